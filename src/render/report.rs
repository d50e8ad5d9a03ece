//! Reports of a run from its profile: JSON laid out like fio's so fio parsers read it
//! (`jobs[0].read.iops`, `jobs[0].read.clat_ns.percentile["99.000000"]`, ...), the runs of a
//! multi-run recording, and the tail autopsy. The human summary is `summary`.

use std::io::{self, Write};

use serde_json::{json, Map, Value};
use virtgap_workloads::histogram::FIO_PERCENTILES;
use virtgap_workloads::units;

use crate::analysis::stats;
use crate::model::histogram::Histogram;
use crate::model::interval::Interval;
use crate::model::profile::{DirectionResult, Profile};

/// Per-interval spread of one quantity.
pub(crate) struct Spread {
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    pub stddev: f64,
    pub samples: usize,
}

fn spread(values: impl Iterator<Item = f64>) -> Option<Spread> {
    let v: Vec<f64> = values.collect();
    if v.is_empty() {
        return None;
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    Some(Spread {
        min: v.iter().copied().fold(f64::INFINITY, f64::min),
        max: v.iter().copied().fold(0.0, f64::max),
        mean,
        stddev: var.sqrt(),
        samples: v.len(),
    })
}

/// Full-length intervals only: a short last interval would skew the spread. (Lengths are
/// seconds in the profile: within a microsecond of the longest counts as full.)
fn full_intervals(intervals: &[Interval]) -> impl Iterator<Item = &Interval> {
    let secs = |i: &Interval| i.end_s - i.start_s;
    let longest = intervals.iter().map(secs).fold(0.0, f64::max);
    intervals
        .iter()
        .filter(move |i| longest > 0.0 && secs(i) >= longest - 1e-6)
}

/// IOPS per full-length interval, with their min, mean, max and spread.
pub(crate) fn iops_spread(intervals: &[Interval], ios: fn(&Interval) -> u64) -> Option<Spread> {
    spread(full_intervals(intervals).map(|i| ios(i) as f64 / (i.end_s - i.start_s)))
}

/// fio's `{min,max,mean,stddev,N,percentile}` object for one latency distribution.
fn latency_json(h: &Histogram, percentiles: bool) -> Value {
    let mut m = Map::new();
    m.insert("min".into(), json!(h.min_ns.unwrap_or(0)));
    m.insert("max".into(), json!(h.max_ns.unwrap_or(0)));
    m.insert("mean".into(), json!(h.mean_ns().unwrap_or(0.0)));
    m.insert("stddev".into(), json!(h.stddev_ns().unwrap_or(0.0)));
    m.insert("N".into(), json!(h.count));
    if percentiles && h.count > 0 {
        let pct: Map<String, Value> = FIO_PERCENTILES
            .iter()
            .map(|&q| {
                let ns = h.percentile_ns(q).map_or(0, |v| v.round() as u64);
                (format!("{q:.6}"), json!(ns))
            })
            .collect();
        m.insert("percentile".into(), Value::Object(pct));
    }
    Value::Object(m)
}

fn direction_json(
    p: &Profile,
    d: &DirectionResult,
    ios: fn(&Interval) -> u64,
    bytes: fn(&Interval) -> u64,
) -> Value {
    let iops = iops_spread(&p.intervals, ios);
    let bw_kib = spread(
        full_intervals(&p.intervals).map(|i| bytes(i) as f64 / 1024.0 / (i.end_s - i.start_s)),
    );
    let mut m = Map::new();
    m.insert("io_bytes".into(), json!(d.bytes));
    m.insert("io_kbytes".into(), json!(d.bytes / 1024));
    m.insert("bw_bytes".into(), json!(d.bw_bytes_per_s as u64));
    m.insert("bw".into(), json!((d.bw_bytes_per_s / 1024.0) as u64));
    m.insert("iops".into(), json!(d.iops));
    m.insert(
        "runtime".into(),
        json!((p.results.measured_s * 1000.0) as u64),
    );
    m.insert("total_ios".into(), json!(d.ios));
    m.insert("short_ios".into(), json!(0));
    m.insert("drop_ios".into(), json!(0));
    m.insert("slat_ns".into(), latency_json(&d.slat, false));
    m.insert("clat_ns".into(), latency_json(&d.clat, true));
    m.insert("lat_ns".into(), latency_json(&d.lat, true));
    if let Some(h) = d.lat_intended.as_ref().filter(|h| h.count > 0) {
        m.insert("lat_intended_ns".into(), latency_json(h, true));
    }
    if let (Some(iops), Some(bw)) = (iops, bw_kib) {
        m.insert("bw_min".into(), json!(bw.min as u64));
        m.insert("bw_max".into(), json!(bw.max as u64));
        m.insert("bw_mean".into(), json!(bw.mean));
        m.insert("bw_dev".into(), json!(bw.stddev));
        m.insert("bw_samples".into(), json!(bw.samples));
        m.insert("iops_min".into(), json!(iops.min as u64));
        m.insert("iops_max".into(), json!(iops.max as u64));
        m.insert("iops_mean".into(), json!(iops.mean));
        m.insert("iops_stddev".into(), json!(iops.stddev));
        m.insert("iops_samples".into(), json!(iops.samples));
    }
    Value::Object(m)
}

/// `record --json`: the run's profile laid out like fio's JSON, with virtgap's own keys.
pub fn json(p: &Profile) -> Value {
    if let Some(a) = &p.attached {
        // No workload: what was attached, and the probes' figures as the profile keeps them.
        return json!({
            "virtgap_version": p.run.tool_version,
            "host": p.host.describe(),
            "attached": a,
            "measured_s": p.results.measured_s,
            "stages": p.stages,
            "devices": p.devices,
            "hypervisor": p.hypervisor,
        });
    }
    let w = &p.workload;
    let spec = virtgap_workloads::spec::parse(&w.effective_spec, &w.origin).ok();
    let r = &p.results;
    let intervals: Vec<Value> = p
        .intervals
        .iter()
        .map(|i| {
            let secs = i.end_s - i.start_s;
            json!({
                "start_ms": (i.start_s * 1000.0).round() as u64,
                "end_ms": (i.end_s * 1000.0).round() as u64,
                "read_ios": i.read_ios,
                "write_ios": i.write_ios,
                "read_bytes": i.read_bytes,
                "write_bytes": i.write_bytes,
                "iops": if secs > 0.0 { (i.read_ios + i.write_ios) as f64 / secs } else { 0.0 },
                "lat_p50_ns": i.lat_p50_ns,
                "lat_p99_ns": i.lat_p99_ns,
                "lat_mean_ns": (i.lat_count > 0).then(|| i.lat_sum_ns / i.lat_count as f64),
            })
        })
        .collect();
    let options = spec.as_ref().map(|s| {
        json!({
            "rw": s.fio_rw(),
            "bs": s.bs.0.to_string(),
            "iodepth": s.qd.to_string(),
            "numjobs": s.workers.to_string(),
            "ioengine": s.engine.name(),
            "direct": u8::from(s.direct).to_string(),
        })
    });
    json!({
        "virtgap_version": p.run.tool_version,
        "timestamp": p.run.started_unix_ms / 1000,
        "interrupted": !p.complete,
        "workload": {
            "name": w.name,
            "origin": w.origin,
            "spec_toml": w.effective_spec,
            "fio_equivalent": w.fio_equivalent,
        },
        "target": {
            "description": p.target.description,
            "path": p.target.path,
            "size_bytes": p.target.size_bytes,
        },
        "jobs": [{
            "jobname": w.name,
            "groupid": 0,
            "error": 0,
            "elapsed": r.measured_s.round() as u64,
            "job options": options,
            "read": direction_json(p, &r.read, |i| i.read_ios, |i| i.read_bytes),
            "write": direction_json(p, &r.write, |i| i.write_ios, |i| i.write_bytes),
            "usr_cpu": r.usr_cpu_pct,
            "sys_cpu": r.sys_cpu_pct,
            "ctx": r.context_switches,
            "engine_features": r.engine_features,
            "intervals": intervals,
        }],
        "probes": probes_json(p),
        "stalls": p.stalls,
        "kv": p.kv,
    })
}

/// The probes' part of `--json`: what attached, over how long, at what cost, and the
/// profile's probed sections (null with --no-probes).
fn probes_json(p: &Profile) -> Value {
    match &p.capabilities {
        None => Value::Null,
        Some(report) => json!({
            "capabilities": report,
            "seconds": p.probe_seconds,
            "programs": p.self_overhead.programs,
            "stats_seconds": p.self_overhead.stats_seconds.or(p.probe_seconds),
            "recorder_cpu_pct": p.self_overhead.recorder_cpu_pct,
            "stages": p.stages,
            "devices": p.devices,
            "cpus": p.cpus,
            "virtualization": p.virtualization,
        }),
    }
}

/// The runs of `record --runs N`: one line each, then how much they spread and how many runs
/// per host a diff needs at that spread to resolve a gap of `min_effect`.
pub fn write_runs(
    out: &mut dyn Write,
    runs: &[crate::model::profile::RunRecord],
    min_effect: f64,
) -> io::Result<()> {
    type Metric = (
        &'static str,
        fn(&crate::model::profile::RunRecord) -> Option<f64>,
        bool,
    );
    let metrics: [Metric; 4] = [
        ("IOPS", |r| r.iops(), false),
        ("mean", |r| r.stages.app.mean_ns(), true),
        ("p99", |r| r.stages.app.percentile_ns(99.0), true),
        ("p99.9", |r| r.stages.app.percentile_ns(99.9), true),
    ];
    let show = |v: Option<f64>, latency: bool| match v {
        Some(x) if latency => units::latency(x),
        Some(x) => units::count(x),
        None => "-".into(),
    };
    writeln!(
        out,
        "\nruns ({}), each on a freshly prepared target:",
        runs.len()
    )?;
    writeln!(
        out,
        "  {:>4} {:>10} {:>10} {:>10} {:>10}",
        "run", "IOPS", "mean", "p99", "p99.9"
    )?;
    for r in runs {
        let cells: Vec<String> = metrics.iter().map(|(_, f, lat)| show(f(r), *lat)).collect();
        writeln!(
            out,
            "  {:>4} {:>10} {:>10} {:>10} {:>10}",
            r.run, cells[0], cells[1], cells[2], cells[3]
        )?;
    }
    // Spread on the log scale, as the diff judges it.
    let spread = |f: fn(&crate::model::profile::RunRecord) -> Option<f64>| {
        let logs: Vec<f64> = runs
            .iter()
            .filter_map(f)
            .filter(|x| *x > 0.0)
            .map(f64::ln)
            .collect();
        stats::moments(&logs).filter(|m| m.n >= 2).map(|m| m.sd)
    };
    let parts: Vec<String> = metrics
        .iter()
        .filter_map(|(name, f, _)| spread(*f).map(|sd| format!("{name} {:.1}%", sd * 100.0)))
        .collect();
    if parts.is_empty() {
        return Ok(());
    }
    writeln!(out, "  run-to-run spread (sd): {}", parts.join(", "))?;
    if let Some(sd) = spread(metrics[1].1) {
        let bound = (1.0 + min_effect).ln();
        writeln!(
            out,
            "  at this spread, about {} runs per host resolve a {:.0}% gap in mean latency",
            stats::runs_to_resolve(sd, bound, stats::CONFIDENCE),
            min_effect * 100.0
        )?;
    }
    Ok(())
}

/// The tail autopsy of one run: the mean I/O, then the I/Os above p99 and p99.9 stage by
/// stage, and where the slowest set's extra time went.
pub fn write_tail(out: &mut dyn Write, tail: &crate::model::tail::TailAutopsy) -> io::Result<()> {
    let by = if tail.by_thread {
        "the slowest reads and writes joined to their block requests by thread and time"
    } else {
        "the slowest I/Os joined to their block requests by disk sector and time"
    };
    writeln!(out, "  tail autopsy ({by}):")?;
    if let Some(why) = &tail.unjoinable {
        writeln!(out, "    not joined: {why}")?;
    }
    let Some(first) = tail.sets.first() else {
        writeln!(out, "    no I/O above the p99 was kept")?;
        return Ok(());
    };
    writeln!(
        out,
        "    {:<22} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "", "I/Os", "joined", "app", "queue", "device", "complet.", "software"
    )?;
    let row = |out: &mut dyn Write,
               label: &str,
               ios: String,
               joined: String,
               s: &crate::model::stages::StageBreakdown| {
        writeln!(
            out,
            "    {label:<22} {ios:>7} {joined:>7} {:>9} {:>9} {:>9} {:>9} {:>9}",
            units::latency(s.app_ns),
            units::latency(s.queue_ns),
            units::latency(s.device_ns),
            units::latency(s.completion_ns),
            // The residual can be negative (a request's clock against the worker's reap).
            if s.software_ns < 0.0 {
                format!("-{}", units::latency(-s.software_ns))
            } else {
                units::latency(s.software_ns)
            },
        )
    };
    row(out, "mean I/O", "-".into(), "-".into(), &first.baseline)?;
    for set in &tail.sets {
        let label = format!(
            "above p{} ({})",
            set.percentile,
            units::latency(set.threshold_ns)
        );
        let joined = format!("{:.0}%", set.joined as f64 / set.ios.max(1) as f64 * 100.0);
        row(out, &label, set.ios.to_string(), joined, &set.mean)?;
    }
    for set in &tail.sets {
        if let Some(split) = set.joined_software {
            writeln!(
                out,
                "    software of the joined I/Os above p{}: {} before their request started, {} after it completed",
                set.percentile,
                units::latency(split.before_request_ns),
                units::latency(split.after_request_ns)
            )?;
        }
    }
    if let Some(last) = tail.sets.last() {
        let excess = last.excess();
        if excess.app_ns > 0.0 {
            let parts: Vec<String> = excess
                .parts()
                .iter()
                // + 0.0 turns a rounded -0 into 0.
                .map(|(name, ns)| {
                    format!("{name} {:.0}%", (ns / excess.app_ns * 100.0).round() + 0.0)
                })
                .collect();
            writeln!(
                out,
                "    the I/Os above p{} took {} more than the mean I/O: {}",
                last.percentile,
                units::latency(excess.app_ns),
                parts.join(", ")
            )?;
        }
        let kept = tail.sets.iter().map(|s| s.ios).sum::<u64>();
        let expected = tail.sets.iter().map(|s| s.expected_ios).sum::<u64>();
        if kept < expected * 9 / 10 {
            writeln!(
                out,
                "    only {kept} of the {expected} I/Os above the percentiles were kept (the running tail moved)"
            )?;
        }
    }
    if tail.requests_dropped > 0 {
        writeln!(
            out,
            "    {} slow requests were lost (the kernel's buffer was full): their I/Os count at the mean block stages",
            tail.requests_dropped
        )?;
    }
    Ok(())
}
