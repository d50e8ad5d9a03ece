//! Comparing profiles: the diff of two hosts (pure functions of two profiles).

pub mod diff;
pub mod tail;
