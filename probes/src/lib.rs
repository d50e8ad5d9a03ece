//! virtgap's eBPF probes: the skeletons built from `../bpf` (one object per probe family),
//! loaded and attached with fallbacks (tp_btf, then raw_tp), read into plain snapshots.
//!
//! - [`session`]: load, attach, report capabilities, read maps.
//! - [`collector`]: the one thread that owns a session and sends snapshots every interval.
//! - [`model`] and [`hist`]: the plain data.

pub mod attach;
mod bpf;
pub mod collector;
pub mod hist;
pub mod model;
pub mod procfs;
pub mod pvpaths;
mod sampler;
pub mod session;
pub mod virt;

pub use attach::AttachKind;
pub use collector::{ProbeEvent, ProbeHandle};
pub use hist::KernelHist;
pub use model::ProbeSnapshot;
pub use session::{CapabilityReport, Family, ProbeConfig, ProbeSession, ProbeStorage};

/// Whether this process may load BPF programs at all, and if not, why.
pub fn bpf_permission() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(());
    }
    Err("not root: tracing needs root, or CAP_BPF + CAP_PERFMON + CAP_SYS_RESOURCE".into())
}
