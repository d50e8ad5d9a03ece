//! The profile: one JSON document describing a recorded run — the host, what could be measured
//! on it, the exact workload, per-interval series and cumulative stage histograms. Pure data
//! (serde both ways): the recorder builds it, the diff and the CSV writer read it.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use virtgap_probes::model::{BlockOp, BlockStage, CpuEvents, DevNum, ProbeSnapshot, ProgramStats};
use virtgap_probes::{CapabilityReport, KernelHist};
use virtgap_workloads::stats::{IntervalSample, RunStats};
use virtgap_workloads::LatencyHistogram;

use crate::model::host::{Fingerprint, TargetDisks};

/// Bump when a field changes meaning or disappears; readers refuse newer versions.
/// 2: `runs` (one entry per replicate of `record --runs N`); a version-1 profile reads as one
/// run whose figures are the whole profile's (see [`Profile::replicates`]).
/// 3: `stages.device` ends at the entry of the queue's interrupt handler and
/// `stages.completion` holds the rest; without a completion stage (older profiles, devices with
/// no known queue IRQ) device runs to the request's completion, and the diff compares both
/// sides that way.
pub const SCHEMA_VERSION: u32 = 3;

/// A latency distribution as sparse buckets with exact count and sum.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Histogram {
    pub count: u64,
    pub sum_ns: f64,
    pub min_ns: Option<u64>,
    pub max_ns: Option<u64>,
    /// [low ns, high ns inclusive, count] for every non-empty bucket, ascending.
    pub buckets: Vec<[u64; 3]>,
    /// Sum of the squared values, for the exact standard deviation (the workload's
    /// histograms; the kernel's keep none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum_sq_ns: Option<f64>,
}

impl Histogram {
    pub fn from_latency(h: &LatencyHistogram) -> Self {
        Self {
            count: h.count(),
            sum_ns: h.sum_ns() as f64,
            min_ns: h.min_ns(),
            max_ns: h.max_ns(),
            buckets: h
                .buckets()
                .into_iter()
                .map(|(l, hi, n)| [l, hi, n])
                .collect(),
            sum_sq_ns: Some(h.sum_sq_ns() as f64),
        }
    }

    pub fn from_kernel(h: &KernelHist) -> Self {
        let buckets: Vec<[u64; 3]> = h
            .buckets()
            .into_iter()
            .map(|(l, hi, n)| [l, hi.min(u64::MAX / 2), n])
            .collect();
        // The kernel keeps no extremes, only buckets: min and max are unknown, not the first
        // bucket's low or the last one's high bound.
        Self {
            count: h.count,
            sum_ns: h.sum_ns as f64,
            min_ns: None,
            max_ns: None,
            buckets,
            sum_sq_ns: None,
        }
    }

    pub fn mean_ns(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ns / self.count as f64)
    }

    /// Population standard deviation (fio's), where the sum of squares is kept.
    pub fn stddev_ns(&self) -> Option<f64> {
        let mean = self.mean_ns()?;
        let mean_sq = self.sum_sq_ns? / self.count as f64;
        Some((mean_sq - mean * mean).max(0.0).sqrt())
    }

    /// Percentile `p` of a kernel histogram, read as its copy in a profile reads it.
    pub fn kernel_percentile_ns(h: &KernelHist, p: f64) -> Option<f64> {
        Self::from_kernel(h).percentile_ns(p)
    }

    /// The histogram of `values`, as the workload would record them (for tests).
    #[cfg(test)]
    pub fn of_values(values: &[u64]) -> Self {
        let mut h = LatencyHistogram::new();
        for &v in values {
            h.record(v);
        }
        Self::from_latency(&h)
    }

    /// Adds `other` into this one. Buckets with the same bounds add up (both sources use fixed
    /// bucket layouts, so a run's buckets line up with another run's of the same source).
    pub fn merge(&mut self, other: &Histogram) {
        // An empty side (a default histogram merged into) has nothing to add or lose.
        self.sum_sq_ns = match (self.count, other.count) {
            (_, 0) => self.sum_sq_ns,
            (0, _) => other.sum_sq_ns,
            _ => self.sum_sq_ns.zip(other.sum_sq_ns).map(|(a, b)| a + b),
        };
        self.count = self.count.saturating_add(other.count);
        self.sum_ns += other.sum_ns;
        let pick = |a: Option<u64>, b: Option<u64>, f: fn(u64, u64) -> u64| match (a, b) {
            (Some(a), Some(b)) => Some(f(a, b)),
            (a, b) => a.or(b),
        };
        self.min_ns = pick(self.min_ns, other.min_ns, u64::min);
        self.max_ns = pick(self.max_ns, other.max_ns, u64::max);
        let mut by_bounds: BTreeMap<(u64, u64), u64> = BTreeMap::new();
        for &[lo, hi, n] in self.buckets.iter().chain(&other.buckets) {
            let slot = by_bounds.entry((lo, hi)).or_default();
            *slot = slot.saturating_add(n);
        }
        self.buckets = by_bounds
            .into_iter()
            .map(|((lo, hi), n)| [lo, hi, n])
            .collect();
    }

    /// Adds `other` into an optional histogram (a stage one side may not have).
    pub fn merge_into(slot: &mut Option<Histogram>, other: Option<&Histogram>) {
        match (slot.as_mut(), other) {
            (Some(mine), Some(other)) => mine.merge(other),
            (None, Some(other)) => *slot = Some(other.clone()),
            _ => {}
        }
    }

    /// Percentile `p` (0–100) by virtgap's one rule (`percentile_of_buckets`).
    pub fn percentile_ns(&self, p: f64) -> Option<f64> {
        let buckets: Vec<(u64, u64, u64)> = self
            .buckets
            .iter()
            .map(|&[lo, hi, n]| (lo, hi, n))
            .collect();
        let extremes = self.min_ns.zip(self.max_ns);
        virtgap_workloads::histogram::percentile_of_buckets(&buckets, p, extremes)
    }
}

/// Latency statistics of one direction of the workload (fio's definitions).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DirectionResult {
    pub ios: u64,
    pub bytes: u64,
    pub iops: f64,
    pub bw_bytes_per_s: f64,
    pub slat: Histogram,
    pub clat: Histogram,
    pub lat: Histogram,
    /// Paced runs only.
    pub lat_intended: Option<Histogram>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WorkloadResult {
    pub read: DirectionResult,
    pub write: DirectionResult,
    pub measured_s: f64,
    pub usr_cpu_pct: f64,
    pub sys_cpu_pct: f64,
    pub cpu_ns_per_io: Option<f64>,
    pub context_switches: u64,
    pub engine_features: String,
    /// Worst lag behind the pacing schedule (paced runs).
    pub max_schedule_lag_ns: Option<u64>,
}

/// A stage of an I/O's time that a profile keeps a histogram of (and, but for `App`, a
/// per-interval count and sum under `Interval::stages`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    App,
    Queue,
    Device,
    Completion,
    Wakeup,
}

impl Stage {
    pub const ALL: [Stage; 5] = [
        Stage::App,
        Stage::Queue,
        Stage::Device,
        Stage::Completion,
        Stage::Wakeup,
    ];
    /// The block and scheduler stages the probes measure.
    pub const PROBED: [Stage; 4] = [
        Stage::Queue,
        Stage::Device,
        Stage::Completion,
        Stage::Wakeup,
    ];

    /// Its name in profiles, CSV files and the diff.
    pub fn name(self) -> &'static str {
        match self {
            Stage::App => "app",
            Stage::Queue => BlockStage::Queue.name(),
            Stage::Device => BlockStage::Device.name(),
            Stage::Completion => BlockStage::Completion.name(),
            Stage::Wakeup => "wakeup",
        }
    }
}

/// The stage histograms of the workload's own I/Os, over the measured window (the ramp left out).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Stages {
    /// Application-visible latency (`lat`, both directions).
    pub app: Histogram,
    /// Block layer: request start -> issue (None when the block probe did not attach).
    pub queue: Option<Histogram>,
    /// Issue -> entry of the completing queue's interrupt handler (-> completion for requests
    /// whose queue IRQ is unknown: see `completion`).
    pub device: Option<Histogram>,
    /// Interrupt handler entry -> request completion, for the requests whose queue IRQ is known
    /// (absent: none was, as on loop or md-only targets, or a profile from before the stage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<Histogram>,
    /// Wakeup -> on CPU of the workload's threads.
    pub wakeup: Option<Histogram>,
    /// The workload's cache flushes: request start -> completion (none counted before 6.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush: Option<Histogram>,
}

/// Block requests per app I/O (see [`Stages::requests_per_io`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RequestsPerIo {
    pub requests: u64,
    pub ios: u64,
}

impl RequestsPerIo {
    pub fn ratio(self) -> f64 {
        self.requests as f64 / self.ios as f64
    }

    /// Whether the block layer kept one request per I/O, within 5%: the probes' window and the
    /// workload's differ by the I/Os in flight at their edges (the requests of those drained at
    /// the end count, the I/Os do not), and a split or a merge moves the figure far more.
    pub fn one_to_one(self) -> bool {
        (self.ratio() - 1.0).abs() <= 0.05
    }

    /// "2.00 (7910 requests for 3955 I/Os)".
    pub fn describe(self) -> String {
        format!(
            "{:.2} ({} requests for {} I/Os)",
            self.ratio(),
            self.requests,
            self.ios
        )
    }
}

impl Stages {
    /// Block requests completed per app I/O over (nearly) the same window: 1 when every I/O was
    /// one request, more when the block layer split them or a mirror wrote them to each disk,
    /// fewer when it merged them or served some without one. The block stages are per request and the app's latency per I/O, so where
    /// this is not 1 the two are not the same unit. None without the block stages.
    pub fn requests_per_io(&self) -> Option<RequestsPerIo> {
        let requests = self.device.as_ref()?.count;
        let ios = self.app.count;
        (requests > 0 && ios > 0).then_some(RequestsPerIo { requests, ios })
    }

    /// The whole-run histogram of `stage` (None when its probe did not attach).
    pub fn get(&self, stage: Stage) -> Option<&Histogram> {
        match stage {
            Stage::App => Some(&self.app),
            Stage::Queue => self.queue.as_ref(),
            Stage::Device => self.device.as_ref(),
            Stage::Completion => self.completion.as_ref(),
            Stage::Wakeup => self.wakeup.as_ref(),
        }
    }

    /// Mean completion stage per block request, the requests without one counting 0: what
    /// the stage adds to queue + device, so the means still decompose a request's time.
    pub fn completion_per_request(&self) -> Option<f64> {
        let (c, d) = (self.completion.as_ref()?, self.device.as_ref()?);
        (d.count > 0).then(|| c.sum_ns / d.count as f64)
    }
}

/// One request-based disk under the target: its read and write stages, per hardware queue,
/// and the NVMe command latency per queue id (NVMe only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DeviceProfile {
    pub name: String,
    pub major: u32,
    pub minor: u32,
    pub stages: DeviceStages,
    pub queues: Vec<QueueStages>,
    pub nvme_queues: Vec<NvmeQueueLatency>,
    /// The stages of each kind of request on its own: reads, writes, and cache flushes (a
    /// flush is never queued by the workload: its `device` runs from start to completion).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<OpStages>,
}

