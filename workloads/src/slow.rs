//! The application side of the tail autopsy: each worker keeps the I/Os at or above a
//! threshold near its running p99, stamped in CLOCK_MONOTONIC (the clock BPF's
//! `bpf_ktime_get_ns` reads), so they can be joined to the kernel's slow requests.
//!
//! The threshold sits well below the p99 (half of it) so the I/Os above the run's final p99 are
//! all kept even while the running estimate wanders (it starts high on a host still warming
//! up); what is kept is a few percent of the I/Os where the tail is long, about one in ten where
//! it is tight (rand4k on the virtio disk: half its p99 is its p88), so memory stays bounded by
//! the run's length.
//! The kernel's threshold is the lowest worker's (half its p99): an I/O above the p99 whose
//! request took less than that spent most of its time outside the block layer, which the
//! autopsy can say without the request's record. A lower one would cost every request the
//! kernel sends (a ring buffer record, a cache line): at 0.4 of the p99 a tight distribution's
//! middle was sent, up to half of all requests on the virtio disk.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::histogram::LatencyHistogram;

/// One application I/O kept for the tail autopsy. Times are CLOCK_MONOTONIC nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowIo {
    /// Byte offset in the target.
    pub offset: u64,
    pub len: u32,
    pub write: bool,
    /// When the I/O was created (its latency counts from here, as fio's `lat` does).
    pub start_ns: u64,
    /// When its completion was reaped.
    pub end_ns: u64,
}

impl SlowIo {
    pub fn latency_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// I/Os kept while a worker's threshold is unknown (every one of them, until this many).
const WARM_UP_IOS: u64 = 256;
/// How often (in completions) a worker recomputes its threshold.
const UPDATE_EVERY: u64 = 256;
/// A worker keeps I/Os at or above this fraction of its running p99.
const KEEP_FRACTION: f64 = 0.5;

/// The thresholds the workers keep their slow I/Os at, shared with the probes' collector: it
/// copies `request_ns` into the block probe every interval.
#[derive(Debug)]
pub struct TailWatch {
    worker_ns: Vec<AtomicU64>,
    request_ns: Arc<AtomicU64>,
    /// Slow I/Os the workers handed over as they ran, for a live view (None: each worker keeps
    /// its own to the end of the run).
    handed: Option<Mutex<Vec<SlowIo>>>,
}

impl TailWatch {
    /// For `workers` workers; `request_ns` is the kernel's threshold (0 until known: every
    /// request is sent while the workers warm up).
    pub fn new(workers: u32, request_ns: Arc<AtomicU64>) -> Arc<Self> {
        Self::build(workers, request_ns, None)
    }

    /// As [`TailWatch::new`], for a live view: the workers hand their slow I/Os over every
    /// [`UPDATE_EVERY`] completions (see [`TailWatch::take_handed`]), keeping only those since.
    pub fn handing_over(workers: u32, request_ns: Arc<AtomicU64>) -> Arc<Self> {
        Self::build(workers, request_ns, Some(Mutex::new(Vec::new())))
    }

    fn build(
        workers: u32,
        request_ns: Arc<AtomicU64>,
        handed: Option<Mutex<Vec<SlowIo>>>,
    ) -> Arc<Self> {
        request_ns.store(0, Ordering::Relaxed);
        Arc::new(Self {
            worker_ns: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            request_ns,
            handed,
        })
    }

    /// The slow I/Os handed over since the last call (none unless made by `handing_over`).
    pub fn take_handed(&self) -> Vec<SlowIo> {
        self.handed.as_ref().map_or_else(Vec::new, |h| {
            std::mem::take(&mut *h.lock().unwrap_or_else(|e| e.into_inner()))
        })
    }

    fn hand_over(&self, kept: &mut Vec<SlowIo>) {
        if let Some(h) = &self.handed {
            h.lock().unwrap_or_else(|e| e.into_inner()).append(kept);
        }
    }

    /// A worker's new threshold. Workers beyond those the watch was made for (a kv store's
    /// background threads) keep theirs without moving the kernel's; a worker still warming up
    /// (0) does not hold it at 0 once another has published.
    fn publish(&self, worker: u32, keep_ns: u64) {
        let Some(w) = self.worker_ns.get(worker as usize) else {
            return;
        };
        w.store(keep_ns, Ordering::Relaxed);
        let lowest = self
            .worker_ns
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .filter(|&ns| ns > 0)
            .min()
            .unwrap_or(0);
        self.request_ns.store(lowest, Ordering::Relaxed);
    }
}

/// One worker's side: its running latency histogram, threshold and kept I/Os.
#[derive(Debug)]
pub(crate) struct SlowIoKeeper {
    watch: Arc<TailWatch>,
    worker: u32,
    seen: LatencyHistogram,
    keep_ns: u64,
    /// CLOCK_MONOTONIC at the worker's own time origin.
    origin_ns: u64,
    pub kept: Vec<SlowIo>,
}

impl SlowIoKeeper {
    /// `origin_ns`: CLOCK_MONOTONIC when the worker's relative clock read 0.
    pub fn new(watch: Arc<TailWatch>, worker: u32, origin_ns: u64) -> Self {
        Self {
            watch,
            worker,
            seen: LatencyHistogram::new(),
            keep_ns: 0,
            origin_ns,
            kept: Vec::new(),
        }
    }

