//! Running a workload: one thread per worker, each with its own engine, offset generator and
//! statistics. Workers send interval samples and their final statistics as owned events over a
//! channel; nothing is shared between them but the stop flag.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::engine::{
    Completion, Engine, EngineConfig, EngineError, IoDir, IoRequest, NullEngine, PsyncEngine,
    UringEngine, Wait,
};
use crate::offsets::OffsetGenerator;
use crate::pattern;
use crate::schedule::RateSchedule;
use crate::slow::SlowIoKeeper;
use crate::spec::{EngineKind, ReadWrite, WorkloadSpec};
use crate::stats::{CpuTime, DirStats, IntervalSample, RunStats};
use crate::target::Target;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("worker {worker}: {error}")]
    Engine { worker: u32, error: EngineError },
    #[error("worker {worker}: {dir} of {len} B at offset {offset} failed: {error}")]
    Io {
        worker: u32,
        dir: &'static str,
        offset: u64,
        len: u32,
        error: std::io::Error,
    },
    #[error("worker {worker}: {dir} of {len} B at offset {offset} transferred only {got} B")]
    Short {
        worker: u32,
        dir: &'static str,
        offset: u64,
        len: u32,
        got: u32,
    },
    #[error("worker {worker}: read at offset {offset} returned wrong data: {detail}")]
    Verify {
        worker: u32,
        offset: u64,
        detail: String,
    },
    #[error("worker {worker} panicked")]
    Panicked { worker: u32 },
    #[error("kv service thread {worker}: {error}")]
    Kv {
        worker: u32,
        error: crate::kv::KvError,
    },
}

/// Messages from workers.
#[derive(Debug)]
pub enum WorkloadEvent {
    /// Every worker has set up its engine and the measured timeline has started.
    Started {
        engine_features: String,
    },
    Interval(IntervalSample),
    Finished {
        worker: u32,
        result: Result<Box<RunStats>, WorkloadError>,
    },
}

/// Knobs that are not part of the workload itself.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Length of an interval sample.
    pub interval: Duration,
    /// Check the header of every sector read (targets filled by virtgap only).
    pub verify_reads: bool,
    /// Tag stamped into written sectors.
    pub write_tag: u64,
    pub seed: u64,
    /// Keep the I/Os near the tail for the tail autopsy (see [`crate::slow`]).
    pub tail_watch: Option<Arc<crate::slow::TailWatch>>,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            verify_reads: false,
            write_tag: 2,
            seed: rand::random(),
            tail_watch: None,
        }
    }
}

/// A started run: the worker threads.
#[derive(Debug)]
pub struct RunHandle {
    threads: Vec<JoinHandle<()>>,
    workers: u32,
}

impl RunHandle {
    pub(crate) fn from_threads(threads: Vec<JoinHandle<()>>, workers: u32) -> Self {
        Self { threads, workers }
    }

    /// How many workers report: each sends interval samples and exactly one `Finished`.
    pub fn workers(&self) -> u32 {
        self.workers
    }

    /// Waits for every worker thread to exit.
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Starts `spec.workers` threads on `target`. Events arrive on `tx`; the run ends after
/// ramp + duration, or early when `stop` is set. Each worker sends exactly one `Finished`.
pub fn start<T>(
    spec: &WorkloadSpec,
    target: &Target,
    options: &RunOptions,
    stop: Arc<AtomicBool>,
    tx: Sender<T>,
) -> RunHandle
where
    T: From<WorkloadEvent> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(spec.workers as usize));
    let threads = (0..spec.workers)
        .map(|worker| {
            let ctx = WorkerContext {
                worker,
                spec: spec.clone(),
                options: options.clone(),
                file: Arc::clone(&target.file),
                target_size: target.size,
                align: target.align as usize,
                stop: Arc::clone(&stop),
                barrier: Arc::clone(&barrier),
            };
            let tx = tx.clone();
            std::thread::Builder::new()
                .name(format!("vg-worker-{worker}"))
                .spawn(move || {
                    let send = |ev: WorkloadEvent| {
                        let _ = tx.send(T::from(ev));
                    };
                    let result =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ctx.run(&send)))
                            .unwrap_or(Err(WorkloadError::Panicked { worker }))
                            .map(Box::new);
                    if result.is_err() {
                        ctx.stop.store(true, Ordering::Relaxed);
                    }
                    send(WorkloadEvent::Finished { worker, result });
                })
                .expect("spawning a worker thread")
        })
        .collect();
    RunHandle {
        threads,
        workers: spec.workers,
    }
}

