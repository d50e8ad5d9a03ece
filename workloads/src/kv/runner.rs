//! Running the kv workload: load the store (`prepare`), then `start` ACT's threads on it —
//! synchronous service threads paced on an absolute schedule, one large-block writer and one
//! defragmenter — and a coordinator that dumps ACT's cumulative histograms every report
//! interval, closes verdict slices, and stops the run when a stream falls behind.
//!
//! Events follow the generic runner's contract: each service thread is a worker that sends its
//! own interval samples; the coordinator sends every worker's `Finished`, worker 0's carrying
//! the kv outcome.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use crate::act::{self, ActHistogram, AtomicActHistogram, Derived, SliceVerdict};
use crate::kv::store::{KvConfig, KvCounters, KvError, KvStore, OpDone};
use crate::offsets::OffsetGenerator;
use crate::run::{RunHandle, RunOptions, WorkloadError, WorkloadEvent};
use crate::schedule::RateSchedule;
use crate::spec::{EngineKind, Pattern, WorkloadSpec};
use crate::stats::{CpuTime, DirStats, IntervalSample, RunStats};
use crate::target::Target;

/// How far along the load is.
#[derive(Clone, Copy, Debug)]
pub struct FillProgress {
    pub phase: &'static str,
    pub done: u64,
    pub total: u64,
}

/// A loaded store and what loading it took.
#[derive(Debug)]
pub struct LoadedStore {
    pub store: Arc<KvStore>,
    pub keys: u64,
    /// Overwrites after the first write of every key, to bring defrag to its steady state.
    pub aging_overwrites: u64,
    pub seconds: f64,
}

/// Overwrites run after loading, as a multiple of the key count. A freshly loaded store has
/// every block full; uniform overwrites then drain them all at once, and defrag swings
/// (measured: large-block reads per write 1.2, then 0.8, ...) until about 2.5 rewrites of the
/// key space have spread the blocks' ages; from there the ratio stays within ±3% of 1.
const AGING_ROUNDS: u64 = 3;

fn config(spec: &WorkloadSpec) -> KvConfig {
    let kv = spec.kv.as_ref().expect("a kv spec");
    KvConfig {
        record_bytes: kv.record_bytes.0,
        record_bytes_max: kv.record_bytes_max.map_or(kv.record_bytes.0, |m| m.0),
        lb_bytes: spec.bs.0,
        defrag_lwm_pct: kv.defrag_lwm_pct,
        dsync: kv.dsync,
    }
}

/// Builds the store on `target` and loads it to the spec's fill fraction, then ages it with
/// overwrites. Ok(None): `stop` was set first.
pub fn prepare(
    spec: &WorkloadSpec,
    target: &Target,
    stop: &AtomicBool,
    mut progress: impl FnMut(FillProgress),
) -> Result<Option<LoadedStore>, KvError> {
    let kv = spec.kv.as_ref().expect("a kv spec");
    let cfg = config(spec);
    let blocks = target.size / cfg.lb_bytes;
    let keys = blocks * cfg.records_per_block() * kv.fill_pct / 100;
    if keys == 0 {
        return Err(KvError::TooSmall { blocks });
    }
    let store = Arc::new(KvStore::new(
        Arc::clone(&target.file),
        target.size,
        target.align as usize,
        cfg,
        keys,
    )?);
    let started = Instant::now();
    let aging = keys * AGING_ROUNDS;
    let total = keys + aging;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x6b76);
    let interrupted = std::thread::scope(|s| -> Result<bool, KvError> {
        store.start_background();
        let writer = s.spawn(|| store.run_writer(|_, _| {}));
        let defrag = s.spawn(|| store.run_defrag(|_, _| {}));
        let mut result = Ok(false);
        for i in 0..total {
            if i % 4096 == 0 {
                if stop.load(Ordering::Relaxed) {
                    result = Ok(true);
                    break;
                }
                let phase = if i < keys { "loading" } else { "aging" };
                progress(FillProgress {
                    phase,
                    done: i,
                    total,
                });
            }
            let key = if i < keys {
                i
            } else {
                rng.random_range(0..keys)
            };
            if let Err(e) = store.put(key) {
                result = Err(e);
                break;
            }
            // Unpaced loading would outrun defrag and leave a backlog of candidates (and a
            // store with no free blocks) that the measured run then works off.
            if i % 64 == 0 {
                store.wait_caught_up(2, 2);
            }
        }
        store.stop_background();
        let w = writer.join().expect("the writer does not panic");
        let d = defrag.join().expect("the defragmenter does not panic");
        let interrupted = result?;
        w?;
        d?;
        Ok(interrupted)
    })?;
    if interrupted {
        return Ok(None);
    }
    Ok(Some(LoadedStore {
        store,
        keys,
        aging_overwrites: aging,
        seconds: started.elapsed().as_secs_f64(),
    }))
}

