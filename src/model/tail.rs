//! The tail autopsy's figures: for the I/Os above a run's app p99 and p99.9, where those I/Os
//! spent their time, next to the run's mean I/O (pure data; `analysis::tail` computes it).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    /// run's means (their request was too short to be sent: under 0.4 of the running p99).
    pub joined: u64,
    /// The set's mean per I/O.
    pub mean: TailStages,
    /// Of the joined I/Os' software time, the mean before their request started (the
    /// application, the submission syscall, throttling and tag waits before the block layer
    /// takes the bio) and after it completed (waking and reaping); None when none was joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joined_software: Option<SoftwareSplit>,
    /// The run's mean per I/O (per request for the block stages), the excess's zero.
    pub baseline: TailStages,
}

impl TailSet {
    /// The set's mean less the run's mean, per stage: where the tail's extra time went.
    pub fn excess(&self) -> TailStages {
        self.mean.minus(&self.baseline)
    }
}

/// Mean nanoseconds per joined I/O on either side of its block request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SoftwareSplit {
    pub before_request_ns: f64,
    pub after_request_ns: f64,
}

/// Mean nanoseconds per I/O in each stage; software is app less the block stages (submission,
/// reaping and anything else outside the block layer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TailStages {
    pub app_ns: f64,
    pub queue_ns: f64,
    pub device_ns: f64,
    pub completion_ns: f64,
    pub software_ns: f64,
}

impl TailStages {
    /// The stages that add up to app, with their names as the waterfall prints them.
    pub fn parts(&self) -> [(&'static str, f64); 4] {
        [
            ("queue", self.queue_ns),
            ("device", self.device_ns),
            ("completion", self.completion_ns),
            ("software", self.software_ns),
        ]
    }

    pub fn minus(&self, other: &Self) -> Self {
        Self {
            app_ns: self.app_ns - other.app_ns,
            queue_ns: self.queue_ns - other.queue_ns,
            device_ns: self.device_ns - other.device_ns,
            completion_ns: self.completion_ns - other.completion_ns,
            software_ns: self.software_ns - other.software_ns,
        }
    }

    /// The mean of several runs' figures.
    pub fn mean_of<'a>(all: impl IntoIterator<Item = &'a TailStages>) -> Option<Self> {
        let mut sum = Self::default();
        let mut n = 0.0;
        for s in all {
            sum.app_ns += s.app_ns;
            sum.queue_ns += s.queue_ns;
            sum.device_ns += s.device_ns;
            sum.completion_ns += s.completion_ns;
            sum.software_ns += s.software_ns;
            n += 1.0;
        }
        (n > 0.0).then(|| Self {
            app_ns: sum.app_ns / n,
            queue_ns: sum.queue_ns / n,
            device_ns: sum.device_ns / n,
            completion_ns: sum.completion_ns / n,
            software_ns: sum.software_ns / n,
        })
    }
}
