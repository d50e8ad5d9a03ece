//! Paravirt path timing: the timed paths of the host's hypervisor table (`crate::hypervisor`),
//! each at the first of its functions that this kernel has (kallsyms) and that attaches: by
//! fentry/fexit where the function is traceable, else by kprobes: one object for all of them,
//! the function's index as the attach cookie, where the kernel has `bpf_get_attach_cookie`
//! (5.15+); else one object per function, bound to its index like the fentry objects. Every
//! path of the table is reported: attached how, absent on this kernel, or why it cannot be
//! traced. The programs are in `bpf/pvpath.bpf.c`.

use std::os::fd::AsFd;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapHandle, Object};

use super::{
    kprobes_unavailable, leaked_object_slot, sections_of, FamilyDef, LoadContext, LoadResult,
    LoadedFamily, Signals, Slots,
};
use crate::attach::{AttachKind, AttachOutcome};
use crate::bpf;
use crate::error::{BpfError, Unavailable};
use crate::hypervisor::{
    argument_splits, called_inside, function_of, split_named, timed_paths, ArgumentSplit,
    SplitValue,
};
use crate::model::ProbeSnapshot;
use crate::report::{Family, FamilyReport, ABSENT_ON_THIS_KERNEL};

pub(super) const FAMILY: FamilyDef = FamilyDef {
    name: "pv-paths",
    gives: "paravirt callback timing",
    view: "Hypervisor: PV path timings",
    // One attach point per timed path of the hypervisor's table, named for its function.
    signals: Signals::Each("paravirt callback timing"),
    modules: &[],
    load,
    sections: sections_of::<bpf::pvpath::PvpathSkelBuilder>,
};

/// How one object of `bpf/pvpath.bpf.c` is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flavour {
    /// fentry/fexit on one function.
    Fentry,
    /// kprobe/kretprobe on many functions, each link's cookie its index.
    KprobeCookies,
    /// kprobe/kretprobe on one function, for kernels without `bpf_get_attach_cookie`.
    KprobeOne,
    /// The hard-IRQ handler frames only (one object, whatever the others' flavour), on typed
    /// tracepoints where the kernel has them, else raw ones.
    Handlers { btf: bool },
}

/// What a one-function object (fentry, or a kprobe without cookies) is bound to: its
/// function's index, and how its calls divide.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Bound {
    index: u32,
    /// Calls with this second argument are another path's (see `ArgumentSplit`).
    split: Option<Split>,
    /// Calls made directly inside these paths' frames are theirs (see `CalledInside`).
    inside_of: Option<[u32; 2]>,
}

impl Bound {
    /// Only an object of its own can carry more than the index (a kprobe cookie is one
    /// number).
    fn plain(&self) -> bool {
        self.split.is_none() && self.inside_of.is_none()
    }
}

/// A split function's calls with `value` as their second argument are timed under `index`
/// (see `ArgumentSplit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Split {
    value: u64,
    index: u32,
}

type PvSkel = bpf::pvpath::PvpathSkel<'static>;

/// Opens and loads an object of `flavour`; `bound` binds the one-function flavours to their
/// function (`target`, for fentry, is set before load). With `stack`, the object's per-CPU
/// stack of calls in progress is that map: every object times against one stack per CPU, so a
/// path nested in another (or in an IRQ handler) is left out of the other's time.
fn load_object(
    flavour: Flavour,
    bound: Bound,
    target: Option<&str>,
    stack: Option<&MapHandle>,
) -> Result<PvSkel, BpfError> {
    let mut open = bpf::pvpath::PvpathSkelBuilder::default()
        .open(leaked_object_slot())
        .map_err(BpfError::Open)?;
    if let Some(stack) = stack {
        open.maps
            .stacks
            .reuse_fd(stack.as_fd())
            .map_err(BpfError::Open)?;
    }
    let progs = &mut open.progs;
    let (btf, raw) = match flavour {
        Flavour::Handlers { btf } => (btf, !btf),
        _ => (false, false),
    };
    progs.pv_handler_entry_btf.set_autoload(btf);
    progs.pv_handler_exit_btf.set_autoload(btf);
    progs.pv_handler_entry_raw.set_autoload(raw);
    progs.pv_handler_exit_raw.set_autoload(raw);
    let split = bound.split;
    let fentry_split = flavour == Flavour::Fentry && split.is_some();
    let kprobe_split = flavour == Flavour::KprobeOne && split.is_some();
    progs
        .pv_fentry
        .set_autoload(flavour == Flavour::Fentry && !fentry_split);
    progs
        .pv_fexit
        .set_autoload(flavour == Flavour::Fentry && !fentry_split);
    progs.pv_fentry_split.set_autoload(fentry_split);
    progs.pv_fexit_split.set_autoload(fentry_split);
    progs.pv_kprobe_split.set_autoload(kprobe_split);
    progs.pv_kretprobe_split.set_autoload(kprobe_split);
    progs
        .pv_kprobe
        .set_autoload(flavour == Flavour::KprobeCookies);
    progs
        .pv_kretprobe
        .set_autoload(flavour == Flavour::KprobeCookies);
    progs
        .pv_kprobe_one
        .set_autoload(flavour == Flavour::KprobeOne && !kprobe_split);
    progs
        .pv_kretprobe_one
        .set_autoload(flavour == Flavour::KprobeOne && !kprobe_split);
    if let Some(target) = target {
        let (entry, exit) = if fentry_split {
            (&mut progs.pv_fentry_split, &mut progs.pv_fexit_split)
        } else {
            (&mut progs.pv_fentry, &mut progs.pv_fexit)
        };
        for prog in [entry, exit] {
            prog.set_attach_target(0, Some(target.to_string()))
                .map_err(|source| BpfError::NoBtf {
                    symbol: target.to_string(),
                    source,
                })?;
        }
    }
    if flavour != Flavour::KprobeCookies {
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.symbol_index = bound.index;
            if let Some(split) = split {
                ro.split_value = split.value;
                ro.split_index = split.index;
            }
            if let Some(inside_of) = bound.inside_of {
                ro.inside_of = inside_of;
            }
        }
        // Its one function's histogram is all it keeps (a split function's, its two).
        let _ = open
            .maps
            .durations
            .set_max_entries(if split.is_some() { 2 } else { 1 });
    }
    open.load().map_err(|source| BpfError::Load {
        kind: None,
        source,
        why: None,
    })
}

