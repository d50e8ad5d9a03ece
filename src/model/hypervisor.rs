//! The hypervisor's part in a run, one shape on every platform: per mechanism (timer
//! programming, IPIs, interrupt delivery, upcalls, halts, PV spinlocks, TLB flushes, other
//! hypercalls) how often the guest asked for it and, where a hypercall wrapper is timed, how long
//! it took — each path saying how it was measured — and the CPU time the sampler found in the
//! hypervisor interface. On metal nothing is the hypervisor's (no row is 0 there, and none is
//! "not measured"); the section holds the native work metal does at the generic callers a
//! guest's paths are timed at, which a diff subtracts where both hosts timed the same function.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use virtgap_probes::hypervisor::{Hypervisor, Mechanism};

/// The hypervisor section of a profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HypervisorSection {
    /// The hypervisor this host runs on ("none" on metal).
    #[schemars(with = "String")]
    pub hypervisor: Hypervisor,
    /// Seconds the probes watched: the denominator of every rate below.
    pub seconds: f64,
    /// Each mechanism of this hypervisor's table, in the table's order (on metal, the native
    /// callers timed for comparison).
    pub mechanisms: Vec<MechanismFigure>,
    /// CPU time spent in the hypervisor interface, from the sampler (None: not sampled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<HypervisorCpu>,
}

/// One mechanism: what its paths counted and timed together.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MechanismFigure {
    #[schemars(with = "String")]
    pub mechanism: Mechanism,
    /// Calls (and exit-causing writes) over the window; None when none of its paths was
    /// measured here.
    pub count: Option<u64>,
    /// Time in its timed paths over the window, ns; None when none is timed.
    pub time_ns: Option<f64>,
    pub paths: Vec<PathFigure>,
}

/// One path of a mechanism and how it was measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PathFigure {
    /// The path in the hypervisor's own terms ("EVTCHNOP_send").
    pub what: String,
    pub how: PathMeasure,
    /// None when not measured (see `state`).
    pub count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ns: Option<f64>,
    pub state: PathState,
}

/// How a path is measured from inside the guest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum PathMeasure {
    /// A write to this MSR exits: counted by the msr probe.
    MsrWrite { msr: u32 },
    /// The kernel function that makes the hypercall: counted and timed by the pv-paths probe.
    Timed { symbol: Option<String> },
    /// Only the sampler sees it, as CPU time in the hypervisor interface.
    Sampled,
    /// The sampler's CPU time in its functions (and the accessors they write through), where
    /// nothing can time them: a time, no count.
    SampledIn { functions: Vec<String> },
}

/// Whether a path was measured in this run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "state", content = "why")]
pub enum PathState {
    Measured,
    /// This kernel has none of its functions.
    Absent,
    /// Its probe did not run or attach here; why, in words.
    NotMeasured(String),
    /// The hypervisor does not offer it to this guest (its CPUID feature bit is clear), so the
    /// guest never takes it: which bit, in words. Not "0 calls".
    NotOffered(String),
}

/// CPU time in the hypervisor interface (hypercall stubs and page, paravirt callbacks,
/// trapping accessors), from the sampler: samples there times the sampling period, over the
/// CPUs whose samples stand for their time, scaled from the seconds sampled to the window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HypervisorCpu {
    /// Over all represented CPUs, ns.
    pub ns: f64,
    /// Per CPU, ns.
    pub per_cpu: BTreeMap<u32, f64>,
    /// CPUs whose samples did not stand for their time (left out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unrepresented_cpus: Vec<u32>,
}

impl HypervisorSection {
    /// The figure of one mechanism (None: not a mechanism of this hypervisor's table).
    pub fn mechanism(&self, m: Mechanism) -> Option<&MechanismFigure> {
        self.mechanisms.iter().find(|f| f.mechanism == m)
    }

    /// Whether this is a guest (metal has no hypervisor to measure).
    pub fn is_guest(&self) -> bool {
        self.hypervisor != Hypervisor::None
    }

