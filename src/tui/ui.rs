//! Rendering: pure functions of `&App` onto a frame. No I/O, no locks, nothing that blocks.
//! Every signal that has a colour also has text or a distinct fill, so the screen reads in
//! monochrome too.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Row, Sparkline, Table, Tabs, Wrap};
use ratatui::Frame;
use virtgap_probes::model::{BlockOp, BlockStage};
use virtgap_probes::{Family, ProbeSnapshot};
use virtgap_workloads::units;

use super::app::{App, RunState, View};
use crate::model::histogram::Histogram;
use crate::model::stages::{Stage, StageBreakdown};
use crate::model::virtualization::MsrWrites;

/// Below this the screen says so instead of drawing a squashed layout.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 15;
/// A CPU busier than this in hard IRQ + softirq is flagged as saturating.
const IRQ_SATURATED_PCT: f64 = 80.0;

fn lat(v: Option<f64>) -> String {
    v.map(units::latency).unwrap_or_else(|| "-".into())
}

pub fn render(f: &mut Frame<'_>, app: &App) {
    let area = f.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let msg = format!(
            "terminal too small: {}x{}, virtgap needs at least {MIN_WIDTH}x{MIN_HEIGHT} (q quits)",
            area.width, area.height
        );
        f.render_widget(Paragraph::new(msg).wrap(Wrap { trim: true }), area);
        return;
    }
    let [header, tabs, body, footer] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    render_header(f, app, header);
    let titles: Vec<String> = View::ALL
        .iter()
        .enumerate()
        .map(|(i, v)| format!("{} {}", i + 1, v.title()))
        .collect();
    let selected = View::ALL.iter().position(|v| *v == app.view).unwrap_or(0);
    f.render_widget(
        Tabs::new(titles)
            .select(selected)
            .highlight_style(Style::new().add_modifier(Modifier::REVERSED)),
        tabs,
    );
    match app.view {
        View::Time => render_time(f, app, body),
        View::Cpus => render_cpus(f, app, body),
        View::Hypervisor => render_hypervisor(f, app, body),
        View::Devices => render_devices(f, app, body),
    }
    let mut hint =
        "q quit · Tab/1-4 views · arrows select · p pause · r reset · s save · ? help".to_string();
    if app.paused.is_some() {
        hint = format!("PAUSED · {hint}");
    }
    if app.state == RunState::Finished {
        hint = format!("run finished · {hint}");
    }
    if let Some(m) = &app.message {
        hint = format!("{m} · {hint}");
    }
    f.render_widget(Paragraph::new(hint).dim(), footer);
    if app.help {
        render_help(f, area);
    }
}

fn render_header(f: &mut Frame<'_>, app: &App, area: Rect) {
    let d = app.shown();
    let last = d.points.back().copied().unwrap_or_default();
    let state = match &app.state {
        RunState::Running => String::new(),
        RunState::Finished => " · finished".into(),
        RunState::Failed(e) => format!(" · FAILED: {e}"),
    };
    let (attached, unavailable) = app
        .report()
        .map_or((0, 0), |r| (r.attached_count(), r.unavailable_count()));
    let lines = vec![
        Line::from(vec!["virtgap ".bold(), Span::raw(app.host.describe())]),
        Line::from(format!(
            "{} · {} IOPS · {} MB/s · p99 {} · {:.0} s{state}",
            app.workload,
            units::count(last.iops),
            last.bytes_per_s
                .map_or("-".into(), |b| format!("{:.1}", b / 1e6)),
            lat(last.p99_ns.map(|v| v as f64)),
            d.elapsed.as_secs_f64()
        )),
        Line::from(format!(
            "probes: {attached} attached, {unavailable} unavailable"
        ))
        .dim(),
    ];
    f.render_widget(Paragraph::new(lines), area);
}

/// Mean latency of the workload's I/Os split into software | queue | device | completion
/// (each per request; completion 0 where no request had the stage), from the shown data as a
/// profile's stages.
fn stage_means(app: &App) -> (Option<f64>, Option<StageBreakdown>) {
    let stages = shown_stages(app);
    if app.attached {
        // The attached processes' calls are not one block request each (page-cache hits,
        // merged and split requests): the bar is the block request alone.
        let mean = |st: Stage| stages.get(st).and_then(Histogram::mean_ns);
        let means = mean(Stage::Queue).zip(mean(Stage::Device)).map(|(q, dv)| {
            let c = stages.completion_per_request().unwrap_or(0.0);
            StageBreakdown::of(q + dv + c, q, dv, c)
        });
        return (stages.app.mean_ns(), means);
    }
    (stages.app.mean_ns(), stages.breakdown())
}

/// The shown data as a profile's stages: the same histograms a saved profile holds (in attach
/// mode the app stage is the followed processes' reads and writes, where the app probe times
/// them).
fn shown_stages(app: &App) -> crate::model::stages::Stages {
    let d = app.shown();
    let app_stage = if app.attached {
        d.attached_app.clone().unwrap_or_default()
    } else {
        Histogram::from_latency(&d.app)
    };
    crate::run::assemble::stages(app_stage, d.probes.as_ref(), app.target_devs())
}

fn render_time(f: &mut Frame<'_>, app: &App, area: Rect) {
    let area = match &app.kv {
        Some(kv) => render_kv_panel(f, kv, area),
        None => area,
    };
    let [bar, table, sparks] = Layout::vertical([
        Constraint::Length(4),
        Constraint::Length(8),
        Constraint::Min(4),
    ])
    .areas(area);
    if app.percentiles {
        // The chart takes the mean bar's rows too: a tail needs height to show.
        let [table, chart] =
            Layout::vertical([Constraint::Length(8), Constraint::Min(4)]).areas(area);
        render_stage_table(f, app, table);
        render_percentiles(f, app, chart);
        return;
    }
    render_mean_bar(f, app, bar);
    render_stage_table(f, app, table);
    // The tail autopsy takes the bottom of the view, the sparklines what is left.
    let sparks = match &app.tail {
        Some(tail) => render_tail_panel(f, app, tail, sparks),
        None => sparks,
    };
    render_sparklines(f, app.shown(), sparks);
}

