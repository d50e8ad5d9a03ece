//! What an accepted input is fed to, and the checks on what comes out: beyond not panicking,
//! no NaN or inf the input did not hold, SVG that parses, CSV rows of the header's width,
//! percentages within 0-100, an effective spec that reads back the same.

use std::collections::BTreeSet;
use std::time::Duration;

use virtgap::analysis::diff::{self, DiffOptions, ProfileDiff};
use virtgap::model::file;
use virtgap::model::profile::Profile;
use virtgap::render::{charts, csv_export, diff_html, diff_render, report, summary};
use virtgap_workloads::spec::{self, Pattern, WorkloadSpec};

use crate::{one_line, Outcome};

/// Parses a profile and runs every consumer of one on it: diffs against the reference both
/// ways, with itself, and pooled with it; every rendering of each; the summary, the report and
/// the CSV export.
pub fn profile(input: &[u8], reference: &Profile) -> Outcome {
    let p = match file::parse(input, "fuzz-input.json") {
        Ok(p) => p,
        Err(e) => {
            // The refusal is shown to users: it must format.
            let _ = e.to_string();
            return Outcome::default();
        }
    };
    let mut out = Outcome::accepted();
    let in_input = non_finite_words(&String::from_utf8_lossy(input));
    let r = reference;
    let pairs: [(&str, &[&Profile], &[&Profile]); 4] = [
        ("diff(p, p)", &[&p], &[&p]),
        ("diff(ref, p)", &[r], &[&p]),
        ("diff(p, ref)", &[&p], &[r]),
        ("diff(p+ref, ref+p)", &[&p, r], &[r, &p]),
    ];
    for (label, a, b) in pairs {
        let d = diff::diff_hosts(a, b, &DiffOptions::default());
        check_diff_values(&mut out, label, &d);
        let json = diff_render::json(&d).unwrap_or_else(|e| {
            out.odd("diff --json fails", e.to_string());
            String::new()
        });
        let texts = [
            ("diff --json", json),
            ("diff terminal", diff_render::terminal(&d)),
            ("diff markdown", diff_render::markdown(&d)),
            ("diff csv", diff_render::csv(&d)),
            ("waterfall.svg", charts::waterfalls::waterfall_chart(&d)),
            ("percentiles.svg", charts::percentiles::diff_chart(a, b, &d)),
            ("hypervisor.svg", charts::waterfalls::hypervisor_chart(&d)),
            ("diff --html", diff_html::page(a, b, &d)),
        ];
        for (consumer, text) in &texts {
            // As `virtgap diff` prints it.
            let shown = virtgap_workloads::units::printable(text);
            scan_output(&mut out, consumer, &shown, &in_input);
            if consumer.ends_with(".svg") {
                if let Err(e) = roxmltree::Document::parse(text) {
                    out.odd(format!("{consumer} is not well-formed XML"), e.to_string());
                }
            }
            if text.len() > 16 << 20 {
                out.odd(
                    format!("{consumer} output is huge"),
                    format!("{} bytes", text.len()),
                );
            }
        }
    }
    let mut written = Vec::new();
    if let Err(e) = summary::write(&mut written, &p) {
        out.odd("the summary fails", e.to_string());
    }
    scan_output(
        &mut out,
        "summary",
        &String::from_utf8_lossy(&written),
        &in_input,
    );
    scan_output(
        &mut out,
        "record --json",
        &report::json(&p).to_string(),
        &in_input,
    );
    for (file, text) in csv_export::export(&p) {
        scan_output(&mut out, file, &text, &in_input);
        check_csv_columns(&mut out, file, &text);
    }
    out
}

/// Numbers in a diff that no output can show sensibly, and percentages no measurement gives.
fn check_diff_values(out: &mut Outcome, label: &str, d: &ProfileDiff) {
    for r in d.rows() {
        let fields = [
            ("a", r.a),
            ("b", r.b),
            ("delta", r.delta),
            ("ci_low", r.ci_low),
            ("ci_high", r.ci_high),
            ("effect", r.effect),
            ("effect_low", r.effect_low),
            ("effect_high", r.effect_high),
            ("share", r.share),
        ];
        for (field, v) in fields {
            if let Some(x) = v.filter(|x| !x.is_finite()) {
                let what = if x.is_nan() { "NaN" } else { "infinite" };
                let row = diff_render::label(r.metric, d.above_idle);
                out.odd(
                    format!("diff row '{}' {field} is {what}", row.trim()),
                    format!("{label}: {x}"),
                );
            }
        }
    }
    for e in diff_render::evidence(d) {
        for text in [&e.a, &e.b] {
            if let Some(pct) = percentages(text)
                .into_iter()
                .find(|p| !(0.0..=100.0).contains(p))
            {
                out.odd(
                    format!("evidence '{}' shows a percentage outside 0-100", e.item),
                    format!("{label}: {pct:.3e}% in \"{}\"", one_line(text, 120)),
                );
            }
        }
    }
}

/// The numbers written just before a '%' sign.
fn percentages(text: &str) -> Vec<f64> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices('%') {
        let head = &text[..i];
        let start = head
            .rfind(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
            .map_or(0, |j| j + 1);
        if let Ok(v) = head[start..].parse::<f64>() {
            out.push(v);
        }
    }
    out
}

