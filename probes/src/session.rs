//! A probe session: loads the probe families (one BPF object each, so a family that cannot
//! load fails alone) by walking the family table, reports what attached and how, and reads
//! their maps into plain snapshots. The session borrows caller-provided storage for the BPF
//! objects, so it lives on the stack of the thread that owns it (the collector).

use std::cell::RefCell;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use libbpf_rs::{MapCore, Object};

use crate::attach::KernelTracepoints;
use crate::error::{BpfError, NoPermission, Unavailable};
use crate::families::{
    HostShape, LoadContext, Loaded, ProbeConfig, ProbeStorage, ProcessFilter, SharedMaps,
};
use crate::model::{ProbeSnapshot, ProgramStats};
use crate::report::{CapabilityReport, Family, FamilyReport};
use crate::{libbpf_log, memory, procfs};

/// Set to a hypervisor's name ("xen", "kvm", "hyperv"), the hypervisor probes load as in a guest
/// of it, where the config does not say: for the VM tier, whose TCG guests are no hypervisor's.
const HYPERVISOR_VAR: &str = "VIRTGAP_HYPERVISOR";

/// Loaded and attached probes.
pub struct ProbeSession<'a> {
    families: Vec<(Family, Loaded<'a>)>,
    /// Attach mode: the tgids the families follow, shared by every object (declared after
    /// `families`, so it closes after the objects that reuse it).
    followed: Option<libbpf_rs::MapHandle>,
    /// What attach mode follows, for the refresh.
    follow: Option<crate::follow::AttachTarget>,
    /// The followed set was filled from the target once.
    seeded: std::cell::Cell<bool>,
    run_stats: RefCell<RunStats>,
    started: Instant,
    /// /proc/stat at load time: snapshots count from here, like the BPF maps.
    base_cpu_times: Vec<procfs::CpuTimes>,
    pub report: CapabilityReport,
}

impl std::fmt::Debug for ProbeSession<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeSession")
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

