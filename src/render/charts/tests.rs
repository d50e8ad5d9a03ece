//! The charts read back in their own coordinates: what is drawn must show what the diff says.

use super::percentiles::{diff_chart, nines, profile_chart};
use super::waterfalls::{hypervisor_chart, waterfall_chart};
use crate::analysis::diff::{diff_hosts, DiffOptions, MetricId, ProfileDiff, Verdict};
use crate::model::histogram::Histogram;
use crate::model::profile::{Profile, RunRecord};
use crate::model::stages::{Stage, StageBreakdown, Stages};
use crate::model::tail::{TailAutopsy, TailSet};
use virtgap_testkit::chart::Panel;

/// A latency in ns: 60 µs plus an exponential spread of mean 40 µs, from a fixed sequence.
fn latencies(n: usize, seed: u64, scale: f64) -> Vec<u64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            ((60_000.0 - 40_000.0 * (1.0 - u).ln()) * scale) as u64
        })
        .collect()
}

/// A profile of `runs` runs of 20,000 reads at QD 1; with `tail`, one read in a thousand is
/// delayed 5 ms in the device (a slow tail the mean barely shows).
fn tail_fixture(runs: u32, tail: bool, seed: u64) -> Profile {
    let mut p: Profile =
        serde_json::from_str(include_str!("../../../tests/data/minimal-profile.json")).unwrap();
    p.intervals.clear();
    p.runs = (1..=runs)
        .map(|run| {
            let scale = 1.0 + 0.01 * f64::from(run % 3) - 0.01;
            let device: Vec<u64> = latencies(20_000, seed + u64::from(run), scale)
                .into_iter()
                .enumerate()
                .map(|(k, v)| {
                    if tail && k % 1000 == 7 {
                        v + 5_000_000
                    } else {
                        v
                    }
                })
                .collect();
            let queue: Vec<u64> = latencies(20_000, seed + 100 + u64::from(run), 0.02);
            let app: Vec<u64> = device
                .iter()
                .zip(&queue)
                .map(|(d, q)| d + q + 8_000)
                .collect();
            let tail = Some(autopsy(&app, &queue, &device));
            RunRecord {
                run,
                complete: true,
                tail,
                measured_s: 10.0,
                read_ios: 20_000,
                stages: Stages {
                    app: Histogram::of_values(&app),
                    queue: Some(Histogram::of_values(&queue)),
                    device: Some(Histogram::of_values(&device)),
                    ..Stages::default()
                },
                ..RunRecord::default()
            }
        })
        .collect();
    p
}

/// The tail autopsy of one run's I/Os (app, queue and device time of each, in order): the
/// mean of those above its p99 and p99.9, next to the mean of all.
fn autopsy(app: &[u64], queue: &[u64], device: &[u64]) -> TailAutopsy {
    let hist = Histogram::of_values(app);
    let mean_of = |keep: &dyn Fn(usize) -> bool| {
        let (mut n, mut sums) = (0.0, [0.0; 3]);
        for k in (0..app.len()).filter(|&k| keep(k)) {
            n += 1.0;
            sums[0] += app[k] as f64;
            sums[1] += queue[k] as f64;
            sums[2] += device[k] as f64;
        }
        (
            n,
            StageBreakdown::of(sums[0] / n, sums[1] / n, sums[2] / n, 0.0),
        )
    };
    let (_, baseline) = mean_of(&|_| true);
    let sets = [99.0, 99.9]
        .into_iter()
        .map(|percentile| {
            let threshold_ns = hist.percentile_ns(percentile).unwrap();
            let (n, mean) = mean_of(&|k| app[k] as f64 > threshold_ns);
            TailSet {
                percentile,
                threshold_ns,
                expected_ios: n as u64,
                ios: n as u64,
                joined: n as u64,
                mean,
                joined_software: None,
                baseline,
            }
        })
        .collect();
    TailAutopsy {
        sets,
        ..TailAutopsy::default()
    }
}

fn tail_pair() -> (Profile, Profile, ProfileDiff) {
    let (a, b) = (tail_fixture(3, false, 1), tail_fixture(3, true, 11));
    let d = crate::analysis::diff::tests::diff_apart(&a, &b);
    (a, b, d)
}

