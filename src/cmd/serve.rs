//! `virtgap serve`: the probes' figures as Prometheus metrics, until stopped.

use std::process::ExitCode;

use anyhow::{bail, Result};

use crate::cli::ServeArgs;
use crate::run::signals::StopSignals;

pub fn run(args: &ServeArgs) -> Result<ExitCode> {
    if args.probe.no_probes {
        bail!("serve exports what the probes measure: drop --no-probes");
    }
    crate::cli::check_interval(&args.interval)?;
    let target = args.attach.target();
    if let Some(t) = &target {
        let root = std::path::Path::new("/");
        virtgap_probes::follow::check_pid_namespace(root)?;
        t.resolve(root)?;
    }
    let signals = StopSignals::install(true)?;
    let plan = crate::run::serve::ServePlan {
        listen: args.listen,
        target,
        label: args.attach.label.clone(),
        interval: args.interval.0,
        duration: args.duration.as_ref().map(|d| d.value.0),
        probes: args.probe.choice(),
    };
    crate::run::serve::serve(&plan, &signals.stop, !args.quiet)?;
    // A signal is how a server is meant to stop: that is success.
    Ok(ExitCode::SUCCESS)
}
