//! Pure data: the profile a run leaves (stages, intervals, devices, kv, virtualization), the
//! host fingerprint, and stall detection over the intervals.

pub mod host;
pub mod profile;
pub mod stalls;
pub mod tail;
