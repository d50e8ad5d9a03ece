//! The block family's two sources of stage times side by side on the same I/Os: two sessions
//! attached at once, one taking its own clock readings at a request's start, issue and
//! completion, the other reading the kernel's stamps at completion
//! ([`crate::BlockStamps::KernelUnchecked`]), while this process makes direct reads.
//! Doctor prints it; the VM tier checks that the kernel's stamps give the same stages where
//! they are exact.

use serde::Serialize;

use std::collections::{BTreeMap, VecDeque};

use crate::error::StampsCheckError;
use crate::families::BlockStamps;
use crate::model::{BlockOp, BlockStage, DevNum, ProbeSnapshot, SlowRequest};
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
    /// The same requests paired one to one (each session sends every request's stamps to user
    /// space), and the median of each stage's difference (kernel - own) over them: a few
    /// requests whose two sessions' programs ran far apart (a vCPU descheduled between them)
    /// move a mean, not a median.
    pub per_request: PairedRequests,
}

/// Both sessions' records of the same requests, paired.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PairedRequests {
    /// Requests both sessions recorded (the same disk, sector and op, in completion order).
    pub paired: u64,
    /// Requests only one session recorded.
    pub unpaired: u64,
    /// Median over the paired requests of (kernel - own) per stage, in ns (None: no request
    /// had that stage in both).
    pub median_difference_ns: StageMedians,
    /// Median of a request's whole time, start to completion, by our stamps (ns).
    pub median_whole_ns: Option<f64>,
}

/// A median per stage and of the whole request (start to completion), in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StageMedians {
    pub queue: Option<f64>,
    pub device: Option<f64>,
    pub completion: Option<f64>,
    pub whole: Option<f64>,
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
    // Every request of this process to user space, for the pairing: both sessions pay for
    // sending it, ours before the kernel-stamped session's completion program runs (counted
    // in the order's lag, as that program's run time).
    own.set_slow_request_threshold(0);
    kernel.set_slow_request_threshold(0);
    own.drain_slow_requests();
    kernel.drain_slow_requests();
    let before = (own.snapshot(), kernel.snapshot());
    let reads = reads().map_err(StampsCheckError::Read)?;
    let after = (own.snapshot(), kernel.snapshot());
    // Reads only, as the stage means: writeback of other files may be counted to this
    // process too.
    let reads_of = |session: &ProbeSession| -> Vec<SlowRequest> {
        session
            .drain_slow_requests()
            .into_iter()
            .filter(|r| r.op == BlockOp::Read)
            .collect()
    };
    let per_request = pair_requests(&reads_of(&own), &reads_of(&kernel));
    let (own, kernel) = (
        stages(&after.0.since(&before.0), reads),
        stages(&after.1.since(&before.1), reads),
    );
    Ok(StampsComparison {
        reads,
        order_lag_ns: order_lag(&own, &kernel),
        own,
        kernel,
        per_request,
        kernel_inexact: crate::families::block::kernel_stamps_exact(
            &crate::attach::KernelTracepoints::load(&[]),
        )
        .err()
        .map(str::to_string),
    })
}

/// Where [`request_stages`] puts the whole request, start to completion.
const WHOLE: usize = 3;

/// One request's queue, device and completion stages and its whole time by one session's
/// stamps, in ns (None: not measured).
fn request_stages(r: &SlowRequest) -> [Option<i64>; 4] {
    let apart = |from: u64, to: u64| (to >= from).then(|| (to - from) as i64);
    // A request without a queue stage is recorded from its issue.
    let queue = (r.start_ns < r.issue_ns)
        .then(|| apart(r.start_ns, r.issue_ns))
        .flatten();
    let whole = apart(r.start_ns, r.complete_ns);
    match r.irq_ns {
        Some(irq) => [
            queue,
            apart(r.issue_ns, irq),
            apart(irq, r.complete_ns),
            whole,
        ],
        None => [queue, None, None, whole],
    }
}

