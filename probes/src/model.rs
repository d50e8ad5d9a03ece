//! Plain data read from the probes' maps: no BPF types, no I/O. Snapshots are cumulative since
//! the probes attached; `since` turns two of them into one interval.

use serde::{Deserialize, Serialize};

use crate::hist::KernelHist;
use crate::hypervisor::Hypervisor;

/// Stage of a block request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockStage {
    /// Request started (allocated and accounted) -> its last issue to the driver.
    Queue,
    /// Last issue to the driver -> entry of the interrupt handler of the request's queue:
    /// device service plus interrupt delivery. Where that IRQ is unknown (see
    /// `BlockSnapshot::unsplit`), -> final completion. For a flush (op `Flush`), request start
    /// -> completion.
    Device,
    /// That handler's entry -> the request's final completion: the driver's completion path
    /// and any hop to another CPU (an IPI or softirq).
    Completion,
}

impl BlockStage {
    pub fn name(self) -> &'static str {
        match self {
            Self::Queue => "queue",
            Self::Device => "device",
            Self::Completion => "completion",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockOp {
    Read,
    Write,
    Flush,
    Discard,
    Other,
}

impl BlockOp {
    pub fn from_raw(op: u8) -> Self {
        match op {
            0 => Self::Read,
            1 => Self::Write,
            2 => Self::Flush,
            3 => Self::Discard,
            _ => Self::Other,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Flush => "flush",
            Self::Discard => "discard",
            Self::Other => "other",
        }
    }
}

/// A device number (major, minor).
pub type DevNum = (u32, u32);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockStageHist {
    pub dev: DevNum,
    /// Hardware queue index.
    pub hctx: u16,
    pub op: BlockOp,
    pub stage: BlockStage,
    pub hist: KernelHist,
}

/// Requests of one device: first issues, and completions (the device stage's count).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceGauge {
    pub dev: DevNum,
    /// Requests issued and not yet completed, as of the snapshot (requests whose start was not
    /// seen are not counted).
    pub inflight: i64,
    pub issued: u64,
    pub completed: u64,
    /// Reads and writes completed whose queue time started at their first bio's entry into the
    /// block layer (noted by the hook on submit_bio_noacct, or at block_bio_remap), not at the
    /// request: beside the queue stage's count, where this device's queue stage starts.
    #[serde(default)]
    pub from_bio_entry: u64,
}

/// Requests completed on `complete_cpu` that were submitted on `submit_cpu`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuPair {
    pub submit_cpu: u32,
    pub complete_cpu: u32,
    pub count: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockSnapshot {
    pub stages: Vec<BlockStageHist>,
    pub devices: Vec<DeviceGauge>,
    pub cpu_pairs: Vec<CpuPair>,
    /// Requests, histogram entries or devices' first-issue counts lost to full maps.
    pub dropped: u64,
    /// Completions of requests never seen issued (issued before the probes attached).
    pub unseen: u64,
    /// Requests the driver handed back to be issued again.
    #[serde(default)]
    pub requeued: u64,
    /// Requests that completed with an error status.
    #[serde(default)]
    pub errors: u64,
    /// ... of which the block layer's timeout ended them.
    #[serde(default)]
    pub timeouts: u64,
    /// Completions whose device time ran to completion, with no completion stage: their
    /// queue's IRQ is unknown (virtual devices, shared vectors) or had not entered (polled).
    #[serde(default)]
    pub unsplit: u64,
    /// Slow requests lost for the tail autopsy: its ring buffer was full.
    #[serde(default)]
    pub slow_dropped: u64,
}

/// One request of the followed process that was slow enough for the tail autopsy: its stage
/// boundaries in CLOCK_MONOTONIC nanoseconds and where its data sits on the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowRequest {
    pub dev: DevNum,
    /// First 512-byte sector on the whole disk.
    pub sector: u64,
    pub bytes: u32,
    pub op: BlockOp,
    pub start_ns: u64,
    pub issue_ns: u64,
    /// The queue's interrupt handler entry ending device time (None: unsplit).
    pub irq_ns: Option<u64>,
    pub complete_ns: u64,
    /// The thread it was started for (attach mode joins a slow call to it by this).
    pub tid: u32,
}

/// One file I/O call or io_uring request of an attached process slow enough for the tail
/// autopsy. Times are CLOCK_MONOTONIC nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowCall {
    pub via: AppVia,
    pub op: AppOp,
    /// The thread that made the call or submitted the request.
    pub tid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
}

impl BlockSnapshot {
    /// All histograms of one stage on one device, merged over queues and the given ops.
    /// One stage of `ops` summed over `devs` (every device when None).
    pub fn stage(&self, devs: Option<&[DevNum]>, stage: BlockStage, ops: &[BlockOp]) -> KernelHist {
        let mut h = KernelHist::default();
        for s in &self.stages {
            if s.stage == stage && devs.is_none_or(|d| d.contains(&s.dev)) && ops.contains(&s.op) {
                h.merge(&s.hist);
            }
        }
        h
    }

