//! What each hypervisor does per mechanism, and how virtgap measures it from inside the guest:
//! one table of data. A guest asks its hypervisor for the same few things — program a timer,
//! send an IPI, end an interrupt, wait for an event, halt, wait on or kick a lock holder, flush
//! another CPU's TLB — but each hypervisor (and each kernel version) does it by another path: an
//! MSR write that traps, a hypercall behind a kernel function, or nothing a guest can see.
//! Metal has no hypervisor at all: nothing there is the hypervisor's, which is neither "not
//! measured" nor 0. Metal still times the generic callers a guest's paths may be timed at
//! (`clockevents_program_event`, the halt), so that the native work inside a guest's timed path
//! can be told from the hypervisor's part of it by comparing the two hosts.

use serde::{Deserialize, Serialize};

/// The hypervisor a guest runs on, as the fingerprint names it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Hypervisor {
    /// Bare metal.
    #[default]
    None,
    Kvm,
    Xen,
    HyperV,
    Vmware,
    /// A hypervisor bit with a signature this table does not know.
    Other,
}

impl Hypervisor {
    pub const ALL: [Hypervisor; 6] = [
        Self::None,
        Self::Kvm,
        Self::Xen,
        Self::HyperV,
        Self::Vmware,
        Self::Other,
    ];

    /// The fingerprint's name for it ("none", "kvm", "xen", "hyperv", "vmware", "other").
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Kvm => "kvm",
            Self::Xen => "xen",
            Self::HyperV => "hyperv",
            Self::Vmware => "vmware",
            Self::Other => "other",
        }
    }

    /// From the fingerprint's name; anything unknown is `Other`.
    pub fn of_name(name: &str) -> Self {
        Self::ALL
            .into_iter()
            .find(|h| h.name() == name)
            .unwrap_or(Self::Other)
    }
}

/// What a guest asks its hypervisor for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// Programming the next timer interrupt (TSC-deadline or timer-count write, or a
    /// single-shot timer hypercall).
    Timer,
    /// Sending an inter-processor interrupt (ICR write, or an IPI hypercall / event channel).
    Ipi,
    /// Ending an interrupt (EOI write or hypercall; PV EOI avoids the exit).
    InterruptDelivery,
    /// The hypervisor's upcall into the guest: Xen event channels, Hyper-V's VMBus interrupt.
    Upcall,
    /// Halting an idle CPU (an exit on every hypervisor that does not poll).
    Halt,
    /// A paravirt spinlock waiter handing its CPU back.
    SpinlockWait,
    /// Waking a paravirt spinlock waiter.
    SpinlockKick,
    /// Flushing other CPUs' TLBs by hypercall rather than IPIs.
    TlbFlush,
    /// Telling a paravirtual device there is work (the I/O doorbell): virtio's queue notify, a
    /// write to the device's notify register that exits; Xen's event-channel send to a
    /// frontend's backend; Hyper-V's VMBus signal hypercall.
    DeviceNotify,
    /// Any other hypercall: seen only by the sampler, in the hypercall stubs and page.
    OtherHypercall,
}

impl Mechanism {
    pub const ALL: [Mechanism; 10] = [
        Self::Timer,
        Self::Ipi,
        Self::InterruptDelivery,
        Self::Upcall,
        Self::Halt,
        Self::SpinlockWait,
        Self::SpinlockKick,
        Self::TlbFlush,
        Self::DeviceNotify,
        Self::OtherHypercall,
    ];

    /// Its name in profiles, CSV files and the diff.
    pub fn name(self) -> &'static str {
        match self {
            Self::Timer => "timer",
            Self::Ipi => "ipi",
            Self::InterruptDelivery => "interrupt_delivery",
            Self::Upcall => "upcall",
            Self::Halt => "halt",
            Self::SpinlockWait => "spinlock_wait",
            Self::SpinlockKick => "spinlock_kick",
            Self::TlbFlush => "tlb_flush",
            Self::DeviceNotify => "device_notify",
            Self::OtherHypercall => "other_hypercall",
        }
    }
}

/// How a path is measured from inside the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// Counted: a write to this MSR exits (the msr probe).
    MsrWrite(u32),
    /// Counted and timed entry to return: the kernel function that makes the hypercall (the
    /// pv-paths probe). Its functions in the order to try them (its names by kernel version,
    /// then where it has no ftrace site a traceable caller): timed at the first this kernel has
    /// that attaches.
    Timed(&'static [&'static str]),
    /// Seen only as CPU time in the sampler's samples of the hypervisor interface.
    Sampled,
    /// The CPU time the sampler finds in these functions, or in an MMIO or port accessor they
    /// call (`NOTIFY_ACCESSORS`): where nothing can time them (no fentry, no kprobes), their
    /// share of the samples.
    SampledIn(&'static [&'static str]),
}

