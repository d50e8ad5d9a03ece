//! Latency against percentile on a logarithmic "nines" axis (p90, p99, p99.9 … equally
//! spaced), latency on a log axis: the tail, which a linear axis flattens, takes most of the
//! width. Each run is a faint line, so a reader sees whether two hosts' tails differ by more
//! than their runs do; the bold line is the runs' geometric mean at each percentile, which at
//! p99 and p99.9 is exactly the figure the diff's tail rows compare (on the log scale).

use super::{Svg, COLOR_A, COLOR_B};
use crate::analysis::diff::{Host, MetricId, ProfileDiff};
use crate::model::histogram::Histogram;
use crate::model::profile::Profile;
use crate::model::stages::Stage;
use crate::render::diff_render::{side_words, verdict_text};
use std::fmt::Write as _;
use virtgap_workloads::units;

/// Points per nine of the x axis: p90, p99, p99.9 … fall on points of every curve.
const STEPS_PER_NINE: u32 = 20;
/// The deepest percentile drawn (p99.999), when the runs hold enough I/Os for it.
const MAX_NINES: f64 = 5.0;
/// The percentiles marked on every curve and annotated.
const MARKED: [f64; 2] = [99.0, 99.9];

const WIDTH: f64 = 960.0;
const PLOT_LEFT: f64 = 80.0;
const PLOT_WIDTH: f64 = 540.0;
const PLOT_HEIGHT: f64 = 200.0;
const NOTES_LEFT: f64 = 650.0;

/// The nines of percentile `p` (0–100): 1 for p90, 2 for p99, 3 for p99.9.
pub fn nines(p: f64) -> f64 {
    -(1.0 - p / 100.0).log10()
}

/// The percentile `n` nines deep: 90 for 1, 99.9 for 3.
pub fn percentile_at(n: f64) -> f64 {
    100.0 * (1.0 - 10f64.powf(-n))
}

/// "p99.9", "p50", "p0".
pub fn percentile_name(p: f64) -> String {
    let rounded = (p * 1e4).round() / 1e4;
    format!("p{rounded}")
}

/// One host as the chart draws it.
struct HostSide<'a> {
    letter: &'static str,
    color: &'static str,
    profiles: &'a [&'a Profile],
}

/// The histograms of `stage`, one per run of every profile on a side (a profile without run
/// records counts as one run); runs that did not measure it are left out.
fn stage_runs<'a>(side: &[&'a Profile], stage: Stage) -> Vec<&'a Histogram> {
    side.iter()
        .flat_map(|p| -> Vec<Option<&'a Histogram>> {
            if p.runs.is_empty() {
                vec![p.stages.get(stage)]
            } else {
                p.runs.iter().map(|r| r.stages.get(stage)).collect()
            }
        })
        .flatten()
        .filter(|h| h.count > 0)
        .collect()
}

/// How many nines deep a curve of `count` I/Os can go, on a point of the axis (at least one
/// nine, at most `MAX_NINES`): beyond 1/count a percentile is the maximum.
pub fn depth_of(count: u64) -> f64 {
    let nines = (count as f64).log10().clamp(1.0, MAX_NINES);
    (nines * f64::from(STEPS_PER_NINE)).floor() / f64::from(STEPS_PER_NINE)
}

/// A histogram's latency by percentile, as (nines, ns), from p0 to `depth` nines: what the
/// TUI's percentile view draws, point for point as the charts do.
pub fn curve_points(h: &Histogram, depth: f64) -> Vec<(f64, f64)> {
    let steps = (depth * f64::from(STEPS_PER_NINE)).round() as u32;
    curve(h, steps)
        .into_iter()
        .enumerate()
        .map(|(k, ns)| (k as f64 / f64::from(STEPS_PER_NINE), ns))
        .filter(|(_, ns)| ns.is_finite())
        .collect()
}

/// A run's latency (ns) at each point of the axis, from p0 down to `steps` points.
fn curve(h: &Histogram, steps: u32) -> Vec<f64> {
    (0..=steps)
        .map(|k| {
            let p = percentile_at(f64::from(k) / f64::from(STEPS_PER_NINE));
            // A latency of 0 (an empty bucket's floor) is drawn at 1 ns on the log axis.
            h.percentile_ns(p).unwrap_or(f64::NAN).max(1.0)
        })
        .collect()
}

/// The runs' geometric mean at each point: the diff compares tails on the log scale.
fn geometric_mean(curves: &[Vec<f64>]) -> Vec<f64> {
    let points = curves.first().map_or(0, Vec::len);
    (0..points)
        .map(|i| {
            let logs: f64 = curves.iter().map(|c| c[i].ln()).sum();
            (logs / curves.len() as f64).exp()
        })
        .collect()
}

