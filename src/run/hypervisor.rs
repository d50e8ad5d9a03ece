//! The profile's hypervisor section, assembled from what the probes saw (the run's
//! virtualization figures and what attached) and the hypervisor's table
//! (`virtgap_probes::hypervisor`): each mechanism's paths, how each was measured, and the
//! sampler's CPU time in the hypervisor interface.

use std::collections::BTreeMap;

use virtgap_probes::hypervisor::{self, Hypervisor, Measure, Mechanism, Path};
use virtgap_probes::report::Family;
use virtgap_probes::virt::SampleCategory;
use virtgap_probes::CapabilityReport;

use crate::model::host::Cpuid;
use crate::model::hypervisor::{
    HypervisorCpu, HypervisorSection, MechanismFigure, PathFigure, PathMeasure, PathState,
};
use crate::model::virtualization::Virtualization;

/// The section for a host running on `hypervisor`, over `seconds` of probes (`virt`: what the
/// hypervisor probes saw, None when none attached; `report`: what attached and why not;
/// `cpuid`: what the hypervisor offers, where a CPUID bit decides a path).
pub fn section(
    hypervisor: Hypervisor,
    seconds: f64,
    virt: Option<&Virtualization>,
    report: Option<&CapabilityReport>,
    cpuid: Option<&Cpuid>,
) -> HypervisorSection {
    let mut mechanisms: Vec<MechanismFigure> = Vec::new();
    for path in hypervisor::paths(hypervisor) {
        let figure = match cpuid.and_then(|c| not_offered(hypervisor, path, c)) {
            Some(why) => PathFigure {
                what: path.what.to_string(),
                how: path_measure(path),
                count: None,
                time_ns: None,
                state: PathState::NotOffered(why),
            },
            None => path_figure(path, seconds, virt, report),
        };
        match mechanisms
            .iter_mut()
            .find(|m| m.mechanism == path.mechanism)
        {
            Some(m) => m.paths.push(figure),
            None => mechanisms.push(MechanismFigure {
                mechanism: path.mechanism,
                count: None,
                time_ns: None,
                paths: vec![figure],
            }),
        }
    }
    for m in &mut mechanisms {
        let add = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        // A sampled time stands in only where no path of the mechanism was timed: both are
        // the same calls' time.
        let timed = m
            .paths
            .iter()
            .any(|p| matches!(p.how, PathMeasure::Timed { .. }) && p.state == PathState::Measured);
        // A split's own calls (Xen's kick sends) are made inside another path of their
        // mechanism (the kick): where that one is timed, their time adds and their calls are its.
        let is_split = |p: &PathFigure| {
            matches!(&p.how, PathMeasure::Timed { symbol: Some(s) }
                if hypervisor::split_named(hypervisor, s).is_some())
        };
        let caller_timed = m.paths.iter().any(|p| {
            matches!(p.how, PathMeasure::Timed { .. })
                && p.state == PathState::Measured
                && !is_split(p)
        });
        // A timer timed at its generic caller holds the MSR write it makes: those writes are
        // its calls counted again.
        let writes_inside = m.paths.iter().any(|p| {
            p.state == PathState::Measured
                && matches!(&p.how, PathMeasure::Timed { symbol: Some(s) }
                    if hypervisor::makes_its_msr_writes(s))
        });
        let (mut count, mut time) = (None, None);
        for p in &m.paths {
            let counted_again = (caller_timed && is_split(p))
                || (writes_inside && matches!(p.how, PathMeasure::MsrWrite { .. }));
            if !counted_again {
                count = add(count, p.count.map(|n| n as f64));
            }
            if !(timed && matches!(p.how, PathMeasure::SampledIn { .. })) {
                time = add(time, p.time_ns);
            }
        }
        m.count = count.map(|n| n as u64);
        m.time_ns = time;
    }
    HypervisorSection {
        hypervisor,
        seconds,
        cpu: (hypervisor != Hypervisor::None)
            .then(|| virt.and_then(|v| cpu_time(v, seconds)))
            .flatten(),
        mechanisms,
    }
}

