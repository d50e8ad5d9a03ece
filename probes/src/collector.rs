//! The collector: one thread owns the probe session, reads every map once per interval into
//! an owned snapshot, and sends it over the pipeline's channel. Nothing else touches the maps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::families::{ProbeConfig, ProbeStorage};
use crate::model::ProbeSnapshot;
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
}

/// With the msr probe attached, the sampler pauses for the first 1/this of every interval: its
/// timer moves the host's own timer writes, which the msr probe counts in the pauses instead.
const SAMPLER_PAUSE_DIVISOR: u32 = 4;

/// Sleeps until `deadline` in short steps, so a stop is noticed quickly.
fn wait_until(deadline: Instant, stop: &AtomicBool) {
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        std::thread::sleep((deadline - Instant::now()).min(Duration::from_millis(50)));
    }
}

/// The running collector thread.
#[derive(Debug)]
pub struct ProbeHandle {
    thread: JoinHandle<()>,
    stop: Arc<AtomicBool>,
}

impl ProbeHandle {
    /// Starts the collector. It sends `Attached` first, then a snapshot every `interval` until
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
                let mut previous = session.snapshot();
                let mut next = Instant::now() + interval;
                loop {
                    if pauses {
                        session.set_sampler_running(false);
                        wait_until(
                            (Instant::now() + interval / SAMPLER_PAUSE_DIVISOR).min(next),
                            &flag,
                        );
                        session.set_sampler_running(true);
                    }
                    wait_until(next, &flag);
                    let cumulative = session.snapshot();
                    let delta = cumulative.since(&previous);
                    previous = cumulative.clone();
                    let sent = tx.send(T::from(ProbeEvent::Snapshot {
                        cumulative: Box::new(cumulative),
                        interval: Box::new(delta),
                    }));
                    if sent.is_err() || flag.load(Ordering::Relaxed) {
                        break;
                    }
                    next += interval;
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
