//! `virtgap serve`: the probes run continuously — following processes, a cgroup, or every
//! process — and `/metrics` (`run::endpoint`) serves their totals for Prometheus.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use virtgap_probes::ProbeEvent;

use crate::cli::ServeArgs;
use crate::run::attached::AttachPlan;
use crate::run::endpoint::MetricsEndpoint;
use crate::run::exporter::ExporterContext;
use crate::run::pipeline::Event;
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
/// probes, and serves until `stop` or `--duration`.
pub fn serve(plan: &ServePlan, stop: &Arc<AtomicBool>, verbose: bool) -> Result<()> {
    let endpoint = MetricsEndpoint::bind(plan.listen)?;
    let (attach, described) = (&plan.attach, plan.attach.describe());
    let config = crate::run::attached::follow_config(attach)?;
    let (tx, rx) = mpsc::channel::<Event>();
    let (collector, report) = start_collector(config, attach.interval, &tx, &rx)?;
    drop(tx);
    endpoint.follow(ExporterContext {
        series: plan.series.clone(),
        ..ExporterContext::this_host(
            attach.label.as_deref().unwrap_or_default(),
            &described,
            &report,
        )
    });
    if verbose {
        say!(
            "serving http://{}/metrics: probes attached, following {described}, updated every {}",
            endpoint.local_addr(),
            humantime::format_duration(attach.interval)
        );
    }
    let started = Instant::now();
    let mut told_gone = false;
    while !stop.load(Ordering::Relaxed) {
        if attach.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        let event = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(event) => event,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            // The collector is gone: serving its last page as if current would hide that.
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the probes' collector stopped; the metrics are no longer updated")
            }
        };
        let Event::Probe(ProbeEvent::Snapshot { cumulative, .. }) = event else {
            continue;
        };
        if verbose && !told_gone && cumulative.followed.as_ref().is_some_and(Vec::is_empty) {
            say!("every followed process has exited; serving their totals until stopped");
            told_gone = true;
        }
        endpoint.publish(&cumulative);
    }
    collector.stop();
    drop(endpoint);
    Ok(())
}
