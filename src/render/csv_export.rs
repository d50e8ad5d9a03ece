//! CSV export of a profile: tidy files (one observation per row, units in the metric or column
//! names, a schema version in every row) that open in a spreadsheet or pandas without cleanup.
//! Pure: a profile in, file contents out.

use crate::model::hypervisor::HypervisorSection;
use crate::model::interval::{CpuLoad, Interval};
use crate::model::kv::KvSection;
use crate::model::profile::Profile;
use crate::model::stages::Stage;

/// Version of the CSV layout; bump when columns or metric names change.
pub const CSV_SCHEMA_VERSION: u32 = 3;

pub const FILES: [&str; 5] = [
    "intervals.csv",
    "histograms.csv",
    "summary.csv",
    "host.csv",
    "runs.csv",
];

pub const INTERVAL_COLUMNS: [&str; 12] = [
    "schema_version",
    "host",
    "label",
    "interval",
    "start_s",
    "end_s",
    "metric",
    "cpu",
    "device",
    "stage",
    "name",
    "value",
];
pub const HISTOGRAM_COLUMNS: [&str; 11] = [
    "schema_version",
    "host",
    "label",
    "run",
    "device",
    "op",
    "queue",
    "stage",
    "bucket_low_ns",
    "bucket_high_ns",
    "count",
];
pub const SUMMARY_COLUMNS: [&str; 5] = ["schema_version", "host", "label", "metric", "value"];
pub const HOST_COLUMNS: [&str; 5] = ["schema_version", "host", "label", "key", "value"];
pub const RUN_COLUMNS: [&str; 6] = ["schema_version", "host", "label", "run", "metric", "value"];

/// One CSV file being written: every row leads with the schema version and the host's name and
/// label, so files of several hosts concatenate into one table.
struct CsvFile {
    w: csv::Writer<Vec<u8>>,
    lead: [String; 3],
}

impl CsvFile {
    fn new(columns: &[&str], p: &Profile) -> Self {
        let mut w = csv::Writer::from_writer(Vec::new());
        w.write_record(columns).expect("writing to memory");
        let name = |s: &Option<String>| s.clone().unwrap_or_default();
        Self {
            w,
            lead: [
                CSV_SCHEMA_VERSION.to_string(),
                name(&p.host.hostname),
                name(&p.host.label),
            ],
        }
    }

    fn row<'a>(&mut self, fields: impl IntoIterator<Item = &'a str>) {
        let Self { w, lead } = self;
        for field in lead.iter() {
            w.write_field(field).expect("writing to memory");
        }
        w.write_record(fields).expect("writing to memory");
    }

    fn finish(self) -> String {
        String::from_utf8(self.w.into_inner().expect("flushing to memory")).expect("CSV is UTF-8")
    }
}

fn num(v: f64) -> String {
    if v.is_finite() {
        // Three decimals; figures too large for the rounding to fit print as they are.
        let rounded = (v * 1000.0).round() / 1000.0;
        format!("{}", if rounded.is_finite() { rounded } else { v })
    } else {
        String::new()
    }
}

/// `intervals.csv`: one row per interval x metric, labelled by cpu / device / stage / name.
pub fn intervals(p: &Profile) -> String {
    let mut w = CsvFile::new(&INTERVAL_COLUMNS, p);
    let device = p.target.device.clone().unwrap_or_default();
    for iv in &p.intervals {
        let mut rows = IntervalRows {
            w: &mut w,
            iv,
            bytes_measured: p.attached.is_none(),
        };
        rows.workload();
        rows.stages(&device);
        for c in &iv.cpus {
            rows.cpu(c);
        }
        if let Some(ns) = iv.probe_run_ns {
            let pct = rows.rate(ns as f64 / 1e9) * 100.0;
            rows.row("probe_cpu_pct", None, "", "", "", pct);
        }
    }
    w.finish()
}

