//! Writing results safely: output paths are checked before the run starts, and files are written
//! to a temp name in the same directory, synced, and renamed into place, so a reader never sees a
//! partial file and a failed write (disk full) leaves nothing at the final path.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn check_writable_dir(dir: &Path, flag: &str) -> Result<()> {
    let meta = fs::metadata(dir)
        .map_err(|_| anyhow::anyhow!("{flag}: directory {} does not exist", dir.display()))?;
    if !meta.is_dir() {
        bail!("{flag}: {} is not a directory", dir.display());
    }
    // Probe with a real file: permission bits do not tell about read-only mounts.
    let probe = dir.join(format!(".virtgap-write-check-{}", std::process::id()));
    match OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => bail!("{flag}: cannot write in {} ({e})", dir.display()),
    }
}

/// Checks `--output PATH` before anything runs.
pub fn check_output(path: &Path, force: bool) -> Result<()> {
    if path.is_dir() {
        bail!(
            "--output {} is a directory; name a file, e.g. {}/profile.json",
            path.display(),
            path.display()
        );
    }
    if path.exists() && !force {
        bail!(
            "--output {} already exists; pass --force to overwrite it",
            path.display()
        );
    }
    check_writable_dir(&parent_dir(path), "--output")
}

/// Checks `--csv DIR` before anything runs: a directory (created if missing, under an existing
/// parent) whose CSV files may be replaced only with `--force`.
pub fn check_csv_dir(dir: &Path, force: bool) -> Result<()> {
    if dir.exists() {
        if !dir.is_dir() {
            bail!("--csv {} is a file, not a directory", dir.display());
        }
        for name in crate::csv_export::FILES {
            if dir.join(name).exists() && !force {
                bail!(
                    "--csv {}: {name} already exists; pass --force to overwrite it",
                    dir.display()
                );
            }
        }
        check_writable_dir(dir, "--csv")
    } else {
        check_writable_dir(&parent_dir(dir), "--csv")
    }
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .context("output path has no file name")?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| -> io::Result<()> {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        // Make the rename itself durable.
        if let Ok(d) = fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}
