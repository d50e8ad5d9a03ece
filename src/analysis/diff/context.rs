//! What is shown beside the compared rows, as numbers and settings: how the workloads and the
//! hosts differ, host-level evidence, and the warnings that qualify the verdicts.

use virtgap_probes::virt::SampleCategory;

use super::{Host, Hosts};
use crate::model::host::BlockDeviceInfo;
use crate::model::profile::Profile;
use crate::model::stages::{QueueStart, RequestsPerIo};
use crate::model::stalls::Stalls;
use crate::model::virtualization::{MsrRate, MsrWrites};

/// Keys of the workload spec that change what is measured (duration and ramp only change how
/// long, and the name and description nothing).
const SHAPE_KEYS: [&str; 12] = [
    "pattern",
    "rw",
    "rwmix_read",
    "bs",
    "qd",
    "workers",
    "engine",
    "distribution",
    "rate_iops",
    "size",
    "direct",
    "submit_batch",
];

/// Keys of a kv spec's `[kv]` table that change what is measured, besides the client load
/// (compared as resolved rates, however they were written); the slice and `max_lag` change
/// only how it is judged.
const KV_SHAPE_KEYS: [&str; 5] = [
    "record_bytes",
    "record_bytes_max",
    "defrag_lwm_pct",
    "fill_pct",
    "dsync",
];

/// A workload key that changes what is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecKey {
    /// A key of the workload spec (one of `SHAPE_KEYS`).
    Workload(&'static str),
    /// A kv workload's client load, as resolved rates.
    KvLoad,
    /// A key of a kv spec's `[kv]` table (one of `KV_SHAPE_KEYS`).
    Kv(&'static str),
}

impl SpecKey {
    /// The workload's own keys first, in their usual order, then the kv load and the kv
    /// table's keys by name.
    fn order(self) -> (usize, u8, &'static str) {
        match self {
            Self::Workload(k) => (SHAPE_KEYS.iter().position(|s| *s == k).unwrap_or(0), 0, k),
            Self::KvLoad => (SHAPE_KEYS.len(), 0, ""),
            Self::Kv(k) => (SHAPE_KEYS.len(), 1, k),
        }
    }
}

/// A workload key's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpecValue {
    /// As the spec's TOML writes it.
    Toml(String),
    KvLoad {
        reads_per_s: u64,
        writes_per_s: u64,
    },
    /// A `[kv]` table that does not read as a kv spec.
    Unreadable,
}

/// A workload key whose values differ (None: unset on that side).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecDifference {
    pub key: SpecKey,
    pub a: Option<SpecValue>,
    pub b: Option<SpecValue>,
}

/// The keys of a profile's effective spec that change what is measured (none when the spec
/// does not parse).
fn spec_shape(p: &Profile) -> Vec<(SpecKey, SpecValue)> {
    if let Some(a) = &p.attached {
        return attached_shape(a);
    }
    let Ok(table) = toml::from_str::<toml::Table>(&p.workload.effective_spec) else {
        return Vec::new();
    };
    let mut keys: Vec<(SpecKey, SpecValue)> = SHAPE_KEYS
        .iter()
        .filter_map(|&k| {
            Some((
                SpecKey::Workload(k),
                SpecValue::Toml(table.get(k)?.to_string()),
            ))
        })
        .collect();
    if let Some(kv) = table.get("kv").and_then(|v| v.as_table()) {
        keys.retain(|(k, _)| *k != SpecKey::Workload("workers"));
        for k in KV_SHAPE_KEYS {
            if let Some(v) = kv.get(k) {
                keys.push((SpecKey::Kv(k), SpecValue::Toml(v.to_string())));
            }
        }
        let load = kv
            .clone()
            .try_into::<virtgap_workloads::kv::spec::KvSpec>()
            .map(|k| {
                let (reads_per_s, writes_per_s) = k.rates();
                SpecValue::KvLoad {
                    reads_per_s,
                    writes_per_s,
                }
            })
            .unwrap_or(SpecValue::Unreadable);
        keys.push((SpecKey::KvLoad, load));
    }
    keys
}

