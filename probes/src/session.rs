//! A probe session: loads the probe families (one BPF object each, so a family that cannot
//! load fails alone), attaches them, reports what attached and how, and reads their maps into
//! plain snapshots. The session borrows caller-provided storage for the BPF objects, so it
//! lives on the stack of the thread that owns it (the collector).

use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, Object, OpenObject};
use serde::{Deserialize, Serialize};

use crate::attach::{attach_each, select_programs, AttachKind, AttachOutcome, KernelTracepoints};
use crate::bpf;
use crate::hist::KernelHist;
use crate::model::*;
use crate::procfs;

/// The probe families.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    Block,
    Irq,
    Wakeup,
    Nvme,
    /// Exit-causing MSR accesses.
    Msr,
    /// CPU-clock sampling of kernel IPs on every CPU.
    Sampler,
    /// Host-side KVM exits (when virtgap runs on a hypervisor).
    KvmHost,
    /// Entry -> return timing of paravirt callbacks (fentry, else kprobes).
    PvPaths,
}

impl Family {
    pub const ALL: [Family; 8] = [
        Family::Block,
        Family::Irq,
        Family::Wakeup,
        Family::Nvme,
        Family::Msr,
        Family::Sampler,
        Family::KvmHost,
        Family::PvPaths,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Block => "block",
            Self::Irq => "irq",
            Self::Wakeup => "wakeup",
            Self::Nvme => "nvme",
            Self::Msr => "msr",
            Self::Sampler => "sampler",
            Self::KvmHost => "kvm-host",
            Self::PvPaths => "pv-paths",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == s)
    }
}

/// What to load.
#[derive(Clone, Debug)]
pub struct ProbeConfig {
    pub families: Vec<Family>,
    /// CPU-clock sampling frequency.
    pub sample_hz: u64,
    /// Restrict block and wakeup probes to this process (the workload). The wakeup probe needs
    /// it and is reported unavailable without it.
    pub filter_tgid: Option<u32>,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            families: Family::ALL.to_vec(),
            sample_hz: 999,
            filter_tgid: None,
        }
    }
}

impl ProbeConfig {
    pub fn new(families: Vec<Family>, filter_tgid: Option<u32>) -> Self {
        Self {
            families,
            filter_tgid,
            ..Self::default()
        }
    }
}

/// One family's outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FamilyReport {
    pub family: Family,
    /// Why the whole family is unavailable, if it is.
    pub unavailable: Option<String>,
    /// Per tracepoint: attached how, or why not.
    pub tracepoints: Vec<AttachOutcome>,
}

const NO_NVME: &str = "no NVMe on this host (nvme_core module not loaded)";
const NOT_A_KVM_HOST: &str = "not a KVM host (no kvm module)";

impl FamilyReport {
    /// The family watches hardware or a hypervisor role this host does not have, so nothing
    /// is lost by it being unavailable.
    pub fn watches_nothing_here(&self) -> bool {
        matches!(self.unavailable.as_deref(), Some(NO_NVME | NOT_A_KVM_HOST))
    }
}

/// What attached on this host, for doctor, the profile and the reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapabilityReport {
    pub families: Vec<FamilyReport>,
    /// Things the loader did on the way, e.g. mounting tracefs.
    #[serde(default)]
    pub notes: Vec<String>,
    /// Why per-program run statistics are unavailable, if they are.
    pub run_stats_unavailable: Option<String>,
}

impl CapabilityReport {
    pub fn attached_count(&self) -> usize {
        self.families
            .iter()
            .flat_map(|f| &f.tracepoints)
            .filter(|t| t.attached.is_some())
            .count()
    }

    pub fn unavailable_count(&self) -> usize {
        self.families
            .iter()
            .map(|f| {
                if f.unavailable.is_some() {
                    1
                } else {
                    f.tracepoints
                        .iter()
                        .filter(|t| t.attached.is_none())
                        .count()
                }
            })
            .sum()
    }
}

