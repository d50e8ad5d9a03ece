//! The profile: one JSON document describing a recorded run — the host, what could be measured
//! on it, the exact workload, per-interval series and cumulative stage histograms. Pure data
//! (serde both ways): the recorder builds it, the diff and the CSV writer read it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use virtgap_probes::CapabilityReport;

use crate::model::calibration::Calibration;
use crate::model::devices::{DeviceProfile, NvmeQueueRun};
use crate::model::histogram::Histogram;
use crate::model::host::Fingerprint;
use crate::model::hypervisor::{HypervisorSection, RunHypervisor};
use crate::model::interval::{CpuLoad, Interval};
use crate::model::kv::KvSection;
use crate::model::stages::{QueueStart, Stages};
use crate::model::stalls::Stalls;
use crate::model::tail::TailAutopsy;
use crate::model::virtualization::Virtualization;

/// Bump when a field changes meaning or disappears; readers refuse newer versions.
/// 2: `runs` (one entry per replicate of `record --runs N`); a version-1 profile reads as one
/// run whose figures are the whole profile's (see [`Profile::replicates`]).
/// 3: `stages.device` ends at the entry of the queue's interrupt handler and
/// `stages.completion` holds the rest; without a completion stage (older profiles, devices with
/// no known queue IRQ) device runs to the request's completion, and the diff compares both
/// sides that way.
pub const SCHEMA_VERSION: u32 = 3;

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

/// The probes' own cost over the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SelfOverhead {
    /// None when run statistics were unavailable.
    pub programs: Option<Vec<ProgramCost>>,
    /// Seconds the kernel's run statistics were on, over which `programs` count runs and run
    /// time: they cost every BPF program run on the host two clock reads, so a recording
    /// keeps them on over its first two intervals (the idle host's and the first of work),
    /// then over one in four (absent in older profiles, which held them on throughout: the
    /// probe window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats_seconds: Option<f64>,
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
    /// Events the kernel skipped the program for (it was already running on that CPU): lost
    /// measurements, 0 in a sound run.
    #[serde(default)]
    pub missed: u64,
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
    /// The hypervisor's part: per mechanism how often and how long, each path saying how it was
    /// measured, and the sampled CPU time in the hypervisor interface; "no hypervisor" on
    /// metal. None for runs without probes (and profiles from before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hypervisor: Option<HypervisorSection>,
    /// Calibrated costs of exit-causing operations (`record --calibrate`); None when not run.
    pub calibration: Option<Calibration>,
    pub self_overhead: SelfOverhead,
    /// The processes an attached run followed and the I/O they sent (attached runs only: no
    /// built-in workload ran; `workload` and `target` describe what was attached, `results`
    /// count its block requests as its I/Os — no latency or bytes, which are not measured —
    /// and `stages.app` is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attached: Option<crate::model::attached::Attached>,
    /// The kv workload's rates, integrity figures and per-slice verdict (kv runs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv: Option<KvSection>,
    /// Per disk under the target (several for md/dm/multipath): stages per hardware queue.
    #[serde(default)]
    pub devices: Vec<DeviceProfile>,
    /// Stalls in the measured window (absent in profiles from before they were detected).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalls: Option<Stalls>,
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
    pub tail: Option<TailAutopsy>,
    /// The host with the probes attached and the workload not yet started: the host-wide
    /// figures per I/O are compared above it (None: no probes, or a profile from before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdleBaseline>,
    /// The hypervisor's mechanisms over the same window (None: no probes, or a profile from
    /// before they were kept; on metal, no hypervisor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hypervisor: Option<RunHypervisor>,
    /// NVMe command latency per queue id over the run (empty: no NVMe disk, or a profile from
    /// before it was kept per run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvme_queues: Vec<NvmeQueueRun>,
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
    /// The hypervisor's mechanisms while idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hypervisor: Option<RunHypervisor>,
}

impl IdleBaseline {
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
            hypervisor: a
                .hypervisor
                .zip(b.hypervisor)
                .map(|(x, y)| RunHypervisor::added(&x, &y)),
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
            hypervisor: p.hypervisor.as_ref().map(RunHypervisor::of),
            nvme_queues: NvmeQueueRun::of_devices(&p.devices),
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
