//! Each host's replicates — its runs, and batches of consecutive intervals within each run —
//! and the figures every replicate yields.

use super::{BreakdownPart, Hosts, MetricId};
use crate::analysis::tail::TAIL_PERCENTILES;
use virtgap_probes::hypervisor::Mechanism;

use crate::model::hypervisor::{HypervisorSection, RunHypervisor};
use crate::model::interval::{CpuLoad, Interval};
use crate::model::profile::{IdleBaseline, Profile, RunRecord};
use crate::model::stages::{Stage, StageBreakdown};

/// One replicate's figures: a run's, or a batch of intervals'.
#[derive(Clone, Debug, Default)]
pub(super) struct Figures {
    pub app: Option<f64>,
    pub queue: Option<f64>,
    pub device: Option<f64>,
    /// Per block request (those without the stage count 0), so the means still add up.
    pub completion: Option<f64>,
    pub iops: Option<f64>,
    pub wakeup_per_io: Option<f64>,
    pub hardirq_per_io: Option<f64>,
    pub softirq_per_io: Option<f64>,
    pub ipis_per_io: Option<f64>,
    pub msr_per_io: Option<f64>,
    /// Mean of the workload's cache flushes (runs only: intervals keep no flush stage).
    pub flush: Option<f64>,
    /// (stage, percentile) -> ns; runs only (an interval keeps no stage histograms).
    pub tails: Vec<(Stage, f64, f64)>,
    /// The hypervisor rows' figures per I/O, above idle (intervals of older profiles keep none).
    pub hypervisor: Vec<(MetricId, f64)>,
    /// (queue id, mean NVMe command latency in ns); runs only (intervals keep no NVMe figure).
    pub nvme: Vec<(u16, f64)>,
}

impl Figures {
    /// This replicate's figure of `metric` (None for the estimate, which no replicate gives).
    pub fn get(&self, metric: MetricId) -> Option<f64> {
        match metric {
            MetricId::AppMean => self.app,
            MetricId::Stage(BreakdownPart::Queue) => self.queue,
            MetricId::Stage(BreakdownPart::Device) => self.device,
            MetricId::Stage(BreakdownPart::Completion) => self.completion,
            MetricId::Stage(BreakdownPart::Software) => self.software(),
            MetricId::WakeupPerIo => self.wakeup_per_io,
            MetricId::HardirqPerIo => self.hardirq_per_io,
            MetricId::SoftirqPerIo => self.softirq_per_io,
            MetricId::IpisPerIo => self.ipis_per_io,
            MetricId::MsrExitsPerIo => self.msr_per_io,
            MetricId::EstMsrExitTimePerIo => None,
            MetricId::FlushMean => self.flush,
            MetricId::Iops => self.iops,
            MetricId::Tail { stage, percentile } => self.tail(stage, percentile),
            MetricId::MechanismPerIo(_)
            | MetricId::MechanismTimePerIo(_)
            | MetricId::HypervisorCpuPerIo
            | MetricId::HypervisorTimePerIo => self
                .hypervisor
                .iter()
                .find(|(m, _)| *m == metric)
                .map(|(_, v)| *v),
            MetricId::NvmeCommandMean(qid) => self.nvme.iter().find(|q| q.0 == qid).map(|q| q.1),
        }
    }

    fn software(&self) -> Option<f64> {
        let split = StageBreakdown::of(
            self.app?,
            self.queue?,
            self.device?,
            self.completion.unwrap_or(0.0),
        );
        Some(split.software_ns)
    }

    fn tail(&self, stage: Stage, pct: f64) -> Option<f64> {
        self.tails
            .iter()
            .find(|t| t.0 == stage && t.1 == pct)
            .map(|t| t.2)
    }