/// Backing storage for the BPF objects: two slots per family (a failed tp_btf load consumes
/// its slot; the raw_tp retry gets a fresh one).
pub struct ProbeStorage {
    block: [MaybeUninit<OpenObject>; 2],
    irq: [MaybeUninit<OpenObject>; 2],
    sched: [MaybeUninit<OpenObject>; 2],
    nvme: [MaybeUninit<OpenObject>; 2],
    msr: [MaybeUninit<OpenObject>; 2],
    sampler: MaybeUninit<OpenObject>,
    kvm: [MaybeUninit<OpenObject>; 2],
}

impl std::fmt::Debug for ProbeStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProbeStorage")
    }
}

impl Default for ProbeStorage {
    fn default() -> Self {
        let two = || [MaybeUninit::uninit(), MaybeUninit::uninit()];
        Self {
            block: two(),
            irq: two(),
            sched: two(),
            nvme: two(),
            msr: two(),
            sampler: MaybeUninit::uninit(),
            kvm: two(),
        }
    }
}

/// Loaded and attached probes.
pub struct ProbeSession<'a> {
    block: Option<bpf::block::BlockSkel<'a>>,
    irq: Option<bpf::irq::IrqSkel<'a>>,
    sched: Option<bpf::sched::SchedSkel<'a>>,
    nvme: Option<bpf::nvme::NvmeSkel<'a>>,
    msr: Option<bpf::msr::MsrSkel<'a>>,
    sampler: Option<bpf::sampler::SamplerSkel<'a>>,
    sample_hz: u64,
    symbols: crate::virt::Symbols,
    kvm: Option<bpf::kvm::KvmSkel<'a>>,
    pv: Option<crate::pvpaths::PvTimer>,
    _links: Vec<Link>,
    _stats_fd: Option<OwnedFd>,
    started: Instant,
    /// /proc/stat at load time: snapshots count from here, like the BPF maps.
    base_cpu_times: Vec<procfs::CpuTimes>,
    irq_names: BTreeMap<u32, String>,
    pub report: CapabilityReport,
}

impl std::fmt::Debug for ProbeSession<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeSession")
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