struct WorkerContext {
    worker: u32,
    spec: WorkloadSpec,
    options: RunOptions,
    file: Arc<std::fs::File>,
    target_size: u64,
    align: usize,
    stop: Arc<AtomicBool>,
    barrier: Arc<Barrier>,
}

/// Bookkeeping for one in-flight slot.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    dir_write: bool,
    offset: u64,
    created_ns: u64,
    submitted_ns: u64,
    scheduled_ns: Option<u64>,
}

impl WorkerContext {
    fn run(&self, send: &dyn Fn(WorkloadEvent)) -> Result<RunStats, WorkloadError> {
        let qd = if self.spec.engine == EngineKind::Psync {
            1
        } else {
            self.spec.qd
        };
        let cfg = EngineConfig {
            file: Arc::clone(&self.file),
            slots: qd,
            buffer_len: self.spec.bs.0 as usize,
            buffer_align: self.align.max(4096),
        };
        // Engines are built on the thread that uses them (io_uring's single-issuer rule).
        let engine: Result<Box<dyn Engine>, EngineError> = match self.spec.engine {
            EngineKind::IoUring => UringEngine::new(&cfg).map(|e| Box::new(e) as Box<dyn Engine>),
            EngineKind::Psync => PsyncEngine::new(&cfg).map(|e| Box::new(e) as Box<dyn Engine>),
            EngineKind::Null => NullEngine::new(&cfg).map(|e| Box::new(e) as Box<dyn Engine>),
        };
        // Everyone meets at the barrier, so a failed setup cannot leave the others waiting.
        self.barrier.wait();
        let mut engine = engine.map_err(|error| WorkloadError::Engine {
            worker: self.worker,
            error,
        })?;
        if self.worker == 0 {
            send(WorkloadEvent::Started {
                engine_features: engine.features(),
            });
        }
        self.drive(engine.as_mut(), qd, send)
    }

    /// The I/O loop: issue what is due, reap, count what completed in the measured window.
    /// Generic over `dyn Engine`: one virtual call per batch step, not per byte.
    fn drive(
        &self,
        engine: &mut dyn Engine,
        qd: u32,
        send: &dyn Fn(WorkloadEvent),
    ) -> Result<RunStats, WorkloadError> {
        let worker = self.worker;
        let mut io = IoLoop::new(self, qd);
        let mut completions: Vec<Completion> = Vec::with_capacity(qd as usize);
        let mut now = io.clock.now_ns();
        loop {
            io.measure_from(now);
            if now >= io.clock.end_ns || self.stop.load(Ordering::Relaxed) || io.failure.is_some() {
                break;
            }
            io.issue_due(engine, now)?;

            // Reap: block for one completion, or until the next scheduled I/O or interval end.
            completions.clear();
            engine
                .reap(io.wait(), &mut completions)
                .map_err(|error| WorkloadError::Engine { worker, error })?;
            now = io.clock.now_ns();

            // Close every interval boundary crossed while waiting, before the completions are
            // counted: they land in the interval they completed in, and an I/O stuck through
            // whole intervals shows as in flight at each of their ends.
            io.close_intervals(now, send);
            for c in &completions {
                io.complete(engine, c, now);
            }
            if let Some(s) = io.schedule.as_ref() {
                io.stats.max_lag_ns = io.stats.max_lag_ns.max(s.lag_ns(now));
            }
        }
        io.finish(engine, now, completions, send)
    }
}