    /// A run's figures; with `idle`, the host-wide ones less what the idle host did over the
    /// same time (see [`IdleBaseline`]).
    fn of_run(r: &RunRecord, idle: Option<&IdleBaseline>) -> Self {
        // Host-wide figures span the probes' window: per I/O completed over the same window
        // (the device stage's count), else per I/O the workload did.
        let span_ios = r
            .stages
            .device
            .as_ref()
            .map(|d| d.count as f64)
            .filter(|&n| n > 0.0)
            .or(Some(r.ios()).filter(|&n| n > 0.0));
        let per_io = |total: Option<f64>| total.zip(span_ios).map(|(t, n)| t / n);
        let seconds = r.probe_seconds.unwrap_or(r.measured_s);
        let above_idle = |total: Option<u64>, of_idle: fn(&IdleBaseline) -> Option<u64>| {
            let total = total? as f64;
            match idle {
                Some(b) => Some(total - b.over(of_idle(b), seconds)?),
                None => Some(total),
            }
        };
        let mut tails = Vec::new();
        for stage in Stage::ALL {
            for pct in TAIL_PERCENTILES {
                if let Some(v) = r.stages.get(stage).and_then(|h| h.percentile_ns(pct)) {
                    tails.push((stage, pct, v));
                }
            }
        }
        Self {
            app: r.stages.app.mean_ns(),
            queue: r.stages.queue.as_ref().and_then(|h| h.mean_ns()),
            device: r.stages.device.as_ref().and_then(|h| h.mean_ns()),
            completion: r.stages.completion_per_request(),
            iops: r.iops(),
            wakeup_per_io: per_io(r.stages.wakeup.as_ref().map(|w| w.sum_ns)),
            hardirq_per_io: per_io(above_idle(r.hardirq_ns, |b| b.hardirq_ns)),
            softirq_per_io: per_io(above_idle(r.softirq_ns, |b| b.softirq_ns)),
            ipis_per_io: per_io(above_idle(r.ipis_sent, |b| b.ipis_sent)),
            msr_per_io: per_io(above_idle(r.msr_writes, |b| b.msr_writes)),
            flush: r.stages.flush.as_ref().and_then(|h| h.mean_ns()),
            tails,
            hypervisor: r
                .hypervisor
                .as_ref()
                .map_or_else(Vec::new, |hv| hypervisor_figures(hv, idle, seconds))
                .into_iter()
                .filter_map(|(m, total)| Some((m, per_io(Some(total))?)))
                .collect(),
            nvme: r
                .nvme_queues
                .iter()
                .filter_map(|q| Some((q.qid, q.mean_ns()?)))
                .collect(),
        }
    }