/// Opens a skeleton in `slot`, lets `setup` configure it, selects programs and loads it.
fn open_and_load<'a, B>(
    builder: B,
    slot: &'a mut MaybeUninit<OpenObject>,
    kind: AttachKind,
    exists: &dyn Fn(&str) -> bool,
    setup: &dyn Fn(&mut B::Output),
) -> Result<(<B::Output as OpenSkel<'a>>::Output, Vec<String>), String>
where
    B: SkelBuilder<'a>,
{
    let mut open = builder.open(slot).map_err(|e| format!("open: {e}"))?;
    setup(&mut open);
    let missing = select_programs(open.open_object_mut(), kind, exists);
    let skel = open
        .load()
        .map_err(|e| format!("{} load: {e}", kind.name()))?;
    Ok((skel, missing.into_iter().collect()))
}

/// Loads a family with tp_btf programs, or raw_tp ones if that fails; attaches each program.
fn load_family<'a, B, F>(
    family: Family,
    make: F,
    slots: &'a mut [MaybeUninit<OpenObject>; 2],
    kernel: &KernelTracepoints,
    exists: &dyn Fn(&str) -> bool,
    setup: &dyn Fn(&mut B::Output),
    links: &mut Vec<Link>,
) -> (Option<<B::Output as OpenSkel<'a>>::Output>, FamilyReport)
where
    B: SkelBuilder<'a>,
    F: Fn() -> B,
{
    let [first, second] = slots;
    let kinds = if kernel.has_btf() {
        [AttachKind::TpBtf, AttachKind::RawTp]
    } else {
        [AttachKind::RawTp, AttachKind::RawTp]
    };
    let mut errors = Vec::new();
    for (kind, slot) in kinds.into_iter().zip([first, second]) {
        match open_and_load(make(), slot, kind, exists, setup) {
            Ok((skel, missing)) => {
                let (mut new_links, mut outcomes) = attach_each(skel.object(), kind);
                links.append(&mut new_links);
                outcomes.extend(missing.into_iter().map(|tp| AttachOutcome {
                    tracepoint: tp,
                    attached: None,
                    reason: Some("tracepoint not in this kernel".into()),
                }));
                outcomes.sort_by(|a, b| a.tracepoint.cmp(&b.tracepoint));
                let report = FamilyReport {
                    family,
                    unavailable: None,
                    tracepoints: outcomes,
                };
                return (Some(skel), report);
            }
            Err(e) => errors.push(e),
        }
    }
    errors.dedup();
    let report = FamilyReport {
        family,
        unavailable: Some(errors.join("; ")),
        tracepoints: vec![],
    };
    (None, report)
}

fn unavailable(family: Family, reason: impl Into<String>) -> FamilyReport {
    FamilyReport {
        family,
        unavailable: Some(reason.into()),
        tracepoints: vec![],
    }
}

impl<'a> ProbeSession<'a> {
    /// Loads and attaches the configured families. Never fails as a whole: what cannot attach
    /// is in `report`, with its reason.
    pub fn load(storage: &'a mut ProbeStorage, config: &ProbeConfig) -> Self {
        // libbpf would print its own load errors on stderr; every failure is in the report.
        libbpf_rs::set_print(None);
        let mut report = CapabilityReport::default();
        let mut links = Vec::new();
        let kernel = KernelTracepoints::load();
        let permission = crate::bpf_permission();
        let wants = |f: Family| config.families.contains(&f);
        // Read once: the irq probe, the sampler and the paravirt timers all need it.
        let symbols = crate::virt::Symbols::load();

        let stats_fd = match &permission {
            Ok(()) => enable_run_stats()
                .map_err(|e| report.run_stats_unavailable = Some(e))
                .ok(),
            Err(e) => {
                report.run_stats_unavailable = Some(e.clone());
                None
            }
        };

        let ProbeStorage {
            block: block_slots,
            irq: irq_slots,
            sched: sched_slots,
            nvme: nvme_slots,
            msr: msr_slots,
            sampler: sampler_slot,
            kvm: kvm_slots,
        } = storage;
        let mut block = None;
        if wants(Family::Block) {
            if let Err(e) = &permission {
                report.families.push(unavailable(Family::Block, e.clone()));
            } else {
                let tgid = config.filter_tgid.unwrap_or(0);
                let has_io_start = kernel.has("block_io_start");
                let setup = |open: &mut bpf::block::OpenBlockSkel<'_>| {
                    if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
                        ro.filter_tgid = tgid;
                        ro.have_io_start = has_io_start;
                    }
                };
                let (skel, r) = load_family(
                    Family::Block,
                    bpf::block::BlockSkelBuilder::default,
                    block_slots,
                    &kernel,
                    &|tp| kernel.has(tp),
                    &setup,
                    &mut links,
                );
                block = skel;
                report.families.push(r);
            }
        }

        let mut irq = None;
        if wants(Family::Irq) {
            if let Err(e) = &permission {
                report.families.push(unavailable(Family::Irq, e.clone()));
            } else {
                let remote_fn = symbols
                    .address("__blk_mq_complete_request_remote")
                    .unwrap_or(0);
                let setup = |open: &mut bpf::irq::OpenIrqSkel<'_>| {
                    if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
                        ro.blk_complete_remote_fn = remote_fn;
                    }
                };
                let (skel, r) = load_family(
                    Family::Irq,
                    bpf::irq::IrqSkelBuilder::default,
                    irq_slots,
                    &kernel,
                    &|tp| kernel.has(tp),
                    &setup,
                    &mut links,
                );
                irq = skel;
                report.families.push(r);
            }
        }

        let mut sched = None;
        if wants(Family::Wakeup) {
            match (&permission, config.filter_tgid) {
                (Err(e), _) => report.families.push(unavailable(Family::Wakeup, e.clone())),
                (Ok(()), None) => report.families.push(unavailable(
                    Family::Wakeup,
                    "needs a workload process to follow",
                )),
                (Ok(()), Some(tgid)) => {
                    let setup = |open: &mut bpf::sched::OpenSchedSkel<'_>| {
                        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
                            ro.filter_tgid = tgid;
                        }
                    };
                    let (skel, r) = load_family(
                        Family::Wakeup,
                        bpf::sched::SchedSkelBuilder::default,
                        sched_slots,
                        &kernel,
                        &|tp| kernel.has(tp),
                        &setup,
                        &mut links,
                    );
                    sched = skel;
                    report.families.push(r);
                }
            }
        }

        let mut nvme = None;
        if wants(Family::Nvme) {
            // The nvme tracepoints live in the nvme_core module (or a kernel that builds it in).
            let present = std::path::Path::new("/sys/module/nvme_core").exists()
                || kernel.has("nvme_setup_cmd");
            match (&permission, present) {
                (_, false) => report.families.push(unavailable(Family::Nvme, NO_NVME)),
                (Err(e), true) => report.families.push(unavailable(Family::Nvme, e.clone())),
                (Ok(()), true) => {
                    let (skel, r) = load_family(
                        Family::Nvme,
                        bpf::nvme::NvmeSkelBuilder::default,
                        nvme_slots,
                        &kernel,
                        &|_| true,
                        &|_: &mut bpf::nvme::OpenNvmeSkel<'_>| {},
                        &mut links,
                    );
                    nvme = skel;
                    report.families.push(r);
                }
            }
        }

        let mut msr = None;
        if wants(Family::Msr) {
            if let Err(e) = &permission {
                report.families.push(unavailable(Family::Msr, e.clone()));
            } else {
                let (skel, r) = load_family(
                    Family::Msr,
                    bpf::msr::MsrSkelBuilder::default,
                    msr_slots,
                    &kernel,
                    &|tp| kernel.has(tp),
                    &|_: &mut bpf::msr::OpenMsrSkel<'_>| {},
                    &mut links,
                );
                msr = skel;
                report.families.push(r);
            }
        }

        let mut sampler = None;
        if wants(Family::Sampler) {
            match &permission {
                Err(e) => report
                    .families
                    .push(unavailable(Family::Sampler, e.clone())),
                Ok(()) => match crate::sampler::start(sampler_slot, config.sample_hz, &mut links) {
                    Ok((skel, r)) => {
                        sampler = Some(skel);
                        report.families.push(r);
                    }
                    Err(r) => report.families.push(r),
                },
            }
        }

        let mut kvm = None;
        if wants(Family::KvmHost) {
            let present =
                kernel.has("kvm_exit") || std::path::Path::new("/sys/module/kvm").exists();
            match (&permission, present) {
                (_, false) => report
                    .families
                    .push(unavailable(Family::KvmHost, NOT_A_KVM_HOST)),
                (Err(e), true) => report
                    .families
                    .push(unavailable(Family::KvmHost, e.clone())),
                (Ok(()), true) => {
                    // kvm_exit/kvm_entry are classic tracepoints, which need tracefs.
                    if let Some(note) = crate::attach::ensure_tracefs() {
                        report.notes.push(note);
                    }
                    let tgid = config.filter_tgid.unwrap_or(0);
                    let (skel, r) = load_family(
                        Family::KvmHost,
                        bpf::kvm::KvmSkelBuilder::default,
                        kvm_slots,
                        &kernel,
                        &|tp| kernel.has(tp),
                        &|open: &mut bpf::kvm::OpenKvmSkel<'_>| {
                            if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
                                ro.filter_tgid = tgid;
                            }
                        },
                        &mut links,
                    );
                    kvm = skel;
                    report.families.push(r);
                }
            }
        }

        let mut pv = None;
        if wants(Family::PvPaths) {
            let (timer, r) = crate::pvpaths::start(&permission, &symbols);
            pv = timer;
            report.families.push(r);
        }

        let irq_names = std::fs::read_to_string("/proc/interrupts")
            .map(|t| procfs::irq_names(&t))
            .unwrap_or_default();
        Self {
            block,
            irq,
            sched,
            nvme,
            msr,
            sampler,
            sample_hz: config.sample_hz,
            symbols,
            kvm,
            pv,
            _links: links,
            _stats_fd: stats_fd,
            started: Instant::now(),
            base_cpu_times: procfs::read_cpu_times(),
            irq_names,
            report,
        }
    }

    /// Reads every map into a cumulative snapshot.
    pub fn snapshot(&self) -> ProbeSnapshot {
        let mut programs = Vec::new();
        if self._stats_fd.is_some() {
            if let Some(s) = &self.block {
                programs.extend(program_stats("block", s.object()));
            }
            if let Some(s) = &self.irq {
                programs.extend(program_stats("irq", s.object()));
            }
            if let Some(s) = &self.sched {
                programs.extend(program_stats("wakeup", s.object()));
            }
            if let Some(s) = &self.nvme {
                programs.extend(program_stats("nvme", s.object()));
            }
            if let Some(s) = &self.msr {
                programs.extend(program_stats("msr", s.object()));
            }
            if let Some(s) = &self.sampler {
                programs.extend(program_stats("sampler", s.object()));
            }
            if let Some(s) = &self.kvm {
                programs.extend(program_stats("kvm-host", s.object()));
            }
        }
        ProbeSnapshot {
            elapsed_ns: self.started.elapsed().as_nanos() as u64,
            block: self.block.as_ref().map(read_block),
            irq: self.irq.as_ref().map(|s| read_irq(s, &self.irq_names)),
            wakeups: self.sched.as_ref().map(read_wakeups),
            nvme: self.nvme.as_ref().map(read_nvme),
            cpu_times: procfs::read_cpu_times()
                .into_iter()
                .map(|t| {
                    self.base_cpu_times
                        .iter()
                        .find(|b| b.cpu == t.cpu)
                        .map_or(t, |b| t.since(b))
                })
                .collect(),
            msr: self.msr.as_ref().map(read_msr),
            sampler: self
                .sampler
                .as_ref()
                .map(|s| read_sampler(s, &self.symbols, self.sample_hz)),
            kvm: self.kvm.as_ref().map(read_kvm),
            pv_paths: self.pv.as_ref().map(crate::pvpaths::PvTimer::read),
            programs,
        }
    }
}

