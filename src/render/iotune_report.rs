//! iotune in words: the four figures with the search behind each and what the host did at the
//! saturation point; ScyllaDB's io_properties.yaml; and the diff of two hosts' results.

use std::fmt::Write as _;

use serde::Serialize;

use crate::analysis::diff::{HostEvidence, Verdict};
use crate::analysis::iotune_diff::{FigureReplicates, IotuneDiff, PhaseDiff};
use crate::model::iotune::{IotunePhase, IotuneProfile, IotuneProgress, Phase};
use crate::render::diff_render::{
    busiest_irq_cpu, hypervisor_share, percent, source_words, verdict_sentence, verdict_text,
};
use virtgap_workloads::units;

/// A figure in its unit: "1.20 GiB/s", "74.2k IOPS".
pub fn figure(phase: Phase, value: f64) -> String {
    if phase.is_bandwidth() {
        format!("{}/s", units::bytes(value.max(0.0) as u64))
    } else {
        format!("{} IOPS", units::count(value))
    }
}

/// One line of iotune's progress on `target` (shown as given).
pub fn progress_line(target: &str, p: IotuneProgress) -> String {
    let plural = |n: u64| if n == 1 { "" } else { "s" };
    match p {
        IotuneProgress::Started {
            phases,
            workers,
            tolerance,
            runs,
            measure,
        } => format!(
            "iotune on {target}: {phases} phase{}, {workers} workers, depth per worker doubling from 1 until it grows less than {}% twice, then {runs} run{} of {:.1} s at the peak",
            plural(phases as u64),
            tolerance * 100.0,
            plural(u64::from(runs)),
            measure.as_secs_f64()
        ),
        IotuneProgress::Phase { number, of, phase } => {
            format!("phase {number} of {of}: {}", phase.key())
        }
        IotuneProgress::Step {
            phase,
            workers,
            qd,
            figure: f,
        } => format!("  {}: {workers} workers x qd {qd}: {}", phase.key(), figure(phase, f)),
        IotuneProgress::Peak {
            phase,
            workers,
            qd,
            runs,
            measure,
        } => format!(
            "  {}: peak at {workers} workers x qd {qd}; measuring {runs} run{} of {:.0} s there",
            phase.key(),
            plural(u64::from(runs)),
            measure.as_secs_f64()
        ),
        IotuneProgress::Run {
            phase,
            number,
            figure: f,
        } => format!("  {}: run {number}: {}", phase.key(), figure(phase, f)),
    }
}

/// "2 workers x qd 8".
fn concurrency(workers: u32, qd: u32) -> String {
    format!(
        "{workers} worker{} x qd {qd}",
        if workers == 1 { "" } else { "s" }
    )
}

/// What the host did at a phase's saturation point, from its measured runs' profile.
fn at_peak(p: &IotunePhase) -> Vec<String> {
    let app = &p.profile.stages.app;
    let lat = |v: Option<f64>| v.map_or("-".to_string(), units::latency);
    let mut lines = vec![format!(
        "latency at the peak: mean {}, p99 {}{}",
        lat(app.mean_ns()),
        lat(app.percentile_ns(99.0)),
        p.profile
            .stages
            .device
            .as_ref()
            .and_then(|d| d.mean_ns())
            .map_or(String::new(), |d| format!(
                " (device {})",
                units::latency(d)
            ))
    )];
    let e = HostEvidence::of(&[&p.profile]);
    lines.push(format!("busiest IRQ CPU: {}", busiest_irq_cpu(&e)));
    lines.push(format!(
        "hypervisor-interface share of samples: {}",
        hypervisor_share(&e)
    ));
    lines
}

/// The result as printed on stdout.
pub fn summary(r: &IotuneProfile) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "iotune on {} (mountpoint {}): {}",
        r.target,
        r.mountpoint,
        r.host.describe()
    );
    if r.phases.is_empty() {
        let _ = writeln!(s, "no phase finished");
        return s;
    }
    let _ = writeln!(s, "{:<16} {:>14}  {:<22} each run", "figure", "value", "at");
    for p in &r.phases {
        let runs: Vec<String> = p.runs.iter().map(|&v| figure(p.phase, v)).collect();
        let _ = writeln!(
            s,
            "{:<16} {:>14}  {:<22} {}",
            p.phase.key(),
            figure(p.phase, p.figure),
            concurrency(p.workers, p.qd),
            runs.join(", ")
        );
        let steps: Vec<String> = p
            .search
            .iter()
            .map(|x| format!("qd {} {}", x.qd, figure(p.phase, x.figure)))
            .collect();
        let _ = writeln!(s, "  search: {}", steps.join(" · "));
        for line in at_peak(p) {
            let _ = writeln!(s, "  {line}");
        }
    }
    if !r.complete {
        let _ = writeln!(s, "(interrupted: the phases above are those that finished)");
    }
    s
}

