//! A latency distribution as a profile keeps it: sparse log-linear buckets with an exact count
//! and sum, from the workload's histograms or the kernel's, merged across runs, read by
//! virtgap's one percentile rule.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use virtgap_probes::KernelHist;
use virtgap_workloads::LatencyHistogram;

/// A latency distribution as sparse buckets with exact count and sum.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Histogram {
    pub count: u64,
    pub sum_ns: f64,
    pub min_ns: Option<u64>,
    pub max_ns: Option<u64>,
    /// [low ns, high ns inclusive, count] for every non-empty bucket, ascending.
    pub buckets: Vec<[u64; 3]>,
    /// Sum of the squared values, for the exact standard deviation (the workload's
    /// histograms; the kernel's keep none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum_sq_ns: Option<f64>,
}

impl Histogram {
    pub fn from_latency(h: &LatencyHistogram) -> Self {
        Self {
            count: h.count(),
            sum_ns: h.sum_ns() as f64,
            min_ns: h.min_ns(),
            max_ns: h.max_ns(),
            buckets: h
                .buckets()
                .into_iter()
                .map(|(l, hi, n)| [l, hi, n])
                .collect(),
            sum_sq_ns: Some(h.sum_sq_ns() as f64),
        }
    }

    pub fn from_kernel(h: &KernelHist) -> Self {
        let buckets: Vec<[u64; 3]> = h
            .buckets()
            .into_iter()
            .map(|(l, hi, n)| [l, hi.min(u64::MAX / 2), n])
            .collect();
        // The kernel keeps no extremes, only buckets: min and max are unknown, not the first
        // bucket's low or the last one's high bound.
        Self {
            count: h.count,
            sum_ns: h.sum_ns as f64,
            min_ns: None,
            max_ns: None,
            buckets,
            sum_sq_ns: None,
        }
    }