/// Pairs the two sessions' records of the same requests: the same disk, sector and op, taken
/// in completion order (a block read twice is two requests, completed in the same order in
/// both), and takes each stage's median difference.
pub fn pair_requests(own: &[SlowRequest], kernel: &[SlowRequest]) -> PairedRequests {
    type Key = (DevNum, u64, BlockOp);
    let by_request = |records: &[SlowRequest]| {
        let mut sorted = records.to_vec();
        sorted.sort_by_key(|r| r.complete_ns);
        let mut map: BTreeMap<Key, VecDeque<SlowRequest>> = BTreeMap::new();
        for r in sorted {
            map.entry((r.dev, r.sector, r.op)).or_default().push_back(r);
        }
        map
    };
    let mut kernel = by_request(kernel);
    let (mut paired, mut unpaired) = (0u64, 0u64);
    let mut differences: [Vec<i64>; 4] = Default::default();
    let mut whole = Vec::new();
    for (key, mut own) in by_request(own) {
        let theirs = kernel.entry(key).or_default();
        while let Some(a) = own.pop_front() {
            let Some(b) = theirs.pop_front() else {
                unpaired += 1;
                continue;
            };
            paired += 1;
            let ours = request_stages(&a);
            whole.extend(ours[WHOLE]);
            for (i, (a, b)) in ours.into_iter().zip(request_stages(&b)).enumerate() {
                if let (Some(a), Some(b)) = (a, b) {
                    differences[i].push(b - a);
                }
            }
        }
    }
    unpaired += kernel.values().map(|q| q.len() as u64).sum::<u64>();
    let [queue, device, completion, whole_difference] = differences.map(|mut d| median(&mut d));
    PairedRequests {
        paired,
        unpaired,
        median_difference_ns: StageMedians {
            queue,
            device,
            completion,
            whole: whole_difference,
        },
        median_whole_ns: median(&mut whole),
    }
}

/// The middle value (the mean of the two middle ones for an even count).
fn median(values: &mut [i64]) -> Option<f64> {
    values.sort_unstable();
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2] as f64),
        _ => Some((values[n / 2 - 1] as f64 + values[n / 2] as f64) / 2.0),
    }
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

    fn request(sector: u64, stamps: [u64; 4]) -> SlowRequest {
        SlowRequest {
            dev: (254, 0),
            sector,
            bytes: 4096,
            op: BlockOp::Read,
            start_ns: stamps[0],
            issue_ns: stamps[1],
            irq_ns: Some(stamps[2]),
            complete_ns: stamps[3],
            tid: 1,
        }
    }

    #[test]
    fn a_few_requests_far_apart_move_the_mean_but_not_the_median_difference() {
        // Nine requests whose completions read 200 ns apart, one 40 µs apart (a vCPU
        // descheduled between the two sessions' programs), and one only ours saw.
        let mut own = Vec::new();
        let mut kernel = Vec::new();
        for i in 0..10u64 {
            let t = i * 1_000_000;
            own.push(request(i * 8, [t, t + 1_000, t + 100_000, t + 105_000]));
            let late = if i == 3 { 40_000 } else { 200 };
            kernel.push(request(
                i * 8,
                [t, t + 1_000, t + 100_050, t + 105_000 + late],
            ));
        }
        own.push(request(999, [0, 1, 2, 3]));
        let p = pair_requests(&own, &kernel);
        assert_eq!((p.paired, p.unpaired), (10, 1));
        let m = p.median_difference_ns;
        assert_eq!(
            (m.queue, m.device, m.completion),
            (Some(0.0), Some(50.0), Some(150.0))
        );
        assert_eq!(m.whole, Some(200.0));
        assert_eq!(p.median_whole_ns, Some(105_000.0));
    }

    #[test]
    fn a_block_read_twice_pairs_in_completion_order_and_a_missing_stage_is_left_out() {
        let own = [
            request(8, [5_000, 5_100, 5_900, 6_000]),
            request(8, [0, 100, 900, 1_000]),
        ];
        let mut unsplit = request(8, [5_000, 5_150, 0, 6_010]);
        unsplit.irq_ns = None;
        let kernel = [request(8, [0, 120, 900, 1_010]), unsplit];
        let p = pair_requests(&own, &kernel);
        assert_eq!((p.paired, p.unpaired), (2, 0));
        let m = p.median_difference_ns;
        // Queue from both requests (+20, +50); device and completion from the first only.
        assert_eq!(
            (m.queue, m.device, m.completion),
            (Some(35.0), Some(-20.0), Some(10.0))
        );
    }
}
