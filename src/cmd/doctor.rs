//! `virtgap doctor`: the host fingerprint and the probe table — every signal, attached how, or
//! unavailable and exactly why — and which views degrade as a result.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use serde::Serialize;
use virtgap_probes::FamilyReport;
use virtgap_probes::{CapabilityReport, ProbeConfig, ProbeSession, ProbeStorage};

use crate::cli::DoctorArgs;
use crate::model::host::Fingerprint;

/// One row of the probe table.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeRow {
    pub family: String,
    pub tracepoint: String,
    pub signal: String,
    /// "attached via tp_btf", or "unavailable: <reason>".
    pub status: String,
    pub available: bool,
}

/// Signals that are not tracepoints of a loaded family.
fn extra_rows(report: &CapabilityReport) -> Vec<ProbeRow> {
    let tracefs = if Path::new("/sys/kernel/tracing/events").exists() {
        "tracefs mounted (not needed: every probe attaches without it)"
    } else {
        "tracefs not mounted (not needed: every probe attaches without it)"
    };
    vec![
        ProbeRow {
            family: "self".into(),
            tracepoint: "BPF_ENABLE_STATS".into(),
            signal: "run time of our own programs".into(),
            available: report.run_stats_unavailable.is_none(),
            status: match &report.run_stats_unavailable {
                None => "enabled while virtgap runs".into(),
                Some(why) => format!("unavailable: {why}"),
            },
        },
        ProbeRow {
            family: "classic".into(),
            tracepoint: "tracefs".into(),
            signal: "classic tracepoints".into(),
            available: true,
            status: tracefs.into(),
        },
    ]
}

pub fn probe_rows(report: &CapabilityReport) -> Vec<ProbeRow> {
    let mut rows = Vec::new();
    for f in &report.families {
        rows.extend(family_rows(f));
    }
    rows.extend(extra_rows(report));
    rows
}

fn family_rows(f: &FamilyReport) -> Vec<ProbeRow> {
    if let Some(why) = &f.unavailable {
        return vec![ProbeRow {
            family: f.family.name().into(),
            tracepoint: "(all)".into(),
            signal: f.family.def().gives.into(),
            status: format!("unavailable: {why}"),
            available: false,
        }];
    }
    f.tracepoints
        .iter()
        .map(|t| ProbeRow {
            family: f.family.name().into(),
            tracepoint: t.tracepoint.clone(),
            // Every attach point of the objects has its signal (a probes test checks); one
            // that does not is still the family's.
            signal: f
                .family
                .signal(&t.tracepoint)
                .unwrap_or(f.family.def().gives)
                .into(),
            status: match (t.attached, &t.reason) {
                (Some(kind), _) => format!("attached via {}", kind.name()),
                (None, Some(why)) => format!("unavailable: {why}"),
                (None, None) => "unavailable".into(),
            },
            available: t.attached.is_some(),
        })
        .collect()
}

/// Views that lose something on this host, in words.
pub fn degraded_views(report: &CapabilityReport) -> Vec<String> {
    let mut out = Vec::new();
    for f in &report.families {
        if f.watches_nothing_here() {
            continue;
        }
        let what = f.family.def().view;
        if let Some(why) = &f.unavailable {
            out.push(format!("{what}: missing ({why})"));
        } else {
            let missing: Vec<&str> = f
                .tracepoints
                .iter()
                .filter(|t| t.attached.is_none())
                .map(|t| t.tracepoint.as_str())
                .collect();
            if !missing.is_empty() {
                out.push(format!("{what}: partial (no {})", missing.join(", ")));
            }
        }
    }
    if let Some(why) = &report.run_stats_unavailable {
        out.push(format!("probe self-overhead: missing ({why})"));
    }
    out
}

#[derive(Serialize)]
struct DoctorJson<'a> {
    host: &'a Fingerprint,
    platform: String,
    probes: Vec<ProbeRow>,
    degraded_views: Vec<String>,
    /// Every family's outcome and each loaded map's kernel memory.
    capabilities: &'a CapabilityReport,
    map_memory: MapMemoryTotals,
    histogram_self_test: SelfTest,
}

