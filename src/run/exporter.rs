//! The metrics `virtgap serve` exposes, built from the probes' cumulative snapshot: counters
//! stay monotonic and histograms cumulative because every figure is a total since the probes
//! attached. Label sets are bounded per host: queues beyond the first few of a device and IRQs
//! beyond the first [`MAX_IRQ_SERIES`] (cpu, irq) pairs are summed under "other", and a key
//! keeps its label for the life of the process, so no series ever goes backwards.

use std::collections::{BTreeMap, BTreeSet};

use virtgap_probes::hist::{slot_bounds, KernelHist};
use virtgap_probes::hypervisor::Hypervisor;
use virtgap_probes::model::{BlockOp, BlockStage, DevNum};
use virtgap_probes::{CapabilityReport, ProbeSnapshot};

use crate::model::host::Fingerprint;
use crate::model::hypervisor::PathState;
use crate::model::metrics::{MetricFamily, MetricKind, MetricUnit, Sample, SampleValue};
use crate::run::pipeline::device_name;

/// Hardware queues of one device with a label of their own; the rest are "other".
pub const MAX_QUEUES_PER_DEVICE: usize = 4;
/// (cpu, irq) pairs with a label of their own; the rest are "other" on their CPU.
pub const MAX_IRQ_SERIES: usize = 64;

/// Histogram bucket bounds in ns: four per power of two from 512 ns to 16 s (each one a slot
/// boundary of the kernel's log-linear histogram, so no slot is split), then +Inf.
fn bucket_bounds_ns(coarse: bool) -> Vec<u64> {
    let per_power = if coarse { 1 } else { 4 };
    let mut bounds = Vec::new();
    for e in 9..34u32 {
        for quarter in 0..per_power {
            bounds.push((1u64 << e) + quarter * (1u64 << (e - 2)));
        }
    }
    bounds.push(1u64 << 34);
    bounds
}

/// A kernel histogram as Prometheus buckets in seconds: each slot counts under the first bound
/// above its highest value.
pub fn buckets(h: &KernelHist, bounds_ns: &[u64]) -> SampleValue {
    let mut counts = vec![0u64; bounds_ns.len() + 1];
    for (slot, &n) in h.slots.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let (_, high) = slot_bounds(slot);
        let i = bounds_ns.partition_point(|&b| b <= high);
        counts[i] += n;
    }
    let mut buckets: Vec<(f64, u64)> = bounds_ns
        .iter()
        .zip(&counts)
        .map(|(&b, &n)| (b as f64 / 1e9, n))
        .collect();
    buckets.push((f64::MAX, counts[bounds_ns.len()]));
    SampleValue::Histogram {
        sum: h.sum_ns as f64 / 1e9,
        count: h.count,
        buckets,
    }
}

/// Keys that keep the label they were first given: the first `limit` seen (per group) are
/// named, every later one is "other", for as long as the exporter runs.
#[derive(Debug, Default)]
struct StickyLabels<G: Ord, K: Ord> {
    named: BTreeMap<G, BTreeSet<K>>,
    other: BTreeSet<(G, K)>,
}

impl<G: Ord + Clone, K: Ord + Clone> StickyLabels<G, K> {
    /// Whether `key` of `group` has its own label.
    fn named(&mut self, group: &G, key: &K, limit: usize) -> bool {
        if self.other.contains(&(group.clone(), key.clone())) {
            return false;
        }
        let set = self.named.entry(group.clone()).or_default();
        if set.contains(key) {
            return true;
        }
        if set.len() < limit {
            set.insert(key.clone());
            return true;
        }
        self.other.insert((group.clone(), key.clone()));
        false
    }
}

/// A queue's label on a disk's series: none without `per_queue`, else its own for a disk's
/// first few queues and "other" for the rest (kept for the life of the process).
fn queue_label(
    per_queue: bool,
    named: &mut StickyLabels<DevNum, u16>,
    dev: DevNum,
    queue: u16,
) -> String {
    if !per_queue {
        String::new()
    } else if named.named(&dev, &queue, MAX_QUEUES_PER_DEVICE) {
        queue.to_string()
    } else {
        "other".to_string()
    }
}

/// What the exporter says of the host and the run besides the probes' figures.
#[derive(Clone, Debug)]
pub struct ExporterContext {
    /// How many series the page may carry.
    pub series: SeriesOptions,
    pub host: Fingerprint,
    /// `--label`, or empty.
    pub label: String,
    /// What the probes follow, in words ("every process", "pid 1234 and children").
    pub attached: String,
    pub report: CapabilityReport,
    /// The host's request-based disks when the probes attached, and whether each has a
    /// volatile write cache (so takes flushes): their block series start at zero on the
    /// first page, so `rate()` over a series' first scrapes counts its first requests.
    pub disks: Vec<(String, bool)>,
}

/// What sets the page's series count: the block stages' `queue` label (off by default: no
/// dashboard query uses it, and it multiplies the largest family by five), the buckets, and
/// which disks are exported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeriesOptions {
    pub per_queue: bool,
    /// One bucket per power of two instead of four.
    pub coarse_buckets: bool,
    /// The disks whose block series are exported, by name ("nvme0n1"); empty: every disk.
    pub devices: Vec<String>,
}

impl SeriesOptions {
    /// Whether disk `device`'s block series are on the page.
    fn exports(&self, device: &str) -> bool {
        self.devices.is_empty() || self.devices.iter().any(|d| d == device)
    }
}

impl ExporterContext {
    /// This host's, read now, for probes that attached with `report`.
    pub fn this_host(label: &str, attached: &str, report: &CapabilityReport) -> Self {
        Self {
            series: SeriesOptions::default(),
            host: crate::run::host::this_host(),
            label: label.to_string(),
            attached: attached.to_string(),
            report: report.clone(),
            disks: request_disks(std::path::Path::new("/")),
        }
    }
}

/// The request-based disks under `root` (those [`crate::run::host::every_disk`] lists) that have a
/// size (an unbound loop device has none), each with whether its write cache is volatile.
fn request_disks(root: &std::path::Path) -> Vec<(String, bool)> {
    let read = |disk: &str, file: &str| {
        std::fs::read_to_string(root.join("sys/block").join(disk).join(file)).unwrap_or_default()
    };
    crate::run::host::every_disk(root)
        .leaves
        .into_iter()
        .filter(|d| read(&d.name, "size").trim().parse::<u64>().unwrap_or(0) > 0)
        .map(|d| {
            let write_back = read(&d.name, "queue/write_cache").trim() == "write back";
            (d.name, write_back)
        })
        .collect()
}

