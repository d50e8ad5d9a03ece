//! Writing results safely.
//!
//! Every output path is checked before the run starts ([`Outputs`]): its directory exists and
//! can be written, nothing but a regular file is there, no two outputs are the same file and no
//! output is a file the command reads — compared by canonical path and, for what exists, by
//! device and inode, so a hard link or a second spelling does not slip through — nor a file
//! that backs a loop device (a disk image, mounted or not: the target's, or any other) or is
//! a swap file, whatever the consent.
//!
//! At the end each file is written into an anonymous file in its directory (`O_TMPFILE`),
//! synced, and linked in place: a link never replaces anything, and a run killed mid-write
//! leaves no trace. Where `O_TMPFILE` or linking it is unsupported, a temp file with a random
//! name stands in (a second signal removes it). With consent (`--force`) an existing regular
//! file is replaced, by a rename from a random temp name. Nothing else is ever replaced or
//! deleted: a device node, FIFO, socket, directory or symbolic link at an output path is
//! refused whatever the consent, an input is never written, and a file that appears at the path
//! while the run goes on is kept, this run's output going beside it under a name the error
//! gives. An output that cannot be written at all (a full filesystem) is saved under the temp
//! directory instead ([`Outputs::write_all`]).

use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use virtgap_workloads::units::printable;

