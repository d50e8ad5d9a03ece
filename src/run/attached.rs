//! An attached run (`record --pid/--cgroup/--comm/--all`): no built-in workload; the probes
//! follow processes already running — a database, a benchmark, a container's cgroup, or every
//! process — until `--duration` ends, Ctrl-C, or the processes are gone. The profile holds
//! the same block stages per device and queue and the same host-wide signals as a workload's,
//! with what was attached (`model::attached`). There is no app latency: what the processes
//! waited for is seen here as their block requests only.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use virtgap_probes::follow::AttachTarget;
use virtgap_probes::model::BlockOp;
use virtgap_probes::{ProbeEvent, ProbeSnapshot};
use virtgap_workloads::stats::RunStats;

use crate::model::attached::{AppLatency, AttachEnd, AttachKind, Attached, AttachedIo};
use crate::model::histogram::Histogram;
use crate::model::host::{Fingerprint, TargetDisks};
use crate::model::interval::Interval;
use crate::model::profile::{Profile, RunInfo, RunRecord, TargetInfo, WorkloadInfo};
use crate::run::assemble::{assemble, ProbeInterval, ProfileInputs};
use crate::run::endpoint::SharedEndpoint;
use crate::run::pipeline::Event;
use crate::run::recorder::unix_ms;
use crate::run::session::{probe_config, start_collector, ProbeChoice};

/// What to attach to and for how long.
#[derive(Clone, Debug)]
pub struct AttachPlan {
    /// None: every process of the host.
    pub target: Option<AttachTarget>,
    pub label: Option<String>,
    pub interval: Duration,
    /// None: until Ctrl-C or the processes are gone.
    pub duration: Option<Duration>,
    pub probes: ProbeChoice,
}

impl AttachPlan {
    fn kind(&self) -> AttachKind {
        match &self.target {
            None => AttachKind::All,
            Some(AttachTarget::Pids(_)) => AttachKind::Pid,
            Some(AttachTarget::Cgroup(_)) => AttachKind::Cgroup,
            Some(AttachTarget::Comm(_)) => AttachKind::Comm,
        }
    }

    /// What was named, as given.
    fn named(&self) -> String {
        match &self.target {
            None => String::new(),
            Some(AttachTarget::Pids(p)) => {
                p.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
            }
            Some(AttachTarget::Cgroup(c)) => c.display().to_string(),
            Some(AttachTarget::Comm(c)) => c.clone(),
        }
    }

    /// In words: "pid 1234 and children", "every process".
    pub fn describe(&self) -> String {
        self.target
            .as_ref()
            .map_or("every process".into(), AttachTarget::describe)
    }
}

/// The processes followed so far and their command lines, bounded.
#[derive(Debug, Default)]
struct Seen {
    pids: BTreeSet<u32>,
    commands: Vec<String>,
}

impl Seen {
    fn add(&mut self, pids: &[u32]) {
        for &pid in pids {
            if self.pids.len() >= Attached::MAX_PIDS || !self.pids.insert(pid) {
                continue;
            }
            if self.commands.len() >= Attached::MAX_COMMANDS {
                continue;
            }
            if let Some(cmd) = command_line(pid).filter(|c| !self.commands.contains(c)) {
                self.commands.push(cmd);
            }
        }
    }
}

/// `/proc/PID/cmdline` as one line (arguments joined by spaces), at most 512 bytes.
fn command_line(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let text: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let mut line = text.join(" ");
    if line.is_empty() {
        return None;
    }
    if line.len() > 512 {
        let cut = (0..=512)
            .rev()
            .find(|&i| line.is_char_boundary(i))
            .unwrap_or(0);
        line.truncate(cut);
        line.push('…');
    }
    Some(line)
}

/// The most intervals an attached run keeps: past it, neighbours merge (as a workload's series
/// does), so memory stays flat however long the run.
const MAX_INTERVALS: usize = 2048;

