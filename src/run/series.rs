//! The run's interval series, joined and bounded: each workload interval is paired with the
//! probe interval of the same measured second as both arrive, and the series never holds more
//! than [`MAX_POINTS`] points. A run longer than that many intervals is coarsened — neighbouring
//! points merge pairwise and each point then spans twice as long — so the profile's size stays
//! flat in run length while every point still covers the whole run. Sums and counts stay exact;
//! each point's percentiles come from its merged latency histogram. Settled points wait in an
//! unlinked temporary file (see [`Spool`]), so the recorder's memory stays flat too.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::time::Duration;
use virtgap_probes::hypervisor::Hypervisor;

use serde::{Deserialize, Serialize};
use virtgap_probes::model::{BlockOp, BlockStage, DevNum, ProbeSnapshot};
use virtgap_workloads::histogram::CompactHistogram;
use virtgap_workloads::stats::IntervalSample;

use crate::model::interval::Interval;
use crate::run::assemble::ProbeInterval;
use crate::run::stalls::StallLog;

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
#[derive(Clone, Debug, Serialize, Deserialize)]
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
    /// The host's hypervisor: each interval keeps its mechanisms' figures.
    hypervisor: Hypervisor,
    interval: Duration,
    /// Raw intervals per point: a power of two, 1 until the series first fills.
    span: u64,
    /// Points that take no more intervals, in order.
    settled: Spool,
    /// The last point, which may still absorb intervals.
    tail: Option<SeriesPoint>,
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
    /// No workload: each probe interval is a point of its own (see [`Self::probe_only`]).
    probe_only: bool,
    /// Every worker finished: no workload interval will come, and what probe intervals still
    /// come are folded into the last point (see [`Self::fold_trailing`]).
    workload_ended: bool,
}

impl IntervalSeries {
    /// The first `ramp_intervals` probe intervals fall in the workload's warm-up and are
    /// dropped (see [`crate::run::recorder::ramp_intervals`]). `probes`: whether probe intervals
    /// will come to be joined.
    pub fn new(
        interval: Duration,
        ramp_intervals: u64,
        devs: Option<Vec<DevNum>>,
        probes: bool,
        hypervisor: Hypervisor,
    ) -> Self {
        Self {
            hypervisor,
            interval,
            span: 1,
            settled: Spool::new(),
            tail: None,
            origin: None,
            devs,
            probes_expected: probes,
            probe_skip: ramp_intervals,
            probes_seen: 0,
            waiting_probes: VecDeque::new(),
            waiting_samples: VecDeque::new(),
            stall_log: StallLog::watching(),
            max_points: None,
            probe_only: false,
            workload_ended: false,
        }
    }

    /// The series of a run without a workload (attach mode): each probe interval is a point,
    /// its block requests the point's I/Os and the followed processes' reads and writes (the
    /// app probe's calls and requests) its latency. Request sizes are not measured: the bytes
    /// stay 0. Merged points keep no percentiles (the kernel's histograms are not kept per
    /// point). `devs`: the disks whose requests count (None: every disk).
    pub fn probe_only(
        interval: Duration,
        hypervisor: Hypervisor,
        devs: Option<Vec<DevNum>>,
    ) -> Self {
        Self {
            probe_only: true,
            ..Self::new(interval, 0, devs, true, hypervisor)
        }
    }

    /// The disks whose requests the series counts (None: every disk).
    pub fn devs(&self) -> Option<&[DevNum]> {
        self.devs.as_deref()
    }

    /// Whether each probe interval is a point of its own (see [`Self::probe_only`]).
    pub fn is_probe_only(&self) -> bool {
        self.probe_only
    }

    /// The points so far, read back from where they wait.
    pub fn points(&self) -> io::Result<Vec<SeriesPoint>> {
        let mut points = Vec::with_capacity(self.len());
        self.settled.read(|p| points.push(p))?;
        points.extend(self.tail.clone());
        Ok(points)
    }

    /// The latest point.
    pub fn last_point(&self) -> Option<&SeriesPoint> {
        self.tail.as_ref()
    }

