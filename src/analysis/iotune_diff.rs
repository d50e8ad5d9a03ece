//! Two hosts' iotune results compared: per phase, the figure's ratio judged over the measured
//! runs, and the diff of the two phases' profiles — the stage waterfall, the CPUs' interrupt
//! load and the hypervisor at each host's saturation point.

use crate::analysis::diff::{diff_hosts, DiffOptions, MetricId, ProfileDiff, Row};
use crate::model::host::Fingerprint;
use crate::model::iotune::{IotunePhase, IotuneProfile, Phase};

/// One phase on both hosts.
#[derive(Clone, Debug)]
pub struct PhaseDiff {
    pub phase: Phase,
    /// Each host's figure (bytes/s or IOPS: the mean of its measured runs).
    pub a: f64,
    pub b: f64,
    /// Each host's saturation point: (workers, depth per worker).
    pub at_a: (u32, u32),
    pub at_b: (u32, u32),
    /// The figure compared over runs: the throughput row of the phases' diff (its I/Os per
    /// second; at one request size, the same ratio as the bandwidth).
    pub figure: Row,
    /// The phases' profiles compared.
    pub diff: ProfileDiff,
}

/// The comparison of two iotune results.
#[derive(Clone, Debug)]
pub struct IotuneDiff {
    pub host_a: Fingerprint,
    pub host_b: Fingerprint,
    pub target_a: String,
    pub target_b: String,
    pub phases: Vec<PhaseDiff>,
    /// Phases only one host ran (the other had no consent to write, or was cut short).
    pub only_a: Vec<Phase>,
    pub only_b: Vec<Phase>,
}

fn phase_diff(a: &IotunePhase, b: &IotunePhase, opts: &DiffOptions) -> PhaseDiff {
    let diff = diff_hosts(&[&a.profile], &[&b.profile], opts);
    let figure = diff
        .row(MetricId::Iops)
        .cloned()
        .expect("a diff always has the throughput row");
    PhaseDiff {
        phase: a.phase,
        a: a.figure,
        b: b.figure,
        at_a: (a.workers, a.qd),
        at_b: (b.workers, b.qd),
        figure,
        diff,
    }
}

/// Compares host A's iotune result with host B's, phase by phase.
pub fn diff(a: &IotuneProfile, b: &IotuneProfile, opts: &DiffOptions) -> IotuneDiff {
    let mut phases = Vec::new();
    let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
    for phase in Phase::ALL {
        match (a.phase(phase), b.phase(phase)) {
            (Some(x), Some(y)) => phases.push(phase_diff(x, y, opts)),
            (Some(_), None) => only_a.push(phase),
            (None, Some(_)) => only_b.push(phase),
            (None, None) => {}
        }
    }
    IotuneDiff {
        host_a: a.host.clone(),
        host_b: b.host.clone(),
        target_a: a.target.clone(),
        target_b: b.target.clone(),
        phases,
        only_a,
        only_b,
    }
}
