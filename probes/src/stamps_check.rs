//! The block family's two sources of stage times side by side on the same I/Os: two sessions
//! attached at once, one taking its own clock readings at a request's start, issue and
//! completion, the other reading the kernel's stamps at completion
//! ([`crate::BlockStamps::KernelUnchecked`]), while this process makes direct reads.
//! Doctor prints it; the VM tier checks that the kernel's stamps give the same stages where
//! they are exact.

use serde::Serialize;

use crate::error::StampsCheckError;
use crate::families::BlockStamps;
use crate::model::{BlockOp, BlockStage, ProbeSnapshot};
use crate::report::Family;
use crate::{ProbeConfig, ProbeSession, ProbeStorage};

/// One source's view of the reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StampedStages {
    /// Requests measured (the device stage's count).
    pub requests: u64,
    pub queue_mean_ns: Option<f64>,
    pub device_mean_ns: Option<f64>,
    pub completion_mean_ns: Option<f64>,
    /// The family's BPF program runs per read, and their time per read (None without run
    /// statistics).
    pub program_runs_per_read: Option<f64>,
    pub program_ns_per_read: Option<f64>,
    /// Each program that ran: its name, runs per read and mean time per run (ns).
    pub programs: Vec<(String, f64, f64)>,
    /// Runs the kernel skipped because the program was already running on that CPU.
    pub missed_runs: u64,
}

/// Both sources on the same reads.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StampsComparison {
    pub reads: u64,
    pub own: StampedStages,
    pub kernel: StampedStages,
    /// Why the kernel's stamps are not exact on this kernel (None: they are; the block family
    /// uses them when asked).
    pub kernel_inexact: Option<String>,
    /// How much later (ns, negative: earlier) the kernel-stamped session's queue, device and
    /// completion stages read than ours only because of the order the two sessions' programs
    /// run in on each boundary (see [`order_lag`]).
    pub order_lag_ns: StageLag,
}

/// A difference per stage, in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StageLag {
    pub queue: f64,
    pub device: f64,
    pub completion: f64,
}

/// What the two sessions' program order alone moves between them. The kernel-stamped session
/// attaches second: on a tracepoint its programs run after ours, so its clock reads at the IRQ
/// entry and the completion come later by our programs' time there; the kernel's issue stamp is
/// taken after the issue tracepoint's programs (ours) have run; a bio's entry by fentry runs
/// the last attached program first (the kernel session's, so its entry comes earlier by its own
/// program's time), by kprobe or block_bio_remap ours first. Starts from the request's own
/// stamp are the same for both. Times are each program's mean run per read.
pub fn order_lag(own: &StampedStages, kernel: &StampedStages) -> StageLag {
    let time = |side: &StampedStages, prefix: &str| -> f64 {
        side.programs
            .iter()
            .filter(|(name, ..)| name.starts_with(prefix))
            .map(|(_, runs, ns)| runs * ns)
            .sum()
    };
    let start = if time(kernel, "bio_entry_fentry") > 0.0 {
        -time(kernel, "bio_entry_fentry")
    } else {
        time(own, "bio_entry_kprobe") + time(own, "block_bio_remap")
    };
    let issue = time(own, "block_rq_issue");
    let irq = time(own, "irq_handler_entry");
    let complete = time(own, "block_rq_complete");
    StageLag {
        queue: issue - start,
        device: irq - issue,
        completion: complete - irq,
    }
}

