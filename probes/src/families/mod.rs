//! The probe families, one module each. A family module holds everything about its signal on
//! the Rust side: its definition ([`FamilyDef`]: name, what each attach point gives, the view it
//! feeds, its loader), what it needs from the host before loading, how its BPF object is set up
//! (read-only data, map sizes, which programs this kernel runs), and how its maps read into a
//! snapshot. `Family::def` is the registry: the one place that lists the families' modules.

mod app;
pub(crate) mod block;
mod irq;
mod kvm_host;
mod msr;
mod nvme;
mod pv_paths;
mod sampler;
mod wakeup;

use std::mem::MaybeUninit;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, Object, OpenObject};

use crate::attach::{
    attach_each, select_programs, AttachKind, AttachOutcome, KernelTracepoints, Selection,
    TracedModule,
};
use crate::error::{BpfError, Unavailable};
use crate::libbpf_log;
use crate::model::ProbeSnapshot;
use crate::report::{Family, FamilyReport};
use crate::virt::Symbols;

/// A probe family's definition, one per family module (its `FAMILY`): everything outside the
/// module says about the family comes from here.
pub struct FamilyDef {
    /// As the CLI, the reports and doctor name it.
    pub name: &'static str,
    /// What the family gives, for doctor's row when none of it loads.
    pub gives: &'static str,
    /// The view that loses something when the family does not load or attach fully.
    pub view: &'static str,
    /// What each of its attach points gives.
    pub signals: Signals,
    /// Kernel modules whose tracepoints it uses (their BTF is read at load).
    pub(crate) modules: &'static [TracedModule],
    pub(crate) load: for<'obj> fn(&LoadContext<'_>, &'obj mut Slots) -> LoadResult<'obj>,
    /// Its BPF objects' program sections, read by opening (not loading) them: no privilege.
    pub(crate) sections: fn() -> Result<Vec<String>, BpfError>,
}

impl std::fmt::Debug for FamilyDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FamilyDef")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// What a family's attach points give.
#[derive(Clone, Copy, Debug)]
pub enum Signals {
    /// By attach point (tracepoint, or hooked function). The tests fail on an attach point of
    /// the family's objects that has no entry, and on an entry no object has.
    Named(&'static [(&'static str, &'static str)]),
    /// The same for every attach point, where the points are only known on the host (one
    /// perf event per CPU; the paravirt callbacks the kernel has).
    Each(&'static str),
}

impl Family {
    /// Its definition, from its module. A family without one does not compile.
    pub fn def(self) -> &'static FamilyDef {
        match self {
            Family::Block => &block::FAMILY,
            Family::Irq => &irq::FAMILY,
            Family::Wakeup => &wakeup::FAMILY,
            Family::App => &app::FAMILY,
            Family::Nvme => &nvme::FAMILY,
            Family::Msr => &msr::FAMILY,
            Family::Sampler => &sampler::FAMILY,
            Family::KvmHost => &kvm_host::FAMILY,
            Family::PvPaths => &pv_paths::FAMILY,
        }
    }

    pub fn name(self) -> &'static str {
        self.def().name
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == s)
    }

    /// What attach point `point` (a tracepoint, a hooked function, a perf event) gives; None
    /// for a point the family does not have.
    pub fn signal(self, point: &str) -> Option<&'static str> {
        match self.def().signals {
            Signals::Named(named) => named.iter().find(|(p, _)| *p == point).map(|(_, s)| *s),
            Signals::Each(signal) => Some(signal),
        }
    }
}

/// Backing storage for one family's BPF objects: a failed tp_btf load consumes its slot and
/// the raw_tp retry gets a fresh one.
pub(crate) type Slots = [MaybeUninit<OpenObject>; 2];

/// Why kprobes cannot be used on this kernel, if they cannot.
pub(crate) fn kprobes_unavailable() -> Option<String> {
    let pmu = std::path::Path::new("/sys/bus/event_source/devices/kprobe");
    if !pmu.exists() {
        return Some("kprobes: not in this kernel (no kprobe PMU; CONFIG_KPROBES off?)".into());
    }
    None
}

