//! Latency histograms: log-linear buckets (HdrHistogram, 2 significant digits, so any recorded
//! value is reported within 1% of itself) plus exact count, sum, sum of squares, min and max,
//! so means and standard deviations are exact rather than bucket midpoints.

use hdrhistogram::Histogram;

/// Largest latency a histogram tracks: one hour. Longer values saturate into the top bucket.
const MAX_TRACKABLE_NS: u64 = 3_600_000_000_000;
/// Two significant digits: 256 sub-buckets per power of two, relative bucket width <= 0.78%.
const SIGNIFICANT_DIGITS: u8 = 2;

/// The percentiles fio prints by default, as fractions of 100.
pub const FIO_PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

/// Percentile `p` (0–100) of a distribution kept as buckets of (low, high inclusive, count),
/// ascending: the one rule for every histogram virtgap keeps (the workload's, the kernel's and
/// the profile's), so a p99 reads the same in the summary, the TUI, the CSV and the diff. The
/// rank is p/100 of the count; the value is interpolated linearly inside the bucket holding
/// that rank, and clamped to the exact extremes when they are known (so p0 and p100 are
/// exact). `None` when the buckets are empty.
pub fn percentile_of_buckets(
    buckets: &[(u64, u64, u64)],
    p: f64,
    extremes: Option<(u64, u64)>,
) -> Option<f64> {
    let total = buckets.iter().fold(0u64, |t, b| t.saturating_add(b.2));
    if total == 0 {
        return None;
    }
    let rank = (p / 100.0).clamp(0.0, 1.0) * total as f64;
    let clamp = |v: f64| match extremes {
        Some((lo, hi)) => v.clamp(lo as f64, hi.max(lo) as f64),
        None => v,
    };
    let mut seen = 0u64;
    for &(low, high, n) in buckets {
        if n > 0 && seen.saturating_add(n) as f64 >= rank {
            let frac = ((rank - seen as f64) / n as f64).clamp(0.0, 1.0);
            return Some(clamp(low as f64 + frac * high.saturating_sub(low) as f64));
        }
        seen = seen.saturating_add(n);
    }
    buckets.last().map(|b| clamp(b.1 as f64))
}

/// A latency distribution in nanoseconds.
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    buckets: Histogram<u64>,
    count: u64,
    sum_ns: u128,
    sum_sq_ns: u128,
    min_ns: u64,
    max_ns: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    pub fn new() -> Self {
        let buckets = Histogram::new_with_bounds(1, MAX_TRACKABLE_NS, SIGNIFICANT_DIGITS)
            .expect("constant histogram bounds are valid");
        Self {
            buckets,
            count: 0,
            sum_ns: 0,
            sum_sq_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
        }
    }

    /// Records one latency. O(1), no allocation.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        // Zero is not representable in a log-linear histogram with a lowest value of 1 ns;
        // a zero reading means "below clock resolution", which 1 ns describes faithfully.
        let ns = ns.max(1);
        self.buckets.saturating_record(ns);
        self.count += 1;
        self.sum_ns += u128::from(ns);
        self.sum_sq_ns += u128::from(ns) * u128::from(ns);
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Adds every observation of `other` to this histogram.
    pub fn merge(&mut self, other: &Self) {
        if other.count == 0 {
            return;
        }
        self.buckets
            .add(&other.buckets)
            .expect("histograms share the same bounds");
        self.count += other.count;
        self.sum_ns += other.sum_ns;
        self.sum_sq_ns += other.sum_sq_ns;
        self.min_ns = self.min_ns.min(other.min_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    pub fn reset(&mut self) {
        *self = Self::new();
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Exact sum of all recorded values.
    pub fn sum_ns(&self) -> u128 {
        self.sum_ns
    }

    /// Sum of the squared values (for the standard deviation of merged histograms).
    pub fn sum_sq_ns(&self) -> u128 {
        self.sum_sq_ns
    }

    /// Smallest recorded value, or `None` when empty.
    pub fn min_ns(&self) -> Option<u64> {
        (self.count > 0).then_some(self.min_ns)
    }

    pub fn max_ns(&self) -> Option<u64> {
        (self.count > 0).then_some(self.max_ns)
    }

    /// Exact mean.
    pub fn mean_ns(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ns as f64 / self.count as f64)
    }

    /// Exact population standard deviation (fio reports the same).
    pub fn stddev_ns(&self) -> Option<f64> {
        let mean = self.mean_ns()?;
        let mean_sq = self.sum_sq_ns as f64 / self.count as f64;
        Some((mean_sq - mean * mean).max(0.0).sqrt())
    }

    /// Percentile `p` (0–100) by virtgap's one rule (`percentile_of_buckets`), to the
    /// nearest nanosecond.
    pub fn percentile_ns(&self, p: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        percentile_of_buckets(&self.buckets(), p, Some((self.min_ns, self.max_ns)))
            .map(|v| v.round() as u64)
    }

    /// How many values exceed `ns` (to bucket precision: a bucket counts when its low end does).
    pub fn count_above(&self, ns: u64) -> u64 {
        if self.count == 0 || self.max_ns <= ns {
            return 0;
        }
        self.buckets()
            .into_iter()
            .filter(|&(low, _, _)| low > ns)
            .map(|(_, _, n)| n)
            .sum()
    }

    /// Non-empty buckets as (low ns inclusive, high ns inclusive, count), ascending.
    pub fn buckets(&self) -> Vec<(u64, u64, u64)> {
        self.buckets
            .iter_recorded()
            .map(|v| {
                let high = v.value_iterated_to();
                let low = self.buckets.lowest_equivalent(high);
                (low, high, v.count_since_last_iteration())
            })
            .collect()
    }
}

/// A latency histogram kept for later: only its non-empty buckets, so a series of thousands of
/// intervals costs kilobytes each rather than the full bucket array. Expanding it gives back a
/// histogram with exactly the same buckets and statistics.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CompactHistogram {
    /// (highest value of the bucket, count), ascending.
    buckets: Vec<(u64, u64)>,
    count: u64,
    sum_ns: u128,
    sum_sq_ns: u128,
    min_ns: u64,
    max_ns: u64,
}

