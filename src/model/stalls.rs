//! Stalls: stretches where the workload's I/Os were in flight and none completed, I/Os slower
//! than [`SLOW_IO_NS`], and requests the kernel completed with an error. A run with any of these
//! is not steady state, and its figures say so wherever they are shown. The kernel's requeues
//! are kept here too, as a count: they are the driver's backpressure, not a stall. Pauses of
//! virtgap itself are kept apart (they are not a stall). Pure data: `run::stalls` finds them,
//! `render::stalls` says them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An I/O slower than this is a stall in itself (a cloud disk's worst healthy tail is in the
/// tens of milliseconds; drivers time out at 30 s).
pub const SLOW_IO_NS: u64 = 1_000_000_000;

/// Stall spans kept; beyond this only the count of stalled intervals grows.
pub const MAX_SPANS: usize = 64;

/// Consecutive intervals in which no I/O completed while one was in flight throughout.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StallSpan {
    /// Seconds since the measured window started.
    pub start_s: f64,
    pub end_s: f64,
    /// Age of the oldest I/O in flight at the span's last interval end.
    pub oldest_in_flight_ns: u64,
}

/// A stretch in which virtgap itself did not run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PauseSpan {
    /// Seconds since the measured window started (negative: it began before).
    pub start_s: f64,
    pub end_s: f64,
}

/// What stalled in a run (a profile section).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Stalls {
    /// Intervals with no completion while an I/O was in flight through the whole interval.
    pub stalled_intervals: u64,
    /// The first of those spans (at most 64).
    pub spans: Vec<StallSpan>,
    /// I/Os slower than `slow_io_ns`, and the slowest I/O of the run.
    pub slow_io_ns: u64,
    pub slow_ios: u64,
    pub max_lat_ns: Option<u64>,
    /// The kernel's view of the target's requests (None: block probes not attached).
    pub requeued: Option<u64>,
    pub errors: Option<u64>,
    pub timeouts: Option<u64>,
    /// Stretches in which virtgap itself did not run — the process was stopped (SIGSTOP, a
    /// debugger) or not scheduled — that hid completions or lasted a second or more. Intervals
    /// they overlap are not counted as stalled, and `slow_io_ns` is raised by the longest, so
    /// I/Os in flight through them are not counted as slow.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub process_paused: Vec<PauseSpan>,
}

impl Stalls {
    /// Whether anything stalled.
    pub fn found(&self) -> bool {
        // Requeues are not in it: a driver hands a request back whenever the device's queue is
        // full (a virtio ring of 1 MiB reads does so thousands of times a second), and the
        // request is issued again at once; the summary lists them beside the block stages.
        self.stalled_intervals > 0 || self.slow_ios > 0 || self.errors.unwrap_or(0) > 0
    }
}