/// The in-kernel histogram self-test's outcome.
#[derive(Clone, Debug, Serialize)]
struct SelfTest {
    ok: bool,
    /// Values checked, or what went wrong.
    detail: String,
}

fn histogram_self_test() -> SelfTest {
    match virtgap_probes::selftest::histogram_self_test() {
        Ok(n) => SelfTest {
            ok: true,
            detail: format!(
                "{n} known values landed in their slots, plain and atomic (BPF_PROG_TEST_RUN)"
            ),
        },
        Err(e) => SelfTest {
            ok: false,
            detail: e.to_string(),
        },
    }
}

/// The probes' kernel map memory on this host, and the same maps on bigger hosts.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct MapMemoryTotals {
    /// The kernel's own figure (fdinfo memlock), when every map reports one.
    pub kernel_bytes: Option<u64>,
    pub estimated_bytes: u64,
    pub estimated_bytes_64_cpus: u64,
    pub estimated_bytes_192_cpus: u64,
    pub possible_cpus: u64,
}

pub fn map_memory(report: &CapabilityReport) -> MapMemoryTotals {
    let maps = &report.maps;
    MapMemoryTotals {
        kernel_bytes: maps.iter().map(|m| m.kernel_bytes).sum(),
        estimated_bytes: maps.iter().map(|m| m.estimated_bytes).sum(),
        estimated_bytes_64_cpus: maps.iter().map(|m| m.estimated_bytes_64_cpus).sum(),
        estimated_bytes_192_cpus: maps.iter().map(|m| m.estimated_bytes_192_cpus).sum(),
        possible_cpus: virtgap_probes::memory::possible_cpus(),
    }
}

fn write_map_memory(out: &mut impl Write, report: &CapabilityReport) -> std::io::Result<()> {
    use virtgap_workloads::units::bytes;
    let m = map_memory(report);
    if report.maps.is_empty() {
        return Ok(());
    }
    let here = match m.kernel_bytes {
        Some(k) => format!(
            "{} by the kernel's count, {} estimated",
            bytes(k),
            bytes(m.estimated_bytes)
        ),
        None => format!("{} estimated", bytes(m.estimated_bytes)),
    };
    writeln!(
        out,
        "\nmap memory: {here} on this host ({} possible CPUs); the same maps on 64 CPUs: {}, on 192 CPUs: {}",
        m.possible_cpus,
        bytes(m.estimated_bytes_64_cpus),
        bytes(m.estimated_bytes_192_cpus)
    )?;
    let mut largest: Vec<_> = report.maps.iter().collect();
    largest.sort_by_key(|x| std::cmp::Reverse(x.estimated_bytes_192_cpus));
    let top: Vec<String> = largest
        .iter()
        .take(4)
        .map(|x| format!("{}/{} {}", x.family.name(), x.map, bytes(x.estimated_bytes)))
        .collect();
    writeln!(out, "  largest here: {}", top.join(", "))
}

