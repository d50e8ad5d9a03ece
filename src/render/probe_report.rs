//! The probe part of the run summary: block stages, interrupt load per CPU, wakeups,
//! hypervisor signals and the probes' own cost, from the profile; and the live IPI lines the
//! TUI shows.

use std::collections::BTreeMap;
use std::io::{self, Write};

use virtgap_probes::model::{CpuEvents, IrqSnapshot};
use virtgap_probes::virt::SampleCategory;
use virtgap_probes::{CapabilityReport, Family};
use virtgap_workloads::units;

use crate::model::devices::{DeviceProfile, DeviceStages, OpStages};
use crate::model::histogram::Histogram;
use crate::model::interval::CpuLoad;
use crate::model::profile::Profile;
use crate::model::stages::QueueStart;
use crate::model::virtualization::{MsrRate, MsrWrites, SamplerSection, Virtualization};

fn opt_latency(v: Option<f64>) -> String {
    v.map(units::latency).unwrap_or_else(|| "-".into())
}

/// IPIs sent and cross-CPU calls queued per second, on one CPU or all, or why they are not
/// measured (the ipi_send_* and csd tracepoints came in Linux 6.4 and 6.6).
pub fn ipi_summary(
    irq: &IrqSnapshot,
    cpu: Option<u32>,
    secs: f64,
    report: &CapabilityReport,
) -> Vec<String> {
    let rate = |events: &[CpuEvents], kind: &str| {
        let n: u64 = events
            .iter()
            .filter(|e| e.kind == kind && cpu.is_none_or(|c| e.cpu == c))
            .map(|e| e.count)
            .sum();
        units::count(n as f64 / secs.max(1e-9))
    };
    if !report.counts_ipis() {
        return vec!["IPIs sent: not measured (ipi_send_* tracepoints came in Linux 6.4)".into()];
    }
    vec![
        format!(
            "IPIs sent: {}/s reschedule, {}/s function call",
            rate(&irq.ipis_sent, "reschedule"),
            rate(&irq.ipis_sent, "function_call")
        ),
        format!(
            "cross-CPU calls queued: {}/s block completion, {}/s wakeup, {}/s other",
            rate(&irq.cross_cpu_calls, "block_completion"),
            rate(&irq.cross_cpu_calls, "wakeup"),
            rate(&irq.cross_cpu_calls, "other")
        ),
    ]
}

/// One block-stage table: queue, device and (where measured) completion rows under a title.
fn stage_table(out: &mut impl Write, title: &str, stages: &DeviceStages) -> io::Result<()> {
    writeln!(out, "  {title}:")?;
    writeln!(
        out,
        "    {:<13} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "stage", "requests", "mean", "p50", "p99", "p99.9"
    )?;
    let empty = Histogram::default();
    stage_row(out, "queue", stages.queue.as_ref().unwrap_or(&empty))?;
    stage_row(out, "device", stages.device.as_ref().unwrap_or(&empty))?;
    if let Some(completion) = stages.completion.as_ref().filter(|h| h.count > 0) {
        stage_row(out, "completion", completion)?;
    }
    Ok(())
}

fn stage_row(out: &mut impl Write, name: &str, h: &Histogram) -> io::Result<()> {
    writeln!(
        out,
        "    {:<13} {:>9} {:>9} {:>9} {:>9} {:>9}",
        name,
        // A count, not a rate: whole below where `units::count` abbreviates.
        if h.count < 10_000 {
            h.count.to_string()
        } else {
            units::count(h.count as f64)
        },
        opt_latency(h.mean_ns()),
        opt_latency(h.percentile_ns(50.0)),
        opt_latency(h.percentile_ns(99.0)),
        opt_latency(h.percentile_ns(99.9)),
    )
}

/// Each kind of request's stages, summed over `devices` (the disks of a stacked target).
fn ops_of(devices: &[&DeviceProfile]) -> Vec<OpStages> {
    let mut ops: Vec<OpStages> = Vec::new();
    for op in devices.iter().flat_map(|d| &d.ops) {
        let Some(mine) = ops.iter_mut().find(|o| o.op == op.op) else {
            ops.push(op.clone());
            continue;
        };
        for (m, t) in [
            (&mut mine.stages.queue, &op.stages.queue),
            (&mut mine.stages.device, &op.stages.device),
            (&mut mine.stages.completion, &op.stages.completion),
        ] {
            Histogram::merge_into(m, t.as_ref());
        }
    }
    ops
}

