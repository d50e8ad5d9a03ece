//! Choosing and attaching programs. Every tracepoint program comes as a `tp_btf` version and a
//! `raw_tp` twin, and where a tracepoint's arguments changed between kernels, as one variant per
//! layout. Before load, exactly the programs this kernel can run are enabled; after load, each
//! attaches on its own, so one failure costs one signal.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::ptr::NonNull;

use libbpf_rs::btf::types::{FuncProto, Struct, Typedef};
use libbpf_rs::btf::{Btf, BtfKind, BtfType, ReferencesType};
use libbpf_rs::{AsRawLibbpf, Link, Object, OpenObject};
use serde::{Deserialize, Serialize};

/// How a program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AttachKind {
    /// BTF-enabled tracepoint: typed arguments, cheapest.
    TpBtf,
    /// Raw tracepoint: the same arguments without BTF typing.
    RawTp,
    /// A perf event (the sampler's cpu-clock).
    PerfEvent,
    /// Classic tracepoint through tracefs: only where the formatted fields are needed.
    Tracepoint,
    /// fentry/fexit trampolines on a kernel function.
    Fentry,
    /// kprobe/kretprobe on a kernel function.
    Kprobe,
}

impl AttachKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::TpBtf => "tp_btf",
            Self::RawTp => "raw_tp",
            Self::PerfEvent => "perf_event",
            Self::Tracepoint => "tracepoint",
            Self::Fentry => "fentry",
            Self::Kprobe => "kprobe",
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Self::TpBtf => "_btf",
            Self::RawTp => "_raw",
            Self::PerfEvent | Self::Tracepoint | Self::Fentry | Self::Kprobe => "",
        }
    }
}

/// A module's split BTF (`/sys/kernel/btf/<module>`), parsed against vmlinux's.
struct ModuleBtf {
    name: String,
    ptr: NonNull<libbpf_rs::libbpf_sys::btf>,
}

impl ModuleBtf {
    fn load(name: &str, vmlinux: &Btf<'static>) -> Option<Self> {
        let c_name = CString::new(name).ok()?;
        // SAFETY: both pointers are valid for the call; libbpf returns a new BTF object we own
        // (freed in Drop) or an error pointer / NULL, which libbpf_get_error tells apart.
        let ptr = unsafe {
            let p = libbpf_rs::libbpf_sys::btf__load_module_btf(
                c_name.as_ptr(),
                vmlinux.as_libbpf_object().as_ptr(),
            );
            if libbpf_rs::libbpf_sys::libbpf_get_error(p.cast()) != 0 {
                return None;
            }
            p
        };
        Some(Self {
            name: name.to_string(),
            ptr: NonNull::new(ptr)?,
        })
    }

    fn has_typedef(&self, name: &str) -> bool {
        let Ok(c_name) = CString::new(name) else {
            return false;
        };
        // SAFETY: ptr is a live BTF object owned by self; the name is NUL-terminated.
        unsafe {
            libbpf_rs::libbpf_sys::btf__find_by_name_kind(
                self.ptr.as_ptr(),
                c_name.as_ptr(),
                libbpf_rs::libbpf_sys::BTF_KIND_TYPEDEF,
            ) >= 0
        }
    }
}

impl Drop for ModuleBtf {
    fn drop(&mut self) {
        // SAFETY: ptr came from btf__load_module_btf and is freed exactly once.
        unsafe { libbpf_rs::libbpf_sys::btf__free(self.ptr.as_ptr()) }
    }
}

/// What this kernel's BTF says about its tracepoints (`btf_trace_<name>` typedefs), in vmlinux
/// and in the loaded modules.
#[derive(Default)]
pub struct KernelTracepoints {
    /// None when the kernel exposes no BTF; then only raw_tp programs are tried.
    btf: Option<Btf<'static>>,
    modules: Vec<ModuleBtf>,
    /// The modules whose tracepoints the families use, loaded or not.
    traced: Vec<TracedModule>,
}

