//! The waterfalls: where a mean I/O's time goes on each host, and where the I/Os above p99 and
//! p99.9 spent theirs (the tail autopsy), as stacked bars with each stage's delta beneath; and
//! the hypervisor's mechanisms per I/O. A stage's share of the gap is drawn only when the diff
//! judges that gap significant: a share of a gap that is not there means nothing, so otherwise
//! each stage shows its own delta and verdict.

use super::{Svg, COLOR_A, COLOR_B, PART_COLORS};
use crate::analysis::diff::{
    BreakdownPart, Host, MetricId, ProfileDiff, Row, TailWaterfall, Verdict,
};
use crate::model::stages::Stage;
use crate::render::diff_render::{
    hypervisor_heading, label, side_words, signed, value, verdict_text,
};
use std::fmt::Write as _;
use virtgap_probes::hypervisor::Hypervisor;
use virtgap_workloads::units;

const WIDTH: f64 = 960.0;
const BAR_LEFT: f64 = 60.0;
const BAR_WIDTH: f64 = 620.0;

/// One stage of a waterfall: each host's time and how it is worded beneath the bars.
struct Part {
    part: BreakdownPart,
    a: Option<f64>,
    b: Option<f64>,
    /// Of the app gap, when that gap is significant.
    share: Option<f64>,
    /// The stage's own verdict (the mean's rows are judged; a tail autopsy's are not).
    verdict: Option<String>,
}

/// One host's time of a stage (`|p| p.a` or `|p| p.b`).
type HostTime = fn(&Part) -> Option<f64>;

/// One waterfall: a mean I/O, or the I/Os above a percentile.
struct Section {
    key: String,
    title: String,
    /// The app gap's verdict in words, and whether it is significant.
    gap: String,
    gap_significant: bool,
    app: (Option<f64>, Option<f64>),
    parts: Vec<Part>,
}

fn mean_section(d: &ProfileDiff) -> Section {
    let app = &d.waterfall.app;
    let significant = app.verdict == Verdict::Significant;
    Section {
        key: "mean".into(),
        title: "Mean I/O".into(),
        gap: verdict_text(app, d),
        gap_significant: significant,
        app: (app.a, app.b),
        parts: d
            .waterfall
            .stages
            .iter()
            .filter_map(|r| match r.metric {
                MetricId::Stage(part) => Some(Part {
                    part,
                    a: r.a,
                    b: r.b,
                    share: r.share.filter(|_| significant),
                    verdict: Some(verdict_text(r, d)),
                }),
                _ => None,
            })
            .collect(),
    }
}

fn tail_section(d: &ProfileDiff, w: &TailWaterfall) -> Section {
    let row = d.row(MetricId::Tail {
        stage: Stage::App,
        percentile: w.percentile,
    });
    let significant = row.is_some_and(|r| r.verdict == Verdict::Significant);
    Section {
        key: format!("p{}", w.percentile),
        title: format!(
            "I/Os above p{} (tail autopsy, {} + {} runs; joined to their block request: {:.0}% / {:.0}%)",
            w.percentile,
            w.runs_a,
            w.runs_b,
            w.joined_a * 100.0,
            w.joined_b * 100.0
        ),
        gap: row.map_or("not judged".into(), |r| {
            format!("app p{}: {}", w.percentile, verdict_text(r, d))
        }),
        gap_significant: significant,
        app: (Some(w.a.app_ns), Some(w.b.app_ns)),
        parts: w
            .rows
            .iter()
            .map(|r| Part {
                part: r.stage,
                a: Some(r.a_ns),
                b: Some(r.b_ns),
                share: r.share.filter(|_| significant),
                verdict: None,
            })
            .collect(),
    }
}

