//! MSR accesses by CPU and MSR (`bpf/msr.bpf.c`).

use libbpf_rs::skel::Skel;
use std::os::fd::AsFd;

use libbpf_rs::{Link, MapCore, Object};

use super::{
    copy, load_tracepoints, percpu_entry, sections_of, FamilyDef, LoadContext, LoadResult,
    LoadedFamily, Signals, Slots,
};
use crate::bpf::msr::{types, MsrSkel, MsrSkelBuilder};
use crate::model::{IcrSends, MsrCount, MsrSnapshot, ProbeSnapshot};
use crate::report::Family;

pub(super) const FAMILY: FamilyDef = FamilyDef {
    name: "msr",
    gives: "exit-causing MSR writes",
    view: "Hypervisor: MSR writes",
    signals: Signals::Named(&[
        ("write_msr", "exit-causing MSR writes by MSR"),
        ("read_msr", "MSR reads by MSR"),
        (SAMPLER_TIMER, "the sampler's own writes, set apart"),
        (
            IPI_SEND,
            "IPIs to one CPU timed to their ICR write's return",
        ),
        ("ipi_send_cpumask", "IPIs to a mask left untimed"),
    ]),
    modules: &[],
    load,
    sections: sections_of::<MsrSkelBuilder>,
};

/// Where the sampler's timer expires: writes right after it are the sampler's own.
const SAMPLER_TIMER: &str = "hrtimer_expire_entry";

/// Where an IPI to one CPU is sent (6.4+): its ICR write's return ends the send's time.
const IPI_SEND: &str = "ipi_send_cpu";

struct MsrProbe<'obj> {
    skel: MsrSkel<'obj>,
    _links: Vec<Link>,
    /// The hypervisor this guest runs on (none on metal): which writes exit.
    hypervisor: crate::hypervisor::Hypervisor,
    /// How long virtgap's sampler has run while this probe counted.
    sampler_ran: super::RunningTime,
    /// Whether IPIs to one CPU are timed (the kernel has `ipi:ipi_send_cpu`).
    times_icr_sends: bool,
}

fn load<'obj>(cx: &LoadContext<'_>, slots: &'obj mut Slots) -> LoadResult<'obj> {
    let hypervisor = cx.hypervisor;
    // The sampler's timer callback: its expiries stamp the sampler's writes even where the
    // kernel delivers no sample. Without the sampler the timer is someone else's.
    let sampler_timer_fn = if cx.config.families.contains(&Family::Sampler) {
        cx.symbols.address("perf_swevent_hrtimer").unwrap_or(0)
    } else {
        0
    };
    let (skel, links, report) = load_tracepoints(
        Family::Msr,
        MsrSkelBuilder::default,
        slots,
        cx.kernel,
        &|tracepoint| tracepoint == SAMPLER_TIMER && sampler_timer_fn == 0,
        &|open: &mut crate::bpf::msr::OpenMsrSkel<'_>, _| {
            if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
                ro.sampler_timer_fn = sampler_timer_fn;
            }
        },
    )?;
    // The sampler stamps this map so the writes its own interrupts cause are counted apart.
    if let Ok(fd) = skel.maps.sampler_stamp.as_fd().try_clone_to_owned() {
        cx.shared.borrow_mut().sampler_stamp = Some(fd);
    }
    let times_icr_sends = report
        .tracepoints
        .iter()
        .any(|t| t.tracepoint == IPI_SEND && t.attached.is_some());
    let probe = MsrProbe {
        skel,
        _links: links,
        hypervisor,
        sampler_ran: super::RunningTime::default(),
        times_icr_sends,
    };
    Ok((Box::new(probe), report))
}

impl LoadedFamily for MsrProbe<'_> {
    fn read(&self, snap: &mut ProbeSnapshot) {
        let map = &self.skel.maps.msrs;
        let mut counts = Vec::new();
        for key in map.keys() {
            let Some(k) = copy::<types::vg_msr_key>(&key) else {
                continue;
            };
            for (cpu, n) in percpu_entry::<u64>(map, &key).into_iter().enumerate() {
                if n > 0 {
                    let write = k.access != types::vg_msr_access::VG_MSR_READ.0;
                    counts.push(MsrCount {
                        cpu: cpu as u32,
                        msr: k.msr,
                        write,
                        by_sampler: k.access == types::vg_msr_access::VG_MSR_WRITE_BY_SAMPLER.0,
                        while_sampling: k.access
                            == types::vg_msr_access::VG_MSR_WRITE_WHILE_SAMPLING.0,
                        exits: write && crate::virt::msr_exits(self.hypervisor, k.msr),
                        count: n,
                    });
                }
            }
        }
        counts.sort_by_key(|c| (c.cpu, c.msr, c.write, c.by_sampler, c.while_sampling));
        let icr_sends = self.times_icr_sends.then(|| {
            let per_cpu =
                percpu_entry::<types::vg_icr_sends>(&self.skel.maps.icr_sends, &0u32.to_ne_bytes());
            IcrSends {
                sends: per_cpu.iter().map(|c| c.sends).sum(),
                ns: per_cpu.iter().map(|c| c.ns).sum(),
                unpaired: per_cpu.iter().map(|c| c.unpaired).sum(),
            }
        });
        snap.msr = Some(MsrSnapshot {
            counts,
            sampler_ns: self.sampler_ran.total_ns(),
            icr_sends,
        });
    }

    fn sampler_running(&self, running: bool) {
        let Some(bss) = self.skel.maps.bss_data.as_deref() else {
            return;
        };
        // SAFETY: the bss map is mmap'd and shared with the programs; a 4-byte aligned store is
        // atomic on every architecture BPF runs on, and the programs only read this word.
        unsafe {
            let p = std::ptr::addr_of!(bss.sampler_running).cast_mut();
            std::ptr::write_volatile(p, u32::from(running));
        }
        self.sampler_ran.set(running);
    }

    fn objects(&self) -> Vec<&Object> {
        vec![self.skel.object()]
    }
}