/// Runs `f` with libbpf's messages captured: a failure says why in libbpf's words too ("failed
/// to find kernel BTF type ID of 'x'", why a kprobe would not attach).
fn explained<T>(f: impl FnOnce() -> Result<T, BpfError>) -> Result<T, String> {
    let (result, log) = crate::libbpf_log::captured(f);
    result.map_err(|e| with_why(&e, &log))
}

/// `e` in words, with the lines of libbpf's `log` that say why.
fn with_why(e: &BpfError, log: &str) -> String {
    match crate::libbpf_log::why(log, 3) {
        Some(why) => format!("{e}: {why}"),
        None => e.to_string(),
    }
}

/// fentry/fexit on `symbol`, as `bound` says.
fn fentry(
    symbol: &str,
    bound: Bound,
    stack: Option<&MapHandle>,
) -> Result<(PvSkel, Vec<libbpf_rs::Link>), BpfError> {
    let skel = load_object(Flavour::Fentry, bound, Some(symbol), stack)?;
    let (entry, exit) = match bound.split {
        Some(_) => (&skel.progs.pv_fentry_split, &skel.progs.pv_fexit_split),
        None => (&skel.progs.pv_fentry, &skel.progs.pv_fexit),
    };
    let entry = entry.attach().map_err(BpfError::Attach)?;
    let exit = exit.attach().map_err(BpfError::Attach)?;
    Ok((skel, vec![entry, exit]))
}

/// A kprobe and a kretprobe of `entry`/`exit` on `symbol`, with `cookie`.
fn kprobe_pair(
    entry: &libbpf_rs::ProgramMut<'_>,
    exit: &libbpf_rs::ProgramMut<'_>,
    symbol: &str,
    cookie: u64,
) -> Result<Vec<libbpf_rs::Link>, BpfError> {
    let opts = || libbpf_rs::KprobeOpts {
        cookie,
        ..Default::default()
    };
    let enter = entry
        .attach_kprobe_with_opts(false, symbol, opts())
        .map_err(BpfError::Kprobe)?;
    let leave = exit
        .attach_kprobe_with_opts(true, symbol, opts())
        .map_err(BpfError::Kretprobe)?;
    Ok(vec![enter, leave])
}

/// Whether kprobe programs may call `bpf_get_attach_cookie` here (5.15+).
fn attach_cookies_supported() -> bool {
    libbpf_rs::ProgramType::Kprobe
        .is_helper_supported(libbpf_rs::libbpf_sys::BPF_FUNC_get_attach_cookie)
        .unwrap_or(false)
}

/// Why a kprobe on `symbol` failed, with what the kernel says of it where it can tell: on the
/// kprobe blacklist (noinstr and __kprobes functions; debugfs shows it), or, for a function
/// without an ftrace site (`no_ftrace_site`), kprobe events refuse it (unless the kernel is
/// built with CONFIG_KPROBE_EVENTS_ON_NOTRACE, which distributions leave off).
fn kprobe_failure(symbol: &str, e: &str, no_ftrace_site: bool) -> String {
    let listed = std::fs::read_to_string("/sys/kernel/debug/kprobes/blacklist").is_ok_and(|t| {
        t.lines()
            .any(|l| l.split_whitespace().nth(1) == Some(symbol))
    });
    if listed {
        format!("{e} (on the kernel's kprobe blacklist)")
    } else if no_ftrace_site && (e.contains("EINVAL") || e.contains("Invalid argument")) {
        format!("{e} (kprobe events refuse functions without an ftrace site)")
    } else {
        e.to_string()
    }
}

