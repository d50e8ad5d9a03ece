//! Interrupt handling per CPU (`bpf/irq.bpf.c`): hard-IRQ time per (CPU, IRQ), softirq time per
//! vector, the x86 system vectors, and IPI sends by purpose.

use std::collections::BTreeMap;

use libbpf_rs::skel::Skel;
use libbpf_rs::{Link, MapCore, Object};

use super::{
    entries, load_tracepoints, percpu_entry, percpu_sum, LoadContext, LoadResult, LoadedFamily,
    Slots,
};
use crate::bpf::irq::{types, IrqSkel, IrqSkelBuilder};
use crate::hist::KernelHist;
use crate::model::{CpuEvents, HardIrq, IrqSnapshot, ProbeSnapshot};
use crate::report::Family;

/// The kernel's softirq vectors, in its numbering (HI_SOFTIRQ = 0 … RCU_SOFTIRQ = 9).
const SOFTIRQS: [&str; 10] = [
    "HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU",
];

const VECTORS: [(types::vg_vector, &str); 5] = [
    (types::vg_vector::VG_VEC_LOCAL_TIMER, "local_timer"),
    (types::vg_vector::VG_VEC_RESCHEDULE, "reschedule"),
    (types::vg_vector::VG_VEC_CALL_FUNCTION, "call_function"),
    (
        types::vg_vector::VG_VEC_CALL_FUNCTION_SINGLE,
        "call_function_single",
    ),
    (types::vg_vector::VG_VEC_IRQ_WORK, "irq_work"),
];

const IPI_KINDS: [(types::vg_ipi_kind, &str); 3] = [
    (
        types::vg_ipi_kind::VG_IPI_BLOCK_COMPLETE,
        "block_completion",
    ),
    (types::vg_ipi_kind::VG_IPI_RESCHEDULE, "reschedule"),
    (types::vg_ipi_kind::VG_IPI_OTHER, "other"),
];

struct IrqProbe<'obj> {
    skel: IrqSkel<'obj>,
    _links: Vec<Link>,
    /// IRQ number -> action name, as /proc/interrupts named them at load.
    names: BTreeMap<u32, String>,
}

pub(super) fn load<'obj>(cx: &LoadContext<'_>, slots: &'obj mut Slots) -> LoadResult<'obj> {
    let remote_fn = cx
        .symbols
        .address("__blk_mq_complete_request_remote")
        .unwrap_or(0);
    // Most IRQs are delivered to one CPU at a time; leave room for affinity changes.
    let pairs = (cx.host.irq_lines.saturating_mul(4) + cx.host.possible_cpus * 4).clamp(256, 65536);
    let setup = |open: &mut crate::bpf::irq::OpenIrqSkel<'_>, _kind| {
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.blk_complete_remote_fn = remote_fn;
        }
        let _ = open.maps.hardirqs.set_max_entries(pairs);
    };
    let (skel, links, report) = load_tracepoints(
        Family::Irq,
        IrqSkelBuilder::default,
        slots,
        cx.kernel,
        &|_| false,
        &setup,
    )?;
    let names = std::fs::read_to_string("/proc/interrupts")
        .map(|t| crate::procfs::irq_names(&t))
        .unwrap_or_default();
    Ok((
        Box::new(IrqProbe {
            skel,
            _links: links,
            names,
        }),
        report,
    ))
}

/// Count and time per CPU of each indexed kind of a per-CPU map of vg_count_time.
fn per_cpu_kinds<'k>(
    map: &dyn MapCore,
    kinds: impl Iterator<Item = (u32, &'k str)>,
) -> Vec<CpuEvents> {
    let mut out = Vec::new();
    for (index, kind) in kinds {
        for (cpu, ct) in percpu_entry::<types::vg_count_time>(map, &index.to_ne_bytes())
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
}

impl LoadedFamily for IrqProbe<'_> {
    fn read(&self, snap: &mut ProbeSnapshot) {
        let maps = &self.skel.maps;
        let mut irq = IrqSnapshot::default();
        for (k, st) in entries::<types::vg_irq_key, types::vg_irq_stats>(&maps.hardirqs) {
            irq.hardirqs.push(HardIrq {
                cpu: k.cpu,
                irq: k.irq,
                name: self
                    .names
                    .get(&k.irq)
                    .cloned()
                    .unwrap_or_else(|| format!("irq{}", k.irq)),
                count: st.count,
                time_ns: st.time_ns,
                duration: KernelHist::from(&st.duration),
            });
        }
        irq.hardirqs.sort_by_key(|h| (h.cpu, h.irq));
        irq.softirqs = per_cpu_kinds(
            &maps.softirqs,
            SOFTIRQS.iter().enumerate().map(|(i, n)| (i as u32, *n)),
        );
        irq.vectors = per_cpu_kinds(&maps.vectors, VECTORS.iter().map(|(v, n)| (v.0, *n)));
        irq.ipis_sent = per_cpu_kinds(&maps.ipis, IPI_KINDS.iter().map(|(k, n)| (k.0, *n)));
        irq.dropped = percpu_sum(&maps.dropped, 0);
        snap.irq = Some(irq);
    }

    fn objects(&self) -> Vec<&Object> {
        vec![self.skel.object()]
    }
}
