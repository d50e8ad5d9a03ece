//! `virtgap diff A B`: loads two profiles, refuses different workloads unless forced, and
//! prints the comparison (text, Markdown or JSON), with CSV and SVG files on request.

use std::process::ExitCode;

use crate::analysis::diff;
use crate::cli::DiffArgs;
use crate::model::profile;
use crate::render::diff_render;
use crate::run::output;

pub fn run(args: &DiffArgs) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let a = profile::load(&args.a)?;
    let b = profile::load(&args.b)?;
    for (p, path) in [(&a, &args.a), (&b, &args.b)] {
        if !p.complete {
            eprintln!(
                "virtgap: warning: {} is incomplete (its run was interrupted); comparing anyway",
                path.display()
            );
        }
    }
    let differences = diff::spec_differences(&a, &b);
    if !differences.is_empty() && !args.force {
        anyhow::bail!(
            "the profiles ran different workloads ({}); pass --force to compare anyway",
            differences.join(", ")
        );
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
    let d = diff::diff(&a, &b);
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
            ("stages.svg", diff_render::stages_svg(&a, &b, &d)),
        ];
        for (name, svg) in charts {
            output::write_atomic(&dir.join(name), svg.as_bytes(), true, "--svg")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