/// Storage for one BPF object for the life of the process, for objects beyond a family's two
/// `Slots` (one per paravirt symbol, the block family's bio-entry hook); each leaks a few
/// hundred bytes once per probe session, of which a process has one or two.
pub(crate) fn leaked_object_slot() -> &'static mut MaybeUninit<OpenObject> {
    Box::leak(Box::new(MaybeUninit::uninit()))
}

/// What to load.
#[derive(Clone, Debug)]
pub struct ProbeConfig {
    pub families: Vec<Family>,
    /// CPU-clock sampling frequency.
    pub sample_hz: u64,
    /// How often the maps are read (sizes what must fit between two reads).
    pub interval: Duration,
    /// Restrict block and wakeup probes to this process (the workload), numbered as this
    /// process sees it. The wakeup probe needs it and is reported unavailable without it.
    pub filter_tgid: Option<u32>,
    /// Attach mode: block and wakeup probes count the processes this names (and the children
    /// they start), not `filter_tgid`; the collector refreshes the set every interval
    /// ([`crate::ProbeSession::refresh_followed`]).
    pub follow: Option<crate::follow::AttachTarget>,
    /// kvm-host: count only this VMM process (None: every process that runs a VM).
    pub vmm_pid: Option<u32>,
    /// Load the hypervisor families (msr, sampler, pv-paths) as on a guest of this hypervisor
    /// (None: the one this host runs on, `virt::detect_hypervisor`). Doctor checks another
    /// hypervisor's paths on this kernel with it.
    pub hypervisor: Option<crate::hypervisor::Hypervisor>,
    /// Block requests at least this many nanoseconds long are sent as slow requests, for the
    /// tail autopsy; the workload moves it with its running tail (None: none are sent).
    pub slow_request_ns: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    /// Attached processes' calls and io_uring requests at least this long are sent as slow
    /// calls, for the attached tail autopsy; attach mode moves it with their running tail
    /// (None: none are sent).
    pub slow_call_ns: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    /// Where the block family's stage times come from.
    pub block_stamps: BlockStamps,
    /// The kernel's run statistics (our self-overhead figures) are on for one interval in this
    /// many (1: always; see [`crate::ProbeSession::set_run_stats`]).
    pub run_stats_every: u32,
}

/// Where the block family's stage times come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BlockStamps {
    /// Our own clock readings where a request starts, is issued and completes (three programs
    /// per request; every kernel).
    Own,
    /// The kernel's own request stamps (made and issued), read at completion: one program per
    /// request. Where they are not exact (6.9+: the plug's cached clock) or a device's queue
    /// may not stamp issues (no request statistics), our own, with a note.
    #[default]
    Kernel,
    /// The kernel's stamps even where they are not exact: to compare the two
    /// ([`crate::stamps_check`]).
    KernelUnchecked,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            families: Family::ALL.to_vec(),
            // Low on purpose: every sample interrupts a CPU and reprograms its timer (an exit
            // in a guest), which is what the msr probe measures.
            sample_hz: 99,
            interval: Duration::from_secs(1),
            filter_tgid: None,
            follow: None,
            vmm_pid: None,
            slow_request_ns: None,
            slow_call_ns: None,
            block_stamps: BlockStamps::Kernel,
            hypervisor: None,
            run_stats_every: 1,
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

/// A process to follow, as BPF compares it: the tgid this process sees, and the pid namespace
/// it sees it in (None: the initial namespace, where the kernel's own numbers are the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProcessFilter {
    pub tgid: u32,
    pub pidns: Option<(u64, u64)>,
    /// Attach mode: the session's map of followed tgids (`vg_filter.bpf.h`'s `followed`), which
    /// every object shares instead of comparing `tgid`. The session owns the map and outlives
    /// every load.
    pub followed: Option<std::os::fd::RawFd>,
}

/// The initial pid namespace's inode number (PROC_PID_INIT_INO).
const INIT_PIDNS_INO: u64 = 0xEFFF_FFFC;

impl ProcessFilter {
    pub(crate) fn of(tgid: u32) -> Self {
        let pidns = std::fs::metadata("/proc/self/ns/pid")
            .ok()
            .map(|m| (m.dev(), m.ino()))
            .filter(|&(_, ino)| ino != INIT_PIDNS_INO);
        Self {
            tgid,
            pidns,
            followed: None,
        }
    }

    /// Attach mode: the processes in the map `followed` (a session's).
    pub(crate) fn following(followed: std::os::fd::RawFd) -> Self {
        Self {
            tgid: 0,
            pidns: None,
            followed: Some(followed),
        }
    }

