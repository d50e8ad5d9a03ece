//! One run of a workload on a prepared target, with its own probes: the events fed to a
//! recorder until every worker finished, and the run's profile. `record` runs it once per
//! `--runs`, `iotune` once per search step and measurement.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use virtgap_probes::{CapabilityReport, Family, ProbeHandle};
use virtgap_workloads::stats::RunStats;
use virtgap_workloads::{units, RunOptions};

use crate::model::profile::Profile;
use crate::run::endpoint::SharedEndpoint;
use crate::run::pipeline::Event;
use crate::run::prepare::Prepared;
use crate::run::recorder::{RecordPlan, Recorder, RunContext};
use crate::run::series::SeriesPoint;
use crate::run::session::{start_probes, ProbeChoice};

/// What one run of the workload produced: its profile (with its run record, numbered), the
/// workload's statistics, and whether a signal cut it short.
#[derive(Debug)]
pub struct OneRun {
    pub profile: Profile,
    pub stats: RunStats,
    pub interrupted: bool,
}

/// How a run is recorded: its interval, its probes, whether reads are verified, and whether it
/// says what it does on stderr (the ramp, the probes that could not attach, a progress line).
#[derive(Clone, Debug)]
pub struct RunSettings {
    pub interval: Duration,
    pub probes: ProbeChoice,
    pub verify: bool,
    pub verbose: bool,
}

/// Runs the workload once on `prepared` with its own probes, attached for this run only so
/// every run's probe intervals line up with its workload intervals.
pub fn record_one(
    spec: &virtgap_workloads::WorkloadSpec,
    loaded: &virtgap_workloads::LoadedSpec,
    prepared: &Prepared,
    calibration: &Option<crate::model::calibration::Calibration>,
    number: u32,
    settings: &RunSettings,
    metrics: Option<&SharedEndpoint>,
) -> Result<OneRun> {
    let verbose = settings.verbose;
    let stop = &prepared.stop;
    let (tx, rx) = mpsc::channel::<Event>();
    let mut recorder = new_recorder(spec, prepared, settings, metrics);
    // The tail autopsy: the workers (kv's client threads: their device reads) keep their I/Os
    // near the tail, the block probe the requests that took a good part of that.
    let slow_request_ns = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let slow = Some(Arc::clone(&slow_request_ns));
    let collector = attach_probes(&mut recorder, settings, number == 1, slow, (&tx, &rx))?;
    let mut options = RunOptions {
        interval: settings.interval,
        verify_reads: settings.verify,
        ..RunOptions::default()
    };
    if recorder.report().is_some_and(|r| r.attached(Family::Block)) {
        options.tail_watch = Some(virtgap_workloads::slow::TailWatch::new(
            spec.workers,
            Arc::clone(&slow_request_ns),
        ));
    }
    if collector.is_some() {
        if verbose {
            say!("measuring the idle host for a second before the workload starts");
        }
        measure_idle(&mut recorder, &rx, stop, settings.interval);
    }
    let started = std::time::SystemTime::now();
    let cpu_start = virtgap_workloads::stats::CpuTime::of_this_process().total_ns();
    let handle = prepared.start(spec, &options, tx);
    recorder.workload_started(handle.workers());
    if verbose {
        // Where a log (or a script waiting to signal the run) sees measurement begin.
        say!(
            "running {}: {:.1} s ramp, then {:.1} s measured",
            spec.name,
            spec.ramp.0.as_secs_f64(),
            spec.duration.0.as_secs_f64()
        );
    }
    let run_start = Instant::now();
    let progress = verbose && std::io::stderr().is_terminal();
    follow(&mut recorder, &rx, spec, progress);
    handle.join();
    if let Some(c) = collector {
        // One last snapshot arrives before the collector detaches the probes.
        c.stop();
        for ev in rx.try_iter() {
            recorder.on_event(ev);
        }
    }
    recorder.finish();
    if let Some(problem) = recorder.series().spool_problem() {
        say!("warning: the interval series was held in memory: {problem}");
    }
    if progress {
        crate::stderr::clear_progress();
    }
    if let Some(e) = recorder.take_error() {
        return Err(e).context("the workload failed");
    }
    let stats = recorder.stats().clone();
    let run_wall = run_start.elapsed().as_secs_f64();
    let recorder_cpu_ns = recorder_cpu_ns(cpu_start, &stats);
    let interrupted = stop.load(Ordering::Relaxed);
    let cx = RunContext {
        spec,
        loaded,
        target: &prepared.target,
        host: crate::run::host::this_host(),
        interval: settings.interval,
        started,
        calibration: calibration.clone(),
        recorder_cpu_pct: (run_wall > 0.0).then(|| recorder_cpu_ns as f64 / 1e9 / run_wall * 100.0),
        complete: !interrupted,
    };
    let mut profile = recorder
        .profile(&cx, options.tail_watch.is_some())
        .map_err(anyhow::Error::msg)?;
    profile.runs[0].run = number;
    Ok(OneRun {
        profile,
        stats,
        interrupted,
    })
}

/// The run's recorder, serving the metrics endpoint (when there is one) as it goes.
fn new_recorder(
    spec: &virtgap_workloads::WorkloadSpec,
    prepared: &Prepared,
    settings: &RunSettings,
    metrics: Option<&SharedEndpoint>,
) -> Recorder {
    let plan = RecordPlan {
        interval: settings.interval,
        ramp: spec.ramp.0,
        disks: prepared.disks.clone(),
        probed: !settings.probes.no_probes,
        hypervisor: crate::run::host::this_hypervisor(),
    };
    Recorder::of_workload(plan, &spec.name, metrics)
}

