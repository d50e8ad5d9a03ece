//! Before a run: the target opened with every safety check (see `virtgap_workloads::target`),
//! the memory the workload needs checked against what this process may use, and the target made
//! ready — a temp file filled, a kv store loaded and aged — with progress on a terminal.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use virtgap_workloads::kv::{self, LoadedStore};
use virtgap_workloads::safety::SysRoot;
use virtgap_workloads::target::{self, TargetChoice, TargetError, TargetRequest};
use virtgap_workloads::{units, RunOptions, WorkloadEvent};

use crate::model::host::TargetDisks;
use crate::run::signals::StopSignals;

/// Where the workload runs, as the user chose it.
#[derive(Clone, Debug, Default)]
pub struct TargetOptions {
    /// An existing file or block device (else a temp file).
    pub target: Option<PathBuf>,
    /// The temp file's directory.
    pub dir: Option<PathBuf>,
    /// The identity that allows writes to `target`.
    pub destroy_data: Option<String>,
}

/// A target ready for the workload, and the flag that stops it.
#[derive(Debug)]
pub struct Prepared {
    pub target: virtgap_workloads::Target,
    /// The disks whose block stages are the target's.
    pub disks: TargetDisks,
    pub stop: Arc<AtomicBool>,
    /// The loaded store of a kv workload.
    pub kv: Option<LoadedStore>,
}

impl Prepared {
    /// Starts the workload's threads: the kv store's, or the generic workers.
    pub fn start<T>(
        &self,
        spec: &virtgap_workloads::WorkloadSpec,
        options: &RunOptions,
        tx: mpsc::Sender<T>,
    ) -> virtgap_workloads::RunHandle
    where
        T: From<WorkloadEvent> + Send + 'static,
    {
        let stop = Arc::clone(&self.stop);
        match &self.kv {
            Some(store) => kv::start(spec, store, &self.target, options, stop, tx),
            None => virtgap_workloads::start(spec, &self.target, options, stop, tx),
        }
    }
}

/// Refuses a workload whose buffers alone would take more than half the memory this process
/// may use — the host's available memory, or less under a memory cgroup's limit: such a run
/// would swap or be killed mid-way (by a cgroup's limit, silently) rather than measure anything.
fn check_memory(spec: &virtgap_workloads::WorkloadSpec) -> Result<()> {
    let need = spec.worker_memory_bytes();
    let Some(budget) = mem_available() else {
        return Ok(());
    };
    if need > budget.bytes / 2 {
        let (whose, fix) = match budget.limited_by {
            virtgap_workloads::memory::Limit::Host => ("this host has available".to_string(), ""),
            ref cgroup => (
                format!("this process may use under {cgroup}"),
                ", or raise the cgroup's limit",
            ),
        };
        bail!(
            "the workload's buffers need about {} ({} workers x qd {} x {} bs), over half of the {} {whose}; lower --workers, --qd or --bs{fix}",
            units::bytes(need),
            spec.workers,
            spec.qd,
            units::bytes(spec.bs.0),
            units::bytes(budget.bytes),
        );
    }
    Ok(())
}

/// What this process may still allocate: the host's MemAvailable or its memory cgroup's room,
/// the smaller.
pub fn mem_available() -> Option<virtgap_workloads::memory::MemoryBudget> {
    virtgap_workloads::memory::available(std::path::Path::new("/"))
}