/// An attached run's interval series, from the probes' intervals alone: each interval's block
/// requests of the followed processes as its I/Os, their app latency (read and write calls and
/// requests) as its latency, and the probed stages and CPU loads as a workload's have.
#[derive(Debug)]
struct AttachedSeries {
    /// The host's hypervisor: each interval keeps its mechanisms' figures.
    hypervisor: virtgap_probes::hypervisor::Hypervisor,
    interval: Duration,
    /// Probe intervals per kept interval (doubles at each coarsening).
    span: u64,
    intervals: Vec<Interval>,
}

impl AttachedSeries {
    fn new(interval: Duration, hypervisor: virtgap_probes::hypervisor::Hypervisor) -> Self {
        Self {
            hypervisor,
            interval,
            span: 1,
            intervals: Vec::new(),
        }
    }

    fn interval_s(&self) -> f64 {
        self.interval.as_secs_f64() * self.span as f64
    }

    fn add(&mut self, cumulative: &ProbeSnapshot, interval: &ProbeSnapshot) {
        let end = cumulative.elapsed_ns;
        let start = end.saturating_sub(interval.elapsed_ns);
        let app = interval
            .app
            .as_ref()
            .map(|a| Histogram::from_kernel(&a.data_latency()));
        let app = app.unwrap_or_default();
        let probes = ProbeInterval::of(interval, None, self.hypervisor);
        let next = Interval {
            index: 0,
            start_s: start as f64 / 1e9,
            end_s: end as f64 / 1e9,
            read_ios: requests(interval, BlockOp::Read),
            write_ios: requests(interval, BlockOp::Write),
            // Request sizes are not measured: the outputs leave bandwidth out for attached runs.
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
        let span_s = self.interval_s();
        match self.intervals.last_mut() {
            // The newest kept interval takes probe intervals until it spans `span` of them.
            Some(last) if self.span > 1 && last.end_s - last.start_s < span_s * 0.99 => {
                last.absorb(&next);
                // Percentiles of a merged interval are not kept (no histogram per interval).
                last.lat_p50_ns = None;
                last.lat_p99_ns = None;
            }
            _ => self.intervals.push(next),
        }
        if self.intervals.len() > MAX_INTERVALS {
            self.coarsen();
        }
        for (k, iv) in self.intervals.iter_mut().enumerate() {
            iv.index = k as u64;
        }
    }

    /// Merges neighbours pairwise: half as many intervals, each twice as long.
    fn coarsen(&mut self) {
        let old = std::mem::take(&mut self.intervals);
        let mut it = old.into_iter();
        while let Some(mut a) = it.next() {
            if let Some(b) = it.next() {
                a.absorb(&b);
                a.lat_p50_ns = None;
                a.lat_p99_ns = None;
            }
            self.intervals.push(a);
        }
        self.span *= 2;
    }
}

/// The probes of a run that follows `plan`'s processes rather than virtgap's own workload:
/// `record`'s and the TUI's attach mode, and `serve`.
pub fn follow_config(plan: &AttachPlan) -> Result<virtgap_probes::ProbeConfig> {
    let mut config = probe_config(&plan.probes, plan.interval)?
        .context("following processes is done by the probes: drop --no-probes")?;
    config.filter_tgid = None;
    config.follow = plan.target.clone();
    // App latency where the kernel shows it: named processes only (every process's system
    // calls would cost every process of the host).
    if plan.probes.families.is_none() && plan.target.is_some() {
        config.families.push(virtgap_probes::Family::App);
    }
    Ok(config)
}

/// What an attached run left: its profile and whether a signal ended it.
#[derive(Debug)]
pub struct AttachedRun {
    pub profile: Profile,
    pub interrupted: bool,
}

/// Attaches, follows until the end, and assembles the profile. `verbose` says on stderr when
/// the probes are attached (from then on every I/O of the processes is counted); `progress`
/// draws a line there each interval.
/// With `metrics` (`--listen`), the probes' totals are served there as they arrive.
pub fn record(
    plan: &AttachPlan,
    stop: &AtomicBool,
    (verbose, progress): (bool, bool),
    metrics: Option<&SharedEndpoint>,
) -> Result<AttachedRun> {
    let mut config = follow_config(plan)?;
    // The tail autopsy's material: slow calls (the app probe) and slow requests of the
    // followed processes, at thresholds that follow their running p99 (every one until it is
    // known).
    let mut tail = AttachedTail::default();
    if config.families.contains(&virtgap_probes::Family::App) {
        config.slow_call_ns = Some(Arc::clone(&tail.call_ns));
        config.slow_request_ns = Some(Arc::clone(&tail.request_ns));
    }
    let started = SystemTime::now();
    let (tx, rx) = mpsc::channel::<Event>();
    let (collector, report) = start_collector(config, plan.interval, &tx, &rx)?;
    drop(tx);
    if let Some(endpoint) = metrics {
        endpoint.follow(crate::run::exporter::ExporterContext::this_host(
            plan.label.as_deref().unwrap_or_default(),
            &plan.describe(),
            &report,
        ));
    }
    // The command lines of what is followed now, read before the line that says the probes are
    // attached: a process held until then may do its I/O and exit at once.
    let mut seen = Seen::default();
    if let Some(target) = &plan.target {
        seen.add(&target.current(std::path::Path::new("/")));
    }
    if verbose {
        say!("probes attached: measuring {}", plan.describe());
    }
    let run_start = Instant::now();
    let mut series = AttachedSeries::new(plan.interval, crate::run::host::this_hypervisor());
    let mut last: Option<ProbeSnapshot> = None;
    let end;
    loop {
        if stop.load(Ordering::Relaxed) {
            end = AttachEnd::Interrupted;
            break;
        }
        if plan.duration.is_some_and(|d| run_start.elapsed() >= d) {
            end = AttachEnd::Duration;
            break;
        }
        let Ok(event) = rx.recv_timeout(Duration::from_millis(100)) else {
            continue;
        };
        let Event::Probe(event) = event else {
            continue;
        };
        let (cumulative, interval) = match event {
            ProbeEvent::Snapshot {
                cumulative,
                interval,
            } => (cumulative, interval),
            other => {
                tail.add(other);
                continue;
            }
        };
        let followed = cumulative.followed.clone();
        if let Some(pids) = &followed {
            seen.add(pids);
        }
        tail.follow(&cumulative);
        if let Some(endpoint) = metrics {
            endpoint.publish(&cumulative);
        }
        series.add(&cumulative, &interval);
        if progress {
            draw_progress(
                run_start.elapsed(),
                plan.duration,
                &interval,
                followed.as_deref(),
            );
        }
        last = Some(*cumulative);
        if followed.is_some_and(|p| p.is_empty()) {
            end = AttachEnd::ProcessesExited;
            break;
        }
    }
    collector.stop();
    // The collector's last snapshot, taken as it stopped, and the last slow records.
    for event in rx.try_iter() {
        match event {
            Event::Probe(ProbeEvent::Snapshot {
                cumulative,
                interval,
            }) => {
                if let Some(pids) = &cumulative.followed {
                    seen.add(pids);
                }
                series.add(&cumulative, &interval);
                last = Some(*cumulative);
            }
            Event::Probe(other) => tail.add(other),
            Event::Workload(_) => {}
        }
    }
    if progress {
        crate::stderr::clear_progress();
    }
    let interrupted = end == AttachEnd::Interrupted;
    let host = Fingerprint {
        label: plan.label.clone(),
        ..Fingerprint::this_host()
    };
    let profile = attached_profile(
        plan,
        AttachedInputs {
            host,
            report,
            started,
            // Cumulative totals: the window is the whole time attached.
            window: last,
            seen,
            series,
            end,
            tail: tail.enabled().then_some(tail),
        },
    );
    Ok(AttachedRun {
        profile,
        interrupted,
    })
}

/// What the assembly of an attached profile takes.
struct AttachedInputs {
    host: Fingerprint,
    report: virtgap_probes::CapabilityReport,
    started: SystemTime,
    /// The probes' totals from attach to the end.
    window: Option<ProbeSnapshot>,
    seen: Seen,
    series: AttachedSeries,
    end: AttachEnd,
    /// The slow calls and requests kept (None: the app probe did not run).
    tail: Option<AttachedTail>,
}

/// The attached tail autopsy's material, bounded, and the thresholds the probes keep it at.
#[derive(Debug)]
struct AttachedTail {
    calls: Vec<virtgap_probes::model::SlowCall>,
    requests: Vec<virtgap_probes::model::SlowRequest>,
    /// Calls at least this long are sent (0, every one, until the first interval's p99).
    call_ns: Arc<AtomicU64>,
    request_ns: Arc<AtomicU64>,
    /// Whether the app probe was asked for calls at all.
    asked: bool,
}

impl Default for AttachedTail {
    fn default() -> Self {
        Self {
            calls: Vec::new(),
            requests: Vec::new(),
            // Every one is kept until the first interval says where the tail is (a process
            // may do all its I/O in less than an interval).
            call_ns: Arc::new(AtomicU64::new(0)),
            request_ns: Arc::new(AtomicU64::new(0)),
            asked: false,
        }
    }
}

impl AttachedTail {
    /// Calls are kept at half the running p99 of the processes' reads and writes, so those
    /// above the run's final p99 are all kept while the estimate wanders; requests at the same
    /// half (as a workload's autopsy keeps them: a slow call whose request was shorter spent
    /// most of its time outside the block layer).
    fn follow(&mut self, total: &ProbeSnapshot) {
        let Some(p99) = total.app.as_ref().and_then(|a| {
            crate::model::histogram::Histogram::from_kernel(&a.data_latency()).percentile_ns(99.0)
        }) else {
            return;
        };
        self.call_ns.store((p99 * 0.5) as u64, Ordering::Relaxed);
        self.request_ns.store((p99 * 0.5) as u64, Ordering::Relaxed);
    }