/// Why the host does not offer `path` ("CPUID 0x40000001 EAX bit 11 (KVM_FEATURE_PV_SEND_IPI)
/// clear"), or None: offered, or no bit decides it, or the bit was not read.
fn not_offered(hypervisor: Hypervisor, path: &Path, cpuid: &Cpuid) -> Option<String> {
    offer_state(hypervisor, path, cpuid)?.err()
}

/// Whether the host offers `path`, by the CPUID bit that decides it: Ok(the bit, in words) or
/// Err(the bit, clear); None where no bit decides it or it was not read.
pub fn offer_state(
    hypervisor: Hypervisor,
    path: &Path,
    cpuid: &Cpuid,
) -> Option<Result<String, String>> {
    let offer = hypervisor::offer(hypervisor, path)?;
    let offered = virtgap_probes::virt::offered(&offer, &cpuid.leaves, &cpuid.features)?;
    let base = cpuid
        .leaves
        .iter()
        .find(|l| l.signature == offer.signature)?
        .leaf;
    let bit = format!(
        "CPUID {:#x} {} bit {} ({})",
        base + offer.offset,
        offer.register.to_uppercase(),
        offer.bit,
        offer.name
    );
    Some(if offered {
        Ok(format!("{bit} set"))
    } else {
        Err(format!("{bit} clear"))
    })
}

/// How `path` is measured, before anything is.
fn path_measure(path: &Path) -> PathMeasure {
    match path.measure {
        Measure::MsrWrite(msr) => PathMeasure::MsrWrite { msr },
        Measure::Timed(names) => PathMeasure::Timed {
            symbol: Some(names[0].to_string()),
        },
        Measure::Sampled => PathMeasure::Sampled,
        Measure::SampledIn(names) => PathMeasure::SampledIn {
            functions: names.iter().map(|n| n.to_string()).collect(),
        },
    }
}

fn path_figure(
    path: &Path,
    seconds: f64,
    virt: Option<&Virtualization>,
    report: Option<&CapabilityReport>,
) -> PathFigure {
    let unmeasured = |how: PathMeasure, state: PathState| PathFigure {
        what: path.what.to_string(),
        how,
        count: None,
        time_ns: None,
        state,
    };
    match path.measure {
        Measure::MsrWrite(msr) => {
            let how = PathMeasure::MsrWrite { msr };
            let Some(v) = virt.filter(|v| v.msr_writes.is_some()) else {
                return unmeasured(how, not_measured(report, Family::Msr));
            };
            let Some(n) = v.host_writes(|w| w.msr == msr, seconds) else {
                let why = "the sampler never paused long enough to count the host's writes";
                return unmeasured(how, PathState::NotMeasured(why.into()));
            };
            // The ICR's writes that send IPIs to one CPU are timed (6.4+): their time is the
            // path's; the writes for a mask are counted, not timed.
            let time_ns = v
                .icr_sends
                .filter(|_| msr == hypervisor::X2APIC_ICR)
                .and_then(|t| t.time_ns());
            PathFigure {
                what: path.what.to_string(),
                how,
                count: Some(n.round() as u64),
                time_ns,
                state: PathState::Measured,
            }
        }
        Measure::Timed(names) => timed_figure(path, names, virt, report),
        Measure::SampledIn(names) => {
            let how = PathMeasure::SampledIn {
                functions: names.iter().map(|n| n.to_string()).collect(),
            };
            match virt.and_then(|v| mechanism_cpu_ns(v, path.mechanism, seconds)) {
                Some(ns) => PathFigure {
                    what: path.what.to_string(),
                    how,
                    count: None,
                    time_ns: Some(ns),
                    state: PathState::Measured,
                },
                None => unmeasured(how, not_measured(report, Family::Sampler)),
            }
        }
        Measure::Sampled => {
            let sampled = virt.is_some_and(|v| v.sampler.is_some());
            let state = if sampled {
                PathState::Measured
            } else {
                not_measured(report, Family::Sampler)
            };
            unmeasured(PathMeasure::Sampled, state)
        }
    }
}