/// One stage's curves for one host.
struct StageCurves {
    letter: &'static str,
    color: &'static str,
    runs: Vec<Vec<f64>>,
    center: Vec<f64>,
}

/// A stage's runs on one host: none when the host did not measure it.
type Measured<'h, 'a> = (&'h HostSide<'a>, Vec<&'a Histogram>);

/// A stage's panel: the curves of every host that measured it, the axes, the marks at p99 and
/// p99.9, and the notes beside it. Returns the height it took.
fn panel(
    svg: &mut Svg,
    top: f64,
    stage: Stage,
    hosts: &[HostSide<'_>],
    note: &dyn Fn(Stage, f64) -> Vec<String>,
) -> f64 {
    let measured: Vec<Measured<'_, '_>> = hosts
        .iter()
        .map(|h| (h, stage_runs(h.profiles, stage)))
        .collect();
    let title = format!("{} latency", stage.name());
    if measured.iter().all(|(_, runs)| runs.is_empty()) {
        let who = if hosts.len() == 1 {
            ""
        } else {
            " on either host"
        };
        svg.text(
            20.0,
            top + 14.0,
            r##"fill="#555""##,
            &format!("{title}: not measured{who}"),
        );
        return 30.0;
    }
    let (depth, series) = stage_curves(&measured);
    let plot = Plot::fit(top, depth, &series);
    let _ = writeln!(
        svg.body,
        r#"<g class="panel" data-stage="{}">"#,
        stage.name()
    );
    svg.text(20.0, top + 12.0, r#"font-weight="bold""#, &title);
    let y0 = plot.y0;
    let _ = writeln!(
        svg.body,
        r##"<rect x="{PLOT_LEFT}" y="{y0}" width="{PLOT_WIDTH}" height="{PLOT_HEIGHT}" fill="none" stroke="#ccc"/>"##
    );
    plot.latency_ticks(svg);
    plot.percentile_ticks(svg);
    for s in &series {
        plot.curves(svg, s);
    }
    let line_y = notes(svg, y0 + 10.0, stage, &measured, note);
    svg.raw("</g>");
    (PLOT_HEIGHT + 60.0).max(line_y - top + 10.0)
}

/// The curves of every host that measured the stage, as deep (in nines) as every drawn run
/// has I/Os for: beyond 1/count a percentile is the maximum.
fn stage_curves(measured: &[Measured<'_, '_>]) -> (f64, Vec<StageCurves>) {
    let fewest = measured
        .iter()
        .flat_map(|(_, runs)| runs.iter().map(|h| h.count))
        .min()
        .unwrap_or(1);
    let depth = depth_of(fewest);
    let steps = (depth * f64::from(STEPS_PER_NINE)).round() as u32;
    let series = measured
        .iter()
        .filter(|(_, runs)| !runs.is_empty())
        .map(|(h, runs)| {
            let curves: Vec<Vec<f64>> = runs.iter().map(|r| curve(r, steps)).collect();
            StageCurves {
                letter: h.letter,
                color: h.color,
                center: geometric_mean(&curves),
                runs: curves,
            }
        })
        .collect();
    (depth, series)
}

/// A panel's plot area: where a percentile (in nines) and a latency (ns, on a log axis from
/// 10^`lo` to 10^`hi`) are drawn.
struct Plot {
    y0: f64,
    depth: f64,
    lo: f64,
    hi: f64,
}

impl Plot {
    /// The plot under a panel's title at `top`, its latency axis spanning whole decades
    /// around every run's curve.
    fn fit(top: f64, depth: f64, series: &[StageCurves]) -> Self {
        let all = series
            .iter()
            .flat_map(|s| s.runs.iter().flatten())
            .filter(|v| v.is_finite());
        let (min, max) = all.fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        let lo = min.log10().floor();
        let hi = max.log10().ceil().max(lo + 1.0);
        Self {
            y0: top + 22.0,
            depth,
            lo,
            hi,
        }
    }

    fn x_of(&self, n: f64) -> f64 {
        PLOT_LEFT + n / self.depth * PLOT_WIDTH
    }

    fn y_of(&self, ns: f64) -> f64 {
        self.y0 + PLOT_HEIGHT - (ns.log10() - self.lo) / (self.hi - self.lo) * PLOT_HEIGHT
    }

    /// A curve as polyline points; points with no latency are left out.
    fn points(&self, c: &[f64]) -> String {
        c.iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(k, &v)| {
                let n = k as f64 / f64::from(STEPS_PER_NINE);
                format!("{:.2},{:.2}", self.x_of(n), self.y_of(v))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Latency ticks: each power of ten, with 2x and 5x when the axis spans two decades or
    /// less.
    fn latency_ticks(&self, svg: &mut Svg) {
        let (lo, hi) = (self.lo, self.hi);
        let minors: &[f64] = if hi - lo <= 2.0 {
            &[1.0, 2.0, 5.0]
        } else {
            &[1.0]
        };
        for decade in (lo as i32)..=(hi as i32) {
            for &m in minors {
                let ns = m * 10f64.powi(decade);
                if ns.log10() > hi + 1e-9 {
                    continue;
                }
                let y = self.y_of(ns);
                let _ = writeln!(
                    svg.body,
                    r##"<line class="ytick" data-ns="{ns}" x1="{PLOT_LEFT}" y1="{y:.2}" x2="{:.1}" y2="{y:.2}" stroke="#eee"/>"##,
                    PLOT_LEFT + PLOT_WIDTH
                );
                svg.text(
                    PLOT_LEFT - 6.0,
                    y + 4.0,
                    r##"text-anchor="end" fill="#555""##,
                    &units::latency(ns),
                );
            }
        }
    }

    /// Percentile ticks: p50 and every whole nine, the marked ones with a dashed guide; then
    /// the axis' caption.
    fn percentile_ticks(&self, svg: &mut Svg) {
        let y0 = self.y0;
        let mut ticks: Vec<f64> = vec![nines(50.0)];
        ticks.extend((0..=self.depth.floor() as u32).map(f64::from));
        for n in ticks {
            let (x, p) = (self.x_of(n), percentile_at(n));
            let guide = if MARKED.iter().any(|&m| (nines(m) - n).abs() < 1e-9) {
                r##"stroke="#999" stroke-dasharray="4 3""##
            } else {
                r##"stroke="#eee""##
            };
            let _ = writeln!(
                svg.body,
                r#"<line class="xtick" data-percentile="{}" x1="{x:.2}" y1="{y0}" x2="{x:.2}" y2="{}" {guide}/>"#,
                (p * 1e4).round() / 1e4,
                y0 + PLOT_HEIGHT
            );
            svg.text(
                x,
                y0 + PLOT_HEIGHT + 14.0,
                r##"text-anchor="middle" fill="#555""##,
                &percentile_name(p),
            );
        }
        svg.text(
            PLOT_LEFT + PLOT_WIDTH / 2.0,
            y0 + PLOT_HEIGHT + 30.0,
            r##"text-anchor="middle" fill="#555""##,
            "percentile (each step right: ten times rarer)",
        );
    }

    /// One host's curves: each run faint (when there are several), their geometric mean bold,
    /// and a mark on it at each marked percentile the axis reaches.
    fn curves(&self, svg: &mut Svg, s: &StageCurves) {
        if s.runs.len() > 1 {
            for (k, run) in s.runs.iter().enumerate() {
                let _ = writeln!(
                    svg.body,
                    r#"<polyline class="curve curve-{}" data-run="{}" points="{}" fill="none" stroke="{}" stroke-opacity="0.3" stroke-width="1"/>"#,
                    s.letter,
                    k + 1,
                    self.points(run),
                    s.color
                );
            }
        }
        let _ = writeln!(
            svg.body,
            r#"<polyline class="curve curve-{}" data-run="all" points="{}" fill="none" stroke="{}" stroke-width="2"/>"#,
            s.letter,
            self.points(&s.center),
            s.color
        );
        for p in MARKED
            .into_iter()
            .filter(|&p| nines(p) <= self.depth + 1e-9)
        {
            let k = (nines(p) * f64::from(STEPS_PER_NINE)).round() as usize;
            let v = s.center[k];
            let _ = writeln!(
                svg.body,
                r#"<circle class="mark-{}" cx="{:.2}" cy="{:.2}" r="3.5" fill="{}"><title>{} {}: {}</title></circle>"#,
                s.letter,
                self.x_of(nines(p)),
                self.y_of(v),
                s.color,
                s.letter,
                percentile_name(p),
                units::latency(v)
            );
        }
    }
}

/// Notes beside the plot from `line_y` down: each host's runs, then what `note` says of each
/// marked tail. Returns where the next line would go.
fn notes(
    svg: &mut Svg,
    mut line_y: f64,
    stage: Stage,
    measured: &[Measured<'_, '_>],
    note: &dyn Fn(Stage, f64) -> Vec<String>,
) -> f64 {
    for (h, runs) in measured {
        let text = if runs.is_empty() {
            format!("{}: not measured", h.letter)
        } else {
            let ios: u64 = runs.iter().map(|r| r.count).sum();
            format!(
                "{}{}{} run{}, {} I/Os",
                h.letter,
                if h.letter.is_empty() { "" } else { ": " },
                runs.len(),
                if runs.len() == 1 { "" } else { "s" },
                units::count(ios as f64)
            )
        };
        svg.text(NOTES_LEFT, line_y, &format!(r#"fill="{}""#, h.color), &text);
        line_y += 16.0;
    }
    for p in MARKED {
        for (k, line) in note(stage, p).into_iter().enumerate() {
            let attrs = if k == 0 { r#"font-weight="bold""# } else { "" };
            svg.text(NOTES_LEFT, line_y, attrs, &line);
            line_y += 15.0;
        }
    }
    line_y
}

/// Every stage's panel under one heading.
fn chart(
    title: &str,
    legend: &[(&str, String)],
    hosts: &[HostSide<'_>],
    note: &dyn Fn(Stage, f64) -> Vec<String>,
) -> String {
    let mut svg = Svg::new(WIDTH);
    let mut y = svg.heading(title, legend);
    for stage in Stage::ALL {
        y += panel(&mut svg, y, stage, hosts, note);
    }
    svg.finish(title, y + 10.0)
}

/// Whether the runs of a side are several (the bold line is then their geometric mean).
fn runs_words(side: &[&Profile]) -> String {
    let runs: usize = side.iter().map(|p| p.runs.len().max(1)).sum();
    if runs > 1 {
        format!(" (bold: geometric mean of {runs} runs; faint: each run)")
    } else {
        String::new()
    }
}

/// Both hosts' percentile curves for every stage, with the diff's verdict on each p99 and
/// p99.9 beside them.
pub fn diff_chart(a: &[&Profile], b: &[&Profile], d: &ProfileDiff) -> String {
    let legend = [
        (
            COLOR_A,
            format!("A: {}{}", side_words(d, Host::A), runs_words(a)),
        ),
        (
            COLOR_B,
            format!("B: {}{}", side_words(d, Host::B), runs_words(b)),
        ),
    ];
    let hosts = [
        HostSide {
            letter: "A",
            color: COLOR_A,
            profiles: a,
        },
        HostSide {
            letter: "B",
            color: COLOR_B,
            profiles: b,
        },
    ];
    let note = |stage: Stage, p: f64| -> Vec<String> {
        let Some(r) = d.row(MetricId::Tail {
            stage,
            percentile: p,
        }) else {
            return Vec::new();
        };
        let lat = |v: Option<f64>| v.map_or("-".into(), units::latency);
        let mut lines = vec![format!(
            "{}: A {}, B {}",
            percentile_name(p),
            lat(r.a),
            lat(r.b)
        )];
        lines.extend(
            textwrap::wrap(&verdict_text(r, d), 44)
                .into_iter()
                .map(|l| format!("  {l}")),
        );
        lines
    };
    chart("Latency by percentile: A vs B", &legend, &hosts, &note)
}

/// One host's percentile curves for every stage (`record --svg`).
pub fn profile_chart(p: &Profile) -> String {
    let side = [p];
    let legend = [(
        COLOR_A,
        format!(
            "{} on {}{}",
            p.workload.name,
            p.host.describe(),
            runs_words(&side)
        ),
    )];
    let hosts = [HostSide {
        letter: "",
        color: COLOR_A,
        profiles: &side,
    }];
    let note = |stage: Stage, pct: f64| -> Vec<String> {
        let runs = stage_runs(&side, stage);
        let values: Vec<f64> = runs.iter().filter_map(|h| h.percentile_ns(pct)).collect();
        if values.is_empty() {
            return Vec::new();
        }
        // The runs' geometric mean, as the bold line is drawn.
        let logs: f64 = values.iter().map(|v| v.max(1.0).ln()).sum();
        let mean = (logs / values.len() as f64).exp();
        let spread = if values.len() > 1 {
            let (lo, hi) = values
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), &v| (l.min(v), h.max(v)));
            format!(" (runs {} to {})", units::latency(lo), units::latency(hi))
        } else {
            String::new()
        };
        vec![format!(
            "{}: {}{spread}",
            percentile_name(pct),
            units::latency(mean)
        )]
    };
    let title = format!("Latency by percentile: {}", p.workload.name);
    chart(&title, &legend, &hosts, &note)
}
