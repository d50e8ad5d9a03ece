//! Running the kv workload on a loaded store: `start` ACT's threads — client threads paced on an
//! absolute schedule (io_uring rings, or synchronous service threads as ACT's), one large-block
//! writer and one defragmenter — and a coordinator that dumps ACT's cumulative histograms every
//! report interval, closes verdict slices, and stops the run when a stream falls behind.
//!
//! Events follow the generic runner's contract: each client thread is a worker that sends its
//! own interval samples; the coordinator sends the large-block stream's as one more worker, and
//! every worker's `Finished`, the large-block stream's (the last) carrying the kv outcome.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::act_log::{act_log_header, write_dump, HistogramSnapshot};
use super::client::{ClientContext, ServiceResult};
use super::fill::LoadedStore;
use super::inflight::QueueTally;
use super::ring::{run_ring, TICK};
use super::service::run_service_thread;
use super::shared::Shared;
use super::spec::KvSpec;
use super::store::{KvError, KvStore};
use super::verdict::{slice_result, Behind, KvOutcome, SliceResult};
use crate::act::{self, Derived};
use crate::run::{RunHandle, RunOptions, WorkloadError, WorkloadEvent};
use crate::spec::{EngineKind, WorkloadSpec};
use crate::stats::{CpuTime, DirStats, RunStats};
use crate::target::Target;

/// Starts the kv workload on a loaded store. Events arrive on `tx` as from `crate::start`;
/// the handle's `workers()` counts the service threads plus the large-block stream.
pub fn start<T>(
    spec: &WorkloadSpec,
    loaded: &LoadedStore,
    target: &Target,
    options: &RunOptions,
    stop: Arc<AtomicBool>,
    tx: Sender<T>,
) -> RunHandle
where
    T: From<WorkloadEvent> + Send + 'static,
{
    let spec = spec.clone();
    let store = Arc::clone(&loaded.store);
    let keys = loaded.keys;
    let options = options.clone();
    let device = target.path.display().to_string();
    let workers = spec.workers + 1;
    let coordinator = std::thread::Builder::new()
        .name("vg-kv".into())
        .spawn(move || {
            let tx2 = tx.clone();
            let send = move |ev: WorkloadEvent| {
                let _ = tx2.send(T::from(ev));
            };
            coordinate(&spec, &store, keys, &device, &options, &stop, send);
        })
        .expect("spawning the kv coordinator");
    RunHandle::from_threads(vec![coordinator], workers)
}

