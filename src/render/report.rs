//! Reports of a run: the human summary, and JSON laid out like fio's so fio parsers read it
//! (`jobs[0].read.iops`, `jobs[0].read.clat_ns.percentile["99.000000"]`, ...).

use std::io::{self, Write};
use std::time::SystemTime;

use serde_json::{json, Map, Value};
use virtgap_workloads::histogram::{LatencyHistogram, FIO_PERCENTILES};
use virtgap_workloads::stats::{DirStats, RunStats};
use virtgap_workloads::target::Target;
use virtgap_workloads::units;
use virtgap_workloads::WorkloadSpec;

use crate::run::pipeline::ProbeResults;
use crate::run::series::{IntervalSeries, SeriesPoint};

/// Everything a report is made from.
#[derive(Debug)]
pub struct Report<'a> {
    pub spec: &'a WorkloadSpec,
    pub origin: &'a str,
    pub target: &'a Target,
    pub stats: &'a RunStats,
    pub series: &'a IntervalSeries,
    /// The series' points, read back.
    pub points: &'a [SeriesPoint],
    pub stalls: &'a crate::model::stalls::Stalls,
    pub interrupted: bool,
    pub started: SystemTime,
    pub probes: &'a ProbeResults,
    /// The disks whose block stages are the target's.
    pub disks: &'a crate::model::host::TargetDisks,
}

