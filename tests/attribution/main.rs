//! Proves the attribution on this machine: record a baseline and a run with a known injected
//! overhead, diff them, and check the diff blames the right stage with the right size.
//!
//! | injected | how | the diff must say |
//! |---|---|---|
//! | block-layer queueing | cgroup v1 blkio read-IOPS throttle below the workload's paced demand, on a partition of a loop disk | queue (≥ 80%, the queue starting at each bio's entry), not device |
//! | slower device | loop device over a file on a FUSE filesystem that delays each read by 5 ms | device, ≈ the delay at QD 1 |
//! | completion path | SCHED_FIFO hog on the CPU that takes the disk IRQ and runs the workload | software (wakeup up), not device |
//! | completion hop | the workload on another CPU than the disk IRQ, rq_affinity 1 then 2 (each completion sent back by IPI) | completion, not device |
//! | nothing (A/A) | 5 + 5 plain runs, interleaved | no significant difference on any row, the hypervisor block's included |
//! | IPIs | rand4k at QD 1 pinned to the disk IRQ's CPU, then to another CPU (completions and wakeups cross CPUs), 5 + 5 runs interleaved | the hypervisor block's IPIs per I/O significantly higher and named as the mechanism that moved; the timer moving less |
//! | slow tail | loop over FUSE delaying one 4 KiB block in 500 by 3 ms, QD 1, 5 + 5 runs | p99.9 of app and device significant, the mean moving far less |
//! | small gap | blkio throttle at 88% of the unthrottled IOPS on a partition of a loop disk, 5 + 5 runs interleaved (10 + 10 if inconclusive) | IOPS and mean latency significant; ≥ 80% of the gap in queue, not device |
//! | storage figures | `iotune` on a loop device over memory, B's reads limited to 60% of A's read IOPS; A, B, B, A, A, B, B, A, one measured run a phase each, the figures judged over the four results a side | read_iops significant, B at or below the limit and more than 20% lower, the phase that moved most; at ±25% read_iops the only significant phase |
//!
//! Needs root (cgroups, mounts, loop devices, BPF). Minutes of recording each, so they are not
//! part of `cargo test`'s default run: `just attribution-check` runs them (CI does too) and
//! prints each experiment's table.
// Test progress, on the harness's stderr: eprintln! is fine here.
#![allow(clippy::disallowed_macros)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

mod common;
use common::root_allowed;
use common::slow_device::{slow_fuse, SlowDevice};
use virtgap_testkit::block::{BlkioGroup, MemoryLoop, PartitionedLoop};

fn scratch() -> tempfile::TempDir {
    common::scratch("vg-attr-")
}

/// The experiments share the disk: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `virtgap record` with `args`, writing the profile to `out`.
fn record(cmd_prefix: &[&str], args: &[&str], out: &Path) {
    let bin = env!("CARGO_BIN_EXE_virtgap");
    let (program, pre) = match cmd_prefix.split_first() {
        Some((p, rest)) => (*p, rest.to_vec()),
        None => (bin, vec![]),
    };
    let mut c = Command::new(program);
    c.args(pre);
    if !cmd_prefix.is_empty() {
        c.arg(bin);
    }
    let res = c
        .args(["record", "--quiet", "--force", "-o"])
        .arg(out)
        .args(args)
        .output()
        .expect("running virtgap record");
    assert!(
        res.status.success(),
        "record {args:?} failed: {}",
        String::from_utf8_lossy(&res.stderr)
    );
}

/// `virtgap diff --json a b`, after printing the human table.
fn diff(name: &str, a: &Path, b: &Path) -> Value {
    diff_runs(name, &[a.to_path_buf()], &[b.to_path_buf()])
}

/// `virtgap diff --json` of host A's profiles against host B's (runs pooled per host).
fn diff_runs(name: &str, a: &[PathBuf], b: &[PathBuf]) -> Value {
    let args = |json: bool| {
        let mut c = diff_command(a, b);
        if json {
            c.arg("--json");
        }
        c
    };
    let table = args(false).output().unwrap();
    eprintln!("=== {name} ===\n{}", String::from_utf8_lossy(&table.stdout));
    let out = args(true).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `virtgap diff` of host A's files against host B's: the first of each side as A and B, the
/// rest pooled with `--with-a`/`--with-b`.
fn diff_command(a: &[PathBuf], b: &[PathBuf]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_virtgap"));
    c.arg("diff").arg(&a[0]).arg(&b[0]);
    for p in &a[1..] {
        c.arg("--with-a").arg(p);
    }
    for p in &b[1..] {
        c.arg("--with-b").arg(p);
    }
    c
}

/// The diff's row of `metric`, by its identifier: a waterfall, throughput or tail row
/// ("app_p99_9").
fn row<'a>(d: &'a Value, metric: &str) -> &'a Value {
    let rows = |section: &str| d[section].as_array().unwrap().iter();
    rows("waterfall")
        .chain(rows("throughput"))
        .chain(rows("tails").map(|t| &t["row"]))
        .find(|r| r["metric"] == metric)
        .unwrap_or_else(|| panic!("no row {metric}"))
}

