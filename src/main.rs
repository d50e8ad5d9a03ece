//! virtgap: runs a storage workload, traces where each I/O's time goes, and compares hosts.

mod cli;
mod csv_export;
mod doctor;
mod host;
mod output;
mod pipeline;
mod probe_report;
mod profile;
mod record;
mod report;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        Some(cli::Command::Record(args)) => record::run(&args),
        Some(cli::Command::Workloads(args)) => record::workloads(&args),
        Some(cli::Command::Doctor(args)) => doctor::run(&args),
        None => {
            // The live TUI will live here; until then the bare command explains itself.
            use clap::CommandFactory;
            let _ = cli::Cli::command().print_help();
            Ok(ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("virtgap: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
