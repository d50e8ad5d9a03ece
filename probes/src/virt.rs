//! What the hypervisor looks like from the probes: names of exit-causing MSRs, KVM exit reasons
//! (VMX and SVM), classification of sampled kernel symbols, and the paravirt callbacks worth
//! timing on each hypervisor. Pure tables and functions, unit-tested on fixtures.

use serde::{Deserialize, Serialize};

/// A name for an MSR number, for the ones that matter in a guest.
pub fn msr_name(msr: u32) -> &'static str {
    match msr {
        0x6e0 => "IA32_TSC_DEADLINE (timer)",
        0x830 => "x2APIC ICR (IPI)",
        0x838 => "x2APIC TMICT (timer)",
        0x80b => "x2APIC EOI",
        0x4000_0070 => "Hyper-V EOI",
        0x4000_0071 => "Hyper-V ICR",
        0x4000_0072 => "Hyper-V TPR",
        0x4000_00b0..=0x4000_00b7 => "Hyper-V STIMER",
        0x4b56_4d00..=0x4b56_4d08 => "KVM paravirt (kvm-clock, steal, PV EOI)",
        0x10 => "IA32_TSC",
        0x1b => "IA32_APIC_BASE",
        0x48 => "IA32_SPEC_CTRL",
        0x49 => "IA32_PRED_CMD",
        _ => "other",
    }
}

/// Whether a guest's write to `msr` exits to `hypervisor` ("kvm", "xen", "hyperv", "other";
/// "none" on metal, where nothing exits). Only MSRs known to trap are labelled: the TSC-deadline
/// timer, the x2APIC ICR (IPIs) and timer-count registers, and Hyper-V's synthetic MSRs. EOI
/// is left out (APICv and AVIC complete it without an exit), as are MSRs modern KVM passes
/// through (SPEC_CTRL, PRED_CMD, FS/GS base).
pub fn msr_exits(hypervisor: &str, msr: u32) -> bool {
    let timer_or_ipi = matches!(msr, 0x6e0 | 0x830 | 0x838);
    let hyperv_synthetic = (0x4000_0000..=0x4000_00ff).contains(&msr);
    match hypervisor {
        "none" => false,
        "hyperv" => timer_or_ipi || hyperv_synthetic,
        // KVM also emulates Hyper-V's MSRs for Windows-enlightened guests.
        "kvm" => timer_or_ipi || hyperv_synthetic || (0x4b56_4d00..=0x4b56_4dff).contains(&msr),
        _ => timer_or_ipi,
    }
}

/// KVM's `isa` field of kvm_exit: 1 = Intel VMX, 2 = AMD SVM.
pub fn exit_reason_name(isa: u32, reason: u32) -> String {
    let name = match isa {
        1 => match reason {
            0 => "EXCEPTION_NMI",
            1 => "EXTERNAL_INTERRUPT",
            2 => "TRIPLE_FAULT",
            7 => "INTERRUPT_WINDOW",
            10 => "CPUID",
            12 => "HLT",
            18 => "VMCALL",
            28 => "CR_ACCESS",
            30 => "IO_INSTRUCTION",
            31 => "MSR_READ",
            32 => "MSR_WRITE",
            40 => "PAUSE_INSTRUCTION",
            44 => "APIC_ACCESS",
            45 => "EOI_INDUCED",
            48 => "EPT_VIOLATION",
            49 => "EPT_MISCONFIG",
            52 => "PREEMPTION_TIMER",
            55 => "XSETBV",
            56 => "APIC_WRITE",
            _ => "",
        },
        2 => match reason {
            0x060 => "INTR",
            0x061 => "NMI",
            0x064 => "VINTR",
            0x072 => "CPUID",
            0x078 => "HLT",
            0x07b => "IOIO",
            0x07c => "MSR",
            0x080 => "VMMCALL",
            0x400 => "NPF",
            0x401 => "AVIC_INCOMPLETE_IPI",
            0x402 => "AVIC_UNACCELERATED_ACCESS",
            0x403 => "VMGEXIT",
            _ => "",
        },
        _ => "",
    };
    if name.is_empty() {
        format!("reason {reason}")
    } else {
        name.to_string()
    }
}

