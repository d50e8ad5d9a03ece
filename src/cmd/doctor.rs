//! `virtgap doctor`: the host fingerprint and the probe table — every signal, attached how, or
//! unavailable and exactly why — and which views degrade as a result.

use std::io::{Seek, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use serde::Serialize;
use virtgap_probes::hypervisor::{self, Hypervisor, Measure};
use virtgap_probes::report::ABSENT_ON_THIS_KERNEL;
use virtgap_probes::{CapabilityReport, ProbeConfig, ProbeSession, ProbeStorage};
use virtgap_probes::{Family, FamilyReport};

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
                (Some(kind), Some(how)) => format!("attached via {} ({how})", kind.name()),
                (Some(kind), None) => format!("attached via {}", kind.name()),
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

/// Every path of a hypervisor's table (`virtgap_probes::hypervisor`) and how it is measured on
/// this host.
#[derive(Clone, Debug, Serialize)]
pub struct HypervisorPaths {
    /// The hypervisor whose table this is ("none" on metal: no paths).
    pub hypervisor: String,
    /// The table is another hypervisor's, checked on this kernel (`--hypervisor`).
    pub checked_as: bool,
    pub paths: Vec<PathRow>,
}

/// One path of the table and its state here.
#[derive(Clone, Debug, Serialize)]
pub struct PathRow {
    pub mechanism: String,
    /// The path in the hypervisor's own terms.
    pub what: String,
    /// "msr_write", "timed" or "sampled".
    pub measure: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub msr: Option<u32>,
    /// A timed path's function names by kernel version, newest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// The function timed here (one of `names`), when this kernel has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symbol: Option<String>,
    /// "attached", "absent" (this kernel has none of its functions), "not_traceable" (it has
    /// one, which neither fentry nor a kprobe could take) or "unavailable" (the probe that
    /// measures it did not load).
    pub state: String,
    /// How it attached: "fentry", "kprobe", "tp_btf", "raw_tp", "perf_event".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attach: Option<String>,
    /// The state in words.
    pub detail: String,
    /// Whether the hypervisor offers it, where a CPUID bit decides: "offered: CPUID … set" or
    /// "not offered: CPUID … clear" (a path not offered is never taken: its 0 calls are not
    /// "unused").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offered: Option<String>,
}

/// The probe family that measures a path.
fn family_of(measure: Measure) -> Family {
    match measure {
        Measure::MsrWrite(_) => Family::Msr,
        Measure::Timed(_) => Family::PvPaths,
        Measure::Sampled | Measure::SampledIn(_) => Family::Sampler,
    }
}

/// Each path of `hv`'s table as `report` found it, and whether this host offers it (`cpuid`:
/// this host's, when the table is its own).
pub fn hypervisor_paths(
    hv: Hypervisor,
    checked_as: bool,
    report: &CapabilityReport,
    cpuid: Option<&crate::model::host::Cpuid>,
) -> HypervisorPaths {
    let paths = hypervisor::paths(hv)
        .iter()
        .map(|p| path_row(hv, p, report, cpuid))
        .collect();
    HypervisorPaths {
        hypervisor: hv.name().into(),
        checked_as,
        paths,
    }
}

/// One path of `hv`'s table: what it is and how it is measured, in the state the report of the
/// family that measures it says.
fn path_row(
    hv: Hypervisor,
    p: &hypervisor::Path,
    report: &CapabilityReport,
    cpuid: Option<&crate::model::host::Cpuid>,
) -> PathRow {
    let names: Vec<String> = match p.measure {
        Measure::Timed(names) | Measure::SampledIn(names) => {
            names.iter().map(|n| n.to_string()).collect()
        }
        _ => vec![],
    };
    let mut row = PathRow {
        mechanism: p.mechanism.name().into(),
        what: p.what.into(),
        measure: match p.measure {
            Measure::MsrWrite(_) => "msr_write",
            Measure::Timed(_) => "timed",
            Measure::Sampled => "sampled",
            Measure::SampledIn(_) => "sampled_in",
        }
        .into(),
        msr: match p.measure {
            Measure::MsrWrite(msr) => Some(msr),
            _ => None,
        },
        names,
        symbol: None,
        state: "unavailable".into(),
        attach: None,
        detail: String::new(),
        offered: cpuid
            .and_then(|c| crate::run::hypervisor::offer_state(hv, p, c))
            .map(|o| match o {
                Ok(bit) => format!("offered: {bit}"),
                Err(bit) => format!("not offered: {bit}"),
            }),
    };
    let family = family_of(p.measure);
    let Some(f) = report.families.iter().find(|f| f.family == family) else {
        row.detail = format!("unavailable: the {} probe was not loaded", family.name());
        return row;
    };
    if let Some(why) = &f.unavailable {
        row.detail = format!("unavailable: {} probe: {why}", family.name());
        return row;
    }
    match p.measure {
        Measure::MsrWrite(_) => row.counted_at_write_msr(f),
        Measure::Sampled | Measure::SampledIn(_) => row.sampled(f),
        Measure::Timed(names) => row.timed(f, names),
    }
    row
}

impl PathRow {
    /// A path counted by the msr probe: as its write_msr program attached.
    fn counted_at_write_msr(&mut self, f: &FamilyReport) {
        match f.tracepoints.iter().find(|t| t.tracepoint == "write_msr") {
            Some(t) if t.attached.is_some() => {
                let kind = t.attached.map(|k| k.name()).unwrap_or_default();
                self.state = "attached".into();
                self.attach = Some(kind.into());
                self.detail = format!("counted by the msr probe (write_msr via {kind})");
            }
            Some(t) => {
                self.detail = format!(
                    "unavailable: write_msr: {}",
                    t.reason.as_deref().unwrap_or("did not attach")
                )
            }
            None => self.detail = "unavailable: write_msr not loaded".into(),
        }
    }

    /// A path the sampler sees: as many CPUs' cpu-clock events as attached.
    fn sampled(&mut self, f: &FamilyReport) {
        let on = f
            .tracepoints
            .iter()
            .filter(|t| t.attached.is_some())
            .count();
        if on > 0 {
            self.state = "attached".into();
            self.attach = Some("perf_event".into());
            self.detail = format!("sampled (cpu-clock on {on} CPUs)");
        } else {
            self.detail = "unavailable: no CPU's cpu-clock event attached".into();
        }
    }

    /// A path the pv-paths probe times at the first of `names` it reported: attached there,
    /// absent from this kernel, or there but not traceable.
    fn timed(&mut self, f: &FamilyReport, names: &[&str]) {
        let outcome = f
            .tracepoints
            .iter()
            .find(|t| names.contains(&t.tracepoint.as_str()));
        match outcome {
            Some(t) if t.attached.is_some() => {
                let kind = t.attached.map(|k| k.name()).unwrap_or_default();
                self.symbol = Some(t.tracepoint.clone());
                self.state = "attached".into();
                self.attach = Some(kind.into());
                self.detail = format!("attached via {kind}");
            }
            Some(t) => {
                let why = t.reason.clone().unwrap_or_else(|| "did not attach".into());
                if why.starts_with(ABSENT_ON_THIS_KERNEL) {
                    self.state = "absent".into();
                    self.detail = why;
                } else {
                    self.symbol = Some(t.tracepoint.clone());
                    self.state = "not_traceable".into();
                    self.detail = format!("not traceable: {why}");
                }
            }
            None => self.detail = "unavailable: the pv-paths probe did not report it".into(),
        }
    }
}

fn write_hypervisor_paths(out: &mut impl Write, h: &HypervisorPaths) -> std::io::Result<()> {
    if h.paths.is_empty() {
        return writeln!(
            out,
            "\nhypervisor paths:\n  no hypervisor: nothing to measure"
        );
    }
    let whose = if h.hypervisor == Hypervisor::None.name() {
        "no hypervisor: the native callers guests' paths are timed at, for comparison".to_string()
    } else if h.checked_as {
        format!("{}'s table, checked on this kernel", h.hypervisor)
    } else {
        format!("{}, this host's", h.hypervisor)
    };
    writeln!(out, "\nhypervisor paths ({whose}):")?;
    let how = |r: &PathRow| match (r.measure.as_str(), r.msr, &r.symbol) {
        ("msr_write", Some(msr), _) => format!("MSR {msr:#x} write"),
        ("timed", _, Some(sym)) => format!("timed at {sym}"),
        ("timed", _, None) => format!("timed at {}", r.names.join("|")),
        _ => "sampled".into(),
    };
    let what_w = h.paths.iter().map(|r| r.what.len()).max().unwrap_or(0);
    let how_w = h.paths.iter().map(|r| how(r).len()).max().unwrap_or(0);
    writeln!(
        out,
        "  {:<18} {:<what_w$} {:<how_w$} state",
        "mechanism", "what", "measured by"
    )?;
    for r in &h.paths {
        let offered = r
            .offered
            .as_deref()
            .map_or(String::new(), |o| format!("; {o}"));
        writeln!(
            out,
            "  {:<18} {:<what_w$} {:<how_w$} {}{offered}",
            r.mechanism,
            r.what,
            how(r),
            r.detail
        )?;
    }
    Ok(())
}

#[derive(Serialize)]
struct DoctorJson<'a> {
    host: &'a Fingerprint,
    platform: String,
    probes: Vec<ProbeRow>,
    /// Every path of the hypervisor's table and its state here.
    hypervisor_paths: HypervisorPaths,
    degraded_views: Vec<String>,
    /// Every family's outcome and each loaded map's kernel memory.
    capabilities: &'a CapabilityReport,
    map_memory: MapMemoryTotals,
    histogram_self_test: SelfTest,
    /// Each family's cost over a second of this host's own activity.
    probe_cost: ProbeCost,
}