/// What an attached run's diff can check of its workload: the label, the program (the first
/// command's), and the mix of reads and writes (to the nearest 10%).
fn attached_shape(a: &crate::model::attached::Attached) -> Vec<(SpecKey, SpecValue)> {
    let program = a
        .commands
        .first()
        .and_then(|c| c.split_whitespace().next())
        .map(|p| p.rsplit('/').next().unwrap_or(p).to_string());
    let mix =
        a.io.read_share()
            .map(|r| format!("{:.0}% reads", (r * 10.0).round() * 10.0));
    [
        ("label", a.label.clone()),
        ("program", program),
        ("mix", mix),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some((SpecKey::Workload(k), SpecValue::Toml(v?))))
    .collect()
}

/// Workload keys that differ between the two profiles' effective specs. For kv workloads the
/// `[kv]` table's load and store shape count, and `workers` does not: it is resolved per host
/// (one ring or five service threads per CPU) and only sets how much load the generator could
/// give, not the load asked for.
pub fn spec_differences(a: &Profile, b: &Profile) -> Vec<SpecDifference> {
    let (sa, sb) = (spec_shape(a), spec_shape(b));
    let mut keys: Vec<SpecKey> = sa.iter().chain(&sb).map(|(k, _)| *k).collect();
    keys.sort_by_key(|k| k.order());
    keys.dedup();
    let value = |side: &[(SpecKey, SpecValue)], key: SpecKey| {
        side.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone())
    };
    keys.into_iter()
        .filter_map(|key| {
            let (va, vb) = (value(&sa, key), value(&sb, key));
            (va != vb).then_some(SpecDifference { key, a: va, b: vb })
        })
        .collect()
}

/// A setting of a host that can confound the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostTrait {
    CpuCount,
    CpuModel,
    Clocksource,
    /// The clockevent device: whether programming a timer is an MSR write that exits
    /// (lapic-deadline), a hypercall (xen) or a synthetic timer (hyperv_stimer0).
    Clockevent,
    Kernel,
    /// Hardware queues of the target's device.
    TargetQueues,
    IoScheduler,
    RqAffinity,
    /// Effective IRQ affinity of the target's queues.
    IrqAffinity,
    /// How the target's queue interrupts arrive: the IRQ chip ("PCI-MSIX", "IR-PCI-MSI",
    /// "xen-pirq-msi-x": through Xen's event channels, with an EOI hypercall each).
    IrqDelivery,
    /// The target's device, when neither host lists it among its disks.
    TargetDevice,
}

/// A host's value of a setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Setting {
    Count(u64),
    Text(String),
    /// One value per queue, in queue order.
    List(Vec<String>),
    Unknown,
}

impl Setting {
    fn text(s: &Option<String>) -> Self {
        s.clone().map_or(Self::Unknown, Self::Text)
    }
}

/// A host difference that can confound the comparison.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Confounder {
    Differs {
        what: HostTrait,
        a: Setting,
        b: Setting,
    },
    /// The host does not list the target's device: queue and IRQ layout not compared.
    TargetQueuesUnknown(Host),
}

/// The host settings of A and B that differ.
pub(super) fn confounders(a: &Profile, b: &Profile) -> Vec<Confounder> {
    let mut out = Vec::new();
    let (ha, hb) = (&a.host, &b.host);
    let mut cmp = |what: HostTrait, a: Setting, b: Setting| {
        if a != b {
            out.push(Confounder::Differs { what, a, b });
        }
    };
    cmp(
        HostTrait::CpuCount,
        Setting::Count(ha.cpus.into()),
        Setting::Count(hb.cpus.into()),
    );
    cmp(
        HostTrait::CpuModel,
        Setting::text(&ha.cpu_model),
        Setting::text(&hb.cpu_model),
    );
    cmp(
        HostTrait::Clocksource,
        Setting::text(&ha.clocksource),
        Setting::text(&hb.clocksource),
    );
    cmp(
        HostTrait::Clockevent,
        Setting::text(&ha.clockevent),
        Setting::text(&hb.clockevent),
    );
    cmp(
        HostTrait::Kernel,
        Setting::text(&ha.kernel),
        Setting::text(&hb.kernel),
    );
    let dev = |p: &Profile| {
        let name = p.target.device.as_ref();
        p.host
            .block_devices
            .iter()
            .find(|d| Some(&d.name) == name)
            .cloned()
    };
    match (dev(a), dev(b)) {
        (Some(da), Some(db)) => {
            let queues = |d: &BlockDeviceInfo| Setting::Count(d.queues.len() as u64);
            cmp(HostTrait::TargetQueues, queues(&da), queues(&db));
            cmp(
                HostTrait::IoScheduler,
                Setting::text(&da.scheduler),
                Setting::text(&db.scheduler),
            );
            let rq = |d: &BlockDeviceInfo| {
                d.rq_affinity
                    .map_or(Setting::Unknown, |v| Setting::Count(v.into()))
            };
            cmp(HostTrait::RqAffinity, rq(&da), rq(&db));
            cmp(HostTrait::IrqAffinity, irq_cpus(&da), irq_cpus(&db));
            cmp(HostTrait::IrqDelivery, irq_delivery(&da), irq_delivery(&db));
        }
        (Some(_), None) => out.push(Confounder::TargetQueuesUnknown(Host::B)),
        (None, Some(_)) => out.push(Confounder::TargetQueuesUnknown(Host::A)),
        // Neither host lists the target among its disks (a loop, md or dm device): nothing to
        // compare, and nothing that differs unless the devices do.
        (None, None) => cmp(
            HostTrait::TargetDevice,
            Setting::text(&a.target.device),
            Setting::text(&b.target.device),
        ),
    }
    out
}