/// Every row of an exported CSV file has the header's column count.
fn check_csv_columns(out: &mut Outcome, file: &str, text: &str) {
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(text.as_bytes());
    let width = reader.headers().map(|h| h.len()).unwrap_or(0);
    for record in reader.records() {
        match record {
            Ok(r) if r.len() == width => {}
            Ok(r) => {
                let detail = format!("{} of {width} columns", r.len());
                return out.odd(format!("{file} has a ragged row"), detail);
            }
            Err(e) => return out.odd(format!("{file} does not read back as CSV"), e.to_string()),
        }
    }
}

/// Parses a workload file and runs what uses a spec: its description, its effective TOML (read
/// back), the fio command, re-validation, the I/O loop's end time, where the first I/Os land,
/// the rate schedule, and ACT's derived load for kv.
pub fn spec(input: &[u8]) -> Outcome {
    // Workload files are read as UTF-8 text; anything else is refused before parsing.
    let Ok(text) = std::str::from_utf8(input) else {
        return Outcome::default();
    };
    let spec = match spec::parse(text, "fuzz.toml") {
        Ok(s) => s,
        Err(e) => {
            let _ = e.to_string();
            return Outcome::default();
        }
    };
    let mut out = Outcome::accepted();
    let in_input = non_finite_words(text);
    let describe = spec.describe();
    let effective = spec.to_toml();
    // The effective spec is stored in profiles and parsed again by `diff` and `record -w`.
    match spec::parse(&effective, "effective spec") {
        Err(e) => out.odd(
            "the effective spec (to_toml) is refused when read back",
            e.to_string(),
        ),
        Ok(again) if again != spec => out.odd(
            "the effective spec (to_toml) reads back different",
            one_line(&effective, 300),
        ),
        Ok(_) => {}
    }
    let fio = spec
        .fio_command(&spec::FioTarget {
            filename: "/tmp/fuzz-target",
            size: spec.size.0,
            existing: true,
        })
        .unwrap_or_default();
    let _ = (spec.fio_rw(), spec.is_read_only());
    let mut copy = spec.clone();
    if let Err(e) = spec::Overrides::default().apply(&mut copy) {
        out.odd("an accepted spec fails re-validation", e.to_string());
    }
    // The I/O loop's end time: ramp + duration in u64 nanoseconds (workloads/src/run.rs).
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).ok();
    let end = nanos(spec.ramp.0)
        .zip(nanos(spec.duration.0))
        .and_then(|(r, d)| r.checked_add(d));
    if end.is_none() {
        out.odd(
            "ramp + duration overflow the runner's u64 nanoseconds (run.rs: ramp_ns + duration)",
            format!("ramp {:?}, duration {:?}", spec.ramp.0, spec.duration.0),
        );
    }
    first_offsets(&mut out, &spec);
    if let Some(rate) = spec.rate_iops {
        let per_worker = rate as f64 / f64::from(spec.workers);
        let mut schedule = virtgap_workloads::schedule::RateSchedule::new(per_worker);
        let _ = (schedule.take_due(1_000_000), schedule.lag_ns(u64::MAX));
    }
    if let Some(kv) = &spec.kv {
        let derived = virtgap_workloads::act::derive(&kv.act_load(spec.bs.0));
        let rates = [
            derived.internal_read_rps,
            derived.lb_reads_per_s,
            derived.lb_writes_per_s,
        ];
        if rates.iter().any(|r| !r.is_finite()) {
            out.odd("ACT's derived rates are not finite", format!("{derived:?}"));
        }
        let _ = kv.slice_for(spec.duration.0);
    }
    for (consumer, text) in [
        ("describe", &describe),
        ("to_toml", &effective),
        ("fio_command", &fio),
    ] {
        scan_output(&mut out, consumer, text, &in_input);
    }
    out
}

/// Where the first I/Os of the first and last worker go: inside the target, aligned.
fn first_offsets(out: &mut Outcome, spec: &WorkloadSpec) {
    if spec.pattern == Pattern::Kv {
        return;
    }
    for worker in [0, spec.workers.saturating_sub(1)] {
        let mut offsets = virtgap_workloads::offsets::OffsetGenerator::new(
            spec.pattern,
            spec.distribution,
            spec.size.0,
            spec.bs.0,
            worker,
            spec.workers,
            1,
        );
        for _ in 0..8 {
            let at = offsets.next_offset();
            if at
                .checked_add(spec.bs.0)
                .is_none_or(|end| end > spec.size.0)
            {
                out.odd(
                    "an I/O lands past the end of the target",
                    format!("offset {at} + bs {} > size {}", spec.bs.0, spec.size.0),
                );
                break;
            }
        }
    }
}

/// Words a float prints as when it is not finite, found as whole words in `text`.
pub fn non_finite_words(text: &str) -> BTreeSet<&'static str> {
    let mut found = BTreeSet::new();
    for word in ["NaN", "inf"] {
        let hit = text.match_indices(word).any(|(i, _)| {
            let before = text[..i].chars().next_back();
            let after = text[i + word.len()..].chars().next();
            !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphabetic)
        });
        if hit {
            found.insert(word);
        }
    }
    found
}

/// Flags `NaN`/`inf` in a consumer's output that the input did not already contain as text.
fn scan_output(out: &mut Outcome, consumer: &str, text: &str, in_input: &BTreeSet<&str>) {
    for word in non_finite_words(text) {
        if in_input.contains(word) {
            continue;
        }
        let line = text
            .lines()
            .find(|l| non_finite_words(l).contains(word))
            .unwrap_or("");
        out.odd(
            format!("{consumer} prints {word}"),
            one_line(line.trim(), 200),
        );
    }
}
