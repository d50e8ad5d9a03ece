//! Interrupt handling per CPU (`bpf/irq.bpf.c`): hard-IRQ time per (CPU, IRQ), softirq time per
//! vector, the x86 system vectors, and IPI sends by purpose.

use std::collections::BTreeMap;
use std::os::fd::AsFd;

use libbpf_rs::skel::Skel;
use libbpf_rs::{Link, MapCore, Object};

use super::{
    entries, load_tracepoints, percpu_entry, percpu_sum, sections_of, FamilyDef, LoadContext,
    LoadResult, LoadedFamily, Signals, Slots,
};
use crate::bpf::irq::{types, IrqSkel, IrqSkelBuilder};
use crate::hist::KernelHist;
use crate::model::{CpuEvents, HardIrq, IrqSnapshot, ProbeSnapshot};
use crate::report::Family;

pub(super) const FAMILY: FamilyDef = FamilyDef {
    name: "irq",
    gives: "interrupt load per CPU",
    view: "CPUs: interrupt load per CPU",
    signals: Signals::Named(&[
        ("irq_handler_entry", "hard-IRQ time per CPU and IRQ"),
        ("irq_handler_exit", "hard-IRQ time per CPU and IRQ"),
        ("softirq_entry", "softirq time per CPU and vector"),
        ("softirq_exit", "softirq time per CPU and vector"),
        ("local_timer_entry", "local timer interrupts"),
        ("local_timer_exit", "local timer interrupts"),
        ("reschedule_entry", "reschedule IPIs received"),
        ("reschedule_exit", "reschedule IPIs received"),
        ("call_function_entry", "call-function IPIs received"),
        ("call_function_exit", "call-function IPIs received"),
        (
            "call_function_single_entry",
            "call-function-single IPIs received",
        ),
        (
            "call_function_single_exit",
            "call-function-single IPIs received",
        ),
        ("irq_work_entry", "irq-work interrupts"),
        ("irq_work_exit", "irq-work interrupts"),
        ("ipi_send_cpu", "IPIs sent, by purpose"),
        ("ipi_send_cpumask", "IPIs sent, by purpose"),
        ("csd_queue_cpu", "cross-CPU calls queued, by purpose"),
    ]),
    modules: &[],
    load,
    sections: sections_of::<IrqSkelBuilder>,
};

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

const IPI_KINDS: [(types::vg_ipi_kind, &str); 2] = [
    (types::vg_ipi_kind::VG_IPI_RESCHEDULE, "reschedule"),
    (types::vg_ipi_kind::VG_IPI_FUNCTION_CALL, "function_call"),
];

const CSD_KINDS: [(types::vg_csd_kind, &str); 3] = [
    (
        types::vg_csd_kind::VG_CSD_BLOCK_COMPLETE,
        "block_completion",
    ),
    (types::vg_csd_kind::VG_CSD_WAKEUP, "wakeup"),
    (types::vg_csd_kind::VG_CSD_OTHER, "other"),
];

struct IrqProbe<'obj> {
    skel: IrqSkel<'obj>,
    _links: Vec<Link>,
    /// IRQ number -> action name, as /proc/interrupts named them at load.
    names: BTreeMap<u32, String>,
}

fn load<'obj>(cx: &LoadContext<'_>, slots: &'obj mut Slots) -> LoadResult<'obj> {
    let address = |name: &str| cx.symbols.address(name).unwrap_or(0);
    let remote_fn = address("__blk_mq_complete_request_remote");
    let ttwu_fn = address("sched_ttwu_pending");
    let generic_single = address("generic_smp_call_function_single_interrupt");
    let generic_many = address("generic_smp_call_function_interrupt");
    let words = cx.host.possible_cpus.div_ceil(64).clamp(1, 16);
    // Most IRQs are delivered to one CPU at a time; leave room for affinity changes.
    let pairs = (cx.host.irq_lines.saturating_mul(4) + cx.host.possible_cpus * 4).clamp(256, 65536);
    // With the block family, this object's interrupt-entry program stamps the block object's
    // IRQ entries too (sized as the block family sizes them, so its object can take the map).
    let for_block = cx.config.families.contains(&Family::Block);
    let irq_slots = super::block::irq_entered_slots(&cx.host.devices);
    let setup = |open: &mut crate::bpf::irq::OpenIrqSkel<'_>, _kind| {
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.blk_complete_remote_fn = remote_fn;
            ro.ttwu_pending_fn = ttwu_fn;
            ro.generic_single_fn = generic_single;
            ro.generic_many_fn = generic_many;
            ro.cpumask_words = words;
            ro.stamp_irq_entered = for_block;
        }
        let _ = open.maps.hardirqs.set_max_entries(pairs);
        let _ = open.maps.irq_entered.set_max_entries(irq_slots);
    };
    let (skel, links, report) = load_tracepoints(
        Family::Irq,
        IrqSkelBuilder::default,
        slots,
        cx.kernel,
        &|_| false,
        &setup,
    )?;
    let entry_kind = report
        .tracepoints
        .iter()
        .find(|t| t.tracepoint == "irq_handler_entry")
        .and_then(|t| t.attached);
    if let (true, Some(kind)) = (for_block, entry_kind) {
        if let Ok(fd) = skel.maps.irq_entered.as_fd().try_clone_to_owned() {
            cx.shared.borrow_mut().irq_entered = Some((fd, kind));
        }
    }
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

