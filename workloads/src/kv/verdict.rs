//! What a kv run found and ACT's verdict on it: each slice's latency percentages on two
//! definitions side by side — ACT's (each read's device service time) and the client's (from
//! each read's scheduled start, so a read that waited for its turn counts as slow) — and the
//! run's verdict, PASS only when both hold in every slice and the load asked for was delivered.

use std::time::Duration;

use super::act_log::HistogramSnapshot;
use super::inflight::QueueTally;
use super::store::KvCounters;
use crate::act::{self, Derived, SliceVerdict};
use crate::dir_stats::DirStats;

/// Latency percentages of one stream over one slice, ACT's way.
#[derive(Clone, Debug, PartialEq)]
pub struct SliceResult {
    pub start_s: f64,
    pub end_s: f64,
    /// Slices shorter than `--slice` (the run's tail) are shown but not judged, as
    /// act_latency.py ignores them.
    pub complete: bool,
    /// Client reads on ACT's definition: their device service time.
    pub reads: SliceVerdict,
    /// The same reads from their scheduled start (`lat_intended`): a share of reads, so one
    /// late operation cannot fail a slice, but a generator or a queue that holds many back does.
    pub reads_intended: SliceVerdict,
    /// The slice's worst lag of client operations behind their schedule.
    pub worst_lag: Duration,
    pub lb_reads: SliceVerdict,
    pub lb_writes: SliceVerdict,
}

impl SliceResult {
    /// Within ACT's limits on both definitions.
    pub fn pass(&self) -> bool {
        self.reads.pass && self.reads_intended.pass
    }
}

/// The least share of the scheduled load a passing run delivered.
pub const DELIVERED_MIN: f64 = 0.99;

/// ACT's verdict on a kv run, made honest about the load: PASS only when it was delivered.
#[derive(Clone, Debug, PartialEq)]
pub enum KvVerdict {
    /// Every complete slice passed, at the load asked for.
    Pass,
    /// A complete slice's reads were too slow.
    Fail,
    /// Less than [`DELIVERED_MIN`] of the client or large-block operations were done, or a
    /// stream fell behind by more than `--max-lag`: the figures are those of a lighter load.
    NotDelivered {
        client: f64,
        large_blocks: f64,
        behind: Option<Behind>,
    },
    /// Reads returned data other than what was written.
    Mismatches(u64),
    /// No slice ran to its end (a run shorter than `--slice`).
    NoCompleteSlice,
}

/// Which stream fell behind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behind {
    /// Client operations: the generator (more service threads may help), as ACT's service
    /// threads report it.
    Generator,
    /// Large-block writes or defrag reads: the device, as ACT's large-block threads report it.
    Device(&'static str),
}

/// What a kv run found, beyond the generic statistics.
#[derive(Clone, Debug)]
pub struct KvOutcome {
    pub derived: Derived,
    pub read_rps: u64,
    pub write_rps: u64,
    pub service_threads: u32,
    pub keys: u64,
    pub records_per_block: u64,
    /// Bytes of a client read of the smallest and the largest record.
    pub read_bytes: (u64, u64),
    pub measured_s: f64,
    /// Large-block operations in the measured window.
    pub lb_reads: u64,
    pub lb_writes: u64,
    /// Sealed blocks still waiting for the writer, and defrag candidates for the defragmenter,
    /// when the run ended.
    pub lb_pending: (u64, u64),
    /// Client reads in the measured window (each a device read unless the record was still in
    /// memory).
    pub client_read: DirStats,
    /// Client writes: appends to the write buffer, waiting only when no block is free.
    pub client_write: DirStats,
    pub slices: Vec<SliceResult>,
    /// Why the run stopped early, with how far behind it was.
    pub behind: Option<(Behind, Duration)>,
    /// The worst lag of client operations behind their schedule.
    pub worst_lag: Duration,
    /// How the rings' device reads queued, and their limit on reads in flight (None for
    /// service threads).
    pub read_queue: Option<QueueTally>,
    pub counters: KvCounters,
    /// ACT's text log: histogram dumps every report interval.
    pub act_log: String,
}

impl KvOutcome {
    /// ACT's verdict, given only when the load was delivered: every complete slice passes,
    /// no stream fell behind, at least [`DELIVERED_MIN`] of the operations were done.
    pub fn verdict(&self) -> KvVerdict {
        if self.counters.mismatches > 0 {
            return KvVerdict::Mismatches(self.counters.mismatches);
        }
        let (client, large_blocks) = (self.achieved_fraction(), self.large_block_fraction());
        if self.behind.is_some() || client < DELIVERED_MIN || large_blocks < DELIVERED_MIN {
            return KvVerdict::NotDelivered {
                client,
                large_blocks,
                behind: self.behind.as_ref().map(|(who, _)| who.clone()),
            };
        }
        match self.complete_slices_pass(SliceResult::pass) {
            None => KvVerdict::NoCompleteSlice,
            Some(true) => KvVerdict::Pass,
            Some(false) => KvVerdict::Fail,
        }
    }