/// Holds kernel BPF run-time statistics on while the fd lives (only our run pays for them).
fn enable_run_stats() -> Result<OwnedFd, String> {
    // SAFETY: plain syscall wrapper; a non-negative return is a new fd we own.
    let fd = unsafe {
        libbpf_rs::libbpf_sys::bpf_enable_stats(libbpf_rs::libbpf_sys::BPF_STATS_RUN_TIME)
    };
    if fd < 0 {
        return Err(format!(
            "BPF_ENABLE_STATS: {}",
            std::io::Error::from_raw_os_error(-fd)
        ));
    }
    // SAFETY: fd is a fresh descriptor returned by the kernel, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn program_stats(family: &'static str, object: &Object) -> Vec<ProgramStats> {
    object
        .progs()
        .filter(|p| p.autoload())
        .filter_map(|p| {
            let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
            let mut len = std::mem::size_of_val(&info) as u32;
            // SAFETY: info is a writable bpf_prog_info of `len` bytes; the fd is live.
            let rc = unsafe {
                libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(
                    p.as_fd().as_raw_fd(),
                    &mut info,
                    &mut len,
                )
            };
            (rc == 0).then(|| ProgramStats {
                family: family.to_string(),
                name: p.name().to_string_lossy().into_owned(),
                run_count: info.run_cnt,
                run_time_ns: info.run_time_ns,
            })
        })
        .collect()
}