/// Each stage's latency by percentile since start (or reset): the nines axis of `record --svg`
/// and `diff --svg` (p0, p90, p99, p99.9 … equally spaced), latency on a log axis.
fn render_percentiles(f: &mut Frame<'_>, app: &App, area: Rect) {
    use crate::render::charts::percentiles::{
        curve_points, depth_of, percentile_at, percentile_name,
    };
    use ratatui::symbols::Marker;
    use ratatui::widgets::{Axis, Chart, Dataset, GraphType};
    let stages = shown_stages(app);
    let drawn: Vec<(&str, Color, &Histogram)> = [
        ("app", Stage::App, Color::Yellow),
        ("queue", Stage::Queue, Color::Cyan),
        ("device", Stage::Device, Color::Magenta),
        ("completion", Stage::Completion, Color::Green),
    ]
    .into_iter()
    .filter_map(|(name, stage, color)| Some((name, color, stages.get(stage)?)))
    .filter(|(_, _, h)| h.count > 0)
    .collect();
    let block = Block::bordered().title(" latency by percentile since start (or reset) · n: back ");
    let Some(fewest) = drawn.iter().map(|(_, _, h)| h.count).min() else {
        f.render_widget(
            Paragraph::new("waiting for the first I/Os…").block(block),
            area,
        );
        return;
    };
    // Whole nines only: the axis labels are spaced evenly.
    let depth = depth_of(fewest).floor();
    // Each stage's (nines, log10 ns) points.
    type Curve<'a> = (&'a str, Color, Vec<(f64, f64)>);
    let curves: Vec<Curve<'_>> = drawn
        .iter()
        .map(|(name, color, h)| {
            let points = curve_points(h, depth)
                .into_iter()
                .map(|(n, ns)| (n, ns.log10()))
                .collect();
            (*name, *color, points)
        })
        .collect();
    let (lo, hi) = curves
        .iter()
        .flat_map(|c| c.2.iter().map(|p| p.1))
        .fold((f64::MAX, f64::MIN), |(l, h), y| (l.min(y), h.max(y)));
    let (lo, hi) = (lo.floor(), hi.ceil().max(lo.floor() + 1.0));
    let datasets = curves
        .iter()
        .map(|(name, color, points)| {
            Dataset::default()
                .name(*name)
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(Style::new().fg(*color))
                .data(points)
        })
        .collect();
    let x_labels: Vec<Line<'_>> = (0..=depth as u32)
        .map(|n| Line::from(percentile_name(percentile_at(f64::from(n)))))
        .collect();
    // A label per decade where the rows allow (labels are spaced evenly), else the ends.
    let rows = area.height.saturating_sub(4) as f64;
    let decades: Vec<i32> = if hi - lo < rows / 2.0 {
        (lo as i32..=hi as i32).collect()
    } else {
        vec![lo as i32, hi as i32]
    };
    let y_labels: Vec<Line<'_>> = decades
        .into_iter()
        .map(|k| Line::from(units::latency(10f64.powi(k))))
        .collect();
    let chart = Chart::new(datasets)
        .block(block)
        .x_axis(Axis::default().bounds([0.0, depth]).labels(x_labels).dim())
        .y_axis(Axis::default().bounds([lo, hi]).labels(y_labels).dim())
        .legend_position(Some(ratatui::widgets::LegendPosition::TopLeft))
        // The legend names the colours: shown down to a short chart.
        .hidden_legend_constraints((Constraint::Ratio(1, 3), Constraint::Ratio(1, 1)));
    f.render_widget(chart, area);
}

/// The kv run's panel at the top of `area`, as tall as its lines once wrapped (within half of
/// the view); the rest of `area`.
fn render_kv_panel(f: &mut Frame<'_>, kv: &crate::tui::app::KvPanel, area: Rect) -> Rect {
    let lines = kv_lines(kv);
    let inner_w = area.width.saturating_sub(2).max(1) as usize;
    let rows: usize = lines
        .iter()
        .map(|l| l.width().div_ceil(inner_w).max(1))
        .sum();
    let height = (rows as u16 + 2).min(area.height / 2).max(3);
    let [panel, rest] =
        Layout::vertical([Constraint::Length(height), Constraint::Min(0)]).areas(area);
    f.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title(" kv: ACT verdict ")),
        panel,
    );
    rest
}

/// The mean I/O as one bar: submit + reap | queue | device | completion, with its legend.
fn render_mean_bar(f: &mut Frame<'_>, app: &App, bar: Rect) {
    let (app_mean, means) = stage_means(app);
    let block = Block::bordered().title(if app.attached {
        " mean block request of the attached processes "
    } else {
        " mean latency of the workload's I/Os "
    });
    let inner = block.inner(bar);
    f.render_widget(block, bar);
    let mut lines = Vec::new();
    match (app_mean, means) {
        (_, Some(m)) if m.app_ns > 0.0 => {
            let width = inner.width.saturating_sub(1) as f64;
            let cells = |v: f64| ((v / m.app_ns) * width).round() as usize;
            let at_least_one = |v: f64| cells(v).max(usize::from(v > 0.0));
            let (cs, cq, cc) = (
                cells(m.software_ns.max(0.0)),
                at_least_one(m.queue_ns),
                at_least_one(m.completion_ns),
            );
            let cd = (width as usize).saturating_sub(cs + cq + cc);
            lines.push(Line::from(vec![
                Span::styled("░".repeat(cs), Style::new().fg(Color::Yellow)),
                Span::styled("▒".repeat(cq), Style::new().fg(Color::Cyan)),
                Span::styled("█".repeat(cd), Style::new().fg(Color::Magenta)),
                Span::styled("▓".repeat(cc), Style::new().fg(Color::Green)),
            ]));
            // An attached bar is the block request alone: nothing of it is submit + reap.
            let software = if app.attached {
                String::new()
            } else {
                format!("░ submit+reap {}  ", units::latency(m.software_ns.max(0.0)))
            };
            let legend = format!(
                "{software}▒ queue {}  █ device {}  ▓ completion {}",
                units::latency(m.queue_ns),
                units::latency(m.device_ns),
                units::latency(m.completion_ns),
            );
            let total = format!("  = {}", units::latency(m.app_ns));
            // The sum where it fits: narrow terminals keep the parts.
            let fits = legend.chars().count() + total.chars().count() <= inner.width as usize;
            lines.push(Line::from(if fits { legend + &total } else { legend }));
        }
        (Some(total), _) => lines.push(Line::from(format!(
            "app latency {} · stages unavailable ({})",
            units::latency(total),
            unavailable_reason(app, Family::Block)
        ))),
        _ => lines.push(Line::from("waiting for the first interval…")),
    }
    f.render_widget(Paragraph::new(lines), inner);
}

/// Each stage's mean and percentiles since start (or reset), beside the baseline's.
fn render_stage_table(f: &mut Frame<'_>, app: &App, table: Rect) {
    let d = app.shown();
    let stages = shown_stages(app);
    let bl = app.baseline.as_ref();
    let row_of = |name: &str, mean: Option<f64>, p: &dyn Fn(f64) -> Option<f64>, base| {
        let mut cells = vec![
            name.to_string(),
            lat(mean),
            lat(p(50.0)),
            lat(p(99.0)),
            lat(p(99.9)),
        ];
        if app.baseline.is_some() {
            cells.push(baseline_cell(base));
        }
        Row::new(cells)
    };
    let probed = |name: &str, stage: Stage| {
        let h = stages.get(stage);
        row_of(
            name,
            h.and_then(Histogram::mean_ns),
            &|q| h.and_then(|h| h.percentile_ns(q)),
            bl.and_then(|b| b.stages.get(stage)),
        )
    };
    let app_p = |q: f64| {
        if app.attached {
            stages.app.percentile_ns(q)
        } else {
            d.app.percentile_ns(q).map(|v| v as f64)
        }
    };
    let app_mean = if app.attached {
        stages.app.mean_ns()
    } else {
        d.app.mean_ns()
    };
    let rows = vec![
        row_of("app (lat)", app_mean, &app_p, bl.map(|b| &b.stages.app)),
        probed("block queue", Stage::Queue),
        probed("device", Stage::Device),
        probed("completion", Stage::Completion),
        probed("wakeup", Stage::Wakeup),
    ];
    let mut header = vec!["stage", "mean", "p50", "p99", "p99.9"];
    let mut widths = vec![
        Constraint::Length(12),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(10),
    ];
    if app.baseline.is_some() {
        header.push("baseline mean / p99");
        widths.push(Constraint::Min(20));
    }
    f.render_widget(
        Table::new(rows, widths)
            .header(Row::new(header).bold())
            .block(
                Block::bordered()
                    .title(" stage latency since start (or reset) · n: by percentile "),
            ),
        table,
    );
}