/// One kind of request's stages on one disk.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OpStages {
    /// "read", "write" or "flush".
    pub op: String,
    pub stages: DeviceStages,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DeviceStages {
    pub queue: Option<Histogram>,
    pub device: Option<Histogram>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<Histogram>,
}

/// One hardware queue's share of a disk's stages.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QueueStages {
    pub hctx: u16,
    pub queue: StageSample,
    pub device: StageSample,
    #[serde(default)]
    pub completion: StageSample,
}

/// NVMe command latency (setup -> completion) on one queue id (hardware queue + 1).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NvmeQueueLatency {
    pub qid: u16,
    pub count: u64,
    pub sum_ns: u64,
    pub p99_ns: Option<f64>,
    /// The commands' latency distribution (reads and writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<Histogram>,
}

/// One CPU's interrupt load over an interval or a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CpuLoad {
    pub cpu: u32,
    pub hardirq_ns: u64,
    pub softirq_ns: u64,
    pub hardirq_count: u64,
    pub softirq_count: u64,
    /// Hard IRQs by name (e.g. "virtio1-req.0") -> count.
    pub irqs: BTreeMap<String, u64>,
    /// Hard IRQs by name -> time in their handlers, ns (the run's total only, not per interval).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub irq_time_ns: BTreeMap<String, u64>,
    /// IPIs sent from this CPU ("reschedule", "function_call") -> count, one per target CPU.
    pub ipis_sent: BTreeMap<String, u64>,
    /// Cross-CPU calls queued from this CPU by purpose ("block_completion", "wakeup", "other").
    #[serde(default)]
    pub cross_cpu_calls: BTreeMap<String, u64>,
    /// System vectors received (local_timer, reschedule, ...) -> count.
    pub vectors: BTreeMap<String, u64>,
    /// Time in user, system, idle and steal, from /proc/stat (None when not read).
    pub user_ns: Option<u64>,
    pub system_ns: Option<u64>,
    pub idle_ns: Option<u64>,
    /// Time the hypervisor ran something else while this vCPU wanted to run.
    pub steal_ns: Option<u64>,
}

/// A block stage over one interval, for one device (both ops merged).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StageSample {
    pub count: u64,
    pub sum_ns: u64,
}

/// Requests the block probe kept whole or lost over the measured window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BlockCounts {
    /// Requests whose device time ran to their completion (no completion stage): their
    /// queue's IRQ is not known here, or did not fire.
    pub unsplit: u64,
    /// Requests or histogram entries lost to full probe maps.
    pub dropped: u64,
    /// Reads and writes on the target's disks whose queue time started at their first bio's
    /// entry into the block layer: set against `stages.queue`'s count (absent in profiles from
    /// before this was counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_bio_entry: Option<u64>,
}

/// Where a profile's queue stage starts (see [`Profile::queue_start`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueStart {
    /// Where each bio entered the block layer: blk-throttle and tag waits are queue.
    /// `remap`: noted at block_bio_remap (a partition's bios) for want of a hook on
    /// submit_bio_noacct.
    BioEntry { remap: bool },
    /// At the request: blk-throttle and tag waits fall before it, in the software residual.
    Request,
    /// At the bio's entry for `from_entry` of `requests` (those block_bio_remap saw), at the
    /// request for the rest.
    Mixed { from_entry: u64, requests: u64 },
}

impl QueueStart {
    /// Share of requests from the bio's entry above which a remap-noted stage counts as
    /// starting there (a few requests built without a noted bio: at the window's edges).
    const WHOLE: f64 = 0.95;

    pub fn from_bio_entry(self) -> bool {
        matches!(self, Self::BioEntry { .. })
    }
}

/// Everything measured in one interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Interval {
    pub index: u64,
    /// Seconds since the measured window started.
    pub start_s: f64,
    pub end_s: f64,
    pub read_ios: u64,
    pub write_ios: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub lat_count: u64,
    pub lat_sum_ns: f64,
    pub lat_p50_ns: Option<u64>,
    pub lat_p99_ns: Option<u64>,
    /// `Stage::name` of a probed stage -> this interval's count and sum.
    pub stages: BTreeMap<String, StageSample>,
    pub cpus: Vec<CpuLoad>,
    /// CPU time our BPF programs used in the interval, ns.
    pub probe_run_ns: Option<u64>,
    /// MSR writes that exit to this host's hypervisor in the interval, all CPUs, virtgap's own
    /// sampler's left out (None: probe not attached).
    #[serde(default)]
    pub msr_writes: Option<u64>,
    /// Age at the interval's end of the oldest I/O the workload still had in flight (0: none;
    /// absent: not tracked, as for kv).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_in_flight_ns: Option<u64>,
}

/// The probes' own cost over the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SelfOverhead {
    /// None when run statistics were unavailable.
    pub programs: Option<Vec<ProgramCost>>,
    pub probe_cpu_pct: Option<f64>,
    /// Map-full events: measurements not recorded.
    pub dropped: u64,
    /// CPU used by virtgap's recorder and collector threads (beyond the workload and the probes).
    pub recorder_cpu_pct: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProgramCost {
    pub family: String,
    pub name: String,
    pub runs: u64,
    pub run_time_ns: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TargetInfo {
    pub description: String,
    pub path: String,
    pub size_bytes: u64,
    /// Block device holding the target ("vda", "md0"), when known.
    pub device: Option<String>,
    /// The request-based disks whose stages are the target's: the device itself, or the disks
    /// under a stacked one (md, dm, NVMe multipath).
    #[serde(default)]
    pub stage_devices: Vec<String>,
    /// Why block stages may be missing or summed, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_note: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WorkloadInfo {
    pub name: String,
    /// "preset rand4k" or the file path.
    pub origin: String,
    /// The preset or file text exactly as read.
    pub source_text: String,
    /// The spec as run, after command-line overrides (TOML).
    pub effective_spec: String,
    /// The fio command running the same job; null for kv (fio has no key-value store).
    pub fio_equivalent: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunInfo {
    pub tool_version: String,
    pub command_line: Vec<String>,
    pub started_unix_ms: u64,
    pub ended_unix_ms: u64,
    /// What each of `intervals` spans.
    pub interval_s: f64,
    /// The interval asked for, when the run was long enough for its series to be coarsened
    /// (each interval then spans a power-of-two multiple of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_interval_s: Option<f64>,
    /// The most intervals this host's series keeps (its coarsening began there), when coarsened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_intervals: Option<u64>,
    /// False when the run was interrupted (Ctrl-C, SIGTERM) before its planned end.
    pub complete: bool,
}

/// One recorded run of virtgap (or several, in `runs`): host fingerprint, probe capabilities,
/// the exact workload, per-interval series and cumulative stage histograms. Latencies are in
/// nanoseconds, times in seconds unless a field name says otherwise.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Profile {
    pub schema_version: u32,
    pub complete: bool,
    pub run: RunInfo,
    pub host: Fingerprint,
    /// None for runs without probes.
    pub capabilities: Option<CapabilityReport>,
    pub workload: WorkloadInfo,
    pub target: TargetInfo,
    pub results: WorkloadResult,
    pub stages: Stages,
    pub intervals: Vec<Interval>,
    /// Interrupt load per CPU over the measured window (`record`; the TUI's saved profiles: over
    /// the probes' lifetime).
    pub cpus: Vec<CpuLoad>,
    /// Seconds of that window (the denominator for the CPU loads).
    pub probe_seconds: Option<f64>,
    /// (submitting CPU, completing CPU, count) of the workload's block requests.
    pub cpu_pairs: Vec<[u64; 3]>,
    /// What the block probe could not split or record (None: the block probe did not run, or
    /// a profile from before these were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<BlockCounts>,
    /// Hypervisor signals: MSR accesses, the sampler's split of CPU time, host-side KVM events
    /// and paravirt callback times; None when none of their probes attached.
    pub virtualization: Option<Virtualization>,
    /// Calibrated costs of exit-causing operations (`record --calibrate`); None when not run.
    pub calibration: Option<crate::cmd::calibrate::Calibration>,
    pub self_overhead: SelfOverhead,
    /// The kv workload's rates, integrity figures and per-slice verdict (kv runs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv: Option<KvSection>,
    /// Per disk under the target (several for md/dm/multipath): stages per hardware queue.
    #[serde(default)]
    pub devices: Vec<DeviceProfile>,
    /// Stalls in the measured window (absent in profiles from before they were detected).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalls: Option<crate::model::stalls::Stalls>,
    /// Each replicate run, in order (absent in version-1 profiles). With more than one run the
    /// workload results, stage histograms, intervals, CPU loads and block counts above pool
    /// every run; the
    /// `virtualization`, `devices`, `kv`, `self_overhead` and `stalls` sections are the first
    /// run's (a stall in any later run is named there too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<RunRecord>,
}

/// One replicate of `record --runs N`: the workload on a freshly prepared target with its own
/// ramp. The diff's verdicts compare these, not the intervals inside one run, whose
/// run-to-run variation no single run can show.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunRecord {
    /// 1 for the first run.
    pub run: u32,
    pub started_unix_ms: u64,
    /// False when this run was interrupted.
    pub complete: bool,
    pub measured_s: f64,
    pub read_ios: u64,
    pub write_ios: u64,
    /// The app stage from the workload; the probed stages over the measured window only (the
    /// ramp's requests left out), so every stage covers the same I/Os' span.
    pub stages: Stages,
    /// Host-wide hard-IRQ and softirq time, IPIs sent and exit-causing MSR writes (virtgap's
    /// sampler's left out) over the same window; None when their probe did not attach.
    pub hardirq_ns: Option<u64>,
    pub softirq_ns: Option<u64>,
    pub ipis_sent: Option<u64>,
    pub msr_writes: Option<u64>,
    /// Seconds of that window.
    pub probe_seconds: Option<f64>,
    /// How many of the profile's `intervals` are this run's (they follow the earlier runs').
    pub intervals: u64,
    /// Where the I/Os above this run's app p99 and p99.9 spent their time (None: not
    /// recorded — no block probe, a kv workload, or a profile from before the autopsy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<crate::model::tail::TailAutopsy>,
    /// The host with the probes attached and the workload not yet started: the host-wide
    /// figures per I/O are compared above it (None: no probes, or a profile from before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdleBaseline>,
}

/// One interval of the host idle (as far as virtgap is concerned) just before the workload:
/// the background that host-wide figures per I/O would otherwise carry, more of it per I/O the
/// fewer I/Os a host does.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct IdleBaseline {
    pub seconds: f64,
    pub hardirq_ns: Option<u64>,
    pub softirq_ns: Option<u64>,
    pub ipis_sent: Option<u64>,
    /// Exit-causing MSR writes, virtgap's sampler's left out.
    pub msr_writes: Option<u64>,
}

impl IdleBaseline {
    /// `counts_ipis`: whether this kernel's probes count IPIs sent (else None, not 0).
    pub fn of(probes: &ProbeInterval, seconds: f64, counts_ipis: bool) -> Self {
        let sum_cpus = |f: fn(&CpuLoad) -> u64| {
            (!probes.cpus.is_empty()).then(|| probes.cpus.iter().map(f).sum::<u64>())
        };
        Self {
            seconds,
            hardirq_ns: sum_cpus(|c| c.hardirq_ns),
            softirq_ns: sum_cpus(|c| c.softirq_ns),
            ipis_sent: sum_cpus(|c| c.ipis_sent.values().sum()).filter(|_| counts_ipis),
            msr_writes: probes.msr_writes,
        }
    }