    fn of_batch(ivs: &[&Interval], idle: Option<&IdleBaseline>) -> Self {
        let lat_count: f64 = ivs.iter().map(|i| i.lat_count as f64).sum();
        let per_io = |f: &dyn Fn(&Interval) -> Option<f64>| -> Option<f64> {
            let parts: Option<Vec<f64>> = ivs.iter().map(|i| f(i)).collect();
            parts
                .filter(|_| lat_count > 0.0)
                .map(|p| p.iter().sum::<f64>() / lat_count)
        };
        let span: f64 = ivs.iter().map(|i| i.end_s - i.start_s).sum();
        // What the idle host did over the batch's span, for the host-wide figures.
        let idle_part = |of_idle: fn(&IdleBaseline) -> Option<u64>| match idle {
            Some(b) => b.over(of_idle(b), span),
            None => Some(0.0),
        };
        let above_idle = |total: Option<f64>, of_idle: fn(&IdleBaseline) -> Option<u64>| {
            let t = total?;
            Some(t - idle_part(of_idle)? / lat_count)
        };
        // (count, sum in ns) of a stage over the batch.
        let stage_total = |stage: Stage| {
            ivs.iter()
                .filter_map(|i| i.stage(stage))
                .fold((0.0, 0.0), |(n, s), x| {
                    (n + x.count as f64, s + x.sum_ns as f64)
                })
        };
        let stage_mean = |stage: Stage| {
            let (n, sum) = stage_total(stage);
            (n > 0.0).then(|| sum / n)
        };
        let cpus = |i: &Interval, f: fn(&CpuLoad) -> f64| {
            (!i.cpus.is_empty()).then(|| i.cpus.iter().map(f).sum::<f64>())
        };
        Self {
            app: (lat_count > 0.0)
                .then(|| ivs.iter().map(|i| i.lat_sum_ns).sum::<f64>() / lat_count),
            queue: stage_mean(Stage::Queue),
            device: stage_mean(Stage::Device),
            completion: {
                let ((completed, _), (split, completion_ns)) =
                    (stage_total(Stage::Device), stage_total(Stage::Completion));
                (completed > 0.0 && split > 0.0).then(|| completion_ns / completed)
            },
            iops: (span > 0.0).then(|| {
                ivs.iter()
                    .map(|i| i.read_ios as f64 + i.write_ios as f64)
                    .sum::<f64>()
                    / span
            }),
            wakeup_per_io: per_io(&|i| i.stage(Stage::Wakeup).map(|s| s.sum_ns as f64)),
            hardirq_per_io: above_idle(per_io(&|i| cpus(i, |c| c.hardirq_ns as f64)), |b| {
                b.hardirq_ns
            }),
            softirq_per_io: above_idle(per_io(&|i| cpus(i, |c| c.softirq_ns as f64)), |b| {
                b.softirq_ns
            }),
            ipis_per_io: above_idle(
                per_io(&|i| cpus(i, |c| c.ipis_sent.values().sum::<u64>() as f64)),
                |b| b.ipis_sent,
            ),
            msr_per_io: above_idle(per_io(&|i| i.msr_writes.map(|n| n as f64)), |b| {
                b.msr_writes
            }),
            flush: None,
            tails: Vec::new(),
            nvme: Vec::new(),
            // Every interval's mechanisms added up (none when one lacks them), per I/O.
            hypervisor: ivs
                .iter()
                .map(|i| i.hypervisor.clone())
                .reduce(|a, b| a.zip(b).map(|(a, b)| RunHypervisor::added(&a, &b)))
                .flatten()
                .filter(|_| lat_count > 0.0)
                .map_or_else(Vec::new, |hv| hypervisor_figures(&hv, idle, span))
                .into_iter()
                .map(|(m, total)| (m, total / lat_count))
                .collect(),
        }
    }
}

/// A run's (or a batch's) hypervisor figures over its probe window of `seconds`, less what the
/// idle host did over as long (when `idle` is given): each mechanism's uses and the time of
/// its timed paths, and the sampled CPU time in the hypervisor interface.
fn hypervisor_figures(
    hv: &RunHypervisor,
    idle: Option<&IdleBaseline>,
    seconds: f64,
) -> Vec<(MetricId, f64)> {
    if hv.hypervisor.is_none() {
        return Vec::new();
    }
    let idle_hv = idle.map(|b| (b.seconds, b.hypervisor.as_ref()));
    // The total less the idle rate over the window; with a baseline lacking the figure, none.
    let above_idle = |total: f64, of_idle: &dyn Fn(&RunHypervisor) -> Option<f64>| match idle_hv {
        None => Some(total),
        Some((idle_s, Some(i))) if idle_s > 0.0 => Some(total - of_idle(i)? / idle_s * seconds),
        Some(_) => None,
    };
    let mut out = Vec::new();
    for m in Mechanism::ALL {
        if let Some(n) = hv.count(m) {
            let v = above_idle(n as f64, &|i| i.count(m).map(|c| c as f64));
            out.extend(v.map(|v| (MetricId::MechanismPerIo(m), v)));
        }
        if let Some(t) = hv.time_ns(m) {
            let v = above_idle(t, &|i| i.time_ns(m));
            out.extend(v.map(|v| (MetricId::MechanismTimePerIo(m), v)));
        }
    }
    if let Some(total) = paths_time(&out) {
        out.push((MetricId::HypervisorTimePerIo, total));
    }
    if let Some(cpu) = hv.cpu_ns {
        let v = above_idle(cpu, &|i| i.cpu_ns);
        out.extend(v.map(|v| (MetricId::HypervisorCpuPerIo, v)));
    }
    out
}

