//! The run's interval series, joined and bounded: each workload interval is paired with the
//! probe interval of the same measured second as both arrive, and the series never holds more
//! than [`MAX_POINTS`] points. A run longer than that many intervals is coarsened in place —
//! neighbouring points merge pairwise and each point then spans twice as long — so memory and
//! profile size stay flat in run length while every point still covers the whole run. Sums and
//! counts stay exact; each point's percentiles come from its merged latency histogram.

use std::collections::VecDeque;
use std::time::Duration;

use virtgap_probes::model::{DevNum, ProbeSnapshot};
use virtgap_workloads::histogram::CompactHistogram;
use virtgap_workloads::stats::IntervalSample;

use crate::profile::{Interval, ProbeInterval};
use crate::stalls::StallLog;

/// Points kept at most: an hour at 1 s intervals coarsens to 2 s, a day to 64 s.
pub const MAX_POINTS: usize = 2048;
/// Fewer on a host whose intervals are large (per-CPU loads of dozens of CPUs): the series'
/// share of a profile stays under this many bytes of JSON, but keeps at least `MIN_POINTS`.
const SERIES_JSON_BUDGET: usize = 40 << 20;
const MIN_POINTS: usize = 256;

/// Workload intervals held while their probe interval has not arrived; past this the probes
/// are taken to have stopped reporting and the interval is kept without them.
const MAX_WAITING: usize = 8;

/// One point of the series.
#[derive(Clone, Debug)]
pub struct SeriesPoint {
    pub interval: Interval,
    pub start_ns: u64,
    pub end_ns: u64,
    lat: CompactHistogram,
}

impl SeriesPoint {
    /// The mean latency of the point's I/Os.
    pub fn lat_mean_ns(&self) -> Option<f64> {
        (self.interval.lat_count > 0)
            .then(|| self.interval.lat_sum_ns / self.interval.lat_count as f64)
    }

    pub fn secs(&self) -> f64 {
        (self.end_ns - self.start_ns) as f64 / 1e9
    }

    fn absorb(&mut self, later: SeriesPoint) {
        self.interval.absorb(&later.interval);
        self.end_ns = later.end_ns;
        let mut h = self.lat.expand();
        h.merge(&later.lat.expand());
        self.interval.lat_p50_ns = h.percentile_ns(50.0);
        self.interval.lat_p99_ns = h.percentile_ns(99.0);
        self.lat = h.compact();
    }
}

/// The joined, bounded series of a run.
#[derive(Debug)]
pub struct IntervalSeries {
    interval: Duration,
    /// Raw intervals per point: a power of two, 1 until the series first fills.
    span: u64,
    points: Vec<SeriesPoint>,
    /// The workload interval index point 0 starts at: the first one pushed (after a reset, the
    /// first one after it).
    origin: Option<u64>,
    devs: Option<Vec<DevNum>>,
    probes_expected: bool,
    /// Probe intervals that fall in the ramp, before the measured window.
    probe_skip: u64,
    /// Probe intervals received so far.
    probes_seen: u64,
    /// Condensed probe intervals not yet joined, with the workload index each belongs to.
    waiting_probes: VecDeque<(u64, ProbeInterval)>,
    waiting_samples: VecDeque<IntervalSample>,
    /// Stalls seen in the whole-run intervals, before coarsening could hide them.
    stall_log: StallLog,
    /// The most points kept, set from the first point's size (see [`SERIES_JSON_BUDGET`]).
    max_points: Option<usize>,
}

impl IntervalSeries {
    /// `ramp` is the workload's warm-up: the probe intervals in it are dropped. `probes`: whether
    /// probe intervals will come to be joined.
    pub fn new(
        interval: Duration,
        ramp: Duration,
        devs: Option<Vec<DevNum>>,
        probes: bool,
    ) -> Self {
        let skip = (ramp.as_secs_f64() / interval.as_secs_f64().max(1e-9)).round() as u64;
        Self {
            interval,
            span: 1,
            points: Vec::new(),
            origin: None,
            devs,
            probes_expected: probes,
            probe_skip: skip,
            probes_seen: 0,
            waiting_probes: VecDeque::new(),
            waiting_samples: VecDeque::new(),
            stall_log: StallLog::default(),
            max_points: None,
        }
    }

    pub fn points(&self) -> &[SeriesPoint] {
        &self.points
    }

    /// The length each point spans.
    pub fn point_interval(&self) -> Duration {
        self.interval * self.span as u32
    }