/// The effective IRQ affinity of a device's queues.
fn irq_cpus(d: &BlockDeviceInfo) -> Setting {
    let v: Vec<String> = d
        .queues
        .iter()
        .filter_map(|q| q.irq.as_ref()?.effective_affinity.clone())
        .collect();
    if v.is_empty() {
        Setting::Unknown
    } else {
        Setting::List(v)
    }
}

/// The distinct IRQ chips of a device's queues, each without the PCI address some chips carry
/// ("PCI-MSIX-0000:00:04.0" is PCI-MSIX on any slot).
fn irq_delivery(d: &BlockDeviceInfo) -> Setting {
    let mut chips: Vec<String> = d
        .queues
        .iter()
        .filter_map(|q| q.irq.as_ref())
        .map(|irq| match irq.chip.rsplit_once('-') {
            Some((kind, addr)) if addr.contains(':') => kind.to_string(),
            _ => irq.chip.clone(),
        })
        .collect();
    chips.dedup();
    match chips.len() {
        0 => Setting::Unknown,
        1 => Setting::Text(chips.remove(0)),
        _ => Setting::List(chips),
    }
}

/// Host-level figures of both hosts, beside the rows: shown, not judged.
#[derive(Clone, Debug, PartialEq)]
pub struct Evidence {
    pub a: HostEvidence,
    pub b: HostEvidence,
}

/// One host's evidence, from its first profile (block requests per I/O: from all of them).
#[derive(Clone, Debug, PartialEq)]
pub struct HostEvidence {
    pub busiest_irq_cpu: BusiestIrqCpu,
    pub requests_per_io: Option<RequestsPerIo>,
    /// The workload's block requests completed on a CPU other than the submitting one.
    pub cross_cpu: Option<CrossCpu>,
    pub steal: Option<Steal>,
    /// Exit-causing MSR writes per second by MSR, most written first (None: not measured).
    pub msr_exit_rates: Option<Vec<MsrRate>>,
    /// Per sampled CPU, its samples' share in the hypervisor interface (None: no sampler).
    pub hypervisor_share: Option<Vec<CpuShare>>,
    /// The probes' own CPU use, in % of one CPU.
    pub probe_cpu_pct: Option<f64>,
    /// None: not checked for stalls.
    pub stalls: Option<Stalls>,
}

