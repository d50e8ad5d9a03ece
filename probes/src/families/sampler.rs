//! The hypervisor sampler (`bpf/sampler.bpf.c`): one cpu-clock perf event per online CPU, each
//! counting where its samples landed. The two sample maps are flipped and drained every read,
//! and the counts accumulate here, resolved to symbols, so the kernel side never fills up.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::os::fd::AsFd;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, Object};
use std::sync::Arc;

use super::{
    copy, percpu_sum, sections_of, FamilyDef, LoadContext, LoadResult, LoadedFamily, Signals, Slots,
};
use crate::attach::{AttachKind, AttachOutcome};
use crate::bpf::sampler::{types, SamplerSkel, SamplerSkelBuilder};
use crate::error::{BpfError, Unavailable};
use crate::libbpf_log;
use crate::model::{CpuSamples, ProbeSnapshot, SamplerSnapshot};
use crate::report::{Family, FamilyReport};
use crate::virt::Symbols;

pub(super) const FAMILY: FamilyDef = FamilyDef {
    name: "sampler",
    gives: "where each CPU's time goes (sampled)",
    view: "Hypervisor: sampled CPU split",
    // One cpu-clock event per online CPU, named for its rate and CPU.
    signals: Signals::Each("sampled kernel IPs per CPU"),
    modules: &[],
    load,
    sections: sections_of::<SamplerSkelBuilder>,
};

/// The sampling period at `hz`, in ns of CPU clock.
fn period_ns(hz: u64) -> u64 {
    1_000_000_000 / hz.max(1)
}

/// Opens a cpu-clock sampling event on `cpu`, one sample every `period_ns(hz)` (a fixed period
/// rather than perf's adaptive frequency: the cost per second is then known in advance).
fn open_cpu_clock(cpu: u32, hz: u64) -> Result<i32, BpfError> {
    use libbpf_rs::libbpf_sys as sys;
    let mut attr = sys::perf_event_attr {
        type_: sys::PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<sys::perf_event_attr>() as u32,
        config: u64::from(sys::PERF_COUNT_SW_CPU_CLOCK),
        ..Default::default()
    };
    attr.__bindgen_anon_1.sample_period = period_ns(hz);
    // Enabled when the session starts its clock (`sampler_running`), so the time the samples
    // cover is the session's.
    attr.set_disabled(1);
    // SAFETY: perf_event_open with a fully initialised attr; pid -1 and a CPU number means
    // "every task on that CPU". A non-negative result is a new fd we own.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const sys::perf_event_attr,
            -1,
            cpu as libc::c_int,
            -1,
            sys::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(BpfError::PerfEventOpen(std::io::Error::last_os_error()));
    }
    Ok(fd as i32)
}

/// `PERF_EVENT_IOC_ENABLE` / `_DISABLE` (`_IO('$', 0)` and `_IO('$', 1)` in
/// linux/perf_event.h; neither libc nor libbpf-sys exports them).
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;

struct SamplerProbe<'obj> {
    skel: SamplerSkel<'obj>,
    _links: Vec<Link>,
    /// The attached events' fds (each link owns and closes its own): paused and resumed here.
    events: Vec<i32>,
    /// How long the events have been enabled.
    ran: super::RunningTime,
    hz: u64,
    symbols: Arc<Symbols>,
    /// What the samples are sorted for: the hypervisor's interface (none on metal).
    hypervisor: crate::hypervisor::Hypervisor,
    /// Samples drained so far, per CPU (each CPU's rare symbols folded by category).
    drained: RefCell<BTreeMap<u32, CpuSamples>>,
}

