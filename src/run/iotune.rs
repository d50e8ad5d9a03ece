//! iotune's phases, run: the target prepared once for all of them, the concurrency search in short
//! runs without probes (one worker per CPU, each worker's depth doubling), then `runs`
//! measured runs at the peak with the probes, pooled into the phase's profile.

use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use virtgap_workloads::spec::{self, Overrides};
use virtgap_workloads::stats::RunStats;
use virtgap_workloads::units;
use virtgap_workloads::values::{ByteSize, Span};
use virtgap_workloads::{LoadedSpec, WorkloadSpec};

use crate::analysis::saturation::Saturation;
use crate::model::iotune::{IotunePhase, IotuneProfile, IotuneProgress, Phase, IOTUNE_VERSION};
use crate::run::one_run::{add_run_stats, pool_profiles, record_one, OneRun, RunSettings};
use crate::run::prepare::{prepare, Prepared, TargetOptions};
use crate::run::recorder::unix_ms;
use crate::run::session::ProbeChoice;
use crate::run::signals::StopSignals;

/// How iotune searches and measures.
#[derive(Clone, Debug)]
pub struct IotunePlan {
    /// Workers per phase: one per CPU, as a shard-per-core database issues I/O.
    pub workers: u32,
    /// A step must beat the best figure by more than this fraction to count as growth.
    pub tolerance: f64,
    /// Each search step's ramp and measured length.
    pub ramp: Duration,
    pub step: Duration,
    /// Each measured run's length, and how many.
    pub measure: Duration,
    pub runs: u32,
    /// The target's size to use (None: a temp file's default, or all of a device or file).
    pub size: Option<u64>,
    pub target: TargetOptions,
    pub probes: ProbeChoice,
    pub interval: Duration,
    /// The most I/Os in flight over all workers, and the most bytes (`bytes_in_flight_cap`).
    pub max_in_flight: u32,
    pub max_bytes_in_flight: u64,
    pub verbose: bool,
}

/// The most bytes in flight a search tries, whatever `--max-in-flight` says (the workers'
/// buffers are that large): 512 MiB where a quarter of the memory this process may use holds
/// them (fio's best 1 MiB reads on this machine's virtio disk were 4 jobs x 128), halved down
/// to 32 MiB where it does not.
const MAX_BYTES_IN_FLIGHT: u64 = 512 << 20;
const MIN_BYTES_IN_FLIGHT: u64 = 32 << 20;

/// The byte cap for a process that may use `available` bytes (None: unknown, the largest).
pub fn bytes_in_flight_cap(available: Option<u64>) -> u64 {
    let Some(available) = available else {
        return MAX_BYTES_IN_FLIGHT;
    };
    let mut cap = MAX_BYTES_IN_FLIGHT;
    while cap > MIN_BYTES_IN_FLIGHT && cap > available / 4 {
        cap /= 2;
    }
    cap
}

impl IotunePlan {
    /// The deepest queue per worker the search of `phase` tries.
    pub fn max_qd(&self, phase: Phase) -> u32 {
        let by_bytes = (self.max_bytes_in_flight / block_size(phase)) as u32;
        (self.max_in_flight.min(by_bytes) / self.workers.max(1)).clamp(1, spec::MAX_QD)
    }
}

/// A phase's request size.
fn block_size(phase: Phase) -> u64 {
    if phase.is_bandwidth() {
        1 << 20
    } else {
        4096
    }
}

/// The preset a phase runs: its pattern, direction and request size.
fn preset(phase: Phase) -> &'static str {
    match phase {
        Phase::ReadBandwidth => "seq1m",
        Phase::WriteBandwidth => "seq1m-write",
        Phase::ReadIops => "rand4k",
        Phase::WriteIops => "rand4k-write",
    }
}

/// The workload of `phase` at `workers` × `qd`, measured for `length` after `ramp`.
fn phase_spec(
    phase: Phase,
    plan: &IotunePlan,
    (workers, qd): (u32, u32),
    (ramp, length): (Duration, Duration),
) -> Result<(LoadedSpec, WorkloadSpec)> {
    let loaded = spec::load(preset(phase))?;
    let mut spec = loaded.spec.clone();
    let overrides = Overrides {
        workers: Some(workers),
        qd: Some(qd),
        duration: Some(Span(length)),
        ramp: Some(Span(ramp)),
        size: plan.size.map(ByteSize),
        ..Overrides::default()
    };
    overrides
        .apply(&mut spec)
        .with_context(|| format!("the {} phase's workload", phase.key()))?;
    spec.name = format!("iotune-{}", phase.key().replace('_', "-"));
    Ok((loaded, spec))
}