    /// The tgid as task structs hold it, when this process can know it (initial namespace).
    fn global_tgid(&self) -> u32 {
        if self.pidns.is_none() {
            self.tgid
        } else {
            0
        }
    }
}

/// Sets the vg_filter.bpf.h fields of a skeleton's read-only and bss data.
macro_rules! apply_filter {
    ($open:expr, $filter:expr) => {{
        let filter: Option<$crate::families::ProcessFilter> = $filter;
        if let Some(fd) = filter.and_then(|f| f.followed) {
            // SAFETY: the fd is the session's followed map, open until the session drops, which
            // is after every object that reuses it was loaded (reuse_fd duplicates it).
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            // A map that cannot be shared leaves the object's own, empty one: nothing counted.
            let _ = $open.maps.followed.reuse_fd(fd);
        } else {
            // Unused outside attach mode: the smallest map the kernel takes.
            let _ = $open.maps.followed.set_max_entries(1);
        }
        if let (Some(f), Some(ro)) = (filter, $open.maps.rodata_data.as_deref_mut()) {
            ro.filter_tgid = f.tgid;
            ro.filter_followed = f.followed.is_some();
            if let Some((dev, ino)) = f.pidns {
                ro.filter_pidns_dev = dev;
                ro.filter_pidns_ino = ino;
            }
        }
        if let (Some(f), Some(bss)) = (filter, $open.maps.bss_data.as_deref_mut()) {
            bss.filter_tgid_global = f.global_tgid();
        }
    }};
}
pub(crate) use apply_filter;

/// The tracepoint where a followed process's children join it (attach mode only).
pub(crate) const FORK: &str = "sched_process_fork";

/// Whether a family loading now attaches its fork programs: in attach mode, and only while no
/// family loaded before it follows forks (one program per fork is enough: they share the map).
pub(crate) fn takes_forks(cx: &LoadContext<'_>) -> bool {
    cx.filter.is_some_and(|f| f.followed.is_some()) && !cx.shared.borrow().follows_forks
}

/// Notes that the family `report` describes now follows forks, when its fork program attached.
pub(crate) fn note_forks(cx: &LoadContext<'_>, report: &FamilyReport) {
    if report
        .tracepoints
        .iter()
        .any(|t| t.tracepoint == FORK && t.attached.is_some())
    {
        cx.shared.borrow_mut().follows_forks = true;
    }
}

/// A request-based block device: what sizes the block and NVMe maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct QueueShape {
    pub name: String,
    pub hw_queues: u32,
    pub nr_requests: u32,
    /// Its device number as the probes key it (major << 20 | minor; 0: unknown).
    pub dev: u32,
    /// (hardware queue, the IRQ that serves it) where the driver names its IRQs by queue.
    pub queue_irqs: Vec<(u32, u32)>,
    /// Whether its queue keeps request statistics (the kernel then stamps each request's issue
    /// in `io_start_time_ns`); None: nothing here says.
    pub request_stats: Option<bool>,
}

/// Whether block device `name`'s queue keeps request statistics (QUEUE_FLAG_STATS: only then
/// does the kernel stamp a request's issue). debugfs lists the queue's flags where it is
/// mounted; else writeback throttling, which turns the statistics on for its own use, shows
/// its latency target exactly while it is set up on the queue (reading it fails otherwise).
fn keeps_request_stats(name: &str) -> Option<bool> {
    if let Ok(state) = std::fs::read_to_string(format!("/sys/kernel/debug/block/{name}/state")) {
        return Some(state.trim().split('|').any(|flag| flag == "STATS"));
    }
    match std::fs::read_to_string(format!("/sys/block/{name}/queue/wbt_lat_usec")) {
        Ok(_) => Some(true),
        // The attribute exists and refuses to be read: no throttling set up, and nothing
        // else here says whether another user keeps the statistics on.
        Err(_) => None,
    }
}

/// The host facts map sizes follow, read once per session.
#[derive(Clone, Debug)]
pub(crate) struct HostShape {
    pub possible_cpus: u32,
    pub online_cpus: Vec<u32>,
    pub devices: Vec<QueueShape>,
    /// Numbered IRQ lines in /proc/interrupts.
    pub irq_lines: u32,
}