    /// Points in the series (settled ones and the latest).
    pub fn len(&self) -> usize {
        self.settled.len() + usize::from(self.tail.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Why settled points are held in memory rather than in a temporary file, if they are.
    pub fn spool_problem(&self) -> Option<&str> {
        self.settled.problem.as_deref()
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

    /// A probe interval of a probe-only series, ending `end_ns` after the probes attached.
    pub fn add_probe_only(&mut self, end_ns: u64, snapshot: &ProbeSnapshot) {
        let raw = self.probes_seen - *self.origin.get_or_insert(self.probes_seen);
        self.probes_seen += 1;
        let start_ns = end_ns.saturating_sub(snapshot.elapsed_ns);
        let app = crate::run::assemble::attached_app_stage(snapshot).unwrap_or_default();
        let probes = ProbeInterval::of(snapshot, self.devs.as_deref(), self.hypervisor);
        let interval = Interval {
            index: raw,
            start_s: start_ns as f64 / 1e9,
            end_s: end_ns as f64 / 1e9,
            read_ios: block_requests(snapshot, BlockOp::Read, self.devs.as_deref()),
            write_ios: block_requests(snapshot, BlockOp::Write, self.devs.as_deref()),
            read_bytes: 0,
            write_bytes: 0,
            lat_count: app.count,
            lat_sum_ns: app.sum_ns,
            lat_p50_ns: app.percentile_ns(50.0).map(|v| v as u64),
            lat_p99_ns: app.percentile_ns(99.0).map(|v| v as u64),
            stages: probes.stages,
            cpus: probes.cpus,
            probe_run_ns: probes.probe_run_ns,
            msr_writes: probes.msr_writes,
            oldest_in_flight_ns: None,
            hypervisor: probes.hypervisor,
        };
        let point = SeriesPoint {
            interval,
            start_ns,
            end_ns,
            // Empty: a merged point's percentiles are left out rather than guessed.
            lat: virtgap_workloads::LatencyHistogram::new().compact(),
        };
        self.place(raw, point);
    }

    /// A probe collector interval, in arrival order.
    pub fn add_probe(&mut self, snapshot: &ProbeSnapshot) {
        let ordinal = self.probes_seen;
        self.probes_seen += 1;
        let Some(index) = ordinal.checked_sub(self.probe_skip) else {
            return;
        };
        self.waiting_probes.push_back((
            index,
            ProbeInterval::of(snapshot, self.devs.as_deref(), self.hypervisor),
        ));
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

    /// Every worker finished: the workload intervals are all in, and probe intervals after
    /// them are folded into the last point.
    pub fn workload_ended(&mut self) {
        self.workload_ended = true;
        self.join_waiting();
    }

    /// The run is over: what still waits for a probe interval is kept without one.
    pub fn finish(&mut self) {
        self.probes_expected = false;
        self.workload_ended = true;
        self.join_waiting();
    }

    /// Drops the points so far (the TUI's reset); what comes next starts a new series.
    pub fn clear(&mut self) {
        self.settled = Spool::new();
        self.tail = None;
        self.span = 1;
        self.origin = None;
        self.stall_log = self.stall_log.cleared();
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
        if self.workload_ended {
            while let Some((_, probe)) = self.waiting_probes.pop_front() {
                self.fold_trailing(&probe);
            }
        }
    }

    /// A probe interval after the workload's last interval: the requests it saw complete are
    /// the workload's last ones (the probes' intervals end a little after the workload's), so
    /// their stage counts and times join the last point, and the points' stages add up to the
    /// run's. The host-wide figures of the time after the workload are no point's.
    fn fold_trailing(&mut self, probe: &ProbeInterval) {
        let Some(last) = self.tail.as_mut() else {
            return;
        };
        for (stage, sample) in &probe.stages {
            let into = last.interval.stages.entry(stage.clone()).or_default();
            into.count += sample.count;
            into.sum_ns += sample.sum_ns;
        }
    }

    fn push(&mut self, sample: &IntervalSample, probe: Option<ProbeInterval>) {
        let origin = *self.origin.get_or_insert(sample.index);
        let raw = sample.index.saturating_sub(origin);
        let point = SeriesPoint {
            interval: crate::run::assemble::interval(sample, probe),
            start_ns: sample.start_ns,
            end_ns: sample.end_ns,
            lat: sample.lat.compact(),
        };
        self.place(raw, point);
    }

    /// Puts `point`, the `raw`-th interval since the series began, where it belongs.
    fn place(&mut self, raw: u64, mut point: SeriesPoint) {
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
        match &mut self.tail {
            Some(last) if last.interval.index == slot => last.absorb(point),
            _ => {
                if let Some(done) = self.tail.replace(point) {
                    self.settled.push(done);
                    if self.settled.len().is_multiple_of(TRIM_EVERY_POINTS) {
                        release_free_heap();
                    }
                }
            }
        }
    }

    /// Halves the resolution: points 2k and 2k+1 become point k.
    fn coarsen(&mut self) {
        self.span *= 2;
        let old = std::mem::replace(&mut self.settled, Spool::new());
        let mut merged: Option<SeriesPoint> = None;
        let mut add = |mut p: SeriesPoint, settled: &mut Spool| {
            p.interval.index /= 2;
            match &mut merged {
                Some(last) if last.interval.index == p.interval.index => last.absorb(p),
                _ => {
                    if let Some(done) = merged.replace(p) {
                        settled.push(done);
                    }
                }
            }
        };
        let settled = &mut self.settled;
        if let Err(e) = old.read(|p| add(p, settled)) {
            settled.lost = Some(e.to_string());
        }
        if let Some(p) = self.tail.take() {
            add(p, settled);
        }
        self.tail = merged;
        release_free_heap();
    }
}

/// The block requests of operation `op` the probes saw in `snap` (0 without the block probe).
pub fn block_requests(snap: &ProbeSnapshot, op: BlockOp, devs: Option<&[DevNum]>) -> u64 {
    snap.block
        .as_ref()
        .map_or(0, |b| b.stage(devs, BlockStage::Device, &[op]).count)
}

/// Points settled between two heap trims (about a minute at the default interval).
const TRIM_EVERY_POINTS: usize = 64;

/// Hands the allocator's free pages back to the kernel. Merging points expands their latency
/// histograms to full size for a moment, and each interval's snapshots, joins and JSON are
/// short-lived blocks of many sizes; glibc keeps such freed blocks in its heap (measured in an
/// hour's soak: 24 MB of one thread's arena held for 6 MB in use), so without a trim after each
/// coarsening and every few dozen points the recorder's resident memory creeps up all run.
fn release_free_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free memory to the kernel; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Settled points, one JSON line each in an unlinked temporary file (`$TMPDIR`, gone with the
/// process however it ends): a point of a many-CPU host is tens of KB, and a day-long run
/// would otherwise hold its whole series in memory. Points are read back only to coarsen and
/// when the profile is assembled. Without a temporary file, or after a write to it failed (a
/// full disk), points are held in memory instead and the run goes on.
#[derive(Debug)]
struct Spool {
    file: Option<File>,
    /// Bytes of complete lines in the file; what follows (a failed write's part) is ignored.
    bytes: u64,
    on_disk: usize,
    in_memory: Vec<SeriesPoint>,
    problem: Option<String>,
    /// Points could not be read back while coarsening: the series has lost them.
    lost: Option<String>,
}

impl Spool {
    fn new() -> Self {
        let (file, problem) = match tempfile::tempfile() {
            Ok(f) => (Some(f), None),
            Err(e) => (
                None,
                Some(format!(
                    "no temporary file in {} ({e})",
                    std::env::temp_dir().display()
                )),
            ),
        };
        Self {
            file,
            bytes: 0,
            on_disk: 0,
            in_memory: Vec::new(),
            problem,
            lost: None,
        }
    }

    fn len(&self) -> usize {
        self.on_disk + self.in_memory.len()
    }

    fn push(&mut self, point: SeriesPoint) {
        if let (Some(file), true) = (&self.file, self.in_memory.is_empty()) {
            let mut line = serde_json::to_vec(&point).expect("a series point serializes");
            line.push(b'\n');
            match file.write_all_at(&line, self.bytes) {
                Ok(()) => {
                    self.bytes += line.len() as u64;
                    self.on_disk += 1;
                    return;
                }
                Err(e) => self.problem = Some(format!("writing its temporary file failed ({e})")),
            }
        }
        self.in_memory.push(point);
    }

    /// Calls `each` with every point, in order.
    fn read(&self, mut each: impl FnMut(SeriesPoint)) -> io::Result<()> {
        if let Some(lost) = &self.lost {
            return Err(io::Error::other(format!(
                "the interval series could not be read back: {lost}"
            )));
        }
        if let Some(file) = &self.file {
            let lines = BufReader::with_capacity(
                1 << 16,
                FileAt {
                    file,
                    pos: 0,
                    end: self.bytes,
                },
            );
            let mut n = 0;
            for point in serde_json::Deserializer::from_reader(lines).into_iter() {
                each(point.map_err(io::Error::other)?);
                n += 1;
            }
            if n != self.on_disk {
                return Err(io::Error::other(format!(
                    "the interval series' temporary file holds {n} of its {} points",
                    self.on_disk
                )));
            }
        }
        for p in &self.in_memory {
            each(p.clone());
        }
        Ok(())
    }
}

/// Reads `file` from `pos` to `end` by offset, leaving its file position alone.
struct FileAt<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

impl Read for FileAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf.len().min(self.end.saturating_sub(self.pos) as usize);
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
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
                missed: 0,
            }],
            // Measured with the run statistics on throughout.
            elapsed_ns: SEC,
            stats_on_ns: SEC,
            ..Default::default()
        }
    }