/// A path shown in a message: escapes in its name are shown, not obeyed.
fn shown(path: &Path) -> String {
    printable(&path.display().to_string()).into_owned()
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The file name of an output path; None when the path names a directory (`dir/`, `..`).
fn file_name(path: &Path) -> Option<&OsStr> {
    let text = path.as_os_str().as_bytes();
    if text.ends_with(b"/") || text.ends_with(b"/.") || text == b"." {
        return None;
    }
    path.file_name()
}

fn check_writable_dir(dir: &Path, flag: &str) -> Result<()> {
    let meta = fs::metadata(dir)
        .map_err(|_| anyhow::anyhow!("{flag}: directory {} does not exist", shown(dir)))?;
    if !meta.is_dir() {
        bail!("{flag}: {} is not a directory", shown(dir));
    }
    // Probe with a real file (anonymous, or a random name removed at once): permission bits do
    // not tell about read-only mounts.
    tempfile::tempfile_in(dir)
        .map(drop)
        .map_err(|e| anyhow::anyhow!("{flag}: cannot write in {} ({e})", shown(dir)))
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

/// What the file (st_dev, st_ino) serves that replacing it would destroy — a loop device's
/// backing (a disk image, mounted or not), a swap file — in words; None for a plain file.
fn in_service(dev: u64, ino: u64) -> Option<String> {
    virtgap_workloads::safety::SysRoot::default().file_in_service(dev, ino)
}

/// (st_dev, st_ino) of what `path` names now.
fn id_of(path: &Path) -> Option<(u64, u64)> {
    fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// A path the command reads or writes, as compared with the others.
#[derive(Debug, Clone)]
struct Known {
    /// What named it, for messages: "--output", "profile A".
    role: String,
    path: PathBuf,
    /// Its canonical path; for a file not there yet, its directory's and its name.
    canonical: Option<PathBuf>,
    /// (st_dev, st_ino) of what is there, if anything.
    id: Option<(u64, u64)>,
}

impl Known {
    fn same(&self, other: &Known) -> bool {
        (self.canonical.is_some() && self.canonical == other.canonical)
            || (self.id.is_some() && self.id == other.id)
    }
}

/// A command's output paths, checked against each other and against its inputs before
/// anything runs, and written at the end.
#[derive(Debug)]
pub struct Outputs {
    force: bool,
    /// How to give consent to overwrite, for the message: "pass --force to overwrite it".
    consent: &'static str,
    inputs: Vec<Known>,
    outputs: Vec<Known>,
    /// Output directories that did not exist when checked: created when first written into.
    new_dirs: Vec<PathBuf>,
}

impl Outputs {
    /// `force`: existing regular files may be replaced; `consent` says how to give that
    /// consent, e.g. "pass --force to overwrite it".
    pub fn new(force: bool, consent: &'static str) -> Self {
        Self {
            force,
            consent,
            inputs: Vec::new(),
            outputs: Vec::new(),
            new_dirs: Vec::new(),
        }
    }

    /// A file the command reads (`role` names it: "profile A", "the workload file"): no output
    /// may be it, with or without consent. Register inputs before outputs.
    pub fn input(&mut self, role: &str, path: &Path) {
        // Nothing there yet: nothing an output could destroy.
        let Ok(canonical) = fs::canonicalize(path) else {
            return;
        };
        self.inputs.push(Known {
            role: role.to_string(),
            path: path.to_path_buf(),
            canonical: Some(canonical),
            id: id_of(path),
        });
    }

    /// Checks an output file named by `flag` (e.g. "--output"): a new file, or with consent an
    /// existing regular file, in a directory virtgap can write; not an input, not another
    /// output.
    pub fn file(&mut self, flag: &str, path: &Path) -> Result<()> {
        let Some(name) = file_name(path) else {
            bail!(
                "{flag} {} names a directory; name a file in it, e.g. {}",
                shown(path),
                shown(&path.join("profile.json"))
            );
        };
        if let Some(what) = not_a_regular_file(path) {
            bail!(
                "{flag} {} is {what}; virtgap writes only regular files: name a new file",
                shown(path)
            );
        }
        let dir = parent_dir(path);
        check_writable_dir(&dir, flag)?;
        let canonical = fs::canonicalize(&dir).ok().map(|d| d.join(name));
        self.add(flag, path, canonical, id_of(path))
    }

    /// Checks an output directory named by `flag` (e.g. "--csv") into which `names` are
    /// written: an existing directory whose files are checked as [`Outputs::file`] does, or a
    /// new one (created at the end) under an existing parent.
    pub fn dir(&mut self, flag: &str, dir: &Path, names: &[&str]) -> Result<()> {
        match fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => names
                .iter()
                .try_for_each(|name| self.file(flag, &dir.join(name))),
            Ok(_) => bail!("{flag} {} is a file, not a directory", shown(dir)),
            Err(_) => {
                if let Some(what) = not_a_regular_file(dir) {
                    bail!("{flag} {} is {what}; name a directory", shown(dir));
                }
                let Some(base) = dir.file_name() else {
                    bail!("{flag} {} cannot be created; name a directory", shown(dir));
                };
                let parent = parent_dir(dir);
                check_writable_dir(&parent, flag)?;
                let canonical = fs::canonicalize(&parent).ok().map(|p| p.join(base));
                for name in names {
                    let path = dir.join(name);
                    self.add(flag, &path, canonical.as_ref().map(|c| c.join(name)), None)?;
                }
                self.new_dirs.push(dir.to_path_buf());
                Ok(())
            }
        }
    }

    fn add(
        &mut self,
        flag: &str,
        path: &Path,
        canonical: Option<PathBuf>,
        id: Option<(u64, u64)>,
    ) -> Result<()> {
        let me = Known {
            role: flag.to_string(),
            path: path.to_path_buf(),
            canonical,
            id,
        };
        if let Some(input) = self.inputs.iter().find(|k| k.same(&me)) {
            bail!(
                "{flag} {} is {} ({}), which this command reads; name another file",
                shown(path),
                input.role,
                shown(&input.path)
            );
        }
        if let Some(other) = self.outputs.iter().find(|k| k.same(&me)) {
            bail!(
                "{flag} {} is the same file as {} {}; give each output its own path",
                shown(path),
                other.role,
                shown(&other.path)
            );
        }
        if let Some(service) = me.id.and_then(|(dev, ino)| in_service(dev, ino)) {
            bail!(
                "{flag} {} {service}: replacing it would destroy that data, whatever --force says; name another file",
                shown(path)
            );
        }
        if me.id.is_some() && !self.force {
            bail!("{flag} {} already exists; {}", shown(path), self.consent);
        }
        self.outputs.push(me);
        Ok(())
    }

    /// Writes `bytes` to `path`, an output checked by [`Outputs::file`] or [`Outputs::dir`].
    pub fn write(&self, flag: &str, path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
        if let Some(dir) = self
            .new_dirs
            .iter()
            .find(|d| path.parent() == Some(d.as_path()))
        {
            create_dir(dir).map_err(|err| WriteError::Failed {
                flag: flag.to_string(),
                path: path.to_path_buf(),
                err,
            })?;
        }
        write_file(path, flag, self.force, &self.inputs, true, &mut |f| {
            f.write_all(bytes)
        })
    }

    /// Writes each of `files`, saying on stderr what could not be written. Whatever could not,
    /// and `profile` (its file name and contents) unless it was written, then go into a new
    /// directory under the temp dir, whose path is said: a full filesystem does not lose the
    /// run. Returns which of `files` were written where asked.
    pub fn write_all(&self, files: &[Pending<'_>], profile: (&str, &[u8])) -> Vec<bool> {
        self.write_all_or_save_in(files, profile, &std::env::temp_dir())
            .0
    }

    /// [`Outputs::write_all`], saving what was not written under `temp`; also returns where.
    fn write_all_or_save_in(
        &self,
        files: &[Pending<'_>],
        profile: (&str, &[u8]),
        temp: &Path,
    ) -> (Vec<bool>, Option<PathBuf>) {
        // The profile is the buffer `profile` gives, wherever a file writes it.
        let is_profile = |bytes: &[u8]| std::ptr::eq(bytes, profile.1);
        let mut written = Vec::with_capacity(files.len());
        let mut profile_kept = false;
        let mut unsaved: Vec<&Pending<'_>> = Vec::new();
        for file in files {
            let result = self.write(file.flag, &file.path, file.bytes);
            if let Err(e) = &result {
                say!("virtgap: error: {e}");
            }
            match result {
                Ok(()) | Err(WriteError::Beside { .. }) => {
                    profile_kept |= is_profile(file.bytes);
                }
                Err(WriteError::Failed { .. }) => unsaved.push(file),
            }
            written.push(result.is_ok());
        }
        if unsaved.is_empty() {
            return (written, None);
        }
        // The profile holds everything the other files are made from: keep it with them.
        let mut aside: Vec<(String, &[u8])> = Vec::new();
        if !profile_kept && !unsaved.iter().any(|f| is_profile(f.bytes)) {
            aside.push((profile.0.to_string(), profile.1));
        }
        for file in &unsaved {
            let name = file
                .path
                .file_name()
                .map_or("output".into(), |n| n.to_string_lossy().into_owned());
            // Two outputs may share a name in different directories.
            let name = if aside.iter().any(|(n, _)| *n == name) {
                format!("{}-{name}", file.flag.trim_start_matches('-'))
            } else {
                name
            };
            aside.push((name, file.bytes));
        }
        match save_aside(temp, &aside) {
            Ok(dir) => {
                let (profiles, others): (Vec<_>, Vec<_>) =
                    aside.iter().partition(|(_, bytes)| is_profile(bytes));
                let others: Vec<&str> = others.iter().map(|(n, _)| n.as_str()).collect();
                match profiles.first() {
                    Some((name, _)) => {
                        let beside = if others.is_empty() {
                            String::new()
                        } else {
                            format!(" (with {} beside it)", others.join(", "))
                        };
                        say!(
                            "virtgap: this run's profile is saved as {} instead{}",
                            shown(&dir.join(name)),
                            printable(&beside)
                        );
                    }
                    None => say!(
                        "virtgap: what could not be written is saved in {} instead: {}",
                        shown(&dir),
                        printable(&others.join(", "))
                    ),
                }
                (written, Some(dir))
            }
            Err(e) => {
                say!(
                    "virtgap: error: saving this run's unwritten files under {} failed too ({e}); they are lost",
                    shown(temp)
                );
                (written, None)
            }
        }
    }
}

/// One file to write at the end of a run: the flag that named it, its path, its contents.
#[derive(Debug)]
pub struct Pending<'a> {
    pub flag: &'static str,
    pub path: PathBuf,
    pub bytes: &'a [u8],
}

/// Why an output is not at its path.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Something took the path during the run; this run's file went beside it.
    #[error("{flag} {} {why}; not replacing it: this run's file is {}", shown(.path), shown(.beside))]
    Beside {
        flag: String,
        path: PathBuf,
        why: String,
        beside: PathBuf,
    },
    /// Nothing was written (the filesystem is full, the directory went away, ...).
    #[error("{flag}: writing {} failed: {err}", shown(.path))]
    Failed {
        flag: String,
        path: PathBuf,
        err: io::Error,
    },
}

/// The workload file `-w NAME|FILE` reads, when it names one (as `spec::load` decides).
pub fn workload_file(name: &str) -> Option<&Path> {
    let path = Path::new(name);
    let is_path = name.contains('/')
        || name.ends_with(".toml")
        || (virtgap_workloads::spec::preset_text(name).is_none() && path.is_file());
    is_path.then_some(path)
}

/// The TUI's `--save` file (or the name `s` makes up) checked against the files the TUI reads:
/// its workload file (`-w`), `--target` and `--baseline`. An explicit `--save` is consent to
/// replace that file; a made-up name never replaces one.
pub fn tui_save(
    workload: &str,
    target: Option<&Path>,
    baseline: Option<&Path>,
    path: &Path,
    force: bool,
) -> Result<Outputs> {
    let mut outputs = Outputs::new(force, "name it with --save to overwrite it");
    if let Some(file) = workload_file(workload) {
        outputs.input("the workload file", file);
    }
    if let Some(target) = target {
        outputs.input("the --target", target);
    }
    if let Some(baseline) = baseline {
        outputs.input("the --baseline profile", baseline);
    }
    outputs.file("--save", path)?;
    Ok(outputs)
}

/// Saves `files` (name, contents) in a new directory under `temp` and returns it.
fn save_aside(temp: &Path, files: &[(String, &[u8])]) -> io::Result<PathBuf> {
    let dir = tempfile::Builder::new()
        .prefix("virtgap-unsaved-")
        .tempdir_in(temp)?;
    for (name, bytes) in files {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.path().join(name))?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    // A failure above drops `dir`, removing what this call created.
    Ok(dir.keep())
}

/// Creates an output directory that was missing when checked (or is there by now).
fn create_dir(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        other => other,
    }
}

/// The temp file being written under a name, for a second signal to remove before it exits
/// (unlink is async-signal-safe; the path is a leaked C string while it is set). An anonymous
/// file has no name to remove.
static PENDING_TMP: std::sync::atomic::AtomicPtr<libc::c_char> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

fn set_pending(tmp: Option<&Path>) {
    use std::sync::atomic::Ordering;
    let new = tmp
        .and_then(|p| CString::new(p.as_os_str().as_bytes()).ok())
        .map_or(std::ptr::null_mut(), CString::into_raw);
    let old = PENDING_TMP.swap(new, Ordering::SeqCst);
    if !old.is_null() {
        // SAFETY: `old` came from CString::into_raw above and is no longer published.
        drop(unsafe { CString::from_raw(old) });
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

/// A random suffix for temp and beside names: unique across processes whatever their pid (two
/// pid namespaces reuse pids), and retried on a clash anyway.
fn random_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    // RandomState's keys come from the OS's randomness.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(now);
    format!("{:012x}", h.finish() & 0xffff_ffff_ffff)
}

/// A new name in `dir` for `make(suffix)`, tried with fresh random suffixes while taken.
fn with_fresh_name(
    dir: &Path,
    make: impl Fn(&str) -> String,
    mut try_at: impl FnMut(&Path) -> io::Result<()>,
) -> io::Result<PathBuf> {
    let mut last = None;
    for _ in 0..16 {
        let path = dir.join(make(&random_suffix()));
        match try_at(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)))
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}

/// A written, synced file not yet at its path.
enum Staged {
    Anonymous(File),
    Named(Option<tempfile::NamedTempFile>),
}

/// A linkat error that means anonymous files cannot be linked here (no /proc, no capability
/// for AT_EMPTY_PATH, a filesystem without it), so a named temp file must stand in.
fn unlinkable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::EPERM | libc::EOPNOTSUPP | libc::EINVAL | libc::EXDEV)
    )
}

