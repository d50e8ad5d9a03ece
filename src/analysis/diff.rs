//! `diff`: attributes the difference between two hosts' profiles to stages. A pure function of
//! the profiles; rendering lives in `render::diff_render`.
//!
//! Means decompose exactly: app = queue + device + software, where software (app − queue −
//! device) is everything outside the block layer and the device — submission and completion
//! paths, interrupt handling, wakeups. So Δapp = Δqueue + Δdevice + Δsoftware, and each stage's
//! share of the gap is its Δ over Δapp.
//!
//! Verdicts compare replicates. With two or more runs per host (`record --runs N`) a replicate
//! is a run, and each metric is compared as the ratio B/A on the log scale with a Welch 95%
//! interval over runs. With one run on a side, between-run noise is unknown: replicates are
//! then batches of consecutive intervals (batch means, so autocorrelated intervals do not pose
//! as independent ones) and the verdicts say they are within-run only. A row is a difference
//! only when its interval excludes no change *and* its estimate reaches the user's smallest
//! effect of interest (`--min-effect`); it is equivalent when the whole interval lies inside
//! ±that effect; otherwise inconclusive, with the runs per host that would resolve it. Every
//! rule is symmetric: swapping A and B mirrors each row.

use std::collections::BTreeMap;

use serde::Serialize;
use statrs::distribution::{ContinuousCDF, Normal, StudentsT};

use crate::model::profile::{
    IdleBaseline, Interval, Profile, QueueStart, RequestsPerIo, RunRecord, Stage,
};
use crate::model::tail::TailStages;

/// The smallest effect `diff` calls a difference unless told otherwise: 5%, the size of gap the
/// tool is for (a VM 8% short of bare metal) and about the run-to-run spread of a quiet host.
pub const DEFAULT_MIN_EFFECT: f64 = 0.05;

/// Power of the "runs that would resolve it" estimate: runs enough to tell an effect of the
/// stated size from none 80% of the time at the 95% level.
const Z_POWER: f64 = 0.841_621;

/// The confidence of one row's interval.
pub const CONFIDENCE: f64 = 0.95;

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct DiffOptions {
    /// Smallest effect of interest, as a fraction (0.05 = 5%).
    pub min_effect: f64,
}

impl Default for DiffOptions {
    fn default() -> Self {
        Self {
            min_effect: DEFAULT_MIN_EFFECT,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    Ns,
    PerIo,
    Iops,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The interval excludes no change and the estimate reaches the smallest effect.
    Significant,
    /// The whole interval lies within ±the smallest effect.
    Equivalent,
    /// Neither: more replicates would tell.
    Inconclusive,
    /// Fewer than two replicates on a side: no interval to judge by.
    InsufficientData,
    /// One of the hosts could not measure it.
    NotMeasured,
}

impl Verdict {
    pub fn words(self) -> &'static str {
        match self {
            Self::Significant => "significant",
            Self::Equivalent => "equivalent",
            Self::Inconclusive => "inconclusive",
            Self::InsufficientData => "too few replicates",
            Self::NotMeasured => "not measured",
        }
    }
}

/// What the replicates behind the intervals are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// Runs: two or more per host.
    Runs,
    /// Batches of consecutive intervals within runs: a side has one run, so between-run noise
    /// is unknown and a verdict holds for these runs only.
    Batches,
}

/// How a metric is compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    /// B/A on the log scale (positive figures).
    Ratio,
    /// B − A as a fraction of a reference (figures that can be zero or negative).
    Difference,
}

/// One compared metric.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub metric: String,
    pub unit: Unit,
    /// Each host's value: the mean over its runs.
    pub a: Option<f64>,
    pub b: Option<f64>,
    pub delta: Option<f64>,
    /// 95% interval of `delta`, in the row's unit.
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
    pub scale: Scale,
    /// B relative to A as a fraction (B/A − 1 on the ratio scale; B − A over the reference on
    /// the difference scale), with its 95% interval.
    pub effect: Option<f64>,
    pub effect_low: Option<f64>,
    pub effect_high: Option<f64>,
    pub verdict: Verdict,
    /// Runs per host that would likely resolve an inconclusive row (runs basis only).
    pub runs_needed: Option<u32>,
    /// Share of the app-latency gap (the stage rows only), as a fraction.
    pub share: Option<f64>,
    /// True for estimates built from counts rather than measured times.
    pub estimated: bool,
    /// The interval's confidence: 0.95, or higher for a row judged as one of a family.
    pub confidence: f64,
}

/// A percentile of one stage, compared like the means.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Tail {
    pub stage: String,
    pub percentile: f64,
    pub row: Row,
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
    /// Smallest effect of interest, as a fraction.
    pub min_effect: f64,
    /// Runs on each side, over all its profiles.
    pub runs_a: usize,
    pub runs_b: usize,
    pub basis: Basis,
    /// Workload keys whose values differ (empty: same workload).
    pub spec_differences: Vec<String>,
    /// Host differences that can confound the comparison.
    pub confounders: Vec<String>,
    pub warnings: Vec<String>,
    /// Mean app latency, the stages it decomposes into, and host-wide evidence.
    pub waterfall: Waterfall,
    /// p99 and p99.9 of app latency and of each probed stage.
    pub tails: Vec<Tail>,
    /// The stage whose p99 moved most (by ratio), with the move in ns.
    pub tail_mover: Option<(String, f64)>,
    /// Where each host's I/Os above its p99 and p99.9 spent their time (the tail autopsy),
    /// when both sides recorded it.
    pub tail_waterfalls: Vec<TailWaterfall>,
    pub throughput: Vec<Row>,
    pub evidence: Vec<Evidence>,
    /// Stage with the largest significant share of the gap, if any.
    pub verdict: Option<String>,
}

/// The tail autopsy of both hosts at one percentile: the mean slow I/O of each (over the runs
/// that recorded the autopsy) and how the gap between them splits over the stages. Shown, not
/// judged: the tail rows above carry the verdicts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TailWaterfall {
    pub percentile: f64,
    /// Runs whose autopsy had this set, per side.
    pub runs_a: usize,
    pub runs_b: usize,
    /// Share of each side's slow I/Os joined to their block request (the rest were counted at
    /// the run's mean block stages: their request was short).
    pub joined_a: f64,
    pub joined_b: f64,
    pub a: TailStages,
    pub b: TailStages,
    /// Per stage (queue, device, completion, software): B − A and its share of the app gap.
    pub rows: Vec<TailRow>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TailRow {
    pub stage: String,
    pub a_ns: f64,
    pub b_ns: f64,
    pub delta_ns: f64,
    /// Of B − A in the set's app latency (None when that gap is 0).
    pub share: Option<f64>,
}

/// The tail waterfalls of two sides' profiles (none when a side has no autopsy). With
/// `folded`, completion is counted in device on both sides, as in the mean waterfall.
fn tail_waterfalls(a: &[&Profile], b: &[&Profile], folded: bool) -> Vec<TailWaterfall> {
    let sets = |side: &[&Profile], p: f64| -> (Vec<TailStages>, f64) {
        let (mut means, mut ios, mut joined) = (Vec::new(), 0u64, 0u64);
        for set in side
            .iter()
            .flat_map(|prof| &prof.runs)
            .filter_map(|r| r.tail.as_ref()?.set(p))
        {
            let mut m = set.mean;
            if folded {
                m.device_ns += m.completion_ns;
                m.completion_ns = 0.0;
            }
            means.push(m);
            ios += set.ios;
            joined += set.joined;
        }
        (means, joined as f64 / ios.max(1) as f64)
    };
    crate::analysis::tail::TAIL_PERCENTILES
        .iter()
        .filter_map(|&p| {
            let ((sa, joined_a), (sb, joined_b)) = (sets(a, p), sets(b, p));
            let (ma, mb) = (TailStages::mean_of(&sa)?, TailStages::mean_of(&sb)?);
            let gap = mb.app_ns - ma.app_ns;
            let rows = ma
                .parts()
                .iter()
                .zip(mb.parts())
                .map(|(&(stage, x), (_, y))| TailRow {
                    stage: stage.into(),
                    a_ns: x,
                    b_ns: y,
                    delta_ns: y - x,
                    share: (gap != 0.0).then(|| (y - x) / gap),
                })
                .collect();
            Some(TailWaterfall {
                percentile: p,
                runs_a: sa.len(),
                runs_b: sb.len(),
                joined_a,
                joined_b,
                a: ma,
                b: mb,
                rows,
            })
        })
        .collect()
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
        (Some(_), None) | (None, Some(_)) => {
            let unknown = if dev(a).is_none() { "A" } else { "B" };
            out.push(format!(
                "target device's queues unknown on host {unknown}: queue and IRQ layout not compared"
            ))
        }
        // Neither host lists the target among its disks (a loop, md or dm device): nothing to
        // compare, and nothing that differs unless the devices do.
        (None, None) => cmp(
            "target device",
            opt(&a.target.device),
            opt(&b.target.device),
        ),
    }
    out
}

