//! Renders a `ProfileDiff`: terminal text (fits 100 columns), Markdown, CSV, and SVG charts.

use std::fmt::Write as _;

use crate::analysis::diff::{
    Basis, ProfileDiff, Row, Scale, TailWaterfall, Unit, Verdict, CONFIDENCE,
};
use crate::model::profile::{Histogram, Profile, Stage};
use virtgap_workloads::units;

fn value(v: Option<f64>, unit: Unit) -> String {
    // An empty float sum is -0.0; show it as 0.
    let v = v.map(|x| if x == 0.0 { 0.0 } else { x });
    match (v, unit) {
        (None, _) => "-".into(),
        (Some(x), Unit::Ns) => units::latency(x),
        (Some(x), Unit::PerIo) => format!("{x:.3}"),
        (Some(x), Unit::Iops) => units::count(x),
    }
}

fn signed(v: Option<f64>, unit: Unit) -> String {
    match v {
        None => "-".into(),
        Some(x) => {
            let sign = if x >= 0.0 { "+" } else { "-" };
            format!("{sign}{}", value(Some(x.abs()), unit))
        }
    }
}

fn share(r: &Row) -> String {
    r.share
        .map_or(String::new(), |s| format!("{:.0}%", s * 100.0))
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
    format!("{:.1}", x * 100.0)
}