/// Opens the target with every safety check, and fills a temp file (with a progress line on a
/// terminal when `verbose`). None: interrupted while filling.
pub fn prepare(
    spec: &virtgap_workloads::WorkloadSpec,
    size_explicit: bool,
    target_args: &TargetOptions,
    verbose: bool,
    signals: &StopSignals,
) -> Result<Option<Prepared>> {
    let stop = Arc::clone(&signals.stop);
    check_memory(spec)?;
    let choice = match &target_args.target {
        Some(p) => TargetChoice::Path(p.clone()),
        None => TargetChoice::TempFile {
            dir: target_args.dir.clone(),
        },
    };
    if target_args.destroy_data.is_some() && target_args.target.is_none() {
        bail!("--destroy-data only applies to an existing --target");
    }
    let req = TargetRequest {
        choice,
        size: spec.size.0,
        size_explicit,
        bs: spec.bs.0,
        write: !spec.is_read_only(),
        direct: spec.direct,
        destroy_data: target_args.destroy_data.clone(),
    };
    let target = target::open(&req, &SysRoot::default())?;
    if let Some(w) = &target.warning {
        say!("virtgap: warning: {w}");
    }
    let disks = target_disks(&target);
    if let Some(note) = &disks.note {
        if verbose || disks.leaves.is_empty() {
            say!("virtgap: {note}");
        }
    }
    let progress = verbose && std::io::stderr().is_terminal();

    if spec.kv.is_some() {
        return Ok(
            load_kv_store(spec, &target, &stop, verbose)?.map(|store| Prepared {
                target,
                disks,
                stop,
                kv: Some(store),
            }),
        );
    }
    if target.needs_fill() {
        if verbose && !progress {
            // Without a terminal for the progress line, a log still sees the phase begin.
            say!("preparing {}…", target.describe());
        }
        let started = Instant::now();
        let mut last_draw = Instant::now();
        let result = target::fill(&target, &stop, |done| {
            if progress && last_draw.elapsed() >= Duration::from_millis(200) {
                last_draw = Instant::now();
                progress!(
                    "preparing {}: {} of {} written",
                    target.describe(),
                    units::bytes(done),
                    units::bytes(target.size)
                );
            }
        });
        if progress {
            crate::stderr::clear_progress();
        }
        match result {
            Ok(()) => {}
            Err(TargetError::Interrupted) => {
                say!("virtgap: interrupted while preparing the temp file; nothing measured");
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
        if verbose {
            say!(
                "prepared {} in {:.1} s",
                target.describe(),
                started.elapsed().as_secs_f64()
            );
        }
    }

    Ok(Some(Prepared {
        target,
        disks,
        stop,
        kv: None,
    }))
}

/// Loads and ages the kv store before anything is measured (progress on a terminal).
/// None: interrupted.
fn load_kv_store(
    spec: &virtgap_workloads::WorkloadSpec,
    target: &virtgap_workloads::Target,
    stop: &AtomicBool,
    verbose: bool,
) -> Result<Option<LoadedStore>> {
    let progress = verbose && std::io::stderr().is_terminal();
    if verbose && !progress {
        say!("loading the kv store on {}…", target.describe());
    }
    let mut last_draw = Instant::now();
    let loaded = kv::prepare(spec, target, stop, |p| {
        if progress && last_draw.elapsed() >= Duration::from_millis(200) {
            last_draw = Instant::now();
            progress!(
                "{} the kv store on {}: {:.0}%",
                p.phase,
                target.describe(),
                100.0 * p.done as f64 / p.total.max(1) as f64
            );
        }
    });
    if progress {
        crate::stderr::clear_progress();
    }
    let Some(loaded) = loaded.context("loading the kv store")? else {
        say!("virtgap: interrupted while loading the kv store; nothing measured");
        return Ok(None);
    };
    if verbose {
        say!(
            "loaded {} keys into {} and aged them with {} overwrites in {:.1} s",
            loaded.keys,
            target.describe(),
            loaded.aging_overwrites,
            loaded.seconds
        );
    }
    Ok(Some(loaded))
}

/// The disks whose block stages are the target's I/O (through md, dm or NVMe multipath).
fn target_disks(target: &virtgap_workloads::Target) -> TargetDisks {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(meta) = target.file.metadata() else {
        return TargetDisks::default();
    };
    let dev = if meta.file_type().is_block_device() {
        meta.rdev()
    } else {
        meta.dev()
    };
    crate::run::host::target_disks(
        std::path::Path::new("/"),
        (libc::major(dev), libc::minor(dev)),
    )
}