    /// Completions whose submitting and completing CPU differ.
    pub fn cross_cpu_completions(&self) -> (u64, u64) {
        let total: u64 = self.cpu_pairs.iter().map(|p| p.count).sum();
        let cross = self
            .cpu_pairs
            .iter()
            .filter(|p| p.submit_cpu != p.complete_cpu)
            .map(|p| p.count)
            .sum();
        (cross, total)
    }

    pub fn since(&self, earlier: &Self) -> Self {
        let stages = self
            .stages
            .iter()
            .map(|s| {
                let prev = earlier
                    .stages
                    .iter()
                    .find(|p| (p.dev, p.hctx, p.op, p.stage) == (s.dev, s.hctx, s.op, s.stage));
                BlockStageHist {
                    hist: prev.map_or_else(|| s.hist.clone(), |p| s.hist.since(&p.hist)),
                    ..s.clone()
                }
            })
            .collect();
        let devices = self
            .devices
            .iter()
            .map(|d| {
                let prev = earlier.devices.iter().find(|p| p.dev == d.dev);
                DeviceGauge {
                    dev: d.dev,
                    inflight: d.inflight,
                    issued: d.issued - prev.map_or(0, |p| p.issued.min(d.issued)),
                    completed: d.completed - prev.map_or(0, |p| p.completed.min(d.completed)),
                    from_bio_entry: d.from_bio_entry
                        - prev.map_or(0, |p| p.from_bio_entry.min(d.from_bio_entry)),
                }
            })
            .collect();
        let cpu_pairs = self
            .cpu_pairs
            .iter()
            .map(|c| {
                let prev = earlier
                    .cpu_pairs
                    .iter()
                    .find(|p| (p.submit_cpu, p.complete_cpu) == (c.submit_cpu, c.complete_cpu));
                CpuPair {
                    count: c.count - prev.map_or(0, |p| p.count.min(c.count)),
                    ..c.clone()
                }
            })
            .collect();
        Self {
            stages,
            devices,
            cpu_pairs,
            dropped: self.dropped.saturating_sub(earlier.dropped),
            unseen: self.unseen.saturating_sub(earlier.unseen),
            requeued: self.requeued.saturating_sub(earlier.requeued),
            unsplit: self.unsplit.saturating_sub(earlier.unsplit),
            slow_dropped: self.slow_dropped.saturating_sub(earlier.slow_dropped),
            errors: self.errors.saturating_sub(earlier.errors),
            timeouts: self.timeouts.saturating_sub(earlier.timeouts),
        }
    }
}

/// Hard-IRQ activity of one IRQ on one CPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HardIrq {
    pub cpu: u32,
    pub irq: u32,
    /// From /proc/interrupts, e.g. "virtio1-req.0", "nvme0q3".
    pub name: String,
    pub count: u64,
    pub time_ns: u64,
    pub duration: KernelHist,
}

impl HardIrq {
    /// The system vector this per-CPU IRQ stands for, by its name: Xen binds each CPU's timer,
    /// IPIs and IRQ work to event channels named `timer3`, `resched3`, `callfunc3`,
    /// `callfuncsingle3`, `spinlock3`, `irqwork3`, `debug3`, where other hosts take the local
    /// APIC's vectors. Every reading counts these as vectors, their time out of hard-IRQ time.
    pub fn system_vector(&self) -> Option<&'static str> {
        let stem = self.name.trim_end_matches(|c: char| c.is_ascii_digit());
        if stem.len() == self.name.len() {
            return None;
        }
        Some(match stem {
            "timer" => "local_timer",
            "resched" => "reschedule",
            "callfunc" => "call_function",
            "callfuncsingle" => "call_function_single",
            "spinlock" => "spinlock",
            "irqwork" => "irq_work",
            "debug" => "debug",
            _ => return None,
        })
    }
}

/// Count and time of one kind of event (a softirq vector, a system vector, an IPI kind) on one
/// CPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuEvents {
    pub cpu: u32,
    pub kind: String,
    pub count: u64,
    /// Zero for kinds that are only counted (IPI sends).
    pub time_ns: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IrqSnapshot {
    pub hardirqs: Vec<HardIrq>,
    pub softirqs: Vec<CpuEvents>,
    pub vectors: Vec<CpuEvents>,
    /// IPIs actually sent, one per target CPU: "reschedule" or "function_call" (6.4+).
    pub ipis_sent: Vec<CpuEvents>,
    /// Cross-CPU calls queued, by purpose: "block_completion", "wakeup", "other" (6.4+).
    #[serde(default)]
    pub cross_cpu_calls: Vec<CpuEvents>,
    pub dropped: u64,
}

fn events_since(now: &[CpuEvents], earlier: &[CpuEvents]) -> Vec<CpuEvents> {
    now.iter()
        .map(|e| {
            let prev = earlier.iter().find(|p| p.cpu == e.cpu && p.kind == e.kind);
            CpuEvents {
                count: e.count - prev.map_or(0, |p| p.count.min(e.count)),
                time_ns: e.time_ns - prev.map_or(0, |p| p.time_ns.min(e.time_ns)),
                ..e.clone()
            }
        })
        .collect()
}