/// "0-3,6" -> [0, 1, 2, 3, 6]
pub fn parse_cpu_list(text: &str) -> Vec<u32> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    cpus.extend(a..=b);
                }
            }
            None => cpus.extend(part.parse::<u32>().ok()),
        }
    }
    cpus
}

impl HostShape {
    pub(crate) fn read() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let possible_cpus = libbpf_rs::num_possible_cpus().map_or(1, |n| n as u32);
        let mut online_cpus = parse_cpu_list(&read("/sys/devices/system/cpu/online"));
        if online_cpus.is_empty() {
            online_cpus = (0..possible_cpus).collect();
        }
        let interrupts = read("/proc/interrupts");
        let irq_names = crate::procfs::irq_names(&interrupts);
        let mut devices: Vec<QueueShape> = std::fs::read_dir("/sys/block")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let base = e.path();
                let hw_queues = std::fs::read_dir(base.join("mq")).ok()?.count() as u32;
                let nr_requests = read(&base.join("queue/nr_requests").to_string_lossy())
                    .trim()
                    .parse()
                    .unwrap_or(128);
                let dev = read(&base.join("dev").to_string_lossy())
                    .trim()
                    .split_once(':')
                    .and_then(|(major, minor)| {
                        Some((major.parse::<u32>().ok()?, minor.parse::<u32>().ok()?))
                    })
                    .map_or(0, |(major, minor)| major << 20 | minor);
                let queue_irqs = crate::procfs::driver_device(&base)
                    .map(|d| {
                        irq_names
                            .iter()
                            .filter_map(|(&irq, n)| {
                                Some((crate::procfs::queue_of_irq(&d, n)?, irq))
                            })
                            .filter(|&(q, _)| q < hw_queues)
                            .collect()
                    })
                    .unwrap_or_default();
                let request_stats = keeps_request_stats(&name);
                (hw_queues > 0).then_some(QueueShape {
                    name,
                    hw_queues,
                    nr_requests,
                    dev,
                    queue_irqs,
                    request_stats,
                })
            })
            .collect();
        devices.sort_by(|a, b| a.name.cmp(&b.name));
        let irq_lines = interrupts
            .lines()
            .filter(|l| {
                l.trim_start()
                    .split_once(':')
                    .is_some_and(|(n, _)| n.trim().parse::<u32>().is_ok())
            })
            .count() as u32;
        Self {
            possible_cpus,
            online_cpus,
            devices,
            irq_lines,
        }
    }

    /// Requests that can be in flight at once on the devices (their tag space), bounded by
    /// [`INFLIGHT_BOUNDS`].
    pub fn inflight_capacity(&self) -> u32 {
        let tags: u64 = self
            .devices
            .iter()
            .map(|d| u64::from(d.hw_queues) * u64::from(d.nr_requests))
            .sum();
        tags.clamp(*INFLIGHT_BOUNDS.start(), *INFLIGHT_BOUNDS.end()) as u32
    }

    /// Histogram keys (device, hardware queue, op, stage) the devices can produce, bounded.
    pub fn hist_keys(&self, devices: impl Fn(&QueueShape) -> bool, per_queue: u32) -> u32 {
        let queues: u64 = self
            .devices
            .iter()
            .filter(|d| devices(d))
            .map(|d| u64::from(d.hw_queues))
            .sum();
        (queues * u64::from(per_queue)).clamp(*HIST_KEY_BOUNDS.start(), *HIST_KEY_BOUNDS.end())
            as u32
    }
}

/// Entries of the in-flight request map: room for a small host's tags at least, and a bound
/// on the memory of a host with thousands of hardware queues.
pub const INFLIGHT_BOUNDS: std::ops::RangeInclusive<u64> = 4096..=65536;
/// Keys of the per-queue histogram maps, bounded the same way.
pub const HIST_KEY_BOUNDS: std::ops::RangeInclusive<u64> = 64..=16384;

