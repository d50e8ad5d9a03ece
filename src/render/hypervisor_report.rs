//! The hypervisor section of a run's summary: per mechanism, how often per I/O and per second,
//! the time of its timed paths, and how each path was measured; the sampled CPU time in the
//! hypervisor interface. On metal: no hypervisor, and the native work timed for comparison.

use std::io::{self, Write};

use virtgap_workloads::units;

use crate::model::hypervisor::{HypervisorSection, MechanismFigure, PathMeasure, PathState};
use virtgap_probes::hypervisor::{Hypervisor, Mechanism};

/// The section, for a run of `ios` I/Os.
pub fn write(out: &mut impl Write, h: &HypervisorSection, ios: f64) -> io::Result<()> {
    let name = hypervisor_words(Some(h.hypervisor));
    let native = !h.is_guest();
    if native && h.mechanisms.iter().all(|m| m.count.is_none()) {
        return writeln!(
            out,
            "  hypervisor: none (bare metal): nothing between the guest and the device to measure"
        );
    }
    if native {
        writeln!(
            out,
            "  hypervisor: none (bare metal); native work at the functions guests' paths are timed at, \
             for comparison, over {:.1} s of probes",
            h.seconds
        )?;
    } else {
        writeln!(
            out,
            "  hypervisor: {name}, its mechanisms over {:.1} s of probes (each path: how it was measured)",
            h.seconds
        )?;
    }
    writeln!(
        out,
        "    {:<22} {:>9} {:>9} {:>11}  paths",
        "mechanism", "per I/O", "per s", "time/I/O"
    )?;
    // Why paths were not measured, said once each under the table.
    let mut reasons: Vec<&str> = Vec::new();
    for m in &h.mechanisms {
        write_mechanism(out, m, h.seconds, ios, &mut reasons)?;
    }
    for (n, why) in reasons.iter().enumerate() {
        writeln!(out, "      [{}] not measured: {why}", n + 1)?;
    }
    match &h.cpu {
        Some(cpu) if ios > 0.0 => {
            let busiest = cpu
                .per_cpu
                .iter()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .filter(|(_, ns)| **ns > 0.0)
                .map_or(String::new(), |(c, ns)| {
                    format!(
                        "; most on cpu{c}, {:.1}% of it",
                        ns / 1e9 / h.seconds.max(1e-9) * 100.0
                    )
                });
            writeln!(
                out,
                "    hypervisor interface CPU time (sampled): {} per I/O, {:.2}% of one CPU{busiest}",
                units::latency(cpu.ns / ios),
                cpu.ns / 1e9 / h.seconds.max(1e-9) * 100.0
            )
        }
        Some(_) => Ok(()),
        // Metal has no hypervisor interface to sample.
        None if native => Ok(()),
        None => writeln!(out, "    hypervisor interface CPU time: not sampled"),
    }
}

fn write_mechanism<'a>(
    out: &mut impl Write,
    m: &'a MechanismFigure,
    seconds: f64,
    ios: f64,
    reasons: &mut Vec<&'a str>,
) -> io::Result<()> {
    let per = |n: f64, by: f64| {
        (by > 0.0)
            .then(|| n / by)
            .map_or("-".to_string(), |v| format!("{v:.3}"))
    };
    let (per_io, per_s) = match m.count {
        Some(n) => (
            per(n as f64, ios),
            units::count(n as f64 / seconds.max(1e-9)),
        ),
        None => ("-".into(), "-".into()),
    };
    let time = m
        .time_ns
        .filter(|_| ios > 0.0)
        .map_or("-".into(), |t| units::latency(t / ios));
    let paths: Vec<String> = m.paths.iter().map(|p| path_words(p, reasons)).collect();
    writeln!(
        out,
        "    {:<22} {per_io:>9} {per_s:>9} {time:>11}  {}",
        mechanism_words(m.mechanism),
        paths.join("; ")
    )
}

/// "MSR 0x6e0 write", "xen_send_IPI_one timed", "sampled", with what happened to it (a reason
/// it was not measured goes into `reasons`, and the path points at it).
fn path_words<'a>(
    p: &'a crate::model::hypervisor::PathFigure,
    reasons: &mut Vec<&'a str>,
) -> String {
    let how = match &p.how {
        PathMeasure::MsrWrite { msr } if p.time_ns.is_some() => {
            format!("MSR {msr:#x} write (IPIs to one CPU timed)")
        }
        PathMeasure::MsrWrite { msr } => format!("MSR {msr:#x} write"),
        PathMeasure::Timed {
            symbol: Some(symbol),
        } => format!("{symbol} timed"),
        PathMeasure::Timed { symbol: None } => format!("{} timed", p.what),
        PathMeasure::Sampled => "sampled".into(),
        PathMeasure::SampledIn { functions } => format!("sampled in {}", functions.join(", ")),
    };
    match &p.state {
        PathState::Measured => how,
        PathState::Absent => format!("{how}: absent on this kernel"),
        PathState::NotMeasured(why) => {
            let n = match reasons.iter().position(|r| *r == why.as_str()) {
                Some(i) => i + 1,
                None => {
                    reasons.push(why);
                    reasons.len()
                }
            };
            format!("{how}: not measured [{n}]")
        }
        PathState::NotOffered(why) => format!("{how}: not offered by this host ({why})"),
    }
}

/// A hypervisor mechanism as the reports name what it counts.
pub fn mechanism_words(m: Mechanism) -> &'static str {
    match m {
        Mechanism::Timer => "timer programmings",
        Mechanism::Ipi => "IPIs",
        Mechanism::InterruptDelivery => "interrupt EOIs",
        Mechanism::Upcall => "upcalls",
        Mechanism::Halt => "halts",
        Mechanism::SpinlockWait => "PV spinlock waits",
        Mechanism::SpinlockKick => "PV spinlock kicks",
        Mechanism::TlbFlush => "TLB-flush hypercalls",
        Mechanism::DeviceNotify => "doorbells",
        Mechanism::OtherHypercall => "other hypercalls",
    }
}

/// A hypervisor as the reports name it.
pub fn hypervisor_words(h: Option<Hypervisor>) -> &'static str {
    match h {
        None => "not measured",
        Some(Hypervisor::None) => "no hypervisor",
        Some(Hypervisor::Kvm) => "KVM",
        Some(Hypervisor::Xen) => "Xen",
        Some(Hypervisor::HyperV) => "Hyper-V",
        Some(Hypervisor::Vmware) => "VMware",
        Some(Hypervisor::Other) => "another hypervisor",
    }
}

/// A hypervisor mechanism as a noun for its time ("timer programming time").
pub fn mechanism_noun(m: Mechanism) -> &'static str {
    match m {
        Mechanism::Timer => "timer programming",
        Mechanism::Ipi => "IPI",
        Mechanism::InterruptDelivery => "EOI",
        Mechanism::Upcall => "upcall",
        Mechanism::Halt => "halt",
        Mechanism::SpinlockWait => "spinlock wait",
        Mechanism::SpinlockKick => "spinlock kick",
        Mechanism::TlbFlush => "TLB-flush",
        Mechanism::DeviceNotify => "doorbell",
        Mechanism::OtherHypercall => "other hypercall",
    }
}