impl IrqSnapshot {
    pub fn since(&self, earlier: &Self) -> Self {
        let hardirqs = self
            .hardirqs
            .iter()
            .map(|h| {
                let prev = earlier
                    .hardirqs
                    .iter()
                    .find(|p| p.cpu == h.cpu && p.irq == h.irq);
                HardIrq {
                    count: h.count - prev.map_or(0, |p| p.count.min(h.count)),
                    time_ns: h.time_ns - prev.map_or(0, |p| p.time_ns.min(h.time_ns)),
                    duration: prev
                        .map_or_else(|| h.duration.clone(), |p| h.duration.since(&p.duration)),
                    ..h.clone()
                }
            })
            .collect();
        Self {
            hardirqs,
            softirqs: events_since(&self.softirqs, &earlier.softirqs),
            vectors: events_since(&self.vectors, &earlier.vectors),
            ipis_sent: events_since(&self.ipis_sent, &earlier.ipis_sent),
            cross_cpu_calls: events_since(&self.cross_cpu_calls, &earlier.cross_cpu_calls),
            dropped: self.dropped.saturating_sub(earlier.dropped),
        }
    }

    /// Time each CPU spent in hard-IRQ handlers (system vectors left out, as
    /// [`HardIrq::system_vector`] says) and in softirqs, in ns: (cpu, hardirq, softirq).
    pub fn cpu_irq_time(&self) -> Vec<(u32, u64, u64)> {
        let mut cpus: Vec<u32> = self
            .hardirqs
            .iter()
            .map(|h| h.cpu)
            .chain(self.softirqs.iter().map(|s| s.cpu))
            .collect();
        cpus.sort_unstable();
        cpus.dedup();
        cpus.into_iter()
            .map(|cpu| {
                let hard = self
                    .hardirqs
                    .iter()
                    .filter(|h| h.cpu == cpu && h.system_vector().is_none())
                    .map(|h| h.time_ns)
                    .sum();
                let soft = self
                    .softirqs
                    .iter()
                    .filter(|s| s.cpu == cpu)
                    .map(|s| s.time_ns)
                    .sum();
                (cpu, hard, soft)
            })
            .collect()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeupSnapshot {
    /// Wakeup -> on-CPU latency of the workload's threads.
    pub latency: KernelHist,
    pub dropped: u64,
}

impl WakeupSnapshot {
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            latency: self.latency.since(&earlier.latency),
            dropped: self.dropped.saturating_sub(earlier.dropped),
        }
    }
}

/// How an app-level I/O of attached processes was timed (`bpf/app.bpf.c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AppVia {
    /// A synchronous system call, entry to exit.
    Syscall,
    /// An io_uring request, submission to completion.
    IoUring,
}

/// What an app-level I/O was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AppOp {
    Read,
    Write,
    /// fsync, fdatasync.
    Sync,
}

/// One kind of app-level I/O: its latency and the bytes it moved (system calls only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppHist {
    pub via: AppVia,
    pub op: AppOp,
    pub latency: KernelHist,
    pub bytes: u64,
}

/// App latency of the attached processes, where the kernel shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppSnapshot {
    pub kinds: Vec<AppHist>,
    /// io_submit calls (libaio): their I/O has no app-level time here.
    pub io_submits: u64,
    /// File I/O calls that returned an error.
    pub failed: u64,
    /// Calls or requests not timed (a full map).
    pub dropped: u64,
    /// Slow calls lost for the tail autopsy: its ring buffer was full.
    #[serde(default)]
    pub slow_dropped: u64,
}

impl AppSnapshot {
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            kinds: self
                .kinds
                .iter()
                .map(|k| {
                    let before = earlier
                        .kinds
                        .iter()
                        .find(|e| e.via == k.via && e.op == k.op);
                    AppHist {
                        latency: before.map_or(k.latency.clone(), |b| k.latency.since(&b.latency)),
                        bytes: k.bytes - before.map_or(0, |b| b.bytes.min(k.bytes)),
                        ..k.clone()
                    }
                })
                .collect(),
            io_submits: self.io_submits.saturating_sub(earlier.io_submits),
            failed: self.failed.saturating_sub(earlier.failed),
            dropped: self.dropped.saturating_sub(earlier.dropped),
            slow_dropped: self.slow_dropped.saturating_sub(earlier.slow_dropped),
        }
    }

    /// The latency of every read and write, system calls and io_uring requests together: the
    /// attached processes' app stage (fsyncs are apart).
    pub fn data_latency(&self) -> KernelHist {
        let mut h = self.latency(AppVia::Syscall, &[AppOp::Read, AppOp::Write]);
        h.merge(&self.latency(AppVia::IoUring, &[AppOp::Read, AppOp::Write]));
        h
    }

    /// The latency of `op` I/Os timed `via`, merged (empty when none).
    pub fn latency(&self, via: AppVia, ops: &[AppOp]) -> KernelHist {
        let mut h = KernelHist::default();
        for k in self
            .kinds
            .iter()
            .filter(|k| k.via == via && ops.contains(&k.op))
        {
            h.merge(&k.latency);
        }
        h
    }
}