/// Draws one section: a stacked bar per host, then a line per stage. Returns its height.
fn draw_section(svg: &mut Svg, top: f64, s: &Section) -> f64 {
    let _ = writeln!(svg.body, r#"<g class="waterfall" data-set="{}">"#, s.key);
    svg.text(
        20.0,
        top + 14.0,
        r#"font-size="14" font-weight="bold""#,
        &s.title,
    );
    svg.text(20.0, top + 32.0, "", &s.gap);
    let scale = BAR_WIDTH / s.longest_bar();
    let mut y = top + 44.0;
    for (host, color, app, side) in [
        ("A", COLOR_A, s.app.0, (|p: &Part| p.a) as HostTime),
        ("B", COLOR_B, s.app.1, |p: &Part| p.b),
    ] {
        s.draw_bar(svg, y, (host, color), (app, side), scale);
        y += 28.0;
    }
    y += 8.0;
    let y = s.draw_stage_lines(svg, y);
    svg.raw("</g>");
    y - top + 16.0
}

impl Section {
    /// The longest bar's length (ns, at least 1): a host's app time, or its stages' positive
    /// times stacked.
    fn longest_bar(&self) -> f64 {
        let positive = |side: HostTime| -> f64 {
            self.parts
                .iter()
                .filter_map(side)
                .filter(|v| *v > 0.0)
                .sum::<f64>()
        };
        [
            self.app.0.unwrap_or(0.0),
            self.app.1.unwrap_or(0.0),
            positive(|p| p.a),
            positive(|p| p.b),
        ]
        .into_iter()
        .fold(1.0, f64::max)
    }

    /// One host's bar at `y`: its stages stacked (`side` picks the host's time of a stage),
    /// and a mark at its app time, `app`, labelled.
    fn draw_bar(
        &self,
        svg: &mut Svg,
        y: f64,
        (host, color): (&str, &str),
        (app, side): (Option<f64>, HostTime),
        scale: f64,
    ) {
        svg.text(
            20.0,
            y + 15.0,
            &format!(r#"fill="{color}" font-weight="bold""#),
            host,
        );
        let mut x = BAR_LEFT;
        for p in &self.parts {
            let Some(v) = side(p) else { continue };
            let len = v.max(0.0) * scale;
            let _ = writeln!(
                svg.body,
                r#"<rect class="seg seg-{host}" data-part="{}" data-ns="{v}" x="{x:.2}" y="{y}" width="{len:.2}" height="20" fill="{}"><title>{host} {}: {}</title></rect>"#,
                p.part.key(),
                PART_COLORS[part_index(p.part)],
                p.part.key(),
                units::latency(v)
            );
            x += len;
        }
        match app {
            Some(v) => {
                let end = BAR_LEFT + v.max(0.0) * scale;
                let _ = writeln!(
                    svg.body,
                    r#"<line class="app-{host}" data-ns="{v}" x1="{end:.2}" y1="{}" x2="{end:.2}" y2="{}" stroke="black" stroke-width="2"/>"#,
                    y - 3.0,
                    y + 23.0
                );
                svg.text(
                    end.max(x) + 8.0,
                    y + 15.0,
                    "",
                    &format!("app {}", units::latency(v)),
                );
            }
            None => svg.text(BAR_LEFT, y + 15.0, r##"fill="#555""##, "not measured"),
        }
    }

    /// A line per stage from `y` down: each host's time, the delta, its share of the gap when
    /// the gap is significant (else a line saying why there are none), and its verdict.
    /// Returns where the next line would go.
    fn draw_stage_lines(&self, svg: &mut Svg, mut y: f64) -> f64 {
        for p in &self.parts {
            let delta = match (p.a, p.b) {
                (Some(a), Some(b)) => Some(b - a),
                _ => None,
            };
            let _ = writeln!(
                svg.body,
                r#"<rect x="20" y="{:.1}" width="10" height="10" fill="{}"/>"#,
                y - 9.0,
                PART_COLORS[part_index(p.part)]
            );
            let share = p.share.map_or(String::new(), |x| {
                format!(", {:.0}% of the gap", (x * 100.0).round() + 0.0)
            });
            let verdict = p
                .verdict
                .as_ref()
                .map_or(String::new(), |v| format!(": {v}"));
            svg.text(
                36.0,
                y,
                "",
                &format!(
                    "{}: A {}, B {}, delta {}{share}{verdict}",
                    p.part.key(),
                    value(p.a, crate::analysis::diff::Unit::Ns),
                    value(p.b, crate::analysis::diff::Unit::Ns),
                    signed(delta, crate::analysis::diff::Unit::Ns),
                ),
            );
            y += 17.0;
        }
        if !self.gap_significant {
            svg.text(
                36.0,
                y,
                r##"fill="#555" font-style="italic""##,
                "no shares of the gap: it is not judged significant",
            );
            y += 17.0;
        }
        y
    }
}

fn part_index(part: BreakdownPart) -> usize {
    BreakdownPart::ALL
        .iter()
        .position(|&p| p == part)
        .unwrap_or(0)
}

/// The mean waterfall, then the tail autopsy's at p99 and p99.9 (when both hosts recorded it).
pub fn waterfall_chart(d: &ProfileDiff) -> String {
    let title = "Where the time goes: A vs B";
    let mut svg = Svg::new(WIDTH);
    let mut y = svg.heading(
        title,
        &[
            (COLOR_A, format!("A: {}", side_words(d, Host::A))),
            (COLOR_B, format!("B: {}", side_words(d, Host::B))),
        ],
    );
    // The stages' colours.
    let mut x = 20.0;
    for part in BreakdownPart::ALL {
        let _ = writeln!(
            svg.body,
            r#"<rect x="{x}" y="{y}" width="12" height="12" fill="{}"/>"#,
            PART_COLORS[part_index(part)]
        );
        svg.text(x + 16.0, y + 11.0, "", part.key());
        x += 110.0;
    }
    y += 30.0;
    y += draw_section(&mut svg, y, &mean_section(d));
    if d.tail_waterfalls.is_empty() {
        svg.text(
            20.0,
            y + 12.0,
            r##"fill="#555""##,
            "tail autopsy: not recorded on both hosts (it needs the block probe and a workload of virtgap's own)",
        );
        y += 30.0;
    }
    for w in &d.tail_waterfalls {
        y += draw_section(&mut svg, y, &tail_section(d, w));
    }
    svg.finish(title, y + 10.0)
}

/// The hypervisor block: each mechanism's uses and time per I/O on both hosts, each row on its
/// own scale, with its verdict.
pub fn hypervisor_chart(d: &ProfileDiff) -> String {
    let title = "The hypervisor per I/O: A vs B";
    let mut svg = Svg::new(WIDTH);
    let mut y = svg.heading(
        title,
        &[
            (COLOR_A, format!("A: {}", side_words(d, Host::A))),
            (COLOR_B, format!("B: {}", side_words(d, Host::B))),
        ],
    );
    svg.text(20.0, y + 4.0, "", &hypervisor_heading(d));
    y += 24.0;
    for r in &d.hypervisor.rows {
        y += hypervisor_row(&mut svg, y, d, r);
    }
    svg.finish(title, y + 10.0)
}

fn hypervisor_row(svg: &mut Svg, top: f64, d: &ProfileDiff, r: &Row) -> f64 {
    let _ = writeln!(
        svg.body,
        r#"<g class="mechanism" data-metric="{}">"#,
        r.metric.key()
    );
    svg.text(
        20.0,
        top + 14.0,
        r#"font-weight="bold""#,
        &label(r.metric, d.above_idle),
    );
    let max = [r.a, r.b].into_iter().flatten().fold(0.0, f64::max);
    let mut y = top + 22.0;
    for (host, color, v, kind) in [
        ("A", COLOR_A, r.a, d.hypervisor.a),
        ("B", COLOR_B, r.b, d.hypervisor.b),
    ] {
        svg.text(20.0, y + 12.0, &format!(r#"fill="{color}""#), host);
        let len = match v {
            Some(v) if max > 0.0 => v.max(0.0) / max * BAR_WIDTH * 0.8,
            _ => 0.0,
        };
        let _ = writeln!(
            svg.body,
            r#"<rect class="bar-{host}" x="{BAR_LEFT}" y="{y}" width="{len:.2}" height="16" fill="{color}"/>"#
        );
        let figure = match (v, kind) {
            (Some(_), _) => value(v, r.unit),
            (None, Some(Hypervisor::None)) => "no hypervisor".into(),
            (None, _) => "not measured".into(),
        };
        svg.text(BAR_LEFT + len + 6.0, y + 12.0, "", &figure);
        y += 20.0;
    }
    svg.text(36.0, y + 12.0, r##"fill="#555""##, &verdict_text(r, d));
    svg.raw("</g>");
    y + 24.0 - top
}