/// Where a CPU-clock sample landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SampleCategory {
    /// Hypercall stubs, paravirt callbacks, trapping MSR accessors: time charged to the
    /// hypervisor interface.
    Hypervisor,
    Idle,
    HardIrq,
    SoftIrq,
    /// Block layer and storage drivers.
    Block,
    OtherKernel,
    User,
}

impl SampleCategory {
    pub const ALL: [SampleCategory; 7] = [
        Self::Hypervisor,
        Self::Idle,
        Self::HardIrq,
        Self::SoftIrq,
        Self::Block,
        Self::OtherKernel,
        Self::User,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Hypervisor => "hypervisor interface",
            Self::Idle => "idle/halt",
            Self::HardIrq => "hard IRQ",
            Self::SoftIrq => "softirq",
            Self::Block => "block and driver",
            Self::OtherKernel => "other kernel",
            Self::User => "user",
        }
    }

    /// The key under which a CPU's rarely sampled symbols of this category are counted
    /// together once it has seen too many distinct ones (see `CpuSamples::fold`).
    pub fn folded_key(self) -> String {
        format!("[other {}]", self.name())
    }

    fn of_folded_key(sym: &str) -> Option<Self> {
        let name = sym.strip_prefix("[other ")?.strip_suffix(']')?;
        Self::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// Sorts a kernel symbol into a category. Idle comes first: `pv_native_safe_halt` is a halt,
/// not hypervisor work the guest asked for.
pub fn classify_symbol(sym: &str) -> SampleCategory {
    use SampleCategory::*;
    if let Some(folded) = SampleCategory::of_folded_key(sym) {
        return folded;
    }
    let s = sym.trim_start_matches('_');
    let starts = |p: &[&str]| p.iter().any(|x| s.starts_with(x));
    let contains = |p: &[&str]| p.iter().any(|x| s.contains(x));
    if contains(&["safe_halt", "_idle", "idle_", "haltpoll", "mwait"])
        || s == "do_idle"
        || s == "cpu_idle_poll"
    {
        return Idle;
    }
    if starts(&[
        "xen_hypercall",
        "hypercall_page",
        "pvm_",
        "pv_",
        "hv_",
        "kvm_clock",
        "kvm_steal",
        "kvm_send_ipi",
        "kvm_guest_apic",
        "kvm_flush_tlb",
        "kvm_kick",
        "kvm_wait",
        "kvm_hypercall",
        "pvclock",
        "native_write_msr",
        "native_read_msr",
        "xen_",
    ]) || s == "lapic_next_deadline"
    {
        return Hypervisor;
    }
    if contains(&[
        "softirq",
        "net_rx_action",
        "tasklet",
        "rcu_core",
        "run_timer",
    ]) {
        return SoftIrq;
    }
    if starts(&[
        "sysvec_",
        "asm_sysvec",
        "handle_irq",
        "handle_edge_irq",
        "handle_fasteoi",
        "common_interrupt",
        "asm_common_interrupt",
        "irq_",
        "vring_interrupt",
        "vp_interrupt",
        "vm_interrupt",
        "nvme_irq",
        "virtblk_done",
        "handle_irq_event",
    ]) || s.ends_with("_interrupt")
    {
        return HardIrq;
    }
    if starts(&[
        "blk_",
        "bio_",
        "submit_bio",
        "virtblk",
        "virtqueue",
        "vring_",
        "nvme_",
        "dd_",
        "bfq_",
        "kyber_",
        "scsi_",
        "iomap_dio",
        "io_uring",
        "io_issue",
        "io_read",
        "io_write",
        "io_submit",
        "__io_",
    ]) {
        return Block;
    }
    OtherKernel
}

/// What the CPU says about a hypervisor: the CPUID leaf 1 ECX bit 31 and the leaf 0x40000000
/// vendor signature (e.g. "KVMKVMKVM", "XenVMMXenVMM", "Microsoft Hv"), when present.
pub fn cpuid_hypervisor() -> (bool, Option<String>) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // CPUID exists on every x86_64 CPU; an absent leaf returns harmless values.
        if __cpuid(1).ecx & (1 << 31) == 0 {
            return (false, None);
        }
        let leaf = __cpuid(0x4000_0000);
        let bytes: Vec<u8> = [leaf.ebx, leaf.ecx, leaf.edx]
            .iter()
            .flat_map(|r| r.to_le_bytes())
            .collect();
        let signature = String::from_utf8_lossy(&bytes)
            .trim_end_matches('\0')
            .trim()
            .to_string();
        return (true, (!signature.is_empty()).then_some(signature));
    }
    #[allow(unreachable_code)]
    (false, None)
}