#[test]
fn a_tail_of_one_read_in_a_thousand_is_drawn_as_far_apart_as_the_diff_says() {
    let (a, b, d) = tail_pair();
    let row = |percentile| {
        d.row(MetricId::Tail {
            stage: Stage::App,
            percentile,
        })
        .unwrap()
    };
    let (p999, p99) = (row(99.9), row(99.0));
    assert_eq!(p999.verdict, Verdict::Significant, "{p999:?}");
    let reported = 1.0 + p999.effect.unwrap();
    assert!(reported > 10.0, "a 5 ms tail over ~100 µs: x{reported}");
    let mean = d.waterfall.app.effect.unwrap();
    assert!(mean < 0.1, "the mean barely moves: {mean}");
    let svg = diff_chart(&[&a], &[&b], &d);
    let app = Panel::read(&svg, "app");
    let drawn = app.drawn_ratio(99.9);
    assert!(
        drawn >= reported * 0.995,
        "p99.9 drawn x{drawn:.2} apart, the diff says x{reported:.2}"
    );
    // Exactly the diff's figure, to the drawing's rounding; p99 too, where the curves are close.
    assert!(
        (drawn / reported - 1.0).abs() < 0.005,
        "{drawn} vs {reported}"
    );
    let at_p99 = app.drawn_ratio(99.0);
    assert!(
        (at_p99 / (1.0 + p99.effect.unwrap()) - 1.0).abs() < 0.005,
        "{at_p99} vs {:?}",
        p99.effect
    );
    // The device panel shows the same tail; each run is a faint line of its own.
    assert!(Panel::read(&svg, "device").drawn_ratio(99.9) > 10.0);
    assert_eq!(app.runs.iter().filter(|r| r.0 == "A").count(), 3);
    assert_eq!(app.runs.iter().filter(|r| r.0 == "B").count(), 3);
    // The percentile axis reaches p99.99 (20,000 reads per run) and p99.9 sits at three nines.
    let (x0, x999) = (app.x_of(0.0), app.x_of(99.9));
    assert!(((app.x_of(99.99) - x0) / (x999 - x0) - 4.0 / 3.0).abs() < 1e-4);
    assert!((nines(99.9) - 3.0).abs() < 1e-9);
    insta::assert_snapshot!("percentiles_tail", svg);
}

#[test]
fn stages_neither_host_measured_are_said_not_drawn() {
    let (a, b, d) = tail_pair();
    let svg = diff_chart(&[&a], &[&b], &d);
    assert!(svg.contains("completion latency: not measured on either host"));
    assert!(svg.contains("wakeup latency: not measured on either host"));
    roxmltree::Document::parse(&svg).unwrap();
}

#[test]
fn the_waterfall_shares_a_gap_only_when_it_is_significant() {
    let (a, b, d) = tail_pair();
    // The mean gap here is small but real (5 ms on one read in a thousand).
    let svg = waterfall_chart(&d);
    roxmltree::Document::parse(&svg).expect("XML");
    if d.waterfall.app.verdict == Verdict::Significant {
        assert!(svg.contains("% of the gap"));
    }
    // Two hosts alike: no shares, each stage's own verdict instead.
    let twin = tail_fixture(3, false, 21);
    let same = diff_hosts(&[&a], &[&twin], &DiffOptions::default());
    assert_ne!(same.waterfall.app.verdict, Verdict::Significant);
    let svg = waterfall_chart(&same);
    assert!(!svg.contains("% of the gap"), "{svg}");
    assert!(svg.contains("no shares of the gap: it is not judged significant"));
    assert!(svg.contains("device: A "));
    let _ = b;
}

#[test]
fn a_one_host_chart_draws_each_run_and_names_its_tails() {
    let p = tail_fixture(3, true, 5);
    let svg = profile_chart(&p);
    let app = Panel::read(&svg, "app");
    assert_eq!(app.runs.len(), 3);
    assert_eq!(app.curves.len(), 1);
    assert!(svg.contains("p99.9: "), "{svg}");
    // Its p99.9 is the 5 ms tail.
    let drawn_ns = app.drawn_ns("", 99.9);
    assert!(drawn_ns > 4e6, "p99.9 drawn at {drawn_ns} ns");
}

#[test]
fn the_hypervisor_chart_draws_each_mechanism_or_says_why_not() {
    use crate::analysis::diff::{diff, tests::on_hypervisor};
    use virtgap_probes::hypervisor::{Hypervisor, Mechanism};
    let xen = [
        (Mechanism::Timer, 0.9, 1_800.0),
        (Mechanism::Ipi, 0.3, 1_500.0),
    ];
    let d = diff(
        &on_hypervisor(Hypervisor::None, &[], 0.0),
        &on_hypervisor(Hypervisor::Xen, &xen, 4_100.0),
    );
    let svg = hypervisor_chart(&d);
    let doc = roxmltree::Document::parse(&svg).unwrap();
    let groups = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("mechanism"))
        .count();
    assert_eq!(groups, d.hypervisor.rows.len());
    assert!(groups >= 3);
    insta::assert_snapshot!("hypervisor_xen_vs_metal", svg);
    let (a, b, d) = tail_pair();
    let svg = hypervisor_chart(&d);
    assert!(svg.contains("not recorded in these profiles"), "{svg}");
    let _ = (a, b);
}

#[test]
fn the_waterfall_chart_matches_its_snapshot() {
    let (_, _, d) = tail_pair();
    insta::assert_snapshot!("waterfall_tail", waterfall_chart(&d));
}