/// The coordinator: starts the threads, reports every interval until the run ends or a stream
/// falls behind, then collects every worker's results.
fn coordinate(
    spec: &WorkloadSpec,
    store: &Arc<KvStore>,
    keys: u64,
    device: &str,
    options: &RunOptions,
    stop: &Arc<AtomicBool>,
    send: impl Fn(WorkloadEvent) + Clone + Send + 'static,
) {
    let kv = spec.kv.clone().expect("a kv spec");
    let (read_rps, write_rps) = kv.rates();
    let threads = spec.workers;
    let shared = Arc::new(Shared::new(spec, options));

    let large_block_threads = LargeBlockThreads::start(store, &shared);
    let clients: Vec<_> = (0..threads)
        .map(|worker| {
            let ctx = ClientContext::new(worker, spec, options, store, keys, &shared, stop);
            spawn_client(ctx, spec.engine == EngineKind::IoUring, send.clone())
        })
        .collect();
    send(WorkloadEvent::Started {
        engine_features: engine_features(spec, &kv),
    });

    let derived = act::derive(&kv.act_load(spec.bs.0));
    let mut report = ActReport::new(spec, device, options.interval, &derived);
    let mut clock = ReportClock::new(options.interval);
    while let Some(tick) = clock.wait(&shared, stop) {
        if let Some(done) = shared.next_large_block_interval(tick.index, tick.window_ns) {
            send(WorkloadEvent::Interval(done));
        }
        check_large_block_backlog(store, &shared, kv.max_lag.0);
        report.at_tick(tick.window_ns, &shared);
    }

    // Before the stop: the writer then drains its queue, which is not the measured load.
    let lb_pending = store.pending_blocks();
    shared.halt.store(true, Ordering::Relaxed);
    let (mut results, clients) = ClientTotals::join(clients);
    let (large_block_error, large_block_cpu) = large_block_threads.stop(store);
    let measured_ns = shared
        .now_ns()
        .min(shared.end_ns)
        .saturating_sub(shared.ramp_ns);
    let (act_log, slices) = report.close(measured_ns, &shared);

    let (last, mut large_blocks) = shared.finish_large_blocks(measured_ns);
    if let Some(last) = last {
        send(WorkloadEvent::Interval(last));
    }
    large_blocks.measured_ns = measured_ns;
    large_blocks.cpu = large_block_cpu;
    large_blocks.engine_features = "psync".into();
    let outcome = KvOutcome {
        derived,
        read_rps,
        write_rps,
        service_threads: threads,
        keys,
        records_per_block: store.records_per_block(),
        read_bytes: store.read_bytes(),
        measured_s: measured_ns as f64 / 1e9,
        lb_reads: large_blocks.read.ios,
        lb_writes: large_blocks.write.ios,
        lb_pending,
        client_read: clients.read,
        client_write: clients.write,
        slices,
        worst_lag: clients.worst_lag,
        read_queue: clients.queue,
        behind: shared.behind(),
        counters: store.counters(),
        act_log,
    };
    // A failed writer or defragmenter fails the run.
    let large_block_result = match large_block_error {
        Some(error) if !matches!(error, KvError::Stopped) => Err(WorkloadError::Kv {
            worker: threads,
            error,
        }),
        _ => Ok(RunStats {
            kv: Some(Box::new(outcome)),
            ..large_blocks
        }),
    };
    results.push(large_block_result);
    for (worker, result) in results.into_iter().enumerate() {
        send(WorkloadEvent::Finished {
            worker: worker as u32,
            result: result.map(Box::new),
        });
    }
}

/// The store's background loops, each on its own thread recording its large blocks.
struct LargeBlockThreads {
    writer: JoinHandle<(Result<(), KvError>, CpuTime)>,
    defrag: JoinHandle<(Result<(), KvError>, CpuTime)>,
}

impl LargeBlockThreads {
    fn start(store: &Arc<KvStore>, shared: &Arc<Shared>) -> Self {
        store.start_background();
        Self {
            writer: background("vg-kv-writer", store, shared, true),
            defrag: background("vg-kv-defrag", store, shared, false),
        }
    }

    /// Stops the loops and waits for them: the first error met (the writer's first; a thread
    /// that panicked counts as stopped) and the CPU time both took.
    fn stop(self, store: &KvStore) -> (Option<KvError>, CpuTime) {
        store.stop_background();
        let (writer_result, mut cpu) = self
            .writer
            .join()
            .unwrap_or((Err(KvError::Stopped), CpuTime::default()));
        let (defrag_result, defrag_cpu) = self
            .defrag
            .join()
            .unwrap_or((Err(KvError::Stopped), CpuTime::default()));
        cpu.add(defrag_cpu);
        let error = [writer_result, defrag_result]
            .into_iter()
            .find_map(|r| r.err());
        (error, cpu)
    }
}

/// Runs one of the store's background loops on its own thread, recording its large blocks.
fn background(
    name: &str,
    store: &Arc<KvStore>,
    shared: &Arc<Shared>,
    write: bool,
) -> JoinHandle<(Result<(), KvError>, CpuTime)> {
    let (store, shared) = (Arc::clone(store), Arc::clone(shared));
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let cpu = CpuTime::of_this_thread();
            let observe = |offset, ns| shared.large_block(write, offset, ns);
            let r = if write {
                store.run_writer(observe)
            } else {
                store.run_defrag(observe)
            };
            if r.is_err() {
                shared.halt.store(true, Ordering::Relaxed);
            }
            (r, CpuTime::of_this_thread().since(cpu))
        })
        .expect("spawning a kv background thread")
}

