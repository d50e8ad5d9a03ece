//! The diff's behaviour on synthetic profiles, and the fixtures other tests build profiles with.

use std::collections::BTreeMap;

use super::context::confounders;
use super::figures::batches_of;
use super::judge::{judge, Judging, HOST_WIDE, STAGE_TAILS};
use super::*;
use crate::analysis::stats::CONFIDENCE;
use crate::model::histogram::Histogram;
use crate::model::interval::{CpuLoad, Interval, StageSample};
use crate::model::profile::{IdleBaseline, RunRecord};
use crate::model::stages::{QueueStart, RequestsPerIo};

/// The row of one of the waterfall's stages.
fn stage(d: &ProfileDiff, part: BreakdownPart) -> &Row {
    d.row(MetricId::Stage(part))
        .expect("every stage has its row")
}

/// Each of `p`'s runs as a recording of its own, as sessions at different times give them.
pub(crate) fn as_sessions(p: &Profile) -> Vec<Profile> {
    if p.runs.is_empty() {
        return vec![p.clone()];
    }
    p.replicates()
        .into_iter()
        .map(|(run, intervals)| Profile {
            runs: vec![run],
            intervals: intervals.to_vec(),
            ..p.clone()
        })
        .collect()
}

/// The diff of two hosts whose runs were each recorded apart (see [`as_sessions`]): the
/// diff that judges, where one recording a host is provisional.
pub(crate) fn diff_apart(a: &Profile, b: &Profile) -> ProfileDiff {
    let (a, b) = (as_sessions(a), as_sessions(b));
    diff_hosts(
        &a.iter().collect::<Vec<_>>(),
        &b.iter().collect::<Vec<_>>(),
        &DiffOptions::default(),
    )
}

/// A profile whose every interval has the given stage means (ns) plus deterministic jitter.
/// `p` with a completion stage of `mean_ns` on `share` of its requests, taken out of their
/// device time (app latency unchanged).
fn with_completion(mut p: Profile, mean_ns: f64, share: f64) -> Profile {
    let moved = |device: &mut u64, count: u64| -> (u64, u64) {
        let n = (count as f64 * share) as u64;
        let ns = (mean_ns * n as f64) as u64;
        *device -= ns;
        (n, ns)
    };
    for iv in &mut p.intervals {
        let dev = iv.stages.get_mut("device").unwrap();
        let count = dev.count;
        let (n, ns) = moved(&mut dev.sum_ns, count);
        iv.stages.insert(
            "completion".into(),
            StageSample {
                count: n,
                sum_ns: ns,
            },
        );
    }
    let dh = p.stages.device.as_mut().unwrap();
    let mut sum = dh.sum_ns as u64;
    let (n, ns) = moved(&mut sum, dh.count);
    dh.sum_ns = sum as f64;
    p.stages.completion = Some(Histogram {
        count: n,
        sum_ns: ns as f64,
        buckets: vec![[(mean_ns * 0.9) as u64, (mean_ns * 1.1) as u64, n]],
        ..Default::default()
    });
    p
}

pub(crate) fn synthetic(queue: f64, device: f64, software: f64, jitter: f64, n: usize) -> Profile {
    let mut p: Profile =
        serde_json::from_str(include_str!("../../../tests/data/minimal-profile.json")).unwrap();
    let ios = 1000u64;
    let mut app = crate::model::histogram::Histogram::default();
    let (mut qh, mut dh) = (Histogram::default(), Histogram::default());
    p.intervals = (0..n)
        .map(|i| {
            // Alternating jitter: mean unchanged, spread `jitter`.
            let j = if i % 2 == 0 { jitter } else { -jitter };
            let (q, d, s) = (queue + j * 0.1, device + j, software + j * 0.2);
            let lat = q + d + s;
            Interval {
                index: i as u64,
                start_s: i as f64,
                end_s: i as f64 + 1.0,
                read_ios: ios,
                lat_count: ios,
                lat_sum_ns: lat * ios as f64,
                lat_p99_ns: Some((lat * 2.0) as u64),
                stages: BTreeMap::from([
                    (
                        "queue".into(),
                        StageSample {
                            count: ios,
                            sum_ns: (q * ios as f64) as u64,
                        },
                    ),
                    (
                        "device".into(),
                        StageSample {
                            count: ios,
                            sum_ns: (d * ios as f64) as u64,
                        },
                    ),
                ]),
                cpus: vec![CpuLoad {
                    cpu: 0,
                    hardirq_ns: 1_000_000,
                    ..Default::default()
                }],
                ..Default::default()
            }
        })
        .collect();
    let total = ios * n as u64;
    app.count = total;
    app.sum_ns = (queue + device + software) * total as f64;
    qh.count = total;
    qh.sum_ns = queue * total as f64;
    dh.count = total;
    dh.sum_ns = device * total as f64;
    // One bucket around each mean, so the distributions have a shape to draw.
    let around = |mean: f64| [(mean * 0.9) as u64, (mean * 1.1) as u64, total];
    app.buckets = vec![around(queue + device + software)];
    qh.buckets = vec![around(queue)];
    dh.buckets = vec![around(device)];
    p.stages.app = app;
    p.stages.queue = Some(qh);
    p.stages.device = Some(dh);
    p.results.read.ios = total;
    p.results.measured_s = n as f64;
    p.capabilities = Some(Default::default());
    p.cpus = vec![CpuLoad {
        cpu: 0,
        hardirq_ns: 1_000_000 * n as u64,
        ..Default::default()
    }];
    p.probe_seconds = Some(n as f64);
    p
}

/// A histogram of `count` values all near `mean`, with a tail bucket at `tail` holding
/// `tail_count` of them.
fn hist(mean: f64, count: u64, tail: f64, tail_count: u64) -> Histogram {
    let body = count - tail_count;
    let mut buckets = vec![[(mean * 0.9) as u64, (mean * 1.1) as u64, body]];
    if tail_count > 0 {
        buckets.push([(tail * 0.95) as u64, (tail * 1.05) as u64, tail_count]);
    }
    Histogram {
        count,
        sum_ns: mean * body as f64 + tail * tail_count as f64,
        min_ns: None,
        max_ns: None,
        buckets,
        sum_sq_ns: None,
    }
}

/// A profile of `runs`, each (app mean, device mean, IOPS, app p99.9 tail) with the queue
/// at 2 µs: one interval per run, so its verdicts can only come from runs.
fn with_runs(runs: &[(f64, f64, f64, f64)]) -> Profile {
    let mut p = synthetic(2_000.0, 1.0, 1.0, 0.0, 1);
    p.intervals.clear();
    p.runs = runs
        .iter()
        .enumerate()
        .map(|(k, &(app, device, iops, tail))| {
            let ios = (iops * 10.0) as u64;
            RunRecord {
                run: k as u32 + 1,
                measured_s: 10.0,
                read_ios: ios,
                stages: crate::model::stages::Stages {
                    app: hist(app, ios, tail, ios / 500),
                    queue: Some(hist(2_000.0, ios, 2_000.0, 0)),
                    device: Some(hist(device, ios, device, 0)),
                    ..Default::default()
                },
                complete: true,
                ..Default::default()
            }
        })
        .collect();
    p
}

