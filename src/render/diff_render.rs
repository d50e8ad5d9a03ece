//! Renders a `ProfileDiff`: terminal text (fits 100 columns), Markdown, CSV, JSON and SVG
//! charts. Every word of the diff is written here: row labels, verdicts, evidence, warnings.

use std::borrow::Cow;
use std::fmt::Write as _;

use serde::Serialize;

use crate::analysis::diff::{
    Basis, BreakdownPart, BusiestIrqCpu, Confounder, Host, HostEvidence, HostTrait, Hosts,
    MetricId, ProfileDiff, QueueStartSplit, Row, Scale, Setting, SideSource, SpecDifference,
    SpecKey, SpecValue, TailWaterfall, Unit, Verdict, Warning,
};
use crate::analysis::stats::CONFIDENCE;
use crate::model::stages::Stage;
use crate::render::hypervisor_report::{hypervisor_words, mechanism_noun, mechanism_words};
use virtgap_probes::hypervisor::{Hypervisor, Mechanism};
use virtgap_workloads::units;

const NOT_MEASURED: &str = "not measured";

/// The terminal report's label column: the longest label with its indent (a mechanism's uses
/// per I/O above idle, under the hypervisor heading), so the figures line up.
const LABEL_COLUMNS: usize = 44;

/// The heading of the NVMe rows, where both hosts' runs used NVMe queues.
pub(crate) const NVME_HEADING: &str =
    "NVMe command latency per queue id (queues both hosts used, judged as one family):";

/// A row's label (without its indent in the terminal's table). `above_idle`: the host-wide
/// figures are above each host's idle activity.
pub fn label(metric: MetricId, above_idle: bool) -> Cow<'static, str> {
    use MetricId::*;
    // Above idle, short enough for the terminal's label column.
    let fixed = match metric {
        AppMean => "app latency (mean)",
        Stage(BreakdownPart::Queue) => "block queue",
        Stage(BreakdownPart::Device) => "device",
        Stage(BreakdownPart::Completion) => "completion: IRQ -> request done",
        Stage(BreakdownPart::Software) => "software: submit + reap",
        WakeupPerIo => "wakeup delay per I/O",
        HardirqPerIo if above_idle => "hard-IRQ time per I/O, above idle",
        HardirqPerIo => "hard-IRQ time per I/O (all IRQs)",
        SoftirqPerIo if above_idle => "softirq time per I/O, above idle",
        SoftirqPerIo => "softirq time per I/O (all)",
        IpisPerIo if above_idle => "IPIs sent per I/O, above idle",
        IpisPerIo => "IPIs sent per I/O",
        MsrExitsPerIo if above_idle => "MSR exits per I/O, above idle",
        MsrExitsPerIo => "exit-causing MSR writes per I/O",
        EstMsrExitTimePerIo if above_idle => "est. exit time per I/O, above idle",
        EstMsrExitTimePerIo => "est. MSR exit time per I/O",
        FlushMean => "cache flush latency (mean)",
        Iops => "IOPS",
        Tail { stage, percentile } => return format!("{} p{percentile}", stage.name()).into(),
        MechanismPerIo(m) => {
            let idle = if above_idle { ", above idle" } else { "" };
            return format!("{} per I/O{idle}", mechanism_words(m)).into();
        }
        MechanismTimePerIo(m) => return format!("{} time per I/O", mechanism_noun(m)).into(),
        HypervisorCpuPerIo => "hypervisor CPU time per I/O",
        HypervisorTimePerIo => "all hypervisor paths' time per I/O",
        NvmeCommandMean(qid) => return format!("NVMe queue {qid} command (mean)").into(),
    };
    fixed.into()
}

/// The indent of a row's label in the terminal's table: stages under the app, evidence under
/// the software residual.
pub(crate) fn indent_of(metric: MetricId) -> usize {
    use MetricId::*;
    match metric {
        Stage(_) => 2,
        WakeupPerIo | HardirqPerIo | SoftirqPerIo | IpisPerIo | MsrExitsPerIo
        | EstMsrExitTimePerIo | FlushMean => 4,
        AppMean | Iops | Tail { .. } | HypervisorTimePerIo | NvmeCommandMean(_) => 0,
        MechanismPerIo(_) | MechanismTimePerIo(_) | HypervisorCpuPerIo => 2,
    }
}

pub(crate) fn row_label(d: &ProfileDiff, r: &Row) -> Cow<'static, str> {
    label(r.metric, d.above_idle)
}

/// A tail waterfall's stage, as its rows name it.
fn part_name(part: BreakdownPart) -> &'static str {
    match part {
        BreakdownPart::Queue => "queue",
        BreakdownPart::Device => "device",
        BreakdownPart::Completion => "completion",
        BreakdownPart::Software => "software",
    }
}

pub fn verdict_words(v: Verdict) -> &'static str {
    match v {
        Verdict::Significant => "significant",
        Verdict::Equivalent => "equivalent",
        Verdict::Inconclusive => "inconclusive",
        Verdict::InsufficientData => "too few replicates",
        Verdict::NotMeasured => NOT_MEASURED,
        Verdict::NoHypervisor => "one host has no hypervisor",
        Verdict::WithinRuns => "provisional: one run a host",
        Verdict::OneSession => "provisional: one session a host",
    }
}

pub(crate) fn value(v: Option<f64>, unit: Unit) -> String {
    // An empty float sum is -0.0; show it as 0.
    let v = v.map(|x| if x == 0.0 { 0.0 } else { x });
    match (v, unit) {
        (None, _) => "-".into(),
        (Some(x), Unit::Ns) => units::latency(x),
        (Some(x), Unit::PerIo) => units::fixed(x, 3),
        (Some(x), Unit::Iops) => units::count(x),
    }
}

/// A host's figure in a row's column: "none" where the host has no hypervisor to offer the
/// row's mechanism (not "-", which is "not measured").
pub(crate) fn cell(r: &Row, host: Host) -> String {
    let v = match host {
        Host::A => r.a,
        Host::B => r.b,
    };
    if v.is_none() && r.verdict == Verdict::NoHypervisor {
        return "none".into();
    }
    // A host-wide figure per I/O less the idle host's rate is below 0 only when the host did
    // less of it while the workload ran than idle: not a figure of the host's own.
    if v.is_some_and(|x| x < 0.0) && r.metric.is_above_idle() {
        return "below idle".into();
    }
    value(v, r.unit)
}

pub(crate) fn signed(v: Option<f64>, unit: Unit) -> String {
    match v {
        None => "-".into(),
        Some(x) => {
            let magnitude = value(Some(x.abs()), unit);
            // What rounds to zero has no direction: "+0 ns", never "-0 ns".
            let zero = !magnitude.bytes().any(|b| (b'1'..=b'9').contains(&b));
            let sign = if x >= 0.0 || zero { "+" } else { "-" };
            format!("{sign}{magnitude}")
        }
    }
}

/// A stage's share of the app gap, shown only when that gap is judged significant: a share of
/// a gap that is not there means nothing (the stage's own verdict says what it did).
pub(crate) fn share(r: &Row, d: &ProfileDiff) -> String {
    if !d.waterfall.app.verdict.found_a_difference() {
        return String::new();
    }
    r.share.map_or(String::new(), |s| {
        format!("{}%", units::fixed(s * 100.0, 0))
    })
}