/// Runs `reads` (this process's direct reads, one at a time: the number done) with both
/// sessions attached, and returns what each measured of them.
pub fn compare_stamps(
    reads: impl FnOnce() -> std::io::Result<u64>,
) -> Result<StampsComparison, StampsCheckError> {
    crate::bpf_permission()?;
    let pid = std::process::id();
    let config = |block_stamps| ProbeConfig {
        families: vec![Family::Block],
        filter_tgid: Some(pid),
        block_stamps,
        ..ProbeConfig::default()
    };
    let (own_config, kernel_config) = (
        config(BlockStamps::Own),
        config(BlockStamps::KernelUnchecked),
    );
    let (mut own_storage, mut kernel_storage) = (ProbeStorage::default(), ProbeStorage::default());
    let own = ProbeSession::load(&mut own_storage, &own_config);
    let kernel = ProbeSession::load(&mut kernel_storage, &kernel_config);
    for session in [&own, &kernel] {
        if !session.report.attached(Family::Block) {
            let why = session
                .report
                .families
                .iter()
                .find_map(|f| f.unavailable.as_ref().map(ToString::to_string))
                .unwrap_or_else(|| "no tracepoint attached".into());
            return Err(StampsCheckError::NotLoaded(why));
        }
    }
    // No slow requests: sending each to user space would weigh on both programs' figures.
    own.set_slow_request_threshold(u64::MAX);
    kernel.set_slow_request_threshold(u64::MAX);
    let before = (own.snapshot(), kernel.snapshot());
    let reads = reads().map_err(StampsCheckError::Read)?;
    let after = (own.snapshot(), kernel.snapshot());
    let (own, kernel) = (
        stages(&after.0.since(&before.0), reads),
        stages(&after.1.since(&before.1), reads),
    );
    Ok(StampsComparison {
        reads,
        order_lag_ns: order_lag(&own, &kernel),
        own,
        kernel,
        kernel_inexact: crate::families::block::kernel_stamps_exact(
            &crate::attach::KernelTracepoints::load(&[]),
        )
        .err()
        .map(str::to_string),
    })
}

fn stages(delta: &ProbeSnapshot, reads: u64) -> StampedStages {
    let block = delta.block.clone().unwrap_or_default();
    let mean = |stage| block.stage(None, stage, &[BlockOp::Read]).mean_ns();
    let (runs, time) = delta
        .runs_by_family()
        .get(Family::Block.name())
        .copied()
        .unwrap_or_default();
    let per_read =
        |v: u64| (!delta.programs.is_empty() && reads > 0).then(|| v as f64 / reads as f64);
    StampedStages {
        requests: block
            .stage(None, BlockStage::Device, &[BlockOp::Read])
            .count,
        queue_mean_ns: mean(BlockStage::Queue),
        device_mean_ns: mean(BlockStage::Device),
        completion_mean_ns: mean(BlockStage::Completion),
        program_runs_per_read: per_read(runs),
        program_ns_per_read: per_read(time),
        programs: delta
            .programs
            .iter()
            .filter(|p| p.run_count > 0 && reads > 0)
            .map(|p| {
                (
                    p.name.clone(),
                    p.run_count as f64 / reads as f64,
                    p.run_time_ns as f64 / p.run_count as f64,
                )
            })
            .collect(),
        missed_runs: delta.programs.iter().map(|p| p.missed).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(programs: &[(&str, f64)]) -> StampedStages {
        StampedStages {
            programs: programs
                .iter()
                .map(|&(name, ns)| (name.to_string(), 1.0, ns))
                .collect(),
            ..StampedStages::default()
        }
    }

    #[test]
    fn the_program_order_moves_each_boundary_by_the_programs_that_run_before_its_stamp() {
        // Tracepoints run ours first; fentry runs the kernel-stamped session's first.
        let own = side(&[
            ("bio_entry_fentry", 50.0),
            ("block_bio_queue_btf", 60.0),
            ("block_rq_issue_btf", 100.0),
            ("irq_handler_entry_btf", 30.0),
            ("block_rq_complete_btf", 200.0),
        ]);
        let kernel = side(&[
            ("bio_entry_fentry", 70.0),
            ("irq_handler_entry_btf", 30.0),
            ("block_rq_complete_btf", 250.0),
        ]);
        let lag = order_lag(&own, &kernel);
        // Its start 70 ns earlier, its issue (the kernel's) 100 ns later.
        assert_eq!(lag.queue, 170.0);
        assert_eq!(lag.device, 30.0 - 100.0);
        assert_eq!(lag.completion, 200.0 - 30.0);
        // Without a fentry hook, a remapped bio's entry is ours first.
        let own = side(&[("block_bio_remap_btf", 40.0), ("block_rq_issue_btf", 100.0)]);
        assert_eq!(order_lag(&own, &side(&[])).queue, 60.0);
    }
}
