//! How a row is judged — over which replicates, on which scale, at which confidence — and the
//! rows of the waterfall and the tails, each family of rows at its own confidence.

use virtgap_probes::hypervisor::{Hypervisor, Mechanism};

use super::figures::Side;
use super::{
    Basis, BreakdownPart, DiffOptions, HypervisorBlock, MetricId, Row, Scale, Verdict, Waterfall,
};
use crate::analysis::stats::{moments, runs_to_resolve, welch_half_width, CONFIDENCE};
use crate::analysis::tail::TAIL_PERCENTILES;
use crate::model::stages::Stage;

/// The block stages of the mean, compared as ratios (the software residual follows them).
const BLOCK_STAGES: [MetricId; 3] = [
    MetricId::Stage(BreakdownPart::Queue),
    MetricId::Stage(BreakdownPart::Device),
    MetricId::Stage(BreakdownPart::Completion),
];

/// Host-wide figures per I/O, listed under the software residual as evidence.
pub(super) const HOST_WIDE: [MetricId; 5] = [
    MetricId::WakeupPerIo,
    MetricId::HardirqPerIo,
    MetricId::SoftirqPerIo,
    MetricId::IpisPerIo,
    MetricId::MsrExitsPerIo,
];

/// The stages' tail rows (every stage but the app, at each tail percentile): one family.
pub(super) const STAGE_TAILS: usize = (Stage::ALL.len() - 1) * TAIL_PERCENTILES.len();

/// How a row is judged: over what replicates, against what effect, at what confidence.
#[derive(Clone, Copy)]
pub(super) struct Judging<'a> {
    pub basis: Basis,
    /// Each host's runs come from one recording: a difference found holds between these two
    /// sessions only (see [`Verdict::OneSession`]).
    pub one_session: bool,
    pub opts: &'a DiffOptions,
    pub confidence: f64,
}

impl Judging<'_> {
    /// The same judging for a row of a family of `members`, each at 1 − 5%/members
    /// (Bonferroni), so that the family, like one row, calls a difference that is not there at
    /// most 5% of the time.
    fn in_family_of(self, members: usize) -> Self {
        Self {
            confidence: 1.0 - (1.0 - CONFIDENCE) / members as f64,
            ..self
        }
    }
}

/// A comparison's outcome on its scale.
pub(super) struct Judgement {
    pub effect: f64,
    pub low: Option<f64>,
    pub high: Option<f64>,
    pub verdict: Verdict,
    pub runs_needed: Option<u32>,
}

/// Compares replicates `a` and `b` of one metric. On the ratio scale the replicates are logged;
/// on the difference scale they are divided by `reference`. `points` are the hosts' values,
/// which set the estimate when there are too few replicates for an interval.
pub(super) fn judge(
    a: &[f64],
    b: &[f64],
    points: (f64, f64),
    scale: Scale,
    reference: f64,
    how: Judging,
) -> Judgement {
    let Judging {
        basis,
        opts,
        confidence,
        ..
    } = how;
    let to_scale = |x: f64| match scale {
        Scale::Ratio => x.ln(),
        Scale::Difference => x / reference,
    };
    let from_scale = |d: f64| match scale {
        Scale::Ratio => d.exp() - 1.0,
        Scale::Difference => d,
    };
    let bound = match scale {
        Scale::Ratio => (1.0 + opts.min_effect).ln(),
        Scale::Difference => opts.min_effect,
    };
    let (ta, tb): (Vec<f64>, Vec<f64>) = (
        a.iter().map(|&x| to_scale(x)).collect(),
        b.iter().map(|&x| to_scale(x)).collect(),
    );
    // Too few replicates, or figures so far apart their interval overflows: the hosts' values
    // give the estimate, and there is no verdict.
    let no_interval = Judgement {
        effect: from_scale(to_scale(points.1) - to_scale(points.0)),
        low: None,
        high: None,
        verdict: Verdict::InsufficientData,
        runs_needed: None,
    };
    let (Some(ma), Some(mb), Some(hw)) = (
        moments(&ta),
        moments(&tb),
        welch_half_width(&ta, &tb, confidence),
    ) else {
        return no_interval;
    };
    let d = mb.mean - ma.mean;
    let (low, high) = (from_scale(d - hw), from_scale(d + hw));
    if ![d, hw, low, high].iter().all(|x| x.is_finite()) {
        return no_interval;
    }
    // Significant only when the whole interval lies beyond the smallest effect (a minimal-effect
    // test): an interval that excludes no change but reaches into ±bound has not shown a
    // difference that matters. Two sessions of one shared host drift by a few % (its minute of
    // the machine), and "excludes zero with an estimate past 5%" called that drift in A/A pairs.
    let beyond = d - hw > bound || d + hw < -bound;
    let verdict = if beyond {
        Verdict::Significant
    } else if d - hw > -bound && d + hw < bound {
        Verdict::Equivalent
    } else {
        Verdict::Inconclusive
    };
    // Runs per host for an 80% chance of an interval wholly on one side of the smallest
    // effect, from the pooled per-run spread (only runs say how runs vary) and the estimate's
    // distance from ±bound (at least a quarter of the bound: an estimate sitting on the bound
    // is resolved by any drift of it).
    let runs_needed = (verdict == Verdict::Inconclusive && basis == Basis::Runs).then(|| {
        let have = ma.n.max(mb.n) as u32;
        let pooled_sd = ((ma.sd * ma.sd + mb.sd * mb.sd) / 2.0).sqrt();
        let distance = (d.abs() - bound).abs().max(bound / 4.0);
        runs_to_resolve(pooled_sd, distance, confidence).max(have + 1)
    });
    Judgement {
        effect: from_scale(d),
        low: Some(low),
        high: Some(high),
        verdict,
        runs_needed,
    }
}

