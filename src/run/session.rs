//! The start of a run shared by `record` and the TUI: which probes to load, and the collector
//! started and attached before the workload's first I/O.

use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use virtgap_probes::collector::FIRST_SNAPSHOT_AFTER;
use virtgap_probes::{
    CapabilityReport, Family, ProbeConfig, ProbeEvent, ProbeHandle, ProbeSnapshot,
};

use crate::run::pipeline::{Carries, Event};

/// The probes the user asked for (`--no-probes`, `--probes LIST`, `--sample-hz`, `--vmm-pid`).
#[derive(Clone, Debug, Default)]
pub struct ProbeChoice {
    pub no_probes: bool,
    /// Family names, comma-separated (None: all).
    pub families: Option<String>,
    pub sample_hz: u64,
    pub vmm_pid: Option<u32>,
    /// Where the block family's stage times come from.
    pub block_stamps: virtgap_probes::BlockStamps,
}

/// The probes to load, or None for a pure workload run. The workload runs in this process, so
/// the block and wakeup probes follow it.
pub fn probe_config(args: &ProbeChoice, interval: Duration) -> Result<Option<ProbeConfig>> {
    if args.no_probes {
        return Ok(None);
    }
    let mut families = match &args.families {
        None => Family::ALL.to_vec(),
        Some(list) => list
            .split(',')
            .map(|name| {
                Family::parse(name.trim()).with_context(|| {
                    let known: Vec<&str> = Family::ALL.iter().map(|f| f.name()).collect();
                    format!(
                        "--probes: unknown probe family '{}'; known: {}",
                        name.trim(),
                        known.join(", ")
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?,
    };
    if let Some(pid) = args.vmm_pid {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            bail!("--vmm-pid {pid}: no such process; give the pid of a running VMM (e.g. qemu)");
        }
    }
    if args.sample_hz == 0 {
        families.retain(|f| *f != Family::Sampler);
    }
    // The workload times its own I/O; the app family times attached processes'.
    if args.families.is_none() {
        families.retain(|f| *f != Family::App);
    }
    Ok(Some(ProbeConfig {
        interval,
        sample_hz: args.sample_hz.max(1),
        vmm_pid: args.vmm_pid,
        block_stamps: args.block_stamps,
        // The run statistics cost every BPF program run on the host two clock reads: a
        // recording keeps them on over its first two intervals, then over one in four.
        run_stats_every: run_stats_every(),
        ..ProbeConfig::new(families, Some(std::process::id()))
    }))
}

/// One interval in how many keeps the BPF run statistics on: 4, or `VIRTGAP_RUN_STATS_EVERY`
/// (1 keeps them on throughout). Each switch flips a kernel static key, which rewrites kernel
/// text at every BPF program's call site; the VM tier's emulator sometimes runs a vCPU on the
/// stale text, so its guests switch once per run.
fn run_stats_every() -> u32 {
    std::env::var("VIRTGAP_RUN_STATS_EVERY")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 1)
        .unwrap_or(4)
}

/// Starts the probe collector for `args` (None with `--no-probes`) and waits for it to attach,
/// so the workload's first I/Os are traced: the collector and what attached. Call before the
/// workload starts, while `rx` carries nothing else. With `slow_request_ns`, the block probe
/// sends the requests at least that long (the tail autopsy's; the workload moves it).
pub fn start_probes<T: Carries>(
    args: &ProbeChoice,
    interval: Duration,
    slow_request_ns: Option<Arc<AtomicU64>>,
    tx: &Sender<T>,
    rx: &Receiver<T>,
) -> Result<Option<(ProbeHandle, CapabilityReport)>> {
    let Some(mut config) = probe_config(args, interval)? else {
        return Ok(None);
    };
    if config.families.contains(&Family::Block) {
        config.slow_request_ns = slow_request_ns;
    }
    start_collector(config, interval, tx, rx).map(Some)
}

/// Starts the probe collector with `config` and waits for it to attach: the collector and what
/// attached.
pub fn start_collector<T: Carries>(
    config: ProbeConfig,
    interval: Duration,
    tx: &Sender<T>,
    rx: &Receiver<T>,
) -> Result<(ProbeHandle, CapabilityReport)> {
    let handle = ProbeHandle::start(config, interval, tx.clone());
    match rx
        .recv_timeout(Duration::from_secs(60))
        .map(Carries::into_event)
    {
        Ok(Ok(Event::Probe(ProbeEvent::Attached(report)))) => Ok((handle, report)),
        _ => bail!("the probe collector did not start"),
    }
}

/// Waits for the collector's first snapshot, taken with nothing of virtgap's running but the
/// probes: the idle baseline, as (totals at its end, its own activity). It covers at most
/// [`FIRST_SNAPSHOT_AFTER`] whatever `interval` is, so a long interval does not hold the workload
/// back. Other probe events go to `other`. None after a few times that without one, or on a stop
/// (the run has no baseline then).
pub fn wait_for_idle_interval<T: Carries>(
    rx: &Receiver<T>,
    stop: &std::sync::atomic::AtomicBool,
    interval: Duration,
    mut other: impl FnMut(ProbeEvent),
) -> Option<(ProbeSnapshot, ProbeSnapshot)> {
    let idle = interval.min(FIRST_SNAPSHOT_AFTER);
    let deadline = std::time::Instant::now() + idle * 3 + Duration::from_secs(1);
    while std::time::Instant::now() < deadline && !stop.load(std::sync::atomic::Ordering::Relaxed) {
        match rx
            .recv_timeout(Duration::from_millis(100))
            .map(Carries::into_event)
        {
            Ok(Ok(Event::Probe(ProbeEvent::Snapshot {
                cumulative,
                interval,
            }))) => return Some((*cumulative, *interval)),
            Ok(Ok(Event::Probe(ev))) => other(ev),
            Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return None,
        }
    }
    None
}
