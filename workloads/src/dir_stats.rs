//! What one direction of a run (its reads, or its writes) measured: fio's latency histograms
//! and the I/O and byte counts. A run's statistics (`stats`) and a kv run's outcome
//! (`kv::verdict`) both hold it.

use crate::histogram::LatencyHistogram;

/// Latency and volume of one direction (reads or writes).
#[derive(Clone, Debug, Default)]
pub struct DirStats {
    pub ios: u64,
    pub bytes: u64,
    /// Created → handed to the kernel.
    pub slat: LatencyHistogram,
    /// Handed to the kernel → completion reaped.
    pub clat: LatencyHistogram,
    /// Created → completion reaped.
    pub lat: LatencyHistogram,
    /// Scheduled time → completion reaped (paced runs only).
    pub lat_intended: LatencyHistogram,
}

impl DirStats {
    pub fn merge(&mut self, other: &Self) {
        self.ios += other.ios;
        self.bytes += other.bytes;
        self.slat.merge(&other.slat);
        self.clat.merge(&other.clat);
        self.lat.merge(&other.lat);
        self.lat_intended.merge(&other.lat_intended);
    }
}