    /// Sees one completed I/O (times on the worker's relative clock); keeps it when it is in
    /// the measured window and at or above the threshold.
    pub fn observe(
        &mut self,
        offset: u64,
        len: u32,
        write: bool,
        start: u64,
        end: u64,
        measured: bool,
    ) {
        let latency = end.saturating_sub(start);
        self.seen.record(latency);
        let n = self.seen.count();
        if n >= WARM_UP_IOS && n.is_multiple_of(UPDATE_EVERY) {
            if let Some(p99) = self.seen.percentile_ns(99.0) {
                self.keep_ns = (p99 as f64 * KEEP_FRACTION) as u64;
                self.watch.publish(self.worker, self.keep_ns);
            }
        }
        if measured && latency >= self.keep_ns {
            self.kept.push(SlowIo {
                offset,
                len,
                write,
                start_ns: self.origin_ns + start,
                end_ns: self.origin_ns + end,
            });
        }
        if n.is_multiple_of(UPDATE_EVERY) && !self.kept.is_empty() {
            self.watch.hand_over(&mut self.kept);
        }
    }
}

/// CLOCK_MONOTONIC now, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_keeps_everything_until_warm_then_only_what_is_near_its_tail() {
        let request = Arc::new(AtomicU64::new(7));
        let watch = TailWatch::new(2, Arc::clone(&request));
        assert_eq!(
            request.load(Ordering::Relaxed),
            0,
            "every request until known"
        );
        let mut keeper = SlowIoKeeper::new(Arc::clone(&watch), 0, 1_000);
        // 100 µs I/Os with one 5 ms I/O in every 100.
        for i in 0..10_000u64 {
            let lat = if i % 100 == 99 { 5_000_000 } else { 100_000 };
            keeper.observe(i * 4096, 4096, false, i * 10, i * 10 + lat, true);
        }
        let warm = keeper
            .kept
            .iter()
            .filter(|s| s.offset < WARM_UP_IOS * 4096)
            .count();
        assert_eq!(warm as u64, WARM_UP_IOS, "all kept while warming up");
        let later: Vec<_> = keeper
            .kept
            .iter()
            .filter(|s| s.offset >= 1024 * 4096)
            .collect();
        assert!(
            later.iter().all(|s| s.latency_ns() >= 80_000),
            "below the threshold after warm-up"
        );
        let slow = later.iter().filter(|s| s.latency_ns() == 5_000_000).count();
        assert_eq!(slow, (1024..10_000).filter(|i| i % 100 == 99).count());
        assert_eq!(keeper.kept[0].start_ns, 1_000, "stamped on CLOCK_MONOTONIC");
        // The other worker has not published: the kernel's threshold follows the one that has.
        assert_eq!(request.load(Ordering::Relaxed), keeper.keep_ns);
        let mut other = SlowIoKeeper::new(Arc::clone(&watch), 1, 0);
        for i in 0..512u64 {
            other.observe(0, 4096, false, 0, 200_000 + i, false);
        }
        assert!(other.kept.is_empty(), "nothing outside the measured window");
        let lowest = keeper.keep_ns.min(other.keep_ns);
        assert_eq!(request.load(Ordering::Relaxed), lowest);
    }

    #[test]
    fn a_live_watch_takes_the_slow_ios_as_the_workers_go_and_the_rest_stay_for_the_end() {
        let watch = TailWatch::handing_over(1, Arc::new(AtomicU64::new(0)));
        let mut keeper = SlowIoKeeper::new(Arc::clone(&watch), 0, 0);
        // Every I/O is kept while warming up: 300 of them, 256 handed over at the 256th.
        for i in 0..300u64 {
            keeper.observe(i * 4096, 4096, false, i, i + 100_000, true);
        }
        let handed = watch.take_handed();
        assert_eq!(handed.len(), 256);
        assert_eq!(handed[0].offset, 0);
        assert_eq!(
            keeper.kept.len(),
            44,
            "the rest wait for the next hand-over or the end"
        );
        assert!(watch.take_handed().is_empty(), "taken once");
        // A watch for a recording keeps nothing aside: each worker holds its own to the end.
        let record = TailWatch::new(1, Arc::new(AtomicU64::new(0)));
        let mut keeper = SlowIoKeeper::new(Arc::clone(&record), 0, 0);
        for i in 0..300u64 {
            keeper.observe(i * 4096, 4096, false, i, i + 100_000, true);
        }
        assert!(record.take_handed().is_empty());
        assert_eq!(keeper.kept.len(), 300);
    }
}
