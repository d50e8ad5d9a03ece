//! Choosing and attaching programs. Every program comes as a `tp_btf` version and a `raw_tp`
//! twin; before load, one flavour is enabled and programs whose tracepoint this kernel lacks
//! are left out. After load, each program attaches on its own, so one failure costs one signal.

use std::collections::BTreeSet;

use libbpf_rs::btf::types::Typedef;
use libbpf_rs::btf::Btf;
use libbpf_rs::{Link, Object, OpenObject};
use serde::{Deserialize, Serialize};

/// How a program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

/// The tracepoints this kernel defines, read once from its BTF (`btf_trace_<name>` typedefs).
#[derive(Debug, Default)]
pub struct KernelTracepoints {
    /// None when the kernel exposes no BTF; then only raw_tp programs are tried.
    btf: Option<Btf<'static>>,
}

impl KernelTracepoints {
    pub fn load() -> Self {
        Self {
            btf: Btf::from_vmlinux().ok(),
        }
    }

    pub fn has_btf(&self) -> bool {
        self.btf.is_some()
    }

    /// Whether tracepoint `name` exists. Without BTF the answer is "assume yes" and the attach
    /// itself decides.
    pub fn has(&self, name: &str) -> bool {
        match &self.btf {
            Some(btf) => btf
                .type_by_name::<Typedef<'_>>(&format!("btf_trace_{name}"))
                .is_some(),
            None => true,
        }
    }
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

/// Enables the `kind` flavour of every program whose tracepoint `exists`; returns the
/// tracepoints left out because the kernel lacks them.
pub fn select_programs(
    object: &mut OpenObject,
    kind: AttachKind,
    exists: &dyn Fn(&str) -> bool,
) -> BTreeSet<String> {
    let mut missing = BTreeSet::new();
    for mut prog in object.progs_mut() {
        let name = prog.name().to_string_lossy().into_owned();
        let section = prog.section().to_string_lossy().into_owned();
        // Classic tracepoints have no twin: enabled whenever the tracepoint exists.
        if let Some(tp) = classic_tracepoint(&section) {
            let present = exists(tp);
            if !present {
                missing.insert(tp.to_string());
            }
            prog.set_autoload(present);
            continue;
        }
        let Some(tp) = section_tracepoint(&section) else {
            continue;
        };
        let right_flavour = name.ends_with(kind.suffix());
        let present = exists(tp);
        if right_flavour && !present {
            missing.insert(tp.to_string());
        }
        prog.set_autoload(right_flavour && present);
    }
    missing
}

/// One tracepoint's outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    }
}
