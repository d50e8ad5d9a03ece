//! Real O_DIRECT I/O on temp files: reads see the data written there, writes land where they
//! were sent, every engine completes what it was asked, and pacing holds its rate.
// Test progress, on the harness's stderr: eprintln! is fine here.
#![allow(clippy::disallowed_macros)]

use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use virtgap_workloads::engine::AlignedBuffer;
use virtgap_workloads::kv::KvVerdict;
use virtgap_workloads::pattern::{self, FILL_TAG};
use virtgap_workloads::safety::SysRoot;
use virtgap_workloads::spec::{self, ByteSize, EngineKind, Overrides, Pattern, ReadWrite, Span};
use virtgap_workloads::target::{self, Target, TargetChoice, TargetRequest};
use virtgap_workloads::{RunOptions, RunStats, WorkloadEvent, WorkloadSpec};

/// A directory on a disk-backed filesystem (O_DIRECT works there): under the build tree.
fn scratch_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("vg-io-test-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("scratch dir")
}

fn spec_from(preset: &str, o: Overrides) -> WorkloadSpec {
    let mut s = spec::load(preset).unwrap().spec;
    o.apply(&mut s).unwrap();
    s
}

fn open_temp(dir: &std::path::Path, s: &WorkloadSpec) -> Target {
    let req = TargetRequest {
        choice: TargetChoice::TempFile {
            dir: Some(dir.to_path_buf()),
        },
        size: s.size.0,
        size_explicit: true,
        bs: s.bs.0,
        write: !s.is_read_only(),
        direct: s.direct,
        destroy_data: None,
    };
    let t = target::open(&req, &SysRoot::default()).expect("temp target");
    target::fill(&t, &AtomicBool::new(false), |_| {}).expect("fill");
    t
}

fn run(s: &WorkloadSpec, t: &Target, options: RunOptions) -> (RunStats, Vec<WorkloadEvent>) {
    let (tx, rx) = mpsc::channel::<WorkloadEvent>();
    let handle = virtgap_workloads::start(s, t, &options, Arc::new(AtomicBool::new(false)), tx);
    handle.join();
    let events: Vec<WorkloadEvent> = rx.try_iter().collect();
    let mut stats = RunStats::default();
    for ev in &events {
        if let WorkloadEvent::Finished { result, .. } = ev {
            match result {
                Ok(s) => stats.merge(s),
                Err(e) => panic!("worker failed: {e}"),
            }
        }
    }
    (stats, events)
}

fn read_back(t: &Target) -> Vec<pattern::SectorHeader> {
    let mut buf = AlignedBuffer::new(1 << 20, 4096).unwrap();
    let mut headers = Vec::new();
    let mut off = 0u64;
    while off < t.size {
        let len = (t.size - off).min(1 << 20) as usize;
        // SAFETY: buf has at least len bytes and outlives the call.
        let n = unsafe {
            libc::pread(
                t.file.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                len,
                off as libc::off_t,
            )
        };
        assert_eq!(n, len as isize, "read back at {off}");
        headers.extend(pattern::verify(&buf.as_slice()[..len], off).expect("sector headers"));
        off += len as u64;
    }
    headers
}

fn short(o: Overrides) -> Overrides {
    Overrides {
        size: Some(ByteSize(16 << 20)),
        duration: Some(Span(Duration::from_millis(700))),
        ..o
    }
}

#[test]
fn temp_file_is_unlinked_while_open() {
    let dir = scratch_dir();
    let s = spec_from("rand4k", short(Overrides::default()));
    let t = open_temp(dir.path(), &s);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no name left in the dir"
    );
    assert!(t.needs_fill());
}