/// One way a hypervisor serves a mechanism.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Path {
    pub mechanism: Mechanism,
    pub measure: Measure,
    /// What the path is, in the hypervisor's own terms ("VCPUOP_set_singleshot_timer").
    pub what: &'static str,
}

const fn msr(mechanism: Mechanism, msr: u32, what: &'static str) -> Path {
    Path {
        mechanism,
        measure: Measure::MsrWrite(msr),
        what,
    }
}

const fn timed(mechanism: Mechanism, names: &'static [&'static str], what: &'static str) -> Path {
    Path {
        mechanism,
        measure: Measure::Timed(names),
        what,
    }
}

const fn sampled(mechanism: Mechanism, what: &'static str) -> Path {
    Path {
        mechanism,
        measure: Measure::Sampled,
        what,
    }
}

const fn sampled_in(
    mechanism: Mechanism,
    names: &'static [&'static str],
    what: &'static str,
) -> Path {
    Path {
        mechanism,
        measure: Measure::SampledIn(names),
        what,
    }
}

/// A timed function whose calls serve two mechanisms, told apart by its second argument: the
/// calls with `value` are timed as a path of their own, named `symbol` among the timed
/// functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgumentSplit {
    /// The function, timed by its own path for every other argument.
    pub function: &'static str,
    /// The argument's value that marks the other path's calls.
    pub value: SplitValue,
    /// The other path's name, the only name in its `Measure::Timed`.
    pub symbol: &'static str,
}

/// The argument's value that marks a split's calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitValue {
    /// An enumerator of the kernel's, its value read from the kernel's BTF at load.
    Enumerator {
        enum_type: &'static str,
        name: &'static str,
    },
    /// A constant the kernel defines by a macro (not in BTF), fixed on the architecture.
    Constant { name: &'static str, value: u64 },
}

impl SplitValue {
    /// Its name in the kernel's source.
    pub fn name(self) -> &'static str {
        match self {
            Self::Enumerator { name, .. } | Self::Constant { name, .. } => name,
        }
    }
}

/// Xen's PV spinlock kick is `xen_send_IPI_one(cpu, XEN_SPIN_UNLOCK_VECTOR)`: an event-channel
/// send like an IPI's, but a lock mechanism, so those calls are timed apart from the IPIs.
const XEN_KICK_SEND: ArgumentSplit = ArgumentSplit {
    function: "xen_send_IPI_one",
    value: SplitValue::Enumerator {
        enum_type: "ipi_vector",
        name: "XEN_SPIN_UNLOCK_VECTOR",
    },
    symbol: "xen_send_IPI_one:XEN_SPIN_UNLOCK_VECTOR",
};

/// Hyper-V's PV spinlock kick is `apic->send_IPI(cpu, X86_PLATFORM_IPI_VECTOR)`, which on
/// Hyper-V is `hv_send_ipi` (the vector is 0xf7 in arch/x86/include/asm/irq_vectors.h).
const HYPERV_KICK_SEND: ArgumentSplit = ArgumentSplit {
    function: "hv_send_ipi",
    value: SplitValue::Constant {
        name: "X86_PLATFORM_IPI_VECTOR",
        value: 0xf7,
    },
    symbol: "hv_send_ipi:X86_PLATFORM_IPI_VECTOR",
};

/// The timed functions of `hypervisor` whose calls are split by their argument.
pub fn argument_splits(hypervisor: Hypervisor) -> &'static [ArgumentSplit] {
    match hypervisor {
        Hypervisor::Xen => &[XEN_KICK_SEND],
        Hypervisor::HyperV => &[HYPERV_KICK_SEND],
        _ => &[],
    }
}

/// A timed function that other timed paths also call, where that call is their own work: a
/// call of `function` made directly inside one of `callers` (or a split of theirs) is left in
/// the caller's time, not timed apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CalledInside {
    pub function: &'static str,
    pub callers: &'static [&'static str],
}

/// `notify_remote_via_irq` is the Xen frontends' doorbell (blkfront's, netfront's kick to their
/// backend), and also what `xen_send_IPI_one` sends an IPI through.
const XEN_NOTIFY_IN_IPI: CalledInside = CalledInside {
    function: "notify_remote_via_irq",
    callers: &["xen_send_IPI_one"],
};

/// The timed functions of `hypervisor` that other timed paths call as their own work.
pub fn called_inside(hypervisor: Hypervisor) -> &'static [CalledInside] {
    match hypervisor {
        Hypervisor::Xen => &[XEN_NOTIFY_IN_IPI],
        _ => &[],
    }
}