/// Loaded paravirt-path timers: fentry objects, kprobe objects, or both.
struct PvTimer {
    /// The functions timed, by their index in the objects' maps.
    symbols: Vec<&'static str>,
    objects: Vec<PvSkel>,
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
    /// Entry -> return durations per attached function, cumulative.
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

/// Set (to anything), fentry is not tried: every function is timed by kprobes, as on a kernel
/// that refuses fentry (for the VM tier, which checks both ways).
const KPROBES_ONLY_VAR: &str = "VIRTGAP_PV_KPROBES";

/// Attaches to functions one at a time: fentry, else a kprobe (the cookie object shared by
/// all, or an object of its own), keeping what attached.
struct Attacher {
    /// fentry is left out (`KPROBES_ONLY_VAR`).
    kprobes_only: bool,
    /// Why kprobes cannot be used at all here, if they cannot.
    no_kprobes: Option<String>,
    cookies_supported: bool,
    /// The shared kprobe object, once loaded (or why it did not load).
    cookie_object: Option<Result<usize, String>>,
    /// The per-CPU stack of calls in progress every object shares (see `load_object`), from
    /// the first object that loaded.
    stack: Option<MapHandle>,
    objects: Vec<PvSkel>,
    links: Vec<libbpf_rs::Link>,
}

impl Attacher {
    fn new() -> Self {
        let no_kprobes = kprobes_unavailable();
        Self {
            kprobes_only: std::env::var_os(KPROBES_ONLY_VAR).is_some(),
            cookies_supported: no_kprobes.is_none() && attach_cookies_supported(),
            no_kprobes,
            cookie_object: None,
            stack: None,
            objects: Vec::new(),
            links: Vec::new(),
        }
    }

    /// Times `symbol` as `bound` says: how it attached, or why it could not.
    fn attach(&mut self, symbol: &str, bound: Bound) -> Result<AttachKind, String> {
        let (fentry_failed, no_ftrace_site) = if self.kprobes_only {
            (format!("left out ({KPROBES_ONLY_VAR} is set)"), false)
        } else {
            let stack = self.stack.as_ref();
            let (fentry, log) = crate::libbpf_log::captured(|| fentry(symbol, bound, stack));
            match fentry {
                Ok((skel, links)) => {
                    self.keep(skel);
                    self.links.extend(links);
                    return Ok(AttachKind::Fentry);
                }
                // A function in the BTF but without an ftrace site: the trampoline finds no
                // nop to patch (libbpf logs the errno).
                Err(e @ BpfError::Attach(_)) if log.contains("-EBUSY") => {
                    (format!("{} (no ftrace site)", with_why(&e, &log)), true)
                }
                Err(e) => (with_why(&e, &log), matches!(e, BpfError::NoBtf { .. })),
            }
        };
        if let Some(why) = &self.no_kprobes {
            return Err(format!("fentry: {fentry_failed}; {why}"));
        }
        let kprobe = if self.cookies_supported && bound.plain() {
            self.kprobe_with_cookie(symbol, bound.index)
        } else {
            let stack = self.stack.as_ref();
            explained(|| {
                let skel = load_object(Flavour::KprobeOne, bound, None, stack)?;
                let progs = &skel.progs;
                let (entry, exit) = match bound.split {
                    Some(_) => (&progs.pv_kprobe_split, &progs.pv_kretprobe_split),
                    None => (&progs.pv_kprobe_one, &progs.pv_kretprobe_one),
                };
                let links = kprobe_pair(entry, exit, symbol, 0)?;
                Ok((skel, links))
            })
            .map(|(skel, links)| {
                self.keep(skel);
                self.links.extend(links);
            })
        };
        kprobe.map(|()| AttachKind::Kprobe).map_err(|k| {
            format!(
                "fentry: {fentry_failed}; {}",
                kprobe_failure(symbol, &k, no_ftrace_site)
            )
        })
    }

    /// Keeps a loaded object; the first one's stack becomes everyone's.
    fn keep(&mut self, skel: PvSkel) {
        if self.stack.is_none() {
            self.stack = MapHandle::try_from(&skel.maps.stacks).ok();
        }
        self.objects.push(skel);
    }