/// Latency percentages of one stream over one slice, ACT's way.
#[derive(Clone, Debug, PartialEq)]
pub struct SliceResult {
    pub start_s: f64,
    pub end_s: f64,
    /// Slices shorter than `--slice` (the run's tail) are shown but not judged, as
    /// act_latency.py ignores them.
    pub complete: bool,
    /// Client reads, as judged: their device service time, or from their scheduled start
    /// when the schedule slipped in this slice (see `judged_on`).
    pub reads: SliceVerdict,
    pub judged_on: Judged,
    /// The slice's worst lag of client operations behind their schedule.
    pub worst_lag: Duration,
    pub lb_reads: SliceVerdict,
    pub lb_writes: SliceVerdict,
}

/// What a slice's client reads are judged on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judged {
    /// The device read's service time, as ACT measures it: the schedule held.
    Service,
    /// The time from each read's scheduled start (`lat_intended`): operations started late in
    /// this slice, and a read that waits for its turn is as slow for the client as a slow
    /// device.
    Intended,
}

impl Judged {
    pub fn label(self) -> &'static str {
        match self {
            Judged::Service => "service",
            Judged::Intended => "intended",
        }
    }
}

/// A slice whose client operations fell this far behind their schedule is judged on
/// `lat_intended`: ACT's smallest threshold, so a lag that alone could fail a read counts.
pub const SLIPPED_LAG: Duration = Duration::from_millis(1);

/// The least share of the scheduled load a passing run delivered.
pub const DELIVERED_MIN: f64 = 0.99;

/// ACT's verdict on a kv run, made honest about the load: PASS only when it was delivered.
#[derive(Clone, Debug, PartialEq)]
pub enum KvVerdict {
    /// Every complete slice passed, at the load asked for.
    Pass,
    /// A complete slice's reads were too slow.
    Fail,
    /// Less than [`DELIVERED_MIN`] of the client or large-block operations were done, or a
    /// stream fell behind by more than `--max-lag`: the figures are those of a lighter load.
    NotDelivered {
        client: f64,
        large_blocks: f64,
        behind: Option<Behind>,
    },
    /// Reads returned data other than what was written.
    Mismatches(u64),
    /// No slice ran to its end (a run shorter than `--slice`).
    NoCompleteSlice,
}

/// Which stream fell behind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behind {
    /// Client operations: the generator (more service threads may help), as ACT's service
    /// threads report it.
    Generator,
    /// Large-block writes or defrag reads: the device, as ACT's large-block threads report it.
    Device(&'static str),
}