/// The kernel function a timed path's name stands for: itself, or a split's own path's function
/// (present, absent and attached with it).
pub fn function_of(hypervisor: Hypervisor, name: &'static str) -> &'static str {
    split_named(hypervisor, name).map_or(name, |s| s.function)
}

/// The split whose own path `symbol` names, if it names one.
pub fn split_named(hypervisor: Hypervisor, symbol: &str) -> Option<&'static ArgumentSplit> {
    argument_splits(hypervisor)
        .iter()
        .find(|s| s.symbol == symbol)
}

/// The MMIO and port accessors a device doorbell writes through: the sampler keeps the caller
/// of a sample in one (at most `VG_NOTIFY_ACCESSORS` of them). virtio-pci's notify is an
/// `iowrite16` (`iowrite32` with notification data); legacy virtio-pci writes a port through
/// the same accessors.
pub const NOTIFY_ACCESSORS: &[&str] = &["iowrite16", "iowrite32", "iowrite8"];

/// How a sample's symbol is kept when the sampler knows its caller: "caller/function".
pub fn sample_symbol(function: &str, caller: Option<&str>) -> String {
    match caller {
        Some(c) => format!("{c}/{function}"),
        None => function.to_string(),
    }
}

/// The functions a sampled symbol stands for: itself, or for "caller/function" the caller
/// first, then the function.
fn sample_functions(symbol: &str) -> [&str; 2] {
    match symbol.split_once('/') {
        Some((caller, function)) => [caller, function],
        None => [symbol, symbol],
    }
}

/// The virtio queue notify, by transport: timed where the kernel lets BPF time it, else the
/// sampler's share in it and in the accessor it writes through.
const VIRTIO_NOTIFY: [Path; 3] = [
    timed(
        Mechanism::DeviceNotify,
        &["vp_notify"],
        "virtio PCI queue notify (a write to the notify register, which exits)",
    ),
    timed(
        Mechanism::DeviceNotify,
        &["vm_notify"],
        "virtio MMIO queue notify (a write to QueueNotify, which exits)",
    ),
    sampled_in(
        Mechanism::DeviceNotify,
        &["vp_notify", "vp_notify_with_data", "vm_notify"],
        "virtio queue notify, sampled (its CPU time where it cannot be timed)",
    ),
];

use Mechanism::*;

// Kernel names below were checked against /proc/kallsyms of Debian's 5.10, 6.1 and 6.12 kernels
// (`scripts/vmtest.py` pins what attaches on each). A path's names are tried in order and it is
// timed at the first that the kernel has and that attaches: one function renamed between
// versions, and last, where the function itself has no ftrace site (BPF can hook it neither by
// fentry nor by kprobe events), the traceable caller that makes the call. Functions that
// coexist are paths of their own, so each is timed.

/// The halt every guest does, native HLT (exits unless the hypervisor lets it poll): named
/// `native_safe_halt` before 6.5 and `pv_native_safe_halt` since; neither has an ftrace site,
/// so it is timed at its caller `default_idle` (noinstr since 6.x: then untraceable).
const HALT: Path = timed(
    Halt,
    &["pv_native_safe_halt", "native_safe_halt", "default_idle"],
    "HLT (exits unless the hypervisor polls; or its caller default_idle)",
);

/// The local APIC timer and ICR, as every x86 hypervisor traps them. (x2APIC EOI writes go
/// through `__wrmsr`, which no tracepoint sees: not listed.)
const APIC_TIMER: Path = msr(Timer, 0x6e0, "IA32_TSC_DEADLINE write (lapic-deadline)");
const APIC_TIMER_COUNT: Path = msr(Timer, 0x838, "x2APIC TMICT write (lapic)");
const APIC_ICR: Path = msr(
    Ipi,
    X2APIC_ICR,
    "x2APIC ICR write (IPIs to one CPU timed from send to the write's return, 6.4+)",
);

/// The x2APIC ICR: the MSR whose writes send IPIs, timed for IPIs to one CPU (`bpf/msr.bpf.c`).
pub const X2APIC_ICR: u32 = 0x830;

/// The timer programming every kernel does, timed at its generic caller (the same function on
/// metal: `NATIVE`), so that a guest's timer time has metal's native work to compare with.
const TIMER_PROGRAMMING: Path = timed(
    Timer,
    &["clockevents_program_event"],
    "timer programming, timed at clockevents_program_event (the TSC-deadline or TMICT write's exit inside it)",
);

/// Whether a timed function makes its mechanism's trapping MSR writes itself: where it is
/// timed, those writes are its calls counted again.
pub fn makes_its_msr_writes(function: &str) -> bool {
    function == "clockevents_program_event"
}