/// NVMe command latency of one queue (setup -> completion).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmeQueueHist {
    pub dev: DevNum,
    /// Hardware queue index + 1; 0 is the admin queue. IRQ "nvme<c>q<qid>" serves it.
    pub qid: u16,
    pub op: BlockOp,
    pub hist: KernelHist,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmeSnapshot {
    pub queues: Vec<NvmeQueueHist>,
    pub dropped: u64,
}

impl NvmeSnapshot {
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            queues: self
                .queues
                .iter()
                .map(|q| {
                    let prev = earlier
                        .queues
                        .iter()
                        .find(|p| (p.dev, p.qid, p.op) == (q.dev, q.qid, q.op));
                    NvmeQueueHist {
                        hist: prev.map_or_else(|| q.hist.clone(), |p| q.hist.since(&p.hist)),
                        ..q.clone()
                    }
                })
                .collect(),
            dropped: self.dropped.saturating_sub(earlier.dropped),
        }
    }
}

/// Accesses of one MSR on one CPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsrCount {
    pub cpu: u32,
    pub msr: u32,
    pub write: bool,
    /// A write in the wake of virtgap's own sampler interrupt on this CPU (the tool's cost).
    #[serde(default)]
    pub by_sampler: bool,
    /// Any other write while the sampler ran: the host's, but in a pattern the sampler's timer
    /// changed (see `MsrSnapshot::sampler_ns`).
    #[serde(default)]
    pub while_sampling: bool,
    /// Whether writes to this MSR exit to the hypervisor this host runs on (see
    /// `virt::msr_exits`); false on metal.
    #[serde(default)]
    pub exits: bool,
    pub count: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsrSnapshot {
    pub counts: Vec<MsrCount>,
    /// How long virtgap's sampler ran while these were counted, ns (0: it never ran). Its timer
    /// moves the host's own timer writes, so it pauses for part of every interval and the
    /// host's figures are those counted in the pauses (`quiet_secs`), scaled to the window by
    /// the profile model.
    #[serde(default)]
    pub sampler_ns: u64,
    /// IPIs to one CPU timed from their send to their ICR write's return; None where the
    /// kernel has no `ipi:ipi_send_cpu` (before 6.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icr_sends: Option<IcrSends>,
}

/// IPIs to one CPU timed from the generic send (`ipi:ipi_send_cpu`) to the return of the x2APIC
/// ICR write that sends them (`bpf/msr.bpf.c`): the native send, and in a guest whose ICR
/// writes exit, the exit too. Over all CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IcrSends {
    pub sends: u64,
    pub ns: u64,
    /// Sends to one CPU that no ICR write ended (a paravirt send, an xAPIC's MMIO write).
    #[serde(default)]
    pub unpaired: u64,
}

impl IcrSends {
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            sends: self.sends.saturating_sub(earlier.sends),
            ns: self.ns.saturating_sub(earlier.ns),
            unpaired: self.unpaired.saturating_sub(earlier.unpaired),
        }
    }
}

/// The least pause time from which the host's writes are scaled to a whole window.
pub const MIN_QUIET_NS: u64 = 10_000_000;

impl MsrSnapshot {
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            counts: self
                .counts
                .iter()
                .map(|c| {
                    let prev = earlier.counts.iter().find(|p| {
                        (p.cpu, p.msr, p.write, p.by_sampler, p.while_sampling)
                            == (c.cpu, c.msr, c.write, c.by_sampler, c.while_sampling)
                    });
                    MsrCount {
                        count: c.count - prev.map_or(0, |p| p.count.min(c.count)),
                        ..c.clone()
                    }
                })
                .collect(),
            sampler_ns: self.sampler_ns.saturating_sub(earlier.sampler_ns),
            icr_sends: match (&self.icr_sends, &earlier.icr_sends) {
                (Some(now), Some(then)) => Some(now.since(then)),
                (now, _) => *now,
            },
        }
    }

    /// Seconds of `elapsed_ns` in which the host's writes were counted (no sampler running).
    pub fn quiet_secs(&self, elapsed_ns: u64) -> f64 {
        elapsed_ns.saturating_sub(self.sampler_ns) as f64 / 1e9
    }

    /// Whether a count is the host's own, counted with no sampler running.
    pub fn is_hosts(c: &MsrCount) -> bool {
        c.write && !c.by_sampler && !c.while_sampling
    }

    /// Writes to `msr` summed over CPUs, the sampler's own included.
    pub fn writes(&self, msr: u32) -> u64 {
        self.counts
            .iter()
            .filter(|c| c.write && c.msr == msr)
            .map(|c| c.count)
            .sum()
    }

    /// Writes of any kind in the wake of virtgap's own sampler.
    pub fn sampler_writes(&self) -> u64 {
        self.counts
            .iter()
            .filter(|c| c.write && c.by_sampler)
            .map(|c| c.count)
            .sum()
    }
}

