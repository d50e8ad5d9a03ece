//! virtgap: runs a storage workload, traces where each I/O's time goes, and compares hosts.

mod calibrate;
mod cli;
mod csv_export;
mod diff;
mod diff_render;
mod doctor;
#[cfg(test)]
mod fuzz;
mod host;
mod kv_report;
mod microvm;
mod output;
mod pipeline;
mod probe_report;
mod profile;
mod record;
mod report;
mod series;
mod signals;
mod stalls;
mod tui;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        Some(cli::Command::Record(args)) => record::run(&args),
        Some(cli::Command::Workloads(args)) => record::workloads(&args),
        Some(cli::Command::Doctor(args)) => doctor::run(&args),
        Some(cli::Command::Diff(args)) => run_diff(&args),
        Some(cli::Command::Calibrate(args)) => calibrate::run(&args),
        Some(cli::Command::Tui(args)) => tui::run(&args),
        None => tui::run(&cli.tui),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!(
                "virtgap: error: {}",
                virtgap_workloads::units::printable(&format!("{e:#}"))
            );
            ExitCode::FAILURE
        }
    }
}

fn run_diff(args: &cli::DiffArgs) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let a = profile::load(&args.a)?;
    let b = profile::load(&args.b)?;
    for (p, path) in [(&a, &args.a), (&b, &args.b)] {
        if !p.complete {
            eprintln!(
                "virtgap: warning: {} is incomplete (its run was interrupted); comparing anyway",
                path.display()
            );
        }
    }
    let differences = diff::spec_differences(&a, &b);
    if !differences.is_empty() && !args.force {
        anyhow::bail!(
            "the profiles ran different workloads ({}); pass --force to compare anyway",
            differences.join(", ")
        );
    }
    if let Some(path) = &args.csv {
        output::check_output(path, true, "--csv")?;
    }
    if let Some(dir) = &args.svg {
        if dir.exists() && !dir.is_dir() {
            anyhow::bail!("--svg {} is a file, not a directory", dir.display());
        }
        if dir.is_dir() {
            for name in ["waterfall.svg", "stages.svg"] {
                output::check_output(&dir.join(name), true, "--svg")?;
            }
        } else {
            output::check_output(dir, false, "--svg")?;
        }
    }
    let d = diff::diff(&a, &b);
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &d)?;
        writeln!(out)?;
    } else {
        // Host names, workload names and labels come from other hosts' profiles: shown, never
        // obeyed by the terminal.
        let text = if args.markdown {
            diff_render::markdown(&d)
        } else {
            diff_render::terminal(&d)
        };
        out.write_all(virtgap_workloads::units::printable(&text).as_bytes())?;
    }
    if let Some(path) = &args.csv {
        output::write_atomic(path, diff_render::csv(&d).as_bytes(), true, "--csv")?;
    }
    if let Some(dir) = &args.svg {
        if !dir.exists() {
            std::fs::create_dir(dir)
                .map_err(|e| anyhow::anyhow!("--svg: cannot create {}: {e}", dir.display()))?;
        }
        let charts = [
            ("waterfall.svg", diff_render::waterfall_svg(&d)),
            ("stages.svg", diff_render::stages_svg(&a, &b, &d)),
        ];
        for (name, svg) in charts {
            output::write_atomic(&dir.join(name), svg.as_bytes(), true, "--svg")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
