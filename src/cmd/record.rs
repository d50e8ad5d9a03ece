//! `virtgap record` and `virtgap workloads`: load a spec, open the target safely, fill it, run
//! the workload, and print the summary.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use virtgap_workloads::spec::{self, PRESETS};
use virtgap_workloads::stats::RunStats;
use virtgap_workloads::units;

use crate::cli::{RecordArgs, WorkloadsArgs};
use crate::model::kv::KvOutcome;
use crate::model::profile::{Profile, RunRecord};
use crate::render::report;
use crate::run::endpoint::SharedEndpoint;
use crate::run::one_run::{add_run_stats, pool_profiles, record_one, report_problems, RunSettings};
use crate::run::prepare::{prepare, Prepared};
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
    if args.attach.any() {
        return record_attached(args);
    }
    args.attach.check_no_devices()?;
    let loaded = spec::load(&args.workload)?;
    let mut spec = loaded.spec.clone();
    let overrides = args.overrides.to_overrides();
    overrides.apply(&mut spec)?;
    crate::cli::check_interval(&args.interval)?;
    if args.fio_equivalent {
        return print_fio_equivalent(args, &spec, overrides.size.is_some());
    }
    if args.runs_share_duration() {
        // The default runs share the workload's measured time; each keeps its own ramp.
        spec.duration = virtgap_workloads::values::Span(spec.duration.0 / args.runs());
    }
    let outputs = check_outputs(args, &spec)?;
    if args.listen.is_some() && args.probe.no_probes {
        bail!("--listen serves what the probes measure: drop --no-probes or --listen");
    }
    let metrics = crate::run::endpoint::listen(args.listen)?;
    let signals = StopSignals::install(true)?;
    let verbose = !args.quiet && !args.json;
    if verbose {
        if let Some(m) = &metrics {
            let addr = m.local_addr();
            say!("serving the probes' metrics at http://{addr}/metrics while the run lasts");
        }
    }
    let Some(recorded) = record_runs(
        args,
        &spec,
        &loaded,
        overrides.size.is_some(),
        verbose,
        &signals,
        metrics.as_ref(),
    )?
    else {
        // Interrupted while preparing the first run: nothing was measured.
        return Ok(signals.exit_code());
    };
    report(args, recorded, outputs, verbose, &signals)
}

/// The first flag given that applies only to a built-in workload.
fn workload_flag(args: &RecordArgs) -> Option<&'static str> {
    let given = |set: bool, flag: &'static str| set.then_some(flag);
    args.overrides
        .workload_flag()
        .or(given(args.workload != spec::DEFAULT_PRESET, "--workload"))
        .or(args.target.given())
        .or(given(args.verify, "--verify"))
        .or(given(args.runs.is_some(), "--runs"))
        .or(given(args.calibrate, "--calibrate"))
        .or(given(args.act_log.is_some(), "--act-log"))
        .or(given(args.fio_equivalent, "--fio-equivalent"))
}

