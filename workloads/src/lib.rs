//! virtgap's storage workloads: I/O engines (io_uring, psync, null), offset generators, open-loop
//! pacing, fio-compatible latency statistics, presets, and the safety checks that keep a write
//! workload away from data the user did not offer.
//!
//! Everything here builds and runs without root and without BPF.

// No function longer than clippy.toml's threshold outside tests (code lines, comments apart).
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod act;
pub mod dir_stats;
pub mod dm;
pub mod engine;
pub mod extents;
pub mod histogram;
pub mod input;
pub mod kv;
pub mod memory;
pub mod offsets;
pub mod pattern;
pub mod run;
pub mod safety;
pub mod schedule;
pub mod slow;
pub mod spec;
pub mod stats;
pub mod target;
pub mod units;
pub mod values;

pub use histogram::LatencyHistogram;
pub use run::{start, RunHandle, RunOptions, WorkloadError, WorkloadEvent};
pub use spec::{LoadedSpec, WorkloadSpec};
pub use stats::{IntervalMerger, IntervalSample, RunStats};
pub use target::{Target, TargetChoice, TargetRequest};