/// A row with the hosts' values and nothing judged yet.
fn unjudged(metric: MetricId, a: Option<f64>, b: Option<f64>, confidence: f64) -> Row {
    Row {
        metric,
        unit: metric.unit(),
        a,
        b,
        delta: a.zip(b).map(|(a, b)| b - a),
        ci_low: None,
        ci_high: None,
        scale: Scale::Ratio,
        effect: None,
        effect_low: None,
        effect_high: None,
        verdict: Verdict::NotMeasured,
        runs_needed: None,
        share: None,
        share_low: None,
        share_high: None,
        estimated: false,
        confidence,
    }
}

/// Builds one row: the hosts' values from their runs, the verdict from the replicates. With a
/// `difference_reference` the row is compared as a difference relative to it.
pub(super) fn compare(
    metric: MetricId,
    sides: (&Side, &Side),
    how: Judging,
    difference_reference: Option<f64>,
) -> Row {
    let (pa, pb) = (sides.0.point(metric), sides.1.point(metric));
    let (ra, rb) = (
        sides.0.replicates(how.basis, metric),
        sides.1.replicates(how.basis, metric),
    );
    let mut row = unjudged(metric, pa, pb, how.confidence);
    let (Some(a), Some(b)) = (pa, pb) else {
        return row;
    };
    let positive = a > 0.0 && b > 0.0 && ra.iter().chain(&rb).all(|&x| x > 0.0);
    let (scale, reference) = match difference_reference {
        None if positive => (Scale::Ratio, a),
        // Symmetric in A and B: the mean of their magnitudes.
        reference => (
            Scale::Difference,
            reference.unwrap_or((a.abs() + b.abs()) / 2.0),
        ),
    };
    if scale == Scale::Difference && reference <= 0.0 {
        // Both zero: nothing to compare, and nothing differs.
        row.scale = scale;
        row.effect = Some(0.0);
        row.verdict = Verdict::Equivalent;
        return row;
    }
    let j = judge(&ra, &rb, (a, b), scale, reference, how);
    // The interval in the row's unit: relative bounds applied to A (ratio) or the reference.
    let unit_base = match scale {
        Scale::Ratio => a,
        Scale::Difference => reference,
    };
    set_judgement(&mut row, j, scale, unit_base);
    row.delta = row.delta.filter(|x| x.is_finite());
    // One run a side: batches within a run show none of the between-run noise, which on a
    // shared machine is far larger; a difference found there is provisional, never called
    // significant (an A/A pair of single runs would otherwise cry wolf).
    provisional(row, how)
}

/// Writes a judgement into its row: the effect and its interval, relative and in the row's unit
/// (`unit_base` times the relative bounds), the verdict and the runs that would resolve it.
fn set_judgement(row: &mut Row, j: Judgement, scale: Scale, unit_base: f64) {
    row.scale = scale;
    row.effect = Some(j.effect).filter(|e| e.is_finite());
    row.effect_low = j.low;
    row.effect_high = j.high;
    row.verdict = j.verdict;
    row.runs_needed = j.runs_needed;
    row.ci_low = j.low.map(|e| unit_base * e).filter(|x| x.is_finite());
    row.ci_high = j.high.map(|e| unit_base * e).filter(|x| x.is_finite());
}

