//! The tail autopsies of both hosts side by side: where each host's slowest I/Os spent their
//! time, and how the gap between them splits over the stages.

use serde::Serialize;

use super::BreakdownPart;
use crate::analysis::tail::TAIL_PERCENTILES;
use crate::model::profile::Profile;
use crate::model::stages::StageBreakdown;

/// The tail autopsy of both hosts at one percentile: the mean slow I/O of each (over the runs
/// that recorded the autopsy) and how the gap between them splits over the stages. Shown, not
/// judged: the tail rows carry the verdicts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TailWaterfall {
    pub percentile: f64,
    /// Runs whose autopsy had this set, per side.
    pub runs_a: usize,
    pub runs_b: usize,
    /// Share of each side's slow I/Os joined to their block request (the rest were counted at
    /// the run's mean block stages: their request was short).
    pub joined_a: f64,
    pub joined_b: f64,
    pub a: StageBreakdown,
    pub b: StageBreakdown,
    /// Per stage (queue, device, completion, software): B − A and its share of the app gap.
    pub rows: Vec<TailRow>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TailRow {
    pub stage: BreakdownPart,
    pub a_ns: f64,
    pub b_ns: f64,
    pub delta_ns: f64,
    /// Of B − A in the set's app latency (None when that gap is 0).
    pub share: Option<f64>,
}

/// Each side's mean slow I/O above percentile `p` over its runs' autopsies, and the share of
/// its slow I/Os joined to their request. With `folded`, completion is counted in device.
fn side_sets(side: &[&Profile], p: f64, folded: bool) -> (Vec<StageBreakdown>, f64) {
    let (mut means, mut ios, mut joined) = (Vec::new(), 0u64, 0u64);
    for set in side
        .iter()
        .flat_map(|prof| &prof.runs)
        .filter_map(|r| r.tail.as_ref()?.set(p))
    {
        let mut m = set.mean;
        if folded {
            m.device_ns += m.completion_ns;
            m.completion_ns = 0.0;
        }
        means.push(m);
        ios += set.ios;
        joined += set.joined;
    }
    (means, joined as f64 / ios.max(1) as f64)
}

/// The tail waterfalls of two sides' profiles (none when a side has no autopsy). With
/// `folded`, completion is counted in device on both sides, as in the mean waterfall.
pub(super) fn of(a: &[&Profile], b: &[&Profile], folded: bool) -> Vec<TailWaterfall> {
    TAIL_PERCENTILES
        .iter()
        .filter_map(|&p| {
            let ((sa, joined_a), (sb, joined_b)) =
                (side_sets(a, p, folded), side_sets(b, p, folded));
            let (ma, mb) = (StageBreakdown::mean_of(&sa)?, StageBreakdown::mean_of(&sb)?);
            let gap = mb.app_ns - ma.app_ns;
            let rows = BreakdownPart::ALL
                .iter()
                .map(|&stage| {
                    let (x, y) = (stage.of(&ma), stage.of(&mb));
                    TailRow {
                        stage,
                        a_ns: x,
                        b_ns: y,
                        delta_ns: y - x,
                        share: (gap != 0.0).then(|| (y - x) / gap),
                    }
                })
                .collect();
            Some(TailWaterfall {
                percentile: p,
                runs_a: sa.len(),
                runs_b: sb.len(),
                joined_a,
                joined_b,
                a: ma,
                b: mb,
                rows,
            })
        })
        .collect()
}