fn share(d: &Value, metric: &str) -> f64 {
    row(d, metric)["share"].as_f64().unwrap_or(0.0)
}

fn delta(d: &Value, metric: &str) -> f64 {
    row(d, metric)["delta"]
        .as_f64()
        .expect("measured on both hosts")
}

/// Whether the profile's queue stage starts at each bio's entry into the block layer (noted by
/// the hook on `submit_bio_noacct`, or at `block_bio_remap` for a partition's bios).
fn queue_from_bio_entry(profile: &Path) -> bool {
    virtgap::model::file::load(profile)
        .unwrap()
        .queue_start()
        .is_some_and(|q| q.from_bio_entry())
}

/// Throttling holds bios before their requests start, not on the device: on a partition the
/// queue stage starts at each bio's entry (by the hook, or at `block_bio_remap` where it cannot
/// load), so the queue's extra time is the gap. "Is the gap" is judged against the gap's own
/// interval, not a fixed share: the queue's delta is precise (the throttle), but the app delta
/// it is divided by carries every stage's run-to-run noise, so at a 12% gap a fixed 80% share
/// fails on a noisy host while the queue still accounts for the whole gap within its interval.
/// The queue must also be the largest share, and the device take under 20%.
fn assert_gap_in_queue(d: &Value, from_bio_entry: bool) {
    assert!(
        from_bio_entry,
        "the throttled runs' queue stage does not start at the bio's entry on a partition"
    );
    let app = row(d, "app_mean");
    let gap_low = app["ci_low"].as_f64().expect("the app gap's interval");
    let queue = delta(d, "queue_mean");
    assert!(
        queue >= gap_low,
        "the queue's extra {queue:.0} ns is below the gap's interval {app}"
    );
    let largest = [
        "queue_mean",
        "device_mean",
        "completion_mean",
        "software_mean",
    ]
    .into_iter()
    .max_by(|x, y| share(d, x).total_cmp(&share(d, y)))
    .unwrap();
    assert_eq!(
        largest, "queue_mean",
        "the largest share is not the queue's"
    );
    assert!(
        share(d, "device_mean") < 0.2,
        "device took {:.0}%",
        share(d, "device_mean") * 100.0
    );
}

/// The whole disk (major:minor) holding `path`.
fn disk_of(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).unwrap().dev();
    let sys = std::fs::canonicalize(format!(
        "/sys/dev/block/{}:{}",
        libc::major(dev),
        libc::minor(dev)
    ))
    .unwrap();
    let disk = if sys.join("partition").exists() {
        sys.parent().unwrap().to_path_buf()
    } else {
        sys
    };
    std::fs::read_to_string(disk.join("dev"))
        .unwrap()
        .trim()
        .to_string()
}

/// Records `runs` single-run profiles per side, interleaved A B, B A, A B, ... so a drift of the
/// host over the experiment and whatever one run leaves for the next (writeback, caches) fall on
/// both sides alike; returns each side's profile paths.
fn record_interleaved(
    dir: &Path,
    runs: usize,
    a: (&[&str], &[&str]),
    b: (&[&str], &[&str]),
) -> (Vec<PathBuf>, Vec<PathBuf>) {
    record_interleaved_from(dir, 0..runs, a, b)
}

/// `record_interleaved` numbering the runs' files from `runs.start`, to add runs to a side.
fn record_interleaved_from(
    dir: &Path,
    runs: std::ops::Range<usize>,
    a: (&[&str], &[&str]),
    b: (&[&str], &[&str]),
) -> (Vec<PathBuf>, Vec<PathBuf>) {
    record_interleaved_with(dir, runs, a, b, |_| {})
}

/// `record_interleaved_from`, calling `before_b` with host A's runs so far before each B run
/// (the small-gap experiment sets B's throttle from the latest unthrottled run).
fn record_interleaved_with(
    dir: &Path,
    runs: std::ops::Range<usize>,
    a: (&[&str], &[&str]),
    b: (&[&str], &[&str]),
    mut before_b: impl FnMut(&[PathBuf]),
) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let (mut pa, mut pb) = (Vec::new(), Vec::new());
    for k in runs {
        let (fa, fb) = (
            dir.join(format!("a{k}.json")),
            dir.join(format!("b{k}.json")),
        );
        let mut run_b = |pa: &[PathBuf]| {
            before_b(pa);
            record(b.0, b.1, &fb);
        };
        if k % 2 == 0 {
            record(a.0, a.1, &fa);
            pa.push(fa.clone());
            run_b(&pa);
        } else {
            run_b(&pa);
            record(a.0, a.1, &fa);
            pa.push(fa.clone());
        }
        pb.push(fb);
    }
    (pa, pb)
}