fn dev_of(raw: u32) -> DevNum {
    (raw >> 20, raw & 0xf_ffff)
}

fn copy<T: plain::Plain + Default>(bytes: &[u8]) -> Option<T> {
    let mut v = T::default();
    plain::copy_from_bytes(&mut v, bytes).ok()?;
    Some(v)
}

/// Every CPU's copy of a per-CPU map entry (array slots take the index's bytes as key).
fn percpu_entry<T: plain::Plain + Default>(map: &dyn MapCore, key: &[u8]) -> Vec<T> {
    map.lookup_percpu(key, MapFlags::ANY)
        .ok()
        .flatten()
        .map(|per_cpu| per_cpu.iter().filter_map(|b| copy::<T>(b)).collect())
        .unwrap_or_default()
}

fn read_block(skel: &bpf::block::BlockSkel<'_>) -> BlockSnapshot {
    use bpf::block::types;
    let maps = &skel.maps;
    let mut snap = BlockSnapshot::default();
    for key in maps.block_hists.keys() {
        let Some(k) = copy::<types::vg_block_key>(&key) else {
            continue;
        };
        let mut hist = KernelHist::default();
        for h in percpu_entry::<types::vg_hist>(&maps.block_hists, &key) {
            hist.merge(&KernelHist::from(&h));
        }
        snap.stages.push(BlockStageHist {
            dev: dev_of(k.dev),
            hctx: k.hctx,
            op: BlockOp::from_raw(k.op),
            stage: if k.stage == 0 {
                BlockStage::Queue
            } else {
                BlockStage::Device
            },
            hist,
        });
    }
    snap.stages.sort_by_key(|s| (s.dev, s.hctx, s.op, s.stage));
    // Issued requests are the queue stage's count, completed ones the device stage's.
    let mut devs: Vec<DevNum> = snap.stages.iter().map(|s| s.dev).collect();
    devs.dedup();
    for dev in devs {
        let count = |stage| {
            snap.stages
                .iter()
                .filter(|s| s.dev == dev && s.stage == stage)
                .map(|s| s.hist.count)
                .sum::<u64>()
        };
        let (issued, completed) = (count(BlockStage::Queue), count(BlockStage::Device));
        snap.devices.push(DeviceGauge {
            dev,
            inflight: issued as i64 - completed as i64,
            issued,
            completed,
        });
    }
    let cpus = libbpf_rs::num_possible_cpus().unwrap_or(1).min(1024) as u32;
    for submit_cpu in 0..cpus {
        for (complete_cpu, count) in
            percpu_entry::<u64>(&maps.completions_by_submitter, &submit_cpu.to_ne_bytes())
                .into_iter()
                .enumerate()
        {
            if count > 0 {
                snap.cpu_pairs.push(CpuPair {
                    submit_cpu,
                    complete_cpu: complete_cpu as u32,
                    count,
                });
            }
        }
    }
    snap.cpu_pairs
        .sort_by_key(|p| (p.submit_cpu, p.complete_cpu));
    snap.dropped = percpu_entry::<u64>(&maps.counters, &0u32.to_ne_bytes())
        .iter()
        .sum();
    snap.unseen = percpu_entry::<u64>(&maps.counters, &1u32.to_ne_bytes())
        .iter()
        .sum();
    snap
}