fn load<'obj>(cx: &LoadContext<'_>, slots: &'obj mut Slots) -> LoadResult<'obj> {
    let fail = |why: String| FamilyReport::unavailable(Family::Sampler, Unavailable::Other(why));
    let hz = cx.config.sample_hz;
    // At most one key per sample between two reads.
    let per_interval =
        cx.host.online_cpus.len() as f64 * hz as f64 * cx.config.interval.as_secs_f64() * 1.25;
    let keys = (per_interval as u64).clamp(4096, 262_144) as u32;
    let (loaded, log) = libbpf_log::captured(|| {
        let mut open = SamplerSkelBuilder::default()
            .open(&mut slots[0])
            .map_err(BpfError::Open)?;
        let _ = open.maps.samples_first.set_max_entries(keys);
        let _ = open.maps.samples_second.set_max_entries(keys);
        // Where the notify accessors are, so a sample in one keeps its caller.
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            let ranges = crate::hypervisor::NOTIFY_ACCESSORS
                .iter()
                .filter_map(|name| cx.symbols.range(name));
            for (i, (lo, hi)) in ranges.take(ro.notify_lo.len()).enumerate() {
                ro.notify_lo[i] = lo;
                ro.notify_hi[i] = hi;
            }
        }
        // The msr object counts the writes this sampler's interrupts cause apart.
        if let Some(fd) = &cx.shared.borrow().sampler_stamp {
            open.maps
                .sampler_stamp
                .reuse_fd(fd.as_fd())
                .map_err(|source| BpfError::Share {
                    map: "sampler_stamp",
                    owner: "msr",
                    source,
                })?;
        }
        open.load().map_err(|source| BpfError::Load {
            kind: None,
            source,
            why: None,
        })
    });
    // libbpf's log says why, whichever step failed.
    let skel = loaded.map_err(|e| match libbpf_log::why(&log, 4) {
        Some(why) => fail(format!("{e}: {why}")),
        None => fail(e.to_string()),
    })?;
    let mut links = Vec::new();
    let mut events = Vec::new();
    let mut outcomes = Vec::new();
    for &cpu in &cx.host.online_cpus {
        let name = format!("cpu-clock@{hz}Hz cpu{cpu}");
        let result = open_cpu_clock(cpu, hz).and_then(|fd| {
            skel.progs
                .sample
                .attach_perf_event(fd)
                .map(|link| (fd, link))
                .map_err(BpfError::Attach)
        });
        match result {
            Ok((fd, link)) => {
                links.push(link);
                events.push(fd);
                outcomes.push(AttachOutcome {
                    tracepoint: name,
                    attached: Some(AttachKind::PerfEvent),
                    reason: None,
                });
            }
            Err(why) => outcomes.push(AttachOutcome {
                tracepoint: name,
                attached: None,
                reason: Some(why.to_string()),
            }),
        }
    }
    if outcomes.iter().all(|o| o.attached.is_none()) {
        let why = outcomes
            .first()
            .and_then(|o| o.reason.clone())
            .unwrap_or_else(|| "no CPU online".into());
        return Err(fail(why));
    }
    let ran = super::RunningTime::default();
    let probe = SamplerProbe {
        skel,
        _links: links,
        events,
        ran,
        hz,
        symbols: Arc::clone(cx.symbols),
        hypervisor: cx.hypervisor,
        drained: RefCell::new(BTreeMap::new()),
    };
    let report = FamilyReport {
        family: Family::Sampler,
        unavailable: None,
        tracepoints: outcomes,
        fallback: None,
    };
    Ok((Box::new(probe), report))
}

impl SamplerProbe<'_> {
    /// Points the program at the other map, then empties the one it was filling into `drained`.
    /// A sample racing with the flip may land in the map being emptied after its key was read;
    /// it is then counted at the next read.
    fn flip_and_drain(&self) {
        let Some(bss) = self.skel.maps.bss_data.as_deref() else {
            return;
        };
        let filled_second = bss.fill_second != 0;
        // SAFETY: the bss map is mmap'd and shared with the program; a 4-byte aligned store is
        // atomic on every architecture BPF runs on, and the program only reads this word.
        unsafe {
            let p = std::ptr::addr_of!(bss.fill_second).cast_mut();
            std::ptr::write_volatile(p, u32::from(!filled_second));
        }
        let map = if filled_second {
            &self.skel.maps.samples_second
        } else {
            &self.skel.maps.samples_first
        };
        let mut drained = self.drained.borrow_mut();
        for key in map.keys() {
            let (Some(k), Ok(Some(v))) = (
                copy::<types::vg_sample_key>(&key),
                map.lookup(&key, MapFlags::ANY),
            ) else {
                continue;
            };
            let _ = map.delete(&key);
            let Ok(raw) = <[u8; 8]>::try_from(&v[..]) else {
                continue;
            };
            let n = u64::from_ne_bytes(raw);
            let c = drained.entry(k.cpu).or_insert_with(|| CpuSamples {
                cpu: k.cpu,
                ..Default::default()
            });
            if k.user != 0 {
                c.user += n;
            } else {
                let sym = self.symbols.resolve(k.ip).unwrap_or("[unknown]");
                let caller = (k.caller != 0)
                    .then(|| self.symbols.resolve(k.caller))
                    .flatten();
                let key = crate::hypervisor::sample_symbol(sym, caller);
                *c.kernel.entry(key).or_insert(0) += n;
            }
        }
        for c in drained.values_mut() {
            c.fold(self.hypervisor);
        }
    }
}

impl LoadedFamily for SamplerProbe<'_> {
    fn read(&self, snap: &mut ProbeSnapshot) {
        self.flip_and_drain();
        snap.sampler = Some(SamplerSnapshot {
            frequency_hz: self.hz,
            cpus: self.drained.borrow().values().cloned().collect(),
            dropped: percpu_sum(&self.skel.maps.dropped, 0),
            sampled_ns: self.ran.total_ns(),
            hypervisor: self.hypervisor,
        });
    }

    fn sampler_running(&self, running: bool) {
        let request = if running {
            PERF_EVENT_IOC_ENABLE
        } else {
            PERF_EVENT_IOC_DISABLE
        };
        for &fd in &self.events {
            // SAFETY: `fd` is a perf event fd kept open by its link for as long as `self`
            // lives; these two ioctls take no argument. A failure leaves the event as it was.
            unsafe {
                libc::ioctl(fd, request, 0);
            }
        }
        self.ran.set(running);
    }

    fn objects(&self) -> Vec<&Object> {
        vec![self.skel.object()]
    }
}