/// What a kv run found, beyond the generic statistics.
#[derive(Clone, Debug)]
pub struct KvOutcome {
    pub derived: Derived,
    pub read_rps: u64,
    pub write_rps: u64,
    pub service_threads: u32,
    pub keys: u64,
    pub records_per_block: u64,
    /// Bytes of a client read of the smallest and the largest record.
    pub read_bytes: (u64, u64),
    pub measured_s: f64,
    /// Large-block operations in the measured window.
    pub lb_reads: u64,
    pub lb_writes: u64,
    /// Sealed blocks still waiting for the writer, and defrag candidates for the defragmenter,
    /// when the run ended.
    pub lb_pending: (u64, u64),
    /// Client reads in the measured window (each a device read unless the record was still in
    /// memory).
    pub client_read: crate::stats::DirStats,
    /// Client writes: appends to the write buffer, waiting only when no block is free.
    pub client_write: crate::stats::DirStats,
    pub slices: Vec<SliceResult>,
    /// Why the run stopped early, with how far behind it was.
    pub behind: Option<(Behind, Duration)>,
    /// The worst lag of client operations behind their schedule.
    pub worst_lag: Duration,
    pub counters: KvCounters,
    /// ACT's text log: histogram dumps every report interval.
    pub act_log: String,
}

impl KvOutcome {
    /// ACT's verdict, given only when the load was delivered: every complete slice passes,
    /// no stream fell behind, at least [`DELIVERED_MIN`] of the operations were done.
    pub fn verdict(&self) -> KvVerdict {
        if self.counters.mismatches > 0 {
            return KvVerdict::Mismatches(self.counters.mismatches);
        }
        let (client, large_blocks) = (self.achieved_fraction(), self.large_block_fraction());
        if self.behind.is_some() || client < DELIVERED_MIN || large_blocks < DELIVERED_MIN {
            return KvVerdict::NotDelivered {
                client,
                large_blocks,
                behind: self.behind.as_ref().map(|(who, _)| who.clone()),
            };
        }
        let judged: Vec<&SliceResult> = self.slices.iter().filter(|s| s.complete).collect();
        if judged.is_empty() {
            KvVerdict::NoCompleteSlice
        } else if judged.iter().all(|s| s.reads.pass) {
            KvVerdict::Pass
        } else {
            KvVerdict::Fail
        }
    }

    /// Share of the large-block operations the store asked for that were done: the writer's
    /// and the defragmenter's, against what was still queued for them at the end. One block
    /// per stream may be in hand at any moment and is not counted as behind.
    pub fn large_block_fraction(&self) -> f64 {
        let done = self.lb_reads + self.lb_writes;
        let behind = self.lb_pending.0.saturating_sub(1) + self.lb_pending.1.saturating_sub(1);
        if done + behind == 0 {
            1.0
        } else {
            done as f64 / (done + behind) as f64
        }
    }

    /// Share of the target client operations done in the measured window.
    pub fn achieved_fraction(&self) -> f64 {
        let target = (self.read_rps + self.write_rps) as f64 * self.measured_s;
        if target > 0.0 {
            (self.client_read.ios + self.client_write.ios) as f64 / target
        } else {
            0.0
        }
    }

    pub fn rate(&self, n: u64) -> f64 {
        if self.measured_s > 0.0 {
            n as f64 / self.measured_s
        } else {
            0.0
        }
    }
}

/// The large-block streams (writer and defragmenter), reported as one more worker: its reads
/// are defrag reads and its writes large-block writes, so a kv profile's I/Os are the device
/// I/Os the store issued, the same set the block probes see.
#[derive(Default)]
struct LargeBlocks {
    stats: RunStats,
    interval: Option<IntervalSample>,
}

/// State shared by the kv threads.
pub(super) struct Shared {
    t0: Instant,
    /// CLOCK_MONOTONIC at `t0`, for the slow I/Os kept for the tail autopsy.
    t0_monotonic_ns: u64,
    ramp_ns: u64,
    end_ns: u64,
    lb_bytes: u64,
    /// Set by the coordinator (end, lag) or a failing thread.
    pub halt: AtomicBool,
    reads: AtomicActHistogram,
    /// The same reads from their scheduled start.
    reads_intended: AtomicActHistogram,
    /// Worst lag of a client operation since the current slice began.
    slice_lag_ns: AtomicU64,
    lb_reads: AtomicActHistogram,
    lb_writes: AtomicActHistogram,
    large_blocks: Mutex<LargeBlocks>,
    behind: Mutex<Option<(Behind, Duration)>>,
    /// The defrag reader's and the writer's slow I/Os for the tail autopsy (when kept).
    large_block_slow: [Mutex<Option<crate::slow::SlowIoKeeper>>; 2],
}

