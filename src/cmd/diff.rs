//! `virtgap diff A B`: loads each host's profiles, refuses different workloads unless forced, and
//! prints the comparison (text, Markdown or JSON), with CSV, SVG charts and an HTML page on
//! request.

use std::process::ExitCode;

use crate::analysis::diff;
use crate::cli::{DiffArgs, FailOn, FOUND_EXIT};
use crate::model::iotune::IotuneProfile;
use crate::model::{file, profile};
use crate::render::{charts, diff_html, diff_render};
use crate::run::output;
use virtgap_workloads::units;

/// The charts `--svg DIR` writes.
const SVG_FILES: [&str; 3] = ["percentiles.svg", "waterfall.svg", "hypervisor.svg"];

/// The most bytes of profiles one diff reads, all inputs together: two profiles of the largest
/// size a profile may have. Parsed, a profile takes about three times its size in memory.
pub const MAX_DIFF_INPUT_BYTES: u64 = 2 * file::MAX_PROFILE_BYTES;

/// The profiles a path names: itself, every `.json` file of a directory (sorted), or the files
/// a quoted glob pattern matches (`'vm-*.json'`), so "10 VMs vs 10 metal" is one command.
fn expand(path: &std::path::Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let shown = units::printable(&path.display().to_string()).into_owned();
    if path.is_dir() {
        let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(path)
            .map_err(|e| anyhow::anyhow!("{shown}: cannot list it: {e}"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
            .collect();
        files.sort();
        if files.is_empty() {
            anyhow::bail!("{shown}: a directory with no .json profiles in it; name profile files, or a directory holding them");
        }
        return Ok(files);
    }
    let text = path.to_string_lossy();
    if !path.exists() && text.contains(['*', '?', '[']) {
        let mut files: Vec<std::path::PathBuf> = glob::glob(&text)
            .map_err(|e| anyhow::anyhow!("{shown}: not a valid pattern: {e}"))?
            .filter_map(Result::ok)
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        if files.is_empty() {
            anyhow::bail!("{shown}: no profile matches this pattern");
        }
        return Ok(files);
    }
    Ok(vec![path.to_path_buf()])
}

/// One side's profiles: the positional path's, then each `--with-` path's, expanded.
fn side_paths(
    first: &std::path::Path,
    more: &[std::path::PathBuf],
) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut paths = expand(first)?;
    for p in more {
        paths.extend(expand(p)?);
    }
    Ok(paths)
}

pub fn run(args: &DiffArgs) -> anyhow::Result<ExitCode> {
    if let Some(url) = &args.prometheus {
        return diff_prometheus(args, url);
    }
    let a_paths = side_paths(&args.a, &args.with_a)?;
    let b_paths = side_paths(&args.b, &args.with_b)?;
    let outputs = claim_outputs(args, &a_paths, &b_paths)?;
    check_input_budget(a_paths.iter().chain(&b_paths).map(|p| p.as_path()))?;
    let (a_docs, b_docs) = (load_side(&a_paths)?, load_side(&b_paths)?);
    let is_iotune = |d: &file::Document| matches!(d, file::Document::Iotune(_));
    if a_docs.iter().chain(&b_docs).any(|(_, d)| is_iotune(d)) {
        return diff_iotune(args, a_docs, b_docs);
    }
    let (a_side, b_side) = (profiles_of(a_docs), profiles_of(b_docs));
    check_repeated_runs(&run_identities(&a_side), &run_identities(&b_side))?;
    say_what_is_compared(&a_side, &b_side);
    check_same_workload(args, &a_side, &b_side)?;
    judge_and_report(args, &outputs, (&a_side, &b_side))
}

/// A profile and where it came from (its file, or the Prometheus instance).
type Named = (std::path::PathBuf, profile::Profile);

/// The two sides judged, the report printed and the files `--csv`, `--svg` and `--html` asked
/// for written; the exit status `--fail-on` asks for.
fn judge_and_report(
    args: &DiffArgs,
    outputs: &output::Outputs,
    (a_side, b_side): (&[Named], &[Named]),
) -> anyhow::Result<ExitCode> {
    let options = diff::DiffOptions {
        min_effect: args.min_effect,
    };
    let a_profiles: Vec<&profile::Profile> = a_side.iter().map(|(_, p)| p).collect();
    let b_profiles: Vec<&profile::Profile> = b_side.iter().map(|(_, p)| p).collect();
    let d = diff::diff_hosts(&a_profiles, &b_profiles, &options).with_files(
        file_names(a_side.iter().map(|(p, _)| p.as_path())),
        file_names(b_side.iter().map(|(p, _)| p.as_path())),
    );
    print_report(args, &d)?;
    write_files(args, outputs, (&a_profiles, &b_profiles), &d)?;
    Ok(exit_for(args.fail_on, (d.b_slower(), d.any_significant())))
}

/// Each side's files (or Prometheus instances) as the reports name them: the name alone, not
/// the directory a run's scratch space happened to be in.
fn file_names<'a>(paths: impl IntoIterator<Item = &'a std::path::Path>) -> Vec<String> {
    paths
        .into_iter()
        .map(|p| {
            p.file_name()
                .unwrap_or(p.as_os_str())
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// `diff --prometheus URL A B`: each side's instances (those whose `virtgap_host_info` matches
/// its selector in the range) read back from Prometheus as profiles, each slice of the range a
/// run, and judged as two groups of profile files are.
fn diff_prometheus(args: &DiffArgs, url: &str) -> anyhow::Result<ExitCode> {
    use crate::analysis::fleet;
    use crate::run::prometheus::{self, Prometheus};
    let server = Prometheus::new(url)?;
    let selectors = [args.a.to_string_lossy(), args.b.to_string_lossy()];
    for s in &selectors {
        if s.trim().trim_matches(['{', '}']).trim().is_empty() {
            anyhow::bail!("--prometheus: an empty label selector; give one per side, e.g. 'platform=\"metal\"' 'platform=\"kvm\"'");
        }
    }
    let until = args.until.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    });
    let since = args.since.map_or(3600.0, |s| s.0.as_secs_f64());
    let slice = args
        .slice
        .map_or(600.0_f64.min(since), |s| s.0.as_secs_f64());
    if since < 1.0 || slice < 1.0 {
        anyhow::bail!(
            "--since and --slice must each be at least 1s (a scrape apart, at the least)"
        );
    }
    let bounds = fleet::boundaries(until - since, until, slice);
    let outputs = claim_outputs(args, &[], &[])?;
    let mut sides = Vec::new();
    for (name, selector) in ["A", "B"].into_iter().zip(&selectors) {
        let mut told = 0;
        let hosts = prometheus::fleet_side(&server, selector, &bounds, &mut |done, total| {
            // A fleet's range can take a while: a line per tenth of the queries.
            if total >= 100 && done * 10 / total > told {
                told = done * 10 / total;
                say!("virtgap: host {name} ({selector}): {done}/{total} queries read");
            }
        })?;
        say!(
            "virtgap: host {name} ({selector}): {} instance(s), {} slice(s) of {}",
            hosts.len(),
            bounds.len() - 1,
            humantime::format_duration(std::time::Duration::from_secs_f64(slice.min(since)))
        );
        sides.push(hosts);
    }
    prometheus::apart(&sides[0], &sides[1])?;
    let mut profiles = Vec::new();
    for (hosts, selector) in sides.iter().zip(&selectors) {
        let source = fleet::FleetSource {
            url: server.url(),
            selector,
        };
        let side: Vec<(std::path::PathBuf, profile::Profile)> = hosts
            .iter()
            .filter_map(|h| {
                let p = fleet::host_profile(h, source);
                if p.is_none() {
                    say!(
                        "virtgap: {}: no block request in the range; left out",
                        units::printable(&h.instance)
                    );
                }
                Some((std::path::PathBuf::from(&h.instance), p?))
            })
            .collect();
        if side.is_empty() {
            anyhow::bail!(
                "no instance matching {} completed a block request in the range; nothing to compare (widen --since, or check that serve ran there)",
                prometheus::braced(selector)
            );
        }
        profiles.push(side);
    }
    let (a_side, b_side) = (&profiles[0], &profiles[1]);
    say_what_is_compared(a_side, b_side);
    judge_and_report(args, &outputs, (a_side, b_side))
}

/// The files `--csv`, `--svg` and `--html` will write, claimed before anything is read: none
/// may be an input, whatever the consent.
fn claim_outputs(
    args: &DiffArgs,
    a_paths: &[std::path::PathBuf],
    b_paths: &[std::path::PathBuf],
) -> anyhow::Result<output::Outputs> {
    let inputs = a_paths
        .iter()
        .map(|p| ("a profile of host A", p))
        .chain(b_paths.iter().map(|p| ("a profile of host B", p)));
    let mut outputs = output::Outputs::new(args.overwrite, "pass --overwrite to replace it");
    for (role, path) in inputs {
        outputs.input(role, path);
    }
    if let Some(path) = &args.csv {
        outputs.file("--csv", path)?;
    }
    if let Some(dir) = &args.svg {
        outputs.dir("--svg", dir, &SVG_FILES)?;
    }
    if let Some(path) = &args.html {
        outputs.file("--html", path)?;
    }
    Ok(outputs)
}

/// Each file of a side, read: a profile or an iotune result.
fn load_side(
    paths: &[std::path::PathBuf],
) -> anyhow::Result<Vec<(std::path::PathBuf, file::Document)>> {
    paths
        .iter()
        .map(|path| Ok((path.clone(), file::load_document(path)?)))
        .collect()
}

/// A side's profiles, each with its path (its iotune results, which a profile diff never has,
/// left out).
fn profiles_of(
    docs: Vec<(std::path::PathBuf, file::Document)>,
) -> Vec<(std::path::PathBuf, profile::Profile)> {
    docs.into_iter()
        .filter_map(|(path, d)| match d {
            file::Document::Profile(p) => Some((path, *p)),
            file::Document::Iotune(_) => None,
        })
        .collect()
}

/// Every recorded run of a side, with the path of the profile holding it.
fn run_identities(
    side: &[(std::path::PathBuf, profile::Profile)],
) -> Vec<(std::path::PathBuf, String)> {
    side.iter()
        .flat_map(|(path, p)| {
            p.replicates()
                .into_iter()
                .map(move |(r, _)| (path.clone(), run_identity(&r)))
        })
        .collect()
}

/// Says on stderr which profiles a side of several pools, and which profiles are incomplete.
fn say_what_is_compared(
    a_side: &[(std::path::PathBuf, profile::Profile)],
    b_side: &[(std::path::PathBuf, profile::Profile)],
) {
    for (name, side) in [("A", a_side), ("B", b_side)] {
        if side.len() > 1 {
            let names: Vec<String> = side
                .iter()
                .map(|(p, _)| units::printable(&p.display().to_string()).into_owned())
                .collect();
            say!(
                "virtgap: host {name}: {} profiles: {}",
                side.len(),
                names.join(", ")
            );
        }
    }
    for (path, p) in a_side.iter().chain(b_side) {
        if !p.complete {
            say!(
                "virtgap: warning: {} is incomplete (its run was interrupted); comparing anyway",
                units::printable(&path.display().to_string())
            );
        }
    }
}

/// Refuses, unless `--force`d, profiles of different workloads: every profile pooled on a side
/// must be the same workload as that side's first, and the two sides the same as each other.
fn check_same_workload(
    args: &DiffArgs,
    a_side: &[(std::path::PathBuf, profile::Profile)],
    b_side: &[(std::path::PathBuf, profile::Profile)],
) -> anyhow::Result<()> {
    let ((a_path, a), (b_path, b)) = (&a_side[0], &b_side[0]);
    let pairs = a_side
        .iter()
        .skip(1)
        .map(|(path, p)| (a_path, a, path, p))
        .chain(b_side.iter().skip(1).map(|(path, p)| (b_path, b, path, p)))
        .chain(std::iter::once((a_path, a, b_path, b)));
    for (first_path, first, path, p) in pairs {
        let differences = diff::spec_differences(first, p);
        // Two attached runs measured programs no one here chose: what differs is said in the
        // diff's warnings, not refused.
        let both_attached = first.attached.is_some() && p.attached.is_some();
        if !differences.is_empty() && !args.force && !both_attached {
            anyhow::bail!(
                "{} and {} ran different workloads ({}); pass --force to compare anyway",
                first_path.display(),
                path.display(),
                differences
                    .iter()
                    .map(diff_render::spec_difference)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    Ok(())
}

/// The report on stdout: JSON, Markdown or the terminal's text.
fn print_report(args: &DiffArgs, d: &diff::ProfileDiff) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", diff_render::json(d)?)?;
    } else {
        // Host names, workload names and labels come from other hosts' profiles: shown, never
        // obeyed by the terminal.
        let text = if args.markdown {
            diff_render::markdown(d)
        } else {
            diff_render::terminal(d)
        };
        out.write_all(units::printable(&text).as_bytes())?;
    }
    Ok(())
}

/// Writes what `--csv`, `--svg` and `--html` ask for, of the diff of hosts `a` and `b`.
fn write_files(
    args: &DiffArgs,
    outputs: &output::Outputs,
    (a, b): (&[&profile::Profile], &[&profile::Profile]),
    d: &diff::ProfileDiff,
) -> anyhow::Result<()> {
    if let Some(path) = &args.csv {
        outputs.write("--csv", path, diff_render::csv(d).as_bytes())?;
    }
    if let Some(dir) = &args.svg {
        let drawn = [
            charts::percentiles::diff_chart(a, b, d),
            charts::waterfalls::waterfall_chart(d),
            charts::waterfalls::hypervisor_chart(d),
        ];
        for (name, svg) in SVG_FILES.into_iter().zip(drawn) {
            outputs.write("--svg", &dir.join(name), svg.as_bytes())?;
        }
    }
    if let Some(path) = &args.html {
        let page = diff_html::page(a, b, d);
        outputs.write("--html", path, page.as_bytes())?;
    }
    Ok(())
}

/// The exit status once the report is out: 3 when `--fail-on`'s condition is met (given as
/// whether B is slower, and whether anything is significant).
fn exit_for(fail_on: FailOn, (slower, significant): (bool, bool)) -> ExitCode {
    let found = match fail_on {
        FailOn::Slower => slower,
        FailOn::Significant => significant,
        FailOn::Never => false,
    };
    if found {
        ExitCode::from(FOUND_EXIT)
    } else {
        ExitCode::SUCCESS
    }
}

/// Iotune results, one or more a side: the four figures judged over their measured runs (a
/// side's results pooled), and each phase's saturation point compared.
fn diff_iotune(
    args: &DiffArgs,
    a: Vec<(std::path::PathBuf, file::Document)>,
    b: Vec<(std::path::PathBuf, file::Document)>,
) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let a_paths: Vec<std::path::PathBuf> = a.iter().map(|(p, _)| p.clone()).collect();
    let b_paths: Vec<std::path::PathBuf> = b.iter().map(|(p, _)| p.clone()).collect();
    let results = |side: &str, docs: Vec<(std::path::PathBuf, file::Document)>| {
        docs.into_iter()
            .map(|(_, d)| match d {
                file::Document::Iotune(r) => Ok(*r),
                file::Document::Profile(_) => anyhow::bail!("host {side} has a profile among iotune results: compare iotune results with iotune results, profiles with profiles"),
            })
            .collect::<anyhow::Result<Vec<_>>>()
    };
    let (a, b) = (results("A", a)?, results("B", b)?);
    let identities = |paths: &[std::path::PathBuf], results: &[IotuneProfile]| {
        paths
            .iter()
            .zip(results)
            .map(|(path, r)| {
                let figures: Vec<u64> = r
                    .phases
                    .iter()
                    .flat_map(|p| p.runs.iter().map(|f| f.to_bits()))
                    .collect();
                (path.clone(), format!("{} {figures:?}", r.started_unix_ms))
            })
            .collect::<Vec<_>>()
    };
    check_repeated_runs(&identities(&a_paths, &a), &identities(&b_paths, &b))?;
    for (side, results) in [("A", &a), ("B", &b)] {
        if let Some(cut) = results.iter().find(|r| !r.complete) {
            say!(
                "virtgap: warning: an iotune result of host {side} ({}) was interrupted; comparing the phases it finished",
                units::printable(&cut.target)
            );
        }
    }
    for (flag, given) in [
        ("--svg", args.svg.is_some()),
        ("--html", args.html.is_some()),
        ("--csv", args.csv.is_some()),
        ("--markdown", args.markdown),
    ] {
        if given {
            anyhow::bail!("{flag} draws a profile's diff; for iotune results the text or --json says it all: drop {flag}");
        }
    }
    let options = diff::DiffOptions {
        min_effect: args.min_effect,
    };
    let (a, b): (Vec<_>, Vec<_>) = (a.iter().collect(), b.iter().collect());
    let d = crate::analysis::iotune_diff::diff(&a, &b, &options).with_files(
        file_names(a_paths.iter().map(|p| p.as_path())),
        file_names(b_paths.iter().map(|p| p.as_path())),
    );
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", crate::render::iotune_report::diff_json(&d)?)?;
    } else {
        let text = crate::render::iotune_report::diff_text(&d);
        out.write_all(units::printable(&text).as_bytes())?;
    }
    Ok(exit_for(args.fail_on, (d.b_slower(), d.any_significant())))
}

