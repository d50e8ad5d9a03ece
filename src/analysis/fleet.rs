//! A fleet's profiles from what Prometheus scraped of `virtgap serve`: each instance's
//! counters at the boundaries of a time range's slices, turned into one profile per instance
//! whose runs are its slices, so the diff judges a group of hosts from Prometheus as it judges
//! a group of profile files. Every figure is a difference of two cumulative counters (never a
//! `rate()`, which extrapolates); a counter that went down between two boundaries restarted,
//! and counts from zero.

use std::collections::{BTreeMap, BTreeSet};

use virtgap_probes::hypervisor::{Hypervisor, Mechanism};
use virtgap_probes::CapabilityReport;

use crate::model::devices::NvmeQueueRun;
use crate::model::histogram::Histogram;
use crate::model::host::Fingerprint;
use crate::model::hypervisor::RunHypervisor;
use crate::model::profile::{
    DirectionResult, Profile, RunInfo, RunRecord, SelfOverhead, TargetInfo, WorkloadInfo,
    WorkloadResult, SCHEMA_VERSION,
};
use crate::model::stages::Stages;

/// The metrics a fleet diff reads, as one `__name__` pattern.
pub const METRICS_PATTERN: &str = "virtgap_(block_stage|app_latency|wakeup_latency)_seconds_(bucket|sum|count)|virtgap_block_requests_total|virtgap_(hardirq|softirq|msr_counted)_seconds_total|virtgap_ipis_sent_total|virtgap_hypervisor_mechanism_(events|seconds)_total";

/// One series' value at one instant, as Prometheus' query API gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct PromSample {
    /// Every label, `__name__` included.
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl PromSample {
    fn label(&self, key: &str) -> &str {
        self.labels.get(key).map_or("", String::as_str)
    }
}

/// What Prometheus holds of one instance over the range.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetHost {
    /// The `instance` label, and the `job` that scraped it.
    pub instance: String,
    pub job: String,
    /// Its `virtgap_host_info` labels.
    pub info: BTreeMap<String, String>,
    /// The slice boundaries (unix seconds, ascending) and the instance's series at each.
    pub boundaries: Vec<(f64, Vec<PromSample>)>,
}

/// Where a side's figures came from, for the profiles' words.
#[derive(Clone, Copy, Debug)]
pub struct FleetSource<'a> {
    pub url: &'a str,
    pub selector: &'a str,
}

/// Series identity: every label but the bucket bound.
type SeriesKey = Vec<(String, String)>;