/// CPU-clock samples of one CPU: user-mode samples and kernel samples by symbol.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuSamples {
    pub cpu: u32,
    pub user: u64,
    pub kernel: std::collections::BTreeMap<String, u64>,
}

impl CpuSamples {
    pub fn total(&self) -> u64 {
        self.user + self.kernel.values().sum::<u64>()
    }

    /// Whether this CPU's samples stand for its time: false when fewer than
    /// `MIN_DELIVERED_SHARE` of what `frequency_hz` over `secs` should have given arrived. Some
    /// kernels expire the sampling timer on a CPU without delivering the sample (seen on a PVM
    /// guest's second vCPU while idle: 4 of 500), so the split of those that came is biased.
    /// True over less than a second.
    pub fn represents(&self, frequency_hz: u64, secs: f64) -> bool {
        samples_represent(self.total(), frequency_hz, secs)
    }

    /// Samples per category, on a host running on `hypervisor` (the snapshot's).
    pub fn categories(
        &self,
        hypervisor: Hypervisor,
    ) -> std::collections::BTreeMap<crate::virt::SampleCategory, u64> {
        let mut out = std::collections::BTreeMap::new();
        if self.user > 0 {
            out.insert(crate::virt::SampleCategory::User, self.user);
        }
        for (sym, n) in &self.kernel {
            *out.entry(crate::virt::classify_symbol(sym, hypervisor))
                .or_insert(0) += n;
        }
        out
    }

    /// Past `MAX_SYMBOLS_PER_CPU` distinct kernel symbols, keeps the `KEPT_SYMBOLS_PER_CPU`
    /// most sampled and counts the rest under their category's folded key, so a long run's
    /// tally stays bounded (rare symbols keep turning up for hours) while every category's
    /// total stays exact. A folded symbol sampled again starts a new count. Symbols are
    /// sorted as on `hypervisor` (the snapshot's).
    pub fn fold(&mut self, hypervisor: Hypervisor) {
        if self.kernel.len() <= MAX_SYMBOLS_PER_CPU {
            return;
        }
        let mut by_count: Vec<(String, u64)> =
            std::mem::take(&mut self.kernel).into_iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut folded: std::collections::BTreeMap<String, u64> = Default::default();
        for (i, (sym, n)) in by_count.into_iter().enumerate() {
            let category = crate::virt::classify_symbol(&sym, hypervisor);
            // A sampled mechanism's symbols are never folded: its time is read by symbol.
            let kept = i < KEPT_SYMBOLS_PER_CPU
                || sym == category.folded_key()
                || crate::hypervisor::sampled_mechanism(hypervisor, &sym).is_some();
            if kept {
                *self.kernel.entry(sym).or_insert(0) += n;
            } else {
                *folded.entry(category.folded_key()).or_insert(0) += n;
            }
        }
        for (key, n) in folded {
            *self.kernel.entry(key).or_insert(0) += n;
        }
    }

    /// Samples per mechanism the sampler alone measures on `hypervisor` (its
    /// `Measure::SampledIn` paths: the doorbell where nothing can time it).
    pub fn mechanisms(
        &self,
        hypervisor: Hypervisor,
    ) -> std::collections::BTreeMap<crate::hypervisor::Mechanism, u64> {
        let mut out = std::collections::BTreeMap::new();
        for (sym, n) in &self.kernel {
            if let Some(m) = crate::hypervisor::sampled_mechanism(hypervisor, sym) {
                *out.entry(m).or_insert(0) += n;
            }
        }
        out
    }

    /// The `n` kernel symbols with the most samples.
    pub fn top(&self, n: usize) -> Vec<(&str, u64)> {
        let mut v: Vec<(&str, u64)> = self.kernel.iter().map(|(s, c)| (s.as_str(), *c)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v.truncate(n);
        v
    }
}

/// Share of a CPU's expected samples that must arrive for its split to be shown (the timer's
/// count is exact; a shortfall is samples the kernel dropped).
pub const MIN_DELIVERED_SHARE: f64 = 0.8;

/// The rule of `CpuSamples::represents` for a CPU's sample count, wherever it is kept.
pub fn samples_represent(samples: u64, frequency_hz: u64, secs: f64) -> bool {
    let expected = frequency_hz as f64 * secs;
    expected < frequency_hz as f64 || samples as f64 >= MIN_DELIVERED_SHARE * expected
}

/// Distinct kernel symbols a CPU's tally holds before `CpuSamples::fold` thins it.
pub const MAX_SYMBOLS_PER_CPU: usize = 512;
/// Symbols a fold keeps by name.
pub const KEPT_SYMBOLS_PER_CPU: usize = 256;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerSnapshot {
    pub frequency_hz: u64,
    pub cpus: Vec<CpuSamples>,
    pub dropped: u64,
    /// How long the sampler ran, ns: it pauses for part of every interval while the msr probe
    /// counts the host's timer writes, so this is what a CPU's sample count is judged against.
    #[serde(default)]
    pub sampled_ns: u64,
    /// The hypervisor the samples are sorted for (`CpuSamples::categories`): what is its
    /// interface, and on metal nothing.
    #[serde(default)]
    pub hypervisor: Hypervisor,
}

impl SamplerSnapshot {
    /// The seconds its samples cover, out of a window of `window` seconds.
    pub fn seconds(&self, window: f64) -> f64 {
        if self.sampled_ns > 0 {
            self.sampled_ns as f64 / 1e9
        } else {
            window
        }
    }