/// What tells one recorded run from every other: when it started, and what it did.
fn run_identity(r: &profile::RunRecord) -> String {
    format!(
        "{} {} {} {}",
        r.started_unix_ms,
        r.read_ios,
        r.write_ios,
        r.measured_s.to_bits()
    )
}

/// Refuses a side on which one recorded run appears twice — a file named twice, or a copy of
/// it: the diff would take the copies for independent replicates and call one run's figures
/// significant with an interval of zero width. The same run on both sides is allowed (it
/// compares a run with itself: nothing differs) and said on stderr.
fn check_repeated_runs(
    a: &[(std::path::PathBuf, String)],
    b: &[(std::path::PathBuf, String)],
) -> anyhow::Result<()> {
    let name = |p: &std::path::Path| units::printable(&p.display().to_string()).into_owned();
    for (host, side) in [("A", a), ("B", b)] {
        let mut seen: std::collections::HashMap<&str, &std::path::Path> =
            std::collections::HashMap::new();
        for (path, identity) in side {
            if let Some(first) = seen.insert(identity, path) {
                let (first, again) = (name(first), name(path));
                if first == again {
                    anyhow::bail!(
                        "host {host}: {first} is named twice; a run counted twice would pass for two independent replicates: name each run once"
                    );
                }
                anyhow::bail!(
                    "host {host}: {first} and {again} hold the same recorded run (copies of one file?); it would pass for two independent replicates: name each run once"
                );
            }
        }
    }
    if let Some((path, _)) = a
        .iter()
        .find(|(_, id)| b.iter().any(|(_, other)| other == id))
    {
        say!(
            "virtgap: warning: host B has the same recorded run as host A ({}): that run is compared with itself",
            name(path)
        );
    }
    Ok(())
}

