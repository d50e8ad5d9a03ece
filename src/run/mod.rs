//! What a run is made of, shared by `record` and the TUI: its start (probes attached before the
//! workload), the one event channel, the interval series it fills, the tail autopsy at its end, signals that stop it, safe
//! output files, and the micro-guest that drives host-side KVM probes.

pub mod autopsy;
pub mod microvm;
pub mod output;
pub mod pipeline;
pub mod series;
pub mod session;
pub mod signals;