/// Three significant figures: 3.14, 31.4, 314, 3140.
fn sig3(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn pct(x: f64) -> String {
    units::fixed(x * 100.0, 1)
}

/// A significant row's effect: "B slower by 8.1% [5.9, 10.4]", or "B slower x2.29 [x2.27,
/// x2.32]" for a change of 2x or more.
fn significant_text(r: &Row, within_run: &str) -> String {
    let (e, lo, hi) = (
        r.effect.unwrap_or(0.0),
        r.effect_low.unwrap_or(0.0),
        r.effect_high.unwrap_or(0.0),
    );
    let (up, down) = match r.unit {
        Unit::Ns => ("slower", "faster"),
        Unit::Iops | Unit::PerIo => ("higher", "lower"),
    };
    // On the difference scale a row is relative to its reference: app latency for the software
    // residual and the hypervisor's time, the hosts' mean magnitude for the rest (a figure that
    // can be 0 or below).
    let of = match (r.scale, r.metric) {
        (Scale::Ratio, _) => "",
        (
            Scale::Difference,
            MetricId::Stage(BreakdownPart::Software) | MetricId::HypervisorTimePerIo,
        ) => " of app latency",
        (Scale::Difference, _) => " of the hosts' mean",
    };
    // A fall is shown as how much lower B is than A; a change of 2x or more as a factor —
    // B/A up, A/B down — so the words read alike whichever host is A.
    let word = if e >= 0.0 { up } else { down };
    // Where one host's figure is 0 (or below), a difference is always 200% of the hosts' mean
    // magnitude, which says nothing: it is given in the row's unit instead.
    let one_host_at_zero = r.a.zip(r.b).is_some_and(|(a, b)| a <= 0.0 || b <= 0.0);
    if let (Scale::Difference, " of the hosts' mean", true) = (r.scale, of, one_host_at_zero) {
        if let (Some(d), Some(lo), Some(hi)) = (r.delta, r.ci_low, r.ci_high) {
            let (d, lo, hi) = if e >= 0.0 {
                (d, lo, hi)
            } else {
                (-d, -hi, -lo)
            };
            return format!(
                "B {word} by {} [{}, {}]{within_run}",
                value(Some(d), r.unit),
                value(Some(lo), r.unit),
                value(Some(hi), r.unit)
            );
        }
    }
    let ratio = 1.0 + e;
    if r.scale == Scale::Ratio && (ratio >= 2.0 || ratio <= 0.5) {
        let factor = |x: f64| {
            let f = if e >= 0.0 { 1.0 + x } else { 1.0 / (1.0 + x) };
            format!("x{}", sig3(f))
        };
        let (near, far) = if e >= 0.0 { (lo, hi) } else { (hi, lo) };
        format!(
            "B {word} {} [{}, {}]{within_run}",
            factor(e),
            factor(near),
            factor(far)
        )
    } else {
        let (e, lo, hi) = if e >= 0.0 {
            (e, lo, hi)
        } else {
            (-e, -hi, -lo)
        };
        format!(
            "B {word} by {}%{of} [{}, {}]{within_run}",
            pct(e),
            pct(lo),
            pct(hi)
        )
    }
}

/// The row's verdict in words: "B slower by 8.1% [5.9, 10.4]", "equivalent within ±5%",
/// "inconclusive (≈7 runs per host would resolve ±5%)".
pub fn verdict_text(r: &Row, d: &ProfileDiff) -> String {
    if r.estimated && r.verdict != Verdict::NotMeasured {
        return "estimated from counts, not judged".into();
    }
    let bound = format!("±{}%", percent(d.min_effect));
    // A row judged as one of a family says its interval's own confidence.
    let within_run = match (d.basis == Basis::Batches, r.confidence > CONFIDENCE) {
        (true, false) => " (within run)".to_string(),
        (true, true) => format!(" ({}% interval, within run)", percent(r.confidence)),
        (false, true) => format!(" ({}% interval)", percent(r.confidence)),
        (false, false) => String::new(),
    };
    match r.verdict {
        Verdict::Significant => significant_text(r, &within_run),
        Verdict::Equivalent => format!("equivalent within {bound}{within_run}"),
        // With one session a host, more runs of it narrow the interval but leave any
        // difference provisional: the words say the runs take a second session.
        Verdict::Inconclusive => match r.runs_needed {
            Some(n) if one_session(d) => {
                format!("inconclusive (≈{n} runs per host, in 2 sessions, would resolve {bound})")
            }
            Some(n) => format!("inconclusive (≈{n} runs per host would resolve {bound})"),
            None => format!("inconclusive at {bound} (between-run noise unknown: --runs 5)"),
        },
        Verdict::InsufficientData
            if d.basis == Basis::Batches && matches!(r.metric, MetricId::Tail { .. }) =>
        {
            "no verdict: tails need 2+ runs per host".into()
        }
        Verdict::InsufficientData | Verdict::NotMeasured => verdict_words(r.verdict).into(),
        // Between-run noise is unknown with one run a host: a difference that holds within
        // the run is provisional, and the words say what judges it.
        Verdict::WithinRuns => format!(
            "{} (one run a host; --runs 5 judges it)",
            significant_text(r, "")
        ),
        // Runs back to back in one session a host show no noise between sessions: the
        // difference holds between these two, and the words say what judges it.
        Verdict::OneSession => format!(
            "{} (one session a host; record again to judge)",
            significant_text(r, &within_run)
        ),
        Verdict::NoHypervisor => one_sided_text(r, d),
    }
}

/// Whether each side is one session (see `Warning::OneSession`).
fn one_session(d: &ProfileDiff) -> bool {
    d.warnings.iter().any(|w| matches!(w, Warning::OneSession))
}

/// "B: 4.1 µs [3.2, 5.0] hypervisor CPU time per I/O; A: no hypervisor": a figure only one
/// host can have, with the interval of that host's runs, never "equivalent".
fn one_sided_text(r: &Row, d: &ProfileDiff) -> String {
    let what = label(r.metric, false);
    let (host, v, other) = match (r.a, r.b) {
        (_, Some(b)) => ("B", b, "A"),
        (Some(a), None) => ("A", a, "B"),
        (None, None) => return verdict_words(r.verdict).into(),
    };
    let (other_kind, other_lacks) = if other == "A" {
        (d.hypervisor.a, &d.hypervisor.not_offered.0)
    } else {
        (d.hypervisor.b, &d.hypervisor.not_offered.1)
    };
    let other_words = match r.metric.mechanism() {
        Some(m) if other_lacks.contains(&m) => "not offered by this host (a CPUID bit clear)",
        _ => hypervisor_words(other_kind),
    };
    let interval = guest_interval(r).map_or(String::new(), |(lo, hi)| {
        format!(
            " [{}, {}]",
            signed_or_zero(lo, r.unit),
            signed_or_zero(hi, r.unit)
        )
    });
    let from_none = match guest_interval(r) {
        Some((lo, hi)) if lo <= 0.0 && hi >= 0.0 => ", not told from none",
        _ => "",
    };
    // Not one use in any run (Xen's timer is a hypercall, so none of its MSR writes exit).
    if v == 0.0 && guest_interval(r) == Some((0.0, 0.0)) {
        return format!("{host}: none in any run ({what}); {other}: {other_words}");
    }
    // Above idle, a figure below the host's idle rate is no use of the mechanism by the
    // workload: said as such, not printed as if the host had a negative figure.
    if v < 0.0 && value(Some(-v), r.unit) != value(Some(0.0), r.unit) {
        return format!(
            "{host}: below its idle rate ({}{interval}): none of it the workload's; {other}: \
             {other_words}",
            signed(Some(v), r.unit),
        );
    }
    format!(
        "{host}: {}{interval} {what}{from_none}; {other}: {other_words}",
        value(Some(v), r.unit),
    )
}

/// The interval of the guest's own figure on a row against a host with no hypervisor (the
/// row's interval is of B − A, negated when the guest is A).
fn guest_interval(r: &Row) -> Option<(f64, f64)> {
    let (lo, hi) = r.ci_low.zip(r.ci_high)?;
    Some(if r.b.is_some() { (lo, hi) } else { (-hi, -lo) })
}

/// A bound of an interval: "-4 ns" below zero, "12 ns" above, and what rounds to zero "0".
fn signed_or_zero(x: f64, unit: Unit) -> String {
    let magnitude = value(Some(x.abs()), unit);
    if x < 0.0 && magnitude.bytes().any(|b| (b'1'..=b'9').contains(&b)) {
        format!("-{magnitude}")
    } else {
        magnitude
    }
}

/// The hypervisor's paths as a share of B's gap, in words, when the gap is significant:
/// "the hypervisor's paths (Xen) take 39% [31, 47] of it, 111.0 µs per I/O (an upper bound:
/// timed host-wide)"; None when they are not measured or the gap is not significant.
pub(crate) fn hypervisor_share_words(d: &ProfileDiff) -> Option<String> {
    let r = d.row(MetricId::HypervisorTimePerIo)?;
    if !d.waterfall.app.verdict.found_a_difference() {
        return None;
    }
    let share = r.share?;
    let whose = match (d.hypervisor.a, d.hypervisor.b) {
        (Some(Hypervisor::None), Some(h)) | (Some(h), Some(Hypervisor::None)) => {
            format!(" ({})", hypervisor_words(Some(h)))
        }
        _ => String::new(),
    };
    let interval = r
        .share_low
        .zip(r.share_high)
        .map_or(String::new(), |(lo, hi)| {
            format!(
                " [{}, {}]",
                units::fixed(lo * 100.0, 0),
                units::fixed(hi * 100.0, 0)
            )
        });
    let told = r.ci_low.zip(r.ci_high).map(|(lo, hi)| lo > 0.0 || hi < 0.0);
    let words = match told {
        Some(false) => "not told from none",
        _ if share.abs() < d.min_effect => "a negligible part",
        _ => "an upper bound: timed host-wide, not only on the I/O's path",
    };
    Some(format!(
        "the hypervisor's paths{whose} take {}%{interval} of it, {} per I/O ({words})",
        units::fixed(share * 100.0, 0),
        signed(r.delta, Unit::Ns),
    ))
}

/// A percentage as typed: 5 for 5%, 2.5 for 2.5%.
pub fn percent(fraction: f64) -> String {
    let p = (fraction * 1e4).round() / 100.0;
    format!("{p}")
}

pub(crate) fn runs_line(d: &ProfileDiff) -> String {
    format!(
        "runs: A {}, B {}; replicates: {}; smallest effect of interest ±{}%",
        d.runs_a,
        d.runs_b,
        match d.basis {
            Basis::Runs => "runs (Welch 95% intervals, log scale)",
            Basis::Batches => "batches of intervals within a run",
        },
        percent(d.min_effect)
    )
}

fn host_letter(host: Host) -> &'static str {
    match host {
        Host::A => "A",
        Host::B => "B",
    }
}