/// A run's figure: bytes/s for a bandwidth phase, I/Os per second for an IOPS phase, of the
/// phase's direction.
fn figure(phase: Phase, stats: &RunStats) -> f64 {
    let seconds = stats.seconds();
    if seconds <= 0.0 {
        return 0.0;
    }
    let dir = if phase.writes() {
        &stats.write
    } else {
        &stats.read
    };
    if phase.is_bandwidth() {
        dir.bytes as f64 / seconds
    } else {
        dir.ios as f64 / seconds
    }
}

/// The target, opened and made ready once for every phase in `phases` (a write phase among
/// them opens it for writing): one open, one lock and one fill for the whole search, rather than
/// one per phase. None: a signal stopped the fill.
fn prepare_target(
    plan: &IotunePlan,
    phases: &[Phase],
    signals: &StopSignals,
) -> Result<Option<Prepared>> {
    let Some(&first) = phases.first() else {
        anyhow::bail!("no phase to run");
    };
    let opener = phases.iter().copied().find(|p| p.writes()).unwrap_or(first);
    // At the deepest queue any phase may reach, so the memory check covers the whole search.
    let deepest = phases
        .iter()
        .map(|&p| plan.max_qd(p) as u64 * block_size(p))
        .max()
        .unwrap_or(0);
    // Twice the workers, as the search's last steps may run, at half the depth: no step has
    // more in flight than the depth search's deepest.
    let qd = (deepest / 2 / block_size(opener)).clamp(1, u64::from(spec::MAX_QD)) as u32;
    let (_, spec) = phase_spec(opener, plan, (plan.workers * 2, qd), (plan.ramp, plan.step))?;
    let Some(prepared) = prepare(
        &spec,
        plan.size.is_some(),
        &plan.target,
        plan.verbose,
        signals,
    )?
    else {
        return Ok(None);
    };
    // Each worker reads or writes a region of its own, of whole blocks: on a target smaller
    // than a block per worker the regions would start past its end (a file would grow; reads
    // would return nothing). The search may double the workers.
    let workers = plan.workers * 2;
    if let Some((phase, need)) = phases
        .iter()
        .map(|&p| (p, block_size(p) * u64::from(workers)))
        .max_by_key(|&(_, need)| need)
        .filter(|&(_, need)| prepared.target.size < need)
    {
        let fewer = match prepared.target.size / block_size(phase) / 2 {
            0 => String::new(),
            n => format!(", or pass fewer --workers (at most {n})"),
        };
        anyhow::bail!(
            "the target holds {}, and {} needs {} ({workers} workers, as the search may try, x one {} block each); name a larger target{fewer}",
            units::bytes(prepared.target.size),
            phase.key(),
            units::bytes(need),
            units::bytes(block_size(phase)),
        );
    }
    Ok(Some(prepared))
}

/// Runs one phase on the prepared target: the search, then the measurement at its peak. None:
/// a signal stopped it.
fn run_phase(
    phase: Phase,
    plan: &IotunePlan,
    prepared: &Prepared,
    first_measured: bool,
    progress: &mut dyn FnMut(IotuneProgress),
) -> Result<Option<IotunePhase>> {
    let quiet = RunSettings {
        interval: plan.interval,
        probes: ProbeChoice {
            no_probes: true,
            ..plan.probes.clone()
        },
        verify: false,
        verbose: false,
    };
    let mut search = Saturation::new(plan.workers, plan.tolerance, plan.max_qd(phase));
    while let Some((workers, qd)) = search.next() {
        let (loaded, spec) = phase_spec(phase, plan, (workers, qd), (plan.ramp, plan.step))?;
        let one = record_one(&spec, &loaded, prepared, &None, 1, &quiet, None)?;
        if one.interrupted {
            return Ok(None);
        }
        let f = figure(phase, &one.stats);
        progress(IotuneProgress::Step {
            phase,
            workers,
            qd,
            figure: f,
        });
        search.record(workers, qd, f);
    }
    let peak = search.peak().cloned().context("the search ran no step")?;
    progress(IotuneProgress::Peak {
        phase,
        workers: peak.workers,
        qd: peak.qd,
        runs: plan.runs,
        measure: plan.measure,
    });
    let (loaded, spec) = phase_spec(
        phase,
        plan,
        (peak.workers, peak.qd),
        (plan.ramp, plan.measure),
    )?;
    let measured = RunSettings {
        interval: plan.interval,
        probes: plan.probes.clone(),
        verify: false,
        verbose: false,
    };
    let mut runs: Vec<OneRun> = Vec::new();
    let mut figures: Vec<f64> = Vec::new();
    for number in 1..=plan.runs {
        // What the probes could not attach is said once, on the first measured run.
        let settings = RunSettings {
            verbose: plan.verbose && first_measured && number == 1,
            ..measured.clone()
        };
        let one = record_one(&spec, &loaded, prepared, &None, number, &settings, None)?;
        let f = figure(phase, &one.stats);
        progress(IotuneProgress::Run {
            phase,
            number,
            figure: f,
        });
        figures.push(f);
        let interrupted = one.interrupted;
        runs.push(one);
        if interrupted {
            return Ok(None);
        }
    }
    let mean = figures.iter().sum::<f64>() / figures.len() as f64;
    let mut pooled = RunStats::default();
    for r in &runs {
        add_run_stats(&mut pooled, &r.stats);
    }
    Ok(Some(IotunePhase {
        phase,
        block_size: spec.bs.0,
        search: search.into_steps(),
        workers: peak.workers,
        qd: peak.qd,
        figure: mean,
        runs: figures,
        profile: pool_profiles(runs.into_iter().map(|r| r.profile).collect(), &pooled),
    }))
}