#[test]
#[ignore = "experiment: run by `just attribution-check`"]
fn aa_five_plain_runs_a_side_differ_in_nothing_significant() {
    if !root_allowed("A/A attribution experiment") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch();
    let args = [
        "-w",
        "rand4k",
        "--size",
        "256MiB",
        "--duration",
        "4s",
        "--dir",
        dir.path().to_str().unwrap(),
    ];
    let (a, b) = record_interleaved(dir.path(), 5, (&[], &args), (&[], &args));
    let d = diff_runs("A/A: 5 + 5 plain runs, interleaved", &a, &b);
    assert_eq!(d["basis"], "runs");
    for r in d["waterfall"]
        .as_array()
        .unwrap()
        .iter()
        .chain(d["throughput"].as_array().unwrap())
        .chain(d["tails"].as_array().unwrap().iter().map(|t| &t["row"]))
        .chain(d["hypervisor"]["rows"].as_array().unwrap())
    {
        assert_ne!(
            r["verdict"], "significant",
            "A/A run found a difference: {r}"
        );
    }
    assert_eq!(d["verdict"], Value::Null);
}

/// A partition of a loop disk holding 256 MiB of data, for the throttle experiments: a
/// partition's bios are noted where they enter the block layer even where no hook on
/// `submit_bio_noacct` loads (at `block_bio_remap`), so the throttle's wait is queue time.
fn throttle_target(dir: &Path, what: &str) -> Option<PartitionedLoop> {
    virtgap_testkit::ready(what, PartitionedLoop::new(dir, 256 << 20))
}

/// The small-gap experiment's throttle: 88% of an unthrottled rate (a ~12% gap).
fn throttle_at(unthrottled_iops: f64) -> u32 {
    (unthrottled_iops * 0.88) as u32
}

/// Mean IOPS of the runs in the profiles at `paths`.
fn mean_iops(paths: &[PathBuf]) -> f64 {
    let iops: Vec<f64> = paths
        .iter()
        .map(|p| {
            let v: Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
            let r = &v["results"];
            (r["read"]["ios"].as_f64().unwrap() + r["write"]["ios"].as_f64().unwrap())
                / r["measured_s"].as_f64().unwrap()
        })
        .collect();
    iops.iter().sum::<f64>() / iops.len() as f64
}

#[test]
#[ignore = "experiment: run by `just attribution-check`"]
fn a_twelve_percent_throttle_is_found_over_five_runs_a_side() {
    if !root_allowed("small-gap attribution experiment") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch();
    let Some(lo) = throttle_target(dir.path(), "the small-gap experiment") else {
        return;
    };
    let args = [
        "-w",
        "rand4k",
        "--qd",
        "8",
        "--size",
        "256MiB",
        "--duration",
        "4s",
        "--target",
        lo.partition.to_str().unwrap(),
    ];
    // The throttle is 88% of the unthrottled rate, and follows it: this host's IOPS wander by
    // several % between minutes, and a limit fixed from the first runs can leave a 3% gap by
    // the last (or none). So before each throttled run it is reset from the latest unthrottled
    // run (from two warm-up runs before the first).
    let probe: Vec<PathBuf> = (0..2)
        .map(|k| dir.path().join(format!("probe{k}.json")))
        .collect();
    for p in &probe {
        record(&[], &args, p);
    }
    let Some(group) = virtgap_testkit::ready(
        "the small-gap experiment",
        BlkioGroup::new(throttle_at(mean_iops(&probe)), &lo.disk_dev()),
    ) else {
        return;
    };
    let follow = |a_so_far: &[PathBuf]| {
        if let Some(latest) = a_so_far.last() {
            group
                .set_read_iops(throttle_at(mean_iops(std::slice::from_ref(latest))))
                .unwrap();
        }
    };
    let script = group.enter_script();
    let b_cmd: &[&str] = &["sh", "-c", &script];
    let (mut a, mut b) =
        record_interleaved_with(dir.path(), 0..5, (&[], &args), (b_cmd, &args), follow);
    let mut d = diff_runs(
        "small gap: blkio throttle at 88% of the latest unthrottled run's IOPS, 5 + 5 runs",
        &a,
        &b,
    );
    // Even so, a host's noise can leave 5 + 5 runs short: then, as the diff itself advises,
    // five more runs a side.
    let resolved = |d: &Value| {
        row(d, "iops")["verdict"] == "significant" && row(d, "app_mean")["verdict"] == "significant"
    };
    if !resolved(&d) {
        let (a2, b2) =
            record_interleaved_with(dir.path(), 5..10, (&[], &args), (b_cmd, &args), follow);
        a.extend(a2);
        b.extend(b2);
        d = diff_runs(
            "small gap: inconclusive at 5 + 5 runs, now 10 + 10 (throttle at 88%)",
            &a,
            &b,
        );
    }
    assert_eq!(d["basis"], "runs");
    let iops = row(&d, "iops");
    assert_eq!(iops["verdict"], "significant", "{iops}");
    assert!(iops["effect"].as_f64().unwrap() < 0.0, "{iops}");
    assert_eq!(row(&d, "app_mean")["verdict"], "significant");
    assert_gap_in_queue(&d, b.iter().all(|p| queue_from_bio_entry(p)));
}