/// `n` runs around `app` (ns), IOPS around `iops`, spread ±`noise` (a fraction) in a fixed
/// pattern.
pub(crate) fn noisy_runs(n: usize, app: f64, iops: f64, noise: f64, tail: f64) -> Profile {
    let pattern = [0.0, 1.0, -1.0, 0.5, -0.5, 0.8, -0.8, 0.2];
    with_runs(
        &(0..n)
            .map(|k| {
                let j = 1.0 + noise * pattern[k % pattern.len()];
                (app * j, (app - 100_000.0) * j, iops / j, tail * j)
            })
            .collect::<Vec<_>>(),
    )
}

#[test]
fn counts_near_the_top_of_u64_in_a_profile_do_not_overflow_the_diff() {
    let mut p: Profile =
        serde_json::from_str(include_str!("../../../tests/data/minimal-profile.json")).unwrap();
    p.results.read.ios = 2;
    p.results.write.ios = u64::MAX - 1;
    for i in &mut p.intervals {
        i.read_ios = u64::MAX;
        i.write_ios = u64::MAX;
    }
    let d = diff(&p, &p);
    assert!(d.spec_differences.is_empty());
}

#[test]
fn waterfall_decomposes_the_gap_exactly() {
    // Every request of A has a 20 µs completion stage, half of B's a 60 µs one: taken out
    // of their device time, so app latency is as before.
    let a = with_completion(
        synthetic(2_000.0, 300_000.0, 100_000.0, 5_000.0, 10),
        20_000.0,
        1.0,
    );
    let b = with_completion(
        synthetic(2_000.0, 800_000.0, 110_000.0, 5_000.0, 10),
        60_000.0,
        0.5,
    );
    let d = diff(&a, &b);
    let w = &d.waterfall;
    let gap = w.app.delta.unwrap();
    assert!((gap - 510_000.0).abs() < 1.0, "{gap}");
    let parts: f64 = w.stages.iter().map(|r| r.delta.unwrap()).sum();
    assert!(
        (parts - gap).abs() < 1e-6,
        "Δqueue + Δdevice + Δcompletion + Δsoftware = Δapp"
    );
    let completion = stage(&d, BreakdownPart::Completion).delta.unwrap();
    assert!(
        (completion - 10_000.0).abs() < 1e-6,
        "per request: 30 - 20 µs, {completion}"
    );
    let shares: f64 = w.stages.iter().map(|r| r.share.unwrap()).sum();
    assert!((shares - 1.0).abs() < 1e-9);
    // One run a side: found within the run, provisional.
    let device = stage(&d, BreakdownPart::Device);
    assert_eq!(device.verdict, Verdict::WithinRuns);
    assert!((device.share.unwrap() - 490.0 / 510.0).abs() < 1e-9);
    assert_eq!(d.verdict, Some(BreakdownPart::Device));
    let msr = d.row(MetricId::MsrExitsPerIo).unwrap();
    assert_eq!(
        msr.verdict,
        Verdict::NotMeasured,
        "MSR writes are not in these profiles"
    );
    assert!(
        w.evidence.iter().all(|r| r.share.is_none()),
        "host-wide figures are evidence, not shares of the gap"
    );
    // Without a completion stage on either side, software takes what it would have.
    let d = diff(
        &synthetic(2_000.0, 300_000.0, 100_000.0, 5_000.0, 10),
        &synthetic(2_000.0, 800_000.0, 110_000.0, 5_000.0, 10),
    );
    assert_eq!(
        stage(&d, BreakdownPart::Completion).verdict,
        Verdict::NotMeasured
    );
    assert!((stage(&d, BreakdownPart::Software).delta.unwrap() - 10_000.0).abs() < 1e-6);
}

#[test]
fn a_side_without_the_completion_stage_compares_device_to_completion_on_both() {
    // A splits 20 µs of each request's 300 µs into completion; B's device has no known
    // queue IRQ. The same device either way: device must not look 20 µs faster on A.
    let a = with_completion(
        synthetic(2_000.0, 300_000.0, 100_000.0, 5_000.0, 10),
        20_000.0,
        1.0,
    );
    let b = synthetic(2_000.0, 300_000.0, 100_000.0, 5_000.0, 10);
    for (d, lacking) in [(diff(&a, &b), Hosts::B), (diff(&b, &a), Hosts::A)] {
        let device = stage(&d, BreakdownPart::Device);
        assert!(device.delta.unwrap().abs() < 1.0, "{device:?}");
        assert_eq!(
            stage(&d, BreakdownPart::Completion).verdict,
            Verdict::NotMeasured
        );
        assert!(
            d.warnings.contains(&Warning::CompletionFolded(lacking)),
            "{:?}",
            d.warnings
        );
        assert!(d
            .tails
            .iter()
            .filter(|r| matches!(
                r.metric,
                MetricId::Tail {
                    stage: Stage::Device,
                    ..
                }
            ))
            .all(|r| r.a.is_none()));
    }
    // Both split: nothing folded, no warning.
    let d = diff(&a, &a);
    assert_eq!(
        stage(&d, BreakdownPart::Completion).verdict,
        Verdict::Equivalent
    );
    assert!(!d
        .warnings
        .iter()
        .any(|w| matches!(w, Warning::CompletionFolded(_))));
}

/// The same background (timer interrupts, MSR writes) on both hosts and the same cost per
/// I/O above it: per I/O, B doing half the I/Os carries twice A's share of background. Above
/// each run's idle baseline the rows agree; without the baselines they do not.
#[test]
fn host_wide_figures_per_io_are_compared_above_the_idle_host() {
    let with_background = |iops: f64| {
        let mut p = noisy_runs(5, 100_000.0, iops, 0.02, 300_000.0);
        for r in &mut p.runs {
            let (secs, ios) = (r.measured_s, r.ios());
            r.probe_seconds = Some(secs);
            // 50 ms/s of hard-IRQ time and 600 MSR writes/s idle, plus 1 µs and 0.1 per I/O.
            r.hardirq_ns = Some((0.05e9 * secs + 1_000.0 * ios) as u64);
            r.msr_writes = Some((600.0 * secs + 0.1 * ios) as u64);
            r.idle = Some(IdleBaseline {
                seconds: 1.0,
                hardirq_ns: Some(50_000_000),
                softirq_ns: None,
                ipis_sent: None,
                msr_writes: Some(600),
                hypervisor: None,
            });
        }
        p
    };
    let (a, b) = (with_background(10_000.0), with_background(5_000.0));
    let row = |d: &ProfileDiff, metric: MetricId| d.row(metric).unwrap().clone();
    for d in [diff_apart(&a, &b), diff_apart(&b, &a)] {
        assert!(d.above_idle);
        let hardirq = row(&d, MetricId::HardirqPerIo);
        assert!((hardirq.a.unwrap() - 1_000.0).abs() < 20.0, "{hardirq:?}");
        assert_eq!(hardirq.verdict, Verdict::Equivalent, "{hardirq:?}");
        let msr = row(&d, MetricId::MsrExitsPerIo);
        assert_eq!(msr.verdict, Verdict::Equivalent, "{msr:?}");
    }
    // An older profile on one side: both compared as before, and B's background shows.
    let mut old = b.clone();
    for r in &mut old.runs {
        r.idle = None;
    }
    let d = diff_apart(&a, &old);
    assert!(!d.above_idle);
    let hardirq = row(&d, MetricId::HardirqPerIo);
    assert_eq!(hardirq.verdict, Verdict::Significant, "{hardirq:?}");
    assert!(hardirq.b.unwrap() > 1.5 * hardirq.a.unwrap(), "{hardirq:?}");
}