impl LatencyHistogram {
    pub fn compact(&self) -> CompactHistogram {
        let mut buckets: Vec<(u64, u64)> = self
            .buckets
            .iter_recorded()
            .map(|v| (v.value_iterated_to(), v.count_since_last_iteration()))
            .collect();
        buckets.shrink_to_fit();
        CompactHistogram {
            buckets,
            count: self.count,
            sum_ns: self.sum_ns,
            sum_sq_ns: self.sum_sq_ns,
            min_ns: self.min_ns,
            max_ns: self.max_ns,
        }
    }
}

impl CompactHistogram {
    pub fn expand(&self) -> LatencyHistogram {
        let mut h = LatencyHistogram::new();
        for &(value, n) in &self.buckets {
            // A bucket's highest value falls in that same bucket.
            h.buckets.saturating_record_n(value, n);
        }
        h.count = self.count;
        h.sum_ns = self.sum_ns;
        h.sum_sq_ns = self.sum_sq_ns;
        h.min_ns = self.min_ns;
        h.max_ns = self.max_ns;
        h
    }

    /// Heap bytes held (for memory accounting in tests).
    pub fn heap_bytes(&self) -> usize {
        self.buckets.capacity() * std::mem::size_of::<(u64, u64)>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_histogram_has_no_statistics() {
        let h = LatencyHistogram::new();
        assert_eq!(h.count(), 0);
        assert_eq!(h.mean_ns(), None);
        assert_eq!(h.percentile_ns(50.0), None);
        assert_eq!(h.min_ns(), None);
    }

    #[test]
    fn mean_and_stddev_are_exact() {
        let mut h = LatencyHistogram::new();
        for v in [1_000u64, 2_000, 3_000, 4_000] {
            h.record(v);
        }
        assert_eq!(h.mean_ns(), Some(2_500.0));
        let sd = h.stddev_ns().unwrap();
        assert!((sd - 1_118.033_988_75).abs() < 1e-6, "stddev {sd}");
        assert_eq!(h.min_ns(), Some(1_000));
        assert_eq!(h.max_ns(), Some(4_000));
    }

    #[test]
    fn every_value_is_reported_within_one_percent() {
        // Walk values across twelve orders of magnitude; a histogram holding one value must
        // report each percentile within 1% of it.
        let mut v = 1u64;
        while v < MAX_TRACKABLE_NS {
            let mut h = LatencyHistogram::new();
            h.record(v);
            // Percentiles of a single value are clamped to it; check the raw buckets instead.
            let (low, high, count) = h.buckets()[0];
            assert_eq!(count, 1);
            assert!(low <= v && v <= high, "{v} not in [{low}, {high}]");
            let width = (high - low) as f64;
            assert!(
                width <= v as f64 * 0.01 + 1.0,
                "bucket [{low},{high}] too wide for {v}"
            );
            v = v * 7 / 3 + 1;
        }
    }

    #[test]
    fn percentiles_of_a_uniform_spread_are_within_one_percent() {
        let mut h = LatencyHistogram::new();
        for v in 1..=100_000u64 {
            h.record(v * 10);
        }
        for p in [50.0, 90.0, 99.0, 99.9] {
            let exact = (p / 100.0 * 100_000.0) * 10.0;
            let got = h.percentile_ns(p).unwrap() as f64;
            assert!(
                (got - exact).abs() / exact <= 0.01,
                "p{p}: {got} vs {exact}"
            );
        }
    }

    #[test]
    fn a_percentile_is_interpolated_inside_its_bucket_and_clamped_to_the_extremes() {
        // 10 values in [100, 199], 10 in [200, 299].
        let buckets = [(100, 199, 10), (200, 299, 10)];
        let at = |p, ext| percentile_of_buckets(&buckets, p, ext).unwrap();
        assert_eq!(at(25.0, None), 149.5);
        assert_eq!(at(50.0, None), 199.0);
        assert_eq!(at(75.0, None), 249.5);
        assert_eq!(at(100.0, None), 299.0);
        assert_eq!(at(0.0, Some((130, 250))), 130.0);
        assert_eq!(at(100.0, Some((130, 250))), 250.0);
        assert_eq!(percentile_of_buckets(&[], 50.0, None), None);
        assert_eq!(percentile_of_buckets(&[(5, 9, 0)], 50.0, None), None);
    }

    #[test]
    fn merge_equals_recording_everything_in_one() {
        let mut a = LatencyHistogram::new();
        let mut b = LatencyHistogram::new();
        let mut all = LatencyHistogram::new();
        for v in 0..5_000u64 {
            let x = 1_000 + v * 37 % 91_000;
            if v % 3 == 0 {
                a.record(x)
            } else {
                b.record(x)
            }
            all.record(x);
        }
        a.merge(&b);
        assert_eq!(a.count(), all.count());
        assert_eq!(a.sum_ns(), all.sum_ns());
        assert_eq!(a.percentile_ns(99.0), all.percentile_ns(99.0));
        assert_eq!(a.buckets(), all.buckets());
    }

    #[test]
    fn zero_is_recorded_as_one_nanosecond() {
        let mut h = LatencyHistogram::new();
        h.record(0);
        assert_eq!(h.min_ns(), Some(1));
        assert_eq!(h.count(), 1);
    }

    #[test]
    fn values_beyond_an_hour_saturate() {
        let mut h = LatencyHistogram::new();
        h.record(u64::MAX / 2);
        assert_eq!(h.count(), 1);
        assert!(h.percentile_ns(100.0).is_some());
    }

    #[test]
    fn a_compacted_histogram_expands_to_the_same_one() {
        let mut h = LatencyHistogram::new();
        for v in 0..20_000u64 {
            h.record(5_000 + v * 7919 % 2_000_000);
        }
        let c = h.compact();
        assert!(c.heap_bytes() < 16 * 1024, "{} bytes", c.heap_bytes());
        let back = c.expand();
        assert_eq!(back.buckets(), h.buckets());
        for p in [50.0, 99.0, 99.9] {
            assert_eq!(back.percentile_ns(p), h.percentile_ns(p));
        }
        assert_eq!(back.stddev_ns(), h.stddev_ns());
        let mut twice = c.expand();
        twice.merge(&h);
        let mut hh = h.clone();
        hh.merge(&h);
        assert_eq!(twice.compact().expand().buckets(), hh.buckets());
        assert_eq!(LatencyHistogram::new().compact().expand().count(), 0);
    }
}
