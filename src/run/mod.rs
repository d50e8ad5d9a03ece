//! What a run is made of, shared by `record`, `iotune` and the TUI: the target made ready
//! (`prepare`), one run recorded (`one_run`), iotune's concurrency search (`iotune`),
//! the probes attached before the workload (`session`), the one event channel (`pipeline`), the
//! one recorder of its events (`recorder`: the interval series, the probes' window, the idle
//! baseline, the tail autopsy's material) and the profile assembled from it (`assemble`), the
//! signals that stop it, safe output files, calibration, the micro-guest that drives
//! host-side KVM probes, and a fleet's figures read back from Prometheus (`prometheus`).

pub mod assemble;
pub mod attached;
pub mod autopsy;
pub mod calibrate;
pub mod endpoint;
pub mod exporter;
pub mod exposition;
pub mod host;
pub mod hypervisor;
pub mod iotune;
pub mod microvm;
pub mod one_run;
pub mod output;
pub mod pipeline;
pub mod prepare;
pub mod prometheus;
pub mod recorder;
pub mod series;
pub mod session;
pub mod signals;
pub mod stalls;