#[test]
fn the_host_wide_rows_are_judged_as_one_family_at_a_higher_confidence() {
    // B 0.15 above A on the log scale, SE ≈ 0.036 with 5 + 5 runs: the interval's low end
    // 0.15 − 2.31 SE lies past the smallest effect ln 1.05 = 0.049 at t(0.975, 8) = 2.31, and
    // 0.15 − 3.36 SE short of it at t(0.995, 8) = 3.36.
    let spread = [-2.0, -1.0, 0.0, 1.0, 2.0].map(|k: f64| k * 0.0357);
    let a: Vec<f64> = spread.iter().map(|x| 1000.0 * x.exp()).collect();
    let b: Vec<f64> = spread.iter().map(|x| 1000.0 * (0.15 + x).exp()).collect();
    let opts = DiffOptions::default();
    let at = |confidence| {
        let points = (1000.0, 1000.0 * 0.15f64.exp());
        let how = Judging {
            basis: Basis::Runs,
            one_session: false,
            opts: &opts,
            confidence,
        };
        judge(&a, &b, points, Scale::Ratio, 1000.0, how).verdict
    };
    assert_eq!(at(CONFIDENCE), Verdict::Significant);
    assert_eq!(at(0.99), Verdict::Inconclusive);
    let d = diff(
        &noisy_runs(5, 100_000.0, 10_000.0, 0.02, 300_000.0),
        &noisy_runs(5, 100_000.0, 10_000.0, 0.02, 300_000.0),
    );
    let host_wide = |r: &&Row| HOST_WIDE.contains(&r.metric);
    assert_eq!(d.waterfall.evidence.iter().filter(host_wide).count(), 5);
    for r in d.waterfall.rows().chain(&d.throughput) {
        let want = if host_wide(&r) { 0.99 } else { CONFIDENCE };
        assert!(
            (r.confidence - want).abs() < 1e-12,
            "{:?}: {}",
            r.metric,
            r.confidence
        );
    }
    // The stages' tails likewise (eight rows: 1 − 5%/8); the app's tails are at 95%.
    assert_eq!(STAGE_TAILS, 8);
    for r in &d.tails {
        let want = if matches!(
            r.metric,
            MetricId::Tail {
                stage: Stage::App,
                ..
            }
        ) {
            CONFIDENCE
        } else {
            1.0 - 0.05 / 8.0
        };
        assert!(
            (r.confidence - want).abs() < 1e-12,
            "{:?}: {}",
            r.metric,
            r.confidence
        );
    }
}

#[test]
fn one_run_per_host_says_between_run_noise_is_unknown() {
    let a = synthetic(2_000.0, 300_000.0, 100_000.0, 20_000.0, 10);
    let b = synthetic(2_000.0, 301_000.0, 99_500.0, 20_000.0, 10);
    let d = diff(&a, &b);
    assert_eq!(d.basis, Basis::Batches);
    assert!(
        d.warnings.contains(&Warning::OneRun(Hosts::Both)),
        "{:?}",
        d.warnings
    );
    for r in d.waterfall.rows().chain(&d.throughput) {
        assert_ne!(r.verdict, Verdict::Significant, "{:?}", r.metric);
    }
    assert!(
        d.tails.iter().all(|r| r.verdict != Verdict::Significant),
        "tails are not judged from one run"
    );
    assert_eq!(d.verdict, None);
}

/// `p` recorded `minutes` later.
pub(crate) fn later(mut p: Profile, minutes: u64) -> Profile {
    p.run.started_unix_ms += minutes * 60_000;
    p.run.ended_unix_ms += minutes * 60_000;
    p
}

/// A clear gap found in one recording a host holds between those two sessions only: it is
/// provisional, named so, and gates nothing; the same runs recorded apart are judged, and so
/// are two recordings over the same time (a fleet's hosts read from Prometheus).
#[test]
fn a_difference_in_one_recording_a_host_is_provisional() {
    let a = noisy_runs(3, 400_000.0, 10_000.0, 0.02, 2e6);
    let b_meanwhile = noisy_runs(3, 480_000.0, 8_300.0, 0.02, 2e6);
    let b = later(b_meanwhile.clone(), 1);
    let d = diff(&a, &b);
    assert!(d.warnings.contains(&Warning::OneSession));
    assert_eq!(d.basis, Basis::Runs);
    assert_eq!(d.waterfall.app.verdict, Verdict::OneSession);
    assert!(d.waterfall.app.verdict.found_a_difference());
    assert!(!d.b_slower() && !d.any_significant());
    let apart = diff_apart(&a, &b);
    assert_eq!(apart.waterfall.app.verdict, Verdict::Significant);
    assert!(apart.b_slower());
    // Either host recorded twice: its runs span sessions, and the diff judges.
    let again = noisy_runs(3, 400_000.0, 10_000.0, 0.02, 2e6);
    let d = diff_hosts(&[&a, &again], &[&b], &DiffOptions::default());
    assert_eq!(d.waterfall.app.verdict, Verdict::Significant);
    let at_once = diff(&a, &b_meanwhile);
    assert_eq!(at_once.waterfall.app.verdict, Verdict::Significant);
    assert!(!at_once.warnings.contains(&Warning::OneSession));
}

/// Runs recorded back to back share their stretch of the machine's time: with one recording a
/// side the diff says so; with a second recording of either host it does not.
#[test]
fn one_recording_per_host_is_named_one_session() {
    let a = noisy_runs(3, 100_000.0, 10_000.0, 0.02, 300_000.0);
    let b = later(noisy_runs(3, 100_000.0, 10_000.0, 0.02, 300_000.0), 1);
    assert!(diff(&a, &b).warnings.contains(&Warning::OneSession));
    let again = noisy_runs(3, 100_000.0, 10_000.0, 0.02, 300_000.0);
    let d = diff_hosts(&[&a, &again], &[&b], &DiffOptions::default());
    assert!(
        !d.warnings.contains(&Warning::OneSession),
        "{:?}",
        d.warnings
    );
    let single = synthetic(2_000.0, 300_000.0, 100_000.0, 20_000.0, 10);
    let d = diff(&single, &single);
    assert!(
        !d.warnings.contains(&Warning::OneSession),
        "one run: {:?}",
        d.warnings
    );
}

#[test]
fn a_certain_difference_smaller_than_the_smallest_effect_is_equivalent() {
    // 0.5 µs on a 400 µs app latency with no jitter: a real difference, but not one of
    // interest at ±5%.
    let a = synthetic(2_000.0, 300_000.0, 100_000.0, 0.0, 10);
    let b = synthetic(2_000.0, 300_500.0, 100_000.0, 0.0, 10);
    let d = diff(&a, &b);
    assert_eq!(d.waterfall.app.verdict, Verdict::Equivalent);
    assert_eq!(
        stage(&d, BreakdownPart::Device).verdict,
        Verdict::Equivalent
    );
    let strict = diff_hosts(&[&a], &[&b], &DiffOptions { min_effect: 0.001 });
    assert_eq!(
        stage(&strict, BreakdownPart::Device).verdict,
        Verdict::WithinRuns,
        "0.17% is found (within the run) when 0.1% is of interest"
    );
}

