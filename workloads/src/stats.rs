//! What a run measured: per-direction latency histograms (fio's slat / clat / lat, and
//! lat_intended for paced runs), byte and I/O counts, CPU time, and per-interval samples.

use crate::histogram::LatencyHistogram;

// One direction's figures live in `dir_stats`, which a kv run's outcome holds too; this keeps
// their old path.
pub use crate::dir_stats::DirStats;

/// CPU used by a worker thread over the measured window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTime {
    pub user_ns: u64,
    pub system_ns: u64,
    pub context_switches: u64,
}

impl CpuTime {
    /// This thread's usage so far.
    pub fn of_this_thread() -> Self {
        Self::of(libc::RUSAGE_THREAD)
    }

    /// The whole process's usage so far (all threads).
    pub fn of_this_process() -> Self {
        Self::of(libc::RUSAGE_SELF)
    }

    pub fn total_ns(self) -> u64 {
        self.user_ns + self.system_ns
    }

    fn of(who: libc::c_int) -> Self {
        let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: ru points to writable memory of the right type.
        let rc = unsafe { libc::getrusage(who, ru.as_mut_ptr()) };
        if rc != 0 {
            return Self::default();
        }
        // SAFETY: getrusage succeeded; the struct was zeroed before anyway.
        let ru = unsafe { ru.assume_init() };
        let ns = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000_000 + tv.tv_usec as u64 * 1_000;
        Self {
            user_ns: ns(ru.ru_utime),
            system_ns: ns(ru.ru_stime),
            context_switches: (ru.ru_nvcsw + ru.ru_nivcsw) as u64,
        }
    }

    pub fn since(self, earlier: Self) -> Self {
        Self {
            user_ns: self.user_ns.saturating_sub(earlier.user_ns),
            system_ns: self.system_ns.saturating_sub(earlier.system_ns),
            context_switches: self
                .context_switches
                .saturating_sub(earlier.context_switches),
        }
    }

    pub fn add(&mut self, other: Self) {
        self.user_ns += other.user_ns;
        self.system_ns += other.system_ns;
        self.context_switches += other.context_switches;
    }
}

/// Everything one worker (or, merged, the whole run) measured.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    pub read: DirStats,
    pub write: DirStats,
    pub cpu: CpuTime,
    /// Length of the measured window actually run.
    pub measured_ns: u64,
    /// I/Os that were still in flight at the end (completed, not counted).
    pub drained_ios: u64,
    /// Worst lag behind the schedule seen in a paced run.
    pub max_lag_ns: u64,
    /// Engine features in use.
    pub engine_features: String,
    /// The kv workload's verdict and store figures (kv runs only).
    pub kv: Option<Box<crate::kv::KvOutcome>>,
    /// I/Os near the tail, kept for the tail autopsy when asked for (see [`crate::slow`]).
    pub slow_ios: Vec<crate::slow::SlowIo>,
}

impl RunStats {
    pub fn merge(&mut self, other: &Self) {
        self.read.merge(&other.read);
        self.write.merge(&other.write);
        self.cpu.add(other.cpu);
        self.measured_ns = self.measured_ns.max(other.measured_ns);
        self.drained_ios += other.drained_ios;
        self.max_lag_ns = self.max_lag_ns.max(other.max_lag_ns);
        if self.engine_features.is_empty() {
            self.engine_features.clone_from(&other.engine_features);
        }
        if self.kv.is_none() {
            self.kv.clone_from(&other.kv);
        }
        self.slow_ios.extend_from_slice(&other.slow_ios);
    }

    pub fn total_ios(&self) -> u64 {
        self.read.ios + self.write.ios
    }

    pub fn seconds(&self) -> f64 {
        self.measured_ns as f64 / 1e9
    }

    /// CPU time per completed I/O, in ns.
    pub fn cpu_ns_per_io(&self) -> Option<f64> {
        let ios = self.total_ios();
        (ios > 0).then(|| (self.cpu.user_ns + self.cpu.system_ns) as f64 / ios as f64)
    }
}

/// One worker's activity over one interval of the measured window.
#[derive(Clone, Debug)]
pub struct IntervalSample {
    pub worker: u32,
    /// 0 for the first interval of the measured window.
    pub index: u64,
    /// Offsets from the start of the measured window.
    pub start_ns: u64,
    pub end_ns: u64,
    pub read_ios: u64,
    pub write_ios: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Latency (`lat`) of the I/Os completed in the interval, both directions.
    pub lat: LatencyHistogram,
    /// Age at the interval's end of the oldest I/O still in flight (0: none was; None: the
    /// workload does not track it).
    pub oldest_in_flight_ns: Option<u64>,
}