#[test]
fn random_reads_see_the_written_data() {
    let dir = scratch_dir();
    let s = spec_from("rand4k", short(Overrides::default()));
    let t = open_temp(dir.path(), &s);
    let options = RunOptions {
        verify_reads: true,
        ..RunOptions::default()
    };
    let (stats, _) = run(&s, &t, options);
    assert!(stats.read.ios > 100, "only {} reads", stats.read.ios);
    assert_eq!(stats.write.ios, 0);
    assert_eq!(stats.read.bytes, stats.read.ios * 4096);
    assert_eq!(stats.read.lat.count(), stats.read.ios);
    // Each I/O's lat is its slat plus its clat.
    let sum = stats.read.slat.sum_ns() + stats.read.clat.sum_ns();
    assert_eq!(sum, stats.read.lat.sum_ns());
    assert!(
        stats.engine_features.contains("registered"),
        "{}",
        stats.engine_features
    );
}

#[test]
fn sequential_writes_land_where_they_were_sent() {
    let dir = scratch_dir();
    let s = spec_from(
        "seq1m-write",
        Overrides {
            size: Some(ByteSize(8 << 20)),
            duration: Some(Span(Duration::from_millis(1500))),
            workers: Some(2),
            qd: Some(2),
            ..Default::default()
        },
    );
    let t = open_temp(dir.path(), &s);
    let (stats, _) = run(
        &s,
        &t,
        RunOptions {
            write_tag: 0xabc,
            ..RunOptions::default()
        },
    );
    // 8 MiB over two workers at 1 MiB a write: 1.5 s of writing passes over the file many times.
    assert!(stats.write.ios >= 8, "only {} writes", stats.write.ios);
    let headers = read_back(&t);
    assert!(
        headers.iter().all(|h| h.tag == 0xabc),
        "every sector rewritten by this run"
    );
}

#[test]
fn random_writes_land_where_they_were_sent() {
    let dir = scratch_dir();
    let s = spec_from("rand4k-write", short(Overrides::default()));
    let t = open_temp(dir.path(), &s);
    let (stats, _) = run(
        &s,
        &t,
        RunOptions {
            write_tag: 0x77,
            ..RunOptions::default()
        },
    );
    let headers = read_back(&t);
    // verify() already checked every sector names its own offset; count the rewritten blocks.
    let rewritten = headers.iter().filter(|h| h.tag == 0x77).count() as u64 / 8;
    let filled = headers.iter().filter(|h| h.tag == FILL_TAG).count() as u64 / 8;
    assert!(rewritten > 0);
    assert!(
        rewritten <= stats.write.ios + stats.drained_ios,
        "{rewritten} blocks > writes"
    );
    assert_eq!(rewritten + filled, t.size / 4096);
}

#[test]
fn mixed_workload_splits_reads_and_writes() {
    let dir = scratch_dir();
    let s = spec_from(
        "rand4k-mix",
        short(Overrides {
            rwmix_read: Some(50),
            ..Default::default()
        }),
    );
    let t = open_temp(dir.path(), &s);
    let (stats, _) = run(
        &s,
        &t,
        RunOptions {
            verify_reads: true,
            ..RunOptions::default()
        },
    );
    let total = stats.total_ios() as f64;
    let reads = stats.read.ios as f64 / total;
    assert!((0.4..0.6).contains(&reads), "read share {reads}");
}

#[test]
fn psync_engine_does_one_io_at_a_time() {
    let dir = scratch_dir();
    let s = spec_from(
        "rand4k",
        short(Overrides {
            engine: Some(EngineKind::Psync),
            ..Default::default()
        }),
    );
    let t = open_temp(dir.path(), &s);
    let (stats, _) = run(
        &s,
        &t,
        RunOptions {
            verify_reads: true,
            ..RunOptions::default()
        },
    );
    assert!(stats.read.ios > 10);
    assert_eq!(stats.engine_features, "blocking pread/pwrite");
}