    /// Several baselines of one host as one: their sums over their total time (None: none,
    /// or no time). A figure missing from any of them is missing from the sum.
    pub fn pooled(all: impl IntoIterator<Item = IdleBaseline>) -> Option<Self> {
        let add = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(x, y)| x.saturating_add(y));
        let total = all.into_iter().reduce(|a, b| Self {
            seconds: a.seconds + b.seconds,
            hardirq_ns: add(a.hardirq_ns, b.hardirq_ns),
            softirq_ns: add(a.softirq_ns, b.softirq_ns),
            ipis_sent: add(a.ipis_sent, b.ipis_sent),
            msr_writes: add(a.msr_writes, b.msr_writes),
        })?;
        (total.seconds > 0.0).then_some(total)
    }

    /// `idle`'s rate (per second of this baseline) times `seconds`: what the idle host would
    /// have done over that long.
    pub fn over(&self, idle: Option<u64>, seconds: f64) -> Option<f64> {
        (self.seconds > 0.0).then_some(())?;
        idle.map(|v| v as f64 / self.seconds * seconds)
    }
}

impl RunRecord {
    /// The record of the one run `p` holds, numbered `run`: its figures are the profile's.
    pub fn of_profile(p: &Profile, run: u32) -> Self {
        let sum_cpus = |f: fn(&CpuLoad) -> u64| {
            (!p.cpus.is_empty()).then(|| p.cpus.iter().map(f).sum::<u64>())
        };
        Self {
            run,
            started_unix_ms: p.run.started_unix_ms,
            complete: p.complete,
            measured_s: p.results.measured_s,
            read_ios: p.results.read.ios,
            write_ios: p.results.write.ios,
            stages: p.stages.clone(),
            hardirq_ns: sum_cpus(|c| c.hardirq_ns),
            softirq_ns: sum_cpus(|c| c.softirq_ns),
            // Not counted before Linux 6.4 (the per-CPU maps are empty then, not zero).
            ipis_sent: sum_cpus(|c| c.ipis_sent.values().sum())
                .filter(|_| p.capabilities.as_ref().is_none_or(|r| r.counts_ipis())),
            msr_writes: p
                .intervals
                .iter()
                .filter_map(|i| i.msr_writes)
                .reduce(|a, b| a.saturating_add(b)),
            probe_seconds: p.probe_seconds,
            intervals: p.intervals.len() as u64,
            tail: None,
            idle: None,
        }
    }

    pub fn ios(&self) -> f64 {
        self.read_ios as f64 + self.write_ios as f64
    }

    /// I/Os per second over the measured window (None: no window).
    pub fn iops(&self) -> Option<f64> {
        (self.measured_s > 0.0).then(|| self.ios() / self.measured_s)
    }
}

impl Profile {
    /// Where the queue stage starts: at each bio's entry where the hook on submit_bio_noacct
    /// attached, or where block_bio_remap noted (nearly) every read's and write's bio; else at
    /// the request. None without the block probe.
    pub fn queue_start(&self) -> Option<QueueStart> {
        let report = self.capabilities.as_ref()?;
        if !report.attached(virtgap_probes::Family::Block) {
            return None;
        }
        if report.queue_from_bio_entry() {
            return Some(QueueStart::BioEntry { remap: false });
        }
        let from_entry = self.block.as_ref().and_then(|b| b.from_bio_entry);
        let requests = self.stages.queue.as_ref().map_or(0, |h| h.count);
        Some(match from_entry {
            Some(n) if n > 0 && requests > 0 => {
                if n as f64 >= requests as f64 * QueueStart::WHOLE {
                    QueueStart::BioEntry { remap: true }
                } else {
                    QueueStart::Mixed {
                        from_entry: n,
                        requests,
                    }
                }
            }
            _ => QueueStart::Request,
        })
    }

    /// The replicate runs, with the intervals of each: `runs` as recorded, or — for a
    /// version-1 profile — one run made of the whole profile.
    pub fn replicates(&self) -> Vec<(RunRecord, &[Interval])> {
        if self.runs.is_empty() {
            return vec![(RunRecord::of_profile(self, 1), &self.intervals[..])];
        }
        let mut rest = &self.intervals[..];
        self.runs
            .iter()
            .map(|r| {
                let n = (r.intervals as usize).min(rest.len());
                let (mine, later) = rest.split_at(n);
                rest = later;
                (r.clone(), mine)
            })
            .collect()
    }
}

fn direction(d: &virtgap_workloads::stats::DirStats, secs: f64) -> DirectionResult {
    let rate = |x: u64| if secs > 0.0 { x as f64 / secs } else { 0.0 };
    DirectionResult {
        ios: d.ios,
        bytes: d.bytes,
        iops: rate(d.ios),
        bw_bytes_per_s: rate(d.bytes),
        slat: Histogram::from_latency(&d.slat),
        clat: Histogram::from_latency(&d.clat),
        lat: Histogram::from_latency(&d.lat),
        lat_intended: (!d.lat_intended.is_empty())
            .then(|| Histogram::from_latency(&d.lat_intended)),
    }
}

pub fn workload_result(stats: &RunStats, paced: bool) -> WorkloadResult {
    let secs = stats.seconds();
    let pct = |ns: u64| {
        if secs > 0.0 {
            ns as f64 / 1e9 / secs * 100.0
        } else {
            0.0
        }
    };
    WorkloadResult {
        read: direction(&stats.read, secs),
        write: direction(&stats.write, secs),
        measured_s: secs,
        usr_cpu_pct: pct(stats.cpu.user_ns),
        sys_cpu_pct: pct(stats.cpu.system_ns),
        cpu_ns_per_io: stats.cpu_ns_per_io(),
        context_switches: stats.cpu.context_switches,
        engine_features: stats.engine_features.clone(),
        max_schedule_lag_ns: paced.then_some(stats.max_lag_ns),
    }
}

/// The app-stage histogram: `lat` of both directions merged.
pub fn app_stage(stats: &RunStats) -> Histogram {
    let mut all = stats.read.lat.clone();
    all.merge(&stats.write.lat);
    Histogram::from_latency(&all)
}

fn load_of(cpus: &mut BTreeMap<u32, CpuLoad>, cpu: u32) -> &mut CpuLoad {
    cpus.entry(cpu).or_insert_with(|| CpuLoad {
        cpu,
        ..Default::default()
    })
}

/// Per-CPU load from a probe snapshot (cumulative or one interval): interrupt handling from
/// the IRQ probes, time by state from /proc/stat.
pub fn cpu_loads(snap: &ProbeSnapshot) -> Vec<CpuLoad> {
    let mut cpus: BTreeMap<u32, CpuLoad> = BTreeMap::new();
    for t in &snap.cpu_times {
        let c = load_of(&mut cpus, t.cpu);
        c.user_ns = Some(t.user_ns);
        c.system_ns = Some(t.system_ns);
        c.idle_ns = Some(t.idle_ns + t.iowait_ns);
        c.steal_ns = Some(t.steal_ns);
    }
    let Some(irq) = &snap.irq else {
        return cpus.into_values().collect();
    };
    // Zero counts (a source idle in this interval) are left out of the per-name maps.
    for h in &irq.hardirqs {
        let c = load_of(&mut cpus, h.cpu);
        c.hardirq_ns += h.time_ns;
        c.hardirq_count += h.count;
        if h.count > 0 {
            *c.irqs.entry(h.name.clone()).or_default() += h.count;
        }
    }
    for s in &irq.softirqs {
        let c = load_of(&mut cpus, s.cpu);
        c.softirq_ns += s.time_ns;
        c.softirq_count += s.count;
    }
    // Per-CPU counts by kind into one of the load's maps.
    let mut tally = |events: &[CpuEvents],
                     field: fn(&mut CpuLoad) -> &mut BTreeMap<String, u64>| {
        for e in events.iter().filter(|e| e.count > 0) {
            *field(load_of(&mut cpus, e.cpu))
                .entry(e.kind.clone())
                .or_default() += e.count;
        }
    };
    tally(&irq.vectors, |c| &mut c.vectors);
    tally(&irq.ipis_sent, |c| &mut c.ipis_sent);
    tally(&irq.cross_cpu_calls, |c| &mut c.cross_cpu_calls);
    cpus.into_values().collect()
}

/// `cpu_loads` with each hard IRQ's handler time (a run's total: per interval it would grow
/// every interval by a map per CPU).
pub fn cpu_loads_with_irq_time(snap: &ProbeSnapshot) -> Vec<CpuLoad> {
    let mut cpus = cpu_loads(snap);
    for h in snap.irq.iter().flat_map(|q| &q.hardirqs) {
        if let (Some(c), true) = (cpus.iter_mut().find(|c| c.cpu == h.cpu), h.count > 0) {
            *c.irq_time_ns.entry(h.name.clone()).or_default() += h.time_ns;
        }
    }
    cpus
}

/// Stage samples of the workload's device from one probe interval.
pub fn stage_samples(
    snap: &ProbeSnapshot,
    devs: Option<&[DevNum]>,
) -> BTreeMap<String, StageSample> {
    let mut out = BTreeMap::new();
    if let Some(block) = &snap.block {
        for stage in [
            BlockStage::Queue,
            BlockStage::Device,
            BlockStage::Completion,
        ] {
            let h = block.stage(devs, stage, &[BlockOp::Read, BlockOp::Write]);
            out.insert(
                stage.name().to_string(),
                StageSample {
                    count: h.count,
                    sum_ns: h.sum_ns,
                },
            );
        }
    }
    if let Some(w) = &snap.wakeups {
        out.insert(
            Stage::Wakeup.name().into(),
            StageSample {
                count: w.latency.count,
                sum_ns: w.latency.sum_ns,
            },
        );
    }
    out
}

/// What one probe interval contributes to a profile interval, condensed as soon as it arrives
/// so a run keeps no raw snapshots.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProbeInterval {
    pub stages: BTreeMap<String, StageSample>,
    pub cpus: Vec<CpuLoad>,
    pub probe_run_ns: Option<u64>,
    pub msr_writes: Option<u64>,
}

impl ProbeInterval {
    pub fn of(probes: &ProbeSnapshot, devs: Option<&[DevNum]>) -> Self {
        Self {
            stages: stage_samples(probes, devs),
            cpus: cpu_loads(probes),
            probe_run_ns: (!probes.programs.is_empty())
                .then(|| probes.programs.iter().map(|q| q.run_time_ns).sum()),
            msr_writes: probes
                .msr
                .as_ref()
                .and_then(|m| m.exiting_writes(probes.elapsed_ns)),
        }
    }
}