/// "mean / p99" of a baseline profile's stage, "-" without one.
fn baseline_cell(h: Option<&Histogram>) -> String {
    h.and_then(|h| Some((h.mean_ns()?, h.percentile_ns(99.0)?)))
        .map_or("-".into(), |(m, p99)| {
            format!("{} / {}", units::latency(m), units::latency(p99))
        })
}

/// The tail autopsy at the bottom of `area`; the rest of `area`.
fn render_tail_panel(
    f: &mut Frame<'_>,
    app: &App,
    tail: &crate::model::tail::TailAutopsy,
    area: Rect,
) -> Rect {
    let lines = tail_lines(tail);
    // The findings come before the sparklines when room is short.
    let height = (lines.len() as u16 + 2).min(area.height);
    let [rest, panel] =
        Layout::vertical([Constraint::Min(0), Constraint::Length(height)]).areas(area);
    // Whole-run only once the run finished; a running or failed run's is partial.
    let title = if app.state == RunState::Finished {
        " tail autopsy: the slowest I/Os joined to their block requests "
    } else {
        " tail autopsy so far: the slowest I/Os joined to their block requests "
    };
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(title)),
        panel,
    );
    rest
}

/// IOPS and p99 latency over the latest intervals.
fn render_sparklines(f: &mut Frame<'_>, d: &crate::tui::app::Data, area: Rect) {
    let [s1, s2] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    let n = s1.width.saturating_sub(2) as usize;
    let pts: Vec<_> = d.points.iter().rev().take(n).rev().collect();
    let iops: Vec<u64> = pts.iter().map(|p| p.iops as u64).collect();
    let p99: Vec<u64> = pts.iter().map(|p| p.p99_ns.unwrap_or(0)).collect();
    let peak = |v: &[u64]| v.iter().copied().max().unwrap_or(0);
    f.render_widget(
        Sparkline::default().data(&iops).block(
            Block::bordered().title(format!(" IOPS, peak {} ", units::count(peak(&iops) as f64))),
        ),
        s1,
    );
    f.render_widget(
        Sparkline::default()
            .data(&p99)
            .block(Block::bordered().title(format!(
                " p99 latency, peak {} ",
                units::latency(peak(&p99) as f64)
            ))),
        s2,
    );
}

/// The tail autopsy as the summary prints it, less its heading (the panel's title).
fn tail_lines(tail: &crate::model::tail::TailAutopsy) -> Vec<Line<'static>> {
    let mut text = Vec::new();
    let _ = crate::render::report::write_tail(&mut text, tail);
    String::from_utf8_lossy(&text)
        .lines()
        .skip(1)
        .map(|l| Line::from(l.strip_prefix("    ").unwrap_or(l).to_string()))
        .collect()
}

/// ACT's verdict on a kv run: the load while it runs, the verdict once it ended.
fn kv_lines(kv: &crate::tui::app::KvPanel) -> Vec<Line<'static>> {
    let mut lines = vec![Line::from(format!("load: {}", kv.load))];
    match (&kv.verdict, &kv.delivered) {
        (Some(verdict), Some(delivered)) => {
            let style = if verdict.starts_with("PASS") {
                Style::new().fg(Color::Green).add_modifier(Modifier::BOLD)
            } else {
                Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
            };
            lines.push(Line::from(verdict.clone()).style(style));
            lines.push(Line::from(delivered.clone()));
            lines.extend(kv.slices.iter().map(|s| Line::from(s.clone())));
            lines.extend(kv.queueing.iter().map(|q| Line::from(q.clone())));
        }
        _ => lines.push(Line::from(
            "verdict when the run ends (ACT judges whole slices; set --duration)",
        )),
    }
    lines
}

fn unavailable_reason(app: &App, family: Family) -> String {
    app.report()
        .and_then(|r| r.families.iter().find(|f| f.family == family))
        .and_then(|f| f.unavailable.as_ref().map(ToString::to_string))
        .unwrap_or_else(|| "no data yet".into())
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:5.1}%"))
}

fn render_cpus(f: &mut Frame<'_>, app: &App, area: Rect) {
    let [top, bottom] = Layout::vertical([Constraint::Min(5), Constraint::Min(6)]).areas(area);
    let iv = app.shown().probe_interval.as_ref();
    let rows = cpu_rows(app, iv);
    let widths = [
        Constraint::Length(6),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(8),
        Constraint::Min(9),
    ];
    f.render_widget(
        Table::new(rows, widths)
            .header(
                Row::new(vec![
                    "cpu", "user", "sys", "hardirq", "softirq", "steal", "idle", "irq+soft",
                    "(>80%)",
                ])
                .bold(),
            )
            .block(Block::bordered().title(" CPU time by state, last interval ")),
        top,
    );
    let cpu = app.focus_cpu() as u32;
    f.render_widget(
        Paragraph::new(cpu_interrupt_lines(app, iv, cpu))
            .block(Block::bordered().title(format!(" interrupts per second on cpu{cpu} "))),
        bottom,
    );
}

/// One row per CPU: its time by state in the latest interval, SATURATED above the IRQ bound.
fn cpu_rows(app: &App, iv: Option<&ProbeSnapshot>) -> Vec<Row<'static>> {
    let irq = app.irq_load();
    let mut rows = Vec::new();
    for cpu in 0..app.cpus() as u32 {
        let t = iv.and_then(|s| s.cpu_times.iter().find(|t| t.cpu == cpu));
        let total = t.map(|t| t.total_ns() as f64).filter(|x| *x > 0.0);
        let share = |ns: Option<u64>| match (ns, total) {
            (Some(ns), Some(total)) => Some(ns as f64 / total * 100.0),
            _ => None,
        };
        // With the IRQ probes attached, a CPU with no interrupts is at 0%, not unmeasured.
        let measured = iv.is_some_and(|s| s.irq.is_some());
        let (hard, soft) = match irq.iter().find(|x| x.0 == cpu) {
            Some(x) => (Some(x.1), Some(x.2)),
            None if measured => (Some(0.0), Some(0.0)),
            None => (None, None),
        };
        let busy = hard.unwrap_or(0.0) + soft.unwrap_or(0.0);
        let flag = if busy >= IRQ_SATURATED_PCT {
            "SATURATED"
        } else {
            ""
        };
        let bar_len = (busy / 100.0 * 8.0).round().clamp(0.0, 8.0) as usize;
        let marker = if cpu as usize == app.focus_cpu() {
            ">"
        } else {
            " "
        };
        let mut row = Row::new(vec![
            format!("{marker}cpu{cpu}"),
            pct(share(t.map(|t| t.user_ns))),
            pct(share(t.map(|t| t.system_ns))),
            pct(hard),
            pct(soft),
            pct(share(t.map(|t| t.steal_ns))),
            pct(share(t.map(|t| t.idle_ns + t.iowait_ns))),
            format!("{:<8}", "#".repeat(bar_len)),
            flag.to_string(),
        ]);
        if !flag.is_empty() {
            row = row.style(Style::new().fg(Color::Red).add_modifier(Modifier::BOLD));
        }
        rows.push(row);
    }
    rows
}