/// Per-interval IOPS and bandwidth spread of one direction.
struct Spread {
    min: f64,
    max: f64,
    mean: f64,
    stddev: f64,
    samples: usize,
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

/// Full-length intervals only: a short last interval would skew the spread.
fn full_intervals<'a>(r: &'a Report<'_>) -> impl Iterator<Item = &'a SeriesPoint> {
    let points = r.points;
    let longest = points
        .iter()
        .map(|s| s.end_ns - s.start_ns)
        .max()
        .unwrap_or(0);
    points
        .iter()
        .filter(move |s| s.end_ns - s.start_ns == longest && longest > 0)
}

/// fio's `{min,max,mean,stddev,N,percentile}` object for one latency distribution.
fn latency_json(h: &LatencyHistogram, percentiles: bool) -> Value {
    let mut m = Map::new();
    m.insert("min".into(), json!(h.min_ns().unwrap_or(0)));
    m.insert("max".into(), json!(h.max_ns().unwrap_or(0)));
    m.insert("mean".into(), json!(h.mean_ns().unwrap_or(0.0)));
    m.insert("stddev".into(), json!(h.stddev_ns().unwrap_or(0.0)));
    m.insert("N".into(), json!(h.count()));
    if percentiles && !h.is_empty() {
        let pct: Map<String, Value> = FIO_PERCENTILES
            .iter()
            .map(|&p| (format!("{p:.6}"), json!(h.percentile_ns(p).unwrap_or(0))))
            .collect();
        m.insert("percentile".into(), Value::Object(pct));
    }
    Value::Object(m)
}

fn direction_json(r: &Report<'_>, d: &DirStats, write: bool) -> Value {
    let secs = r.stats.seconds();
    let rate = |x: u64| if secs > 0.0 { x as f64 / secs } else { 0.0 };
    let ios = |s: &SeriesPoint| {
        if write {
            s.interval.write_ios
        } else {
            s.interval.read_ios
        }
    };
    let bytes = |s: &SeriesPoint| {
        if write {
            s.interval.write_bytes
        } else {
            s.interval.read_bytes
        }
    };
    let iops = spread(full_intervals(r).map(|s| ios(s) as f64 / s.secs()));
    let bw_kib = spread(full_intervals(r).map(|s| bytes(s) as f64 / 1024.0 / s.secs()));
    let mut m = Map::new();
    m.insert("io_bytes".into(), json!(d.bytes));
    m.insert("io_kbytes".into(), json!(d.bytes / 1024));
    m.insert("bw_bytes".into(), json!(rate(d.bytes) as u64));
    m.insert("bw".into(), json!((rate(d.bytes) / 1024.0) as u64));
    m.insert("iops".into(), json!(rate(d.ios)));
    m.insert("runtime".into(), json!(r.stats.measured_ns / 1_000_000));
    m.insert("total_ios".into(), json!(d.ios));
    m.insert("short_ios".into(), json!(0));
    m.insert("drop_ios".into(), json!(0));
    m.insert("slat_ns".into(), latency_json(&d.slat, false));
    m.insert("clat_ns".into(), latency_json(&d.clat, true));
    m.insert("lat_ns".into(), latency_json(&d.lat, true));
    if !d.lat_intended.is_empty() {
        m.insert(
            "lat_intended_ns".into(),
            latency_json(&d.lat_intended, true),
        );
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

pub fn json(r: &Report<'_>) -> Value {
    let spec = r.spec;
    let secs = r.stats.seconds();
    let pct = |ns: u64| {
        if secs > 0.0 {
            ns as f64 / 1e9 / secs * 100.0
        } else {
            0.0
        }
    };
    let timestamp = r
        .started
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let intervals: Vec<Value> = r
        .points
        .iter()
        .map(|s| {
            let iv = &s.interval;
            json!({
                "start_ms": s.start_ns / 1_000_000,
                "end_ms": s.end_ns / 1_000_000,
                "read_ios": iv.read_ios,
                "write_ios": iv.write_ios,
                "read_bytes": iv.read_bytes,
                "write_bytes": iv.write_bytes,
                "iops": if s.secs() > 0.0 { (iv.read_ios + iv.write_ios) as f64 / s.secs() } else { 0.0 },
                "lat_p50_ns": iv.lat_p50_ns,
                "lat_p99_ns": iv.lat_p99_ns,
                "lat_mean_ns": s.lat_mean_ns(),
            })
        })
        .collect();
    json!({
        "virtgap_version": env!("CARGO_PKG_VERSION"),
        "timestamp": timestamp,
        "interrupted": r.interrupted,
        "workload": {
            "name": spec.name,
            "origin": r.origin,
            "spec_toml": spec.to_toml(),
            "fio_equivalent": spec.fio_command(&r.target.path.display().to_string()),
        },
        "target": {
            "description": r.target.describe(),
            "path": r.target.path.display().to_string(),
            "size_bytes": r.target.size,
        },
        "jobs": [{
            "jobname": spec.name,
            "groupid": 0,
            "error": 0,
            "elapsed": (secs.round() as u64),
            "job options": {
                "rw": spec.fio_rw(),
                "bs": spec.bs.0.to_string(),
                "iodepth": spec.qd.to_string(),
                "numjobs": spec.workers.to_string(),
                "ioengine": spec.engine.name(),
                "direct": u8::from(spec.direct).to_string(),
            },
            "read": direction_json(r, &r.stats.read, false),
            "write": direction_json(r, &r.stats.write, true),
            "usr_cpu": pct(r.stats.cpu.user_ns),
            "sys_cpu": pct(r.stats.cpu.system_ns),
            "ctx": r.stats.cpu.context_switches,
            "engine_features": r.stats.engine_features,
            "intervals": intervals,
        }],
        "probes": probes_json(r.probes),
        "stalls": r.stalls,
        "kv": r.stats.kv.as_deref().map(crate::render::kv_report::section),
    })
}

fn probes_json(p: &ProbeResults) -> Value {
    match &p.report {
        None => Value::Null,
        Some(report) => json!({
            "capabilities": report,
            "cumulative": p.cumulative,
            "device_names": p
                .device_names
                .iter()
                .map(|((a, b), n)| (format!("{a}:{b}"), Value::from(n.clone())))
                .collect::<Map<String, Value>>(),
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
        crate::analysis::diff::moments(&logs)
            .filter(|&(_, _, n)| n >= 2)
            .map(|(_, sd, _)| sd)
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
            crate::analysis::diff::runs_to_resolve(sd, bound, crate::analysis::diff::CONFIDENCE),
            min_effect * 100.0
        )?;
    }
    Ok(())
}

/// The tail autopsy of one run: the mean I/O, then the I/Os above p99 and p99.9 stage by
/// stage, and where the slowest set's extra time went.
pub fn write_tail(out: &mut dyn Write, tail: &crate::model::tail::TailAutopsy) -> io::Result<()> {
    writeln!(
        out,
        "  tail autopsy (the slowest I/Os joined to their block requests by disk sector and time):"
    )?;
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
               s: &crate::model::tail::TailStages| {
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
