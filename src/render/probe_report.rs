//! The probe part of the run summary: block stages, interrupt load per CPU, wakeups, and the
//! probes' own cost. Pure formatting of a `ProbeResults`.

use std::io::{self, Write};

use virtgap_probes::model::{BlockOp, BlockStage, CpuEvents, DevNum, IrqSnapshot, MsrSnapshot};
use virtgap_probes::{CapabilityReport, Family, KernelHist};
use virtgap_workloads::units;

use crate::model::profile::Histogram;
use crate::run::pipeline::ProbeResults;

fn opt_latency(v: Option<f64>) -> String {
    v.map(units::latency).unwrap_or_else(|| "-".into())
}

/// IPIs sent and cross-CPU calls queued per second, on one CPU or all, or why they are not
/// measured (the ipi_send_* and csd tracepoints came in Linux 6.4 and 6.6).
pub fn ipi_summary(
    irq: &IrqSnapshot,
    cpu: Option<u32>,
    secs: f64,
    report: &CapabilityReport,
) -> Vec<String> {
    let rate = |events: &[CpuEvents], kind: &str| {
        let n: u64 = events
            .iter()
            .filter(|e| e.kind == kind && cpu.is_none_or(|c| e.cpu == c))
            .map(|e| e.count)
            .sum();
        units::count(n as f64 / secs.max(1e-9))
    };
    if !report.counts_ipis() {
        return vec!["IPIs sent: not measured (ipi_send_* tracepoints came in Linux 6.4)".into()];
    }
    vec![
        format!(
            "IPIs sent: {}/s reschedule, {}/s function call",
            rate(&irq.ipis_sent, "reschedule"),
            rate(&irq.ipis_sent, "function_call")
        ),
        format!(
            "cross-CPU calls queued: {}/s block completion, {}/s wakeup, {}/s other",
            rate(&irq.cross_cpu_calls, "block_completion"),
            rate(&irq.cross_cpu_calls, "wakeup"),
            rate(&irq.cross_cpu_calls, "other")
        ),
    ]
}

