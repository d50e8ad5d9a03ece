//! `diff`: attributes the difference between two hosts' profiles to stages. A pure function of
//! the profiles that returns numbers: rows keyed by [`MetricId`] with the hosts' values, the
//! interval and the verdict, and typed evidence, confounders and warnings. `render::diff_render`
//! writes every label and sentence.
//!
//! Means decompose exactly: app = queue + device + completion + software, where software is
//! everything outside the block layer and the device — submission and completion paths,
//! interrupt handling, wakeups (see [`StageBreakdown`]). So Δapp is the sum of the stages' Δ,
//! and each stage's share of the gap is its Δ over Δapp.
//!
//! Verdicts compare replicates. With two or more runs per host (`record --runs N`) a replicate
//! is a run, and each metric is compared as the ratio B/A on the log scale with a Welch 95%
//! interval over runs. With one run on a side, between-run noise is unknown: replicates are
//! then batches of consecutive intervals (batch means, so autocorrelated intervals do not pose
//! as independent ones) and the verdicts say they are within-run only. A row is a difference
//! only when its whole interval lies beyond the user's smallest effect of interest
//! (`--min-effect`) on one side; it is equivalent when the whole interval lies inside
//! ±that effect; otherwise inconclusive, with the runs per host that would resolve it. Every
//! rule is symmetric: swapping A and B mirrors each row.
//!
//! `figures` turns each replicate into its figures, `judge` compares them row by row,
//! `tail_waterfall` sets the tail autopsies side by side, and `context` gathers what is shown
//! beside the rows (workload and host differences, evidence, warnings).

mod context;
mod figures;
mod judge;
mod tail_waterfall;
#[cfg(test)]
pub(crate) mod tests;

use serde::{Serialize, Serializer};

use virtgap_probes::hypervisor::{Hypervisor, Mechanism};

use crate::analysis::stats::CONFIDENCE;
use crate::model::host::Fingerprint;
use crate::model::profile::Profile;
use crate::model::stages::{Stage, StageBreakdown};

pub use context::{
    spec_differences, BusiestIrqCpu, Confounder, CpuShare, CrossCpu, Evidence, HostEvidence,
    HostTrait, QueueStartSplit, Setting, SpecDifference, SpecKey, SpecValue, Steal, Warning,
};
pub use tail_waterfall::{TailRow, TailWaterfall};

/// The smallest effect `diff` calls a difference unless told otherwise: 5%, the size of gap the
/// tool is for (a VM 8% short of bare metal) and about the run-to-run spread of a quiet host.
pub const DEFAULT_MIN_EFFECT: f64 = 0.05;

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
    /// The whole interval lies beyond the smallest effect, on one side.
    Significant,
    /// The whole interval lies within ±the smallest effect.
    Equivalent,
    /// Neither: more replicates would tell.
    Inconclusive,
    /// Fewer than two replicates on a side: no interval to judge by.
    InsufficientData,
    /// One of the hosts could not measure it.
    NotMeasured,
    /// One host has no hypervisor (metal): there is nothing to compare it with, and the other
    /// host's figure is all of the difference.
    NoHypervisor,
    /// The whole interval lies beyond the smallest effect, but its replicates are batches
    /// within single runs:
    /// a host-wide figure drifts between runs more than batches show, so it holds for these
    /// runs only.
    WithinRuns,
    /// The whole interval lies beyond the smallest effect, but each host's runs come from one
    /// recording, back to back: a change in the machine between the two sessions moves every
    /// run of a side alike, so the difference holds between these two sessions only.
    OneSession,
}

impl Verdict {
    /// The whole interval lies beyond the smallest effect: for good, or, from one run or one
    /// session a side, for these runs or sessions only.
    pub fn found_a_difference(self) -> bool {
        matches!(
            self,
            Self::Significant | Self::WithinRuns | Self::OneSession
        )
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

/// One of the hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    A,
    B,
}

/// Which hosts something holds for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hosts {
    A,
    B,
    Both,
}

impl Hosts {
    /// The hosts for which `(on_a, on_b)` hold (None: neither).
    fn of(on_a: bool, on_b: bool) -> Option<Self> {
        match (on_a, on_b) {
            (true, true) => Some(Self::Both),
            (true, false) => Some(Self::A),
            (false, true) => Some(Self::B),
            (false, false) => None,
        }
    }
}

