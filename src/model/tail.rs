//! The tail autopsy's figures: for the I/Os above a run's app p99 and p99.9, where those I/Os
//! spent their time, next to the run's mean I/O (pure data; `analysis::tail` computes it).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::stages::StageBreakdown;

/// One run's tail autopsy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TailAutopsy {
    /// The I/Os above the run's app p99, then above its p99.9 (a set is absent when the run
    /// had too few I/Os to have one).
    pub sets: Vec<TailSet>,
    /// Slow requests the kernel could not hand over (its buffer was full).
    pub requests_dropped: u64,
    /// Why slow I/Os could not be joined to their requests, in words (e.g. a stacked device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unjoinable: Option<String>,
    /// An attached run's: its slow calls were joined to their requests by thread and time,
    /// not by disk sector.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_thread: bool,
}

impl TailAutopsy {
    /// The set above percentile `p` (99 or 99.9).
    pub fn set(&self, p: f64) -> Option<&TailSet> {
        self.sets.iter().find(|s| (s.percentile - p).abs() < 1e-9)
    }
}

/// The I/Os above one percentile of a run's app latency.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TailSet {
    /// 99 or 99.9.
    pub percentile: f64,
    /// The run's app latency at that percentile.
    pub threshold_ns: f64,
    /// How many I/Os the run's histogram has above it.
    pub expected_ios: u64,
    /// How many of those the workload kept (the autopsy's sample).
    pub ios: u64,
    /// How many of those were joined to their block request; the others' block stages are the
    /// run's means (their request was too short to be sent: under half the running p99).
    pub joined: u64,
    /// The set's mean per I/O.
    pub mean: StageBreakdown,
    /// Of the joined I/Os' software time, the mean before their request started (the
    /// application, the submission syscall, throttling and tag waits before the block layer
    /// takes the bio) and after it completed (waking and reaping); None when none was joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joined_software: Option<SoftwareSplit>,
    /// The run's mean per I/O (per request for the block stages), the excess's zero.
    pub baseline: StageBreakdown,
}

impl TailSet {
    /// The set's mean less the run's mean, per stage: where the tail's extra time went.
    pub fn excess(&self) -> StageBreakdown {
        self.mean.minus(&self.baseline)
    }
}

/// Mean nanoseconds per joined I/O on either side of its block request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SoftwareSplit {
    pub before_request_ns: f64,
    pub after_request_ns: f64,
}