/// Each series' increase from one boundary to the next (a restart counts from zero; a series
/// not yet there started at zero; one gone since counts nothing).
fn increases(start: &[PromSample], end: &[PromSample]) -> Vec<PromSample> {
    let key = |s: &PromSample| -> SeriesKey {
        s.labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    // A counter is finite and not negative; anything else (a broken or hostile source) is
    // left out rather than carried into the figures.
    let counter = |s: &&PromSample| s.value.is_finite() && s.value >= 0.0;
    let before: BTreeMap<SeriesKey, f64> = start
        .iter()
        .filter(counter)
        .map(|s| (key(s), s.value))
        .collect();
    end.iter()
        .filter(counter)
        .map(|s| {
            let was = before.get(&key(s)).copied().unwrap_or(0.0);
            let value = if s.value >= was {
                s.value - was
            } else {
                s.value
            };
            PromSample {
                labels: s.labels.clone(),
                value,
            }
        })
        .collect()
}

/// A Prometheus histogram's increases (its `_bucket`, `_sum` and `_count` series named `base`,
/// those whose labels pass `keep`) as one distribution: the buckets of every series kept add up
/// (all share one layout), each as [previous bound, bound) in ns. None when no series is there.
fn histogram(
    increases: &[PromSample],
    base: &str,
    keep: &dyn Fn(&PromSample) -> bool,
) -> Option<Histogram> {
    let named = |suffix: &str| {
        let name = format!("{base}_{suffix}");
        increases
            .iter()
            .filter(move |s| s.label("__name__") == name && keep(s))
    };
    let count: f64 = named("count").map(|s| s.value).sum();
    let mut any = named("count").next().is_some();
    let sum_s: f64 = named("sum").map(|s| s.value).sum();
    // Per series (every label but `le`): its cumulative buckets in bound order.
    let mut series: BTreeMap<SeriesKey, Vec<(f64, f64)>> = BTreeMap::new();
    for s in named("bucket") {
        any = true;
        let Ok(le) = s.label("le").parse::<f64>() else {
            continue;
        };
        let id = s
            .labels
            .iter()
            .filter(|(k, _)| k.as_str() != "le")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        series.entry(id).or_default().push((le, s.value));
    }
    if !any {
        return None;
    }
    let mut by_bounds: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for mut cumulative in series.into_values() {
        cumulative.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut below = (0u64, 0.0);
        for (le, n) in cumulative {
            // Bounds are whole nanoseconds (slot boundaries); +Inf holds the rest.
            let high = if le.is_finite() {
                (le * 1e9).round() as u64
            } else {
                u64::MAX / 2
            };
            let in_bucket = (n - below.1).max(0.0).round() as u64;
            if in_bucket > 0 && high > below.0 {
                *by_bounds.entry((below.0, high - 1)).or_default() += in_bucket;
            }
            below = (high, n.max(below.1));
        }
    }
    Some(Histogram {
        count: count.round() as u64,
        sum_ns: sum_s * 1e9,
        min_ns: None,
        max_ns: None,
        buckets: by_bounds
            .into_iter()
            .map(|((lo, hi), n)| [lo, hi, n])
            .collect(),
        sum_sq_ns: None,
    })
}

/// The sum of the increases of the counter `name` whose labels pass `keep` (None: no series).
fn counter(
    increases: &[PromSample],
    name: &str,
    keep: &dyn Fn(&PromSample) -> bool,
) -> Option<f64> {
    let mut it = increases
        .iter()
        .filter(|s| s.label("__name__") == name && keep(s))
        .peekable();
    it.peek()?;
    Some(it.map(|s| s.value).sum())
}

/// NVMe command latency per queue id, where the exporter labels its queues (`serve
/// --per-queue`; a queue beyond its limit of labels, "other", is left out).
fn nvme_queues(increases: &[PromSample]) -> Vec<NvmeQueueRun> {
    const COUNT: &str = "virtgap_nvme_command_seconds_count";
    let qids: BTreeSet<u16> = increases
        .iter()
        .filter(|s| s.label("__name__") == COUNT)
        .filter_map(|s| s.label("qid").parse().ok())
        .collect();
    qids.into_iter()
        .filter_map(|qid| {
            let label = qid.to_string();
            let on_queue = |s: &PromSample| s.label("qid") == label && data_op(s);
            let count = counter(increases, COUNT, &on_queue)?;
            let sum_s = counter(increases, "virtgap_nvme_command_seconds_sum", &on_queue)?;
            Some(NvmeQueueRun {
                qid,
                count: count.round() as u64,
                sum_ns: (sum_s * 1e9).round() as u64,
            })
        })
        .filter(|q| q.count > 0)
        .collect()
}

/// The reads and writes (the profile's stages are its data I/O's; flushes are apart).
fn data_op(s: &PromSample) -> bool {
    matches!(s.label("op"), "read" | "write")
}

/// One slice of an instance as a run: its stages, requests, host-wide figures and the
/// hypervisor's mechanisms over the slice.
fn slice_run(
    run: u32,
    (start, end): (f64, f64),
    increases: &[PromSample],
    hypervisor: Hypervisor,
) -> RunRecord {
    let stage = |name: &'static str| {
        histogram(increases, "virtgap_block_stage_seconds", &move |s| {
            data_op(s) && s.label("stage") == name
        })
    };
    let requests = |op: &'static str| {
        counter(increases, "virtgap_block_requests_total", &move |s| {
            s.label("op") == op
        })
        .unwrap_or(0.0)
        .round() as u64
    };
    let seconds = end - start;
    let ns = |name: &str| counter(increases, name, &|_| true).map(|s| (s * 1e9).round() as u64);
    let mechanisms = (hypervisor != Hypervisor::None)
        .then(|| mechanisms(increases, hypervisor, seconds))
        .flatten()
        .unwrap_or(RunHypervisor {
            hypervisor: Some(hypervisor),
            ..RunHypervisor::default()
        });
    RunRecord {
        run,
        started_unix_ms: (start * 1000.0) as u64,
        complete: true,
        measured_s: seconds,
        read_ios: requests("read"),
        write_ios: requests("write"),
        stages: Stages {
            app: histogram(increases, "virtgap_app_latency_seconds", &data_op).unwrap_or_default(),
            queue: stage("queue"),
            device: stage("device"),
            completion: stage("completion"),
            wakeup: histogram(increases, "virtgap_wakeup_latency_seconds", &|_| true),
            flush: None,
        },
        hardirq_ns: ns("virtgap_hardirq_seconds_total"),
        softirq_ns: ns("virtgap_softirq_seconds_total"),
        ipis_sent: counter(increases, "virtgap_ipis_sent_total", &|_| true)
            .map(|n| n.round() as u64),
        // The profile's count is the sampler's pauses scaled up; the exported raw count is
        // compared per mechanism below instead.
        msr_writes: None,
        probe_seconds: Some(seconds),
        intervals: 0,
        tail: None,
        idle: None,
        hypervisor: Some(mechanisms),
        nvme_queues: nvme_queues(increases),
    }
}