    pub fn mean_ns(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ns / self.count as f64)
    }

    /// Population standard deviation (fio's), where the sum of squares is kept.
    pub fn stddev_ns(&self) -> Option<f64> {
        let mean = self.mean_ns()?;
        let mean_sq = self.sum_sq_ns? / self.count as f64;
        Some((mean_sq - mean * mean).max(0.0).sqrt())
    }

    /// Percentile `p` of a kernel histogram, read as its copy in a profile reads it.
    pub fn kernel_percentile_ns(h: &KernelHist, p: f64) -> Option<f64> {
        Self::from_kernel(h).percentile_ns(p)
    }

    /// The histogram of `values`, as the workload would record them (for tests).
    #[cfg(test)]
    pub fn of_values(values: &[u64]) -> Self {
        let mut h = LatencyHistogram::new();
        for &v in values {
            h.record(v);
        }
        Self::from_latency(&h)
    }

    /// Adds `other` into this one. Buckets with the same bounds add up (both sources use fixed
    /// bucket layouts, so a run's buckets line up with another run's of the same source).
    pub fn merge(&mut self, other: &Histogram) {
        // An empty side (a default histogram merged into) has nothing to add or lose.
        self.sum_sq_ns = match (self.count, other.count) {
            (_, 0) => self.sum_sq_ns,
            (0, _) => other.sum_sq_ns,
            _ => self.sum_sq_ns.zip(other.sum_sq_ns).map(|(a, b)| a + b),
        };
        self.count = self.count.saturating_add(other.count);
        self.sum_ns += other.sum_ns;
        let pick = |a: Option<u64>, b: Option<u64>, f: fn(u64, u64) -> u64| match (a, b) {
            (Some(a), Some(b)) => Some(f(a, b)),
            (a, b) => a.or(b),
        };
        self.min_ns = pick(self.min_ns, other.min_ns, u64::min);
        self.max_ns = pick(self.max_ns, other.max_ns, u64::max);
        let mut by_bounds: BTreeMap<(u64, u64), u64> = BTreeMap::new();
        for &[lo, hi, n] in self.buckets.iter().chain(&other.buckets) {
            let slot = by_bounds.entry((lo, hi)).or_default();
            *slot = slot.saturating_add(n);
        }
        self.buckets = by_bounds
            .into_iter()
            .map(|((lo, hi), n)| [lo, hi, n])
            .collect();
    }

    /// Adds `other` into an optional histogram (a stage one side may not have).
    pub fn merge_into(slot: &mut Option<Histogram>, other: Option<&Histogram>) {
        match (slot.as_mut(), other) {
            (Some(mine), Some(other)) => mine.merge(other),
            (None, Some(other)) => *slot = Some(other.clone()),
            _ => {}
        }
    }

    /// Percentile `p` (0–100) by virtgap's one rule (`percentile_of_buckets`).
    pub fn percentile_ns(&self, p: f64) -> Option<f64> {
        let buckets: Vec<(u64, u64, u64)> = self
            .buckets
            .iter()
            .map(|&[lo, hi, n]| (lo, hi, n))
            .collect();
        let extremes = self.min_ns.zip(self.max_ns);
        virtgap_workloads::histogram::percentile_of_buckets(&buckets, p, extremes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_percentiles_interpolate_within_buckets() {
        let h = Histogram {
            count: 4,
            sum_ns: 10.0,
            min_ns: Some(1),
            max_ns: Some(4),
            buckets: vec![[1, 1, 1], [2, 2, 1], [3, 3, 1], [4, 4, 1]],
            sum_sq_ns: Some(30.0),
        };
        assert_eq!(h.mean_ns(), Some(2.5));
        assert_eq!(h.stddev_ns(), Some(1.25f64.sqrt()));
        assert_eq!(h.percentile_ns(100.0), Some(4.0));
        assert_eq!(h.percentile_ns(50.0), Some(2.0));
        assert_eq!(Histogram::default().percentile_ns(50.0), None);
    }

    #[test]
    fn kernel_histograms_keep_exact_sums() {
        let mut k = KernelHist::default();
        for v in [100, 200, 300, 10_000] {
            k.record(v);
        }
        let h = Histogram::from_kernel(&k);
        assert_eq!(h.count, 4);
        assert_eq!(
            (h.min_ns, h.max_ns),
            (None, None),
            "bucket bounds are not extremes"
        );
        assert_eq!(h.mean_ns(), Some(2_650.0));
        assert_eq!(h.buckets.iter().map(|b| b[2]).sum::<u64>(), 4);
    }

    #[test]
    fn one_percentile_rule_for_the_workloads_the_kernels_and_the_profiles_histograms() {
        // A skewed spread: most values near 100 µs, a tail to 5 ms.
        let values: Vec<u64> = (0..20_000u64)
            .map(|i| 100_000 + (i * 7919 % 20_000) * (i % 97) / 4)
            .collect();
        let mut workload = virtgap_workloads::histogram::LatencyHistogram::new();
        let mut kernel = KernelHist::default();
        for &v in &values {
            workload.record(v);
            kernel.record(v);
        }
        let (from_workload, from_kernel) = (
            Histogram::from_latency(&workload),
            Histogram::from_kernel(&kernel),
        );
        for p in [0.0, 50.0, 90.0, 99.0, 99.9, 100.0] {
            // The profile's copy of a histogram reads the same percentile as the original.
            let w = workload.percentile_ns(p).unwrap();
            let pw = from_workload.percentile_ns(p).unwrap();
            assert!(
                (pw - w as f64).abs() <= 0.5,
                "p{p}: profile {pw} vs workload {w}"
            );
            let k = virtgap_workloads::histogram::percentile_of_buckets(&kernel.buckets(), p, None);
            assert_eq!(from_kernel.percentile_ns(p), k, "p{p}");
            // And the rule is the same one: the two layouts agree to their bucket widths.
            let k = k.unwrap();
            assert!(
                (k - pw).abs() / pw <= 0.13,
                "p{p}: kernel {k} vs workload {pw}"
            );
        }
        assert_eq!(
            workload.percentile_ns(0.0),
            Some(*values.iter().min().unwrap())
        );
        assert_eq!(
            workload.percentile_ns(100.0),
            Some(*values.iter().max().unwrap())
        );
    }
}
