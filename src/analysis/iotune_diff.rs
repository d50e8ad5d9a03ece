//! Two hosts' iotune results compared: per phase, the figure's ratio judged over the results
//! (or over the measured runs where a side has one result), and the diff of the two phases'
//! profiles — the stage waterfall, the CPUs' interrupt load and the hypervisor at each host's
//! saturation point.

use serde::Serialize;

use crate::analysis::diff::{
    compare_replicates, diff_hosts, DiffOptions, MetricId, ProfileDiff, Row, SideSource, Verdict,
};
use crate::model::host::Fingerprint;
use crate::model::iotune::{IotunePhase, IotuneProfile, Phase};
use crate::model::profile::Profile;

/// What a figure's replicates are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FigureReplicates {
    /// Each result's mean is one replicate: the drift between results recorded apart is in
    /// the interval. Used when both sides have two or more results.
    Results,
    /// The measured runs of all results, pooled: with one result on a side its runs ran back
    /// to back, so the interval misses the drift between results.
    Runs,
}

/// One phase on both hosts.
#[derive(Clone, Debug)]
pub struct PhaseDiff {
    pub phase: Phase,
    /// Each host's figure (bytes/s or IOPS): the mean of its results' means, or of its runs.
    pub a: f64,
    pub b: f64,
    /// Each host's saturation point (its first result's): (workers, depth per worker).
    pub at_a: (u32, u32),
    pub at_b: (u32, u32),
    /// The figure compared: over results, each result's mean figure as a replicate; over runs,
    /// the throughput row of the phases' diff (its I/Os per second; at one request size, the
    /// same ratio as the bandwidth).
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
    /// What the figures were judged over.
    pub replicates: FigureReplicates,
    /// Where each side's results came from: their files and when they were measured.
    pub source_a: SideSource,
    pub source_b: SideSource,
}

impl IotuneDiff {
    /// The diff with each side's files named, as the caller read them.
    pub fn with_files(mut self, a: Vec<String>, b: Vec<String>) -> Self {
        self.source_a.files = a;
        self.source_b.files = b;
        self
    }

    /// Whether a figure of B is significantly lower (each is a throughput: lower is slower).
    pub fn b_slower(&self) -> bool {
        self.phases.iter().any(|p| {
            p.figure.verdict == Verdict::Significant && p.figure.effect.is_some_and(|e| e < 0.0)
        })
    }

    /// Whether any figure is significantly different, either way.
    pub fn any_significant(&self) -> bool {
        self.phases
            .iter()
            .any(|p| p.figure.verdict == Verdict::Significant)
    }
}

/// A side's phases' profiles.
fn profiles<'a>(side: &[&'a IotunePhase]) -> Vec<&'a Profile> {
    side.iter().map(|p| &p.profile).collect()
}

/// The phase `phase` of every result of a side (None: one of them did not measure it).
fn phase_of<'a>(side: &[&'a IotuneProfile], phase: Phase) -> Option<Vec<&'a IotunePhase>> {
    side.iter().map(|r| r.phase(phase)).collect()
}

/// A phase's figure in each result of a side (each the mean of its measured runs).
fn result_figures(side: &[&IotunePhase]) -> Vec<f64> {
    side.iter().map(|p| p.figure).collect()
}

fn phase_diff(
    a: &[&IotunePhase],
    b: &[&IotunePhase],
    over: FigureReplicates,
    opts: &DiffOptions,
) -> PhaseDiff {
    let diff = diff_hosts(&profiles(a), &profiles(b), opts);
    let (figure, a_figure, b_figure) = match over {
        FigureReplicates::Results => {
            let row =
                compare_replicates(MetricId::Iops, &result_figures(a), &result_figures(b), opts);
            let (x, y) = (row.a.unwrap_or(f64::NAN), row.b.unwrap_or(f64::NAN));
            (row, x, y)
        }
        FigureReplicates::Runs => {
            // A side's figure: the mean over all its measured runs.
            let mean = |side: &[&IotunePhase]| {
                let runs: Vec<f64> = side.iter().flat_map(|p| p.runs.iter().copied()).collect();
                runs.iter().sum::<f64>() / runs.len().max(1) as f64
            };
            let row = diff
                .row(MetricId::Iops)
                .cloned()
                .expect("a diff always has the throughput row");
            (row, mean(a), mean(b))
        }
    };
    PhaseDiff {
        phase: a[0].phase,
        a: a_figure,
        b: b_figure,
        at_a: (a[0].workers, a[0].qd),
        at_b: (b[0].workers, b[0].qd),
        figure,
        diff,
    }
}