/// `cpu`'s busiest interrupts and the IPIs it sent in the latest interval.
fn cpu_interrupt_lines(app: &App, iv: Option<&ProbeSnapshot>, cpu: u32) -> Vec<Line<'static>> {
    let secs = iv.map_or(0.0, |s| s.elapsed_ns as f64 / 1e9);
    let mut lines = Vec::new();
    match iv.and_then(|s| s.irq.as_ref()) {
        Some(irq) if secs > 0.0 => {
            let mut irqs: Vec<_> = irq
                .hardirqs
                .iter()
                .filter(|h| h.cpu == cpu && h.count > 0)
                .collect();
            irqs.sort_by_key(|h| std::cmp::Reverse(h.count));
            for h in irqs.iter().take(6) {
                lines.push(Line::from(format!(
                    "  {:<24} {:>9}/s  {} each",
                    h.name,
                    units::count(h.count as f64 / secs),
                    units::latency(h.time_ns as f64 / h.count as f64)
                )));
            }
            if irqs.is_empty() {
                lines.push(Line::from("  no device interrupts on this CPU"));
            }
            let summary = match app.report() {
                Some(report) => {
                    crate::render::probe_report::ipi_summary(irq, Some(cpu), secs, report)
                }
                None => vec!["IPIs sent: -".into()],
            };
            lines.extend(summary.into_iter().map(|l| Line::from(format!("  {l}"))));
        }
        _ => lines.push(Line::from(format!(
            "  interrupts: unavailable ({})",
            unavailable_reason(app, Family::Irq)
        ))),
    }
    if let Some(block) = iv.and_then(|s| s.block.as_ref()) {
        let (cross, total) = block.cross_cpu_completions();
        if total > 0 {
            lines.push(Line::from(format!(
                "  completions on another CPU than submitted (all CPUs): {:.1}%",
                cross as f64 / total as f64 * 100.0
            )));
        }
    }
    lines
}

fn render_hypervisor(f: &mut Frame<'_>, app: &App, area: Rect) {
    let iv = app.shown().probe_interval.as_ref();
    let secs = iv.map_or(0.0, |s| s.elapsed_ns as f64 / 1e9);
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    let mut lines = msr_lines(app, iv, secs);
    lines.push(Line::from(""));
    lines.extend(steal_lines(iv));
    lines.push(Line::from(""));
    lines.extend(mechanism_lines(app, iv, secs));
    lines.push(Line::from(
        "calibration: not run here (`virtgap calibrate`)",
    ));
    f.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title(" hypervisor ")),
        left,
    );
    let cpu = app.focus_cpu() as u32;
    let lines = sampled_cpu_lines(app, iv, secs, cpu);
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(format!(
            " cpu{cpu} sampled{} (perf top -C {cpu}) ",
            // Until a CPU is picked with the arrows, the busiest one is shown.
            if app.selected_cpu.is_none() {
                ", busiest"
            } else {
                ""
            }
        ))),
        right,
    );
}

/// The host's exit-causing MSR writes per second in the latest interval.
fn msr_lines(app: &App, iv: Option<&ProbeSnapshot>, secs: f64) -> Vec<Line<'static>> {
    let mut lines = vec![Line::from("exit-causing MSR writes per second".bold())];
    // The latest interval as a profile keeps it: its rates by the profile's one computation.
    let virt = iv
        .filter(|s| s.msr.is_some() && secs > 0.0)
        .and_then(crate::run::assemble::virtualization);
    match &virt {
        Some(v) => {
            match v.msr_write_rates(MsrWrites::Exiting) {
                None => lines.push(Line::from(
                    "  not measured (no sampler pause in this interval)",
                )),
                Some(rates) if rates.is_empty() => lines.push(Line::from("  none seen")),
                Some(rates) => {
                    for r in rates.iter().take(6) {
                        lines.push(Line::from(format!(
                            "  {:#07x} {:<26} {:>8}/s",
                            r.msr,
                            r.name,
                            units::count(r.per_s)
                        )));
                    }
                }
            }
            if let Some(own) = v.sampler_msr_writes_per_s() {
                lines.push(Line::from(format!(
                    "  (counted in the sampler's pauses; its own: {}/s more, left out)",
                    units::count(own)
                )));
            }
        }
        None => lines.push(Line::from(format!(
            "  unavailable ({})",
            unavailable_reason(app, Family::Msr)
        ))),
    }
    lines
}

/// Steal per CPU in the latest interval.
fn steal_lines(iv: Option<&ProbeSnapshot>) -> Vec<Line<'static>> {
    let mut lines = vec![Line::from("steal".bold())];
    match iv.filter(|s| !s.cpu_times.is_empty()) {
        Some(iv) => {
            for t in &iv.cpu_times {
                let total = t.total_ns().max(1) as f64;
                lines.push(Line::from(format!(
                    "  cpu{} {:5.2}% ({})",
                    t.cpu,
                    t.steal_ns as f64 / total * 100.0,
                    units::latency(t.steal_ns as f64)
                )));
            }
        }
        None => lines.push(Line::from("  no data yet")),
    }
    lines
}

/// The hypervisor's mechanisms in the latest interval: how often per second and the mean time
/// of a timed call, as the profile's hypervisor section counts them.
fn mechanism_lines(app: &App, iv: Option<&ProbeSnapshot>, secs: f64) -> Vec<Line<'static>> {
    let hypervisor = virtgap_probes::hypervisor::Hypervisor::of_name(&app.host.hypervisor);
    let mut lines = vec![Line::from("hypervisor mechanisms".bold())];
    let Some(iv) = iv.filter(|_| secs > 0.0) else {
        lines.push(Line::from("  no data yet"));
        return lines;
    };
    let section = crate::run::hypervisor::section(
        hypervisor,
        secs,
        crate::run::assemble::virtualization(iv).as_ref(),
        app.report(),
        Some(&app.host.cpuid),
    );
    if !section.is_guest() {
        lines.push(Line::from("  none: bare metal, nothing to measure"));
        return lines;
    }
    for m in &section.mechanisms {
        let Some(n) = m.count else {
            continue;
        };
        let mean = m.time_ns.filter(|_| n > 0).map(|t| t / n as f64);
        lines.push(Line::from(format!(
            "  {:<22} {:>8}/s{}",
            crate::render::hypervisor_report::mechanism_words(m.mechanism),
            units::count(n as f64 / secs),
            mean.map_or(String::new(), |t| format!("  {} each", units::latency(t)))
        )));
    }
    if let Some(cpu) = &section.cpu {
        lines.push(Line::from(format!(
            "  in the hypervisor interface: {:.2}% of one CPU (sampled)",
            cpu.ns / 1e9 / secs * 100.0
        )));
    }
    if lines.len() == 1 {
        lines.push(Line::from(format!(
            "  not measured ({})",
            unavailable_reason(app, Family::PvPaths)
        )));
    }
    lines
}