/// A kernel symbol table sorted by address, for resolving sampled IPs.
#[derive(Clone, Debug, Default)]
pub struct Symbols {
    entries: Vec<(u64, String)>,
}

impl Symbols {
    /// Parses /proc/kallsyms text (text symbols only).
    pub fn parse(kallsyms: &str) -> Self {
        let mut entries: Vec<(u64, String)> = kallsyms
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let kind = f.next()?;
                let name = f.next()?;
                (addr != 0 && matches!(kind, "t" | "T" | "w" | "W"))
                    .then(|| (addr, name.to_string()))
            })
            .collect();
        entries.sort_by_key(|e| e.0);
        Self { entries }
    }

    pub fn load() -> Self {
        std::fs::read_to_string("/proc/kallsyms")
            .map(|t| Self::parse(&t))
            .unwrap_or_default()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.iter().any(|e| e.1 == name)
    }

    /// Address of a text symbol; None when absent or hidden by kptr_restrict.
    pub fn address(&self, name: &str) -> Option<u64> {
        self.entries.iter().find(|e| e.1 == name).map(|e| e.0)
    }

    /// The symbol an address falls in.
    pub fn resolve(&self, ip: u64) -> Option<&str> {
        let i = self.entries.partition_point(|e| e.0 <= ip);
        i.checked_sub(1).map(|i| self.entries[i].1.as_str())
    }
}

/// Paravirt callbacks worth timing, per hypervisor (from the kernel sources' pv-op tables);
/// "any" lists native paths that exit to every hypervisor: the local APIC timer's reprogram,
/// as a TSC-deadline MSR write or as a timer-count register write.
pub const PV_SYMBOLS: &[(&str, &[&str])] = &[
    ("any", &["lapic_next_deadline", "lapic_next_event"]),
    (
        "xen",
        &[
            "xen_send_IPI_one",
            "xen_vcpuop_set_next_event",
            "eoi_pirq",
            "xen_qlock_wait",
            "xen_evtchn_do_upcall",
            "pvclock_clocksource_read",
        ],
    ),
    (
        "kvm",
        &[
            "kvm_send_ipi_mask",
            "kvm_wait",
            "kvm_kick_cpu",
            "kvm_flush_tlb_multi",
        ],
    ),
    (
        "hyperv",
        &[
            "hv_send_ipi",
            "hv_send_ipi_mask",
            "hv_send_ipi_mask_allbutself",
        ],
    ),
];