#[test]
fn an_eight_percent_gap_over_five_runs_is_significant_both_ways_round() {
    // The motivating case: IOPS −8%, mean latency +9%, with 2% run-to-run noise.
    let a = noisy_runs(5, 400_000.0, 10_000.0, 0.02, 2e6);
    let b = noisy_runs(5, 436_000.0, 9_200.0, 0.02, 2e6);
    let d = diff_apart(&a, &b);
    assert_eq!(d.basis, Basis::Runs);
    let (app, iops) = (&d.waterfall.app, &d.throughput[0]);
    assert_eq!(app.verdict, Verdict::Significant);
    assert!((app.effect.unwrap() - 0.09).abs() < 0.005, "{app:?}");
    assert!(app.effect_low.unwrap() > 0.0 && app.effect_high.unwrap() > 0.09);
    assert_eq!(iops.verdict, Verdict::Significant);
    assert!((iops.effect.unwrap() + 0.08).abs() < 0.005, "{iops:?}");
    assert_eq!(d.verdict, Some(BreakdownPart::Device));
    // Swapped, every row mirrors: the same verdict, the inverse ratio.
    let back = diff_apart(&b, &a);
    for (x, y) in d.rows().zip(back.rows()) {
        assert_eq!(x.metric, y.metric);
        assert_eq!(x.verdict, y.verdict, "{:?}", x.metric);
        if let (Some(e), Some(f), Scale::Ratio) = (x.effect, y.effect, x.scale) {
            assert!(((1.0 + e) * (1.0 + f) - 1.0).abs() < 1e-9, "{:?}", x.metric);
        }
    }
}

/// `p`'s runs with NVMe queues: queue id -> mean command latency (ns), 1,000 commands each,
/// spread ±2% across the runs.
pub(crate) fn with_nvme(mut p: Profile, queues: &[(u16, f64)]) -> Profile {
    let pattern = [0.0, 1.0, -1.0, 0.5, -0.5];
    for (k, run) in p.runs.iter_mut().enumerate() {
        run.nvme_queues = queues
            .iter()
            .map(|&(qid, mean)| crate::model::devices::NvmeQueueRun {
                qid,
                count: 1_000,
                sum_ns: (mean * (1.0 + 0.02 * pattern[k % pattern.len()]) * 1_000.0) as u64,
            })
            .collect();
    }
    p
}

/// NVMe command latency is compared per queue id both hosts used, the queues as one family,
/// over runs only (one run a side gives no interval), and it is no stage of the mean's gap.
#[test]
fn nvme_queues_both_hosts_used_are_judged_queue_by_queue() {
    let base = || noisy_runs(5, 400_000.0, 10_000.0, 0.02, 2e6);
    let a = with_nvme(base(), &[(1, 80_000.0), (2, 80_000.0), (3, 80_000.0)]);
    let b = with_nvme(base(), &[(1, 80_000.0), (2, 240_000.0), (4, 80_000.0)]);
    let d = diff_apart(&a, &b);
    let qids: Vec<_> = d.nvme_queues.iter().map(|r| r.metric).collect();
    assert_eq!(
        qids,
        [MetricId::NvmeCommandMean(1), MetricId::NvmeCommandMean(2)],
        "only the queues both used"
    );
    let (same, slower) = (&d.nvme_queues[0], &d.nvme_queues[1]);
    assert_eq!(same.verdict, Verdict::Equivalent, "{same:?}");
    assert_eq!(slower.verdict, Verdict::Significant, "{slower:?}");
    assert!((slower.effect.unwrap() - 2.0).abs() < 0.05, "{slower:?}");
    assert!(slower.confidence > CONFIDENCE, "judged as a family of two");
    assert_eq!(slower.share, None);
    assert_eq!(
        d.verdict, None,
        "the queues are evidence, not a stage of the mean"
    );
    // One run a side: a point each, no interval.
    let one = |p: &Profile| {
        let mut p = p.clone();
        p.runs.truncate(1);
        p
    };
    let d = diff(&one(&a), &one(&b));
    assert_eq!(d.nvme_queues[1].verdict, Verdict::InsufficientData);
    // A host without NVMe: no row.
    let d = diff(&base(), &b);
    assert!(d.nvme_queues.is_empty());
}

#[test]
fn a_noisy_a_a_pair_is_never_significant_and_says_how_many_runs_would_resolve_it() {
    // Same host, 8% run-to-run noise, alternating pattern shifted between the sides.
    let a = noisy_runs(5, 400_000.0, 10_000.0, 0.08, 2e6);
    let mut b = noisy_runs(6, 400_000.0, 10_000.0, 0.08, 2e6);
    b.runs.remove(0);
    let d = diff(&a, &b);
    for r in d.waterfall.rows().chain(&d.throughput) {
        assert_ne!(r.verdict, Verdict::Significant, "{:?}", r.metric);
    }
    let app = &d.waterfall.app;
    assert_eq!(app.verdict, Verdict::Inconclusive, "{app:?}");
    let n = app.runs_needed.expect("runs basis says how many runs");
    assert!((6..1000).contains(&n), "{n}");
}

#[test]
fn a_tail_that_grew_eightfold_is_significant_while_the_mean_barely_moves() {
    // 0.2% of I/Os: 2 ms on A, 16 ms on B. p99.9 moves 8x; the mean ~7%.
    let a = noisy_runs(5, 400_000.0, 10_000.0, 0.01, 2e6);
    let b = noisy_runs(5, 400_000.0, 10_000.0, 0.01, 16e6);
    let d = diff_apart(&a, &b);
    let app_tail = |percentile| {
        d.row(MetricId::Tail {
            stage: Stage::App,
            percentile,
        })
        .unwrap()
    };
    let tail = app_tail(99.9);
    assert_eq!(tail.verdict, Verdict::Significant, "{tail:?}");
    assert!(tail.effect.unwrap() > 5.0, "{tail:?}");
    assert_ne!(
        app_tail(99.0).verdict,
        Verdict::Significant,
        "the p99 did not move"
    );
    // Only the app's tail moved: no stage is named as the one whose tail moved.
    assert!(d.tails_judged());
    assert_eq!(d.tail_mover, None);
}

/// The stage named as the one whose tail moved most is chosen among the significant tails,
/// at either percentile: a device whose p99.9 grew eightfold, not a p99 that wandered.
#[test]
fn the_tail_that_moved_most_is_a_significant_one_at_any_percentile() {
    let slow_device_tail = |mut p: Profile, tail: f64| {
        for r in &mut p.runs {
            let ios = r.read_ios;
            let device = r.stages.device.as_ref().unwrap().mean_ns().unwrap();
            r.stages.device = Some(hist(device, ios, tail, ios / 500));
        }
        p
    };
    let a = slow_device_tail(noisy_runs(5, 400_000.0, 10_000.0, 0.01, 2e6), 2e6);
    let b = slow_device_tail(noisy_runs(5, 400_000.0, 10_000.0, 0.01, 16e6), 16e6);
    let d = diff_apart(&a, &b);
    let mover = d.tail_mover.expect("the device's tail moved");
    assert_eq!((mover.stage, mover.percentile), (Stage::Device, 99.9));
    assert!(mover.delta_ns > 0.0);
}

#[test]
fn a_run_is_cut_into_about_root_n_batches_of_consecutive_intervals() {
    let sizes = |n: usize| -> Vec<usize> {
        let p = synthetic(1.0, 1.0, 1.0, 0.0, n);
        batches_of(&p.intervals).iter().map(Vec::len).collect()
    };
    assert_eq!(sizes(1), [1], "one interval: one batch, no spread");
    assert_eq!(sizes(5), [2, 3]);
    assert_eq!(sizes(10), [3, 3, 4]);
    assert_eq!(sizes(100), [10; 10]);
    let p = synthetic(1.0, 1.0, 1.0, 0.0, 7);
    let order: Vec<u64> = batches_of(&p.intervals)
        .concat()
        .iter()
        .map(|i| i.index)
        .collect();
    assert_eq!(order, (0..7).collect::<Vec<_>>(), "consecutive, none lost");
}