/// The rows of one interval of `intervals.csv`.
struct IntervalRows<'a> {
    w: &'a mut CsvFile,
    iv: &'a Interval,
    /// False for attached runs, whose request sizes are not measured: no bandwidth rows.
    bytes_measured: bool,
}

impl IntervalRows<'_> {
    /// Per second of the interval.
    fn rate(&self, x: f64) -> f64 {
        let secs = self.iv.end_s - self.iv.start_s;
        if secs > 0.0 {
            x / secs
        } else {
            0.0
        }
    }

    fn row(
        &mut self,
        metric: &str,
        cpu: Option<u32>,
        dev: &str,
        stage: &str,
        name: &str,
        value: f64,
    ) {
        let iv = self.iv;
        self.w.row([
            iv.index.to_string().as_str(),
            &num(iv.start_s),
            &num(iv.end_s),
            metric,
            &cpu.map(|c| c.to_string()).unwrap_or_default(),
            dev,
            stage,
            name,
            &num(value),
        ]);
    }

    /// Throughput and the app latency.
    fn workload(&mut self) {
        let iv = self.iv;
        for (metric, x) in [
            ("read_iops", iv.read_ios),
            ("write_iops", iv.write_ios),
            ("read_bw_bytes_per_s", iv.read_bytes),
            ("write_bw_bytes_per_s", iv.write_bytes),
        ] {
            if !self.bytes_measured && metric.contains("_bw_") {
                continue;
            }
            let value = self.rate(x as f64);
            self.row(metric, None, "", "", "", value);
        }
        if iv.lat_count > 0 {
            let mean = iv.lat_sum_ns / iv.lat_count as f64;
            self.row("lat_mean_ns", None, "", "app", "", mean);
        }
        if let Some(p50) = iv.lat_p50_ns {
            self.row("lat_p50_ns", None, "", "app", "", p50 as f64);
        }
        if let Some(p99) = iv.lat_p99_ns {
            self.row("lat_p99_ns", None, "", "app", "", p99 as f64);
        }
    }

    /// Each probed stage's count and mean (block stages on the target's `device`).
    fn stages(&mut self, device: &str) {
        for (stage, s) in &self.iv.stages {
            let dev = if stage == Stage::Wakeup.name() {
                ""
            } else {
                device
            };
            self.row("stage_count", None, dev, stage, "", s.count as f64);
            if s.count > 0 {
                let mean = s.sum_ns as f64 / s.count as f64;
                self.row("stage_mean_ns", None, dev, stage, "", mean);
            }
        }
    }

    /// One CPU's interrupt load, time by state, IRQs, IPIs and cross-CPU calls.
    fn cpu(&mut self, c: &CpuLoad) {
        let cpu = Some(c.cpu);
        let shares = [
            ("hardirq_pct", Some(c.hardirq_ns)),
            ("softirq_pct", Some(c.softirq_ns)),
            ("user_pct", c.user_ns),
            ("system_pct", c.system_ns),
            ("steal_pct", c.steal_ns),
        ];
        for (metric, ns) in shares {
            if let Some(ns) = ns {
                let pct = self.rate(ns as f64 / 1e9) * 100.0;
                self.row(metric, cpu, "", "", "", pct);
            }
        }
        for (name, n) in &c.irqs {
            let value = self.rate(*n as f64);
            self.row("irqs_per_s", cpu, "", "", name, value);
        }
        for (metric, counts) in [
            ("ipis_sent_per_s", &c.ipis_sent),
            ("cross_cpu_calls_per_s", &c.cross_cpu_calls),
        ] {
            for (kind, n) in counts {
                let value = self.rate(*n as f64);
                self.row(metric, cpu, "", "", kind, value);
            }
        }
    }
}

