//! Compiles every `../bpf/*.bpf.c` into a libbpf-rs skeleton in OUT_DIR (`<name>.skel.rs`), and
//! writes `skeletons.rs`, which `src/bpf.rs` includes: one module per skeleton, with the
//! plain-data impls of the ABI types (`vg_*`, from `bpf/include/virtgap.h`) it generated. A new
//! BPF file is then a new module with nothing to list by hand.

use std::env;
use std::path::PathBuf;

use anyhow::{Context, Result};
use libbpf_cargo::SkeletonBuilder;

fn main() -> Result<()> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let bpf_dir = manifest.join("../bpf");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let arch = env::var("CARGO_CFG_TARGET_ARCH")?;
    let vmlinux = bpf_dir.join("vmlinux").join(&arch);
    anyhow::ensure!(
        vmlinux.join("vmlinux.h").exists(),
        "no vmlinux.h for {arch}: generate bpf/vmlinux/{arch}/vmlinux.h (see bpf/vmlinux/README.md)"
    );
    println!("cargo:rerun-if-changed={}", bpf_dir.display());

    let mut sources: Vec<PathBuf> = std::fs::read_dir(&bpf_dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".bpf.c"))
        .collect();
    sources.sort();
    let mut modules = String::new();
    for src in sources {
        let file = src
            .file_name()
            .and_then(|n| n.to_str())
            .context("source name")?;
        let stem = file.trim_end_matches(".bpf.c");
        println!("cargo:rerun-if-changed={}", src.display());
        SkeletonBuilder::new()
            .source(&src)
            .clang_args([
                "-Wall".into(),
                "-Werror".into(),
                format!("-I{}", bpf_dir.join("include").display()),
                format!("-I{}", vmlinux.display()),
            ])
            .build_and_generate(out_dir.join(format!("{stem}.skel.rs")))
            .with_context(|| format!("building BPF skeleton for {}", src.display()))?;
        let skeleton = std::fs::read_to_string(out_dir.join(format!("{stem}.skel.rs")))?;
        modules.push_str(&skeleton_module(stem, &skeleton));
    }
    std::fs::write(out_dir.join("skeletons.rs"), modules)?;
    Ok(())
}

/// The module of skeleton `stem`: the generated code, and `plain_types!` (and, where it has a
/// histogram, `hist_type!`) for the ABI types it generated.
fn skeleton_module(stem: &str, skeleton: &str) -> String {
    let mut abi: Vec<&str> = skeleton
        .split("pub struct ")
        .skip(1)
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_alphanumeric() && c != '_')
                .next()
        })
        .filter(|name| name.starts_with("vg_"))
        .collect();
    abi.sort_unstable();
    abi.dedup();
    let plain: Vec<String> = abi.iter().map(|t| format!("types::{t}")).collect();
    let hist = if abi.contains(&"vg_hist") {
        "    hist_type!();\n"
    } else {
        ""
    };
    format!(
        "/// The skeleton of `bpf/{stem}.bpf.c`.\npub mod {stem} {{\n    \
         include!(concat!(env!(\"OUT_DIR\"), \"/{stem}.skel.rs\"));\n{hist}    \
         plain_types!({});\n}}\n\n",
        plain.join(", ")
    )
}