/// The CPU with the most hard-IRQ and softirq time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BusiestIrqCpu {
    NotMeasured,
    /// No CPU load was recorded.
    NoneSeen,
    /// `share`: of the probes' window, as a fraction.
    Cpu {
        cpu: u32,
        share: f64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossCpu {
    /// Requests completed on another CPU than their submitter's, of `total` (> 0).
    pub cross: f64,
    pub total: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Steal {
    /// Stolen ns over all CPUs, of `cpu_ns` (> 0) of their time.
    pub steal_ns: f64,
    pub cpu_ns: f64,
}

/// One sampled CPU's share of samples in a category, as a fraction (None: its samples do not
/// stand for its time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuShare {
    pub cpu: u32,
    pub share: Option<f64>,
}

impl HostEvidence {
    pub fn of(side: &[&Profile]) -> Self {
        let p = side[0];
        Self {
            busiest_irq_cpu: busiest_irq_cpu(p),
            requests_per_io: side_requests_per_io(side),
            cross_cpu: cross_cpu(p),
            steal: steal(p),
            // Only the host's writes that exit, counted while the recording tool's sampler
            // paused.
            msr_exit_rates: p
                .virtualization
                .as_ref()
                .and_then(|v| v.msr_write_rates(MsrWrites::Exiting)),
            hypervisor_share: hypervisor_share(p),
            probe_cpu_pct: p.self_overhead.probe_cpu_pct,
            stalls: p.stalls.clone(),
        }
    }
}

fn busiest_irq_cpu(p: &Profile) -> BusiestIrqCpu {
    let Some(secs) = p.probe_seconds.filter(|s| *s > 0.0) else {
        return BusiestIrqCpu::NotMeasured;
    };
    p.cpus
        .iter()
        .map(|c| (c.cpu, (c.hardirq_ns + c.softirq_ns) as f64 / 1e9 / secs))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(BusiestIrqCpu::NoneSeen, |(cpu, share)| BusiestIrqCpu::Cpu {
            cpu,
            share,
        })
}

fn hypervisor_share(p: &Profile) -> Option<Vec<CpuShare>> {
    let v = p.virtualization.as_ref()?;
    let sampler = v.sampler.as_ref()?;
    let hypervisor = SampleCategory::Hypervisor.name();
    Some(
        sampler
            .cpus
            .iter()
            .map(|c| CpuShare {
                cpu: c.cpu,
                share: c
                    .represents(sampler.frequency_hz, sampler.seconds(v.seconds))
                    .then(|| c.in_category(hypervisor) as f64 / (c.samples.max(1)) as f64),
            })
            .collect(),
    )
}

fn steal(p: &Profile) -> Option<Steal> {
    // In f64: the figures come from a profile file and must not overflow a sum.
    let steal: Option<f64> = p.cpus.iter().map(|c| c.steal_ns.map(|v| v as f64)).sum();
    let total: f64 = p
        .cpus
        .iter()
        .map(|c| {
            [c.user_ns, c.system_ns, c.idle_ns, c.steal_ns]
                .iter()
                .map(|v| v.unwrap_or(0) as f64)
                .sum::<f64>()
                + c.hardirq_ns as f64
                + c.softirq_ns as f64
        })
        .sum();
    steal.filter(|_| total > 0.0).map(|steal_ns| Steal {
        steal_ns,
        cpu_ns: total,
    })
}

fn cross_cpu(p: &Profile) -> Option<CrossCpu> {
    let total: f64 = p.cpu_pairs.iter().map(|x| x[2] as f64).sum();
    if total == 0.0 {
        return None;
    }
    let cross: f64 = p
        .cpu_pairs
        .iter()
        .filter(|x| x[0] != x[1])
        .map(|x| x[2] as f64)
        .sum();
    Some(CrossCpu { cross, total })
}

/// A side's block requests per app I/O, over all its profiles.
fn side_requests_per_io(side: &[&Profile]) -> Option<RequestsPerIo> {
    side.iter()
        .filter_map(|p| p.stages.requests_per_io())
        .reduce(|x, y| RequestsPerIo {
            requests: x.requests + y.requests,
            ios: x.ios + y.ios,
        })
}

/// Where the two hosts' queue stages start, when not at the same point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueStartSplit {
    /// At each bio's entry into the block layer on host A, at its request on host B.
    EntryOnA,
    /// At each bio's entry on host B, at its request on host A.
    EntryOnB,
    /// At the bio's entry in some runs and at the request in others.
    Mixed,
}

/// What qualifies the verdicts.
#[derive(Clone, Debug, PartialEq)]
pub enum Warning {
    /// A profile of the host is incomplete: its run was interrupted.
    Incomplete(Host),
    /// A profile of the host was recorded without probes: only app latency compares.
    NoProbes(Host),
    /// The host stalled during a run: its figures are not steady state.
    Stalled(Host, Stalls),
    /// These hosts lack the completion stage in some run (a profile from before it, or a
    /// device whose queue IRQ is not known): device is compared as issue -> completion on
    /// both sides, and its tails and the completion row are not judged.
    CompletionFolded(Hosts),
    /// The queue stages start at different points: blk-throttle and tag waits count as queue
    /// on one side and as software on the other.
    QueueStart(QueueStartSplit),
    /// The hosts issue an app I/O as different numbers of block requests (these per I/O): the
    /// block stages are per request and the app's latency per I/O, so the software residual
    /// also holds the difference.
    RequestsPerIo { a: f64, b: f64 },
    /// One run on these hosts: verdicts compare batches of intervals within runs and hold for
    /// these runs only.
    OneRun(Hosts),
    /// Each host's runs come from one recording (back to back, in one stretch of the machine's
    /// time, the two stretches apart): a change in the machine between the two sessions moves
    /// every run of one side alike and reads as a difference between the hosts, so a
    /// difference found is provisional ([`super::Verdict::OneSession`]).
    OneSession,
}

