//! I/O engines. A worker hands an engine requests tagged with a slot number (one slot per
//! in-flight I/O, each with its own buffer), asks it to submit, and reaps completions. The
//! contract mirrors fio's `queue` / `commit` / `getevents`.

mod buffer;
mod null;
mod psync;
mod uring;

use std::fs::File;
use std::sync::Arc;
use std::time::Instant;

pub(crate) use buffer::slot_buffers;
pub use buffer::AlignedBuffer;
pub use null::NullEngine;
pub use psync::PsyncEngine;
pub use uring::UringEngine;
pub(crate) use uring::{build_ring, Registered};

/// Direction of one I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoDir {
    Read,
    Write,
}

/// One I/O to perform with the buffer of `slot`.
#[derive(Clone, Copy, Debug)]
pub struct IoRequest {
    pub slot: u32,
    pub dir: IoDir,
    pub offset: u64,
    pub len: u32,
}

/// A finished I/O: bytes transferred, or a negative errno.
#[derive(Clone, Copy, Debug)]
pub struct Completion {
    pub slot: u32,
    pub result: i32,
}

/// How long `reap` may block.
#[derive(Clone, Copy, Debug)]
pub enum Wait {
    /// Return what has completed, without blocking.
    None,
    /// Block until at least one I/O completes.
    One,
    /// Block until one completes or the deadline passes.
    Until(Instant),
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("io_uring setup failed: {0}")]
    Setup(std::io::Error),
    #[error("io_uring does not support {0} on this kernel; use --engine psync")]
    Unsupported(&'static str),
    #[error("submitting I/O failed: {0}")]
    Submit(std::io::Error),
    #[error("cannot allocate {bytes} bytes of aligned I/O buffers")]
    Alloc { bytes: usize },
}

/// An I/O engine owning one buffer per slot.
pub trait Engine: Send {
    /// The buffer of `slot`. Only valid to touch while that slot has no I/O in flight.
    fn buffer_mut(&mut self, slot: u32) -> &mut [u8];
    /// Queues one request; it is not handed to the kernel before `submit`.
    fn queue(&mut self, req: IoRequest) -> Result<(), EngineError>;
    /// Hands every queued request to the kernel.
    fn submit(&mut self) -> Result<(), EngineError>;
    /// Appends finished I/Os to `out`, blocking as `wait` allows.
    fn reap(&mut self, wait: Wait, out: &mut Vec<Completion>) -> Result<(), EngineError>;
    /// What the engine set up, e.g. "registered files, fixed buffers, defer-taskrun".
    fn features(&self) -> String;
}

/// Shared setup for every engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub file: Arc<File>,
    pub slots: u32,
    pub buffer_len: usize,
    pub buffer_align: usize,
}

/// Sleeps until `deadline` (used by engines with nothing in flight).
pub(crate) fn sleep_until(deadline: Instant) {
    let now = Instant::now();
    if deadline > now {
        std::thread::sleep(deadline - now);
    }
}