/// ScyllaDB's io_properties.yaml: one disk, its mount point and the four figures, in the units
/// ScyllaDB reads (I/Os per second, bytes per second).
#[derive(Serialize)]
struct IoProperties {
    disks: Vec<Disk>,
}

#[derive(Serialize)]
struct Disk {
    mountpoint: String,
    read_iops: u64,
    read_bandwidth: u64,
    write_iops: u64,
    write_bandwidth: u64,
}

/// The io_properties.yaml of a result holding all four phases.
pub fn io_properties_yaml(r: &IotuneProfile) -> anyhow::Result<String> {
    let get = |phase: Phase| -> anyhow::Result<u64> {
        r.phase(phase)
            .map(|p| p.figure.round() as u64)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "io_properties.yaml needs {}, which did not run",
                    phase.key()
                )
            })
    };
    let doc = IoProperties {
        disks: vec![Disk {
            mountpoint: r.mountpoint.clone(),
            read_iops: get(Phase::ReadIops)?,
            read_bandwidth: get(Phase::ReadBandwidth)?,
            write_iops: get(Phase::WriteIops)?,
            write_bandwidth: get(Phase::WriteBandwidth)?,
        }],
    };
    Ok(yaml_serde::to_string(&doc)?)
}

/// A phase's figure verdict in words. Over results, the more that would resolve an inconclusive
/// figure are results (iotune runs recorded apart), not runs inside one.
fn figure_verdict(p: &PhaseDiff, d: &IotuneDiff) -> String {
    match (d.replicates, p.figure.verdict, p.figure.runs_needed) {
        (FigureReplicates::Results, Verdict::Inconclusive, Some(n)) => format!(
            "inconclusive (≈{n} results per host would resolve ±{}%)",
            percent(p.diff.min_effect)
        ),
        _ => verdict_text(&p.figure, &p.diff),
    }
}