    pub fn since(&self, earlier: &Self) -> Self {
        let cpus = self
            .cpus
            .iter()
            .map(|c| {
                let prev = earlier.cpus.iter().find(|p| p.cpu == c.cpu);
                // Symbols folded since `earlier` moved their counts into their category's
                // folded key: that part of the key's growth is not this interval's.
                let mut moved: std::collections::BTreeMap<String, u64> = Default::default();
                for (sym, n) in prev.map(|p| &p.kernel).into_iter().flatten() {
                    if !c.kernel.contains_key(sym) {
                        let key = crate::virt::classify_symbol(sym, self.hypervisor).folded_key();
                        *moved.entry(key).or_insert(0) += n;
                    }
                }
                let kernel = c
                    .kernel
                    .iter()
                    .map(|(s, n)| {
                        let before = prev.and_then(|p| p.kernel.get(s)).copied().unwrap_or(0)
                            + moved.get(s).copied().unwrap_or(0);
                        (s.clone(), n - before.min(*n))
                    })
                    .filter(|(_, n)| *n > 0)
                    .collect();
                CpuSamples {
                    cpu: c.cpu,
                    user: c.user - prev.map_or(0, |p| p.user.min(c.user)),
                    kernel,
                }
            })
            .collect();
        Self {
            frequency_hz: self.frequency_hz,
            cpus,
            dropped: self.dropped.saturating_sub(earlier.dropped),
            sampled_ns: self.sampled_ns.saturating_sub(earlier.sampled_ns),
            hypervisor: self.hypervisor,
        }
    }
}

/// Host-side KVM events of one VMM process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct KvmEventCount {
    pub tgid: u32,
    /// "pio", "mmio", "msr", "hypercall", "exit".
    pub event: String,
    pub count: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitHist {
    pub isa: u32,
    pub reason: u32,
    pub name: String,
    pub hist: KernelHist,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvmSnapshot {
    pub events: Vec<KvmEventCount>,
    pub exits: Vec<ExitHist>,
}

impl KvmSnapshot {
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            events: self
                .events
                .iter()
                .map(|e| {
                    let prev = earlier
                        .events
                        .iter()
                        .find(|p| p.tgid == e.tgid && p.event == e.event);
                    KvmEventCount {
                        count: e.count - prev.map_or(0, |p| p.count.min(e.count)),
                        ..e.clone()
                    }
                })
                .collect(),
            exits: self
                .exits
                .iter()
                .map(|x| {
                    let prev = earlier
                        .exits
                        .iter()
                        .find(|p| (p.isa, p.reason) == (x.isa, x.reason));
                    ExitHist {
                        hist: prev.map_or_else(|| x.hist.clone(), |p| x.hist.since(&p.hist)),
                        ..x.clone()
                    }
                })
                .collect(),
        }
    }

    pub fn count(&self, tgid: u32, event: &str) -> u64 {
        self.events
            .iter()
            .filter(|e| e.tgid == tgid && e.event == event)
            .map(|e| e.count)
            .sum()
    }
}

/// Entry -> return time of one paravirt callback.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PvPathHist {
    pub symbol: String,
    pub hist: KernelHist,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PvPathSnapshot {
    pub paths: Vec<PvPathHist>,
}

impl PvPathSnapshot {
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            paths: self
                .paths
                .iter()
                .map(|p| {
                    let prev = earlier.paths.iter().find(|e| e.symbol == p.symbol);
                    PvPathHist {
                        hist: prev.map_or_else(|| p.hist.clone(), |e| p.hist.since(&e.hist)),
                        ..p.clone()
                    }
                })
                .collect(),
        }
    }
}

/// Run statistics of one of our BPF programs (needs the BPF_ENABLE_STATS fd held).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramStats {
    pub family: String,
    pub name: String,
    pub run_count: u64,
    pub run_time_ns: u64,
    /// Events the kernel did not run the program for because it was already running on that
    /// CPU (an interrupt's event nested in the program's own): lost measurements.
    #[serde(default)]
    pub missed: u64,
}

