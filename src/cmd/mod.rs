//! The subcommands other than the TUI: `record` (and `workloads`), `diff`, `doctor`,
//! `calibrate`, `serve`, `iotune` and `schema`. Each parses nothing itself (`cli.rs` does) and returns the exit
//! code.

pub mod calibrate;
pub mod diff;
pub mod doctor;
pub mod iotune;
pub mod record;
pub mod serve;

/// `virtgap schema`: the profile's JSON Schema on standard output.
pub fn schema() -> anyhow::Result<std::process::ExitCode> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, &crate::model::file::json_schema())?;
    writeln!(out)?;
    Ok(std::process::ExitCode::SUCCESS)
}
