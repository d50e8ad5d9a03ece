//! What the hypervisor looks like from the probes: which hypervisor this is (from every CPUID
//! hypervisor leaf and `/sys/hypervisor/type`), names of exit-causing MSRs, KVM exit reasons
//! (VMX and SVM), and classification of sampled kernel symbols. Pure tables and functions,
//! unit-tested on fixtures; what each hypervisor does per mechanism is `crate::hypervisor`'s.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::hypervisor::Hypervisor;

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

/// Whether a guest's write to `msr` exits to `hypervisor` (on metal nothing exits). Only MSRs
/// known to trap are labelled: the TSC-deadline timer, the x2APIC ICR (IPIs) and timer-count
/// registers, and Hyper-V's synthetic MSRs. EOI is left out (APICv and AVIC complete it without
/// an exit), as are MSRs modern KVM passes through (SPEC_CTRL, PRED_CMD, FS/GS base).
pub fn msr_exits(hypervisor: Hypervisor, msr: u32) -> bool {
    let timer_or_ipi = matches!(msr, 0x6e0 | 0x830 | 0x838);
    let hyperv_synthetic = (0x4000_0000..=0x4000_00ff).contains(&msr);
    match hypervisor {
        Hypervisor::None => false,
        Hypervisor::HyperV => timer_or_ipi || hyperv_synthetic,
        // KVM also emulates Hyper-V's MSRs for Windows-enlightened guests.
        Hypervisor::Kvm => {
            timer_or_ipi || hyperv_synthetic || (0x4b56_4d00..=0x4b56_4dff).contains(&msr)
        }
        Hypervisor::Xen | Hypervisor::Vmware | Hypervisor::Other => timer_or_ipi,
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
    /// Hypercall stubs and pages, the hypervisor's timed paths, trapping MSR and APIC
    /// accessors: time charged to the hypervisor interface (never on metal).
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

/// Sorts a kernel symbol sampled on a host running on `hypervisor` into a category. Idle comes
/// first: `pv_native_safe_halt` is a halt, not hypervisor work the guest asked for. What is the
/// hypervisor interface depends on the hypervisor (`hypervisor::is_interface_symbol`): on metal
/// nothing is.
pub fn classify_symbol(sym: &str, hypervisor: Hypervisor) -> SampleCategory {
    use SampleCategory::*;
    if let Some(folded) = SampleCategory::of_folded_key(sym) {
        return folded;
    }
    let s = sym.trim_start_matches('_');
    let starts = |p: &[&str]| p.iter().any(|x| s.starts_with(x));
    let contains = |p: &[&str]| p.iter().any(|x| s.contains(x));
    // A Xen PV guest halts by SCHEDOP_block: an idle CPU's samples land on the return from
    // the sched_op hypercall stub (its halt, not work asked of the hypervisor; the lock waits
    // that poll through it are a sliver beside idle).
    if contains(&["safe_halt", "_idle", "idle_", "haltpoll", "mwait"])
        || s == "do_idle"
        || s == "cpu_idle_poll"
        || s.starts_with("xen_hypercall_sched_op")
    {
        return Idle;
    }
    if crate::hypervisor::is_interface_symbol(hypervisor, sym) {
        return SampleCategory::Hypervisor;
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

/// One leaf of the CPUID hypervisor range (0x40000000 + n × 0x100) that answers: the interface a
/// guest finds there. A Xen guest may show Viridian (Hyper-V) at 0x40000000 and Xen at
/// 0x40000100; KVM with Hyper-V enlightenments shows "Microsoft Hv" or "Linux KVM Hv" first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CpuidLeaf {
    pub leaf: u32,
    /// EAX: the highest leaf of this interface (0 from older KVM, meaning leaf + 1).
    pub max_leaf: u32,
    /// EBX, ECX, EDX as text, trailing NULs and spaces trimmed ("XenVMMXenVMM", "KVMKVMKVM").
    pub signature: String,
}

/// One CPUID leaf's registers, as the CPU answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CpuidRegisters {
    pub leaf: u32,
    pub eax: u32,
    pub ebx: u32,
    pub ecx: u32,
    pub edx: u32,
}

/// The feature and hint leaves kept after each interface's first leaf (KVM's features are at
/// +1, Hyper-V's privileges, recommendations and limits at +3..+5, Xen's HVM features at +4).
const FEATURE_LEAVES: u32 = 0x10;

/// Everything that says which hypervisor a host runs on, and what it decides.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HypervisorEvidence {
    /// CPUID leaf 1 ECX bit 31.
    pub hypervisor_bit: bool,
    /// The hypervisor leaves that answer, lowest first (not read without the hypervisor bit:
    /// there, Intel CPUs answer these leaves with the highest basic leaf's values).
    pub leaves: Vec<CpuidLeaf>,
    /// `/sys/hypervisor/type` (Xen's driver writes it).
    pub sys_hypervisor_type: Option<String>,
    /// Each interface's feature and hint leaves (what it offers: PV IPIs, PV EOI, ...).
    pub features: Vec<CpuidRegisters>,
    /// What all of it decides (`hypervisor_of`).
    #[schemars(with = "String")]
    pub hypervisor: Hypervisor,
}

/// The first hypervisor leaf and the step between interfaces.
const HYPERVISOR_LEAVES: std::ops::RangeInclusive<u32> = 0x4000_0000..=0x4000_ff00;
const LEAF_STEP: usize = 0x100;

/// Reads this host: the CPU's CPUID and `/sys/hypervisor/type` under `root` ("/" on a live
/// host).
pub fn detect_hypervisor(root: &Path) -> HypervisorEvidence {
    detect_hypervisor_with(root, cpu_cpuid)
}

/// Reads the evidence with `cpuid` (leaf -> (eax, ebx, ecx, edx)) standing for the CPU, and
/// `/sys/hypervisor/type` under `root`.
pub fn detect_hypervisor_with(
    root: &Path,
    cpuid: impl Fn(u32) -> (u32, u32, u32, u32),
) -> HypervisorEvidence {
    let hypervisor_bit = cpuid(1).2 & (1 << 31) != 0;
    let leaves: Vec<CpuidLeaf> = if hypervisor_bit {
        HYPERVISOR_LEAVES
            .step_by(LEAF_STEP)
            .filter_map(|leaf| hypervisor_leaf(leaf, cpuid(leaf)))
            .collect()
    } else {
        Vec::new()
    };
    let features = leaves
        .iter()
        .flat_map(|l| {
            // An older KVM answers 0: its interface ends at the next leaf.
            let last = l.max_leaf.clamp(l.leaf + 1, l.leaf + FEATURE_LEAVES);
            (l.leaf + 1..=last).map(|leaf| {
                let (eax, ebx, ecx, edx) = cpuid(leaf);
                CpuidRegisters {
                    leaf,
                    eax,
                    ebx,
                    ecx,
                    edx,
                }
            })
        })
        .collect();
    let sys_hypervisor_type = std::fs::read_to_string(root.join("sys/hypervisor/type"))
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty());
    let hypervisor = hypervisor_of(hypervisor_bit, &leaves, sys_hypervisor_type.as_deref());
    HypervisorEvidence {
        hypervisor_bit,
        leaves,
        sys_hypervisor_type,
        features,
        hypervisor,
    }
}