#[test]
fn a_version_1_profile_diffs_as_one_run() {
    let v1: Profile =
        serde_json::from_str(include_str!("../../../tests/data/minimal-profile.json")).unwrap();
    assert!(v1.runs.is_empty());
    let reps = v1.replicates();
    assert_eq!(reps.len(), 1);
    assert_eq!(reps[0].1.len(), v1.intervals.len());
    let d = diff(&v1, &noisy_runs(3, 400_000.0, 10_000.0, 0.01, 2e6));
    assert_eq!((d.runs_a, d.runs_b, d.basis), (1, 3, Basis::Batches));
}

#[test]
fn different_workloads_are_named() {
    let a = synthetic(1.0, 1.0, 1.0, 0.0, 3);
    let mut b = a.clone();
    b.workload.effective_spec = b.workload.effective_spec.replace("qd = 32", "qd = 1");
    let toml = |v: &str| Some(SpecValue::Toml(v.into()));
    assert_eq!(
        spec_differences(&a, &b),
        [SpecDifference {
            key: SpecKey::Workload("qd"),
            a: toml("32"),
            b: toml("1"),
        }]
    );
    assert!(spec_differences(&a, &a).is_empty());
}

/// A kv profile's effective spec as `record` writes it, after `edit`.
fn kv_profile(edit: impl FnOnce(&mut virtgap_workloads::spec::WorkloadSpec)) -> Profile {
    let mut spec = virtgap_workloads::spec::load("kv-act").unwrap().spec;
    spec.workers = 2;
    edit(&mut spec);
    let mut p = synthetic(1.0, 1.0, 1.0, 0.0, 3);
    p.workload.effective_spec = spec.to_toml();
    p
}

#[test]
fn kv_profiles_differ_by_their_load_not_by_their_hosts_thread_count() {
    let one_x = kv_profile(|_| {});
    let same_on_a_bigger_host = kv_profile(|s| s.workers = 64);
    assert!(
        spec_differences(&one_x, &same_on_a_bigger_host).is_empty(),
        "workers is resolved per host"
    );
    let thirty_x = kv_profile(|s| s.kv.as_mut().unwrap().x = Some(30));
    let load = |reads_per_s, writes_per_s| {
        Some(SpecValue::KvLoad {
            reads_per_s,
            writes_per_s,
        })
    };
    assert_eq!(
        spec_differences(&one_x, &thirty_x),
        [SpecDifference {
            key: SpecKey::KvLoad,
            a: load(2000, 1000),
            b: load(60000, 30000),
        }]
    );
    let written_as_rates = kv_profile(|s| {
        let k = s.kv.as_mut().unwrap();
        (k.x, k.read_rps, k.write_rps) = (None, Some(2000), Some(1000));
    });
    assert!(
        spec_differences(&one_x, &written_as_rates).is_empty(),
        "the same load however it was asked for"
    );
    let bigger_records = kv_profile(|s| {
        s.kv.as_mut().unwrap().record_bytes = virtgap_workloads::spec::ByteSize(4096);
    });
    let differences = spec_differences(&one_x, &bigger_records);
    assert_eq!(differences.len(), 1, "{differences:?}");
    assert_eq!(
        differences[0].key,
        SpecKey::Kv("record_bytes"),
        "{differences:?}"
    );
}

#[test]
fn a_target_device_no_host_lists_is_not_a_confounder_unless_they_differ() {
    let mut a = synthetic(1.0, 1.0, 1.0, 0.0, 3);
    a.target.device = Some("loop0".into());
    let b = a.clone();
    assert_eq!(confounders(&a, &b), []);
    let mut b = a.clone();
    b.target.device = Some("md0".into());
    assert_eq!(
        confounders(&a, &b),
        [Confounder::Differs {
            what: HostTrait::TargetDevice,
            a: Setting::Text("loop0".into()),
            b: Setting::Text("md0".into()),
        }]
    );
}

#[test]
fn host_differences_are_listed_as_confounders() {
    let a = synthetic(1.0, 1.0, 1.0, 0.0, 3);
    let mut b = a.clone();
    b.host.cpus = 72;
    b.host.clocksource = Some("xen".into());
    let c = diff(&a, &b).confounders;
    assert!(
        c.contains(&Confounder::Differs {
            what: HostTrait::CpuCount,
            a: Setting::Count(2),
            b: Setting::Count(72),
        }),
        "{c:?}"
    );
    assert!(
        c.contains(&Confounder::Differs {
            what: HostTrait::Clocksource,
            a: Setting::Text("tsc".into()),
            b: Setting::Text("xen".into()),
        }),
        "{c:?}"
    );
}

#[test]
fn queue_stages_that_start_at_different_points_are_flagged() {
    use virtgap_probes::attach::AttachOutcome;
    use virtgap_probes::{AttachKind, CapabilityReport, Family, FamilyReport};
    let with_block = |bio_entry: bool| {
        let mut p = synthetic(1.0, 1.0, 1.0, 0.0, 3);
        let hook = |tracepoint: &str, attached: bool| AttachOutcome {
            tracepoint: tracepoint.into(),
            attached: attached.then_some(AttachKind::Fentry),
            reason: (!attached).then(|| "fentry: refused".into()),
        };
        p.capabilities = Some(CapabilityReport {
            families: vec![FamilyReport {
                family: Family::Block,
                unavailable: None,
                tracepoints: vec![
                    hook("block_rq_issue", true),
                    hook("submit_bio_noacct", bio_entry),
                ],
                fallback: None,
            }],
            ..Default::default()
        });
        p
    };
    let flagged = |a: &Profile, b: &Profile| {
        diff(a, b).warnings.into_iter().find_map(|w| match w {
            Warning::QueueStart(split) => Some(split),
            _ => None,
        })
    };
    let (entry, request) = (with_block(true), with_block(false));
    assert_eq!(flagged(&entry, &request), Some(QueueStartSplit::EntryOnA));
    assert_eq!(flagged(&request, &entry), Some(QueueStartSplit::EntryOnB));
    assert_eq!(flagged(&entry, &entry), None);
    assert_eq!(flagged(&request, &request), None);
    // No hook, but block_bio_remap noted every request's bio (a partition's): the same start.
    let mut remapped = with_block(false);
    let requests = remapped.stages.queue.as_ref().unwrap().count;
    assert!(requests > 0);
    remapped.block = Some(crate::model::profile::BlockCounts {
        from_bio_entry: Some(requests),
        ..Default::default()
    });
    assert_eq!(
        remapped.queue_start(),
        Some(QueueStart::BioEntry { remap: true })
    );
    assert_eq!(flagged(&entry, &remapped), None);
    assert!(flagged(&remapped, &request).is_some());
    // Half of them: a mixed start, not the bio's entry.
    remapped.block.as_mut().unwrap().from_bio_entry = Some(requests / 2);
    assert_eq!(
        remapped.queue_start(),
        Some(QueueStart::Mixed {
            from_entry: requests / 2,
            requests
        })
    );
    assert!(flagged(&entry, &remapped).is_some());
    // A profile from before the count: at the request.
    remapped.block.as_mut().unwrap().from_bio_entry = None;
    assert_eq!(remapped.queue_start(), Some(QueueStart::Request));
    // Without the block probe there is no queue stage to compare.
    let bare = synthetic(1.0, 1.0, 1.0, 0.0, 3);
    assert_eq!(flagged(&bare, &entry), None);
}

