//! What the kv threads share while a run goes on: the run's clock, ACT's cumulative histograms
//! (client reads, large-block reads and writes), the large-block stream's statistics, and who
//! fell behind.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::act_log::HistogramSnapshot;
use super::verdict::Behind;
use crate::act::AtomicActHistogram;
use crate::run::RunOptions;
use crate::slow::SlowIoKeeper;
use crate::spec::WorkloadSpec;
use crate::stats::{IntervalSample, RunStats};

/// The large-block streams (writer and defragmenter), reported as one more worker: its reads
/// are defrag reads and its writes large-block writes, so a kv profile's I/Os are the device
/// I/Os the store issued, the same set the block probes see.
#[derive(Default)]
struct LargeBlocks {
    stats: RunStats,
    interval: Option<IntervalSample>,
}

/// State shared by the kv threads: the run's clock, ACT's histograms, the large-block stream's
/// statistics and who fell behind.
pub(super) struct Shared {
    t0: Instant,
    /// CLOCK_MONOTONIC at `t0`, for the slow I/Os kept for the tail autopsy.
    pub t0_monotonic_ns: u64,
    pub ramp_ns: u64,
    pub end_ns: u64,
    lb_bytes: u64,
    /// The worker the large-block stream reports as: the one after the client threads.
    large_block_worker: u32,
    /// Set by the coordinator (end, lag) or a failing thread.
    pub halt: AtomicBool,
    /// Client reads that went to the device: their service time (ACT's "reads").
    pub reads: AtomicActHistogram,
    /// The same reads from their scheduled start.
    pub reads_intended: AtomicActHistogram,
    /// Worst lag of a client operation since the current slice began.
    pub slice_lag_ns: AtomicU64,
    lb_reads: AtomicActHistogram,
    lb_writes: AtomicActHistogram,
    large_blocks: Mutex<LargeBlocks>,
    behind: Mutex<Option<(Behind, Duration)>>,
    /// The defrag reader's and the writer's slow I/Os for the tail autopsy (when kept).
    large_block_slow: [Mutex<Option<SlowIoKeeper>>; 2],
}

impl Shared {
    /// The state of a run of `spec`, its clock starting now.
    pub fn new(spec: &WorkloadSpec, options: &RunOptions) -> Self {
        let threads = spec.workers;
        let ramp_ns = spec.ramp.0.as_nanos() as u64;
        let (t0, t0_monotonic_ns) = (Instant::now(), crate::slow::monotonic_ns());
        Self {
            t0,
            t0_monotonic_ns,
            ramp_ns,
            end_ns: ramp_ns + spec.duration.0.as_nanos() as u64,
            lb_bytes: spec.bs.0,
            large_block_worker: threads,
            halt: AtomicBool::new(false),
            reads: AtomicActHistogram::default(),
            reads_intended: AtomicActHistogram::default(),
            slice_lag_ns: AtomicU64::new(0),
            lb_reads: AtomicActHistogram::default(),
            lb_writes: AtomicActHistogram::default(),
            large_blocks: Mutex::new(LargeBlocks {
                stats: RunStats::default(),
                interval: Some(IntervalSample::empty(threads, 0, 0)),
            }),
            behind: Mutex::new(None),
            // The background threads keep theirs as workers after the client threads (the
            // kernel's threshold follows the client threads' tails only).
            large_block_slow: [threads, threads + 1].map(|worker| {
                Mutex::new(
                    options
                        .tail_watch
                        .as_ref()
                        .map(|w| SlowIoKeeper::new(Arc::clone(w), worker, t0_monotonic_ns)),
                )
            }),
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    pub fn fall_behind(&self, who: Behind, by: Duration) {
        let mut b = self.behind.lock().unwrap_or_else(|e| e.into_inner());
        b.get_or_insert((who, by));
        self.halt.store(true, Ordering::Relaxed);
    }

    /// Records one large-block I/O at `offset` that took `ns` and ended now, if inside the
    /// measured window.
    pub fn large_block(&self, write: bool, offset: u64, ns: u64) {
        let now = self.now_ns();
        // After a stop the writer still drains its queue: that is not the measured load.
        let halted = self.halt.load(Ordering::Relaxed);
        let in_window = !halted
            && (self.ramp_ns..self.end_ns).contains(&now.saturating_sub(ns))
            && now <= self.end_ns;
        let keeper = &self.large_block_slow[usize::from(write)];
        if let Some(k) = keeper.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            let len = self.lb_bytes as u32;
            k.observe(offset, len, write, now.saturating_sub(ns), now, in_window);
        }
        if !in_window {
            return;
        }
        if write {
            self.lb_writes.record_ns(ns);
        } else {
            self.lb_reads.record_ns(ns);
        }
        let mut lb = self.large_blocks.lock().unwrap_or_else(|e| e.into_inner());
        let d = if write {
            &mut lb.stats.write
        } else {
            &mut lb.stats.read
        };
        d.ios += 1;
        d.bytes += self.lb_bytes;
        d.clat.record(ns);
        d.lat.record(ns);
        if let Some(i) = lb.interval.as_mut() {
            if write {
                i.write_ios += 1;
                i.write_bytes += self.lb_bytes;
            } else {
                i.read_ios += 1;
                i.read_bytes += self.lb_bytes;
            }
            i.lat.record(ns);
        }
    }

    /// ACT's cumulative histograms now.
    pub fn histograms(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            reads: self.reads.snapshot(),
            reads_intended: self.reads_intended.snapshot(),
            lb_reads: self.lb_reads.snapshot(),
            lb_writes: self.lb_writes.snapshot(),
        }
    }

    /// Starts the large-block stream's interval `index` at `start_ns` into the measured window;
    /// returns the one it ends there.
    pub fn next_large_block_interval(&self, index: u64, start_ns: u64) -> Option<IntervalSample> {
        let mut lb = self.large_blocks.lock().unwrap_or_else(|e| e.into_inner());
        let next = IntervalSample::empty(self.large_block_worker, index, start_ns);
        lb.interval.replace(next).map(|mut done| {
            done.end_ns = start_ns;
            done
        })
    }

    /// Ends the large-block stream at `measured_ns` into the window: its last interval (when it
    /// has begun) and its statistics so far, with the slow I/Os its threads kept.
    pub fn finish_large_blocks(&self, measured_ns: u64) -> (Option<IntervalSample>, RunStats) {
        let (last, mut stats) = {
            let mut lb = self.large_blocks.lock().unwrap_or_else(|e| e.into_inner());
            let last = lb
                .interval
                .take()
                .filter(|last| measured_ns > last.start_ns);
            (last, std::mem::take(&mut lb.stats))
        };
        for keeper in &self.large_block_slow {
            if let Some(k) = keeper.lock().unwrap_or_else(|e| e.into_inner()).take() {
                stats.slow_ios.extend(k.kept);
            }
        }
        let last = last.map(|mut last| {
            last.end_ns = measured_ns;
            last
        });
        (last, stats)
    }

    /// Which stream fell behind, and by how much, if one did.
    pub fn behind(&self) -> Option<(Behind, Duration)> {
        self.behind
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}
