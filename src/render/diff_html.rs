//! `diff --html FILE`: the diff as one self-contained page — header, verdict, the tables the
//! text report prints (worded by the same functions), the charts inline and the warnings — to
//! attach to a ticket. Nothing is fetched: styles and charts are inline, and the page's own
//! Content-Security-Policy forbids any load, so a viewer makes no network request.
//!
//! Written as markup directly rather than with a template crate: the page is a few tables whose
//! cells come from `diff_render`'s wording functions and three SVG strings, and a template would
//! be a second place that words each row.

use std::fmt::Write as _;

use crate::analysis::diff::{Host, ProfileDiff, Row};
use crate::model::profile::Profile;
use crate::render::charts::{self, esc};
use crate::render::diff_render::{
    cell, confounder, evidence, hypervisor_heading, row_label, runs_line, share, side_words,
    signed, spec_difference, tail_heading, tail_rows, verdict_sentence, verdict_text, warning,
    workload, NVME_HEADING,
};
use crate::render::hypervisor_report::mechanism_words;

const STYLE: &str = "
body { font-family: sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }
h1 { font-size: 1.6em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.6em 0; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: right; vertical-align: top; }
th:first-child, td:first-child, td.verdict, th.verdict { text-align: left; }
td.indent-2 { padding-left: 26px; } td.indent-4 { padding-left: 42px; }
.verdict-significant { color: #b00; font-weight: bold; }
.warnings li { color: #8a5a00; }
.verdict-line { font-size: 1.15em; padding: 0.6em 1em; background: #f4f6fa; border-left: 4px solid #1f77b4; }
figure { margin: 1em 0; overflow-x: auto; }
dl.hosts dt { font-weight: bold; float: left; width: 6em; } dl.hosts dd { margin-left: 7em; }
footer { margin-top: 3em; color: #777; font-size: 0.9em; }
";

/// The verdict's class, so a significant row stands out.
fn verdict_class(r: &Row) -> &'static str {
    use crate::analysis::diff::Verdict;
    match r.verdict {
        Verdict::Significant => "verdict verdict-significant",
        _ => "verdict",
    }
}

/// A table of compared rows: metric, A, B, delta, share, verdict — the text report's columns.
fn rows_table(s: &mut String, d: &ProfileDiff, rows: &mut dyn Iterator<Item = &Row>) {
    s.push_str("<table class=\"rows\">\n<tr><th>metric</th><th>A</th><th>B</th><th>delta</th><th>share</th><th class=\"verdict\">verdict (95% interval, % of A)</th></tr>\n");
    for r in rows {
        let indent = crate::render::diff_render::indent_of(r.metric);
        let _ = writeln!(
            s,
            "<tr class=\"row\" data-metric=\"{}\"><td class=\"label indent-{indent}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td></tr>",
            esc(&r.metric.key()),
            esc(&row_label(d, r)),
            esc(&cell(r, Host::A)),
            esc(&cell(r, Host::B)),
            esc(&signed(r.delta, r.unit)),
            esc(&share(r, d)),
            verdict_class(r),
            esc(&verdict_text(r, d)),
        );
    }
    s.push_str("</table>\n");
}

fn figure(s: &mut String, svg: &str, caption: &str) {
    let _ = writeln!(
        s,
        "<figure>\n{}<figcaption>{}</figcaption>\n</figure>",
        svg,
        esc(caption)
    );
}

/// The whole page. `a` and `b` are each side's profiles (their runs draw the percentile
/// curves).
pub fn page(a: &[&Profile], b: &[&Profile], d: &ProfileDiff) -> String {
    let mut s = String::new();
    header(&mut s, d);
    s.push_str("<h2>Where the time goes</h2>\n");
    rows_table(&mut s, d, &mut d.waterfall.rows());
    figure(
        &mut s,
        &charts::waterfalls::waterfall_chart(d),
        "Each host's mean I/O, and its I/Os above p99 and p99.9, split over the stages.",
    );
    tails_section(&mut s, a, b, d);
    s.push_str("<h2>Throughput</h2>\n");
    rows_table(&mut s, d, &mut d.throughput.iter());
    hypervisor_section(&mut s, d);
    if !d.nvme_queues.is_empty() {
        let _ = writeln!(s, "<h2>NVMe queues</h2>\n<p>{}</p>", esc(NVME_HEADING));
        rows_table(&mut s, d, &mut d.nvme_queues.iter());
    }
    evidence_table(&mut s, d);
    let _ = writeln!(
        s,
        "<footer>virtgap {} — <code>virtgap diff</code></footer>\n</body>\n</html>",
        env!("CARGO_PKG_VERSION")
    );
    s
}

/// The document's head, the hosts and workload compared, the verdict, and the notes that
/// qualify it (workload differences, confounders, warnings).
fn header(s: &mut String, d: &ProfileDiff) {
    let _ = writeln!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">\n\
         <title>virtgap diff: {}</title>\n<style>{STYLE}</style>\n</head>\n<body>",
        esc(&d.workload)
    );
    let _ = writeln!(s, "<h1>virtgap diff</h1>\n<dl class=\"hosts\">");
    for (what, text) in [
        ("A", side_words(d, Host::A)),
        ("B", side_words(d, Host::B)),
        ("workload", workload(d)),
        ("runs", runs_line(d)),
    ] {
        let _ = writeln!(s, "<dt>{what}</dt><dd>{}</dd>", esc(&text));
    }
    s.push_str("</dl>\n");
    let _ = writeln!(
        s,
        "<p class=\"verdict-line\" id=\"verdict\"><b>Verdict:</b> {}</p>",
        esc(&verdict_sentence(d))
    );
    let notes: Vec<String> = d
        .spec_differences
        .iter()
        .map(|x| format!("workload differs: {}", spec_difference(x)))
        .chain(
            d.confounders
                .iter()
                .map(|c| format!("confounder: {}", confounder(c))),
        )
        .chain(
            d.warnings
                .iter()
                .map(|w| format!("warning: {}", warning(w))),
        )
        .collect();
    if !notes.is_empty() {
        s.push_str("<ul class=\"warnings\">\n");
        for n in notes {
            let _ = writeln!(s, "<li>{}</li>", esc(&n));
        }
        s.push_str("</ul>\n");
    }
}

/// The tails: their rows, the stage that moved most, the percentile chart, and each tail's
/// waterfall as a table.
fn tails_section(s: &mut String, a: &[&Profile], b: &[&Profile], d: &ProfileDiff) {
    s.push_str("<h2>Tails</h2>\n");
    rows_table(s, d, &mut d.tails.iter());
    if let Some(m) = &d.tail_mover {
        let _ = writeln!(
            s,
            "<p>The <b>{}</b> stage's {} moved most ({}).</p>",
            esc(m.stage.name()),
            esc(&crate::render::diff_render::percentile_name(m.percentile)),
            esc(&signed(Some(m.delta_ns), crate::analysis::diff::Unit::Ns))
        );
    } else if d.tails_judged() {
        s.push_str("<p>No stage's tail moved significantly.</p>\n");
    }
    figure(
        s,
        &charts::percentiles::diff_chart(a, b, d),
        "Latency by percentile, each run faint and the runs' geometric mean bold.",
    );
    for w in &d.tail_waterfalls {
        let _ = writeln!(
            s,
            "<h3>{}</h3>\n<table class=\"tail-waterfall\">\n<tr><th>stage</th><th>A</th><th>B</th><th>delta</th><th>share</th></tr>",
            esc(tail_heading(w).trim_end_matches(':'))
        );
        for (label, a, b, delta, share) in tail_rows(w, d) {
            let _ = writeln!(
                s,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(label.trim()),
                esc(&a),
                esc(&b),
                esc(&delta),
                esc(&share)
            );
        }
        s.push_str("</table>\n");
    }
}

/// The hypervisor's section: what was compared, its rows and chart when there are any, and
/// the mechanism that moved most.
fn hypervisor_section(s: &mut String, d: &ProfileDiff) {
    let _ = writeln!(
        s,
        "<h2>Hypervisor</h2>\n<p>{}</p>",
        esc(&hypervisor_heading(d))
    );
    if !d.hypervisor.rows.is_empty() {
        rows_table(s, d, &mut d.hypervisor.rows.iter());
        figure(
            s,
            &charts::waterfalls::hypervisor_chart(d),
            "Each mechanism per I/O on both hosts, each row on its own scale.",
        );
    }
    if let Some(m) = d.hypervisor.moved {
        let _ = writeln!(
            s,
            "<p>The mechanism that moved most: <b>{}</b>.</p>",
            esc(mechanism_words(m))
        );
    }
}

/// The evidence each host's figures rest on, side by side.
fn evidence_table(s: &mut String, d: &ProfileDiff) {
    s.push_str(
        "<h2>Evidence</h2>\n<table class=\"evidence\">\n<tr><th></th><th>A</th><th>B</th></tr>\n",
    );
    for e in evidence(d) {
        let _ = writeln!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(e.item),
            esc(&e.a),
            esc(&e.b)
        );
    }
    s.push_str("</table>\n");
}