#[test]
fn hosts_that_split_an_io_into_different_numbers_of_requests_are_flagged() {
    let a = synthetic(1_000.0, 50_000.0, 5_000.0, 0.0, 3);
    // B's device takes smaller requests: each app I/O became eight.
    let mut b = a.clone();
    b.stages.device.as_mut().unwrap().count *= 8;
    let flagged = |d: &ProfileDiff| {
        d.warnings.iter().find_map(|w| match *w {
            Warning::RequestsPerIo { a, b } => Some((a, b)),
            _ => None,
        })
    };
    let d = diff(&a, &b);
    assert_eq!(flagged(&d), Some((1.0, 8.0)));
    let counted = |requests, ios| Some(RequestsPerIo { requests, ios });
    assert_eq!(d.evidence.a.requests_per_io, counted(3000, 3000));
    assert_eq!(d.evidence.b.requests_per_io, counted(24000, 3000));
    // The same unit on both sides: no warning.
    assert_eq!(flagged(&diff(&a, &a.clone())), None);
    // Without block stages there is nothing to say.
    let mut bare = a.clone();
    bare.stages.device = None;
    let d = diff(&bare, &b);
    assert_eq!(flagged(&d), None);
    assert_eq!(d.evidence.a.requests_per_io, None);
}

/// Five runs of the same load on a host running on `hypervisor` (None: metal), with the
/// hypervisor's mechanisms per run: `(mechanism, uses per I/O, ns per use)` and the sampled CPU
/// time per I/O, and an idle baseline that does a little of each.
pub(crate) fn on_hypervisor(
    hypervisor: virtgap_probes::hypervisor::Hypervisor,
    uses: &[(Mechanism, f64, f64)],
    cpu_per_io: f64,
) -> Profile {
    on_hypervisor_at(hypervisor, uses, cpu_per_io, 300_000.0)
}

/// As [`on_hypervisor`], with a mean app latency of `app_ns`.
pub(crate) fn on_hypervisor_at(
    hypervisor: virtgap_probes::hypervisor::Hypervisor,
    uses: &[(Mechanism, f64, f64)],
    cpu_per_io: f64,
    app_ns: f64,
) -> Profile {
    use crate::model::hypervisor::{HypervisorSection, RunHypervisor};
    use virtgap_probes::hypervisor::Hypervisor as Hv;
    let mut p = noisy_runs(5, app_ns, 5_000.0, 0.02, 900_000.0);
    p.host.hypervisor = hypervisor.name().into();
    p.host.clockevent = Some(match hypervisor {
        Hv::Xen => "xen".into(),
        _ => "lapic-deadline".into(),
    });
    let guest = hypervisor != Hv::None;
    p.hypervisor = Some(HypervisorSection {
        hypervisor,
        seconds: 10.0,
        mechanisms: Vec::new(),
        cpu: None,
    });
    let pattern = [0.0, 0.03, -0.03, 0.02, -0.02];
    for (k, r) in p.runs.iter_mut().enumerate() {
        let ios = r.ios() * (1.0 + pattern[k]);
        r.probe_seconds = Some(10.0);
        let mut figures = RunHypervisor {
            hypervisor: guest.then_some(hypervisor),
            cpu_ns: guest.then_some(cpu_per_io * ios),
            ..RunHypervisor::default()
        };
        for &(m, per_io, ns) in uses.iter().filter(|_| guest) {
            let n = per_io * ios;
            figures.counts.insert(m.name().into(), n as u64);
            figures.times_ns.insert(m.name().into(), n * ns);
        }
        r.hypervisor = Some(figures);
        let mut idle = RunHypervisor {
            hypervisor: guest.then_some(hypervisor),
            cpu_ns: guest.then_some(1_000.0),
            ..RunHypervisor::default()
        };
        for &(m, _, ns) in uses.iter().filter(|_| guest) {
            idle.counts.insert(m.name().into(), 100);
            idle.times_ns.insert(m.name().into(), 100.0 * ns);
        }
        r.idle = Some(IdleBaseline {
            seconds: 1.0,
            hardirq_ns: Some(0),
            softirq_ns: Some(0),
            ipis_sent: None,
            msr_writes: None,
            hypervisor: Some(idle),
        });
    }
    p
}

use virtgap_probes::hypervisor::{Hypervisor as Hv, Mechanism};

/// What a Xen guest's hypervisor block reads like against bare metal: every row says B's
/// figure and that A has no hypervisor, never "equivalent".
#[test]
fn a_xen_guest_against_metal_reads_no_hypervisor_never_equivalent() {
    let xen = [
        (Mechanism::Timer, 0.9, 1_800.0),
        (Mechanism::Ipi, 0.3, 1_500.0),
        (Mechanism::Upcall, 1.2, 900.0),
    ];
    let metal = on_hypervisor(Hv::None, &[], 0.0);
    let guest = on_hypervisor(Hv::Xen, &xen, 4_100.0);
    let d = diff(&metal, &guest);
    assert_eq!(d.hypervisor.a, Some(Hv::None));
    assert_eq!(d.hypervisor.b, Some(Hv::Xen));
    assert!(!d.hypervisor.rows.is_empty());
    for r in &d.hypervisor.rows {
        assert_eq!(r.verdict, Verdict::NoHypervisor, "{:?}", r.metric);
        assert_eq!(r.a, None, "{:?}", r.metric);
    }
    let cpu = d.row(MetricId::HypervisorCpuPerIo).unwrap();
    assert!((cpu.b.unwrap() - 4_100.0).abs() < 100.0, "{cpu:?}");
    assert!(d.confounders.iter().any(|c| matches!(
        c,
        Confounder::Differs {
            what: HostTrait::Clockevent,
            ..
        }
    )));
}

/// A Xen guest 30 µs slower than metal per I/O, 15 µs of which its timer and upcall paths
/// take: every mechanism row carries an interval from the guest's runs, and the hypervisor's
/// time is about half of the gap, with an interval around it that excludes none.
#[test]
fn against_metal_the_hypervisors_time_is_a_share_of_the_gap_with_an_interval() {
    let xen = [
        (Mechanism::Timer, 1.0, 10_000.0),
        (Mechanism::Upcall, 1.0, 5_000.0),
    ];
    let metal = on_hypervisor_at(Hv::None, &[], 0.0, 300_000.0);
    let guest = on_hypervisor_at(Hv::Xen, &xen, 4_100.0, 330_000.0);
    let d = diff_apart(&metal, &guest);
    assert_eq!(d.waterfall.app.verdict, Verdict::Significant);
    for r in &d.hypervisor.rows {
        assert_eq!(r.verdict, Verdict::NoHypervisor, "{:?}", r.metric);
        let (lo, hi) = (r.ci_low.unwrap(), r.ci_high.unwrap());
        let delta = r.delta.unwrap();
        assert!(lo < delta && delta < hi, "{r:?}");
        assert_eq!(delta, r.b.unwrap(), "{r:?}");
    }
    let all = d.row(MetricId::HypervisorTimePerIo).unwrap();
    assert!((all.b.unwrap() - 15_000.0).abs() < 1_000.0, "{all:?}");
    let share = all.share.unwrap();
    assert!((0.4..0.6).contains(&share), "{all:?}");
    let (lo, hi) = (all.share_low.unwrap(), all.share_high.unwrap());
    assert!(lo > 0.0 && lo < share && share < hi, "{all:?}");
    // The same guest against itself: the hypervisor's time moved by nothing told from none.
    let same = diff(&guest, &guest);
    let all = same.row(MetricId::HypervisorTimePerIo).unwrap();
    assert!(
        all.ci_low.unwrap() <= 0.0 && all.ci_high.unwrap() >= 0.0,
        "{all:?}"
    );
    assert_ne!(all.verdict, Verdict::Significant, "{all:?}");
}

