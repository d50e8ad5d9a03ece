//! Stalls: stretches where the workload's I/Os were in flight and none completed, I/Os slower
//! than [`SLOW_IO_NS`], and requests the kernel completed with an error. A run with any of these
//! is not steady state, and its figures say so wherever they are shown. The kernel's requeues
//! are kept here too, as a count: they are the driver's backpressure, not a stall.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use virtgap_probes::model::BlockSnapshot;
use virtgap_workloads::histogram::LatencyHistogram;
use virtgap_workloads::stats::IntervalSample;
use virtgap_workloads::units;

/// An I/O slower than this is a stall in itself (a cloud disk's worst healthy tail is in the
/// tens of milliseconds; drivers time out at 30 s).
pub const SLOW_IO_NS: u64 = 1_000_000_000;

/// Stall spans kept; beyond this only the count of stalled intervals grows.
const MAX_SPANS: usize = 64;

/// Consecutive intervals in which no I/O completed while one was in flight throughout.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StallSpan {
    /// Seconds since the measured window started.
    pub start_s: f64,
    pub end_s: f64,
    /// Age of the oldest I/O in flight at the span's last interval end.
    pub oldest_in_flight_ns: u64,
}

/// What stalled in a run (a profile section).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Stalls {
    /// Intervals with no completion while an I/O was in flight through the whole interval.
    pub stalled_intervals: u64,
    /// The first of those spans (at most 64).
    pub spans: Vec<StallSpan>,
    /// I/Os slower than `slow_io_ns`, and the slowest I/O of the run.
    pub slow_io_ns: u64,
    pub slow_ios: u64,
    pub max_lat_ns: Option<u64>,
    /// The kernel's view of the target's requests (None: block probes not attached).
    pub requeued: Option<u64>,
    pub errors: Option<u64>,
    pub timeouts: Option<u64>,
}

impl Stalls {
    /// Whether anything stalled.
    pub fn found(&self) -> bool {
        // Requeues are not in it: a driver hands a request back whenever the device's queue is
        // full (a virtio ring of 1 MiB reads does so thousands of times a second), and the
        // request is issued again at once; the summary lists them beside the block stages.
        self.stalled_intervals > 0 || self.slow_ios > 0 || self.errors.unwrap_or(0) > 0
    }

    /// The finding in one line ("no I/O completed for 6 s (3.0–9.0 s) with I/Os in flight; …").
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.stalled_intervals > 0 {
            let secs: f64 = self.spans.iter().map(|s| s.end_s - s.start_s).sum();
            let at: Vec<String> = self
                .spans
                .iter()
                .take(3)
                .map(|s| format!("{:.1}–{:.1} s", s.start_s, s.end_s))
                .collect();
            let oldest = self.spans.iter().map(|s| s.oldest_in_flight_ns).max();
            parts.push(format!(
                "no I/O completed in {} interval{} ({:.1} s: {}{}) while I/Os were in flight{}",
                self.stalled_intervals,
                if self.stalled_intervals == 1 { "" } else { "s" },
                secs,
                at.join(", "),
                if self.spans.len() > 3 { ", …" } else { "" },
                oldest.map_or(String::new(), |o| format!(
                    " (oldest {})",
                    units::latency(o as f64)
                ))
            ));
        }
        if self.slow_ios > 0 {
            parts.push(format!(
                "{} I/O{} took over {} (slowest {})",
                self.slow_ios,
                if self.slow_ios == 1 { "" } else { "s" },
                units::latency(self.slow_io_ns as f64),
                units::latency(self.max_lat_ns.unwrap_or(0) as f64)
            ));
        }
        if let (Some(e), Some(t)) = (self.errors, self.timeouts) {
            if e > 0 {
                parts.push(format!(
                    "kernel: {e} request{} completed with an error ({t} timed out)",
                    if e == 1 { "" } else { "s" }
                ));
            }
        }
        parts.join("; ")
    }
}

/// Collects stall spans from whole-run intervals as they arrive (before any coarsening, which
/// would hide a stalled interval inside a busy one).
#[derive(Clone, Debug, Default)]
pub struct StallLog {
    stalled_intervals: u64,
    spans: Vec<StallSpan>,
    /// The end of the last stalled interval, to extend its span.
    last_end_ns: Option<u64>,
}