const KVM: &[Path] = &[
    TIMER_PROGRAMMING,
    APIC_TIMER,
    APIC_TIMER_COUNT,
    APIC_ICR,
    timed(
        Ipi,
        &["kvm_send_ipi_mask"],
        "KVM_HC_SEND_IPI (PV IPIs to a mask)",
    ),
    timed(
        Ipi,
        &["kvm_send_ipi_mask_allbutself"],
        "KVM_HC_SEND_IPI (PV IPIs to all others)",
    ),
    timed(
        InterruptDelivery,
        &["kvm_guest_apic_eoi_write"],
        "PV EOI (shared memory; an EOI write only when the host asks)",
    ),
    HALT,
    timed(SpinlockWait, &["kvm_wait"], "HLT while waiting on a lock"),
    timed(SpinlockKick, &["kvm_kick_cpu"], "KVM_HC_KICK_CPU"),
    timed(
        TlbFlush,
        &["kvm_flush_tlb_multi", "kvm_flush_tlb_others"],
        "PV TLB flush (skips preempted vCPUs)",
    ),
    VIRTIO_NOTIFY[0],
    VIRTIO_NOTIFY[1],
    VIRTIO_NOTIFY[2],
    sampled(OtherHypercall, "VMCALL/VMMCALL sites"),
];

const XEN: &[Path] = &[
    // arch/x86/xen is built without ftrace: the timer and spinlock callbacks are timed at
    // their callers where the kernel allows no other way.
    timed(
        Timer,
        &["xen_vcpuop_set_next_event", "clockevents_program_event"],
        "VCPUOP_set_singleshot_timer (xen clockevent; or its caller clockevents_program_event)",
    ),
    APIC_TIMER,
    APIC_TIMER_COUNT,
    timed(
        Ipi,
        &["xen_send_IPI_one"],
        "EVTCHNOP_send (but on the lock-kick vector: a spinlock kick)",
    ),
    APIC_ICR,
    timed(
        InterruptDelivery,
        &["eoi_pirq"],
        "PHYSDEVOP_eoi (a passthrough IRQ's end, when Xen asks for it)",
    ),
    // 5.10's HVM callback calls xen_hvm_evtchn_do_upcall; since the 2023 rename (in Debian's
    // 6.1 too) xen_evtchn_do_upcall. The handlers it runs, and the EOIs inside it, are the
    // guest's own work and paths of their own: left out of its time (bpf/pvpath.bpf.c).
    timed(
        Upcall,
        &["xen_hvm_evtchn_do_upcall", "xen_evtchn_do_upcall"],
        "event channel upcall (less the handlers it runs)",
    ),
    // HVM guests halt natively; xen_safe_halt is PV guests' only.
    HALT,
    timed(SpinlockWait, &["xen_qlock_wait"], "SCHEDOP_poll"),
    timed(
        SpinlockKick,
        &["xen_qlock_kick", "__pv_queued_spin_unlock_slowpath"],
        "the kick to the waiter (or its caller, the unlock slowpath), less its send",
    ),
    timed(
        SpinlockKick,
        &[XEN_KICK_SEND.symbol],
        "EVTCHNOP_send on the lock-kick vector (xen_send_IPI_one's XEN_SPIN_UNLOCK_VECTOR calls)",
    ),
    timed(
        TlbFlush,
        &["xen_flush_tlb_multi", "xen_flush_tlb_others"],
        "MMUEXT_TLB_FLUSH_MULTI (PV guests only)",
    ),
    // After the IPI sender: its calls inside that sender's frames are the IPI's (see
    // `XEN_NOTIFY_IN_IPI`).
    timed(
        DeviceNotify,
        &[XEN_NOTIFY_IN_IPI.function],
        "EVTCHNOP_send to a backend (blkfront's and netfront's kick), outside the IPI sender",
    ),
    sampled(
        OtherHypercall,
        "xen_hypercall_* stubs (the hypercall page on older kernels)",
    ),
];

