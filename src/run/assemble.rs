//! Assembling a profile from what a run produced: the workload's statistics, the probes'
//! snapshots (condensed per interval as they arrive, and whole at the end), the target and the
//! host. Pure functions of their inputs: no I/O.

use std::collections::BTreeMap;

use virtgap_probes::hypervisor::Hypervisor;
use virtgap_probes::model::{BlockOp, BlockStage, CpuEvents, DevNum, ProbeSnapshot, ProgramStats};
use virtgap_probes::{CapabilityReport, KernelHist};
use virtgap_workloads::stats::{IntervalSample, RunStats};

use crate::model::devices::{DeviceProfile, DeviceStages, NvmeQueueLatency, OpStages, QueueStages};
use crate::model::histogram::Histogram;
use crate::model::host::{Fingerprint, TargetDisks};
use crate::model::hypervisor::RunHypervisor;
use crate::model::interval::{absorb_cpus, CpuLoad, Interval, StageSample};
use crate::model::kv::{
    JudgedOn, KvBehind, KvClientLatency, KvDelivered, KvOutcome, KvRates, KvReadQueueing,
    KvSection, KvSlice, KvSliceShares,
};
use crate::model::profile::{
    BlockCounts, DirectionResult, IdleBaseline, Profile, ProgramCost, RunInfo, RunRecord,
    SelfOverhead, TargetInfo, WorkloadInfo, WorkloadResult, SCHEMA_VERSION,
};
use crate::model::stages::{Stage, Stages};
use crate::model::virtualization::{
    IcrSendTime, KvmExitFigure, KvmHostSection, MsrAccesses, PvPathFigure, SampledCpu,
    SamplerSection, Virtualization,
};

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

/// An attached run's app stage from a probe snapshot: the followed processes' reads and
/// writes, system calls and io_uring requests together (fsyncs apart); None when the app probe
/// did not run.
pub fn attached_app_stage(snap: &ProbeSnapshot) -> Option<Histogram> {
    snap.app
        .as_ref()
        .map(|a| Histogram::from_kernel(&a.data_latency()))
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
        if let Some(vector) = h.system_vector() {
            // A Xen guest's timer and IPIs arrive as per-CPU event-channel IRQs; elsewhere they
            // are system vectors, counted but not timed. Counted the same way on every host:
            // as vectors, their time left out of hard-IRQ time.
            if h.count > 0 {
                *c.vectors.entry(vector.to_string()).or_default() += h.count;
            }
            continue;
        }
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
        if h.system_vector().is_some() {
            continue;
        }
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
    pub hypervisor: Option<RunHypervisor>,
}

impl ProbeInterval {
    /// One probe interval on a host running on `hypervisor`.
    pub fn of(probes: &ProbeSnapshot, devs: Option<&[DevNum]>, hypervisor: Hypervisor) -> Self {
        let seconds = probes.elapsed_ns as f64 / 1e9;
        let virt = virtualization(probes);
        let section =
            crate::run::hypervisor::section(hypervisor, seconds, virt.as_ref(), None, None);
        let hypervisor = Some(RunHypervisor::of(&section));
        Self {
            hypervisor,
            stages: stage_samples(probes, devs),
            cpus: cpu_loads(probes),
            // None where the run statistics were off for the whole interval.
            probe_run_ns: probes.program_run_ns_estimate(),
            msr_writes: virt
                .as_ref()
                .and_then(|v| v.host_writes(|w| w.exits, seconds))
                .map(|n| n.round() as u64),
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
        hypervisor: probes.hypervisor,
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
            missed: p.missed,
        })
        .collect()
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
            fio_equivalent: spec.fio_command(&virtgap_workloads::spec::FioTarget {
                filename: &target.path.display().to_string(),
                size: target.size,
                existing: !target.needs_fill(),
            }),
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
    pub calibration: Option<crate::model::calibration::Calibration>,
    pub stalls: Option<crate::model::stalls::Stalls>,
}

