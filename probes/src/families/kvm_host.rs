//! Host-side KVM (`bpf/kvm.bpf.c`), for when virtgap runs on a hypervisor: exit -> entry time by
//! exit reason, and port I/O, MMIO, MSR and hypercall exits per VMM process. KVM is usually a
//! module; its tracepoints and types come from its module BTF. Every VMM is counted unless the
//! user names one (`--vmm-pid`).

use libbpf_rs::skel::Skel;
use libbpf_rs::{Link, Object};

use super::{
    apply_filter, entries, load_tracepoints, LoadContext, LoadResult, LoadedFamily, ProcessFilter,
    Slots,
};
use crate::bpf::kvm::{types, KvmSkel, KvmSkelBuilder};
use crate::hist::KernelHist;
use crate::model::{ExitHist, KvmEventCount, KvmSnapshot, ProbeSnapshot};
use crate::report::{Family, FamilyReport, NOT_A_KVM_HOST};

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

pub(super) fn load<'obj>(cx: &LoadContext<'_>, slots: &'obj mut Slots) -> LoadResult<'obj> {
    let builtin = cx.kernel.in_vmlinux("kvm_exit");
    let module = std::path::Path::new("/sys/module/kvm").exists();
    if !builtin && !module {
        return Err(FamilyReport::unavailable(Family::KvmHost, NOT_A_KVM_HOST));
    }
    if !builtin && !cx.kernel.has_module_btf("kvm") {
        return Err(FamilyReport::unavailable(
            Family::KvmHost,
            "the kvm module has no BTF on this kernel (module BTF came in Linux 5.11): its tracepoint layouts are unknown",
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