impl StallLog {
    pub fn add(&mut self, s: &IntervalSample) {
        let len = s.end_ns - s.start_ns;
        let stalled =
            len > 0 && s.ios() == 0 && s.oldest_in_flight_ns.is_some_and(|age| age >= len);
        if !stalled {
            return;
        }
        self.stalled_intervals += 1;
        let age = s.oldest_in_flight_ns.unwrap_or(0);
        let continues = self.last_end_ns == Some(s.start_ns);
        let room = self.spans.len() < MAX_SPANS;
        match self.spans.last_mut() {
            Some(span) if continues => {
                span.end_s = s.end_ns as f64 / 1e9;
                span.oldest_in_flight_ns = age;
            }
            _ if room => self.spans.push(StallSpan {
                start_s: s.start_ns as f64 / 1e9,
                end_s: s.end_ns as f64 / 1e9,
                oldest_in_flight_ns: age,
            }),
            _ => {}
        }
        self.last_end_ns = Some(s.end_ns);
    }

    /// The run's stalls: these spans with the slow I/Os among the app latencies `lat` (each
    /// direction's, or the live view's merged one) and the kernel's counts.
    pub fn stalls(&self, lat: &[&LatencyHistogram], block: Option<&BlockSnapshot>) -> Stalls {
        let (mut slow, mut max) = (0, None::<u64>);
        for h in lat {
            slow += h.count_above(SLOW_IO_NS);
            max = max.max(h.max_ns());
        }
        Stalls {
            stalled_intervals: self.stalled_intervals,
            spans: self.spans.clone(),
            slow_io_ns: SLOW_IO_NS,
            slow_ios: slow,
            max_lat_ns: max,
            requeued: block.map(|b| b.requeued),
            errors: block.map(|b| b.errors),
            timeouts: block.map(|b| b.timeouts),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn interval(index: u64, ios: u64, oldest: u64) -> IntervalSample {
        let mut s = IntervalSample::empty(0, index, index * SEC);
        s.end_ns = s.start_ns + SEC;
        s.read_ios = ios;
        s.oldest_in_flight_ns = Some(oldest);
        s
    }

    #[test]
    fn intervals_without_completions_while_an_io_is_stuck_make_one_span() {
        let mut log = StallLog::default();
        log.add(&interval(0, 900, 2_000_000));
        log.add(&interval(1, 400, SEC / 2));
        // Stuck from 1.5 s: intervals 2..=4 end with it 1.5, 2.5, 3.5 s old.
        for (i, age) in [(2, 3 * SEC / 2), (3, 5 * SEC / 2), (4, 7 * SEC / 2)] {
            log.add(&interval(i, 0, age));
        }
        log.add(&interval(5, 1200, 1_000_000));
        let mut lat = LatencyHistogram::default();
        lat.record(4 * SEC);
        lat.record(200_000);
        let s = log.stalls(&[&lat], None);
        assert_eq!(s.stalled_intervals, 3);
        assert_eq!(
            s.spans,
            [StallSpan {
                start_s: 2.0,
                end_s: 5.0,
                oldest_in_flight_ns: 7 * SEC / 2
            }]
        );
        assert_eq!((s.slow_ios, s.max_lat_ns), (1, Some(4 * SEC)));
        assert!(s.found());
        let text = s.describe();
        assert!(
            text.starts_with("no I/O completed in 3 intervals (3.0 s: 2.0–5.0 s)"),
            "{text}"
        );
        assert!(text.contains("1 I/O took over 1.00 s"), "{text}");
    }

    #[test]
    fn idle_intervals_of_a_paced_run_are_not_stalls() {
        let mut log = StallLog::default();
        // Nothing in flight, or an I/O issued mid-interval: quiet, not stuck.
        log.add(&interval(0, 0, 0));
        log.add(&interval(1, 0, SEC / 3));
        let s = log.stalls(&[], Some(&BlockSnapshot::default()));
        assert!(!s.found(), "{s:?}");
        assert_eq!(s.describe(), "");
    }

    #[test]
    fn requeues_are_the_drivers_backpressure_not_a_stall_but_errors_are_found() {
        let log = StallLog::default();
        // A virtio ring full of 1 MiB reads hands requests back thousands of times a second.
        let busy = BlockSnapshot {
            requeued: 6949,
            ..Default::default()
        };
        let s = log.stalls(&[], Some(&busy));
        assert_eq!(s.requeued, Some(6949));
        assert!(!s.found(), "{s:?}");
        let failing = BlockSnapshot {
            requeued: 3,
            errors: 2,
            timeouts: 1,
            ..Default::default()
        };
        let s = log.stalls(&[], Some(&failing));
        assert!(s.found());
        assert_eq!(
            s.describe(),
            "kernel: 2 requests completed with an error (1 timed out)"
        );
    }
}