/// The paravirt symbols of guest `hypervisor` ("none" on metal) this kernel has (kallsyms),
/// in table order.
pub fn select_pv_symbols(hypervisor: &str, symbols: &Symbols) -> Vec<&'static str> {
    PV_SYMBOLS
        .iter()
        .filter(|(hv, _)| *hv == hypervisor || (*hv == "any" && hypervisor != "none"))
        .flat_map(|(_, list)| list.iter().copied())
        .filter(|s| symbols.contains(s))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const XEN_GUEST: &str = "\
ffffffff81001000 T xen_hypercall_hvm
ffffffff81002000 t xen_send_IPI_one
ffffffff81003000 t xen_vcpuop_set_next_event
ffffffff81004000 t eoi_pirq
ffffffff81005000 T pvclock_clocksource_read
ffffffff81006000 T xen_evtchn_do_upcall
ffffffff81007000 T native_safe_halt
ffffffff81008000 T blk_mq_start_request
";

    const KVM_GUEST: &str = "\
ffffffff81100000 t kvm_send_ipi_mask
ffffffff81101000 t lapic_next_deadline
ffffffff81102000 t kvm_wait
ffffffff81103000 T pv_native_safe_halt
ffffffff81104000 T native_write_msr
ffffffff81105000 T __do_softirq
ffffffff81106000 T sysvec_apic_timer_interrupt
ffffffff81107000 T virtblk_done
ffffffff81108000 T schedule
";

    #[test]
    fn selects_the_pv_paths_each_kernel_has() {
        let xen = Symbols::parse(XEN_GUEST);
        assert_eq!(
            select_pv_symbols("xen", &xen),
            [
                "xen_send_IPI_one",
                "xen_vcpuop_set_next_event",
                "eoi_pirq",
                "xen_evtchn_do_upcall",
                "pvclock_clocksource_read"
            ]
        );
        let kvm = Symbols::parse(KVM_GUEST);
        assert_eq!(
            select_pv_symbols("kvm", &kvm),
            ["lapic_next_deadline", "kvm_send_ipi_mask", "kvm_wait"]
        );
        // The timer write exits under any hypervisor; other hypervisors' callbacks are absent.
        assert_eq!(select_pv_symbols("xen", &kvm), ["lapic_next_deadline"]);
        assert_eq!(select_pv_symbols("other", &kvm), ["lapic_next_deadline"]);
        assert!(select_pv_symbols("none", &kvm).is_empty());
    }

    #[test]
    fn resolves_ips_to_the_enclosing_symbol() {
        let kvm = Symbols::parse(KVM_GUEST);
        assert_eq!(kvm.resolve(0xffffffff81103010), Some("pv_native_safe_halt"));
        assert_eq!(kvm.resolve(0xffffffff81100000), Some("kvm_send_ipi_mask"));
        assert_eq!(kvm.resolve(0x1000), None);
    }

    #[test]
    fn classifies_symbols() {
        use SampleCategory::*;
        for (sym, cat) in [
            ("pv_native_safe_halt", Idle),
            ("default_idle", Idle),
            ("xen_hypercall_hvm", Hypervisor),
            ("xen_hypercall_event_channel_op", Hypervisor),
            ("native_write_msr", Hypervisor),
            ("kvm_send_ipi_mask", Hypervisor),
            ("lapic_next_deadline", Hypervisor),
            ("__do_softirq", SoftIrq),
            ("handle_softirqs", SoftIrq),
            ("sysvec_apic_timer_interrupt", HardIrq),
            ("vring_interrupt", HardIrq),
            ("virtblk_done", HardIrq),
            ("blk_mq_start_request", Block),
            ("io_uring_enter", Block),
            ("schedule", OtherKernel),
        ] {
            assert_eq!(classify_symbol(sym), cat, "{sym}");
        }
    }

    #[test]
    fn names_msrs_and_exit_reasons() {
        assert_eq!(msr_name(0x6e0), "IA32_TSC_DEADLINE (timer)");
        assert_eq!(msr_name(0x830), "x2APIC ICR (IPI)");
        assert_eq!(msr_name(0x4000_0071), "Hyper-V ICR");
        assert_eq!(msr_name(0x1234), "other");
        assert_eq!(exit_reason_name(1, 30), "IO_INSTRUCTION");
        assert_eq!(exit_reason_name(1, 32), "MSR_WRITE");
        assert_eq!(exit_reason_name(2, 0x7b), "IOIO");
        assert_eq!(exit_reason_name(2, 0x400), "NPF");
        assert_eq!(exit_reason_name(1, 999), "reason 999");
    }

    #[test]
    fn finds_symbols() {
        let ks = Symbols::parse(
            "ffffffff81b010a0 t __blk_mq_complete_request_remote\n\
ffffffff81b01000 T blk_mq_complete_request\n0000000000000000 t hidden_sym\n",
        );
        assert_eq!(
            ks.address("__blk_mq_complete_request_remote"),
            Some(0xffffffff81b010a0)
        );
        assert_eq!(ks.address("hidden_sym"), None);
        assert_eq!(ks.address("missing"), None);
    }
}