/// Compares host A's iotune results with host B's (each side non-empty), phase by phase: over
/// the results when both sides have two or more, else over their pooled measured runs.
pub fn diff(a: &[&IotuneProfile], b: &[&IotuneProfile], opts: &DiffOptions) -> IotuneDiff {
    let replicates = if a.len() >= 2 && b.len() >= 2 {
        FigureReplicates::Results
    } else {
        FigureReplicates::Runs
    };
    let mut phases = Vec::new();
    let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
    for phase in Phase::ALL {
        // A phase is compared where every result of both sides measured it.
        match (phase_of(a, phase), phase_of(b, phase)) {
            (Some(x), Some(y)) => phases.push(phase_diff(&x, &y, replicates, opts)),
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
        replicates,
        source_a: recorded(a),
        source_b: recorded(b),
    }
}

/// When a side's results were measured, from their own start and end.
fn recorded(side: &[&IotuneProfile]) -> SideSource {
    SideSource::recorded(side.iter().map(|r| (r.started_unix_ms, r.ended_unix_ms)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::diff::Verdict;
    use crate::model::iotune::fixture;

    /// A result whose read_iops phase measured `runs`.
    fn result(runs: &[f64]) -> IotuneProfile {
        fixture("/dev/vdb", "", &[(Phase::ReadIops, runs.to_vec())])
    }

    fn read_iops(a: &[IotuneProfile], b: &[IotuneProfile]) -> (FigureReplicates, Row) {
        let opts = DiffOptions { min_effect: 0.10 };
        let d = diff(
            &a.iter().collect::<Vec<_>>(),
            &b.iter().collect::<Vec<_>>(),
            &opts,
        );
        (d.replicates, d.phases[0].figure.clone())
    }

    /// Results that drift 20% between them while their back-to-back runs agree within 1%:
    /// judged over results, the drift is in the interval and no difference is called.
    #[test]
    fn drift_between_results_is_in_the_interval() {
        let a = [result(&[100e3, 101e3, 99e3]), result(&[80e3, 81e3, 79e3])];
        let b = [result(&[81e3, 80e3, 79e3]), result(&[66e3, 67e3, 65e3])];
        let (over, row) = read_iops(&a, &b);
        assert_eq!(over, FigureReplicates::Results);
        assert_eq!(row.a, Some(90e3));
        assert_eq!(row.b, Some(73e3));
        assert_eq!(row.verdict, Verdict::Inconclusive, "{row:?}");
        assert!(row.runs_needed.is_some_and(|n| n > 2), "{row:?}");
        // One result on a side: its runs are the replicates (the profiles' throughput).
        let (over, _) = read_iops(&a[..1], &b);
        assert_eq!(over, FigureReplicates::Runs);
    }

    /// A 40% limit under 10% drift, four results a side: significant, and its interval holds
    /// the true ratio.
    #[test]
    fn a_limit_beyond_the_drift_is_significant_over_results() {
        let drift = [1.0, 0.92, 1.06, 0.97];
        let a: Vec<IotuneProfile> = drift.iter().map(|d| result(&[300e3 * d])).collect();
        let b: Vec<IotuneProfile> = drift.iter().rev().map(|d| result(&[180e3 * d])).collect();
        let (over, row) = read_iops(&a, &b);
        assert_eq!(over, FigureReplicates::Results);
        assert_eq!(row.verdict, Verdict::Significant, "{row:?}");
        let (low, high) = (row.effect_low.unwrap(), row.effect_high.unwrap());
        assert!(low < -0.4 && -0.4 < high, "[{low}, {high}]");
    }
}