/// Where the queue stage starts, when that is not the plain case of a hook on every bio's entry.
fn queue_start_line(start: QueueStart) -> Option<String> {
    match start {
        QueueStart::BioEntry { remap: false } => None,
        QueueStart::BioEntry { remap: true } => Some(
            "queue starts at each bio's entry, noted at block_bio_remap (the target's bios are a partition's; no fentry or kprobe on submit_bio_noacct here): blk-throttle and tag waits count as queue".into(),
        ),
        QueueStart::Request => Some(
            "queue starts at the request here, not at the bio's entry (no fentry or kprobe on submit_bio_noacct here, and block_bio_remap, which notes a partition's bios, noted none of these): blk-throttle and tag waits count as software".into(),
        ),
        QueueStart::Mixed { from_entry, requests } => Some(format!(
            "queue starts at the bio's entry for {from_entry} of {requests} requests (those block_bio_remap saw) and at the request for the rest (no fentry or kprobe on submit_bio_noacct): blk-throttle and tag waits count partly as software"
        )),
    }
}

/// The block stages of the target's disks, each on its own and a stacked target's together.
fn write_block(out: &mut impl Write, p: &Profile) -> io::Result<()> {
    let mut groups: Vec<(String, Vec<&DeviceProfile>)> = p
        .devices
        .iter()
        .map(|d| (d.name.clone(), vec![d]))
        .collect();
    if let (Some(top), true) = (&p.target.device, p.devices.len() > 1) {
        groups.push((
            format!("{top} ({}, summed)", p.target.stage_devices.join(" + ")),
            p.devices.iter().collect(),
        ));
    }
    for (name, devices) in &groups {
        for op in ops_of(devices) {
            if op.op == "flush" {
                // Never issued itself: one stage, request start -> completion.
                writeln!(
                    out,
                    "  cache flushes of {} on {name} (start -> completion):",
                    whose(p).0
                )?;
                stage_row(
                    out,
                    "flush",
                    op.stages.device.as_ref().unwrap_or(&Histogram::default()),
                )?;
                continue;
            }
            let title = format!("block stages of {} {} on {name}", whose(p).1, op.op);
            stage_table(out, &title, &op.stages)?;
        }
    }
    if !groups.is_empty() {
        if let Some(line) = p.queue_start().and_then(queue_start_line) {
            writeln!(out, "    {line}")?;
        }
    }
    if let Some(note) = p
        .target
        .device_note
        .as_deref()
        .filter(|_| p.target.stage_devices.is_empty())
    {
        writeln!(out, "    {note}")?;
    }
    if let Some(per_io) = p.stages.requests_per_io().filter(|r| !r.one_to_one()) {
        let how = if per_io.ratio() > 1.0 {
            "the block layer split them (or a mirror wrote each to several disks)"
        } else {
            "merged, or served without a request"
        };
        writeln!(
            out,
            "    block requests per app I/O: {} — {how}; the stages above are per request, app latency per I/O",
            requests_per_io(per_io)
        )?;
    }
    let counts = p.block.clone().unwrap_or_default();
    if counts.unsplit > 0 {
        writeln!(
            out,
            "    {} requests kept device time to their completion (no completion stage): their queue's IRQ is not known here, or did not fire",
            counts.unsplit
        )?;
    }
    let total: u64 = p.cpu_pairs.iter().map(|x| x[2]).sum();
    let cross: u64 = p
        .cpu_pairs
        .iter()
        .filter(|x| x[0] != x[1])
        .map(|x| x[2])
        .sum();
    if total > 0 {
        writeln!(
            out,
            "    completed on another CPU than submitted: {:.1}% ({cross} of {total})",
            cross as f64 / total as f64 * 100.0
        )?;
    }
    if let Some(requeued) = p
        .stalls
        .as_ref()
        .and_then(|s| s.requeued)
        .filter(|&n| n > 0)
    {
        writeln!(
            out,
            "    handed back by the driver and issued again (device queue full): {requeued} times; the wait counts as queue"
        )?;
    }
    if counts.dropped > 0 {
        writeln!(
            out,
            "    {} requests not recorded (probe maps full)",
            counts.dropped
        )?;
    }
    Ok(())
}