/// Builds the families from each snapshot, keeping label assignments across snapshots.
#[derive(Debug)]
pub struct Exporter {
    cx: ExporterContext,
    bounds_ns: Vec<u64>,
    queues: StickyLabels<DevNum, u16>,
    /// NVMe queue ids (with `per_queue`), labelled as the block stages' queues are.
    nvme_queues: StickyLabels<DevNum, u16>,
    irqs: StickyLabels<(), (u32, u32)>,
    devices: BTreeMap<DevNum, String>,
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn family(
    name: &'static str,
    help: &'static str,
    unit: Option<MetricUnit>,
    kind: MetricKind,
    samples: Vec<Sample>,
) -> MetricFamily {
    MetricFamily {
        name,
        help,
        unit,
        kind,
        samples,
    }
}

fn count(labels: Vec<(String, String)>, n: u64) -> Sample {
    Sample {
        labels,
        value: SampleValue::Count(n),
    }
}

/// This process's resident memory, from /proc/self/status (None where it cannot be read).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// A family's state as a label from a fixed set.
fn family_state(f: &virtgap_probes::FamilyReport) -> &'static str {
    use virtgap_probes::Unavailable;
    match &f.unavailable {
        Some(Unavailable::NothingToWatch(_)) => "nothing_to_watch",
        Some(Unavailable::NoPermission(_)) => "no_permission",
        Some(Unavailable::Other(_)) => "failed",
        None if f.tracepoints.iter().all(|t| t.attached.is_some()) => "attached",
        None if f.tracepoints.iter().any(|t| t.attached.is_some()) => "partial",
        None => "failed",
    }
}

fn number(labels: Vec<(String, String)>, x: f64) -> Sample {
    Sample {
        labels,
        value: SampleValue::Number(x),
    }
}

impl Exporter {
    pub fn new(cx: ExporterContext) -> Self {
        Self {
            bounds_ns: bucket_bounds_ns(cx.series.coarse_buckets),
            queues: StickyLabels::default(),
            nvme_queues: StickyLabels::default(),
            irqs: StickyLabels::default(),
            devices: BTreeMap::new(),
            cx,
        }
    }

    fn device(&mut self, dev: DevNum) -> String {
        self.devices
            .entry(dev)
            .or_insert_with(|| device_name(dev))
            .clone()
    }

    /// Every family, from the probes' totals since they attached. Families of a probe that
    /// did not run are left out (never zeros for what was not measured).
    pub fn families(&mut self, total: &ProbeSnapshot) -> Vec<MetricFamily> {
        let mut out = vec![self.host_info()];
        self.block(total, &mut out);
        self.nvme(total, &mut out);
        self.app(total, &mut out);
        self.irq(total, &mut out);
        if let Some(w) = &total.wakeups {
            out.push(family(
                "virtgap_wakeup_latency",
                "Wakeup to on-CPU latency of the followed processes' threads",
                Some(MetricUnit::Seconds),
                MetricKind::Histogram,
                vec![Sample {
                    labels: vec![],
                    value: buckets(&w.latency, &self.bounds_ns),
                }],
            ));
        }
        if !total.cpu_times.is_empty() {
            out.push(family(
                "virtgap_cpu_steal",
                "Time each vCPU wanted to run while the hypervisor ran something else (/proc/stat)",
                Some(MetricUnit::Seconds),
                MetricKind::Counter,
                total
                    .cpu_times
                    .iter()
                    .map(|t| {
                        number(
                            labels(&[("cpu", &t.cpu.to_string())]),
                            t.steal_ns as f64 / 1e9,
                        )
                    })
                    .collect(),
            ));
        }
        self.hypervisor(total, &mut out);
        self.probe_cost(total, &mut out);
        self.self_metrics(&mut out);
        out
    }

    /// What an operator alerts on: the build, which probe families run (and why not, from a
    /// fixed set of reasons), when the figures were last updated, and this process's own CPU
    /// time and memory (Prometheus' standard `process_` names).
    fn self_metrics(&self, out: &mut Vec<MetricFamily>) {
        out.push(family(
            "virtgap_build_info",
            "The virtgap build serving these figures (always 1)",
            None,
            MetricKind::Gauge,
            vec![number(
                labels(&[("version", env!("CARGO_PKG_VERSION"))]),
                1.0,
            )],
        ));
        out.push(family(
            "virtgap_probe_family",
            "Each probe family's state (always 1): attached, partial (some attach points \
             failed), nothing_to_watch (the host has none of what it watches), no_permission or \
             failed; `doctor` says why in words",
            None,
            MetricKind::Gauge,
            self.cx
                .report
                .families
                .iter()
                .map(|f| {
                    number(
                        labels(&[("family", f.family.name()), ("state", family_state(f))]),
                        1.0,
                    )
                })
                .collect(),
        ));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        out.push(family(
            "virtgap_last_update_timestamp",
            "When these figures were taken from the probes (Unix time): a scrape that sees it \
             stand still sees a stalled collector",
            Some(MetricUnit::Seconds),
            MetricKind::Gauge,
            vec![number(vec![], now)],
        ));
        let cpu = virtgap_workloads::stats::CpuTime::of_this_process();
        out.push(family(
            "process_cpu",
            "CPU time of virtgap's own process, user and system",
            Some(MetricUnit::Seconds),
            MetricKind::Counter,
            vec![number(vec![], cpu.total_ns() as f64 / 1e9)],
        ));
        if let Some(rss) = resident_bytes() {
            out.push(family(
                "process_resident_memory",
                "Resident memory of virtgap's own process",
                Some(MetricUnit::Bytes),
                MetricKind::Gauge,
                vec![number(vec![], rss as f64)],
            ));
        }
    }

    fn host_info(&self) -> MetricFamily {
        let h = &self.cx.host;
        let or_unknown = |s: &Option<String>| s.clone().unwrap_or_else(|| "unknown".into());
        family(
            "virtgap_host_info",
            "The host's fingerprint and what the probes follow (always 1)",
            None,
            MetricKind::Gauge,
            vec![number(
                vec![
                    ("platform".into(), h.platform.clone()),
                    ("hypervisor".into(), h.hypervisor.clone()),
                    ("instance_type".into(), or_unknown(&h.instance_type)),
                    ("kernel".into(), or_unknown(&h.kernel)),
                    ("clocksource".into(), or_unknown(&h.clocksource)),
                    ("clockevent".into(), or_unknown(&h.clockevent)),
                    ("cpu_model".into(), or_unknown(&h.cpu_model)),
                    ("cpus".into(), h.cpus.to_string()),
                    ("label".into(), self.cx.label.clone()),
                    ("attached".into(), self.cx.attached.clone()),
                ],
                1.0,
            )],
        )
    }

