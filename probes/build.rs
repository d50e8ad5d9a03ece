//! Compiles every `../bpf/*.bpf.c` into a libbpf-rs skeleton in OUT_DIR (`<name>.skel.rs`).

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
    }
    Ok(())
}
