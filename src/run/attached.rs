//! An attached run (`record --pid/--cgroup/--comm/--all`): no built-in workload; the probes
//! follow processes already running — a database, a benchmark, a container's cgroup, or every
//! process — until `--duration` ends, Ctrl-C, or the processes are gone. The profile holds
//! the same block stages per device and queue and the same host-wide signals as a workload's,
//! with what was attached (`model::attached`). There is no app latency: what the processes
//! waited for is seen here as their block requests only.
//!
//! The probes are the run's only source: their events go through the one recorder
//! ([`Recorder::attached`]) as a workload run's do. What is kept here is what only attaching
//! has: the processes followed, how the run ended, and the attached section of the profile.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use virtgap_probes::follow::AttachTarget;
use virtgap_probes::model::{BlockOp, DevNum};
use virtgap_probes::{ProbeEvent, ProbeSnapshot};

use crate::model::attached::{AppLatency, AttachEnd, AttachKind, Attached, AttachedIo};
use crate::model::histogram::Histogram;
use crate::model::host::{Fingerprint, TargetDisks};
use crate::model::profile::{Profile, RunRecord, TargetInfo, WorkloadInfo};
use crate::run::endpoint::SharedEndpoint;
use crate::run::pipeline::Event;
use crate::run::recorder::{FollowUntil, Framing, Metrics, Recorder, TailMaterial};
use crate::run::series::block_requests;
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
    /// The disks whose requests count (`--device`; None: every disk).
    pub disks: Option<TargetDisks>,
}

impl AttachPlan {
    /// The plan for `target` (None: every process), `label` and the `--device` names, checked:
    /// the processes named are in this pid namespace and each name is a disk of this host. With
    /// how many processes the target holds now (None: every process).
    pub fn checked(
        (target, label, devices): (Option<AttachTarget>, Option<String>, &[String]),
        interval: Duration,
        duration: Option<Duration>,
        probes: ProbeChoice,
    ) -> Result<(Self, Option<usize>)> {
        let root = std::path::Path::new("/");
        let mut processes = None;
        if let Some(t) = &target {
            virtgap_probes::follow::check_pid_namespace(root)?;
            processes = Some(t.resolve(root)?.len());
        }
        let disks = crate::run::host::named_disks(root, devices).map_err(anyhow::Error::msg)?;
        let plan = Self {
            target,
            label,
            interval,
            duration,
            probes,
            disks,
        };
        Ok((plan, processes))
    }

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
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pids: BTreeSet<u32>,
    commands: Vec<String>,
}

impl Seen {
    /// The processes `plan` names, as they are now (none for every process: they are noted as
    /// the snapshots list them).
    pub fn at_start(plan: &AttachPlan) -> Self {
        let mut seen = Self::default();
        if let Some(target) = &plan.target {
            seen.add(&target.current(std::path::Path::new("/")));
        }
        seen
    }