#[test]
#[ignore = "experiment: run by `just attribution-check`"]
fn blkio_throttling_shows_up_as_queueing_not_device_time() {
    if !root_allowed("blkio attribution experiment") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch();
    let Some(lo) = throttle_target(dir.path(), "the blkio experiment") else {
        return;
    };
    let Some(group) =
        virtgap_testkit::ready("the blkio experiment", BlkioGroup::new(500, &lo.disk_dev()))
    else {
        return;
    };
    // Paced at 1000 IOPS, throttled to 500: requests wait in the throttle, the device does not.
    let args = [
        "-w",
        "rand4k",
        "--rate-iops",
        "1000",
        "--qd",
        "16",
        "--size",
        "256MiB",
        "--duration",
        "6s",
        "--target",
        lo.partition.to_str().unwrap(),
    ];
    let (a, b) = (
        dir.path().join("base.json"),
        dir.path().join("throttled.json"),
    );
    record(&[], &args, &a);
    let script = group.enter_script();
    record(&["sh", "-c", &script], &args, &b);
    let d = diff(
        "block-layer queueing: blkio throttle 500 IOPS under a 1000 IOPS demand",
        &a,
        &b,
    );
    assert_eq!(row(&d, "app_mean")["verdict"], "significant");
    assert_gap_in_queue(&d, queue_from_bio_entry(&b));
}

/// A SCHED_FIFO busy loop pinned to `cpu`, running 2 ms out of every 3.
struct Hog(Child);

impl Hog {
    fn start(cpu: u32) -> Self {
        let script = format!(
            "import os, time\nos.sched_setaffinity(0, {{{cpu}}})\n\
             os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))\n\
             while True:\n    t = time.perf_counter()\n    while time.perf_counter() - t < 0.002: pass\n    time.sleep(0.001)\n"
        );
        let child = Command::new("python3")
            .args(["-c", &script])
            .stdout(Stdio::null())
            .spawn()
            .expect("python3");
        std::thread::sleep(Duration::from_millis(300));
        Self(child)
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The CPU that takes the interrupts of the disk holding `path`.
fn irq_cpu(path: &Path) -> Option<u32> {
    let disk = disk_of(path);
    let sys = std::fs::canonicalize(format!("/sys/dev/block/{disk}")).ok()?;
    let driver = std::fs::canonicalize(sys.join("device"))
        .ok()?
        .file_name()?
        .to_string_lossy()
        .into_owned();
    let interrupts = std::fs::read_to_string("/proc/interrupts").ok()?;
    let irq = interrupts.lines().find_map(|l| {
        let (num, rest) = l.trim_start().split_once(':')?;
        let last = rest.split_whitespace().last()?;
        (last.starts_with(&format!("{driver}-req")) || last.starts_with(&format!("{driver}q1")))
            .then(|| num.trim().to_string())
    })?;
    let list = std::fs::read_to_string(format!("/proc/irq/{irq}/effective_affinity_list")).ok()?;
    list.trim().split([',', '-']).next()?.parse().ok()
}

#[test]
#[ignore = "experiment: run by `just attribution-check`"]
fn a_cpu_hog_on_the_irq_cpu_shows_up_in_the_completion_path() {
    if !root_allowed("CPU-hog attribution experiment") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch();
    let cpu = irq_cpu(dir.path()).unwrap_or(0);
    let cpu_s = cpu.to_string();
    // Twelve one-second batches a side: the hog's bursts spread the batches' means widely,
    // and with six a 3x gap was once left inconclusive.
    let args = [
        "-w",
        "rand4k-qd1",
        "--size",
        "256MiB",
        "--duration",
        "12s",
        "--dir",
        dir.path().to_str().unwrap(),
    ];
    let (a, b) = (dir.path().join("base.json"), dir.path().join("hog.json"));
    record(&["taskset", "-c", &cpu_s], &args, &a);
    {
        let _hog = Hog::start(cpu);
        record(&["taskset", "-c", &cpu_s], &args, &b);
    }
    let d = diff(
        &format!("completion path: SCHED_FIFO hog on CPU {cpu} (disk IRQ and workload)"),
        &a,
        &b,
    );
    assert_eq!(row(&d, "app_mean")["verdict"], "significant");
    let software = share(&d, "software_mean");
    assert!(
        software >= 0.8,
        "only {:.0}% of the gap in software",
        software * 100.0
    );
    assert!(
        share(&d, "device_mean") < 0.2,
        "device took {:.0}%",
        share(&d, "device_mean") * 100.0
    );
    assert!(delta(&d, "wakeup_per_io") > 0.0, "wakeup delay went up");
}

/// A disk's `queue/rq_affinity`, set for an experiment and restored on drop.
struct RqAffinity {
    file: PathBuf,
    was: String,
}

impl RqAffinity {
    fn of(path: &Path) -> Self {
        let sys = std::fs::canonicalize(format!("/sys/dev/block/{}", disk_of(path))).unwrap();
        let file = sys.join("queue/rq_affinity");
        let was = std::fs::read_to_string(&file).unwrap().trim().to_string();
        Self { file, was }
    }

    fn set(&self, value: u32) {
        std::fs::write(&self.file, value.to_string()).unwrap();
    }
}

impl Drop for RqAffinity {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.file, &self.was);
    }
}