const HYPERV: &[Path] = &[
    // hv_ce_set_next_event writes HV_X64_MSR_STIMER0_COUNT: timed here, so that write is not
    // listed again.
    timed(
        Timer,
        &["hv_ce_set_next_event"],
        "STIMER0_COUNT write (hyperv_stimer0 clockevent)",
    ),
    APIC_TIMER,
    APIC_TIMER_COUNT,
    timed(
        Ipi,
        &["hv_send_ipi"],
        "HVCALL_SEND_IPI (one CPU; but on the platform vector: a spinlock kick)",
    ),
    timed(Ipi, &["hv_send_ipi_mask"], "HVCALL_SEND_IPI (a mask)"),
    timed(
        Ipi,
        &["hv_send_ipi_mask_allbutself"],
        "HVCALL_SEND_IPI (all others)",
    ),
    msr(Ipi, 0x4000_0071, "HV_X64_MSR_ICR write"),
    APIC_ICR,
    msr(InterruptDelivery, 0x4000_0070, "HV_X64_MSR_EOI write"),
    // In the hv_vmbus module: absent until it is loaded.
    timed(Upcall, &["vmbus_isr"], "VMBus synthetic interrupt"),
    HALT,
    timed(
        SpinlockWait,
        &["hv_qlock_wait"],
        "HV_X64_MSR_GUEST_IDLE read",
    ),
    timed(
        SpinlockKick,
        &["hv_qlock_kick"],
        "an IPI to the waiter, less its send",
    ),
    timed(
        SpinlockKick,
        &[HYPERV_KICK_SEND.symbol],
        "HVCALL_SEND_IPI on the platform vector (hv_send_ipi's X86_PLATFORM_IPI_VECTOR calls)",
    ),
    timed(
        TlbFlush,
        &["hyperv_flush_tlb_multi", "hyperv_flush_tlb_others"],
        "HVCALL_FLUSH_VIRTUAL_ADDRESS_LIST",
    ),
    // In the hv_vmbus module: absent until it is loaded.
    timed(
        DeviceNotify,
        &["vmbus_set_event"],
        "HVCALL_SIGNAL_EVENT (a VMBus channel's kick: storvsc, netvsc)",
    ),
    sampled_in(
        DeviceNotify,
        &["vmbus_set_event"],
        "VMBus channel signal, sampled (its CPU time where it cannot be timed)",
    ),
    sampled(OtherHypercall, "hv_do_hypercall and the hypercall page"),
];

/// Metal's native work at the generic callers a guest's timed path may be timed at: a Xen
/// guest's timer path is timed at `clockevents_program_event` where `xen_vcpuop_set_next_event`
/// has no ftrace site, every guest's halt at the native halt, and an IPI to one CPU from its
/// send to its ICR write (which exits in a KVM guest). Timed on metal, the same path's time
/// there is the native part a diff subtracts; none of it is the hypervisor's.
const NATIVE: &[Path] = &[
    timed(
        Timer,
        &["clockevents_program_event"],
        "clockevents_program_event (the native timer programming, for comparison)",
    ),
    msr(
        Ipi,
        X2APIC_ICR,
        "x2APIC ICR write (native; IPIs to one CPU timed, for comparison)",
    ),
    HALT,
];

/// A hypervisor this table does not know in detail: the APIC traps every x86 hypervisor has.
const GENERIC: &[Path] = &[APIC_TIMER, APIC_TIMER_COUNT, APIC_ICR, HALT];

/// Accessors whose MSR or APIC accesses trap to any hypervisor: a sample taken on the exit's
/// return lands in them. Symbol prefixes, leading underscores ignored.
const TRAPPING_ACCESSORS: &[&str] = &[
    "native_write_msr",
    "native_read_msr",
    "native_apic_msr_",
    "native_apic_mem_",
    "native_x2apic_icr_write",
    "x2apic_send_IPI",
    "lapic_next_deadline",
    "lapic_next_event",
];

/// Where each hypervisor's hypercalls are made outside its timed paths: the stubs and pages a
/// sample lands in. Symbol prefixes, leading underscores ignored.
fn hypercall_sites(hypervisor: Hypervisor) -> &'static [&'static str] {
    match hypervisor {
        // Since the 2024 hypercall rework (backported to 5.10 and 6.1): xen_hypercall_intel,
        // _amd, _hvm; before it, the hypercall page's xen_hypercall_<op> entries.
        Hypervisor::Xen => &["xen_hypercall", "hypercall_page"],
        // VMCALLs are inlined into their callers: KVM_HC_SEND_IPI in __send_ipi_mask,
        // KVM_HC_SCHED_YIELD in kvm_smp_send_call_func_ipi.
        Hypervisor::Kvm => &[
            "kvm_hypercall",
            "send_ipi_mask",
            "kvm_smp_send_call_func_ipi",
        ],
        // hv_apic.c's __send_ipi_one/_mask/_mask_ex make the IPI hypercalls; the synthetic
        // APIC and timer registers are MSRs.
        Hypervisor::HyperV => &[
            "hv_do_",
            "hv_hypercall",
            "send_ipi_one",
            "send_ipi_mask",
            "hv_apic_",
            "hv_stimer",
            "hv_set_register",
            "hv_set_msr",
        ],
        Hypervisor::None | Hypervisor::Vmware | Hypervisor::Other => &[],
    }
}

