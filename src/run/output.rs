//! Writing results safely: output paths are checked before the run starts, and files are written
//! to a temp name in the same directory, synced, and renamed into place, so a reader never sees a
//! partial file and a failed write (disk full) leaves nothing at the final path. Only regular
//! files are ever written or replaced: a device node, FIFO, socket, directory or symbolic link at
//! an output path is refused whatever `--force` says, and without `--force` a file that appears
//! at the path while the run goes on is not replaced either.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileTypeExt;
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

/// What is at `path` when it is not a regular file, in words; None for a regular file or
/// nothing at all.
fn not_a_regular_file(path: &Path) -> Option<&'static str> {
    let meta = fs::symlink_metadata(path).ok()?;
    let t = meta.file_type();
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_symlink() {
        Some("a symbolic link")
    } else if t.is_block_device() || t.is_char_device() {
        Some("a device node")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("not a regular file")
    }
}

/// Checks an output file named by `flag` (e.g. "--output") before anything runs: a new file,
/// or with `force` an existing regular file, in a directory virtgap can write.
pub fn check_output(path: &Path, force: bool, flag: &str) -> Result<()> {
    if let Some(what) = not_a_regular_file(path) {
        bail!(
            "{flag} {} is {what}; virtgap writes only regular files: name a new file",
            path.display()
        );
    }
    if path.exists() && !force {
        bail!(
            "{flag} {} already exists; pass --force to overwrite it",
            path.display()
        );
    }
    check_writable_dir(&parent_dir(path), flag)
}

/// Checks `--csv DIR` before anything runs: a directory (created if missing, under an existing
/// parent) whose CSV files may be replaced only with `--force`.
pub fn check_csv_dir(dir: &Path, force: bool) -> Result<()> {
    if dir.exists() {
        if !dir.is_dir() {
            bail!("--csv {} is a file, not a directory", dir.display());
        }
        for name in crate::render::csv_export::FILES {
            check_output(&dir.join(name), force, "--csv")?;
        }
        check_writable_dir(dir, "--csv")
    } else {
        check_writable_dir(&parent_dir(dir), "--csv")
    }
}

/// The temp file being written, for a second signal to remove before it exits (unlink is
/// async-signal-safe; the path is a leaked C string while it is set).
static PENDING_TMP: std::sync::atomic::AtomicPtr<libc::c_char> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

fn set_pending(tmp: Option<&Path>) {
    use std::os::unix::ffi::OsStrExt;
    use std::sync::atomic::Ordering;
    let new = tmp
        .and_then(|p| std::ffi::CString::new(p.as_os_str().as_bytes()).ok())
        .map_or(std::ptr::null_mut(), std::ffi::CString::into_raw);
    let old = PENDING_TMP.swap(new, Ordering::SeqCst);
    if !old.is_null() {
        // SAFETY: `old` came from CString::into_raw above and is no longer published.
        drop(unsafe { std::ffi::CString::from_raw(old) });
    }
}

/// Removes the temp file being written, if any. Async-signal-safe: for a signal handler that
/// is about to _exit.
pub fn remove_pending_tmp() {
    let p = PENDING_TMP.load(std::sync::atomic::Ordering::SeqCst);
    if !p.is_null() {
        // SAFETY: p is a NUL-terminated path kept alive until set_pending replaces it.
        unsafe { libc::unlink(p) };
    }
}

/// Renames `from` to `to` unless something exists at `to` (renameat2 RENAME_NOREPLACE).
fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let (from, to) = (
        std::ffi::CString::new(from.as_os_str().as_bytes())?,
        std::ffi::CString::new(to.as_os_str().as_bytes())?,
    );
    // SAFETY: both paths are NUL-terminated C strings alive for the call; AT_FDCWD makes them
    // relative to the working directory, as fs::rename would.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Writes `bytes` to `path` (the file named by `flag`) atomically. With `force` an existing
/// regular file is replaced; without it, a file that appeared at `path` since the run started is
/// kept and this run's output goes beside it, under a name the error gives.
pub fn write_atomic(path: &Path, bytes: &[u8], force: bool, flag: &str) -> Result<()> {
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .context("output path has no file name")?
        .to_string_lossy()
        .into_owned();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    set_pending(Some(&tmp));
    let result = place(path, &tmp, &dir, &name, bytes, force, flag);
    set_pending(None);
    result
}

fn place(
    path: &Path,
    tmp: &Path,
    dir: &Path,
    name: &str,
    bytes: &[u8],
    force: bool,
    flag: &str,
) -> Result<()> {
    let written = (|| -> io::Result<()> {
        let mut f = OpenOptions::new().write(true).create_new(true).open(tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(tmp);
        return Err(e).with_context(|| format!("{flag}: writing {}", path.display()));
    }
    let placed = if let Some(what) = not_a_regular_file(path) {
        // Something took the path during the run: never replace it.
        Err(io::Error::other(format!(
            "{} is now {what}",
            path.display()
        )))
    } else if force {
        fs::rename(tmp, path)
    } else {
        rename_no_replace(tmp, path)
    };
    match placed {
        Ok(()) => {
            // Make the rename itself durable.
            if let Ok(d) = fs::File::open(dir) {
                let _ = d.sync_all();
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists || e.kind() == io::ErrorKind::Other => {
            // Keep this run's result beside the file that appeared, under its own name.
            let aside = dir.join(format!("{name}.{}", std::process::id()));
            match rename_no_replace(tmp, &aside) {
                Ok(()) => bail!(
                    "{flag} {} appeared while this run was going ({e}); not replacing it: this run's file is {}",
                    path.display(),
                    aside.display()
                ),
                Err(e2) => {
                    let _ = fs::remove_file(tmp);
                    bail!("{flag} {}: {e}; keeping this run's file failed too ({e2})", path.display())
                }
            }
        }
        Err(e) => {
            let _ = fs::remove_file(tmp);
            Err(e).with_context(|| format!("{flag}: writing {}", path.display()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_are_refused_even_with_force() {
        for (path, what) in [("/dev/null", "device node"), ("/", "directory")] {
            let err = check_output(Path::new(path), true, "--output")
                .unwrap_err()
                .to_string();
            assert!(err.contains(what), "{err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path alive for the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = check_output(&fifo, true, "--save").unwrap_err().to_string();
        assert!(err.starts_with("--save") && err.contains("FIFO"), "{err}");
        let err = write_atomic(&fifo, b"x", true, "--save")
            .unwrap_err()
            .to_string();
        assert!(err.contains("FIFO"), "{err}");
        assert!(
            fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(),
            "the FIFO is still there"
        );
    }

    #[test]
    fn a_file_that_appears_meanwhile_is_kept_and_the_output_goes_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.json");
        check_output(&path, false, "--output").unwrap();
        fs::write(&path, "theirs").unwrap();
        let err = write_atomic(&path, b"ours", false, "--output")
            .unwrap_err()
            .to_string();
        assert!(err.contains("appeared while this run was going"), "{err}");
        assert_eq!(fs::read_to_string(&path).unwrap(), "theirs");
        let aside = dir.path().join(format!("p.json.{}", std::process::id()));
        assert_eq!(fs::read_to_string(aside).unwrap(), "ours");
        // With --force a regular file is replaced.
        write_atomic(&path, b"forced", true, "--output").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "forced");
    }
}
