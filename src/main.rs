//! virtgap: runs a storage workload, traces where each I/O's time goes, and compares hosts.

use virtgap::{cli, cmd, tui};

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        Some(cli::Command::Record(args)) => cmd::record::run(&args),
        Some(cli::Command::Workloads(args)) => cmd::record::workloads(&args),
        Some(cli::Command::Doctor(args)) => cmd::doctor::run(&args),
        Some(cli::Command::Diff(args)) => cmd::diff::run(&args),
        Some(cli::Command::Calibrate(args)) => cmd::calibrate::run(&args),
        Some(cli::Command::Schema) => cmd::schema(),
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