    /// Whether every complete slice passes `pass` (one definition, or both); None without a
    /// complete slice.
    pub fn complete_slices_pass(&self, pass: fn(&SliceResult) -> bool) -> Option<bool> {
        let mut judged = self.slices.iter().filter(|s| s.complete).peekable();
        judged.peek()?;
        Some(judged.all(pass))
    }

    /// Share of the large-block operations the store asked for that were done: the writer's
    /// and the defragmenter's, against what was still queued for them at the end. One block
    /// per stream may be in hand at any moment and is not counted as behind.
    pub fn large_block_fraction(&self) -> f64 {
        let done = self.lb_reads + self.lb_writes;
        let behind = self.lb_pending.0.saturating_sub(1) + self.lb_pending.1.saturating_sub(1);
        if done + behind == 0 {
            1.0
        } else {
            done as f64 / (done + behind) as f64
        }
    }

    /// Share of the target client operations done in the measured window.
    pub fn achieved_fraction(&self) -> f64 {
        let target = (self.read_rps + self.write_rps) as f64 * self.measured_s;
        if target > 0.0 {
            (self.client_read.ios + self.client_write.ios) as f64 / target
        } else {
            0.0
        }
    }

    pub fn rate(&self, n: u64) -> f64 {
        if self.measured_s > 0.0 {
            n as f64 / self.measured_s
        } else {
            0.0
        }
    }
}

/// Judges one slice, from `start` (when it began and the histograms then) to `end_ns` with the
/// histograms `now`: its client reads on both definitions, its large blocks for information.
pub(super) fn slice_result(
    start: &(u64, HistogramSnapshot),
    end_ns: u64,
    now: &HistogramSnapshot,
    complete: bool,
    worst_lag: Duration,
) -> SliceResult {
    SliceResult {
        start_s: start.0 as f64 / 1e9,
        end_s: end_ns as f64 / 1e9,
        complete,
        reads: act::slice_verdict(&now.reads.since(&start.1.reads)),
        reads_intended: act::slice_verdict(&now.reads_intended.since(&start.1.reads_intended)),
        worst_lag,
        lb_reads: act::slice_verdict(&now.lb_reads.since(&start.1.lb_reads)),
        lb_writes: act::slice_verdict(&now.lb_writes.since(&start.1.lb_writes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_judge_only_complete_windows() {
        let start = (0, HistogramSnapshot::default());
        let mut now = HistogramSnapshot::default();
        for _ in 0..100 {
            now.reads.record_ns(100_000);
        }
        now.reads.record_ns(70_000_000);
        let full = slice_result(&start, 60_000_000_000, &now, true, Duration::ZERO);
        assert!(!full.reads.pass, "1% of reads at 64 ms or more fails");
        assert_eq!(full.end_s, 60.0);
        assert_eq!(full.lb_writes.reads, 0);
    }

    #[test]
    fn a_slice_is_judged_on_both_definitions_and_one_late_read_cannot_fail_it() {
        let start = (0, HistogramSnapshot::default());
        let mut now = HistogramSnapshot::default();
        for _ in 0..1000 {
            now.reads.record_ns(100_000);
            now.reads_intended.record_ns(150_000);
        }
        // One read fast on the device but started 50 ms late: the slice's worst lag.
        now.reads.record_ns(100_000);
        now.reads_intended.record_ns(50_100_000);
        let one_late = slice_result(&start, 1_000_000_000, &now, true, Duration::from_millis(50));
        assert!(one_late.reads.pass && one_late.reads_intended.pass);
        assert!(
            one_late.pass(),
            "0.1% of reads late by 50 ms is within ACT's limits"
        );

        // Fast on the device, but every read 10 ms from its schedule: the client's definition
        // fails, ACT's alone would pass.
        let mut slipped = HistogramSnapshot::default();
        for _ in 0..1000 {
            slipped.reads.record_ns(100_000);
            slipped.reads_intended.record_ns(10_100_000);
        }
        let r = slice_result(
            &start,
            1_000_000_000,
            &slipped,
            true,
            Duration::from_millis(10),
        );
        assert!(r.reads.pass);
        assert!(!r.reads_intended.pass);
        assert!(!r.pass());
        assert_eq!(r.reads_intended.over_8ms_pct, 100.0);
    }
}