/// A workload interval joined with its probe interval (None: no probes, or none arrived).
pub fn interval(sample: &IntervalSample, probes: Option<ProbeInterval>) -> Interval {
    let probes = probes.unwrap_or_default();
    Interval {
        index: sample.index,
        start_s: sample.start_ns as f64 / 1e9,
        end_s: sample.end_ns as f64 / 1e9,
        read_ios: sample.read_ios,
        write_ios: sample.write_ios,
        read_bytes: sample.read_bytes,
        write_bytes: sample.write_bytes,
        lat_count: sample.lat.count(),
        lat_sum_ns: sample.lat.sum_ns() as f64,
        lat_p50_ns: sample.lat.percentile_ns(50.0),
        lat_p99_ns: sample.lat.percentile_ns(99.0),
        stages: probes.stages,
        cpus: probes.cpus,
        probe_run_ns: probes.probe_run_ns,
        msr_writes: probes.msr_writes,
        oldest_in_flight_ns: sample.oldest_in_flight_ns,
    }
}

impl Interval {
    /// This interval's count and sum of a probed stage (None when not measured).
    pub fn stage(&self, stage: Stage) -> Option<&StageSample> {
        self.stages.get(stage.name())
    }

    /// Adds the next interval `later` into this one: counts and times summed, the span extended;
    /// percentiles are left to the caller, who holds the latency histograms.
    pub fn absorb(&mut self, later: &Interval) {
        self.end_s = later.end_s;
        self.read_ios += later.read_ios;
        self.write_ios += later.write_ios;
        self.read_bytes += later.read_bytes;
        self.write_bytes += later.write_bytes;
        self.lat_count += later.lat_count;
        self.lat_sum_ns += later.lat_sum_ns;
        for (name, s) in &later.stages {
            let mine = self.stages.entry(name.clone()).or_default();
            mine.count += s.count;
            mine.sum_ns += s.sum_ns;
        }
        absorb_cpus(&mut self.cpus, &later.cpus);
        self.probe_run_ns = add_measured(self.probe_run_ns, later.probe_run_ns);
        self.msr_writes = add_measured(self.msr_writes, later.msr_writes);
        // The coarse interval's end is the later one's.
        self.oldest_in_flight_ns = later.oldest_in_flight_ns.or(self.oldest_in_flight_ns);
    }
}

/// Adds each CPU's load in `later` into the same CPU's in `loads`, kept in CPU order.
fn absorb_cpus(loads: &mut Vec<CpuLoad>, later: &[CpuLoad]) {
    for c in later {
        match loads.iter_mut().find(|m| m.cpu == c.cpu) {
            Some(mine) => mine.absorb(c),
            None => loads.push(c.clone()),
        }
    }
    loads.sort_by_key(|c| c.cpu);
}

impl CpuLoad {
    fn absorb(&mut self, later: &CpuLoad) {
        self.hardirq_ns += later.hardirq_ns;
        self.softirq_ns += later.softirq_ns;
        self.hardirq_count += later.hardirq_count;
        self.softirq_count += later.softirq_count;
        for (mine, theirs) in [
            (&mut self.irqs, &later.irqs),
            (&mut self.ipis_sent, &later.ipis_sent),
            (&mut self.cross_cpu_calls, &later.cross_cpu_calls),
            (&mut self.vectors, &later.vectors),
        ] {
            for (k, v) in theirs {
                *mine.entry(k.clone()).or_default() += v;
            }
        }
        self.user_ns = add_measured(self.user_ns, later.user_ns);
        self.system_ns = add_measured(self.system_ns, later.system_ns);
        self.idle_ns = add_measured(self.idle_ns, later.idle_ns);
        self.steal_ns = add_measured(self.steal_ns, later.steal_ns);
    }
}

/// The sum of two figures that may not have been measured: measured if either was.
fn add_measured(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

pub fn program_costs(programs: &[ProgramStats]) -> Vec<ProgramCost> {
    programs
        .iter()
        .map(|p| ProgramCost {
            family: p.family.to_string(),
            name: p.name.clone(),
            runs: p.run_count,
            run_time_ns: p.run_time_ns,
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("{path}: cannot read: {err}")]
    Read { path: String, err: std::io::Error },
    #[error("{path}: not a virtgap profile ({err})")]
    NotProfile { path: String, err: String },
    #[error("{path}: schema version {found} is newer than this virtgap understands ({SCHEMA_VERSION}); upgrade virtgap")]
    Newer { path: String, found: u64 },
    #[error("{path}: profile schema version {found}; this virtgap reads versions {MIN_SCHEMA_VERSION} to {SCHEMA_VERSION}")]
    Unsupported { path: String, found: u64 },
    #[error("{path}: profile schema version {found}, but it has {field}, which version {since} added: its schema_version is wrong (set it to the version that wrote the file)")]
    VersionMismatch {
        path: String,
        found: u64,
        field: String,
        since: u32,
    },
    #[error(
        "{path} is {size} bytes, over the {MAX_PROFILE_BYTES}-byte limit for a profile; is it one?"
    )]
    TooLarge { path: String, size: u64 },
}

/// The oldest schema version virtgap reads (there was never a version 0).
pub const MIN_SCHEMA_VERSION: u32 = 1;

/// The largest profile virtgap reads: far above a day-long run's, far below what would exhaust
/// memory when a wrong file is named.
pub const MAX_PROFILE_BYTES: u64 = 256 << 20;

/// The JSON Schema of a profile file, generated from the types above (`virtgap schema` prints
/// it; `schema/profile.schema.json` is this, and a test keeps it so).
pub fn json_schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(Profile);
    schema.insert(
        "$id".into(),
        format!("https://virtgap.dev/schema/profile-{SCHEMA_VERSION}.json").into(),
    );
    schema.insert("title".into(), "virtgap profile".into());
    schema.to_value()
}

/// Reads a profile, refusing files that are not profiles, are not regular files (a FIFO without
/// waiting for a writer), are implausibly large or come from a newer virtgap; a value that does
/// not fit says where it is (`stages.device.count: …`).
pub fn load(path: &std::path::Path) -> Result<Profile, ProfileError> {
    use virtgap_workloads::input::{read_bounded, InputError};
    let shown = path.display().to_string();
    // A FIFO, a device or a file over the limit is refused before anything is read from it.
    let bytes = read_bounded(path, MAX_PROFILE_BYTES).map_err(|e| match e {
        InputError::Io(err) => ProfileError::Read {
            path: shown.clone(),
            err,
        },
        InputError::NotRegular(kind) => ProfileError::NotProfile {
            path: shown.clone(),
            err: format!("{kind}, not a regular file"),
        },
        InputError::TooLarge { size, .. } => ProfileError::TooLarge {
            path: shown.clone(),
            size,
        },
    })?;
    parse(&bytes, &shown)
}

/// Parses a profile's bytes (`shown` names it in errors): the schema version first, then the
/// whole document straight into the typed model (no intermediate JSON tree), then the values
/// serde cannot check (finite, in range, consistent).
pub fn parse(bytes: &[u8], shown: &str) -> Result<Profile, ProfileError> {
    let not_profile = |err: String| ProfileError::NotProfile {
        path: shown.to_string(),
        err,
    };
    /// Only the version: every other field is skipped without being kept.
    #[derive(Deserialize, JsonSchema)]
    struct VersionOnly {
        schema_version: Option<serde_json::Value>,
    }
    let head: VersionOnly =
        serde_json::from_slice(bytes).map_err(|e| not_profile(format!("not JSON: {e}")))?;
    let version = match head.schema_version {
        None => return Err(not_profile("no schema_version".into())),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| not_profile(format!("schema_version is {v}, not a version number")))?,
    };
    if version > u64::from(SCHEMA_VERSION) {
        return Err(ProfileError::Newer {
            path: shown.to_string(),
            found: version,
        });
    }
    if version < u64::from(MIN_SCHEMA_VERSION) {
        return Err(ProfileError::Unsupported {
            path: shown.to_string(),
            found: version,
        });
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let profile: Profile = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let at = e.path().to_string();
        not_profile(format!("{at}: {}", e.into_inner()))
    })?;
    if let Some((field, since)) = newer_than(&profile, version) {
        return Err(ProfileError::VersionMismatch {
            path: shown.to_string(),
            found: version,
            field,
            since,
        });
    }
    validate(&profile).map_err(not_profile)?;
    Ok(profile)
}

/// A section a profile of schema `version` cannot have, with the version that added it: read
/// as its version says, such a profile would be misread (before version 3, `stages.device` runs
/// to the request's completion).
fn newer_than(p: &Profile, version: u64) -> Option<(String, u32)> {
    if version >= 3 {
        return None;
    }
    let stages = std::iter::once(("stages".to_string(), p.stages.completion.is_some())).chain(
        p.runs
            .iter()
            .enumerate()
            .map(|(n, r)| (format!("runs[{n}].stages"), r.stages.completion.is_some())),
    );
    let devices = p.devices.iter().enumerate().flat_map(|(n, d)| {
        std::iter::once((
            format!("devices[{n}].stages"),
            d.stages.completion.is_some(),
        ))
        .chain(d.ops.iter().enumerate().map(move |(m, o)| {
            (
                format!("devices[{n}].ops[{m}].stages"),
                o.stages.completion.is_some(),
            )
        }))
    });
    let intervals = p.intervals.iter().enumerate().map(|(n, iv)| {
        (
            format!("intervals[{n}].stages"),
            iv.stages.contains_key(Stage::Completion.name()),
        )
    });
    let (at, _) = stages
        .chain(devices)
        .chain(intervals)
        .find(|(_, has)| *has)?;
    Some((format!("{at}.completion"), 3))
}