/// Mean, standard deviation and count of a series of replicates.
pub(crate) fn moments(xs: &[f64]) -> Option<(f64, f64, usize)> {
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
pub fn welch_half_width(a: &[f64], b: &[f64], confidence: f64) -> Option<f64> {
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
        .inverse_cdf(1.0 - (1.0 - confidence) / 2.0);
    Some(t * se2.sqrt())
}

impl ProfileDiff {
    /// Every compared row: the waterfall, throughput, then the tails.
    pub fn rows(&self) -> impl Iterator<Item = &Row> {
        self.waterfall
            .rows()
            .chain(&self.throughput)
            .chain(self.tails.iter().map(|t| &t.row))
    }
}

/// The mean waterfall. Serialized as one list of rows in this order (app, stages, evidence),
/// as `diff --json` has always shown it.
#[derive(Clone, Debug, PartialEq)]
pub struct Waterfall {
    /// Mean app latency: the gap the stages explain.
    pub app: Row,
    /// Block queue, device, completion and the software residual: their deltas add up to the
    /// app row's, and each carries its share of it.
    pub stages: Vec<Row>,
    /// Host-wide figures per I/O and the cache flushes: evidence beside the stages, no share.
    pub evidence: Vec<Row>,
}

impl Waterfall {
    pub fn rows(&self) -> impl Iterator<Item = &Row> {
        std::iter::once(&self.app)
            .chain(&self.stages)
            .chain(&self.evidence)
    }
}

impl Serialize for Waterfall {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.rows())
    }
}

/// A compared figure: its row's label, unit, and how a replicate yields it.
struct Metric {
    label: &'static str,
    unit: Unit,
    value: fn(&Figures) -> Option<f64>,
}

/// The block stages of the mean, compared as ratios (the software residual follows them).
const BLOCK_STAGES: [Metric; 3] = [
    Metric {
        label: "  block queue",
        unit: Unit::Ns,
        value: |f| f.queue,
    },
    Metric {
        label: "  device",
        unit: Unit::Ns,
        value: |f| f.device,
    },
    Metric {
        label: "  completion: IRQ -> request done",
        unit: Unit::Ns,
        value: |f| f.completion,
    },
];

/// The stages' tail rows (every stage but the app, at each tail percentile): one family.
const STAGE_TAILS: usize = (Stage::ALL.len() - 1) * TAIL_PERCENTILES.len();

/// Host-wide figures per I/O, listed under the software residual as evidence.
const HOST_WIDE: [Metric; 5] = [
    Metric {
        label: "    wakeup delay per I/O",
        unit: Unit::Ns,
        value: |f| f.wakeup_per_io,
    },
    Metric {
        label: "    hard-IRQ time per I/O (all IRQs)",
        unit: Unit::Ns,
        value: |f| f.hardirq_per_io,
    },
    Metric {
        label: "    softirq time per I/O (all)",
        unit: Unit::Ns,
        value: |f| f.softirq_per_io,
    },
    Metric {
        label: "    IPIs sent per I/O",
        unit: Unit::PerIo,
        value: |f| f.ipis_per_io,
    },
    Metric {
        label: "    exit-causing MSR writes per I/O",
        unit: Unit::PerIo,
        value: |f| f.msr_per_io,
    },
];

/// The percentiles compared as tails.
const TAIL_PERCENTILES: [f64; 2] = [99.0, 99.9];

/// One replicate's figures: a run's, or a batch of intervals'.
#[derive(Clone, Debug, Default)]
struct Figures {
    app: Option<f64>,
    queue: Option<f64>,
    device: Option<f64>,
    /// Per block request (those without the stage count 0), so the means still add up.
    completion: Option<f64>,
    iops: Option<f64>,
    wakeup_per_io: Option<f64>,
    hardirq_per_io: Option<f64>,
    softirq_per_io: Option<f64>,
    ipis_per_io: Option<f64>,
    msr_per_io: Option<f64>,
    /// Mean of the workload's cache flushes (runs only: intervals keep no flush stage).
    flush: Option<f64>,
    /// (stage, percentile) -> ns; runs only (an interval keeps no stage histograms).
    tails: Vec<(Stage, f64, f64)>,
}

impl Figures {
    fn software(&self) -> Option<f64> {
        Some(self.app? - self.queue? - self.device? - self.completion.unwrap_or(0.0))
    }

    fn tail(&self, stage: Stage, pct: f64) -> Option<f64> {
        self.tails
            .iter()
            .find(|t| t.0 == stage && t.1 == pct)
            .map(|t| t.2)
    }

    /// A run's figures; with `idle`, the host-wide ones less what the idle host did over the
    /// same time (see [`IdleBaseline`]).
    fn of_run(r: &RunRecord, idle: Option<&IdleBaseline>) -> Self {
        // Host-wide figures span the probes' window: per I/O completed over the same window
        // (the device stage's count), else per I/O the workload did.
        let span_ios = r
            .stages
            .device
            .as_ref()
            .map(|d| d.count as f64)
            .filter(|&n| n > 0.0)
            .or(Some(r.ios()).filter(|&n| n > 0.0));
        let per_io = |total: Option<f64>| total.zip(span_ios).map(|(t, n)| t / n);
        let seconds = r.probe_seconds.unwrap_or(r.measured_s);
        let above_idle = |total: Option<u64>, of_idle: fn(&IdleBaseline) -> Option<u64>| {
            let total = total? as f64;
            match idle {
                Some(b) => Some(total - b.over(of_idle(b), seconds)?),
                None => Some(total),
            }
        };
        let mut tails = Vec::new();
        for stage in Stage::ALL {
            for pct in TAIL_PERCENTILES {
                if let Some(v) = r.stages.get(stage).and_then(|h| h.percentile_ns(pct)) {
                    tails.push((stage, pct, v));
                }
            }
        }
        Self {
            app: r.stages.app.mean_ns(),
            queue: r.stages.queue.as_ref().and_then(|h| h.mean_ns()),
            device: r.stages.device.as_ref().and_then(|h| h.mean_ns()),
            completion: r.stages.completion_per_request(),
            iops: r.iops(),
            wakeup_per_io: per_io(r.stages.wakeup.as_ref().map(|w| w.sum_ns)),
            hardirq_per_io: per_io(above_idle(r.hardirq_ns, |b| b.hardirq_ns)),
            softirq_per_io: per_io(above_idle(r.softirq_ns, |b| b.softirq_ns)),
            ipis_per_io: per_io(above_idle(r.ipis_sent, |b| b.ipis_sent)),
            msr_per_io: per_io(above_idle(r.msr_writes, |b| b.msr_writes)),
            flush: r.stages.flush.as_ref().and_then(|h| h.mean_ns()),
            tails,
        }
    }

