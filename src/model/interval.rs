//! One interval of a run's series: the workload's counts and latency, each probed stage's count
//! and sum, and the interrupt load per CPU; how a coarser interval absorbs the next.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::stages::Stage;

/// One CPU's interrupt load over an interval or a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CpuLoad {
    pub cpu: u32,
    pub hardirq_ns: u64,
    pub softirq_ns: u64,
    pub hardirq_count: u64,
    pub softirq_count: u64,
    /// Hard IRQs by name (e.g. "virtio1-req.0") -> count.
    pub irqs: BTreeMap<String, u64>,
    /// Hard IRQs by name -> time in their handlers, ns (the run's total only, not per interval).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub irq_time_ns: BTreeMap<String, u64>,
    /// IPIs sent from this CPU ("reschedule", "function_call") -> count, one per target CPU.
    pub ipis_sent: BTreeMap<String, u64>,
    /// Cross-CPU calls queued from this CPU by purpose ("block_completion", "wakeup", "other").
    #[serde(default)]
    pub cross_cpu_calls: BTreeMap<String, u64>,
    /// System vectors received (local_timer, reschedule, ...) -> count.
    pub vectors: BTreeMap<String, u64>,
    /// Time in user, system, idle and steal, from /proc/stat (None when not read).
    pub user_ns: Option<u64>,
    pub system_ns: Option<u64>,
    pub idle_ns: Option<u64>,
    /// Time the hypervisor ran something else while this vCPU wanted to run.
    pub steal_ns: Option<u64>,
}

/// A block stage over one interval, for one device (both ops merged).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StageSample {
    pub count: u64,
    pub sum_ns: u64,
}

/// Everything measured in one interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Interval {
    pub index: u64,
    /// Seconds since the measured window started.
    pub start_s: f64,
    pub end_s: f64,
    pub read_ios: u64,
    pub write_ios: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub lat_count: u64,
    pub lat_sum_ns: f64,
    pub lat_p50_ns: Option<u64>,
    pub lat_p99_ns: Option<u64>,
    /// `Stage::name` of a probed stage -> this interval's count and sum.
    pub stages: BTreeMap<String, StageSample>,
    pub cpus: Vec<CpuLoad>,
    /// CPU time our BPF programs used in the interval, ns.
    pub probe_run_ns: Option<u64>,
    /// MSR writes that exit to this host's hypervisor in the interval, all CPUs, virtgap's own
    /// sampler's left out (None: probe not attached).
    #[serde(default)]
    pub msr_writes: Option<u64>,
    /// Age at the interval's end of the oldest I/O the workload still had in flight (0: none;
    /// absent: not tracked, as for kv).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_in_flight_ns: Option<u64>,
    /// The hypervisor's mechanisms over the interval (uses, timed time, sampled CPU time), so
    /// that one run's batches give them an interval too (None on metal, or not measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hypervisor: Option<crate::model::hypervisor::RunHypervisor>,
}

impl Interval {
    /// This interval's count and sum of a probed stage (None when not measured).
    pub fn stage(&self, stage: Stage) -> Option<&StageSample> {
        self.stages.get(stage.name())
    }

    /// Adds the next interval `later` into this one: counts and times summed, the span extended;
    /// percentiles are left to the caller, who holds the latency histograms.
    pub fn absorb(&mut self, later: &Interval) {
        let spans = (self.end_s - self.start_s, later.end_s - later.start_s);
        self.end_s = later.end_s;
        self.read_ios += later.read_ios;
        self.write_ios += later.write_ios;
        self.read_bytes += later.read_bytes;
        self.write_bytes += later.write_bytes;
        self.lat_count += later.lat_count;
        self.lat_sum_ns += later.lat_sum_ns;
        for (name, s) in &later.stages {
            let mine = self.stages.entry(name.clone()).or_default();
            mine.count += s.count;
            mine.sum_ns += s.sum_ns;
        }
        absorb_cpus(&mut self.cpus, &later.cpus);
        self.probe_run_ns =
            add_sampled((self.probe_run_ns, spans.0), (later.probe_run_ns, spans.1));
        self.msr_writes = add_measured(self.msr_writes, later.msr_writes);
        // The coarse interval's end is the later one's.
        self.oldest_in_flight_ns = later.oldest_in_flight_ns.or(self.oldest_in_flight_ns);
        self.hypervisor = match (&self.hypervisor, &later.hypervisor) {
            (Some(a), Some(b)) => Some(crate::model::hypervisor::RunHypervisor::added(a, b)),
            _ => None,
        };
    }
}

/// Adds each CPU's load in `later` into the same CPU's in `loads`, kept in CPU order.
pub fn absorb_cpus(loads: &mut Vec<CpuLoad>, later: &[CpuLoad]) {
    for c in later {
        match loads.iter_mut().find(|m| m.cpu == c.cpu) {
            Some(mine) => mine.absorb(c),
            None => loads.push(c.clone()),
        }
    }
    loads.sort_by_key(|c| c.cpu);
}

impl CpuLoad {
    fn absorb(&mut self, later: &CpuLoad) {
        self.hardirq_ns += later.hardirq_ns;
        self.softirq_ns += later.softirq_ns;
        self.hardirq_count += later.hardirq_count;
        self.softirq_count += later.softirq_count;
        for (mine, theirs) in [
            (&mut self.irqs, &later.irqs),
            (&mut self.ipis_sent, &later.ipis_sent),
            (&mut self.cross_cpu_calls, &later.cross_cpu_calls),
            (&mut self.vectors, &later.vectors),
        ] {
            for (k, v) in theirs {
                *mine.entry(k.clone()).or_default() += v;
            }
        }
        self.user_ns = add_measured(self.user_ns, later.user_ns);
        self.system_ns = add_measured(self.system_ns, later.system_ns);
        self.idle_ns = add_measured(self.idle_ns, later.idle_ns);
        self.steal_ns = add_measured(self.steal_ns, later.steal_ns);
    }
}

/// Two intervals' figures of something measured in only some intervals (the probes' run time:
/// the run statistics are on for a share of them), each with its span in seconds: the sum
/// where both are measured, else the measured one's rate over both spans.
fn add_sampled((a, a_s): (Option<u64>, f64), (b, b_s): (Option<u64>, f64)) -> Option<u64> {
    let over_both = |x: u64, x_s: f64| {
        if x_s > 0.0 {
            (x as f64 * (a_s + b_s) / x_s) as u64
        } else {
            x
        }
    };
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (Some(a), None) => Some(over_both(a, a_s)),
        (None, Some(b)) => Some(over_both(b, b_s)),
        (None, None) => None,
    }
}

/// The sum of two figures that may not have been measured: measured if either was.
fn add_measured(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

#[cfg(test)]
mod tests {
    use super::add_sampled;

    #[test]
    fn a_figure_measured_in_some_intervals_keeps_its_rate_when_they_are_joined() {
        // Measured in both: the sum.
        assert_eq!(add_sampled((Some(10), 1.0), (Some(30), 1.0)), Some(40));
        // Measured in the first second of four: its rate over all four.
        let one = add_sampled((Some(10), 1.0), (None, 1.0));
        assert_eq!(one, Some(20));
        let two = add_sampled((one, 2.0), (None, 1.0));
        assert_eq!(add_sampled((two, 3.0), (None, 1.0)), Some(40));
        assert_eq!(add_sampled((None, 1.0), (Some(7), 1.0)), Some(14));
        assert_eq!(add_sampled((None, 1.0), (None, 1.0)), None);
    }
}