/// A guest's mechanisms over a slice: calls of the timed paths, plus the MSR writes counted
/// while no sampler ran scaled to the slice, and the time in the timed paths. None when the
/// instance exported none.
fn mechanisms(
    increases: &[PromSample],
    hypervisor: Hypervisor,
    seconds: f64,
) -> Option<RunHypervisor> {
    let counted_s = counter(increases, "virtgap_msr_counted_seconds_total", &|_| true);
    let mut hv = RunHypervisor {
        hypervisor: Some(hypervisor),
        ..RunHypervisor::default()
    };
    let mut any = false;
    for m in Mechanism::ALL {
        let of = |how: &'static str| {
            counter(
                increases,
                "virtgap_hypervisor_mechanism_events_total",
                &move |s| s.label("mechanism") == m.name() && s.label("how") == how,
            )
        };
        let timed = of("timed");
        let written = of("msr_write").and_then(|n| {
            let counted = counted_s.filter(|&c| c > 0.0)?;
            Some(n * seconds / counted)
        });
        if timed.is_some() || written.is_some() {
            any = true;
            let n = timed.unwrap_or(0.0) + written.unwrap_or(0.0);
            hv.counts.insert(m.name().to_string(), n.round() as u64);
        }
        let time = counter(
            increases,
            "virtgap_hypervisor_mechanism_seconds_total",
            &move |s| s.label("mechanism") == m.name(),
        );
        if let Some(t) = time {
            any = true;
            hv.times_ns.insert(m.name().to_string(), t * 1e9);
        }
    }
    any.then_some(hv)
}

/// The fingerprint `virtgap_host_info` carries (the rest of a profile's is not exported).
fn fingerprint(host: &FleetHost) -> Fingerprint {
    let get = |k: &str| {
        host.info
            .get(k)
            .filter(|v| !v.is_empty() && v.as_str() != "unknown")
            .cloned()
    };
    Fingerprint {
        label: get("label"),
        hostname: Some(host.instance.clone()),
        hypervisor: get("hypervisor").unwrap_or_else(|| "unknown".into()),
        platform: get("platform").unwrap_or_else(|| "unknown".into()),
        instance_type: get("instance_type"),
        clocksource: get("clocksource"),
        clockevent: get("clockevent"),
        kernel: get("kernel"),
        cpu_model: get("cpu_model"),
        cpus: get("cpus").and_then(|c| c.parse().ok()).unwrap_or(0),
        cpuid: Default::default(),
        dmi: None,
        sys_hypervisor_type: None,
        available_clocksources: Vec::new(),
        btf: false,
        smt_active: None,
        block_devices: Vec::new(),
    }
}