/// One measured path's figures as the probes keep them: cumulative and unscaled, so a counter
/// built on them never goes down (a count scaled by the sampler's pauses can, between two
/// scrapes). `how` is "timed" (calls and their time) or "msr_write" (exit-causing writes,
/// counted only while no sampler ran: see [`Virtualization::msr_seconds`]).
#[derive(Clone, Debug, PartialEq)]
pub struct RawPathCount {
    pub mechanism: Mechanism,
    pub how: &'static str,
    pub count: u64,
    pub time_ns: Option<f64>,
}

/// Every measured path's raw count on a host running on `hypervisor` (sampled paths, a time
/// scaled to the window, are not counts and are left out).
pub fn raw_counts(hypervisor: Hypervisor, virt: &Virtualization) -> Vec<RawPathCount> {
    let mut out = Vec::new();
    for path in hypervisor::paths(hypervisor) {
        match path.measure {
            Measure::MsrWrite(msr) => {
                let Some(writes) = &virt.msr_writes else {
                    continue;
                };
                out.push(RawPathCount {
                    mechanism: path.mechanism,
                    how: "msr_write",
                    count: writes
                        .iter()
                        .filter(|w| w.msr == msr && w.is_hosts())
                        .map(|w| w.count)
                        .sum(),
                    time_ns: None,
                });
            }
            Measure::Timed(names) => {
                let timed_as = |names: &[&str]| {
                    virt.pv_paths
                        .as_ref()
                        .and_then(|paths| paths.iter().find(|p| names.contains(&p.symbol.as_str())))
                };
                // A split's calls are its caller path's where that is timed too (as in
                // `section`): its time adds, its calls do not.
                let counted_by_caller = hypervisor::split_named(hypervisor, names[0]).is_some()
                    && hypervisor::paths(hypervisor).iter().any(|q| {
                        q.mechanism == path.mechanism
                            && matches!(q.measure, Measure::Timed(n) if n != names && timed_as(n).is_some())
                    });
                if let Some(p) = timed_as(names) {
                    out.push(RawPathCount {
                        mechanism: path.mechanism,
                        how: "timed",
                        count: if counted_by_caller { 0 } else { p.count },
                        time_ns: Some(p.mean_ns.unwrap_or(0.0) * p.count as f64),
                    });
                }
            }
            Measure::SampledIn(_) | Measure::Sampled => {}
        }
    }
    out
}

/// A timed path: the first of its names the pv-paths probe timed, else why none was.
fn timed_figure(
    path: &Path,
    names: &[&str],
    virt: Option<&Virtualization>,
    report: Option<&CapabilityReport>,
) -> PathFigure {
    let timed = virt
        .and_then(|v| v.pv_paths.as_ref())
        .and_then(|paths| paths.iter().find(|p| names.contains(&p.symbol.as_str())));
    if let Some(p) = timed {
        return PathFigure {
            what: path.what.to_string(),
            how: PathMeasure::Timed {
                symbol: Some(p.symbol.clone()),
            },
            count: Some(p.count),
            time_ns: Some(p.mean_ns.unwrap_or(0.0) * p.count as f64),
            state: PathState::Measured,
        };
    }
    // What the probe said of these names: attached with no calls kept, absent, or why not.
    let family = report.and_then(|r| r.families.iter().find(|f| f.family == Family::PvPaths));
    let outcome = family.and_then(|f| {
        f.tracepoints
            .iter()
            .find(|t| names.contains(&t.tracepoint.as_str()))
    });
    let state = match (family, outcome) {
        (Some(f), _) if f.unavailable.is_some() => not_measured(report, Family::PvPaths),
        (_, Some(t)) if t.attached.is_some() => PathState::Measured,
        (_, Some(t)) => match t.reason.as_deref() {
            Some(why) if why.contains("absent") => PathState::Absent,
            Some(why) => PathState::NotMeasured(why.to_string()),
            None => PathState::NotMeasured("did not attach".into()),
        },
        (Some(_), None) => PathState::Absent,
        (None, _) => not_measured(report, Family::PvPaths),
    };
    let measured = state == PathState::Measured;
    PathFigure {
        what: path.what.to_string(),
        how: PathMeasure::Timed {
            symbol: outcome.map(|t| t.tracepoint.clone()),
        },
        count: measured.then_some(0),
        time_ns: measured.then_some(0.0),
        state,
    }
}