/// The row's verdict in words: "B slower by 8.1% [5.9, 10.4]", "equivalent within ±5%",
/// "inconclusive (≈7 runs per host would resolve ±5%)".
pub fn verdict_text(r: &Row, d: &ProfileDiff) -> String {
    let bound = format!("±{}%", percent(d.min_effect));
    // A row judged as one of a family says its interval's own confidence.
    let within_run = match (d.basis == Basis::Batches, r.confidence > CONFIDENCE) {
        (true, false) => " (within run)".to_string(),
        (true, true) => format!(" ({}% interval, within run)", percent(r.confidence)),
        (false, true) => format!(" ({}% interval)", percent(r.confidence)),
        (false, false) => String::new(),
    };
    let w = match r.verdict {
        Verdict::Significant => {
            let (e, lo, hi) = (
                r.effect.unwrap_or(0.0),
                r.effect_low.unwrap_or(0.0),
                r.effect_high.unwrap_or(0.0),
            );
            let (up, down) = match r.unit {
                Unit::Ns => ("slower", "faster"),
                Unit::Iops | Unit::PerIo => ("higher", "lower"),
            };
            let of = match r.scale {
                Scale::Ratio => "",
                Scale::Difference => " of app latency",
            };
            // A fall is shown as how much lower B is than A; a change of 2x or more as a
            // factor — B/A up, A/B down — so the words read alike whichever host is A.
            let word = if e >= 0.0 { up } else { down };
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
        Verdict::Equivalent => format!("equivalent within {bound}{within_run}"),
        Verdict::Inconclusive => match r.runs_needed {
            Some(n) => format!("inconclusive (≈{n} runs per host would resolve {bound})"),
            None => format!("inconclusive at {bound} (between-run noise unknown: --runs 5)"),
        },
        Verdict::InsufficientData => match (d.basis, r.scale) {
            (Basis::Batches, _) if r.metric.contains(" p99") => {
                "no verdict: tails need 2+ runs per host".into()
            }
            _ => r.verdict.words().into(),
        },
        Verdict::NotMeasured => r.verdict.words().into(),
    };
    if r.estimated && r.verdict != Verdict::NotMeasured {
        return "estimated from counts, not judged".into();
    }
    w
}

/// A percentage as typed: 5 for 5%, 2.5 for 2.5%.
fn percent(fraction: f64) -> String {
    let p = (fraction * 1e4).round() / 100.0;
    format!("{p}")
}

fn runs_line(d: &ProfileDiff) -> String {
    format!(
        "runs: A {}, B {}; replicates: {}; smallest effect of interest ±{}%",
        d.runs_a,
        d.runs_b,
        match d.basis {
            Basis::Runs => "runs (Welch 95% intervals on the log scale)",
            Basis::Batches => "batches of intervals within a run",
        },
        percent(d.min_effect)
    )
}

/// One compared row, in two lines: the figures, then the verdict.
fn terminal_row(s: &mut String, r: &Row, d: &ProfileDiff) {
    let figures = format!(
        "{:<38} {:>10} {:>10} {:>11} {:>5}",
        r.metric,
        value(r.a, r.unit),
        value(r.b, r.unit),
        signed(r.delta, r.unit),
        share(r),
    );
    let _ = writeln!(s, "{}", figures.trim_end());
    let indent = r.metric.len() - r.metric.trim_start().len();
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

/// Plain text for a terminal, at most 100 columns wide.
pub fn terminal(d: &ProfileDiff) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "A: {}", d.host_a);
    let _ = writeln!(s, "B: {}", d.host_b);
    let _ = writeln!(s, "workload: {}", d.workload);
    let _ = writeln!(s, "{}", runs_line(d));
    for x in &d.spec_differences {
        let _ = writeln!(s, "  workload differs: {x}");
    }
    for c in &d.confounders {
        let _ = writeln!(s, "  confounder: {c}");
    }
    for w in &d.warnings {
        let _ = writeln!(s, "{}", wrap(&format!("  warning: {w}"), 100, 4));
    }
    let _ = writeln!(
        s,
        "\nwhere B's extra latency goes (B - A; verdict with its 95% interval, in % of A):"
    );
    let _ = writeln!(
        s,
        "{:<38} {:>10} {:>10} {:>11} {:>5}",
        "stage", "A", "B", "delta", "share"
    );
    for r in d.waterfall.rows() {
        terminal_row(&mut s, r, d);
    }
    let _ = writeln!(s, "\ntails:");
    for t in &d.tails {
        terminal_row(&mut s, &t.row, d);
    }
    if let Some((stage, delta)) = &d.tail_mover {
        let _ = writeln!(
            s,
            "the {stage} stage's p99 moved most: {}",
            signed(Some(*delta), Unit::Ns)
        );
    }
    for w in &d.tail_waterfalls {
        let _ = writeln!(s, "\n{}", tail_heading(w));
        let _ = writeln!(
            s,
            "{:<38} {:>10} {:>10} {:>11} {:>5}",
            "stage", "A", "B", "delta", "share"
        );
        for (label, a, b, delta, share) in tail_rows(w) {
            let line = format!("{label:<38} {a:>10} {b:>10} {delta:>11} {share:>5}");
            let _ = writeln!(s, "{}", line.trim_end());
        }
    }
    let _ = writeln!(s, "\nthroughput:");
    for r in &d.throughput {
        terminal_row(&mut s, r, d);
    }
    let _ = writeln!(s, "\nevidence:");
    for e in &d.evidence {
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
fn tail_heading(w: &TailWaterfall) -> String {
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
fn tail_rows(w: &TailWaterfall) -> Vec<(String, String, String, String, String)> {
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
                format!("  {}", r.stage),
                value(Some(r.a_ns), Unit::Ns),
                value(Some(r.b_ns), Unit::Ns),
                signed(Some(r.delta_ns), Unit::Ns),
                r.share.map_or(String::new(), |x| {
                    format!("{:.0}%", (x * 100.0).round() + 0.0)
                }),
            )
        }))
        .collect()
}