/// One instance's profile: each slice with requests in it is a run (a slice without any says
/// nothing of the stages), its stages and counts pooled over them. None when no slice had a
/// request.
pub fn host_profile(host: &FleetHost, source: FleetSource<'_>) -> Option<Profile> {
    let hypervisor = Hypervisor::of_name(host.info.get("hypervisor").map_or("", String::as_str));
    let mut runs: Vec<RunRecord> = Vec::new();
    for pair in host.boundaries.windows(2) {
        let ((start, before), (end, after)) = (&pair[0], &pair[1]);
        let run = slice_run(
            runs.len() as u32 + 1,
            (*start, *end),
            &increases(before, after),
            hypervisor,
        );
        if run.read_ios.saturating_add(run.write_ios) > 0 {
            runs.push(run);
        }
    }
    let first = runs.first()?;
    let mut stages = first.stages.clone();
    for r in &runs[1..] {
        stages.app.merge(&r.stages.app);
        stages.merge_probed(&r.stages);
    }
    let measured_s: f64 = runs.iter().map(|r| r.measured_s).sum();
    let direction = |ios: u64| DirectionResult {
        ios,
        iops: ios as f64 / measured_s,
        ..DirectionResult::default()
    };
    let total = |ios: fn(&RunRecord) -> u64| runs.iter().map(ios).fold(0u64, u64::saturating_add);
    let (reads, writes) = (total(|r| r.read_ios), total(|r| r.write_ios));
    let (started, ended) = (
        host.boundaries.first().map_or(0.0, |b| b.0),
        host.boundaries.last().map_or(0.0, |b| b.0),
    );
    let attached = host.info.get("attached").cloned().unwrap_or_default();
    Some(Profile {
        schema_version: SCHEMA_VERSION,
        complete: true,
        run: RunInfo {
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            command_line: Vec::new(),
            started_unix_ms: (started * 1000.0) as u64,
            ended_unix_ms: (ended * 1000.0) as u64,
            interval_s: runs[0].measured_s,
            requested_interval_s: None,
            max_intervals: None,
            complete: true,
        },
        host: fingerprint(host),
        // The figures are the probes' (serve exports nothing else); which tracepoints
        // attached is not on the page.
        capabilities: Some(CapabilityReport {
            notes: vec![format!(
                "read back from Prometheus at {}: the probes' attach report is not exported",
                source.url
            )],
            ..CapabilityReport::default()
        }),
        workload: WorkloadInfo {
            name: "fleet".into(),
            origin: format!(
                "{} at {} ({}), following {}",
                source.selector,
                source.url,
                host.instance,
                if attached.is_empty() {
                    "what serve followed"
                } else {
                    &attached
                }
            ),
            ..WorkloadInfo::default()
        },
        target: TargetInfo {
            description: format!("the disks {} exported", host.instance),
            ..TargetInfo::default()
        },
        results: WorkloadResult {
            read: direction(reads),
            write: direction(writes),
            measured_s,
            ..WorkloadResult::default()
        },
        stages,
        intervals: Vec::new(),
        cpus: Vec::new(),
        probe_seconds: Some(measured_s),
        cpu_pairs: Vec::new(),
        block: None,
        virtualization: None,
        hypervisor: None,
        calibration: None,
        self_overhead: SelfOverhead::default(),
        attached: None,
        kv: None,
        devices: Vec::new(),
        stalls: None,
        runs,
    })
}

