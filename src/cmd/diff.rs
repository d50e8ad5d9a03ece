//! `virtgap diff A B`: loads each host's profiles, refuses different workloads unless forced, and
//! prints the comparison (text, Markdown or JSON), with CSV and SVG files on request.

use std::process::ExitCode;

use crate::analysis::diff;
use crate::cli::DiffArgs;
use crate::model::profile;
use crate::render::diff_render;
use crate::run::output;

pub fn run(args: &DiffArgs) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let load_side = |first: &std::path::PathBuf, more: &[std::path::PathBuf]| {
        std::iter::once(first)
            .chain(more)
            .map(|path| Ok((path.clone(), profile::load(path)?)))
            .collect::<anyhow::Result<Vec<_>>>()
    };
    let a_side = load_side(&args.a, &args.with_a)?;
    let b_side = load_side(&args.b, &args.with_b)?;
    for (path, p) in a_side.iter().chain(&b_side) {
        if !p.complete {
            eprintln!(
                "virtgap: warning: {} is incomplete (its run was interrupted); comparing anyway",
                path.display()
            );
        }
    }
    let (a, b) = (&a_side[0].1, &b_side[0].1);
    // Every profile pooled on a side must be the same workload as that side's first, and the
    // two sides the same as each other.
    let pairs = a_side
        .iter()
        .skip(1)
        .map(|(path, p)| (&args.a, a, path, p))
        .chain(b_side.iter().skip(1).map(|(path, p)| (&args.b, b, path, p)))
        .chain(std::iter::once((&args.a, a, &args.b, b)));
    for (first_path, first, path, p) in pairs {
        let differences = diff::spec_differences(first, p);
        if !differences.is_empty() && !args.force {
            anyhow::bail!(
                "{} and {} ran different workloads ({}); pass --force to compare anyway",
                first_path.display(),
                path.display(),
                differences.join(", ")
            );
        }
    }
    if let Some(path) = &args.csv {
        output::check_output(path, true, "--csv")?;
    }
    if let Some(dir) = &args.svg {
        if dir.exists() && !dir.is_dir() {
            anyhow::bail!("--svg {} is a file, not a directory", dir.display());
        }
        if dir.is_dir() {
            for name in ["waterfall.svg", "stages.svg"] {
                output::check_output(&dir.join(name), true, "--svg")?;
            }
        } else {
            output::check_output(dir, false, "--svg")?;
        }
    }
    let options = diff::DiffOptions {
        min_effect: args.min_effect,
    };
    let a_profiles: Vec<&profile::Profile> = a_side.iter().map(|(_, p)| p).collect();
    let b_profiles: Vec<&profile::Profile> = b_side.iter().map(|(_, p)| p).collect();
    let d = diff::diff_hosts(&a_profiles, &b_profiles, &options);
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &d)?;
        writeln!(out)?;
    } else {
        // Host names, workload names and labels come from other hosts' profiles: shown, never
        // obeyed by the terminal.
        let text = if args.markdown {
            diff_render::markdown(&d)
        } else {
            diff_render::terminal(&d)
        };
        out.write_all(virtgap_workloads::units::printable(&text).as_bytes())?;
    }
    if let Some(path) = &args.csv {
        output::write_atomic(path, diff_render::csv(&d).as_bytes(), true, "--csv")?;
    }
    if let Some(dir) = &args.svg {
        if !dir.exists() {
            std::fs::create_dir(dir)
                .map_err(|e| anyhow::anyhow!("--svg: cannot create {}: {e}", dir.display()))?;
        }
        let charts = [
            ("waterfall.svg", diff_render::waterfall_svg(&d)),
            ("stages.svg", diff_render::stages_svg(a, b, &d)),
        ];
        for (name, svg) in charts {
            output::write_atomic(&dir.join(name), svg.as_bytes(), true, "--svg")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
