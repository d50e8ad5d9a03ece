//! The one channel of the pipeline: workload threads and the probe collector send owned events;
//! one sink (`record`'s recorder or the TUI) consumes them.

use virtgap_probes::{CapabilityReport, ProbeEvent, ProbeSnapshot};
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

/// What the probes reported over a run.
#[derive(Debug, Default)]
pub struct ProbeResults {
    /// None when the run had no probes.
    pub report: Option<CapabilityReport>,
    /// Totals since the probes attached, as of the last snapshot.
    pub cumulative: Option<ProbeSnapshot>,
    /// Kernel names of the block devices seen ("vda").
    pub device_names: std::collections::BTreeMap<(u32, u32), String>,
    /// Snapshots that fall in the workload's ramp (see [`Self::skipping_ramp`]).
    ramp_snapshots: u64,
    snapshots: u64,
    /// The totals as the measured window began (None: no ramp, or it has not ended).
    at_measure_start: Option<ProbeSnapshot>,
    /// The block probe's slow requests, for the tail autopsy (when asked for).
    pub slow_requests: Vec<virtgap_probes::model::SlowRequest>,
    /// The idle window before the workload started, a second or the interval when shorter
    /// (see [`Self::set_idle`]); its figures are read as rates over its own length.
    idle: Option<ProbeSnapshot>,
    /// The totals at its end: where the window starts when there is no ramp.
    at_idle_end: Option<ProbeSnapshot>,
}

impl ProbeResults {
    /// Results that know the first `ramp_snapshots` interval snapshots are the ramp's, so
    /// [`Self::window`] can leave them out.
    pub fn skipping_ramp(ramp_snapshots: u64) -> Self {
        Self {
            ramp_snapshots,
            ..Self::default()
        }
    }

    /// The probes' activity over the measured window: the totals less those at the ramp's end
    /// (or at the idle interval's end, without a ramp).
    pub fn window(&self) -> Option<ProbeSnapshot> {
        let total = self.cumulative.as_ref()?;
        Some(
            match self.at_measure_start.as_ref().or(self.at_idle_end.as_ref()) {
                Some(start) => total.since(start),
                None => total.clone(),
            },
        )
    }

    /// Keeps the first snapshot, taken before the workload started, as the idle baseline. It
    /// is not an interval of the run: the series and the ramp count never see it.
    pub fn set_idle(&mut self, cumulative: ProbeSnapshot, interval: ProbeSnapshot) {
        self.at_idle_end = Some(cumulative);
        self.idle = Some(interval);
    }

    /// The idle interval's host-wide figures (None: none was taken).
    pub fn idle_baseline(
        &self,
        devs: Option<&[virtgap_probes::model::DevNum]>,
    ) -> Option<crate::model::profile::IdleBaseline> {
        let idle = self.idle.as_ref()?;
        let seconds = idle.elapsed_ns as f64 / 1e9;
        (seconds > 0.0).then(|| {
            crate::model::profile::IdleBaseline::of(
                &crate::model::profile::ProbeInterval::of(idle, devs),
                seconds,
                self.report.as_ref().is_some_and(|r| r.counts_ipis()),
            )
        })
    }

    /// Keeps the report and the latest totals; returns the interval's snapshot for the series
    /// (only the latest totals are kept here, so memory does not grow with the run).
    pub fn add(&mut self, event: ProbeEvent) -> Option<Box<ProbeSnapshot>> {
        match event {
            ProbeEvent::Attached(report) => {
                self.report = Some(report);
                None
            }
            ProbeEvent::Snapshot {
                cumulative,
                interval,
            } => {
                if let Some(block) = &cumulative.block {
                    for d in &block.devices {
                        self.device_names
                            .entry(d.dev)
                            .or_insert_with(|| device_name(d.dev));
                    }
                }
                self.snapshots += 1;
                if self.ramp_snapshots > 0 && self.snapshots == self.ramp_snapshots {
                    self.at_measure_start = Some((*cumulative).clone());
                }
                self.cumulative = Some(*cumulative);
                Some(interval)
            }
            ProbeEvent::SlowRequests(mut slow) => {
                self.slow_requests.append(&mut slow);
                None
            }
        }
    }
}

/// "vda" for (254, 0), from /sys/dev/block; "254:0" when sysfs does not say.
pub fn device_name((major, minor): (u32, u32)) -> String {
    std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| format!("{major}:{minor}"))
}