    /// The workload's last requests complete in a probe interval after its last interval:
    /// once every worker finished, their stage counts join the last point, so the points add
    /// up to the run's; that interval's other figures are no point's.
    #[test]
    fn requests_seen_after_the_workloads_last_interval_count_in_its_last_point() {
        use virtgap_probes::model::{BlockOp, BlockSnapshot, BlockStage, BlockStageHist};
        let with_requests = |ordinal, n| {
            let mut hist = virtgap_probes::KernelHist::default();
            for _ in 0..n {
                hist.record(50_000);
            }
            ProbeSnapshot {
                block: Some(BlockSnapshot {
                    stages: vec![BlockStageHist {
                        dev: (254, 0),
                        hctx: 0,
                        op: BlockOp::Read,
                        stage: BlockStage::Device,
                        hist,
                    }],
                    ..Default::default()
                }),
                ..probe(ordinal)
            }
        };
        let mut s = IntervalSeries::new(Duration::from_secs(1), 0, None, true, Hypervisor::None);
        s.add_sample(sample(0, 10));
        s.add_sample(sample(1, 10));
        s.add_probe(&with_requests(0, 10));
        s.add_probe(&with_requests(1, 10));
        // Before the workload ended, a probe interval ahead of the samples waits for its own.
        s.add_probe(&with_requests(2, 3));
        let device = |s: &IntervalSeries| -> Vec<u64> {
            s.points()
                .unwrap()
                .iter()
                .map(|p| {
                    p.interval
                        .stage(crate::model::stages::Stage::Device)
                        .map_or(0, |d| d.count)
                })
                .collect()
        };
        assert_eq!(device(&s), [10, 10]);
        s.workload_ended();
        assert_eq!(device(&s), [10, 13]);
        // Later intervals (the live view stays up) fold in too; no point is added.
        s.add_probe(&with_requests(3, 0));
        s.finish();
        assert_eq!(device(&s), [10, 13]);
        assert_eq!(s.points().unwrap()[1].interval.probe_run_ns, Some(1001));
    }