    fn kprobe_with_cookie(&mut self, symbol: &str, index: u32) -> Result<(), String> {
        if self.cookie_object.is_none() {
            let loaded = explained(|| {
                load_object(
                    Flavour::KprobeCookies,
                    Bound::default(),
                    None,
                    self.stack.as_ref(),
                )
            });
            self.cookie_object = Some(match loaded {
                Ok(skel) => {
                    self.keep(skel);
                    Ok(self.objects.len() - 1)
                }
                Err(e) => Err(format!("kprobes: {e}")),
            });
        }
        let object = self
            .cookie_object
            .clone()
            .expect("the cookie object was just tried")?;
        let progs = &self.objects[object].progs;
        let links = explained(|| {
            kprobe_pair(
                &progs.pv_kprobe,
                &progs.pv_kretprobe,
                symbol,
                u64::from(index),
            )
        })?;
        self.links.extend(links);
        Ok(())
    }
}

/// How `split`'s calls are told apart on this kernel: its enumerator's value from the kernel's
/// BTF, the calls timed under `index`; else why they are not (they count as the function's).
fn split_value(
    kernel: &crate::attach::KernelTracepoints,
    split: &ArgumentSplit,
    index: u32,
) -> Result<Split, String> {
    let value = match split.value {
        SplitValue::Constant { value, .. } => value,
        SplitValue::Enumerator { enum_type, name } => kernel
            .enum_value(enum_type, name)
            // The argument as the program reads it: a 64-bit register or context slot, the
            // enum zero-extended (every enumerator of these is small and positive).
            .map(|v| v as u64)
            .ok_or_else(|| {
                format!(
                    "the kernel's BTF has no {name} in enum {enum_type}: these calls count as {}'s",
                    split.function
                )
            })?,
    };
    Ok(Split { value, index })
}

/// Where `symbol` is also called by other timed paths as their own work, the indexes of those
/// callers' frames (and their splits') among those `timed` so far: its calls made directly
/// inside them are left to them.
fn inside_of(hv: crate::hypervisor::Hypervisor, symbol: &str, timed: &[&str]) -> Option<[u32; 2]> {
    let called = called_inside(hv).iter().find(|c| c.function == symbol)?;
    let mut frames = called.callers.iter().flat_map(|&caller| {
        let split = argument_splits(hv)
            .iter()
            .find(|s| s.function == caller)
            .map(|s| s.symbol);
        [Some(caller), split]
            .into_iter()
            .flatten()
            .filter_map(|name| timed.iter().position(|t| *t == name))
    });
    // Two frames at most (a caller and its split); none timed: nothing to leave to them.
    let first = frames.next()? as u32;
    Some([first, frames.next().map_or(first, |i| i as u32)])
}

/// A split's own path as the report lists it: attached as its function was, or why not.
fn split_outcome(
    split: &ArgumentSplit,
    splits: &[(&'static str, Result<AttachKind, String>)],
) -> AttachOutcome {
    let (attached, reason) = match splits.iter().find(|(s, _)| *s == split.symbol) {
        Some((_, Ok(kind))) => (Some(*kind), None),
        Some((_, Err(why))) => (None, Some(why.clone())),
        None => (None, Some(format!("{} was not timed", split.function))),
    };
    AttachOutcome {
        tracepoint: split.symbol.to_string(),
        attached,
        reason,
    }
}

/// The hard-IRQ handler frames on `stack`: typed tracepoints, else raw ones (the others'
/// twins, as every family loads them).
fn handler_frames(stack: &MapHandle) -> Result<(PvSkel, [libbpf_rs::Link; 2]), String> {
    let attach = |btf: bool| {
        explained(|| {
            let skel = load_object(
                Flavour::Handlers { btf },
                Bound::default(),
                None,
                Some(stack),
            )?;
            let progs = &skel.progs;
            let (entry, exit) = if btf {
                (&progs.pv_handler_entry_btf, &progs.pv_handler_exit_btf)
            } else {
                (&progs.pv_handler_entry_raw, &progs.pv_handler_exit_raw)
            };
            let entry = entry.attach().map_err(BpfError::Attach)?;
            let exit = exit.attach().map_err(BpfError::Attach)?;
            Ok((skel, [entry, exit]))
        })
    };
    attach(true).or_else(|btf_failed| {
        attach(false).map_err(|raw_failed| format!("tp_btf: {btf_failed}; raw_tp: {raw_failed}"))
    })
}

/// Times the host hypervisor's timed paths this kernel has (on metal, the native callers a
/// guest's paths share): each path under the first of its
/// functions that attaches (fentry/fexit where the kernel allows it, else a kprobe). Reports
/// every path of the table: how it attached, absent on this kernel, or exactly why it could
/// not. Its objects live in leaked slots (see `leaked_object_slot`), not `slots`.
fn load<'obj>(cx: &LoadContext<'_>, _slots: &'obj mut Slots) -> LoadResult<'obj> {
    let unavailable = |why: Unavailable| FamilyReport::unavailable(Family::PvPaths, why);
    let hv = cx.hypervisor;
    if cx.symbols.is_empty() {
        return Err(unavailable(Unavailable::Other(
            "kallsyms is empty or its addresses hidden: which paths this kernel has is unknown"
                .into(),
        )));
    }
    let mut attacher = Attacher::new();
    let mut timed: Vec<&'static str> = Vec::new();
    // Each split's own path: timed as its function attached, or why not.
    let mut splits: Vec<(&'static str, Result<AttachKind, String>)> = Vec::new();
    let mut tracepoints = Vec::new();
    for path in timed_paths(hv, |s| cx.symbols.contains(s)) {
        if let Some(split) = path.present.first().and_then(|&s| split_named(hv, s)) {
            tracepoints.push(split_outcome(split, &splits));
            continue;
        }
        let Some(&first) = path.present.first() else {
            tracepoints.push(AttachOutcome {
                tracepoint: path.names[0].to_string(),
                attached: None,
                reason: Some(format!(
                    "{ABSENT_ON_THIS_KERNEL} (no {} in kallsyms)",
                    path.names
                        .iter()
                        .map(|&n| function_of(hv, n))
                        .collect::<Vec<_>>()
                        .join(" or ")
                )),
            });
            continue;
        };
        let mut failures = Vec::new();
        let mut outcome = None;
        for &symbol in &path.present {
            let split = argument_splits(hv).iter().find(|s| s.function == symbol);
            let split_value = split.map(|s| split_value(cx.kernel, s, timed.len() as u32 + 1));
            let bound = Bound {
                index: timed.len() as u32,
                split: split_value.clone().and_then(Result::ok),
                inside_of: inside_of(hv, symbol, &timed),
            };
            match attacher.attach(symbol, bound) {
                Ok(kind) => {
                    timed.push(symbol);
                    if let (Some(split), Some(value)) = (split, split_value) {
                        if value.is_ok() {
                            timed.push(split.symbol);
                        }
                        splits.push((split.symbol, value.map(|_| kind)));
                    }
                    outcome = Some(AttachOutcome {
                        tracepoint: symbol.to_string(),
                        attached: Some(kind),
                        reason: None,
                    });
                    break;
                }
                Err(why) => failures.push((symbol, why)),
            }
        }
        tracepoints.push(outcome.unwrap_or_else(|| {
            AttachOutcome {
                tracepoint: first.to_string(),
                attached: None,
                reason: Some(match failures.as_slice() {
                    // One function: the tracepoint names it.
                    [(_, why)] => why.clone(),
                    _ => failures
                        .iter()
                        .map(|(symbol, why)| format!("{symbol}: {why}"))
                        .collect::<Vec<_>>()
                        .join("; "),
                }),
            }
        }));
    }
    // Hard-IRQ handlers nested in a timed path get frames of their own (left out of its time);
    // where that cannot load, the paths' times include them, and the report says so. Only
    // where the table has an upcall, the path that runs the guest's handlers (Xen's event
    // channels, Hyper-V's VMBus interrupt): elsewhere handlers nest in no timed path but a
    // halt, whose time is time halted, and a second program on the hottest tracepoint is not
    // worth its cost (nor, under an emulator, the code patching that adding it takes).
    let upcalls = crate::hypervisor::paths(hv)
        .iter()
        .any(|p| p.mechanism == crate::hypervisor::Mechanism::Upcall);
    let fallback = match attacher
        .stack
        .as_ref()
        .filter(|_| upcalls && !timed.is_empty())
    {
        None => None,
        Some(stack) => match handler_frames(stack) {
            Ok((skel, links)) => {
                attacher.objects.push(skel);
                attacher.links.extend(links);
                None
            }
            Err(why) => Some(format!(
                "IRQ handlers run inside a timed path are counted in its time ({why})"
            )),
        },
    };
    let report = FamilyReport {
        family: Family::PvPaths,
        unavailable: None,
        tracepoints,
        fallback,
    };
    let timer = PvTimer {
        symbols: timed,
        objects: attacher.objects,
        _links: attacher.links,
    };
    Ok((Box::new(timer), report))
}

impl LoadedFamily for PvTimer {
    fn read(&self, snap: &mut ProbeSnapshot) {
        if !self.symbols.is_empty() {
            snap.pv_paths = Some(self.durations());
        }
    }

    fn objects(&self) -> Vec<&Object> {
        self.objects.iter().map(|o| o.object()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hypervisor::{self, Hypervisor, Measure};
    use crate::virt::Symbols;

    /// Excerpts of Debian's kernels' /proc/kallsyms (the VM tier's; every Debian kernel carries
    /// the Xen, KVM and Hyper-V guest code, so one table serves each hypervisor's guest).
    const DEBIAN_5_10: &str = include_str!("../../testdata/kallsyms-debian-5.10.txt");
    const DEBIAN_6_1: &str = include_str!("../../testdata/kallsyms-debian-6.1.txt");
    const DEBIAN_6_12: &str = include_str!("../../testdata/kallsyms-debian-6.12.txt");

    /// (path's newest name, the function timed) for each timed path; None: absent.
    fn chosen(hv: Hypervisor, kallsyms: &str) -> Vec<(&'static str, Option<&'static str>)> {
        let symbols = Symbols::parse(kallsyms);
        timed_paths(hv, |s| symbols.contains(s))
            .into_iter()
            .map(|p| (p.names[0], p.present.first().copied()))
            .collect()
    }

    #[test]
    fn xen_guests_time_their_hypercall_paths_under_each_kernels_names() {
        let common = |upcall, halt, tlb| {
            vec![
                (
                    "xen_vcpuop_set_next_event",
                    Some("xen_vcpuop_set_next_event"),
                ),
                ("xen_send_IPI_one", Some("xen_send_IPI_one")),
                ("eoi_pirq", Some("eoi_pirq")),
                ("xen_hvm_evtchn_do_upcall", Some(upcall)),
                ("pv_native_safe_halt", Some(halt)),
                ("xen_qlock_wait", Some("xen_qlock_wait")),
                ("xen_qlock_kick", Some("xen_qlock_kick")),
                (
                    "xen_send_IPI_one:XEN_SPIN_UNLOCK_VECTOR",
                    Some("xen_send_IPI_one:XEN_SPIN_UNLOCK_VECTOR"),
                ),
                ("xen_flush_tlb_multi", Some(tlb)),
                // Exported for the frontend modules, absent from these excerpts.
                ("notify_remote_via_irq", None),
            ]
        };
        // 5.10 (Amazon Linux 2's series): the HVM upcall and the TLB flush under their old
        // names, the native halt.
        assert_eq!(
            chosen(Hypervisor::Xen, DEBIAN_5_10),
            common(
                "xen_hvm_evtchn_do_upcall",
                "native_safe_halt",
                "xen_flush_tlb_others"
            )
        );
        // 6.1 (AL2023's series; Debian's carries the 2023 upcall rename).
        assert_eq!(
            chosen(Hypervisor::Xen, DEBIAN_6_1),
            common(
                "xen_evtchn_do_upcall",
                "native_safe_halt",
                "xen_flush_tlb_multi"
            )
        );
        assert_eq!(
            chosen(Hypervisor::Xen, DEBIAN_6_12),
            common(
                "xen_evtchn_do_upcall",
                "pv_native_safe_halt",
                "xen_flush_tlb_multi"
            )
        );
        // arch/x86/xen has no ftrace sites: where its callbacks cannot be hooked, their
        // traceable callers are tried next.
        let symbols = Symbols::parse(DEBIAN_5_10);
        let planned = timed_paths(Hypervisor::Xen, |s| symbols.contains(s));
        let present = |first: &str| {
            planned
                .iter()
                .find(|p| p.names[0] == first)
                .map(|p| p.present.clone())
                .unwrap()
        };
        assert_eq!(
            present("xen_vcpuop_set_next_event"),
            ["xen_vcpuop_set_next_event", "clockevents_program_event"]
        );
        assert_eq!(
            present("xen_qlock_kick"),
            ["xen_qlock_kick", "__pv_queued_spin_unlock_slowpath"]
        );
        assert_eq!(
            present("pv_native_safe_halt"),
            ["native_safe_halt", "default_idle"]
        );
    }

    /// Xen's doorbell is also the IPI sender's way out: its calls inside the sender's frames
    /// (or its kick calls') are left to them, found by their indexes among those timed.
    #[test]
    fn the_xen_doorbell_inside_the_ipi_sender_is_the_senders() {
        let timed = [
            "clockevents_program_event",
            "xen_send_IPI_one",
            "xen_send_IPI_one:XEN_SPIN_UNLOCK_VECTOR",
            "eoi_pirq",
        ];
        assert_eq!(
            inside_of(Hypervisor::Xen, "notify_remote_via_irq", &timed),
            Some([1, 2])
        );
        // The kick calls not told apart (no enumerator in BTF): the sender's frame alone.
        assert_eq!(
            inside_of(Hypervisor::Xen, "notify_remote_via_irq", &timed[..2]),
            Some([1, 1])
        );
        // The sender not timed: every call is a doorbell's.
        assert_eq!(
            inside_of(Hypervisor::Xen, "notify_remote_via_irq", &timed[..1]),
            None
        );
        assert_eq!(
            inside_of(Hypervisor::Kvm, "notify_remote_via_irq", &timed),
            None
        );
        assert_eq!(inside_of(Hypervisor::Xen, "eoi_pirq", &timed), None);
    }

    #[test]
    fn kvm_guests_time_the_pv_tlb_flush_under_its_5_10_name() {
        let kvm = |halt, tlb| {
            vec![
                (
                    "clockevents_program_event",
                    Some("clockevents_program_event"),
                ),
                ("kvm_send_ipi_mask", Some("kvm_send_ipi_mask")),
                (
                    "kvm_send_ipi_mask_allbutself",
                    Some("kvm_send_ipi_mask_allbutself"),
                ),
                ("kvm_guest_apic_eoi_write", Some("kvm_guest_apic_eoi_write")),
                ("pv_native_safe_halt", Some(halt)),
                ("kvm_wait", Some("kvm_wait")),
                ("kvm_kick_cpu", Some("kvm_kick_cpu")),
                ("kvm_flush_tlb_multi", Some(tlb)),
                // The virtio transports' notify: module functions (virtio_pci, virtio_mmio),
                // absent from these excerpts.
                ("vp_notify", None),
                ("vm_notify", None),
            ]
        };
        assert_eq!(
            chosen(Hypervisor::Kvm, DEBIAN_5_10),
            kvm("native_safe_halt", "kvm_flush_tlb_others")
        );
        assert_eq!(
            chosen(Hypervisor::Kvm, DEBIAN_6_1),
            kvm("native_safe_halt", "kvm_flush_tlb_multi")
        );
        assert_eq!(
            chosen(Hypervisor::Kvm, DEBIAN_6_12),
            kvm("pv_native_safe_halt", "kvm_flush_tlb_multi")
        );
    }

    #[test]
    fn a_module_function_is_absent_until_its_module_loads() {
        // vmbus_isr is hv_vmbus's, which loads only on Hyper-V.
        let hv = chosen(Hypervisor::HyperV, DEBIAN_6_1);
        assert!(hv.contains(&("vmbus_isr", None)), "{hv:?}");
        let with_module = format!("{DEBIAN_6_1}ffffffffc0402b10 t vmbus_isr\t[hv_vmbus]\n");
        assert!(
            chosen(Hypervisor::HyperV, &with_module).contains(&("vmbus_isr", Some("vmbus_isr")))
        );
        assert!(hv.contains(&("hyperv_flush_tlb_multi", Some("hyperv_flush_tlb_multi"))));
        let old = chosen(Hypervisor::HyperV, DEBIAN_5_10);
        assert!(old.contains(&("hyperv_flush_tlb_multi", Some("hyperv_flush_tlb_others"))));
    }

    #[test]
    fn every_timed_path_is_planned_once_and_metal_plans_the_native_callers() {
        let native: Vec<_> = timed_paths(Hypervisor::None, |_| true)
            .into_iter()
            .map(|p| p.names[0])
            .collect();
        assert_eq!(native, ["clockevents_program_event", "pv_native_safe_halt"]);
        for hv in Hypervisor::ALL {
            let timed = hypervisor::paths(hv)
                .iter()
                .filter(|p| matches!(p.measure, Measure::Timed(_)))
                .count();
            assert_eq!(timed_paths(hv, |_| false).len(), timed, "{hv:?}");
            // Each function is one path's: an index never names two.
            let planned = timed_paths(hv, |_| true);
            let mut symbols: Vec<_> = planned.iter().flat_map(|p| p.present.clone()).collect();
            let all = symbols.len();
            symbols.sort_unstable();
            symbols.dedup();
            assert_eq!(symbols.len(), all, "{hv:?}");
        }
    }

    /// Table functions that live in modules, absent from the kernel's own symbols until the
    /// module loads: Hyper-V's VMBus (hv_vmbus), the virtio transports (virtio_pci,
    /// virtio_mmio). The VM tier pins what they attach to where the module is loaded.
    const IN_MODULES: &[&str] = &["vmbus_isr", "vmbus_set_event", "vp_notify", "vm_notify"];

    /// Table functions the excerpts leave out that the kernel exports to modules: each of
    /// Debian's 5.10, 6.1 and 6.12 `xen-blkfront.ko` imports `notify_remote_via_irq` (`nm -u`).
    /// The VM tier attaches it on each.
    const EXPORTED: &[&str] = &["notify_remote_via_irq"];

    /// The table's every name was checked against a real kernel: each of them exists in one
    /// of Debian's 5.10, 6.1 and 6.12, or in one of its modules (`IN_MODULES`).
    #[test]
    fn every_name_in_the_table_exists_in_a_real_kernel() {
        let kernels: Vec<Symbols> = [DEBIAN_5_10, DEBIAN_6_1, DEBIAN_6_12]
            .iter()
            .map(|k| Symbols::parse(k))
            .collect();
        for hv in Hypervisor::ALL {
            for path in hypervisor::paths(hv) {
                if let Measure::Timed(names) = path.measure {
                    for name in names {
                        // A split's own path is its function's.
                        let name = &hypervisor::function_of(hv, name);
                        assert!(
                            IN_MODULES.contains(name)
                                || EXPORTED.contains(name)
                                || kernels.iter().any(|k| k.contains(name)),
                            "{name} ({hv:?}) is in none of Debian's kernels"
                        );
                    }
                }
            }
        }
    }
}

/// The shared stack's frames run for real in the kernel: a hard-IRQ handler run inside a timed
/// path is a frame of its own whose time is left to its parent's `nested_ns`; outside every
/// timed path it leaves no frame.
#[cfg(test)]
mod handler_frames {
    use std::time::Duration;

    use libbpf_rs::{MapCore, MapFlags};

    use super::super::test_run::{bpf_allowed, now_ns, run_on_cpu0};
    use super::*;

    type Stack = bpf::pvpath::types::vg_pv_stack;

    /// Every CPU's stack set to `stack`.
    fn set_stack(skel: &PvSkel, stack: &Stack) {
        // SAFETY: `vg_pv_stack` is the skeleton's plain C struct (explicit padding, no pointers).
        let bytes = unsafe { plain::as_bytes(stack) }.to_vec();
        let cpus = libbpf_rs::num_possible_cpus().expect("possible CPUs");
        skel.maps
            .stacks
            .update_percpu(&0u32.to_ne_bytes(), &vec![bytes; cpus], MapFlags::ANY)
            .expect("stack written");
    }

    fn cpu0_stack(skel: &PvSkel) -> Stack {
        let per_cpu = skel
            .maps
            .stacks
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .expect("stack read")
            .expect("stack present");
        let mut stack = Stack::default();
        plain::copy_from_bytes(&mut stack, &per_cpu[0]).expect("a vg_pv_stack");
        stack
    }

    #[test]
    fn a_handler_inside_a_timed_path_is_left_out_of_its_time() {
        if !bpf_allowed("pv-paths handler frames test") {
            return;
        }
        let skel = load_object(
            Flavour::Handlers { btf: false },
            Bound::default(),
            None,
            None,
        )
        .expect("handler frames load");
        // The raw twins: test runs need no attach target.
        let (entry, exit) = (
            &skel.progs.pv_handler_entry_raw,
            &skel.progs.pv_handler_exit_raw,
        );
        // One path open on every CPU (its start 1 ms ago), as a kprobe on it would leave it.
        let mut open = Stack {
            depth: 1,
            ..Default::default()
        };
        open.frames[0].ts = now_ns() - 1_000_000;
        open.frames[0].index = 3;
        set_stack(&skel, &open);
        run_on_cpu0(entry, &[24, 0]);
        assert_eq!(cpu0_stack(&skel).depth, 2, "the handler's frame pushed");
        std::thread::sleep(Duration::from_millis(20));
        run_on_cpu0(exit, &[24, 0, 1]);
        let after = cpu0_stack(&skel);
        assert_eq!(
            after.depth, 1,
            "the handler's frame popped, the path's left"
        );
        assert_eq!(after.frames[0].index, 3);
        let nested = after.frames[0].nested_ns;
        assert!(
            (20_000_000..2_000_000_000).contains(&nested),
            "the handler's ~20 ms is the path's nested time: {nested} ns"
        );
        // No path open: a handler leaves no frame, and an exit without its entry pops nothing.
        set_stack(&skel, &Stack::default());
        run_on_cpu0(entry, &[24, 0]);
        assert_eq!(cpu0_stack(&skel).depth, 0);
        set_stack(&skel, &open);
        run_on_cpu0(exit, &[24, 0, 1]);
        let untouched = cpu0_stack(&skel);
        assert_eq!((untouched.depth, untouched.frames[0].nested_ns), (1, 0));
        // A path whose return was missed, left above the handler's frame: the handler's exit
        // drops it with its own frame rather than leaving both for good.
        run_on_cpu0(entry, &[24, 0]);
        let mut stale = cpu0_stack(&skel);
        stale.frames[2] = stale.frames[0];
        stale.depth = 3;
        set_stack(&skel, &stale);
        run_on_cpu0(exit, &[24, 0, 1]);
        assert_eq!(cpu0_stack(&skel).depth, 1, "the stale frame dropped");
        // A stack full of frames never returned from starts afresh at the next entry.
        let mut full = open;
        full.frames = [open.frames[0]; 8];
        full.depth = 8;
        set_stack(&skel, &full);
        run_on_cpu0(entry, &[24, 0]);
        let fresh = cpu0_stack(&skel);
        assert_eq!(
            fresh.depth, 1,
            "a full stack started afresh with the handler's frame"
        );
    }
}