/// All hypervisor paths' time: every mechanism's time among `figures` but a halt's (time
/// halted is not work done for the guest), summed as they are, below-idle ones too, so that
/// noise around zero cancels rather than adds. None when no mechanism was timed.
fn paths_time(figures: &[(MetricId, f64)]) -> Option<f64> {
    figures
        .iter()
        .filter_map(|(metric, v)| match metric {
            MetricId::MechanismTimePerIo(m) if *m != Mechanism::Halt => Some(*v),
            _ => None,
        })
        .reduce(|a, b| a + b)
}

/// One host's replicates: its runs, and batches of consecutive intervals within each run.
pub(super) struct Side {
    pub runs: Vec<Figures>,
    pub batches: Vec<Figures>,
}

impl Side {
    /// The side's replicates; with `above_idle`, host-wide figures less the host's idle rate,
    /// pooled over all its runs' baselines (every run must have one): one second of idle per
    /// run is a noisy estimate, and the host is the same in every run.
    fn of(profiles: &[&Profile], above_idle: bool) -> Self {
        let pooled = above_idle
            .then(|| {
                IdleBaseline::pooled(
                    profiles
                        .iter()
                        .flat_map(|p| p.replicates())
                        .filter_map(|(r, _)| r.idle),
                )
            })
            .flatten();
        let idle = pooled.as_ref();
        let mut runs = Vec::new();
        let mut batches = Vec::new();
        for p in profiles {
            for (record, intervals) in p.replicates() {
                runs.push(Figures::of_run(&record, idle));
                batches.extend(
                    batches_of(intervals)
                        .iter()
                        .map(|b| Figures::of_batch(b, idle)),
                );
            }
        }
        Self { runs, batches }
    }

    fn replicates_all(&self) -> impl Iterator<Item = &Figures> {
        self.runs.iter().chain(&self.batches)
    }

    /// Every replicate has the completion stage (device ends at the queue IRQ's entry).
    fn splits_completion(&self) -> bool {
        self.replicates_all().all(|f| f.completion.is_some())
    }

    /// Device time as issue -> completion: each replicate's completion stage added back into
    /// it and dropped, and the device and completion tails with it (percentiles do not add).
    fn fold_completion(&mut self) {
        for f in self.runs.iter_mut().chain(self.batches.iter_mut()) {
            if let (Some(d), Some(c)) = (f.device, f.completion) {
                f.device = Some(d + c);
            }
            f.completion = None;
            f.tails
                .retain(|t| t.0 != Stage::Device && t.0 != Stage::Completion);
        }
    }

    /// Keeps of metal's native figures only those of `mechanisms` (the ones timed at the same
    /// functions as the guest's), and their sum as its hypervisor time: the rest are not the
    /// same work as anything the guest timed, so they are not compared.
    fn keep_native(&mut self, mechanisms: &[Mechanism]) {
        for f in self.runs.iter_mut().chain(self.batches.iter_mut()) {
            f.hypervisor.retain(|(metric, _)| match metric {
                MetricId::MechanismPerIo(m) | MetricId::MechanismTimePerIo(m) => {
                    mechanisms.contains(m)
                }
                _ => false,
            });
            if let Some(total) = paths_time(&f.hypervisor) {
                f.hypervisor.push((MetricId::HypervisorTimePerIo, total));
            }
        }
    }

    /// The host's value of a metric: the mean over its runs that measured it (a figure no
    /// real run gives — infinite, from a damaged file — counts as not measured).
    pub fn point(&self, metric: MetricId) -> Option<f64> {
        let v: Vec<f64> = self.runs.iter().filter_map(|f| f.get(metric)).collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        (!v.is_empty() && mean.is_finite()).then_some(mean)
    }

    /// The NVMe queue ids its runs used.
    pub fn nvme_qids(&self) -> std::collections::BTreeSet<u16> {
        self.runs
            .iter()
            .flat_map(|f| f.nvme.iter().map(|q| q.0))
            .collect()
    }