impl<'a> ProbeSession<'a> {
    /// Loads and attaches the configured families. Never fails as a whole: what cannot attach
    /// is in `report`, with its reason.
    pub fn load(storage: &'a mut ProbeStorage, config: &ProbeConfig) -> Self {
        // libbpf's messages are captured per load and quoted in the report, never printed.
        libbpf_log::install();
        let mut report = CapabilityReport::default();
        let permission = crate::bpf_permission();
        let run_stats = RefCell::new(RunStats::turned_on(&permission, &mut report));
        let traced: Vec<_> = Family::ALL
            .iter()
            .flat_map(|f| f.def().modules)
            .copied()
            .collect();
        let kernel = KernelTracepoints::load(&traced);
        // Read once: the irq probe, the sampler and the paravirt timers all need it.
        let symbols = Arc::new(crate::virt::Symbols::load());
        let host = HostShape::read();
        let hypervisor = hypervisor_of(config);
        let followed = config.follow.as_ref().map(|_| followed_map());
        let filter = match &followed {
            Some(Ok(map)) => Some(ProcessFilter::following(map.as_fd().as_raw_fd())),
            _ => config.filter_tgid.map(ProcessFilter::of),
        };
        // Without its map attach mode would count every process: nothing loads then.
        let followed_failed = match (&followed, &permission) {
            (Some(Err(e)), Ok(())) => Some(format!("the map of followed processes: {e}")),
            _ => None,
        };
        let followed = followed.and_then(Result::ok);
        let notes = RefCell::new(Vec::new());
        let shared = RefCell::new(SharedMaps::default());
        let cx = LoadContext {
            config,
            kernel: &kernel,
            symbols: &symbols,
            host: &host,
            hypervisor,
            filter,
            notes: &notes,
            shared: &shared,
        };
        let refusal = (permission, followed_failed.as_deref());
        let mut families = load_families(&cx, storage, refusal, &mut report);
        report.families.sort_by_key(|r| r.family);
        families.sort_by_key(|(family, _)| *family);
        report.notes = notes.into_inner();
        report.maps = families
            .iter()
            .flat_map(|(family, f)| {
                f.objects()
                    .into_iter()
                    .flat_map(|o| memory::object_maps(*family, o, f.cpu_sized_maps()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let started = Instant::now();
        run_stats.borrow_mut().since = started;
        let session = Self {
            families,
            followed,
            follow: config.follow.clone(),
            seeded: std::cell::Cell::new(false),
            run_stats,
            started,
            base_cpu_times: procfs::read_cpu_times(),
            report,
        };
        // The sampler's events open disabled: they start with the session's clock, and the
        // others learn it runs.
        if session.families.iter().any(|(f, _)| *f == Family::Sampler) {
            session.set_sampler_running(true);
        }
        // Attach mode starts with what the target names now.
        session.refresh_followed();
        session
    }

    /// Whether the sampler pauses for part of each interval: it does when the msr probe counts
    /// alongside it, whose host figures come from the pauses.
    pub fn sampler_pauses(&self) -> bool {
        let has = |f: Family| self.families.iter().any(|(family, _)| *family == f);
        has(Family::Sampler) && has(Family::Msr)
    }

    /// Attach mode: adds processes (tgids as this process sees them, in the initial pid
    /// namespace) to the followed set; their children started from now on join by themselves.
    /// Returns how many were new. Without attach mode nothing is followed this way: 0.
    pub fn follow(&self, tgids: &[u32]) -> usize {
        let Some(map) = &self.followed else {
            return 0;
        };
        tgids
            .iter()
            .filter(|t| {
                let key = t.to_ne_bytes();
                map.update(&key, &[1], libbpf_rs::MapFlags::NO_EXIST)
                    .is_ok()
            })
            .count()
    }

    /// Attach mode: stops following these processes (gone, or no longer in the cgroup).
    pub fn unfollow(&self, tgids: &[u32]) {
        if let Some(map) = &self.followed {
            for t in tgids {
                let _ = map.delete(&t.to_ne_bytes());
            }
        }
    }

    /// Attach mode: follows what the target names now and lets go of processes that are gone
    /// (a refresh each interval: a process that joined the cgroup or took the name since, or a
    /// child of a followed one that forked before the probes attached).
    pub fn refresh_followed(&self) {
        let Some(target) = &self.follow else {
            return;
        };
        let root = std::path::Path::new("/");
        // Named pids have no newcomers: their children join at the fork, in the kernel, and
        // the ones they had before the probes attached were taken with them at load.
        if !self.seeded.get() || !matches!(target, crate::follow::AttachTarget::Pids(_)) {
            self.follow(&target.current(root));
            self.seeded.set(true);
        }
        let gone: Vec<u32> = self
            .followed()
            .into_iter()
            .filter(|&t| !crate::follow::alive(root, t))
            .collect();
        self.unfollow(&gone);
    }

    /// Attach mode: the processes followed now, those added here and the children that joined
    /// at their fork, sorted.
    pub fn followed(&self) -> Vec<u32> {
        let Some(map) = &self.followed else {
            return Vec::new();
        };
        let mut tgids: Vec<u32> = map
            .keys()
            .filter_map(|k| Some(u32::from_ne_bytes(k.as_slice().try_into().ok()?)))
            .collect();
        tgids.sort_unstable();
        tgids
    }

    /// The slow requests the block probe saw since the last call (for the tail autopsy).
    pub fn drain_slow_requests(&self) -> Vec<crate::model::SlowRequest> {
        let mut out = Vec::new();
        for (_, f) in &self.families {
            f.drain_slow_requests(&mut out);
        }
        out
    }

    /// Requests at least `ns` long from start to completion are kept as slow requests.
    pub fn set_slow_request_threshold(&self, ns: u64) {
        for (_, f) in &self.families {
            f.set_slow_request_threshold(ns);
        }
    }

    /// The slow calls the app probe saw since the last call (the attached tail autopsy).
    pub fn drain_slow_calls(&self) -> Vec<crate::model::SlowCall> {
        let mut out = Vec::new();
        for (_, f) in &self.families {
            f.drain_slow_calls(&mut out);
        }
        out
    }

    /// Calls and io_uring requests at least `ns` long are kept as slow calls.
    pub fn set_slow_call_threshold(&self, ns: u64) {
        for (_, f) in &self.families {
            f.set_slow_call_threshold(ns);
        }
    }

    /// Starts or pauses the sampler. Pausing stops it first and then tells the others, starting
    /// tells them first, so no write it causes is counted as the host's.
    pub fn set_sampler_running(&self, running: bool) {
        let (sampler, others): (Vec<_>, Vec<_>) = self
            .families
            .iter()
            .partition(|(family, _)| *family == Family::Sampler);
        let order = if running {
            others.iter().chain(&sampler)
        } else {
            sampler.iter().chain(&others)
        };
        for (_, f) in order {
            f.sampler_running(running);
        }
    }

    /// Reads every map into a cumulative snapshot.
    pub fn snapshot(&self) -> ProbeSnapshot {
        let now = Instant::now();
        let mut snap = ProbeSnapshot {
            elapsed_ns: now.duration_since(self.started).as_nanos() as u64,
            cpu_times: procfs::read_cpu_times()
                .into_iter()
                .map(|t| {
                    self.base_cpu_times
                        .iter()
                        .find(|b| b.cpu == t.cpu)
                        .map_or(t, |b| t.since(b))
                })
                .collect(),
            followed: self.follow.is_some().then(|| self.followed()),
            ..ProbeSnapshot::default()
        };
        for (_, f) in &self.families {
            f.read(&mut snap);
        }
        let mut stats = self.run_stats.borrow_mut();
        if stats.available {
            snap.programs = self.program_stats();
        }
        let runs = snap.programs.iter().map(|p| p.run_count).sum();
        snap.stats_on_ns = stats.account(now, runs);
        snap
    }

    /// Turns the kernel's run statistics on or off from now (where they could be turned on at
    /// load). They cost two clock reads at every run of every BPF program on the host (here
    /// ~70 ns a run, as much as one of our programs), so the collector keeps them on for a
    /// share of the intervals; snapshots say for how long they were on (`stats_on_ns`), over
    /// which the programs' runs and run time were counted.
    pub fn set_run_stats(&self, on: bool) {
        let mut stats = self.run_stats.borrow_mut();
        if !stats.available || on == stats.fd.is_some() {
            return;
        }
        stats.fd = if on { enable_run_stats().ok() } else { None };
        if !on {
            // Runs between the last snapshot and now were counted: they must not make the next
            // snapshot take the switch for another holder's.
            stats.runs = self.program_stats().iter().map(|p| p.run_count).sum();
        }
    }

    /// Every loaded program's run statistics, family by family.
    fn program_stats(&self) -> Vec<ProgramStats> {
        self.families
            .iter()
            .flat_map(|(family, f)| {
                f.objects()
                    .into_iter()
                    .flat_map(|o| program_stats(family.name(), o))
            })
            .collect()
    }
}

/// The hypervisor whose paths the hypervisor families measure: the config's, else the one
/// `VIRTGAP_HYPERVISOR` names, else the one this host runs under (none on metal).
fn hypervisor_of(config: &ProbeConfig) -> crate::hypervisor::Hypervisor {
    config
        .hypervisor
        .or_else(|| {
            std::env::var(HYPERVISOR_VAR)
                .ok()
                .map(|name| crate::hypervisor::Hypervisor::of_name(&name))
        })
        .unwrap_or_else(|| crate::virt::detect_hypervisor(std::path::Path::new("/")).hypervisor)
}

/// Loads each configured family into its slots of `storage`, its report in `report` (in load
/// order). None loads when `refusal` says why: without permission, or without the map of
/// followed processes.
fn load_families<'a>(
    cx: &LoadContext<'_>,
    storage: &'a mut ProbeStorage,
    (permission, followed_failed): (Result<(), NoPermission>, Option<&str>),
    report: &mut CapabilityReport,
) -> Vec<(Family, Loaded<'a>)> {
    let mut families = Vec::new();
    // The irq family loads first: its interrupt-entry program also stamps the block
    // family's IRQ entries (SharedMaps::irq_entered). Reports keep Family::ALL's order.
    let mut order: Vec<_> = Family::ALL
        .into_iter()
        .zip(storage.slots.iter_mut())
        .collect();
    order.sort_by_key(|(family, _)| *family != Family::Irq);
    for (family, slots) in order {
        if !cx.config.families.contains(&family) {
            continue;
        }
        if let Err(why) = permission {
            report.families.push(FamilyReport::unavailable(
                family,
                Unavailable::NoPermission(why),
            ));
            continue;
        }
        if let Some(why) = followed_failed {
            report.families.push(FamilyReport::unavailable(
                family,
                Unavailable::Other(why.to_owned()),
            ));
            continue;
        }
        match (family.def().load)(cx, slots) {
            Ok((loaded, r)) => {
                report.families.push(r);
                families.push((family, loaded));
            }
            Err(r) => report.families.push(r),
        }
    }
    families
}

/// The kernel's run statistics as this session holds them, and for how long they were on.
struct RunStats {
    /// They could be turned on at load (else no program statistics are read).
    available: bool,
    /// Held while on: the kernel's switch stays on while any holder's fd lives.
    fd: Option<OwnedFd>,
    /// Time they were on, up to `since`.
    on_ns: u64,
    since: Instant,
    /// Our programs' runs as counted at `since`.
    runs: u64,
}

impl RunStats {
    /// The statistics, turned on where this process may (else the report says why not).
    fn turned_on(permission: &Result<(), NoPermission>, report: &mut CapabilityReport) -> Self {
        let stats_fd = match permission {
            Ok(()) => enable_run_stats()
                .map_err(|e| report.run_stats_unavailable = Some(e.to_string()))
                .ok(),
            Err(e) => {
                report.run_stats_unavailable = Some(e.to_string());
                None
            }
        };
        Self {
            available: stats_fd.is_some(),
            fd: stats_fd,
            on_ns: 0,
            since: Instant::now(),
            runs: 0,
        }
    }

    /// The time they were on up to `now`, given our programs' runs then. A span counts as on when
    /// this session held them, or when the runs were counted anyway (another tool holds them
    /// on: the kernel's switch is one for the host).
    fn account(&mut self, now: Instant, runs: u64) -> u64 {
        if self.fd.is_some() || runs > self.runs {
            self.on_ns += now.duration_since(self.since).as_nanos() as u64;
        }
        self.since = now;
        self.runs = runs;
        self.on_ns
    }
}

/// Holds kernel BPF run-time statistics on while the fd lives. The switch is the kernel's, for
/// every BPF program on the host (two clock reads a run), and goes off with the last holder.
fn enable_run_stats() -> Result<OwnedFd, BpfError> {
    // SAFETY: plain syscall wrapper; a non-negative return is a new fd we own.
    let fd = unsafe {
        libbpf_rs::libbpf_sys::bpf_enable_stats(libbpf_rs::libbpf_sys::BPF_STATS_RUN_TIME)
    };
    if fd < 0 {
        return Err(BpfError::EnableStats(std::io::Error::from_raw_os_error(
            -fd,
        )));
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
                missed: info.recursion_misses,
            })
        })
        .collect()
}

/// The followed-process map of attach mode, which every object's `followed` reuses: created
/// here, not by one family, so it exists whichever families load.
fn followed_map() -> Result<libbpf_rs::MapHandle, libbpf_rs::Error> {
    let opts = libbpf_rs::libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_create_opts>() as _,
        map_flags: libbpf_rs::libbpf_sys::BPF_F_NO_PREALLOC,
        ..Default::default()
    };
    libbpf_rs::MapHandle::create(
        libbpf_rs::MapType::Hash,
        Some("followed"),
        4,
        1,
        crate::bpf::hist_check::types::vg_limits::VG_MAX_FOLLOWED.0,
        &opts,
    )
}

#[cfg(test)]
mod tests {
    use crate::hist::KernelHist;
    use crate::model::*;

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