/// A leaf's answer as a hypervisor interface, or None where nothing answers: a signature of
/// printable text and a highest leaf within its own block (a leaf no interface claims returns
/// zeros, or on Intel the highest basic leaf's values).
fn hypervisor_leaf(leaf: u32, (eax, ebx, ecx, edx): (u32, u32, u32, u32)) -> Option<CpuidLeaf> {
    let bytes: Vec<u8> = [ebx, ecx, edx]
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .collect();
    let text = bytes.iter().all(|&b| b == 0 || (0x20..0x7f).contains(&b));
    let printable = bytes.iter().filter(|&&b| b > 0x20).count();
    let in_block = eax == 0 || (leaf..=leaf + 0xff).contains(&eax);
    if !text || printable < 4 || !in_block {
        return None;
    }
    let signature = String::from_utf8_lossy(&bytes)
        .trim_end_matches(['\0', ' '])
        .to_string();
    Some(CpuidLeaf {
        leaf,
        max_leaf: eax,
        signature,
    })
}

/// Whether the host whose CPUID answered `leaves` and `features` offers what `offer` decides:
/// None where it cannot tell (the interface or its feature leaf was not read).
pub fn offered(
    offer: &crate::hypervisor::Offer,
    leaves: &[CpuidLeaf],
    features: &[CpuidRegisters],
) -> Option<bool> {
    let base = leaves.iter().find(|l| l.signature == offer.signature)?.leaf;
    let regs = features.iter().find(|r| r.leaf == base + offer.offset)?;
    let value = match offer.register {
        "eax" => regs.eax,
        "ebx" => regs.ebx,
        "ecx" => regs.ecx,
        _ => regs.edx,
    };
    Some(value & (1 << offer.bit) != 0)
}