    /// Notes `pids` (a snapshot's followed processes) and their command lines.
    pub fn add(&mut self, pids: &[u32]) {
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
    let thresholds = TailThresholds::default();
    if config.families.contains(&virtgap_probes::Family::App) {
        config.slow_call_ns = Some(Arc::clone(&thresholds.call_ns));
        config.slow_request_ns = Some(Arc::clone(&thresholds.request_ns));
    }
    let started = SystemTime::now();
    // Before the probes: the recorder's own temporary file is not measured (`--all`).
    let mut recorder = Recorder::attached(
        plan.interval,
        crate::run::host::this_hypervisor(),
        plan.disks.clone(),
    );
    let (tx, rx) = mpsc::channel::<Event>();
    let (collector, report) = start_collector(config, plan.interval, &tx, &rx)?;
    drop(tx);
    if let Some(endpoint) = metrics {
        let label = plan.label.as_deref().unwrap_or_default();
        recorder.serve_metrics(Metrics::new(endpoint, label, &plan.describe()));
    }
    recorder.on_event(Event::Probe(ProbeEvent::Attached(report)));
    // The command lines of what is followed now, read before the line that says the probes are
    // attached: a process held until then may do its I/O and exit at once.
    let mut seen = Seen::at_start(plan);
    if verbose {
        say!("probes attached: measuring {}", plan.describe());
    }
    let since = Instant::now();
    // Beside the recorder: the processes seen, the tail thresholds, the progress line.
    let mut each = |recorder: &Recorder, interval: &ProbeSnapshot, followed: Option<&[u32]>| {
        if let Some(total) = recorder.cumulative() {
            thresholds.follow(total);
        }
        if let Some(pids) = followed {
            seen.add(pids);
        }
        if progress {
            draw_progress(
                since.elapsed(),
                plan.duration,
                (interval, recorder.series().devs()),
                followed,
            );
        }
    };
    let until = FollowUntil {
        stop,
        duration: plan.duration,
        processes_gone: true,
    };
    let end = recorder.follow(&rx, until, &mut each);
    collector.stop();
    let end = end?;
    // The collector's last snapshot, taken as it stopped, and the last slow records.
    for event in rx.try_iter() {
        recorder.take_followed(event, &mut |_, _, followed| {
            if let Some(pids) = followed {
                seen.add(pids);
            }
        });
    }
    if progress {
        crate::stderr::clear_progress();
    }
    let host = Fingerprint {
        label: plan.label.clone(),
        ..crate::run::host::this_host()
    };
    let profile = attached_profile(plan, &recorder, (host, started), seen, end)
        .map_err(anyhow::Error::msg)?;
    Ok(AttachedRun {
        profile,
        interrupted: end == AttachEnd::Interrupted,
    })
}

/// The thresholds the probes keep the attached tail autopsy's material at.
#[derive(Debug)]
struct TailThresholds {
    /// Calls at least this long are sent (0, every one, until the first interval's p99).
    call_ns: Arc<AtomicU64>,
    request_ns: Arc<AtomicU64>,
}

impl Default for TailThresholds {
    fn default() -> Self {
        // Every one is kept until the first interval says where the tail is (a process may do
        // all its I/O in less than an interval).
        Self {
            call_ns: Arc::new(AtomicU64::new(0)),
            request_ns: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl TailThresholds {
    /// Calls are kept at half the running p99 of the processes' reads and writes, so those
    /// above the run's final p99 are all kept while the estimate wanders; requests at the same
    /// half (as a workload's autopsy keeps them: a slow call whose request was shorter spent
    /// most of its time outside the block layer).
    fn follow(&self, total: &ProbeSnapshot) {
        let Some(p99) =
            crate::run::assemble::attached_app_stage(total).and_then(|h| h.percentile_ns(99.0))
        else {
            return;
        };
        self.call_ns.store((p99 * 0.5) as u64, Ordering::Relaxed);
        self.request_ns.store((p99 * 0.5) as u64, Ordering::Relaxed);
    }
}

/// The autopsy of the kept calls (reads and writes: the app stage's) over `stages` (None: the
/// app probe sent no calls).
fn tail_autopsy(
    material: &TailMaterial,
    stages: &crate::model::stages::Stages,
    requests_dropped: u64,
) -> Option<crate::model::tail::TailAutopsy> {
    use virtgap_probes::model::AppOp;
    if !material.calls_asked {
        return None;
    }
    let data: Vec<_> = material
        .calls
        .iter()
        .filter(|c| c.op != AppOp::Sync)
        .collect();
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
        requests: &material.requests,
        join: crate::analysis::tail::Join::Threads(&tids),
        stages,
        requests_dropped,
    })
}

/// The profile of an attached run: the recorder's, framed by what was attached, with the
/// app probe's latency as its app stage and the attached section in place of a workload's
/// results. The live view saves its own the same way.
pub fn attached_profile(
    plan: &AttachPlan,
    recorder: &Recorder,
    (host, started): (Fingerprint, SystemTime),
    seen: Seen,
    end: AttachEnd,
) -> Result<Profile, String> {
    // Cumulative totals: the window is the whole time attached.
    let window = recorder.window();
    let window = window.as_ref();
    let devs = recorder.series().devs();
    let count = |op| window.map_or(0, |w| block_requests(w, op, devs));
    let io = AttachedIo {
        read_requests: count(BlockOp::Read),
        write_requests: count(BlockOp::Write),
        flushes: count(BlockOp::Flush),
        mean_in_flight: window.and_then(|w| mean_in_flight(w, devs)),
    };
    // The disks the processes' I/O reached: their stages are the profile's.
    let mut disks = recorder.disks().clone();
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
    let program = seen
        .commands
        .first()
        .and_then(|c| c.split_whitespace().next())
        .map(|p| p.rsplit('/').next().unwrap_or(p).to_string());
    let name = plan
        .label
        .clone()
        .or(program)
        .unwrap_or_else(|| "attached".into());
    let mut profile = recorder.assemble_profile(Framing {
        started,
        interval: plan.interval,
        complete: end != AttachEnd::Interrupted,
        host,
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
        disks: &disks,
        recorder_cpu_pct: None,
        calibration: None,
        stalls: None,
    })?;
    // App latency: the read and write calls and requests are the app stage (fsyncs are apart).
    let app_kinds = window.and_then(|w| w.app.as_ref());
    if let Some(app) = window.and_then(crate::run::assemble::attached_app_stage) {
        profile.stages.app = app;
    }
    // The processes' CPU time is not measured: none per I/O rather than 0.
    profile.results.cpu_ns_per_io = None;
    profile.attached = Some(Attached {
        kind: plan.kind(),
        named: plan.named(),
        label: plan.label.clone(),
        pids: seen.pids.into_iter().collect(),
        commands: seen.commands,
        end,
        io,
        app: app_kinds.map(app_latency),
        io_submits: app_kinds.map_or(0, |a| a.io_submits),
    });
    let mut run = RunRecord::of_profile(&profile, 1);
    run.tail = tail_autopsy(
        recorder.tail_material(),
        &profile.stages,
        window.map_or(0, ProbeSnapshot::slow_dropped),
    );
    profile.runs = vec![run];
    Ok(profile)
}

/// The followed processes' latency per kind of call (those that made any).
fn app_latency(app: &virtgap_probes::model::AppSnapshot) -> Vec<AppLatency> {
    app.kinds
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
}

/// Reads and writes in the block layer at once, on average over `snap`'s window: the time
/// each spent there (queue + device + completion) summed over all of them, over the window.
fn mean_in_flight(snap: &ProbeSnapshot, devs: Option<&[DevNum]>) -> Option<f64> {
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
            .stage(devs, stage, &[BlockOp::Read, BlockOp::Write])
            .sum_ns
    })
    .sum();
    Some(busy_ns as f64 / snap.elapsed_ns as f64)
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
    (interval, devs): (&ProbeSnapshot, Option<&[DevNum]>),
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
        let n = |op| block_requests(interval, op, devs) as f64 / secs;
        line.push_str(&format!(
            ", {} reads/s, {} writes/s",
            units::count(n(BlockOp::Read)),
            units::count(n(BlockOp::Write))
        ));
    }
    progress!("{line}");
}