    fn of_batch(ivs: &[&Interval], idle: Option<&IdleBaseline>) -> Self {
        let lat_count: f64 = ivs.iter().map(|i| i.lat_count as f64).sum();
        let per_io = |f: &dyn Fn(&Interval) -> Option<f64>| -> Option<f64> {
            let parts: Option<Vec<f64>> = ivs.iter().map(|i| f(i)).collect();
            parts
                .filter(|_| lat_count > 0.0)
                .map(|p| p.iter().sum::<f64>() / lat_count)
        };
        let span: f64 = ivs.iter().map(|i| i.end_s - i.start_s).sum();
        // What the idle host did over the batch's span, for the host-wide figures.
        let idle_part = |of_idle: fn(&IdleBaseline) -> Option<u64>| match idle {
            Some(b) => b.over(of_idle(b), span),
            None => Some(0.0),
        };
        let above_idle = |total: Option<f64>, of_idle: fn(&IdleBaseline) -> Option<u64>| {
            let t = total?;
            Some(t - idle_part(of_idle)? / lat_count)
        };
        // (count, sum in ns) of a stage over the batch.
        let stage_total = |stage: Stage| {
            ivs.iter()
                .filter_map(|i| i.stage(stage))
                .fold((0.0, 0.0), |(n, s), x| {
                    (n + x.count as f64, s + x.sum_ns as f64)
                })
        };
        let stage_mean = |stage: Stage| {
            let (n, sum) = stage_total(stage);
            (n > 0.0).then(|| sum / n)
        };
        let cpus = |i: &Interval, f: fn(&crate::model::profile::CpuLoad) -> f64| {
            (!i.cpus.is_empty()).then(|| i.cpus.iter().map(f).sum::<f64>())
        };
        Self {
            app: (lat_count > 0.0)
                .then(|| ivs.iter().map(|i| i.lat_sum_ns).sum::<f64>() / lat_count),
            queue: stage_mean(Stage::Queue),
            device: stage_mean(Stage::Device),
            completion: {
                let ((completed, _), (split, completion_ns)) =
                    (stage_total(Stage::Device), stage_total(Stage::Completion));
                (completed > 0.0 && split > 0.0).then(|| completion_ns / completed)
            },
            iops: (span > 0.0).then(|| {
                ivs.iter()
                    .map(|i| i.read_ios as f64 + i.write_ios as f64)
                    .sum::<f64>()
                    / span
            }),
            wakeup_per_io: per_io(&|i| i.stage(Stage::Wakeup).map(|s| s.sum_ns as f64)),
            hardirq_per_io: above_idle(per_io(&|i| cpus(i, |c| c.hardirq_ns as f64)), |b| {
                b.hardirq_ns
            }),
            softirq_per_io: above_idle(per_io(&|i| cpus(i, |c| c.softirq_ns as f64)), |b| {
                b.softirq_ns
            }),
            ipis_per_io: above_idle(
                per_io(&|i| cpus(i, |c| c.ipis_sent.values().sum::<u64>() as f64)),
                |b| b.ipis_sent,
            ),
            msr_per_io: above_idle(per_io(&|i| i.msr_writes.map(|n| n as f64)), |b| {
                b.msr_writes
            }),
            flush: None,
            tails: Vec::new(),
        }
    }
}

/// One host's replicates: its runs, and batches of consecutive intervals within each run.
struct Side {
    runs: Vec<Figures>,
    batches: Vec<Figures>,
}

impl Side {
    /// The side's replicates; with `above_idle`, host-wide figures less the host's idle rate,
    /// pooled over all its runs' baselines (every run must have one): one second of idle per
    /// run is a noisy estimate, and the host is the same in every run.
    fn of(profiles: &[&Profile], above_idle: bool) -> Self {
        let pooled = above_idle
            .then(|| {
                IdleBaseline::pooled(
                    profiles
                        .iter()
                        .flat_map(|p| p.replicates())
                        .filter_map(|(r, _)| r.idle),
                )
            })
            .flatten();
        let idle = pooled.as_ref();
        let mut runs = Vec::new();
        let mut batches = Vec::new();
        for p in profiles {
            for (record, intervals) in p.replicates() {
                runs.push(Figures::of_run(&record, idle));
                batches.extend(
                    batches_of(intervals)
                        .iter()
                        .map(|b| Figures::of_batch(b, idle)),
                );
            }
        }
        Self { runs, batches }
    }

    fn replicates_all(&self) -> impl Iterator<Item = &Figures> {
        self.runs.iter().chain(&self.batches)
    }

    /// Every replicate has the completion stage (device ends at the queue IRQ's entry).
    fn splits_completion(&self) -> bool {
        self.replicates_all().all(|f| f.completion.is_some())
    }

    /// Device time as issue -> completion: each replicate's completion stage added back into
    /// it and dropped, and the device and completion tails with it (percentiles do not add).
    fn fold_completion(&mut self) {
        for f in self.runs.iter_mut().chain(self.batches.iter_mut()) {
            if let (Some(d), Some(c)) = (f.device, f.completion) {
                f.device = Some(d + c);
            }
            f.completion = None;
            f.tails
                .retain(|t| t.0 != Stage::Device && t.0 != Stage::Completion);
        }
    }

    /// The host's value of a metric: the mean over its runs that measured it (a figure no
    /// real run gives — infinite, from a damaged file — counts as not measured).
    fn point(&self, get: &dyn Fn(&Figures) -> Option<f64>) -> Option<f64> {
        let v: Vec<f64> = self.runs.iter().filter_map(get).collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        (!v.is_empty() && mean.is_finite()).then_some(mean)
    }

    fn replicates(&self, basis: Basis, get: &dyn Fn(&Figures) -> Option<f64>) -> Vec<f64> {
        let from = match basis {
            Basis::Runs => &self.runs,
            Basis::Batches => &self.batches,
        };
        from.iter()
            .filter_map(get)
            .filter(|x| x.is_finite())
            .collect()
    }
}

/// A run's full intervals in ⌊√n⌋ batches (at least two) of consecutive ones, sized as evenly
/// as they divide: batch means are far less autocorrelated than 1-s intervals, which is what
/// lets their spread stand for the run's noise.
fn batches_of(intervals: &[Interval]) -> Vec<Vec<&Interval>> {
    // Only full intervals: a short last one has few I/Os and would skew the spread.
    let longest = intervals
        .iter()
        .map(|i| i.end_s - i.start_s)
        .fold(0.0, f64::max);
    let full: Vec<&Interval> = intervals
        .iter()
        .filter(|i| i.lat_count > 0 && (i.end_s - i.start_s) >= longest * 0.99)
        .collect();
    let n = full.len();
    if n == 0 {
        return Vec::new();
    }
    let count = ((n as f64).sqrt().floor() as usize).max(2).min(n);
    (0..count)
        .map(|k| full[k * n / count..(k + 1) * n / count].to_vec())
        .collect()
}

/// Runs per host that tell an effect of `bound` from none 80% of the time at the `confidence`
/// level, given a per-run spread `sd` on the same scale (two-sample normal approximation; at
/// least 2, at most 1000).
pub fn runs_to_resolve(sd: f64, bound: f64, confidence: f64) -> u32 {
    let z_alpha = Normal::standard().inverse_cdf(1.0 - (1.0 - confidence) / 2.0);
    let n = (2.0 * (z_alpha + Z_POWER).powi(2) * sd * sd / (bound * bound)).ceil();
    if n.is_finite() {
        n.clamp(2.0, 1000.0) as u32
    } else {
        1000
    }
}

/// How a row is judged: over what replicates, against what effect, at what confidence.
#[derive(Clone, Copy)]
struct Judging<'a> {
    basis: Basis,
    opts: &'a DiffOptions,
    confidence: f64,
}

/// A comparison's outcome on its scale.
struct Judgement {
    effect: f64,
    low: Option<f64>,
    high: Option<f64>,
    verdict: Verdict,
    runs_needed: Option<u32>,
}