    /// The most points this series keeps.
    pub fn max_points(&self) -> usize {
        self.max_points.unwrap_or(MAX_POINTS)
    }

    /// How many times longer each point is than the interval asked for (1: not coarsened).
    pub fn coarsening(&self) -> u64 {
        self.span
    }

    pub fn intervals(&self) -> Vec<Interval> {
        self.points.iter().map(|p| p.interval.clone()).collect()
    }

    /// A probe collector interval, in arrival order.
    pub fn add_probe(&mut self, snapshot: &ProbeSnapshot) {
        let ordinal = self.probes_seen;
        self.probes_seen += 1;
        let Some(index) = ordinal.checked_sub(self.probe_skip) else {
            return;
        };
        self.waiting_probes
            .push_back((index, ProbeInterval::of(snapshot, self.devs.as_deref())));
        self.join_waiting();
    }

    pub fn stall_log(&self) -> &StallLog {
        &self.stall_log
    }

    /// A whole-run workload interval, in index order.
    pub fn add_sample(&mut self, sample: IntervalSample) {
        self.stall_log.add(&sample);
        self.waiting_samples.push_back(sample);
        self.join_waiting();
    }

    /// The run is over: what still waits for a probe interval is kept without one.
    pub fn finish(&mut self) {
        self.probes_expected = false;
        self.join_waiting();
    }

    /// Drops the points so far (the TUI's reset); what comes next starts a new series.
    pub fn clear(&mut self) {
        self.points.clear();
        self.span = 1;
        self.origin = None;
        self.stall_log = StallLog::default();
        self.max_points = None;
    }

    fn join_waiting(&mut self) {
        while let Some(sample) = self.waiting_samples.front() {
            let index = sample.index;
            while self.waiting_probes.front().is_some_and(|(i, _)| *i < index) {
                self.waiting_probes.pop_front();
            }
            let probe = match self.waiting_probes.front() {
                Some((i, _)) if *i == index => self.waiting_probes.pop_front().map(|(_, p)| p),
                _ if self.probes_expected && self.waiting_samples.len() <= MAX_WAITING => return,
                _ => None,
            };
            let sample = self.waiting_samples.pop_front().expect("front exists");
            self.push(&sample, probe);
        }
    }

    fn push(&mut self, sample: &IntervalSample, probe: Option<ProbeInterval>) {
        let origin = *self.origin.get_or_insert(sample.index);
        let raw = sample.index.saturating_sub(origin);
        let mut point = SeriesPoint {
            interval: crate::profile::interval(sample, probe),
            start_ns: sample.start_ns,
            end_ns: sample.end_ns,
            lat: sample.lat.compact(),
        };
        let max_points = *self.max_points.get_or_insert_with(|| {
            // As the profile prints it, plus the deeper indentation inside its intervals array.
            let bytes = serde_json::to_vec_pretty(&point.interval).map_or(1, |v| v.len() * 5 / 4);
            (SERIES_JSON_BUDGET / bytes.max(1)).clamp(MIN_POINTS, MAX_POINTS)
        });
        while raw / self.span >= max_points as u64 {
            self.coarsen();
        }
        let slot = raw / self.span;
        point.interval.index = slot;
        match self.points.last_mut() {
            Some(last) if last.interval.index == slot => last.absorb(point),
            _ => self.points.push(point),
        }
    }