/// Each side is one recording of two runs or more, and the two recordings' times do not
/// overlap: the runs of each side share one stretch of the machine's time, and nothing tells a
/// change between the stretches from a difference between the hosts. (A fleet's sides, read
/// from Prometheus over the same range, overlap: time moves both alike.)
pub(super) fn one_session_each(a_side: &[&Profile], b_side: &[&Profile]) -> bool {
    let ([a], [b]) = (a_side, b_side) else {
        return false;
    };
    let several_runs = |p: &Profile| p.runs.len() >= 2;
    let overlap =
        a.run.started_unix_ms < b.run.ended_unix_ms && b.run.started_unix_ms < a.run.ended_unix_ms;
    several_runs(a) && several_runs(b) && !overlap
}

/// The warnings on a comparison of `a_side` with `b_side`: per profile, then the stages'
/// units, then the replicates. `folded` names the hosts lacking the completion stage when
/// device is compared as issue -> completion; `runs` are each side's; `one_session`: see
/// [`one_session_each`].
pub(super) fn warnings(
    a_side: &[&Profile],
    b_side: &[&Profile],
    folded: Option<Hosts>,
    runs: (usize, usize),
    one_session: bool,
) -> Vec<Warning> {
    let mut warnings = Vec::new();
    for (host, side) in [(Host::A, a_side), (Host::B, b_side)] {
        for p in side {
            if !p.complete {
                warnings.push(Warning::Incomplete(host));
            }
            if p.capabilities.is_none() {
                warnings.push(Warning::NoProbes(host));
            }
            if let Some(s) = p.stalls.as_ref().filter(|s| s.found()) {
                warnings.push(Warning::Stalled(host, s.clone()));
            }
        }
    }
    warnings.extend(folded.map(Warning::CompletionFolded));
    warnings.extend(queue_start_split(a_side, b_side).map(Warning::QueueStart));
    warnings.extend(request_unit_warning(a_side, b_side));
    warnings.extend(Hosts::of(runs.0 < 2, runs.1 < 2).map(Warning::OneRun));
    if one_session {
        warnings.push(Warning::OneSession);
    }
    warnings
}

/// The hosts turn an app I/O into different numbers of block requests (a device that takes
/// smaller requests splits more): the stages are per request and the app's latency per I/O, so
/// per-request stages compare unlike units.
fn request_unit_warning(a_side: &[&Profile], b_side: &[&Profile]) -> Option<Warning> {
    let (a, b) = (side_requests_per_io(a_side)?, side_requests_per_io(b_side)?);
    let (ra, rb) = (a.ratio(), b.ratio());
    (ra.max(rb) / ra.min(rb) > 1.05).then_some(Warning::RequestsPerIo { a: ra, b: rb })
}

/// Whether the queue stages of the two hosts start at different points: one side counts
/// blk-throttle and tag waits as queue, the other as software.
fn queue_start_split(a_side: &[&Profile], b_side: &[&Profile]) -> Option<QueueStartSplit> {
    // (some start at the bio's entry, some at the request); none without the block probe.
    let starts = |side: &[&Profile]| -> (bool, bool) {
        let s: Vec<bool> = side
            .iter()
            .filter_map(|p| p.queue_start().map(QueueStart::from_bio_entry))
            .collect();
        (s.contains(&true), s.contains(&false))
    };
    match (starts(a_side), starts(b_side)) {
        ((true, false), (false, true)) => Some(QueueStartSplit::EntryOnA),
        ((false, true), (true, false)) => Some(QueueStartSplit::EntryOnB),
        ((true, true), _) | (_, (true, true)) => Some(QueueStartSplit::Mixed),
        _ => None,
    }
}