/// Compares replicates `a` and `b` of one metric. On the ratio scale the replicates are logged;
/// on the difference scale they are divided by `reference`. `points` are the hosts' values,
/// which set the estimate when there are too few replicates for an interval.
fn judge(
    a: &[f64],
    b: &[f64],
    points: (f64, f64),
    scale: Scale,
    reference: f64,
    how: Judging,
) -> Judgement {
    let Judging {
        basis,
        opts,
        confidence,
    } = how;
    let to_scale = |x: f64| match scale {
        Scale::Ratio => x.ln(),
        Scale::Difference => x / reference,
    };
    let from_scale = |d: f64| match scale {
        Scale::Ratio => d.exp() - 1.0,
        Scale::Difference => d,
    };
    let bound = match scale {
        Scale::Ratio => (1.0 + opts.min_effect).ln(),
        Scale::Difference => opts.min_effect,
    };
    let (ta, tb): (Vec<f64>, Vec<f64>) = (
        a.iter().map(|&x| to_scale(x)).collect(),
        b.iter().map(|&x| to_scale(x)).collect(),
    );
    // Too few replicates, or figures so far apart their interval overflows: the hosts' values
    // give the estimate, and there is no verdict.
    let no_interval = Judgement {
        effect: from_scale(to_scale(points.1) - to_scale(points.0)),
        low: None,
        high: None,
        verdict: Verdict::InsufficientData,
        runs_needed: None,
    };
    let (Some((ma, sa, na)), Some((mb, sb, nb)), Some(hw)) = (
        moments(&ta),
        moments(&tb),
        welch_half_width(&ta, &tb, confidence),
    ) else {
        return no_interval;
    };
    let d = mb - ma;
    let (low, high) = (from_scale(d - hw), from_scale(d + hw));
    if ![d, hw, low, high].iter().all(|x| x.is_finite()) {
        return no_interval;
    }
    let excludes_zero = d - hw > 0.0 || d + hw < 0.0;
    let verdict = if excludes_zero && d.abs() >= bound {
        Verdict::Significant
    } else if d - hw > -bound && d + hw < bound {
        Verdict::Equivalent
    } else {
        Verdict::Inconclusive
    };
    // Runs per host for an 80% chance of telling the stated effect from none, from the
    // pooled per-run spread; only runs say how runs vary.
    let runs_needed = (verdict == Verdict::Inconclusive && basis == Basis::Runs).then(|| {
        let have = na.max(nb) as u32;
        runs_to_resolve(((sa * sa + sb * sb) / 2.0).sqrt(), bound, confidence).max(have + 1)
    });
    Judgement {
        effect: from_scale(d),
        low: Some(low),
        high: Some(high),
        verdict,
        runs_needed,
    }
}