pub fn run(args: &DoctorArgs) -> Result<ExitCode> {
    let host = Fingerprint::this_host();
    let mut storage = ProbeStorage::default();
    // Follow this process so the wakeup probe is exercised too.
    let config = ProbeConfig {
        filter_tgid: Some(std::process::id()),
        ..ProbeConfig::default()
    };
    let session = ProbeSession::load(&mut storage, &config);
    let rows = probe_rows(&session.report);
    let degraded = degraded_views(&session.report);
    let mut out = std::io::stdout().lock();
    if args.json {
        let doc = DoctorJson {
            host: &host,
            platform: host.describe(),
            probes: rows,
            degraded_views: degraded,
            capabilities: &session.report,
            map_memory: map_memory(&session.report),
            histogram_self_test: histogram_self_test(),
        };
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    write_host(&mut out, &host)?;
    writeln!(out, "\nprobes:")?;
    writeln!(
        out,
        "  {:<8} {:<28} {:<38} status",
        "family", "tracepoint", "signal"
    )?;
    for r in &rows {
        writeln!(
            out,
            "  {:<8} {:<28} {:<38} {}",
            r.family, r.tracepoint, r.signal, r.status
        )?;
    }
    writeln!(out, "\nviews:")?;
    if degraded.is_empty() {
        writeln!(out, "  every view has all its signals on this host")?;
    }
    for d in &degraded {
        writeln!(out, "  {d}")?;
    }
    let notes: Vec<String> = session
        .report
        .families
        .iter()
        .filter_map(|f| {
            f.fallback
                .as_ref()
                .map(|why| format!("{}: loaded as raw_tp because {why}", f.family.name()))
        })
        .chain(session.report.notes.iter().cloned())
        .collect();
    if !notes.is_empty() {
        writeln!(out, "\nnotes:")?;
        for n in &notes {
            writeln!(out, "  {n}")?;
        }
    }
    write_map_memory(&mut out, &session.report)?;
    let selftest = histogram_self_test();
    let verdict = if selftest.ok { "ok" } else { "FAILED" };
    writeln!(
        out,
        "in-kernel histogram self-test: {verdict}: {}",
        selftest.detail
    )?;
    Ok(ExitCode::SUCCESS)
}

fn opt(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("-")
}

fn write_host(out: &mut impl Write, h: &Fingerprint) -> std::io::Result<()> {
    writeln!(out, "host: {}", h.describe())?;
    let sig = h
        .cpuid
        .signature
        .as_deref()
        .map(|s| format!(", CPUID signature \"{s}\""))
        .unwrap_or_default();
    writeln!(
        out,
        "  hypervisor    {} (hypervisor bit {}{sig})",
        h.hypervisor,
        if h.cpuid.hypervisor_bit {
            "set"
        } else {
            "clear"
        }
    )?;
    writeln!(out, "  platform      {}", h.platform)?;
    match &h.dmi {
        Some(d) => writeln!(
            out,
            "  dmi           vendor {}, product {}, bios {} {}",
            opt(&d.sys_vendor),
            opt(&d.product_name),
            opt(&d.bios_vendor),
            opt(&d.bios_version)
        )?,
        None => writeln!(out, "  dmi           none (no SMBIOS tables)")?,
    }
    writeln!(
        out,
        "  /sys/hypervisor/type  {}",
        opt(&h.sys_hypervisor_type)
    )?;
    writeln!(
        out,
        "  clocksource   {} (available: {})",
        opt(&h.clocksource),
        h.available_clocksources.join(" ")
    )?;
    writeln!(
        out,
        "  kernel        {}, BTF {}",
        opt(&h.kernel),
        if h.btf { "yes" } else { "no" }
    )?;
    let smt = match h.smt_active {
        Some(true) => "SMT on",
        Some(false) => "SMT off",
        None => "SMT unknown",
    };
    writeln!(
        out,
        "  cpu           {}, {} CPUs, {smt}",
        opt(&h.cpu_model),
        h.cpus
    )?;
    writeln!(out, "  block devices:")?;
    for d in &h.block_devices {
        writeln!(
            out,
            "    {} ({}{}): scheduler {}, nr_requests {}, rq_affinity {}, polling {}, logical block {} B",
            d.name,
            d.kind,
            d.model.as_deref().map(|m| format!(", {m}")).unwrap_or_default(),
            opt(&d.scheduler),
            d.nr_requests.map_or("-".into(), |n| n.to_string()),
            d.rq_affinity.map_or("-".into(), |n| n.to_string()),
            match d.io_poll {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            },
            d.logical_block_size.map_or("-".into(), |n| n.to_string()),
        )?;
        for q in &d.queues {
            match &q.irq {
                Some(irq) => writeln!(
                    out,
                    "      queue {} (CPUs {}): IRQ {} {} via {}, delivered to CPU {}",
                    q.index,
                    q.cpu_list,
                    irq.irq,
                    irq.name,
                    irq.chip,
                    opt(&irq.effective_affinity)
                )?,
                None => writeln!(
                    out,
                    "      queue {} (CPUs {}): no IRQ found",
                    q.index, q.cpu_list
                )?,
            }
        }
    }
    Ok(())
}