/// Whether a sample in kernel function `symbol` is time in `hypervisor`'s interface: its
/// hypercall stubs and pages, the functions of its timed paths, and the accessors that trap.
/// Nothing is on metal. (Halts are idle time, sorted before this is asked.)
pub fn is_interface_symbol(hypervisor: Hypervisor, symbol: &str) -> bool {
    if hypervisor == Hypervisor::None {
        return false;
    }
    if sampled_mechanism(hypervisor, symbol).is_some() {
        return true;
    }
    // A sample in an accessor whose caller is no doorbell is the accessor's.
    let symbol = sample_functions(symbol)[1];
    // "eoi_pirq.isra.0" is eoi_pirq.
    let base = symbol.split('.').next().unwrap_or(symbol);
    let trimmed = base.trim_start_matches('_');
    let timed = paths(hypervisor).iter().any(|p| {
        matches!(p.measure, Measure::Timed(names) if names.contains(&base) || names.contains(&trimmed))
    });
    timed
        || TRAPPING_ACCESSORS
            .iter()
            .chain(hypercall_sites(hypervisor))
            .any(|prefix| trimmed.starts_with(prefix))
}

/// The mechanism whose sampled path (`Measure::SampledIn`) a sampled symbol ("function" or
/// "caller/function") belongs to on `hypervisor`: the function is one of the path's, or it is
/// a notify accessor called from one of them.
pub fn sampled_mechanism(hypervisor: Hypervisor, symbol: &str) -> Option<Mechanism> {
    let [caller, function] = sample_functions(symbol);
    let base = |s: &str| s.split('.').next().unwrap_or(s).to_string();
    let (caller, function) = (base(caller), base(function));
    paths(hypervisor).iter().find_map(|p| match p.measure {
        Measure::SampledIn(names)
            if names.contains(&function.as_str())
                || (NOTIFY_ACCESSORS.contains(&function.as_str())
                    && names.contains(&caller.as_str())) =>
        {
            Some(p.mechanism)
        }
        _ => None,
    })
}

/// How `hypervisor` serves each mechanism, as virtgap measures it; on metal, the native work
/// at the generic callers guests' paths share (see `NATIVE`).
pub fn paths(hypervisor: Hypervisor) -> &'static [Path] {
    match hypervisor {
        Hypervisor::None => NATIVE,
        Hypervisor::Kvm => KVM,
        Hypervisor::Xen => XEN,
        Hypervisor::HyperV => HYPERV,
        Hypervisor::Vmware | Hypervisor::Other => GENERIC,
    }
}

/// A CPUID bit by which a hypervisor says it offers a path: in the leaf `offset` past its
/// interface's first (the one signed `signature`), register `register` ("eax".."edx"), bit
/// `bit`, named as the hypervisor's headers name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    pub signature: &'static str,
    pub offset: u32,
    pub register: &'static str,
    pub bit: u32,
    pub name: &'static str,
}

const fn kvm_feature(bit: u32, name: &'static str) -> Offer {
    Offer {
        signature: "KVMKVMKVM",
        offset: 1,
        register: "eax",
        bit,
        name,
    }
}

const fn hyperv(offset: u32, bit: u32, name: &'static str) -> Offer {
    Offer {
        signature: "Microsoft Hv",
        offset,
        register: "eax",
        bit,
        name,
    }
}

/// The CPUID bit that says whether `hypervisor` offers `path` (None: no bit decides it; the
/// APIC traps and halts every guest has). Where the bit is clear the guest never takes the
/// path, and its "0 calls" means "not offered", not "not used".
pub fn offer(hypervisor: Hypervisor, path: &Path) -> Option<Offer> {
    let first = match path.measure {
        Measure::Timed(names) => names[0],
        Measure::MsrWrite(0x4000_0070 | 0x4000_0071) => "hv_apic_msrs",
        _ => return None,
    };
    match (hypervisor, first) {
        (Hypervisor::Kvm, "kvm_send_ipi_mask" | "kvm_send_ipi_mask_allbutself") => {
            Some(kvm_feature(11, "KVM_FEATURE_PV_SEND_IPI"))
        }
        (Hypervisor::Kvm, "kvm_guest_apic_eoi_write") => Some(kvm_feature(6, "KVM_FEATURE_PV_EOI")),
        (Hypervisor::Kvm, "kvm_wait" | "kvm_kick_cpu") => {
            Some(kvm_feature(7, "KVM_FEATURE_PV_UNHALT"))
        }
        (Hypervisor::Kvm, "kvm_flush_tlb_multi") => {
            Some(kvm_feature(9, "KVM_FEATURE_PV_TLB_FLUSH"))
        }
        (Hypervisor::HyperV, "hv_ce_set_next_event") => {
            Some(hyperv(3, 3, "HV_MSR_SYNTIMER_AVAILABLE"))
        }
        (
            Hypervisor::HyperV,
            "hv_send_ipi"
            | "hv_send_ipi_mask"
            | "hv_send_ipi_mask_allbutself"
            | "hv_send_ipi:X86_PLATFORM_IPI_VECTOR",
        ) => Some(hyperv(4, 10, "HV_X64_CLUSTER_IPI_RECOMMENDED")),
        (Hypervisor::HyperV, "hyperv_flush_tlb_multi") => {
            Some(hyperv(4, 2, "HV_X64_REMOTE_TLB_FLUSH_RECOMMENDED"))
        }
        (Hypervisor::HyperV, "hv_apic_msrs") => {
            Some(hyperv(4, 3, "HV_X64_APIC_ACCESS_RECOMMENDED"))
        }
        _ => None,
    }
}