/// Everything a family's load needs.
pub(crate) struct LoadContext<'h> {
    pub config: &'h ProbeConfig,
    pub kernel: &'h KernelTracepoints,
    pub symbols: &'h std::sync::Arc<Symbols>,
    pub host: &'h HostShape,
    /// The hypervisor whose paths the hypervisor families measure (none on metal).
    pub hypervisor: crate::hypervisor::Hypervisor,
    pub filter: Option<ProcessFilter>,
    /// Things a loader did on the way (e.g. mounting tracefs), for the report.
    pub notes: &'h std::cell::RefCell<Vec<String>>,
    /// Maps one family hands to a later one.
    pub shared: &'h std::cell::RefCell<SharedMaps>,
}

/// Maps shared between families' objects, filled by the family that creates them.
#[derive(Debug, Default)]
pub(crate) struct SharedMaps {
    /// The msr object's per-CPU "last sampled at" stamps, which the sampler writes.
    pub sampler_stamp: Option<std::os::fd::OwnedFd>,
    /// The irq object's `irq_entered`, which its irq_handler_entry program (attached as the
    /// kind given) stamps for the block family, loaded after it: whose own program for that
    /// tracepoint is then left out.
    pub irq_entered: Option<(std::os::fd::OwnedFd, AttachKind)>,
    /// A family's fork program attached (attach mode): the others leave theirs out.
    pub follows_forks: bool,
}

/// A loaded, attached family. Dropping it detaches its programs.
pub(crate) trait LoadedFamily {
    /// Adds this family's cumulative figures to `snap`.
    fn read(&self, snap: &mut ProbeSnapshot);
    /// Its BPF objects (run statistics, map memory).
    fn objects(&self) -> Vec<&Object>;
    /// Maps whose entry count is the possible-CPU count.
    fn cpu_sized_maps(&self) -> &'static [&'static str] {
        &[]
    }
    /// Told when virtgap's sampler starts or pauses (the sampler pauses itself; the msr family
    /// counts the host's writes apart while it is paused).
    fn sampler_running(&self, _running: bool) {}
    /// Moves the slow requests seen since the last call into `out` (the block family's).
    fn drain_slow_requests(&self, _out: &mut Vec<crate::model::SlowRequest>) {}
    /// Requests at least this long are sent as slow requests (the block family's).
    fn set_slow_request_threshold(&self, _ns: u64) {}
    /// Moves the slow calls seen since the last call into `out` (the app family's).
    fn drain_slow_calls(&self, _out: &mut Vec<crate::model::SlowCall>) {}
    /// Calls at least this long are sent as slow calls (the app family's).
    fn set_slow_call_threshold(&self, _ns: u64) {}
}

/// Stores `value` in a word of an object's mmap'd bss (a threshold user space moves while the
/// programs run).
pub(crate) fn store_bss_u64(word: *const u64, value: u64) {
    // SAFETY: `word` points into a bss map mmap'd and shared with the programs for as long as
    // the skeleton lives; an aligned 8-byte store is atomic on x86-64 and arm64, and the
    // programs only read the word.
    unsafe { std::ptr::write_volatile(word.cast_mut(), value) }
}

/// How long something that starts and pauses has run in total.
#[derive(Debug, Default)]
pub(crate) struct RunningTime {
    since: std::cell::Cell<Option<std::time::Instant>>,
    before: std::cell::Cell<Duration>,
}

impl RunningTime {
    /// Starts or pauses the clock; a repeated state changes nothing.
    pub fn set(&self, running: bool) {
        match (running, self.since.get()) {
            (true, None) => self.since.set(Some(std::time::Instant::now())),
            (false, Some(t)) => {
                self.before.set(self.before.get() + t.elapsed());
                self.since.set(None);
            }
            _ => {}
        }
    }

    pub fn total_ns(&self) -> u64 {
        let now = self.since.get().map_or(Duration::ZERO, |t| t.elapsed());
        (self.before.get() + now).as_nanos() as u64
    }
}

pub(crate) type Loaded<'obj> = Box<dyn LoadedFamily + 'obj>;
pub(crate) type LoadResult<'obj> = Result<(Loaded<'obj>, FamilyReport), FamilyReport>;

/// Storage for every family's BPF objects, on the stack of the thread that owns the session.
pub struct ProbeStorage {
    pub(crate) slots: [Slots; Family::ALL.len()],
}

impl std::fmt::Debug for ProbeStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProbeStorage")
    }
}

impl Default for ProbeStorage {
    fn default() -> Self {
        Self {
            slots: std::array::from_fn(|_| [MaybeUninit::uninit(), MaybeUninit::uninit()]),
        }
    }
}

