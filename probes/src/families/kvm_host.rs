//! Host-side KVM (`bpf/kvm.bpf.c`), for when virtgap runs on a hypervisor: exit -> entry time by
//! exit reason, and port I/O, MMIO, MSR and hypercall exits per VMM process. KVM is usually a
//! module; its tracepoints and types come from its module BTF. Every VMM is counted unless the
//! user names one (`--vmm-pid`).

use libbpf_rs::skel::Skel;
use libbpf_rs::{Link, Object};

use super::{
    apply_filter, entries, load_tracepoints, sections_of, FamilyDef, LoadContext, LoadResult,
    LoadedFamily, ProcessFilter, Signals, Slots,
};
use crate::attach::TracedModule;
use crate::bpf::kvm::{types, KvmSkel, KvmSkelBuilder};
use crate::error::{Absent, Unavailable};
use crate::hist::KernelHist;
use crate::model::{ExitHist, KvmEventCount, KvmSnapshot, ProbeSnapshot};
use crate::report::{Family, FamilyReport};

pub(super) const FAMILY: FamilyDef = FamilyDef {
    name: "kvm-host",
    gives: "host-side KVM exits",
    view: "Hypervisor: host-side exits",
    signals: Signals::Named(&[
        ("kvm_exit", "host: exit -> entry time by reason"),
        ("kvm_entry", "host: exit -> entry time by reason"),
        ("kvm_pio", "host: port I/O exits per VM"),
        ("kvm_mmio", "host: MMIO exits per VM"),
        ("kvm_msr", "host: MSR exits per VM"),
        ("kvm_hypercall", "host: hypercalls per VM"),
    ]),
    modules: &[KVM],
    load,
    sections: sections_of::<KvmSkelBuilder>,
};

/// KVM's module, whose BTF has its tracepoints' types (KVM may also be built in).
const KVM: TracedModule = TracedModule {
    name: "kvm",
    prefix: "kvm_",
    system: "kvm",
};

const EVENTS: [(types::vg_kvm_event, &str); 5] = [
    (types::vg_kvm_event::VG_KVM_PIO, "pio"),
    (types::vg_kvm_event::VG_KVM_MMIO, "mmio"),
    (types::vg_kvm_event::VG_KVM_MSR, "msr"),
    (types::vg_kvm_event::VG_KVM_HYPERCALL, "hypercall"),
    (types::vg_kvm_event::VG_KVM_EXIT, "exit"),
];

struct KvmProbe<'obj> {
    skel: KvmSkel<'obj>,
    _links: Vec<Link>,
}

fn load<'obj>(cx: &LoadContext<'_>, slots: &'obj mut Slots) -> LoadResult<'obj> {
    let builtin = cx.kernel.in_vmlinux("kvm_exit");
    if !builtin && !KVM.loaded() {
        return Err(FamilyReport::unavailable(
            Family::KvmHost,
            Unavailable::NothingToWatch(Absent::KvmHost),
        ));
    }
    if !builtin && !cx.kernel.has_module_btf(KVM.name) {
        return Err(FamilyReport::unavailable(
            Family::KvmHost,
            Unavailable::Other("the kvm module has no BTF on this kernel (module BTF came in Linux 5.11): its tracepoint layouts are unknown".into()),
        ));
    }
    // kvm_exit/kvm_entry are classic tracepoints, which need tracefs.
    if let Some(note) = crate::attach::ensure_tracefs() {
        cx.notes.borrow_mut().push(note);
    }
    let filter = cx.config.vmm_pid.map(ProcessFilter::of);
    let setup = |open: &mut crate::bpf::kvm::OpenKvmSkel<'_>, _kind| {
        apply_filter!(open, filter);
    };
    let (skel, links, report) = load_tracepoints(
        Family::KvmHost,
        KvmSkelBuilder::default,
        slots,
        cx.kernel,
        &|_| false,
        &setup,
    )?;
    Ok((
        Box::new(KvmProbe {
            skel,
            _links: links,
        }),
        report,
    ))
}

impl LoadedFamily for KvmProbe<'_> {
    fn read(&self, snap: &mut ProbeSnapshot) {
        let maps = &self.skel.maps;
        let mut kvm = KvmSnapshot::default();
        for (k, count) in entries::<types::vg_kvm_key, u64>(&maps.events) {
            let event = EVENTS
                .iter()
                .find(|(e, _)| e.0 == k.event)
                .map_or("other", |(_, n)| n);
            kvm.events.push(KvmEventCount {
                tgid: k.tgid,
                event: event.to_string(),
                count,
            });
        }
        kvm.events
            .sort_by(|a, b| (a.tgid, &a.event).cmp(&(b.tgid, &b.event)));
        for (k, h) in entries::<types::vg_exit_key, types::vg_hist>(&maps.exits) {
            kvm.exits.push(ExitHist {
                isa: k.isa,
                reason: k.reason,
                name: crate::virt::exit_reason_name(k.isa, k.reason),
                hist: KernelHist::from(&h),
            });
        }
        kvm.exits.sort_by_key(|x| (x.isa, x.reason));
        snap.kvm = Some(kvm);
    }

    fn objects(&self) -> Vec<&Object> {
        vec![self.skel.object()]
    }
}