/// Builds one row from replicates given directly (each host's value their mean), on the ratio
/// scale; a side with a figure at or below zero, or fewer than two, gets no verdict.
pub(super) fn compare_figures(metric: MetricId, a: &[f64], b: &[f64], how: Judging) -> Row {
    let mean = |xs: &[f64]| (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64);
    let (pa, pb) = (mean(a), mean(b));
    let mut row = unjudged(metric, pa, pb, how.confidence);
    let (Some(pa), Some(pb)) = (pa, pb) else {
        return row;
    };
    if !a.iter().chain(b).all(|&x| x > 0.0 && x.is_finite()) {
        row.verdict = Verdict::InsufficientData;
        return row;
    }
    let j = judge(a, b, (pa, pb), Scale::Ratio, pa, how);
    set_judgement(&mut row, j, Scale::Ratio, pa);
    row
}

/// The mean waterfall: app, the stages with their shares of its gap, and the evidence rows.
/// `exit_costs` are each host's calibrated cost of an exit.
pub(super) fn waterfall(
    sides: (&Side, &Side),
    how: Judging,
    exit_costs: (Option<f64>, Option<f64>),
    kinds: (Option<Hypervisor>, Option<Hypervisor>),
) -> Waterfall {
    // The software residual can be negative: compared as a difference, relative to the hosts'
    // app latency so its smallest effect means what it means for the app row.
    let app_reference = sides
        .0
        .point(MetricId::AppMean)
        .zip(sides.1.point(MetricId::AppMean))
        .map(|(x, y)| (x * y).sqrt());
    let mut stages: Vec<Row> = BLOCK_STAGES
        .iter()
        .map(|&m| compare(m, sides, how, None))
        .collect();
    stages.push(compare(
        MetricId::Stage(BreakdownPart::Software),
        sides,
        how,
        Some(app_reference.unwrap_or(0.0)),
    ));
    // The host-wide rows are background figures judged as one family. They are noisy (timer
    // and interrupt activity of the whole host) and only evidence, not parts of the gap.
    let family = how.in_family_of(HOST_WIDE.len());
    // On metal no MSR write exits: against a guest, its exits are the guest's alone, like
    // the hypervisor's rows, never "equivalent" to metal's nothing.
    let metal = none_offered(kinds);
    let mut evidence: Vec<Row> = HOST_WIDE
        .iter()
        .map(|&m| match (m, metal) {
            (MetricId::MsrExitsPerIo, Some(host)) => against_none(m, sides, family, host),
            _ => compare(m, sides, family, None),
        })
        .collect();
    evidence.push(msr_exit_time(sides, how, exit_costs));
    // Flushes are requests of their own, not part of a read's or write's stages: their own row.
    evidence.push(compare(MetricId::FlushMean, sides, how, None));
    let app = compare(MetricId::AppMean, sides, how, None);
    // Shares only for the stages an I/O's latency is made of: the host-wide figures below them
    // are background divided by I/Os, evidence rather than parts of the gap.
    let gap = app.delta.filter(|d| d.abs() > 0.0);
    for r in &mut stages {
        r.share = gap.zip(r.delta).map(|(g, d)| d / g);
    }
    Waterfall {
        app,
        stages,
        evidence,
    }
}

/// Exit-causing MSR writes per I/O times each host's calibrated cost of an exit: counts times
/// a cost, shown but never judged.
fn msr_exit_time(sides: (&Side, &Side), how: Judging, costs: (Option<f64>, Option<f64>)) -> Row {
    let per_io = |side: &Side, cost: Option<f64>| {
        side.point(MetricId::MsrExitsPerIo)
            .zip(cost)
            .map(|(n, c)| n * c)
    };
    let (a, b) = (per_io(sides.0, costs.0), per_io(sides.1, costs.1));
    let mut row = unjudged(MetricId::EstMsrExitTimePerIo, a, b, how.confidence);
    if row.delta.is_some() {
        row.verdict = Verdict::InsufficientData;
    }
    row.estimated = true;
    row
}