fn read_irq(skel: &bpf::irq::IrqSkel<'_>, names: &BTreeMap<u32, String>) -> IrqSnapshot {
    use bpf::irq::types;
    let maps = &skel.maps;
    let mut snap = IrqSnapshot::default();
    for key in maps.hardirqs.keys() {
        let (Some(k), Ok(Some(v))) = (
            copy::<types::vg_irq_key>(&key),
            maps.hardirqs.lookup(&key, MapFlags::ANY),
        ) else {
            continue;
        };
        let Some(st) = copy::<types::vg_irq_stats>(&v) else {
            continue;
        };
        snap.hardirqs.push(HardIrq {
            cpu: k.cpu,
            irq: k.irq,
            name: names
                .get(&k.irq)
                .cloned()
                .unwrap_or_else(|| format!("irq{}", k.irq)),
            count: st.count,
            time_ns: st.time_ns,
            duration: KernelHist::from(&st.duration),
        });
    }
    snap.hardirqs.sort_by_key(|h| (h.cpu, h.irq));
    let per_cpu = |map: &dyn MapCore, kinds: &[&str]| -> Vec<CpuEvents> {
        let mut out = Vec::new();
        for (i, kind) in kinds.iter().enumerate() {
            for (cpu, ct) in percpu_entry::<types::vg_count_time>(map, &(i as u32).to_ne_bytes())
                .into_iter()
                .enumerate()
            {
                if ct.count > 0 {
                    out.push(CpuEvents {
                        cpu: cpu as u32,
                        kind: kind.to_string(),
                        count: ct.count,
                        time_ns: ct.time_ns,
                    });
                }
            }
        }
        out.sort_by(|a, b| (a.cpu, &a.kind).cmp(&(b.cpu, &b.kind)));
        out
    };
    snap.softirqs = per_cpu(&maps.softirqs, &SOFTIRQ_NAMES);
    snap.vectors = per_cpu(&maps.vectors, &VECTOR_NAMES);
    snap.ipis_sent = per_cpu(&maps.ipis, &IPI_KIND_NAMES);
    snap.dropped = percpu_entry::<u64>(&maps.dropped, &0u32.to_ne_bytes())
        .iter()
        .sum();
    snap
}