/// A warning in words.
pub fn warning(w: &Warning) -> String {
    match w {
        Warning::Incomplete(host) => format!(
            "a profile of {} is incomplete (its run was interrupted)",
            host_letter(*host)
        ),
        Warning::NoProbes(host) => format!(
            "a profile of {} was recorded without probes: only app latency compares",
            host_letter(*host)
        ),
        Warning::Stalled(host, stalls) => format!(
            "host {} stalled during a run ({}): its figures are not steady state",
            host_letter(*host),
            stalls.describe()
        ),
        Warning::CompletionFolded(lacking) => format!(
            "{} lacks the completion stage in some run (a profile from before it, or a device whose queue IRQ is not known): device is compared as issue -> completion on both sides, and its tails and the completion row are not judged",
            match lacking {
                Hosts::A => "host A",
                Hosts::B => "host B",
                Hosts::Both => "both hosts",
            }
        ),
        Warning::QueueStart(split) => {
            let (entry, request) = match split {
                QueueStartSplit::EntryOnA => ("host A", "host B"),
                QueueStartSplit::EntryOnB => ("host B", "host A"),
                QueueStartSplit::Mixed => ("some runs", "others"),
            };
            format!(
                "the queue stage starts where each bio enters the block layer on {entry} but where its request starts on {request} (for all or some of its requests: no fentry or kprobe there, and a whole disk's bios pass no block_bio_remap): blk-throttle and tag waits count as queue on one side and as software on the other"
            )
        }
        Warning::RequestsPerIo { a, b } => format!(
            "the hosts issue an app I/O as different numbers of block requests (A {a:.2}, B {b:.2} per I/O: split or merged differently, e.g. a smaller max_sectors_kb): the block stages are per request and the app's latency per I/O, so the software residual also holds the difference in requests per I/O"
        ),
        Warning::OneRun(on) => format!(
            "one run on {}: between-run noise is unknown, so verdicts compare batches of intervals within runs and hold for these runs only; record each host with --runs 5 for verdicts that hold",
            match on {
                Hosts::Both => "each host",
                Hosts::A => "host A",
                Hosts::B => "host B",
            }
        ),
        Warning::OneSession => "each host's runs were recorded in one session, back to back: a change in the machine between the two sessions (a neighbour's load, a background job) moves every run of one side alike and reads as a difference between the hosts, so a difference found is provisional; record each host again at another time (--with-a, --with-b) to judge it".into(),
    }
}

fn setting(s: &Setting) -> String {
    match s {
        Setting::Count(n) => n.to_string(),
        Setting::Text(t) => t.clone(),
        Setting::List(v) => v.join(";"),
        Setting::Unknown => "unknown".into(),
    }
}

/// A host difference in words: "CPU count: 2 vs 72".
pub fn confounder(c: &Confounder) -> String {
    match c {
        Confounder::Differs { what, a, b } => {
            let what = match what {
                HostTrait::CpuCount => "CPU count",
                HostTrait::CpuModel => "CPU model",
                HostTrait::Clocksource => "clocksource",
                HostTrait::Clockevent => "clockevent device",
                HostTrait::Kernel => "kernel",
                HostTrait::TargetQueues => "target device queues",
                HostTrait::IoScheduler => "I/O scheduler",
                HostTrait::RqAffinity => "rq_affinity",
                HostTrait::IrqAffinity => "IRQ affinity of the target's queues",
                HostTrait::IrqDelivery => "interrupt delivery of the target's queues",
                HostTrait::TargetDevice => "target device",
            };
            format!("{what}: {} vs {}", setting(a), setting(b))
        }
        Confounder::TargetQueuesUnknown(host) => format!(
            "target device's queues unknown on host {}: queue and IRQ layout not compared",
            host_letter(*host)
        ),
    }
}

/// A workload difference in words: "qd: 32 vs 1".
pub fn spec_difference(x: &SpecDifference) -> String {
    let key: Cow<str> = match x.key {
        SpecKey::Workload(k) => k.into(),
        SpecKey::KvLoad => "kv load".into(),
        SpecKey::Kv(k) => format!("kv.{k}").into(),
    };
    let show = |v: &Option<SpecValue>| match v {
        None => "(unset)".to_string(),
        Some(SpecValue::Toml(t)) => t.clone(),
        Some(SpecValue::KvLoad {
            reads_per_s,
            writes_per_s,
        }) => format!("{reads_per_s} reads/s + {writes_per_s} writes/s"),
        Some(SpecValue::Unreadable) => "(unreadable)".into(),
    };
    format!("{key}: {} vs {}", show(&x.a), show(&x.b))
}

/// One evidence item in words: what it is and each host's value.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EvidenceLine {
    pub item: &'static str,
    pub a: String,
    pub b: String,
}

pub(crate) fn busiest_irq_cpu(e: &HostEvidence) -> String {
    match e.busiest_irq_cpu {
        BusiestIrqCpu::NotMeasured => NOT_MEASURED.into(),
        BusiestIrqCpu::NoneSeen => "no interrupts seen".into(),
        BusiestIrqCpu::Cpu { cpu, share } => {
            format!("CPU {cpu} at {:.1}% in IRQ+softirq", share * 100.0)
        }
    }
}