/// Interrupt time per CPU that handled any, its two busiest IRQs, and the IPIs sent.
fn write_irq(
    out: &mut impl Write,
    p: &Profile,
    secs: f64,
    report: &CapabilityReport,
) -> io::Result<()> {
    writeln!(out, "  interrupt load per CPU (all sources, {secs:.1} s):")?;
    writeln!(
        out,
        "    {:<5} {:>8} {:>8}  busiest IRQs",
        "cpu", "hardirq", "softirq"
    )?;
    for c in p
        .cpus
        .iter()
        .filter(|c| c.hardirq_count + c.softirq_count > 0)
    {
        let mut top: Vec<(&String, u64, u64)> = c
            .irqs
            .iter()
            .map(|(name, &n)| (name, n, c.irq_time_ns.get(name).copied().unwrap_or(0)))
            .collect();
        top.sort_by_key(|&(_, _, t)| std::cmp::Reverse(t));
        let busiest: Vec<String> = top
            .iter()
            .take(2)
            .map(|(name, n, t)| {
                format!(
                    "{name} {}/s at {} each",
                    units::count(*n as f64 / secs),
                    units::latency(*t as f64 / *n as f64)
                )
            })
            .collect();
        writeln!(
            out,
            "    {:<5} {:>7.1}% {:>7.1}%  {}",
            format!("cpu{}", c.cpu),
            c.hardirq_ns as f64 / 1e9 / secs * 100.0,
            c.softirq_ns as f64 / 1e9 / secs * 100.0,
            busiest.join(", ")
        )?;
    }
    if !report.counts_ipis() {
        return writeln!(
            out,
            "    IPIs sent: not measured (ipi_send_* tracepoints came in Linux 6.4)"
        );
    }
    let rate = |field: fn(&CpuLoad) -> &BTreeMap<String, u64>, kind: &str| {
        let n: u64 = p.cpus.iter().filter_map(|c| field(c).get(kind)).sum();
        units::count(n as f64 / secs)
    };
    writeln!(
        out,
        "    IPIs sent: {}/s reschedule, {}/s function call",
        rate(|c| &c.ipis_sent, "reschedule"),
        rate(|c| &c.ipis_sent, "function_call")
    )?;
    writeln!(
        out,
        "    cross-CPU calls queued: {}/s block completion, {}/s wakeup, {}/s other",
        rate(|c| &c.cross_cpu_calls, "block_completion"),
        rate(|c| &c.cross_cpu_calls, "wakeup"),
        rate(|c| &c.cross_cpu_calls, "other")
    )
}