/// The tail rows: each stage at each tail percentile. The app's tails are the question, at
/// 95%; the stages' tails are evidence of where a tail went, one family like the host-wide rows
/// (with eight of them at 95% each, an A/A pair would show one "significant" stage tail about
/// one time in three).
pub(super) fn tails(sides: (&Side, &Side), how: Judging) -> Vec<Row> {
    let stage_tails = how.in_family_of(STAGE_TAILS);
    let mut rows = Vec::new();
    for stage in Stage::ALL {
        let judging = if stage == Stage::App {
            how
        } else {
            stage_tails
        };
        for percentile in TAIL_PERCENTILES {
            rows.push(compare(
                MetricId::Tail { stage, percentile },
                sides,
                judging,
                None,
            ));
        }
    }
    rows
}

/// The NVMe rows: each queue id both hosts' runs used, its mean command latency, the queues
/// judged as one family. Queue ids pair up as the driver numbers them (hardware queue + 1):
/// on two hosts they are the same CPUs' queues only when both map queues to CPUs alike, which
/// the Devices view and each profile's queue map show.
pub(super) fn nvme_queues(sides: (&Side, &Side), how: Judging) -> Vec<Row> {
    let both: Vec<u16> = sides
        .0
        .nvme_qids()
        .intersection(&sides.1.nvme_qids())
        .copied()
        .collect();
    let family = how.in_family_of(both.len().max(1));
    both.into_iter()
        .map(|qid| compare(MetricId::NvmeCommandMean(qid), sides, family, None))
        .collect()
}

/// Batches within one run show none of the between-run noise, and runs of one session a host
/// none of the noise between sessions: from them, a difference holds for these runs or these
/// sessions only (every row passes through here, in `compare`).
fn provisional(mut row: Row, how: Judging) -> Row {
    if row.verdict == Verdict::Significant {
        if how.basis == Basis::Batches {
            row.verdict = Verdict::WithinRuns;
        } else if how.one_session {
            row.verdict = Verdict::OneSession;
        }
    }
    row
}

/// The hypervisor block: first the time in all its paths per I/O, the hypervisor's part of
/// the gap with its share; then each mechanism either host measured (uses per I/O, and the time
/// of its paths per I/O), then the sampled CPU time in the hypervisor interface per I/O — all
/// host-wide figures above idle, the mechanisms judged as one family. Against a host with no
/// hypervisor, nothing there is offered: that side's figure is none at all, not a measurement,
/// so the row's difference is the guest's figure and its interval the guest's runs' alone.
pub(super) fn hypervisor_block(
    sides: (&Side, &Side),
    how: Judging,
    kinds: (Option<Hypervisor>, Option<Hypervisor>),
    not_offered: (Vec<Mechanism>, Vec<Mechanism>),
    app: &Row,
) -> HypervisorBlock {
    let measured = |metric| sides.0.point(metric).is_some() || sides.1.point(metric).is_some();
    let mut metrics = Vec::new();
    for m in Mechanism::ALL {
        if measured(MetricId::MechanismPerIo(m)) {
            metrics.push(MetricId::MechanismPerIo(m));
        }
        // A halt's time is time halted, not work the hypervisor did for the guest.
        if m != Mechanism::Halt && measured(MetricId::MechanismTimePerIo(m)) {
            metrics.push(MetricId::MechanismTimePerIo(m));
        }
    }
    if measured(MetricId::HypervisorCpuPerIo) {
        metrics.push(MetricId::HypervisorCpuPerIo);
    }
    let family = how.in_family_of(metrics.len().max(1));
    let none_offered = none_offered(kinds);
    // A side that does not offer the row's mechanism has none of it, as metal has none.
    let lacks = |metric: MetricId| {
        let m = metric.mechanism()?;
        if sides.0.point(metric).is_none() && not_offered.0.contains(&m) {
            Some(super::Host::A)
        } else if sides.1.point(metric).is_none() && not_offered.1.contains(&m) {
            Some(super::Host::B)
        } else {
            None
        }
    };
    let side = |host: super::Host| match host {
        super::Host::A => sides.0,
        super::Host::B => sides.1,
    };
    let judge_row = |metric: MetricId, how: Judging, reference: Option<f64>| match none_offered
        .or_else(|| lacks(metric))
    {
        // Metal timed the same function natively: the difference is the guest's excess.
        Some(without) if side(without).point(metric).is_some() => {
            compare(metric, sides, how, reference)
        }
        Some(without) => against_none(metric, sides, how, without),
        None => compare(metric, sides, how, reference),
    };
    let mut rows = Vec::new();
    // The question itself, at the diff's own confidence: relative to app latency, like the
    // software residual, so its smallest effect means what it means for the app row.
    if measured(MetricId::HypervisorTimePerIo) {
        let reference = sides
            .0
            .point(MetricId::AppMean)
            .zip(sides.1.point(MetricId::AppMean))
            .map(|(x, y)| (x * y).sqrt());
        let mut row = judge_row(MetricId::HypervisorTimePerIo, how, reference);
        share_of_gap(&mut row, app);
        rows.push(row);
    }
    rows.extend(metrics.into_iter().map(|m| judge_row(m, family, None)));
    let moved = rows
        .iter()
        .filter(|r| r.verdict == Verdict::Significant)
        .filter_map(|r| match r.metric {
            // Fewer halts per I/O above idle is a busier CPU, not a hypervisor mechanism
            // costing more: never the mechanism that moved.
            MetricId::MechanismPerIo(m) if m != Mechanism::Halt => Some((m, r.effect?.abs())),
            _ => None,
        })
        .max_by(|x, y| x.1.total_cmp(&y.1))
        .map(|(m, _)| m);
    HypervisorBlock {
        a: kinds.0,
        b: kinds.1,
        rows,
        moved,
        not_offered,
    }
}