/// Each loaded family's cost over `COST_WINDOW`, or why it could not be measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProbeCost {
    pub seconds: f64,
    pub families: Vec<FamilyCost>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

/// How long doctor watches the probes' own cost.
const COST_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);

/// One family's programs over the cost window: how often they ran and what a run cost.
#[derive(Clone, Debug, Serialize)]
pub struct FamilyCost {
    pub family: String,
    pub events_per_s: f64,
    /// None when nothing ran.
    pub ns_per_event: Option<f64>,
    /// Of one CPU.
    pub cpu_pct: f64,
}

/// Each loaded family's cost over `window` of whatever this host does meanwhile (the kernel's
/// BPF run statistics, held on for the session). Families with no program that ran are listed
/// with no cost per event: nothing happened for them.
fn probe_costs(session: &ProbeSession, window: std::time::Duration) -> ProbeCost {
    if let Some(why) = &session.report.run_stats_unavailable {
        return ProbeCost {
            unavailable: Some(why.clone()),
            ..ProbeCost::default()
        };
    }
    let before = session.snapshot();
    std::thread::sleep(window);
    let during = session.snapshot().since(&before);
    let secs = during.elapsed_ns as f64 / 1e9;
    let families = during
        .runs_by_family()
        .into_iter()
        .map(|(family, (runs, ns))| FamilyCost {
            family: family.to_string(),
            events_per_s: runs as f64 / secs,
            ns_per_event: (runs > 0).then(|| ns as f64 / runs as f64),
            cpu_pct: ns as f64 / 1e9 / secs * 100.0,
        })
        .collect();
    ProbeCost {
        seconds: secs,
        families,
        unavailable: None,
    }
}

