//! What attached on this host and how: the capability report doctor, the profile and the
//! summaries show. Pure data.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::attach::AttachOutcome;
use crate::error::Unavailable;

/// Declares [`Family`] and `Family::ALL` from one list. Each family's definition (name,
/// signals, loader) is `Family::def`, in `families/`.
macro_rules! declare_families {
    ($($(#[doc = $doc:literal])* $variant:ident,)*) => {
        /// The probe families.
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
            JsonSchema,
        )]
        #[serde(rename_all = "snake_case")]
        pub enum Family {
            $($(#[doc = $doc])* $variant,)*
        }

        impl Family {
            /// Every family, in the order the session loads them (the msr object before the
            /// sampler's, which shares one of its maps).
            pub const ALL: [Family; [$(Family::$variant),*].len()] = [$(Family::$variant,)*];
        }
    };
}

declare_families! {
    Block,
    Irq,
    Wakeup,
    /// App latency of attached processes: file system calls and io_uring requests.
    App,
    Nvme,
    /// Exit-causing MSR accesses.
    Msr,
    /// CPU-clock sampling of kernel IPs on every CPU.
    Sampler,
    /// Host-side KVM exits (when virtgap runs on a hypervisor).
    KvmHost,
    /// Entry -> return timing of paravirt callbacks (fentry, else kprobes).
    PvPaths,
}

/// One family's outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FamilyReport {
    pub family: Family,
    /// Why the whole family is unavailable, if it is.
    #[schemars(with = "Option<String>")]
    pub unavailable: Option<Unavailable>,
    /// Per tracepoint: attached how, or why not.
    pub tracepoints: Vec<AttachOutcome>,
    /// Why the preferred flavour (tp_btf) did not load, when a fallback did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}

/// How a hooked function's outcome begins when the kernel has none of its names (a paravirt
/// path of another kernel version, or of a module not loaded): nothing to attach, which is not
/// a failure to attach.
pub const ABSENT_ON_THIS_KERNEL: &str = "absent on this kernel";

/// The kernel function the block probe hooks (fentry, else kprobe) where each bio enters the
/// block layer, before blk-throttle; reported among the block family's tracepoints.
pub const BIO_ENTRY_HOOK: &str = "submit_bio_noacct";

impl FamilyReport {
    pub(crate) fn unavailable(family: Family, reason: Unavailable) -> Self {
        Self {
            family,
            unavailable: Some(reason),
            tracepoints: vec![],
            fallback: None,
        }
    }

    /// The family watches hardware or a hypervisor role this host does not have, so nothing
    /// is lost by it being unavailable.
    pub fn watches_nothing_here(&self) -> bool {
        matches!(self.unavailable, Some(Unavailable::NothingToWatch(_)))
    }
}

/// Memory one BPF map holds in the kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MapMemory {
    pub family: Family,
    pub map: String,
    /// The kernel's own accounting (fdinfo `memlock`), when it reports one.
    pub kernel_bytes: Option<u64>,
    /// This host's figure from the map's definition (see `memory::map_bytes`).
    pub estimated_bytes: u64,
    /// The same map on hosts with 64 and 192 possible CPUs.
    pub estimated_bytes_64_cpus: u64,
    pub estimated_bytes_192_cpus: u64,
}

/// What attached on this host, for doctor, the profile and the reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CapabilityReport {
    pub families: Vec<FamilyReport>,
    /// Things the loader did on the way, e.g. mounting tracefs.
    #[serde(default)]
    pub notes: Vec<String>,
    /// Why per-program run statistics are unavailable, if they are.
    pub run_stats_unavailable: Option<String>,
    /// Kernel memory of every loaded map.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub maps: Vec<MapMemory>,
}

impl CapabilityReport {
    /// Whether `family` loaded (some of its tracepoints attached).
    pub fn attached(&self, family: Family) -> bool {
        self.families.iter().any(|f| {
            f.family == family
                && f.unavailable.is_none()
                && f.tracepoints.iter().any(|t| t.attached.is_some())
        })
    }

    /// Whether the hook on [`BIO_ENTRY_HOOK`] attached, so the block probe's queue stage starts
    /// at every bio's entry into the block layer. Where it did not, a partition's bios may still
    /// be noted at `block_bio_remap`: a profile's `queue_start` says what a run measured.
    pub fn queue_from_bio_entry(&self) -> bool {
        self.tracepoint_attached(BIO_ENTRY_HOOK)
    }

    /// Whether the tracepoint `tp` attached (in any family).
    pub fn tracepoint_attached(&self, tp: &str) -> bool {
        self.families
            .iter()
            .flat_map(|f| &f.tracepoints)
            .any(|t| t.tracepoint == tp && t.attached.is_some())
    }

    /// Whether IPIs sent are counted (the ipi_send_* tracepoints came in Linux 6.4).
    pub fn counts_ipis(&self) -> bool {
        self.tracepoint_attached("ipi_send_cpu")
    }

    pub fn attached_count(&self) -> usize {
        self.families
            .iter()
            .flat_map(|f| &f.tracepoints)
            .filter(|t| t.attached.is_some())
            .count()
    }

    pub fn unavailable_count(&self) -> usize {
        self.families
            .iter()
            .map(|f| {
                if f.unavailable.is_some() {
                    1
                } else {
                    f.tracepoints
                        .iter()
                        .filter(|t| t.attached.is_none())
                        .count()
                }
            })
            .sum()
    }
}