fn msr_exit_rates(e: &HostEvidence) -> String {
    match e.msr_exit_rates.as_deref() {
        None => NOT_MEASURED.into(),
        Some([]) => "none seen".into(),
        Some(rates) => rates
            .iter()
            .take(3)
            .map(|r| format!("{:#x} {} {:.0}/s", r.msr, r.name, r.per_s))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

pub(crate) fn hypervisor_share(e: &HostEvidence) -> String {
    let Some(cpus) = &e.hypervisor_share else {
        return NOT_MEASURED.into();
    };
    cpus.iter()
        .map(|c| match c.share {
            None => format!("cpu{} not measured", c.cpu),
            Some(share) => format!("cpu{} {:.1}%", c.cpu, share * 100.0),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The evidence in words, item by item (stalls only when a host was checked for them).
pub fn evidence(d: &ProfileDiff) -> Vec<EvidenceLine> {
    let (a, b) = (&d.evidence.a, &d.evidence.b);
    let line = |item, say: &dyn Fn(&HostEvidence) -> String| EvidenceLine {
        item,
        a: say(a),
        b: say(b),
    };
    let mut lines = vec![
        line("busiest IRQ CPU", &busiest_irq_cpu),
        line("block requests per app I/O", &|e| {
            e.requests_per_io.map_or(
                NOT_MEASURED.into(),
                crate::render::probe_report::requests_per_io,
            )
        }),
        line("completions on another CPU", &|e| {
            e.cross_cpu.map_or(NOT_MEASURED.into(), |c| {
                format!(
                    "{}% of {:.0}",
                    units::fixed(c.cross / c.total * 100.0, 1),
                    c.total
                )
            })
        }),
        line("steal (all CPUs)", &|e| {
            e.steal.map_or(NOT_MEASURED.into(), |s| {
                format!(
                    "{:.2}% of CPU time ({:.0} ms)",
                    s.steal_ns / s.cpu_ns * 100.0,
                    s.steal_ns / 1e6
                )
            })
        }),
        line("exit-causing MSR writes per second", &msr_exit_rates),
        line("hypervisor-interface share of samples", &hypervisor_share),
        line("recording self-overhead", &|e| {
            e.probe_cpu_pct.map_or(NOT_MEASURED.into(), |v| {
                format!("probes {v:.2}% of one CPU")
            })
        }),
    ];
    // Stalls are findings in their own right: shown whenever either side was checked for them.
    if a.stalls.is_some() || b.stalls.is_some() {
        lines.push(line("stalls", &|e| match &e.stalls {
            None => "not checked".to_string(),
            Some(s) if s.found() => s.describe(),
            Some(_) => "none".to_string(),
        }));
    }
    lines
}

/// One compared row, in two lines: the figures, then the verdict.
fn terminal_row(s: &mut String, r: &Row, d: &ProfileDiff) {
    let indent = indent_of(r.metric);
    let figures = format!(
        "{:<LABEL_COLUMNS$} {:>10} {:>10} {:>11} {:>5}",
        format!("{:indent$}{}", "", row_label(d, r)),
        cell(r, Host::A),
        cell(r, Host::B),
        signed(r.delta, r.unit),
        share(r, d),
    );
    let _ = writeln!(s, "{}", figures.trim_end());
    let _ = writeln!(s, "{:indent$}  -> {}", "", verdict_text(r, d));
}

/// `text` broken at spaces into lines of at most `width` characters, the later ones indented
/// by `indent` (a word longer than a line stays whole, and hyphenated words are never split).
fn wrap(text: &str, width: usize, indent: usize) -> String {
    let lead = &text[..text.len() - text.trim_start().len()];
    let rest = " ".repeat(indent);
    let options = textwrap::Options::new(width)
        .initial_indent(lead)
        .subsequent_indent(&rest)
        .word_separator(textwrap::WordSeparator::AsciiSpace)
        .word_splitter(textwrap::WordSplitter::NoHyphenation)
        .break_words(false);
    textwrap::fill(text.trim_start(), options)
}

pub(crate) fn workload(d: &ProfileDiff) -> String {
    format!(
        "{} ({})",
        units::one_line(&d.workload),
        units::one_line(&d.workload_origin)
    )
}

/// A host's description, from its profile (another host's words): on one line.
fn host(f: &crate::model::host::Fingerprint) -> String {
    units::one_line(&f.describe()).into_owned()
}

fn side(d: &ProfileDiff, which: Host) -> (&crate::model::host::Fingerprint, &SideSource) {
    match which {
        Host::A => (&d.host_a, &d.source_a),
        Host::B => (&d.host_b, &d.source_b),
    }
}

/// One side in words: its host's description (label and hostname first), then where its
/// figures came from and when, e.g. "… · from vm.json, recorded 2026-12-06 18:50 to 18:53 UTC".
pub(crate) fn side_words(d: &ProfileDiff, which: Host) -> String {
    let (host, source) = side(d, which);
    match source_words(source) {
        Some(w) => format!("{} · {w}", host.describe()),
        None => host.describe(),
    }
}

/// A side's short name, for a column: its label, else its hostname, else its first file,
/// else its letter.
pub(crate) fn side_name(d: &ProfileDiff, which: Host) -> String {
    let (host, source) = side(d, which);
    host.label
        .clone()
        .or_else(|| host.hostname.clone())
        .or_else(|| source.files.first().cloned())
        .unwrap_or_else(|| host_letter(which).to_string())
}

/// Where a side's figures came from and when they were recorded, if anyone said.
pub(crate) fn source_words(s: &SideSource) -> Option<String> {
    let files = match s.files.as_slice() {
        [] => None,
        [one] => Some(format!("from {one}")),
        [first, rest @ ..] => Some(format!(
            "from {first} and {} more file{}",
            rest.len(),
            if rest.len() == 1 { "" } else { "s" }
        )),
    };
    let when = s
        .recorded_unix_ms
        .map(|(from, to)| format!("recorded {}", span_words(from, to)));
    match (files, when) {
        (Some(f), Some(w)) => Some(format!("{f}, {w}")),
        (f, w) => f.or(w),
    }
}

/// A span of wall-clock time in UTC to the minute: "2026-12-06 18:50 to 18:53 UTC", the date
/// repeated only when it changes.
fn span_words(from_ms: u64, to_ms: u64) -> String {
    let stamp = |ms: u64| {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
        // "2026-12-06T18:50:21Z": the date, then the hour and minute.
        let text = humantime::format_rfc3339_seconds(t).to_string();
        (text[..10].to_string(), text[11..16].to_string())
    };
    let ((day_a, time_a), (day_b, time_b)) = (stamp(from_ms), stamp(to_ms));
    if day_a != day_b {
        format!("{day_a} {time_a} to {day_b} {time_b} UTC")
    } else if time_a != time_b {
        format!("{day_a} {time_a} to {time_b} UTC")
    } else {
        format!("{day_a} {time_a} UTC")
    }
}

/// Text from a profile placed in Markdown, shown as text: HTML's `<`, `>` and `&` as
/// entities (many renderers let inline HTML through), a table's `|` and code's backtick
/// escaped, and on one line.
fn md(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in units::one_line(text).chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '|' => out.push_str("\\|"),
            '`' => out.push_str("\\`"),
            '*' | '_' | '[' | ']' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// Plain text for a terminal, at most 100 columns wide.
pub fn terminal(d: &ProfileDiff) -> String {
    let mut s = String::new();
    for which in [Host::A, Host::B] {
        let (h, source) = side(d, which);
        let _ = writeln!(s, "{}: {}", host_letter(which), host(h));
        if let Some(w) = source_words(source) {
            let _ = writeln!(s, "   {}", units::one_line(&w));
        }
    }
    let _ = writeln!(s, "workload: {}", workload(d));
    let _ = writeln!(s, "{}", runs_line(d));
    for x in &d.spec_differences {
        let _ = writeln!(s, "  workload differs: {}", spec_difference(x));
    }
    for c in &d.confounders {
        let _ = writeln!(s, "  confounder: {}", units::one_line(&confounder(c)));
    }
    for w in &d.warnings {
        let _ = writeln!(s, "{}", wrap(&format!("  warning: {}", warning(w)), 100, 4));
    }
    let _ = writeln!(
        s,
        "\nwhere B's extra latency goes (B - A; verdict with its 95% interval, in % of A):"
    );
    let _ = writeln!(
        s,
        "{:<LABEL_COLUMNS$} {:>10} {:>10} {:>11} {:>5}",
        "stage", "A", "B", "delta", "share"
    );
    for r in d.waterfall.rows() {
        terminal_row(&mut s, r, d);
    }
    let _ = writeln!(s, "\ntails:");
    for r in &d.tails {
        terminal_row(&mut s, r, d);
    }
    if let Some(line) = tail_mover_words(d) {
        let _ = writeln!(s, "{line}");
    }
    for w in &d.tail_waterfalls {
        let _ = writeln!(s, "\n{}", tail_heading(w));
        let _ = writeln!(
            s,
            "{:<LABEL_COLUMNS$} {:>10} {:>10} {:>11} {:>5}",
            "stage", "A", "B", "delta", "share"
        );
        for (label, a, b, delta, share) in tail_rows(w, d) {
            let line = format!("{label:<LABEL_COLUMNS$} {a:>10} {b:>10} {delta:>11} {share:>5}");
            let _ = writeln!(s, "{}", line.trim_end());
        }
    }
    let _ = writeln!(s, "\nthroughput:");
    for r in &d.throughput {
        terminal_row(&mut s, r, d);
    }
    let _ = writeln!(s, "\n{}", hypervisor_heading(d));
    for r in &d.hypervisor.rows {
        terminal_row(&mut s, r, d);
    }
    if let Some(m) = d.hypervisor.moved {
        let _ = writeln!(s, "the mechanism that moved most: {}", mechanism_words(m));
    }
    if !d.nvme_queues.is_empty() {
        let _ = writeln!(s, "\n{NVME_HEADING}");
        for r in &d.nvme_queues {
            terminal_row(&mut s, r, d);
        }
    }
    let _ = writeln!(s, "\nevidence:");
    for e in evidence(d) {
        let _ = writeln!(s, "  {}:\n    A: {}\n    B: {}", e.item, e.a, e.b);
    }
    let _ = writeln!(
        s,
        "\n{}",
        wrap(&format!("verdict: {}", verdict_sentence(d)), 100, 9)
    );
    s
}

/// "the I/Os above p99.9 (tail autopsy, 5 + 5 runs; joined to their request: 100% / 98%):"
pub(crate) fn tail_heading(w: &TailWaterfall) -> String {
    format!(
        "where the I/Os above p{} spent their time (tail autopsy, {} + {} runs; joined to \
         their block request: {:.0}% / {:.0}%):",
        w.percentile,
        w.runs_a,
        w.runs_b,
        w.joined_a * 100.0,
        w.joined_b * 100.0
    )
}

/// The tail waterfall's rows as text: label, A, B, delta, share.
/// A share of the set's gap is shown only when the diff judges app latency at that percentile
/// significantly different.
pub(crate) fn tail_rows(
    w: &TailWaterfall,
    d: &ProfileDiff,
) -> Vec<(String, String, String, String, String)> {
    let significant = d
        .row(MetricId::Tail {
            stage: Stage::App,
            percentile: w.percentile,
        })
        .is_some_and(|r| r.verdict == Verdict::Significant);
    let app = (
        format!("app latency (mean above p{})", w.percentile),
        value(Some(w.a.app_ns), Unit::Ns),
        value(Some(w.b.app_ns), Unit::Ns),
        signed(Some(w.b.app_ns - w.a.app_ns), Unit::Ns),
        String::new(),
    );
    std::iter::once(app)
        .chain(w.rows.iter().map(|r| {
            (
                format!("  {}", part_name(r.stage)),
                value(Some(r.a_ns), Unit::Ns),
                value(Some(r.b_ns), Unit::Ns),
                signed(Some(r.delta_ns), Unit::Ns),
                r.share.filter(|_| significant).map_or(String::new(), |x| {
                    format!("{:.0}%", (x * 100.0).round() + 0.0)
                }),
            )
        }))
        .collect()
}

/// "hypervisor (A: no hypervisor, B: Xen; per I/O above idle, judged as one family):".
pub(crate) fn hypervisor_heading(d: &ProfileDiff) -> String {
    let h = &d.hypervisor;
    let kinds = format!("A: {}, B: {}", hypervisor_words(h.a), hypervisor_words(h.b));
    if h.rows.is_empty() {
        let why = match (h.a, h.b) {
            (Some(Hypervisor::None), Some(Hypervisor::None)) => "no hypervisor on either host",
            (None, None) => "not recorded in these profiles",
            _ => "nothing measured",
        };
        return format!("hypervisor ({kinds}): {why}");
    }
    let idle = if d.above_idle { " above idle" } else { "" };
    match (h.a, h.b) {
        (Some(Hypervisor::None), Some(Hypervisor::None)) => format!(
            "hypervisor (none on either host; the native work guests' paths are compared with, \
             per I/O{idle}, judged as one family):"
        ),
        (Some(Hypervisor::None), Some(_)) | (Some(_), Some(Hypervisor::None))
            if h.rows.iter().any(|r| r.a.is_some() && r.b.is_some()) =>
        {
            format!(
                "hypervisor ({kinds}; per I/O{idle}, judged as one family; a row with both \
                 figures has metal's native work at the same function as its baseline):"
            )
        }
        _ => format!("hypervisor ({kinds}; per I/O{idle}, judged as one family):"),
    }
}

pub(crate) fn verdict_sentence(d: &ProfileDiff) -> String {
    let mut sentence = stage_sentence(d);
    if let Some(words) = hypervisor_share_words(d) {
        sentence.push_str("; ");
        sentence.push_str(&words);
    }
    sentence
}

/// The verdict on mean latency and the stage that holds most of its gap.
fn stage_sentence(d: &ProfileDiff) -> String {
    let app = &d.waterfall.app;
    let bound = format!("±{}%", percent(d.min_effect));
    match (d.verdict, app.verdict) {
        (Some(part), _) => {
            let stage = MetricId::Stage(part);
            let r = d.row(stage).expect("the verdict names a stage's row");
            format!(
                "mean latency: {} ({}); {:.0}% of that is in {}",
                verdict_text(app, d),
                signed(app.delta, Unit::Ns),
                r.share.unwrap_or(0.0) * 100.0,
                label(stage, d.above_idle)
            )
        }
        (None, Verdict::Significant | Verdict::WithinRuns | Verdict::OneSession) => format!(
            "mean latency: {} ({}), spread over stages with no single significant one",
            verdict_text(app, d),
            signed(app.delta, Unit::Ns)
        ),
        (None, Verdict::Equivalent) => {
            format!("B's mean latency is equivalent to A's within {bound}")
        }
        (None, _) => format!("no verdict on mean latency: {}", verdict_text(app, d)),
    }
}

/// "p99", "p99.9".
pub(crate) fn percentile_name(percentile: f64) -> String {
    format!("p{percentile}")
}

/// Which stage's tail moved most, among the significant ones, in a sentence; or that none did
/// (when tails were judged at all).
pub(crate) fn tail_mover_words(d: &ProfileDiff) -> Option<String> {
    match &d.tail_mover {
        Some(m) => Some(format!(
            "the {} stage's {} moved most: {}",
            m.stage.name(),
            percentile_name(m.percentile),
            signed(Some(m.delta_ns), Unit::Ns)
        )),
        None if d.tails_judged() => Some("no stage's tail moved significantly".into()),
        None => None,
    }
}

/// A Markdown report.
pub fn markdown(d: &ProfileDiff) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# virtgap diff\n");
    let _ = writeln!(
        s,
        "- **A:** {}\n- **B:** {}\n- **workload:** {}\n- {}",
        md(&side_words(d, Host::A)),
        md(&side_words(d, Host::B)),
        md(&workload(d)),
        runs_line(d)
    );
    for x in &d.spec_differences {
        let _ = writeln!(s, "- workload differs: {}", md(&spec_difference(x)));
    }
    for c in &d.confounders {
        let _ = writeln!(s, "- confounder: {}", md(&confounder(c)));
    }
    for w in &d.warnings {
        let _ = writeln!(s, "- warning: {}", md(&warning(w)));
    }
    let _ = writeln!(s, "\n**Verdict:** {}\n", verdict_sentence(d));
    let _ = writeln!(s, "## Where the time goes\n");
    let table = |s: &mut String, rows: &mut dyn Iterator<Item = &Row>| {
        let _ = writeln!(
            s,
            "| metric | A | B | delta | share | verdict (95% interval, % of A) |\n|---|---:|---:|---:|---:|---|"
        );
        for r in rows {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} |",
                row_label(d, r),
                value(r.a, r.unit),
                value(r.b, r.unit),
                signed(r.delta, r.unit),
                share(r, d),
                verdict_text(r, d)
            );
        }
    };
    table(&mut s, &mut d.waterfall.rows());
    let _ = writeln!(s, "\n## Tails\n");
    table(&mut s, &mut d.tails.iter());
    if let Some(m) = &d.tail_mover {
        let _ = writeln!(
            s,
            "\nThe **{}** stage's {} moved most ({}).",
            m.stage.name(),
            percentile_name(m.percentile),
            signed(Some(m.delta_ns), Unit::Ns)
        );
    } else if d.tails_judged() {
        let _ = writeln!(s, "\nNo stage's tail moved significantly.");
    }
    for w in &d.tail_waterfalls {
        let _ = writeln!(
            s,
            "\n### {}\n\n| stage | A | B | delta | share |\n|---|---:|---:|---:|---:|",
            tail_heading(w).trim_end_matches(':')
        );
        for (label, a, b, delta, share) in tail_rows(w, d) {
            let _ = writeln!(s, "| {} | {a} | {b} | {delta} | {share} |", label.trim());
        }
    }
    let _ = writeln!(s, "\n## Throughput\n");
    table(&mut s, &mut d.throughput.iter());
    let _ = writeln!(s, "\n## Hypervisor\n\n{}", hypervisor_heading(d));
    if !d.hypervisor.rows.is_empty() {
        let _ = writeln!(s);
        table(&mut s, &mut d.hypervisor.rows.iter());
    }
    if let Some(m) = d.hypervisor.moved {
        let _ = writeln!(
            s,
            "\nThe mechanism that moved most: **{}**.",
            mechanism_words(m)
        );
    }
    if !d.nvme_queues.is_empty() {
        let _ = writeln!(s, "\n## NVMe queues\n\n{NVME_HEADING}\n");
        table(&mut s, &mut d.nvme_queues.iter());
    }
    let _ = writeln!(s, "\n## Evidence\n\n| | A | B |\n|---|---|---|");
    for e in evidence(d) {
        let _ = writeln!(s, "| {} | {} | {} |", e.item, e.a, e.b);
    }
    s
}

fn unit_key(unit: Unit) -> &'static str {
    match unit {
        Unit::Ns => "ns",
        Unit::PerIo => "per_io",
        Unit::Iops => "iops",
    }
}

/// CSV: one row per metric: the hosts' values, the difference with its interval, the effect
/// (B relative to A) with its interval, the share of the gap, the verdict, and each side's
/// name (its label, hostname or file), so rows from several diffs can be pooled.
pub fn csv(d: &ProfileDiff) -> String {
    let mut w = csv::Writer::from_writer(Vec::new());
    let num = |v: Option<f64>| {
        v.map(|x| {
            let rounded = (x * 1000.0).round() / 1000.0;
            format!("{}", if rounded.is_finite() { rounded } else { x })
        })
        .unwrap_or_default()
    };
    let frac = |v: Option<f64>| {
        v.map(|x| format!("{}", (x * 1e5).round() / 1e5))
            .unwrap_or_default()
    };
    w.write_record([
        "metric",
        "unit",
        "a",
        "b",
        "delta",
        "ci_low",
        "ci_high",
        "effect",
        "effect_low",
        "effect_high",
        "confidence",
        "share",
        "verdict",
        "runs_needed",
        "a_name",
        "b_name",
    ])
    .expect("writing to memory");
    let names = (side_name(d, Host::A), side_name(d, Host::B));
    for r in d.rows() {
        w.write_record([
            &*row_label(d, r),
            unit_key(r.unit),
            &num(r.a),
            &num(r.b),
            &num(r.delta),
            &num(r.ci_low),
            &num(r.ci_high),
            &frac(r.effect),
            &frac(r.effect_low),
            &frac(r.effect_high),
            &frac(Some(r.confidence)),
            &num(r.share),
            verdict_words(r.verdict),
            &r.runs_needed.map(|n| n.to_string()).unwrap_or_default(),
            &names.0,
            &names.1,
        ])
        .expect("writing to memory");
    }
    String::from_utf8(w.into_inner().expect("flushing to memory")).expect("UTF-8")
}

/// A compared row in `--json`: its figures, its metric's identifier ("device_mean") and the
/// label the reports show it by.
#[derive(Serialize)]
struct JsonRow<'a> {
    #[serde(flatten)]
    row: &'a Row,
    label: Cow<'static, str>,
}

fn labelled<'a>(d: &ProfileDiff, row: &'a Row) -> JsonRow<'a> {
    JsonRow {
        row,
        label: row_label(d, row),
    }
}