/// Everything the probes measured, cumulative since they attached.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeSnapshot {
    /// Nanoseconds since the probes attached.
    pub elapsed_ns: u64,
    pub block: Option<BlockSnapshot>,
    pub irq: Option<IrqSnapshot>,
    pub wakeups: Option<WakeupSnapshot>,
    /// App latency of attached processes (attach mode's app family).
    pub app: Option<AppSnapshot>,
    pub nvme: Option<NvmeSnapshot>,
    pub msr: Option<MsrSnapshot>,
    pub sampler: Option<SamplerSnapshot>,
    pub kvm: Option<KvmSnapshot>,
    pub pv_paths: Option<PvPathSnapshot>,
    /// Per-CPU time by state from /proc/stat (user, system, irq, softirq, steal, idle).
    pub cpu_times: Vec<crate::procfs::CpuTimes>,
    /// Attach mode: the processes followed when the snapshot was taken (a state, not a count:
    /// an interval's is its end's); None outside attach mode.
    pub followed: Option<Vec<u32>>,
    /// Empty when run-time statistics are unavailable.
    pub programs: Vec<ProgramStats>,
    /// Nanoseconds the kernel's run statistics were on, over which `programs` were counted
    /// (the collector keeps them on for a share of the intervals: see
    /// [`crate::ProbeSession::set_run_stats`]).
    #[serde(default)]
    pub stats_on_ns: u64,
}

impl ProbeSnapshot {
    /// Our programs' run time over the whole snapshot, estimated from the time the run
    /// statistics were on (measured outright when they were on throughout). None without
    /// them, or when they were off for all of it.
    pub fn program_run_ns_estimate(&self) -> Option<u64> {
        if self.programs.is_empty() || self.stats_on_ns == 0 {
            return None;
        }
        let measured: u64 = self.programs.iter().map(|p| p.run_time_ns).sum();
        let on = self.stats_on_ns.min(self.elapsed_ns.max(1));
        Some((measured as f64 * self.elapsed_ns.max(1) as f64 / on as f64) as u64)
    }

    /// Slow requests the block probe could not send (its ring buffer was full); 0 without it.
    pub fn slow_dropped(&self) -> u64 {
        self.block.as_ref().map_or(0, |b| b.slow_dropped)
    }

    /// Runs and run time (ns) of the programs, summed by probe family (empty without run-time
    /// statistics).
    pub fn runs_by_family(&self) -> std::collections::BTreeMap<&str, (u64, u64)> {
        let mut by_family = std::collections::BTreeMap::<&str, (u64, u64)>::new();
        for p in &self.programs {
            let e = by_family.entry(p.family.as_str()).or_default();
            e.0 += p.run_count;
            e.1 += p.run_time_ns;
        }
        by_family
    }

