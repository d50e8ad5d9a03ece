//! `virtgap serve`: the probes run continuously — following processes, a cgroup, or every
//! process — and `/metrics` (`run::endpoint`) serves their totals for Prometheus.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};

use anyhow::{bail, Result};
use virtgap_probes::{ProbeEvent, ProbeSnapshot};

use crate::cli::ServeArgs;
use crate::run::attached::AttachPlan;
use crate::run::endpoint::MetricsEndpoint;
use crate::run::pipeline::Event;
use crate::run::recorder::{FollowUntil, Metrics, Recorder};
use crate::run::session::start_collector;
use crate::run::signals::StopSignals;

pub fn run(args: &ServeArgs) -> Result<ExitCode> {
    if args.probe.no_probes {
        bail!("serve exports what the probes measure: drop --no-probes");
    }
    crate::cli::check_interval(&args.interval)?;
    let (attach, _) = args.attach.plan(
        args.interval.0,
        args.duration.as_ref().map(|d| d.value.0),
        args.probe.choice(),
    )?;
    let signals = StopSignals::install(true)?;
    let plan = ServePlan {
        listen: args.listen,
        attach,
        series: crate::run::exporter::SeriesOptions {
            per_queue: args.per_queue,
            coarse_buckets: args.buckets == crate::cli::Buckets::Coarse,
            devices: args.attach.devices.clone(),
        },
    };
    serve(&plan, &signals.stop, !args.quiet)?;
    // A signal is how a server is meant to stop: that is success.
    Ok(ExitCode::SUCCESS)
}

/// What to serve and what to follow (for `--duration` or until a signal).
#[derive(Clone, Debug)]
pub struct ServePlan {
    pub listen: SocketAddr,
    pub attach: AttachPlan,
    pub series: crate::run::exporter::SeriesOptions,
}

/// Binds the endpoint (so a taken port is refused before any probe loads), attaches the
/// probes, and serves until `stop` or `--duration`. The probes' events go through the one
/// recorder of an attached run, which publishes each snapshot's totals to the endpoint; no
/// profile is written.
pub fn serve(plan: &ServePlan, stop: &Arc<AtomicBool>, verbose: bool) -> Result<()> {
    let endpoint = Arc::new(MetricsEndpoint::bind(plan.listen)?);
    let (attach, described) = (&plan.attach, plan.attach.describe());
    let config = crate::run::attached::follow_config(attach)?;
    // Before the probes: the recorder's own temporary file is not measured (`--all`).
    let mut recorder = Recorder::attached(
        attach.interval,
        crate::run::host::this_hypervisor(),
        attach.disks.clone(),
    );
    let (tx, rx) = mpsc::channel::<Event>();
    let (collector, report) = start_collector(config, attach.interval, &tx, &rx)?;
    drop(tx);
    recorder.keep_no_series();
    recorder.serve_metrics(Metrics {
        series: plan.series.clone(),
        ..Metrics::new(
            &endpoint,
            attach.label.as_deref().unwrap_or_default(),
            &described,
        )
    });
    recorder.on_event(Event::Probe(ProbeEvent::Attached(report)));
    if verbose {
        say!(
            "serving http://{}/metrics: probes attached, following {described}, updated every {}",
            endpoint.local_addr(),
            humantime::format_duration(attach.interval)
        );
    }
    let mut told_gone = false;
    let mut each = |_: &Recorder, _: &ProbeSnapshot, followed: Option<&[u32]>| {
        if verbose && !told_gone && followed.is_some_and(<[u32]>::is_empty) {
            say!("every followed process has exited; serving their totals until stopped");
            told_gone = true;
        }
    };
    let until = FollowUntil {
        stop,
        duration: attach.duration,
        processes_gone: false,
    };
    let end = recorder.follow(&rx, until, &mut each);
    collector.stop();
    end.map(drop)
}