/// Two hosts' iotune results as text.
pub fn diff_text(d: &IotuneDiff) -> String {
    let mut s = String::new();
    for (letter, host, target, source) in [
        ("A", &d.host_a, &d.target_a, &d.source_a),
        ("B", &d.host_b, &d.target_b, &d.source_b),
    ] {
        let _ = writeln!(s, "{letter}: {} ({target})", host.describe());
        if let Some(w) = source_words(source) {
            let _ = writeln!(s, "   {w}");
        }
    }
    for (host, phases) in [("A", &d.only_a), ("B", &d.only_b)] {
        if !phases.is_empty() {
            let _ = writeln!(
                s,
                "  only host {host} measured {}: not compared",
                phases
                    .iter()
                    .map(|p| p.key())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let single: Vec<&str> = [("A", d.results_a), ("B", d.results_b)]
        .into_iter()
        .filter(|(_, n)| *n == 1)
        .map(|(host, _)| host)
        .collect();
    if !single.is_empty() {
        let _ = writeln!(
            s,
            "  warning: one iotune result on host {}: its runs ran back to back, so drift between results recorded apart (often 10% or more on a shared host) is not in the intervals; record two or more per host, interleaved (A, B, B, A), and pool them with --with-a/--with-b",
            single.join(" and ")
        );
    }
    let over = match d.replicates {
        FigureReplicates::Results => "over the results, each result's mean one replicate",
        FigureReplicates::Runs => "over the measured runs",
    };
    let _ = writeln!(
        s,
        "\nthe storage's figures (B vs A {over}; verdict with its 95% interval, in % of A):"
    );
    let _ = writeln!(s, "{:<16} {:>14} {:>14}  verdict", "figure", "A", "B");
    for p in &d.phases {
        let _ = writeln!(
            s,
            "{:<16} {:>14} {:>14}  {}",
            p.phase.key(),
            figure(p.phase, p.a),
            figure(p.phase, p.b),
            figure_verdict(p, d)
        );
    }
    let _ = writeln!(s, "\nat each host's saturation point:");
    for p in &d.phases {
        let _ = writeln!(
            s,
            "{} (A at {}, B at {}):",
            p.phase.key(),
            concurrency(p.at_a.0, p.at_a.1),
            concurrency(p.at_b.0, p.at_b.1)
        );
        let _ = writeln!(s, "  {}", verdict_sentence(&p.diff));
        let (a, b) = (&p.diff.evidence.a, &p.diff.evidence.b);
        let _ = writeln!(
            s,
            "  busiest IRQ CPU: A {}; B {}",
            busiest_irq_cpu(a),
            busiest_irq_cpu(b)
        );
        let _ = writeln!(
            s,
            "  hypervisor-interface share of samples: A {}; B {}",
            hypervisor_share(a),
            hypervisor_share(b)
        );
    }
    s
}

#[derive(Serialize)]
struct JsonPhase {
    phase: Phase,
    a: f64,
    b: f64,
    unit: &'static str,
    effect: Option<f64>,
    effect_low: Option<f64>,
    effect_high: Option<f64>,
    verdict: crate::analysis::diff::Verdict,
    verdict_text: String,
    diff: serde_json::Value,
}

/// Two hosts' iotune results as JSON: per phase the figures, the judged ratio, and the phase's
/// whole diff (as `diff --json` gives it).
pub fn diff_json(d: &IotuneDiff) -> serde_json::Result<String> {
    let phases = d
        .phases
        .iter()
        .map(|p| {
            Ok(JsonPhase {
                phase: p.phase,
                a: p.a,
                b: p.b,
                unit: if p.phase.is_bandwidth() {
                    "bytes_per_s"
                } else {
                    "iops"
                },
                effect: p.figure.effect,
                effect_low: p.figure.effect_low,
                effect_high: p.figure.effect_high,
                verdict: p.figure.verdict,
                verdict_text: figure_verdict(p, d),
                diff: serde_json::from_str(&crate::render::diff_render::json(&p.diff)?)?,
            })
        })
        .collect::<serde_json::Result<Vec<_>>>()?;
    serde_json::to_string_pretty(&serde_json::json!({
        "kind": "iotune",
        "target_a": d.target_a,
        "target_b": d.target_b,
        "source_a": source_words(&d.source_a),
        "source_b": source_words(&d.source_b),
        "phases": phases,
        "only_a": d.only_a,
        "only_b": d.only_b,
        "results_a": d.results_a,
        "results_b": d.results_b,
        "replicates": d.replicates,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::iotune::fixture;

    #[test]
    fn each_progress_event_is_one_line_with_its_units() {
        let phase = Phase::ALL[0];
        let lines = [
            IotuneProgress::Started {
                phases: 4,
                workers: 2,
                tolerance: 0.05,
                runs: 1,
                measure: std::time::Duration::from_secs(10),
            },
            IotuneProgress::Phase {
                number: 1,
                of: 4,
                phase,
            },
            IotuneProgress::Step {
                phase,
                workers: 2,
                qd: 8,
                figure: 1.5e9,
            },
            IotuneProgress::Peak {
                phase,
                workers: 2,
                qd: 8,
                runs: 3,
                measure: std::time::Duration::from_secs(10),
            },
            IotuneProgress::Run {
                phase,
                number: 2,
                figure: 1.5e9,
            },
        ]
        .map(|p| progress_line("/dev/vdb", p));
        assert!(
            lines[0].starts_with("iotune on /dev/vdb: 4 phases, 2 workers")
                && lines[0].contains("1 run of 10.0 s")
        );
        assert_eq!(lines[1], format!("phase 1 of 4: {}", phase.key()));
        assert!(lines[2].ends_with(&figure(phase, 1.5e9)) && lines[2].contains("2 workers x qd 8"));
        assert!(lines[3].contains("peak at 2 workers x qd 8; measuring 3 runs of 10 s"));
        assert!(lines[4].contains("run 2: ") && lines.iter().all(|l| !l.contains('\n')));
    }

    fn result(phases: &[(Phase, f64)]) -> IotuneProfile {
        let phases: Vec<(Phase, Vec<f64>)> = phases.iter().map(|&(p, f)| (p, vec![f])).collect();
        fixture("/dev/md0", "/var/lib/scylla", &phases)
    }

    /// The file ScyllaDB reads: a `disks` list of one, with exactly its five keys, the figures
    /// as whole numbers in I/Os and bytes per second.
    #[test]
    fn io_properties_has_exactly_scyllas_keys() {
        let r = result(&[
            (Phase::ReadBandwidth, 2_658_013_184.4),
            (Phase::WriteBandwidth, 1_241_305_344.0),
            (Phase::ReadIops, 1_186_000.6),
            (Phase::WriteIops, 1_013_000.0),
        ]);
        let text = io_properties_yaml(&r).unwrap();
        insta::assert_snapshot!("io_properties", text);
        let doc: std::collections::BTreeMap<
            String,
            Vec<std::collections::BTreeMap<String, yaml_serde::Value>>,
        > = yaml_serde::from_str(&text).unwrap();
        assert_eq!(doc.keys().collect::<Vec<_>>(), ["disks"]);
        let disk = &doc["disks"][0];
        assert_eq!(doc["disks"].len(), 1);
        assert_eq!(
            disk.keys().map(String::as_str).collect::<Vec<_>>(),
            [
                "mountpoint",
                "read_bandwidth",
                "read_iops",
                "write_bandwidth",
                "write_iops"
            ]
        );
        assert_eq!(disk["mountpoint"].as_str(), Some("/var/lib/scylla"));
        assert_eq!(disk["read_iops"].as_u64(), Some(1_186_001));
        assert_eq!(disk["read_bandwidth"].as_u64(), Some(2_658_013_184));
    }

    #[test]
    fn io_properties_needs_all_four_figures() {
        let r = result(&[(Phase::ReadIops, 1.0), (Phase::ReadBandwidth, 1.0)]);
        let e = io_properties_yaml(&r).unwrap_err().to_string();
        assert!(e.contains("needs write_iops, which did not run"), "{e}");
    }
}