/// `histograms.csv`: one row per non-empty bucket of each stage histogram — of the profile's
/// runs pooled (`run` "all"), of each run, and of each disk (`device`) by kind of request (`op`
/// "read", "write", "flush"; "all" for the disk's requests together) — and of each NVMe disk's
/// commands per queue id (`stage` "nvme_command", `queue` the id, 0 the admin queue).
pub fn histograms(p: &Profile) -> String {
    use crate::model::histogram::Histogram;
    let mut w = CsvFile::new(&HISTOGRAM_COLUMNS, p);
    let mut rows = |[run, device, op, queue]: [&str; 4], stage: &str, h: Option<&Histogram>| {
        for [low, high, count] in h.map(|h| h.buckets.as_slice()).unwrap_or_default() {
            w.row([
                run,
                device,
                op,
                queue,
                stage,
                &low.to_string(),
                &high.to_string(),
                &count.to_string(),
            ]);
        }
    };
    for stage in Stage::ALL {
        rows(["all", "", "", ""], stage.name(), p.stages.get(stage));
    }
    for r in &p.runs {
        let run = r.run.to_string();
        for stage in Stage::ALL {
            rows([&run, "", "", ""], stage.name(), r.stages.get(stage));
        }
    }
    for d in &p.devices {
        let by_op = std::iter::once(("all", &d.stages))
            .chain(d.ops.iter().map(|o| (o.op.as_str(), &o.stages)));
        for (op, s) in by_op {
            for (stage, h) in [
                (Stage::Queue, &s.queue),
                (Stage::Device, &s.device),
                (Stage::Completion, &s.completion),
            ] {
                rows(["all", &d.name, op, ""], stage.name(), h.as_ref());
            }
        }
        for q in &d.nvme_queues {
            let qid = q.qid.to_string();
            rows(
                ["all", &d.name, "all", &qid],
                "nvme_command",
                q.latency.as_ref(),
            );
        }
    }
    w.finish()
}

/// `summary.csv`: one row per whole-run metric; units in the metric name.
pub fn summary(p: &Profile) -> String {
    let mut rows = SummaryRows(CsvFile::new(&SUMMARY_COLUMNS, p));
    let r = &p.results;
    rows.row("complete".into(), Some(if p.complete { 1.0 } else { 0.0 }));
    rows.row("measured_s".into(), Some(r.measured_s));
    rows.directions(p);
    if let Some(h) = p.hypervisor.as_ref().filter(|h| h.seconds > 0.0) {
        rows.hypervisor(h, (r.read.ios + r.write.ios) as f64);
    }
    rows.row("usr_cpu_pct".into(), Some(r.usr_cpu_pct));
    rows.row("sys_cpu_pct".into(), Some(r.sys_cpu_pct));
    rows.row("cpu_ns_per_io".into(), r.cpu_ns_per_io);
    rows.stages(p);
    if let Some(secs) = p.probe_seconds.filter(|s| *s > 0.0) {
        rows.cpus(&p.cpus, secs);
    }
    rows.row("probe_cpu_pct".into(), p.self_overhead.probe_cpu_pct);
    rows.row("recorder_cpu_pct".into(), p.self_overhead.recorder_cpu_pct);
    rows.row("probe_dropped".into(), Some(p.self_overhead.dropped as f64));
    if let Some(kv) = &p.kv {
        rows.kv(kv);
    }
    rows.0.finish()
}

/// The rows of `summary.csv`, section by section.
struct SummaryRows(CsvFile);

impl SummaryRows {
    /// A metric's row; none when the metric has no value.
    fn row(&mut self, metric: String, value: Option<f64>) {
        if let Some(value) = value {
            self.0.row([metric.as_str(), &num(value)]);
        }
    }

