//! The human summary of a run, rendered from its assembled profile (the record CSV and the
//! diff read too): the workload's throughput and latencies, the kv store's verdict, then the
//! probes' figures (`probe_report`).

use std::io::{self, Write};

use virtgap_workloads::units;

use crate::model::interval::Interval;
use crate::model::profile::{DirectionResult, Profile};
use crate::render::latency_table::{write_latency_header, write_latency_row};

/// One direction's throughput line, latency table and per-interval IOPS spread.
fn write_direction(
    out: &mut impl Write,
    p: &Profile,
    label: &str,
    d: &DirectionResult,
    ios: fn(&Interval) -> u64,
) -> io::Result<()> {
    let secs = p.results.measured_s;
    writeln!(
        out,
        "  {label}: IOPS {}, BW {}/s ({:.1} MB/s), {} in {:.1} s",
        units::count(d.iops),
        units::bytes(d.bw_bytes_per_s as u64),
        d.bw_bytes_per_s / 1e6,
        units::bytes(d.bytes),
        secs
    )?;
    write_latency_header(out)?;
    let mut rows = vec![("slat", &d.slat), ("clat", &d.clat), ("lat", &d.lat)];
    if let Some(h) = d.lat_intended.as_ref().filter(|h| h.count > 0) {
        rows.push(("lat_intended", h));
    }
    for (name, h) in rows {
        write_latency_row(out, name, h)?;
    }
    if let Some(sp) = crate::render::report::iops_spread(&p.intervals, ios) {
        writeln!(
            out,
            "    IOPS per {} s interval: min {}, mean {}, max {}, stddev {:.1}% ({} samples)",
            p.run.interval_s,
            units::count(sp.min),
            units::count(sp.mean),
            units::count(sp.max),
            if sp.mean > 0.0 {
                sp.stddev / sp.mean * 100.0
            } else {
                0.0
            },
            sp.samples
        )?;
    }
    Ok(())
}

/// The summary `record` prints, from the profile of the run (for `--runs N`, the last run's
/// own profile).
pub fn write(out: &mut impl Write, p: &Profile) -> io::Result<()> {
    if let Some(a) = &p.attached {
        return write_attached(out, p, a);
    }
    let w = &p.workload;
    // The effective spec is the workload's own TOML, so it parses; a profile edited by hand
    // may not, and then only the name is shown.
    let spec = virtgap_workloads::spec::parse(&w.effective_spec, &w.origin).ok();
    let described = spec.as_ref().map(|s| s.describe()).unwrap_or_default();
    // Names a user, a workload file or a profile chose: each kept on its line.
    writeln!(
        out,
        "{} ({}): {}",
        units::one_line(&w.name),
        units::one_line(&w.origin),
        units::one_line(&described)
    )?;
    writeln!(out, "  target: {}", units::one_line(&p.target.description))?;
    let r = &p.results;
    let engine = spec.as_ref().map_or("?", |s| s.engine.name());
    writeln!(out, "  engine: {engine} ({})", r.engine_features)?;
    // For kv these are the device I/Os the store issued (record reads and defrag's large-block
    // reads; large-block writes); client operations are in the kv section below.
    let labels = if p.kv.is_some() {
        [
            "device read (records + defrag)",
            "device write (large blocks)",
        ]
    } else {
        ["read", "write"]
    };
    if r.read.ios > 0 {
        write_direction(out, p, labels[0], &r.read, |i| i.read_ios)?;
    }
    if r.write.ios > 0 {
        write_direction(out, p, labels[1], &r.write, |i| i.write_ios)?;
    }
    if r.read.ios + r.write.ios == 0 {
        writeln!(out, "  no I/O completed in the measured window")?;
    }
    if let Some(stalls) = p.stalls.as_ref().filter(|s| s.found()) {
        writeln!(out, "  STALLED: {}", stalls.describe())?;
        writeln!(
            out,
            "    the figures above mix the stall with steady state; see the profile's stalls section"
        )?;
    }
    if let Some(pauses) = p.stalls.as_ref().and_then(|s| s.describe_pauses()) {
        writeln!(out, "  PAUSED: {pauses}")?;
    }
    if let (Some(asked), Some(max)) = (p.run.requested_interval_s, p.run.max_intervals) {
        writeln!(
            out,
            "  intervals: {} of {} s each ({:.0}x the interval asked for: a run keeps at most {max} intervals)",
            p.intervals.len(),
            p.run.interval_s,
            p.run.interval_s / asked,
        )?;
    }
    if let Some(lag) = r.max_schedule_lag_ns {
        writeln!(
            out,
            "  schedule: worst lag behind the pacing schedule {}",
            units::latency(lag as f64)
        )?;
    }
    if r.measured_s > 0.0 {
        write!(
            out,
            "  cpu: usr {:.1}%, sys {:.1}% of one CPU, {} context switches",
            r.usr_cpu_pct, r.sys_cpu_pct, r.context_switches
        )?;
        if let Some(per_io) = r.cpu_ns_per_io {
            write!(out, ", {} CPU per I/O", units::latency(per_io))?;
        }
        writeln!(out)?;
    }
    if let Some(kv) = &p.kv {
        crate::render::kv_report::write(out, kv)?;
    }
    crate::render::probe_report::write(out, p)?;
    if !p.complete {
        let planned = spec
            .map(|s| format!(" of {:.0} s", s.duration.0.as_secs_f64()))
            .unwrap_or_default();
        writeln!(
            out,
            "  (interrupted: {:.1} s{planned} measured)",
            r.measured_s
        )?;
    }
    Ok(())
}