/// The parts a mean I/O's latency adds up to (see [`StageBreakdown`]), in the waterfall's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakdownPart {
    Queue,
    Device,
    Completion,
    /// What the block stages leave of app: submission, reaping, anything outside the block layer.
    Software,
}

impl BreakdownPart {
    pub const ALL: [BreakdownPart; 4] = [
        BreakdownPart::Queue,
        BreakdownPart::Device,
        BreakdownPart::Completion,
        BreakdownPart::Software,
    ];

    /// This part of a breakdown, in ns.
    pub fn of(self, b: &StageBreakdown) -> f64 {
        match self {
            Self::Queue => b.queue_ns,
            Self::Device => b.device_ns,
            Self::Completion => b.completion_ns,
            Self::Software => b.software_ns,
        }
    }

    /// Its stable identifier ("queue").
    pub fn key(self) -> &'static str {
        match self {
            Self::Queue => "queue",
            Self::Device => "device",
            Self::Completion => "completion",
            Self::Software => "software",
        }
    }
}

/// What a row compares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MetricId {
    /// Mean app latency: the gap the stages explain.
    AppMean,
    /// A stage's mean, per block request (software: the residual per I/O).
    Stage(BreakdownPart),
    /// Wakeup delay of the workload's threads per I/O.
    WakeupPerIo,
    /// Hard-IRQ time of all CPUs per I/O.
    HardirqPerIo,
    /// Softirq time of all CPUs per I/O.
    SoftirqPerIo,
    /// IPIs sent per I/O.
    IpisPerIo,
    /// Exit-causing MSR writes per I/O.
    MsrExitsPerIo,
    /// Those writes times the calibrated cost of an exit: an estimate, never judged.
    EstMsrExitTimePerIo,
    /// Mean latency of the workload's cache flushes.
    FlushMean,
    Iops,
    /// A percentile of one stage's latency (app included).
    Tail {
        stage: Stage,
        percentile: f64,
    },
    /// How often the guest used a hypervisor mechanism per I/O, above idle.
    MechanismPerIo(Mechanism),
    /// Time in a mechanism's timed hypercall paths per I/O, above idle.
    MechanismTimePerIo(Mechanism),
    /// Sampled CPU time in the hypervisor interface per I/O, above idle.
    HypervisorCpuPerIo,
    /// Time in every mechanism's paths per I/O, above idle (halts left out): the hypervisor's
    /// part of the gap, an upper bound since the paths are timed host-wide, not on the I/O's
    /// own path.
    HypervisorTimePerIo,
    /// Mean NVMe command latency (the driver's setup to completion) on one queue id, over the
    /// NVMe disks under the target.
    NvmeCommandMean(u16),
}

impl MetricId {
    pub fn unit(self) -> Unit {
        match self {
            Self::IpisPerIo | Self::MsrExitsPerIo | Self::MechanismPerIo(_) => Unit::PerIo,
            Self::Iops => Unit::Iops,
            _ => Unit::Ns,
        }
    }

    /// Its stable identifier in snake case: "app_mean", "device_mean", "app_p99_9".
    pub fn key(self) -> String {
        match self {
            Self::AppMean => "app_mean".into(),
            Self::Stage(part) => format!("{}_mean", part.key()),
            Self::WakeupPerIo => "wakeup_per_io".into(),
            Self::HardirqPerIo => "hardirq_per_io".into(),
            Self::SoftirqPerIo => "softirq_per_io".into(),
            Self::IpisPerIo => "ipis_per_io".into(),
            Self::MsrExitsPerIo => "msr_exits_per_io".into(),
            Self::EstMsrExitTimePerIo => "est_msr_exit_time_per_io".into(),
            Self::FlushMean => "flush_mean".into(),
            Self::Iops => "iops".into(),
            Self::Tail { stage, percentile } => {
                format!("{}_p{percentile}", stage.name()).replace('.', "_")
            }
            Self::MechanismPerIo(m) => format!("{}_per_io", m.name()),
            Self::MechanismTimePerIo(m) => format!("{}_time_per_io", m.name()),
            Self::HypervisorCpuPerIo => "hypervisor_cpu_per_io".into(),
            Self::HypervisorTimePerIo => "hypervisor_time_per_io".into(),
            Self::NvmeCommandMean(qid) => format!("nvme_q{qid}_command_mean"),
        }
    }
}

