//! Two hosts' iotune results compared: per phase, the figure's ratio judged over the measured
//! runs, and the diff of the two phases' profiles — the stage waterfall, the CPUs' interrupt
//! load and the hypervisor at each host's saturation point.

use crate::analysis::diff::{diff_hosts, DiffOptions, MetricId, ProfileDiff, Row};
use crate::model::host::Fingerprint;
use crate::model::iotune::{IotunePhase, IotuneProfile, Phase};
use crate::model::profile::Profile;

/// One phase on both hosts.
#[derive(Clone, Debug)]
pub struct PhaseDiff {
    pub phase: Phase,
    /// Each host's figure (bytes/s or IOPS: the mean of its results' measured runs).
    pub a: f64,
    pub b: f64,
    /// Each host's saturation point (its first result's): (workers, depth per worker).
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
    /// Phases only one side measured in every result (the other had no consent to write, or
    /// was cut short).
    pub only_a: Vec<Phase>,
    pub only_b: Vec<Phase>,
    /// Results pooled per side: with one, its runs ran back to back, and drift between results
    /// recorded apart is not in the intervals.
    pub results_a: usize,
    pub results_b: usize,
}

/// A side's phases' profiles.
fn profiles<'a>(side: &[&'a IotunePhase]) -> Vec<&'a Profile> {
    side.iter().map(|p| &p.profile).collect()
}

/// The phase `phase` of every result of a side (None: one of them did not measure it).
fn phase_of<'a>(side: &[&'a IotuneProfile], phase: Phase) -> Option<Vec<&'a IotunePhase>> {
    side.iter().map(|r| r.phase(phase)).collect()
}

fn phase_diff(a: &[&IotunePhase], b: &[&IotunePhase], opts: &DiffOptions) -> PhaseDiff {
    let diff = diff_hosts(&profiles(a), &profiles(b), opts);
    let figure = diff
        .row(MetricId::Iops)
        .cloned()
        .expect("a diff always has the throughput row");
    // A side's figure: the mean over all its measured runs.
    let mean = |side: &[&IotunePhase]| {
        let runs: Vec<f64> = side.iter().flat_map(|p| p.runs.iter().copied()).collect();
        runs.iter().sum::<f64>() / runs.len().max(1) as f64
    };
    PhaseDiff {
        phase: a[0].phase,
        a: mean(a),
        b: mean(b),
        at_a: (a[0].workers, a[0].qd),
        at_b: (b[0].workers, b[0].qd),
        figure,
        diff,
    }
}

/// Compares host A's iotune results with host B's (each side non-empty; a side's results pool
/// their measured runs as replicates), phase by phase.
pub fn diff(a: &[&IotuneProfile], b: &[&IotuneProfile], opts: &DiffOptions) -> IotuneDiff {
    let mut phases = Vec::new();
    let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
    for phase in Phase::ALL {
        // A phase is compared where every result of both sides measured it.
        match (phase_of(a, phase), phase_of(b, phase)) {
            (Some(x), Some(y)) => phases.push(phase_diff(&x, &y, opts)),
            (Some(_), None) => only_a.push(phase),
            (None, Some(_)) => only_b.push(phase),
            (None, None) => {}
        }
    }
    IotuneDiff {
        host_a: a[0].host.clone(),
        host_b: b[0].host.clone(),
        target_a: a[0].target.clone(),
        target_b: b[0].target.clone(),
        phases,
        only_a,
        only_b,
        results_a: a.len(),
        results_b: b.len(),
    }
}