/// The slice boundaries of `[start, end]` (unix seconds) every `slice` seconds, the last one
/// at `end` (a shorter last slice rather than time left out).
pub fn boundaries(start: f64, end: f64, slice: f64) -> Vec<f64> {
    let mut out = vec![start];
    let mut t = start + slice;
    while t < end - slice * 1e-6 {
        out.push(t);
        t += slice;
    }
    out.push(end);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(labels: &[(&str, &str)], value: f64) -> PromSample {
        PromSample {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
        }
    }

    /// A device stage's series at one instant: `n` requests of which `slow` took 1–2 ms and
    /// the rest 100–200 µs, summing to `sum_s`.
    fn device_series(n: f64, slow: f64, sum_s: f64) -> Vec<PromSample> {
        let l = |extra: &[(&str, &str)], name: &str| {
            let mut v = vec![
                ("__name__", name),
                ("device", "vda"),
                ("op", "read"),
                ("stage", "device"),
                ("instance", "h:9477"),
            ];
            v.extend_from_slice(extra);
            v.iter()
                .map(|&(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        };
        let s = |labels: Vec<(String, String)>, value| PromSample {
            labels: labels.into_iter().collect(),
            value,
        };
        vec![
            s(
                l(&[("le", "0.0001")], "virtgap_block_stage_seconds_bucket"),
                0.0,
            ),
            s(
                l(&[("le", "0.0002")], "virtgap_block_stage_seconds_bucket"),
                n - slow,
            ),
            s(
                l(&[("le", "0.001")], "virtgap_block_stage_seconds_bucket"),
                n - slow,
            ),
            s(
                l(&[("le", "0.002")], "virtgap_block_stage_seconds_bucket"),
                n,
            ),
            s(
                l(&[("le", "+Inf")], "virtgap_block_stage_seconds_bucket"),
                n,
            ),
            s(l(&[], "virtgap_block_stage_seconds_sum"), sum_s),
            s(l(&[], "virtgap_block_stage_seconds_count"), n),
            s(
                vec![
                    ("__name__".into(), "virtgap_block_requests_total".into()),
                    ("op".into(), "read".into()),
                ],
                n,
            ),
        ]
    }

    #[test]
    fn a_slices_buckets_are_the_difference_of_the_cumulative_counters() {
        let start = device_series(100.0, 0.0, 0.015);
        let end = device_series(300.0, 10.0, 0.015 + 0.03 + 0.015);
        let inc = increases(&start, &end);
        let h = histogram(&inc, "virtgap_block_stage_seconds", &|_| true).unwrap();
        assert_eq!(h.count, 200);
        assert!((h.sum_ns - 45e6).abs() < 1.0, "{}", h.sum_ns);
        assert_eq!(
            h.buckets,
            vec![[100_000, 199_999, 190], [1_000_000, 1_999_999, 10]]
        );
        // A restart between the boundaries: the later values count from zero.
        let restarted = increases(&end, &start);
        let h = histogram(&restarted, "virtgap_block_stage_seconds", &|_| true).unwrap();
        assert_eq!(h.count, 100);
        // Another op's series are not the reads'.
        assert!(
            histogram(&inc, "virtgap_block_stage_seconds", &|s| s.label("op")
                == "write")
            .is_none_or(|h| h.count == 0)
        );
    }

    #[test]
    fn each_slice_with_requests_is_a_run_and_an_empty_one_is_left_out() {
        let host = FleetHost {
            instance: "h:9477".into(),
            job: "vm".into(),
            info: [("hypervisor", "kvm"), ("platform", "kvm"), ("cpus", "2")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            boundaries: vec![
                (0.0, Vec::new()),
                (10.0, device_series(1000.0, 0.0, 0.15)),
                // Nothing happened in the second slice.
                (20.0, device_series(1000.0, 0.0, 0.15)),
                (30.0, device_series(3000.0, 20.0, 0.15 + 0.3 + 0.03)),
            ],
        };
        let source = FleetSource {
            url: "http://prometheus:9090",
            selector: "platform=\"kvm\"",
        };
        let p = host_profile(&host, source).unwrap();
        assert_eq!(p.runs.len(), 2);
        assert_eq!((p.runs[0].read_ios, p.runs[1].read_ios), (1000, 2000));
        assert_eq!(p.runs[1].run, 2);
        assert_eq!(p.runs[1].measured_s, 10.0);
        assert_eq!(p.stages.device.as_ref().unwrap().count, 3000);
        assert_eq!(p.results.read.ios, 3000);
        assert_eq!(p.results.measured_s, 20.0);
        assert_eq!(p.host.platform, "kvm");
        assert_eq!(p.host.cpus, 2);
        // Not exported, so not measured: no stage rather than an empty one.
        assert!(p.stages.queue.is_none() && p.stages.app.count == 0);
        // A KVM guest that exported no mechanism counters: none measured.
        assert!(p.runs[0].hypervisor.as_ref().unwrap().counts.is_empty());
        assert!(p.workload.origin.contains("platform=\"kvm\""));
        let empty = FleetHost {
            boundaries: vec![(0.0, Vec::new()), (10.0, Vec::new())],
            ..host
        };
        assert!(host_profile(&empty, source).is_none());
    }

    #[test]
    fn a_guests_msr_writes_are_scaled_to_the_slice_and_timed_calls_counted_as_they_are() {
        let at = |timed: f64, written: f64, counted: f64, secs: f64| {
            vec![
                sample(
                    &[
                        ("__name__", "virtgap_hypervisor_mechanism_events_total"),
                        ("mechanism", "timer"),
                        ("how", "msr_write"),
                    ],
                    written,
                ),
                sample(
                    &[
                        ("__name__", "virtgap_hypervisor_mechanism_events_total"),
                        ("mechanism", "ipi"),
                        ("how", "timed"),
                    ],
                    timed,
                ),
                sample(
                    &[
                        ("__name__", "virtgap_hypervisor_mechanism_seconds_total"),
                        ("mechanism", "ipi"),
                    ],
                    secs,
                ),
                sample(
                    &[("__name__", "virtgap_msr_counted_seconds_total")],
                    counted,
                ),
            ]
        };
        let inc = increases(&at(10.0, 100.0, 1.0, 0.001), &at(110.0, 900.0, 5.0, 0.003));
        let hv = mechanisms(&inc, Hypervisor::Kvm, 10.0).unwrap();
        // 800 writes in 4 s counted, over a 10 s slice.
        assert_eq!(hv.counts["timer"], 2000);
        assert_eq!(hv.counts["ipi"], 100);
        assert!((hv.times_ns["ipi"] - 2e6).abs() < 1e-3);
        assert!(!hv.times_ns.contains_key("timer"));
    }

    /// A fleet diff's runs have NVMe command latency per queue id where `serve --per-queue`
    /// labelled the queues: reads and writes added up, flushes and "other" left out.
    #[test]
    fn nvme_queues_come_from_the_per_queue_command_series() {
        let at = |reads: f64, read_s: f64, flushes: f64| {
            let mut v = Vec::new();
            for (qid, op, n, secs) in [
                ("1", "read", reads, read_s),
                ("1", "write", 10.0, 0.001),
                ("1", "flush", flushes, flushes),
                ("other", "read", 99.0, 9.0),
            ] {
                let name = |suffix| format!("virtgap_nvme_command_seconds_{suffix}");
                let labels = |name: String| {
                    [
                        ("__name__", name.as_str()),
                        ("device", "nvme0n1"),
                        ("op", op),
                        ("qid", qid),
                    ]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into_iter()
                    .collect()
                };
                v.push(PromSample {
                    labels: labels(name("count")),
                    value: n,
                });
                v.push(PromSample {
                    labels: labels(name("sum")),
                    value: secs,
                });
            }
            v
        };
        let inc = increases(&at(100.0, 0.01, 1.0), &at(1_090.0, 0.109, 3.0));
        let q = nvme_queues(&inc);
        assert_eq!(q.len(), 1, "{q:?}");
        assert_eq!((q[0].qid, q[0].count), (1, 990));
        assert!((q[0].mean_ns().unwrap() - 100_000.0).abs() < 1.0, "{q:?}");
        // Without --per-queue there is no qid label, and no queue.
        assert!(nvme_queues(&[sample(
            &[("__name__", "virtgap_nvme_command_seconds_count")],
            5.0
        )])
        .is_empty());
    }

    #[test]
    fn boundaries_cover_the_range_with_a_shorter_last_slice() {
        assert_eq!(boundaries(0.0, 10.0, 5.0), vec![0.0, 5.0, 10.0]);
        assert_eq!(boundaries(0.0, 11.0, 5.0), vec![0.0, 5.0, 10.0, 11.0]);
        assert_eq!(boundaries(0.0, 3.0, 5.0), vec![0.0, 3.0]);
    }
}
