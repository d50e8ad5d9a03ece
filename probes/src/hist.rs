//! The in-kernel log-linear histogram (`struct vg_hist`, `bpf/include/vg_hist.bpf.h`) as plain
//! Rust data: values 0..7 exactly, then 8 sub-buckets per power of two, so a slot spans at most
//! 12.5% of its value. Percentiles are read from `buckets()` by the one rule every histogram of
//! virtgap follows (`virtgap_workloads::histogram::percentile_of_buckets`).

use serde::{Deserialize, Serialize};

use crate::bpf::hist_check::types::vg_limits;
use crate::bpf::RawHist;

/// Sub-buckets per power of two, as log2 (`VG_HIST_SUB_BITS` in `bpf/include/virtgap.h`).
pub const SUB_BITS: u32 = vg_limits::VG_HIST_SUB_BITS.0;
/// Slots of a histogram (`VG_HIST_SLOTS`); the last one holds every larger value.
pub const SLOTS: usize = vg_limits::VG_HIST_SLOTS.0 as usize;

/// Sub-buckets per power of two.
const SUBS: u64 = 1 << SUB_BITS;

/// The slot a value falls in (the same arithmetic as `vg_hist_slot` in BPF).
pub fn slot_of(v: u64) -> usize {
    if v < SUBS {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    let slot =
        (((e - SUB_BITS + 1) << SUB_BITS) as u64 + ((v >> (e - SUB_BITS)) & (SUBS - 1))) as usize;
    slot.min(SLOTS - 1)
}

/// Inclusive value range [low, high] of a slot.
pub fn slot_bounds(slot: usize) -> (u64, u64) {
    if (slot as u64) < SUBS {
        return (slot as u64, slot as u64);
    }
    let e = (slot >> SUB_BITS) as u32 + SUB_BITS - 1;
    let sub = slot as u64 & (SUBS - 1);
    let low = (SUBS + sub) << (e - SUB_BITS);
    let high = if slot == SLOTS - 1 {
        u64::MAX
    } else {
        ((SUBS + sub + 1) << (e - SUB_BITS)) - 1
    };
    (low, high)
}

/// A latency distribution from the kernel: per-slot counts, exact count and sum.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelHist {
    pub slots: Vec<u64>,
    pub count: u64,
    pub sum_ns: u64,
}

impl Default for KernelHist {
    fn default() -> Self {
        Self {
            slots: vec![0; SLOTS],
            count: 0,
            sum_ns: 0,
        }
    }
}

/// Every skeleton's own copy of `vg_hist` converts to the one model type.
impl<H: RawHist> From<&H> for KernelHist {
    fn from(h: &H) -> Self {
        Self::from_raw(h.slots(), h.sum_ns())
    }
}

impl KernelHist {
    /// A kernel histogram's slots and sum: its count is its slots' total, as the kernel
    /// keeps no count of its own.
    pub fn from_raw(slots: &[u64], sum_ns: u64) -> Self {
        let mut s = vec![0; SLOTS];
        let n = slots.len().min(SLOTS);
        s[..n].copy_from_slice(&slots[..n]);
        Self {
            count: s.iter().sum(),
            slots: s,
            sum_ns,
        }
    }

    /// Records one value (used to build fixtures and in tests).
    pub fn record(&mut self, v: u64) {
        self.slots[slot_of(v)] += 1;
        self.count += 1;
        self.sum_ns += v;
    }

    pub fn merge(&mut self, other: &Self) {
        for (a, b) in self.slots.iter_mut().zip(&other.slots) {
            *a += b;
        }
        self.count += other.count;
        self.sum_ns += other.sum_ns;
    }

    /// What was added since `earlier` (counters only grow, so this is exact).
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            slots: self
                .slots
                .iter()
                .zip(&earlier.slots)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
            count: self.count.saturating_sub(earlier.count),
            sum_ns: self.sum_ns.saturating_sub(earlier.sum_ns),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Exact mean.
    pub fn mean_ns(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ns as f64 / self.count as f64)
    }

    /// Non-empty slots as (low ns, high ns inclusive, count).
    pub fn buckets(&self) -> Vec<(u64, u64, u64)> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(s, &n)| {
                let (lo, hi) = slot_bounds(s);
                (lo, hi, n)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C arithmetic, transcribed literally (log2 by shifts, as BPF has no clz).
    fn c_slot(v: u64) -> usize {
        fn log2(mut v: u64) -> u32 {
            let mut r = 0;
            for bits in [32, 16, 8, 4, 2] {
                let shift = if v > (1u64 << bits) - 1 { bits } else { 0 };
                v >>= shift;
                r |= shift;
            }
            r | (v >> 1) as u32
        }
        if v < 8 {
            return v as usize;
        }
        let e = log2(v);
        let slot = (((e - 3 + 1) << 3) as u64 + ((v >> (e - 3)) & 7)) as usize;
        slot.min(SLOTS - 1)
    }

    #[test]
    fn rust_and_bpf_slots_agree() {
        let mut v = 0u64;
        while v < u64::MAX / 3 {
            assert_eq!(slot_of(v), c_slot(v), "value {v}");
            v = v * 3 / 2 + 1;
        }
        for v in 0..5000 {
            assert_eq!(slot_of(v), c_slot(v));
        }
    }

    #[test]
    fn slots_tile_the_number_line() {
        let mut expected_low = 0;
        for s in 0..SLOTS - 1 {
            let (lo, hi) = slot_bounds(s);
            assert_eq!(lo, expected_low, "slot {s}");
            assert_eq!(slot_of(lo), s);
            assert_eq!(slot_of(hi), s);
            assert!(
                (hi - lo) as f64 <= lo as f64 / 8.0 + 1.0,
                "slot {s} too wide"
            );
            expected_low = hi + 1;
        }
    }

    #[test]
    fn percentiles_are_within_ten_percent() {
        let mut h = KernelHist::default();
        for v in 1..=100_000u64 {
            h.record(v * 37);
        }
        for p in [50.0, 90.0, 99.0, 99.9] {
            let exact = p / 100.0 * 100_000.0 * 37.0;
            let got =
                virtgap_workloads::histogram::percentile_of_buckets(&h.buckets(), p, None).unwrap();
            assert!((got - exact).abs() / exact < 0.10, "p{p}: {got} vs {exact}");
        }
        assert_eq!(h.mean_ns(), Some(50_000.5 * 37.0));
    }

    #[test]
    fn since_subtracts_exactly() {
        let mut a = KernelHist::default();
        a.record(100);
        let before = a.clone();
        a.record(5000);
        let d = a.since(&before);
        assert_eq!(d.count, 1);
        assert_eq!(d.sum_ns, 5000);
        assert_eq!(d.buckets().len(), 1);
    }
}