/// Checks what the types cannot: times and rates finite and not negative, intervals that end
/// after they start, histograms whose buckets, count and sum agree. The first problem found is
/// named by its field path.
fn validate(p: &Profile) -> Result<(), String> {
    let non_negative = |at: &str, v: f64| {
        if v.is_finite() && v >= 0.0 {
            Ok(())
        } else {
            Err(format!("{at}: {v} is not a finite, non-negative number"))
        }
    };
    non_negative("run.interval_s", p.run.interval_s)?;
    if p.run.interval_s == 0.0 {
        return Err("run.interval_s: 0 is not an interval length".into());
    }
    // Beyond these no run of any length gets: rates and sums of such figures would overflow
    // into inf rather than say anything.
    const MAX_SECONDS: f64 = 1e9;
    const MAX_NS_SUM: f64 = 1e24;
    const MAX_PCT: f64 = 1e6;
    let at_most = |at: &str, v: f64, max: f64| {
        non_negative(at, v)?;
        if v > max {
            return Err(format!("{at}: {v} is beyond any real run (at most {max})"));
        }
        Ok(())
    };
    at_most("run.interval_s", p.run.interval_s, MAX_SECONDS)?;
    // Windows are measured with nanosecond clocks: a shorter one is no measurement, and rates
    // over it could be infinite. Anything longer is a window record writes (`-d 100us`, or a
    // run interrupted at its start).
    const MIN_WINDOW_S: f64 = 1e-9;
    let window = |at: &str, v: f64| {
        at_most(at, v, MAX_SECONDS)?;
        if v > 0.0 && v < MIN_WINDOW_S {
            return Err(format!("{at}: {} s is shorter than any run", number(v)));
        }
        Ok(())
    };
    window("results.measured_s", p.results.measured_s)?;
    if let Some(s) = p.probe_seconds {
        window("probe_seconds", s)?;
    }
    for (at, v) in [
        ("results.usr_cpu_pct", Some(p.results.usr_cpu_pct)),
        ("results.sys_cpu_pct", Some(p.results.sys_cpu_pct)),
        ("self_overhead.probe_cpu_pct", p.self_overhead.probe_cpu_pct),
        (
            "self_overhead.recorder_cpu_pct",
            p.self_overhead.recorder_cpu_pct,
        ),
    ] {
        if let Some(v) = v {
            at_most(at, v, MAX_PCT)?;
        }
    }
    // Per-CPU times and counts are added up across CPUs and intervals: bounded far above a
    // real run (3 years of nanoseconds) so those sums cannot overflow.
    const MAX_U64: u64 = 100_000_000_000_000_000;
    let cpu_ok = |at: &str, c: &CpuLoad| -> Result<(), String> {
        let fields = [
            ("hardirq_ns", Some(c.hardirq_ns)),
            ("softirq_ns", Some(c.softirq_ns)),
            ("hardirq_count", Some(c.hardirq_count)),
            ("softirq_count", Some(c.softirq_count)),
            ("user_ns", c.user_ns),
            ("system_ns", c.system_ns),
            ("idle_ns", c.idle_ns),
            ("steal_ns", c.steal_ns),
        ];
        let maps = [&c.irqs, &c.ipis_sent, &c.cross_cpu_calls, &c.vectors];
        let too_big = fields
            .iter()
            .filter_map(|(name, v)| v.filter(|v| *v > MAX_U64).map(|v| (name.to_string(), v)))
            .chain(
                maps.iter()
                    .flat_map(|m| m.iter())
                    .filter(|(_, v)| **v > MAX_U64)
                    .map(|(k, v)| (k.clone(), *v)),
            )
            .next();
        match too_big {
            Some((name, v)) => Err(format!("{at}.{name}: {v} is beyond any real run")),
            None => Ok(()),
        }
    };
    for (n, c) in p.cpus.iter().enumerate() {
        cpu_ok(&format!("cpus[{n}]"), c)?;
    }
    if let Some(n) = p.cpu_pairs.iter().position(|x| x[2] > MAX_U64) {
        return Err(format!("cpu_pairs[{n}]: a count beyond any real run"));
    }
    for (n, r) in p.runs.iter().enumerate() {
        window(&format!("runs[{n}].measured_s"), r.measured_s)?;
        if let Some(s) = r.probe_seconds {
            window(&format!("runs[{n}].probe_seconds"), s)?;
        }
        let counts = [
            ("read_ios", Some(r.read_ios)),
            ("write_ios", Some(r.write_ios)),
            ("hardirq_ns", r.hardirq_ns),
            ("softirq_ns", r.softirq_ns),
            ("ipis_sent", r.ipis_sent),
            ("msr_writes", r.msr_writes),
        ];
        if let Some((name, v)) = counts
            .iter()
            .find_map(|(name, v)| v.filter(|v| *v > MAX_U64).map(|v| (name, v)))
        {
            return Err(format!("runs[{n}].{name}: {v} is beyond any real run"));
        }
        if let Some(idle) = &r.idle {
            window(&format!("runs[{n}].idle.seconds"), idle.seconds)?;
            let counts = [
                idle.hardirq_ns,
                idle.softirq_ns,
                idle.ipis_sent,
                idle.msr_writes,
            ];
            if counts.iter().flatten().any(|v| *v > MAX_U64) {
                return Err(format!("runs[{n}].idle: a count beyond any real run"));
            }
        }
        for (m, set) in r.tail.iter().flat_map(|t| t.sets.iter().enumerate()) {
            let at = format!("runs[{n}].tail.sets[{m}]");
            let m = &set.mean;
            let finite = [
                m.app_ns,
                m.queue_ns,
                m.device_ns,
                m.completion_ns,
                m.software_ns,
            ]
            .iter()
            .chain([&set.threshold_ns, &set.baseline.app_ns])
            .all(|v| v.is_finite() && v.abs() <= MAX_U64 as f64);
            if !finite || set.joined > set.ios || !(0.0..=100.0).contains(&set.percentile) {
                return Err(format!(
                    "{at}: figures no run gives (joined {} of {} I/Os, p{})",
                    set.joined, set.ios, set.percentile
                ));
            }
        }
    }
    let listed: u64 = p
        .runs
        .iter()
        .map(|r| r.intervals)
        .fold(0, u64::saturating_add);
    if !p.runs.is_empty() && listed != p.intervals.len() as u64 {
        return Err(format!(
            "runs: list {listed} intervals, the profile has {}",
            p.intervals.len()
        ));
    }
    for (n, iv) in p.intervals.iter().enumerate() {
        for (m, c) in iv.cpus.iter().enumerate() {
            cpu_ok(&format!("intervals[{n}].cpus[{m}]"), c)?;
        }
        for (name, st) in &iv.stages {
            if st.count > MAX_U64 || st.sum_ns > MAX_U64 {
                return Err(format!("intervals[{n}].stages.{name}: beyond any real run"));
            }
        }
        for (name, v) in [
            ("read_ios", iv.read_ios),
            ("write_ios", iv.write_ios),
            ("read_bytes", iv.read_bytes),
            ("write_bytes", iv.write_bytes),
            ("lat_count", iv.lat_count),
        ] {
            if v > MAX_U64 {
                return Err(format!("intervals[{n}].{name}: {v} is beyond any real run"));
            }
        }
        at_most(&format!("intervals[{n}].start_s"), iv.start_s, MAX_SECONDS)?;
        at_most(&format!("intervals[{n}].end_s"), iv.end_s, MAX_SECONDS)?;
        at_most(
            &format!("intervals[{n}].lat_sum_ns"),
            iv.lat_sum_ns,
            MAX_NS_SUM,
        )?;
        if iv.end_s <= iv.start_s {
            return Err(format!(
                "intervals[{n}]: ends ({} s) no later than it starts ({} s)",
                iv.end_s, iv.start_s
            ));
        }
    }
    for (at, h) in histograms(p) {
        histogram_ok(h, MAX_U64, MAX_NS_SUM).map_err(|e| format!("{at}: {e}"))?;
    }
    Ok(())
}

/// `v` as an error shows it: in exponent form where the plain one would run to dozens of digits.
fn number(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-6..1e16).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        v.to_string()
    }
}

/// Every histogram of a profile, named by its field path.
fn histograms<'a>(p: &'a Profile) -> Vec<(String, &'a Histogram)> {
    fn named<'a>(
        at: String,
        found: impl IntoIterator<Item = (&'static str, Option<&'a Histogram>)>,
    ) -> impl Iterator<Item = (String, &'a Histogram)> {
        found
            .into_iter()
            .filter_map(move |(name, h)| Some((format!("{at}.{name}"), h?)))
    }
    let stages = |at: String, s: &'a Stages| {
        named(
            at,
            [
                ("app", Some(&s.app)),
                ("queue", s.queue.as_ref()),
                ("device", s.device.as_ref()),
                ("completion", s.completion.as_ref()),
                ("wakeup", s.wakeup.as_ref()),
                ("flush", s.flush.as_ref()),
            ],
        )
    };
    let mut out: Vec<(String, &'a Histogram)> = stages("stages".into(), &p.stages).collect();
    for (n, r) in p.runs.iter().enumerate() {
        out.extend(stages(format!("runs[{n}].stages"), &r.stages));
    }
    for (dir, d) in [("read", &p.results.read), ("write", &p.results.write)] {
        let at = format!("results.{dir}");
        out.push((format!("{at}.slat"), &d.slat));
        out.push((format!("{at}.clat"), &d.clat));
        out.push((format!("{at}.lat"), &d.lat));
        if let Some(h) = &d.lat_intended {
            out.push((format!("{at}.lat_intended"), h));
        }
    }
    let device_stages = |at: String, s: &'a DeviceStages| {
        named(
            at,
            [
                ("queue", s.queue.as_ref()),
                ("device", s.device.as_ref()),
                ("completion", s.completion.as_ref()),
            ],
        )
    };
    for (n, d) in p.devices.iter().enumerate() {
        out.extend(device_stages(format!("devices[{n}].stages"), &d.stages));
        for (m, o) in d.ops.iter().enumerate() {
            out.extend(device_stages(
                format!("devices[{n}].ops[{m}].stages"),
                &o.stages,
            ));
        }
        for (m, q) in d.nvme_queues.iter().enumerate() {
            if let Some(h) = &q.latency {
                out.push((format!("devices[{n}].nvme_queues[{m}].latency"), h));
            }
        }
    }
    if let Some(kv) = &p.kv {
        for (name, c) in [
            ("client_reads", &kv.client_reads),
            ("client_writes", &kv.client_writes),
        ] {
            let Some(c) = c else { continue };
            let at = format!("kv.{name}");
            if let Some(h) = &c.service {
                out.push((format!("{at}.service"), h));
            }
            out.push((format!("{at}.lat"), &c.lat));
            out.push((format!("{at}.lat_intended"), &c.lat_intended));
        }
    }
    out
}

/// What any histogram virtgap writes satisfies: finite, non-negative sums; buckets in order,
/// each `low <= high`, holding the histogram's count; a sum that values within its bounds can
/// give. Counts at most `max_count`, sums at most `max_sum` (beyond any real run).
///
/// A histogram with extremes (`min_ns`, `max_ns`) is the workload's, counted in one place: it
/// must hold exactly. One without is the kernel's, read while the probes may still be adding to
/// it: the read can catch a few values in flight, counted in one field and not yet in another.
fn histogram_ok(h: &Histogram, max_count: u64, max_sum: f64) -> Result<(), String> {
    for (name, v) in [("sum_ns", Some(h.sum_ns)), ("sum_sq_ns", h.sum_sq_ns)] {
        match v {
            Some(v) if !(v.is_finite() && v >= 0.0) => {
                return Err(format!(
                    "{name} {} is not a finite, non-negative number",
                    number(v)
                ))
            }
            _ => {}
        }
    }
    if h.count > max_count || h.sum_ns > max_sum {
        return Err(format!(
            "count {} and sum_ns {} are beyond any real run",
            h.count,
            number(h.sum_ns)
        ));
    }
    let mut total: u64 = 0;
    let mut previous_high: Option<u64> = None;
    for (i, &[low, high, n]) in h.buckets.iter().enumerate() {
        if low > high {
            return Err(format!("buckets[{i}]: low {low} above high {high}"));
        }
        if previous_high.is_some_and(|p| low <= p) {
            return Err(format!(
                "buckets[{i}]: starts at {low}, not after the bucket before it"
            ));
        }
        previous_high = Some(high);
        total = total
            .checked_add(n)
            .filter(|t| *t <= max_count)
            .ok_or_else(|| format!("buckets[{i}]: counts beyond any real run"))?;
    }
    // The float sum is rounded: bounds get a hair of room.
    let fits = |sum: f64, bound: f64| sum <= bound * (1.0 + 1e-9) + 1.0;
    match h.min_ns.zip(h.max_ns) {
        Some((min, max)) => {
            if h.count == 0 || min > max {
                return Err(format!(
                    "min_ns {min} and max_ns {max} for {} values",
                    h.count
                ));
            }
            if total != h.count {
                return Err(format!(
                    "its buckets hold {total} values, its count is {}",
                    h.count
                ));
            }
            let (low, high) = (h.count as f64 * min as f64, h.count as f64 * max as f64);
            if !fits(h.sum_ns, high) || !fits(low, h.sum_ns) {
                return Err(format!(
                    "sum_ns {} is not what {} values from {min} to {max} ns add up to",
                    number(h.sum_ns),
                    h.count
                ));
            }
        }
        None => {
            // At most one value in flight per CPU adding to it, on hosts of up to a few
            // hundred busy CPUs; more for a larger count (pooled runs each read once).
            let slack = 256 + h.count / 1024;
            if total.abs_diff(h.count) > slack {
                return Err(format!(
                    "its buckets hold {total} values, its count is {}",
                    h.count
                ));
            }
            // Values in flight may be in the sum but in no bucket yet: each at most u64::MAX.
            let top = previous_high.unwrap_or(0) as f64;
            let n = h.count.max(total) as f64;
            if !fits(h.sum_ns, n * top + slack as f64 * u64::MAX as f64) {
                return Err(format!(
                    "sum_ns {} is more than {} values of at most {} ns add up to",
                    number(h.sum_ns),
                    h.count,
                    previous_high.unwrap_or(0)
                ));
            }
        }
    }
    Ok(())
}

