//! `virtgap record` and `virtgap workloads`: load a spec, open the target safely, fill it, run
//! the workload, and print the summary.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use virtgap_workloads::kv::{self, LoadedStore};
use virtgap_workloads::safety::SysRoot;
use virtgap_workloads::spec::{self, PRESETS};
use virtgap_workloads::stats::{IntervalMerger, RunStats};
use virtgap_workloads::target::{self, TargetChoice, TargetError, TargetRequest};
use virtgap_workloads::{units, RunOptions, WorkloadEvent};

use virtgap_probes::{CapabilityReport, Family};

use crate::cli::{RecordArgs, WorkloadsArgs};
use crate::model::host::TargetDisks;
use crate::model::profile::RunRecord;
use crate::render::report;
use crate::run::pipeline::{Event, ProbeResults};
use crate::run::series::{IntervalSeries, SeriesPoint};
use crate::run::session::start_probes;
use crate::run::signals::StopSignals;

pub fn workloads(args: &WorkloadsArgs) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match &args.name {
        Some(name) => {
            let text = spec::preset_text(name)
                .ok_or_else(|| spec::SpecError::UnknownPreset(name.clone()))?;
            out.write_all(text.as_bytes())?;
        }
        None => {
            writeln!(out, "{:<14} DESCRIPTION", "PRESET")?;
            for (name, text) in PRESETS {
                let spec = spec::parse(text, name)?;
                let marker = if *name == spec::DEFAULT_PRESET {
                    " (default)"
                } else {
                    ""
                };
                writeln!(out, "{name:<14} {}{marker}", spec.description)?;
            }
            writeln!(out, "\nPrint one with `virtgap workloads NAME`; run an edited copy with `virtgap record -w FILE.toml`.")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(args: &RecordArgs) -> Result<ExitCode> {
    let loaded = spec::load(&args.workload)?;
    let mut spec = loaded.spec.clone();
    let overrides = args.overrides.to_overrides();
    overrides.apply(&mut spec)?;
    crate::cli::check_interval(&args.interval)?;

    if args.fio_equivalent {
        // The path goes into a shell command as it is: a lossy rendering would name another file.
        let file = match &args.target.target {
            Some(p) => p.to_str().with_context(|| {
                format!(
                    "--fio-equivalent: the --target path {} is not valid UTF-8; name the target by a UTF-8 path (e.g. a symlink to it)",
                    p.display()
                )
            })?,
            None => "FILE",
        };
        let Some(fio) = spec.fio_command(file) else {
            bail!(
                "{} has no fio equivalent: fio cannot run a log-structured key-value store",
                spec.name
            );
        };
        let mut out = std::io::stdout().lock();
        writeln!(out, "{fio}")?;
        out.flush()?;
        return Ok(ExitCode::SUCCESS);
    }

    // Output paths are checked before anything runs, so a bad one costs nothing; none may be a
    // file this run reads, whatever --force says.
    let mut outputs = crate::run::output::Outputs::new(args.force, "pass --force to overwrite it");
    if let Some(file) = crate::run::output::workload_file(&args.workload) {
        outputs.input("the workload file", file);
    }
    if let Some(target) = &args.target.target {
        outputs.input("the --target", target);
    }
    if let Some(path) = &args.output {
        outputs.file("--output", path)?;
    }
    if let Some(dir) = &args.csv {
        outputs.dir("--csv", dir, &crate::render::csv_export::FILES)?;
    }

    let verbose = !args.quiet && !args.json;
    if spec.kv.is_none() && args.act_log.is_some() {
        bail!("--act-log applies only to kv workloads (e.g. -w kv-act)");
    }
    if spec.kv.is_some() && args.verify {
        bail!("--verify is for rand/seq workloads; kv checks every read against its index anyway");
    }
    if let Some(path) = &args.act_log {
        outputs.file("--act-log", path)?;
    }
    let signals = StopSignals::install(true)?;
    let paced = spec.rate_iops.is_some();
    let mut calibration = None;
    // Each run's profile and record; the pooled statistics; the last run, kept for the summary.
    let mut runs: Vec<(crate::model::profile::Profile, RunRecord)> = Vec::new();
    let mut pooled = RunStats::default();
    let mut last: Option<(Prepared, RunOutcome)> = None;
    let mut undelivered_kv = false;
    for number in 1..=args.runs {
        if args.runs > 1 && verbose {
            say!("run {number} of {}", args.runs);
        }
        let Some(prepared) = prepare(
            &spec,
            overrides.size.is_some(),
            &args.target,
            verbose,
            &signals,
        )?
        else {
            break;
        };
        if number == 1 {
            if args.verify && !prepared.target.needs_fill() {
                bail!("--verify needs a temp-file target (only data virtgap wrote can be checked); drop --target or --verify");
            }
            calibration = args.calibrate.then(|| {
                if verbose {
                    say!("calibrating exit-causing operations (a few seconds)…");
                }
                crate::cmd::calibrate::calibrate(1.0)
            });
        }
        // What the probes could not attach is said once, not for every run.
        let outcome = record_one(args, &spec, &prepared, verbose, verbose && number == 1)?;
        let (target, disks) = (&prepared.target, &prepared.disks);
        // Every probed figure in the profile covers the measured window, as the workload's do.
        let window = outcome.probes.window();
        let profile = crate::model::profile::assemble(crate::model::profile::ProfileInputs {
            run: crate::model::profile::RunInfo {
                tool_version: env!("CARGO_PKG_VERSION").into(),
                command_line: std::env::args().collect(),
                started_unix_ms: unix_ms(outcome.started),
                ended_unix_ms: unix_ms(std::time::SystemTime::now()),
                interval_s: outcome.series.point_interval().as_secs_f64(),
                requested_interval_s: (outcome.series.coarsening() > 1)
                    .then_some(args.interval.0.as_secs_f64()),
                max_intervals: (outcome.series.coarsening() > 1)
                    .then_some(outcome.series.max_points() as u64),
                complete: !outcome.interrupted,
            },
            host: crate::model::host::Fingerprint::this_host(),
            workload: crate::model::profile::WorkloadInfo::of(&spec, &loaded, target),
            target: crate::model::profile::TargetInfo::of(target, disks),
            paced,
            stats: &outcome.stats,
            intervals: outcome.points.iter().map(|p| p.interval.clone()).collect(),
            capabilities: outcome.probes.report.clone(),
            probe_total: window.as_ref(),
            disks,
            recorder_cpu_pct: outcome.recorder_cpu_pct,
            calibration: calibration.clone(),
            stalls: Some(outcome.stalls.clone()),
        });
        let mut record = RunRecord::of_profile(&profile, number);
        record.idle = outcome.probes.idle_baseline(disks.devs().as_deref());
        if outcome.slow_ios_kept {
            let dropped = outcome
                .probes
                .cumulative
                .as_ref()
                .map_or(0, |c| c.slow_dropped());
            record.tail = crate::run::autopsy::tail_autopsy(
                &outcome.stats.slow_ios,
                &outcome.probes.slow_requests,
                dropped,
                target,
                disks,
                &record.stages,
            );
        }
        if args.runs > 1 && verbose {
            say!("  {}", run_line(&record));
        }
        runs.push((profile, record));
        let seconds = pooled.measured_ns + outcome.stats.measured_ns;
        pooled.merge(&outcome.stats);
        pooled.measured_ns = seconds;
        if let Some(kv) = outcome.stats.kv.as_deref() {
            use virtgap_workloads::kv::KvVerdict;
            undelivered_kv |= matches!(
                kv.verdict(),
                KvVerdict::NotDelivered { .. } | KvVerdict::Mismatches(_)
            );
        }
        let interrupted = outcome.interrupted;
        last = Some((prepared, outcome));
        if interrupted {
            break;
        }
    }
    // The last run's target (a temp file removed on drop) stays until the reports are out.
    let Some((_prepared, outcome)) = last else {
        // Interrupted while preparing the first run: nothing was measured.
        return Ok(signals.exit_code());
    };
    let run_records: Vec<RunRecord> = runs.iter().map(|(_, r)| r.clone()).collect();
    let (stats, interrupted) = (&outcome.stats, outcome.interrupted);
    // The summary is the last run's, from its own profile: with several runs, a copy taken
    // before they are pooled; with one, the profile itself.
    let last_run = (runs.len() > 1).then(|| {
        let (profile, record) = &runs[runs.len() - 1];
        let mut profile = profile.clone();
        profile.runs = vec![record.clone()];
        profile
    });
    let profile = if runs.len() == 1 {
        let (mut profile, record) = runs.remove(0);
        profile.runs = vec![record];
        profile
    } else {
        crate::model::profile::pool_runs(runs, &pooled, paced)
    };
    let shown = last_run.as_ref().unwrap_or(&profile);
    // The summary first: whatever becomes of the files below, what ran reaches stdout.
    let printed = (|| -> Result<()> {
        let mut out = std::io::stdout().lock();
        if args.json {
            let mut doc = report::json(shown);
            if let (Some(map), Some(tail)) = (
                doc.as_object_mut(),
                run_records.last().and_then(|r| r.tail.as_ref()),
            ) {
                map.insert("tail_autopsy".into(), serde_json::to_value(tail)?);
            }
            if args.runs > 1 {
                if let Some(map) = doc.as_object_mut() {
                    map.insert("runs".into(), serde_json::to_value(&run_records)?);
                }
            }
            serde_json::to_writer_pretty(&mut out, &doc)?;
            writeln!(out)?;
        } else {
            if args.runs > 1 {
                writeln!(
                    out,
                    "(the summary below is the last run's; the runs follow it, and the profile keeps them all)\n"
                )?;
            }
            // Names in the summary come from workload files: shown, never obeyed by the terminal.
            let mut text = Vec::new();
            crate::render::summary::write(&mut text, shown)?;
            if let Some(tail) = run_records.last().and_then(|r| r.tail.as_ref()) {
                report::write_tail(&mut text, tail)?;
            }
            if args.runs > 1 {
                report::write_runs(
                    &mut text,
                    &run_records,
                    crate::analysis::diff::DEFAULT_MIN_EFFECT,
                )?;
            }
            out.write_all(units::printable(&String::from_utf8_lossy(&text)).as_bytes())?;
        }
        out.flush()?;
        Ok(())
    })();
    let mut all_written = true;
    if args.output.is_some() || args.csv.is_some() || args.act_log.is_some() {
        use crate::run::output::Pending;
        let mut profile_json = serde_json::to_vec_pretty(&profile)?;
        profile_json.push(b'\n');
        let csv = args
            .csv
            .as_ref()
            .map(|_| crate::render::csv_export::export(&profile));
        let mut files = Vec::new();
        if let Some(path) = &args.output {
            files.push(Pending {
                flag: "--output",
                path: path.clone(),
                bytes: &profile_json,
            });
        }
        if let (Some(dir), Some(csv)) = (&args.csv, &csv) {
            files.extend(csv.iter().map(|(name, text)| Pending {
                flag: "--csv",
                path: dir.join(name),
                bytes: text.as_bytes(),
            }));
        }
        if let (Some(path), Some(kv)) = (&args.act_log, &stats.kv) {
            files.push(Pending {
                flag: "--act-log",
                path: path.clone(),
                bytes: kv.act_log.as_bytes(),
            });
        }
        // What cannot be written where asked is saved under the temp dir, the profile with it.
        let profile_name = args
            .output
            .as_deref()
            .and_then(std::path::Path::file_name)
            .map_or("profile.json".into(), |n| n.to_string_lossy().into_owned());
        let written = outputs.write_all(&files, (&profile_name, &profile_json));
        all_written = written.iter().all(|&w| w);
        // Every file a flag names was written (and there was one: no ACT log without kv).
        let done = |flag: &str| {
            let mut of_flag = files.iter().zip(&written).filter(|(f, _)| f.flag == flag);
            of_flag.clone().next().is_some() && of_flag.all(|(_, &w)| w)
        };
        let name =
            |path: &std::path::Path| units::printable(&path.display().to_string()).into_owned();
        if verbose {
            if let Some(path) = args.output.as_deref().filter(|_| done("--output")) {
                say!(
                    "wrote profile {} ({})",
                    name(path),
                    units::bytes(profile_json.len() as u64)
                );
            }
            if let Some(dir) = args.csv.as_deref().filter(|_| done("--csv")) {
                say!(
                    "wrote {} CSV files into {}",
                    crate::render::csv_export::FILES.len(),
                    name(dir)
                );
            }
            if let Some(path) = args.act_log.as_deref().filter(|_| done("--act-log")) {
                say!("wrote ACT log {}", name(path));
            }
        }
    }
    printed?;
    if interrupted {
        say!(
            "virtgap: interrupted after {:.1} s of measurement",
            stats.seconds()
        );
        return Ok(signals.exit_code());
    }
    if let Some(kv) = stats.kv.as_deref() {
        if let Some((who, by)) = &kv.behind {
            say!(
                "virtgap: {}; stopped after {:.1} s",
                crate::render::kv_report::behind_text(who, *by),
                stats.seconds()
            );
        }
        use virtgap_workloads::kv::KvVerdict;
        if let KvVerdict::NotDelivered { .. } | KvVerdict::Mismatches(_) = kv.verdict() {
            say!("virtgap: {}", crate::render::kv_report::verdict_text(kv));
        }
    }
    if undelivered_kv || !all_written {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// One run's line in a multi-run recording: its throughput, mean and tail.
fn run_line(r: &RunRecord) -> String {
    let iops = r.iops().unwrap_or(0.0);
    let lat = |p: Option<f64>| p.map_or("-".to_string(), units::latency);
    format!(
        "run {}: {} IOPS over {:.1} s, mean {}, p99 {}, p99.9 {}",
        r.run,
        units::count(iops),
        r.measured_s,
        lat(r.stages.app.mean_ns()),
        lat(r.stages.app.percentile_ns(99.0)),
        lat(r.stages.app.percentile_ns(99.9)),
    )
}

/// What one run of the workload produced.
struct RunOutcome {
    stats: RunStats,
    series: IntervalSeries,
    points: Vec<SeriesPoint>,
    probes: ProbeResults,
    stalls: crate::model::stalls::Stalls,
    interrupted: bool,
    started: std::time::SystemTime,
    recorder_cpu_pct: Option<f64>,
    /// The workers kept their slow I/Os (the block probe attached; not a kv run).
    slow_ios_kept: bool,
}

/// Runs the workload once on `prepared` with its own probes, attached for this run only so
/// every run's probe intervals line up with its workload intervals.
fn record_one(
    args: &RecordArgs,
    spec: &virtgap_workloads::WorkloadSpec,
    prepared: &Prepared,
    verbose: bool,
    warn_probes: bool,
) -> Result<RunOutcome> {
    let (disks, stop) = (&prepared.disks, &prepared.stop);
    let progress = verbose && std::io::stderr().is_terminal();
    // The tail autopsy: the workers (kv's client threads: their device reads) keep their I/Os
    // near the tail, the block probe the requests that took a good part of that.
    let slow_request_ns = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut options = RunOptions {
        interval: args.interval.0,
        verify_reads: args.verify,
        ..RunOptions::default()
    };
    let (tx, rx) = mpsc::channel::<Event>();
    let mut probes =
        ProbeResults::skipping_ramp(IntervalSeries::ramp_intervals(args.interval.0, spec.ramp.0));
    let slow = Some(Arc::clone(&slow_request_ns));
    let collector = match start_probes(&args.probe, args.interval.0, slow, &tx, &rx)? {
        Some((handle, report)) => {
            if report.attached(virtgap_probes::Family::Block) {
                options.tail_watch = Some(virtgap_workloads::slow::TailWatch::new(
                    spec.workers,
                    Arc::clone(&slow_request_ns),
                ));
            }
            if warn_probes {
                for line in report_problems(&report) {
                    say!("virtgap: {line}");
                }
            }
            probes.report = Some(report);
            Some(handle)
        }
        None => None,
    };
    if collector.is_some() {
        if verbose {
            say!("measuring the idle host for a second before the workload starts");
        }
        let idle = crate::run::session::wait_for_idle_interval(&rx, stop, args.interval.0, |ev| {
            probes.add(ev);
        });
        if let Some((cumulative, interval)) = idle {
            probes.set_idle(cumulative, interval);
        }
    }
    let wall_start = std::time::SystemTime::now();
    let cpu_start = virtgap_workloads::stats::CpuTime::of_this_process().total_ns();
    let handle = prepared.start(spec, &options, tx);
    if verbose {
        // Where a log (or a script waiting to signal the run) sees measurement begin.
        say!(
            "running {}: {:.1} s ramp, then {:.1} s measured",
            spec.name,
            spec.ramp.0.as_secs_f64(),
            spec.duration.0.as_secs_f64()
        );
    }

    let total = spec.ramp.0 + spec.duration.0;
    let mut merger = IntervalMerger::new(handle.workers());
    let mut series = IntervalSeries::new(
        args.interval.0,
        spec.ramp.0,
        disks.devs(),
        collector.is_some(),
    );
    let mut stats = RunStats::default();
    let mut errors = Vec::new();
    let mut finished = 0;
    let mut features = String::new();
    let run_start = Instant::now();
    while finished < handle.workers() {
        let event = match rx.recv_timeout(Duration::from_millis(250)) {
            Ok(ev) => ev,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if progress {
                    draw_progress(run_start.elapsed(), total, series.last_point());
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        let event = match event {
            Event::Workload(ev) => ev,
            Event::Probe(ev) => {
                if let Some(interval) = probes.add(ev) {
                    series.add_probe(&interval);
                }
                continue;
            }
        };
        match event {
            WorkloadEvent::Started { engine_features } => features = engine_features,
            WorkloadEvent::Interval(sample) => {
                for s in merger.add(sample) {
                    series.add_sample(s);
                }
            }
            WorkloadEvent::Finished { worker, result } => {
                finished += 1;
                for s in merger.worker_finished(worker) {
                    series.add_sample(s);
                }
                match result {
                    Ok(s) => stats.merge(&s),
                    Err(e) => errors.push(e),
                }
            }
        }
        if progress {
            draw_progress(run_start.elapsed(), total, series.last_point());
        }
    }
    handle.join();
    if let Some(c) = collector {
        // One last snapshot arrives before the collector detaches the probes.
        c.stop();
        for ev in rx.try_iter() {
            if let Event::Probe(ev) = ev {
                if let Some(interval) = probes.add(ev) {
                    series.add_probe(&interval);
                }
            }
        }
    }
    series.finish();
    let points = series
        .points()
        .context("reading back the run's interval series")?;
    if let Some(problem) = series.spool_problem() {
        say!("warning: the interval series was held in memory: {problem}");
    }
    let run_wall = run_start.elapsed().as_secs_f64();
    let recorder_cpu_ns = virtgap_workloads::stats::CpuTime::of_this_process()
        .total_ns()
        .saturating_sub(cpu_start)
        .saturating_sub(stats.cpu.user_ns + stats.cpu.system_ns);
    if progress {
        crate::stderr::clear_progress();
    }
    if let Some(e) = errors.into_iter().next() {
        return Err(e).context("the workload failed");
    }
    if stats.engine_features.is_empty() {
        stats.engine_features = features;
    }
    let stalls = series.stall_log().stalls(
        &[&stats.read.lat, &stats.write.lat],
        probes.cumulative.as_ref().and_then(|c| c.block.as_ref()),
    );
    Ok(RunOutcome {
        interrupted: stop.load(Ordering::Relaxed),
        stats,
        series,
        points,
        probes,
        stalls,
        slow_ios_kept: options.tail_watch.is_some(),
        started: wall_start,
        recorder_cpu_pct: (run_wall > 0.0).then(|| recorder_cpu_ns as f64 / 1e9 / run_wall * 100.0),
    })
}

/// A target ready for the workload, and the flag that stops it.
#[derive(Debug)]
pub struct Prepared {
    pub target: virtgap_workloads::Target,
    /// The disks whose block stages are the target's.
    pub disks: TargetDisks,
    pub stop: Arc<AtomicBool>,
    /// The loaded store of a kv workload.
    pub kv: Option<LoadedStore>,
}

impl Prepared {
    /// Starts the workload's threads: the kv store's, or the generic workers.
    pub fn start<T>(
        &self,
        spec: &virtgap_workloads::WorkloadSpec,
        options: &RunOptions,
        tx: mpsc::Sender<T>,
    ) -> virtgap_workloads::RunHandle
    where
        T: From<WorkloadEvent> + Send + 'static,
    {
        let stop = Arc::clone(&self.stop);
        match &self.kv {
            Some(store) => kv::start(spec, store, &self.target, options, stop, tx),
            None => virtgap_workloads::start(spec, &self.target, options, stop, tx),
        }
    }
}

/// Opens the target with every safety check, and fills a temp file (with a progress line on a
/// terminal when `verbose`). None: interrupted while filling.
/// Refuses a workload whose buffers alone would take more than half the memory this process
/// may use — the host's available memory, or less under a memory cgroup's limit: such a run
/// would swap or be killed mid-way (by a cgroup's limit, silently) rather than measure anything.
fn check_memory(spec: &virtgap_workloads::WorkloadSpec) -> Result<()> {
    let need = spec.worker_memory_bytes();
    let Some(budget) = mem_available() else {
        return Ok(());
    };
    if need > budget.bytes / 2 {
        let (whose, fix) = match budget.limited_by {
            virtgap_workloads::memory::Limit::Host => ("this host has available".to_string(), ""),
            ref cgroup => (
                format!("this process may use under {cgroup}"),
                ", or raise the cgroup's limit",
            ),
        };
        bail!(
            "the workload's buffers need about {} ({} workers x qd {} x {} bs), over half of the {} {whose}; lower --workers, --qd or --bs{fix}",
            units::bytes(need),
            spec.workers,
            spec.qd,
            units::bytes(spec.bs.0),
            units::bytes(budget.bytes),
        );
    }
    Ok(())
}

/// What this process may still allocate: the host's MemAvailable or its memory cgroup's room,
/// the smaller.
fn mem_available() -> Option<virtgap_workloads::memory::MemoryBudget> {
    virtgap_workloads::memory::available(std::path::Path::new("/"))
}

pub fn prepare(
    spec: &virtgap_workloads::WorkloadSpec,
    size_explicit: bool,
    target_args: &crate::cli::TargetArgs,
    verbose: bool,
    signals: &StopSignals,
) -> Result<Option<Prepared>> {
    let stop = Arc::clone(&signals.stop);
    check_memory(spec)?;
    let choice = match &target_args.target {
        Some(p) => TargetChoice::Path(p.clone()),
        None => TargetChoice::TempFile {
            dir: target_args.dir.clone(),
        },
    };
    if target_args.destroy_data.is_some() && target_args.target.is_none() {
        bail!("--destroy-data only applies to an existing --target");
    }
    let req = TargetRequest {
        choice,
        size: spec.size.0,
        size_explicit,
        bs: spec.bs.0,
        write: !spec.is_read_only(),
        direct: spec.direct,
        destroy_data: target_args.destroy_data.clone(),
    };
    let target = target::open(&req, &SysRoot::default())?;
    if let Some(w) = &target.warning {
        say!("virtgap: warning: {w}");
    }
    let disks = target_disks(&target);
    if let Some(note) = &disks.note {
        if verbose || disks.leaves.is_empty() {
            say!("virtgap: {note}");
        }
    }
    let progress = verbose && std::io::stderr().is_terminal();

    if spec.kv.is_some() {
        return Ok(
            load_kv_store(spec, &target, &stop, verbose)?.map(|store| Prepared {
                target,
                disks,
                stop,
                kv: Some(store),
            }),
        );
    }
    if target.needs_fill() {
        if verbose && !progress {
            // Without a terminal for the progress line, a log still sees the phase begin.
            say!("preparing {}…", target.describe());
        }
        let started = Instant::now();
        let mut last_draw = Instant::now();
        let result = target::fill(&target, &stop, |done| {
            if progress && last_draw.elapsed() >= Duration::from_millis(200) {
                last_draw = Instant::now();
                progress!(
                    "preparing {}: {} of {} written",
                    target.describe(),
                    units::bytes(done),
                    units::bytes(target.size)
                );
            }
        });
        if progress {
            crate::stderr::clear_progress();
        }
        match result {
            Ok(()) => {}
            Err(TargetError::Interrupted) => {
                say!("virtgap: interrupted while preparing the temp file; nothing measured");
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
        if verbose {
            say!(
                "prepared {} in {:.1} s",
                target.describe(),
                started.elapsed().as_secs_f64()
            );
        }
    }

    Ok(Some(Prepared {
        target,
        disks,
        stop,
        kv: None,
    }))
}

/// Loads and ages the kv store before anything is measured (progress on a terminal).
/// None: interrupted.
fn load_kv_store(
    spec: &virtgap_workloads::WorkloadSpec,
    target: &virtgap_workloads::Target,
    stop: &AtomicBool,
    verbose: bool,
) -> Result<Option<LoadedStore>> {
    let progress = verbose && std::io::stderr().is_terminal();
    if verbose && !progress {
        say!("loading the kv store on {}…", target.describe());
    }
    let mut last_draw = Instant::now();
    let loaded = kv::prepare(spec, target, stop, |p| {
        if progress && last_draw.elapsed() >= Duration::from_millis(200) {
            last_draw = Instant::now();
            progress!(
                "{} the kv store on {}: {:.0}%",
                p.phase,
                target.describe(),
                100.0 * p.done as f64 / p.total.max(1) as f64
            );
        }
    });
    if progress {
        crate::stderr::clear_progress();
    }
    let Some(loaded) = loaded.context("loading the kv store")? else {
        say!("virtgap: interrupted while loading the kv store; nothing measured");
        return Ok(None);
    };
    if verbose {
        say!(
            "loaded {} keys into {} and aged them with {} overwrites in {:.1} s",
            loaded.keys,
            target.describe(),
            loaded.aging_overwrites,
            loaded.seconds
        );
    }
    Ok(Some(loaded))
}

pub(crate) fn unix_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The whole disk (major, minor) that holds the target.
/// The disks whose block stages are the target's I/O (through md, dm or NVMe multipath).
fn target_disks(target: &virtgap_workloads::Target) -> TargetDisks {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(meta) = target.file.metadata() else {
        return TargetDisks::default();
    };
    let dev = if meta.file_type().is_block_device() {
        meta.rdev()
    } else {
        meta.dev()
    };
    TargetDisks::resolve(
        std::path::Path::new("/"),
        (libc::major(dev), libc::minor(dev)),
    )
}

/// One line per probe family or tracepoint that did not attach.
fn report_problems(report: &CapabilityReport) -> Vec<String> {
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