impl Serialize for BreakdownPart {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.key())
    }
}

impl Serialize for MetricId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.key())
    }
}

/// One compared metric.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub metric: MetricId,
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
    /// Share of the app-latency gap (the stage rows and the hypervisor's time), as a
    /// fraction.
    pub share: Option<f64>,
    /// The share's approximate 95% interval (the hypervisor's time only: its interval and the
    /// gap's, combined as if independent).
    pub share_low: Option<f64>,
    pub share_high: Option<f64>,
    /// True for estimates built from counts rather than measured times.
    pub estimated: bool,
    /// The interval's confidence: 0.95, or higher for a row judged as one of a family.
    pub confidence: f64,
}

/// The mean waterfall.
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
    /// App, stages, evidence: the order the reports list them in.
    pub fn rows(&self) -> impl Iterator<Item = &Row> {
        std::iter::once(&self.app)
            .chain(&self.stages)
            .chain(&self.evidence)
    }
}

/// The stage whose tail moved most (by ratio) among the significant stage tails, at which
/// percentile, and by how much.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TailMover {
    pub stage: Stage,
    pub percentile: f64,
    pub delta_ns: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ProfileDiff {
    /// Each side's host, from its first profile.
    pub host_a: Fingerprint,
    pub host_b: Fingerprint,
    /// A's workload: its name and where it came from ("preset rand4k", a path).
    pub workload: String,
    pub workload_origin: String,
    /// Smallest effect of interest, as a fraction.
    pub min_effect: f64,
    /// Runs on each side, over all its profiles.
    pub runs_a: usize,
    pub runs_b: usize,
    pub basis: Basis,
    /// Workload keys whose values differ (empty: same workload).
    pub spec_differences: Vec<SpecDifference>,
    /// Host differences that can confound the comparison.
    pub confounders: Vec<Confounder>,
    pub warnings: Vec<Warning>,
    /// The host-wide figures per I/O are above each host's idle activity.
    pub above_idle: bool,
    /// Mean app latency, the stages it decomposes into, and host-wide evidence.
    pub waterfall: Waterfall,
    /// p99 and p99.9 of app latency and of each probed stage.
    pub tails: Vec<Row>,
    pub tail_mover: Option<TailMover>,
    /// Where each host's I/Os above its p99 and p99.9 spent their time (the tail autopsy),
    /// when both sides recorded it.
    pub tail_waterfalls: Vec<TailWaterfall>,
    pub throughput: Vec<Row>,
    pub evidence: Evidence,
    /// Stage with the largest significant share of the gap, if any.
    pub verdict: Option<BreakdownPart>,
    /// The hypervisor's mechanisms and CPU time, per I/O above idle, judged as one family.
    pub hypervisor: HypervisorBlock,
    /// NVMe command latency per queue id that both hosts' runs used, judged as one family
    /// (empty: a side without NVMe, or profiles from before it was kept per run).
    pub nvme_queues: Vec<Row>,
    /// Where each side's figures came from: its files and when its runs were recorded.
    pub source_a: SideSource,
    pub source_b: SideSource,
}

/// Where one side's figures came from, so two reports of one host, or two sides recorded on
/// hosts alike, can be told apart.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SideSource {
    /// The side's profiles as the caller named them (files, or Prometheus instances); empty
    /// until the caller says.
    pub files: Vec<String>,
    /// The first run's start and the last run's end, Unix ms (None: no profile says).
    pub recorded_unix_ms: Option<(u64, u64)>,
}

impl SideSource {
    /// A side recorded over `spans`, each a profile's or result's (start, end) in Unix ms (a
    /// start of 0: not known): from the earliest start to the latest end.
    pub fn recorded(spans: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let known: Vec<(u64, u64)> = spans.into_iter().filter(|&(s, _)| s > 0).collect();
        let started = known.iter().map(|&(s, _)| s).min();
        let ended = known.iter().map(|&(s, e)| e.max(s)).max();
        Self {
            files: Vec::new(),
            recorded_unix_ms: started.zip(ended),
        }
    }
}

