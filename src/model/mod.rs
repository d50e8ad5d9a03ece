//! Pure data: the profile a run leaves and the types it is made of — histograms, stages,
//! intervals, devices, virtualization, kv, calibration, the host fingerprint, stalls and the tail
//! autopsy — and the profile file (read, parsed, checked). Numbers, no words; no I/O but in
//! `file.rs` and the host's own reading of itself in `host.rs`.

pub mod attached;
pub mod calibration;
pub mod devices;
pub mod file;
pub mod histogram;
pub mod host;
pub mod hypervisor;
pub mod interval;
pub mod iotune;
pub mod kv;
pub mod metrics;
pub mod profile;
pub mod stages;
pub mod stalls;
pub mod tail;
pub mod virtualization;