fn verdict_sentence(d: &ProfileDiff) -> String {
    let app = &d.waterfall.app;
    let bound = format!("±{}%", percent(d.min_effect));
    match (&d.verdict, app.verdict) {
        (Some(stage), _) => {
            let r = d
                .waterfall
                .stages
                .iter()
                .find(|r| r.metric.trim() == stage)
                .expect("verdict names a row");
            format!(
                "mean latency: {} ({}); {:.0}% of that is in {stage}",
                verdict_text(app, d),
                signed(app.delta, Unit::Ns),
                r.share.unwrap_or(0.0) * 100.0
            )
        }
        (None, Verdict::Significant) => format!(
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

/// A Markdown report.
pub fn markdown(d: &ProfileDiff) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# virtgap diff\n");
    let _ = writeln!(
        s,
        "- **A:** {}\n- **B:** {}\n- **workload:** {}\n- {}",
        d.host_a,
        d.host_b,
        d.workload,
        runs_line(d)
    );
    for x in &d.spec_differences {
        let _ = writeln!(s, "- workload differs: {x}");
    }
    for c in &d.confounders {
        let _ = writeln!(s, "- confounder: {c}");
    }
    for w in &d.warnings {
        let _ = writeln!(s, "- warning: {w}");
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
                r.metric.trim(),
                value(r.a, r.unit),
                value(r.b, r.unit),
                signed(r.delta, r.unit),
                share(r),
                verdict_text(r, d)
            );
        }
    };
    table(&mut s, &mut d.waterfall.rows());
    let _ = writeln!(s, "\n## Tails\n");
    table(&mut s, &mut d.tails.iter().map(|t| &t.row));
    if let Some((stage, delta)) = &d.tail_mover {
        let _ = writeln!(
            s,
            "\nThe **{stage}** stage's p99 moved most ({}).",
            signed(Some(*delta), Unit::Ns)
        );
    }
    for w in &d.tail_waterfalls {
        let _ = writeln!(
            s,
            "\n### {}\n\n| stage | A | B | delta | share |\n|---|---:|---:|---:|---:|",
            tail_heading(w).trim_end_matches(':')
        );
        for (label, a, b, delta, share) in tail_rows(w) {
            let _ = writeln!(s, "| {} | {a} | {b} | {delta} | {share} |", label.trim());
        }
    }
    let _ = writeln!(s, "\n## Throughput\n");
    table(&mut s, &mut d.throughput.iter());
    let _ = writeln!(s, "\n## Evidence\n\n| | A | B |\n|---|---|---|");
    for e in &d.evidence {
        let _ = writeln!(s, "| {} | {} | {} |", e.item, e.a, e.b);
    }
    s
}

/// CSV: one row per metric: the hosts' values, the difference with its interval, the effect
/// (B relative to A) with its interval, the share of the gap, the verdict.
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
    ])
    .expect("writing to memory");
    for r in d.rows() {
        let unit = match r.unit {
            Unit::Ns => "ns",
            Unit::PerIo => "per_io",
            Unit::Iops => "iops",
        };
        w.write_record([
            r.metric.trim(),
            unit,
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
            r.verdict.words(),
            &r.runs_needed.map(|n| n.to_string()).unwrap_or_default(),
        ])
        .expect("writing to memory");
    }
    String::from_utf8(w.into_inner().expect("flushing to memory")).expect("UTF-8")
}

// The charts are drawn as SVG directly: plotters needs a font rasterizer (system fonts or an
// embedded font file) to lay out text even for SVG output, while these two charts are a few
// rectangles and polylines whose text the viewer renders.

