//! `virtgap calibrate`: prints the costs of exit-causing operations (measured by
//! [`crate::run::calibrate`]), as a table or JSON; `--host` adds a micro-guest's exit round trip.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use virtgap_workloads::units;

use crate::cli::CalibrateArgs;

pub fn run(args: &CalibrateArgs) -> Result<ExitCode> {
    let mut c = crate::run::calibrate::calibrate(1.0);
    if args.host {
        match crate::run::microvm::exit_round_trip(2000) {
            Ok(f) => c.figures.push(f),
            Err(e) => say!("virtgap: --host: {e}"),
        }
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &c)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(
        out,
        "clocksource: {}",
        c.clocksource.as_deref().unwrap_or("unknown")
    )?;
    writeln!(
        out,
        "{:<24} {:>10} {:>10} {:>8}  what",
        "operation", "median", "p99", "samples"
    )?;
    for f in &c.figures {
        writeln!(
            out,
            "{:<24} {:>10} {:>10} {:>8}  {}",
            f.name,
            units::latency(f.median_ns),
            units::latency(f.p99_ns),
            f.samples,
            f.what
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