/// Builds the profile (pure: no I/O).
pub fn assemble(i: ProfileInputs<'_>) -> Profile {
    let intervals = i.intervals;
    let devs = i.disks.devs();
    let total = i.probe_total;
    let hypervisor = total.map(|t| {
        crate::run::hypervisor::section(
            Hypervisor::of_name(&i.host.hypervisor),
            t.elapsed_ns as f64 / 1e9,
            virtualization(t).as_ref(),
            i.capabilities.as_ref(),
            Some(&i.host.cpuid),
        )
    });
    let secs = total.map(|t| t.elapsed_ns as f64 / 1e9);
    let programs = total
        .filter(|t| !t.programs.is_empty())
        .map(|t| program_costs(&t.programs));
    // The programs' runs and run time count while the run statistics were on.
    let stats_secs = total.map(|t| t.stats_on_ns as f64 / 1e9);
    let probe_cpu_pct = match (&programs, stats_secs) {
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
        stages: stages(app_stage(i.stats), total, devs.as_deref()),
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
        hypervisor,
        virtualization: total.and_then(virtualization),
        calibration: i.calibration,
        kv: i.stats.kv.as_deref().map(kv_section),
        attached: None,
        devices: total
            .map(|t| device_profiles(t, i.disks))
            .unwrap_or_default(),
        stalls: i.stalls,
        runs: Vec::new(),
        self_overhead: SelfOverhead {
            stats_seconds: programs.as_ref().and(stats_secs),
            programs,
            probe_cpu_pct,
            dropped,
            recorder_cpu_pct: i.recorder_cpu_pct,
        },
    }
}

/// The stage histograms of a window: `app` (the workload's latency) and the probes' stages of
/// the target's disks `devs` from the window's totals `total`.
pub fn stages(app: Histogram, total: Option<&ProbeSnapshot>, devs: Option<&[DevNum]>) -> Stages {
    let block = total.and_then(|t| t.block.as_ref());
    let kernel_stage = |stage: BlockStage| {
        block.map(|b| {
            Histogram::from_kernel(&b.stage(devs, stage, &[BlockOp::Read, BlockOp::Write]))
        })
    };
    Stages {
        app,
        queue: kernel_stage(BlockStage::Queue),
        device: kernel_stage(BlockStage::Device),
        completion: kernel_stage(BlockStage::Completion).filter(|h| h.count > 0),
        wakeup: total
            .and_then(|t| t.wakeups.as_ref())
            .map(|w| Histogram::from_kernel(&w.latency)),
        flush: block.and_then(|b| {
            let h = b.stage(devs, BlockStage::Device, &[BlockOp::Flush]);
            (h.count > 0).then(|| Histogram::from_kernel(&h))
        }),
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
        pooled.stages.merge_probed(&p.stages);
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
                    msr: c.msr,
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
                    .categories(s.hypervisor)
                    .into_iter()
                    .map(|(k, v)| (k.name().to_string(), v))
                    .collect(),
                top: c
                    .top(10)
                    .into_iter()
                    .map(|(sym, n)| (sym.to_string(), n))
                    .collect(),
                mechanisms: c
                    .mechanisms(s.hypervisor)
                    .into_iter()
                    .map(|(m, n)| (m.name().to_string(), n))
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
        icr_sends: total
            .msr
            .as_ref()
            .and_then(|m| m.icr_sends)
            .map(|t| IcrSendTime {
                sends: t.sends,
                ns: t.ns,
                unpaired: t.unpaired,
            }),
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
            hypervisor: None,
        }
    }
}

/// The profile's (and `--json`'s) kv section: the run's outcome as numbers and kinds.
pub fn kv_section(k: &virtgap_workloads::kv::KvOutcome) -> KvSection {
    use virtgap_workloads::kv::{Behind, KvVerdict};
    let verdict = k.verdict();
    let delivered = !matches!(verdict, KvVerdict::NotDelivered { .. });
    KvSection {
        verdict: match verdict {
            KvVerdict::Pass => Some(true),
            KvVerdict::NoCompleteSlice => None,
            _ => Some(false),
        },
        service_pass: k.complete_slices_pass(|s| s.reads.pass),
        intended_pass: k.complete_slices_pass(|s| s.reads_intended.pass),
        outcome: match verdict {
            KvVerdict::Pass => KvOutcome::Pass,
            KvVerdict::Fail => KvOutcome::Fail,
            KvVerdict::NotDelivered { .. } => KvOutcome::NotDelivered,
            KvVerdict::Mismatches(_) => KvOutcome::Mismatches,
            KvVerdict::NoCompleteSlice => KvOutcome::NoCompleteSlice,
        },
        delivered: KvDelivered {
            client_fraction: k.achieved_fraction(),
            large_block_fraction: k.large_block_fraction(),
        },
        behind: k.behind.as_ref().map(|(who, by)| KvBehind {
            stream: match who {
                Behind::Generator => None,
                Behind::Device(stream) => Some(stream.to_string()),
            },
            by_ns: by.as_nanos() as u64,
        }),
        keys: k.keys,
        records_per_block: k.records_per_block,
        read_bytes_min: k.read_bytes.0,
        read_bytes_max: k.read_bytes.1,
        service_threads: k.service_threads,
        achieved_fraction: k.achieved_fraction(),
        worst_lag_ns: k.worst_lag.as_nanos() as u64,
        target: KvRates {
            client_reads_per_s: k.read_rps as f64,
            client_writes_per_s: k.write_rps as f64,
            lb_reads_per_s: k.derived.lb_reads_per_s,
            lb_writes_per_s: k.derived.lb_writes_per_s,
        },
        achieved: KvRates {
            client_reads_per_s: k.rate(k.client_read.ios),
            client_writes_per_s: k.rate(k.client_write.ios),
            lb_reads_per_s: k.rate(k.lb_reads),
            lb_writes_per_s: k.rate(k.lb_writes),
        },
        relocated: k.counters.relocated,
        read_retries: k.counters.read_retries,
        mismatches: k.counters.mismatches,
        slices: k.slices.iter().map(|s| kv_slice(s, delivered)).collect(),
        client_reads: kv_client_latency(&k.client_read, true),
        client_writes: kv_client_latency(&k.client_write, false),
        read_queueing: k.read_queue.map(|q| KvReadQueueing {
            queued_share: q.queued_share(),
            adaptive: q.adaptive,
            ceiling: q.ceiling,
            limit_min: q.limit_min,
            limit_max: q.limit_max,
            limit_mean: q.mean_limit(),
        }),
    }
}

