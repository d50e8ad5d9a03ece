//! A kv client thread's side of the run, whichever engine drives it (io_uring rings in `ring`,
//! ACT's synchronous service threads in `service`): its share of the schedule and keys, and the
//! tally of what its operations took.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::inflight::QueueTally;
use super::shared::Shared;
use super::store::{KvStore, OpDone};
use super::verdict::Behind;
use crate::offsets::OffsetGenerator;
use crate::run::RunOptions;
use crate::schedule::RateSchedule;
use crate::slow::{SlowIoKeeper, TailWatch};
use crate::spec::{Pattern, WorkloadSpec};
use crate::stats::{CpuTime, DirStats, IntervalSample, RunStats};
use crate::values::Distribution;

/// What a client thread needs to know of the run, whichever engine it drives.
pub(super) struct ClientContext {
    pub worker: u32,
    /// Client threads (service threads or rings) sharing the schedule.
    pub threads: u32,
    pub keys: u64,
    pub reads_per_s: u64,
    pub writes_per_s: u64,
    pub distribution: Distribution,
    pub seed: u64,
    pub interval_ns: u64,
    pub max_lag: Duration,
    /// Reads in flight per ring at most (the asynchronous engine only).
    pub qd: u32,
    /// Whether a ring keeps fewer in flight while they queue (`kv::inflight`).
    pub adaptive_qd: bool,
    pub store: Arc<KvStore>,
    pub shared: Arc<Shared>,
    pub stop: Arc<AtomicBool>,
    /// Keep the device reads near the tail for the tail autopsy.
    pub tail_watch: Option<Arc<TailWatch>>,
}

impl ClientContext {
    /// Client thread `worker`'s view of a run of `spec` on `store`, loaded with `keys` keys.
    pub fn new(
        worker: u32,
        spec: &WorkloadSpec,
        options: &RunOptions,
        store: &Arc<KvStore>,
        keys: u64,
        shared: &Arc<Shared>,
        stop: &Arc<AtomicBool>,
    ) -> Self {
        let kv = spec.kv.as_ref().expect("a kv spec");
        let (reads_per_s, writes_per_s) = kv.rates();
        Self {
            worker,
            threads: spec.workers,
            keys,
            reads_per_s,
            writes_per_s,
            distribution: spec.distribution,
            seed: options.seed,
            interval_ns: options.interval.as_nanos().max(1) as u64,
            max_lag: kv.max_lag.0,
            qd: spec.qd,
            adaptive_qd: kv.adaptive_qd,
            store: Arc::clone(store),
            shared: Arc::clone(shared),
            stop: Arc::clone(stop),
            tail_watch: options.tail_watch.clone(),
        }
    }

    /// This thread's operations: its share of the schedule, its keys, and which are writes
    /// (spread evenly among reads, Bresenham on the op count, each thread at its own phase so
    /// the mix holds over any short window).
    pub fn operations(&self) -> ClientOps {
        let total = self.reads_per_s + self.writes_per_s;
        ClientOps {
            schedule: RateSchedule::new(total as f64 / f64::from(self.threads)),
            keys: OffsetGenerator::new(
                Pattern::Random,
                self.distribution,
                self.keys,
                1,
                self.worker,
                self.threads,
                self.seed ^ (u64::from(self.worker) << 32),
            ),
            op: u64::from(self.worker) * total / u64::from(self.threads).max(1),
            writes: self.writes_per_s,
            total,
        }
    }

    /// When the measured window ends, in the run's clock.
    pub fn end_ns(&self) -> u64 {
        self.shared.end_ns
    }

    /// Whether the run should end now.
    pub fn over(&self, now: u64) -> bool {
        now >= self.shared.end_ns
            || self.shared.halt.load(Ordering::Relaxed)
            || self.stop.load(Ordering::Relaxed)
    }

    /// Stops the run when the schedule slipped past `--max-lag`, naming who was behind.
    /// Returns whether it did.
    pub fn fell_behind(&self, lag: Duration) -> bool {
        if lag <= self.max_lag {
            return false;
        }
        let (w, d) = self.store.backlog();
        let who = if w >= Duration::from_secs(1) {
            Behind::Device("large-block writes")
        } else if d >= Duration::from_secs(1) || self.store.free_blocks() <= 2 {
            Behind::Device("large-block reads (defrag)")
        } else {
            Behind::Generator
        };
        self.shared.fall_behind(who, lag);
        true
    }
}

/// One client thread's stream of operations.
pub(super) struct ClientOps {
    schedule: RateSchedule,
    keys: OffsetGenerator,
    op: u64,
    writes: u64,
    total: u64,
}

/// An operation taken from the schedule.
pub(super) struct ClientOp {
    pub due: u64,
    pub write: bool,
    pub key: u64,
}

impl ClientOps {
    /// When the next operation is due.
    pub fn next_due_ns(&self) -> u64 {
        self.schedule.next_due_ns()
    }

    /// How far behind its schedule the next operation is at `now`.
    pub fn lag(&self, now: u64) -> Duration {
        Duration::from_nanos(self.schedule.lag_ns(now))
    }

    /// Takes the next operation, due at or before `now`.
    pub fn take(&mut self, now: u64) -> ClientOp {
        let due = self.schedule.take_due(now).expect("an operation is due");
        let (op, w, t) = (self.op, self.writes, self.total.max(1));
        self.op += 1;
        ClientOp {
            due,
            write: (op + 1) * w / t > op * w / t,
            key: self.keys.next_offset(),
        }
    }
}