/// A worker's clock, in nanoseconds since it started: the ramp, then the measured window, cut
/// into intervals.
#[derive(Clone, Copy)]
struct Clock {
    t0: Instant,
    ramp_ns: u64,
    end_ns: u64,
    interval_ns: u64,
}

impl Clock {
    fn now_ns(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }
}

/// One worker's I/O loop: where its I/Os go and when, its slots in flight, and what it has
/// measured.
struct IoLoop<'a> {
    ctx: &'a WorkerContext,
    bs: u32,
    qd: u32,
    /// Queued I/Os handed to the kernel per submission.
    submit_batch: usize,
    offsets: OffsetGenerator,
    /// Open-loop pacing, when the spec sets a rate.
    schedule: Option<RateSchedule>,
    clock: Clock,
    slow: Option<SlowIoKeeper>,
    slots: Vec<Slot>,
    /// Slots with no I/O in flight.
    free: Vec<u32>,
    /// Slots queued since the last submission.
    batch: Vec<u32>,
    stats: RunStats,
    interval: IntervalSample,
    /// Past the ramp: completions count, and the CPU clock runs from `cpu_start`.
    measuring: bool,
    cpu_start: CpuTime,
    /// The first I/O that failed: the loop ends at its next turn.
    failure: Option<WorkloadError>,
}

impl<'a> IoLoop<'a> {
    fn new(ctx: &'a WorkerContext, qd: u32) -> Self {
        let spec = &ctx.spec;
        let worker = ctx.worker;
        let bs = spec.bs.0 as u32;
        let offsets = OffsetGenerator::new(
            spec.pattern,
            spec.distribution,
            ctx.target_size,
            u64::from(bs),
            worker,
            spec.workers,
            ctx.options.seed,
        );
        let schedule = spec
            .rate_iops
            .map(|total| RateSchedule::new(total as f64 / f64::from(spec.workers)));

        let t0 = Instant::now();
        let slow = ctx
            .options
            .tail_watch
            .as_ref()
            .map(|w| SlowIoKeeper::new(Arc::clone(w), worker, crate::slow::monotonic_ns()));
        let ramp_ns = spec.ramp.0.as_nanos() as u64;
        let clock = Clock {
            t0,
            ramp_ns,
            end_ns: ramp_ns + spec.duration.0.as_nanos() as u64,
            interval_ns: ctx.options.interval.as_nanos().max(1) as u64,
        };
        Self {
            ctx,
            bs,
            qd,
            submit_batch: spec.submit_batch.clamp(1, qd) as usize,
            offsets,
            schedule,
            clock,
            slow,
            slots: vec![Slot::default(); qd as usize],
            free: (0..qd).rev().collect(),
            batch: Vec::with_capacity(qd as usize),
            stats: RunStats::default(),
            interval: IntervalSample::empty(worker, 0, 0),
            measuring: ramp_ns == 0,
            cpu_start: CpuTime::of_this_thread(),
            failure: None,
        }
    }

    /// Starts measuring (and the thread's CPU clock) once the ramp is over.
    fn measure_from(&mut self, now: u64) {
        if !self.measuring && now >= self.clock.ramp_ns {
            self.measuring = true;
            self.cpu_start = CpuTime::of_this_thread();
        }
    }