    /// The replicates' figures of `metric` on `basis` (the finite ones).
    pub fn replicates(&self, basis: super::Basis, metric: MetricId) -> Vec<f64> {
        let from = match basis {
            super::Basis::Runs => &self.runs,
            super::Basis::Batches => &self.batches,
        };
        from.iter()
            .filter_map(|f| f.get(metric))
            .filter(|x| x.is_finite())
            .collect()
    }
}

/// Both hosts' replicates, made comparable.
pub(super) struct Replicates {
    pub a: Side,
    pub b: Side,
    /// Host-wide figures are above each host's idle activity.
    pub above_idle: bool,
    /// The hosts lacking the completion stage in some replicate, when device is compared as
    /// issue -> completion on both sides for want of it.
    pub folded: Option<Hosts>,
}

impl Replicates {
    pub fn of(a_side: &[&Profile], b_side: &[&Profile]) -> Self {
        // Host-wide figures per I/O are compared above each run's idle host when every run of
        // both sides measured one (older profiles did not): background that is the same on
        // both hosts would otherwise weigh more per I/O on the one doing fewer.
        let above_idle = a_side
            .iter()
            .chain(b_side)
            .flat_map(|p| p.replicates())
            .all(|(r, _)| r.idle.is_some());
        let (mut a, mut b) = (Side::of(a_side, above_idle), Side::of(b_side, above_idle));
        // Device means one thing on both sides or is not compared: where either side lacks the
        // completion stage somewhere, both compare issue -> completion.
        let any_split = a
            .replicates_all()
            .chain(b.replicates_all())
            .any(|f| f.completion.is_some());
        let lacking = Hosts::of(!a.splits_completion(), !b.splits_completion());
        let folded = lacking.filter(|_| any_split);
        if folded.is_some() {
            a.fold_completion();
            b.fold_completion();
        }
        // Metal against a guest: metal's native work is compared only where the guest's path
        // was timed at the same functions (a Xen timer timed at clockevents_program_event).
        if let (Some(sa), Some(sb)) = (&a_side[0].hypervisor, &b_side[0].hypervisor) {
            if !sa.is_guest() && sb.is_guest() {
                a.keep_native(&same_functions(sa, sb));
            } else if sa.is_guest() && !sb.is_guest() {
                b.keep_native(&same_functions(sb, sa));
            }
        }
        Self {
            a,
            b,
            above_idle,
            folded,
        }
    }
}

/// The mechanisms metal timed where the guest timed them too, at every function metal did:
/// the guest's own further paths (a KVM guest's PV IPI hypercall to a mask, beside its IPIs to
/// one CPU through the ICR) have no native part, so all of their time is the guest's excess.
fn same_functions(metal: &HypervisorSection, guest: &HypervisorSection) -> Vec<Mechanism> {
    Mechanism::ALL
        .into_iter()
        .filter(|&m| {
            let native = metal.timed_functions(m);
            let guests = guest.timed_functions(m);
            !native.is_empty() && native.iter().all(|f| guests.contains(f))
        })
        .collect()
}

/// A run's full intervals in ⌊√n⌋ batches (at least two) of consecutive ones, sized as evenly
/// as they divide: batch means are far less autocorrelated than 1-s intervals, which is what
/// lets their spread stand for the run's noise.
pub(super) fn batches_of(intervals: &[Interval]) -> Vec<Vec<&Interval>> {
    // Only full intervals: a short last one has few I/Os and would skew the spread.
    let longest = intervals
        .iter()
        .map(|i| i.end_s - i.start_s)
        .fold(0.0, f64::max);
    let full: Vec<&Interval> = intervals
        .iter()
        .filter(|i| i.lat_count > 0 && (i.end_s - i.start_s) >= longest * 0.99)
        .collect();
    let n = full.len();
    if n == 0 {
        return Vec::new();
    }
    let count = ((n as f64).sqrt().floor() as usize).max(2).min(n);
    (0..count)
        .map(|k| full[k * n / count..(k + 1) * n / count].to_vec())
        .collect()
}