/// Text for an SVG element: markup escaped, and control characters (which XML 1.0 cannot hold
/// at all) shown as U+FFFD.
fn esc(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect::<String>()
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

const COLOR_A: &str = "#1f77b4";
const COLOR_B: &str = "#d62728";

/// The waterfall: for each stage, A's and B's mean side by side, with the delta.
pub fn waterfall_svg(d: &ProfileDiff) -> String {
    // A stage neither host measured (completion on a loop device, say) has no bars to draw.
    let rows: Vec<&Row> = std::iter::once(&d.waterfall.app)
        .chain(&d.waterfall.stages)
        .filter(|r| r.a.is_some() || r.b.is_some())
        .collect();
    let max = rows
        .iter()
        .flat_map(|r| [r.a, r.b])
        .flatten()
        .fold(1.0_f64, f64::max);
    let (w, left, bar_w) = (900.0, 260.0, 560.0);
    let h = 90.0 + rows.len() as f64 * 70.0;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="13">
<title>virtgap diff: where the time goes</title>
<rect width="100%" height="100%" fill="white"/>
<text x="20" y="28" font-size="16" font-weight="bold">Mean latency per stage: A vs B</text>
<rect x="20" y="42" width="12" height="12" fill="{COLOR_A}"/><text x="38" y="53">A: {}</text>
<rect x="20" y="60" width="12" height="12" fill="{COLOR_B}"/><text x="38" y="71">B: {}</text>
"#,
        esc(&d.host_a),
        esc(&d.host_b)
    );
    for (i, r) in rows.iter().enumerate() {
        let y = 95.0 + i as f64 * 70.0;
        let _ = writeln!(
            s,
            r#"<text x="20" y="{}">{}</text>"#,
            y + 22.0,
            esc(r.metric.trim())
        );
        for (j, (v, color, host)) in [(r.a, COLOR_A, "A"), (r.b, COLOR_B, "B")]
            .into_iter()
            .enumerate()
        {
            let yy = y + j as f64 * 24.0;
            let len = v.map_or(0.0, |v| (v.max(0.0) / max) * bar_w);
            let _ = writeln!(
                s,
                r#"<rect class="bar-{host}" x="{left}" y="{yy}" width="{len:.1}" height="20" fill="{color}"><title>{host}: {}</title></rect><text x="{:.1}" y="{:.1}">{}</text>"#,
                value(v, r.unit),
                left + len + 6.0,
                yy + 15.0,
                value(v, r.unit)
            );
        }
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" fill="#555">{} {}</text>"##,
            left,
            y + 62.0,
            signed(r.delta, r.unit),
            r.share.map_or(String::new(), |x| format!(
                "({:.0}% of the gap, {})",
                x * 100.0,
                r.verdict.words()
            ))
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Latency distributions of each stage, both hosts overlaid (log-scaled latency axis).
pub fn stages_svg(a: &Profile, b: &Profile, d: &ProfileDiff) -> String {
    let stages: Vec<(&str, Option<&Histogram>, Option<&Histogram>)> = Stage::ALL
        .map(|s| (s.name(), a.stages.get(s), b.stages.get(s)))
        .to_vec();
    let (pw, ph, left, top) = (790.0, 160.0, 60.0, 70.0);
    let h = top + stages.len() as f64 * (ph + 50.0);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="900" height="{h}" viewBox="0 0 900 {h}" font-family="sans-serif" font-size="12">
<title>virtgap diff: latency distribution per stage</title>
<rect width="100%" height="100%" fill="white"/>
<text x="20" y="26" font-size="16" font-weight="bold">Latency distribution per stage (share of I/Os per log bucket)</text>
<rect x="20" y="38" width="12" height="12" fill="{COLOR_A}"/><text x="38" y="49">A: {}</text>
<rect x="20" y="54" width="12" height="12" fill="{COLOR_B}"/><text x="38" y="65">B: {}</text>
"#,
        esc(&d.host_a),
        esc(&d.host_b)
    );
    for (i, (stage, ha, hb)) in stages.iter().enumerate() {
        let y0 = top + 20.0 + i as f64 * (ph + 50.0);
        let _ = writeln!(
            s,
            r#"<text x="20" y="{}" font-weight="bold">{stage}</text>"#,
            y0 - 6.0
        );
        let _ = writeln!(
            s,
            r##"<rect x="{left}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>"##
        );
        // Common log10 range over both hosts.
        let all: Vec<[u64; 3]> = ha
            .iter()
            .chain(hb.iter())
            .flat_map(|h| h.buckets.iter().copied())
            .collect();
        if all.is_empty() {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}">not measured</text>"#,
                left + 10.0,
                y0 + 20.0
            );
            continue;
        }
        let lo = all
            .iter()
            .map(|b| (b[0].max(1) as f64).log10())
            .fold(f64::MAX, f64::min)
            .floor();
        let hi = all
            .iter()
            .map(|b| (b[1].max(1) as f64).log10())
            .fold(f64::MIN, f64::max)
            .ceil()
            .max(lo + 1.0);
        let x_of = |ns: f64| left + (ns.max(1.0).log10() - lo) / (hi - lo) * pw;
        for decade in (lo as i32)..=(hi as i32) {
            let x = x_of(10f64.powi(decade));
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="#eee"/><text x="{x:.1}" y="{}" text-anchor="middle" fill="#555">{}</text>"##,
                y0,
                y0 + ph,
                y0 + ph + 14.0,
                units::latency(10f64.powi(decade))
            );
        }
        // Density per log10 decade so buckets of different widths compare.
        let series = |h: Option<&Histogram>| -> Vec<(f64, f64)> {
            let Some(h) = h else { return vec![] };
            let total = h.buckets.iter().fold(0u64, |t, b| t.saturating_add(b[2]));
            h.buckets
                .iter()
                .map(|b| {
                    let high = b[1] as f64 + 1.0;
                    let width = high.log10() - (b[0].max(1) as f64).log10();
                    let mid = ((b[0].max(1) as f64) * high).sqrt();
                    (mid, b[2] as f64 / total.max(1) as f64 / width.max(1e-9))
                })
                .collect()
        };
        let (sa, sb) = (series(*ha), series(*hb));
        let ymax = sa.iter().chain(&sb).map(|p| p.1).fold(1e-12, f64::max);
        for (pts, color, host) in [(sa, COLOR_A, "A"), (sb, COLOR_B, "B")] {
            if pts.is_empty() {
                continue;
            }
            let path: Vec<String> = pts
                .iter()
                .map(|(x, y)| format!("{:.1},{:.1}", x_of(*x), y0 + ph - y / ymax * (ph - 8.0)))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline class="series-{host}" data-stage="{stage}" points="{}" fill="none" stroke="{color}" stroke-width="1.5"/>"#,
                path.join(" ")
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::analysis::diff::{diff, tests::synthetic};

    fn pair() -> (Profile, Profile) {
        (
            synthetic(2_000.0, 300_000.0, 100_000.0, 5_000.0, 10),
            synthetic(2_500.0, 800_000.0, 120_000.0, 5_000.0, 10),
        )
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
        assert!(
            text.contains("verdict: mean latency: B slower x2.29 [x2.27, x2.32] (within run)")
                && text.contains("(+520.5 µs); 96% of that is in\n         device"),
            "{text}"
        );
    }

    #[test]
    fn svgs_parse_and_show_both_hosts() {
        let (a, b) = pair();
        let d = diff(&a, &b);
        let w = waterfall_svg(&d);
        let doc = roxmltree::Document::parse(&w).expect("waterfall.svg is XML");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let class = |doc: &roxmltree::Document<'_>, c: &str| {
            doc.descendants()
                .filter(|n| n.attribute("class") == Some(c))
                .count()
        };
        assert_eq!(class(&doc, "bar-A"), 4);
        assert_eq!(class(&doc, "bar-B"), 4);
        let s = stages_svg(&a, &b, &d);
        let doc = roxmltree::Document::parse(&s).expect("stages.svg is XML");
        assert!(
            class(&doc, "series-A") >= 3,
            "A's app, queue and device distributions"
        );
        assert!(class(&doc, "series-B") >= 3);
        for n in doc.descendants().filter(|n| n.has_tag_name("polyline")) {
            assert!(n.attribute("points").is_some_and(|p| !p.is_empty()));
        }
    }
}
