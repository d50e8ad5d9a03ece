//! The collector: one thread owns the probe session, reads every map once per interval into
//! an owned snapshot, and sends it over the pipeline's channel. Nothing else touches the maps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::families::{ProbeConfig, ProbeStorage};
use crate::model::{ProbeSnapshot, SlowCall, SlowRequest};
use crate::report::CapabilityReport;
use crate::session::ProbeSession;

/// Messages from the collector.
#[derive(Debug)]
pub enum ProbeEvent {
    /// Sent once, after loading: what attached and what did not.
    Attached(CapabilityReport),
    /// Sent every interval: cumulative totals and the interval's own activity.
    Snapshot {
        cumulative: Box<ProbeSnapshot>,
        interval: Box<ProbeSnapshot>,
    },
    /// Sent after each snapshot when slow requests are asked for: those completed since the
    /// last (see `ProbeConfig::slow_request_ns`).
    SlowRequests(Vec<SlowRequest>),
    /// The attached processes' slow calls since the last batch (see
    /// `ProbeConfig::slow_call_ns`), sent right after their interval's slow requests.
    SlowCalls(Vec<SlowCall>),
}

/// The first snapshot comes this soon after attaching (or after one interval, when shorter),
/// whatever the interval: callers take it as the idle host's baseline before their workload
/// starts, and a rate over a second of an idle host is as telling as one over an hour.
pub const FIRST_SNAPSHOT_AFTER: Duration = Duration::from_secs(1);

/// With the msr probe attached, the sampler pauses for the first 1/this of every interval: its
/// timer moves the host's own timer writes, which the msr probe counts in the pauses instead.
const SAMPLER_PAUSE_DIVISOR: u32 = 4;

/// Sleeps until `deadline` in short steps, so a stop is noticed quickly; `each_step` runs
/// between them.
fn wait_until(deadline: Instant, stop: &AtomicBool, each_step: &mut dyn FnMut()) {
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        std::thread::sleep((deadline - Instant::now()).min(Duration::from_millis(50)));
        each_step();
    }
}

/// Whether the run statistics are on over interval `index` (0: the first after attaching).
/// They cost every program run two clock reads, as much as one of our programs: on over the
/// first interval (where `record` measures the idle host) and the second (a run's first
/// second of work), then over one interval in `every`: a short run pays for them over the same
/// share of its work as a long one (on over its first `every` intervals, a 4 s run paid for
/// them throughout), and still has a measured interval of work.
fn run_stats_on(index: u64, every: u64) -> bool {
    every <= 1 || index == 0 || index % every == 1
}

/// The running collector thread.
#[derive(Debug)]
pub struct ProbeHandle {
    thread: JoinHandle<()>,
    stop: Arc<AtomicBool>,
}

impl ProbeHandle {
    /// Starts the collector. It sends `Attached` first, a snapshot after
    /// [`FIRST_SNAPSHOT_AFTER`] (or `interval`, when shorter), then one every `interval` until
    /// stopped, then one final snapshot.
    pub fn start<T>(config: ProbeConfig, interval: Duration, tx: Sender<T>) -> Self
    where
        T: From<ProbeEvent> + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("vgtool-collect".into())
            .spawn(move || {
                let mut storage = ProbeStorage::default();
                let session = ProbeSession::load(&mut storage, &config);
                let _ = tx.send(T::from(ProbeEvent::Attached(session.report.clone())));
                let pauses = session.sampler_pauses();
                // Slow requests are drained (and their threshold follows the workload's) every
                // step of the wait, so the kernel's buffer holds only a fraction of a second.
                let slow_threshold = config.slow_request_ns.clone();
                let call_threshold = config.slow_call_ns.clone();
                let mut slow = (Vec::new(), Vec::new());
                let drain_slow = |slow: &mut (Vec<SlowRequest>, Vec<SlowCall>)| {
                    let ns = |t: &Option<Arc<std::sync::atomic::AtomicU64>>| {
                        t.as_ref().map_or(u64::MAX, |t| t.load(Ordering::Relaxed))
                    };
                    session.set_slow_request_threshold(ns(&slow_threshold));
                    session.set_slow_call_threshold(ns(&call_threshold));
                    if slow_threshold.is_some() {
                        slow.0.append(&mut session.drain_slow_requests());
                    }
                    if call_threshold.is_some() {
                        slow.1.append(&mut session.drain_slow_calls());
                    }
                };
                drain_slow(&mut slow);
                let mut previous = session.snapshot();
                let every = u64::from(config.run_stats_every.max(1));
                let mut intervals = 0u64;
                let mut length = interval.min(FIRST_SNAPSHOT_AFTER);
                let mut next = Instant::now() + length;
                loop {
                    if pauses {
                        session.set_sampler_running(false);
                        wait_until(
                            (Instant::now() + length / SAMPLER_PAUSE_DIVISOR).min(next),
                            &flag,
                            &mut || drain_slow(&mut slow),
                        );
                        session.set_sampler_running(true);
                    }
                    wait_until(next, &flag, &mut || drain_slow(&mut slow));
                    let cumulative = session.snapshot();
                    intervals += 1;
                    session.set_run_stats(run_stats_on(intervals, every));
                    // After the snapshot: it lists every process followed in the interval,
                    // those that exited in it too; the next one lists only the living.
                    session.refresh_followed();
                    let delta = cumulative.since(&previous);
                    previous = cumulative.clone();
                    let mut sent = tx.send(T::from(ProbeEvent::Snapshot {
                        cumulative: Box::new(cumulative),
                        interval: Box::new(delta),
                    }));
                    if sent.is_ok() {
                        drain_slow(&mut slow);
                    }
                    if slow_threshold.is_some() && sent.is_ok() {
                        let batch = std::mem::take(&mut slow.0);
                        sent = tx.send(T::from(ProbeEvent::SlowRequests(batch)));
                    }
                    if call_threshold.is_some() && sent.is_ok() {
                        let batch = std::mem::take(&mut slow.1);
                        sent = tx.send(T::from(ProbeEvent::SlowCalls(batch)));
                    }
                    if sent.is_err() || flag.load(Ordering::Relaxed) {
                        break;
                    }
                    length = interval;
                    next += length;
                }
                // The session drops here: links detach, objects unload.
            })
            .expect("spawning the collector thread");
        Self { thread, stop }
    }

    /// Stops the collector after one last snapshot and waits for it to detach the probes.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::run_stats_on;

    #[test]
    fn run_statistics_are_on_over_the_first_two_intervals_then_one_in_every() {
        let on = |every| {
            (0..12)
                .filter(|&i| run_stats_on(i, every))
                .collect::<Vec<_>>()
        };
        assert_eq!(on(4), [0, 1, 5, 9]);
        assert_eq!(on(1), (0..12).collect::<Vec<_>>());
        // A 4 s run after the idle second: one of its four intervals of work.
        assert_eq!((1..5).filter(|&i| run_stats_on(i, 4)).count(), 1);
    }
}