/// The mechanism a write to `msr` serves on `hypervisor` (None: not one this table lists).
pub fn mechanism_of_msr(hypervisor: Hypervisor, msr: u32) -> Option<Mechanism> {
    paths(hypervisor)
        .iter()
        .find(|p| p.measure == Measure::MsrWrite(msr))
        .map(|p| p.mechanism)
}

/// The mechanism a timed kernel function serves on `hypervisor`.
pub fn mechanism_of_symbol(hypervisor: Hypervisor, symbol: &str) -> Option<Mechanism> {
    paths(hypervisor)
        .iter()
        .find(|p| matches!(p.measure, Measure::Timed(names) if names.contains(&symbol)))
        .map(|p| p.mechanism)
}

/// One timed path of a hypervisor's table as a kernel has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimedPath {
    /// Its functions, in the order to try them.
    pub names: &'static [&'static str],
    /// Those the kernel has, in that order; none: absent on this kernel.
    pub present: Vec<&'static str>,
}

/// The timed paths of `hypervisor`'s table in table order, each with the functions `has` says
/// the kernel has. The pv-paths probe times each path at the first of them that attaches.
pub fn timed_paths(hypervisor: Hypervisor, has: impl Fn(&str) -> bool) -> Vec<TimedPath> {
    let mut out: Vec<TimedPath> = Vec::new();
    for p in paths(hypervisor) {
        if let Measure::Timed(names) = p.measure {
            if out.iter().all(|t| t.names != names) {
                // A split's own path is present where its function is.
                out.push(TimedPath {
                    names,
                    present: names
                        .iter()
                        .copied()
                        .filter(|&n| has(function_of(hypervisor, n)))
                        .collect(),
                });
            }
        }
    }
    out
}