/// Starts one client thread: an io_uring ring (`asynchronous`) or a synchronous service
/// thread. A thread that fails or panics halts the run.
fn spawn_client(
    ctx: ClientContext,
    asynchronous: bool,
    send: impl Fn(WorkloadEvent) + Send + 'static,
) -> JoinHandle<Result<ServiceResult, WorkloadError>> {
    let worker = ctx.worker;
    let name = if asynchronous {
        format!("vg-kv-ring-{worker}")
    } else {
        format!("vg-kv-svc-{worker}")
    };
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            let send_interval = |s| send(WorkloadEvent::Interval(s));
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if asynchronous {
                    run_ring(&ctx, &send_interval)
                } else {
                    run_service_thread(&ctx, &send_interval)
                }
            }))
            .unwrap_or(Err(WorkloadError::Panicked { worker }));
            if r.is_err() {
                ctx.shared.halt.store(true, Ordering::Relaxed);
            }
            r
        })
        .expect("spawning a kv service thread")
}

/// How the run does its I/O, as the `Started` event reports it.
fn engine_features(spec: &WorkloadSpec, kv: &KvSpec) -> String {
    let threads = spec.workers;
    let clients = match spec.engine {
        EngineKind::IoUring => format!(
            "io_uring, {threads} rings of up to {} reads in flight, sleeping at least {} µs",
            spec.qd,
            TICK.as_micros()
        ),
        _ => format!("psync, {threads} service threads"),
    };
    format!(
        "{clients}, large-block writes {}",
        if kv.dsync {
            "O_DIRECT|O_DSYNC"
        } else {
            "O_DIRECT"
        }
    )
}

/// Stops the run when the writer's or the defragmenter's queue is more than `max_lag` behind.
fn check_large_block_backlog(store: &KvStore, shared: &Shared, max_lag: Duration) {
    let (write_backlog, defrag_backlog) = store.backlog();
    if write_backlog > max_lag {
        shared.fall_behind(Behind::Device("large-block writes"), write_backlog);
    } else if defrag_backlog > max_lag {
        shared.fall_behind(Behind::Device("large-block reads (defrag)"), defrag_backlog);
    }
}

/// The coordinator's clock: a tick at the end of every report interval of the measured window,
/// the last at the window's end when that is a whole interval.
struct ReportClock {
    interval_ns: u64,
    /// The next tick's number, from 1.
    next: u64,
}

/// A tick: which interval starts there, and how far into the measured window it is.
struct Tick {
    index: u64,
    window_ns: u64,
}

impl ReportClock {
    fn new(interval: Duration) -> Self {
        Self {
            interval_ns: interval.as_nanos().max(1) as u64,
            next: 1,
        }
    }

    /// Sleeps until the next tick; None once the run is over, halted or stopped.
    fn wait(&mut self, shared: &Shared, stop: &AtomicBool) -> Option<Tick> {
        loop {
            let due = shared.ramp_ns + self.next * self.interval_ns;
            let now = shared.now_ns();
            if shared.halt.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
                return None;
            }
            // The last tick is the end of the run when that is a whole interval.
            let wake = if due > shared.end_ns {
                if now >= shared.end_ns {
                    return None;
                }
                shared.end_ns
            } else {
                due
            };
            if now < wake {
                std::thread::sleep(
                    Duration::from_nanos(wake - now).min(Duration::from_millis(100)),
                );
                continue;
            }
            if due > shared.end_ns {
                continue;
            }
            let tick = Tick {
                index: self.next,
                window_ns: self.next * self.interval_ns,
            };
            self.next += 1;
            return Some(tick);
        }
    }
}