/// Attaches the run's probes, their report to `recorder`; what could not attach is said when
/// `verbose` and `first_run`. None: the run has no probes.
fn attach_probes(
    recorder: &mut Recorder,
    settings: &RunSettings,
    first_run: bool,
    slow_request_ns: Option<Arc<std::sync::atomic::AtomicU64>>,
    (tx, rx): (&mpsc::Sender<Event>, &mpsc::Receiver<Event>),
) -> Result<Option<ProbeHandle>> {
    let choice = &settings.probes;
    let Some((handle, report)) = start_probes(choice, settings.interval, slow_request_ns, tx, rx)?
    else {
        return Ok(None);
    };
    if settings.verbose && first_run {
        for line in report_problems(&report) {
            say!("virtgap: {line}");
        }
    }
    recorder.on_event(Event::Probe(virtgap_probes::ProbeEvent::Attached(report)));
    Ok(Some(handle))
}

/// This process's CPU time since `cpu_start` that the workload's threads did not use: the
/// recorder's and the probes' collector's.
fn recorder_cpu_ns(cpu_start: u64, stats: &RunStats) -> u64 {
    virtgap_workloads::stats::CpuTime::of_this_process()
        .total_ns()
        .saturating_sub(cpu_start)
        .saturating_sub(stats.cpu.user_ns + stats.cpu.system_ns)
}

/// The idle host's interval before the workload starts, into `recorder`.
fn measure_idle(
    recorder: &mut Recorder,
    rx: &mpsc::Receiver<Event>,
    stop: &AtomicBool,
    interval: Duration,
) {
    let idle = crate::run::session::wait_for_idle_interval(rx, stop, interval, |ev| {
        recorder.on_event(Event::Probe(ev));
    });
    if let Some((cumulative, interval)) = idle {
        recorder.set_idle(cumulative, interval);
    }
}

/// Feeds the run's events to `recorder` until every worker finished, with a progress line.
fn follow(
    recorder: &mut Recorder,
    rx: &mpsc::Receiver<Event>,
    spec: &virtgap_workloads::WorkloadSpec,
    progress: bool,
) {
    let total = spec.ramp.0 + spec.duration.0;
    let run_start = Instant::now();
    while !recorder.all_finished() {
        match rx.recv_timeout(Duration::from_millis(250)) {
            Ok(ev) => {
                recorder.on_event(ev);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if progress {
            draw_progress(run_start.elapsed(), total, recorder.series().last_point());
        }
    }
}

/// One line per probe family or tracepoint that did not attach.
pub fn report_problems(report: &CapabilityReport) -> Vec<String> {
    let mut lines = Vec::new();
    for f in &report.families {
        if let Some(why) = &f.unavailable {
            // A host without NVMe is not missing anything.
            if f.family != Family::Nvme || !f.watches_nothing_here() {
                lines.push(format!("{} probes unavailable: {why}", f.family.name()));
            }
            continue;
        }
        let failed: Vec<_> = f
            .tracepoints
            .iter()
            .filter(|t| t.attached.is_none())
            .collect();
        // One line per family when every failure has the same reason.
        let same = failed.windows(2).all(|w| w[0].reason == w[1].reason);
        if failed.len() > 1 && same {
            let names: Vec<&str> = failed.iter().map(|t| t.tracepoint.as_str()).collect();
            lines.push(format!(
                "{} probes {} unavailable: {}",
                f.family.name(),
                names.join(", "),
                failed[0].reason.as_deref().unwrap_or("unknown reason")
            ));
            continue;
        }
        for t in failed {
            lines.push(format!(
                "{} probe {} unavailable: {}",
                f.family.name(),
                t.tracepoint,
                t.reason.as_deref().unwrap_or("unknown reason")
            ));
        }
    }
    lines
}

fn draw_progress(elapsed: Duration, total: Duration, last: Option<&SeriesPoint>) {
    let mut line = format!(
        "[{:>4.0}/{:.0} s]",
        elapsed.as_secs_f64().min(total.as_secs_f64()),
        total.as_secs_f64()
    );
    if let Some(p) = last.filter(|p| p.secs() > 0.0) {
        let ios = p.interval.read_ios + p.interval.write_ios;
        line.push_str(&format!(" {} IOPS", units::count(ios as f64 / p.secs())));
        if let Some(p99) = p.interval.lat_p99_ns {
            line.push_str(&format!(", p99 lat {}", units::latency(p99 as f64)));
        }
    }
    progress!("{line}");
}

/// Adds a run's statistics to those of the runs before it: counts and histograms merged, the
/// measured seconds summed (each run measured its own window).
pub fn add_run_stats(pooled: &mut RunStats, run: &RunStats) {
    let seconds = pooled.measured_ns + run.measured_ns;
    pooled.merge(run);
    pooled.measured_ns = seconds;
}

/// Several runs' profiles (one run record each) as one profile keeping every run record, as
/// `record --runs N` writes it; `pooled` is their statistics added up (`add_run_stats`).
pub fn pool_profiles(mut runs: Vec<Profile>, pooled: &RunStats) -> Profile {
    if runs.len() == 1 {
        return runs.remove(0);
    }
    let paced = runs[0].results.max_schedule_lag_ns.is_some();
    let runs = runs
        .into_iter()
        .map(|mut p| {
            let record = p.runs.remove(0);
            (p, record)
        })
        .collect();
    crate::run::assemble::pool_runs(runs, pooled, paced)
}