    /// Fills free slots with the I/Os due at `now` (every free slot in a closed loop), handing
    /// them to the kernel in batches of `submit_batch`.
    fn issue_due(&mut self, engine: &mut dyn Engine, mut now: u64) -> Result<(), WorkloadError> {
        let spec = &self.ctx.spec;
        let worker = self.ctx.worker;
        self.batch.clear();
        while let Some(&slot) = self.free.last() {
            let scheduled = match self.schedule.as_mut() {
                Some(s) => match s.take_due(now) {
                    Some(t) => Some(t),
                    None => break,
                },
                None => None,
            };
            self.free.pop();
            let write = match spec.rw {
                ReadWrite::Read => false,
                ReadWrite::Write => true,
                ReadWrite::Mix => self.offsets.percent() >= spec.rwmix_read,
            };
            let offset = self.offsets.next_offset();
            if write {
                pattern::stamp(engine.buffer_mut(slot), offset, self.ctx.options.write_tag);
            }
            // `now` is refreshed after every submission, so each I/O's creation time is
            // stamped without an extra clock read.
            self.slots[slot as usize] = Slot {
                dir_write: write,
                offset,
                created_ns: now,
                submitted_ns: 0,
                scheduled_ns: scheduled,
            };
            let dir = if write { IoDir::Write } else { IoDir::Read };
            engine
                .queue(IoRequest {
                    slot,
                    dir,
                    offset,
                    len: self.bs,
                })
                .map_err(|error| WorkloadError::Engine { worker, error })?;
            self.batch.push(slot);
            if self.batch.len() >= self.submit_batch {
                now = self.flush(engine)?;
            }
        }
        if !self.batch.is_empty() {
            self.flush(engine)?;
        }
        Ok(())
    }

    /// Hands the queued batch to the kernel and stamps its submission time; returns that time.
    fn flush(&mut self, engine: &mut dyn Engine) -> Result<u64, WorkloadError> {
        engine.submit().map_err(|error| WorkloadError::Engine {
            worker: self.ctx.worker,
            error,
        })?;
        let submitted = self.clock.now_ns();
        for &slot in self.batch.iter() {
            self.slots[slot as usize].submitted_ns = submitted;
        }
        self.batch.clear();
        Ok(submitted)
    }

    /// How long the reap may block: for one completion, or until the next scheduled I/O.
    fn wait(&self) -> Wait {
        let inflight = self.qd - self.free.len() as u32;
        match self.schedule.as_ref() {
            _ if inflight == 0 && self.schedule.is_none() => Wait::None,
            None => Wait::One,
            Some(_) if inflight == self.qd => Wait::One,
            Some(s) => {
                let wake = s.next_due_ns().min(self.clock.end_ns);
                Wait::Until(self.clock.t0 + Duration::from_nanos(wake))
            }
        }
    }

    /// Sends every interval that ended by `now`, each with the age of its oldest I/O in flight
    /// at its end.
    fn close_intervals(&mut self, now: u64, send: &dyn Fn(WorkloadEvent)) {
        if !self.measuring {
            return;
        }
        let Clock {
            ramp_ns,
            end_ns,
            interval_ns,
            ..
        } = self.clock;
        let window_now = now.min(end_ns) - ramp_ns;
        while window_now >= self.interval.start_ns + interval_ns {
            let next_start = self.interval.start_ns + interval_ns;
            self.interval.end_ns = next_start;
            self.interval.oldest_in_flight_ns = Some(oldest_in_flight(
                &self.slots,
                &self.free,
                ramp_ns + next_start,
            ));
            let next = IntervalSample::empty(self.ctx.worker, self.interval.index + 1, next_start);
            send(WorkloadEvent::Interval(std::mem::replace(
                &mut self.interval,
                next,
            )));
        }
    }