impl IntervalSample {
    pub fn empty(worker: u32, index: u64, start_ns: u64) -> Self {
        Self {
            worker,
            index,
            start_ns,
            end_ns: start_ns,
            read_ios: 0,
            write_ios: 0,
            read_bytes: 0,
            write_bytes: 0,
            lat: LatencyHistogram::new(),
            oldest_in_flight_ns: None,
        }
    }

    pub fn ios(&self) -> u64 {
        self.read_ios + self.write_ios
    }

    pub fn iops(&self) -> f64 {
        let secs = (self.end_ns - self.start_ns) as f64 / 1e9;
        if secs > 0.0 {
            self.ios() as f64 / secs
        } else {
            0.0
        }
    }

    pub fn merge(&mut self, other: &Self) {
        self.start_ns = self.start_ns.min(other.start_ns);
        self.end_ns = self.end_ns.max(other.end_ns);
        self.read_ios += other.read_ios;
        self.write_ios += other.write_ios;
        self.read_bytes += other.read_bytes;
        self.write_bytes += other.write_bytes;
        self.lat.merge(&other.lat);
        self.oldest_in_flight_ns = match (self.oldest_in_flight_ns, other.oldest_in_flight_ns) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

/// Merges per-worker interval samples into whole-run intervals, releasing interval `i` once
/// every worker still running has reported it.
#[derive(Debug)]
pub struct IntervalMerger {
    workers: u32,
    finished: Vec<bool>,
    pending: std::collections::BTreeMap<u64, (IntervalSample, u32)>,
    reported: Vec<u64>,
}

impl IntervalMerger {
    /// The workers whose intervals it merges.
    pub fn workers(&self) -> u32 {
        self.workers
    }

    pub fn new(workers: u32) -> Self {
        Self {
            workers,
            finished: vec![false; workers as usize],
            pending: Default::default(),
            reported: vec![0; workers as usize],
        }
    }

    /// Adds one worker's sample; returns the whole-run intervals that are now complete.
    pub fn add(&mut self, sample: IntervalSample) -> Vec<IntervalSample> {
        let w = sample.worker as usize;
        self.reported[w] = self.reported[w].max(sample.index + 1);
        let mut merged = sample.clone();
        merged.worker = u32::MAX;
        self.pending
            .entry(sample.index)
            .and_modify(|(s, n)| {
                s.merge(&sample);
                *n += 1;
            })
            .or_insert((merged, 1));
        self.release()
    }

    /// Marks a worker done; intervals it will never report no longer wait for it.
    pub fn worker_finished(&mut self, worker: u32) -> Vec<IntervalSample> {
        self.finished[worker as usize] = true;
        self.release()
    }

    fn release(&mut self) -> Vec<IntervalSample> {
        let mut out = Vec::new();
        while let Some((&index, _)) = self.pending.iter().next() {
            let ready =
                (0..self.workers as usize).all(|w| self.finished[w] || self.reported[w] > index);
            if !ready {
                break;
            }
            let (sample, _) = self.pending.remove(&index).expect("present");
            out.push(sample);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(worker: u32, index: u64, ios: u64) -> IntervalSample {
        let mut s = IntervalSample::empty(worker, index, index * 1_000_000_000);
        s.end_ns = s.start_ns + 1_000_000_000;
        s.read_ios = ios;
        s
    }

    #[test]
    fn intervals_wait_for_every_worker() {
        let mut m = IntervalMerger::new(2);
        assert!(m.add(sample(0, 0, 10)).is_empty());
        assert!(m.add(sample(0, 1, 11)).is_empty());
        let out = m.add(sample(1, 0, 5));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].read_ios, 15);
        assert_eq!(out[0].iops(), 15.0);
        let out = m.worker_finished(1);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].index, 1);
        assert_eq!(out[0].read_ios, 11);
    }

    #[test]
    fn cpu_time_of_a_busy_thread_grows() {
        let before = CpuTime::of_this_thread();
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(30) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let used = CpuTime::of_this_thread().since(before);
        assert!(
            used.user_ns + used.system_ns >= 10_000_000,
            "{used:?} ({x})"
        );
    }
}
