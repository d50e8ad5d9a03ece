//! The one channel of the pipeline: workload threads and the probe collector send owned events;
//! one sink (the [`crate::run::recorder::Recorder`] of `record` or of the TUI) consumes them.

use virtgap_probes::ProbeEvent;
use virtgap_workloads::WorkloadEvent;

#[derive(Debug)]
pub enum Event {
    Workload(WorkloadEvent),
    Probe(ProbeEvent),
}

impl From<WorkloadEvent> for Event {
    fn from(e: WorkloadEvent) -> Self {
        Self::Workload(e)
    }
}

impl From<ProbeEvent> for Event {
    fn from(e: ProbeEvent) -> Self {
        Self::Probe(e)
    }
}

/// What a pipeline channel carries: its events, and possibly more (the TUI's key presses go
/// down the same channel, so one receiver sees everything in order).
pub trait Carries: From<WorkloadEvent> + From<ProbeEvent> + Send + Sized + 'static {
    /// The pipeline's event, or the value itself when it is something else.
    fn into_event(self) -> Result<Event, Self>;
}

impl Carries for Event {
    fn into_event(self) -> Result<Event, Self> {
        Ok(self)
    }
}

/// "vda" for (254, 0), from /sys/dev/block; "254:0" when sysfs does not say.
pub fn device_name((major, minor): (u32, u32)) -> String {
    std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| format!("{major}:{minor}"))
}