    /// Each direction that did I/O: its count, rate and latencies.
    fn directions(&mut self, p: &Profile) {
        let r = &p.results;
        for (dir, d) in [("read", &r.read), ("write", &r.write)] {
            if d.ios == 0 {
                continue;
            }
            self.row(format!("{dir}_ios"), Some(d.ios as f64));
            self.row(format!("{dir}_iops"), Some(d.iops));
            // An attached run counts requests; their bytes are not measured.
            if p.attached.is_none() {
                self.row(format!("{dir}_bw_bytes_per_s"), Some(d.bw_bytes_per_s));
            }
            let mut lats = vec![("slat", &d.slat), ("clat", &d.clat), ("lat", &d.lat)];
            if let Some(li) = &d.lat_intended {
                lats.push(("lat_intended", li));
            }
            for (name, h) in lats {
                self.row(format!("{dir}_{name}_mean_ns"), h.mean_ns());
                self.row(format!("{dir}_{name}_p50_ns"), h.percentile_ns(50.0));
                self.row(format!("{dir}_{name}_p99_ns"), h.percentile_ns(99.0));
                self.row(format!("{dir}_{name}_p99_9_ns"), h.percentile_ns(99.9));
                self.row(format!("{dir}_{name}_max_ns"), h.max_ns.map(|x| x as f64));
            }
        }
    }

    /// The hypervisor's mechanisms and CPU time, per second and per I/O (of `ios`). Metal has
    /// no hypervisor rows at all (host.csv says `hypervisor,none`), never zeros: its native
    /// work at the callers guests' paths share is `native_*`.
    fn hypervisor(&mut self, h: &HypervisorSection, ios: f64) {
        let prefix = if h.is_guest() { "hv" } else { "native" };
        for m in &h.mechanisms {
            let name = m.mechanism.name();
            self.row(
                format!("{prefix}_{name}_per_s"),
                m.count.map(|n| n as f64 / h.seconds),
            );
            if ios > 0.0 {
                self.row(
                    format!("{prefix}_{name}_per_io"),
                    m.count.map(|n| n as f64 / ios),
                );
                self.row(
                    format!("{prefix}_{name}_time_ns_per_io"),
                    m.time_ns.map(|t| t / ios),
                );
            }
        }
        if let Some(cpu) = &h.cpu {
            self.row("hv_cpu_pct".into(), Some(cpu.ns / 1e9 / h.seconds * 100.0));
            if ios > 0.0 {
                self.row("hv_cpu_ns_per_io".into(), Some(cpu.ns / ios));
            }
        }
    }

    /// Each probed stage's count, mean and percentiles.
    fn stages(&mut self, p: &Profile) {
        for (stage, h) in Stage::PROBED.map(|s| (s.name(), p.stages.get(s))) {
            if let Some(h) = h {
                self.row(format!("{stage}_count"), Some(h.count as f64));
                self.row(format!("{stage}_mean_ns"), h.mean_ns());
                self.row(format!("{stage}_p50_ns"), h.percentile_ns(50.0));
                self.row(format!("{stage}_p99_ns"), h.percentile_ns(99.0));
                self.row(format!("{stage}_p99_9_ns"), h.percentile_ns(99.9));
            }
        }
    }

    /// Each CPU's interrupt and steal time, as a share of the `secs` probed.
    fn cpus(&mut self, cpus: &[CpuLoad], secs: f64) {
        for c in cpus {
            self.row(
                format!("cpu{}_hardirq_pct", c.cpu),
                Some(c.hardirq_ns as f64 / 1e9 / secs * 100.0),
            );
            self.row(
                format!("cpu{}_softirq_pct", c.cpu),
                Some(c.softirq_ns as f64 / 1e9 / secs * 100.0),
            );
            self.row(
                format!("cpu{}_steal_pct", c.cpu),
                c.steal_ns.map(|ns| ns as f64 / 1e9 / secs * 100.0),
            );
        }
    }