/// A path of `p`'s section measured `how`, with a figure.
fn measured(
    what: &str,
    how: crate::model::hypervisor::PathMeasure,
) -> crate::model::hypervisor::PathFigure {
    crate::model::hypervisor::PathFigure {
        what: what.into(),
        how,
        count: Some(1),
        time_ns: Some(1.0),
        state: crate::model::hypervisor::PathState::Measured,
    }
}

/// `p`'s section says `m` was measured by `paths`.
fn measured_by(p: &mut Profile, m: Mechanism, paths: Vec<crate::model::hypervisor::PathFigure>) {
    p.hypervisor
        .as_mut()
        .unwrap()
        .mechanisms
        .push(crate::model::hypervisor::MechanismFigure {
            mechanism: m,
            count: Some(1),
            time_ns: Some(1.0),
            paths,
        });
}

/// A path timed at the kernel function `symbol`.
fn timed_path(symbol: &str) -> crate::model::hypervisor::PathFigure {
    let how = crate::model::hypervisor::PathMeasure::Timed {
        symbol: Some(symbol.into()),
    };
    measured(symbol, how)
}

/// `p`'s section says `m` was timed at `symbol` (the diff compares metal's native time of a
/// mechanism only where the guest timed it at the same function).
fn timed_at(p: &mut Profile, m: Mechanism, symbol: &str) {
    measured_by(p, m, vec![timed_path(symbol)]);
}

/// Metal that timed `uses` natively, as its pv-paths probe does at the generic callers.
fn metal_with_native(uses: &[(Mechanism, f64, f64)], app_ns: f64) -> Profile {
    let mut p = on_hypervisor_at(Hv::Xen, uses, 0.0, app_ns);
    p.host.hypervisor = Hv::None.name().into();
    p.hypervisor.as_mut().unwrap().hypervisor = Hv::None;
    for r in &mut p.runs {
        for hv in r
            .hypervisor
            .iter_mut()
            .chain(r.idle.as_mut().and_then(|i| i.hypervisor.as_mut()))
        {
            hv.hypervisor = Some(Hv::None);
            hv.cpu_ns = None;
        }
    }
    p
}

/// A Xen guest whose timer path is timed at clockevents_program_event, against metal that
/// timed the same function: the timer rows compare both hosts' figures (the guest's excess over
/// the native work, with a Welch interval), the hypervisor's time is the sum of those excesses
/// and of what metal has none of; where the guest timed another function, metal's native time
/// is not the same work and the row is the guest's figure against none.
#[test]
fn against_metal_that_timed_the_same_function_the_native_work_is_subtracted() {
    let native = [(Mechanism::Timer, 2.0, 1_500.0)];
    let xen = [
        (Mechanism::Timer, 2.0, 4_000.0),
        (Mechanism::Upcall, 1.0, 2_000.0),
    ];
    let mut metal = metal_with_native(&native, 300_000.0);
    timed_at(&mut metal, Mechanism::Timer, "clockevents_program_event");
    let mut guest = on_hypervisor_at(Hv::Xen, &xen, 4_100.0, 330_000.0);
    timed_at(&mut guest, Mechanism::Timer, "clockevents_program_event");
    timed_at(&mut guest, Mechanism::Upcall, "xen_evtchn_do_upcall");
    let d = diff_apart(&metal, &guest);
    let near = |x: f64, want: f64| (x - want).abs() < want * 0.05;
    let time = d
        .row(MetricId::MechanismTimePerIo(Mechanism::Timer))
        .unwrap();
    assert!(near(time.a.unwrap(), 3_000.0), "{time:?}");
    assert!(near(time.b.unwrap(), 8_000.0), "{time:?}");
    assert_eq!(time.verdict, Verdict::Significant, "{time:?}");
    let (lo, hi) = (time.ci_low.unwrap(), time.ci_high.unwrap());
    assert!(
        lo < time.delta.unwrap() && time.delta.unwrap() < hi,
        "{time:?}"
    );
    let count = d.row(MetricId::MechanismPerIo(Mechanism::Timer)).unwrap();
    assert_ne!(count.verdict, Verdict::NoHypervisor, "{count:?}");
    assert_ne!(count.verdict, Verdict::Significant, "{count:?}");
    let upcall = d
        .row(MetricId::MechanismTimePerIo(Mechanism::Upcall))
        .unwrap();
    assert_eq!(upcall.verdict, Verdict::NoHypervisor, "{upcall:?}");
    let all = d.row(MetricId::HypervisorTimePerIo).unwrap();
    assert!(near(all.a.unwrap(), 3_000.0), "{all:?}");
    assert!(near(all.delta.unwrap(), 7_000.0), "{all:?}");
    let share = all.share.unwrap();
    assert!((0.15..0.3).contains(&share), "{all:?}");
    // The guest's timer timed where metal timed nothing like it: not the same work.
    let mut elsewhere = on_hypervisor_at(Hv::Xen, &xen, 4_100.0, 330_000.0);
    timed_at(
        &mut elsewhere,
        Mechanism::Timer,
        "xen_vcpuop_set_next_event",
    );
    let d = diff(&metal, &elsewhere);
    for r in &d.hypervisor.rows {
        assert_eq!(r.verdict, Verdict::NoHypervisor, "{:?}", r.metric);
        assert_eq!(r.a, None, "{:?}", r.metric);
    }
    // Metal against itself: its native rows are compared, and nothing moved.
    let same = diff(&metal, &metal);
    assert!(!same.hypervisor.rows.is_empty());
    assert!(same
        .hypervisor
        .rows
        .iter()
        .all(|r| r.verdict != Verdict::Significant && r.verdict != Verdict::NoHypervisor));
}

/// `p`'s section says its IPIs to one CPU were timed at their x2APIC ICR write, and further at
/// `also` (a KVM guest's PV mask hypercall).
fn icr_timed(p: &mut Profile, also: Option<&str>) {
    let icr = crate::model::hypervisor::PathMeasure::MsrWrite { msr: 0x830 };
    let mut paths = vec![measured("x2APIC ICR write", icr)];
    paths.extend(also.map(timed_path));
    measured_by(p, Mechanism::Ipi, paths);
}