impl WorkloadInfo {
    /// The workload as run: the spec after overrides, and the text it came from.
    pub fn of(
        spec: &virtgap_workloads::WorkloadSpec,
        loaded: &virtgap_workloads::LoadedSpec,
        target: &virtgap_workloads::Target,
    ) -> Self {
        Self {
            name: spec.name.clone(),
            origin: loaded.origin.clone(),
            source_text: loaded.source_text.clone(),
            effective_spec: spec.to_toml(),
            fio_equivalent: spec.fio_command(&target.path.display().to_string()),
        }
    }
}

impl TargetInfo {
    pub fn of(target: &virtgap_workloads::Target, disks: &TargetDisks) -> Self {
        Self {
            description: target.describe(),
            path: target.path.display().to_string(),
            size_bytes: target.size,
            device: disks.top.as_ref().map(|d| d.name.clone()),
            stage_devices: disks.leaves.iter().map(|d| d.name.clone()).collect(),
            device_note: disks.note.clone(),
        }
    }
}

/// Everything a run produced, borrowed for assembling its profile.
#[derive(Debug)]
pub struct ProfileInputs<'a> {
    pub run: RunInfo,
    pub host: Fingerprint,
    pub workload: WorkloadInfo,
    pub target: TargetInfo,
    pub paced: bool,
    pub stats: &'a RunStats,
    /// The measured window's intervals, joined with the probes' (see [`crate::run::series`]).
    pub intervals: Vec<Interval>,
    pub capabilities: Option<CapabilityReport>,
    pub probe_total: Option<&'a ProbeSnapshot>,
    /// The disks whose block stages are the target's.
    pub disks: &'a TargetDisks,
    pub recorder_cpu_pct: Option<f64>,
    pub calibration: Option<crate::cmd::calibrate::Calibration>,
    pub stalls: Option<crate::model::stalls::Stalls>,
}

/// Builds the profile (pure: no I/O).
pub fn assemble(i: ProfileInputs<'_>) -> Profile {
    let intervals = i.intervals;
    let devs = i.disks.devs();
    let total = i.probe_total;
    let kernel_stage = |stage: BlockStage| {
        total.and_then(|t| t.block.as_ref()).map(|b| {
            Histogram::from_kernel(&b.stage(
                devs.as_deref(),
                stage,
                &[BlockOp::Read, BlockOp::Write],
            ))
        })
    };
    let secs = total.map(|t| t.elapsed_ns as f64 / 1e9);
    let programs = total
        .filter(|t| !t.programs.is_empty())
        .map(|t| program_costs(&t.programs));
    let probe_cpu_pct = match (&programs, secs) {
        (Some(p), Some(s)) if s > 0.0 => {
            Some(p.iter().map(|c| c.run_time_ns as f64).sum::<f64>() / 1e9 / s * 100.0)
        }
        _ => None,
    };
    let dropped = total
        .map(|t| {
            t.block.as_ref().map_or(0, |b| b.dropped)
                + t.irq.as_ref().map_or(0, |q| q.dropped)
                + t.wakeups.as_ref().map_or(0, |w| w.dropped)
                + t.nvme.as_ref().map_or(0, |n| n.dropped)
        })
        .unwrap_or(0);
    Profile {
        schema_version: SCHEMA_VERSION,
        complete: i.run.complete,
        run: i.run,
        host: i.host,
        capabilities: i.capabilities,
        workload: i.workload,
        target: i.target,
        results: workload_result(i.stats, i.paced),
        stages: Stages {
            app: app_stage(i.stats),
            queue: kernel_stage(BlockStage::Queue),
            device: kernel_stage(BlockStage::Device),
            completion: kernel_stage(BlockStage::Completion).filter(|h| h.count > 0),
            wakeup: total
                .and_then(|t| t.wakeups.as_ref())
                .map(|w| Histogram::from_kernel(&w.latency)),
            flush: total.and_then(|t| t.block.as_ref()).and_then(|b| {
                let h = b.stage(devs.as_deref(), BlockStage::Device, &[BlockOp::Flush]);
                (h.count > 0).then(|| Histogram::from_kernel(&h))
            }),
        },
        intervals,
        cpus: total.map(cpu_loads_with_irq_time).unwrap_or_default(),
        probe_seconds: secs,
        cpu_pairs: total
            .and_then(|t| t.block.as_ref())
            .map(|b| {
                b.cpu_pairs
                    .iter()
                    .map(|p| [u64::from(p.submit_cpu), u64::from(p.complete_cpu), p.count])
                    .collect()
            })
            .unwrap_or_default(),
        block: total.and_then(|t| t.block.as_ref()).map(|b| BlockCounts {
            unsplit: b.unsplit,
            dropped: b.dropped,
            from_bio_entry: Some(
                b.devices
                    .iter()
                    .filter(|g| devs.as_ref().is_none_or(|d| d.contains(&g.dev)))
                    .map(|g| g.from_bio_entry)
                    .sum(),
            ),
        }),
        virtualization: total.and_then(virtualization),
        calibration: i.calibration,
        kv: i.stats.kv.as_deref().map(crate::render::kv_report::section),
        devices: total
            .map(|t| device_profiles(t, i.disks))
            .unwrap_or_default(),
        stalls: i.stalls,
        runs: Vec::new(),
        self_overhead: SelfOverhead {
            programs,
            probe_cpu_pct,
            dropped,
            recorder_cpu_pct: i.recorder_cpu_pct,
        },
    }
}

/// Pools the profiles of `record --runs N`'s runs into one: the workload's results from the
/// runs' merged statistics, stage histograms merged, intervals one after another on one time
/// axis, CPU loads and pairs summed; the sections that do not pool are the first run's.
pub fn pool_runs(mut runs: Vec<(Profile, RunRecord)>, merged: &RunStats, paced: bool) -> Profile {
    let (mut pooled, first) = runs.remove(0);
    pooled.runs = vec![first];
    let mut offset_s = pooled.intervals.last().map_or(0.0, |i| i.end_s);
    for (p, record) in runs {
        pooled.complete &= p.complete;
        pooled.run.complete &= p.run.complete;
        pooled.run.ended_unix_ms = p.run.ended_unix_ms;
        let mine = &mut pooled.stages;
        for (m, t) in [
            (&mut mine.queue, &p.stages.queue),
            (&mut mine.device, &p.stages.device),
            (&mut mine.completion, &p.stages.completion),
            (&mut mine.wakeup, &p.stages.wakeup),
            (&mut mine.flush, &p.stages.flush),
        ] {
            Histogram::merge_into(m, t.as_ref());
        }
        let next_index = pooled.intervals.last().map_or(0, |i| i.index + 1);
        for (k, mut iv) in p.intervals.into_iter().enumerate() {
            iv.index = next_index + k as u64;
            iv.start_s += offset_s;
            iv.end_s += offset_s;
            pooled.intervals.push(iv);
        }
        offset_s = pooled.intervals.last().map_or(offset_s, |i| i.end_s);
        absorb_cpus(&mut pooled.cpus, &p.cpus);
        pooled.probe_seconds = match (pooled.probe_seconds, p.probe_seconds) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        for pair in &p.cpu_pairs {
            match pooled
                .cpu_pairs
                .iter_mut()
                .find(|x| x[0] == pair[0] && x[1] == pair[1])
            {
                Some(mine) => mine[2] = mine[2].saturating_add(pair[2]),
                None => pooled.cpu_pairs.push(*pair),
            }
        }
        pooled.block = match (pooled.block.take(), p.block) {
            (Some(a), Some(b)) => Some(BlockCounts {
                unsplit: a.unsplit + b.unsplit,
                dropped: a.dropped + b.dropped,
                from_bio_entry: a.from_bio_entry.zip(b.from_bio_entry).map(|(x, y)| x + y),
            }),
            (a, b) => a.or(b),
        };
        let stalled =
            |s: &Option<crate::model::stalls::Stalls>| s.as_ref().is_some_and(|s| s.found());
        if !stalled(&pooled.stalls) && stalled(&p.stalls) {
            pooled.stalls = p.stalls;
        }
        pooled.runs.push(record);
    }
    pooled.results = workload_result(merged, paced);
    pooled.stages.app = app_stage(merged);
    pooled
}

/// Each disk under the target: its stages, per hardware queue, and NVMe latency per queue id.
pub fn device_profiles(total: &ProbeSnapshot, disks: &TargetDisks) -> Vec<DeviceProfile> {
    let data = [BlockOp::Read, BlockOp::Write];
    disks
        .leaves
        .iter()
        .map(|disk| {
            let dev = disk.dev();
            let block = total.block.as_ref();
            let stage =
                |stage| block.map(|b| Histogram::from_kernel(&b.stage(Some(&[dev]), stage, &data)));
            let mut queues: BTreeMap<u16, QueueStages> = BTreeMap::new();
            for s in block.iter().flat_map(|b| &b.stages) {
                if s.dev != dev || !data.contains(&s.op) {
                    continue;
                }
                let q = queues.entry(s.hctx).or_insert_with(|| QueueStages {
                    hctx: s.hctx,
                    ..QueueStages::default()
                });
                let sample = match s.stage {
                    BlockStage::Queue => &mut q.queue,
                    BlockStage::Device => &mut q.device,
                    BlockStage::Completion => &mut q.completion,
                };
                sample.count += s.hist.count;
                sample.sum_ns += s.hist.sum_ns;
            }
            let mut nvme: BTreeMap<u16, KernelHist> = BTreeMap::new();
            for q in total.nvme.iter().flat_map(|n| &n.queues) {
                if q.dev == dev && data.contains(&q.op) {
                    nvme.entry(q.qid).or_default().merge(&q.hist);
                }
            }
            let ops = [BlockOp::Read, BlockOp::Write, BlockOp::Flush]
                .into_iter()
                .filter_map(|op| {
                    let block = block?;
                    let h = |stage| {
                        let h = block.stage(Some(&[dev]), stage, &[op]);
                        (h.count > 0).then(|| Histogram::from_kernel(&h))
                    };
                    let stages = DeviceStages {
                        queue: h(BlockStage::Queue),
                        device: h(BlockStage::Device),
                        completion: h(BlockStage::Completion),
                    };
                    (stages.queue.is_some() || stages.device.is_some()).then(|| OpStages {
                        op: op.name().to_string(),
                        stages,
                    })
                })
                .collect();
            DeviceProfile {
                name: disk.name.clone(),
                major: disk.major,
                minor: disk.minor,
                stages: DeviceStages {
                    queue: stage(BlockStage::Queue),
                    device: stage(BlockStage::Device),
                    completion: stage(BlockStage::Completion).filter(|h| h.count > 0),
                },
                queues: queues.into_values().collect(),
                nvme_queues: nvme
                    .into_iter()
                    .map(|(qid, h)| NvmeQueueLatency {
                        qid,
                        count: h.count,
                        sum_ns: h.sum_ns,
                        p99_ns: Histogram::from_kernel(&h).percentile_ns(99.0),
                        latency: Some(Histogram::from_kernel(&h)),
                    })
                    .collect(),
                ops,
            }
        })
        .collect()
}