    /// kv runs: the verdict (1 pass, 0 fail, absent without a complete slice) and the target
    /// and achieved client and large-block rates.
    fn kv(&mut self, kv: &KvSection) {
        self.row("kv_pass".into(), kv.verdict.map(|b| f64::from(u8::from(b))));
        self.row("kv_mismatches".into(), Some(kv.mismatches as f64));
        // Shares of the scheduled load done (a pass needs 0.99 of both).
        self.row(
            "kv_delivered_client".into(),
            Some(kv.delivered.client_fraction),
        );
        self.row(
            "kv_delivered_large_blocks".into(),
            Some(kv.delivered.large_block_fraction),
        );
        for (side, rates) in [("target", &kv.target), ("achieved", &kv.achieved)] {
            for (stream, rate) in rates.streams() {
                self.row(format!("kv_{side}_{stream}_per_s"), Some(rate));
            }
        }
        // Each definition's pass (ACT's, the device read's time; the client's, from the
        // schedule), absent in older profiles.
        self.row(
            "kv_service_pass".into(),
            kv.service_pass.map(|b| f64::from(u8::from(b))),
        );
        self.row(
            "kv_intended_pass".into(),
            kv.intended_pass.map(|b| f64::from(u8::from(b))),
        );
        // The rings' device reads: the share of their time queued behind other reads (absent
        // when none went out alone) and the limit on reads in flight per ring.
        if let Some(q) = &kv.read_queueing {
            self.row("kv_read_queued_share".into(), q.queued_share);
            self.row("kv_inflight_limit_mean".into(), q.limit_mean);
            self.row("kv_inflight_limit_min".into(), Some(f64::from(q.limit_min)));
            self.row("kv_inflight_limit_max".into(), Some(f64::from(q.limit_max)));
        }
        self.kv_slices(kv);
    }

    /// Each kv slice's shares of reads (by the device's time and by the intended time) at or
    /// over 1, 8 and 64 ms.
    fn kv_slices(&mut self, kv: &KvSection) {
        for (i, slice) in kv.slices.iter().enumerate() {
            let (device, intended) = crate::render::kv_report::slice_shares(slice);
            for (name, shares) in [("reads", device), ("intended_reads", intended)] {
                let Some(r) = shares else { continue };
                for (over, pct) in [
                    ("1ms", r.pct_at_or_over_1ms),
                    ("8ms", r.pct_at_or_over_8ms),
                    ("64ms", r.pct_at_or_over_64ms),
                ] {
                    self.row(
                        format!("kv_slice{i}_{name}_pct_at_or_over_{over}"),
                        Some(pct),
                    );
                }
            }
        }
    }
}

/// `host.csv`: the fingerprint flattened to key/value rows.
pub fn host(p: &Profile) -> String {
    let mut w = CsvFile::new(&HOST_COLUMNS, p);
    let h = &p.host;
    let mut row = |key: String, value: String| {
        w.row([key.as_str(), &value]);
    };
    let opt = |s: &Option<String>| s.clone().unwrap_or_default();
    row("platform_description".into(), h.describe());
    row("hypervisor".into(), h.hypervisor.clone());
    row("platform".into(), h.platform.clone());
    row("instance_type".into(), opt(&h.instance_type));
    row("cpuid_signature".into(), opt(&h.cpuid.signature));
    row("clocksource".into(), opt(&h.clocksource));
    if let Some(ce) = &h.clockevent {
        row("clockevent".into(), ce.clone());
    }
    row("kernel".into(), opt(&h.kernel));
    row("btf".into(), h.btf.to_string());
    row("cpu_model".into(), opt(&h.cpu_model));
    row("cpus".into(), h.cpus.to_string());
    row(
        "smt_active".into(),
        h.smt_active.map(|b| b.to_string()).unwrap_or_default(),
    );
    for d in &h.block_devices {
        let k = |field: &str| format!("device.{}.{field}", d.name);
        row(k("kind"), d.kind.clone());
        row(k("scheduler"), opt(&d.scheduler));
        row(
            k("nr_requests"),
            d.nr_requests.map(|n| n.to_string()).unwrap_or_default(),
        );
        row(
            k("rq_affinity"),
            d.rq_affinity.map(|n| n.to_string()).unwrap_or_default(),
        );
        row(k("queues"), d.queues.len().to_string());
        for q in &d.queues {
            if let Some(irq) = &q.irq {
                row(
                    k(&format!("queue{}.irq", q.index)),
                    format!("{} {}", irq.irq, irq.name),
                );
                row(k(&format!("queue{}.irq_chip", q.index)), irq.chip.clone());
                row(
                    k(&format!("queue{}.irq_cpus", q.index)),
                    opt(&irq.effective_affinity),
                );
            }
        }
    }
    w.finish()
}