/// A KVM guest's IPIs to one CPU, timed from their send to their ICR write's return (the exit
/// inside), against metal that timed the same sends natively: the IPI time row has both hosts'
/// figures and an interval, and the guest's excess is the hypervisor's time. A guest that also
/// timed its PV mask hypercall (which metal has no part of) is still compared; metal whose
/// ICR writes were not timed is not.
#[test]
fn a_kvm_guests_ipi_sends_against_metals_native_sends_give_the_exits_excess() {
    let native = [(Mechanism::Ipi, 0.5, 300.0)];
    let kvm = [(Mechanism::Ipi, 0.5, 8_000.0)];
    let mut metal = metal_with_native(&native, 300_000.0);
    icr_timed(&mut metal, None);
    let near = |x: f64, want: f64| (x - want).abs() < want * 0.05;
    for also in [None, Some("kvm_send_ipi_mask")] {
        let mut guest = on_hypervisor_at(Hv::Kvm, &kvm, 0.0, 310_000.0);
        icr_timed(&mut guest, also);
        let d = diff_apart(&metal, &guest);
        let time = d.row(MetricId::MechanismTimePerIo(Mechanism::Ipi)).unwrap();
        assert!(near(time.a.unwrap(), 150.0), "{time:?}");
        assert!(near(time.b.unwrap(), 4_000.0), "{time:?}");
        assert_eq!(time.verdict, Verdict::Significant, "{time:?}");
        let (lo, hi) = (time.ci_low.unwrap(), time.ci_high.unwrap());
        assert!(
            lo < time.delta.unwrap() && time.delta.unwrap() < hi,
            "{time:?}"
        );
        let all = d.row(MetricId::HypervisorTimePerIo).unwrap();
        assert!(near(all.delta.unwrap(), 3_850.0), "{all:?}");
    }
    // Metal's sends untimed (a kernel before ipi_send_cpu): its ICR writes are not compared.
    let untimed = metal_with_native(&native, 300_000.0);
    let mut guest = on_hypervisor_at(Hv::Kvm, &kvm, 0.0, 310_000.0);
    icr_timed(&mut guest, None);
    let d = diff(&untimed, &guest);
    let time = d.row(MetricId::MechanismTimePerIo(Mechanism::Ipi)).unwrap();
    assert_eq!(
        (time.a, time.verdict),
        (None, Verdict::NoHypervisor),
        "{time:?}"
    );
}

/// On one hypervisor, IPIs that tripled per I/O are the mechanism that moved; the timer, the
/// same on both, is equivalent; and the same host against itself moves nothing.
#[test]
fn the_mechanism_that_moved_is_named_and_the_others_stay_equivalent() {
    let a = on_hypervisor(
        Hv::Kvm,
        &[(Mechanism::Timer, 0.05, 0.0), (Mechanism::Ipi, 0.004, 0.0)],
        50.0,
    );
    let b = on_hypervisor(
        Hv::Kvm,
        &[(Mechanism::Timer, 0.05, 0.0), (Mechanism::Ipi, 0.25, 0.0)],
        50.0,
    );
    let d = diff_apart(&a, &b);
    let ipi = d.row(MetricId::MechanismPerIo(Mechanism::Ipi)).unwrap();
    assert_eq!(ipi.verdict, Verdict::Significant, "{ipi:?}");
    assert!(ipi.effect.unwrap() > 1.0, "{ipi:?}");
    let timer = d.row(MetricId::MechanismPerIo(Mechanism::Timer)).unwrap();
    assert_ne!(timer.verdict, Verdict::Significant, "{timer:?}");
    assert_eq!(d.hypervisor.moved, Some(Mechanism::Ipi));
    let same = diff(&a, &a);
    assert!(same
        .hypervisor
        .rows
        .iter()
        .all(|r| r.verdict != Verdict::Significant));
    assert_eq!(same.hypervisor.moved, None);
}

/// Halts that fell far per I/O (a busier CPU halts less) are judged, but never named as the
/// mechanism that moved: that is a mechanism costing the I/O more, and here none did.
#[test]
fn fewer_halts_are_never_the_mechanism_that_moved() {
    let a = on_hypervisor(
        Hv::Kvm,
        &[(Mechanism::Timer, 0.05, 0.0), (Mechanism::Halt, 0.5, 0.0)],
        50.0,
    );
    let b = on_hypervisor(
        Hv::Kvm,
        &[(Mechanism::Timer, 0.05, 0.0), (Mechanism::Halt, 0.05, 0.0)],
        50.0,
    );
    let d = diff_apart(&a, &b);
    let halts = d.row(MetricId::MechanismPerIo(Mechanism::Halt)).unwrap();
    assert_eq!(halts.verdict, Verdict::Significant, "{halts:?}");
    assert_eq!(d.hypervisor.moved, None);
}

/// One run per host: the hypervisor's rows take their intervals from the run's batches, like
/// every other row (each interval keeps its mechanisms), and say they hold for these runs only.
#[test]
fn one_run_a_side_gives_the_hypervisor_rows_batch_intervals() {
    use crate::model::hypervisor::{HypervisorSection, RunHypervisor};
    let section = |hypervisor| HypervisorSection {
        hypervisor,
        seconds: 16.0,
        mechanisms: Vec::new(),
        cpu: None,
    };
    let mut metal = synthetic(2_000.0, 100_000.0, 20_000.0, 1_000.0, 16);
    metal.hypervisor = Some(section(Hv::None));
    let mut xen = synthetic(2_000.0, 100_000.0, 26_000.0, 1_000.0, 16);
    let mut on_xen = section(Hv::Xen);
    on_xen.mechanisms = vec![crate::model::hypervisor::MechanismFigure {
        mechanism: Mechanism::Upcall,
        count: Some(16_150),
        time_ns: Some(16_150.0 * 5_000.0),
        paths: Vec::new(),
    }];
    xen.hypervisor = Some(on_xen);
    // One upcall of ~5 µs per read (1,000 a second), a little more or less each second.
    for (k, i) in xen.intervals.iter_mut().enumerate() {
        let upcalls = 1_000 + (k as u64 % 3) * 10;
        i.hypervisor = Some(RunHypervisor {
            hypervisor: Some(Hv::Xen),
            counts: BTreeMap::from([("upcall".to_string(), upcalls)]),
            times_ns: BTreeMap::from([("upcall".to_string(), upcalls as f64 * 5_000.0)]),
            cpu_ns: None,
        });
    }
    let d = diff(&metal, &xen);
    assert_eq!(d.basis, Basis::Batches);
    let upcalls = d.row(MetricId::MechanismPerIo(Mechanism::Upcall)).unwrap();
    let (lo, hi) = (upcalls.ci_low.unwrap(), upcalls.ci_high.unwrap());
    assert!(
        0.9 < lo && lo < 1.01 && 1.01 < hi && hi < 1.1,
        "{upcalls:?}"
    );
    let all = d.row(MetricId::HypervisorTimePerIo).unwrap();
    assert!(all.ci_low.is_some() && all.share.is_some(), "{all:?}");
}

/// The IRQ chip of the target's queues is a confounder when the delivery differs (MSI-X
/// through Xen's event channels, or through interrupt remapping), not when only the device's
/// PCI slot does.
#[test]
fn interrupt_delivery_differs_by_chip_not_by_slot() {
    let bare: Profile = serde_json::from_str(include_str!(
        "../../../tests/data/hypervisors/bare-tcg.json"
    ))
    .unwrap();
    let with_chip = |chip: &str| {
        let mut p = bare.clone();
        for d in &mut p.host.block_devices {
            for q in &mut d.queues {
                if let Some(irq) = q.irq.as_mut() {
                    irq.chip = chip.into();
                }
            }
        }
        p
    };
    let delivery = |a: &Profile, b: &Profile| {
        confounders(a, b).into_iter().any(|c| {
            matches!(
                c,
                Confounder::Differs {
                    what: HostTrait::IrqDelivery,
                    ..
                }
            )
        })
    };
    let slot4 = with_chip("PCI-MSIX-0000:00:04.0");
    assert!(!delivery(&slot4, &with_chip("PCI-MSIX-0000:00:05.0")));
    assert!(delivery(&slot4, &with_chip("IR-PCI-MSIX-0000:00:05.0")));
    assert!(delivery(&slot4, &with_chip("xen-pirq-msi-x")));
}