impl Shared {
    pub fn now_ns(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    fn fall_behind(&self, who: Behind, by: Duration) {
        let mut b = self.behind.lock().unwrap_or_else(|e| e.into_inner());
        b.get_or_insert((who, by));
        self.halt.store(true, Ordering::Relaxed);
    }

    /// Records one large-block I/O at `offset` that took `ns` and ended now, if inside the
    /// measured window.
    fn large_block(&self, write: bool, offset: u64, ns: u64) {
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
}

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

/// Runs one of the store's background loops on its own thread, recording its large blocks.
fn background(
    name: &str,
    store: &Arc<KvStore>,
    shared: &Arc<Shared>,
    write: bool,
) -> std::thread::JoinHandle<(Result<(), KvError>, CpuTime)> {
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
    let ramp_ns = spec.ramp.0.as_nanos() as u64;
    let interval_ns = options.interval.as_nanos().max(1) as u64;
    let (t0, t0_monotonic_ns) = (Instant::now(), crate::slow::monotonic_ns());
    let shared =
        Arc::new(Shared {
            t0,
            t0_monotonic_ns,
            ramp_ns,
            end_ns: ramp_ns + spec.duration.0.as_nanos() as u64,
            lb_bytes: spec.bs.0,
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
                Mutex::new(options.tail_watch.as_ref().map(|w| {
                    crate::slow::SlowIoKeeper::new(Arc::clone(w), worker, t0_monotonic_ns)
                }))
            }),
        });