    /// Frees a completed I/O's slot, checks it (and its data, when reads are verified), and
    /// counts it if it was issued in the measured window. A failure is kept to end the loop.
    fn complete(&mut self, engine: &mut dyn Engine, c: &Completion, now: u64) {
        let worker = self.ctx.worker;
        let bs = self.bs;
        let s = self.slots[c.slot as usize];
        self.free.push(c.slot);
        if let Err(e) = check_completion(worker, &s, c, bs) {
            self.failure.get_or_insert(e);
            return;
        }
        if self.ctx.options.verify_reads && !s.dir_write {
            if let Err(detail) = pattern::verify(engine.buffer_mut(c.slot), s.offset) {
                self.failure.get_or_insert(WorkloadError::Verify {
                    worker,
                    offset: s.offset,
                    detail,
                });
                return;
            }
        }
        let in_window = self.measuring && s.created_ns >= self.clock.ramp_ns;
        if let Some(keeper) = self.slow.as_mut() {
            let (offset, write) = (s.offset, s.dir_write);
            keeper.observe(offset, bs, write, s.created_ns, now, in_window);
        }
        if !in_window {
            return;
        }
        let d: &mut DirStats = if s.dir_write {
            &mut self.stats.write
        } else {
            &mut self.stats.read
        };
        d.ios += 1;
        d.bytes += u64::from(bs);
        d.slat.record(s.submitted_ns.saturating_sub(s.created_ns));
        d.clat.record(now.saturating_sub(s.submitted_ns));
        let lat = now.saturating_sub(s.created_ns);
        d.lat.record(lat);
        if let Some(sched) = s.scheduled_ns {
            d.lat_intended.record(now.saturating_sub(sched));
        }
        let interval = &mut self.interval;
        if s.dir_write {
            interval.write_ios += 1;
            interval.write_bytes += u64::from(bs);
        } else {
            interval.read_ios += 1;
            interval.read_bytes += u64::from(bs);
        }
        interval.lat.record(lat);
    }

    /// Measured window over (or stopped) at `now`: accounts CPU and sends the last interval,
    /// then lets in-flight I/Os finish so no buffer is freed under the kernel.
    fn finish(
        mut self,
        engine: &mut dyn Engine,
        now: u64,
        mut completions: Vec<Completion>,
        send: &dyn Fn(WorkloadEvent),
    ) -> Result<RunStats, WorkloadError> {
        let worker = self.ctx.worker;
        let Clock {
            ramp_ns, end_ns, ..
        } = self.clock;
        let mut stats = self.stats;
        let mut interval = self.interval;
        let end = now.min(end_ns);
        stats.cpu = CpuTime::of_this_thread().since(self.cpu_start);
        stats.measured_ns = end.saturating_sub(ramp_ns);
        if self.measuring && end > ramp_ns + interval.start_ns {
            interval.end_ns = end - ramp_ns;
            interval.oldest_in_flight_ns = Some(oldest_in_flight(&self.slots, &self.free, end));
            send(WorkloadEvent::Interval(interval));
        }
        stats.engine_features = engine.features();
        stats.slow_ios = self.slow.map(|k| k.kept).unwrap_or_default();
        while (self.free.len() as u32) < self.qd {
            completions.clear();
            engine
                .submit()
                .map_err(|error| WorkloadError::Engine { worker, error })?;
            engine
                .reap(Wait::One, &mut completions)
                .map_err(|error| WorkloadError::Engine { worker, error })?;
            stats.drained_ios += completions.len() as u64;
            self.free.extend(completions.iter().map(|c| c.slot));
        }
        match self.failure {
            Some(e) => Err(e),
            None => Ok(stats),
        }
    }
}

fn check_completion(worker: u32, s: &Slot, c: &Completion, bs: u32) -> Result<(), WorkloadError> {
    let dir = if s.dir_write { "write" } else { "read" };
    if c.result < 0 {
        return Err(WorkloadError::Io {
            worker,
            dir,
            offset: s.offset,
            len: bs,
            error: std::io::Error::from_raw_os_error(-c.result),
        });
    }
    if c.result as u32 != bs {
        return Err(WorkloadError::Short {
            worker,
            dir,
            offset: s.offset,
            len: bs,
            got: c.result as u32,
        });
    }
    Ok(())
}

/// Age at `at_ns` of the oldest I/O in flight then (issued at or before it, not yet reaped):
/// 0 when none was.
fn oldest_in_flight(slots: &[Slot], free: &[u32], at_ns: u64) -> u64 {
    let mut idle = vec![false; slots.len()];
    for &f in free {
        idle[f as usize] = true;
    }
    slots
        .iter()
        .zip(idle)
        .filter(|(s, idle)| !idle && s.created_ns <= at_ns)
        .map(|(s, _)| at_ns - s.created_ns)
        .max()
        .unwrap_or(0)
}