#[test]
#[ignore = "experiment: run by `just attribution-check`"]
fn a_completion_sent_to_another_cpu_shows_up_as_completion_not_device() {
    if !root_allowed("completion-hop attribution experiment") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch();
    let irq = irq_cpu(dir.path()).unwrap_or(0);
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let online: Vec<u32> = cpus
        .trim()
        .split(',')
        .flat_map(|part| {
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            lo.parse::<u32>().unwrap_or(0)..=hi.parse::<u32>().unwrap_or(0)
        })
        .collect();
    let Some(other) = online.into_iter().find(|&c| c != irq) else {
        virtgap_testkit::require(
            "the completion-hop experiment",
            Err(format!("one CPU online ({})", cpus.trim())),
        );
        return;
    };
    let other_s = other.to_string();
    let args = [
        "-w",
        "rand4k-qd1",
        "--size",
        "256MiB",
        "--duration",
        "6s",
        "--dir",
        dir.path().to_str().unwrap(),
    ];
    let affinity = RqAffinity::of(dir.path());
    let (a, b) = (dir.path().join("same.json"), dir.path().join("sent.json"));
    // 1: completed where the interrupt came in (CPUs sharing a cache); 2: on the submitter's.
    affinity.set(1);
    record(&["taskset", "-c", &other_s], &args, &a);
    affinity.set(2);
    record(&["taskset", "-c", &other_s], &args, &b);
    drop(affinity);
    let d = diff(
        &format!(
            "completion hop: workload on CPU {other}, disk IRQ on CPU {irq}, rq_affinity 1 vs 2"
        ),
        &a,
        &b,
    );
    let completion = row(&d, "completion_mean");
    assert_eq!(completion["verdict"], "significant", "{completion}");
    let (hop, device) = (delta(&d, "completion_mean"), delta(&d, "device_mean"));
    assert!(hop > 0.0, "the completion stage grew by {hop} ns");
    // Single runs: the device stage's own run-to-run noise is a few µs here.
    assert!(
        device < 0.5 * hop,
        "device grew by {device} ns beside the completion's {hop} ns"
    );
}

#[test]
#[ignore = "experiment: run by `just attribution-check`"]
fn a_slower_device_shows_up_as_device_time_of_the_injected_size() {
    if !root_allowed("slow-device attribution experiment") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch();
    // Large enough that the fixed costs of a FUSE round trip stay well inside the tolerance.
    const DELAY: Duration = Duration::from_millis(5);
    let run = |delay: Duration, out: &Path| -> Result<(), String> {
        let dev = SlowDevice::new(
            &dir.path().join(format!("mnt-{}", delay.as_micros())),
            slow_fuse::SlowDisk::delaying(delay),
        )?;
        record(
            &[],
            &[
                "-w",
                "rand4k-qd1",
                "--target",
                &dev.loop_dev,
                "--size",
                "64MiB",
                "--duration",
                "5s",
            ],
            out,
        );
        Ok(())
    };
    let (a, b) = (dir.path().join("fast.json"), dir.path().join("slow.json"));
    if let Err(why) = run(Duration::ZERO, &a).and_then(|_| run(DELAY, &b)) {
        virtgap_testkit::require(
            "the slow-device experiment (FUSE and loop devices)",
            Err(why),
        );
        return;
    }
    let d = diff(
        "slower device: loop over FUSE, +2 ms per read, QD 1",
        &a,
        &b,
    );
    assert_eq!(row(&d, "app_mean")["verdict"], "significant");
    let device = share(&d, "device_mean");
    assert!(
        device >= 0.8,
        "only {:.0}% of the gap in device",
        device * 100.0
    );
    let injected = DELAY.as_nanos() as f64;
    let measured = delta(&d, "device_mean");
    assert!(
        (measured - injected).abs() <= 0.2 * injected,
        "device time grew by {measured:.0} ns for an injected {injected:.0} ns"
    );
}

