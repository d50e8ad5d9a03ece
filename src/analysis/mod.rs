//! Comparing profiles, in numbers: the diff of two hosts and the tail autopsy's join (pure
//! functions of profiles), and the statistics they judge by.

pub mod diff;
pub mod stats;
pub mod tail;
