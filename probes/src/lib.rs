//! virtgap's eBPF probes: the skeletons built from `../bpf` (one object per probe family),
//! loaded and attached with fallbacks (tp_btf, then raw_tp), read into plain snapshots.
//!
//! - [`families`]: one module per probe family (setup, load, read), driven by a table.
//! - [`session`]: walks the table, reports capabilities, reads maps.
//! - [`collector`]: the one thread that owns a session and sends snapshots every interval.
//! - [`model`], [`hist`] and [`report`]: the plain data; [`error`]: what goes wrong, typed.

pub mod attach;
mod bpf;
pub mod collector;
pub mod error;
pub mod families;
pub mod follow;
pub mod hist;
pub mod hypervisor;
mod libbpf_log;
pub mod memory;
pub mod model;
pub mod procfs;
pub mod report;
pub mod selftest;
pub mod session;
pub mod stamps_check;
pub mod virt;

pub use attach::AttachKind;
pub use collector::{ProbeEvent, ProbeHandle};
pub use error::{NoPermission, Unavailable};
pub use families::{BlockStamps, FamilyDef, ProbeConfig, ProbeStorage};
pub use hist::KernelHist;
pub use model::ProbeSnapshot;
pub use report::{CapabilityReport, Family, FamilyReport};
pub use session::ProbeSession;

/// Whether this process may load BPF programs at all, and if not, why.
pub fn bpf_permission() -> Result<(), NoPermission> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(());
    }
    Err(NoPermission)
}