fn read_wakeups(skel: &bpf::sched::SchedSkel<'_>) -> WakeupSnapshot {
    let maps = &skel.maps;
    let mut latency = KernelHist::default();
    for h in percpu_entry::<bpf::sched::types::vg_hist>(&maps.wakeup_hist, &0u32.to_ne_bytes()) {
        latency.merge(&KernelHist::from(&h));
    }
    WakeupSnapshot {
        latency,
        dropped: percpu_entry::<u64>(&maps.dropped, &0u32.to_ne_bytes())
            .iter()
            .sum(),
    }
}

fn read_nvme(skel: &bpf::nvme::NvmeSkel<'_>) -> NvmeSnapshot {
    use bpf::nvme::types;
    let maps = &skel.maps;
    let mut snap = NvmeSnapshot::default();
    for key in maps.nvme_hists.keys() {
        let Some(k) = copy::<types::vg_nvme_key>(&key) else {
            continue;
        };
        let mut hist = KernelHist::default();
        for h in percpu_entry::<types::vg_hist>(&maps.nvme_hists, &key) {
            hist.merge(&KernelHist::from(&h));
        }
        snap.queues.push(NvmeQueueHist {
            dev: dev_of(k.dev),
            qid: k.qid,
            op: BlockOp::from_raw(k.op),
            hist,
        });
    }
    snap.queues.sort_by_key(|q| (q.dev, q.qid, q.op));
    snap.dropped = percpu_entry::<u64>(&maps.dropped, &0u32.to_ne_bytes())
        .iter()
        .sum();
    snap
}

/// Opens (parses, does not load) every BPF object and lists its programs' sections. Needs no
/// privilege; proves the embedded objects are well formed.
pub fn object_sections() -> Result<Vec<(Family, Vec<String>)>, String> {
    fn sections(object: &OpenObject) -> Vec<String> {
        object
            .progs()
            .map(|p| p.section().to_string_lossy().into_owned())
            .collect()
    }
    let mut out = Vec::new();
    let mut slot = MaybeUninit::uninit();
    let open = bpf::block::BlockSkelBuilder::default()
        .open(&mut slot)
        .map_err(|e| e.to_string())?;
    out.push((Family::Block, sections(open.open_object())));
    let mut slot = MaybeUninit::uninit();
    let open = bpf::irq::IrqSkelBuilder::default()
        .open(&mut slot)
        .map_err(|e| e.to_string())?;
    out.push((Family::Irq, sections(open.open_object())));
    let mut slot = MaybeUninit::uninit();
    let open = bpf::sched::SchedSkelBuilder::default()
        .open(&mut slot)
        .map_err(|e| e.to_string())?;
    out.push((Family::Wakeup, sections(open.open_object())));
    let mut slot = MaybeUninit::uninit();
    let open = bpf::nvme::NvmeSkelBuilder::default()
        .open(&mut slot)
        .map_err(|e| e.to_string())?;
    out.push((Family::Nvme, sections(open.open_object())));
    Ok(out)
}

fn read_msr(skel: &bpf::msr::MsrSkel<'_>) -> MsrSnapshot {
    let map = &skel.maps.msrs;
    let mut counts = Vec::new();
    for key in map.keys() {
        let Some(k) = copy::<bpf::msr::types::vg_msr_key>(&key) else {
            continue;
        };
        for (cpu, n) in percpu_entry::<u64>(map, &key).into_iter().enumerate() {
            if n > 0 {
                counts.push(MsrCount {
                    cpu: cpu as u32,
                    msr: k.msr,
                    write: k.write == 1,
                    count: n,
                });
            }
        }
    }
    counts.sort_by_key(|c| (c.cpu, c.msr, c.write));
    MsrSnapshot { counts }
}