/// Hypervisor signals of a run, as a profile keeps them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Virtualization {
    /// Seconds the probes were attached: the denominator of every rate below but two.
    pub seconds: f64,
    /// Of those, the seconds virtgap's sampler was paused: the host's MSR writes (neither
    /// `by_sampler` nor `while_sampling`) were counted then, and their rates are per second of
    /// this. Absent when no sampler ran (all of `seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msr_quiet_seconds: Option<f64>,
    /// None when the msr probe did not attach.
    pub msr_writes: Option<Vec<MsrAccesses>>,
    pub msr_reads: Option<Vec<MsrAccesses>>,
    pub sampler: Option<SamplerSection>,
    pub kvm_host: Option<KvmHostSection>,
    pub pv_paths: Option<Vec<PvPathFigure>>,
}

/// Accesses to one MSR on one CPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MsrAccesses {
    pub cpu: u32,
    /// Hexadecimal, as `0x6e0`.
    pub msr: String,
    pub name: String,
    pub count: u64,
    /// Writes to this MSR exit to the detected hypervisor (profiles from before the label was
    /// kept counted every write as exiting).
    #[serde(default = "every_write_exited")]
    pub exits: bool,
    /// Writes in the wake of virtgap's own sampler interrupt (the tool's cost).
    #[serde(default)]
    pub by_sampler: bool,
    /// Other writes made while the sampler ran (the host's, in a pattern its timer changed).
    #[serde(default)]
    pub while_sampling: bool,
}

impl MsrAccesses {
    /// A write the host made with no sampler running: the ones its rates are made of.
    pub fn is_hosts(&self) -> bool {
        !self.by_sampler && !self.while_sampling
    }
}

impl Virtualization {
    /// The seconds the host's MSR writes were counted in.
    pub fn msr_seconds(&self) -> f64 {
        self.msr_quiet_seconds.unwrap_or(self.seconds)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SamplerSection {
    pub frequency_hz: u64,
    /// Samples the kernel-side map had no room for.
    pub dropped: u64,
    pub cpus: Vec<SampledCpu>,
    /// Seconds the sampler ran (it pauses while the msr probe counts the host's timer writes);
    /// absent in profiles from before it paused, when it ran throughout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled_seconds: Option<f64>,
}

impl SamplerSection {
    /// The seconds its samples cover, out of a window of `window` seconds.
    pub fn seconds(&self, window: f64) -> f64 {
        self.sampled_seconds.unwrap_or(window)
    }
}

/// One CPU's samples: per category (hypervisor interface, idle, IRQ, ...) and its top symbols.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SampledCpu {
    pub cpu: u32,
    pub samples: u64,
    pub categories: BTreeMap<String, u64>,
    /// (kernel symbol, samples), most sampled first.
    pub top: Vec<(String, u64)>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KvmHostSection {
    pub events: Vec<virtgap_probes::model::KvmEventCount>,
    pub exits: Vec<KvmExitFigure>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KvmExitFigure {
    pub reason: String,
    pub count: u64,
    pub mean_ns: Option<f64>,
}

/// Entry-to-return time of one paravirt callback.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PvPathFigure {
    pub symbol: String,
    pub count: u64,
    pub mean_ns: Option<f64>,
    pub p99_ns: Option<f64>,
}

fn every_write_exited() -> bool {
    true
}

impl SampledCpu {
    /// Samples in one category (0 when none).
    pub fn in_category(&self, category: &str) -> u64 {
        self.categories.get(category).copied().unwrap_or(0)
    }

    /// Whether these samples stand for the CPU's time (`CpuSamples::represents`).
    pub fn represents(&self, frequency_hz: u64, secs: f64) -> bool {
        virtgap_probes::model::samples_represent(self.samples, frequency_hz, secs)
    }
}

/// The hypervisor signals of a run: MSR accesses by CPU and MSR, the sampler's split of each
/// CPU's time with its top symbols, and host-side KVM events. None when none of those probes
/// attached.
pub fn virtualization(total: &ProbeSnapshot) -> Option<Virtualization> {
    if total.msr.is_none()
        && total.sampler.is_none()
        && total.kvm.is_none()
        && total.pv_paths.is_none()
    {
        return None;
    }
    let msr = |write: bool| -> Option<Vec<MsrAccesses>> {
        let m = total.msr.as_ref()?;
        Some(
            m.counts
                .iter()
                .filter(|c| c.write == write)
                .map(|c| MsrAccesses {
                    cpu: c.cpu,
                    msr: format!("{:#x}", c.msr),
                    name: virtgap_probes::virt::msr_name(c.msr).to_string(),
                    count: c.count,
                    exits: c.exits,
                    by_sampler: c.by_sampler,
                    while_sampling: c.while_sampling,
                })
                .collect(),
        )
    };
    let sampler = total.sampler.as_ref().map(|s| SamplerSection {
        frequency_hz: s.frequency_hz,
        dropped: s.dropped,
        sampled_seconds: (s.sampled_ns > 0).then(|| s.sampled_ns as f64 / 1e9),
        cpus: s
            .cpus
            .iter()
            .map(|c| SampledCpu {
                cpu: c.cpu,
                samples: c.total(),
                categories: c
                    .categories()
                    .into_iter()
                    .map(|(k, v)| (k.name().to_string(), v))
                    .collect(),
                top: c
                    .top(10)
                    .into_iter()
                    .map(|(sym, n)| (sym.to_string(), n))
                    .collect(),
            })
            .collect(),
    });
    let kvm_host = total.kvm.as_ref().map(|k| KvmHostSection {
        events: k.events.clone(),
        exits: k
            .exits
            .iter()
            .map(|x| KvmExitFigure {
                reason: x.name.clone(),
                count: x.hist.count,
                mean_ns: x.hist.mean_ns(),
            })
            .collect(),
    });
    Some(Virtualization {
        seconds: total.elapsed_ns as f64 / 1e9,
        msr_quiet_seconds: total
            .msr
            .as_ref()
            .filter(|m| m.sampler_ns > 0)
            .map(|m| m.quiet_secs(total.elapsed_ns)),
        msr_writes: msr(true),
        msr_reads: msr(false),
        sampler,
        kvm_host,
        pv_paths: total.pv_paths.as_ref().map(|p| {
            p.paths
                .iter()
                .map(|x| PvPathFigure {
                    symbol: x.symbol.clone(),
                    count: x.hist.count,
                    mean_ns: x.hist.mean_ns(),
                    p99_ns: Histogram::kernel_percentile_ns(&x.hist, 99.0),
                })
                .collect()
        }),
    })
}

/// The kv workload's outcome, as a profile keeps it (and `--json` prints it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct KvSection {
    /// True only for a pass at the delivered load; None without a complete slice.
    pub verdict: Option<bool>,
    /// "PASS", "FAIL", "NO VERDICT", ...
    pub outcome: String,
    pub delivered: KvDelivered,
    /// Who fell behind and by how much, when the run stopped for it.
    pub behind: Option<String>,
    pub keys: u64,
    pub records_per_block: u64,
    pub read_bytes_min: u64,
    pub read_bytes_max: u64,
    pub service_threads: u32,
    pub achieved_fraction: f64,
    pub worst_lag_ns: u64,
    pub target: KvRates,
    pub achieved: KvRates,
    pub relocated: u64,
    pub read_retries: u64,
    pub mismatches: u64,
    pub slices: Vec<KvSlice>,
    /// The verdict in a sentence, as the summary prints it (absent in older profiles).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub verdict_text: String,
    /// Client reads' latencies (absent in older profiles, and with no read done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_reads: Option<KvClientLatency>,
    /// Client writes' latencies (an append to the write buffer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_writes: Option<KvClientLatency>,
}

/// One kind of client operation's latencies: from submission (`lat`; for a read, `service`
/// is its device read alone) and from its scheduled start (`lat_intended`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KvClientLatency {
    pub ops: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<Histogram>,
    pub lat: Histogram,
    pub lat_intended: Histogram,
}

/// Shares of the scheduled load done (a pass needs 0.99 of both).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KvDelivered {
    pub client_fraction: f64,
    pub large_block_fraction: f64,
}

/// Operations per second of each of ACT's streams.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KvRates {
    pub client_reads_per_s: f64,
    pub client_writes_per_s: f64,
    pub lb_reads_per_s: f64,
    pub lb_writes_per_s: f64,
}

impl KvRates {
    /// (stream name, rate) in a fixed order: client reads and writes, large-block reads and
    /// writes.
    pub fn streams(&self) -> [(&'static str, f64); 4] {
        [
            ("client_reads", self.client_reads_per_s),
            ("client_writes", self.client_writes_per_s),
            ("lb_reads", self.lb_reads_per_s),
            ("lb_writes", self.lb_writes_per_s),
        ]
    }
}

/// One slice of ACT's verdict table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KvSlice {
    pub start_s: f64,
    pub end_s: f64,
    pub complete: bool,
    /// None for a partial slice, and for one within limits at a load not delivered.
    pub pass: Option<bool>,
    /// "service" (from submission) or "intended" (from the scheduled start, when the schedule
    /// slipped): which latency the slice was judged on. Profiles from before the switch existed
    /// were judged on service time.
    #[serde(default = "judged_on_service")]
    pub judged_on: String,
    #[serde(default)]
    pub worst_lag_ns: u64,
    pub reads: KvSliceShares,
    pub lb_reads: KvSliceShares,
    pub lb_writes: KvSliceShares,
}

fn judged_on_service() -> String {
    "service".into()
}