    store.start_background();
    let writer = background("vg-kv-writer", store, &shared, true);
    let defrag = background("vg-kv-defrag", store, &shared, false);
    let services: Vec<_> = (0..threads)
        .map(|worker| {
            let ctx = ClientContext {
                worker,
                threads,
                keys,
                reads_per_s: read_rps,
                writes_per_s: write_rps,
                distribution: spec.distribution,
                seed: options.seed,
                interval_ns,
                max_lag: kv.max_lag.0,
                qd: spec.qd,
                store: Arc::clone(store),
                shared: Arc::clone(&shared),
                stop: Arc::clone(stop),
                tail_watch: options.tail_watch.clone(),
            };
            let send = send.clone();
            let asynchronous = spec.engine == EngineKind::IoUring;
            let name = if asynchronous {
                format!("vg-kv-ring-{worker}")
            } else {
                format!("vg-kv-svc-{worker}")
            };
            std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    let send_interval = |s: IntervalSample| send(WorkloadEvent::Interval(s));
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        if asynchronous {
                            super::ring::run_ring(&ctx, &send_interval)
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
        })
        .collect();
    let clients = match spec.engine {
        EngineKind::IoUring => format!(
            "io_uring, {threads} rings of up to {} reads in flight, sleeping at least {} µs",
            spec.qd,
            super::ring::TICK.as_micros()
        ),
        _ => format!("psync, {threads} service threads"),
    };
    send(WorkloadEvent::Started {
        engine_features: format!(
            "{clients}, large-block writes {}",
            if kv.dsync {
                "O_DIRECT|O_DSYNC"
            } else {
                "O_DIRECT"
            }
        ),
    });

    // ACT's log counts whole seconds: dumps every `report_s`, at the first tick past each.
    let report_s = options.interval.as_secs().max(1);
    let slice_ns = kv.slice_for(spec.duration.0).as_nanos() as u64;
    let derived = act::derive(&kv.act_load(spec.bs.0));
    let mut log = act_log_header(spec, device, read_rps, write_rps, &derived, report_s);
    let mut dumped = 0u64;
    let mut slices = Vec::new();
    let mut slice_start = (0u64, Snapshot::default());
    let mut tick = 1u64;
    loop {
        let due = ramp_ns + tick * interval_ns;
        let now = shared.now_ns();
        if shared.halt.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
            break;
        }
        // The last tick is the end of the run when that is a whole interval.
        let wake = if due > shared.end_ns {
            if now >= shared.end_ns {
                break;
            }
            shared.end_ns
        } else {
            due
        };
        if now < wake {
            std::thread::sleep(Duration::from_nanos(wake - now).min(Duration::from_millis(100)));
            continue;
        }
        if due > shared.end_ns {
            continue;
        }
        let window_ns = tick * interval_ns;
        tick += 1;
        {
            let mut lb = shared
                .large_blocks
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let next = IntervalSample::empty(threads, tick - 1, window_ns);
            if let Some(mut done) = lb.interval.replace(next) {
                done.end_ns = window_ns;
                send(WorkloadEvent::Interval(done));
            }
        }
        let (write_backlog, defrag_backlog) = store.backlog();
        if write_backlog > kv.max_lag.0 {
            shared.fall_behind(Behind::Device("large-block writes"), write_backlog);
        } else if defrag_backlog > kv.max_lag.0 {
            shared.fall_behind(Behind::Device("large-block reads (defrag)"), defrag_backlog);
        }
        let seconds = window_ns / 1_000_000_000 / report_s * report_s;
        if seconds <= dumped {
            continue;
        }
        dumped = seconds;
        let snap = Snapshot::of(&shared);
        let _ = write!(log, "after {seconds} sec:\n{}", snap.dump(device));
        if window_ns - slice_start.0 >= slice_ns {
            let lag = Duration::from_nanos(shared.slice_lag_ns.swap(0, Ordering::Relaxed));
            slices.push(slice_result(&slice_start, window_ns, &snap, true, lag));
            slice_start = (window_ns, snap);
        }
    }

    // Before the stop: the writer then drains its queue, which is not the measured load.
    let lb_pending = store.pending_blocks();
    shared.halt.store(true, Ordering::Relaxed);
    let service_results: Vec<Result<ServiceResult, WorkloadError>> = services
        .into_iter()
        .enumerate()
        .map(|(w, h)| {
            h.join()
                .unwrap_or(Err(WorkloadError::Panicked { worker: w as u32 }))
        })
        .collect();
    store.stop_background();
    let (writer_result, writer_cpu) = writer
        .join()
        .unwrap_or((Err(KvError::Stopped), CpuTime::default()));
    let (defrag_result, defrag_cpu) = defrag
        .join()
        .unwrap_or((Err(KvError::Stopped), CpuTime::default()));
    let measured_ns = shared.now_ns().min(shared.end_ns).saturating_sub(ramp_ns);
    let snap = Snapshot::of(&shared);
    if measured_ns > slice_start.0 {
        let complete = measured_ns - slice_start.0 >= slice_ns;
        let lag = Duration::from_nanos(shared.slice_lag_ns.load(Ordering::Relaxed));
        slices.push(slice_result(
            &slice_start,
            measured_ns,
            &snap,
            complete,
            lag,
        ));
    }
    let (mut client_read, mut client_write) = (DirStats::default(), DirStats::default());
    let mut worst_lag_ns = 0;
    let mut results: Vec<Result<RunStats, WorkloadError>> = service_results
        .into_iter()
        .map(|r| {
            r.map(|s| {
                client_read.merge(&s.client_read);
                client_write.merge(&s.client_write);
                worst_lag_ns = worst_lag_ns.max(s.device.max_lag_ns);
                s.device
            })
        })
        .collect();
    let mut large_blocks = {
        let mut lb = shared
            .large_blocks
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(mut last) = lb.interval.take() {
            if measured_ns > last.start_ns {
                last.end_ns = measured_ns;
                send(WorkloadEvent::Interval(last));
            }
        }
        std::mem::take(&mut lb.stats)
    };
    for keeper in &shared.large_block_slow {
        if let Some(k) = keeper.lock().unwrap_or_else(|e| e.into_inner()).take() {
            large_blocks.slow_ios.extend(k.kept);
        }
    }
    large_blocks.measured_ns = measured_ns;
    large_blocks.cpu = writer_cpu;
    large_blocks.cpu.add(defrag_cpu);
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
        client_read,
        client_write,
        slices,
        worst_lag: Duration::from_nanos(worst_lag_ns),
        behind: shared
            .behind
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone(),
        counters: store.counters(),
        act_log: log,
    };
    let mut lb_result = Ok(large_blocks);
    // A failed writer or defragmenter fails the run.
    if let Some(e) = [writer_result, defrag_result]
        .into_iter()
        .find_map(|r| r.err())
    {
        if !matches!(e, KvError::Stopped) {
            lb_result = Err(WorkloadError::Kv {
                worker: threads,
                error: e,
            });
        }
    }
    if let Ok(s) = lb_result.as_mut() {
        s.kv = Some(Box::new(outcome));
    }
    results.push(lb_result);
    for (worker, result) in results.into_iter().enumerate() {
        send(WorkloadEvent::Finished {
            worker: worker as u32,
            result: result.map(Box::new),
        });
    }
}

