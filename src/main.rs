//! virtgap: runs a storage workload, traces where each I/O's time goes, and compares hosts.

use virtgap::{cli, cmd, say, tui};

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
        Some(cli::Command::Serve(args)) => cmd::serve::run(&args),
        Some(cli::Command::Iotune(args)) => cmd::iotune::run(&args),
        Some(cli::Command::Schema) => cmd::schema(),
        Some(cli::Command::Tui(args)) => tui::run(&args),
        None => tui::run(&cli.tui),
    };
    match result {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => {
            // The reader of our output went away (`virtgap workloads | head -1`): no message,
            // and the status a shell reports for coreutils killed by SIGPIPE, 128 + 13, as our
            // other signals exit. Not 0: under `set -o pipefail` a cut-short output is no
            // success, as `seq 1000000 | head -1` is none.
            ExitCode::from(128 + libc::SIGPIPE as u8)
        }
        Err(e) => {
            say!(
                "virtgap: error: {}",
                virtgap_workloads::units::printable(&format!("{e:#}"))
            );
            ExitCode::FAILURE
        }
    }
}

/// Whether the error comes from writing to a pipe nobody reads any more.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        let kind = match cause.downcast_ref::<std::io::Error>() {
            Some(io) => Some(io.kind()),
            // serde_json's error does not give its io::Error as its source.
            None => cause
                .downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind),
        };
        kind == Some(std::io::ErrorKind::BrokenPipe)
    })
}