/// Operations in a slice and the percentages at or over ACT's limits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KvSliceShares {
    pub ops: u64,
    pub pct_at_or_over_1ms: f64,
    pub pct_at_or_over_8ms: f64,
    pub pct_at_or_over_64ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kv_profile_from_before_slices_said_what_they_were_judged_on_still_loads() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/fuzz-seeds/kv-act-no-probes.json");
        let p = load(&path).unwrap();
        let kv = p.kv.expect("a kv profile");
        assert!(!kv.slices.is_empty());
        assert!(kv.slices.iter().all(|s| s.judged_on == "service"));
    }

    #[test]
    fn histogram_percentiles_interpolate_within_buckets() {
        let h = Histogram {
            count: 4,
            sum_ns: 10.0,
            min_ns: Some(1),
            max_ns: Some(4),
            buckets: vec![[1, 1, 1], [2, 2, 1], [3, 3, 1], [4, 4, 1]],
            sum_sq_ns: Some(30.0),
        };
        assert_eq!(h.mean_ns(), Some(2.5));
        assert_eq!(h.stddev_ns(), Some(1.25f64.sqrt()));
        assert_eq!(h.percentile_ns(100.0), Some(4.0));
        assert_eq!(h.percentile_ns(50.0), Some(2.0));
        assert_eq!(Histogram::default().percentile_ns(50.0), None);
    }

    #[test]
    fn kernel_histograms_keep_exact_sums() {
        let mut k = KernelHist::default();
        for v in [100, 200, 300, 10_000] {
            k.record(v);
        }
        let h = Histogram::from_kernel(&k);
        assert_eq!(h.count, 4);
        assert_eq!(
            (h.min_ns, h.max_ns),
            (None, None),
            "bucket bounds are not extremes"
        );
        assert_eq!(h.mean_ns(), Some(2_650.0));
        assert_eq!(h.buckets.iter().map(|b| b[2]).sum::<u64>(), 4);
    }

    #[test]
    fn one_percentile_rule_for_the_workloads_the_kernels_and_the_profiles_histograms() {
        // A skewed spread: most values near 100 µs, a tail to 5 ms.
        let values: Vec<u64> = (0..20_000u64)
            .map(|i| 100_000 + (i * 7919 % 20_000) * (i % 97) / 4)
            .collect();
        let mut workload = virtgap_workloads::histogram::LatencyHistogram::new();
        let mut kernel = KernelHist::default();
        for &v in &values {
            workload.record(v);
            kernel.record(v);
        }
        let (from_workload, from_kernel) = (
            Histogram::from_latency(&workload),
            Histogram::from_kernel(&kernel),
        );
        for p in [0.0, 50.0, 90.0, 99.0, 99.9, 100.0] {
            // The profile's copy of a histogram reads the same percentile as the original.
            let w = workload.percentile_ns(p).unwrap();
            let pw = from_workload.percentile_ns(p).unwrap();
            assert!(
                (pw - w as f64).abs() <= 0.5,
                "p{p}: profile {pw} vs workload {w}"
            );
            let k = virtgap_workloads::histogram::percentile_of_buckets(&kernel.buckets(), p, None);
            assert_eq!(from_kernel.percentile_ns(p), k, "p{p}");
            // And the rule is the same one: the two layouts agree to their bucket widths.
            let k = k.unwrap();
            assert!(
                (k - pw).abs() / pw <= 0.13,
                "p{p}: kernel {k} vs workload {pw}"
            );
        }
        assert_eq!(
            workload.percentile_ns(0.0),
            Some(*values.iter().min().unwrap())
        );
        assert_eq!(
            workload.percentile_ns(100.0),
            Some(*values.iter().max().unwrap())
        );
    }

    #[test]
    fn newer_schema_and_non_profiles_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        std::fs::write(&p, r#"{"schema_version": 99}"#).unwrap();
        assert!(matches!(
            load(&p),
            Err(ProfileError::Newer { found: 99, .. })
        ));
        std::fs::write(&p, "not json").unwrap();
        assert!(load(&p)
            .unwrap_err()
            .to_string()
            .contains("not a virtgap profile"));
        std::fs::write(&p, r#"{"hello": 1}"#).unwrap();
        assert!(load(&p)
            .unwrap_err()
            .to_string()
            .contains("no schema_version"));
        std::fs::write(&p, r#"{"schema_version": "1"}"#).unwrap();
        let err = load(&p).unwrap_err().to_string();
        assert!(
            err.contains(r#"schema_version is "1", not a version number"#),
            "{err}"
        );
        std::fs::write(&p, r#"{"schema_version": 1, "complete": "yes"}"#).unwrap();
        let err = load(&p).unwrap_err().to_string();
        assert!(err.contains("complete:"), "the field path is named: {err}");
        let err = load(std::path::Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }

    /// A profile kept as test data, as a JSON tree to edit.
    fn seed(name: &str) -> serde_json::Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name);
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    fn parsed(doc: &serde_json::Value) -> Result<Profile, ProfileError> {
        parse(doc.to_string().as_bytes(), "p.json")
    }

    fn refusal(doc: &serde_json::Value) -> String {
        match parsed(doc) {
            Ok(_) => panic!("accepted: {doc}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("b.json");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(load(&fifo).map(|_| ()).map_err(|e| e.to_string())));
        let err = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("load returns at once, not blocked in open")
            .unwrap_err();
        assert!(
            err.ends_with("not a virtgap profile (a FIFO, not a regular file)"),
            "{err}"
        );
    }

    #[test]
    fn only_schema_versions_virtgap_wrote_are_read_and_as_themselves() {
        let mut doc = seed("fuzz-seeds/rand4k-two-runs.json");
        assert_eq!(doc["schema_version"], 2);
        parsed(&doc).unwrap();
        doc["schema_version"] = 0.into();
        assert_eq!(
            refusal(&doc),
            "p.json: profile schema version 0; this virtgap reads versions 1 to 3"
        );
        // A version-2 profile has no completion stage: one with it was version 3, and its
        // device stage would be read as running to completion.
        doc["stages"]["completion"] = doc["stages"]["queue"].clone();
        doc["schema_version"] = 3.into();
        parsed(&doc).unwrap();
        doc["schema_version"] = 2.into();
        assert_eq!(
            refusal(&doc),
            "p.json: profile schema version 2, but it has stages.completion, which version 3 \
             added: its schema_version is wrong (set it to the version that wrote the file)"
        );
        let mut doc = seed("minimal-profile.json");
        doc["schema_version"] = 1.into();
        parsed(&doc).unwrap();
    }

    #[test]
    fn histograms_no_run_gives_are_refused() {
        let base = seed("fuzz-seeds/rand4k-two-runs.json");
        parsed(&base).unwrap();
        let refused = |edit: &dyn Fn(&mut serde_json::Value), why: &str| {
            let mut doc = base.clone();
            edit(&mut doc);
            let err = refusal(&doc);
            assert!(err.contains(why), "{why:?} not in: {err}");
        };
        fn app(d: &mut serde_json::Value) -> &mut serde_json::Value {
            &mut d["stages"]["app"]
        }
        fn device(d: &mut serde_json::Value) -> &mut serde_json::Value {
            &mut d["stages"]["device"]
        }
        refused(
            &|d| app(d)["sum_ns"] = (-1e20).into(),
            "stages.app: sum_ns -1e20 is not a finite, non-negative number",
        );
        refused(
            &|d| app(d)["sum_ns"] = 1.7e308.into(),
            "stages.app: count 195915 and sum_ns 1.7e308 are beyond any real run",
        );
        refused(
            &|d| device(d)["sum_ns"] = 1.7e308.into(),
            "stages.device: count 195925 and sum_ns 1.7e308",
        );
        refused(
            &|d| d["runs"][1]["stages"]["app"]["sum_sq_ns"] = (-1.0).into(),
            "runs[1].stages.app: sum_sq_ns -1 is not",
        );
        // A mean outside the extremes, or past the top bucket's bound.
        refused(
            &|d| {
                let max = app(d)["max_ns"].as_f64().unwrap();
                app(d)["sum_ns"] = (max * 195915.0 * 1.01).into();
            },
            "stages.app: sum_ns",
        );
        refused(
            &|d| device(d)["sum_ns"] = 1e22.into(),
            "stages.device: sum_ns 1e22 is more than 195925 values",
        );
        // Buckets that do not hold the count.
        refused(
            &|d| {
                let n = app(d)["buckets"][0][2].as_u64().unwrap();
                app(d)["buckets"][0][2] = (n + 1).into();
            },
            "stages.app: its buckets hold 195916 values, its count is 195915",
        );
        refused(
            &|d| device(d)["count"] = 1_000_000.into(),
            "stages.device: its buckets hold 195925 values, its count is 1000000",
        );
        refused(
            &|d| d["results"]["read"]["clat"]["buckets"] = serde_json::json!([]),
            "results.read.clat: its buckets hold 0 values",
        );
        // Buckets upside down or out of order.
        refused(
            &|d| {
                let b = &mut device(d)["buckets"][0];
                let (lo, hi) = (b[0].clone(), b[1].clone());
                b[0] = hi;
                b[1] = lo;
            },
            "stages.device: buckets[0]: low",
        );
        refused(
            &|d| app(d)["buckets"].as_array_mut().unwrap().swap(0, 1),
            "stages.app: buckets[1]: starts at",
        );
        refused(
            &|d| {
                app(d)["min_ns"] = 10.into();
                app(d)["max_ns"] = 5.into();
            },
            "stages.app: min_ns 10 and max_ns 5",
        );
        refused(
            &|d| d["devices"][0]["stages"]["queue"]["buckets"][0][2] = u64::MAX.into(),
            "devices[0].stages.queue: buckets[0]: counts beyond any real run",
        );
        // The kernel's histograms are read while the probes run: a value in flight, counted and
        // summed but in no bucket yet, is what record writes.
        let mut doc = base.clone();
        let count = device(&mut doc)["count"].as_u64().unwrap();
        device(&mut doc)["count"] = (count + 3).into();
        let sum = device(&mut doc)["sum_ns"].as_f64().unwrap();
        device(&mut doc)["sum_ns"] = (sum + 3e9).into();
        parsed(&doc).unwrap();
    }

    #[test]
    fn windows_as_short_as_record_writes_are_read() {
        // Interrupted while measuring the idle host: the workload ran 0.2 ms.
        let mut doc = seed("fuzz-seeds/rand4k-two-runs.json");
        doc["complete"] = false.into();
        doc["results"]["measured_s"] = 0.000185487.into();
        doc["runs"][1]["measured_s"] = 0.000185487.into();
        doc["runs"][1]["complete"] = false.into();
        parsed(&doc).unwrap();
        // `record -d 100us` completes in 0.1 ms.
        doc["complete"] = true.into();
        doc["results"]["measured_s"] = 0.0001.into();
        parsed(&doc).unwrap();
        // Shorter than a nanosecond clock measures is no window.
        doc["results"]["measured_s"] = 1e-12.into();
        assert!(refusal(&doc).contains("results.measured_s: 1e-12 s is shorter than any run"));
    }

    /// `record --runs N` pools the block counts with the stages they are read against: the
    /// share of requests from their bio's entry stays the whole profile's.
    #[test]
    fn pooled_runs_sum_their_block_counts() {
        let run = |from_bio_entry: Option<u64>| {
            let mut p = crate::analysis::diff::tests::synthetic(1.0, 1.0, 1.0, 0.0, 3);
            p.block = Some(BlockCounts {
                unsplit: 2,
                dropped: 1,
                from_bio_entry,
            });
            let record = RunRecord::of_profile(&p, 1);
            (p, record)
        };
        let stats = RunStats::default();
        let pooled = pool_runs(vec![run(Some(10)), run(Some(5))], &stats, false);
        assert_eq!(
            pooled.block,
            Some(BlockCounts {
                unsplit: 4,
                dropped: 2,
                from_bio_entry: Some(15),
            })
        );
        // A run from before the count: the pooled count is unknown, not a part.
        let pooled = pool_runs(vec![run(Some(10)), run(None)], &stats, false);
        assert_eq!(pooled.block.unwrap().from_bio_entry, None);
    }
}