/// Why a family's figures are missing: it was not asked for, or why it did not attach.
fn not_measured(report: Option<&CapabilityReport>, family: Family) -> PathState {
    let why = report
        .and_then(|r| r.families.iter().find(|f| f.family == family))
        .map_or_else(
            || format!("the {} probe did not run", family.name()),
            |f| match &f.unavailable {
                Some(why) => format!("{} probe unavailable: {why}", family.name()),
                None => format!("the {} probe did not report it", family.name()),
            },
        );
    PathState::NotMeasured(why)
}

/// The CPU time one sample stands for over `seconds` of probes (the samples taken over the
/// seconds the sampler ran, scaled to the window); None without samples.
fn ns_per_sample(v: &Virtualization, seconds: f64) -> Option<f64> {
    let s = v.sampler.as_ref()?;
    let sampled = s.seconds(seconds);
    (s.frequency_hz > 0 && sampled > 0.0).then(|| 1e9 / s.frequency_hz as f64 * (seconds / sampled))
}

/// The sampler's CPU time in `mechanism`'s sampled path over `seconds`, over the CPUs whose
/// samples stand for their time.
fn mechanism_cpu_ns(v: &Virtualization, mechanism: Mechanism, seconds: f64) -> Option<f64> {
    let s = v.sampler.as_ref()?;
    let per_sample = ns_per_sample(v, seconds)?;
    let sampled = s.seconds(seconds);
    Some(
        s.cpus
            .iter()
            .filter(|c| c.represents(s.frequency_hz, sampled))
            .map(|c| c.mechanisms.get(mechanism.name()).copied().unwrap_or(0) as f64 * per_sample)
            .sum(),
    )
}