/// An attached run's summary: what was followed, how the run ended, the requests its
/// processes sent, then the probes' figures.
fn write_attached(
    out: &mut impl Write,
    p: &Profile,
    a: &crate::model::attached::Attached,
) -> io::Result<()> {
    use crate::model::attached::AttachEnd;
    let secs = p.results.measured_s;
    // The label, the names and the command lines are the followed processes' and the user's:
    // each kept on its line, so none can pass for a line of the summary.
    writeln!(
        out,
        "{} ({})",
        units::one_line(&p.workload.name),
        units::one_line(&p.workload.origin)
    )?;
    let shown: Vec<String> = a.pids.iter().take(8).map(u32::to_string).collect();
    let more = a.pids.len().saturating_sub(shown.len());
    if !a.pids.is_empty() {
        write!(
            out,
            "  processes: {} followed (pid {}",
            a.pids.len(),
            shown.join(", ")
        )?;
        if more > 0 {
            write!(out, ", … {more} more")?;
        }
        writeln!(out, ")")?;
    }
    for cmd in a.commands.iter().take(3) {
        writeln!(out, "    {}", units::one_line(cmd))?;
    }
    let ended = match a.end {
        AttachEnd::Duration => "--duration ran out",
        AttachEnd::Interrupted => "interrupted",
        AttachEnd::ProcessesExited => "every followed process exited",
    };
    writeln!(out, "  attached {secs:.1} s; ended: {ended}")?;
    let io = &a.io;
    let rate = |n: u64| {
        if secs > 0.0 {
            format!(" ({}/s)", units::count(n as f64 / secs))
        } else {
            String::new()
        }
    };
    writeln!(
        out,
        "  block requests: {} reads{}, {} writes{}, {} flushes{}{}",
        units::count(io.read_requests as f64),
        rate(io.read_requests),
        units::count(io.write_requests as f64),
        rate(io.write_requests),
        units::count(io.flushes as f64),
        rate(io.flushes),
        io.read_share()
            .map_or(String::new(), |r| format!("; {:.0}% reads", r * 100.0))
    )?;
    if let Some(qd) = io.mean_in_flight {
        writeln!(
            out,
            "  in flight: {qd:.2} reads and writes in the block layer on average over the run (their block time over its length: a steady load's queue depth)"
        )?;
    }
    match &a.app {
        None => writeln!(
            out,
            "  app latency: not measured (the app probe follows named processes: --pid, --cgroup or --comm)"
        )?,
        Some(kinds) if kinds.is_empty() => writeln!(
            out,
            "  app latency: no file system call or io_uring request of theirs was seen"
        )?,
        Some(kinds) => {
            writeln!(
                out,
                "  app latency (file system calls entry -> exit, page-cache hits included; io_uring submission -> completion):"
            )?;
            write_latency_header(out)?;
            for k in kinds {
                write_latency_row(out, &format!("{} {}", k.via, k.op), &k.latency)?;
            }
            for k in kinds.iter().filter(|k| k.latency.count > 0) {
                let bytes = k.bytes.map_or(String::new(), |b| {
                    format!(
                        ", {} ({} per call)",
                        units::bytes(b),
                        units::bytes(b / k.latency.count.max(1))
                    )
                });
                writeln!(
                    out,
                    "      {} {}: {} {}{bytes}",
                    k.via,
                    k.op,
                    units::count(k.latency.count as f64),
                    if k.via == "io_uring" { "requests" } else { "calls" }
                )?;
            }
        }
    }
    if a.io_submits > 0 {
        writeln!(
            out,
            "  {} libaio io_submit calls: their I/O completes out of sight, counted as block requests only",
            units::count(a.io_submits as f64)
        )?;
    }
    // The tail autopsy follows the summary, written by its caller for every kind of run.
    crate::render::probe_report::write(out, p)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use virtgap_probes::attach::AttachOutcome;
    use virtgap_probes::{AttachKind, CapabilityReport, Family, FamilyReport};

    use super::*;
    use crate::model::devices::{DeviceProfile, DeviceStages, OpStages};
    use crate::model::histogram::Histogram;
    use crate::model::profile::{BlockCounts, IdleBaseline, RunRecord};

    fn attached(family: Family, tracepoint: &str) -> FamilyReport {
        FamilyReport {
            family,
            unavailable: None,
            tracepoints: vec![AttachOutcome {
                tracepoint: tracepoint.into(),
                attached: Some(AttachKind::TpBtf),
                reason: None,
            }],
            fallback: None,
        }
    }

    /// The CSV files' fixture with its probes attached: block stages per kind of request, the
    /// IRQ load, a wakeup probe that saw none, and an idle baseline.
    fn probed_profile() -> Profile {
        let mut p = crate::render::csv_export::tests::fixture();
        let rand4k = virtgap_workloads::spec::load("rand4k").unwrap();
        p.workload.origin = rand4k.origin;
        p.workload.effective_spec = rand4k.spec.to_toml();
        p.capabilities = Some(CapabilityReport {
            families: vec![
                attached(Family::Block, "block_rq_issue"),
                attached(Family::Irq, "irq_handler_entry"),
                attached(Family::Wakeup, "sched_wakeup"),
            ],
            notes: vec![],
            run_stats_unavailable: None,
            maps: vec![],
        });
        let h = |values: &[u64]| Histogram::of_values(values);
        p.devices = vec![DeviceProfile {
            name: "vda".into(),
            major: 254,
            minor: 0,
            ops: vec![
                OpStages {
                    op: "read".into(),
                    stages: DeviceStages {
                        queue: Some(h(&[2_000, 2_100])),
                        device: Some(h(&[399_000, 401_000])),
                        completion: Some(h(&[9_000, 11_000])),
                    },
                },
                OpStages {
                    op: "flush".into(),
                    stages: DeviceStages {
                        device: Some(h(&[1_500_000])),
                        ..DeviceStages::default()
                    },
                },
            ],
            ..DeviceProfile::default()
        }];
        p.block = Some(BlockCounts {
            unsplit: 3,
            dropped: 0,
            from_bio_entry: Some(0),
        });
        p.cpus[0].irq_time_ns = BTreeMap::from([("virtio1-req.0".to_string(), 6_000_000)]);
        p.stages.wakeup = Some(Histogram::default());
        p.runs = vec![RunRecord {
            run: 1,
            idle: Some(IdleBaseline {
                seconds: 1.0,
                hardirq_ns: Some(1_000_000),
                softirq_ns: Some(2_000_000),
                ipis_sent: None,
                msr_writes: None,
                hypervisor: None,
            }),
            ..RunRecord::default()
        }];
        p
    }

    #[test]
    fn the_summary_of_a_probed_run_reads_its_profile() {
        let mut text = Vec::new();
        write(&mut text, &probed_profile()).unwrap();
        insta::assert_snapshot!("summary_probed", String::from_utf8(text).unwrap());
    }

    #[test]
    fn events_the_kernel_skipped_a_program_for_are_counted_as_missed() {
        let cost = |name: &str, missed: u64| crate::model::profile::ProgramCost {
            family: "block".into(),
            name: name.into(),
            runs: 1000,
            run_time_ns: 100_000,
            missed,
        };
        let mut p = probed_profile();
        p.self_overhead.programs = Some(vec![cost("block_rq_issue_btf", 0)]);
        let mut text = Vec::new();
        write(&mut text, &p).unwrap();
        assert!(!String::from_utf8(text).unwrap().contains("missed"));
        p.self_overhead.programs = Some(vec![
            cost("block_rq_issue_btf", 2),
            cost("block_rq_complete_btf", 3),
        ]);
        let mut text = Vec::new();
        write(&mut text, &p).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("events missed: 5 ("), "{text}");
    }

    /// A followed process's command line and the user's label are other people's text: a
    /// newline in either stays inside its line, so neither can add a line of the summary.
    #[test]
    fn newlines_in_a_command_line_or_label_add_no_line() {
        use crate::model::attached::{AttachEnd, AttachKind, Attached, AttachedIo};
        let mut p = crate::render::csv_export::tests::fixture();
        p.workload.name = "L1\n  attached 999 s; ended: FORGED".into();
        p.attached = Some(Attached {
            kind: AttachKind::Pid,
            named: "1".into(),
            label: Some(p.workload.name.clone()),
            pids: vec![1],
            commands: vec!["x\n  block requests: 999 reads FORGED\n".into()],
            end: AttachEnd::Duration,
            io: AttachedIo::default(),
            app: None,
            io_submits: 0,
        });
        let mut text = Vec::new();
        write(&mut text, &p).unwrap();
        let text = String::from_utf8(text).unwrap();
        for line in text.lines() {
            assert!(
                !line.trim_start().starts_with("block requests: 999"),
                "{text}"
            );
            assert!(!line.trim_start().starts_with("attached 999"), "{text}");
        }
        assert!(
            text.contains("x\\n  block requests: 999 reads FORGED\\n"),
            "{text}"
        );
    }

    #[test]
    fn the_summary_of_a_run_without_probes_says_so() {
        let mut p = crate::render::csv_export::tests::fixture();
        p.complete = false;
        let mut text = Vec::new();
        write(&mut text, &p).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("probes: off (--no-probes)"), "{text}");
        assert!(text.contains("(interrupted: 2.0 s measured)"), "{text}");
    }
}
