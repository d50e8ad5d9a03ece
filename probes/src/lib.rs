//! virtgap's eBPF probes: the skeletons built from `../bpf` (one object per probe family), loaded
//! and attached with fallbacks (tp_btf, then raw_tp), read into plain Rust data.

pub mod block;
mod bpf;

pub use block::{count_block_completions, BlockCounts};

/// How a program ended up attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachKind {
    /// BTF-enabled tracepoint: typed arguments, cheapest.
    TpBtf,
    /// Raw tracepoint: same arguments without BTF typing, for kernels lacking tp_btf.
    RawTp,
}

impl AttachKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::TpBtf => "tp_btf",
            Self::RawTp => "raw_tp",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{probe}: cannot load or attach ({reason})")]
    Unsupported { probe: &'static str, reason: String },
    #[error("{probe}: reading map {map}: {err}")]
    Read {
        probe: &'static str,
        map: &'static str,
        err: libbpf_rs::Error,
    },
}

/// Whether this process may load BPF programs at all, and if not, why.
pub fn bpf_permission() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(());
    }
    Err("not root: tracing needs root, or CAP_BPF + CAP_PERFMON + CAP_SYS_RESOURCE".into())
}