/// The sampler's split of `cpu`'s time in the latest interval, with its top kernel symbols.
fn sampled_cpu_lines(
    app: &App,
    iv: Option<&ProbeSnapshot>,
    secs: f64,
    cpu: u32,
) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    match iv.and_then(|s| s.sampler.as_ref()) {
        Some(sampler) => match sampler.cpus.iter().find(|c| c.cpu == cpu) {
            Some(c) if !c.represents(sampler.frequency_hz, sampler.seconds(secs)) => {
                lines.push(Line::from(format!(
                    "  not measured: {} of ~{:.0} expected samples arrived (the kernel dropped the rest)",
                    c.total(),
                    sampler.frequency_hz as f64 * sampler.seconds(secs)
                )))
            }
            Some(c) if c.total() > 0 => {
                let total = c.total() as f64;
                for (cat, n) in c.categories(sampler.hypervisor) {
                    let pct = n as f64 / total * 100.0;
                    lines.push(Line::from(format!(
                        "  {:<22} {:5.1}% {}",
                        cat.name(),
                        pct,
                        "#".repeat((pct / 5.0).round() as usize)
                    )));
                }
                lines.push(Line::from(""));
                lines.push(Line::from("  top kernel symbols".bold()));
                for (sym, n) in c.top(8) {
                    lines.push(Line::from(format!(
                        "  {:5.1}% {sym}",
                        n as f64 / total * 100.0
                    )));
                }
            }
            _ => lines.push(Line::from("  no samples on this CPU yet")),
        },
        None => lines.push(Line::from(format!(
            "  unavailable ({})",
            unavailable_reason(app, Family::Sampler)
        ))),
    }
    lines
}

/// One line per block device: its kind, scheduler and each hardware queue's IRQ and CPU.
fn device_map_lines(app: &App) -> Vec<Line<'static>> {
    let devs = &app.host.block_devices;
    let mut lines = Vec::new();
    for (i, dev) in devs.iter().enumerate() {
        let marker = if i == app.selected_device { ">" } else { " " };
        let queues: Vec<String> = dev
            .queues
            .iter()
            .map(|q| match &q.irq {
                Some(irq) => format!(
                    "q{} (cpus {}) -> IRQ {} {} -> CPU {}",
                    q.index,
                    q.cpu_list,
                    irq.irq,
                    irq.name,
                    irq.effective_affinity.as_deref().unwrap_or("?")
                ),
                None => format!("q{} (cpus {}) -> no IRQ found", q.index, q.cpu_list),
            })
            .collect();
        lines.push(Line::from(format!(
            "{marker}{} {} · scheduler {} · {}",
            dev.name,
            dev.kind,
            dev.scheduler.as_deref().unwrap_or("-"),
            if queues.is_empty() {
                "no hardware queues listed".into()
            } else {
                queues.join("; ")
            }
        )));
    }
    if lines.is_empty() {
        lines.push(Line::from("no block devices found"));
    }
    lines
}

fn render_devices(f: &mut Frame<'_>, app: &App, area: Rect) {
    let [map, hist] = Layout::vertical([Constraint::Length(6), Constraint::Min(4)]).areas(area);
    let devs = &app.host.block_devices;
    let lines = device_map_lines(app);
    f.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title(" queue -> IRQ -> CPU ")),
        map,
    );
    // Device-stage histogram of the selected device, one bar per power of two.
    let selected = devs.get(app.selected_device);
    let block = app.shown().probes.as_ref().and_then(|p| p.block.as_ref());
    let devnum = selected.and_then(|d| {
        block.and_then(|b| {
            b.devices
                .iter()
                .map(|g| g.dev)
                .find(|dev| app.device_names.get(dev) == Some(&d.name))
        })
    });
    let title = format!(
        " device time histogram: {} ",
        selected.map_or("-", |d| d.name.as_str())
    );
    let mut rows = Vec::new();
    if let (Some(b), Some(dev)) = (block, devnum) {
        let h = b.stage(
            Some(&[dev]),
            BlockStage::Device,
            &[
                BlockOp::Read,
                BlockOp::Write,
                BlockOp::Flush,
                BlockOp::Discard,
                BlockOp::Other,
            ],
        );
        let mut by_pow: Vec<(u64, u64)> = Vec::new();
        for (lo, _hi, n) in h.buckets() {
            let p = 63 - lo.max(1).leading_zeros();
            match by_pow.last_mut() {
                Some((q, c)) if *q == u64::from(p) => *c += n,
                _ => by_pow.push((u64::from(p), n)),
            }
        }
        let max = by_pow.iter().map(|x| x.1).max().unwrap_or(1).max(1);
        // The count comes before its bar, in a column as wide as the widest count, so no
        // count is cut at the border; the bar takes what is left.
        let count_w = max.to_string().len();
        let label_w = 9 + 3 + 9 + 1 + count_w + 1;
        let bar_w = (hist.width.saturating_sub(2) as usize).saturating_sub(label_w) as u64;
        for (p, n) in by_pow {
            rows.push(Line::from(format!(
                "{:>9} - {:<9} {n:>count_w$} {}",
                units::latency((1u64 << p) as f64),
                units::latency((1u64 << (p + 1)) as f64),
                "#".repeat((n * bar_w / max) as usize),
            )));
        }
    }
    if rows.is_empty() {
        rows.push(Line::from(format!(
            "no requests seen on this device ({})",
            unavailable_reason(app, Family::Block)
        )));
    }
    // The selected disk as the profile reads it (a disk under the target).
    let profile = app.shown().probes.as_ref().and_then(|p| {
        let name = &selected?.name;
        crate::run::assemble::device_profiles(p, app.disks())
            .into_iter()
            .find(|d| &d.name == name)
    });
    let nvme = nvme_lines(profile.as_ref());
    let hist = if nvme.is_empty() {
        hist
    } else {
        let height = (nvme.len() as u16 + 2).min(hist.height / 2);
        let [hist, queues] =
            Layout::vertical([Constraint::Min(4), Constraint::Length(height)]).areas(hist);
        f.render_widget(
            Paragraph::new(nvme).block(
                Block::bordered().title(" NVMe command latency per queue (setup -> completion) "),
            ),
            queues,
        );
        hist
    };
    f.render_widget(
        Paragraph::new(rows).block(Block::bordered().title(title)),
        hist,
    );
}

/// A disk's NVMe commands since the start, a line per queue id (0: the admin queue), from its
/// profile; none when it is no NVMe disk or the family did not run.
fn nvme_lines(disk: Option<&crate::model::devices::DeviceProfile>) -> Vec<Line<'static>> {
    let queues: Vec<(u16, &Histogram)> = disk
        .iter()
        .flat_map(|d| &d.nvme_queues)
        .filter_map(|q| Some((q.qid, q.latency.as_ref().filter(|h| h.count > 0)?)))
        .collect();
    if queues.is_empty() {
        return Vec::new();
    }
    let mut lines = vec![Line::from(format!(
        "{:<6} {:>10} {:>10} {:>10} {:>10}",
        "queue", "commands", "mean", "p50", "p99"
    ))
    .bold()];
    for (qid, h) in queues {
        lines.push(Line::from(format!(
            "{:<6} {:>10} {:>10} {:>10} {:>10}",
            format!("q{qid}"),
            h.count,
            lat(h.mean_ns()),
            lat(h.percentile_ns(50.0)),
            lat(h.percentile_ns(99.0))
        )));
    }
    lines
}