/// The hypervisor the evidence points to. Xen and KVM may also expose Hyper-V's interface
/// (Viridian; enlightenments for Windows guests) in the first leaf, so their own signature
/// anywhere in the range wins over Hyper-V's; `/sys/hypervisor/type` "xen" is Xen (the kernel's
/// own finding). No hypervisor bit and no Xen driver: metal.
pub fn hypervisor_of(
    hypervisor_bit: bool,
    leaves: &[CpuidLeaf],
    sys_hypervisor_type: Option<&str>,
) -> Hypervisor {
    let signed = |prefix: &str| leaves.iter().any(|l| l.signature.starts_with(prefix));
    if sys_hypervisor_type == Some("xen") || signed("XenVMM") {
        Hypervisor::Xen
    } else if !hypervisor_bit {
        Hypervisor::None
    } else if signed("KVMKVMKVM") || signed("Linux KVM Hv") {
        Hypervisor::Kvm
    } else if signed("Microsoft Hv") {
        Hypervisor::HyperV
    } else if signed("VMwareVMware") {
        Hypervisor::Vmware
    } else {
        Hypervisor::Other
    }
}

/// CPUID on this CPU (zeros off x86_64).
fn cpu_cpuid(leaf: u32) -> (u32, u32, u32, u32) {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID exists on every x86_64 CPU; an absent leaf returns harmless values.
        let r = std::arch::x86_64::__cpuid(leaf);
        (r.eax, r.ebx, r.ecx, r.edx)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = leaf;
        (0, 0, 0, 0)
    }
}

