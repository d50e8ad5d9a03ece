//! Paravirt path timing: picks the hypervisor's callbacks this kernel has (kallsyms), then tries
//! fentry/fexit on each, and kprobes where fentry is refused, reporting per symbol exactly why
//! neither attached. The programs are in `bpf/pvpath.bpf.c`.

use libbpf_rs::skel::{OpenSkel, SkelBuilder};

use libbpf_rs::skel::Skel;
use libbpf_rs::Object;

use super::{
    kprobes_unavailable, leaked_object_slot, sections_of, FamilyDef, LoadContext, LoadResult,
    LoadedFamily, Signals, Slots,
};
use crate::attach::AttachOutcome;
use crate::bpf;
use crate::error::{BpfError, Unavailable};
use crate::model::ProbeSnapshot;
use crate::report::{Family, FamilyReport};
use crate::virt::select_pv_symbols;

pub(super) const FAMILY: FamilyDef = FamilyDef {
    name: "pv-paths",
    gives: "paravirt callback timing",
    view: "Hypervisor: PV path timings",
    // One attach point per callback this kernel has, named for its symbol.
    signals: Signals::Each("paravirt callback timing"),
    modules: &[],
    load,
    sections: sections_of::<bpf::pvpath::PvpathSkelBuilder>,
};

/// The hypervisor a guest kernel talks to, from CPUID.
pub fn guest_hypervisor() -> Option<&'static str> {
    let (hypervisor_bit, signature) = crate::virt::cpuid_hypervisor();
    if !hypervisor_bit {
        return None;
    }
    let sig = signature.unwrap_or_default();
    Some(if sig.starts_with("XenVMM") {
        "xen"
    } else if sig.starts_with("KVMKVMKVM") || sig.starts_with("Linux KVM") {
        "kvm"
    } else if sig.starts_with("Microsoft Hv") {
        "hyperv"
    } else {
        "other"
    })
}

/// Loaded paravirt-path timers: fentry objects (one per symbol) or one kprobe object.
struct PvTimer {
    symbols: Vec<&'static str>,
    objects: Vec<bpf::pvpath::PvpathSkel<'static>>,
    _links: Vec<libbpf_rs::Link>,
}

impl std::fmt::Debug for PvTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PvTimer")
            .field("symbols", &self.symbols)
            .finish_non_exhaustive()
    }
}

impl PvTimer {
    /// Entry -> return durations per symbol, cumulative.
    fn durations(&self) -> crate::model::PvPathSnapshot {
        use libbpf_rs::{MapCore, MapFlags};
        let mut paths: Vec<crate::model::PvPathHist> = self
            .symbols
            .iter()
            .map(|s| crate::model::PvPathHist {
                symbol: s.to_string(),
                hist: crate::KernelHist::default(),
            })
            .collect();
        for obj in &self.objects {
            let map = &obj.maps.durations;
            for key in map.keys() {
                let (Ok(raw), Ok(Some(v))) = (
                    <[u8; 4]>::try_from(&key[..]),
                    map.lookup(&key, MapFlags::ANY),
                ) else {
                    continue;
                };
                let mut h = bpf::pvpath::types::vg_hist::default();
                if plain::copy_from_bytes(&mut h, &v).is_err() {
                    continue;
                }
                if let Some(p) = paths.get_mut(u32::from_ne_bytes(raw) as usize) {
                    p.hist.merge(&crate::KernelHist::from(&h));
                }
            }
        }
        crate::model::PvPathSnapshot { paths }
    }
}

/// fentry/fexit on `symbol`, recorded under `index`.
fn fentry(
    symbol: &str,
    index: u32,
) -> Result<(bpf::pvpath::PvpathSkel<'static>, Vec<libbpf_rs::Link>), BpfError> {
    let mut open = bpf::pvpath::PvpathSkelBuilder::default()
        .open(leaked_object_slot())
        .map_err(BpfError::Open)?;
    open.progs
        .pv_fentry
        .set_attach_target(0, Some(symbol.to_string()))
        .map_err(BpfError::Retarget)?;
    open.progs
        .pv_fexit
        .set_attach_target(0, Some(symbol.to_string()))
        .map_err(BpfError::Retarget)?;
    open.progs.pv_kprobe.set_autoload(false);
    open.progs.pv_kretprobe.set_autoload(false);
    if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
        ro.symbol_index = index;
    }
    let (skel, log) = crate::libbpf_log::captured(|| open.load());
    let skel = skel.map_err(|e| BpfError::load(None, e, &log, 3))?;
    let entry = skel.progs.pv_fentry.attach().map_err(BpfError::Attach)?;
    let exit = skel.progs.pv_fexit.attach().map_err(BpfError::Attach)?;
    Ok((skel, vec![entry, exit]))
}

/// Links of each symbol's kprobe pair, or why it did not attach.
type KprobeLinks = Vec<Result<Vec<libbpf_rs::Link>, BpfError>>;