/// How one flavour's attempt failed, before libbpf's log (which says why) is read.
enum LoadFailure {
    Open(libbpf_rs::Error),
    Load(libbpf_rs::Error),
}

/// A loaded tracepoint family: the skeleton, its links and its report.
pub(crate) type TracepointLoad<S> = (S, Vec<Link>, FamilyReport);

/// Loads a tracepoint family with tp_btf programs, or raw_tp ones if that fails, and attaches
/// each program on its own. `setup` configures the opened skeleton (read-only data, map sizes);
/// `unused` names tracepoints this configuration leaves out.
pub(crate) fn load_tracepoints<'obj, B, F>(
    family: Family,
    make: F,
    slots: &'obj mut Slots,
    kernel: &KernelTracepoints,
    unused: &dyn Fn(&str) -> bool,
    setup: &dyn Fn(&mut B::Output, AttachKind),
) -> Result<TracepointLoad<<B::Output as OpenSkel<'obj>>::Output>, FamilyReport>
where
    B: SkelBuilder<'obj>,
    F: Fn() -> B,
{
    let [first, second] = slots;
    let kinds = if kernel.has_btf() {
        [AttachKind::TpBtf, AttachKind::RawTp]
    } else {
        [AttachKind::RawTp, AttachKind::RawTp]
    };
    let mut errors: Vec<String> = Vec::new();
    for (kind, slot) in kinds.into_iter().zip([first, second]) {
        let (loaded, log) = libbpf_log::captured(|| {
            let mut open = make().open(slot).map_err(LoadFailure::Open)?;
            setup(&mut open, kind);
            let selection = Selection {
                kind,
                kernel,
                unused,
            };
            let missing = select_programs(open.open_object_mut(), &selection);
            let skel = open.load().map_err(LoadFailure::Load)?;
            Ok((skel, missing))
        });
        match loaded {
            Ok((skel, missing)) => {
                let (links, mut outcomes) = attach_each(skel.object(), kind);
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
                    fallback: (!errors.is_empty()).then(|| errors.join("; ")),
                };
                return Ok((skel, links, report));
            }
            Err(failure) => {
                // In libbpf's and the verifier's words, not just the errno.
                let text = match failure {
                    LoadFailure::Open(e) => BpfError::Open(e),
                    LoadFailure::Load(e) => BpfError::load(Some(kind), e, &log, 4),
                }
                .to_string();
                if !errors.contains(&text) {
                    errors.push(text);
                }
            }
        }
    }
    Err(FamilyReport::unavailable(
        family,
        Unavailable::Other(errors.join("; ")),
    ))
}

/// The program sections of the object `B` builds, by opening (parsing, not loading) it.
pub(crate) fn sections_of<B>() -> Result<Vec<String>, BpfError>
where
    B: for<'obj> SkelBuilder<'obj> + Default,
{
    let mut slot = MaybeUninit::uninit();
    let open = B::default().open(&mut slot).map_err(BpfError::Open)?;
    let sections = open
        .open_object()
        .progs()
        .map(|p| p.section().to_string_lossy().into_owned())
        .collect();
    Ok(sections)
}

/// Every family's program sections, by opening its embedded objects. Needs no privilege;
/// proves the objects are well formed.
pub fn object_sections() -> Result<Vec<(Family, Vec<String>)>, BpfError> {
    Family::ALL
        .into_iter()
        .map(|family| Ok((family, (family.def().sections)()?)))
        .collect()
}

/// A generated ABI value's bytes, as a map key or value.
pub(crate) fn plain_bytes<T: plain::Plain>(v: &T) -> &[u8] {
    // SAFETY: the Plain ABI types are #[repr(C)] integers with no padding (see `bpf.rs`), so
    // every byte of one is initialised.
    unsafe { plain::as_bytes(v) }
}

/// A value copied out of map bytes into a generated ABI type.
pub(crate) fn copy<T: plain::Plain + Default>(bytes: &[u8]) -> Option<T> {
    let mut v = T::default();
    plain::copy_from_bytes(&mut v, bytes).ok()?;
    Some(v)
}

