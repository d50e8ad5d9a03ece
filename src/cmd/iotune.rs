//! `virtgap iotune`: the storage's four figures, phase by phase (the search and measurement are
//! `run::iotune`'s), printed, and written as an iotune result for `diff` and as ScyllaDB's
//! io_properties.yaml.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use virtgap_workloads::units;

use crate::cli::IotuneArgs;
use crate::model::iotune::{IotuneProfile, Phase};
use crate::render::iotune_report;
use crate::run::iotune::{bytes_in_flight_cap, run_phases, IotunePlan};
use crate::run::output::{Outputs, Pending};
use crate::run::prepare::{mem_available, TargetOptions};
use crate::run::signals::StopSignals;

/// The phases asked for, in iotune's order.
fn wanted_phases(args: &IotuneArgs) -> Vec<Phase> {
    match &args.phases {
        None => Phase::ALL.to_vec(),
        Some(keys) => Phase::ALL
            .into_iter()
            .filter(|p| keys.iter().any(|k| k == p.key()))
            .collect(),
    }
}

/// The shortest measured run or search step: shorter, a figure is a handful of I/Os.
const MIN_MEASURE: Duration = Duration::from_millis(100);

pub fn run(args: &IotuneArgs) -> Result<ExitCode> {
    for (flag, span) in [("--duration", &args.duration), ("--step", &args.step)] {
        if span.0 < MIN_MEASURE {
            bail!(
                "{flag} {} is too short to measure a figure; give at least 100ms (e.g. {flag} 2s)",
                humantime::format_duration(span.0)
            );
        }
    }
    let shown = units::printable(&args.target.display().to_string()).into_owned();
    let (target, phases, skipped) = target_and_phases(args, &shown)?;
    let mut outputs = Outputs::new(args.force, "pass --force to replace it");
    outputs.input("the target", &args.target);
    if let Some(path) = &args.output {
        outputs.file("--output", path)?;
    }
    if let Some(path) = &args.yaml {
        outputs.file("--yaml", path)?;
    }
    let signals = StopSignals::install(true)?;
    let plan = plan(args, target);
    let verbose = plan.verbose;
    if verbose && !skipped.is_empty() {
        say!(
            "virtgap: skipping {}: writing to {shown} needs --destroy-data naming it",
            skipped
                .iter()
                .map(|p| p.key())
                .collect::<Vec<_>>()
                .join(" and ")
        );
    }
    let shown = units::printable(&args.target.display().to_string()).into_owned();
    let mut result = run_phases(&plan, &phases, &signals, &args.target, &mut |p| {
        if plan.verbose {
            say!("{}", iotune_report::progress_line(&shown, p));
        }
    })?;
    result.host.label.clone_from(&args.label);
    let interrupted = !result.complete;
    {
        let mut out = std::io::stdout().lock();
        out.write_all(units::printable(&iotune_report::summary(&result)).as_bytes())?;
    }
    let mut json = serde_json::to_vec_pretty(&result)?;
    json.push(b'\n');
    let yaml = io_properties(args, &result)?;
    let written = write_files(args, &outputs, &json, yaml.as_deref(), verbose);
    if interrupted {
        say!("virtgap: interrupted: the phases that finished are kept, marked incomplete");
        return Ok(signals.exit_code());
    }
    if written.iter().any(|w| !w) || (args.yaml.is_some() && yaml.is_none()) {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// How the target is opened (a directory gets a temp file of iotune's own; a file or device is
/// overwritten only with --destroy-data), the phases that will run, and those skipped as they
/// would write to a target not given up to them.
fn target_and_phases(
    args: &IotuneArgs,
    shown: &str,
) -> Result<(TargetOptions, Vec<Phase>, Vec<Phase>)> {
    let meta = std::fs::metadata(&args.target)
        .with_context(|| format!("--target {shown}: cannot use it"))?;
    let is_dir = meta.is_dir();
    if is_dir && args.destroy_data.is_some() {
        bail!("--destroy-data names an existing file or device to overwrite; in a directory iotune writes only its own temp file: drop --destroy-data");
    }
    let target = if is_dir {
        TargetOptions {
            dir: Some(args.target.clone()),
            ..TargetOptions::default()
        }
    } else {
        TargetOptions {
            target: Some(args.target.clone()),
            destroy_data: args.destroy_data.clone(),
            ..TargetOptions::default()
        }
    };
    let writes_allowed = is_dir || args.destroy_data.is_some();
    let (phases, skipped): (Vec<Phase>, Vec<Phase>) = wanted_phases(args)
        .into_iter()
        .partition(|p| !p.writes() || writes_allowed);
    if args.yaml.is_some() && phases.len() < Phase::ALL.len() {
        let why = if skipped.is_empty() {
            "--phases leaves some out".to_string()
        } else {
            format!(
                "{} would write to {shown}: pass --destroy-data naming it (they overwrite its data)",
                skipped.iter().map(|p| p.key()).collect::<Vec<_>>().join(" and ")
            )
        };
        bail!("--yaml needs all four figures, but {why}");
    }
    Ok((target, phases, skipped))
}

/// The search and measurement as the arguments ask, on `target`.
fn plan(args: &IotuneArgs, target: TargetOptions) -> IotunePlan {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    IotunePlan {
        workers: args.workers.unwrap_or(cpus),
        tolerance: args.tolerance,
        ramp: args.ramp.0,
        step: args.step.0,
        measure: args.duration.0,
        runs: args.runs,
        size: args.size.map(|s| s.0),
        target,
        probes: args.probe.choice(),
        interval: Duration::from_secs(1).min(args.duration.0.max(Duration::from_millis(100))),
        max_in_flight: args.max_in_flight,
        max_bytes_in_flight: bytes_in_flight_cap(mem_available().map(|b| b.bytes)),
        verbose: !args.quiet,
    }
}

/// The io_properties.yaml for --yaml, when every phase finished. ScyllaDB takes the yaml's
/// figures as the disk's: none is written from a zero or a handful of I/Os.
fn io_properties(args: &IotuneArgs, result: &IotuneProfile) -> Result<Option<String>> {
    let interrupted = !result.complete;
    let unfit = result.unfit_figures();
    Ok(match &args.yaml {
        Some(_) if !interrupted && unfit.is_empty() => {
            Some(iotune_report::io_properties_yaml(result)?)
        }
        Some(path) if !interrupted => {
            say!(
                "virtgap: error: not writing {}: {}; measure longer (--duration) or on a larger target",
                units::printable(&path.display().to_string()),
                unfit.join("; ")
            );
            None
        }
        _ => None,
    })
}

/// Writes the iotune result (--output) and the io_properties (--yaml) there are, saying each
/// file written when `verbose`. Whether each was written, in that order.
fn write_files(
    args: &IotuneArgs,
    outputs: &Outputs,
    json: &[u8],
    yaml: Option<&str>,
    verbose: bool,
) -> Vec<bool> {
    let mut files = Vec::new();
    if let Some(path) = &args.output {
        files.push(Pending {
            flag: "--output",
            path: path.clone(),
            bytes: json,
        });
    }
    if let (Some(path), Some(yaml)) = (&args.yaml, yaml) {
        files.push(Pending {
            flag: "--yaml",
            path: path.clone(),
            bytes: yaml.as_bytes(),
        });
    }
    let written = if files.is_empty() {
        Vec::new()
    } else {
        outputs.write_all(&files, ("iotune.json", json))
    };
    if verbose {
        for (f, ok) in files.iter().zip(&written) {
            if *ok {
                say!(
                    "wrote {} {}",
                    if f.flag == "--yaml" {
                        "io_properties"
                    } else {
                        "iotune result"
                    },
                    units::printable(&f.path.display().to_string())
                );
            }
        }
    }
    written
}