/// One kprobe object attached to every symbol, the symbol's index as the attach cookie.
fn kprobes(symbols: &[&str]) -> Result<(bpf::pvpath::PvpathSkel<'static>, KprobeLinks), BpfError> {
    let mut open = bpf::pvpath::PvpathSkelBuilder::default()
        .open(leaked_object_slot())
        .map_err(BpfError::Open)?;
    open.progs.pv_fentry.set_autoload(false);
    open.progs.pv_fexit.set_autoload(false);
    let skel = open.load().map_err(|source| BpfError::Load {
        kind: None,
        source,
        why: None,
    })?;
    let attached = symbols
        .iter()
        .enumerate()
        .map(|(i, sym)| {
            let opts = || libbpf_rs::KprobeOpts {
                cookie: i as u64,
                ..Default::default()
            };
            let entry = skel
                .progs
                .pv_kprobe
                .attach_kprobe_with_opts(false, sym, opts())
                .map_err(BpfError::Kprobe)?;
            let exit = skel
                .progs
                .pv_kretprobe
                .attach_kprobe_with_opts(true, sym, opts())
                .map_err(BpfError::Kretprobe)?;
            Ok(vec![entry, exit])
        })
        .collect();
    Ok((skel, attached))
}

/// Times the hypervisor's paravirt callbacks this kernel has: fentry/fexit where the kernel
/// allows it, kprobes for the symbols where it does not. Reports per symbol how it attached or
/// exactly why it could not. Its objects live in leaked slots (see `object_slot`), not `slots`.
fn load<'obj>(cx: &LoadContext<'_>, _slots: &'obj mut Slots) -> LoadResult<'obj> {
    let unavailable =
        |why: String| FamilyReport::unavailable(Family::PvPaths, Unavailable::Other(why));
    let Some(hv) = guest_hypervisor() else {
        return Err(unavailable(
            "not a guest: no hypervisor callbacks to time".into(),
        ));
    };
    let symbols: &crate::virt::Symbols = cx.symbols;
    let selected = select_pv_symbols(hv, symbols);
    if selected.is_empty() {
        return Err(unavailable(format!(
            "no {hv} paravirt callbacks in this kernel's symbols"
        )));
    }
    let mut objects = Vec::new();
    let mut links = Vec::new();
    let mut outcomes = Vec::new();
    let mut need_kprobe = Vec::new();
    for (i, sym) in selected.iter().enumerate() {
        match fentry(sym, i as u32) {
            Ok((skel, l)) => {
                objects.push(skel);
                links.extend(l);
                outcomes.push(AttachOutcome {
                    tracepoint: sym.to_string(),
                    attached: Some(crate::AttachKind::Fentry),
                    reason: None,
                });
            }
            Err(e) => need_kprobe.push((i, *sym, e)),
        }
    }
    if !need_kprobe.is_empty() {
        match kprobes_unavailable() {
            Some(why) => {
                outcomes.extend(need_kprobe.iter().map(|(_, sym, fentry)| AttachOutcome {
                    tracepoint: sym.to_string(),
                    attached: None,
                    reason: Some(format!("fentry: {fentry}; {why}")),
                }))
            }
            None => {
                // Kprobe cookies index into `selected`, so attach the whole list and keep only
                // the links of the symbols fentry could not take.
                match kprobes(&selected) {
                    Ok((skel, attached)) => {
                        for (i, sym, fentry) in &need_kprobe {
                            match &attached[*i] {
                                Ok(_) => outcomes.push(AttachOutcome {
                                    tracepoint: sym.to_string(),
                                    attached: Some(crate::AttachKind::Kprobe),
                                    reason: None,
                                }),
                                Err(k) => outcomes.push(AttachOutcome {
                                    tracepoint: sym.to_string(),
                                    attached: None,
                                    reason: Some(format!("fentry: {fentry}; {k}")),
                                }),
                            }
                        }
                        for (i, a) in attached.into_iter().enumerate() {
                            if let Ok(l) = a {
                                if need_kprobe.iter().any(|(j, ..)| *j == i) {
                                    links.extend(l);
                                }
                            }
                        }
                        objects.push(skel);
                    }
                    Err(e) => {
                        outcomes.extend(need_kprobe.iter().map(|(_, sym, fentry)| AttachOutcome {
                            tracepoint: sym.to_string(),
                            attached: None,
                            reason: Some(format!("fentry: {fentry}; kprobes: {e}")),
                        }))
                    }
                }
            }
        }
    }
    let report = FamilyReport {
        family: Family::PvPaths,
        unavailable: None,
        tracepoints: outcomes,
        fallback: None,
    };
    let timer = PvTimer {
        symbols: selected,
        objects,
        _links: links,
    };
    Ok((Box::new(timer), report))
}

impl LoadedFamily for PvTimer {
    fn read(&self, snap: &mut ProbeSnapshot) {
        if !self.objects.is_empty() {
            snap.pv_paths = Some(self.durations());
        }
    }

    fn objects(&self) -> Vec<&Object> {
        self.objects.iter().map(|o| o.object()).collect()
    }
}