#[test]
#[ignore = "experiment: run by `just attribution-check`"]
fn a_slow_tail_is_found_in_the_p999_while_the_mean_barely_moves() {
    if !root_allowed("slow-tail attribution experiment") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch();
    // 0.2% of reads 3 ms slower: beyond the p99, inside the p99.9.
    const DELAY: Duration = Duration::from_millis(3);
    let devices = SlowDevice::new(
        &dir.path().join("mnt-fast"),
        slow_fuse::SlowDisk::delaying(Duration::ZERO),
    )
    .and_then(|fast| {
        SlowDevice::new(
            &dir.path().join("mnt-tail"),
            slow_fuse::SlowDisk::delaying_one_block_in(500, DELAY),
        )
        .map(|tail| (fast, tail))
    });
    let (fast, tail) = match devices {
        Ok(d) => d,
        Err(why) => {
            virtgap_testkit::require("the slow-tail experiment (FUSE and loop devices)", Err(why));
            return;
        }
    };
    let args = |dev: &str| -> Vec<String> {
        [
            "-w",
            "rand4k-qd1",
            "--target",
            dev,
            "--size",
            "64MiB",
            "--duration",
            "3s",
        ]
        .map(String::from)
        .to_vec()
    };
    let (fast_args, tail_args) = (args(&fast.loop_dev), args(&tail.loop_dev));
    fn as_str(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let (a, b) = record_interleaved(
        dir.path(),
        5,
        (&[], &as_str(&fast_args)),
        (&[], &as_str(&tail_args)),
    );
    let d = diff_runs(
        "slow tail: one 4 KiB block in 500 delayed 3 ms, QD 1, 5 + 5 runs",
        &a,
        &b,
    );
    assert_eq!(d["basis"], "runs");
    let app_tail = row(&d, "app_p99_9");
    assert_eq!(app_tail["verdict"], "significant", "{app_tail}");
    let device_tail = row(&d, "device_p99_9");
    assert_eq!(device_tail["verdict"], "significant", "{device_tail}");
    let tail_effect = app_tail["effect"].as_f64().unwrap();
    let mean_effect = row(&d, "app_mean")["effect"].as_f64().unwrap();
    assert!(
        mean_effect < tail_effect / 5.0,
        "the mean moved {:.0}%, the p99.9 {:.0}%",
        mean_effect * 100.0,
        tail_effect * 100.0
    );
    assert!(
        delta(&d, "device_mean") > 0.8 * delta(&d, "app_mean"),
        "the added time is the device's"
    );
    // The tail autopsy, one host: the slow I/Os' excess over the mean I/O is the device's,
    // over the five runs' I/Os above p99.9 together (a run here can have a few I/Os held up
    // in the reaping thread, which the autopsy rightly puts in software).
    let (mut app_excess, mut device_excess) = (0.0, 0.0);
    for path in &b {
        let p: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let set = p["runs"][0]["tail"]["sets"]
            .as_array()
            .and_then(|sets| sets.iter().find(|s| s["percentile"] == 99.9))
            .unwrap_or_else(|| panic!("{}: no p99.9 tail autopsy", path.display()))
            .clone();
        let excess = |stage: &str| {
            set["mean"][stage].as_f64().unwrap() - set["baseline"][stage].as_f64().unwrap()
        };
        let (app, device, ios) = (
            excess("app_ns"),
            excess("device_ns"),
            set["ios"].as_f64().unwrap(),
        );
        eprintln!(
            "{}: {ios} I/Os above p99.9, {} joined; excess {:.0} µs, device {:.0}%",
            path.display(),
            set["joined"],
            app / 1e3,
            device / app * 100.0
        );
        app_excess += app * ios;
        device_excess += device * ios;
    }
    assert!(
        device_excess >= 0.8 * app_excess,
        "the autopsy put {:.0}% of the p99.9 I/Os' excess on device",
        device_excess / app_excess * 100.0
    );
    // The diff's tail waterfall: the gap between the hosts' slowest I/Os is the device's.
    let tail = d["tail_waterfalls"]
        .as_array()
        .and_then(|w| w.iter().find(|t| t["percentile"] == 99.9))
        .expect("a p99.9 tail waterfall");
    let device_share = tail["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["stage"] == "device")
        .and_then(|r| r["share"].as_f64())
        .unwrap();
    assert!(device_share >= 0.8, "device share of the p99.9 gap: {tail}");
    // The chart shows it: at p99.9 the two app curves are drawn at least as far apart as the
    // diff's figure (the charts and the page stay in target/tmp/slow-tail for a reader).
    let charts = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("slow-tail");
    std::fs::create_dir_all(&charts).unwrap();
    let out = diff_command(&a, &b)
        .arg("--svg")
        .arg(&charts)
        .arg("--html")
        .arg(charts.join("report.html"))
        .arg("--overwrite")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(charts.join("percentiles.svg")).unwrap();
    for (stage, metric) in [("app", "app_p99_9"), ("device", "device_p99_9")] {
        let reported = 1.0 + row(&d, metric)["effect"].as_f64().unwrap();
        let drawn = virtgap_testkit::chart::Panel::read(&svg, stage).drawn_ratio(99.9);
        eprintln!("{stage} p99.9: drawn x{drawn:.2} apart, the diff says x{reported:.2}");
        assert!(
            drawn >= reported * 0.995,
            "{stage} p99.9 drawn x{drawn:.3} apart, the diff says x{reported:.3}"
        );
    }
}

/// The CPUs online, from sysfs ("0-1" -> [0, 1]).
fn online_cpus() -> Vec<u32> {
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    cpus.trim()
        .split(',')
        .flat_map(|part| {
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            lo.parse::<u32>().unwrap_or(0)..=hi.parse::<u32>().unwrap_or(0)
        })
        .collect()
}

/// QD-1 reads pinned to the CPU that takes the disk's interrupt complete and wake their thread
/// there; pinned to another CPU, every completion and wakeup crosses CPUs by IPI — on a KVM
/// guest an x2APIC ICR write that exits. The diff's hypervisor block must name IPIs.
#[test]
#[ignore = "experiment: run by `just attribution-check`"]
fn a_workload_away_from_its_irq_cpu_moves_the_hypervisors_ipis() {
    if !root_allowed("IPI hypervisor-mechanism experiment") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch();
    let irq = irq_cpu(dir.path()).unwrap_or(0);
    let Some(other) = online_cpus().into_iter().find(|&c| c != irq) else {
        virtgap_testkit::skip("the IPI experiment", "one CPU online");
        return;
    };
    let (irq_s, other_s) = (irq.to_string(), other.to_string());
    let args = [
        "-w",
        "rand4k-qd1",
        "--size",
        "256MiB",
        "--duration",
        "5s",
        "--dir",
        dir.path().to_str().unwrap(),
    ];
    let (a, b) = record_interleaved(
        dir.path(),
        5,
        (&["taskset", "-c", &irq_s], &args),
        (&["taskset", "-c", &other_s], &args),
    );
    let d = diff_runs(
        &format!("IPIs: rand4k QD 1 on the disk IRQ's CPU {irq} vs on CPU {other}, 5 + 5 runs"),
        &a,
        &b,
    );
    if d["hypervisor"]["b"] == "none" {
        virtgap_testkit::skip("the IPI experiment", "bare metal: IPIs do not exit");
        return;
    }
    let hv = |metric: &str| {
        d["hypervisor"]["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["metric"] == metric)
            .unwrap_or_else(|| panic!("no hypervisor row {metric}: {}", d["hypervisor"]))
            .clone()
    };
    let ipi = hv("ipi_per_io");
    assert_eq!(ipi["verdict"], "significant", "{ipi}");
    assert!(ipi["effect"].as_f64().unwrap() > 0.0, "{ipi}");
    assert_eq!(d["hypervisor"]["moved"], "ipi", "{}", d["hypervisor"]);
    // Timer programmings per second barely change, but crossing CPUs costs IOPS, so per I/O
    // they may rise a little: whatever it says, it moved less than the IPIs.
    let timer = hv("timer_per_io");
    eprintln!("timer programmings per I/O: {}", timer["verdict"]);
    if timer["verdict"] == "significant" {
        assert!(
            timer["effect"].as_f64().unwrap().abs() < ipi["effect"].as_f64().unwrap().abs(),
            "{timer}"
        );
    }
}

/// The figure an iotune result reports for one phase.
fn phase_figure(result: &Path, phase: &str) -> f64 {
    let doc: Value = serde_json::from_slice(&std::fs::read(result).unwrap()).unwrap();
    doc["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["phase"] == phase)
        .and_then(|p| p["figure"].as_f64())
        .unwrap_or_else(|| panic!("{} has no {phase} figure", result.display()))
}

/// `virtgap iotune` on `lo` (writes allowed by its backing file), run behind `prefix` (a shell
/// that enters a blkio group), its result in `out`.
fn iotune(prefix: &[&str], lo: &MemoryLoop, out: &Path) {
    let bin = env!("CARGO_BIN_EXE_virtgap");
    let mut c = match prefix {
        [] => Command::new(bin),
        [program, rest @ ..] => {
            let mut c = Command::new(program);
            c.args(rest).arg(bin);
            c
        }
    };
    c.arg("iotune")
        .arg("--target")
        .arg(&lo.disk)
        .arg("--destroy-data")
        .arg(&lo.backing)
        .args([
            "--size",
            "256MiB",
            "--step",
            "1s",
            "--ramp",
            "300ms",
            "--duration",
            "2s",
        ])
        .args([
            "--runs", "1", "--probes", "block", "--quiet", "--force", "-o",
        ])
        .arg(out);
    let res = c.output().unwrap();
    assert!(
        res.status.success(),
        "iotune failed: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&res.stdout));
}

#[test]
#[ignore = "experiment: run by `just attribution-check`"]
fn an_iotune_diff_finds_a_read_iops_limit_and_only_it() {
    if !root_allowed("iotune throttle experiment") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A device in memory: far from a disk's limits, and steadier than one.
    let Some(lo) = virtgap_testkit::ready(
        "the iotune throttle experiment (a loop device over /dev/shm)",
        MemoryLoop::new(512 << 20),
    ) else {
        return;
    };
    // The results stay in target/tmp/iotune-throttle for a reader.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("iotune-throttle");
    std::fs::create_dir_all(&dir).unwrap();
    let path = |name: &str| dir.join(name);
    // A, B, B, A, A, B, B, A: drift over the experiment weighs on both sides alike, and four
    // results a side are the figures' replicates (each its one measured run).
    iotune(&[], &lo, &path("a0.json"));
    let read_iops = phase_figure(&path("a0.json"), "read_iops");
    let limit = (read_iops * 0.6) as u32;
    // Reads limited to 60% of A's read IOPS: far below it for 4 KiB reads, far above what the
    // 1 MiB sequential reads issue (a few thousand requests a second); writes are not limited.
    let Some(group) = virtgap_testkit::ready(
        "the iotune throttle experiment (a cgroup v1 blkio group)",
        BlkioGroup::new(limit, &lo.disk_dev()),
    ) else {
        return;
    };
    let script = group.enter_script();
    let limited = ["sh", "-c", script.as_str()];
    for (name, prefix) in [
        ("b0", &limited[..]),
        ("b1", &limited[..]),
        ("a1", &[][..]),
        ("a2", &[][..]),
        ("b2", &limited[..]),
        ("b3", &limited[..]),
        ("a3", &[][..]),
    ] {
        iotune(prefix, &lo, &path(&format!("{name}.json")));
    }
    // The injected gap is 40%, judged at a smallest effect of 10%; the figures are judged over
    // the results, so their drift (up to 20% here) is in the intervals.
    let diff = |json: bool, min_effect: &str| {
        let results = |host: &str| {
            (0..4)
                .map(|i| path(&format!("{host}{i}.json")))
                .collect::<Vec<_>>()
        };
        let mut c = diff_command(&results("a"), &results("b"));
        c.args(["--min-effect", min_effect]);
        if json {
            c.arg("--json");
        }
        c.output().unwrap()
    };
    eprintln!(
        "=== iotune: B's reads limited to 60% of A's read IOPS, A B B A A B B A ===\n{}",
        String::from_utf8_lossy(&diff(false, "10%").stdout)
    );
    let out = diff(true, "10%");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["replicates"], "results");
    let phases = d["phases"].as_array().unwrap();
    let effect = |p: &Value| p["effect"].as_f64().unwrap_or(f64::NAN);
    let read_iops = phases
        .iter()
        .find(|p| p["phase"] == "read_iops")
        .expect("read_iops compared");
    assert_eq!(
        read_iops["verdict"], "significant",
        "{}",
        read_iops["verdict_text"]
    );
    let throttled = effect(read_iops);
    // How far below A's mean B lands depends on A's drift and on how closely blk-throttle holds
    // its limit at this rate (B reached 0.44 to 0.62 of A's mean in runs seen), so the bounds
    // are the limit itself: B never above it, and a drop well beyond the noise.
    for b in ["b0.json", "b1.json", "b2.json", "b3.json"] {
        let figure = phase_figure(&path(b), "read_iops");
        assert!(
            figure <= f64::from(limit) * 1.05,
            "{b}: read_iops {figure:.0}/s above the {limit}/s limit"
        );
    }
    assert!(throttled < -0.2, "read_iops: B/A - 1 = {throttled}");
    // The limited phase moved most. The others are not asserted "equivalent" at ±10%: a
    // memory-backed loop device here drifts 10-20% between results minutes apart (host A's
    // read_bandwidth 5.60 then 4.56 GiB/s), so four results a side leave them inconclusive.
    for p in phases.iter().filter(|p| p["phase"] != "read_iops") {
        assert!(
            effect(p).abs() < throttled.abs(),
            "{}: {} moved more than the limited read_iops ({})",
            p["phase"],
            p["verdict_text"],
            read_iops["verdict_text"]
        );
    }
    // At ±25%, beyond that drift, the limit stays significant and nothing else is called
    // (equivalent there in the runs seen; asserted only "not significant", as an interval
    // reaching past ±25% now and then is noise, not a finding).
    let out = diff(true, "25%");
    let d: Value = serde_json::from_slice(&out.stdout).unwrap();
    for p in d["phases"].as_array().unwrap() {
        eprintln!("at ±25%: {}: {}", p["phase"], p["verdict_text"]);
        let limited = p["phase"] == "read_iops";
        assert_eq!(
            p["verdict"] == "significant",
            limited,
            "at ±25%, {}: {}",
            p["phase"],
            p["verdict_text"]
        );
    }
}