/// Cumulative histograms at one moment.
#[derive(Clone, Debug, Default)]
struct Snapshot {
    reads: ActHistogram,
    reads_intended: ActHistogram,
    lb_reads: ActHistogram,
    lb_writes: ActHistogram,
}

impl Snapshot {
    fn of(shared: &Shared) -> Self {
        Self {
            reads: shared.reads.snapshot(),
            reads_intended: shared.reads_intended.snapshot(),
            lb_reads: shared.lb_reads.snapshot(),
            lb_writes: shared.lb_writes.snapshot(),
        }
    }

    /// ACT's histogram block: all-device reads, the one device's reads, then large blocks.
    fn dump(&self, device: &str) -> String {
        let mut s = self.reads.dump("reads");
        s.push_str(&self.reads.dump(&format!("{device}-reads")));
        s.push_str(&self.lb_reads.dump("large-block-reads"));
        s.push_str(&self.lb_writes.dump("large-block-writes"));
        s
    }
}

fn slice_result(
    start: &(u64, Snapshot),
    end_ns: u64,
    now: &Snapshot,
    complete: bool,
    worst_lag: Duration,
) -> SliceResult {
    let judged_on = if worst_lag >= SLIPPED_LAG {
        Judged::Intended
    } else {
        Judged::Service
    };
    let reads = match judged_on {
        Judged::Service => now.reads.since(&start.1.reads),
        Judged::Intended => now.reads_intended.since(&start.1.reads_intended),
    };
    SliceResult {
        start_s: start.0 as f64 / 1e9,
        end_s: end_ns as f64 / 1e9,
        complete,
        reads: act::slice_verdict(&reads),
        judged_on,
        worst_lag,
        lb_reads: act::slice_verdict(&now.lb_reads.since(&start.1.lb_reads)),
        lb_writes: act::slice_verdict(&now.lb_writes.since(&start.1.lb_writes)),
    }
}