/// When a client operation was due, started and done, in the run's clock.
#[derive(Clone, Copy, Debug)]
pub(super) struct OpTimes {
    pub due: u64,
    pub started: u64,
    pub now: u64,
}

/// One client thread's measurements: its device reads (reported as a worker's I/O and in
/// ACT's histograms) and all of its client operations.
pub(super) struct ClientTally<'a> {
    worker: u32,
    sh: &'a Shared,
    interval_ns: u64,
    stats: RunStats,
    client_read: DirStats,
    client_write: DirStats,
    interval: IntervalSample,
    cpu_start: CpuTime,
    measuring: bool,
    last_ns: u64,
    slow: Option<SlowIoKeeper>,
}

impl<'a> ClientTally<'a> {
    pub fn new(ctx: &'a ClientContext) -> Self {
        Self {
            worker: ctx.worker,
            sh: &ctx.shared,
            interval_ns: ctx.interval_ns,
            stats: RunStats::default(),
            client_read: DirStats::default(),
            client_write: DirStats::default(),
            interval: IntervalSample::empty(ctx.worker, 0, 0),
            cpu_start: CpuTime::of_this_thread(),
            measuring: ctx.shared.ramp_ns == 0,
            last_ns: 0,
            slow: ctx
                .tail_watch
                .as_ref()
                .map(|w| SlowIoKeeper::new(Arc::clone(w), ctx.worker, ctx.shared.t0_monotonic_ns)),
        }
    }

    /// Starts measuring (and the thread's CPU clock) once the ramp is over.
    pub fn at(&mut self, now: u64) {
        self.last_ns = self.last_ns.max(now);
        if !self.measuring && now >= self.sh.ramp_ns {
            self.measuring = true;
            self.cpu_start = CpuTime::of_this_thread();
        }
    }

    /// An operation issued `lag_ns` after it was due.
    pub fn issued_late_by(&mut self, lag_ns: u64) {
        self.stats.max_lag_ns = self.stats.max_lag_ns.max(lag_ns);
        if self.measuring {
            self.sh.slice_lag_ns.fetch_max(lag_ns, Ordering::Relaxed);
        }
    }

    /// One client operation, with the device read's service time when it went to the device.
    pub fn done(
        &mut self,
        write: bool,
        times: OpTimes,
        OpDone {
            service_ns,
            bytes,
            offset,
        }: OpDone,
        send_interval: &dyn Fn(IntervalSample),
    ) {
        let OpTimes { due, started, now } = times;
        let sh = self.sh;
        self.at(now);
        let in_window = self.measuring && due >= sh.ramp_ns && now <= sh.end_ns;
        // The device reads are the run's app I/Os (see below): those are the autopsy's.
        if let (Some(keeper), Some(offset), Some(_)) = (self.slow.as_mut(), offset, service_ns) {
            keeper.observe(offset, bytes as u32, false, started, now, in_window);
        }
        if !in_window {
            return;
        }
        let lat = now - started;
        let client = if write {
            &mut self.client_write
        } else {
            &mut self.client_read
        };
        client.ios += 1;
        client.bytes += bytes;
        client.lat.record(lat);
        client.lat_intended.record(now - due);
        // Only reads that went to the device are device I/O (writes are appends to memory,
        // and a read of a record still in the write cache is a copy).
        if let Some(service) = service_ns {
            client.slat.record(lat.saturating_sub(service));
            client.clat.record(service);
            let d = &mut self.stats.read;
            d.ios += 1;
            d.bytes += bytes;
            d.slat.record(lat.saturating_sub(service));
            d.clat.record(service);
            d.lat.record(lat);
            d.lat_intended.record(now - due);
            self.interval.read_ios += 1;
            self.interval.read_bytes += bytes;
            self.interval.lat.record(lat);
            // ACT's "reads" histogram: the device read's service time.
            sh.reads.record_ns(service);
            sh.reads_intended.record_ns(now - due);
        }
        let window_now = now - sh.ramp_ns;
        while window_now >= self.interval.start_ns + self.interval_ns {
            let next_start = self.interval.start_ns + self.interval_ns;
            self.interval.end_ns = next_start;
            let next = IntervalSample::empty(self.worker, self.interval.index + 1, next_start);
            send_interval(std::mem::replace(&mut self.interval, next));
        }
    }

    /// The thread's results, its last interval sent.
    pub fn finish(
        mut self,
        engine: &str,
        queue: Option<QueueTally>,
        send_interval: &dyn Fn(IntervalSample),
    ) -> ServiceResult {
        let sh = self.sh;
        let end = self.last_ns.min(sh.end_ns);
        self.stats.cpu = CpuTime::of_this_thread().since(self.cpu_start);
        self.stats.measured_ns = end.saturating_sub(sh.ramp_ns);
        self.stats.engine_features = engine.into();
        self.stats.slow_ios = self.slow.take().map(|k| k.kept).unwrap_or_default();
        if self.measuring && end > sh.ramp_ns + self.interval.start_ns {
            self.interval.end_ns = end - sh.ramp_ns;
            send_interval(self.interval);
        }
        ServiceResult {
            device: self.stats,
            client_read: self.client_read,
            client_write: self.client_write,
            queue,
        }
    }
}

/// What one client thread measured: its device reads (reported as a worker) and all of its
/// client operations (for the kv outcome).
pub(super) struct ServiceResult {
    pub device: RunStats,
    pub client_read: DirStats,
    pub client_write: DirStats,
    /// How the ring's reads queued, and its limit on them (rings only).
    pub queue: Option<QueueTally>,
}