/// MSR writes per second: the host's that exit to its hypervisor and its others, `top` MSRs
/// each, counted while virtgap's sampler paused; then the writes the sampler's own interrupts
/// made while it ran.
pub fn msr_lines(msr: &MsrSnapshot, secs: f64, top: usize) -> Vec<String> {
    let rates = |v: Vec<(u32, u64)>, per: f64| -> String {
        if v.is_empty() {
            return "none seen".into();
        }
        v.iter()
            .take(top)
            .map(|(m, n)| {
                let name = virtgap_probes::virt::msr_name(*m);
                format!("{m:#x} {name} {}/s", units::count(*n as f64 / per))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let window_ns = (secs * 1e9) as u64;
    if msr.host_scale(window_ns).is_none() {
        return vec![
            "exit-causing MSR writes: not measured (the sampler did not pause long enough to count the host's)"
                .into(),
        ];
    }
    let quiet = msr.quiet_secs(window_ns);
    let mut lines = vec![format!(
        "exit-causing MSR writes: {}",
        rates(
            msr.top_writes(|c| c.exits && MsrSnapshot::is_hosts(c)),
            quiet
        )
    )];
    let other = msr.top_writes(|c| !c.exits && MsrSnapshot::is_hosts(c));
    if !other.is_empty() {
        lines.push(format!(
            "other MSR writes (no exit known here): {}",
            rates(other, quiet)
        ));
    }
    if let Some(own) = msr.sampler_write_rate() {
        lines.push(format!(
            "(counted while virtgap's sampler paused, {:.0}% of the time: its timer changes the host's)",
            quiet / secs * 100.0
        ));
        lines.push(format!(
            "virtgap's own sampler interrupts caused {}/s MSR writes while it ran (left out above)",
            units::count(own)
        ));
    }
    lines
}

/// One block-stage table: queue, device and (where measured) completion rows under a title.
fn stage_table(
    out: &mut impl Write,
    title: &str,
    queue: &KernelHist,
    device: &KernelHist,
    completion: &KernelHist,
) -> io::Result<()> {
    writeln!(out, "  {title}:")?;
    writeln!(
        out,
        "    {:<13} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "stage", "requests", "mean", "p50", "p99", "p99.9"
    )?;
    stage_row(out, "queue", queue)?;
    stage_row(out, "device", device)?;
    if !completion.is_empty() {
        stage_row(out, "completion", completion)?;
    }
    Ok(())
}

fn stage_row(out: &mut impl Write, name: &str, h: &KernelHist) -> io::Result<()> {
    writeln!(
        out,
        "    {:<13} {:>9} {:>9} {:>9} {:>9} {:>9}",
        name,
        units::count(h.count as f64),
        opt_latency(h.mean_ns()),
        opt_latency(Histogram::kernel_percentile_ns(h, 50.0)),
        opt_latency(Histogram::kernel_percentile_ns(h, 99.0)),
        opt_latency(Histogram::kernel_percentile_ns(h, 99.9)),
    )
}

pub fn write(
    out: &mut impl Write,
    p: &ProbeResults,
    disks: &crate::model::host::TargetDisks,
) -> io::Result<()> {
    let Some(report) = &p.report else {
        return writeln!(out, "  probes: off (--no-probes)");
    };
    // The measured window, as the profile keeps it: not the idle interval or the ramp.
    let Some(window) = p.window() else {
        return writeln!(out, "  probes: no snapshot was taken");
    };
    let snap = &window;
    let secs = snap.elapsed_ns as f64 / 1e9;
    let why = |family: Family| {
        report
            .families
            .iter()
            .find(|f| f.family == family)
            .and_then(|f| f.unavailable.clone())
            .unwrap_or_else(|| "not requested".into())
    };

    match &snap.block {
        Some(block) => {
            // Each disk on its own, then a stacked target's disks together.
            let mut groups: Vec<(String, Vec<DevNum>)> = block
                .devices
                .iter()
                .map(|g| {
                    let name = p.device_names.get(&g.dev).cloned();
                    (
                        name.unwrap_or_else(|| format!("{}:{}", g.dev.0, g.dev.1)),
                        vec![g.dev],
                    )
                })
                .collect();
            if let (Some(top), Some(devs)) = (&disks.top, disks.devs().filter(|d| d.len() > 1)) {
                let members: Vec<&str> = disks.leaves.iter().map(|d| d.name.as_str()).collect();
                groups.push((
                    format!("{} ({}, summed)", top.name, members.join(" + ")),
                    devs,
                ));
            }
            for (name, devs) in &groups {
                for op in [BlockOp::Read, BlockOp::Write, BlockOp::Flush] {
                    let queue = block.stage(Some(devs), BlockStage::Queue, &[op]);
                    let device = block.stage(Some(devs), BlockStage::Device, &[op]);
                    if device.is_empty() && queue.is_empty() {
                        continue;
                    }
                    if op == BlockOp::Flush {
                        // Never issued itself: one stage, request start -> completion.
                        writeln!(
                            out,
                            "  cache flushes of this process on {name} (start -> completion):"
                        )?;
                        stage_row(out, "flush", &device)?;
                        continue;
                    }
                    let completion = block.stage(Some(devs), BlockStage::Completion, &[op]);
                    let title = format!("block stages of this process's {} on {name}", op.name());
                    stage_table(out, &title, &queue, &device, &completion)?;
                }
            }
            if let Some(note) = disks.note.as_deref().filter(|_| disks.leaves.is_empty()) {
                writeln!(out, "    {note}")?;
            }
            if block.unsplit > 0 {
                writeln!(
                    out,
                    "    {} requests kept device time to their completion (no completion stage): their queue's IRQ is not known here, or did not fire",
                    block.unsplit
                )?;
            }
            let (cross, total) = block.cross_cpu_completions();
            if total > 0 {
                writeln!(
                    out,
                    "    completed on another CPU than submitted: {:.1}% ({cross} of {total})",
                    cross as f64 / total as f64 * 100.0
                )?;
            }
            if block.dropped > 0 {
                writeln!(
                    out,
                    "    {} requests not recorded (probe maps full)",
                    block.dropped
                )?;
            }
        }
        None => writeln!(out, "  block stages: unavailable ({})", why(Family::Block))?,
    }

    match &snap.irq {
        Some(irq) if secs > 0.0 => {
            writeln!(out, "  interrupt load per CPU (all sources, {secs:.1} s):")?;
            writeln!(
                out,
                "    {:<5} {:>8} {:>8}  busiest IRQs",
                "cpu", "hardirq", "softirq"
            )?;
            for (cpu, hard, soft) in irq.cpu_irq_time() {
                let mut top: Vec<_> = irq
                    .hardirqs
                    .iter()
                    .filter(|h| h.cpu == cpu && h.count > 0)
                    .collect();
                top.sort_by_key(|h| std::cmp::Reverse(h.time_ns));
                let busiest: Vec<String> = top
                    .iter()
                    .take(2)
                    .map(|h| {
                        format!(
                            "{} {}/s at {} each",
                            h.name,
                            units::count(h.count as f64 / secs),
                            units::latency(h.time_ns as f64 / h.count as f64)
                        )
                    })
                    .collect();
                writeln!(
                    out,
                    "    {:<5} {:>7.1}% {:>7.1}%  {}",
                    format!("cpu{cpu}"),
                    hard as f64 / 1e9 / secs * 100.0,
                    soft as f64 / 1e9 / secs * 100.0,
                    busiest.join(", ")
                )?;
            }
            for line in ipi_summary(irq, None, secs, report) {
                writeln!(out, "    {line}")?;
            }
        }
        Some(_) => {}
        None => writeln!(out, "  interrupt load: unavailable ({})", why(Family::Irq))?,
    }

    match &snap.wakeups {
        Some(w) if !w.latency.is_empty() => writeln!(
            out,
            "  wakeups of the workload's threads: {}, wakeup -> on CPU mean {}, p99 {}",
            w.latency.count,
            opt_latency(w.latency.mean_ns()),
            opt_latency(Histogram::kernel_percentile_ns(&w.latency, 99.0))
        )?,
        Some(_) => writeln!(out, "  wakeups of the workload's threads: none seen")?,
        None => writeln!(out, "  wakeups: unavailable ({})", why(Family::Wakeup))?,
    }

    if let Some(nvme) = &snap.nvme {
        let queues: Vec<_> = nvme.queues.iter().filter(|q| !q.hist.is_empty()).collect();
        if !queues.is_empty() {
            writeln!(out, "  NVMe command latency per queue (all processes):")?;
            writeln!(
                out,
                "    {:<13} {:>9} {:>9} {:>9} {:>9} {:>9}",
                "queue", "commands", "mean", "p50", "p99", "p99.9"
            )?;
            for q in queues {
                let name = p
                    .device_names
                    .get(&q.dev)
                    .cloned()
                    .unwrap_or_else(|| format!("{}:{}", q.dev.0, q.dev.1));
                stage_row(out, &format!("{name} q{} {}", q.qid, q.op.name()), &q.hist)?;
            }
        }
    }

    if let (Some(msr), true) = (&snap.msr, secs > 0.0) {
        for line in msr_lines(msr, secs, 3) {
            writeln!(out, "  {line}")?;
        }
    }
    if let Some(sampler) = &snap.sampler {
        writeln!(
            out,
            "  sampled CPU time ({} Hz cpu-clock):",
            sampler.frequency_hz
        )?;
        let sampled = sampler.seconds(secs);
        for c in &sampler.cpus {
            if !c.represents(sampler.frequency_hz, sampled) {
                writeln!(
                    out,
                    "    cpu{}: not measured ({} of ~{:.0} expected samples arrived: the kernel dropped the rest, so a split would be biased)",
                    c.cpu,
                    c.total(),
                    sampler.frequency_hz as f64 * sampled
                )?;
                continue;
            }
            let total = c.total().max(1) as f64;
            let cats: Vec<String> = c
                .categories()
                .into_iter()
                .filter(|(_, n)| *n as f64 / total >= 0.005)
                .map(|(k, n)| format!("{} {:.1}%", k.name(), n as f64 / total * 100.0))
                .collect();
            writeln!(out, "    cpu{}: {}", c.cpu, cats.join(", "))?;
        }
    }

    match &report.run_stats_unavailable {
        None if secs > 0.0 => {
            let runs: u64 = snap.programs.iter().map(|p| p.run_count).sum();
            let time: u64 = snap.programs.iter().map(|p| p.run_time_ns).sum();
            writeln!(
                out,
                "  probe overhead: {} programs, {} runs/s, {} per run, {:.2}% of one CPU",
                snap.programs.len(),
                units::count(runs as f64 / secs),
                if runs > 0 {
                    units::latency(time as f64 / runs as f64)
                } else {
                    "-".into()
                },
                time as f64 / 1e9 / secs * 100.0
            )?;
        }
        None => {}
        Some(why) => writeln!(out, "  probe overhead: unavailable ({why})")?,
    }
    if let Some(idle) = p.idle_baseline(disks.devs().as_deref()) {
        writeln!(out, "  {}", idle_line(&idle))?;
    }
    Ok(())
}

/// "idle host before the workload (1.0 s): hard IRQ 0.1%, softirq 0.2% of all CPUs, …"
fn idle_line(idle: &crate::model::profile::IdleBaseline) -> String {
    let s = idle.seconds;
    let time = |ns: Option<u64>| {
        ns.map_or("not measured".into(), |n| {
            format!("{:.2}% of one CPU", n as f64 / 1e9 / s * 100.0)
        })
    };
    let rate =
        |n: Option<u64>| n.map_or("not measured".into(), |n| format!("{:.0}/s", n as f64 / s));
    format!(
        "idle host before the workload ({s:.1} s; the diff compares host-wide figures per I/O above it): hard IRQ {}, softirq {}, IPIs {}, exit-causing MSR writes {}",
        time(idle.hardirq_ns),
        time(idle.softirq_ns),
        rate(idle.ipis_sent),
        rate(idle.msr_writes)
    )
}