/// All four files: (name, contents).
/// `runs.csv`: one row per run x metric — the replicates `diff` compares (a profile from
/// before runs were kept reads as one run).
pub fn runs(p: &Profile) -> String {
    let mut w = CsvFile::new(&RUN_COLUMNS, p);
    for (r, _) in p.replicates() {
        let run = r.run.to_string();
        let mut row = |metric: &str, value: f64| {
            w.row([run.as_str(), metric, &num(value)]);
        };
        row("complete", if r.complete { 1.0 } else { 0.0 });
        row("measured_s", r.measured_s);
        row("read_ios", r.read_ios as f64);
        row("write_ios", r.write_ios as f64);
        if let Some(iops) = r.iops() {
            row("iops", iops);
        }
        for stage in Stage::ALL {
            let Some(h) = r.stages.get(stage) else {
                continue;
            };
            let name = stage.name();
            if let Some(m) = h.mean_ns() {
                row(&format!("{name}_mean_ns"), m);
            }
            for (label, pct) in [("p99", 99.0), ("p999", 99.9)] {
                if let Some(x) = h.percentile_ns(pct) {
                    row(&format!("{name}_{label}_ns"), x);
                }
            }
        }
        for (metric, value) in [
            ("hardirq_ns", r.hardirq_ns),
            ("softirq_ns", r.softirq_ns),
            ("ipis_sent", r.ipis_sent),
            ("msr_writes", r.msr_writes),
        ] {
            if let Some(x) = value {
                row(metric, x as f64);
            }
        }
    }
    w.finish()
}