    /// The activity between `earlier` and this snapshot.
    pub fn since(&self, earlier: &Self) -> Self {
        fn pair<T>(a: &Option<T>, b: &Option<T>, f: impl Fn(&T, &T) -> T) -> Option<T>
        where
            T: Clone,
        {
            match (a, b) {
                (Some(a), Some(b)) => Some(f(a, b)),
                (Some(a), None) => Some(a.clone()),
                _ => None,
            }
        }
        Self {
            elapsed_ns: self.elapsed_ns.saturating_sub(earlier.elapsed_ns),
            block: pair(&self.block, &earlier.block, BlockSnapshot::since),
            irq: pair(&self.irq, &earlier.irq, IrqSnapshot::since),
            wakeups: pair(&self.wakeups, &earlier.wakeups, WakeupSnapshot::since),
            app: pair(&self.app, &earlier.app, AppSnapshot::since),
            nvme: pair(&self.nvme, &earlier.nvme, NvmeSnapshot::since),
            msr: pair(&self.msr, &earlier.msr, MsrSnapshot::since),
            sampler: pair(&self.sampler, &earlier.sampler, SamplerSnapshot::since),
            kvm: pair(&self.kvm, &earlier.kvm, KvmSnapshot::since),
            pv_paths: pair(&self.pv_paths, &earlier.pv_paths, PvPathSnapshot::since),
            cpu_times: self
                .cpu_times
                .iter()
                .map(|t| {
                    earlier
                        .cpu_times
                        .iter()
                        .find(|e| e.cpu == t.cpu)
                        .map_or(*t, |e| t.since(e))
                })
                .collect(),
            followed: self.followed.clone(),
            stats_on_ns: self.stats_on_ns.saturating_sub(earlier.stats_on_ns),
            programs: self
                .programs
                .iter()
                .map(|p| {
                    let prev = earlier
                        .programs
                        .iter()
                        .find(|q| q.name == p.name && q.family == p.family);
                    ProgramStats {
                        run_count: p.run_count - prev.map_or(0, |q| q.run_count.min(p.run_count)),
                        run_time_ns: p.run_time_ns
                            - prev.map_or(0, |q| q.run_time_ns.min(p.run_time_ns)),
                        missed: p.missed - prev.map_or(0, |q| q.missed.min(p.missed)),
                        ..p.clone()
                    }
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virt::SampleCategory;

    fn tally(symbols: usize) -> CpuSamples {
        CpuSamples {
            cpu: 1,
            user: 7,
            kernel: (0..symbols)
                .map(|i| (format!("fn_{i}"), i as u64 + 1))
                .chain([("blk_mq_rare".to_string(), 1)])
                .collect(),
        }
    }

    fn snapshot(c: &CpuSamples) -> SamplerSnapshot {
        SamplerSnapshot {
            frequency_hz: 99,
            cpus: vec![c.clone()],
            dropped: 0,
            sampled_ns: 0,
            hypervisor: Hypervisor::Kvm,
        }
    }

    fn msr_count(msr: u32, count: u64, by_sampler: bool, while_sampling: bool) -> MsrCount {
        MsrCount {
            cpu: 0,
            msr,
            write: true,
            by_sampler,
            while_sampling,
            exits: true,
            count,
        }
    }

    #[test]
    fn the_hosts_msr_writes_are_counted_in_the_samplers_pauses_and_kept_apart() {
        let msr = MsrSnapshot {
            counts: vec![
                msr_count(0x6e0, 100, false, false),
                msr_count(0x6e0, 30, false, true),
                msr_count(0x6e0, 900, true, false),
            ],
            // 750 ms of a 1 s window sampled: the 100 writes were counted in 250 ms.
            sampler_ns: 750_000_000,
            icr_sends: None,
        };
        assert_eq!(msr.quiet_secs(1_000_000_000), 0.25);
        assert_eq!(msr.sampler_writes(), 900);
        // A window the sampler ran all through had no time to count the host's writes in.
        assert_eq!(msr.quiet_secs(750_000_000), 0.0);
        // Deltas keep each kind of write apart.
        let later = MsrSnapshot {
            counts: vec![
                msr_count(0x6e0, 150, false, false),
                msr_count(0x6e0, 70, false, true),
                msr_count(0x6e0, 1900, true, false),
            ],
            sampler_ns: 1_500_000_000,
            icr_sends: None,
        };
        let delta = later.since(&msr);
        let counts: Vec<u64> = delta.counts.iter().map(|c| c.count).collect();
        assert_eq!(counts, [50, 40, 1000]);
        assert_eq!(delta.sampler_ns, 750_000_000);
    }

    #[test]
    fn a_cpu_short_of_its_expected_samples_does_not_represent_its_time() {
        let mut c = CpuSamples {
            cpu: 1,
            ..Default::default()
        };
        c.user = 4;
        assert!(!c.represents(99, 5.0), "4 of ~495");
        c.user = 300;
        assert!(!c.represents(99, 5.0), "300 of ~495");
        c.user = 490;
        assert!(c.represents(99, 5.0));
        c.user = 0;
        assert!(c.represents(99, 0.5), "under a second nothing is judged");
    }

    #[test]
    fn a_long_runs_symbol_tally_stays_bounded_with_exact_category_totals() {
        let mut c = tally(MAX_SYMBOLS_PER_CPU + 100);
        let before = c.categories(Hypervisor::Kvm);
        c.fold(Hypervisor::Kvm);
        assert!(c.kernel.len() <= KEPT_SYMBOLS_PER_CPU + SampleCategory::ALL.len());
        assert_eq!(
            c.categories(Hypervisor::Kvm),
            before,
            "folding moves samples, never loses them"
        );
        assert_eq!(
            c.top(1)[0].0,
            "[other other kernel]",
            "the long tail, together"
        );
        assert_eq!(c.kernel["[other block and driver]"], 1);
        assert!(c
            .kernel
            .contains_key(&format!("fn_{}", MAX_SYMBOLS_PER_CPU + 99)));
        assert!(!c.kernel.contains_key("fn_0"));
        let small = tally(10);
        let mut unchanged = small.clone();
        unchanged.fold(Hypervisor::Kvm);
        assert_eq!(unchanged, small, "a short tally is left alone");
    }

    #[test]
    fn an_interval_across_a_fold_counts_only_its_own_samples() {
        let earlier = tally(MAX_SYMBOLS_PER_CPU + 100);
        let mut later = earlier.clone();
        // Five more samples of a rare symbol and two of a common one, then the fold.
        *later.kernel.get_mut("fn_0").unwrap() += 5;
        *later.kernel.get_mut("fn_400").unwrap() += 2;
        later.fold(Hypervisor::Kvm);
        let interval = snapshot(&later).since(&snapshot(&earlier));
        let cpu = &interval.cpus[0];
        assert_eq!(cpu.total(), 7, "{:?}", cpu.kernel);
        assert_eq!(cpu.kernel["[other other kernel]"], 5);
        assert_eq!(cpu.kernel["fn_400"], 2);
        // The next interval, with a folded symbol sampled again under its own name.
        let mut next = later.clone();
        next.kernel.insert("fn_0".into(), 3);
        let interval = snapshot(&next).since(&snapshot(&later));
        assert_eq!(interval.cpus[0].total(), 3);
        assert_eq!(interval.cpus[0].kernel["fn_0"], 3);
    }
}