impl std::fmt::Debug for KernelTracepoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelTracepoints")
            .field("btf", &self.btf.is_some())
            .field(
                "modules",
                &self.modules.iter().map(|m| &m.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A kernel module whose tracepoints a family uses (a family's definition names it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracedModule {
    pub name: &'static str,
    /// Its tracepoints' name prefix.
    pub prefix: &'static str,
    /// Its tracefs event system.
    pub system: &'static str,
}

impl TracedModule {
    /// Whether the module is loaded.
    pub fn loaded(&self) -> bool {
        std::path::Path::new("/sys/module").join(self.name).exists()
    }
}

impl KernelTracepoints {
    /// Reads vmlinux's BTF, and that of the `traced` modules that are loaded.
    pub fn load(traced: &[TracedModule]) -> Self {
        let btf = Btf::from_vmlinux().ok();
        let modules = btf
            .as_ref()
            .map(|vmlinux| {
                traced
                    .iter()
                    .filter(|m| {
                        std::path::Path::new("/sys/kernel/btf")
                            .join(m.name)
                            .exists()
                    })
                    .filter_map(|m| ModuleBtf::load(m.name, vmlinux))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            btf,
            modules,
            traced: traced.to_vec(),
        }
    }

    pub fn has_btf(&self) -> bool {
        self.btf.is_some()
    }

    /// Whether tracepoint `name` exists, in vmlinux or a loaded module. Without BTF to say
    /// (no kernel BTF, or a module built without it, as on 5.10), tracefs decides when it is
    /// mounted, else the answer is "assume yes" and the attach itself decides.
    pub fn has(&self, name: &str) -> bool {
        let typedef = format!("btf_trace_{name}");
        let Some(btf) = &self.btf else {
            return true;
        };
        if btf.type_by_name::<Typedef<'_>>(&typedef).is_some()
            || self.modules.iter().any(|m| m.has_typedef(&typedef))
        {
            return true;
        }
        // A module tracepoint whose module is loaded but exposes no BTF.
        self.traced.iter().any(|m| {
            name.starts_with(m.prefix)
                && m.loaded()
                && !self.has_module_btf(m.name)
                && tracefs_has(m.system, name).unwrap_or(true)
        })
    }

    /// Whether tracepoint `name` is built into the kernel image (vmlinux BTF names it).
    pub fn in_vmlinux(&self, name: &str) -> bool {
        self.btf.as_ref().is_some_and(|btf| {
            btf.type_by_name::<Typedef<'_>>(&format!("btf_trace_{name}"))
                .is_some()
        })
    }

    /// Whether vmlinux's `struct <name>` has a member `member` at its top level. None when BTF
    /// does not say (no kernel BTF, or no such struct).
    pub fn has_member(&self, name: &str, member: &str) -> Option<bool> {
        let btf = self.btf.as_ref()?;
        let s = btf.type_by_name::<Struct<'_>>(name)?;
        let found = s.iter().any(|m| m.name.is_some_and(|n| n == member));
        Some(found)
    }

    /// The value of `enumerator` in vmlinux's `enum <name>`; None when BTF does not say.
    pub fn enum_value(&self, name: &str, enumerator: &str) -> Option<i64> {
        let btf = self.btf.as_ref()?;
        let e = btf.type_by_name::<libbpf_rs::btf::types::Enum<'_>>(name)?;
        let value = e
            .iter()
            .find(|m| m.name.is_some_and(|n| n == enumerator))
            .map(|m| m.value);
        value
    }

    /// Whether `module` has BTF this kernel exposes (tp_btf programs on its tracepoints need it).
    pub fn has_module_btf(&self, module: &str) -> bool {
        self.modules.iter().any(|m| m.name == module)
    }

    /// Whether tracepoint `name`'s first argument is a `struct request_queue *` (block
    /// tracepoints before Linux 5.11). None when BTF does not say.
    pub fn queue_first(&self, name: &str) -> Option<bool> {
        self.first_arg_is(name, "request_queue")
    }

    /// Whether tracepoint `name`'s first argument is a `struct <wanted> *` (or one). None when
    /// BTF does not say.
    pub fn first_arg_is(&self, name: &str, wanted: &str) -> Option<bool> {
        let btf = self.btf.as_ref()?;
        let typedef = btf.type_by_name::<Typedef<'_>>(&format!("btf_trace_{name}"))?;
        let proto = FuncProto::try_from(
            typedef
                .referenced_type()
                .skip_mods_and_typedefs()
                .next_type()?,
        )
        .ok()?;
        // Parameter 0 is the tracepoint's private context; the arguments follow.
        let first = proto.iter().nth(1)?;
        let pointee = btf
            .type_by_id::<BtfType<'_>>(first.ty)?
            .skip_mods_and_typedefs();
        let target = if pointee.kind() == BtfKind::Ptr {
            pointee.next_type()?.skip_mods_and_typedefs()
        } else {
            pointee
        };
        Some(target.name().is_some_and(|n| n == wanted))
    }
}

/// Whether tracefs lists event `system/name`; None when tracefs is not mounted.
fn tracefs_has(system: &str, name: &str) -> Option<bool> {
    let events = std::path::Path::new("/sys/kernel/tracing/events");
    events
        .exists()
        .then(|| events.join(system).join(name).exists())
}

/// The tracepoint a program's section names ("tp_btf/block_rq_issue" -> "block_rq_issue").
fn section_tracepoint(section: &str) -> Option<&str> {
    section
        .strip_prefix("tp_btf/")
        .or_else(|| section.strip_prefix("raw_tp/"))
}

/// A classic tracepoint section ("tracepoint/kvm/kvm_exit" -> "kvm_exit").
fn classic_tracepoint(section: &str) -> Option<&str> {
    section
        .strip_prefix("tracepoint/")
        .and_then(|s| s.split('/').nth(1))
}

/// Programs named `<base>_q_btf` / `<base>_q_raw` take the pre-5.11 layout whose first
/// argument is the request queue.
fn takes_queue_first(program: &str) -> bool {
    program.ends_with("_q_btf") || program.ends_with("_q_raw")
}

/// What a family needs from the kernel to choose its programs.
pub(crate) struct Selection<'a> {
    pub kind: AttachKind,
    pub kernel: &'a KernelTracepoints,
    /// Tracepoints this configuration does not use at all (left out, not reported).
    pub unused: &'a dyn Fn(&str) -> bool,
}

/// Enables, for every tracepoint this configuration uses, the program of flavour `kind` whose
/// argument layout matches this kernel; returns the used tracepoints this kernel lacks.
pub(crate) fn select_programs(object: &mut OpenObject, sel: &Selection<'_>) -> BTreeSet<String> {
    let mut missing = BTreeSet::new();
    for mut prog in object.progs_mut() {
        let name = prog.name().to_string_lossy().into_owned();
        let section = prog.section().to_string_lossy().into_owned();
        // Classic tracepoints have no twin: enabled whenever the tracepoint exists.
        if let Some(tp) = classic_tracepoint(&section) {
            let present = sel.kernel.has(tp);
            if !present {
                missing.insert(tp.to_string());
            }
            prog.set_autoload(present && !(sel.unused)(tp));
            continue;
        }
        let Some(tp) = section_tracepoint(&section) else {
            continue;
        };
        if (sel.unused)(tp) {
            prog.set_autoload(false);
            continue;
        }
        let present = sel.kernel.has(tp);
        if !present {
            missing.insert(tp.to_string());
        }
        // Without BTF the layout is unknown: assume today's.
        let layout_matches =
            takes_queue_first(&name) == sel.kernel.queue_first(tp).unwrap_or(false);
        prog.set_autoload(name.ends_with(sel.kind.suffix()) && present && layout_matches);
    }
    missing
}

/// One tracepoint's outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AttachOutcome {
    pub tracepoint: String,
    /// How it attached, or None.
    pub attached: Option<AttachKind>,
    /// Why it did not attach.
    pub reason: Option<String>,
}

/// Attaches every loaded program on its own. Returns the links to keep and one outcome per
/// tracepoint.
pub fn attach_each(object: &Object, kind: AttachKind) -> (Vec<Link>, Vec<AttachOutcome>) {
    let mut links = Vec::new();
    let mut outcomes = Vec::new();
    for prog in object.progs_mut() {
        if !prog.autoload() {
            continue;
        }
        let section = prog.section().to_string_lossy().into_owned();
        let classic = classic_tracepoint(&section);
        let tracepoint = classic
            .or_else(|| section_tracepoint(&section))
            .unwrap_or(&section)
            .to_string();
        let how = if classic.is_some() {
            AttachKind::Tracepoint
        } else {
            kind
        };
        match prog.attach() {
            Ok(link) => {
                links.push(link);
                outcomes.push(AttachOutcome {
                    tracepoint,
                    attached: Some(how),
                    reason: None,
                });
            }
            Err(e) => outcomes.push(AttachOutcome {
                tracepoint,
                attached: None,
                reason: Some(format!("{} attach: {e}", how.name())),
            }),
        }
    }
    outcomes.sort_by(|a, b| a.tracepoint.cmp(&b.tracepoint));
    outcomes.dedup_by(|a, b| a.tracepoint == b.tracepoint && a.attached == b.attached);
    (links, outcomes)
}

/// Mounts tracefs at /sys/kernel/tracing if nothing is there (classic tracepoints need it).
/// Returns a note saying so, or why it could not.
pub fn ensure_tracefs() -> Option<String> {
    let dir = std::path::Path::new("/sys/kernel/tracing");
    if dir.join("events").exists() {
        return None;
    }
    let status = std::process::Command::new("mount")
        .args(["-t", "tracefs", "nodev"])
        .arg(dir)
        .status();
    Some(match status {
        Ok(s) if s.success() => "mounted tracefs on /sys/kernel/tracing (classic tracepoints need it)".into(),
        Ok(s) => format!("tracefs is not mounted and mounting it failed ({s}): classic tracepoints will not attach"),
        Err(e) => format!("tracefs is not mounted and mount could not run ({e}): classic tracepoints will not attach"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_name_their_tracepoint() {
        assert_eq!(
            section_tracepoint("tp_btf/block_rq_issue"),
            Some("block_rq_issue")
        );
        assert_eq!(
            section_tracepoint("raw_tp/irq_handler_entry"),
            Some("irq_handler_entry")
        );
        assert_eq!(section_tracepoint("kprobe/foo"), None);
        assert_eq!(
            classic_tracepoint("tracepoint/kvm/kvm_exit"),
            Some("kvm_exit")
        );
    }

    #[test]
    fn queue_first_variants_are_named_so() {
        assert!(takes_queue_first("block_rq_issue_q_btf"));
        assert!(takes_queue_first("block_bio_queue_q_raw"));
        assert!(!takes_queue_first("block_rq_issue_btf"));
        assert!(!takes_queue_first("block_bio_queue_raw"));
    }

    /// The running kernel's BTF answers for a tracepoint whose layout is known on it.
    #[test]
    fn this_kernels_block_rq_issue_layout_is_read_from_btf() {
        let kernel = KernelTracepoints::load(&[]);
        if !kernel.has_btf() {
            virtgap_testkit::require("the BTF layout test", Err("no kernel BTF on this host"));
            return;
        }
        // Every supported kernel since 5.10.137 takes the request alone.
        assert_eq!(kernel.queue_first("block_rq_issue"), Some(false));
        assert!(kernel.has("block_rq_issue"));
        assert!(!kernel.has("no_such_tracepoint_here"));
    }
}