    fn add(&mut self, event: ProbeEvent) {
        match event {
            ProbeEvent::SlowCalls(calls) => {
                self.asked = true;
                self.calls.extend(calls);
            }
            ProbeEvent::SlowRequests(requests) => self.requests.extend(requests),
            _ => return,
        }
        // Past the bound both keep their later half, so the autopsy covers the later part of
        // the run (its sets then say fewer calls were kept than expected).
        let bound = crate::run::recorder::MAX_TAIL_MATERIAL;
        if self.calls.len() > bound || self.requests.len() > bound {
            fn later_half<T>(v: &mut Vec<T>) {
                v.drain(..v.len() - v.len() / 2);
            }
            later_half(&mut self.calls);
            later_half(&mut self.requests);
        }
    }

    fn enabled(&self) -> bool {
        self.asked
    }

    /// The autopsy of the kept calls (reads and writes: the app stage's) over `stages`.
    fn autopsy(
        &self,
        stages: &crate::model::stages::Stages,
        requests_dropped: u64,
    ) -> Option<crate::model::tail::TailAutopsy> {
        use virtgap_probes::model::AppOp;
        let data: Vec<_> = self.calls.iter().filter(|c| c.op != AppOp::Sync).collect();
        let ios: Vec<virtgap_workloads::slow::SlowIo> = data
            .iter()
            .map(|c| virtgap_workloads::slow::SlowIo {
                offset: 0,
                len: 0,
                write: c.op == AppOp::Write,
                start_ns: c.start_ns,
                end_ns: c.end_ns,
            })
            .collect();
        let tids: Vec<u32> = data.iter().map(|c| c.tid).collect();
        crate::analysis::tail::autopsy(&crate::analysis::tail::TailInputs {
            ios: &ios,
            requests: &self.requests,
            join: crate::analysis::tail::Join::Threads(&tids),
            stages,
            requests_dropped,
        })
    }
}

/// The profile of an attached run: the probes' window assembled as a workload's is, with the
/// attached section in place of a workload's results.
fn attached_profile(plan: &AttachPlan, i: AttachedInputs) -> Profile {
    let window = i.window.as_ref();
    let count = |op| window.map_or(0, |w| requests(w, op));
    let io = AttachedIo {
        read_requests: count(BlockOp::Read),
        write_requests: count(BlockOp::Write),
        flushes: count(BlockOp::Flush),
        mean_in_flight: window.and_then(mean_in_flight),
    };
    // The disks the processes' I/O reached: their stages are the profile's.
    let mut disks = TargetDisks::every_disk(std::path::Path::new("/"));
    let reached: BTreeSet<(u32, u32)> = window
        .and_then(|w| w.block.as_ref())
        .map(|b| {
            b.stages
                .iter()
                .filter(|s| s.hist.count > 0)
                .map(|s| s.dev)
                .collect()
        })
        .unwrap_or_default();
    disks.leaves.retain(|d| reached.contains(&d.dev()));
    let described = plan.describe();
    // Named by --label, else by the program of the first process followed.
    let program = i
        .seen
        .commands
        .first()
        .and_then(|c| c.split_whitespace().next())
        .map(|p| p.rsplit('/').next().unwrap_or(p).to_string());
    let name = plan
        .label
        .clone()
        .or(program)
        .unwrap_or_else(|| "attached".into());
    let seconds = window.map_or(0.0, |w| w.elapsed_ns as f64 / 1e9);
    let stats = RunStats {
        measured_ns: window.map_or(0, |w| w.elapsed_ns),
        ..RunStats::default()
    };
    let now = SystemTime::now();
    let mut profile = assemble(ProfileInputs {
        run: RunInfo {
            tool_version: env!("CARGO_PKG_VERSION").into(),
            command_line: std::env::args().collect(),
            started_unix_ms: unix_ms(i.started),
            ended_unix_ms: unix_ms(now),
            interval_s: i.series.interval_s(),
            requested_interval_s: (i.series.span > 1).then_some(plan.interval.as_secs_f64()),
            max_intervals: (i.series.span > 1).then_some(MAX_INTERVALS as u64),
            complete: i.end != AttachEnd::Interrupted,
        },
        host: i.host,
        workload: WorkloadInfo {
            name,
            origin: format!("attached to {described}"),
            source_text: String::new(),
            effective_spec: String::new(),
            fio_equivalent: None,
        },
        target: TargetInfo {
            description: format!("the disks {described} reached"),
            path: String::new(),
            size_bytes: 0,
            device: None,
            stage_devices: disks.leaves.iter().map(|d| d.name.clone()).collect(),
            device_note: None,
        },
        paced: false,
        stats: &stats,
        intervals: i.series.intervals,
        capabilities: Some(i.report),
        probe_total: window,
        disks: &disks,
        recorder_cpu_pct: None,
        calibration: None,
        stalls: None,
    });
    // App latency: the read and write calls and requests are the app stage (fsyncs are apart).
    let app_kinds = window.and_then(|w| w.app.as_ref());
    if let Some(app) = app_kinds {
        profile.stages.app = Histogram::from_kernel(&app.data_latency());
    }
    let app = app_kinds.map(|a| {
        a.kinds
            .iter()
            .filter(|k| k.latency.count > 0)
            .map(|k| AppLatency {
                via: serde_name(&k.via),
                op: serde_name(&k.op),
                latency: Histogram::from_kernel(&k.latency),
                // io_uring's result is not read; fsyncs move no bytes of their own.
                bytes: (k.via == virtgap_probes::model::AppVia::Syscall
                    && k.op != virtgap_probes::model::AppOp::Sync)
                    .then_some(k.bytes),
            })
            .collect()
    });
    profile.attached = Some(Attached {
        kind: plan.kind(),
        named: plan.named(),
        label: plan.label.clone(),
        pids: i.seen.pids.into_iter().collect(),
        commands: i.seen.commands,
        end: i.end,
        io: io.clone(),
        app,
        io_submits: app_kinds.map_or(0, |a| a.io_submits),
    });
    profile.results.measured_s = seconds;
    // Per-I/O figures (host-wide rates, the hypervisor's mechanisms) are per block request of
    // the attached processes: their I/Os as the kernel saw them.
    for (d, n) in [
        (&mut profile.results.read, io.read_requests),
        (&mut profile.results.write, io.write_requests),
    ] {
        d.ios = n;
        d.iops = if seconds > 0.0 {
            n as f64 / seconds
        } else {
            0.0
        };
    }
    let mut run = RunRecord::of_profile(&profile, 1);
    run.tail = i.tail.as_ref().and_then(|tail| {
        tail.autopsy(
            &profile.stages,
            window.map_or(0, ProbeSnapshot::slow_dropped),
        )
    });
    profile.runs = vec![run];
    profile
}

/// Reads and writes in the block layer at once, on average over `snap`'s window: the time
/// each spent there (queue + device + completion) summed over all of them, over the window.
fn mean_in_flight(snap: &ProbeSnapshot) -> Option<f64> {
    use virtgap_probes::model::BlockStage;
    let block = snap.block.as_ref()?;
    if snap.elapsed_ns == 0 {
        return None;
    }
    let busy_ns: u64 = [
        BlockStage::Queue,
        BlockStage::Device,
        BlockStage::Completion,
    ]
    .into_iter()
    .map(|stage| {
        block
            .stage(None, stage, &[BlockOp::Read, BlockOp::Write])
            .sum_ns
    })
    .sum();
    Some(busy_ns as f64 / snap.elapsed_ns as f64)
}

/// The block requests of operation `op` the probes saw in `snap` (0 without the block probe).
fn requests(snap: &ProbeSnapshot, op: BlockOp) -> u64 {
    snap.block.as_ref().map_or(0, |b| {
        b.stage(None, virtgap_probes::model::BlockStage::Device, &[op])
            .count
    })
}

/// A unit enum's serde name ("io_uring", "read").
fn serde_name(v: &impl serde::Serialize) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn draw_progress(
    elapsed: Duration,
    planned: Option<Duration>,
    interval: &ProbeSnapshot,
    followed: Option<&[u32]>,
) {
    use virtgap_workloads::units;
    let secs = interval.elapsed_ns as f64 / 1e9;
    let of = planned.map_or(String::new(), |d| format!("/{:.0}", d.as_secs_f64()));
    let mut line = format!("[{:>4.0}{of} s]", elapsed.as_secs_f64());
    if let Some(pids) = followed {
        line.push_str(&format!(" {} processes", pids.len()));
    }
    if interval.block.is_some() && secs > 0.0 {
        let n = |op| requests(interval, op) as f64 / secs;
        line.push_str(&format!(
            ", {} reads/s, {} writes/s",
            units::count(n(BlockOp::Read)),
            units::count(n(BlockOp::Write))
        ));
    }
    progress!("{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long attached run keeps at most MAX_INTERVALS intervals, contiguous, each `span`
    /// probe intervals long, with every probe interval's time in them.
    #[test]
    fn a_long_attached_run_keeps_a_bounded_contiguous_series() {
        let mut series = AttachedSeries::new(
            Duration::from_secs(1),
            virtgap_probes::hypervisor::Hypervisor::None,
        );
        let n = 5_000u64;
        for k in 1..=n {
            let cumulative = ProbeSnapshot {
                elapsed_ns: k * 1_000_000_000,
                ..ProbeSnapshot::default()
            };
            let interval = ProbeSnapshot {
                elapsed_ns: 1_000_000_000,
                ..ProbeSnapshot::default()
            };
            series.add(&cumulative, &interval);
        }
        let kept = &series.intervals;
        assert!(kept.len() <= MAX_INTERVALS, "{} kept", kept.len());
        assert_eq!(series.span, 4);
        assert_eq!(series.interval_s(), 4.0);
        assert_eq!(kept[0].start_s, 0.0);
        assert_eq!(kept.last().unwrap().end_s, n as f64);
        for (k, w) in kept.windows(2).enumerate() {
            assert_eq!(w[0].end_s, w[1].start_s, "gap after interval {k}");
            assert_eq!(w[1].index, k as u64 + 1);
        }
    }
}