/// One verdict slice; `delivered`: whether the run delivered its load (a slice within limits
/// at a lighter load is no pass).
fn kv_slice(s: &virtgap_workloads::kv::SliceResult, delivered: bool) -> KvSlice {
    let shares = |v: &virtgap_workloads::act::SliceVerdict| KvSliceShares {
        ops: v.reads,
        pct_at_or_over_1ms: v.over_1ms_pct,
        pct_at_or_over_8ms: v.over_8ms_pct,
        pct_at_or_over_64ms: v.over_64ms_pct,
    };
    KvSlice {
        start_s: s.start_s,
        end_s: s.end_s,
        complete: s.complete,
        pass: match (s.complete, s.pass()) {
            (false, _) => None,
            (true, true) => delivered.then_some(true),
            (true, false) => Some(false),
        },
        service_pass: s.complete.then_some(s.reads.pass),
        intended_pass: s.complete.then_some(s.reads_intended.pass),
        judged_on: JudgedOn::Service,
        worst_lag_ns: s.worst_lag.as_nanos() as u64,
        reads: shares(&s.reads),
        reads_intended: Some(shares(&s.reads_intended)),
        lb_reads: shares(&s.lb_reads),
        lb_writes: shares(&s.lb_writes),
    }
}

fn kv_client_latency(
    d: &virtgap_workloads::stats::DirStats,
    reads: bool,
) -> Option<KvClientLatency> {
    (d.ios > 0).then(|| KvClientLatency {
        ops: d.ios,
        service: reads.then(|| Histogram::from_latency(&d.clat)),
        lat: Histogram::from_latency(&d.lat),
        lat_intended: Histogram::from_latency(&d.lat_intended),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A Xen guest's per-CPU timer and IPI event-channel IRQs are counted as the vectors they
    /// stand for elsewhere, their time left out of hard-IRQ time as metal's vectors' is; a
    /// device's IRQ through Xen (`xen-pirq`) stays a hard IRQ with its time.
    #[test]
    fn xens_per_cpu_timer_and_ipi_irqs_count_as_vectors_not_hard_irq_time() {
        use virtgap_probes::model::{HardIrq, IrqSnapshot};
        let irq = |name: &str, count: u64, time_ns: u64| HardIrq {
            cpu: 0,
            irq: 0,
            name: name.into(),
            count,
            time_ns,
            duration: Default::default(),
        };
        let snap = ProbeSnapshot {
            irq: Some(IrqSnapshot {
                hardirqs: vec![
                    irq("timer0", 1000, 5_000_000),
                    irq("resched0", 200, 1_000_000),
                    irq("callfuncsingle0", 50, 300_000),
                    irq("nvme0q1", 4000, 8_000_000),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let loads = cpu_loads_with_irq_time(&snap);
        let c = &loads[0];
        assert_eq!(c.hardirq_ns, 8_000_000, "only the device's IRQ time");
        assert_eq!(c.hardirq_count, 4000);
        assert_eq!(c.irqs.keys().collect::<Vec<_>>(), ["nvme0q1"]);
        assert_eq!(c.vectors["local_timer"], 1000);
        assert_eq!(c.vectors["reschedule"], 200);
        assert_eq!(c.vectors["call_function_single"], 50);
        assert_eq!(
            irq("timer", 1, 1).system_vector(),
            None,
            "a plain name is no per-CPU IRQ"
        );
        assert_eq!(irq("virtio1-req.0", 1, 1).system_vector(), None);
        // The TUI's per-CPU reading follows the same rule.
        let (_, hard, _) = snap.irq.as_ref().unwrap().cpu_irq_time()[0];
        assert_eq!(hard, c.hardirq_ns);
    }
}