/// Builds one row: the hosts' values from their runs, the verdict from the replicates.
fn compare(
    metric: &str,
    unit: Unit,
    sides: (&Side, &Side),
    how: Judging,
    get: &dyn Fn(&Figures) -> Option<f64>,
    difference_reference: Option<f64>,
) -> Row {
    let Judging {
        basis, confidence, ..
    } = how;
    let (pa, pb) = (sides.0.point(get), sides.1.point(get));
    let (ra, rb) = (
        sides.0.replicates(basis, get),
        sides.1.replicates(basis, get),
    );
    let mut row = Row {
        metric: metric.into(),
        unit,
        a: pa,
        b: pb,
        delta: pa.zip(pb).map(|(a, b)| b - a),
        ci_low: None,
        ci_high: None,
        scale: Scale::Ratio,
        effect: None,
        effect_low: None,
        effect_high: None,
        verdict: Verdict::NotMeasured,
        runs_needed: None,
        share: None,
        estimated: false,
        confidence,
    };
    let (Some(a), Some(b)) = (pa, pb) else {
        return row;
    };
    let positive = a > 0.0 && b > 0.0 && ra.iter().chain(&rb).all(|&x| x > 0.0);
    let (scale, reference) = match difference_reference {
        None if positive => (Scale::Ratio, a),
        // Symmetric in A and B: the mean of their magnitudes.
        reference => (
            Scale::Difference,
            reference.unwrap_or((a.abs() + b.abs()) / 2.0),
        ),
    };
    if scale == Scale::Difference && reference <= 0.0 {
        // Both zero: nothing to compare, and nothing differs.
        row.scale = scale;
        row.effect = Some(0.0);
        row.verdict = Verdict::Equivalent;
        return row;
    }
    let j = judge(&ra, &rb, (a, b), scale, reference, how);
    row.scale = scale;
    row.effect = Some(j.effect).filter(|e| e.is_finite());
    row.effect_low = j.low;
    row.effect_high = j.high;
    row.verdict = j.verdict;
    row.runs_needed = j.runs_needed;
    // The interval in the row's unit: relative bounds applied to A (ratio) or the reference.
    let to_unit = |e: f64| match scale {
        Scale::Ratio => a * e,
        Scale::Difference => reference * e,
    };
    row.ci_low = j.low.map(to_unit).filter(|x| x.is_finite());
    row.ci_high = j.high.map(to_unit).filter(|x| x.is_finite());
    row.delta = row.delta.filter(|x| x.is_finite());
    row
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
    let secs = v.msr_seconds();
    let Some(writes) = v.msr_writes.as_ref().filter(|_| secs > 0.0) else {
        return "not measured".into();
    };
    let mut by: BTreeMap<String, f64> = BTreeMap::new();
    // Only the host's writes that exit, counted while the recording tool's sampler paused.
    for w in writes.iter().filter(|w| w.exits && w.is_hosts()) {
        *by.entry(format!("{} {}", w.msr, w.name)).or_default() += w.count as f64 / secs;
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
            if !c.represents(sampler.frequency_hz, sampler.seconds(v.seconds)) {
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

/// Compares one profile per host with the default options: A is the reference, B the host
/// being explained.
pub fn diff(a: &Profile, b: &Profile) -> ProfileDiff {
    diff_hosts(&[a], &[b], &DiffOptions::default())
}

/// Compares host A's profiles with host B's (each side non-empty; its runs pooled as
/// replicates). Descriptions, confounders and evidence come from each side's first profile.
pub fn diff_hosts(a_side: &[&Profile], b_side: &[&Profile], opts: &DiffOptions) -> ProfileDiff {
    let (a, b) = (a_side[0], b_side[0]);
    // Host-wide figures per I/O are compared above each run's idle host when every run of
    // both sides measured one (older profiles did not): background that is the same on both
    // hosts would otherwise weigh more per I/O on the one doing fewer.
    let above_idle = a_side
        .iter()
        .chain(b_side)
        .flat_map(|p| p.replicates())
        .all(|(r, _)| r.idle.is_some());
    let (mut side_a, mut side_b) = (Side::of(a_side, above_idle), Side::of(b_side, above_idle));
    // Device means one thing on both sides or is not compared: where either side lacks the
    // completion stage somewhere, both compare issue -> completion.
    let any_split = side_a
        .replicates_all()
        .chain(side_b.replicates_all())
        .any(|f| f.completion.is_some());
    let splits = (side_a.splits_completion(), side_b.splits_completion());
    let folded = any_split && !(splits.0 && splits.1);
    if folded {
        side_a.fold_completion();
        side_b.fold_completion();
    }
    let sides = (&side_a, &side_b);
    let (runs_a, runs_b) = (sides.0.runs.len(), sides.1.runs.len());
    let basis = if runs_a >= 2 && runs_b >= 2 {
        Basis::Runs
    } else {
        Basis::Batches
    };
    let how = Judging {
        basis,
        opts,
        confidence: CONFIDENCE,
    };
    let cmp = |metric: &str, unit: Unit, get: &dyn Fn(&Figures) -> Option<f64>| {
        compare(metric, unit, sides, how, get, None)
    };
    // The software residual can be negative: compared as a difference, relative to the hosts'
    // app latency so its smallest effect means what it means for the app row.
    let app_reference = sides
        .0
        .point(&|f| f.app)
        .zip(sides.1.point(&|f| f.app))
        .map(|(x, y)| (x * y).sqrt());

    let cmp_metric = |m: &Metric| cmp(m.label, m.unit, &|f| (m.value)(f));
    let mut stages: Vec<Row> = BLOCK_STAGES.iter().map(cmp_metric).collect();
    stages.push(compare(
        "  software: submit + reap",
        Unit::Ns,
        sides,
        how,
        &|f| f.software(),
        Some(app_reference.unwrap_or(0.0)),
    ));
    // The host-wide rows are background figures judged as one family: each at 1 − 5%/k
    // (Bonferroni), so that the family, like one row, calls a difference that is not there at
    // most 5% of the time. They are noisy (timer and interrupt activity of the whole host) and
    // only evidence, not parts of the gap.
    let family = Judging {
        confidence: 1.0 - (1.0 - CONFIDENCE) / HOST_WIDE.len() as f64,
        ..how
    };
    let mut evidence: Vec<Row> = HOST_WIDE
        .iter()
        .map(|m| compare(m.label, m.unit, sides, family, &|f| (m.value)(f), None))
        .collect();
    let msr_cost = {
        let (ca, cb) = (exit_cost(a), exit_cost(b));
        let mut r = cmp("    est. MSR exit time per I/O", Unit::Ns, &|_| None);
        r.a = sides.0.point(&|f| f.msr_per_io).zip(ca).map(|(n, c)| n * c);
        r.b = sides.1.point(&|f| f.msr_per_io).zip(cb).map(|(n, c)| n * c);
        r.delta = r.a.zip(r.b).map(|(x, y)| y - x);
        // Counts times a calibrated cost: shown, never judged.
        r.verdict = if r.delta.is_some() {
            Verdict::InsufficientData
        } else {
            Verdict::NotMeasured
        };
        r.estimated = true;
        r
    };
    evidence.push(msr_cost);
    if above_idle {
        // Short enough for the terminal's label column.
        const ABOVE_IDLE: [(&str, &str); 5] = [
            (
                "hard-IRQ time per I/O (all IRQs)",
                "hard-IRQ time per I/O, above idle",
            ),
            (
                "softirq time per I/O (all)",
                "softirq time per I/O, above idle",
            ),
            ("IPIs sent per I/O", "IPIs sent per I/O, above idle"),
            (
                "exit-causing MSR writes per I/O",
                "MSR exits per I/O, above idle",
            ),
            (
                "est. MSR exit time per I/O",
                "est. exit time per I/O, above idle",
            ),
        ];
        for r in &mut evidence {
            if let Some((from, to)) = ABOVE_IDLE.iter().find(|(from, _)| r.metric.trim() == *from) {
                r.metric = r.metric.replacen(from, to, 1);
            }
        }
    }
    // Flushes are requests of their own, not part of a read's or write's stages: their own row.
    evidence.push(cmp("    cache flush latency (mean)", Unit::Ns, &|f| {
        f.flush
    }));
    let app = cmp("app latency (mean)", Unit::Ns, &|f| f.app);
    // Shares only for the stages an I/O's latency is made of: the host-wide figures below them
    // are background divided by I/Os, evidence rather than parts of the gap.
    let gap = app.delta.filter(|d| d.abs() > 0.0);
    for r in &mut stages {
        r.share = gap.zip(r.delta).map(|(g, d)| d / g);
    }
    let waterfall = Waterfall {
        app,
        stages,
        evidence,
    };

    // The app's tails are the question, at 95%; the stages' tails are evidence of where a tail
    // went, one family like the host-wide rows (with eight of them at 95% each, an A/A pair
    // would show one "significant" stage tail about one time in three).
    let stage_tails = Judging {
        confidence: 1.0 - (1.0 - CONFIDENCE) / STAGE_TAILS as f64,
        ..how
    };
    let mut tails = Vec::new();
    for stage in Stage::ALL {
        for pct in TAIL_PERCENTILES {
            let metric = format!("{} p{pct}", stage.name());
            let judging = if stage == Stage::App {
                how
            } else {
                stage_tails
            };
            tails.push(Tail {
                stage: stage.name().into(),
                percentile: pct,
                row: compare(
                    &metric,
                    Unit::Ns,
                    sides,
                    judging,
                    &|f| f.tail(stage, pct),
                    None,
                ),
            });
        }
    }
    let tail_mover = tails
        .iter()
        .filter(|t| t.stage != Stage::App.name() && t.percentile == 99.0)
        .filter_map(|t| Some((t.stage.clone(), t.row.delta?, t.row.effect?)))
        .max_by(|x, y| x.2.abs().total_cmp(&y.2.abs()))
        .map(|(stage, delta, _)| (stage, delta));

    let throughput = vec![cmp("IOPS", Unit::Iops, &|f| f.iops)];

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
            item: "block requests per app I/O".into(),
            a: requests_per_io(a_side),
            b: requests_per_io(b_side),
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

    let verdict = if waterfall.app.verdict == Verdict::Significant {
        waterfall
            .stages
            .iter()
            .filter(|r| r.verdict == Verdict::Significant && r.share.is_some_and(|s| s > 0.0))
            .max_by(|x, y| x.share.unwrap_or(0.0).total_cmp(&y.share.unwrap_or(0.0)))
            .map(|r| r.metric.trim().to_string())
    } else {
        None
    };

    let mut warnings = Vec::new();
    for (label, side) in [("A", a_side), ("B", b_side)] {
        for p in side {
            if !p.complete {
                warnings.push(format!(
                    "a profile of {label} is incomplete (its run was interrupted)"
                ));
            }
            if p.capabilities.is_none() {
                warnings.push(format!(
                    "a profile of {label} was recorded without probes: only app latency compares"
                ));
            }
            if let Some(s) = p.stalls.as_ref().filter(|s| s.found()) {
                warnings.push(format!(
                    "host {label} stalled during a run ({}): its figures are not steady state",
                    s.describe()
                ));
            }
        }
    }
    if folded {
        let lacking = match splits {
            (true, false) => "host B",
            (false, true) => "host A",
            _ => "both hosts",
        };
        warnings.push(format!(
            "{lacking} lacks the completion stage in some run (a profile from before it, or a device whose queue IRQ is not known): device is compared as issue -> completion on both sides, and its tails and the completion row are not judged"
        ));
    }
    if let Some(warning) = queue_start_warning(a_side, b_side) {
        warnings.push(warning);
    }
    if let Some(warning) = request_unit_warning(a_side, b_side) {
        warnings.push(warning);
    }
    if basis == Basis::Batches {
        warnings.push(format!(
            "one run on {}: between-run noise is unknown, so verdicts compare batches of intervals within runs and hold for these runs only; record each host with --runs 5 for verdicts that hold",
            match (runs_a < 2, runs_b < 2) {
                (true, true) => "each host",
                (true, false) => "host A",
                _ => "host B",
            }
        ));
    }

    ProfileDiff {
        host_a: a.host.describe(),
        host_b: b.host.describe(),
        workload: format!("{} ({})", a.workload.name, a.workload.origin),
        min_effect: opts.min_effect,
        runs_a,
        runs_b,
        basis,
        spec_differences: spec_differences(a, b),
        confounders: confounders(a, b),
        warnings,
        waterfall,
        tails,
        tail_mover,
        tail_waterfalls: tail_waterfalls(a_side, b_side, folded),
        throughput,
        evidence,
        verdict,
    }
}

/// Whether `p`'s queue stage starts where each bio enters the block layer rather than where
/// its request starts; None without the block probe.
fn queue_from_bio_entry(p: &Profile) -> Option<bool> {
    p.queue_start().map(QueueStart::from_bio_entry)
}

/// A side's block requests per app I/O, over all its profiles.
fn side_requests_per_io(side: &[&Profile]) -> Option<RequestsPerIo> {
    side.iter()
        .filter_map(|p| p.stages.requests_per_io())
        .reduce(|x, y| RequestsPerIo {
            requests: x.requests + y.requests,
            ios: x.ios + y.ios,
        })
}

fn requests_per_io(side: &[&Profile]) -> String {
    side_requests_per_io(side).map_or("not measured".into(), RequestsPerIo::describe)
}

/// The hosts turn an app I/O into different numbers of block requests (a device that takes
/// smaller requests splits more): the stages are per request and the app's latency per I/O, so
/// per-request stages compare unlike units.
fn request_unit_warning(a_side: &[&Profile], b_side: &[&Profile]) -> Option<String> {
    let (a, b) = (side_requests_per_io(a_side)?, side_requests_per_io(b_side)?);
    let (ra, rb) = (a.ratio(), b.ratio());
    (ra.max(rb) / ra.min(rb) > 1.05).then(|| {
        format!(
            "the hosts issue an app I/O as different numbers of block requests (A {ra:.2}, B {rb:.2} per I/O: split or merged differently, e.g. a smaller max_sectors_kb): the block stages are per request and the app's latency per I/O, so the software residual also holds the difference in requests per I/O"
        )
    })
}

/// The queue stages of the two hosts do not start at the same point: one side counts
/// blk-throttle and tag waits as queue, the other as software.
fn queue_start_warning(a_side: &[&Profile], b_side: &[&Profile]) -> Option<String> {
    let starts = |side: &[&Profile]| -> (bool, bool) {
        let s: Vec<bool> = side
            .iter()
            .filter_map(|p| queue_from_bio_entry(p))
            .collect();
        (s.contains(&true), s.contains(&false))
    };
    let (a, b) = (starts(a_side), starts(b_side));
    let (entry, request) = match (a, b) {
        ((true, false), (false, true)) => ("host A", "host B"),
        ((false, true), (true, false)) => ("host B", "host A"),
        ((true, true), _) | (_, (true, true)) => ("some runs", "others"),
        _ => return None,
    };
    Some(format!(
        "the queue stage starts where each bio enters the block layer on {entry} but where its request starts on {request} (for all or some of its requests: no fentry or kprobe there, and a whole disk's bios pass no block_bio_remap): blk-throttle and tag waits count as queue on one side and as software on the other"
    ))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::profile::{CpuLoad, Histogram, StageSample};

    /// A profile whose every interval has the given stage means (ns) plus deterministic jitter.
    /// `p` with a completion stage of `mean_ns` on `share` of its requests, taken out of their
    /// device time (app latency unchanged).
    fn with_completion(mut p: Profile, mean_ns: f64, share: f64) -> Profile {
        let moved = |device: &mut u64, count: u64| -> (u64, u64) {
            let n = (count as f64 * share) as u64;
            let ns = (mean_ns * n as f64) as u64;
            *device -= ns;
            (n, ns)
        };
        for iv in &mut p.intervals {
            let dev = iv.stages.get_mut("device").unwrap();
            let count = dev.count;
            let (n, ns) = moved(&mut dev.sum_ns, count);
            iv.stages.insert(
                "completion".into(),
                StageSample {
                    count: n,
                    sum_ns: ns,
                },
            );
        }
        let dh = p.stages.device.as_mut().unwrap();
        let mut sum = dh.sum_ns as u64;
        let (n, ns) = moved(&mut sum, dh.count);
        dh.sum_ns = sum as f64;
        p.stages.completion = Some(Histogram {
            count: n,
            sum_ns: ns as f64,
            buckets: vec![[(mean_ns * 0.9) as u64, (mean_ns * 1.1) as u64, n]],
            ..Default::default()
        });
        p
    }

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

    /// A histogram of `count` values all near `mean`, with a tail bucket at `tail` holding
    /// `tail_count` of them.
    fn hist(mean: f64, count: u64, tail: f64, tail_count: u64) -> Histogram {
        let body = count - tail_count;
        let mut buckets = vec![[(mean * 0.9) as u64, (mean * 1.1) as u64, body]];
        if tail_count > 0 {
            buckets.push([(tail * 0.95) as u64, (tail * 1.05) as u64, tail_count]);
        }
        Histogram {
            count,
            sum_ns: mean * body as f64 + tail * tail_count as f64,
            min_ns: None,
            max_ns: None,
            buckets,
            sum_sq_ns: None,
        }
    }

    /// A profile of `runs`, each (app mean, device mean, IOPS, app p99.9 tail) with the queue
    /// at 2 µs: one interval per run, so its verdicts can only come from runs.
    fn with_runs(runs: &[(f64, f64, f64, f64)]) -> Profile {
        let mut p = synthetic(2_000.0, 1.0, 1.0, 0.0, 1);
        p.intervals.clear();
        p.runs = runs
            .iter()
            .enumerate()
            .map(|(k, &(app, device, iops, tail))| {
                let ios = (iops * 10.0) as u64;
                RunRecord {
                    run: k as u32 + 1,
                    measured_s: 10.0,
                    read_ios: ios,
                    stages: crate::model::profile::Stages {
                        app: hist(app, ios, tail, ios / 500),
                        queue: Some(hist(2_000.0, ios, 2_000.0, 0)),
                        device: Some(hist(device, ios, device, 0)),
                        ..Default::default()
                    },
                    complete: true,
                    ..Default::default()
                }
            })
            .collect();
        p
    }

    /// `n` runs around `app` (ns), IOPS around `iops`, spread ±`noise` (a fraction) in a fixed
    /// pattern.
    fn noisy_runs(n: usize, app: f64, iops: f64, noise: f64, tail: f64) -> Profile {
        let pattern = [0.0, 1.0, -1.0, 0.5, -0.5, 0.8, -0.8, 0.2];
        with_runs(
            &(0..n)
                .map(|k| {
                    let j = 1.0 + noise * pattern[k % pattern.len()];
                    (app * j, (app - 100_000.0) * j, iops / j, tail * j)
                })
                .collect::<Vec<_>>(),
        )
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
        // Every request of A has a 20 µs completion stage, half of B's a 60 µs one: taken out
        // of their device time, so app latency is as before.
        let a = with_completion(
            synthetic(2_000.0, 300_000.0, 100_000.0, 5_000.0, 10),
            20_000.0,
            1.0,
        );
        let b = with_completion(
            synthetic(2_000.0, 800_000.0, 110_000.0, 5_000.0, 10),
            60_000.0,
            0.5,
        );
        let d = diff(&a, &b);
        let w = &d.waterfall;
        let gap = w.app.delta.unwrap();
        assert!((gap - 510_000.0).abs() < 1.0, "{gap}");
        let parts: f64 = w.stages.iter().map(|r| r.delta.unwrap()).sum();
        assert!(
            (parts - gap).abs() < 1e-6,
            "Δqueue + Δdevice + Δcompletion + Δsoftware = Δapp"
        );
        let completion = w.stages[2].delta.unwrap();
        assert!(
            (completion - 10_000.0).abs() < 1e-6,
            "per request: 30 - 20 µs, {completion}"
        );
        let shares: f64 = w.stages.iter().map(|r| r.share.unwrap()).sum();
        assert!((shares - 1.0).abs() < 1e-9);
        assert_eq!(w.stages[1].verdict, Verdict::Significant);
        assert!((w.stages[1].share.unwrap() - 490.0 / 510.0).abs() < 1e-9);
        assert_eq!(d.verdict.as_deref(), Some("device"));
        let msr = w
            .evidence
            .iter()
            .find(|r| r.metric.contains("MSR writes per I/O"))
            .unwrap();
        assert_eq!(
            msr.verdict,
            Verdict::NotMeasured,
            "MSR writes are not in these profiles"
        );
        assert!(
            w.evidence.iter().all(|r| r.share.is_none()),
            "host-wide figures are evidence, not shares of the gap"
        );
        // Without a completion stage on either side, software takes what it would have.
        let d = diff(
            &synthetic(2_000.0, 300_000.0, 100_000.0, 5_000.0, 10),
            &synthetic(2_000.0, 800_000.0, 110_000.0, 5_000.0, 10),
        );
        assert_eq!(d.waterfall.stages[2].verdict, Verdict::NotMeasured);
        assert!((d.waterfall.stages[3].delta.unwrap() - 10_000.0).abs() < 1e-6);
    }

    #[test]
    fn a_side_without_the_completion_stage_compares_device_to_completion_on_both() {
        // A splits 20 µs of each request's 300 µs into completion; B's device has no known
        // queue IRQ. The same device either way: device must not look 20 µs faster on A.
        let a = with_completion(
            synthetic(2_000.0, 300_000.0, 100_000.0, 5_000.0, 10),
            20_000.0,
            1.0,
        );
        let b = synthetic(2_000.0, 300_000.0, 100_000.0, 5_000.0, 10);
        for d in [diff(&a, &b), diff(&b, &a)] {
            let device = &d.waterfall.stages[1];
            assert!(device.delta.unwrap().abs() < 1.0, "{device:?}");
            assert_eq!(d.waterfall.stages[2].verdict, Verdict::NotMeasured);
            assert!(
                d.warnings
                    .iter()
                    .any(|w| w.contains("issue -> completion on both sides")),
                "{:?}",
                d.warnings
            );
            assert!(d
                .tails
                .iter()
                .filter(|t| t.stage == "device")
                .all(|t| t.row.a.is_none()));
        }
        // Both split: nothing folded, no warning.
        let d = diff(&a, &a);
        assert_eq!(d.waterfall.stages[2].verdict, Verdict::Equivalent);
        assert!(!d.warnings.iter().any(|w| w.contains("completion stage")));
    }

    /// The same background (timer interrupts, MSR writes) on both hosts and the same cost per
    /// I/O above it: per I/O, B doing half the I/Os carries twice A's share of background. Above
    /// each run's idle baseline the rows agree; without the baselines they do not.
    #[test]
    fn host_wide_figures_per_io_are_compared_above_the_idle_host() {
        let with_background = |iops: f64| {
            let mut p = noisy_runs(5, 100_000.0, iops, 0.02, 300_000.0);
            for r in &mut p.runs {
                let (secs, ios) = (r.measured_s, r.ios());
                r.probe_seconds = Some(secs);
                // 50 ms/s of hard-IRQ time and 600 MSR writes/s idle, plus 1 µs and 0.1 per I/O.
                r.hardirq_ns = Some((0.05e9 * secs + 1_000.0 * ios) as u64);
                r.msr_writes = Some((600.0 * secs + 0.1 * ios) as u64);
                r.idle = Some(IdleBaseline {
                    seconds: 1.0,
                    hardirq_ns: Some(50_000_000),
                    softirq_ns: None,
                    ipis_sent: None,
                    msr_writes: Some(600),
                });
            }
            p
        };
        let (a, b) = (with_background(10_000.0), with_background(5_000.0));
        let row = |d: &ProfileDiff, what: &str| {
            d.waterfall
                .evidence
                .iter()
                .find(|r| r.metric.contains(what))
                .unwrap()
                .clone()
        };
        for d in [diff(&a, &b), diff(&b, &a)] {
            let hardirq = row(&d, "hard-IRQ time per I/O, above idle");
            assert!((hardirq.a.unwrap() - 1_000.0).abs() < 20.0, "{hardirq:?}");
            assert_eq!(hardirq.verdict, Verdict::Equivalent, "{hardirq:?}");
            let msr = row(&d, "MSR exits per I/O, above idle");
            assert_eq!(msr.verdict, Verdict::Equivalent, "{msr:?}");
            // Every label fits the terminal report's 38 columns.
            assert!(d.waterfall.rows().all(|r| r.metric.len() <= 38), "{d:?}");
        }
        // An older profile on one side: both compared as before, and B's background shows.
        let mut old = b.clone();
        for r in &mut old.runs {
            r.idle = None;
        }
        let d = diff(&a, &old);
        let hardirq = row(&d, "hard-IRQ time per I/O (all IRQs)");
        assert_eq!(hardirq.verdict, Verdict::Significant, "{hardirq:?}");
        assert!(hardirq.b.unwrap() > 1.5 * hardirq.a.unwrap(), "{hardirq:?}");
    }

    #[test]
    fn the_host_wide_rows_are_judged_as_one_family_at_a_higher_confidence() {
        // B 10% above A on the log scale, t ≈ 2.8 with 5 + 5 runs: past t(0.975, 8) = 2.31,
        // short of t(0.995, 8) = 3.36.
        let spread = [-2.0, -1.0, 0.0, 1.0, 2.0].map(|k: f64| k * 0.0357);
        let a: Vec<f64> = spread.iter().map(|x| 1000.0 * x.exp()).collect();
        let b: Vec<f64> = spread.iter().map(|x| 1000.0 * (0.10 + x).exp()).collect();
        let opts = DiffOptions::default();
        let at = |confidence| {
            let points = (1000.0, 1000.0 * 0.10f64.exp());
            let how = Judging {
                basis: Basis::Runs,
                opts: &opts,
                confidence,
            };
            judge(&a, &b, points, Scale::Ratio, 1000.0, how).verdict
        };
        assert_eq!(at(CONFIDENCE), Verdict::Significant);
        assert_eq!(at(0.99), Verdict::Inconclusive);
        let d = diff(
            &noisy_runs(5, 100_000.0, 10_000.0, 0.02, 300_000.0),
            &noisy_runs(5, 100_000.0, 10_000.0, 0.02, 300_000.0),
        );
        let host_wide = |r: &&Row| HOST_WIDE.iter().any(|m| m.label == r.metric);
        assert_eq!(d.waterfall.evidence.iter().filter(host_wide).count(), 5);
        for r in d.waterfall.rows().chain(&d.throughput) {
            let want = if host_wide(&r) { 0.99 } else { CONFIDENCE };
            assert!(
                (r.confidence - want).abs() < 1e-12,
                "{}: {}",
                r.metric,
                r.confidence
            );
        }
        // The stages' tails likewise (eight rows: 1 − 5%/8); the app's tails are at 95%.
        assert_eq!(STAGE_TAILS, 8);
        for t in &d.tails {
            let want = if t.stage == Stage::App.name() {
                CONFIDENCE
            } else {
                1.0 - 0.05 / 8.0
            };
            assert!(
                (t.row.confidence - want).abs() < 1e-12,
                "{}: {}",
                t.row.metric,
                t.row.confidence
            );
        }
    }

    #[test]
    fn one_run_per_host_says_between_run_noise_is_unknown() {
        let a = synthetic(2_000.0, 300_000.0, 100_000.0, 20_000.0, 10);
        let b = synthetic(2_000.0, 301_000.0, 99_500.0, 20_000.0, 10);
        let d = diff(&a, &b);
        assert_eq!(d.basis, Basis::Batches);
        assert!(
            d.warnings
                .iter()
                .any(|w| w.contains("between-run noise is unknown")),
            "{:?}",
            d.warnings
        );
        for r in d.waterfall.rows().chain(&d.throughput) {
            assert_ne!(r.verdict, Verdict::Significant, "{}", r.metric);
        }
        assert!(
            d.tails
                .iter()
                .all(|t| t.row.verdict != Verdict::Significant),
            "tails are not judged from one run"
        );
        assert_eq!(d.verdict, None);
    }

    #[test]
    fn a_certain_difference_smaller_than_the_smallest_effect_is_equivalent() {
        // 0.5 µs on a 400 µs app latency with no jitter: a real difference, but not one of
        // interest at ±5%.
        let a = synthetic(2_000.0, 300_000.0, 100_000.0, 0.0, 10);
        let b = synthetic(2_000.0, 300_500.0, 100_000.0, 0.0, 10);
        let d = diff(&a, &b);
        assert_eq!(d.waterfall.app.verdict, Verdict::Equivalent);
        assert_eq!(d.waterfall.stages[1].verdict, Verdict::Equivalent);
        let strict = diff_hosts(&[&a], &[&b], &DiffOptions { min_effect: 0.001 });
        assert_eq!(
            strict.waterfall.stages[1].verdict,
            Verdict::Significant,
            "0.17% is significant when 0.1% is of interest"
        );
    }

    #[test]
    fn an_eight_percent_gap_over_five_runs_is_significant_both_ways_round() {
        // The motivating case: IOPS −8%, mean latency +9%, with 2% run-to-run noise.
        let a = noisy_runs(5, 400_000.0, 10_000.0, 0.02, 2e6);
        let b = noisy_runs(5, 436_000.0, 9_200.0, 0.02, 2e6);
        let d = diff(&a, &b);
        assert_eq!(d.basis, Basis::Runs);
        let (app, iops) = (&d.waterfall.app, &d.throughput[0]);
        assert_eq!(app.verdict, Verdict::Significant);
        assert!((app.effect.unwrap() - 0.09).abs() < 0.005, "{app:?}");
        assert!(app.effect_low.unwrap() > 0.0 && app.effect_high.unwrap() > 0.09);
        assert_eq!(iops.verdict, Verdict::Significant);
        assert!((iops.effect.unwrap() + 0.08).abs() < 0.005, "{iops:?}");
        assert_eq!(d.verdict.as_deref(), Some("device"));
        // Swapped, every row mirrors: the same verdict, the inverse ratio.
        let back = diff(&b, &a);
        for (x, y) in d.rows().zip(back.rows()) {
            assert_eq!(x.verdict, y.verdict, "{}", x.metric);
            if let (Some(e), Some(f), Scale::Ratio) = (x.effect, y.effect, x.scale) {
                assert!(((1.0 + e) * (1.0 + f) - 1.0).abs() < 1e-9, "{}", x.metric);
            }
        }
    }

    #[test]
    fn a_noisy_a_a_pair_is_never_significant_and_says_how_many_runs_would_resolve_it() {
        // Same host, 8% run-to-run noise, alternating pattern shifted between the sides.
        let a = noisy_runs(5, 400_000.0, 10_000.0, 0.08, 2e6);
        let mut b = noisy_runs(6, 400_000.0, 10_000.0, 0.08, 2e6);
        b.runs.remove(0);
        let d = diff(&a, &b);
        for r in d.waterfall.rows().chain(&d.throughput) {
            assert_ne!(r.verdict, Verdict::Significant, "{}", r.metric);
        }
        let app = &d.waterfall.app;
        assert_eq!(app.verdict, Verdict::Inconclusive, "{app:?}");
        let n = app.runs_needed.expect("runs basis says how many runs");
        assert!((6..1000).contains(&n), "{n}");
    }

    #[test]
    fn a_tail_that_grew_eightfold_is_significant_while_the_mean_barely_moves() {
        // 0.2% of I/Os: 2 ms on A, 16 ms on B. p99.9 moves 8x; the mean ~7%.
        let a = noisy_runs(5, 400_000.0, 10_000.0, 0.01, 2e6);
        let b = noisy_runs(5, 400_000.0, 10_000.0, 0.01, 16e6);
        let d = diff(&a, &b);
        let tail = d
            .tails
            .iter()
            .find(|t| t.stage == "app" && t.percentile == 99.9)
            .unwrap();
        assert_eq!(tail.row.verdict, Verdict::Significant, "{:?}", tail.row);
        assert!(tail.row.effect.unwrap() > 5.0, "{:?}", tail.row);
        let p99 = d
            .tails
            .iter()
            .find(|t| t.stage == "app" && t.percentile == 99.0)
            .unwrap();
        assert_ne!(
            p99.row.verdict,
            Verdict::Significant,
            "the p99 did not move"
        );
    }

    #[test]
    fn a_run_is_cut_into_about_root_n_batches_of_consecutive_intervals() {
        let sizes = |n: usize| -> Vec<usize> {
            let p = synthetic(1.0, 1.0, 1.0, 0.0, n);
            batches_of(&p.intervals).iter().map(Vec::len).collect()
        };
        assert_eq!(sizes(1), [1], "one interval: one batch, no spread");
        assert_eq!(sizes(5), [2, 3]);
        assert_eq!(sizes(10), [3, 3, 4]);
        assert_eq!(sizes(100), [10; 10]);
        let p = synthetic(1.0, 1.0, 1.0, 0.0, 7);
        let order: Vec<u64> = batches_of(&p.intervals)
            .concat()
            .iter()
            .map(|i| i.index)
            .collect();
        assert_eq!(order, (0..7).collect::<Vec<_>>(), "consecutive, none lost");
    }

    #[test]
    fn a_version_1_profile_diffs_as_one_run() {
        let v1: Profile =
            serde_json::from_str(include_str!("../../tests/data/minimal-profile.json")).unwrap();
        assert!(v1.runs.is_empty());
        let reps = v1.replicates();
        assert_eq!(reps.len(), 1);
        assert_eq!(reps[0].1.len(), v1.intervals.len());
        let d = diff(&v1, &noisy_runs(3, 400_000.0, 10_000.0, 0.01, 2e6));
        assert_eq!((d.runs_a, d.runs_b, d.basis), (1, 3, Basis::Batches));
    }

    #[test]
    fn welch_interval_matches_a_textbook_case() {
        // Two samples of 5 with variances 2.5 and 2.5: SE = 1, df = 8, t(0.975, 8) = 2.306.
        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        let b = [3.0, 4.0, 5.0, 6.0, 7.0];
        let hw = welch_half_width(&a, &b, 0.95).unwrap();
        assert!((hw - 2.306).abs() < 0.001, "{hw}");
        // t(0.995, 8) = 3.355.
        let hw = welch_half_width(&a, &b, 0.99).unwrap();
        assert!((hw - 3.355).abs() < 0.001, "{hw}");
        assert_eq!(welch_half_width(&a[..1], &b, 0.95), None);
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
    fn a_target_device_no_host_lists_is_not_a_confounder_unless_they_differ() {
        let mut a = synthetic(1.0, 1.0, 1.0, 0.0, 3);
        a.target.device = Some("loop0".into());
        let b = a.clone();
        let c = confounders(&a, &b);
        assert!(!c.iter().any(|x| x.contains("target device")), "{c:?}");
        let mut b = a.clone();
        b.target.device = Some("md0".into());
        let c = confounders(&a, &b);
        assert!(
            c.iter().any(|x| x == "target device: loop0 vs md0"),
            "{c:?}"
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

    #[test]
    fn queue_stages_that_start_at_different_points_are_flagged() {
        use virtgap_probes::attach::AttachOutcome;
        use virtgap_probes::{AttachKind, CapabilityReport, Family, FamilyReport};
        let with_block = |bio_entry: bool| {
            let mut p = synthetic(1.0, 1.0, 1.0, 0.0, 3);
            let hook = |tracepoint: &str, attached: bool| AttachOutcome {
                tracepoint: tracepoint.into(),
                attached: attached.then_some(AttachKind::Fentry),
                reason: (!attached).then(|| "fentry: refused".into()),
            };
            p.capabilities = Some(CapabilityReport {
                families: vec![FamilyReport {
                    family: Family::Block,
                    unavailable: None,
                    tracepoints: vec![
                        hook("block_rq_issue", true),
                        hook("submit_bio_noacct", bio_entry),
                    ],
                    fallback: None,
                }],
                ..Default::default()
            });
            p
        };
        let flagged = |a: &Profile, b: &Profile| {
            diff(a, b)
                .warnings
                .into_iter()
                .find(|w| w.contains("the queue stage starts"))
        };
        let (entry, request) = (with_block(true), with_block(false));
        let w = flagged(&entry, &request).expect("flagged");
        assert!(
            w.contains("enters the block layer on host A but where its request starts on host B"),
            "{w}"
        );
        let w = flagged(&request, &entry).expect("flagged");
        assert!(
            w.contains("on host B but where its request starts on host A"),
            "{w}"
        );
        assert_eq!(flagged(&entry, &entry), None);
        assert_eq!(flagged(&request, &request), None);
        // No hook, but block_bio_remap noted every request's bio (a partition's): the same start.
        let mut remapped = with_block(false);
        let requests = remapped.stages.queue.as_ref().unwrap().count;
        assert!(requests > 0);
        remapped.block = Some(crate::model::profile::BlockCounts {
            from_bio_entry: Some(requests),
            ..Default::default()
        });
        assert_eq!(
            remapped.queue_start(),
            Some(QueueStart::BioEntry { remap: true })
        );
        assert_eq!(flagged(&entry, &remapped), None);
        assert!(flagged(&remapped, &request).is_some());
        // Half of them: a mixed start, not the bio's entry.
        remapped.block.as_mut().unwrap().from_bio_entry = Some(requests / 2);
        assert_eq!(
            remapped.queue_start(),
            Some(QueueStart::Mixed {
                from_entry: requests / 2,
                requests
            })
        );
        assert!(flagged(&entry, &remapped).is_some());
        // A profile from before the count: at the request.
        remapped.block.as_mut().unwrap().from_bio_entry = None;
        assert_eq!(remapped.queue_start(), Some(QueueStart::Request));
        // Without the block probe there is no queue stage to compare.
        let bare = synthetic(1.0, 1.0, 1.0, 0.0, 3);
        assert_eq!(flagged(&bare, &entry), None);
    }

    #[test]
    fn hosts_that_split_an_io_into_different_numbers_of_requests_are_flagged() {
        let a = synthetic(1_000.0, 50_000.0, 5_000.0, 0.0, 3);
        // B's device takes smaller requests: each app I/O became eight.
        let mut b = a.clone();
        b.stages.device.as_mut().unwrap().count *= 8;
        let d = diff(&a, &b);
        let warning = d
            .warnings
            .iter()
            .find(|w| w.contains("different numbers of block requests"))
            .expect("flagged");
        assert!(warning.contains("A 1.00, B 8.00 per I/O"), "{warning}");
        let row = d
            .evidence
            .iter()
            .find(|e| e.item == "block requests per app I/O")
            .expect("listed");
        assert_eq!(row.a, "1.00 (3000 requests for 3000 I/Os)");
        assert_eq!(row.b, "8.00 (24000 requests for 3000 I/Os)");
        // The same unit on both sides: no warning.
        assert!(!diff(&a, &a.clone())
            .warnings
            .iter()
            .any(|w| w.contains("different numbers of block requests")));
        // Without block stages there is nothing to say.
        let mut bare = a.clone();
        bare.stages.device = None;
        let d = diff(&bare, &b);
        assert!(!d.warnings.iter().any(|w| w.contains("block requests")));
        let row = d
            .evidence
            .iter()
            .find(|e| e.item == "block requests per app I/O");
        assert_eq!(row.unwrap().a, "not measured");
    }
}