    /// Halves the resolution: points 2k and 2k+1 become point k.
    fn coarsen(&mut self) {
        self.span *= 2;
        let old = std::mem::take(&mut self.points);
        for mut p in old {
            p.interval.index /= 2;
            match self.points.last_mut() {
                Some(last) if last.interval.index == p.interval.index => last.absorb(p),
                _ => self.points.push(p),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtgap_probes::model::ProgramStats;
    use virtgap_workloads::LatencyHistogram;

    const SEC: u64 = 1_000_000_000;

    fn sample(index: u64, ios: u64) -> IntervalSample {
        let mut s = IntervalSample::empty(u32::MAX, index, index * SEC);
        s.end_ns = s.start_ns + SEC;
        s.read_ios = ios;
        s.read_bytes = ios * 4096;
        for n in 0..ios {
            s.lat.record(100_000 + (index * 7 + n * 13) % 900_000);
        }
        s
    }

    /// A probe interval whose BPF run time marks which collector interval it was.
    fn probe(ordinal: u64) -> ProbeSnapshot {
        ProbeSnapshot {
            programs: vec![ProgramStats {
                family: "block".into(),
                name: "test".into(),
                run_count: 1,
                run_time_ns: 1000 + ordinal,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn probe_intervals_join_the_workload_interval_of_the_same_second_after_the_ramp() {
        let mut s = IntervalSeries::new(Duration::from_secs(1), Duration::from_secs(2), None, true);
        // Probes run ahead of the workload's first measured interval by the ramp.
        for p in 0..4 {
            s.add_probe(&probe(p));
        }
        s.add_sample(sample(0, 10));
        s.add_sample(sample(1, 10));
        // Interval 2's probe interval has not come yet: it waits.
        s.add_sample(sample(2, 10));
        assert_eq!(s.points().len(), 2);
        s.add_probe(&probe(4));
        let runs: Vec<_> = s.points().iter().map(|p| p.interval.probe_run_ns).collect();
        assert_eq!(runs, [Some(1002), Some(1003), Some(1004)]);
        // Once the run is over nothing waits any more.
        s.add_sample(sample(3, 10));
        s.finish();
        assert_eq!(s.points()[3].interval.probe_run_ns, None);
    }

    #[test]
    fn without_probe_intervals_the_workload_does_not_wait_for_ever() {
        let mut s = IntervalSeries::new(Duration::from_secs(1), Duration::ZERO, None, true);
        for i in 0..20 {
            s.add_sample(sample(i, 1));
        }
        assert!(s.points().len() >= 20 - MAX_WAITING, "{}", s.points().len());
    }

    #[test]
    fn a_long_run_keeps_a_bounded_series_with_exact_sums() {
        let mut s = IntervalSeries::new(Duration::from_secs(1), Duration::ZERO, None, false);
        let mut all = LatencyHistogram::new();
        let mut first_eight = LatencyHistogram::new();
        let n = 5 * MAX_POINTS as u64 + 3;
        let mut total = 0;
        for i in 0..n {
            let x = sample(i, 1 + i % 5);
            total += x.read_ios;
            all.merge(&x.lat);
            if i < 8 {
                first_eight.merge(&x.lat);
            }
            s.add_sample(x);
        }
        s.finish();
        let points = s.points();
        assert!(points.len() <= MAX_POINTS);
        assert_eq!(s.coarsening(), 8, "5x the cap needs points of 8 intervals");
        assert_eq!(s.point_interval(), Duration::from_secs(8));
        assert_eq!(
            points.iter().map(|p| p.interval.read_ios).sum::<u64>(),
            total
        );
        assert_eq!(
            points.iter().map(|p| p.interval.lat_count).sum::<u64>(),
            all.count()
        );
        for (k, p) in points.iter().enumerate() {
            assert_eq!(p.interval.index, k as u64);
            assert_eq!(p.start_ns, k as u64 * 8 * SEC);
        }
        // The last point holds what is left (3 intervals), the rest 8 each.
        assert_eq!(points.last().unwrap().secs(), 3.0);
        // A coarse point's percentiles are those of all the I/Os it holds.
        assert_eq!(
            points[0].interval.lat_p99_ns,
            first_eight.percentile_ns(99.0)
        );
        let held: usize = points.iter().map(|p| p.lat.heap_bytes()).sum();
        assert!(held < 64 << 20, "{held} bytes of histograms");
    }

    #[test]
    fn intervals_of_a_host_with_many_cpus_keep_the_series_within_its_byte_budget() {
        let mut s = IntervalSeries::new(Duration::from_secs(1), Duration::ZERO, None, true);
        let mut snap = probe(0);
        snap.cpu_times = (0..192)
            .map(|cpu| virtgap_probes::procfs::CpuTimes {
                cpu,
                ..Default::default()
            })
            .collect();
        for i in 0..6000 {
            s.add_probe(&snap);
            s.add_sample(sample(i, 1));
        }
        s.finish();
        let json = serde_json::to_vec_pretty(&s.intervals()).unwrap().len();
        assert!(json <= SERIES_JSON_BUDGET, "{json} bytes");
        assert!(s.points().len() >= MIN_POINTS / 2, "{}", s.points().len());
        assert_eq!(s.points()[0].interval.cpus.len(), 192);
    }

    #[test]
    fn a_cleared_series_starts_again_from_the_next_interval() {
        let mut s = IntervalSeries::new(Duration::from_secs(1), Duration::ZERO, None, false);
        for i in 0..5 {
            s.add_sample(sample(i, 2));
        }
        s.clear();
        s.add_sample(sample(5, 3));
        assert_eq!(s.points().len(), 1);
        assert_eq!(s.points()[0].interval.index, 0);
        assert_eq!(s.points()[0].interval.read_ios, 3);
    }
}
