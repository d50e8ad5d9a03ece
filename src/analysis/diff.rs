//! `diff`: attributes the difference between two profiles to stages. A pure function of the two
//! profiles; rendering lives in `diff_render`.
//!
//! Means decompose exactly: app = queue + device + software, where software (app − queue −
//! device) is everything outside the block layer and the device — submission and completion
//! paths, interrupt handling, wakeups. So Δapp = Δqueue + Δdevice + Δsoftware, and each row's
//! share of the gap is its Δ over Δapp. Every Δ carries a 95% confidence interval from the
//! per-interval variation of both runs (Welch's t), and a row is called significant only when
//! that interval excludes zero *and* the difference exceeds a floor (25% of host A's value, and an
//! absolute minimum per unit), so run-to-run drift on a noisy host is not reported as a finding.

use std::collections::BTreeMap;

use serde::Serialize;
use statrs::distribution::{ContinuousCDF, StudentsT};

use crate::model::profile::{Histogram, Interval, Profile, Stage};

/// Relative part of the significance floor: back-to-back runs of one workload on one (noisy,
/// virtualized) host were seen to differ by up to 15% in device time, far more than their own
/// interval spread shows.
const REL_FLOOR: f64 = 0.25;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    Ns,
    PerIo,
    Iops,
}

impl Unit {
    /// The absolute part of the significance floor.
    fn floor(self) -> f64 {
        match self {
            // Stage means here are tens of µs to ms; a few µs is scheduler noise (mq-deadline
            // spikes moved an A/A queue mean from 1.4 to 5.7 µs).
            Unit::Ns => 5_000.0,
            Unit::PerIo => 0.02,
            Unit::Iops => 0.0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Significant,
    WithinNoise,
    /// Fewer than two intervals on a side: no interval to judge by.
    InsufficientData,
    /// One of the hosts could not measure it.
    NotMeasured,
}

impl Verdict {
    pub fn words(self) -> &'static str {
        match self {
            Self::Significant => "significant",
            Self::WithinNoise => "within noise",
            Self::InsufficientData => "too few intervals",
            Self::NotMeasured => "not measured",
        }
    }
}

/// One compared metric.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub metric: String,
    pub unit: Unit,
    pub a: Option<f64>,
    pub b: Option<f64>,
    pub delta: Option<f64>,
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
    pub verdict: Verdict,
    /// Share of the app-latency gap (waterfall rows only), as a fraction.
    pub share: Option<f64>,
    /// True for estimates built from counts rather than measured times.
    pub estimated: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Tail {
    pub stage: String,
    pub percentile: f64,
    pub a_ns: Option<f64>,
    pub b_ns: Option<f64>,
    pub delta_ns: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Evidence {
    pub item: String,
    pub a: String,
    pub b: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProfileDiff {
    pub host_a: String,
    pub host_b: String,
    pub workload: String,
    /// Workload keys whose values differ (empty: same workload).
    pub spec_differences: Vec<String>,
    /// Host differences that can confound the comparison.
    pub confounders: Vec<String>,
    pub warnings: Vec<String>,
    /// app, queue, device, software, then the software split.
    pub waterfall: Vec<Row>,
    pub tails: Vec<Tail>,
    /// The stage whose p99 moved most, with the move in ns.
    pub tail_mover: Option<(String, f64)>,
    pub throughput: Vec<Row>,
    pub evidence: Vec<Evidence>,
    /// Stage with the largest significant share of the gap, if any.
    pub verdict: Option<String>,
}

/// Keys of the workload spec that change what is measured (duration and ramp only change how
/// long, and the name and description nothing).
const SHAPE_KEYS: [&str; 12] = [
    "pattern",
    "rw",
    "rwmix_read",
    "bs",
    "qd",
    "workers",
    "engine",
    "distribution",
    "rate_iops",
    "size",
    "direct",
    "submit_batch",
];

/// Keys of a kv spec's `[kv]` table that change what is measured, besides the client load
/// (compared as resolved rates, however they were written); the slice and `max_lag` change
/// only how it is judged.
const KV_SHAPE_KEYS: [&str; 5] = [
    "record_bytes",
    "record_bytes_max",
    "defrag_lwm_pct",
    "fill_pct",
    "dsync",
];

/// Workload keys that differ between the two profiles' effective specs. For kv workloads the
/// `[kv]` table's load and store shape count, and `workers` does not: it is resolved per host
/// (one ring or five service threads per CPU) and only sets how much load the generator could
/// give, not the load asked for.
pub fn spec_differences(a: &Profile, b: &Profile) -> Vec<String> {
    let parse = |p: &Profile| -> BTreeMap<String, String> {
        let Ok(table) = toml::from_str::<toml::Table>(&p.workload.effective_spec) else {
            return BTreeMap::new();
        };
        let mut keys: BTreeMap<String, String> = table
            .iter()
            .filter(|(k, _)| SHAPE_KEYS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect();
        if let Some(kv) = table.get("kv").and_then(|v| v.as_table()) {
            keys.remove("workers");
            for k in KV_SHAPE_KEYS {
                if let Some(v) = kv.get(k) {
                    keys.insert(format!("kv.{k}"), v.to_string());
                }
            }
            let load = kv
                .clone()
                .try_into::<virtgap_workloads::kv::spec::KvSpec>()
                .map(|k| {
                    let (r, w) = k.rates();
                    format!("{r} reads/s + {w} writes/s")
                })
                .unwrap_or_else(|_| "(unreadable)".into());
            keys.insert("kv load".into(), load);
        }
        keys
    };
    let (sa, sb) = (parse(a), parse(b));
    let names: std::collections::BTreeSet<&String> = sa.keys().chain(sb.keys()).collect();
    // The workload's own keys first, in their usual order, then the kv table's.
    let mut names: Vec<&String> = names.into_iter().collect();
    names.sort_by_key(|k| {
        SHAPE_KEYS
            .iter()
            .position(|s| s == k)
            .unwrap_or(SHAPE_KEYS.len())
    });
    names
        .into_iter()
        .filter_map(|k| {
            let (va, vb) = (sa.get(k), sb.get(k));
            (va != vb).then(|| {
                let show = |v: Option<&String>| v.cloned().unwrap_or_else(|| "(unset)".into());
                format!("{k}: {} vs {}", show(va), show(vb))
            })
        })
        .collect()
}

fn confounders(a: &Profile, b: &Profile) -> Vec<String> {
    let mut out = Vec::new();
    let (ha, hb) = (&a.host, &b.host);
    let mut cmp = |what: &str, x: String, y: String| {
        if x != y {
            out.push(format!("{what}: {x} vs {y}"));
        }
    };
    let opt = |s: &Option<String>| s.clone().unwrap_or_else(|| "unknown".into());
    cmp("CPU count", ha.cpus.to_string(), hb.cpus.to_string());
    cmp("CPU model", opt(&ha.cpu_model), opt(&hb.cpu_model));
    cmp("clocksource", opt(&ha.clocksource), opt(&hb.clocksource));
    cmp("kernel", opt(&ha.kernel), opt(&hb.kernel));
    let dev = |p: &Profile| {
        let name = p.target.device.clone();
        p.host
            .block_devices
            .iter()
            .find(|d| Some(&d.name) == name.as_ref())
            .cloned()
    };
    match (dev(a), dev(b)) {
        (Some(da), Some(db)) => {
            cmp(
                "target device queues",
                da.queues.len().to_string(),
                db.queues.len().to_string(),
            );
            cmp("I/O scheduler", opt(&da.scheduler), opt(&db.scheduler));
            cmp(
                "rq_affinity",
                da.rq_affinity.map_or("unknown".into(), |v| v.to_string()),
                db.rq_affinity.map_or("unknown".into(), |v| v.to_string()),
            );
            let irq_cpus = |d: &crate::model::host::BlockDeviceInfo| {
                let v: Vec<String> = d
                    .queues
                    .iter()
                    .filter_map(|q| q.irq.as_ref()?.effective_affinity.clone())
                    .collect();
                if v.is_empty() {
                    "unknown".into()
                } else {
                    v.join(";")
                }
            };
            cmp(
                "IRQ affinity of the target's queues",
                irq_cpus(&da),
                irq_cpus(&db),
            );
        }
        _ => {
            out.push("target device unknown on one host: queue and IRQ layout not compared".into())
        }
    }
    out
}

/// Mean, standard deviation and count of a per-interval series.
fn moments(xs: &[f64]) -> Option<(f64, f64, usize)> {
    let n = xs.len();
    if n == 0 {
        return None;
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    let var = if n > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
    } else {
        0.0
    };
    Some((mean, var.sqrt(), n))
}

/// 95% confidence interval half-width of the difference of two means (Welch).
pub fn welch_half_width(a: &[f64], b: &[f64]) -> Option<f64> {
    let (_, sa, na) = moments(a)?;
    let (_, sb, nb) = moments(b)?;
    if na < 2 || nb < 2 {
        return None;
    }
    let (va, vb) = (sa * sa / na as f64, sb * sb / nb as f64);
    let se2 = va + vb;
    if se2 == 0.0 {
        return Some(0.0);
    }
    let df = se2 * se2 / (va * va / (na - 1) as f64 + vb * vb / (nb - 1) as f64);
    let t = StudentsT::new(0.0, 1.0, df.max(1.0))
        .ok()?
        .inverse_cdf(0.975);
    Some(t * se2.sqrt())
}

/// Builds a row from point values and per-interval series.
fn row(
    metric: &str,
    unit: Unit,
    a: Option<f64>,
    b: Option<f64>,
    sa: &[f64],
    sb: &[f64],
    estimated: bool,
) -> Row {
    let (delta, ci, verdict) = match (a, b) {
        (Some(a), Some(b)) => {
            let delta = b - a;
            match welch_half_width(sa, sb) {
                Some(hw) => {
                    let floor = (REL_FLOOR * a.abs()).max(unit.floor());
                    let excludes_zero = delta - hw > 0.0 || delta + hw < 0.0;
                    let verdict = if excludes_zero && delta.abs() >= floor {
                        Verdict::Significant
                    } else {
                        Verdict::WithinNoise
                    };
                    (Some(delta), Some((delta - hw, delta + hw)), verdict)
                }
                None => (Some(delta), None, Verdict::InsufficientData),
            }
        }
        _ => (None, None, Verdict::NotMeasured),
    };
    Row {
        metric: metric.into(),
        unit,
        a,
        b,
        delta,
        ci_low: ci.map(|c| c.0),
        ci_high: ci.map(|c| c.1),
        verdict,
        share: None,
        estimated,
    }
}

/// Per-interval series of one profile.
struct Series {
    app: Vec<f64>,
    queue: Vec<f64>,
    device: Vec<f64>,
    software: Vec<f64>,
    wakeup_per_io: Vec<f64>,
    hardirq_per_io: Vec<f64>,
    softirq_per_io: Vec<f64>,
    ipis_per_io: Vec<f64>,
    msr_per_io: Vec<f64>,
    iops: Vec<f64>,
    app_p99: Vec<f64>,
}

fn stage_mean(iv: &Interval, stage: Stage) -> Option<f64> {
    iv.stage(stage)
        .filter(|s| s.count > 0)
        .map(|s| s.sum_ns as f64 / s.count as f64)
}

fn series(p: &Profile) -> Series {
    // Only full intervals: a short last one has few I/Os and would skew the spread.
    let longest = p
        .intervals
        .iter()
        .map(|i| i.end_s - i.start_s)
        .fold(0.0, f64::max);
    let full: Vec<&Interval> = p
        .intervals
        .iter()
        .filter(|i| i.lat_count > 0 && (i.end_s - i.start_s) >= longest * 0.99)
        .collect();
    let per_io = |f: &dyn Fn(&Interval) -> Option<f64>| -> Vec<f64> {
        full.iter()
            .filter_map(|i| f(i).map(|v| v / i.lat_count as f64))
            .collect()
    };
    let measured_cpus = |i: &Interval| (!i.cpus.is_empty()).then_some(());
    Series {
        app: full
            .iter()
            .map(|i| i.lat_sum_ns / i.lat_count as f64)
            .collect(),
        queue: full
            .iter()
            .filter_map(|i| stage_mean(i, Stage::Queue))
            .collect(),
        device: full
            .iter()
            .filter_map(|i| stage_mean(i, Stage::Device))
            .collect(),
        software: full
            .iter()
            .filter_map(|i| {
                Some(
                    i.lat_sum_ns / i.lat_count as f64
                        - stage_mean(i, Stage::Queue)?
                        - stage_mean(i, Stage::Device)?,
                )
            })
            .collect(),
        wakeup_per_io: per_io(&|i| i.stage(Stage::Wakeup).map(|s| s.sum_ns as f64)),
        hardirq_per_io: per_io(&|i| {
            measured_cpus(i).map(|_| i.cpus.iter().map(|c| c.hardirq_ns as f64).sum())
        }),
        softirq_per_io: per_io(&|i| {
            measured_cpus(i).map(|_| i.cpus.iter().map(|c| c.softirq_ns as f64).sum())
        }),
        ipis_per_io: per_io(&|i| {
            measured_cpus(i).map(|_| {
                i.cpus
                    .iter()
                    .flat_map(|c| c.ipis_sent.values())
                    .map(|&n| n as f64)
                    .sum()
            })
        }),
        msr_per_io: per_io(&|i| i.msr_writes.map(|n| n as f64)),
        iops: full
            .iter()
            .map(|i| (i.read_ios as f64 + i.write_ios as f64) / (i.end_s - i.start_s))
            .collect(),
        app_p99: full
            .iter()
            .filter_map(|i| i.lat_p99_ns.map(|v| v as f64))
            .collect(),
    }
}

/// Whole-run point values of one profile.
struct Points {
    app: Option<f64>,
    queue: Option<f64>,
    device: Option<f64>,
    wakeup_per_io: Option<f64>,
    hardirq_per_io: Option<f64>,
    softirq_per_io: Option<f64>,
    ipis_per_io: Option<f64>,
    msr_per_io: Option<f64>,
    iops: Option<f64>,
}

fn points(p: &Profile) -> Points {
    // Counts from a profile file: summed as floats so no file can overflow them.
    let ios = p.results.read.ios as f64 + p.results.write.ios as f64;
    // Probe totals span the probes' lifetime, a little longer than the measured window: scale
    // per-I/O figures by the I/Os completed over the same span (the device stage's count).
    let span_ios = p
        .stages
        .device
        .as_ref()
        .map(|d| d.count as f64)
        .filter(|&n| n > 0.0);
    let per_span_io = |total: f64| span_ios.map(|n| total / n);
    let have_cpus = !p.cpus.is_empty();
    Points {
        app: p.stages.app.mean_ns(),
        queue: p.stages.queue.as_ref().and_then(Histogram::mean_ns),
        device: p.stages.device.as_ref().and_then(Histogram::mean_ns),
        wakeup_per_io: p.stages.wakeup.as_ref().and_then(|w| per_span_io(w.sum_ns)),
        hardirq_per_io: have_cpus
            .then(|| per_span_io(p.cpus.iter().map(|c| c.hardirq_ns as f64).sum()))
            .flatten(),
        softirq_per_io: have_cpus
            .then(|| per_span_io(p.cpus.iter().map(|c| c.softirq_ns as f64).sum()))
            .flatten(),
        ipis_per_io: have_cpus
            .then(|| {
                per_span_io(
                    p.cpus
                        .iter()
                        .flat_map(|c| c.ipis_sent.values())
                        .map(|&n| n as f64)
                        .sum(),
                )
            })
            .flatten(),
        msr_per_io: {
            let n: Vec<f64> = p
                .intervals
                .iter()
                .filter_map(|i| i.msr_writes.map(|v| v as f64))
                .collect();
            let ios: f64 = p
                .intervals
                .iter()
                .filter(|i| i.msr_writes.is_some())
                .map(|i| i.lat_count as f64)
                .sum();
            (!n.is_empty() && ios > 0.0).then(|| n.iter().sum::<f64>() / ios)
        },
        iops: (p.results.measured_s > 0.0).then(|| ios / p.results.measured_s),
    }
}

/// The calibrated cost of one exit (cpuid's median), when the profile was calibrated.
fn exit_cost(p: &Profile) -> Option<f64> {
    p.calibration
        .as_ref()?
        .figures
        .iter()
        .find(|f| f.name == "cpuid")
        .map(|f| f.median_ns)
}

fn saturation(p: &Profile) -> String {
    let Some(secs) = p.probe_seconds.filter(|s| *s > 0.0) else {
        return "not measured".into();
    };
    p.cpus
        .iter()
        .map(|c| {
            (
                c.cpu,
                (c.hardirq_ns + c.softirq_ns) as f64 / 1e9 / secs * 100.0,
            )
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or("no interrupts seen".into(), |(cpu, pct)| {
            format!("CPU {cpu} at {pct:.1}% in IRQ+softirq")
        })
}

fn msr_rates(p: &Profile) -> String {
    let Some(v) = &p.virtualization else {
        return "not measured".into();
    };
    let Some(writes) = v.msr_writes.as_ref().filter(|_| v.seconds > 0.0) else {
        return "not measured".into();
    };
    let mut by: BTreeMap<String, f64> = BTreeMap::new();
    // Only writes that exit, and not the recording tool's own.
    for w in writes.iter().filter(|w| w.exits && !w.by_sampler) {
        *by.entry(format!("{} {}", w.msr, w.name)).or_default() += w.count as f64 / v.seconds;
    }
    let mut v: Vec<_> = by.into_iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    if v.is_empty() {
        return "none seen".into();
    }
    v.iter()
        .take(3)
        .map(|(n, r)| format!("{n} {r:.0}/s"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn hv_share(p: &Profile) -> String {
    let Some(v) = p.virtualization.as_ref() else {
        return "not measured".into();
    };
    let Some(sampler) = v.sampler.as_ref() else {
        return "not measured".into();
    };
    sampler
        .cpus
        .iter()
        .map(|c| {
            if !c.represents(sampler.frequency_hz, v.seconds) {
                return format!("cpu{} not measured", c.cpu);
            }
            let hv = c.in_category("hypervisor interface") as f64;
            format!(
                "cpu{} {:.1}%",
                c.cpu,
                hv / (c.samples.max(1)) as f64 * 100.0
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn steal(p: &Profile) -> String {
    // In f64: the figures come from a profile file and must not overflow a sum.
    let steal: Option<f64> = p.cpus.iter().map(|c| c.steal_ns.map(|v| v as f64)).sum();
    let total: f64 = p
        .cpus
        .iter()
        .map(|c| {
            [c.user_ns, c.system_ns, c.idle_ns, c.steal_ns]
                .iter()
                .map(|v| v.unwrap_or(0) as f64)
                .sum::<f64>()
                + c.hardirq_ns as f64
                + c.softirq_ns as f64
        })
        .sum();
    match steal {
        Some(s) if total > 0.0 => {
            format!("{:.2}% of CPU time ({:.0} ms)", s / total * 100.0, s / 1e6)
        }
        _ => "not measured".into(),
    }
}

fn cross_cpu(p: &Profile) -> String {
    let total: f64 = p.cpu_pairs.iter().map(|x| x[2] as f64).sum();
    if total == 0.0 {
        return "not measured".into();
    }
    let cross: f64 = p
        .cpu_pairs
        .iter()
        .filter(|x| x[0] != x[1])
        .map(|x| x[2] as f64)
        .sum();
    format!("{:.1}% of {total:.0}", cross / total * 100.0)
}

/// Compares two profiles: A is the reference, B the host being explained.
pub fn diff(a: &Profile, b: &Profile) -> ProfileDiff {
    let (sa, sb) = (series(a), series(b));
    let (pa, pb) = (points(a), points(b));
    let software = |p: &Points| Some(p.app? - p.queue? - p.device?);

    let mut waterfall = vec![
        row(
            "app latency (mean)",
            Unit::Ns,
            pa.app,
            pb.app,
            &sa.app,
            &sb.app,
            false,
        ),
        row(
            "  block queue",
            Unit::Ns,
            pa.queue,
            pb.queue,
            &sa.queue,
            &sb.queue,
            false,
        ),
        row(
            "  device",
            Unit::Ns,
            pa.device,
            pb.device,
            &sa.device,
            &sb.device,
            false,
        ),
        row(
            "  software: submit + completion",
            Unit::Ns,
            software(&pa),
            software(&pb),
            &sa.software,
            &sb.software,
            false,
        ),
        row(
            "    wakeup delay per I/O",
            Unit::Ns,
            pa.wakeup_per_io,
            pb.wakeup_per_io,
            &sa.wakeup_per_io,
            &sb.wakeup_per_io,
            false,
        ),
        row(
            "    hard-IRQ time per I/O (all IRQs)",
            Unit::Ns,
            pa.hardirq_per_io,
            pb.hardirq_per_io,
            &sa.hardirq_per_io,
            &sb.hardirq_per_io,
            false,
        ),
        row(
            "    softirq time per I/O (all)",
            Unit::Ns,
            pa.softirq_per_io,
            pb.softirq_per_io,
            &sa.softirq_per_io,
            &sb.softirq_per_io,
            false,
        ),
        row(
            "    IPIs sent per I/O",
            Unit::PerIo,
            pa.ipis_per_io,
            pb.ipis_per_io,
            &sa.ipis_per_io,
            &sb.ipis_per_io,
            false,
        ),
        row(
            "    exit-causing MSR writes per I/O",
            Unit::PerIo,
            pa.msr_per_io,
            pb.msr_per_io,
            &sa.msr_per_io,
            &sb.msr_per_io,
            false,
        ),
        row(
            "    est. MSR exit time per I/O",
            Unit::Ns,
            pa.msr_per_io.zip(exit_cost(a)).map(|(n, c)| n * c),
            pb.msr_per_io.zip(exit_cost(b)).map(|(n, c)| n * c),
            &[],
            &[],
            true,
        ),
    ];
    let gap = waterfall[0].delta.filter(|d| d.abs() > 0.0);
    for r in waterfall
        .iter_mut()
        .skip(1)
        .filter(|r| r.unit == Unit::Ns && !r.estimated)
    {
        r.share = gap.zip(r.delta).map(|(g, d)| d / g);
    }

    let mut tails = Vec::new();
    for (stage, ha, hb) in Stage::ALL.map(|s| (s.name(), a.stages.get(s), b.stages.get(s))) {
        for pct in [50.0, 99.0, 99.9] {
            let (x, y) = (
                ha.and_then(|h| h.percentile_ns(pct)),
                hb.and_then(|h| h.percentile_ns(pct)),
            );
            tails.push(Tail {
                stage: stage.into(),
                percentile: pct,
                a_ns: x,
                b_ns: y,
                delta_ns: x.zip(y).map(|(x, y)| y - x),
            });
        }
    }
    let tail_mover = tails
        .iter()
        .filter(|t| t.stage != "app" && t.percentile == 99.0)
        .filter_map(|t| t.delta_ns.map(|d| (t.stage.clone(), d)))
        .max_by(|x, y| x.1.abs().total_cmp(&y.1.abs()));

    let throughput = vec![
        row(
            "IOPS",
            Unit::Iops,
            pa.iops,
            pb.iops,
            &sa.iops,
            &sb.iops,
            false,
        ),
        tail_row(row(
            "app latency p99 (per interval)",
            Unit::Ns,
            median(&sa.app_p99),
            median(&sb.app_p99),
            &sa.app_p99,
            &sb.app_p99,
            false,
        )),
    ];

    let overhead = |p: &Profile| {
        p.self_overhead
            .probe_cpu_pct
            .map_or("not measured".into(), |v| {
                format!("probes {v:.2}% of one CPU")
            })
    };
    let mut evidence = vec![
        Evidence {
            item: "busiest IRQ CPU".into(),
            a: saturation(a),
            b: saturation(b),
        },
        Evidence {
            item: "completions on another CPU".into(),
            a: cross_cpu(a),
            b: cross_cpu(b),
        },
        Evidence {
            item: "steal (all CPUs)".into(),
            a: steal(a),
            b: steal(b),
        },
        Evidence {
            item: "exit-causing MSR writes per second".into(),
            a: msr_rates(a),
            b: msr_rates(b),
        },
        Evidence {
            item: "hypervisor-interface share of samples".into(),
            a: hv_share(a),
            b: hv_share(b),
        },
        Evidence {
            item: "recording self-overhead".into(),
            a: overhead(a),
            b: overhead(b),
        },
    ];
    // Stalls are findings in their own right: shown whenever either side was checked for them.
    if a.stalls.is_some() || b.stalls.is_some() {
        let stalls = |p: &Profile| match &p.stalls {
            None => "not checked".to_string(),
            Some(s) if s.found() => s.describe(),
            Some(_) => "none".to_string(),
        };
        evidence.push(Evidence {
            item: "stalls".into(),
            a: stalls(a),
            b: stalls(b),
        });
    }

    let verdict = if waterfall[0].verdict == Verdict::Significant {
        waterfall[1..4]
            .iter()
            .filter(|r| r.verdict == Verdict::Significant && r.share.is_some_and(|s| s > 0.0))
            .max_by(|x, y| x.share.unwrap_or(0.0).total_cmp(&y.share.unwrap_or(0.0)))
            .map(|r| r.metric.trim().to_string())
    } else {
        None
    };

    let mut warnings = Vec::new();
    for (label, p) in [("A", a), ("B", b)] {
        if !p.complete {
            warnings.push(format!(
                "profile {label} is incomplete (the run was interrupted)"
            ));
        }
        if p.capabilities.is_none() {
            warnings.push(format!(
                "profile {label} was recorded without probes: only app latency compares"
            ));
        }
        if let Some(s) = p.stalls.as_ref().filter(|s| s.found()) {
            warnings.push(format!(
                "host {label} stalled during its run ({}): its figures are not steady state",
                s.describe()
            ));
        }
    }

    ProfileDiff {
        host_a: a.host.describe(),
        host_b: b.host.describe(),
        workload: format!("{} ({})", a.workload.name, a.workload.origin),
        spec_differences: spec_differences(a, b),
        confounders: confounders(a, b),
        warnings,
        waterfall,
        tails,
        tail_mover,
        throughput,
        evidence,
        verdict,
    }
}

/// Tails of a virtualized host swing severalfold between identical runs (a 3.1x swing of the
/// per-interval p99 was seen in an A/A pair here): a tail row only counts as significant when
/// one side is at least this many times the other.
const TAIL_RATIO_FLOOR: f64 = 4.0;

fn tail_row(mut r: Row) -> Row {
    if let (Verdict::Significant, Some(a), Some(b)) = (r.verdict, r.a, r.b) {
        let (lo, hi) = if a < b { (a, b) } else { (b, a) };
        if lo <= 0.0 || hi / lo < TAIL_RATIO_FLOOR {
            r.verdict = Verdict::WithinNoise;
        }
    }
    r
}

fn median(xs: &[f64]) -> Option<f64> {
    let mut v = xs.to_vec();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::profile::{CpuLoad, StageSample};

    /// A profile whose every interval has the given stage means (ns) plus deterministic jitter.
    pub(crate) fn synthetic(
        queue: f64,
        device: f64,
        software: f64,
        jitter: f64,
        n: usize,
    ) -> Profile {
        let mut p: Profile =
            serde_json::from_str(include_str!("../../tests/data/minimal-profile.json")).unwrap();
        let ios = 1000u64;
        let mut app = crate::model::profile::Histogram::default();
        let (mut qh, mut dh) = (Histogram::default(), Histogram::default());
        p.intervals = (0..n)
            .map(|i| {
                // Alternating jitter: mean unchanged, spread `jitter`.
                let j = if i % 2 == 0 { jitter } else { -jitter };
                let (q, d, s) = (queue + j * 0.1, device + j, software + j * 0.2);
                let lat = q + d + s;
                Interval {
                    index: i as u64,
                    start_s: i as f64,
                    end_s: i as f64 + 1.0,
                    read_ios: ios,
                    lat_count: ios,
                    lat_sum_ns: lat * ios as f64,
                    lat_p99_ns: Some((lat * 2.0) as u64),
                    stages: BTreeMap::from([
                        (
                            "queue".into(),
                            StageSample {
                                count: ios,
                                sum_ns: (q * ios as f64) as u64,
                            },
                        ),
                        (
                            "device".into(),
                            StageSample {
                                count: ios,
                                sum_ns: (d * ios as f64) as u64,
                            },
                        ),
                    ]),
                    cpus: vec![CpuLoad {
                        cpu: 0,
                        hardirq_ns: 1_000_000,
                        ..Default::default()
                    }],
                    ..Default::default()
                }
            })
            .collect();
        let total = ios * n as u64;
        app.count = total;
        app.sum_ns = (queue + device + software) * total as f64;
        qh.count = total;
        qh.sum_ns = queue * total as f64;
        dh.count = total;
        dh.sum_ns = device * total as f64;
        // One bucket around each mean, so the distributions have a shape to draw.
        let around = |mean: f64| [(mean * 0.9) as u64, (mean * 1.1) as u64, total];
        app.buckets = vec![around(queue + device + software)];
        qh.buckets = vec![around(queue)];
        dh.buckets = vec![around(device)];
        p.stages.app = app;
        p.stages.queue = Some(qh);
        p.stages.device = Some(dh);
        p.results.read.ios = total;
        p.results.measured_s = n as f64;
        p.capabilities = Some(Default::default());
        p.cpus = vec![CpuLoad {
            cpu: 0,
            hardirq_ns: 1_000_000 * n as u64,
            ..Default::default()
        }];
        p.probe_seconds = Some(n as f64);
        p
    }

    #[test]
    fn counts_near_the_top_of_u64_in_a_profile_do_not_overflow_the_diff() {
        let mut p: Profile =
            serde_json::from_str(include_str!("../../tests/data/minimal-profile.json")).unwrap();
        p.results.read.ios = 2;
        p.results.write.ios = u64::MAX - 1;
        for i in &mut p.intervals {
            i.read_ios = u64::MAX;
            i.write_ios = u64::MAX;
        }
        let d = diff(&p, &p);
        assert!(d.spec_differences.is_empty());
    }

    #[test]
    fn waterfall_decomposes_the_gap_exactly() {
        let a = synthetic(2_000.0, 300_000.0, 100_000.0, 5_000.0, 10);
        let b = synthetic(2_000.0, 800_000.0, 110_000.0, 5_000.0, 10);
        let d = diff(&a, &b);
        let w = &d.waterfall;
        let gap = w[0].delta.unwrap();
        assert!((gap - 510_000.0).abs() < 1.0, "{gap}");
        let parts: f64 = w[1..4].iter().map(|r| r.delta.unwrap()).sum();
        assert!(
            (parts - gap).abs() < 1e-6,
            "Δqueue + Δdevice + Δsoftware = Δapp"
        );
        let shares: f64 = w[1..4].iter().map(|r| r.share.unwrap()).sum();
        assert!((shares - 1.0).abs() < 1e-9);
        assert_eq!(w[2].verdict, Verdict::Significant);
        assert!((w[2].share.unwrap() - 500.0 / 510.0).abs() < 1e-9);
        assert_eq!(d.verdict.as_deref(), Some("device"));
        assert_eq!(
            w[8].verdict,
            Verdict::NotMeasured,
            "MSR writes are not in these profiles"
        );
    }

    #[test]
    fn identical_runs_show_no_significant_difference() {
        let a = synthetic(2_000.0, 300_000.0, 100_000.0, 20_000.0, 10);
        let b = synthetic(2_000.0, 301_000.0, 99_500.0, 20_000.0, 10);
        let d = diff(&a, &b);
        for r in d.waterfall.iter().chain(&d.throughput) {
            assert_ne!(r.verdict, Verdict::Significant, "{}", r.metric);
        }
        assert_eq!(d.verdict, None);
    }

    #[test]
    fn small_but_certain_differences_stay_below_the_floor() {
        // 0.5 µs on a 400 µs app latency with no jitter: the CI excludes zero, the floor does not.
        let a = synthetic(2_000.0, 300_000.0, 100_000.0, 0.0, 10);
        let b = synthetic(2_000.0, 300_500.0, 100_000.0, 0.0, 10);
        assert_eq!(diff(&a, &b).waterfall[2].verdict, Verdict::WithinNoise);
    }

    #[test]
    fn tails_need_a_severalfold_change() {
        let base = |a: f64, b: f64| Row {
            metric: "p99".into(),
            unit: Unit::Ns,
            a: Some(a),
            b: Some(b),
            delta: Some(b - a),
            ci_low: Some(b - a - 1.0),
            ci_high: Some(b - a + 1.0),
            verdict: Verdict::Significant,
            share: None,
            estimated: false,
        };
        assert_eq!(
            tail_row(base(2.4e6, 0.76e6)).verdict,
            Verdict::WithinNoise,
            "3.1x is run-to-run noise here"
        );
        assert_eq!(
            tail_row(base(2.4e6, 9.8e6)).verdict,
            Verdict::Significant,
            "the seed's 4x p99 gap counts"
        );
    }

    #[test]
    fn welch_interval_matches_a_textbook_case() {
        // Two samples of 5 with variances 2.5 and 2.5: SE = 1, df = 8, t(0.975, 8) = 2.306.
        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        let b = [3.0, 4.0, 5.0, 6.0, 7.0];
        let hw = welch_half_width(&a, &b).unwrap();
        assert!((hw - 2.306).abs() < 0.001, "{hw}");
        assert_eq!(welch_half_width(&a[..1], &b), None);
    }

    #[test]
    fn different_workloads_are_named() {
        let a = synthetic(1.0, 1.0, 1.0, 0.0, 3);
        let mut b = a.clone();
        b.workload.effective_spec = b.workload.effective_spec.replace("qd = 32", "qd = 1");
        assert_eq!(spec_differences(&a, &b), ["qd: 32 vs 1"]);
        assert!(spec_differences(&a, &a).is_empty());
    }

    /// A kv profile's effective spec as `record` writes it, after `edit`.
    fn kv_profile(edit: impl FnOnce(&mut virtgap_workloads::spec::WorkloadSpec)) -> Profile {
        let mut spec = virtgap_workloads::spec::load("kv-act").unwrap().spec;
        spec.workers = 2;
        edit(&mut spec);
        let mut p = synthetic(1.0, 1.0, 1.0, 0.0, 3);
        p.workload.effective_spec = spec.to_toml();
        p
    }

    #[test]
    fn kv_profiles_differ_by_their_load_not_by_their_hosts_thread_count() {
        let one_x = kv_profile(|_| {});
        let same_on_a_bigger_host = kv_profile(|s| s.workers = 64);
        assert!(
            spec_differences(&one_x, &same_on_a_bigger_host).is_empty(),
            "workers is resolved per host"
        );
        let thirty_x = kv_profile(|s| s.kv.as_mut().unwrap().x = Some(30));
        assert_eq!(
            spec_differences(&one_x, &thirty_x),
            ["kv load: 2000 reads/s + 1000 writes/s vs 60000 reads/s + 30000 writes/s"]
        );
        let written_as_rates = kv_profile(|s| {
            let k = s.kv.as_mut().unwrap();
            (k.x, k.read_rps, k.write_rps) = (None, Some(2000), Some(1000));
        });
        assert!(
            spec_differences(&one_x, &written_as_rates).is_empty(),
            "the same load however it was asked for"
        );
        let bigger_records = kv_profile(|s| {
            s.kv.as_mut().unwrap().record_bytes = virtgap_workloads::spec::ByteSize(4096);
        });
        let differences = spec_differences(&one_x, &bigger_records);
        assert_eq!(differences.len(), 1, "{differences:?}");
        assert!(
            differences[0].starts_with("kv.record_bytes: "),
            "{differences:?}"
        );
    }

    #[test]
    fn host_differences_are_listed_as_confounders() {
        let a = synthetic(1.0, 1.0, 1.0, 0.0, 3);
        let mut b = a.clone();
        b.host.cpus = 72;
        b.host.clocksource = Some("xen".into());
        let c = diff(&a, &b).confounders;
        assert!(
            c.iter().any(|x| x.starts_with("CPU count: 2 vs 72")),
            "{c:?}"
        );
        assert!(
            c.iter().any(|x| x.starts_with("clocksource: tsc vs xen")),
            "{c:?}"
        );
    }
}