/// Every CPU's copy of a per-CPU map entry (array slots take the index's bytes as key).
pub(crate) fn percpu_entry<T: plain::Plain + Default>(map: &dyn MapCore, key: &[u8]) -> Vec<T> {
    map.lookup_percpu(key, MapFlags::ANY)
        .ok()
        .flatten()
        .map(|per_cpu| per_cpu.iter().filter_map(|b| copy::<T>(b)).collect())
        .unwrap_or_default()
}

/// The sum over CPUs of a per-CPU u64 counter at `index`.
pub(crate) fn percpu_sum(map: &dyn MapCore, index: u32) -> u64 {
    percpu_entry::<u64>(map, &index.to_ne_bytes()).iter().sum()
}

/// (key, value) pairs of a shared map, copied into generated types.
pub(crate) fn entries<K, V>(map: &dyn MapCore) -> Vec<(K, V)>
where
    K: plain::Plain + Default,
    V: plain::Plain + Default,
{
    map.keys()
        .filter_map(|key| {
            let k = copy::<K>(&key)?;
            let v = copy::<V>(&map.lookup(&key, MapFlags::ANY).ok()??)?;
            Some((k, v))
        })
        .collect()
}

/// (key, sum over CPUs) of a per-CPU hash of u64 counters.
pub(crate) fn percpu_sums<K: plain::Plain + Default>(map: &dyn MapCore) -> Vec<(K, u64)> {
    map.keys()
        .filter_map(|key| {
            let total = percpu_entry::<u64>(map, &key).iter().sum();
            Some((copy::<K>(&key)?, total))
        })
        .collect()
}

