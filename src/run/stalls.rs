//! Finding stalls as a run goes: the intervals in which the workload's I/Os were in flight and
//! none completed, I/Os slower than [`SLOW_IO_NS`], and the kernel's errors. A pause of virtgap
//! itself is not a stall: while the process is stopped (SIGSTOP, a debugger) or not scheduled,
//! its I/Os complete unseen and look stuck. A watch thread that wakes every [`WATCH_TICK`]
//! notices when it did not run, and intervals it missed are put down to the pause instead.

use std::collections::VecDeque;
use std::sync::{Mutex, Once, OnceLock, PoisonError};
use std::time::Duration;

use virtgap_probes::model::BlockSnapshot;
use virtgap_workloads::histogram::LatencyHistogram;
use virtgap_workloads::slow::monotonic_ns;
use virtgap_workloads::stats::IntervalSample;

use crate::model::stalls::{PauseSpan, StallSpan, Stalls, MAX_SPANS, SLOW_IO_NS};

/// How often the pause watch reads the clock.
pub const WATCH_TICK: Duration = Duration::from_millis(20);
/// A tick this much later than due is a pause of the process (a busy host delays a sleeping
/// thread's wakeup by milliseconds, not this).
const MIN_PAUSE_NS: u64 = 100_000_000;
/// Pauses remembered; older ones are dropped.
const MAX_PAUSES: usize = 256;

/// The process-wide pause watch: when the watch thread last ran, and the gaps in its running,
/// on CLOCK_MONOTONIC (which goes on while the process is stopped).
#[derive(Debug)]
struct PauseWatch {
    last_ns: u64,
    pauses: VecDeque<(u64, u64)>,
}

impl PauseWatch {
    /// The clock read `now_ns`, by the watch thread or a reader: a gap since the last read is a
    /// pause. A reader may see a pause first, just after the process resumes.
    fn observe(&mut self, now_ns: u64) {
        let tick_ns = WATCH_TICK.as_nanos() as u64;
        if now_ns.saturating_sub(self.last_ns) >= tick_ns + MIN_PAUSE_NS {
            if self.pauses.len() == MAX_PAUSES {
                self.pauses.pop_front();
            }
            self.pauses.push_back((self.last_ns, now_ns));
        }
        self.last_ns = self.last_ns.max(now_ns);
    }

    /// Starts the watch thread (once per process) and returns the watch.
    fn started() -> &'static Mutex<PauseWatch> {
        static WATCH: OnceLock<Mutex<PauseWatch>> = OnceLock::new();
        static THREAD: Once = Once::new();
        let watch = WATCH.get_or_init(|| {
            Mutex::new(PauseWatch {
                last_ns: monotonic_ns(),
                pauses: VecDeque::new(),
            })
        });
        THREAD.call_once(|| {
            // Without the thread, the pauses a reader sees still count.
            let _ = std::thread::Builder::new()
                .name("vgtool-pauses".into())
                .spawn(move || loop {
                    std::thread::sleep(WATCH_TICK);
                    Self::lock(watch).observe(monotonic_ns());
                });
        });
        watch
    }

    fn lock(watch: &Mutex<PauseWatch>) -> std::sync::MutexGuard<'_, PauseWatch> {
        watch.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pauses so far, the one just ended included.
    fn pauses() -> Vec<(u64, u64)> {
        let mut watch = Self::lock(Self::started());
        watch.observe(monotonic_ns());
        watch.pauses.iter().copied().collect()
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
    /// Whether the process's pauses are watched (see [`Self::watching`]).
    watching: bool,
    /// Where the measured window's 0 lies on CLOCK_MONOTONIC: the earliest arrival less the
    /// end of the interval that arrived (an interval is sent once it has ended).
    origin_ns: Option<u64>,
    /// The end of the last interval seen, in window time.
    seen_until_ns: u64,
    /// The pauses (by their start) that explained stalled-looking intervals.
    excusing: Vec<u64>,
}

impl StallLog {
    /// A log that tells a pause of the process from a stall, by a watch thread started with
    /// the first one. The default log takes every stalled interval as a stall.
    pub fn watching() -> Self {
        PauseWatch::started();
        Self {
            watching: true,
            ..Self::default()
        }
    }

    /// A log like this one but empty (the TUI's reset): the same watch and time origin.
    pub fn cleared(&self) -> Self {
        Self {
            watching: self.watching,
            origin_ns: self.origin_ns,
            ..Self::default()
        }
    }

    /// A whole-run interval, as it arrives.
    pub fn add(&mut self, s: &IntervalSample) {
        if self.watching {
            let now = monotonic_ns();
            self.add_seen(s, Some(now), &PauseWatch::pauses());
        } else {
            self.add_seen(s, None, &[]);
        }
    }