/// ACT's log and the verdict's slices, written as the run goes: a histogram dump every report
/// interval, and a slice closed at the first dump past its length.
struct ActReport<'a> {
    device: &'a str,
    log: String,
    /// ACT's log counts whole seconds: dumps every `report_s`, at the first tick past each.
    report_s: u64,
    /// The last second dumped.
    dumped: u64,
    slice_ns: u64,
    slices: Vec<SliceResult>,
    /// When the open slice began, and the histograms then.
    slice_start: (u64, HistogramSnapshot),
}

impl<'a> ActReport<'a> {
    /// A report whose log begins with ACT's preamble.
    fn new(spec: &WorkloadSpec, device: &'a str, interval: Duration, derived: &Derived) -> Self {
        let kv = spec.kv.as_ref().expect("a kv spec");
        let (read_rps, write_rps) = kv.rates();
        let report_s = interval.as_secs().max(1);
        Self {
            device,
            log: act_log_header(spec, device, read_rps, write_rps, derived, report_s),
            report_s,
            dumped: 0,
            slice_ns: kv.slice_for(spec.duration.0).as_nanos() as u64,
            slices: Vec::new(),
            slice_start: (0, HistogramSnapshot::default()),
        }
    }

    /// A tick `window_ns` into the measured window: dumps the histograms when a report is due,
    /// and closes the slice when it has run its length.
    fn at_tick(&mut self, window_ns: u64, shared: &Shared) {
        let seconds = window_ns / 1_000_000_000 / self.report_s * self.report_s;
        if seconds <= self.dumped {
            return;
        }
        self.dumped = seconds;
        let now = shared.histograms();
        write_dump(&mut self.log, seconds, &now, self.device);
        if window_ns - self.slice_start.0 >= self.slice_ns {
            let lag = Duration::from_nanos(shared.slice_lag_ns.swap(0, Ordering::Relaxed));
            self.slices
                .push(slice_result(&self.slice_start, window_ns, &now, true, lag));
            self.slice_start = (window_ns, now);
        }
    }

    /// Closes the last slice at the end of the measured window (complete only if it ran its
    /// length); returns the log and the slices.
    fn close(mut self, measured_ns: u64, shared: &Shared) -> (String, Vec<SliceResult>) {
        let now = shared.histograms();
        if measured_ns > self.slice_start.0 {
            let complete = measured_ns - self.slice_start.0 >= self.slice_ns;
            let lag = Duration::from_nanos(shared.slice_lag_ns.load(Ordering::Relaxed));
            self.slices.push(slice_result(
                &self.slice_start,
                measured_ns,
                &now,
                complete,
                lag,
            ));
        }
        (self.log, self.slices)
    }
}

/// Every client operation of the run, over all client threads.
struct ClientTotals {
    read: DirStats,
    write: DirStats,
    worst_lag: Duration,
    /// The rings' reads in flight and queueing (None for service threads).
    queue: Option<QueueTally>,
}

impl ClientTotals {
    /// Waits for the client threads: each one's result as a worker's (its device reads), and
    /// the client operations of those that finished.
    fn join(
        threads: Vec<JoinHandle<Result<ServiceResult, WorkloadError>>>,
    ) -> (Vec<Result<RunStats, WorkloadError>>, Self) {
        let results = threads.into_iter().enumerate().map(|(w, h)| {
            h.join()
                .unwrap_or(Err(WorkloadError::Panicked { worker: w as u32 }))
        });
        let (mut read, mut write) = (DirStats::default(), DirStats::default());
        let mut worst_lag_ns = 0;
        let mut queue: Option<QueueTally> = None;
        let workers = results
            .map(|r| {
                r.map(|s| {
                    read.merge(&s.client_read);
                    write.merge(&s.client_write);
                    worst_lag_ns = worst_lag_ns.max(s.device.max_lag_ns);
                    match (&mut queue, &s.queue) {
                        (Some(all), Some(q)) => all.merge(q),
                        (None, q) => queue = *q,
                        (Some(_), None) => {}
                    }
                    s.device
                })
            })
            .collect();
        let totals = Self {
            read,
            write,
            worst_lag: Duration::from_nanos(worst_lag_ns),
            queue,
        };
        (workers, totals)
    }
}
