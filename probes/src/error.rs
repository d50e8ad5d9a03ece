//! The probes' errors. Their words are what doctor, the reports and the profile show, so each
//! message is written once here; code that must decide something matches the variant.

use serde::{Deserialize, Serialize};

use crate::attach::AttachKind;

/// This process may not load BPF programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not root: tracing needs root, or CAP_BPF + CAP_PERFMON")]
pub struct NoPermission;

/// What a family watches that this host does not have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Absent {
    #[error("no NVMe on this host (nvme_core module not loaded)")]
    Nvme,
    #[error("not a KVM host (no kvm module)")]
    KvmHost,
    /// Profiles recorded before metal timed its native callers say this of the pv-paths family.
    #[error("no hypervisor: nothing to measure")]
    Hypervisor,
    /// A run that follows every process (`serve --all`) has no threads of its own to watch wake.
    #[error("needs processes to follow (the workload, or --pid, --cgroup or --comm)")]
    FollowedProcesses,
    /// A built-in workload times its own I/O: only attached processes' calls are the app's.
    #[error(
        "times the I/O of attached processes (--pid, --cgroup or --comm); a built-in workload times its own"
    )]
    AttachedProcesses,
}

impl Absent {
    const ALL: [Absent; 5] = [
        Absent::Nvme,
        Absent::KvmHost,
        Absent::Hypervisor,
        Absent::FollowedProcesses,
        Absent::AttachedProcesses,
    ];
}

/// Why a whole family did not load. Stored in the profile as its words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(into = "String", from = "String")]
pub enum Unavailable {
    /// The host has none of what the family watches: nothing is lost without it.
    #[error("{0}")]
    NothingToWatch(Absent),
    #[error(transparent)]
    NoPermission(#[from] NoPermission),
    /// Anything else, in the loader's words: what it needs, or how its objects failed.
    #[error("{0}")]
    Other(String),
}

impl From<Unavailable> for String {
    fn from(u: Unavailable) -> Self {
        u.to_string()
    }
}

/// A saved reason read back: the fixed messages are their variants again.
impl From<String> for Unavailable {
    fn from(text: String) -> Self {
        if let Some(absent) = Absent::ALL.into_iter().find(|a| a.to_string() == text) {
            return Self::NothingToWatch(absent);
        }
        if text == NoPermission.to_string() {
            return Self::NoPermission(NoPermission);
        }
        Self::Other(text)
    }
}

/// A BPF object or program that would not open, load or attach, in libbpf's words and, where
/// its log says more, the verifier's (`why`).
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("open: {0}")]
    Open(#[source] libbpf_rs::Error),
    /// `kind`: the program flavour tried, where a family tries more than one.
    #[error("{}load: {source}{}", flavour(.kind), because(.why))]
    Load {
        kind: Option<AttachKind>,
        source: libbpf_rs::Error,
        why: Option<String>,
    },
    /// An fentry program could not be pointed at its function.
    #[error("{0}")]
    Retarget(#[source] libbpf_rs::Error),
    /// An fentry program's function is not in the kernel's BTF (pahole leaves out functions
    /// without an ftrace site, which fentry could not hook anyway).
    #[error("{symbol} is not in the kernel's BTF (no ftrace site?): {source}")]
    NoBtf {
        symbol: String,
        source: libbpf_rs::Error,
    },
    #[error("sharing {map} with the {owner} object: {source}")]
    Share {
        map: &'static str,
        owner: &'static str,
        source: libbpf_rs::Error,
    },
    #[error("attach: {0}")]
    Attach(#[source] libbpf_rs::Error),
    #[error("kprobe: {0}")]
    Kprobe(#[source] libbpf_rs::Error),
    #[error("kretprobe: {0}")]
    Kretprobe(#[source] libbpf_rs::Error),
    #[error("perf_event_open: {0}")]
    PerfEventOpen(#[source] std::io::Error),
    #[error("BPF_ENABLE_STATS: {0}")]
    EnableStats(#[source] std::io::Error),
}

fn flavour(kind: &Option<AttachKind>) -> String {
    kind.map(|k| format!("{} ", k.name())).unwrap_or_default()
}

fn because(why: &Option<String>) -> String {
    why.as_ref().map(|w| format!(": {w}")).unwrap_or_default()
}

impl BpfError {
    /// A failed load, with the lines of libbpf's captured `log` that say why (at most `max`).
    pub(crate) fn load(
        kind: Option<AttachKind>,
        source: libbpf_rs::Error,
        log: &str,
        max: usize,
    ) -> Self {
        Self::Load {
            kind,
            source,
            why: crate::libbpf_log::why(log, max),
        }
    }
}

/// The comparison of the block family's own stamps with the kernel's could not run.
#[derive(Debug, thiserror::Error)]
pub enum StampsCheckError {
    #[error(transparent)]
    NoPermission(#[from] NoPermission),
    #[error("the block family did not load: {0}")]
    NotLoaded(String),
    #[error("the reads")]
    Read(#[source] std::io::Error),
}

/// The in-kernel histogram self-test did not pass, or could not run.
#[derive(Debug, thiserror::Error)]
pub enum SelfTestError {
    #[error(transparent)]
    NoPermission(#[from] NoPermission),
    #[error(transparent)]
    Bpf(#[from] BpfError),
    #[error("BPF_PROG_TEST_RUN: {0}")]
    TestRun(#[source] libbpf_rs::Error),
    #[error("the test program found no histogram")]
    NoHistogram,
    #[error("reading the histogram: {0}")]
    Read(#[source] libbpf_rs::Error),
    #[error("the histogram is missing")]
    Missing,
    #[error("histogram size mismatch")]
    SizeMismatch,
    /// Values landed where the layout says they cannot (`atomic`: in the atomic variant).
    #[error("{} adds: {wrong}", if *.atomic { "atomic" } else { "plain" })]
    Wrong { atomic: bool, wrong: HistMismatch },
}

/// How a histogram differs from the values fed into it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HistMismatch {
    #[error("no slot's bounds hold {0}")]
    NoSlot(u64),
    #[error("slot {slot} [{low}, {high}] ns holds {held} values, expected {expected}")]
    Slot {
        slot: usize,
        low: u64,
        high: u64,
        held: u64,
        expected: u64,
    },
    #[error("count {count} / sum {sum} where {added} / {added_sum} were added")]
    Totals {
        count: u64,
        sum: u64,
        added: u64,
        added_sum: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_read_back_as_the_variant_they_were_saved_from() {
        for u in [
            Unavailable::NothingToWatch(Absent::Nvme),
            Unavailable::NothingToWatch(Absent::KvmHost),
            Unavailable::NothingToWatch(Absent::Hypervisor),
            Unavailable::NoPermission(NoPermission),
            Unavailable::Other("needs a workload process to follow".into()),
        ] {
            // What serde writes and reads (`into`/`from` String).
            let saved = String::from(u.clone());
            assert_eq!(saved, u.to_string());
            assert_eq!(Unavailable::from(saved), u);
        }
    }
}