fn read_sampler(
    skel: &bpf::sampler::SamplerSkel<'_>,
    symbols: &crate::virt::Symbols,
    hz: u64,
) -> SamplerSnapshot {
    let map = &skel.maps.samples;
    let mut cpus: BTreeMap<u32, CpuSamples> = BTreeMap::new();
    for key in map.keys() {
        let (Some(k), Ok(Some(v))) = (
            copy::<bpf::sampler::types::vg_sample_key>(&key),
            map.lookup(&key, MapFlags::ANY),
        ) else {
            continue;
        };
        let Ok(raw) = <[u8; 8]>::try_from(&v[..]) else {
            continue;
        };
        let n = u64::from_ne_bytes(raw);
        let c = cpus.entry(k.cpu).or_insert_with(|| CpuSamples {
            cpu: k.cpu,
            ..Default::default()
        });
        if k.user != 0 {
            c.user += n;
        } else {
            let sym = symbols.resolve(k.ip).unwrap_or("[unknown]").to_string();
            *c.kernel.entry(sym).or_insert(0) += n;
        }
    }
    SamplerSnapshot {
        frequency_hz: hz,
        cpus: cpus.into_values().collect(),
        dropped: percpu_entry::<u64>(&skel.maps.dropped, &0u32.to_ne_bytes())
            .iter()
            .sum(),
    }
}

fn read_kvm(skel: &bpf::kvm::KvmSkel<'_>) -> KvmSnapshot {
    use bpf::kvm::types;
    let maps = &skel.maps;
    let names = ["pio", "mmio", "msr", "hypercall", "exit"];
    let mut snap = KvmSnapshot::default();
    for key in maps.events.keys() {
        let (Some(k), Ok(Some(v))) = (
            copy::<types::vg_kvm_key>(&key),
            maps.events.lookup(&key, MapFlags::ANY),
        ) else {
            continue;
        };
        let Ok(raw) = <[u8; 8]>::try_from(&v[..]) else {
            continue;
        };
        snap.events.push(KvmEventCount {
            tgid: k.tgid,
            event: names
                .get(k.event as usize)
                .copied()
                .unwrap_or("other")
                .to_string(),
            count: u64::from_ne_bytes(raw),
        });
    }
    for key in maps.exits.keys() {
        let (Some(k), Ok(Some(v))) = (
            copy::<types::vg_exit_key>(&key),
            maps.exits.lookup(&key, MapFlags::ANY),
        ) else {
            continue;
        };
        let Some(h) = copy::<types::vg_hist>(&v) else {
            continue;
        };
        snap.exits.push(ExitHist {
            isa: k.isa,
            reason: k.reason,
            name: crate::virt::exit_reason_name(k.isa, k.reason),
            hist: KernelHist::from(&h),
        });
    }
    snap
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_object_opens_with_tp_btf_and_raw_tp_twins() {
        for (family, sections) in object_sections().unwrap() {
            assert!(!sections.is_empty(), "{family:?} has programs");
            for s in &sections {
                let tp = s
                    .strip_prefix("tp_btf/")
                    .or_else(|| s.strip_prefix("raw_tp/"))
                    .unwrap_or_else(|| panic!("{family:?}: unexpected section {s}"));
                let twin = if s.starts_with("tp_btf/") {
                    format!("raw_tp/{tp}")
                } else {
                    format!("tp_btf/{tp}")
                };
                assert!(sections.contains(&twin), "{family:?}: {s} has no twin");
            }
        }
    }

    #[test]
    fn nvme_queue_histograms_subtract_per_queue() {
        let mut a = KernelHist::default();
        a.record(10_000);
        let earlier = NvmeSnapshot {
            queues: vec![NvmeQueueHist {
                dev: (259, 0),
                qid: 3,
                op: BlockOp::Read,
                hist: a.clone(),
            }],
            dropped: 0,
        };
        a.record(20_000);
        let mut b = KernelHist::default();
        b.record(5_000);
        let now = NvmeSnapshot {
            queues: vec![
                NvmeQueueHist {
                    dev: (259, 0),
                    qid: 3,
                    op: BlockOp::Read,
                    hist: a,
                },
                NvmeQueueHist {
                    dev: (259, 0),
                    qid: 4,
                    op: BlockOp::Read,
                    hist: b,
                },
            ],
            dropped: 2,
        };
        let d = now.since(&earlier);
        assert_eq!(d.queues[0].hist.count, 1);
        assert_eq!(d.queues[0].hist.sum_ns, 20_000);
        assert_eq!(
            d.queues[1].hist.count, 1,
            "a queue new in this interval keeps all of it"
        );
        assert_eq!(d.dropped, 2);
    }
}