#[test]
fn null_engine_does_no_io_and_keeps_the_schedule() {
    let dir = scratch_dir();
    let s = spec_from(
        "rand4k",
        Overrides {
            engine: Some(EngineKind::Null),
            rate_iops: Some(2_000),
            duration: Some(Span(Duration::from_secs(2))),
            size: Some(ByteSize(1 << 20)),
            ..Default::default()
        },
    );
    let t = open_temp(dir.path(), &s);
    let (stats, events) = run(&s, &t, RunOptions::default());
    // The null engine completes instantly, so the achieved rate is the schedule's.
    let ios = stats.read.ios as f64;
    assert!(
        (ios - 4_000.0).abs() <= 40.0,
        "{ios} I/Os for 2 s at 2000/s"
    );
    assert_eq!(stats.read.lat_intended.count(), stats.read.ios);
    let intervals = events
        .iter()
        .filter(|e| matches!(e, WorkloadEvent::Interval(_)))
        .count();
    assert_eq!(intervals, 2, "one sample per second of a 2 s run");
}

#[test]
fn paced_reads_on_a_real_file_record_intended_latency() {
    let dir = scratch_dir();
    let s = spec_from(
        "rand4k-paced",
        short(Overrides {
            rate_iops: Some(1_000),
            ..Default::default()
        }),
    );
    assert_eq!(s.pattern, Pattern::Random);
    let t = open_temp(dir.path(), &s);
    let (stats, _) = run(&s, &t, RunOptions::default());
    assert!(stats.read.ios > 0);
    assert_eq!(stats.read.lat_intended.count(), stats.read.ios);
    // Intended latency starts at the scheduled time, never after creation.
    assert!(stats.read.lat_intended.sum_ns() >= stats.read.lat.sum_ns());
}

#[test]
fn stop_flag_ends_a_run_early() {
    let dir = scratch_dir();
    let s = spec_from(
        "rand4k",
        Overrides {
            size: Some(ByteSize(16 << 20)),
            ..Default::default()
        },
    );
    assert_eq!(s.duration.0, Duration::from_secs(60));
    let t = open_temp(dir.path(), &s);
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<WorkloadEvent>();
    let started = std::time::Instant::now();
    let handle = virtgap_workloads::start(&s, &t, &RunOptions::default(), Arc::clone(&stop), tx);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    handle.join();
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the stop flag was ignored"
    );
    let finished = rx
        .try_iter()
        .filter(|e| matches!(e, WorkloadEvent::Finished { result: Ok(_), .. }))
        .count();
    assert_eq!(finished, 1);
}

#[test]
fn io_errors_are_reported_not_hidden() {
    // A read past the end of a block-aligned file region fails or comes back short: make the
    // target claim to be larger than the file.
    let dir = scratch_dir();
    let s = spec_from(
        "rand4k",
        short(Overrides {
            rw: Some(ReadWrite::Read),
            ..Default::default()
        }),
    );
    let mut t = open_temp(dir.path(), &s);
    t.file.set_len(4096).unwrap();
    t.size = 16 << 20;
    let (tx, rx) = mpsc::channel::<WorkloadEvent>();
    virtgap_workloads::start(
        &s,
        &t,
        &RunOptions::default(),
        Arc::new(AtomicBool::new(false)),
        tx,
    )
    .join();
    let err = rx
        .try_iter()
        .find_map(|e| match e {
            WorkloadEvent::Finished { result: Err(e), .. } => Some(e.to_string()),
            _ => None,
        })
        .expect("the worker reports the failed read");
    assert!(
        err.contains("transferred only") || err.contains("failed"),
        "{err}"
    );
}