pub fn export(p: &Profile) -> [(&'static str, String); 5] {
    [
        (FILES[0], intervals(p)),
        (FILES[1], histograms(p)),
        (FILES[2], summary(p)),
        (FILES[3], host(p)),
        (FILES[4], runs(p)),
    ]
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::model::histogram::Histogram;
    use crate::model::host::{BlockDeviceInfo, Cpuid, Fingerprint, HwQueue, QueueIrq};
    use crate::model::interval::{CpuLoad, Interval, StageSample};
    use crate::model::profile::*;
    use crate::model::stages::Stages;

    fn hist(values: &[u64]) -> Histogram {
        Histogram::of_values(values)
    }

    /// A small profile with every kind of row, fixed so the output never changes by accident.
    pub(crate) fn fixture() -> Profile {
        let host = Fingerprint {
            label: None,
            hostname: None,
            cpuid: Cpuid {
                hypervisor_bit: true,
                signature: Some("KVMKVMKVM".into()),
                leaves: vec![],
                features: vec![],
            },
            hypervisor: "kvm".into(),
            platform: "microvm".into(),
            instance_type: None,
            dmi: None,
            sys_hypervisor_type: None,
            clocksource: Some("tsc".into()),
            available_clocksources: vec!["tsc".into(), "kvm-clock".into()],
            clockevent: None,
            kernel: Some("6.18.0".into()),
            btf: true,
            cpu_model: Some("AMD EPYC".into()),
            cpus: 2,
            smt_active: Some(false),
            block_devices: vec![BlockDeviceInfo {
                name: "vda".into(),
                kind: "virtio-blk".into(),
                driver_device: Some("virtio1".into()),
                model: None,
                scheduler: Some("none".into()),
                nr_requests: Some(256),
                rq_affinity: Some(1),
                io_poll: Some(false),
                logical_block_size: Some(512),
                queues: vec![HwQueue {
                    index: 0,
                    cpu_list: "0-1".into(),
                    irq: Some(QueueIrq {
                        irq: 36,
                        name: "virtio1-req.0".into(),
                        chip: "PCI-MSIX-0000:00:02.0".into(),
                        effective_affinity: Some("1".into()),
                    }),
                }],
            }],
        };
        let cpu = CpuLoad {
            irq_time_ns: BTreeMap::new(),
            cpu: 1,
            hardirq_ns: 10_000_000,
            softirq_ns: 50_000_000,
            hardirq_count: 2_000,
            softirq_count: 2_100,
            irqs: BTreeMap::from([("virtio1-req.0".to_string(), 2_000)]),
            ipis_sent: BTreeMap::from([("reschedule".to_string(), 10)]),
            cross_cpu_calls: BTreeMap::new(),
            vectors: BTreeMap::from([("local_timer".to_string(), 250)]),
            user_ns: Some(40_000_000),
            system_ns: Some(300_000_000),
            idle_ns: Some(1_600_000_000),
            steal_ns: Some(2_000_000),
        };
        let stages = BTreeMap::from([
            (
                "device".to_string(),
                StageSample {
                    count: 1000,
                    sum_ns: 400_000_000,
                },
            ),
            (
                "queue".to_string(),
                StageSample {
                    count: 1000,
                    sum_ns: 2_000_000,
                },
            ),
        ]);
        let read = DirectionResult {
            ios: 2000,
            bytes: 2000 * 4096,
            iops: 1000.0,
            bw_bytes_per_s: 4_096_000.0,
            slat: hist(&[1_000, 2_000]),
            clat: hist(&[400_000, 500_000]),
            lat: hist(&[401_000, 502_000]),
            lat_intended: None,
        };
        Profile {
            schema_version: SCHEMA_VERSION,
            complete: true,
            run: RunInfo {
                tool_version: "0.1.0".into(),
                command_line: vec!["virtgap".into(), "record".into()],
                started_unix_ms: 1_700_000_000_000,
                ended_unix_ms: 1_700_000_002_000,
                interval_s: 1.0,
                requested_interval_s: None,
                max_intervals: None,
                complete: true,
            },
            host,
            capabilities: None,
            hypervisor: None,
            workload: WorkloadInfo {
                name: "rand4k".into(),
                ..Default::default()
            },
            target: TargetInfo {
                description: "temp file".into(),
                path: "/tmp/x".into(),
                size_bytes: 1 << 30,
                device: Some("vda".into()),
                stage_devices: vec!["vda".into()],
                device_note: None,
            },
            results: WorkloadResult {
                read,
                measured_s: 2.0,
                usr_cpu_pct: 2.5,
                sys_cpu_pct: 30.0,
                cpu_ns_per_io: Some(5_000.0),
                engine_features: "fixed buffers".into(),
                ..Default::default()
            },
            stages: Stages {
                app: hist(&[401_000, 502_000]),
                queue: Some(hist(&[2_000, 2_100])),
                device: Some(hist(&[399_000, 401_000])),
                completion: None,
                wakeup: None,
                flush: None,
            },
            intervals: (0..2)
                .map(|i| Interval {
                    index: i,
                    start_s: i as f64,
                    end_s: i as f64 + 1.0,
                    read_ios: 1000,
                    read_bytes: 4_096_000,
                    lat_count: 1000,
                    lat_sum_ns: 450_000_000.0,
                    lat_p50_ns: Some(449_000),
                    lat_p99_ns: Some(900_000),
                    stages: stages.clone(),
                    cpus: vec![cpu.clone()],
                    probe_run_ns: Some(3_000_000),
                    ..Default::default()
                })
                .collect(),
            cpus: vec![cpu],
            probe_seconds: Some(2.0),
            block: None,
            cpu_pairs: vec![[1, 1, 2000]],
            virtualization: None,
            calibration: None,
            kv: None,
            attached: None,
            self_overhead: SelfOverhead {
                programs: Some(vec![]),
                stats_seconds: Some(2.0),
                probe_cpu_pct: Some(0.3),
                dropped: 0,
                recorder_cpu_pct: Some(0.2),
            },
            devices: vec![],
            stalls: None,
            runs: Vec::new(),
        }
    }

    #[test]
    fn csv_files_match_their_snapshots() {
        for (name, text) in export(&fixture()) {
            insta::assert_snapshot!(name.replace('.', "_"), text);
        }
    }

    #[test]
    fn every_row_has_the_declared_columns() {
        let mut p = fixture();
        p.host.hostname = Some("db-vm-1".into());
        p.host.label = Some("vm".into());
        for (name, text, cols) in [
            ("intervals", intervals(&p), INTERVAL_COLUMNS.len()),
            ("histograms", histograms(&p), HISTOGRAM_COLUMNS.len()),
            ("summary", summary(&p), SUMMARY_COLUMNS.len()),
            ("host", host(&p), HOST_COLUMNS.len()),
            ("runs", runs(&p), RUN_COLUMNS.len()),
        ] {
            let mut r = csv::Reader::from_reader(text.as_bytes());
            assert_eq!(r.headers().unwrap().len(), cols, "{name}");
            let rows: Vec<_> = r.records().map(|x| x.unwrap()).collect();
            assert!(!rows.is_empty(), "{name}");
            assert!(
                rows.iter().all(|row| row.len() == cols
                    && row[0] == *CSV_SCHEMA_VERSION.to_string()
                    && (&row[1], &row[2]) == ("db-vm-1", "vm")),
                "{name}"
            );
        }
    }

    /// The per-run curves the diff judges, each disk's by kind of request, and an NVMe disk's
    /// per queue id can be rebuilt from `histograms.csv`: every histogram's buckets add up to
    /// its count.
    #[test]
    fn histograms_hold_each_run_and_each_disk_by_op() {
        use crate::model::devices::{DeviceProfile, DeviceStages, OpStages};
        use crate::model::profile::RunRecord;
        let mut p = fixture();
        let run = |n| RunRecord {
            run: n,
            stages: p.stages.clone(),
            ..Default::default()
        };
        p.runs = vec![run(1), run(2)];
        let stages = DeviceStages {
            queue: p.stages.queue.clone(),
            device: p.stages.device.clone(),
            completion: None,
        };
        let nvme = |qid| crate::model::devices::NvmeQueueLatency {
            qid,
            latency: p.stages.device.clone(),
            ..Default::default()
        };
        p.devices = vec![DeviceProfile {
            name: "vda".into(),
            stages: stages.clone(),
            ops: vec![OpStages {
                op: "read".into(),
                stages,
            }],
            nvme_queues: vec![nvme(1), nvme(2)],
            ..Default::default()
        }];
        let text = histograms(&p);
        // Each NVMe queue's commands, under its id.
        for qid in ["1", "2"] {
            let commands: u64 = csv::Reader::from_reader(text.as_bytes())
                .records()
                .map(|r| r.unwrap())
                .filter(|r| &r[7] == "nvme_command" && &r[6] == qid && &r[4] == "vda")
                .map(|r| r[10].parse::<u64>().unwrap())
                .sum();
            assert_eq!(commands, p.stages.device.as_ref().unwrap().count, "q{qid}");
        }
        let mut counts: std::collections::BTreeMap<(String, String, String, String), u64> =
            Default::default();
        for row in csv::Reader::from_reader(text.as_bytes()).records() {
            let row = row.unwrap();
            let key = (
                row[3].to_string(),
                row[4].to_string(),
                row[5].to_string(),
                row[7].to_string(),
            );
            *counts.entry(key).or_default() += row[10].parse::<u64>().unwrap();
        }
        let device_count = p.stages.device.as_ref().unwrap().count;
        let key = |run: &str, dev: &str, op: &str, stage: &str| {
            (
                run.to_string(),
                dev.to_string(),
                op.to_string(),
                stage.to_string(),
            )
        };
        for k in [
            key("all", "", "", "device"),
            key("1", "", "", "device"),
            key("2", "", "", "device"),
            key("all", "vda", "all", "device"),
            key("all", "vda", "read", "device"),
        ] {
            assert_eq!(counts.get(&k), Some(&device_count), "{k:?}\n{text}");
        }
    }
}