/// ACT's log preamble: its configuration and derived rates, in its key: value form.
fn act_log_header(
    spec: &WorkloadSpec,
    device: &str,
    read_rps: u64,
    write_rps: u64,
    d: &Derived,
    report_s: u64,
) -> String {
    let kv = spec.kv.as_ref().expect("a kv spec");
    let mut s = String::from("ACT version 6.6\n");
    let _ = writeln!(s, "(written by virtgap {})\n", env!("CARGO_PKG_VERSION"));
    s.push_str("ACT-STORAGE CONFIGURATION\n");
    let lines = [
        ("device-names", device.to_string()),
        ("num-devices", "1".into()),
        ("service-threads", spec.workers.to_string()),
        ("test-duration-sec", spec.duration.0.as_secs().to_string()),
        ("report-interval-sec", report_s.to_string()),
        ("microsecond-histograms", "no".into()),
        ("read-reqs-per-sec", read_rps.to_string()),
        ("write-reqs-per-sec", write_rps.to_string()),
        ("record-bytes", kv.record_bytes.0.to_string()),
        (
            "record-bytes-range-max",
            kv.record_bytes_max.map_or(0, |m| m.0).to_string(),
        ),
        ("large-block-op-kbytes", (spec.bs.0 / 1024).to_string()),
        ("replication-factor", "1".into()),
        ("update-pct", "0".into()),
        ("defrag-lwm-pct", kv.defrag_lwm_pct.to_string()),
        ("disable-odsync", if kv.dsync { "no" } else { "yes" }.into()),
        ("max-lag-sec", kv.max_lag.0.as_secs().to_string()),
    ];
    for (k, v) in lines {
        let _ = writeln!(s, "{k}: {v}");
    }
    s.push_str("\nDERIVED CONFIGURATION\n");
    let _ = writeln!(
        s,
        "record-stored-bytes: {} ... {}",
        d.record_stored, d.record_stored_max
    );
    let _ = writeln!(s, "internal-read-reqs-per-sec: {}", d.internal_read_rps);
    let _ = writeln!(s, "internal-write-reqs-per-sec: {}", d.internal_write_rps);
    let _ = writeln!(s, "large-block-reads-per-sec: {:.2}", d.lb_reads_per_s);
    let _ = writeln!(s, "large-block-writes-per-sec: {:.2}", d.lb_writes_per_s);
    s.push_str("\nHISTOGRAM NAMES\nreads\n");
    let _ = writeln!(s, "{device}-reads");
    s.push_str("large-block-reads\nlarge-block-writes\n\n");
    s
}

/// What a client thread needs to know of the run, whichever engine it drives.
pub(super) struct ClientContext {
    pub worker: u32,
    /// Client threads (service threads or rings) sharing the schedule.
    pub threads: u32,
    pub keys: u64,
    pub reads_per_s: u64,
    pub writes_per_s: u64,
    pub distribution: crate::spec::Distribution,
    pub seed: u64,
    pub interval_ns: u64,
    pub max_lag: Duration,
    /// Reads in flight per ring (the asynchronous engine only).
    pub qd: u32,
    pub store: Arc<KvStore>,
    pub shared: Arc<Shared>,
    pub stop: Arc<AtomicBool>,
    /// Keep the device reads near the tail for the tail autopsy.
    pub tail_watch: Option<Arc<crate::slow::TailWatch>>,
}

impl ClientContext {
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
    slow: Option<crate::slow::SlowIoKeeper>,
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
            slow: ctx.tail_watch.as_ref().map(|w| {
                crate::slow::SlowIoKeeper::new(
                    Arc::clone(w),
                    ctx.worker,
                    ctx.shared.t0_monotonic_ns,
                )
            }),
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
    pub fn finish(mut self, engine: &str, send_interval: &dyn Fn(IntervalSample)) -> ServiceResult {
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
        }
    }
}