/// A kernel device number (major << 20 | minor) as (major, minor).
pub(crate) fn dev_of(raw: u32) -> crate::model::DevNum {
    (raw >> 20, raw & 0xf_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_with_holes() {
        assert_eq!(parse_cpu_list("0-3,6\n"), vec![0, 1, 2, 3, 6]);
        assert_eq!(parse_cpu_list("5"), vec![5]);
        assert!(parse_cpu_list("").is_empty());
    }

    #[test]
    fn map_sizes_follow_the_devices() {
        let nvme = |queues: u32| QueueShape {
            name: "nvme0n1".into(),
            hw_queues: queues,
            nr_requests: 1023,
            dev: 259 << 20,
            queue_irqs: vec![],
            request_stats: Some(true),
        };
        let vda = QueueShape {
            name: "vda".into(),
            hw_queues: 1,
            nr_requests: 256,
            dev: 254 << 20,
            queue_irqs: vec![(0, 25)],
            request_stats: Some(true),
        };
        let host = |devices: Vec<QueueShape>| HostShape {
            possible_cpus: 72,
            online_cpus: (0..72).collect(),
            devices,
            irq_lines: 200,
        };
        // Every request the devices can have in flight has a slot, and every (queue, op,
        // stage) key of the devices asked for fits.
        let mid = host(vec![nvme(8), vda.clone()]);
        assert!(u64::from(mid.inflight_capacity()) >= 8 * 1023 + 256);
        assert!(mid.hist_keys(|_| true, 10) >= (8 + 1) * 10);
        assert!(mid.hist_keys(|d| d.name.starts_with("nvme"), 5) >= 8 * 5);
        // A host with far more tags than that is held to the bound: memory stays bounded.
        let huge = host(vec![nvme(4096), vda.clone()]);
        assert_eq!(u64::from(huge.inflight_capacity()), *INFLIGHT_BOUNDS.end());
        assert_eq!(
            u64::from(huge.hist_keys(|_| true, 10)),
            *HIST_KEY_BOUNDS.end()
        );
        assert!(huge.inflight_capacity() > mid.inflight_capacity());
        // No device known: still room for one small device's requests.
        let none = host(vec![]);
        assert!(u64::from(none.inflight_capacity()) >= 1023);
        assert!(none.hist_keys(|_| true, 10) > 0);
    }

    /// The function or tracepoint a program section names; None where user space picks the
    /// target at load time (a bare "fentry" or "kprobe"; "perf_event").
    fn attach_point(section: &str) -> Option<&str> {
        let (kind, rest) = section.split_once('/')?;
        match kind {
            "tp_btf" | "raw_tp" | "fentry" | "fexit" | "kprobe" | "kretprobe" => Some(rest),
            "tracepoint" => rest.split_once('/').map(|(_, tp)| tp),
            _ => None,
        }
    }

    #[test]
    fn every_object_opens_with_tp_btf_and_raw_tp_twins() {
        for (family, sections) in object_sections().unwrap() {
            assert!(!sections.is_empty(), "{family:?} has programs");
            for s in &sections {
                let (kind, point) = s.split_once('/').unwrap_or((s, ""));
                let twin = match kind {
                    "tp_btf" => format!("raw_tp/{point}"),
                    "raw_tp" => format!("tp_btf/{point}"),
                    // Classic tracepoints, function hooks and perf events come alone.
                    "tracepoint" | "fentry" | "fexit" | "kprobe" | "kretprobe" | "perf_event" => {
                        continue
                    }
                    _ => panic!("{family:?}: unexpected section {s}"),
                };
                assert!(sections.contains(&twin), "{family:?}: {s} has no twin");
            }
        }
    }

    /// Doctor's signal column comes from the families' definitions: an attach point without
    /// an entry there, or an entry for a point no object has, fails here.
    #[test]
    fn every_attach_point_says_what_it_gives() {
        for (family, sections) in object_sections().unwrap() {
            let points: std::collections::BTreeSet<&str> =
                sections.iter().filter_map(|s| attach_point(s)).collect();
            match family.def().signals {
                Signals::Named(named) => {
                    for point in &points {
                        assert!(
                            family.signal(point).is_some(),
                            "{family:?}: {point} has no signal in its FamilyDef"
                        );
                    }
                    for (point, _) in named {
                        assert!(
                            points.contains(point),
                            "{family:?}: a signal for {point}, which none of its objects has"
                        );
                    }
                }
                // The paravirt timer's objects name only the hard-IRQ handler tracepoints,
                // whose frames serve its one signal; the rest is known only on the host.
                Signals::Each(_) => assert!(
                    points
                        .iter()
                        .all(|p| family == Family::PvPaths && p.starts_with("irq_handler_")),
                    "{family:?}: {points:?} are named in its objects: list their signals"
                ),
            }
        }
    }

    #[test]
    fn families_are_named_once_and_parse_back() {
        for family in Family::ALL {
            assert_eq!(Family::parse(family.name()), Some(family));
            assert!(!family.def().gives.is_empty() && !family.def().view.is_empty());
        }
    }
}

/// Helpers for tests that run the real programs in the running kernel with BPF_PROG_TEST_RUN
/// (raw_tp twins take their arguments as a u64 array), without attaching them anywhere.
#[cfg(test)]
pub(crate) mod test_run {
    use libbpf_rs::{OpenObject, ProgramInput, ProgramMut};

    /// Root, or a printed skip; under CI not being root fails the test.
    pub fn bpf_allowed(what: &str) -> bool {
        virtgap_testkit::require(what, crate::bpf_permission())
    }

    /// Loads only the raw_tp twins: test runs need no attach target.
    pub fn raw_only(object: &mut OpenObject) {
        for mut p in object.progs_mut() {
            let section = p.section().to_string_lossy().into_owned();
            let name = p.name().to_string_lossy().into_owned();
            p.set_autoload(section.starts_with("raw_tp/") && !name.contains("_q_"));
        }
    }

    /// Runs `prog` once in this thread's context (the program sees this process as current).
    pub fn run(prog: &ProgramMut<'_>, args: &[u64]) {
        run_with(prog, args, 0);
    }

    /// Runs `prog` once on CPU 0, from an IPI there (per-CPU state lands in CPU 0's slot; the
    /// current task is whatever CPU 0 was running).
    pub fn run_on_cpu0(prog: &ProgramMut<'_>, args: &[u64]) {
        run_with(prog, args, libbpf_rs::libbpf_sys::BPF_F_TEST_RUN_ON_CPU);
    }

    fn run_with(prog: &ProgramMut<'_>, args: &[u64], flags: u32) {
        let mut ctx: Vec<u8> = args.iter().flat_map(|a| a.to_ne_bytes()).collect();
        let input = ProgramInput {
            context_in: Some(&mut ctx),
            cpu: 0,
            flags,
            ..Default::default()
        };
        prog.test_run(input).expect("BPF_PROG_TEST_RUN");
    }

    /// CLOCK_MONOTONIC in ns: bpf_ktime_get_ns's clock.
    pub use virtgap_workloads::slow::monotonic_ns as now_ns;
}