/// The host's MSR writes per second that exit to its hypervisor (and its others), counted while
/// virtgap's sampler paused; then the writes the sampler's own interrupts made.
fn write_msr(out: &mut impl Write, v: &Virtualization) -> io::Result<()> {
    if v.msr_writes.is_none() {
        return Ok(());
    }
    let (Some(exiting), Some(other)) = (
        v.msr_write_rates(MsrWrites::Exiting),
        v.msr_write_rates(MsrWrites::Other),
    ) else {
        return writeln!(
            out,
            "  exit-causing MSR writes: not measured (the sampler did not pause long enough to count the host's)"
        );
    };
    let top3 = |rates: &[MsrRate]| {
        rates
            .iter()
            .take(3)
            .map(|r| format!("{:#x} {} {}/s", r.msr, r.name, units::count(r.per_s)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    writeln!(
        out,
        "  exit-causing MSR writes: {}",
        if exiting.is_empty() {
            "none seen".into()
        } else {
            top3(&exiting)
        }
    )?;
    if !other.is_empty() {
        writeln!(
            out,
            "  other MSR writes (no exit known here): {}",
            top3(&other)
        )?;
    }
    if let Some(sends) = v.icr_sends.filter(|s| s.sends > 0) {
        writeln!(
            out,
            "  IPIs to one CPU: {} a send, from the send to its ICR write's return ({} timed)",
            units::latency(sends.ns as f64 / sends.sends as f64),
            sends.sends
        )?;
    }
    if let Some(quiet) = v.msr_quiet_seconds {
        writeln!(
            out,
            "  (counted while virtgap's sampler paused, {:.0}% of the time: its timer changes the host's)",
            quiet / v.seconds * 100.0
        )?;
        if let Some(own) = v.sampler_msr_writes_per_s() {
            writeln!(
                out,
                "  virtgap's own sampler interrupts caused {}/s MSR writes while it ran (left out above)",
                units::count(own)
            )?;
        }
    }
    Ok(())
}

/// Each sampled CPU's time by category, in the categories' order.
fn write_sampler(out: &mut impl Write, s: &SamplerSection, window: f64) -> io::Result<()> {
    writeln!(out, "  sampled CPU time ({} Hz cpu-clock):", s.frequency_hz)?;
    let sampled = s.seconds(window);
    for c in &s.cpus {
        if !c.represents(s.frequency_hz, sampled) {
            writeln!(
                out,
                "    cpu{}: not measured ({} of ~{:.0} expected samples arrived: the kernel dropped the rest, so a split would be biased)",
                c.cpu,
                c.samples,
                s.frequency_hz as f64 * sampled
            )?;
            continue;
        }
        let total = c.samples.max(1) as f64;
        let cats: Vec<String> = SampleCategory::ALL
            .iter()
            .map(|k| (k.name(), c.in_category(k.name())))
            .filter(|&(_, n)| n > 0 && n as f64 / total >= 0.005)
            .map(|(name, n)| format!("{name} {:.1}%", n as f64 / total * 100.0))
            .collect();
        writeln!(out, "    cpu{}: {}", c.cpu, cats.join(", "))?;
    }
    Ok(())
}

/// The probe part of the summary, from the profile: its figures cover the measured window.
/// Whose requests and threads the probes followed — the workload (this process) or what was
/// attached to — as (who, whose).
fn whose(p: &Profile) -> (&'static str, &'static str) {
    match p.attached.as_ref().map(|a| a.kind) {
        None => ("this process", "this process's"),
        Some(crate::model::attached::AttachKind::All) => ("every process", "every process's"),
        Some(_) => ("the attached processes", "the attached processes'"),
    }
}

/// Whose threads the wakeup probe followed.
fn threads(p: &Profile) -> &'static str {
    if p.attached.is_some() {
        whose(p).1
    } else {
        "the workload's"
    }
}

pub fn write(out: &mut impl Write, p: &Profile) -> io::Result<()> {
    let Some(report) = &p.capabilities else {
        return writeln!(out, "  probes: off (--no-probes)");
    };
    let Some(secs) = p.probe_seconds else {
        return writeln!(out, "  probes: no snapshot was taken");
    };
    let why = |family: Family| {
        report
            .families
            .iter()
            .find(|f| f.family == family)
            .and_then(|f| f.unavailable.as_ref().map(ToString::to_string))
            .unwrap_or_else(|| "not requested".into())
    };
    if report.attached(Family::Block) {
        write_block(out, p)?;
    } else {
        writeln!(out, "  block stages: unavailable ({})", why(Family::Block))?;
    }
    if !report.attached(Family::Irq) {
        writeln!(out, "  interrupt load: unavailable ({})", why(Family::Irq))?;
    } else if secs > 0.0 {
        write_irq(out, p, secs, report)?;
    }
    match &p.stages.wakeup {
        Some(w) if w.count > 0 => writeln!(
            out,
            "  wakeups of {} threads: {}, wakeup -> on CPU mean {}, p99 {}",
            threads(p),
            w.count,
            opt_latency(w.mean_ns()),
            opt_latency(w.percentile_ns(99.0))
        )?,
        Some(_) => writeln!(out, "  wakeups of {} threads: none seen", threads(p))?,
        None => writeln!(out, "  wakeups: unavailable ({})", why(Family::Wakeup))?,
    }
    let nvme: Vec<(String, &Histogram)> = p
        .devices
        .iter()
        .flat_map(|d| {
            d.nvme_queues.iter().filter_map(move |q| {
                let h = q.latency.as_ref().filter(|h| h.count > 0)?;
                Some((format!("{} q{}", d.name, q.qid), h))
            })
        })
        .collect();
    if !nvme.is_empty() {
        writeln!(out, "  NVMe command latency per queue (reads and writes):")?;
        writeln!(
            out,
            "    {:<13} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "queue", "commands", "mean", "p50", "p99", "p99.9"
        )?;
        for (name, h) in nvme {
            stage_row(out, &name, h)?;
        }
    }
    if let Some(v) = p.virtualization.as_ref().filter(|_| secs > 0.0) {
        write_msr(out, v)?;
        if let Some(sampler) = &v.sampler {
            write_sampler(out, sampler, v.seconds)?;
        }
    }
    if let Some(h) = p.hypervisor.as_ref().filter(|_| secs > 0.0) {
        let ios = (p.results.read.ios + p.results.write.ios) as f64;
        crate::render::hypervisor_report::write(out, h, ios)?;
    }
    match &report.run_stats_unavailable {
        None if secs > 0.0 => {
            let programs = p.self_overhead.programs.as_deref().unwrap_or_default();
            let runs: u64 = programs.iter().map(|c| c.runs).sum();
            let time: u64 = programs.iter().map(|c| c.run_time_ns).sum();
            let stats_secs = p.self_overhead.stats_seconds.unwrap_or(secs);
            if stats_secs <= 0.0 {
                writeln!(
                    out,
                    "  probe overhead: not measured (the run statistics were off for this window)"
                )?;
            } else {
                let sampled = if stats_secs < secs * 0.99 {
                    format!(" (run statistics on for {stats_secs:.1} of {secs:.1} s)")
                } else {
                    String::new()
                };
                writeln!(
                    out,
                    "  probe overhead: {} programs, {} runs/s, {} per run, {:.2}% of one CPU{sampled}",
                    programs.len(),
                    units::count(runs as f64 / stats_secs),
                    if runs > 0 {
                        units::latency(time as f64 / runs as f64)
                    } else {
                        "-".into()
                    },
                    time as f64 / 1e9 / stats_secs * 100.0
                )?;
            }
            let missed: u64 = programs.iter().map(|c| c.missed).sum();
            if missed > 0 {
                writeln!(
                    out,
                    "  events missed: {missed} (the kernel skips a program already running on \
                     that CPU; those measurements are not in the figures above)"
                )?;
            }
        }
        None => {}
        Some(why) => writeln!(out, "  probe overhead: unavailable ({why})")?,
    }
    if let Some(idle) = p.runs.last().and_then(|r| r.idle.as_ref()) {
        writeln!(out, "  {}", idle_line(idle))?;
    }
    Ok(())
}

/// "idle host before the workload (1.0 s): hard IRQ 0.1%, softirq 0.2% of all CPUs, …"
fn idle_line(idle: &crate::model::profile::IdleBaseline) -> String {
    let s = idle.seconds;
    let time = |ns: Option<u64>| {
        ns.map_or("not measured".into(), |n| {
            format!("{:.2}% of one CPU", n as f64 / 1e9 / s * 100.0)
        })
    };
    let rate =
        |n: Option<u64>| n.map_or("not measured".into(), |n| format!("{:.0}/s", n as f64 / s));
    format!(
        "idle host before the workload ({s:.1} s; the diff compares host-wide figures per I/O above it): hard IRQ {}, softirq {}, IPIs {}, exit-causing MSR writes {}",
        time(idle.hardirq_ns),
        time(idle.softirq_ns),
        rate(idle.ipis_sent),
        rate(idle.msr_writes)
    )
}
/// "2.00 (7910 requests for 3955 I/Os)".
pub fn requests_per_io(r: crate::model::stages::RequestsPerIo) -> String {
    format!(
        "{:.2} ({} requests for {} I/Os)",
        r.ratio(),
        r.requests,
        r.ios
    )
}