/// The host with no hypervisor when the other has one: nothing a hypervisor offers is there.
fn none_offered(kinds: (Option<Hypervisor>, Option<Hypervisor>)) -> Option<super::Host> {
    let metal = |k: Option<Hypervisor>| k == Some(Hypervisor::None);
    let guest = |k: Option<Hypervisor>| k.is_some_and(|h| h != Hypervisor::None);
    if metal(kinds.0) && guest(kinds.1) {
        Some(super::Host::A)
    } else if metal(kinds.1) && guest(kinds.0) {
        Some(super::Host::B)
    } else {
        None
    }
}

/// A row against a host with no hypervisor (`metal`): that host's figure is none — not a 0
/// measured with noise, but nothing there to measure — so the difference is the guest's figure
/// (negated when the guest is A) with its interval from the guest's replicates alone (Welch
/// against exact zeros is the one-sample t interval). The verdict says one host has none.
fn against_none(metric: MetricId, sides: (&Side, &Side), how: Judging, metal: super::Host) -> Row {
    let (pa, pb) = match metal {
        super::Host::A => (None, sides.1.point(metric)),
        super::Host::B => (sides.0.point(metric), None),
    };
    let mut row = unjudged(metric, pa, pb, how.confidence);
    row.scale = Scale::Difference;
    let (guest, sign) = match metal {
        super::Host::A => (sides.1, 1.0),
        super::Host::B => (sides.0, -1.0),
    };
    let Some(point) = guest.point(metric) else {
        return row;
    };
    row.verdict = Verdict::NoHypervisor;
    row.delta = Some(sign * point);
    let replicates = guest.replicates(how.basis, metric);
    let zeros = vec![0.0; replicates.len()];
    if let Some(hw) = welch_half_width(&zeros, &replicates, how.confidence) {
        if hw.is_finite() {
            row.ci_low = Some(sign * point - hw);
            row.ci_high = Some(sign * point + hw);
        }
    }
    row
}

/// The hypervisor's time as a share of the app-latency gap, with an approximate interval: its
/// own interval and the gap's half-widths combined in quadrature (as if independent; the two
/// move together on a real host, so this errs wide).
fn share_of_gap(row: &mut Row, app: &Row) {
    let (Some(gap), Some(delta)) = (app.delta.filter(|g| g.abs() > 0.0), row.delta) else {
        return;
    };
    let share = delta / gap;
    row.share = Some(share);
    let half = |r: &Row| r.ci_low.zip(r.ci_high).map(|(lo, hi)| (hi - lo) / 2.0);
    if let (Some(h_row), Some(h_gap)) = (half(row), half(app)) {
        let hw = ((h_row / gap).powi(2) + (delta * h_gap / (gap * gap)).powi(2)).sqrt();
        if hw.is_finite() {
            row.share_low = Some(share - hw);
            row.share_high = Some(share + hw);
        }
    }
}