impl ProfileDiff {
    /// The diff with each side's files named, as the caller read them.
    pub fn with_files(mut self, a: Vec<String>, b: Vec<String>) -> Self {
        self.source_a.files = a;
        self.source_b.files = b;
        self
    }
}

/// The diff's hypervisor block.
#[derive(Clone, Debug, PartialEq)]
pub struct HypervisorBlock {
    /// Each side's hypervisor (`Hypervisor::None` on metal; None: not measured there).
    pub a: Option<Hypervisor>,
    pub b: Option<Hypervisor>,
    /// Per mechanism either side measured: uses per I/O, and the time of its timed paths per
    /// I/O; then the sampled CPU time in the hypervisor interface per I/O.
    pub rows: Vec<Row>,
    /// The mechanism whose uses per I/O moved most, significantly (None: none did).
    pub moved: Option<Mechanism>,
    /// Per side, the mechanisms its hypervisor does not offer (a CPUID bit says so): a row of
    /// one reads "not offered by this host" on that side.
    pub not_offered: (Vec<Mechanism>, Vec<Mechanism>),
}

impl MetricId {
    /// Whether the row's figures are host-wide activity per I/O less the idle host's (when the
    /// profiles measured it): below 0 only where the host did less of it than idle.
    pub fn is_above_idle(self) -> bool {
        matches!(
            self,
            Self::HardirqPerIo
                | Self::SoftirqPerIo
                | Self::IpisPerIo
                | Self::MsrExitsPerIo
                | Self::EstMsrExitTimePerIo
                | Self::MechanismPerIo(_)
                | Self::MechanismTimePerIo(_)
                | Self::HypervisorTimePerIo
                | Self::HypervisorCpuPerIo
        )
    }

    /// The hypervisor mechanism a row is about, if it is one's.
    pub fn mechanism(self) -> Option<Mechanism> {
        match self {
            Self::MechanismPerIo(m) | Self::MechanismTimePerIo(m) => Some(m),
            _ => None,
        }
    }
}

impl ProfileDiff {
    /// Every compared row: the waterfall, throughput, the tails, the hypervisor block, then
    /// the NVMe queues.
    pub fn rows(&self) -> impl Iterator<Item = &Row> {
        self.waterfall
            .rows()
            .chain(&self.throughput)
            .chain(&self.tails)
            .chain(&self.hypervisor.rows)
            .chain(&self.nvme_queues)
    }

    /// The row of `metric`, wherever it is listed.
    pub fn row(&self, metric: MetricId) -> Option<&Row> {
        self.rows().find(|r| r.metric == metric)
    }

    /// Whether B is significantly slower: its mean or tail app latency up, or its IOPS down.
    pub fn b_slower(&self) -> bool {
        self.rows().any(|r| {
            let effect = r.effect.unwrap_or(0.0);
            r.verdict == Verdict::Significant
                && match r.metric {
                    MetricId::AppMean => effect > 0.0,
                    MetricId::Tail {
                        stage: Stage::App, ..
                    } => effect > 0.0,
                    MetricId::Iops => effect < 0.0,
                    _ => false,
                }
        })
    }

