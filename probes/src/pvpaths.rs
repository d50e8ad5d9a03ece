//! Paravirt path timing: picks the hypervisor's callbacks this kernel has (kallsyms), then tries
//! fentry/fexit on each, and kprobes where fentry is refused, reporting per symbol exactly why
//! neither attached. The programs are in `bpf/pvpath.bpf.c`.

use std::mem::MaybeUninit;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};

use crate::attach::AttachOutcome;
use crate::bpf;
use crate::session::{Family, FamilyReport};
use crate::virt::{select_pv_symbols, Symbols};

/// The hypervisor a guest kernel talks to, from CPUID.
pub fn guest_hypervisor() -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        if __cpuid(1).ecx & (1 << 31) == 0 {
            return None;
        }
        let l = __cpuid(0x4000_0000);
        let sig: Vec<u8> = [l.ebx, l.ecx, l.edx]
            .iter()
            .flat_map(|r| r.to_le_bytes())
            .collect();
        let sig = String::from_utf8_lossy(&sig).to_string();
        return Some(if sig.starts_with("XenVMM") {
            "xen"
        } else if sig.starts_with("KVMKVMKVM") || sig.starts_with("Linux KVM") {
            "kvm"
        } else if sig.starts_with("Microsoft Hv") {
            "hyperv"
        } else {
            "other"
        });
    }
    #[allow(unreachable_code)]
    None
}

/// Why kprobes cannot be used on this kernel, if they cannot.
fn kprobes_unavailable() -> Option<String> {
    let pmu = std::path::Path::new("/sys/bus/event_source/devices/kprobe");
    if !pmu.exists() {
        return Some("kprobes: not in this kernel (no kprobe PMU; CONFIG_KPROBES off?)".into());
    }
    None
}

/// Tries fentry on `symbol`; Ok(()) if it loads and attaches (then detaches again).
fn try_fentry(symbol: &str) -> Result<(), String> {
    let mut slot = MaybeUninit::uninit();
    let mut open = bpf::pvpath::PvpathSkelBuilder::default()
        .open(&mut slot)
        .map_err(|e| format!("open: {e}"))?;
    open.progs
        .pv_fentry
        .set_attach_target(0, Some(symbol.to_string()))
        .map_err(|e| format!("{e}"))?;
    open.progs
        .pv_fexit
        .set_attach_target(0, Some(symbol.to_string()))
        .map_err(|e| format!("{e}"))?;
    open.progs.pv_kprobe.set_autoload(false);
    open.progs.pv_kretprobe.set_autoload(false);
    let skel = open.load().map_err(|e| format!("load: {e}"))?;
    let _entry = skel
        .progs
        .pv_fentry
        .attach()
        .map_err(|e| format!("attach: {e}"))?;
    let _exit = skel
        .progs
        .pv_fexit
        .attach()
        .map_err(|e| format!("attach: {e}"))?;
    Ok(())
}

/// Checks which paravirt paths could be timed on this host. Timing itself needs fentry or
/// kprobes; this version reports the attach result per symbol (and does not keep them attached).
pub fn probe(permission: &Result<(), String>) -> FamilyReport {
    let unavailable = |why: String| FamilyReport {
        family: Family::PvPaths,
        unavailable: Some(why),
        tracepoints: vec![],
    };
    if let Err(e) = permission {
        return unavailable(e.clone());
    }
    let Some(hv) = guest_hypervisor() else {
        return unavailable("not a guest: no hypervisor callbacks to time".into());
    };
    let symbols = Symbols::load();
    let selected = select_pv_symbols(hv, &symbols);
    if selected.is_empty() {
        return unavailable(format!(
            "no {hv} paravirt callbacks in this kernel's symbols"
        ));
    }
    let kprobes = kprobes_unavailable();
    let tracepoints = selected
        .into_iter()
        .map(|sym| match try_fentry(sym) {
            Ok(()) => AttachOutcome {
                tracepoint: sym.to_string(),
                attached: None,
                reason: Some(
                    "fentry attaches here; timing it is not built into this version".into(),
                ),
            },
            Err(fentry) => AttachOutcome {
                tracepoint: sym.to_string(),
                attached: None,
                reason: Some(format!(
                    "fentry: {fentry}; {}",
                    kprobes.clone().unwrap_or_else(|| {
                        "kprobes: available but not used by this version".into()
                    })
                )),
            },
        })
        .collect();
    FamilyReport {
        family: Family::PvPaths,
        unavailable: None,
        tracepoints,
    }
}