    #[test]
    fn probe_intervals_join_the_workload_interval_of_the_same_second_after_the_ramp() {
        let mut s = IntervalSeries::new(Duration::from_secs(1), 2, None, true, Hypervisor::None);
        // Probes run ahead of the workload's first measured interval by the ramp.
        for p in 0..4 {
            s.add_probe(&probe(p));
        }
        s.add_sample(sample(0, 10));
        s.add_sample(sample(1, 10));
        // Interval 2's probe interval has not come yet: it waits.
        s.add_sample(sample(2, 10));
        assert_eq!(s.points().unwrap().len(), 2);
        s.add_probe(&probe(4));
        let runs: Vec<_> = s
            .points()
            .unwrap()
            .iter()
            .map(|p| p.interval.probe_run_ns)
            .collect();
        assert_eq!(runs, [Some(1002), Some(1003), Some(1004)]);
        // Once the run is over nothing waits any more.
        s.add_sample(sample(3, 10));
        s.finish();
        assert_eq!(s.points().unwrap()[3].interval.probe_run_ns, None);
    }

    #[test]
    fn without_probe_intervals_the_workload_does_not_wait_for_ever() {
        let mut s = IntervalSeries::new(Duration::from_secs(1), 0, None, true, Hypervisor::None);
        for i in 0..20 {
            s.add_sample(sample(i, 1));
        }
        assert!(
            s.points().unwrap().len() >= 20 - MAX_WAITING,
            "{}",
            s.points().unwrap().len()
        );
    }

    #[test]
    fn a_long_run_keeps_a_bounded_series_with_exact_sums() {
        let mut s = IntervalSeries::new(Duration::from_secs(1), 0, None, false, Hypervisor::None);
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
        let points = s.points().unwrap();
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
        // Only the last point is held in memory; the rest wait in the spool's file.
        assert_eq!(s.settled.on_disk, points.len() - 1);
        assert!(s.settled.in_memory.is_empty());
    }

    #[test]
    fn intervals_of_a_host_with_many_cpus_keep_the_series_within_its_byte_budget() {
        let mut s = IntervalSeries::new(Duration::from_secs(1), 0, None, true, Hypervisor::None);
        let mut snap = probe(0);
        snap.cpu_times = (0..192)
            .map(|cpu| virtgap_probes::procfs::CpuTimes {
                cpu,
                ..Default::default()
            })
            .collect();
        // About 500 such points fit the budget: twice that makes the series coarsen at least
        // once, which is what must keep it within the budget.
        for i in 0..1200 {
            s.add_probe(&snap);
            s.add_sample(sample(i, 1));
        }
        assert!(s.coarsening() > 1, "the series never had to coarsen");
        s.finish();
        let intervals: Vec<_> = s
            .points()
            .unwrap()
            .into_iter()
            .map(|p| p.interval)
            .collect();
        let json = serde_json::to_vec_pretty(&intervals).unwrap().len();
        assert!(json <= SERIES_JSON_BUDGET, "{json} bytes");
        assert!(intervals.len() >= MIN_POINTS / 2, "{}", intervals.len());
        assert_eq!(intervals[0].cpus.len(), 192);
    }