    fn block(&mut self, total: &ProbeSnapshot, out: &mut Vec<MetricFamily>) {
        let Some(b) = &total.block else {
            return;
        };
        // (device, queue label, op, stage) -> histogram, "other" queues merged.
        let mut stages: BTreeMap<(String, String, &'static str, BlockStage), KernelHist> =
            BTreeMap::new();
        let mut requests: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
        self.known_disks_at_zero(&mut stages, &mut requests);
        for s in &b.stages {
            let device = self.device(s.dev);
            if !self.cx.series.exports(&device) {
                continue;
            }
            let queue = queue_label(self.cx.series.per_queue, &mut self.queues, s.dev, s.hctx);
            stages
                .entry((device.clone(), queue, s.op.name(), s.stage))
                .or_default()
                .merge(&s.hist);
            if s.stage == BlockStage::Device {
                *requests.entry((device, s.op.name())).or_default() += s.hist.count;
            }
        }
        out.push(family(
            "virtgap_block_stage",
            "Block request latency by stage: queue (start or bio entry to issue), device (issue to the queue's interrupt), completion (interrupt to request done)",
            Some(MetricUnit::Seconds),
            MetricKind::Histogram,
            stages
                .iter()
                .map(|((device, queue, op, stage), h)| Sample {
                    labels: labels(&[
                        ("device", device),
                        ("queue", queue),
                        ("op", op),
                        ("stage", stage.name()),
                    ])
                    .into_iter()
                    // Without --per-queue the label is left out, not set empty.
                    .filter(|(k, _)| k != "queue" || self.cx.series.per_queue)
                    .collect(),
                    value: buckets(h, &self.bounds_ns),
                })
                .collect(),
        ));
        out.push(family(
            "virtgap_block_requests",
            "Block requests completed, by device and operation (flushes are op=\"flush\")",
            None,
            MetricKind::Counter,
            requests
                .iter()
                .map(|((device, op), &n)| count(labels(&[("device", device), ("op", op)]), n))
                .collect(),
        ));
        let mut devices: Vec<(String, i64)> = b
            .devices
            .iter()
            .map(|d| (self.device(d.dev), d.inflight.max(0)))
            .collect();
        devices.retain(|(device, _)| self.cx.series.exports(device));
        out.push(family(
            "virtgap_block_inflight_requests",
            "Requests issued to each device and not yet completed",
            None,
            MetricKind::Gauge,
            devices
                .iter()
                .map(|(device, n)| number(labels(&[("device", device)]), *n as f64))
                .collect(),
        ));
        for (name, help, n) in [
            (
                "virtgap_block_requeues",
                "Requests the driver handed back to be issued again",
                b.requeued,
            ),
            (
                "virtgap_block_errors",
                "Requests that completed with an error status",
                b.errors,
            ),
            (
                "virtgap_block_timeouts",
                "Requests the block layer's timeout ended",
                b.timeouts,
            ),
        ] {
            out.push(family(
                name,
                help,
                None,
                MetricKind::Counter,
                vec![count(vec![], n)],
            ));
        }
        let cross: u64 = b
            .cpu_pairs
            .iter()
            .filter(|p| p.submit_cpu != p.complete_cpu)
            .map(|p| p.count)
            .sum();
        out.push(family(
            "virtgap_block_cross_cpu_completions",
            "Requests completed on another CPU than the one that submitted them",
            None,
            MetricKind::Counter,
            vec![count(vec![], cross)],
        ));
    }

    /// NVMe command latency (setup to completion) per disk and operation, and per queue id
    /// with `per_queue` (the first few of each disk; the rest "other", as the block stages'
    /// queues). Queue id 0 is the admin queue.
    fn nvme(&mut self, total: &ProbeSnapshot, out: &mut Vec<MetricFamily>) {
        let Some(n) = &total.nvme else {
            return;
        };
        let mut commands: BTreeMap<(String, String, &'static str), KernelHist> = BTreeMap::new();
        for q in &n.queues {
            let device = self.device(q.dev);
            if !self.cx.series.exports(&device) {
                continue;
            }
            let qid = queue_label(
                self.cx.series.per_queue,
                &mut self.nvme_queues,
                q.dev,
                q.qid,
            );
            commands
                .entry((device, qid, q.op.name()))
                .or_default()
                .merge(&q.hist);
        }
        let per_queue = self.cx.series.per_queue;
        out.push(family(
            "virtgap_nvme_command",
            "NVMe command latency, from the driver's setup of the command to its completion, by disk and operation (and queue id with --per-queue; 0 is the admin queue)",
            Some(MetricUnit::Seconds),
            MetricKind::Histogram,
            commands
                .iter()
                .map(|((device, qid, op), h)| Sample {
                    labels: labels(&[("device", device), ("qid", qid), ("op", op)])
                        .into_iter()
                        .filter(|(k, _)| k != "qid" || per_queue)
                        .collect(),
                    value: buckets(h, &self.bounds_ns),
                })
                .collect(),
        ));
    }

    /// The known disks' block series, at zero until their first request: they exist from the
    /// first page. Per queue, which queues a disk's requests will use is not known in advance:
    /// those are born with their first request.
    fn known_disks_at_zero(
        &self,
        stages: &mut BTreeMap<(String, String, &'static str, BlockStage), KernelHist>,
        requests: &mut BTreeMap<(String, &'static str), u64>,
    ) {
        if self.cx.series.per_queue {
            return;
        }
        for (device, write_back) in &self.cx.disks {
            if !self.cx.series.exports(device) {
                continue;
            }
            let ops: &[BlockOp] = if *write_back {
                &[BlockOp::Read, BlockOp::Write, BlockOp::Flush]
            } else {
                &[BlockOp::Read, BlockOp::Write]
            };
            for &op in ops {
                for stage in [
                    BlockStage::Queue,
                    BlockStage::Device,
                    BlockStage::Completion,
                ] {
                    stages
                        .entry((device.clone(), String::new(), op.name(), stage))
                        .or_default();
                }
                requests.entry((device.clone(), op.name())).or_default();
            }
        }
    }

    fn app(&self, total: &ProbeSnapshot, out: &mut Vec<MetricFamily>) {
        let Some(a) = &total.app else {
            return;
        };
        let via = |v: virtgap_probes::model::AppVia| match v {
            virtgap_probes::model::AppVia::Syscall => "syscall",
            virtgap_probes::model::AppVia::IoUring => "io_uring",
        };
        let op = |o: virtgap_probes::model::AppOp| match o {
            virtgap_probes::model::AppOp::Read => "read",
            virtgap_probes::model::AppOp::Write => "write",
            virtgap_probes::model::AppOp::Sync => "sync",
        };
        out.push(family(
            "virtgap_app_latency",
            "App latency of the followed processes: file system calls entry to exit, io_uring requests submission to completion",
            Some(MetricUnit::Seconds),
            MetricKind::Histogram,
            // A kind appears once the processes first use it: six empty histograms would be
            // some 600 series of zeros.
            a.kinds
                .iter()
                .filter(|k| k.latency.count > 0)
                .map(|k| Sample {
                    labels: labels(&[("via", via(k.via)), ("op", op(k.op))]),
                    value: buckets(&k.latency, &self.bounds_ns),
                })
                .collect(),
        ));
        out.push(family(
            "virtgap_app",
            "Bytes the followed processes' read and write system calls returned",
            Some(MetricUnit::Bytes),
            MetricKind::Counter,
            a.kinds
                .iter()
                .filter(|k| {
                    k.via == virtgap_probes::model::AppVia::Syscall
                        && k.op != virtgap_probes::model::AppOp::Sync
                        && k.latency.count > 0
                })
                .map(|k| count(labels(&[("op", op(k.op))]), k.bytes))
                .collect(),
        ));
        out.push(family(
            "virtgap_app_io_submits",
            "libaio io_submit calls of the followed processes (their I/O has no app-level time)",
            None,
            MetricKind::Counter,
            vec![count(vec![], a.io_submits)],
        ));
        out.push(family(
            "virtgap_app_failed_calls",
            "File I/O calls of the followed processes that returned an error",
            None,
            MetricKind::Counter,
            vec![count(vec![], a.failed)],
        ));
    }

    fn irq(&mut self, total: &ProbeSnapshot, out: &mut Vec<MetricFamily>) {
        let Some(irq) = &total.irq else {
            return;
        };
        let mut handlers: BTreeMap<(u32, String), (u64, u64)> = BTreeMap::new();
        // A Xen guest's per-CPU timer and IPI IRQs are system vectors, as in the profile: in
        // `virtgap_system_vectors`, not in hard-IRQ time.
        for h in irq.hardirqs.iter().filter(|h| h.system_vector().is_none()) {
            let name = if self.irqs.named(&(), &(h.cpu, h.irq), MAX_IRQ_SERIES) {
                format!("{} {}", h.irq, h.name)
            } else {
                "other".to_string()
            };
            let e = handlers.entry((h.cpu, name)).or_default();
            e.0 += h.count;
            e.1 += h.time_ns;
        }
        out.push(family(
            "virtgap_hardirq",
            "Time in hard-IRQ handlers, by CPU and IRQ (\"number name\" as /proc/interrupts names it)",
            Some(MetricUnit::Seconds),
            MetricKind::Counter,
            handlers
                .iter()
                .map(|((cpu, name), &(_, ns))| {
                    number(
                        labels(&[("cpu", &cpu.to_string()), ("irq", name)]),
                        ns as f64 / 1e9,
                    )
                })
                .collect(),
        ));
        out.push(family(
            "virtgap_hardirqs",
            "Hard-IRQ handler runs, by CPU and IRQ",
            None,
            MetricKind::Counter,
            handlers
                .iter()
                .map(|((cpu, name), &(n, _))| {
                    count(labels(&[("cpu", &cpu.to_string()), ("irq", name)]), n)
                })
                .collect(),
        ));
        let events = |name, help, unit, list: &[virtgap_probes::model::CpuEvents], key| {
            family(
                name,
                help,
                unit,
                MetricKind::Counter,
                list.iter()
                    .map(|e| {
                        let l = labels(&[("cpu", &e.cpu.to_string()), (key, &e.kind)]);
                        if unit.is_some() {
                            number(l, e.time_ns as f64 / 1e9)
                        } else {
                            count(l, e.count)
                        }
                    })
                    .collect(),
            )
        };
        out.push(family(
            "virtgap_system_vectors",
            "System-vector interrupts (timer, IPIs, IRQ work), by CPU and vector; on Xen its per-CPU event-channel IRQs",
            None,
            MetricKind::Counter,
            crate::run::assemble::cpu_loads(total)
                .iter()
                .flat_map(|c| {
                    c.vectors.iter().map(|(vector, &n)| {
                        count(
                            labels(&[("cpu", &c.cpu.to_string()), ("vector", vector)]),
                            n,
                        )
                    })
                })
                .collect(),
        ));
        out.push(events(
            "virtgap_softirq",
            "Time in softirqs, by CPU and vector",
            Some(MetricUnit::Seconds),
            &irq.softirqs,
            "vector",
        ));
        out.push(events(
            "virtgap_ipis_sent",
            "IPIs sent, by sending CPU and kind",
            None,
            &irq.ipis_sent,
            "kind",
        ));
        out.push(events(
            "virtgap_cross_cpu_calls",
            "Cross-CPU calls queued, by CPU and purpose",
            None,
            &irq.cross_cpu_calls,
            "purpose",
        ));
    }

    fn hypervisor(&self, total: &ProbeSnapshot, out: &mut Vec<MetricFamily>) {
        if let Some(msr) = &total.msr {
            let mut writes: BTreeMap<(u32, bool), u64> = BTreeMap::new();
            for c in msr.counts.iter().filter(|c| c.write && !c.by_sampler) {
                *writes.entry((c.msr, c.exits)).or_default() += c.count;
            }
            out.push(family(
                "virtgap_msr_writes",
                "MSR writes by MSR (exits=\"true\" where a write exits to this host's hypervisor)",
                None,
                MetricKind::Counter,
                writes
                    .iter()
                    .map(|(&(msr, exits), &n)| {
                        count(
                            labels(&[
                                ("msr", &format!("{msr:#x}")),
                                ("name", virtgap_probes::virt::msr_name(msr)),
                                ("exits", if exits { "true" } else { "false" }),
                            ]),
                            n,
                        )
                    })
                    .collect(),
            ));
        }
        let hypervisor = Hypervisor::of_name(&self.cx.host.hypervisor);
        if hypervisor == Hypervisor::None {
            return;
        }
        let virt = crate::run::assemble::virtualization(total);
        let section = crate::run::hypervisor::section(
            hypervisor,
            total.elapsed_ns as f64 / 1e9,
            virt.as_ref(),
            Some(&self.cx.report),
            Some(&self.cx.host.cpuid),
        );
        let mut paths = Vec::new();
        for m in &section.mechanisms {
            for p in &m.paths {
                let state = match &p.state {
                    PathState::Measured => "measured",
                    PathState::Absent => "absent",
                    PathState::NotMeasured(_) => "not_measured",
                    PathState::NotOffered(_) => "not_offered",
                };
                paths.push(number(
                    labels(&[
                        ("mechanism", m.mechanism.name()),
                        ("path", &p.what),
                        ("state", state),
                    ]),
                    1.0,
                ));
            }
        }
        // Counters carry raw counts only, and the time the MSR writes were counted beside
        // them: queries divide (the profile's per-window figures are scaled, and a scaled
        // count can go down between scrapes, which Prometheus reads as a restart).
        let mut counts: BTreeMap<(&'static str, &'static str), u64> = BTreeMap::new();
        let mut times: BTreeMap<&'static str, f64> = BTreeMap::new();
        if let Some(v) = virt.as_ref() {
            for raw in crate::run::hypervisor::raw_counts(hypervisor, v) {
                *counts.entry((raw.mechanism.name(), raw.how)).or_default() += raw.count;
                if let Some(t) = raw.time_ns {
                    *times.entry(raw.mechanism.name()).or_default() += t;
                }
            }
            if v.msr_writes.is_some() {
                out.push(family(
                    "virtgap_msr_counted",
                    "Time in which the host's MSR writes were counted (while no sampler ran): a rate of how=\"msr_write\" events divided by this one's rate is writes per second",
                    Some(MetricUnit::Seconds),
                    MetricKind::Counter,
                    vec![number(vec![], v.msr_seconds())],
                ));
            }
        }
        out.push(family(
            "virtgap_hypervisor_mechanism_events",
            "Calls of each hypervisor mechanism's timed paths (how=\"timed\") and its exit-causing MSR writes counted while no sampler ran (how=\"msr_write\"; see virtgap_msr_counted_seconds_total); a mechanism none of whose paths is measured here is left out",
            None,
            MetricKind::Counter,
            counts
                .iter()
                .map(|(&(m, how), &n)| count(labels(&[("mechanism", m), ("how", how)]), n))
                .collect(),
        ));
        out.push(family(
            "virtgap_hypervisor_mechanism",
            "Time in the timed paths of each hypervisor mechanism",
            Some(MetricUnit::Seconds),
            MetricKind::Counter,
            times
                .iter()
                .map(|(&m, &t)| number(labels(&[("mechanism", m)]), t / 1e9))
                .collect(),
        ));
        out.push(family(
            "virtgap_hypervisor_path_info",
            "Each path of each mechanism and whether it is measured on this host (always 1)",
            None,
            MetricKind::Gauge,
            paths,
        ));
    }

    fn probe_cost(&self, total: &ProbeSnapshot, out: &mut Vec<MetricFamily>) {
        out.push(family(
            "virtgap_probes_attached",
            "How long the probes have been attached",
            Some(MetricUnit::Seconds),
            MetricKind::Gauge,
            vec![number(vec![], total.elapsed_ns as f64 / 1e9)],
        ));
        if let Some(pids) = &total.followed {
            out.push(family(
                "virtgap_followed_processes",
                "Processes the probes follow now",
                None,
                MetricKind::Gauge,
                vec![number(vec![], pids.len() as f64)],
            ));
        }
        let by_family = total.runs_by_family();
        if !by_family.is_empty() {
            out.push(family(
                "virtgap_probe_runs",
                "Runs of virtgap's BPF programs, by probe family",
                None,
                MetricKind::Counter,
                by_family
                    .iter()
                    .map(|(f, &(n, _))| count(labels(&[("family", f)]), n))
                    .collect(),
            ));
            out.push(family(
                "virtgap_probe_run",
                "CPU time in virtgap's BPF programs, by probe family: the probes' overhead",
                Some(MetricUnit::Seconds),
                MetricKind::Counter,
                by_family
                    .iter()
                    .map(|(f, &(_, ns))| number(labels(&[("family", f)]), ns as f64 / 1e9))
                    .collect(),
            ));
            out.push(family(
                "virtgap_probe_stats",
                "Time the kernel's run statistics were on, over which virtgap_probe_runs and \
                 virtgap_probe_run_seconds count (on for one interval in four: the probes' CPU \
                 share is rate(virtgap_probe_run_seconds_total) / \
                 rate(virtgap_probe_stats_seconds_total))",
                Some(MetricUnit::Seconds),
                MetricKind::Counter,
                vec![number(vec![], total.stats_on_ns as f64 / 1e9)],
            ));
        }
        let mut dropped = Vec::new();
        let mut add = |name: &str, n: Option<u64>| {
            if let Some(n) = n {
                dropped.push(count(labels(&[("family", name)]), n));
            }
        };
        add("block", total.block.as_ref().map(|b| b.dropped));
        add("irq", total.irq.as_ref().map(|i| i.dropped));
        add("wakeup", total.wakeups.as_ref().map(|w| w.dropped));
        add("app", total.app.as_ref().map(|a| a.dropped));
        out.push(family(
            "virtgap_probe_dropped_events",
            "Events a probe could not record (a full map or ring buffer)",
            None,
            MetricKind::Counter,
            dropped,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_slot_boundaries_and_add_up() {
        let mut h = KernelHist::default();
        for v in [
            100,
            511,
            512,
            600,
            1_000,
            70_000,
            3_000_000_000,
            u64::MAX / 2,
        ] {
            h.record(v);
        }
        let bounds = bucket_bounds_ns(false);
        // Every bound is a slot's low end: no slot straddles one.
        for &b in &bounds {
            assert_eq!(slot_bounds(virtgap_probes::hist::slot_of(b)).0, b);
        }
        let SampleValue::Histogram { count, buckets, .. } = buckets(&h, &bounds) else {
            panic!("not a histogram");
        };
        assert_eq!(count, 8);
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), 8);
        // 100 and 511 ns fall under the first bound (512 ns); 512 and 600 under the next.
        assert_eq!(buckets[0], (512e-9, 2));
        assert_eq!(buckets[1], (640e-9, 2));
        assert_eq!(buckets.last().unwrap(), &(f64::MAX, 1));
        assert!(buckets.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn a_key_keeps_its_label_and_later_ones_share_other() {
        let mut s: StickyLabels<u8, u16> = StickyLabels::default();
        assert!(s.named(&0, &5, 2));
        assert!(s.named(&0, &7, 2));
        assert!(!s.named(&0, &9, 2));
        // Still named, still other, whatever the order they come back in.
        assert!(!s.named(&0, &9, 2));
        assert!(s.named(&0, &5, 2));
        assert!(s.named(&1, &9, 2));
    }

    /// A sample's label `key` ("" when it has none).
    fn label_of(s: &Sample, key: &str) -> String {
        s.labels
            .iter()
            .find(|(k, _)| k == key)
            .map_or(String::new(), |(_, v)| v.clone())
    }

    /// An exporter of the fixture's host following every process, with `report` and `series`.
    fn fixture_exporter(report: CapabilityReport, series: SeriesOptions) -> Exporter {
        Exporter::new(ExporterContext {
            series,
            host: crate::render::csv_export::tests::fixture().host,
            label: String::new(),
            attached: "every process".into(),
            report,
            disks: Vec::new(),
        })
    }

    /// Every family the exporter can build: a snapshot with every probe's part present.
    fn every_family() -> Vec<MetricFamily> {
        let mut exporter = fixture_exporter(CapabilityReport::default(), SeriesOptions::default());
        let snapshot = ProbeSnapshot {
            block: Some(Default::default()),
            irq: Some(Default::default()),
            wakeups: Some(Default::default()),
            app: Some(Default::default()),
            msr: Some(Default::default()),
            followed: Some(vec![]),
            cpu_times: vec![virtgap_probes::procfs::CpuTimes::default()],
            programs: vec![virtgap_probes::model::ProgramStats {
                family: "block".into(),
                name: "p".into(),
                run_count: 1,
                run_time_ns: 1,
                missed: 0,
            }],
            ..Default::default()
        };
        exporter.families(&snapshot)
    }

    /// A KVM host's timer writes counted in the sampler's pauses: a later scrape with more
    /// writes but a longer pause would scale to fewer (2,000 over 10 s, then 1,886 over 12 s);
    /// the counter carries the raw count and the time it covers, which only go up.
    #[test]
    fn hypervisor_counters_carry_raw_counts_that_never_go_down() {
        use virtgap_probes::model::{MsrCount, MsrSnapshot};
        let mut exporter = fixture_exporter(CapabilityReport::default(), SeriesOptions::default());
        exporter.cx.host.hypervisor = "kvm".into();
        let snapshot = |elapsed_s: u64, sampler_s: u64, writes: u64| ProbeSnapshot {
            elapsed_ns: elapsed_s * 1_000_000_000,
            msr: Some(MsrSnapshot {
                counts: vec![MsrCount {
                    cpu: 0,
                    msr: 0x6e0,
                    write: true,
                    by_sampler: false,
                    while_sampling: false,
                    exits: true,
                    count: writes,
                }],
                sampler_ns: sampler_s * 1_000_000_000,
                icr_sends: None,
            }),
            ..Default::default()
        };
        let read = |families: &[MetricFamily], name: &str, with: &[(&str, &str)]| {
            let f = families.iter().find(|f| f.name == name).unwrap();
            let s = f
                .samples
                .iter()
                .find(|s| {
                    with.iter()
                        .all(|(k, v)| s.labels.iter().any(|(l, x)| l == k && x == v))
                })
                .unwrap_or_else(|| panic!("{name} {with:?}: {:?}", f.samples));
            match s.value {
                SampleValue::Count(n) => n as f64,
                SampleValue::Number(x) => x,
                _ => panic!("{name}: not a number"),
            }
        };
        let timer = [("mechanism", "timer"), ("how", "msr_write")];
        let first = exporter.families(&snapshot(10, 5, 1_000));
        let later = exporter.families(&snapshot(12, 5, 1_100));
        let events = "virtgap_hypervisor_mechanism_events";
        assert_eq!(read(&first, events, &timer), 1_000.0);
        assert_eq!(read(&later, events, &timer), 1_100.0);
        assert_eq!(read(&first, "virtgap_msr_counted", &[]), 5.0);
        assert_eq!(read(&later, "virtgap_msr_counted", &[]), 7.0);
    }

    /// A Xen guest's CPU 0: its timer and IPIs arrive as per-CPU IRQs. The hard-IRQ families
    /// hold the device's IRQ only, as the profile's per-CPU load does, and the per-CPU IRQs are
    /// counted as system vectors.
    #[test]
    fn xens_per_cpu_irqs_are_vectors_here_as_in_the_profile() {
        use virtgap_probes::model::{HardIrq, IrqSnapshot};
        let irq = |irq: u32, name: &str, count: u64, time_ns: u64| HardIrq {
            cpu: 0,
            irq,
            name: name.into(),
            count,
            time_ns,
            duration: KernelHist::default(),
        };
        let snapshot = ProbeSnapshot {
            irq: Some(IrqSnapshot {
                hardirqs: vec![
                    irq(40, "timer0", 1000, 5_000_000),
                    irq(41, "resched0", 200, 1_000_000),
                    irq(60, "nvme0q1", 4000, 8_000_000),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut exporter = fixture_exporter(CapabilityReport::default(), SeriesOptions::default());
        let families = exporter.families(&snapshot);
        let samples = |name: &str| {
            families
                .iter()
                .find(|f| f.name == name)
                .unwrap_or_else(|| panic!("no {name}"))
                .samples
                .iter()
                .map(|s| {
                    let label = |k: &str| label_of(s, k);
                    let value = match s.value {
                        SampleValue::Count(n) => n as f64,
                        SampleValue::Number(x) => x,
                        _ => panic!("{name}: not a number"),
                    };
                    (label("irq") + &label("vector"), value)
                })
                .collect::<Vec<_>>()
        };
        let profile = &crate::run::assemble::cpu_loads(&snapshot)[0];
        let seconds: f64 = samples("virtgap_hardirq").iter().map(|s| s.1).sum();
        assert!(
            (seconds * 1e9 - profile.hardirq_ns as f64).abs() < 1.0,
            "{seconds}"
        );
        assert_eq!(samples("virtgap_hardirqs"), [("60 nvme0q1".into(), 4000.0)]);
        assert_eq!(
            samples("virtgap_system_vectors"),
            [("local_timer".into(), 1000.0), ("reschedule".into(), 200.0)]
        );
    }

    /// One NVMe disk with 8 queues doing reads, writes and flushes: the block stages' series
    /// by default (no queue label) stay far under 2,000; `--per-queue` multiplies them by the
    /// five queue labels; coarse buckets divide them by about four.
    #[test]
    fn a_disks_block_series_stay_bounded_by_default() {
        use virtgap_probes::model::{BlockSnapshot, BlockStageHist};
        let mut hist = KernelHist::default();
        hist.slots[40] = 3;
        hist.count = 3;
        let mut stages = Vec::new();
        for hctx in 0..8u16 {
            for op in [BlockOp::Read, BlockOp::Write, BlockOp::Flush] {
                for stage in [
                    BlockStage::Queue,
                    BlockStage::Device,
                    BlockStage::Completion,
                ] {
                    stages.push(BlockStageHist {
                        dev: (259, 0),
                        hctx,
                        op,
                        stage,
                        hist: hist.clone(),
                    });
                }
            }
        }
        let snapshot = ProbeSnapshot {
            block: Some(BlockSnapshot {
                stages,
                ..Default::default()
            }),
            ..Default::default()
        };
        let series = |options: SeriesOptions| {
            let mut exporter = fixture_exporter(CapabilityReport::default(), options);
            let families = exporter.families(&snapshot);
            let f = families
                .iter()
                .find(|f| f.name == "virtgap_block_stage")
                .unwrap();
            f.samples
                .iter()
                .map(|s| match &s.value {
                    // The buckets with +Inf, then _sum and _count.
                    SampleValue::Histogram { buckets, .. } => buckets.len() + 2,
                    _ => 1,
                })
                .sum::<usize>()
        };
        let default = series(SeriesOptions::default());
        assert_eq!(default, 3 * 3 * (101 + 1 + 2));
        assert_eq!(
            series(SeriesOptions {
                per_queue: true,
                ..Default::default()
            }),
            5 * default
        );
        assert_eq!(
            series(SeriesOptions {
                coarse_buckets: true,
                ..Default::default()
            }),
            3 * 3 * (26 + 1 + 2)
        );
        // --device: only the disks named.
        let name = crate::run::pipeline::device_name((259, 0));
        assert_eq!(
            series(SeriesOptions {
                devices: vec![name],
                ..Default::default()
            }),
            default
        );
        assert_eq!(
            series(SeriesOptions {
                devices: vec!["another-disk".into()],
                ..Default::default()
            }),
            0
        );
    }

    /// NVMe commands on one disk's admin queue and eight I/O queues: one histogram per
    /// operation by default, the first four queue ids and "other" with `--per-queue`, none for
    /// a disk `--device` leaves out; every command is counted once whichever the labels.
    #[test]
    fn nvme_commands_are_a_histogram_per_disk_and_op_and_per_queue_on_request() {
        use virtgap_probes::model::{NvmeQueueHist, NvmeSnapshot};
        let mut queues = Vec::new();
        for qid in 0..9u16 {
            for (op, n) in [(BlockOp::Read, 5), (BlockOp::Write, 2)] {
                let mut hist = KernelHist::default();
                hist.slots[40] = n;
                hist.count = n;
                hist.sum_ns = n * 20_000;
                queues.push(NvmeQueueHist {
                    dev: (259, 0),
                    qid,
                    op,
                    hist,
                });
            }
        }
        let snapshot = ProbeSnapshot {
            nvme: Some(NvmeSnapshot { queues, dropped: 0 }),
            ..Default::default()
        };
        let samples = |options: SeriesOptions| -> Vec<(String, String, u64)> {
            let mut exporter = fixture_exporter(CapabilityReport::default(), options);
            let families = exporter.families(&snapshot);
            let f = families
                .iter()
                .find(|f| f.name == "virtgap_nvme_command")
                .expect("the NVMe family");
            assert_eq!(f.unit, Some(MetricUnit::Seconds));
            f.samples
                .iter()
                .map(|s| {
                    let SampleValue::Histogram { count, .. } = &s.value else {
                        panic!("not a histogram: {s:?}")
                    };
                    (label_of(s, "qid"), label_of(s, "op"), *count)
                })
                .collect()
        };
        assert_eq!(
            samples(SeriesOptions::default()),
            [
                ("".into(), "read".into(), 45),
                ("".into(), "write".into(), 18)
            ]
        );
        let per_queue = samples(SeriesOptions {
            per_queue: true,
            ..Default::default()
        });
        let qids: std::collections::BTreeSet<&str> =
            per_queue.iter().map(|(q, ..)| q.as_str()).collect();
        assert_eq!(
            qids.into_iter().collect::<Vec<_>>(),
            ["0", "1", "2", "3", "other"]
        );
        let other_reads = per_queue
            .iter()
            .find(|(q, op, _)| q == "other" && op == "read")
            .map(|s| s.2);
        assert_eq!(other_reads, Some(5 * 5));
        assert_eq!(per_queue.iter().map(|s| s.2).sum::<u64>(), 45 + 18);
        assert!(samples(SeriesOptions {
            devices: vec!["another-disk".into()],
            ..Default::default()
        })
        .is_empty());
    }

    /// A disk known at attach has its series at zero on the first page, before its first
    /// request: Prometheus' `rate()` then counts that request, where a series born with it
    /// would start from its value. Unbound loop devices and bio-based disks have none.
    #[test]
    fn known_disks_series_start_at_zero() {
        let root = tempfile::tempdir().unwrap();
        let disk = |name: &str, mq: bool, size: &str, cache: &str| {
            let base = root.path().join("sys/block").join(name);
            std::fs::create_dir_all(base.join("queue")).unwrap();
            std::fs::write(base.join("dev"), "254:0\n").unwrap();
            if mq {
                std::fs::create_dir_all(base.join("mq/0")).unwrap();
            }
            std::fs::write(base.join("size"), size).unwrap();
            std::fs::write(base.join("queue/write_cache"), cache).unwrap();
        };
        disk("vda", true, "2048\n", "write back\n");
        disk("nvme0n1", true, "2048\n", "write through\n");
        disk("loop0", true, "0\n", "write through\n");
        disk("dm-0", false, "2048\n", "write through\n");
        let disks = request_disks(root.path());
        assert_eq!(
            disks,
            vec![("nvme0n1".to_string(), false), ("vda".to_string(), true)]
        );
        let snapshot = ProbeSnapshot {
            block: Some(Default::default()),
            ..Default::default()
        };
        let page = |series: SeriesOptions| {
            let mut exporter = fixture_exporter(CapabilityReport::default(), series);
            exporter.cx.disks = disks.clone();
            let families = exporter.families(&snapshot);
            let of = |name: &str| {
                families
                    .iter()
                    .find(|f| f.name == name)
                    .unwrap()
                    .samples
                    .iter()
                    .map(|s| {
                        let label = |k: &str| label_of(s, k);
                        let zero = match &s.value {
                            SampleValue::Histogram { count, sum, .. } => *count == 0 && *sum == 0.0,
                            SampleValue::Number(x) => *x == 0.0,
                            SampleValue::Count(n) => *n == 0,
                        };
                        assert!(zero, "{name}: {:?}", s.labels);
                        format!("{} {} {}", label("device"), label("op"), label("stage"))
                    })
                    .collect::<Vec<_>>()
            };
            (of("virtgap_block_stage"), of("virtgap_block_requests"))
        };
        let (stages, requests) = page(SeriesOptions::default());
        // nvme0n1 (no volatile cache): read and write; vda: flush too; three stages each.
        assert_eq!(stages.len(), (2 + 3) * 3, "{stages:?}");
        assert!(stages.contains(&"vda flush device".to_string()));
        assert!(!stages.iter().any(|s| s.starts_with("nvme0n1 flush")));
        assert_eq!(
            requests,
            [
                "nvme0n1 read ",
                "nvme0n1 write ",
                "vda flush ",
                "vda read ",
                "vda write "
            ]
        );
        let (stages, _) = page(SeriesOptions {
            devices: vec!["vda".into()],
            ..Default::default()
        });
        assert_eq!(stages.len(), 3 * 3);
        let (stages, requests) = page(SeriesOptions {
            per_queue: true,
            ..Default::default()
        });
        assert!(stages.is_empty() && requests.is_empty());
    }

    /// The build, each family's state from a fixed set, the last update and the process's own
    /// CPU and memory are exported on every page.
    #[test]
    fn operators_see_the_build_the_families_states_and_the_process() {
        use virtgap_probes::attach::AttachOutcome;
        use virtgap_probes::{Family, FamilyReport, Unavailable};
        let outcome = |attached| AttachOutcome {
            tracepoint: "t".into(),
            attached,
            reason: None,
        };
        let report = CapabilityReport {
            families: vec![
                FamilyReport {
                    family: Family::Block,
                    unavailable: None,
                    tracepoints: vec![outcome(Some(virtgap_probes::AttachKind::TpBtf))],
                    fallback: None,
                },
                FamilyReport {
                    family: Family::Irq,
                    unavailable: None,
                    tracepoints: vec![
                        outcome(Some(virtgap_probes::AttachKind::RawTp)),
                        outcome(None),
                    ],
                    fallback: None,
                },
                FamilyReport {
                    family: Family::KvmHost,
                    unavailable: Some(Unavailable::NothingToWatch(
                        virtgap_probes::error::Absent::KvmHost,
                    )),
                    tracepoints: vec![],
                    fallback: None,
                },
            ],
            ..CapabilityReport::default()
        };
        let mut exporter = fixture_exporter(report, SeriesOptions::default());
        let families = exporter.families(&ProbeSnapshot::default());
        let states: Vec<(String, String)> = families
            .iter()
            .find(|f| f.name == "virtgap_probe_family")
            .unwrap()
            .samples
            .iter()
            .map(|s| (s.labels[0].1.clone(), s.labels[1].1.clone()))
            .collect();
        assert_eq!(
            states,
            [
                ("block".to_string(), "attached".to_string()),
                ("irq".into(), "partial".into()),
                ("kvm-host".into(), "nothing_to_watch".into()),
            ]
        );
        let names: Vec<String> = families.iter().map(|f| f.exposed_name()).collect();
        for name in [
            "virtgap_build_info",
            "virtgap_last_update_timestamp_seconds",
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
    }

    /// The dashboard keeps apart what a VM-vs-metal reading must not pool: every quantile is
    /// per host or per platform, block stages are reads only (flushes and writes apart), the
    /// waterfall is one panel per host, host_info joins survive a relabel that doubles it, a
    /// CPU with one of the IRQ counters is not dropped by a join, and idle halts are not
    /// hypervisor time.
    #[test]
    fn the_dashboard_keeps_hosts_platforms_and_ops_apart() {
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../../grafana/virtgap-dashboard.json")).unwrap();
        let panels = dashboard["panels"].as_array().unwrap();
        for p in panels {
            let title = p["title"].as_str().unwrap();
            for t in p["targets"].as_array().unwrap() {
                let q = t["expr"].as_str().unwrap();
                if let Some(at) = q.find("histogram_quantile(") {
                    let by = &q[at..q[at..].find(')').map_or(q.len(), |e| at + e)];
                    assert!(
                        by.contains("instance") || by.contains("platform"),
                        "{title}: a quantile pooled over hosts: {q}"
                    );
                }
                if q.contains("virtgap_block_stage_seconds") {
                    assert!(q.contains("op=\"read\""), "{title}: ops blended: {q}");
                }
                if q.contains("virtgap_host_info") && !q.starts_with("label_values") {
                    assert!(
                        q.contains("max by (instance, platform) (virtgap_host_info)"),
                        "{title}: a host_info join a relabel can double: {q}"
                    );
                }
                assert!(
                    !q.contains(" + on ("),
                    "{title}: a join drops what one side lacks: {q}"
                );
                if q.contains("virtgap_hypervisor_mechanism_seconds_total") {
                    assert!(q.contains("mechanism!=\"halt\""), "{title}: {q}");
                }
            }
        }
        let waterfall = panels
            .iter()
            .find(|p| p["title"].as_str().unwrap().contains("waterfall"))
            .unwrap();
        assert_eq!(waterfall["repeat"], "instance", "{waterfall}");
    }

    /// The Grafana dashboard's queries name only series `serve` exports.
    #[test]
    fn the_dashboard_queries_only_metrics_serve_exports() {
        let mut exported = BTreeSet::new();
        for f in every_family() {
            let name = f.exposed_name();
            if f.kind == MetricKind::Histogram {
                for suffix in ["_bucket", "_sum", "_count"] {
                    exported.insert(format!("{name}{suffix}"));
                }
            } else {
                exported.insert(name);
            }
        }
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../../grafana/virtgap-dashboard.json")).unwrap();
        let mut queries: Vec<String> = dashboard["panels"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| {
                let targets = p["targets"].as_array().unwrap();
                assert!(!targets.is_empty(), "a panel with no query: {}", p["title"]);
                targets
                    .iter()
                    .map(|t| t["expr"].as_str().unwrap().to_string())
            })
            .collect();
        for v in dashboard["templating"]["list"].as_array().unwrap() {
            if let Some(q) = v["definition"].as_str() {
                queries.push(q.to_string());
            }
        }
        let mut named = 0;
        for q in &queries {
            let mut rest = q.as_str();
            while let Some(at) = rest.find("virtgap_") {
                let name: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(exported.contains(&name), "{name} is not exported (in {q})");
                named += 1;
                rest = &rest[at + name.len()..];
            }
        }
        assert!(named >= queries.len(), "every query names a metric");
        // The views the dashboard is for.
        let titles: Vec<&str> = dashboard["panels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["title"].as_str().unwrap())
            .collect();
        for view in ["waterfall", "platform", "p99", "per CPU", "Hypervisor"] {
            assert!(
                titles.iter().any(|t| t.contains(view)),
                "no {view} panel: {titles:?}"
            );
        }
    }
}