/// One synchronous service thread, as ACT's: client operations on its share of the schedule,
/// one at a time, sleeping until each is due.
fn run_service_thread(
    ctx: &ClientContext,
    send_interval: &dyn Fn(IntervalSample),
) -> Result<ServiceResult, WorkloadError> {
    let worker = ctx.worker;
    let mut ops = ctx.operations();
    let mut scratch = ctx
        .store
        .read_buffer()
        .map_err(|error| WorkloadError::Kv { worker, error })?;
    let sh = &ctx.shared;
    let mut tally = ClientTally::new(ctx);
    let mut now = sh.now_ns();
    loop {
        tally.at(now);
        if ctx.over(now) {
            break;
        }
        let due = ops.next_due_ns();
        if due > now {
            let wait = (due - now).min(sh.end_ns - now).min(50_000_000);
            std::thread::sleep(Duration::from_nanos(wait));
            now = sh.now_ns();
            continue;
        }
        let lag = ops.lag(now);
        if ctx.fell_behind(lag) {
            break;
        }
        let ClientOp { due, write, key } = ops.take(now);
        tally.issued_late_by(lag.as_nanos() as u64);
        let started = sh.now_ns();
        let result = if write {
            ctx.store.put(key).map(|bytes| OpDone {
                service_ns: None,
                bytes,
                offset: None,
            })
        } else {
            ctx.store.get(key, &mut scratch)
        };
        let done = match result {
            Ok(s) => s,
            // Stopping while waiting for space is the end of the run, not a failure.
            Err(KvError::Stopped) => break,
            Err(error) => return Err(WorkloadError::Kv { worker, error }),
        };
        now = sh.now_ns();
        tally.done(write, OpTimes { due, started, now }, done, send_interval);
    }
    Ok(tally.finish("psync", send_interval))
}

/// What one client thread measured: its device reads (reported as a worker) and all of its
/// client operations (for the kv outcome).
pub(super) struct ServiceResult {
    device: RunStats,
    client_read: DirStats,
    client_write: DirStats,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn act_log_matches_its_snapshot() {
        let mut spec = crate::spec::load("kv-act").unwrap().spec;
        spec.workers = 10;
        let kv = spec.kv.clone().unwrap();
        let (r, w) = kv.rates();
        let d = act::derive(&kv.act_load(spec.bs.0));
        let mut log = act_log_header(&spec, "/dev/vdb", r, w, &d, 1);
        let mut snap = Snapshot::default();
        for (ns, n) in [(200_000, 1990), (1_200_000, 9), (5_000_000, 2)] {
            for _ in 0..n {
                snap.reads.record_ns(ns);
            }
        }
        for _ in 0..23 {
            snap.lb_reads.record_ns(900_000);
            snap.lb_writes.record_ns(2_500_000);
        }
        let _ = write!(log, "after 1 sec:\n{}", snap.dump("/dev/vdb"));
        insta::assert_snapshot!("act_log", log);
    }

    #[test]
    fn slices_judge_only_complete_windows() {
        let start = (0, Snapshot::default());
        let mut now = Snapshot::default();
        for _ in 0..100 {
            now.reads.record_ns(100_000);
        }
        now.reads.record_ns(70_000_000);
        let full = slice_result(&start, 60_000_000_000, &now, true, Duration::ZERO);
        assert!(!full.reads.pass, "1% of reads at 64 ms or more fails");
        assert_eq!(full.end_s, 60.0);
        assert_eq!(full.lb_writes.reads, 0);
    }

    #[test]
    fn a_slice_whose_schedule_slipped_is_judged_from_the_scheduled_start() {
        let start = (0, Snapshot::default());
        let mut now = Snapshot::default();
        for _ in 0..1000 {
            // Fast on the device, but started 10 ms late.
            now.reads.record_ns(100_000);
            now.reads_intended.record_ns(10_100_000);
        }
        let held = slice_result(
            &start,
            1_000_000_000,
            &now,
            true,
            Duration::from_micros(200),
        );
        assert_eq!(held.judged_on, Judged::Service);
        assert!(held.reads.pass);
        let slipped = slice_result(&start, 1_000_000_000, &now, true, Duration::from_millis(10));
        assert_eq!(slipped.judged_on, Judged::Intended);
        assert!(
            !slipped.reads.pass,
            "every read 10 ms from its schedule fails"
        );
    }
}