    #[test]
    fn points_stay_in_memory_when_their_file_cannot_be_written() {
        let mut s = IntervalSeries::new(Duration::from_secs(1), 0, None, false, Hypervisor::None);
        let path = tempfile::NamedTempFile::new().unwrap();
        // Opened read-only: every write fails as a full disk's would.
        s.settled.file = Some(File::open(path.path()).unwrap());
        let n = 100;
        for i in 0..n {
            s.add_sample(sample(i, 2));
        }
        s.finish();
        assert!(s.spool_problem().unwrap().contains("failed"));
        assert_eq!(s.settled.in_memory.len(), n as usize - 1);
        let points = s.points().unwrap();
        assert_eq!(points.len(), n as usize);
        assert_eq!(
            points.iter().map(|p| p.interval.read_ios).sum::<u64>(),
            2 * n
        );
    }

    #[test]
    fn a_point_read_back_is_the_point_written() {
        let mut s = IntervalSeries::new(Duration::from_secs(1), 0, None, false, Hypervisor::None);
        for i in 0..3 {
            s.add_sample(sample(i, 5 + i));
        }
        let points = s.points().unwrap();
        assert!(s.settled.on_disk == 2 && s.settled.in_memory.is_empty());
        let again: Vec<_> = (0..3)
            .map(|i| {
                let x = sample(i, 5 + i);
                (x.read_ios, x.lat.compact())
            })
            .collect();
        for (p, (ios, lat)) in points.iter().zip(again) {
            assert_eq!((p.interval.read_ios, &p.lat), (ios, &lat));
        }
        assert_eq!(points[1].interval, s.points().unwrap()[1].interval);
    }

    /// A long attached run keeps a bounded series, contiguous, each point `span` probe
    /// intervals long, with every probe interval's time and requests in it.
    #[test]
    fn a_long_probe_only_series_stays_bounded_and_contiguous() {
        use virtgap_probes::model::{BlockSnapshot, BlockStageHist};
        let mut s = IntervalSeries::probe_only(Duration::from_secs(1), Hypervisor::None, None);
        let n = 5_000u64;
        let mut hist = virtgap_probes::KernelHist::default();
        hist.slots[10] = 1;
        hist.count = 1;
        hist.sum_ns = 1000;
        let one = BlockStageHist {
            dev: (254, 0),
            hctx: 0,
            op: BlockOp::Read,
            stage: BlockStage::Device,
            hist,
        };
        let interval = ProbeSnapshot {
            elapsed_ns: SEC,
            block: Some(BlockSnapshot {
                stages: vec![one],
                ..Default::default()
            }),
            ..ProbeSnapshot::default()
        };
        for k in 1..=n {
            s.add_probe_only(k * SEC, &interval);
        }
        let kept: Vec<_> = s
            .points()
            .unwrap()
            .into_iter()
            .map(|p| p.interval)
            .collect();
        assert!(kept.len() <= MAX_POINTS, "{} kept", kept.len());
        assert_eq!(s.coarsening(), 4);
        assert_eq!(s.point_interval(), Duration::from_secs(4));
        assert_eq!(kept[0].start_s, 0.0);
        assert_eq!(kept.last().unwrap().end_s, n as f64);
        assert_eq!(kept.iter().map(|i| i.read_ios).sum::<u64>(), n);
        for (k, w) in kept.windows(2).enumerate() {
            assert_eq!(w[0].end_s, w[1].start_s, "gap after interval {k}");
            assert_eq!(w[1].index, k as u64 + 1);
        }
    }

    #[test]
    fn a_cleared_series_starts_again_from_the_next_interval() {
        let mut s = IntervalSeries::new(Duration::from_secs(1), 0, None, false, Hypervisor::None);
        for i in 0..5 {
            s.add_sample(sample(i, 2));
        }
        s.clear();
        s.add_sample(sample(5, 3));
        assert_eq!(s.points().unwrap().len(), 1);
        assert_eq!(s.points().unwrap()[0].interval.index, 0);
        assert_eq!(s.points().unwrap()[0].interval.read_ios, 3);
    }
}