/// `record --pid/--cgroup/--comm/--all`: the probes on processes already running, no workload.
fn record_attached(args: &RecordArgs) -> Result<ExitCode> {
    let a = &args.attach;
    if let Some(flag) = workload_flag(args) {
        bail!("{flag} is for a built-in workload, and --pid, --cgroup, --comm and --all measure processes already running: drop one or the other");
    }
    if args.probe.no_probes {
        bail!(
            "--pid, --cgroup, --comm and --all measure processes with the probes: drop --no-probes"
        );
    }
    crate::cli::check_interval(&args.interval)?;
    let (plan, processes) = a.plan(
        args.interval.0,
        args.overrides.duration.as_ref().map(|d| d.value.0),
        args.probe.choice(),
    )?;
    let mut outputs = crate::run::output::Outputs::new(args.force, "pass --force to overwrite it");
    profile_outputs(args, &mut outputs)?;
    let signals = StopSignals::install(true)?;
    let verbose = !args.quiet && !args.json;
    if verbose {
        let count = processes.map_or(String::new(), |n| {
            format!(" ({n} process{} now)", if n == 1 { "" } else { "es" })
        });
        let until = plan
            .duration
            .map_or("until Ctrl-C or they exit".to_string(), |d| {
                format!("for {:.0} s", d.as_secs_f64())
            });
        say!("attaching to {}{count}, {until}", plan.describe());
    }
    let metrics = crate::run::endpoint::listen(args.listen)?;
    if verbose {
        if let Some(m) = &metrics {
            let addr = m.local_addr();
            say!("serving the probes' metrics at http://{addr}/metrics while the run lasts");
        }
    }
    let progress = verbose && std::io::stderr().is_terminal();
    let run =
        crate::run::attached::record(&plan, &signals.stop, (verbose, progress), metrics.as_ref())?;
    if verbose {
        if let Some(problems) = run.profile.capabilities.as_ref().map(report_problems) {
            for line in problems {
                say!("virtgap: {line}");
            }
        }
    }
    let printed = print_summary(args, &run.profile, &run.profile.runs);
    let all_written = write_files(args, &run.profile, &RunStats::default(), &outputs, verbose)?;
    printed?;
    if run.interrupted {
        return Ok(signals.exit_code());
    }
    Ok(if all_written {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `--fio-equivalent`: the fio command line that runs the same job, shell-quoted. An existing
/// target is opened as `record` would open it (every safety check, the region it would span),
/// so the line spans what the run would and never writes what the run would only read.
fn print_fio_equivalent(
    args: &RecordArgs,
    spec: &virtgap_workloads::WorkloadSpec,
    size_explicit: bool,
) -> Result<ExitCode> {
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
    let existing = args
        .target
        .target
        .as_ref()
        .filter(|p| std::fs::symlink_metadata(p).is_ok());
    let size = match existing {
        Some(path) => {
            let req = virtgap_workloads::target::TargetRequest {
                choice: virtgap_workloads::target::TargetChoice::Path(path.clone()),
                size: spec.size.0,
                size_explicit,
                bs: spec.bs.0,
                write: !spec.is_read_only(),
                direct: spec.direct,
                destroy_data: args.target.destroy_data.clone(),
            };
            virtgap_workloads::target::open(&req, &virtgap_workloads::safety::SysRoot::default())?
                .size
        }
        None => spec.size.0,
    };
    let on = virtgap_workloads::spec::FioTarget {
        filename: file,
        size,
        existing: existing.is_some(),
    };
    let Some(fio) = spec.fio_command(&on) else {
        bail!(
            "{} has no fio equivalent: fio cannot run a log-structured key-value store",
            spec.name
        );
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{fio}")?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Output paths are checked before anything runs, so a bad one costs nothing; none may be a
/// file this run reads, whatever --force says. Flags that do not apply are refused here too.
fn check_outputs(
    args: &RecordArgs,
    spec: &virtgap_workloads::WorkloadSpec,
) -> Result<crate::run::output::Outputs> {
    let mut outputs = crate::run::output::Outputs::new(args.force, "pass --force to overwrite it");
    if let Some(file) = crate::run::output::workload_file(&args.workload) {
        outputs.input("the workload file", file);
    }
    if let Some(target) = &args.target.target {
        outputs.input("the --target", target);
    }
    profile_outputs(args, &mut outputs)?;
    if spec.kv.is_none() && args.act_log.is_some() {
        bail!("--act-log applies only to kv workloads (e.g. -w kv-act)");
    }
    if spec.kv.is_some() && args.verify {
        bail!("--verify is for rand/seq workloads; kv checks every read against its index anyway");
    }
    if let Some(path) = &args.act_log {
        outputs.file("--act-log", path)?;
    }
    Ok(outputs)
}

/// `--output` and `--csv`, checked into `outputs` (after any inputs it must not overwrite).
fn profile_outputs(args: &RecordArgs, outputs: &mut crate::run::output::Outputs) -> Result<()> {
    if let Some(path) = &args.output {
        outputs.file("--output", path)?;
    }
    if let Some(dir) = &args.csv {
        outputs.dir("--csv", dir, &crate::render::csv_export::FILES)?;
    }
    if let Some(path) = &args.svg {
        outputs.file("--svg", path)?;
    }
    Ok(())
}

/// What `--runs N` recorded: each run's profile (holding its one run record), the runs'
/// statistics pooled, and the last run's target and statistics (kept until the reports are out:
/// a temp file is removed when its target drops).
struct Recorded {
    runs: Vec<Profile>,
    pooled: RunStats,
    /// None between runs: the previous run's target is closed before the next is opened (a
    /// device opened for writing is opened exclusively, and would refuse its own second open).
    last: (Option<Prepared>, RunStats),
    interrupted: bool,
}

/// Records `--runs` runs back to back, each on a freshly prepared target. None: interrupted
/// while preparing the first.
fn record_runs(
    args: &RecordArgs,
    spec: &virtgap_workloads::WorkloadSpec,
    loaded: &virtgap_workloads::LoadedSpec,
    size_explicit: bool,
    verbose: bool,
    signals: &StopSignals,
    metrics: Option<&SharedEndpoint>,
) -> Result<Option<Recorded>> {
    let mut calibration = None;
    let mut recorded: Option<Recorded> = None;
    let runs = args.runs();
    for number in 1..=runs {
        if runs > 1 && verbose {
            say!("run {number} of {runs}");
        }
        let target = args.target.options();
        if let Some(all) = recorded.as_mut() {
            all.last.0 = None;
        }
        let Some(prepared) = prepare(spec, size_explicit, &target, verbose, signals)? else {
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
                crate::run::calibrate::calibrate(1.0)
            });
        }
        // What the probes could not attach is said once, not for every run.
        let settings = RunSettings {
            interval: args.interval.0,
            probes: args.probe.choice(),
            verify: args.verify,
            verbose,
        };
        let one = record_one(
            spec,
            loaded,
            &prepared,
            &calibration,
            number,
            &settings,
            metrics,
        )?;
        if runs > 1 && verbose {
            say!("  {}", run_line(&one.profile.runs[0]));
        }
        let interrupted = one.interrupted;
        match recorded.as_mut() {
            None => {
                let mut pooled = RunStats::default();
                add_run_stats(&mut pooled, &one.stats);
                recorded = Some(Recorded {
                    pooled,
                    runs: vec![one.profile],
                    last: (Some(prepared), one.stats),
                    interrupted,
                })
            }
            Some(all) => {
                add_run_stats(&mut all.pooled, &one.stats);
                all.runs.push(one.profile);
                all.last = (Some(prepared), one.stats);
                all.interrupted = interrupted;
            }
        }
        if interrupted {
            break;
        }
    }
    Ok(recorded)
}

/// The summary on stdout, then the files; the exit code says whether everything held.
fn report(
    args: &RecordArgs,
    recorded: Recorded,
    outputs: crate::run::output::Outputs,
    verbose: bool,
    signals: &StopSignals,
) -> Result<ExitCode> {
    let Recorded {
        mut runs,
        pooled,
        last: (_last_target, last_stats),
        interrupted,
    } = recorded;
    // `--label`: the user's name for this host, on every side of every report.
    for p in &mut runs {
        p.host.label.clone_from(&args.attach.label);
    }
    let run_records: Vec<RunRecord> = runs.iter().flat_map(|p| p.runs.clone()).collect();
    // Any run's kv load not delivered, or a read of the wrong data, fails the command.
    let undelivered = runs
        .iter()
        .flat_map(|p| &p.kv)
        .any(|kv| matches!(kv.outcome, KvOutcome::NotDelivered | KvOutcome::Mismatches));
    // The summary is the last run's, from its own profile: with several runs, a copy taken
    // before they are pooled; with one, the profile itself.
    let last_run = (runs.len() > 1).then(|| runs[runs.len() - 1].clone());
    let profile = pool_profiles(runs, &pooled);
    let shown = last_run.as_ref().unwrap_or(&profile);
    // The summary first: whatever becomes of the files below, what ran reaches stdout.
    let printed = print_summary(args, shown, &run_records);
    let all_written = write_files(args, &profile, &last_stats, &outputs, verbose)?;
    printed?;
    if interrupted {
        say!(
            "virtgap: interrupted after {:.1} s of measurement",
            last_stats.seconds()
        );
        return Ok(signals.exit_code());
    }
    if let Some(kv) = &shown.kv {
        if let Some(behind) = &kv.behind {
            say!(
                "virtgap: {}; stopped after {:.1} s",
                crate::render::kv_report::behind_text(behind),
                last_stats.seconds()
            );
        }
    }
    if let Some(kv) = &shown.kv {
        if matches!(kv.outcome, KvOutcome::NotDelivered | KvOutcome::Mismatches) {
            say!("virtgap: {}", crate::render::kv_report::verdict_text(kv));
        }
    }
    if undelivered || !all_written {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// The summary (or `--json`'s document) of `shown`, with the tail autopsy and, for several
/// runs, each run's line.
fn print_summary(args: &RecordArgs, shown: &Profile, run_records: &[RunRecord]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let tail = run_records.last().and_then(|r| r.tail.as_ref());
    if args.json {
        let mut doc = report::json(shown);
        if let (Some(map), Some(tail)) = (doc.as_object_mut(), tail) {
            map.insert("tail_autopsy".into(), serde_json::to_value(tail)?);
        }
        if args.runs() > 1 {
            if let Some(map) = doc.as_object_mut() {
                map.insert("runs".into(), serde_json::to_value(run_records)?);
            }
        }
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    } else {
        if args.runs() > 1 {
            writeln!(
                out,
                "(the summary below is the last run's; the runs follow it, and the profile keeps them all)\n"
            )?;
        }
        // Names in the summary come from workload files: shown, never obeyed by the terminal.
        let mut text = Vec::new();
        crate::render::summary::write(&mut text, shown)?;
        if let Some(tail) = tail {
            report::write_tail(&mut text, tail)?;
        }
        if args.runs() > 1 {
            report::write_runs(
                &mut text,
                run_records,
                crate::analysis::diff::DEFAULT_MIN_EFFECT,
            )?;
        }
        out.write_all(units::printable(&String::from_utf8_lossy(&text)).as_bytes())?;
    }
    out.flush()?;
    Ok(())
}

/// Writes `--output`, `--csv` and `--act-log`: what cannot be written where asked is saved under
/// the temp directory, the profile with it. Whether every file was written where asked.
fn write_files(
    args: &RecordArgs,
    profile: &Profile,
    last_stats: &RunStats,
    outputs: &crate::run::output::Outputs,
    verbose: bool,
) -> Result<bool> {
    use crate::run::output::Pending;
    if args.output.is_none() && args.csv.is_none() && args.act_log.is_none() && args.svg.is_none() {
        return Ok(true);
    }
    let mut profile_json = serde_json::to_vec_pretty(profile)?;
    profile_json.push(b'\n');
    let csv = args
        .csv
        .as_ref()
        .map(|_| crate::render::csv_export::export(profile));
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
    let chart = args
        .svg
        .as_ref()
        .map(|_| crate::render::charts::percentiles::profile_chart(profile));
    if let (Some(path), Some(chart)) = (&args.svg, &chart) {
        files.push(Pending {
            flag: "--svg",
            path: path.clone(),
            bytes: chart.as_bytes(),
        });
    }
    if let (Some(path), Some(kv)) = (&args.act_log, &last_stats.kv) {
        files.push(Pending {
            flag: "--act-log",
            path: path.clone(),
            bytes: kv.act_log.as_bytes(),
        });
    }
    let profile_name = args
        .output
        .as_deref()
        .and_then(std::path::Path::file_name)
        .map_or("profile.json".into(), |n| n.to_string_lossy().into_owned());
    let written = outputs.write_all(&files, (&profile_name, &profile_json));
    // Every file a flag names was written (and there was one: no ACT log without kv).
    let done = |flag: &str| {
        let mut of_flag = files.iter().zip(&written).filter(|(f, _)| f.flag == flag);
        of_flag.clone().next().is_some() && of_flag.all(|(_, &w)| w)
    };
    let name = |path: &std::path::Path| units::printable(&path.display().to_string()).into_owned();
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
        if let Some(path) = args.svg.as_deref().filter(|_| done("--svg")) {
            say!("wrote percentile chart {}", name(path));
        }
        if let Some(path) = args.act_log.as_deref().filter(|_| done("--act-log")) {
            say!("wrote ACT log {}", name(path));
        }
    }
    Ok(written.iter().all(|&w| w))
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
