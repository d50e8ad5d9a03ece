//! Comparing profiles, in numbers: the diff of two hosts (and of two iotune results) and the
//! tail autopsy's join (pure functions of profiles), a fleet's profiles from Prometheus'
//! counters, the statistics they judge by, and iotune's concurrency search.

pub mod diff;
pub mod fleet;
pub mod iotune_diff;
pub mod saturation;
pub mod stats;
pub mod tail;
