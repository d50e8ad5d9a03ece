//! virtgap's eBPF probes: the skeletons built from `../bpf` (one object per probe family),
//! loaded and attached with fallbacks (tp_btf, then raw_tp), read into plain snapshots.
//!
//! - [`families`]: one module per probe family (setup, load, read), driven by a table.
//! - [`session`]: walks the table, reports capabilities, reads maps.
//! - [`collector`]: the one thread that owns a session and sends snapshots every interval.
//! - [`model`], [`hist`] and [`report`]: the plain data; [`error`]: what goes wrong, typed.

// No function longer than clippy.toml's threshold outside tests (code lines, comments apart).
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

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

/// Whether this process may load BPF programs at all, and if not, why: root, or the two
/// capabilities tracing needs since 5.8 (CAP_BPF to load programs and maps, CAP_PERFMON to
/// attach them to tracepoints, kprobes and perf events), as a service runs with them.
pub fn bpf_permission() -> Result<(), NoPermission> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(());
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if has_tracing_caps(&status) {
        return Ok(());
    }
    Err(NoPermission)
}

/// Whether a /proc/PID/status text's effective capabilities hold CAP_PERFMON (38) and CAP_BPF
/// (39).
fn has_tracing_caps(status: &str) -> bool {
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|eff| eff & (1 << CAP_PERFMON) != 0 && eff & (1 << CAP_BPF) != 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tracing_needs_both_bpf_and_perfmon() {
        let status = |eff: &str| format!("Name:\tvirtgap\nCapPrm:\t0\nCapEff:\t{eff}\n");
        assert!(super::has_tracing_caps(&status("000000c000000000")));
        assert!(super::has_tracing_caps(&status("000001ffffffffff")));
        assert!(
            !super::has_tracing_caps(&status("0000008000000000")),
            "CAP_BPF alone"
        );
        assert!(
            !super::has_tracing_caps(&status("0000004000000000")),
            "CAP_PERFMON alone"
        );
        assert!(!super::has_tracing_caps(&status("0000000000000000")));
        assert!(!super::has_tracing_caps("no capabilities line"));
    }
}