/// Refuses inputs whose sizes together pass [`MAX_DIFF_INPUT_BYTES`], from their sizes alone:
/// nothing is opened (a FIFO is not waited on here) or parsed.
fn check_input_budget<'a>(paths: impl Iterator<Item = &'a std::path::Path>) -> anyhow::Result<()> {
    let (count, total) = paths
        .filter_map(|p| std::fs::metadata(p).ok())
        .filter(std::fs::Metadata::is_file)
        .fold((0u32, 0u64), |(n, sum), m| {
            (n + 1, sum.saturating_add(m.len()))
        });
    if total > MAX_DIFF_INPUT_BYTES {
        anyhow::bail!(
            "the {count} profiles to compare total {}, over the {} diff reads at once; compare fewer or smaller profiles",
            units::bytes(total),
            units::bytes(MAX_DIFF_INPUT_BYTES)
        );
    }
    // Parsed, they take about three times their size: that must fit what this process may
    // still use (a container's memory cgroup is often far below the host's free memory).
    if let Some(budget) = virtgap_workloads::memory::available(std::path::Path::new("/")) {
        let need = total.saturating_mul(3);
        if need > budget.bytes {
            anyhow::bail!(
                "the {count} profiles to compare total {}, about {} once read, over the {} this process may still use ({}); compare fewer or smaller profiles",
                units::bytes(total),
                units::bytes(need),
                units::bytes(budget.bytes),
                budget.limited_by
            );
        }
    }
    Ok(())
}