impl Staged {
    /// Gives the file the name `to` unless something has it: never replaces.
    fn link_new(&mut self, to: &Path) -> io::Result<()> {
        match self {
            Staged::Anonymous(file) => link_anonymous(file, to),
            Staged::Named(slot) => {
                let tmp = slot.take().expect("a staged file is placed once");
                match tmp.persist_noclobber(to) {
                    Ok(_) => {
                        set_pending(None);
                        Ok(())
                    }
                    Err(e) => {
                        *slot = Some(e.file);
                        Err(e.error)
                    }
                }
            }
        }
    }

    /// Gives the file the name `to`, replacing the regular file there.
    fn replace(&mut self, to: &Path, dir: &Path, name: &OsStr) -> io::Result<()> {
        match self {
            Staged::Anonymous(file) => {
                // rename is what replaces atomically, and it needs a name to move: a random one,
                // there for as long as the rename takes.
                let tmp = with_fresh_name(
                    dir,
                    |r| format!(".{}.{r}.tmp", name.to_string_lossy()),
                    |p| link_anonymous(file, p),
                )?;
                set_pending(Some(&tmp));
                let renamed = fs::rename(&tmp, to);
                if renamed.is_err() {
                    // This run's own link, made just above.
                    let _ = fs::remove_file(&tmp);
                }
                set_pending(None);
                renamed
            }
            Staged::Named(slot) => {
                let tmp = slot.take().expect("a staged file is placed once");
                match tmp.persist(to) {
                    Ok(_) => {
                        set_pending(None);
                        Ok(())
                    }
                    Err(e) => {
                        *slot = Some(e.file);
                        Err(e.error)
                    }
                }
            }
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Staged::Named(Some(_)) = self {
            // The NamedTempFile removes its own file as it drops.
            set_pending(None);
        }
    }
}

/// Links an O_TMPFILE file at `to`; fails with AlreadyExists when something is there.
fn link_anonymous(file: &File, to: &Path) -> io::Result<()> {
    let to = c_path(to)?;
    let proc_path = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    // SAFETY: both paths are NUL-terminated C strings alive for the call; AT_FDCWD resolves
    // `to` as the working directory does.
    let rc = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc_path.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let via_proc = io::Error::last_os_error();
    if !unlinkable(&via_proc) {
        return Err(via_proc);
    }
    // Without /proc: the descriptor itself (needs CAP_DAC_READ_SEARCH on older kernels).
    // SAFETY: the fd is open for the call, "" and `to` are NUL-terminated C strings.
    let rc = unsafe {
        libc::linkat(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// An anonymous file in `dir`, to be linked in place once written.
fn anonymous_in(dir: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .mode(0o666)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
}

/// Writes what `fill` writes to `path` (named by `flag`), never over an input in `inputs`:
/// staged in an anonymous file when `anonymous` and the filesystem allows, else in a named one.
/// `fill` may be called twice: once more when the anonymous file cannot be linked.
fn write_file(
    path: &Path,
    flag: &str,
    force: bool,
    inputs: &[Known],
    anonymous: bool,
    fill: &mut dyn FnMut(&mut File) -> io::Result<()>,
) -> Result<(), WriteError> {
    let failed = |err: io::Error| WriteError::Failed {
        flag: flag.to_string(),
        path: path.to_path_buf(),
        err,
    };
    let Some(name) = file_name(path) else {
        return Err(failed(io::Error::other("the path names a directory")));
    };
    let dir = parent_dir(path);
    if anonymous {
        match anonymous_in(&dir) {
            Ok(mut file) => {
                fill(&mut file)
                    .and_then(|()| file.sync_all())
                    .map_err(failed)?;
                let mut staged = Staged::Anonymous(file);
                match place(&mut staged, path, &dir, name, force, flag, inputs) {
                    Err(WriteError::Failed { err, .. }) if unlinkable(&err) => {}
                    placed => return placed,
                }
            }
            // Where O_TMPFILE is unsupported (old kernels: EISDIR) the named file below stands
            // in; any other error would be the named file's too.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
                ) => {}
            Err(e) => return Err(failed(e)),
        }
    }
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .suffix(".tmp")
        .rand_bytes(12)
        .permissions(fs::Permissions::from_mode(0o666))
        .tempfile_in(&dir)
        .map_err(failed)?;
    set_pending(Some(tmp.path()));
    let mut staged = Staged::Named(Some(tmp));
    if let Staged::Named(Some(tmp)) = &mut staged {
        fill(tmp.as_file_mut())
            .and_then(|()| tmp.as_file().sync_all())
            .map_err(failed)?;
    }
    place(&mut staged, path, &dir, name, force, flag, inputs)
}

/// Puts the staged file at `path`: linked where nothing is, replacing a regular file only with
/// `force` and never an input; otherwise beside whatever took the path.
fn place(
    staged: &mut Staged,
    path: &Path,
    dir: &Path,
    name: &OsStr,
    force: bool,
    flag: &str,
    inputs: &[Known],
) -> Result<(), WriteError> {
    let failed = |err: io::Error| WriteError::Failed {
        flag: flag.to_string(),
        path: path.to_path_buf(),
        err,
    };
    let input_there = || {
        let id = id_of(path)?;
        inputs.iter().find(|k| k.id == Some(id))
    };
    let taken = if let Some(what) = not_a_regular_file(path) {
        Some(format!("is now {what}"))
    } else if let Some(input) = input_there() {
        Some(format!(
            "is now {} ({}), which this command reads",
            input.role,
            shown(&input.path)
        ))
    } else if let Some(service) = id_of(path).and_then(|(dev, ino)| in_service(dev, ino)) {
        Some(format!("now {service}"))
    } else {
        let placed = if force && fs::symlink_metadata(path).is_ok() {
            staged.replace(path, dir, name)
        } else {
            staged.link_new(path)
        };
        match placed {
            Ok(()) => {
                // Make the link or rename itself durable.
                if let Ok(d) = File::open(dir) {
                    let _ = d.sync_all();
                }
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Some("appeared while this run was going".to_string())
            }
            Err(e) => return Err(failed(e)),
        }
    };
    let why = taken.unwrap_or_default();
    // Keep this run's result beside what took the path, under its own name.
    match with_fresh_name(
        dir,
        |r| format!("{}.{r}", name.to_string_lossy()),
        |p| staged.link_new(p),
    ) {
        Ok(beside) => Err(WriteError::Beside {
            flag: flag.to_string(),
            path: path.to_path_buf(),
            why,
            beside,
        }),
        Err(e) if unlinkable(&e) => Err(failed(e)),
        Err(e) => Err(failed(io::Error::other(format!(
            "it {why}, and keeping this run's file beside it failed too ({e})"
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Tests that stage named files take turns: the pending temp file is one per process.
    fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
        TURN.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn write_with(
        path: &Path,
        force: bool,
        anonymous: bool,
        fill: &mut dyn FnMut(&mut File) -> io::Result<()>,
    ) -> Result<(), WriteError> {
        write_file(path, "--output", force, &[], anonymous, fill)
    }

    fn check_output(path: &Path, force: bool, flag: &str) -> Result<()> {
        Outputs::new(force, "pass --force to overwrite it").file(flag, path)
    }

    #[test]
    fn special_files_are_refused_even_with_force() {
        let _turn = one_at_a_time();
        for (path, what) in [("/dev/null", "device node"), ("/", "directory")] {
            let err = check_output(Path::new(path), true, "--output")
                .unwrap_err()
                .to_string();
            assert!(err.contains(what), "{err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path alive for the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = check_output(&fifo, true, "--save").unwrap_err().to_string();
        assert!(err.starts_with("--save") && err.contains("FIFO"), "{err}");
        for anonymous in [true, false] {
            let err = write_with(&fifo, true, anonymous, &mut |f| f.write_all(b"x"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("is now a FIFO"), "{err}");
        }
        assert!(
            fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(),
            "the FIFO is still there"
        );
    }

    #[test]
    fn a_file_that_appears_meanwhile_is_kept_and_the_output_goes_beside_it() {
        let _turn = one_at_a_time();
        for anonymous in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("p.json");
            check_output(&path, false, "--output").unwrap();
            fs::write(&path, "theirs").unwrap();
            let err =
                write_with(&path, false, anonymous, &mut |f| f.write_all(b"ours")).unwrap_err();
            let WriteError::Beside { beside, .. } = &err else {
                panic!("{err}");
            };
            assert!(
                err.to_string()
                    .contains("appeared while this run was going"),
                "{err}"
            );
            assert_eq!(fs::read_to_string(&path).unwrap(), "theirs");
            assert_eq!(fs::read_to_string(beside).unwrap(), "ours");
            // With --force a regular file is replaced.
            write_with(&path, true, anonymous, &mut |f| f.write_all(b"forced")).unwrap();
            assert_eq!(fs::read_to_string(&path).unwrap(), "forced");
            assert_eq!(names(dir.path()).len(), 2, "{:?}", names(dir.path()));
        }
    }

    /// While the file is written it has no name: a run killed then (SIGKILL) leaves nothing.
    #[test]
    fn nothing_is_in_the_directory_while_the_file_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.json");
        write_with(&path, false, true, &mut |f| {
            f.write_all(b"half")?;
            assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
            f.write_all(b" and the rest")
        })
        .unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "half and the rest");
        assert_eq!(names(dir.path()), ["p.json"]);
        // Replacing with --force: still nothing named while writing.
        write_with(&path, true, true, &mut |f| {
            assert_eq!(names(dir.path()), ["p.json"]);
            f.write_all(b"new")
        })
        .unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(names(dir.path()), ["p.json"]);
    }

    /// Where O_TMPFILE cannot be used the temp file has a random name, which a second signal
    /// removes, and which goes away when the write fails.
    #[test]
    fn the_named_fallback_has_a_random_name_a_second_signal_removes() {
        let _turn = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.json");
        let mut seen = Vec::new();
        write_with(&path, false, false, &mut |f| {
            seen = names(dir.path());
            f.write_all(b"named")
        })
        .unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "named");
        assert_eq!(seen.len(), 1, "{seen:?}");
        let tmp = &seen[0];
        assert!(
            tmp.starts_with(".p.json.") && tmp.ends_with(".tmp"),
            "{tmp}"
        );
        let random = &tmp[".p.json.".len()..tmp.len() - ".tmp".len()];
        assert!(
            random.len() == 12 && random != std::process::id().to_string(),
            "{tmp}"
        );
        // The signal handler's removal.
        let other = dir.path().join("q.json");
        let err = write_with(&other, false, false, &mut |f| {
            remove_pending_tmp();
            f.write_all(b"dropped")
        })
        .unwrap_err();
        assert!(matches!(err, WriteError::Failed { .. }), "{err}");
        // A failed write leaves nothing.
        let err = write_with(&other, false, false, &mut |_| {
            Err(io::Error::from_raw_os_error(libc::ENOSPC))
        })
        .unwrap_err();
        assert!(err.to_string().contains("No space left"), "{err}");
        assert_eq!(names(dir.path()), ["p.json"]);
    }

    /// Two writers of one path at once in one process (so with one pid, as two pid namespaces
    /// can have): neither touches the other's temp file, both results are kept.
    #[test]
    fn two_writers_with_one_pid_both_keep_their_file() {
        let _turn = one_at_a_time();
        for anonymous in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("shared.json");
            // The file the old naming would have used, and a stale one: both untouched.
            let pid_name = dir
                .path()
                .join(format!(".shared.json.tmp-{}", std::process::id()));
            fs::write(&pid_name, "stale").unwrap();
            let err = write_with(&path, false, anonymous, &mut |f| {
                f.write_all(b"first")?;
                // The second writer runs whole while the first is mid-write.
                write_with(&path, false, anonymous, &mut |g| g.write_all(b"second")).unwrap();
                f.write_all(b" writer")
            })
            .unwrap_err();
            let WriteError::Beside { beside, .. } = err else {
                panic!("{err}");
            };
            assert_eq!(fs::read_to_string(&path).unwrap(), "second");
            assert_eq!(fs::read_to_string(&beside).unwrap(), "first writer");
            assert_eq!(fs::read_to_string(&pid_name).unwrap(), "stale");
            assert_eq!(names(dir.path()).len(), 3, "{:?}", names(dir.path()));
        }
    }

    #[test]
    fn an_output_is_never_an_input_nor_another_output() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("a.json");
        fs::write(&input, "input").unwrap();
        let link = dir.path().join("hard.json");
        fs::hard_link(&input, &link).unwrap();
        let mut outputs = Outputs::new(true, "pass --overwrite to replace it");
        outputs.input("profile A", &input);
        for path in [
            input.clone(),
            link.clone(),
            dir.path().join(".").join("a.json"),
            dir.path().join("sub/../a.json"),
        ] {
            if path.to_string_lossy().contains("sub") {
                fs::create_dir_all(dir.path().join("sub")).unwrap();
            }
            let err = outputs.file("--csv", &path).unwrap_err().to_string();
            assert!(err.contains("which this command reads"), "{err}");
        }
        // Two outputs, one file; a file output that is a directory output's file.
        let out = dir.path().join("out");
        fs::create_dir(&out).unwrap();
        outputs.file("--output", &out.join("summary.csv")).unwrap();
        let err = outputs
            .dir("--csv", &out, &["intervals.csv", "summary.csv"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--csv") && err.contains("same file as --output"),
            "{err}"
        );
        // The same for a directory created at the end.
        let mut outputs = Outputs::new(false, "pass --force to overwrite it");
        let new = dir.path().join("new");
        outputs.dir("--csv", &new, &["summary.csv"]).unwrap();
        let err = outputs
            .file("--act-log", &new.join("summary.csv"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("directory"), "{err}");
        // An input replaced by --force at write time is still refused.
        let mut outputs = Outputs::new(true, "");
        let target = dir.path().join("t.json");
        outputs.file("--output", &target).unwrap();
        outputs.input("profile A", &input);
        fs::hard_link(&input, &target).unwrap();
        let err = outputs
            .write("--output", &target, b"x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("which this command reads"), "{err}");
        assert_eq!(fs::read_to_string(&input).unwrap(), "input");
    }

    /// What cannot be written where asked is saved under the temp dir, with the profile.
    #[test]
    fn unwritten_files_and_the_profile_are_saved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let temp = dir.path().join("tmp");
        fs::create_dir(&temp).unwrap();
        let gone = dir.path().join("gone");
        fs::create_dir(&gone).unwrap();
        let mut outputs = Outputs::new(false, "");
        let (p, csv) = (dir.path().join("p.json"), gone.join("summary.csv"));
        outputs.file("--output", &p).unwrap();
        outputs.file("--csv", &csv).unwrap();
        // The CSV directory goes away during the run.
        fs::remove_dir(&gone).unwrap();
        let profile = b"{profile}".to_vec();
        let files = [
            Pending {
                flag: "--output",
                path: p.clone(),
                bytes: &profile,
            },
            Pending {
                flag: "--csv",
                path: csv.clone(),
                bytes: b"a,b",
            },
        ];
        let (written, aside) = outputs.write_all_or_save_in(&files, ("p.json", &profile), &temp);
        assert_eq!(written, [true, false]);
        let aside = aside.expect("saved aside");
        assert_eq!(names(&aside), ["summary.csv"], "the profile is at -o");
        assert_eq!(fs::read(&p).unwrap(), profile);
        // Without -o the profile goes aside with what failed.
        let (written, aside) = Outputs::new(false, "").write_all_or_save_in(
            &files[1..],
            ("profile.json", &profile),
            &temp,
        );
        assert_eq!(written, [false]);
        let aside = aside.unwrap();
        assert_eq!(names(&aside), ["profile.json", "summary.csv"]);
        assert_eq!(fs::read(aside.join("profile.json")).unwrap(), profile);
    }

    #[test]
    fn consent_is_asked_for_in_the_commands_words_and_a_new_dir_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("d.csv");
        fs::write(&file, "keep").unwrap();
        let err = Outputs::new(false, "pass --overwrite to replace it")
            .file("--csv", &file)
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with("already exists; pass --overwrite to replace it"),
            "{err}"
        );
        let err = Outputs::new(true, "")
            .file("--output", &dir.path().join("newdir/"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("names a directory"), "{err}");
        let mut outputs = Outputs::new(false, "");
        let svg = dir.path().join("svg");
        outputs.dir("--svg", &svg, &["a.svg"]).unwrap();
        outputs
            .write("--svg", &svg.join("a.svg"), b"<svg/>")
            .unwrap();
        assert_eq!(fs::read_to_string(svg.join("a.svg")).unwrap(), "<svg/>");
    }
}