/// What the CPU says about a hypervisor: the CPUID leaf 1 ECX bit 31 and the leaf 0x40000000
/// vendor signature (e.g. "KVMKVMKVM", "XenVMMXenVMM", "Microsoft Hv"), when present.
pub fn cpuid_hypervisor() -> (bool, Option<String>) {
    let hypervisor_bit = cpu_cpuid(1).2 & (1 << 31) != 0;
    if !hypervisor_bit {
        return (false, None);
    }
    let signature = hypervisor_leaf(0x4000_0000, cpu_cpuid(0x4000_0000)).map(|l| l.signature);
    (true, signature)
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

    /// [start, end) of a text symbol: from its address to the next symbol's.
    pub fn range(&self, name: &str) -> Option<(u64, u64)> {
        let i = self.entries.iter().position(|e| e.1 == name)?;
        let start = self.entries[i].0;
        let end = self.entries[i + 1..]
            .iter()
            .map(|e| e.0)
            .find(|&a| a > start)?;
        Some((start, end))
    }

    /// The symbol an address falls in.
    pub fn resolve(&self, ip: u64) -> Option<&str> {
        let i = self.entries.partition_point(|e| e.0 <= ip);
        i.checked_sub(1).map(|i| self.entries[i].1.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn resolves_ips_to_the_enclosing_symbol() {
        let kvm = Symbols::parse(KVM_GUEST);
        assert_eq!(kvm.resolve(0xffffffff81103010), Some("pv_native_safe_halt"));
        assert_eq!(kvm.resolve(0xffffffff81100000), Some("kvm_send_ipi_mask"));
        assert_eq!(kvm.resolve(0x1000), None);
    }

    #[test]
    fn classifies_symbols_the_same_on_every_host_outside_the_hypervisor_interface() {
        use SampleCategory::*;
        for hv in crate::hypervisor::Hypervisor::ALL {
            for (sym, cat) in [
                ("pv_native_safe_halt", Idle),
                ("native_safe_halt", Idle),
                ("xen_safe_halt", Idle),
                ("default_idle", Idle),
                ("__do_softirq", SoftIrq),
                ("handle_softirqs", SoftIrq),
                ("sysvec_apic_timer_interrupt", HardIrq),
                ("vring_interrupt", HardIrq),
                ("virtblk_done", HardIrq),
                ("blk_mq_start_request", Block),
                ("io_uring_enter", Block),
                ("schedule", OtherKernel),
                ("pvclock_clocksource_read", OtherKernel),
                ("[other hypervisor interface]", Hypervisor),
            ] {
                assert_eq!(classify_symbol(sym, hv), cat, "{sym} on {hv:?}");
            }
        }
    }

    /// On metal nothing is hypervisor interface; in a guest its own hypercall stubs, the
    /// functions of its timed paths and the trapping accessors are, and no other hypervisor's.
    #[test]
    fn the_hypervisor_interface_is_the_hosts_own() {
        use Hypervisor as H;
        let interface = |sym: &str, hv| classify_symbol(sym, hv) == SampleCategory::Hypervisor;
        for (sym, on) in [
            (
                "native_write_msr",
                &[H::Kvm, H::Xen, H::HyperV, H::Vmware, H::Other][..],
            ),
            (
                "lapic_next_deadline",
                &[H::Kvm, H::Xen, H::HyperV, H::Vmware, H::Other],
            ),
            (
                "__x2apic_send_IPI_dest",
                &[H::Kvm, H::Xen, H::HyperV, H::Vmware, H::Other],
            ),
            ("xen_hypercall_intel", &[H::Xen]),
            ("hypercall_page", &[H::Xen]),
            ("xen_send_IPI_one", &[H::Xen]),
            ("xen_vcpuop_set_next_event", &[H::Xen]),
            ("__xen_evtchn_do_upcall", &[H::Xen]),
            ("eoi_pirq.isra.0", &[H::Xen]),
            ("kvm_send_ipi_mask", &[H::Kvm]),
            ("kvm_kick_cpu", &[H::Kvm]),
            ("kvm_flush_tlb_others", &[H::Kvm]),
            ("kvm_smp_send_call_func_ipi", &[H::Kvm]),
            ("__send_ipi_mask", &[H::Kvm, H::HyperV]),
            ("hv_send_ipi_mask", &[H::HyperV]),
            ("hv_ce_set_next_event", &[H::HyperV]),
            ("vmbus_isr", &[H::HyperV]),
        ] {
            for hv in Hypervisor::ALL {
                assert_eq!(interface(sym, hv), on.contains(&hv), "{sym} on {hv:?}");
            }
        }
        // A PV guest's halt is the sched_op hypercall (SCHEDOP_block): idle, on every host.
        for hv in Hypervisor::ALL {
            assert_eq!(
                classify_symbol("xen_hypercall_sched_op", hv),
                SampleCategory::Idle
            );
        }
        // Host-side KVM and a Xen PV-only helper are not a guest's interface.
        assert!(!interface("kvm_vcpu_halt", H::Kvm));
        assert!(!interface("xen_hvm_init_time_ops", H::Xen));
    }

    /// CPUID fixtures: leaf -> (eax, ebx, ecx, edx); unlisted leaves answer as `rest` does.
    fn cpu(
        bit: bool,
        leaves: &'static [(u32, u32, &'static str)],
        rest: (u32, u32, u32, u32),
    ) -> impl Fn(u32) -> (u32, u32, u32, u32) {
        move |leaf| {
            if leaf == 1 {
                return (0x806f8, 0, if bit { 1 << 31 } else { 0 }, 0);
            }
            match leaves.iter().find(|l| l.0 == leaf) {
                Some(&(_, max, sig)) => {
                    let mut b = [0u8; 12];
                    b[..sig.len()].copy_from_slice(sig.as_bytes());
                    let r = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
                    (max, r(0), r(4), r(8))
                }
                None => rest,
            }
        }
    }

    /// Intel answers a leaf no interface claims with the highest basic leaf's values; AMD with
    /// zeros.
    const INTEL_UNCLAIMED: (u32, u32, u32, u32) =
        (0x0000_0bb8, 0x0000_0064, 0x0000_0000, 0x0001_0000);
    const ZEROS: (u32, u32, u32, u32) = (0, 0, 0, 0);

    fn fixture_root(sys_hypervisor_type: Option<&str>) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        if let Some(t) = sys_hypervisor_type {
            std::fs::create_dir_all(root.path().join("sys/hypervisor")).unwrap();
            std::fs::write(root.path().join("sys/hypervisor/type"), format!("{t}\n")).unwrap();
        }
        root
    }

    /// The feature leaves after each interface's first are kept as the CPU answered them: KVM's
    /// one (an older KVM answering 0 for its highest leaf has it too), Hyper-V's through its
    /// highest.
    #[test]
    fn keeps_each_interfaces_feature_leaves() {
        let sig = |s: &[u8; 12]| {
            let r = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
            (r(0), r(4), r(8))
        };
        let (kb, kc, kd) = sig(b"KVMKVMKVM\0\0\0");
        let (hb, hc, hd) = sig(b"Microsoft Hv");
        let cpuid = |leaf: u32| match leaf {
            1 => (0, 0, 1 << 31, 0),
            0x4000_0000 => (0x4000_0004, hb, hc, hd),
            0x4000_0100 => (0, kb, kc, kd),
            l @ 0x4000_0001..=0x4000_0004 => (l, 0, 0, 0),
            0x4000_0101 => (0x0a00, 0, 0, 0),
            _ => (0, 0, 0, 0),
        };
        let e = detect_hypervisor_with(fixture_root(None).path(), cpuid);
        let leaves: Vec<(u32, u32)> = e.features.iter().map(|r| (r.leaf, r.eax)).collect();
        assert_eq!(
            leaves,
            [
                (0x4000_0001, 0x4000_0001),
                (0x4000_0002, 0x4000_0002),
                (0x4000_0003, 0x4000_0003),
                (0x4000_0004, 0x4000_0004),
                (0x4000_0101, 0x0a00),
            ]
        );
    }

    #[test]
    fn detects_the_hypervisor_from_every_leaf_and_sysfs() {
        use Hypervisor as H;
        let leaf = |leaf, max_leaf, signature: &str| CpuidLeaf {
            leaf,
            max_leaf,
            signature: signature.into(),
        };
        // (case, hypervisor bit, leaves, unclaimed leaves, /sys/hypervisor/type, expected
        // hypervisor, expected leaves kept)
        type Case = (
            &'static str,
            bool,
            &'static [(u32, u32, &'static str)],
            (u32, u32, u32, u32),
            Option<&'static str>,
            Hypervisor,
        );
        let cases: [Case; 8] = [
            (
                "Xen HVM (i3)",
                true,
                &[(0x4000_0000, 0x4000_0005, "XenVMMXenVMM")],
                INTEL_UNCLAIMED,
                Some("xen"),
                H::Xen,
            ),
            (
                "Xen HVM with Viridian first",
                true,
                &[
                    (0x4000_0000, 0x4000_0006, "Microsoft Hv"),
                    (0x4000_0100, 0x4000_0105, "XenVMMXenVMM"),
                ],
                INTEL_UNCLAIMED,
                Some("xen"),
                H::Xen,
            ),
            (
                "Xen with Viridian, no Xen driver loaded",
                true,
                &[
                    (0x4000_0000, 0x4000_0006, "Microsoft Hv"),
                    (0x4000_0100, 0x4000_0105, "XenVMMXenVMM"),
                ],
                ZEROS,
                None,
                H::Xen,
            ),
            (
                "KVM (Nitro)",
                true,
                &[(0x4000_0000, 0x4000_0001, "KVMKVMKVM")],
                ZEROS,
                None,
                H::Kvm,
            ),
            (
                "KVM with Hyper-V enlightenments",
                true,
                &[
                    (0x4000_0000, 0x4000_000b, "Microsoft Hv"),
                    (0x4000_0100, 0x4000_0101, "KVMKVMKVM"),
                ],
                INTEL_UNCLAIMED,
                None,
                H::Kvm,
            ),
            (
                "Hyper-V (Azure)",
                true,
                &[(0x4000_0000, 0x4000_000c, "Microsoft Hv")],
                ZEROS,
                None,
                H::HyperV,
            ),
            (
                "an unknown hypervisor (QEMU TCG)",
                true,
                &[],
                ZEROS,
                None,
                H::Other,
            ),
            ("metal", false, &[], INTEL_UNCLAIMED, None, H::None),
        ];
        for (case, bit, leaves, rest, sys, expected) in cases {
            let root = fixture_root(sys);
            let e = detect_hypervisor_with(root.path(), cpu(bit, leaves, rest));
            assert_eq!(e.hypervisor, expected, "{case}");
            assert_eq!(e.hypervisor_bit, bit, "{case}");
            assert_eq!(e.sys_hypervisor_type.as_deref(), sys, "{case}");
            // Every interface that answers is kept, as data, and nothing else.
            let kept: Vec<CpuidLeaf> = leaves
                .iter()
                .map(|&(l, max, sig)| leaf(l, max, sig.trim_end()))
                .collect();
            assert_eq!(e.leaves, kept, "{case}");
        }
    }

    #[test]
    fn a_xen_pv_guest_without_the_hypervisor_bit_is_xen() {
        let root = fixture_root(Some("xen"));
        let e = detect_hypervisor_with(root.path(), cpu(false, &[], ZEROS));
        assert_eq!(e.hypervisor, Hypervisor::Xen);
        assert!(e.leaves.is_empty());
    }

    #[test]
    fn older_kvm_answers_max_leaf_zero() {
        let root = fixture_root(None);
        let e = detect_hypervisor_with(
            root.path(),
            cpu(true, &[(0x4000_0000, 0, "KVMKVMKVM")], ZEROS),
        );
        assert_eq!(e.hypervisor, Hypervisor::Kvm);
        assert_eq!(e.leaves[0].max_leaf, 0);
    }

    #[test]
    fn this_hosts_evidence_agrees_with_its_first_leaf() {
        let e = detect_hypervisor(Path::new("/"));
        let (bit, first) = cpuid_hypervisor();
        assert_eq!(e.hypervisor_bit, bit);
        assert_eq!(
            e.leaves
                .iter()
                .find(|l| l.leaf == 0x4000_0000)
                .map(|l| l.signature.clone()),
            first
        );
        assert_eq!(
            e.hypervisor == Hypervisor::None,
            !bit && e.sys_hypervisor_type.is_none()
        );
    }

    #[test]
    fn which_msr_writes_exit_depends_on_the_hypervisor() {
        assert!(!msr_exits(Hypervisor::None, 0x6e0));
        for hv in [
            Hypervisor::Kvm,
            Hypervisor::Xen,
            Hypervisor::HyperV,
            Hypervisor::Other,
        ] {
            assert!(msr_exits(hv, 0x6e0) && msr_exits(hv, 0x830), "{hv:?}");
        }
        assert!(msr_exits(Hypervisor::HyperV, 0x4000_0071));
        assert!(!msr_exits(Hypervisor::Xen, 0x4000_0071));
        assert!(msr_exits(Hypervisor::Kvm, 0x4b56_4d02));
        assert!(!msr_exits(Hypervisor::Kvm, 0x48));
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