/// Loads a 32 MiB store to half its capacity, then races 4 writers (100k overwrites) against 2
/// readers and the defragmenter, reads every key back, and returns the counters.
fn kv_overwrite_race(
    record_bytes: u64,
    record_bytes_max: u64,
) -> virtgap_workloads::kv::KvCounters {
    use rand::{Rng, SeedableRng};
    use std::sync::atomic::Ordering;
    use virtgap_workloads::kv::{KvConfig, KvStore};

    let dir = scratch_dir();
    let s = spec_from(
        "rand4k-write",
        Overrides {
            size: Some(ByteSize(32 << 20)),
            ..Default::default()
        },
    );
    let t = open_temp(dir.path(), &s);
    let cfg = KvConfig {
        record_bytes,
        record_bytes_max,
        lb_bytes: 128 << 10,
        defrag_lwm_pct: 50,
        dsync: true,
    };
    // Half the capacity in keys: 256 blocks of records of the average size, 50% full.
    let keys = 256 * (128 << 10) / ((record_bytes + record_bytes_max) / 2) / 2;
    let store = KvStore::new(Arc::clone(&t.file), t.size, t.align as usize, cfg, keys).unwrap();
    let readers_done = AtomicBool::new(false);
    std::thread::scope(|sc| {
        store.start_background();
        let writer = sc.spawn(|| store.run_writer(|_, _| {}));
        let defrag = sc.spawn(|| store.run_defrag(|_, _| {}));
        for key in 0..keys {
            store.put(key).unwrap();
        }
        // Two readers race the overwrites and the defragmenter moving records under them.
        let readers: Vec<_> = (0..2u64)
            .map(|r| {
                let (store, done) = (&store, &readers_done);
                sc.spawn(move || {
                    let mut rng = rand::rngs::SmallRng::seed_from_u64(r);
                    let mut buf = store.read_buffer().unwrap();
                    let mut n = 0u64;
                    while !done.load(Ordering::Relaxed) {
                        store.get(rng.random_range(0..keys), &mut buf).unwrap();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        // Four writers, so clients also meet in `seal` while waiting for defrag to free space.
        let writers: Vec<_> = (0..4u64)
            .map(|w| {
                let store = &store;
                sc.spawn(move || {
                    let mut rng = rand::rngs::SmallRng::seed_from_u64(7 + w);
                    for _ in 0..25_000u64 {
                        store.put(rng.random_range(0..keys)).unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        readers_done.store(true, Ordering::Relaxed);
        let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
        store.stop_background();
        writer.join().unwrap().unwrap();
        defrag.join().unwrap().unwrap();
        eprintln!("concurrent reads during overwrites: {reads}");
    });
    let mut buf = store.read_buffer().unwrap();
    for key in 0..keys {
        store.get(key, &mut buf).unwrap_or_else(|e| panic!("{e}"));
    }
    let c = store.counters();
    eprintln!("kv counters after 100k overwrites: {c:?}");
    assert_eq!(c.mismatches, 0);
    assert_eq!(c.puts, keys + 100_000);
    assert!(c.lb_reads > 0 && c.relocated > 0, "defrag ran: {c:?}");
    assert!(
        c.gets > c.buffered_gets,
        "most reads came from the device: {c:?}"
    );
    c
}

#[test]
fn kv_store_returns_every_key_latest_value_after_heavy_overwrite_and_defrag() {
    let c = kv_overwrite_race(1536, 1536);
    // Every large block written was full: the records appended fill exactly lb_writes blocks,
    // bar the one still open (which may itself be full, its write not yet counted).
    let appended = c.puts + c.relocated;
    assert!(
        c.lb_writes * 85 <= appended && appended <= (c.lb_writes + 1) * 85,
        "partly empty blocks were written: {c:?}"
    );
}

#[test]
fn kv_store_with_a_record_size_range_loses_nothing() {
    // Sizes uniform over 512 B..2 KiB: records of different lengths share blocks, and defrag
    // walks them by the length in each header.
    kv_overwrite_race(512, 2048);
}

#[test]
fn kv_store_refuses_records_larger_than_a_block_and_tiny_targets() {
    use virtgap_workloads::kv::{KvConfig, KvStore};
    let dir = scratch_dir();
    let s = spec_from(
        "rand4k-write",
        Overrides {
            size: Some(ByteSize(1 << 20)),
            ..Default::default()
        },
    );
    let t = open_temp(dir.path(), &s);
    let big = KvConfig {
        record_bytes: 200_000,
        record_bytes_max: 200_000,
        lb_bytes: 128 << 10,
        defrag_lwm_pct: 50,
        dsync: false,
    };
    let e = KvStore::new(std::sync::Arc::clone(&t.file), t.size, 512, big, 10).unwrap_err();
    assert!(e.to_string().contains("does not fit"), "{e}");
    let huge_blocks = KvConfig {
        record_bytes: 1536,
        record_bytes_max: 1536,
        lb_bytes: 1 << 20,
        defrag_lwm_pct: 50,
        dsync: false,
    };
    let e = KvStore::new(std::sync::Arc::clone(&t.file), t.size, 512, huge_blocks, 10).unwrap_err();
    assert!(e.to_string().contains("at least 4"), "{e}");
}

/// Runs a kv workload to completion on a temp file and returns its merged statistics.
fn run_kv(dir: &std::path::Path, s: &WorkloadSpec) -> RunStats {
    let t = open_temp(dir, s);
    let stop = Arc::new(AtomicBool::new(false));
    let loaded = virtgap_workloads::kv::prepare(s, &t, &stop, |_| {})
        .unwrap()
        .expect("not interrupted");
    run_loaded_kv(s, &loaded, &t)
}

/// Runs a kv workload on a store already loaded.
fn run_loaded_kv(
    s: &WorkloadSpec,
    loaded: &virtgap_workloads::kv::LoadedStore,
    t: &Target,
) -> RunStats {
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<WorkloadEvent>();
    let options = RunOptions {
        interval: Duration::from_secs(1),
        ..RunOptions::default()
    };
    let handle = virtgap_workloads::kv::start(s, loaded, t, &options, stop, tx);
    let workers = handle.workers();
    handle.join();
    let mut stats = RunStats::default();
    let mut finished = 0;
    for ev in rx.try_iter() {
        if let WorkloadEvent::Finished { result, .. } = ev {
            finished += 1;
            stats.merge(&result.unwrap_or_else(|e| panic!("{e}")));
        }
    }
    assert_eq!(
        workers,
        s.workers + 1,
        "service threads and the large-block stream"
    );
    assert_eq!(finished, workers, "every worker reports");
    stats
}

#[test]
fn kv_rings_hold_their_client_and_large_block_rates_within_two_percent() {
    kv_run_holds_its_rates(EngineKind::IoUring, 6000);
}

#[test]
fn kv_psync_service_threads_hold_their_client_and_large_block_rates_within_two_percent() {
    // Half the rings' load: a synchronous thread per operation in flight costs far more CPU
    // (measured here with another workload running: 6000 + 6000/s fell 9% short).
    kv_run_holds_its_rates(EngineKind::Psync, 3000);
}

/// 1:1 at `per_s` of each per second (at 6000: 141 large-block writes and reads per second,
/// and the 64 MiB store is rewritten about five times in 20 s, so defrag is at its steady
/// state). Lower loads run longer, so the store is rewritten as often: at half the load and the
/// same 20 s, defrag had not settled and large-block reads fell 2.2% short of ACT's rate.
fn kv_run_holds_its_rates(engine: EngineKind, per_s: u64) {
    use virtgap_workloads::kv::spec::{KvOverrides, RecordBytes};
    let dir = scratch_dir();
    let s = spec_from(
        "kv-scylla",
        Overrides {
            engine: Some(engine),
            size: Some(ByteSize(64 << 20)),
            duration: Some(Span(Duration::from_secs(20 * 6000 / per_s))),
            kv: KvOverrides {
                read_rps: Some(per_s),
                write_rps: Some(per_s),
                record_bytes: Some(RecordBytes {
                    min: ByteSize(1536),
                    max: None,
                }),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    let stats = run_kv(dir.path(), &s);
    let kv = stats.kv.as_ref().expect("kv outcome");
    let rates = [
        (
            "client reads",
            kv.rate(kv.client_read.ios),
            kv.read_rps as f64,
        ),
        (
            "client writes",
            kv.rate(kv.client_write.ios),
            kv.write_rps as f64,
        ),
        (
            "large-block reads",
            kv.rate(kv.lb_reads),
            kv.derived.lb_reads_per_s,
        ),
        (
            "large-block writes",
            kv.rate(kv.lb_writes),
            kv.derived.lb_writes_per_s,
        ),
    ];
    for (name, got, want) in rates {
        eprintln!(
            "{name}: {got:.2}/s, target {want:.2}/s ({:+.2}%)",
            (got / want - 1.0) * 100.0
        );
    }
    assert_eq!(kv.counters.mismatches, 0);
    for (name, got, want) in rates {
        // Faster than asked is never right: the schedule is the ceiling.
        assert!(
            got / want <= 1.02,
            "{name}: {got:.2}/s vs target {want:.2}/s"
        );
    }
    let held = rates.iter().all(|(_, got, want)| got / want >= 0.98);
    if held {
        assert!(kv.behind.is_none(), "{:?}", kv.behind);
    } else {
        // The host did not give the generator the CPU for this load (a busy machine: seen
        // beside a CPU hog, client reads 11.6% short; another time the client held and the
        // one large-block thread fell 6% behind). Then what must hold is the run saying so:
        // its verdict is "not delivered", on whichever stream fell short, never a PASS or
        // FAIL of a lighter load.
        let verdict = kv.verdict();
        eprintln!("the load was not delivered on this host; the run says: {verdict:?}");
        assert!(
            matches!(verdict, KvVerdict::NotDelivered { client, large_blocks, ref behind }
                if client < 0.99 || large_blocks < 0.99 || behind.is_some()),
            "rates short of the schedule, yet the verdict is {verdict:?}"
        );
    }
    assert_eq!(kv.slices.len(), 1);
    assert!(
        kv.slices[0].complete && kv.slices[0].reads.reads > if held { per_s * 15 } else { 0 },
        "{:?}",
        kv.slices
    );
    assert!(kv.act_log.contains("after 20 sec:"), "one dump per second");
}

#[test]
fn kv_rings_verify_a_million_reads_with_defrag_running() {
    use virtgap_workloads::kv::spec::KvOverrides;
    let dir = scratch_dir();
    // ACT's mix at 20x on a 64 MiB store: records move under the rings' reads all the time
    // (the store is rewritten every few seconds and defrag relocates what is left), and
    // every read, from the device or a write buffer, is checked against the index.
    let s = spec_from(
        "kv-act",
        Overrides {
            size: Some(ByteSize(64 << 20)),
            duration: Some(Span(Duration::from_secs(10))),
            kv: KvOverrides {
                x: Some(20),
                max_lag: Some(Span(Duration::from_secs(3600))),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    assert_eq!(s.engine, EngineKind::IoUring, "the rings are kv's default");
    let t = open_temp(dir.path(), &s);
    let stop = Arc::new(AtomicBool::new(false));
    let loaded = virtgap_workloads::kv::prepare(&s, &t, &stop, |_| {})
        .unwrap()
        .expect("not interrupted");
    // Runs on the same store until a million reads were checked (a slower host takes more).
    let mut runs = 0;
    let counters = loop {
        let stats = run_loaded_kv(&s, &loaded, &t);
        let kv = stats.kv.as_ref().expect("kv outcome");
        runs += 1;
        assert_eq!(kv.counters.mismatches, 0, "{:?}", kv.counters);
        if kv.counters.gets >= 1_000_000 || runs == 12 {
            break kv.counters.clone();
        }
    };
    eprintln!("after {runs} runs of 10 s: {counters:?}");
    assert!(counters.gets >= 1_000_000, "{counters:?}");
    assert!(
        counters.lb_reads > 0 && counters.relocated > 0,
        "defrag ran: {counters:?}"
    );
    assert!(
        counters.gets > 2 * counters.buffered_gets,
        "most reads went to the device: {counters:?}"
    );
}