/// A tail row in `--json`, with its stage and percentile.
#[derive(Serialize)]
struct JsonTail<'a> {
    stage: &'static str,
    percentile: f64,
    row: JsonRow<'a>,
}

/// The hypervisor block in `--json`: each side's hypervisor ("none" on metal, null when not
/// recorded), its rows, and the mechanism that moved most.
#[derive(Serialize)]
struct JsonHypervisor<'a> {
    a: Option<Hypervisor>,
    b: Option<Hypervisor>,
    rows: Vec<JsonRow<'a>>,
    moved: Option<Mechanism>,
    /// The mechanisms each side's hypervisor does not offer (a CPUID bit clear).
    not_offered_a: &'a [Mechanism],
    not_offered_b: &'a [Mechanism],
}

/// `diff --json`: the comparison's numbers, with the words the reports show beside them.
#[derive(Serialize)]
struct JsonDiff<'a> {
    host_a: String,
    host_b: String,
    /// Where each side's figures came from and when they were recorded.
    source_a: Option<String>,
    source_b: Option<String>,
    workload: String,
    min_effect: f64,
    runs_a: usize,
    runs_b: usize,
    basis: Basis,
    spec_differences: Vec<String>,
    confounders: Vec<String>,
    warnings: Vec<String>,
    waterfall: Vec<JsonRow<'a>>,
    tails: Vec<JsonTail<'a>>,
    /// The stage whose tail moved most among the significant ones, at which percentile, and
    /// the move in ns.
    tail_mover: Option<(&'static str, f64, f64)>,
    tail_waterfalls: &'a [TailWaterfall],
    throughput: Vec<JsonRow<'a>>,
    hypervisor: JsonHypervisor<'a>,
    /// NVMe command latency per queue id both hosts used (absent when none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    nvme_queues: Vec<JsonRow<'a>>,
    evidence: Vec<EvidenceLine>,
    /// The label of the stage with the largest significant share of the gap.
    verdict: Option<Cow<'static, str>>,
}