fn write_probe_costs(out: &mut impl Write, cost: &ProbeCost) -> std::io::Result<()> {
    writeln!(
        out,
        "\nprobe cost over {} s of this host's own activity (BPF run statistics):",
        COST_WINDOW.as_secs()
    )?;
    match &cost.unavailable {
        Some(why) => writeln!(out, "  unavailable: {why}"),
        None => {
            let costs = &cost.families;
            writeln!(
                out,
                "  {:<8} {:>12} {:>11} {:>12}",
                "family", "events/s", "per event", "of one CPU"
            )?;
            for c in costs {
                writeln!(
                    out,
                    "  {:<8} {:>12} {:>11} {:>11.3}%",
                    c.family,
                    virtgap_workloads::units::count(c.events_per_s),
                    c.ns_per_event.map_or("- (none)".into(), |ns| {
                        virtgap_workloads::units::latency(ns)
                    }),
                    c.cpu_pct
                )?;
            }
            writeln!(
                out,
                "  (per I/O costs need I/O: `virtgap record` prints the probes' overhead per run)"
            )
        }
    }
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

/// Bytes per read of --compare-stamps: the smallest O_DIRECT read every device takes.
const STAMPS_READ_BYTES: usize = 4096;

/// `doctor --compare-stamps PATH`: the block family's own stamps and the kernel's on the same
/// reads.
fn compare_stamps(path: &Path, reads: u64, json: bool) -> Result<ExitCode> {
    let what = || format!("opening {} for O_DIRECT reads", path.display());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(what)?;
    // A block device's metadata has no length; its end does.
    let size = (&file).seek(std::io::SeekFrom::End(0)).with_context(what)?;
    // Reads land in the first GiB at most.
    let blocks = size.min(1 << 30) / STAMPS_READ_BYTES as u64;
    anyhow::ensure!(
        blocks > 0,
        "{} is smaller than one 4 KiB block",
        path.display()
    );
    let mut buffer = virtgap_workloads::engine::AlignedBuffer::new(STAMPS_READ_BYTES, 4096)?;
    let c = virtgap_probes::stamps_check::compare_stamps(|| {
        crate::say!(
            "reading {reads} 4 KiB blocks of {} with both stamp sources attached...",
            path.display()
        );
        // Each step a large odd stride (coprime with a power-of-two span: no block twice
        // before all were read), so no two reads in a row are neighbours.
        let mut block = 0u64;
        for _ in 0..reads {
            block = (block + 0x9E37_79B9) % blocks;
            file.read_exact_at(buffer.as_mut_slice(), block * STAMPS_READ_BYTES as u64)?;
        }
        Ok(reads)
    })
    .with_context(|| format!("doctor --compare-stamps {}", path.display()))?;
    let mut out = std::io::stdout().lock();
    if json {
        let doc = StampsJson {
            path: path.display().to_string(),
            comparison: &c,
        };
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    write_stamps_comparison(&mut out, &path.display().to_string(), &c)?;
    Ok(ExitCode::SUCCESS)
}

/// `doctor --compare-stamps --json`: the comparison and what was read.
#[derive(Serialize)]
struct StampsJson<'c> {
    path: String,
    #[serde(flatten)]
    comparison: &'c virtgap_probes::stamps_check::StampsComparison,
}

fn write_stamps_comparison(
    out: &mut impl Write,
    path: &str,
    c: &virtgap_probes::stamps_check::StampsComparison,
) -> std::io::Result<()> {
    use virtgap_workloads::units::latency;
    let mean = |v: Option<f64>| v.map_or_else(|| "-".into(), latency);
    writeln!(
        out,
        "block stage times of {} reads of {path}, both sources on the same requests:",
        c.reads
    )?;
    writeln!(
        out,
        "  {:<8} {:>9} {:>11} {:>11} {:>11} {:>14} {:>14}",
        "stamps", "requests", "queue", "device", "completion", "programs/read", "BPF time/read"
    )?;
    for (name, s) in [("own", &c.own), ("kernel", &c.kernel)] {
        writeln!(
            out,
            "  {:<8} {:>9} {:>11} {:>11} {:>11} {:>14} {:>14}",
            name,
            s.requests,
            mean(s.queue_mean_ns),
            mean(s.device_mean_ns),
            mean(s.completion_mean_ns),
            s.program_runs_per_read
                .map_or_else(|| "-".into(), |r| format!("{r:.2}")),
            mean(s.program_ns_per_read),
        )?;
    }
    // Differences as shares of a request's whole time (start to completion, our stamps).
    let whole: f64 = [
        c.own.queue_mean_ns,
        c.own.device_mean_ns,
        c.own.completion_mean_ns,
    ]
    .iter()
    .flatten()
    .sum();
    let diff = |a: Option<f64>, b: Option<f64>, lag: f64| match (a, b) {
        (Some(a), Some(b)) if whole > 0.0 => format!("{:+.2}%", (b - a - lag) / whole * 100.0),
        _ => "-".into(),
    };
    let lag = c.order_lag_ns;
    for (what, lag) in [
        (
            "difference",
            virtgap_probes::stamps_check::StageLag::default(),
        ),
        ("less the order", lag),
    ] {
        writeln!(
            out,
            "  {:<18} {:>11} {:>11} {:>11}",
            what,
            diff(c.own.queue_mean_ns, c.kernel.queue_mean_ns, lag.queue),
            diff(c.own.device_mean_ns, c.kernel.device_mean_ns, lag.device),
            diff(
                c.own.completion_mean_ns,
                c.kernel.completion_mean_ns,
                lag.completion
            ),
        )?;
    }
    writeln!(
        out,
        "  (kernel - own, as a share of a request's {}; the kernel-stamped session's programs run \
         after ours on each tracepoint, so its clock reads there come later by our programs' \
         time: {:+.0} ns queue, {:+.0} ns device, {:+.0} ns completion)",
        latency(whole),
        lag.queue,
        lag.device,
        lag.completion,
    )?;
    let p = &c.per_request;
    let median = |v: Option<f64>, lag: f64| match (v, p.median_whole_ns) {
        (Some(v), Some(whole)) if whole > 0.0 => format!("{:+.2}%", (v - lag) / whole * 100.0),
        _ => "-".into(),
    };
    let m = p.median_difference_ns;
    writeln!(
        out,
        "  {:<18} {:>11} {:>11} {:>11}",
        "per request",
        median(m.queue, lag.queue),
        median(m.device, lag.device),
        median(m.completion, lag.completion),
    )?;
    writeln!(
        out,
        "  (median over {} requests paired by disk and sector, {} unpaired, less the order, as a \
         share of a request's median {})",
        p.paired,
        p.unpaired,
        p.median_whole_ns.map_or_else(|| "-".into(), latency),
    )?;
    for (name, s) in [("own", &c.own), ("kernel", &c.kernel)] {
        let programs: Vec<String> = s
            .programs
            .iter()
            .map(|(p, runs, ns)| format!("{p} {runs:.2}/read {}", latency(*ns)))
            .collect();
        writeln!(out, "  {name} programs: {}", programs.join(", "))?;
    }
    match &c.kernel_inexact {
        None => writeln!(
            out,
            "the kernel's stamps are exact on this kernel: --block-stamps kernel uses them"
        ),
        Some(why) => writeln!(
            out,
            "the kernel's stamps are not exact here ({why}): --block-stamps kernel keeps our own"
        ),
    }
}

pub fn run(args: &DoctorArgs) -> Result<ExitCode> {
    if let Some(path) = &args.compare_stamps {
        return compare_stamps(path, args.reads, args.json);
    }
    let host = crate::run::host::this_host();
    let mut storage = ProbeStorage::default();
    // Another hypervisor's table: only the probes that measure its paths.
    let (hypervisor, families) = match &args.hypervisor {
        Some(name) => (
            Hypervisor::of_name(name),
            vec![Family::Msr, Family::Sampler, Family::PvPaths],
        ),
        None => (
            virtgap_probes::virt::detect_hypervisor(Path::new("/")).hypervisor,
            Family::ALL.to_vec(),
        ),
    };
    // Follow this process as attach mode follows one, so the wakeup and app probes (which
    // need processes to follow) are exercised too, with the map attach mode shares.
    let config = ProbeConfig {
        follow: Some(virtgap_probes::follow::AttachTarget::Pids(vec![
            std::process::id(),
        ])),
        hypervisor: Some(hypervisor),
        families,
        ..ProbeConfig::default()
    };
    let session = ProbeSession::load(&mut storage, &config);
    let own_table = args.hypervisor.is_none();
    let paths = hypervisor_paths(
        hypervisor,
        !own_table,
        &session.report,
        own_table.then_some(&host.cpuid),
    );
    let probe_cost = probe_costs(&session, COST_WINDOW);
    let rows = probe_rows(&session.report);
    let degraded = degraded_views(&session.report);
    let mut out = std::io::stdout().lock();
    if args.json {
        let doc = DoctorJson {
            host: &host,
            platform: host.describe(),
            probes: rows,
            hypervisor_paths: paths,
            degraded_views: degraded,
            capabilities: &session.report,
            map_memory: map_memory(&session.report),
            histogram_self_test: histogram_self_test(),
            probe_cost,
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
    write_hypervisor_paths(&mut out, &paths)?;
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
    write_probe_costs(&mut out, &probe_cost)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use virtgap_probes::attach::AttachOutcome;
    use virtgap_probes::AttachKind;

    fn outcome(tracepoint: &str, attached: Option<AttachKind>, reason: &str) -> AttachOutcome {
        AttachOutcome {
            tracepoint: tracepoint.into(),
            attached,
            reason: (!reason.is_empty()).then(|| reason.into()),
        }
    }

    fn family(family: Family, tracepoints: Vec<AttachOutcome>) -> FamilyReport {
        FamilyReport {
            family,
            unavailable: None,
            tracepoints,
            fallback: None,
        }
    }

    /// A Xen guest on a 5.10-like kernel: every path of the table gets a row and a state.
    #[test]
    fn every_path_of_the_hosts_table_is_listed_with_its_state() {
        let absent = format!(
            "{ABSENT_ON_THIS_KERNEL} (no xen_flush_tlb_multi or xen_flush_tlb_others in kallsyms)"
        );
        let report = CapabilityReport {
            families: vec![
                family(
                    Family::Msr,
                    vec![outcome("write_msr", Some(AttachKind::TpBtf), "")],
                ),
                family(
                    Family::Sampler,
                    vec![
                        outcome("cpu-clock@99Hz cpu0", Some(AttachKind::PerfEvent), ""),
                        outcome("cpu-clock@99Hz cpu1", Some(AttachKind::PerfEvent), ""),
                    ],
                ),
                family(
                    Family::PvPaths,
                    vec![
                        outcome("clockevents_program_event", Some(AttachKind::Fentry), ""),
                        outcome("xen_send_IPI_one", Some(AttachKind::Fentry), ""),
                        outcome("eoi_pirq", Some(AttachKind::Kprobe), ""),
                        outcome("xen_hvm_evtchn_do_upcall", Some(AttachKind::Fentry), ""),
                        outcome("default_idle", Some(AttachKind::Fentry), ""),
                        outcome(
                            "xen_qlock_wait",
                            None,
                            "fentry: no ftrace site; kprobe: -EINVAL",
                        ),
                        outcome(
                            "__pv_queued_spin_unlock_slowpath",
                            Some(AttachKind::Fentry),
                            "",
                        ),
                        outcome("xen_flush_tlb_multi", None, &absent),
                    ],
                ),
            ],
            ..Default::default()
        };
        let h = hypervisor_paths(Hypervisor::Xen, false, &report, None);
        assert_eq!(h.paths.len(), hypervisor::paths(Hypervisor::Xen).len());
        let row = |what: &str| h.paths.iter().find(|r| r.what.starts_with(what)).unwrap();
        let timer = row("VCPUOP_set_singleshot_timer");
        assert_eq!(
            (
                timer.state.as_str(),
                timer.attach.as_deref(),
                timer.symbol.as_deref()
            ),
            (
                "attached",
                Some("fentry"),
                Some("clockevents_program_event")
            )
        );
        assert_eq!(
            row("IA32_TSC_DEADLINE").detail,
            "counted by the msr probe (write_msr via tp_btf)"
        );
        assert_eq!(row("SCHEDOP_poll").state, "not_traceable");
        assert!(row("SCHEDOP_poll").detail.contains("no ftrace site"));
        assert_eq!(row("MMUEXT_TLB_FLUSH_MULTI").state, "absent");
        assert_eq!(
            row("xen_hypercall_*").detail,
            "sampled (cpu-clock on 2 CPUs)"
        );
        let mut text = Vec::new();
        write_hypervisor_paths(&mut text, &h).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.starts_with("\nhypervisor paths (xen, this host's):\n"),
            "{text}"
        );
        assert!(
            text.contains("timed at clockevents_program_event"),
            "{text}"
        );
        assert!(
            text.contains("timed at xen_flush_tlb_multi|xen_flush_tlb_others"),
            "{text}"
        );
    }

    #[test]
    fn metal_lists_its_native_callers_and_a_missing_probe_says_so() {
        let h = hypervisor_paths(Hypervisor::None, false, &CapabilityReport::default(), None);
        let mut text = Vec::new();
        write_hypervisor_paths(&mut text, &h).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains("hypervisor paths (no hypervisor: the native callers"),
            "{text}"
        );
        assert!(
            text.contains("timer") && text.contains("timed at clockevents_program_event"),
            "{text}"
        );
        // The native IPI send, timed where the msr probe loads: it did not here.
        assert!(
            text.contains("MSR 0x830 write") && text.contains("the msr probe was not loaded"),
            "{text}"
        );
        // Another hypervisor's table checked where its probes did not load.
        let h = hypervisor_paths(Hypervisor::HyperV, true, &CapabilityReport::default(), None);
        assert!(h.checked_as);
        assert!(h
            .paths
            .iter()
            .all(|r| r.state == "unavailable" && r.detail.contains("was not loaded")));
    }
}