fn render_help(f: &mut Frame<'_>, area: Rect) {
    let w = area.width.min(64);
    let h = area.height.min(17);
    let popup = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    };
    let text = vec![
        Line::from("keys".bold()),
        Line::from("  q, Esc, Ctrl-C   quit (probes detach, temp file goes)"),
        Line::from("  Tab, Shift-Tab   next / previous view"),
        Line::from("  1 2 3 4          Time · CPUs · Hypervisor · Devices"),
        Line::from("  arrows           select a CPU (CPUs, Hypervisor) or a device"),
        Line::from("                   (Devices); until picked, the busiest CPU"),
        Line::from("  p                pause / resume the display"),
        Line::from("  n                Time: each stage's latency by percentile"),
        Line::from("  r                reset the cumulative counters"),
        Line::from("  s                save a profile of what has run so far"),
        Line::from("  ?, 5             this help (any key closes it)"),
    ];
    f.render_widget(Clear, popup);
    f.render_widget(
        Paragraph::new(text).block(Block::bordered().title(" help ")),
        popup,
    );
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ratatui::backend::TestBackend;
    use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
    use ratatui::Terminal;
    use virtgap_probes::model::*;
    use virtgap_probes::procfs::CpuTimes;
    use virtgap_probes::{CapabilityReport, ProbeSnapshot};
    use virtgap_workloads::stats::IntervalSample;

    use super::*;
    use crate::model::profile::Profile;
    use crate::tui::app::App;
    use virtgap_probes::KernelHist;

    fn hist(values: &[(u64, u64)]) -> KernelHist {
        let mut h = KernelHist::default();
        for &(v, n) in values {
            for _ in 0..n {
                h.record(v);
            }
        }
        h
    }

    fn probe_snapshot(scale: u64) -> ProbeSnapshot {
        let stage = |stage, h| BlockStageHist {
            dev: (254, 0),
            hctx: 0,
            op: BlockOp::Read,
            stage,
            hist: h,
        };
        ProbeSnapshot {
            elapsed_ns: scale * 1_000_000_000,
            followed: None,
            app: None,
            block: Some(BlockSnapshot {
                stages: vec![
                    stage(
                        BlockStage::Queue,
                        hist(&[(1_500, 900 * scale), (40_000, 10 * scale)]),
                    ),
                    stage(
                        BlockStage::Device,
                        hist(&[
                            (350_000, 800 * scale),
                            (700_000, 100 * scale),
                            (5_000_000, 10 * scale),
                        ]),
                    ),
                    stage(
                        BlockStage::Completion,
                        hist(&[(6_000, 850 * scale), (30_000, 50 * scale)]),
                    ),
                ],
                devices: vec![DeviceGauge {
                    dev: (254, 0),
                    inflight: 3,
                    issued: 910 * scale,
                    completed: 910 * scale,
                    from_bio_entry: 0,
                }],
                cpu_pairs: vec![
                    CpuPair {
                        submit_cpu: 1,
                        complete_cpu: 1,
                        count: 900 * scale,
                    },
                    CpuPair {
                        submit_cpu: 0,
                        complete_cpu: 1,
                        count: 10 * scale,
                    },
                ],
                dropped: 0,
                unseen: 0,
                requeued: 0,
                unsplit: 10 * scale,
                slow_dropped: 0,
                errors: 0,
                timeouts: 0,
            }),
            irq: Some(IrqSnapshot {
                hardirqs: vec![HardIrq {
                    cpu: 1,
                    irq: 36,
                    name: "virtio1-req.0".into(),
                    count: 2_000 * scale,
                    time_ns: 8_000_000 * scale,
                    duration: hist(&[(4_000, 10)]),
                }],
                softirqs: vec![CpuEvents {
                    cpu: 1,
                    kind: "BLOCK".into(),
                    count: 2_100 * scale,
                    time_ns: 850_000_000 * scale,
                }],
                vectors: vec![CpuEvents {
                    cpu: 0,
                    kind: "local_timer".into(),
                    count: 250 * scale,
                    time_ns: 1_000_000,
                }],
                ipis_sent: vec![CpuEvents {
                    cpu: 1,
                    kind: "reschedule".into(),
                    count: 5 * scale,
                    time_ns: 0,
                }],
                cross_cpu_calls: vec![],
                dropped: 0,
            }),
            wakeups: Some(WakeupSnapshot {
                latency: hist(&[(40_000, 50 * scale), (90_000, 5 * scale)]),
                dropped: 0,
            }),
            nvme: None,
            msr: Some(MsrSnapshot {
                counts: vec![
                    MsrCount {
                        cpu: 0,
                        msr: 0x6e0,
                        write: true,
                        by_sampler: false,
                        while_sampling: false,
                        exits: true,
                        count: 2_000 * scale,
                    },
                    MsrCount {
                        cpu: 1,
                        msr: 0x830,
                        write: true,
                        by_sampler: false,
                        while_sampling: false,
                        exits: true,
                        count: 150 * scale,
                    },
                ],
                sampler_ns: 0,
                icr_sends: None,
            }),
            sampler: Some(SamplerSnapshot {
                frequency_hz: 999,
                cpus: vec![CpuSamples {
                    cpu: 0,
                    user: 100 * scale,
                    kernel: BTreeMap::from([
                        ("pv_native_safe_halt".to_string(), 800 * scale),
                        ("native_write_msr".to_string(), 20 * scale),
                        ("blk_mq_start_request".to_string(), 30 * scale),
                        ("__do_softirq".to_string(), 49 * scale),
                    ]),
                }],
                dropped: 0,
                sampled_ns: 0,
                hypervisor: virtgap_probes::hypervisor::Hypervisor::Kvm,
            }),
            kvm: None,
            pv_paths: None,
            cpu_times: vec![
                CpuTimes {
                    cpu: 0,
                    user_ns: 10_000_000 * scale,
                    system_ns: 10_000_000 * scale,
                    idle_ns: 980_000_000 * scale,
                    ..Default::default()
                },
                CpuTimes {
                    cpu: 1,
                    user_ns: 90_000_000 * scale,
                    system_ns: 50_000_000 * scale,
                    idle_ns: 0,
                    irq_ns: 8_000_000 * scale,
                    softirq_ns: 850_000_000 * scale,
                    steal_ns: 2_000_000 * scale,
                    iowait_ns: 0,
                },
            ],
            programs: vec![],
            stats_on_ns: 0,
        }
    }

    fn sample(i: u64, iops: u64) -> IntervalSample {
        let mut s = IntervalSample::empty(0, i, i * 1_000_000_000);
        s.end_ns = s.start_ns + 1_000_000_000;
        s.read_ios = iops;
        s.read_bytes = iops * 4096;
        for n in 0..200u64 {
            s.lat.record(400_000 + (n * 7_919 + i * 13) % 100_000);
        }
        s
    }

    /// An app fed with fixed fixture data, as after ten seconds of rand4k.
    fn fixture_app(baseline: bool) -> App {
        let profile: Profile =
            serde_json::from_str(include_str!("../../tests/data/minimal-profile.json")).unwrap();
        let mut app = App::new(
            profile.host.clone(),
            "random read, bs 4 KiB, qd 32 x 1 worker, io_uring, O_DIRECT".into(),
            crate::tui::app::tests::recorder(std::time::Duration::ZERO),
        );
        let report: CapabilityReport = serde_json::from_value(serde_json::json!({
            "families": [
                {"family": "block", "unavailable": null, "tracepoints": [
                    {"tracepoint": "block_rq_issue", "attached": "tp_btf", "reason": null},
                    {"tracepoint": "block_rq_complete", "attached": "tp_btf", "reason": null}]},
                {"family": "irq", "unavailable": null, "tracepoints": [
                    {"tracepoint": "ipi_send_cpu", "attached": "tp_btf", "reason": null}]},
                {"family": "nvme", "unavailable": "no NVMe on this host (nvme_core module not loaded)", "tracepoints": []}
            ],
            "run_stats_unavailable": null
        }))
        .unwrap();
        app.on_probe_report(report);
        for i in 0..10u64 {
            app.on_probe_snapshot(probe_snapshot(i + 1), probe_snapshot(1));
            app.on_interval(
                &sample(i, 60_000 + (i * 1_234) % 7_000),
                std::time::Duration::from_secs(i + 1),
            );
        }
        if baseline {
            let mut b = profile;
            b.stages.device = Some(crate::model::histogram::Histogram::from_kernel(&hist(&[(
                200_000, 100,
            )])));
            app.baseline = Some(b);
        }
        app.device_names = BTreeMap::from([((254, 0), "vda".to_string())]);
        app
    }

    fn draw(app: &App, w: u16, h: u16) -> String {
        let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
        term.draw(|f| render(f, app)).unwrap();
        term.backend().to_string()
    }

    fn press(app: &mut App, c: KeyCode) {
        app.handle_key(KeyEvent::new(c, KeyModifiers::NONE));
    }

    #[test]
    fn every_view_at_80x24_and_160x50() {
        for (w, h) in [(80, 24), (160, 50)] {
            let mut app = fixture_app(false);
            for (key, name) in [
                ('1', "time"),
                ('2', "cpus"),
                ('3', "hypervisor"),
                ('4', "devices"),
            ] {
                press(&mut app, KeyCode::Char(key));
                insta::assert_snapshot!(format!("{name}_{w}x{h}"), draw(&app, w, h));
            }
            press(&mut app, KeyCode::Char('n'));
            insta::assert_snapshot!(format!("percentiles_{w}x{h}"), draw(&app, w, h));
            press(&mut app, KeyCode::Char('n'));
            press(&mut app, KeyCode::Char('?'));
            insta::assert_snapshot!(format!("help_{w}x{h}"), draw(&app, w, h));
        }
    }

    /// An attached view: no workload, the rates and app latency from the probes; the last
    /// followed process exiting ends it.
    #[test]
    fn an_attached_view_shows_the_probes_rates_and_app_latency_then_the_end() {
        use virtgap_probes::model::{AppHist, AppOp, AppSnapshot, AppVia};
        let profile: Profile =
            serde_json::from_str(include_str!("../../tests/data/minimal-profile.json")).unwrap();
        let mut app = App::new(
            profile.host.clone(),
            "attached to pid 4242 and children".into(),
            crate::tui::app::tests::recorder(std::time::Duration::ZERO),
        );
        app.attached = true;
        let with_app = |scale: u64, followed: Vec<u32>| {
            let mut s = probe_snapshot(scale);
            s.followed = Some(followed);
            s.app = Some(AppSnapshot {
                kinds: vec![AppHist {
                    via: AppVia::Syscall,
                    op: AppOp::Read,
                    latency: hist(&[(90_000, 990 * scale), (2_000_000, 10 * scale)]),
                    bytes: 4096 * 1000 * scale,
                }],
                ..Default::default()
            });
            s
        };
        for i in 1..=5u64 {
            app.on_probe_snapshot(with_app(i, vec![4242]), with_app(1, vec![4242]));
        }
        app.device_names = BTreeMap::from([((254, 0), "vda".to_string())]);
        let screen = draw(&app, 100, 30);
        insta::assert_snapshot!("attached_100x30", screen);
        assert!(
            screen.contains("mean block request of the attached processes"),
            "{screen}"
        );
        assert!(!screen.contains("finished"), "{screen}");
        // The last followed process exits: the view stays, marked finished.
        app.on_probe_snapshot(with_app(6, vec![]), with_app(1, vec![]));
        let screen = draw(&app, 100, 30);
        assert!(screen.contains("finished"), "{screen}");
        assert!(
            screen.contains("every followed process has exited"),
            "{screen}"
        );
    }

    #[test]
    fn device_histogram_bars_are_proportional_and_counts_whole() {
        let mut app = fixture_app(false);
        let mut snap = probe_snapshot(1);
        let block = snap.block.as_mut().unwrap();
        block.stages[1].hist = hist(&[(300_000, 243_690), (600_000, 90_115)]);
        app.on_probe_snapshot(snap.clone(), snap);
        press(&mut app, KeyCode::Char('4'));
        for (w, h) in [(160, 50), (80, 24)] {
            let screen = draw(&app, w, h);
            let bar = |count: &str| {
                let line = screen
                    .lines()
                    .find(|l| l.contains(&format!(" {count} ")))
                    .unwrap_or_else(|| panic!("no whole count {count} at {w}x{h}:\n{screen}"));
                line.matches('#').count() as f64
            };
            let (big, small) = (bar("243690"), bar("90115"));
            assert!(
                big >= 5.0,
                "{w}x{h}: {big} characters for the largest row\n{screen}"
            );
            let expected = big * 90_115.0 / 243_690.0;
            assert!(
                (small - expected).abs() <= 1.0,
                "{w}x{h}: bars {big} and {small}, expected {expected:.1}\n{screen}"
            );
        }
    }

    /// An NVMe disk's commands per queue id sit under its device-time histogram, each queue
    /// with its count and the latencies the profile gives the same histogram.
    #[test]
    fn the_devices_view_shows_an_nvme_disks_commands_per_queue() {
        use virtgap_probes::model::{NvmeQueueHist, NvmeSnapshot};
        let mut app = fixture_app(false);
        let mut snap = probe_snapshot(1);
        let queue = |qid, op, values: &[(u64, u64)]| NvmeQueueHist {
            dev: (254, 0),
            qid,
            op,
            hist: hist(values),
        };
        snap.nvme = Some(NvmeSnapshot {
            queues: vec![
                queue(1, BlockOp::Read, &[(80_000, 600), (400_000, 10)]),
                queue(1, BlockOp::Write, &[(20_000, 90)]),
                queue(2, BlockOp::Read, &[(90_000, 210)]),
                // Another disk's queue: not this one's.
                NvmeQueueHist {
                    dev: (259, 1),
                    ..queue(3, BlockOp::Read, &[(1_000, 5)])
                },
            ],
            dropped: 0,
        });
        app.on_probe_snapshot(snap.clone(), snap);
        press(&mut app, KeyCode::Char('4'));
        let screen = draw(&app, 160, 50);
        assert!(
            screen.contains("NVMe command latency per queue"),
            "{screen}"
        );
        let line = |q: &str| {
            screen
                .lines()
                .find(|l| {
                    l.trim_start_matches(['"', '│'])
                        .starts_with(&format!("{q} "))
                })
                .unwrap_or_else(|| panic!("no {q} line:\n{screen}"))
                .to_string()
        };
        let mut q1 = hist(&[(80_000, 600), (400_000, 10)]);
        q1.merge(&hist(&[(20_000, 90)]));
        let q1 = Histogram::from_kernel(&q1);
        for want in [
            "700".to_string(),
            units::latency(q1.mean_ns().unwrap()),
            units::latency(q1.percentile_ns(99.0).unwrap()),
        ] {
            assert!(line("q1").contains(&want), "q1 without {want}:\n{screen}");
        }
        assert!(line("q2").contains(" 210 "), "{screen}");
        assert!(!screen.contains("q3 "), "{screen}");
    }

    #[test]
    fn a_kv_run_shows_its_load_then_its_verdict() {
        let mut app = fixture_app(false);
        app.kv = Some(crate::tui::app::KvPanel {
            load: "60000 reads/s + 30000 writes/s, 30 s slices".into(),
            ..Default::default()
        });
        let running = draw(&app, 80, 24);
        assert!(running.contains("verdict when the run ends"), "{running}");
        assert!(running.contains("60000 reads/s"), "{running}");
        let panel = app.kv.as_mut().unwrap();
        panel.verdict = Some(
            "NO VERDICT: did not deliver the load of 60000 reads/s + 30000 writes/s (81.7% of client operations, 100.0% of large-block operations done; client operations fell behind their schedule)".into(),
        );
        panel.delivered = Some("delivered 81.7% of the client operations".into());
        panel.slices =
            vec!["slice 0-30 s: 1470000 reads; device 0.38%, 0.00%, 0.00% >= 1/8/64 ms; intended 9.35%, 0.02%, 0.00% >= 1/8/64 ms: FAIL".into()];
        panel.queueing = Vec::from(crate::render::kv_report::queueing_text(
            &crate::model::kv::KvReadQueueing {
                queued_share: Some(0.412),
                adaptive: true,
                ceiling: 64,
                limit_min: 9,
                limit_max: 64,
                limit_mean: Some(23.5),
            },
        ));
        let wide = draw(&app, 160, 50);
        assert!(
            wide.contains("41.2% of device-read time spent queued")
                && wide.contains("adaptive, 9 to 64, 23.5 on average"),
            "{wide}"
        );
        for (w, h) in [(80, 24), (160, 50)] {
            let screen = draw(&app, w, h);
            assert!(screen.contains("NO VERDICT"), "{screen}");
            assert!(screen.contains("delivered 81.7%"), "{w}x{h}:\n{screen}");
            assert!(screen.contains("slice 0-30 s"), "{w}x{h}:\n{screen}");
            assert!(!screen.contains("PASS"), "{screen}");
            assert!(screen.contains("mean latency of the workload"), "{screen}");
        }
    }

    #[test]
    fn a_cpu_whose_samples_did_not_arrive_is_not_measured_not_split() {
        let mut app = fixture_app(false);
        let mut snap = probe_snapshot(1);
        // One second at 999 Hz, 3 samples on each CPU: the kernel dropped the rest.
        snap.sampler.as_mut().unwrap().cpus = (0..2)
            .map(|cpu| CpuSamples {
                cpu,
                user: 0,
                kernel: BTreeMap::from([("pv_native_safe_halt".to_string(), 3)]),
            })
            .collect();
        app.on_probe_snapshot(snap.clone(), snap);
        press(&mut app, KeyCode::Char('3'));
        let screen = draw(&app, 160, 50);
        assert!(screen.contains("not measured: 3 of ~999"), "{screen}");
        assert!(
            !screen.contains("idle/halt"),
            "no split of 3 samples:\n{screen}"
        );
    }

    #[test]
    fn baseline_values_sit_beside_the_live_ones() {
        let app = fixture_app(true);
        let screen = draw(&app, 160, 50);
        assert!(screen.contains("baseline mean / p99"), "{screen}");
        insta::assert_snapshot!("time_with_baseline_160x50", screen);
    }

    #[test]
    fn saturated_irq_cpu_is_flagged_in_words() {
        let mut app = fixture_app(false);
        press(&mut app, KeyCode::Char('2'));
        let screen = draw(&app, 120, 30);
        assert!(
            screen.contains("SATURATED"),
            "cpu1 spends 86% in IRQ+softirq:\n{screen}"
        );
        let narrow = draw(&app, 80, 24);
        assert!(
            narrow.contains("SATURATED"),
            "the flag fits 80 columns:\n{narrow}"
        );
    }

    #[test]
    fn tiny_terminals_get_a_note_not_a_panic() {
        let app = fixture_app(false);
        let screen = draw(&app, 40, 10);
        assert!(screen.contains("terminal too small"), "{screen}");
        for (w, h) in [(1, 1), (59, 30), (80, 14)] {
            draw(&app, w, h);
        }
    }

    #[test]
    fn before_any_data_each_view_says_what_it_waits_for() {
        let profile: Profile =
            serde_json::from_str(include_str!("../../tests/data/minimal-profile.json")).unwrap();
        let mut app = App::new(
            profile.host,
            "w".into(),
            crate::tui::app::tests::recorder(std::time::Duration::ZERO),
        );
        // Before any data, each view says what it waits for instead of showing zeros.
        for (key, waiting) in [
            ('1', "waiting for the first interval"),
            ('2', "interrupts: unavailable"),
            ('3', "unavailable ("),
            ('4', "no data yet"),
        ] {
            press(&mut app, KeyCode::Char(key));
            let screen = draw(&app, 80, 24);
            assert!(
                screen.contains(waiting),
                "view {key} lacks {waiting:?}:\n{screen}"
            );
            assert!(
                !screen.contains(" 0.0%"),
                "view {key} shows zeros:\n{screen}"
            );
        }
    }

    /// A finished run's tail autopsy shows under the stage table, with the sets' figures and
    /// where the slowest set's extra time went.
    #[test]
    fn a_finished_run_shows_its_tail_autopsy() {
        use crate::model::stages::StageBreakdown;
        use crate::model::tail::{TailAutopsy, TailSet};
        let mut app = fixture_app(false);
        app.state = RunState::Finished;
        let baseline = StageBreakdown {
            app_ns: 100_000.0,
            queue_ns: 2_000.0,
            device_ns: 80_000.0,
            completion_ns: 8_000.0,
            software_ns: 10_000.0,
        };
        let set = |p: f64, device_ns: f64, ios: u64| TailSet {
            percentile: p,
            threshold_ns: 400_000.0 * (p - 98.0),
            expected_ios: ios,
            ios,
            joined: ios - 1,
            joined_software: None,
            mean: StageBreakdown {
                app_ns: device_ns + 20_000.0,
                device_ns,
                ..baseline
            },
            baseline,
        };
        app.tail = Some(TailAutopsy {
            sets: vec![set(99.0, 900_000.0, 600), set(99.9, 3_000_000.0, 60)],
            requests_dropped: 0,
            unjoinable: None,
            by_thread: false,
        });
        for (w, h) in [(160, 50), (80, 24)] {
            let screen = draw(&app, w, h);
            insta::assert_snapshot!(format!("time_tail_{w}x{h}"), screen.clone());
            assert!(screen.contains("tail autopsy"), "{w}x{h}:\n{screen}");
        }
        let screen = draw(&app, 160, 50);
        assert!(screen.contains("above p99.9"), "{screen}");
        assert!(screen.contains("device 100%"), "{screen}");
        assert!(!screen.contains("tail autopsy so far"), "{screen}");
        // While the workload runs, the panel is the autopsy of the run so far.
        app.state = RunState::Running;
        let screen = draw(&app, 160, 50);
        assert!(screen.contains("tail autopsy so far"), "{screen}");
    }
}