/// The sampler's samples in the hypervisor interface as CPU time over `seconds`: each sample
/// stands for one sampling period of its CPU, and the samples taken over the seconds the sampler
/// ran are scaled to the window. CPUs whose samples do not stand for their time are left out.
fn cpu_time(v: &Virtualization, seconds: f64) -> Option<HypervisorCpu> {
    let s = v.sampler.as_ref()?;
    let sampled = s.seconds(seconds);
    let ns_per_sample = ns_per_sample(v, seconds)?;
    let mut per_cpu = BTreeMap::new();
    let mut unrepresented_cpus = Vec::new();
    for c in &s.cpus {
        if !c.represents(s.frequency_hz, sampled) {
            unrepresented_cpus.push(c.cpu);
            continue;
        }
        let n = c.in_category(SampleCategory::Hypervisor.name());
        per_cpu.insert(c.cpu, n as f64 * ns_per_sample);
    }
    Some(HypervisorCpu {
        ns: per_cpu.values().sum(),
        per_cpu,
        unrepresented_cpus,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::virtualization::{
        IcrSendTime, MsrAccesses, PvPathFigure, SampledCpu, SamplerSection,
    };
    use virtgap_probes::hypervisor::Mechanism;

    fn virt(seconds: f64) -> Virtualization {
        Virtualization {
            seconds,
            msr_quiet_seconds: Some(seconds / 2.0),
            msr_writes: Some(vec![MsrAccesses {
                cpu: 0,
                msr: 0x6e0,
                name: "IA32_TSC_DEADLINE (timer)".into(),
                count: 500,
                exits: true,
                by_sampler: false,
                while_sampling: false,
            }]),
            msr_reads: Some(vec![]),
            icr_sends: None,
            sampler: Some(SamplerSection {
                frequency_hz: 100,
                dropped: 0,
                cpus: vec![SampledCpu {
                    cpu: 1,
                    samples: 500,
                    categories: [("hypervisor interface".to_string(), 50)].into(),
                    top: vec![],
                    mechanisms: [("device_notify".to_string(), 20)].into(),
                }],
                sampled_seconds: Some(seconds / 2.0),
            }),
            kvm_host: None,
            pv_paths: timed("xen_send_IPI_one", 2000, 1500.0),
        }
    }

    /// The pv-paths probe's figures of one function timed `count` times, `mean_ns` each.
    fn timed(symbol: &str, count: u64, mean_ns: f64) -> Option<Vec<PvPathFigure>> {
        Some(vec![PvPathFigure {
            symbol: symbol.into(),
            count,
            mean_ns: Some(mean_ns),
            p99_ns: None,
        }])
    }

    #[test]
    fn metal_keeps_only_its_native_callers_whatever_the_probes_saw() {
        let mut v = virt(10.0);
        let s = section(Hypervisor::None, 10.0, Some(&v), None, None);
        assert!(!s.is_guest());
        // A Xen path's figure is no native caller's: nothing counted but the native ICR
        // writes (none here), no sampled CPU time.
        assert!(
            s.mechanisms
                .iter()
                .all(|m| m.count.is_none() || (m.mechanism == Mechanism::Ipi && m.count == Some(0))),
            "{s:?}"
        );
        assert_eq!(s.cpu, None);
        v.pv_paths = timed("clockevents_program_event", 3000, 400.0);
        let s = section(Hypervisor::None, 10.0, Some(&v), None, None);
        let timer = s.mechanism(Mechanism::Timer).unwrap();
        assert_eq!(timer.count, Some(3000));
        assert_eq!(timer.time_ns, Some(1.2e6));
        assert_eq!(
            s.timed_functions(Mechanism::Timer),
            ["clockevents_program_event"]
        );
        assert_eq!(s.mechanism(Mechanism::Ipi).unwrap().time_ns, None);
        assert_eq!(s.mechanism(Mechanism::TlbFlush), None);
    }

    fn icr_sends(sends: u64, ns: u64, unpaired: u64) -> IcrSendTime {
        IcrSendTime {
            sends,
            ns,
            unpaired,
        }
    }

    /// ICR writes of 0x830, `n` over the window's quiet half, and the IPIs to one CPU timed.
    fn with_icr(mut v: Virtualization, n: u64, sends: IcrSendTime) -> Virtualization {
        v.msr_writes.as_mut().unwrap().push(MsrAccesses {
            cpu: 1,
            msr: 0x830,
            name: "x2APIC ICR (IPI)".into(),
            count: n,
            exits: true,
            by_sampler: false,
            while_sampling: false,
        });
        v.icr_sends = Some(sends);
        v
    }

    #[test]
    fn ipis_to_one_cpu_are_timed_at_their_icr_write_on_a_guest_and_on_metal_alike() {
        let sends = icr_sends(800, 8_000_000, 0);
        // A KVM guest without fentry: the ICR's writes counted (scaled from the quiet half),
        // the single sends' time measured; the PV mask hypercalls not measured.
        let v = with_icr(virt(10.0), 500, sends);
        let kvm = section(Hypervisor::Kvm, 10.0, Some(&v), None, None);
        let ipi = kvm.mechanism(Mechanism::Ipi).unwrap();
        assert_eq!((ipi.count, ipi.time_ns), (Some(1000), Some(8e6)));
        assert_eq!(kvm.timed_functions(Mechanism::Ipi), ["MSR 0x830 write"]);
        // Metal times the same sends natively: the same place, so a diff compares them.
        let metal = section(Hypervisor::None, 10.0, Some(&v), None, None);
        let native = metal.mechanism(Mechanism::Ipi).unwrap();
        assert_eq!((native.count, native.time_ns), (Some(1000), Some(8e6)));
        assert_eq!(metal.timed_functions(Mechanism::Ipi), ["MSR 0x830 write"]);
        // IPIs sent, none through the ICR (an xAPIC, or a paravirt send): no time, not 0.
        let v = with_icr(virt(10.0), 0, icr_sends(0, 0, 300));
        let metal = section(Hypervisor::None, 10.0, Some(&v), None, None);
        assert_eq!(metal.mechanism(Mechanism::Ipi).unwrap().time_ns, None);
        assert!(metal.timed_functions(Mechanism::Ipi).is_empty());
        // No IPI at all in the window: timed, and none.
        let v = with_icr(virt(10.0), 0, icr_sends(0, 0, 0));
        let kvm = section(Hypervisor::Kvm, 10.0, Some(&v), None, None);
        assert_eq!(kvm.mechanism(Mechanism::Ipi).unwrap().time_ns, Some(0.0));
    }

    /// Xen's lock kicks sent as IPIs on the kick vector are the kick mechanism's, not IPIs: their
    /// time adds to the kick's (timed at its caller, less the send nested in it), their calls
    /// do not (each send is one of the caller's calls), in the profile and the raw counters.
    #[test]
    fn a_lock_kick_sent_as_an_ipi_is_the_kicks_time_not_an_ipis() {
        let mut v = virt(10.0);
        let figure = |symbol: &str, count, mean_ns| PvPathFigure {
            symbol: symbol.into(),
            count,
            mean_ns: Some(mean_ns),
            p99_ns: None,
        };
        v.pv_paths = Some(vec![
            figure("xen_send_IPI_one", 2000, 1500.0),
            figure("__pv_queued_spin_unlock_slowpath", 40, 200.0),
            figure("xen_send_IPI_one:XEN_SPIN_UNLOCK_VECTOR", 40, 1500.0),
        ]);
        let s = section(Hypervisor::Xen, 10.0, Some(&v), None, None);
        let kick = s.mechanism(Mechanism::SpinlockKick).unwrap();
        assert_eq!(kick.count, Some(40));
        assert_eq!(kick.time_ns, Some(40.0 * 200.0 + 40.0 * 1500.0));
        assert_eq!(s.mechanism(Mechanism::Ipi).unwrap().count, Some(2000));
        let raw = raw_counts(Hypervisor::Xen, &v);
        let kicks = raw
            .iter()
            .filter(|r| r.mechanism == Mechanism::SpinlockKick);
        assert_eq!(kicks.clone().map(|r| r.count).sum::<u64>(), 40);
        assert_eq!(
            kicks.filter_map(|r| r.time_ns).sum::<f64>(),
            40.0 * 200.0 + 40.0 * 1500.0
        );
        // Where the kick's caller was not timed, the sends are the kicks counted.
        v.pv_paths = Some(vec![figure(
            "xen_send_IPI_one:XEN_SPIN_UNLOCK_VECTOR",
            40,
            1500.0,
        )]);
        let s = section(Hypervisor::Xen, 10.0, Some(&v), None, None);
        assert_eq!(
            s.mechanism(Mechanism::SpinlockKick).unwrap().count,
            Some(40)
        );
    }

    /// A KVM guest's timer timed at its generic caller (as metal times it) holds the
    /// TSC-deadline write it makes: the mechanism counts each programming once, its time is the
    /// timed calls', and where the caller could not be timed the writes are the count.
    #[test]
    fn a_timer_timed_at_its_caller_counts_its_msr_writes_once() {
        let mut v = virt(10.0);
        v.pv_paths = timed("clockevents_program_event", 1000, 900.0);
        let s = section(Hypervisor::Kvm, 10.0, Some(&v), None, None);
        let timer = s.mechanism(Mechanism::Timer).unwrap();
        assert_eq!(timer.count, Some(1000));
        assert_eq!(timer.time_ns, Some(9e5));
        v.pv_paths = Some(vec![]);
        let s = section(Hypervisor::Kvm, 10.0, Some(&v), None, None);
        let timer = s.mechanism(Mechanism::Timer).unwrap();
        // 500 writes counted in the sampler's pauses (5 of 10 s): 1000 over the window.
        assert_eq!(timer.count, Some(1000));
        assert_eq!(timer.time_ns, None);
    }

    #[test]
    fn each_mechanism_says_how_it_was_measured() {
        let s = section(Hypervisor::Xen, 10.0, Some(&virt(10.0)), None, None);
        // IPIs by hypercall, timed: 2000 calls of 1.5 µs.
        let ipi = s.mechanism(Mechanism::Ipi).unwrap();
        assert_eq!(ipi.count, Some(2000));
        assert_eq!(ipi.time_ns, Some(3e6));
        assert!(ipi.paths.iter().any(|p| p.how
            == PathMeasure::Timed {
                symbol: Some("xen_send_IPI_one".into())
            }));
        // The timer by TSC-deadline writes, counted in the sampler's pauses (5 of 10 s):
        // scaled to the whole window.
        let timer = s.mechanism(Mechanism::Timer).unwrap();
        let msr = timer
            .paths
            .iter()
            .find(|p| p.how == PathMeasure::MsrWrite { msr: 0x6e0 })
            .unwrap();
        assert_eq!(msr.count, Some(1000));
        // The Xen timer hypercall was not timed here (no report): not measured, not 0.
        let hypercall = timer
            .paths
            .iter()
            .find(|p| matches!(p.how, PathMeasure::Timed { .. }))
            .unwrap();
        assert!(
            matches!(hypercall.state, PathState::NotMeasured(_)),
            "{hypercall:?}"
        );
        assert_eq!(hypercall.count, None);
        // 50 samples at 100 Hz over the 5 s sampled, scaled to 10 s: 1 s of CPU.
        assert_eq!(s.cpu.as_ref().unwrap().ns, 1e9);
    }

    /// A KVM host whose CPUID leaves PV IPIs out (KVM_FEATURE_PV_SEND_IPI clear) but offers PV
    /// EOI: the IPI hypercall paths say "not offered", never a count, and the EOI path stands
    /// as measured; with no CPUID read, nothing is said either way.
    #[test]
    fn a_path_the_hypervisor_does_not_offer_says_so_not_zero() {
        use virtgap_probes::virt::{CpuidLeaf, CpuidRegisters};
        let pv_eoi_only = Cpuid {
            hypervisor_bit: true,
            signature: Some("KVMKVMKVM".into()),
            leaves: vec![CpuidLeaf {
                leaf: 0x4000_0000,
                max_leaf: 0x4000_0001,
                signature: "KVMKVMKVM".into(),
            }],
            features: vec![CpuidRegisters {
                leaf: 0x4000_0001,
                eax: 1 << 6,
                ebx: 0,
                ecx: 0,
                edx: 0,
            }],
        };
        let mut v = virt(10.0);
        v.pv_paths = timed("kvm_guest_apic_eoi_write", 300, 100.0);
        let s = section(Hypervisor::Kvm, 10.0, Some(&v), None, Some(&pv_eoi_only));
        let ipi = s.mechanism(Mechanism::Ipi).unwrap();
        let hypercalls: Vec<&PathFigure> = ipi
            .paths
            .iter()
            .filter(|p| matches!(p.how, PathMeasure::Timed { .. }))
            .collect();
        assert_eq!(hypercalls.len(), 2);
        for p in hypercalls {
            assert_eq!(p.count, None, "{p:?}");
            match &p.state {
                PathState::NotOffered(why) => assert!(
                    why.contains("0x40000001 EAX bit 11 (KVM_FEATURE_PV_SEND_IPI) clear"),
                    "{why}"
                ),
                other => panic!("{other:?}"),
            }
        }
        let eoi = s.mechanism(Mechanism::InterruptDelivery).unwrap();
        assert_eq!(eoi.count, Some(300));
        assert_eq!(eoi.paths[0].state, PathState::Measured);
        let unread = section(Hypervisor::Kvm, 10.0, Some(&v), None, None);
        assert!(unread
            .mechanisms
            .iter()
            .flat_map(|m| &m.paths)
            .all(|p| !matches!(p.state, PathState::NotOffered(_))));
    }

    /// The doorbell where nothing can time it (no fentry, no kprobes): the sampler's time in
    /// the notify path, no count; where vp_notify is timed, the timed figure alone.
    #[test]
    fn the_doorbell_is_sampled_where_it_cannot_be_timed() {
        let s = section(Hypervisor::Kvm, 10.0, Some(&virt(10.0)), None, None);
        let notify = s.mechanism(Mechanism::DeviceNotify).unwrap();
        // 20 samples at 100 Hz over 5 s sampled, scaled to 10 s: 0.4 s.
        assert_eq!(notify.time_ns, Some(4e8));
        assert_eq!(notify.count, None);
        let mut notify_timed = virt(10.0);
        notify_timed.pv_paths = timed("vp_notify", 1000, 4000.0);
        let s = section(Hypervisor::Kvm, 10.0, Some(&notify_timed), None, None);
        let notify = s.mechanism(Mechanism::DeviceNotify).unwrap();
        assert_eq!((notify.count, notify.time_ns), (Some(1000), Some(4e6)));
    }
}