/// For each timed path of `hypervisor`'s table, the first of its names `has` says the kernel
/// has: the function tried first (a path whose names it lacks is absent on this kernel).
pub fn timed_symbols(hypervisor: Hypervisor, has: impl Fn(&str) -> bool) -> Vec<&'static str> {
    timed_paths(hypervisor, has)
        .into_iter()
        .filter_map(|t| t.present.first().copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A virtio queue notify is an `iowrite16` from `vp_notify`: the sampler keeps the caller
    /// of a sample in the accessor, and only a doorbell caller makes it the hypervisor's.
    #[test]
    fn a_doorbell_sample_is_told_by_its_caller() {
        let doorbell = sample_symbol("iowrite16", Some("vp_notify"));
        assert_eq!(doorbell, "vp_notify/iowrite16");
        assert_eq!(
            sampled_mechanism(Hypervisor::Kvm, &doorbell),
            Some(Mechanism::DeviceNotify)
        );
        assert!(is_interface_symbol(Hypervisor::Kvm, &doorbell));
        assert_eq!(
            sampled_mechanism(Hypervisor::Kvm, "vm_notify"),
            Some(Mechanism::DeviceNotify)
        );
        // Another driver's MMIO write is not a doorbell; nothing is on metal.
        let other = sample_symbol("iowrite16", Some("e1000_write"));
        assert_eq!(sampled_mechanism(Hypervisor::Kvm, &other), None);
        assert!(!is_interface_symbol(Hypervisor::Kvm, &other));
        assert!(!is_interface_symbol(Hypervisor::None, &doorbell));
        assert_eq!(sampled_mechanism(Hypervisor::None, &doorbell), None);
        // Hyper-V's VMBus signal.
        assert_eq!(
            sampled_mechanism(Hypervisor::HyperV, "vmbus_set_event"),
            Some(Mechanism::DeviceNotify)
        );
    }

    #[test]
    fn metal_times_only_the_generic_callers_and_every_guest_has_the_apic_traps() {
        // Metal's paths are native work a guest's table also measures, nothing else: no
        // sampled interface, and of the MSRs only the ICR, whose IPIs to one CPU are timed.
        for p in paths(Hypervisor::None) {
            let names = match p.measure {
                Measure::Timed(names) => names,
                Measure::MsrWrite(X2APIC_ICR) => {
                    assert!(paths(Hypervisor::Kvm)
                        .iter()
                        .any(|g| g.measure == p.measure));
                    continue;
                }
                _ => panic!("metal measures {p:?}"),
            };
            assert!(
                [Hypervisor::Xen, Hypervisor::Kvm]
                    .iter()
                    .any(|hv| paths(*hv)
                        .iter()
                        .any(|g| matches!(g.measure, Measure::Timed(n) if n.contains(&names[0])))),
                "{names:?} is timed by no guest's table"
            );
        }
        assert!(!is_interface_symbol(
            Hypervisor::None,
            "clockevents_program_event"
        ));
        for hv in [
            Hypervisor::Kvm,
            Hypervisor::Xen,
            Hypervisor::HyperV,
            Hypervisor::Other,
        ] {
            assert_eq!(
                mechanism_of_msr(hv, 0x6e0),
                Some(Mechanism::Timer),
                "{hv:?}"
            );
            assert_eq!(mechanism_of_msr(hv, 0x830), Some(Mechanism::Ipi), "{hv:?}");
        }
        assert_eq!(mechanism_of_msr(Hypervisor::None, 0x6e0), None);
    }

    /// Xen's lock kicks go out through the IPI sender on their own vector: those calls are a
    /// kick path of their own, present wherever the sender is.
    #[test]
    fn xen_lock_kicks_sent_as_ipis_are_a_kick_path() {
        let split = argument_splits(Hypervisor::Xen)
            .iter()
            .find(|s| s.function == "xen_send_IPI_one")
            .expect("the IPI sender is split");
        assert_eq!(split.value.name(), "XEN_SPIN_UNLOCK_VECTOR");
        assert_eq!(
            mechanism_of_symbol(Hypervisor::Xen, split.symbol),
            Some(Mechanism::SpinlockKick)
        );
        assert_eq!(split_named(Hypervisor::Xen, split.symbol), Some(split));
        assert_eq!(split_named(Hypervisor::Kvm, split.symbol), None);
        let present = |has: &dyn Fn(&str) -> bool| {
            timed_paths(Hypervisor::Xen, has)
                .into_iter()
                .find(|p| p.names == [split.symbol])
                .expect("the kick sends are a path")
                .present
        };
        assert_eq!(present(&|s| s == "xen_send_IPI_one"), [split.symbol]);
        assert!(present(&|_| false).is_empty());
    }

    #[test]
    fn xen_programs_timers_and_sends_ipis_by_hypercall() {
        assert_eq!(
            mechanism_of_symbol(Hypervisor::Xen, "xen_vcpuop_set_next_event"),
            Some(Mechanism::Timer)
        );
        assert_eq!(
            mechanism_of_symbol(Hypervisor::Xen, "xen_send_IPI_one"),
            Some(Mechanism::Ipi)
        );
        assert_eq!(
            mechanism_of_symbol(Hypervisor::Kvm, "xen_send_IPI_one"),
            None
        );
    }

    #[test]
    fn a_path_is_timed_under_the_first_name_the_kernel_has() {
        // 5.10 names KVM's PV TLB flush kvm_flush_tlb_others; 5.13+ kvm_flush_tlb_multi.
        let old = timed_symbols(Hypervisor::Kvm, |s| {
            ["kvm_flush_tlb_others", "native_safe_halt", "kvm_wait"].contains(&s)
        });
        assert_eq!(
            old,
            ["native_safe_halt", "kvm_wait", "kvm_flush_tlb_others"]
        );
        let new = timed_symbols(Hypervisor::Kvm, |s| {
            [
                "kvm_flush_tlb_multi",
                "kvm_flush_tlb_others",
                "pv_native_safe_halt",
            ]
            .contains(&s)
        });
        assert_eq!(new, ["pv_native_safe_halt", "kvm_flush_tlb_multi"]);
    }

    #[test]
    fn every_mechanism_has_a_name_and_round_trips_through_serde() {
        for m in Mechanism::ALL {
            assert_eq!(serde_json::to_value(m).unwrap(), m.name());
        }
        for h in Hypervisor::ALL {
            assert_eq!(Hypervisor::of_name(h.name()), h);
        }
    }
}