    /// Where `m`'s time was measured here, sorted: the functions of its measured timed paths,
    /// and "MSR 0x830 write" for an MSR write's sends timed (an x2APIC ICR's IPIs to one CPU).
    /// Two hosts' times of a mechanism are the same work only where these are.
    pub fn timed_functions(&self, m: Mechanism) -> Vec<String> {
        let mut out: Vec<String> = self
            .mechanism(m)
            .into_iter()
            .flat_map(|f| &f.paths)
            .filter(|p| p.state == PathState::Measured)
            .filter_map(|p| match &p.how {
                PathMeasure::Timed { symbol } => symbol.clone(),
                PathMeasure::MsrWrite { msr } if p.time_ns.is_some() => {
                    Some(format!("MSR {msr:#x} write"))
                }
                _ => None,
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// The mechanisms this host's hypervisor does not offer at all: every path of theirs is
    /// "not offered" (a CPUID bit clear), so the guest never uses them.
    pub fn not_offered(&self) -> Vec<Mechanism> {
        self.mechanisms
            .iter()
            .filter(|m| {
                !m.paths.is_empty()
                    && m.paths
                        .iter()
                        .all(|p| matches!(p.state, PathState::NotOffered(_)))
            })
            .map(|m| m.mechanism)
            .collect()
    }
}

/// A run's hypervisor figures as the diff compares them: counts and times per mechanism and the
/// sampled CPU time, over the run's probe window (see `RunRecord::probe_seconds`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunHypervisor {
    /// The host's hypervisor (`none` on metal, whose figures are its native callers'); None:
    /// not measured (and on metal in profiles older than the native figures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub hypervisor: Option<Hypervisor>,
    /// Mechanism name -> calls over the window (mechanisms measured here only).
    #[serde(default)]
    pub counts: BTreeMap<String, u64>,
    /// Mechanism name -> time in its timed paths, ns.
    #[serde(default)]
    pub times_ns: BTreeMap<String, f64>,
    /// Sampled CPU time in the hypervisor interface, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ns: Option<f64>,
}

impl RunHypervisor {
    /// The run's figures from its section.
    pub fn of(section: &HypervisorSection) -> Self {
        let mut r = Self {
            hypervisor: Some(section.hypervisor),
            cpu_ns: section.cpu.as_ref().map(|c| c.ns),
            ..Self::default()
        };
        for m in &section.mechanisms {
            if let Some(n) = m.count {
                r.counts.insert(m.mechanism.name().to_string(), n);
            }
            if let Some(t) = m.time_ns {
                r.times_ns.insert(m.mechanism.name().to_string(), t);
            }
        }
        r
    }

    /// Two windows' figures as one: what both measured, summed.
    pub fn added(a: &Self, b: &Self) -> Self {
        let sum_u = |x: &BTreeMap<String, u64>, y: &BTreeMap<String, u64>| {
            x.iter()
                .filter_map(|(k, v)| y.get(k).map(|w| (k.clone(), v.saturating_add(*w))))
                .collect()
        };
        let sum_f = |x: &BTreeMap<String, f64>, y: &BTreeMap<String, f64>| {
            x.iter()
                .filter_map(|(k, v)| y.get(k).map(|w| (k.clone(), v + w)))
                .collect()
        };
        Self {
            hypervisor: a.hypervisor.filter(|h| Some(*h) == b.hypervisor),
            counts: sum_u(&a.counts, &b.counts),
            times_ns: sum_f(&a.times_ns, &b.times_ns),
            cpu_ns: a.cpu_ns.zip(b.cpu_ns).map(|(x, y)| x + y),
        }
    }

    /// Calls of `m` over the window (None: not measured).
    pub fn count(&self, m: Mechanism) -> Option<u64> {
        self.counts.get(m.name()).copied()
    }

    pub fn time_ns(&self, m: Mechanism) -> Option<f64> {
        self.times_ns.get(m.name()).copied()
    }
}