/// The per-CPU interrupt figures in the maps, IRQs named from `names`.
fn read_irq(skel: &IrqSkel<'_>, names: &BTreeMap<u32, String>) -> IrqSnapshot {
    let maps = &skel.maps;
    let mut irq = IrqSnapshot::default();
    for (k, st) in entries::<types::vg_irq_key, types::vg_irq_stats>(&maps.hardirqs) {
        irq.hardirqs.push(HardIrq {
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
    irq.hardirqs.sort_by_key(|h| (h.cpu, h.irq));
    irq.softirqs = per_cpu_kinds(
        &maps.softirqs,
        SOFTIRQS.iter().enumerate().map(|(i, n)| (i as u32, *n)),
    );
    irq.vectors = per_cpu_kinds(&maps.vectors, VECTORS.iter().map(|(v, n)| (v.0, *n)));
    irq.ipis_sent = per_cpu_kinds(&maps.ipis, IPI_KINDS.iter().map(|(k, n)| (k.0, *n)));
    irq.cross_cpu_calls = per_cpu_kinds(&maps.csds, CSD_KINDS.iter().map(|(k, n)| (k.0, *n)));
    irq.dropped = percpu_sum(&maps.dropped, 0);
    irq
}

impl LoadedFamily for IrqProbe<'_> {
    fn read(&self, snap: &mut ProbeSnapshot) {
        snap.irq = Some(read_irq(&self.skel, &self.names));
    }

    fn objects(&self) -> Vec<&Object> {
        vec![self.skel.object()]
    }
}

/// The interrupt programs run for real in this kernel (BPF_PROG_TEST_RUN on CPU 0 with chosen
/// arguments; addresses come from this kernel's kallsyms).
#[cfg(test)]
mod tests {
    use std::mem::MaybeUninit;
    use std::time::Duration;

    use libbpf_rs::skel::{OpenSkel, SkelBuilder};
    use libbpf_rs::OpenObject;

    use super::super::test_run::{bpf_allowed, raw_only, run_on_cpu0 as run};
    use super::*;

    /// Any kallsyms symbol's address (data symbols included), 0 when hidden.
    fn kallsym(name: &str) -> u64 {
        std::fs::read_to_string("/proc/kallsyms")
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 3 && f[2] == name).then(|| u64::from_str_radix(f[0], 16).unwrap_or(0))
            })
            .unwrap_or(0)
    }

    fn load(slot: &mut MaybeUninit<OpenObject>) -> IrqSkel<'_> {
        let mut open = IrqSkelBuilder::default().open(slot).unwrap();
        let ro = open.maps.rodata_data.as_deref_mut().unwrap();
        ro.blk_complete_remote_fn = kallsym("__blk_mq_complete_request_remote");
        ro.ttwu_pending_fn = kallsym("sched_ttwu_pending");
        ro.generic_single_fn = kallsym("generic_smp_call_function_single_interrupt");
        ro.cpumask_words = 16;
        raw_only(open.open_object_mut());
        open.load().unwrap()
    }

    fn on_cpu0(events: &[CpuEvents], kind: &str) -> (u64, u64) {
        events
            .iter()
            .filter(|e| e.cpu == 0 && e.kind == kind)
            .fold((0, 0), |(n, t), e| (n + e.count, t + e.time_ns))
    }

    /// A hard interrupt that arrives during a softirq is the hard interrupt's time, not the
    /// softirq's (the two rows used to count it twice).
    #[test]
    fn softirq_time_leaves_out_the_hard_interrupts_nested_in_it() {
        if !bpf_allowed("softirq nesting test") {
            return;
        }
        let mut slot = MaybeUninit::uninit();
        let skel = load(&mut slot);
        let net_rx = 3u64;
        run(&skel.progs.softirq_entry_raw, &[net_rx]);
        std::thread::sleep(Duration::from_millis(10));
        run(&skel.progs.irq_handler_entry_raw, &[99, 0]);
        std::thread::sleep(Duration::from_millis(40));
        run(&skel.progs.irq_handler_exit_raw, &[99, 0, 0]);
        run(&skel.progs.local_timer_entry_raw, &[0xec]);
        std::thread::sleep(Duration::from_millis(40));
        run(&skel.progs.local_timer_exit_raw, &[0xec]);
        std::thread::sleep(Duration::from_millis(10));
        run(&skel.progs.softirq_exit_raw, &[net_rx]);
        let irq = read_irq(&skel, &BTreeMap::new());
        let (n, soft) = on_cpu0(&irq.softirqs, "NET_RX");
        let hard: u64 = irq
            .hardirqs
            .iter()
            .filter(|h| h.cpu == 0 && h.irq == 99)
            .map(|h| h.time_ns)
            .sum();
        let (_, timer) = on_cpu0(&irq.vectors, "local_timer");
        assert_eq!(n, 1);
        assert!(
            hard >= 40_000_000 && timer >= 40_000_000,
            "hard {hard} ns, timer {timer} ns"
        );
        assert!(
            (20_000_000..60_000_000).contains(&soft),
            "softirq {soft} ns should be its own ~20 ms, not the ~100 ms it spanned"
        );
    }

    /// An IPI to a cpumask is one IPI per CPU in it: here the online mask itself.
    #[test]
    fn a_cpumask_ipi_counts_every_target_cpu() {
        if !bpf_allowed("IPI count test") {
            return;
        }
        let online_mask = kallsym("__cpu_online_mask");
        if online_mask == 0 {
            virtgap_testkit::skip("IPI count test", "kallsyms hides __cpu_online_mask");
            return;
        }
        let online = crate::families::parse_cpu_list(
            &std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap(),
        )
        .len() as u64;
        let mut slot = MaybeUninit::uninit();
        let skel = load(&mut slot);
        let generic = kallsym("generic_smp_call_function_single_interrupt");
        run(&skel.progs.ipi_send_cpumask_raw, &[online_mask, 0, generic]);
        run(&skel.progs.ipi_send_cpumask_raw, &[online_mask, 0, 0]);
        let irq = read_irq(&skel, &BTreeMap::new());
        assert_eq!(on_cpu0(&irq.ipis_sent, "function_call").0, online);
        assert_eq!(on_cpu0(&irq.ipis_sent, "reschedule").0, online);
    }

    /// Queued cross-CPU calls are told apart by the function they run, and an ipi_send_* event
    /// naming a specific function (6.4/6.5) is a queued call, not an IPI.
    #[test]
    fn cross_cpu_calls_are_sorted_by_purpose() {
        if !bpf_allowed("IPI purpose test") {
            return;
        }
        let (blk, ttwu) = (
            kallsym("__blk_mq_complete_request_remote"),
            kallsym("sched_ttwu_pending"),
        );
        if blk == 0 || ttwu == 0 {
            virtgap_testkit::skip("IPI purpose test", "kallsyms hides the call functions");
            return;
        }
        let mut slot = MaybeUninit::uninit();
        let skel = load(&mut slot);
        run(&skel.progs.csd_queue_cpu_raw, &[1, 0, blk, 0]);
        run(&skel.progs.csd_queue_cpu_raw, &[1, 0, blk, 0]);
        run(&skel.progs.csd_queue_cpu_raw, &[1, 0, ttwu, 0]);
        run(
            &skel.progs.csd_queue_cpu_raw,
            &[
                1,
                0,
                kallsym("generic_smp_call_function_single_interrupt") + 1,
                0,
            ],
        );
        run(&skel.progs.ipi_send_cpu_raw, &[1, 0, blk]);
        let irq = read_irq(&skel, &BTreeMap::new());
        assert_eq!(on_cpu0(&irq.cross_cpu_calls, "block_completion").0, 3);
        assert_eq!(on_cpu0(&irq.cross_cpu_calls, "wakeup").0, 1);
        assert_eq!(on_cpu0(&irq.cross_cpu_calls, "other").0, 1);
        assert_eq!(on_cpu0(&irq.ipis_sent, "function_call").0, 0);
    }
}