    /// Whether any row is significant, either way.
    pub fn any_significant(&self) -> bool {
        self.rows().any(|r| r.verdict == Verdict::Significant)
    }
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
    let replicates = figures::Replicates::of(a_side, b_side);
    let sides = (&replicates.a, &replicates.b);
    let (runs_a, runs_b) = (sides.0.runs.len(), sides.1.runs.len());
    let basis = if runs_a >= 2 && runs_b >= 2 {
        Basis::Runs
    } else {
        Basis::Batches
    };
    // Runs recorded back to back in one session a host show none of the noise between
    // sessions: ten default A/A pairs on one machine called a row significant in two, each a
    // real change of the machine between the two sessions' minutes.
    let one_session = context::one_session_each(a_side, b_side);
    let how = judge::Judging {
        basis,
        one_session,
        opts,
        confidence: CONFIDENCE,
    };
    let kind = |p: &Profile| p.hypervisor.as_ref().map(|h| h.hypervisor);
    let kinds = (kind(a), kind(b));
    let waterfall = judge::waterfall(sides, how, (exit_cost(a), exit_cost(b)), kinds);
    let tails = judge::tails(sides, how);
    let tail_mover = tail_mover(&tails);
    let verdict = stage_verdict(&waterfall);
    let not_offered = |p: &Profile| {
        p.hypervisor
            .as_ref()
            .map_or_else(Vec::new, |h| h.not_offered())
    };
    let hypervisor = judge::hypervisor_block(
        sides,
        how,
        kinds,
        (not_offered(a), not_offered(b)),
        &waterfall.app,
    );
    ProfileDiff {
        host_a: a.host.clone(),
        host_b: b.host.clone(),
        workload: a.workload.name.clone(),
        workload_origin: a.workload.origin.clone(),
        min_effect: opts.min_effect,
        runs_a,
        runs_b,
        basis,
        spec_differences: spec_differences(a, b),
        confounders: context::confounders(a, b),
        warnings: context::warnings(
            a_side,
            b_side,
            replicates.folded,
            (runs_a, runs_b),
            one_session,
        ),
        above_idle: replicates.above_idle,
        waterfall,
        tails,
        tail_mover,
        tail_waterfalls: tail_waterfall::of(a_side, b_side, replicates.folded.is_some()),
        throughput: vec![judge::compare(MetricId::Iops, sides, how, None)],
        evidence: Evidence {
            a: HostEvidence::of(a_side),
            b: HostEvidence::of(b_side),
        },
        verdict,
        hypervisor,
        nvme_queues: judge::nvme_queues(sides, how),
        source_a: recorded(a_side),
        source_b: recorded(b_side),
    }
}

/// When a side's profiles were recorded, from their own run information.
fn recorded(side: &[&Profile]) -> SideSource {
    SideSource::recorded(
        side.iter()
            .map(|p| (p.run.started_unix_ms, p.run.ended_unix_ms)),
    )
}

/// One metric compared over replicates given by the caller (one figure per replicate and host,
/// all positive), on the ratio scale: for figures whose replicates are not a profile's runs,
/// such as iotune results recorded minutes apart.
pub fn compare_replicates(metric: MetricId, a: &[f64], b: &[f64], opts: &DiffOptions) -> Row {
    let how = judge::Judging {
        basis: Basis::Runs,
        one_session: false,
        opts,
        confidence: CONFIDENCE,
    };
    judge::compare_figures(metric, a, b, how)
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

/// The stage tail that moved most, by ratio, among those judged significant at any tail
/// percentile (the app's own tail left out): a move within the noise names nothing.
fn tail_mover(tails: &[Row]) -> Option<TailMover> {
    tails
        .iter()
        .filter(|r| r.verdict == Verdict::Significant)
        .filter_map(|r| match r.metric {
            MetricId::Tail { stage, percentile } if stage != Stage::App => {
                Some((stage, percentile, r.delta?, r.effect?))
            }
            _ => None,
        })
        .max_by(|x, y| x.3.abs().total_cmp(&y.3.abs()))
        .map(|(stage, percentile, delta_ns, _)| TailMover {
            stage,
            percentile,
            delta_ns,
        })
}

impl ProfileDiff {
    /// Whether any stage tail was judged at all (runs on both sides): then no mover means no
    /// stage's tail moved significantly.
    pub fn tails_judged(&self) -> bool {
        self.tails.iter().any(|r| {
            matches!(r.metric, MetricId::Tail { stage, .. } if stage != Stage::App)
                && matches!(
                    r.verdict,
                    Verdict::Significant | Verdict::Equivalent | Verdict::Inconclusive
                )
        })
    }
}

/// With a significant gap in mean latency, the stage with the largest significant share of it
/// (with one run a side, both provisional: within these runs only).
fn stage_verdict(waterfall: &Waterfall) -> Option<BreakdownPart> {
    if !waterfall.app.verdict.found_a_difference() {
        return None;
    }
    waterfall
        .stages
        .iter()
        .filter(|r| r.verdict.found_a_difference() && r.share.is_some_and(|s| s > 0.0))
        .max_by(|x, y| x.share.unwrap_or(0.0).total_cmp(&y.share.unwrap_or(0.0)))
        .and_then(|r| match r.metric {
            MetricId::Stage(part) => Some(part),
            _ => None,
        })
}