    /// `s`, arrived at `arrived_ns` on CLOCK_MONOTONIC, with the process's `pauses` so far.
    fn add_seen(&mut self, s: &IntervalSample, arrived_ns: Option<u64>, pauses: &[(u64, u64)]) {
        if let Some(at) = arrived_ns {
            let origin = at.saturating_sub(s.end_ns);
            self.origin_ns = Some(self.origin_ns.map_or(origin, |o| o.min(origin)));
        }
        self.seen_until_ns = self.seen_until_ns.max(s.end_ns);
        let len = s.end_ns - s.start_ns;
        let stalled =
            len > 0 && s.ios() == 0 && s.oldest_in_flight_ns.is_some_and(|age| age >= len);
        if !stalled {
            return;
        }
        if let Some(origin) = self.origin_ns {
            let (start, end) = (origin + s.start_ns, origin + s.end_ns);
            if let Some(&(ps, _)) = pauses.iter().find(|&&(ps, pe)| ps < end && pe > start) {
                if !self.excusing.contains(&ps) && self.excusing.len() < MAX_SPANS {
                    self.excusing.push(ps);
                }
                return;
            }
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
        let pauses = if self.watching {
            PauseWatch::pauses()
        } else {
            Vec::new()
        };
        self.stalls_given(lat, block, &pauses)
    }

    fn stalls_given(
        &self,
        lat: &[&LatencyHistogram],
        block: Option<&BlockSnapshot>,
        pauses: &[(u64, u64)],
    ) -> Stalls {
        // The pauses within the intervals seen: those that hid completions, and any of a second
        // or more (an I/O in flight through one took that long as the workload saw it).
        let mut paused = Vec::new();
        let mut longest_ns = 0;
        if let Some(origin) = self.origin_ns {
            let window_end = origin + self.seen_until_ns;
            for &(ps, pe) in pauses {
                let len = pe - ps;
                let overlaps = ps < window_end && pe > origin;
                if overlaps && (self.excusing.contains(&ps) || len >= SLOW_IO_NS) {
                    longest_ns = longest_ns.max(len);
                    paused.push(PauseSpan {
                        start_s: (ps as f64 - origin as f64) / 1e9,
                        end_s: (pe as f64 - origin as f64) / 1e9,
                    });
                }
            }
        }
        paused.truncate(MAX_SPANS);
        let slow_io_ns = SLOW_IO_NS.saturating_add(longest_ns);
        let (mut slow, mut max) = (0, None::<u64>);
        for h in lat {
            slow += h.count_above(slow_io_ns);
            max = max.max(h.max_ns());
        }
        Stalls {
            stalled_intervals: self.stalled_intervals,
            spans: self.spans.clone(),
            slow_io_ns,
            slow_ios: slow,
            max_lat_ns: max,
            requeued: block.map(|b| b.requeued),
            errors: block.map(|b| b.errors),
            timeouts: block.map(|b| b.timeouts),
            process_paused: paused,
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

    #[test]
    fn the_watch_takes_a_late_tick_for_a_pause() {
        let ms = 1_000_000;
        let mut w = PauseWatch {
            last_ns: 0,
            pauses: VecDeque::new(),
        };
        w.observe(20 * ms);
        w.observe(60 * ms);
        assert!(w.pauses.is_empty(), "a tick a little late is a busy host");
        w.observe(3_060 * ms);
        w.observe(3_000 * ms);
        assert_eq!(w.pauses, [(60 * ms, 3_060 * ms)]);
        assert_eq!(
            w.last_ns,
            3_060 * ms,
            "the clock read last does not go back"
        );
    }

    #[test]
    fn intervals_missed_while_the_process_was_stopped_are_not_a_stall() {
        let origin = 1_000 * SEC;
        let ms = 1_000_000;
        // Stopped from 2.5 s to 5.5 s of the window: intervals 3 and 4 saw no completion, and
        // arrived after the process went on; the others arrived as they ended.
        let pause = (origin + 2_500 * ms, origin + 5_500 * ms);
        let mut log = StallLog::default();
        for (i, ios, oldest) in [
            (0, 900, ms),
            (1, 900, ms),
            (2, 400, SEC / 2),
            (3, 0, 3 * SEC / 2),
            (4, 0, 5 * SEC / 2),
            (5, 600, ms),
            (6, 900, ms),
        ] {
            let s = interval(i, ios, oldest);
            let end = origin + s.end_ns;
            let arrived = if end > pause.0 {
                end.max(pause.1) + ms
            } else {
                end
            };
            let pauses: &[(u64, u64)] = if arrived > pause.1 { &[pause] } else { &[] };
            log.add_seen(&s, Some(arrived), pauses);
        }
        let mut lat = LatencyHistogram::default();
        lat.record(3 * SEC + 10 * ms);
        lat.record(200_000);
        let s = log.stalls_given(&[&lat], None, &[pause]);
        assert_eq!(s.stalled_intervals, 0, "{s:?}");
        assert!(!s.found(), "{s:?}");
        assert_eq!(
            s.process_paused,
            [PauseSpan {
                start_s: 2.5,
                end_s: 5.5
            }]
        );
        assert_eq!(s.slow_io_ns, SLOW_IO_NS + 3 * SEC);
        assert_eq!(
            s.slow_ios, 0,
            "the I/O in flight through the pause is not slow"
        );
        let text = s.describe_pauses().unwrap();
        assert!(
            text.starts_with(
                "virtgap itself did not run for 3.0 s (2.5–5.5 s): the process was stopped"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_stall_away_from_any_pause_is_still_a_stall() {
        let origin = 1_000 * SEC;
        let ms = 1_000_000;
        let blip = (origin + 500 * ms, origin + 700 * ms);
        let mut log = StallLog::default();
        for (i, ios, oldest) in [(0, 900, ms), (1, 0, 3 * SEC / 2), (2, 0, 5 * SEC / 2)] {
            let s = interval(i, ios, oldest);
            log.add_seen(&s, Some(origin + s.end_ns + ms), &[blip]);
        }
        let s = log.stalls_given(&[], None, &[blip]);
        assert_eq!(s.stalled_intervals, 2);
        assert!(s.found());
        assert!(
            s.process_paused.is_empty(),
            "a short pause that hid nothing is not reported: {s:?}"
        );
        assert_eq!(s.slow_io_ns, SLOW_IO_NS);
        assert_eq!(s.describe_pauses(), None);
    }
}