/// iotune's result: `target` prepared once, then every phase in `phases` in turn (the search,
/// then the measurement at its peak). A signal stops it early: the phases that finished are
/// kept and the result is marked incomplete.
pub fn run_phases(
    plan: &IotunePlan,
    phases: &[Phase],
    signals: &StopSignals,
    target: &Path,
    progress: &mut dyn FnMut(IotuneProgress),
) -> Result<IotuneProfile> {
    let started = unix_ms(SystemTime::now());
    let mut done = Vec::new();
    let mut interrupted = false;
    match prepare_target(plan, phases, signals)? {
        None => interrupted = true,
        Some(prepared) => {
            // Told once the target is known to fit, so a refusal is the only line.
            progress(IotuneProgress::Started {
                phases: phases.len(),
                workers: plan.workers,
                tolerance: plan.tolerance,
                runs: plan.runs,
                measure: plan.measure,
            });
            for (k, &phase) in phases.iter().enumerate() {
                progress(IotuneProgress::Phase {
                    number: k + 1,
                    of: phases.len(),
                    phase,
                });
                match run_phase(phase, plan, &prepared, k == 0, progress)? {
                    Some(p) => done.push(p),
                    None => {
                        interrupted = true;
                        break;
                    }
                }
            }
        }
    }
    Ok(IotuneProfile {
        iotune_version: IOTUNE_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        command_line: std::env::args().collect(),
        started_unix_ms: started,
        ended_unix_ms: unix_ms(SystemTime::now()),
        complete: !interrupted,
        host: crate::run::host::this_host(),
        target: target.display().to_string(),
        mountpoint: mountpoint_of(target),
        tolerance: plan.tolerance,
        phases: done,
    })
}

/// Where ScyllaDB would mount what `path` names: the mount of the filesystem holding a
/// directory or file, a mounted device's mount point, else the path itself.
fn mountpoint_of(path: &Path) -> String {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let shown = || {
        std::fs::canonicalize(path)
            .unwrap_or_else(|_| path.to_path_buf())
            .display()
            .to_string()
    };
    let Ok(meta) = std::fs::metadata(path) else {
        return shown();
    };
    let dev = if meta.file_type().is_block_device() {
        meta.rdev()
    } else {
        meta.dev()
    };
    let devnum = format!("{}:{}", libc::major(dev), libc::minor(dev));
    std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|info| virtgap_workloads::safety::mountpoint_of(&info, &devnum))
        .unwrap_or_else(shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_cap_is_a_quarter_of_the_memory_at_most_and_never_below_its_floor() {
        const GIB: u64 = 1 << 30;
        assert_eq!(bytes_in_flight_cap(None), 512 << 20);
        assert_eq!(bytes_in_flight_cap(Some(24 * GIB)), 512 << 20);
        assert_eq!(bytes_in_flight_cap(Some(2 * GIB)), 512 << 20);
        assert_eq!(bytes_in_flight_cap(Some(GIB)), 256 << 20);
        assert_eq!(bytes_in_flight_cap(Some(300 << 20)), 64 << 20);
        assert_eq!(bytes_in_flight_cap(Some(1 << 20)), 32 << 20);
    }
}