/// The diff as pretty-printed JSON: every row keyed by its metric's identifier (`metric`,
/// snake case) with the label the text report uses (`label`); evidence, warnings and
/// differences as the text report words them.
pub fn json(d: &ProfileDiff) -> serde_json::Result<String> {
    let labelled = |row| labelled(d, row);
    let doc = JsonDiff {
        host_a: d.host_a.describe(),
        host_b: d.host_b.describe(),
        source_a: source_words(&d.source_a),
        source_b: source_words(&d.source_b),
        workload: workload(d),
        min_effect: d.min_effect,
        runs_a: d.runs_a,
        runs_b: d.runs_b,
        basis: d.basis,
        spec_differences: d.spec_differences.iter().map(spec_difference).collect(),
        confounders: d.confounders.iter().map(confounder).collect(),
        warnings: d.warnings.iter().map(warning).collect(),
        waterfall: d.waterfall.rows().map(labelled).collect(),
        tails: d
            .tails
            .iter()
            .filter_map(|row| match row.metric {
                MetricId::Tail { stage, percentile } => Some(JsonTail {
                    stage: stage.name(),
                    percentile,
                    row: labelled(row),
                }),
                _ => None,
            })
            .collect(),
        tail_mover: d
            .tail_mover
            .map(|m| (m.stage.name(), m.percentile, m.delta_ns)),
        tail_waterfalls: &d.tail_waterfalls,
        throughput: d.throughput.iter().map(labelled).collect(),
        hypervisor: JsonHypervisor {
            a: d.hypervisor.a,
            b: d.hypervisor.b,
            rows: d.hypervisor.rows.iter().map(labelled).collect(),
            moved: d.hypervisor.moved,
            not_offered_a: &d.hypervisor.not_offered.0,
            not_offered_b: &d.hypervisor.not_offered.1,
        },
        nvme_queues: d.nvme_queues.iter().map(labelled).collect(),
        evidence: evidence(d),
        verdict: d
            .verdict
            .map(|part| label(MetricId::Stage(part), d.above_idle)),
    };
    serde_json::to_string_pretty(&doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::diff::{diff, tests::synthetic};
    use crate::model::profile::Profile;

    fn pair() -> (Profile, Profile) {
        (
            synthetic(2_000.0, 300_000.0, 100_000.0, 5_000.0, 10),
            synthetic(2_500.0, 800_000.0, 120_000.0, 5_000.0, 10),
        )
    }

    /// A KVM host whose CPUID leaves PV EOI out against one that uses it: the EOI rows are
    /// the other host's alone, and the first reads "not offered by this host", not "-".
    #[test]
    fn a_mechanism_one_host_does_not_offer_reads_so() {
        use crate::analysis::diff::tests::on_hypervisor;
        use crate::model::hypervisor::{MechanismFigure, PathFigure, PathMeasure, PathState};
        use virtgap_probes::hypervisor::{Hypervisor, Mechanism};
        let timer = (Mechanism::Timer, 1.0, 1_000.0);
        let mut a = on_hypervisor(Hypervisor::Kvm, &[timer], 1_000.0);
        a.hypervisor.as_mut().unwrap().mechanisms = vec![MechanismFigure {
            mechanism: Mechanism::InterruptDelivery,
            count: None,
            time_ns: None,
            paths: vec![PathFigure {
                what: "PV EOI".into(),
                how: PathMeasure::Timed {
                    symbol: Some("kvm_guest_apic_eoi_write".into()),
                },
                count: None,
                time_ns: None,
                state: PathState::NotOffered("CPUID 0x40000001 EAX bit 6 clear".into()),
            }],
        }];
        let b = on_hypervisor(
            Hypervisor::Kvm,
            &[timer, (Mechanism::InterruptDelivery, 1.0, 200.0)],
            1_000.0,
        );
        let d = diff(&a, &b);
        let eoi = d
            .row(MetricId::MechanismPerIo(Mechanism::InterruptDelivery))
            .unwrap();
        assert_eq!(eoi.verdict, Verdict::NoHypervisor, "{eoi:?}");
        let words = verdict_text(eoi, &d);
        assert!(
            words.starts_with("B: 0.9")
                && words.ends_with(
                    "interrupt EOIs per I/O; A: not offered by this host (a CPUID bit clear)"
                ),
            "{words}"
        );
        assert_eq!(cell(eoi, Host::A), "none");
    }

    /// A significant difference from a host whose figure is 0 reads in the row's unit, not as
    /// "200% of the hosts' mean" (which any such difference is).
    #[test]
    fn a_difference_from_a_host_at_zero_reads_in_the_rows_unit() {
        use crate::analysis::diff::tests::on_hypervisor_at;
        use virtgap_probes::hypervisor::{Hypervisor, Mechanism};
        let xen = [(Mechanism::Timer, 1.0, 10_000.0)];
        let d = diff(
            &on_hypervisor_at(Hypervisor::None, &[], 0.0, 300_000.0),
            &on_hypervisor_at(Hypervisor::Xen, &xen, 4_100.0, 330_000.0),
        );
        let mut r = d
            .row(MetricId::MechanismTimePerIo(Mechanism::Timer))
            .unwrap()
            .clone();
        (r.a, r.b, r.delta) = (Some(0.0), Some(2_000.0), Some(2_000.0));
        (r.ci_low, r.ci_high) = (Some(1_500.0), Some(2_500.0));
        (r.effect, r.effect_low, r.effect_high) = (Some(2.0), Some(1.5), Some(2.5));
        (r.scale, r.verdict) = (Scale::Difference, Verdict::Significant);
        let words = verdict_text(&r, &d);
        assert!(
            words.starts_with("B slower by 2.0 µs [1.5 µs, 2.5 µs]"),
            "{words}"
        );
        // B at zero instead: lower by A's figure.
        (r.a, r.b, r.delta) = (Some(2_000.0), Some(0.0), Some(-2_000.0));
        (r.ci_low, r.ci_high) = (Some(-2_500.0), Some(-1_500.0));
        (r.effect, r.effect_low, r.effect_high) = (Some(-2.0), Some(-2.5), Some(-1.5));
        let words = verdict_text(&r, &d);
        assert!(
            words.starts_with("B faster by 2.0 µs [1.5 µs, 2.5 µs]"),
            "{words}"
        );
    }

    /// The verdict names the hypervisor's share of a significant gap, with its interval, and
    /// the metal host's column says "none", not "-".
    #[test]
    fn the_verdict_names_the_hypervisors_share_of_the_gap() {
        use crate::analysis::diff::tests::on_hypervisor_at;
        use virtgap_probes::hypervisor::{Hypervisor, Mechanism};
        let xen = [
            (Mechanism::Timer, 1.0, 10_000.0),
            (Mechanism::Upcall, 1.0, 5_000.0),
        ];
        let d = diff(
            &on_hypervisor_at(Hypervisor::None, &[], 0.0, 300_000.0),
            &on_hypervisor_at(Hypervisor::Xen, &xen, 4_100.0, 330_000.0),
        );
        let sentence = verdict_sentence(&d);
        assert!(
            sentence.contains("the hypervisor's paths (Xen) take 49% ["),
            "{sentence}"
        );
        assert!(sentence.contains("an upper bound"), "{sentence}");
        let text = terminal(&d);
        let row = text
            .lines()
            .find(|l| l.starts_with("all hypervisor paths' time per I/O"))
            .unwrap();
        assert!(row.contains(" none "), "{row}");
        assert!(row.trim_end().ends_with("49%"), "{row}");
    }

    /// A Xen guest against metal: B's figure on every hypervisor row, "no hypervisor" for A,
    /// never "equivalent".
    #[test]
    fn a_xen_guest_against_metal_reads_as_no_hypervisor() {
        use crate::analysis::diff::tests::on_hypervisor;
        use virtgap_probes::hypervisor::{Hypervisor, Mechanism};
        let xen = [
            (Mechanism::Timer, 0.9, 1_800.0),
            (Mechanism::Ipi, 0.3, 1_500.0),
            (Mechanism::Upcall, 1.2, 900.0),
        ];
        let d = diff(
            &on_hypervisor(Hypervisor::None, &[], 0.0),
            &on_hypervisor(Hypervisor::Xen, &xen, 4_100.0),
        );
        insta::assert_snapshot!(terminal(&d));
    }

    /// A profile's host strings come from another host: Markdown shows them as text (no tag a
    /// renderer would obey, no `|` splitting a table, no backtick opening code), on one line.
    #[test]
    fn markdown_shows_a_profiles_html_and_table_characters_as_text() {
        let (a, mut b) = pair();
        b.host.cpu_model =
            Some("<script>alert(9)</script><img src=x onerror=alert(8)>|x|`y`\n# H".into());
        let md_text = markdown(&diff(&a, &b));
        for raw in ["<script", "<img", "|x|", "`y`", "\n# H"] {
            assert!(!md_text.contains(raw), "{raw:?} copied as is: {md_text}");
        }
        assert!(md_text.contains("&lt;script&gt;"), "{md_text}");
        let text = terminal(&diff(&a, &b));
        assert!(!text.lines().any(|l| l.starts_with("# H")), "{text}");
    }

    #[test]
    fn markdown_and_csv_match_their_snapshots() {
        let (a, b) = pair();
        let d = diff(&a, &b);
        insta::assert_snapshot!("diff_md", markdown(&d));
        insta::assert_snapshot!("diff_csv", csv(&d));
    }

    #[test]
    fn terminal_report_fits_100_columns() {
        let (a, b) = pair();
        let text = terminal(&diff(&a, &b));
        for line in text
            .lines()
            .filter(|l| !l.starts_with("A: ") && !l.starts_with("B: "))
        {
            assert!(line.chars().count() <= 100, "too wide: {line}");
        }
        // One run a host: the verdict is provisional and says what would judge it.
        assert!(
            text.contains(
                "verdict: mean latency: B slower x2.29 [x2.27, x2.32] (one run a host; --runs 5 \
                 judges it)"
            ) && text.contains("96% of that is in device"),
            "{text}"
        );
    }

    #[test]
    fn one_recording_a_host_reads_provisional_and_says_what_judges_it() {
        use crate::analysis::diff::tests::{later, noisy_runs};
        let a = noisy_runs(3, 400_000.0, 10_000.0, 0.02, 2e6);
        let b = later(noisy_runs(3, 480_000.0, 8_300.0, 0.02, 2e6), 1);
        let text = terminal(&diff(&a, &b));
        let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flat.contains("verdict: mean latency: B slower by 19.8% [14.5, 25.4] (one session a host; record again to judge)")
                && flat.contains("record each host again at another time (--with-a, --with-b) to judge it"),
            "{text}"
        );
        for line in text
            .lines()
            .filter(|l| !l.starts_with("A: ") && !l.starts_with("B: "))
        {
            assert!(line.chars().count() <= 100, "too wide: {line}");
        }
    }

    #[test]
    fn with_one_session_a_host_an_inconclusive_row_asks_for_a_second_session() {
        use crate::analysis::diff::tests::{later, noisy_runs};
        let a = noisy_runs(3, 400_000.0, 10_000.0, 0.08, 2e6);
        let b = later(noisy_runs(3, 420_000.0, 10_000.0, 0.08, 2e6), 1);
        let d = diff(&a, &b);
        let r = &d.waterfall.app;
        assert_eq!(
            (r.verdict, r.runs_needed.is_some()),
            (Verdict::Inconclusive, true),
            "{r:?}"
        );
        let words = verdict_text(r, &d);
        assert!(
            words.contains("runs per host, in 2 sessions, would resolve ±5%"),
            "{words}"
        );
        for line in terminal(&d)
            .lines()
            .filter(|l| !l.starts_with("A: ") && !l.starts_with("B: "))
        {
            assert!(line.chars().count() <= 100, "too wide: {line}");
        }
        // Two recordings of A: more runs alone would resolve it.
        let again = later(noisy_runs(3, 400_000.0, 10_000.0, 0.08, 2e6), 2);
        let d = crate::analysis::diff::diff_hosts(
            &[&a, &again],
            &[&b],
            &crate::analysis::diff::DiffOptions::default(),
        );
        let words = verdict_text(&d.waterfall.app, &d);
        assert!(!words.contains("sessions"), "{words}");
    }

    #[test]
    fn a_figure_below_the_idle_host_reads_so_not_as_a_hosts_figure() {
        use virtgap_probes::hypervisor::Mechanism;
        let (a, b) = pair();
        let d = diff(&a, &b);
        let mut r = d.waterfall.app.clone();
        r.metric = MetricId::MechanismTimePerIo(Mechanism::Timer);
        (r.a, r.b) = (Some(4_215.6), Some(-667.1));
        assert_eq!(
            (cell(&r, Host::A), cell(&r, Host::B)),
            ("4.2 µs".to_string(), "below idle".to_string())
        );
        // The software residual can be below 0 and is a figure of its own.
        r.metric = MetricId::Stage(BreakdownPart::Software);
        assert_eq!(cell(&r, Host::B), "-667 ns");
    }

    #[test]
    fn every_label_with_its_indent_fits_the_terminal_label_column() {
        use crate::analysis::diff::tests::on_hypervisor;
        use virtgap_probes::hypervisor::Hypervisor;
        let (a, b) = pair();
        let d = diff(&a, &b);
        let every_mechanism: Vec<_> = Mechanism::ALL.iter().map(|&m| (m, 1.0, 1_000.0)).collect();
        let h = diff(
            &on_hypervisor(Hypervisor::Kvm, &every_mechanism, 1_000.0),
            &on_hypervisor(Hypervisor::Kvm, &every_mechanism, 2_000.0),
        );
        assert!(h.hypervisor.rows.len() > 2 * Mechanism::ALL.len() / 2);
        for above_idle in [false, true] {
            for r in d.rows().chain(h.rows()) {
                let width = indent_of(r.metric) + label(r.metric, above_idle).chars().count();
                assert!(width <= LABEL_COLUMNS, "{:?}: {width}", r.metric);
            }
        }
    }

    #[test]
    fn rows_are_labelled_from_their_metric_and_the_idle_baseline() {
        assert_eq!(
            label(MetricId::HardirqPerIo, false),
            "hard-IRQ time per I/O (all IRQs)"
        );
        assert_eq!(
            label(MetricId::HardirqPerIo, true),
            "hard-IRQ time per I/O, above idle"
        );
        assert_eq!(label(MetricId::WakeupPerIo, true), "wakeup delay per I/O");
        let tail = MetricId::Tail {
            stage: Stage::Device,
            percentile: 99.9,
        };
        assert_eq!(label(tail, false), "device p99.9");
        assert_eq!(tail.key(), "device_p99_9");
        assert_eq!(MetricId::Stage(BreakdownPart::Queue).key(), "queue_mean");
    }

    #[test]
    fn warnings_differences_and_evidence_are_worded_from_their_figures() {
        assert_eq!(
            warning(&Warning::QueueStart(QueueStartSplit::EntryOnB))
                .split(" (")
                .next(),
            Some("the queue stage starts where each bio enters the block layer on host B but where its request starts on host A")
        );
        assert!(
            warning(&Warning::RequestsPerIo { a: 1.0, b: 8.0 }).contains("(A 1.00, B 8.00 per I/O")
        );
        assert!(warning(&Warning::CompletionFolded(Hosts::Both))
            .starts_with("both hosts lacks the completion stage"));
        assert!(warning(&Warning::OneRun(Hosts::A)).starts_with("one run on host A: "));
        assert_eq!(
            spec_difference(&SpecDifference {
                key: SpecKey::KvLoad,
                a: Some(SpecValue::KvLoad {
                    reads_per_s: 2000,
                    writes_per_s: 1000
                }),
                b: None,
            }),
            "kv load: 2000 reads/s + 1000 writes/s vs (unset)"
        );
        assert_eq!(
            confounder(&Confounder::Differs {
                what: HostTrait::IrqAffinity,
                a: Setting::List(vec!["0".into(), "1".into()]),
                b: Setting::Unknown,
            }),
            "IRQ affinity of the target's queues: 0;1 vs unknown"
        );
        let (a, b) = pair();
        let mut bare = a.clone();
        bare.stages.device = None;
        let lines = evidence(&diff(&bare, &b));
        let requests = lines
            .iter()
            .find(|e| e.item == "block requests per app I/O")
            .unwrap();
        assert_eq!(requests.a, "not measured");
        assert_eq!(requests.b, "1.00 (10000 requests for 10000 I/Os)");
    }

    #[test]
    fn json_keys_rows_by_metric_and_keeps_their_labels() {
        let (a, b) = pair();
        let d = diff(&a, &b);
        let doc: serde_json::Value = serde_json::from_str(&json(&d).unwrap()).unwrap();
        let waterfall = doc["waterfall"].as_array().unwrap();
        assert_eq!(waterfall.len(), d.waterfall.rows().count());
        assert_eq!(waterfall[0]["metric"], "app_mean");
        assert_eq!(waterfall[0]["label"], "app latency (mean)");
        assert_eq!(waterfall[2]["metric"], "device_mean");
        assert_eq!(doc["tails"][1]["row"]["metric"], "app_p99_9");
        assert_eq!(doc["tails"][1]["row"]["label"], "app p99.9");
        assert_eq!(doc["tails"][1]["stage"], "app");
        assert_eq!(doc["verdict"], "device");
        // One run a side: no tail is judged, so none is named as having moved.
        assert_eq!(doc["tail_mover"], serde_json::Value::Null);
        assert_eq!(doc["evidence"][0]["item"], "busiest IRQ CPU");
        assert!(doc["warnings"][0]
            .as_str()
            .unwrap()
            .starts_with("one run on each host"));
    }

    /// The NVMe rows have their own heading and section, where both hosts used NVMe queues
    /// only, in every report.
    #[test]
    fn nvme_queues_get_their_own_section_only_where_both_hosts_have_them() {
        use crate::analysis::diff::tests::{noisy_runs, with_nvme};
        let base = || noisy_runs(5, 400_000.0, 10_000.0, 0.02, 2e6);
        let b = with_nvme(base(), &[(1, 80_000.0), (2, 240_000.0)]);
        let d = diff(&with_nvme(base(), &[(2, 80_000.0)]), &b);
        let text = terminal(&d);
        assert!(text.contains(NVME_HEADING), "{text}");
        assert!(text.contains("NVMe queue 2 command (mean)"));
        assert!(!text.contains("NVMe queue 1"), "queue 1 is B's only");
        assert!(markdown(&d).contains("## NVMe queues"));
        assert!(csv(&d).contains("NVMe queue 2 command (mean),ns,80000,240000"));
        let doc: serde_json::Value = serde_json::from_str(&json(&d).unwrap()).unwrap();
        assert_eq!(doc["nvme_queues"][0]["metric"], "nvme_q2_command_mean");
        let without = diff(&base(), &b);
        assert!(!terminal(&without).contains("NVMe"));
        assert!(!json(&without).unwrap().contains("nvme_queues"));
    }
}
