//! What the workload reads and writes: a temp file (the default), an existing file, or a block
//! device. Temp files have no name (O_TMPFILE, or a random name unlinked at once), so no exit
//! path — error, Ctrl-C, SIGTERM, even SIGKILL — can leave one behind. An existing target is
//! opened once and every check is made on what was opened (see [`open_existing_with`]). Writes
//! to anything the user already had need `--destroy-data` naming it; what a write reaches is
//! checked by [`crate::safety`]; one virtgap run at a time writes a target.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::engine::AlignedBuffer;
use crate::pattern;
use crate::safety::{SafetyError, SysRoot};
use crate::units;

/// Free space kept beyond the temp file so the filesystem is not driven full.
const SPACE_MARGIN: u64 = 64 << 20;
/// Chunk used to fill a temp file.
const FILL_CHUNK: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("--dir {0} does not exist")]
    DirMissing(String),
    #[error("--dir {0} is not a directory")]
    DirNotDir(String),
    #[error("--dir {dir} is not writable ({err}); pick another --dir")]
    DirNotWritable { dir: String, err: io::Error },
    #[error("--dir {dir} has {free} free; a {size} temp file needs {need}; pick another --dir or a smaller --size")]
    NoSpace {
        dir: String,
        free: String,
        size: String,
        need: String,
    },
    #[error("the filesystem of {dir} does not support O_DIRECT; pick another --dir, or pass --buffered (page-cache I/O, e.g. with --engine psync)")]
    NoDirectIo { dir: String },
    #[error("--target {0} does not exist")]
    Missing(String),
    #[error("--target {0} is a directory; to use a temp file in it pass --dir {0}")]
    IsDirectory(String),
    #[error("--target {0} is neither a regular file nor a block device")]
    NotFileOrDevice(String),
    #[error("cannot open {path}: {err}")]
    Open { path: String, err: io::Error },
    #[error("refusing to write to {0}: it is an existing file whose contents would be destroyed; pass --destroy-data={0} to allow it")]
    FileNeedsConsent(String),
    #[error("--destroy-data={given} does not match --target {path}")]
    FileConsentMismatch { given: String, path: String },
    #[error(transparent)]
    Unsafe(#[from] SafetyError),
    #[error("--target {path} is {have}, smaller than --size {want}")]
    TooSmall {
        path: String,
        have: String,
        want: String,
    },
    #[error("--bs {bs} B is not a multiple of {what}'s direct-I/O alignment ({align} B)")]
    Misaligned { bs: u64, what: String, align: u32 },
    #[error("/dev/{0} is busy (opened exclusively by something else); refusing to write to it")]
    Busy(String),
    #[error("cannot prepare the temp file: {0}")]
    Fill(io::Error),
    #[error("the filesystem ran out of space while preparing the temp file; pick another --dir or a smaller --size")]
    FillNoSpace,
    #[error("interrupted")]
    Interrupted,
    #[error("--target {0} changed while it was being opened (it is now a symbolic link); refusing it: check what else writes in its directory")]
    Changed(String),
    #[error("--target /dev/{0} is read-only (its ro flag is set, as by `losetup -r` or `blockdev --setro`), so nothing can write to it; only read it (drop --destroy-data), or make it writable first")]
    ReadOnlyDevice(String),
    #[error("--target {path} is in use by another virtgap run that {other} it; wait for that run to end")]
    InUse { path: String, other: &'static str },
    #[error("--dir {dir} is {kind}, which keeps files in memory: a {size} temp file does not fit the {free} this process may still use ({limit}); pick a disk-backed --dir or a smaller --size")]
    NoMemory {
        dir: String,
        kind: &'static str,
        size: String,
        free: String,
        limit: String,
    },
}

/// Which target the user asked for.
#[derive(Clone, Debug)]
pub enum TargetChoice {
    /// A temp file in `dir`, or in the current directory (falling back to $TMPDIR).
    TempFile { dir: Option<PathBuf> },
    /// An existing file or block device.
    Path(PathBuf),
}

/// How the target will be used.
#[derive(Clone, Debug)]
pub struct TargetRequest {
    pub choice: TargetChoice,
    /// Bytes the workload spans; for existing targets only honoured when `size_explicit`.
    pub size: u64,
    pub size_explicit: bool,
    pub bs: u64,
    pub write: bool,
    pub direct: bool,
    pub destroy_data: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetKind {
    TempFile,
    File,
    BlockDevice { name: String },
}

/// An open target.
#[derive(Debug)]
pub struct Target {
    pub file: Arc<File>,
    pub kind: TargetKind,
    /// Where it lives (for a temp file, the path it had before it was unlinked).
    pub path: PathBuf,
    /// Bytes the workload spans.
    pub size: u64,
    /// Direct-I/O offset alignment.
    pub align: u32,
    /// A warning worth printing, e.g. a sparse file.
    pub warning: Option<String>,
}

impl Target {
    /// "temp file 1 GiB in /work (unlinked)", "/dev/vda (read-only)", ...
    pub fn describe(&self) -> String {
        match &self.kind {
            TargetKind::TempFile => format!(
                "temp file {} in {}",
                units::bytes(self.size),
                self.path.parent().unwrap_or(Path::new(".")).display()
            ),
            TargetKind::File => format!("{} ({})", self.path.display(), units::bytes(self.size)),
            TargetKind::BlockDevice { name } => {
                format!("/dev/{name} ({}, block device)", units::bytes(self.size))
            }
        }
    }

    /// Whether the workload needs the target written before it measures anything.
    pub fn needs_fill(&self) -> bool {
        self.kind == TargetKind::TempFile
    }
}

/// Opens (or creates) the target, running every safety check first.
pub fn open(req: &TargetRequest, sys: &SysRoot) -> Result<Target, TargetError> {
    match &req.choice {
        TargetChoice::TempFile { dir } => open_temp(req, dir.as_deref()),
        TargetChoice::Path(path) => open_existing(req, path, sys),
    }
}

fn open_temp(req: &TargetRequest, dir: Option<&Path>) -> Result<Target, TargetError> {
    let dir = match dir {
        Some(d) => {
            check_dir(d)?;
            d.to_path_buf()
        }
        None => {
            // The current directory's filesystem first; if it cannot take the file, $TMPDIR.
            let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
            match check_dir(&cwd).and_then(|_| check_space(&cwd, req.size)) {
                Ok(()) => cwd,
                Err(_) => std::env::temp_dir(),
            }
        }
    };
    check_space(&dir, req.size)?;
    let file = create_anonymous(&dir, req.direct)?;
    check_memory_backed(&file, &dir, req.size)?;
    let align = dio_alignment(&file).unwrap_or(512);
    check_bs(req.bs, align, &dir.display().to_string())?;
    preallocate(&file, req.size)?;
    Ok(Target {
        file: Arc::new(file),
        kind: TargetKind::TempFile,
        // The file never has a name; this one says where it lives (and names it for fio).
        path: dir.join(format!(".virtgap-{}.tmp", std::process::id())),
        size: req.size,
        align,
        warning: None,
    })
}

/// A new file in `dir` that no one else can open or remove: an O_TMPFILE file with no name at
/// all where the filesystem supports it (so no exit path, SIGKILL included, leaves one behind),
/// else a fresh random name unlinked at once.
fn create_anonymous(dir: &Path, direct: bool) -> Result<File, TargetError> {
    let tmpfile = |direct: bool| {
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).mode(0o600);
        opts.custom_flags(libc::O_TMPFILE | if direct { libc::O_DIRECT } else { 0 });
        opts.open(dir)
    };
    let unsupported = |e: &io::Error| {
        matches!(
            e.raw_os_error(),
            Some(libc::EOPNOTSUPP) | Some(libc::EISDIR)
        )
    };
    match tmpfile(direct) {
        Ok(f) => return Ok(f),
        Err(e) if unsupported(&e) => {}
        // O_DIRECT refused: tell it apart from O_TMPFILE being refused.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) && direct => {
            if tmpfile(false).is_ok() {
                return Err(TargetError::NoDirectIo {
                    dir: dir.display().to_string(),
                });
            }
        }
        Err(e) => return Err(open_error(dir, &dir.display().to_string(), e, direct)),
    }
    let path = dir.join(format!(
        ".virtgap-{}-{:016x}.tmp",
        std::process::id(),
        rand::random::<u64>()
    ));
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).create_new(true).mode(0o600);
    if direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    let file = opts
        .open(&path)
        .map_err(|e| open_error(dir, &path.display().to_string(), e, direct));
    // The name was new and random, so what is there is ours (or, when the open failed after
    // creating it, an empty file of ours): remove it either way.
    let _ = std::fs::remove_file(&path);
    file
}

fn open_error(dir: &Path, shown: &str, e: io::Error, direct: bool) -> TargetError {
    match e.raw_os_error() {
        Some(libc::EINVAL) if direct => TargetError::NoDirectIo {
            dir: dir.display().to_string(),
        },
        Some(libc::EACCES) | Some(libc::EROFS) | Some(libc::EPERM) => TargetError::DirNotWritable {
            dir: dir.display().to_string(),
            err: e,
        },
        _ => TargetError::Open {
            path: shown.to_string(),
            err: e,
        },
    }
}

/// A temp file on tmpfs or ramfs is memory: it must fit what this process may still use
/// (ramfs has no size limit at all, so the free-space check cannot stop it).
fn check_memory_backed(file: &File, dir: &Path, size: u64) -> Result<(), TargetError> {
    let Ok(fs) = rustix::fs::fstatfs(file) else {
        return Ok(());
    };
    let kind = match fs.f_type as u32 {
        linux_raw_sys::general::TMPFS_MAGIC => "tmpfs",
        linux_raw_sys::general::RAMFS_MAGIC => "ramfs",
        _ => return Ok(()),
    };
    let Some(budget) = crate::memory::available(Path::new("/")) else {
        return Ok(());
    };
    let need = size.saturating_add(SPACE_MARGIN);
    if need > budget.bytes {
        return Err(TargetError::NoMemory {
            dir: dir.display().to_string(),
            kind,
            size: units::bytes(size),
            free: units::bytes(budget.bytes),
            limit: budget.limited_by.to_string(),
        });
    }
    Ok(())
}

fn check_dir(dir: &Path) -> Result<(), TargetError> {
    let shown = dir.display().to_string();
    let meta = std::fs::metadata(dir).map_err(|_| TargetError::DirMissing(shown.clone()))?;
    if !meta.is_dir() {
        return Err(TargetError::DirNotDir(shown));
    }
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| TargetError::DirMissing(shown.clone()))?;
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        return Err(TargetError::DirNotWritable {
            dir: shown,
            err: io::Error::last_os_error(),
        });
    }
    // access() ignores read-only mounts for root; statvfs tells.
    if let Ok(st) = statvfs(dir) {
        if st.f_flag & libc::ST_RDONLY != 0 {
            return Err(TargetError::DirNotWritable {
                dir: shown,
                err: io::Error::from_raw_os_error(libc::EROFS),
            });
        }
    }
    Ok(())
}

fn statvfs(dir: &Path) -> io::Result<libc::statvfs> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: c is a valid path and st points to writable memory of the right type.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it initialised st.
    Ok(unsafe { st.assume_init() })
}

fn check_space(dir: &Path, size: u64) -> Result<(), TargetError> {
    let st = statvfs(dir).map_err(|_| TargetError::DirMissing(dir.display().to_string()))?;
    if st.f_blocks == 0 {
        // The filesystem reports no capacity (ramfs and the like): nothing to check against.
        return Ok(());
    }
    let free = st.f_bavail as u64 * st.f_frsize as u64;
    let need = size.saturating_add(SPACE_MARGIN);
    if free < need {
        return Err(TargetError::NoSpace {
            dir: dir.display().to_string(),
            free: units::bytes(free),
            size: units::bytes(size),
            need: units::bytes(need),
        });
    }
    Ok(())
}

fn preallocate(file: &File, size: u64) -> Result<(), TargetError> {
    // SAFETY: plain syscall on an open descriptor.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOSPC) => Err(TargetError::FillNoSpace),
        // No fallocate on this filesystem: the fill writes every byte anyway.
        Some(libc::EOPNOTSUPP) => file.set_len(size).map_err(TargetError::Fill),
        _ => Err(TargetError::Fill(e)),
    }
}

/// Direct-I/O offset alignment from statx (Linux 6.1+), if the filesystem reports one.
fn dio_alignment(file: &File) -> Option<u32> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    let empty = c"";
    // SAFETY: valid fd, empty path with AT_EMPTY_PATH, and stx points to writable memory.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            stx.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: statx succeeded and the struct was zero-initialised before.
    let stx = unsafe { stx.assume_init() };
    (stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_offset_align > 0)
        .then_some(stx.stx_dio_offset_align)
}

fn check_bs(bs: u64, align: u32, what: &str) -> Result<(), TargetError> {
    if !bs.is_multiple_of(u64::from(align)) {
        return Err(TargetError::Misaligned {
            bs,
            what: what.to_string(),
            align,
        });
    }
    Ok(())
}

/// Steps of opening an existing target, where tests swap what the path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenStep {
    /// The path was looked at (for symbolic links the user named) but nothing is open yet.
    Looked,
    /// The path is open (O_PATH) and every check will be made on what was opened.
    Resolved,
    /// The checks passed; the object is about to be opened for I/O.
    Checked,
}

fn open_existing(req: &TargetRequest, path: &Path, sys: &SysRoot) -> Result<Target, TargetError> {
    open_existing_with(req, path, sys, &mut |_| {})
}

/// Opens `path` once and checks only what was opened: the path is resolved to a descriptor
/// (not following a symbolic link the path did not hold when the user named it), every check
/// is made on that descriptor, and the I/O descriptor is opened from it, never from the path
/// again. Whoever controls the target's directory can swap the path at any moment; what they
/// swap in is either refused or never touched.
pub fn open_existing_with(
    req: &TargetRequest,
    path: &Path,
    sys: &SysRoot,
    step: &mut dyn FnMut(OpenStep),
) -> Result<Target, TargetError> {
    let shown = path.display().to_string();
    let follow = names_a_link(path);
    step(OpenStep::Looked);
    let resolved = resolve(path, follow).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => TargetError::Missing(shown.clone()),
        Some(libc::ELOOP) => TargetError::Changed(shown.clone()),
        _ => TargetError::Open {
            path: shown.clone(),
            err: e,
        },
    })?;
    let st = rustix::fs::fstat(&resolved).map_err(|e| TargetError::Open {
        path: shown.clone(),
        err: e.into(),
    })?;
    step(OpenStep::Resolved);
    let file_type = rustix::fs::FileType::from_raw_mode(st.st_mode);
    match file_type {
        rustix::fs::FileType::Directory => Err(TargetError::IsDirectory(shown)),
        // Only when the path became a link after it was looked at.
        rustix::fs::FileType::Symlink => Err(TargetError::Changed(shown)),
        rustix::fs::FileType::BlockDevice => {
            open_device(req, path, &resolved, st.st_rdev, sys, step)
        }
        rustix::fs::FileType::RegularFile => open_file(req, path, &resolved, &st, sys, step),
        _ => Err(TargetError::NotFileOrDevice(shown)),
    }
}

fn open_device(
    req: &TargetRequest,
    path: &Path,
    resolved: &OwnedFd,
    rdev: u64,
    sys: &SysRoot,
    step: &mut dyn FnMut(OpenStep),
) -> Result<Target, TargetError> {
    let shown = path.display().to_string();
    let dev = sys
        .block_device(libc::major(rdev), libc::minor(rdev))
        .map_err(|reason| SafetyError::UnknownDevice {
            path: shown.clone(),
            reason,
        })?;
    let mut flags = if req.direct { libc::O_DIRECT } else { 0 };
    if req.write {
        // Claimed exclusively first (the kernel refuses O_EXCL on a device something else has
        // claimed, a mounted filesystem included), so nothing can mount it after the checks.
        flags |= libc::O_EXCL;
    }
    step(OpenStep::Checked);
    // A device this process wrote moments ago can still be claimed by it: a closed io_uring's
    // files are released by the kernel in the background. So a busy device is tried again for
    // up to 2 s before it is called busy (`record --runs N` and `iotune` reopen their target).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let mut opened = reopen(resolved, req.write, flags);
    while matches!(&opened, Err(e) if e.raw_os_error() == Some(libc::EBUSY))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
        opened = reopen(resolved, req.write, flags);
    }
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            // Say why when the reason is one the checks know (a mount, a holder).
            sys.check_device_in_use(&dev)?;
            return Err(TargetError::Busy(dev.name.clone()));
        }
        Err(e) => {
            // A kernel that forbids writes to mounted devices (BLK_DEV_WRITE_MOUNTED off)
            // refuses the open itself: the checks say why in the user's terms.
            if req.write {
                sys.check_device_in_use(&dev)?;
            }
            return Err(TargetError::Open {
                path: shown.clone(),
                err: e,
            });
        }
    };
    if req.write {
        sys.check_writable(&dev, req.destroy_data.as_deref())?;
        if sys.read_only(&dev) {
            return Err(TargetError::ReadOnlyDevice(dev.name.clone()));
        }
    }
    lock(&file, req.write, &shown)?;
    let have = sys.size_bytes(&dev).unwrap_or(0);
    let size = fit_size(req, have, &shown)?;
    let align = sys.logical_block_size(&dev).unwrap_or(512);
    check_bs(req.bs, align, &format!("/dev/{}", dev.name))?;
    Ok(Target {
        file: Arc::new(file),
        kind: TargetKind::BlockDevice { name: dev.name },
        path: path.to_path_buf(),
        size,
        align,
        warning: None,
    })
}

fn open_file(
    req: &TargetRequest,
    path: &Path,
    resolved: &OwnedFd,
    st: &rustix::fs::Stat,
    sys: &SysRoot,
    step: &mut dyn FnMut(OpenStep),
) -> Result<Target, TargetError> {
    let shown = path.display().to_string();
    if req.write {
        match req.destroy_data.as_deref() {
            None => return Err(TargetError::FileNeedsConsent(shown)),
            Some(given) if !names_object(given, st) => {
                return Err(TargetError::FileConsentMismatch {
                    given: given.to_string(),
                    path: shown,
                })
            }
            Some(_) => {}
        }
        sys.check_file_in_use(&shown, st.st_dev, st.st_ino)?;
    }
    step(OpenStep::Checked);
    let flags = if req.direct { libc::O_DIRECT } else { 0 };
    let file = reopen(resolved, req.write, flags).map_err(|e| match e.raw_os_error() {
        Some(libc::EINVAL) if req.direct => TargetError::NoDirectIo {
            dir: path
                .parent()
                .unwrap_or(Path::new("."))
                .display()
                .to_string(),
        },
        _ => TargetError::Open {
            path: shown.clone(),
            err: e,
        },
    })?;
    lock(&file, req.write, &shown)?;
    let len = st.st_size as u64;
    let size = fit_size(req, len, &shown)?;
    let align = dio_alignment(&file).unwrap_or(512);
    check_bs(req.bs, align, &shown)?;
    let warning = ((st.st_blocks as u64) * 512 < len).then(|| {
        format!("{shown} is sparse: reads of its holes never reach the device and will look fast")
    });
    Ok(Target {
        file: Arc::new(file),
        kind: TargetKind::File,
        path: path.to_path_buf(),
        size,
        align,
        warning,
    })
}

/// Whether the user named a symbolic link anywhere in `path` (e.g. /dev/disk/by-id/...): then
/// it is followed; otherwise a link that appears later is refused.
fn names_a_link(path: &Path) -> bool {
    let mut prefix = PathBuf::new();
    path.components().any(|c| {
        prefix.push(c);
        std::fs::symlink_metadata(&prefix).is_ok_and(|m| m.file_type().is_symlink())
    })
}

/// `path` as an O_PATH descriptor: nothing is opened for I/O (a FIFO does not block, a device
/// driver sees no open), and no symbolic link is followed unless `follow`.
fn resolve(path: &Path, follow: bool) -> io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags, ResolveFlags, CWD};
    let flags = OFlags::PATH | OFlags::CLOEXEC;
    if follow {
        return Ok(rustix::fs::open(path, flags, Mode::empty())?);
    }
    match rustix::fs::openat2(CWD, path, flags, Mode::empty(), ResolveFlags::NO_SYMLINKS) {
        // Before Linux 5.6: the last component at least (a symlink there opens as itself).
        Err(rustix::io::Errno::NOSYS) => Ok(rustix::fs::open(
            path,
            flags | OFlags::NOFOLLOW,
            Mode::empty(),
        )?),
        other => Ok(other?),
    }
}

/// Opens the object `resolved` refers to for I/O, through /proc/self/fd: the same inode
/// whatever its path names now.
fn reopen(resolved: &OwnedFd, write: bool, flags: i32) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(flags | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", resolved.as_raw_fd()))?;
    let (was, now) = (rustix::fs::fstat(resolved)?, rustix::fs::fstat(&file)?);
    if (was.st_dev, was.st_ino, was.st_rdev) != (now.st_dev, now.st_ino, now.st_rdev) {
        return Err(io::Error::other("the object changed while being opened"));
    }
    Ok(file)
}

/// One writer, or any number of readers, per target across virtgap runs (flock on the opened
/// object: released whenever this process ends).
fn lock(file: &File, write: bool, shown: &str) -> Result<(), TargetError> {
    use rustix::fs::FlockOperation;
    let op = if write {
        FlockOperation::NonBlockingLockExclusive
    } else {
        FlockOperation::NonBlockingLockShared
    };
    // A run of this process that just failed can still hold the lock for a moment: a closed
    // io_uring's files are released by the kernel in the background. So a held lock is tried
    // again for up to 2 s before another run is blamed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let mut locked = rustix::fs::flock(file, op);
    while locked == Err(rustix::io::Errno::WOULDBLOCK) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        locked = rustix::fs::flock(file, op);
    }
    match locked {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(TargetError::InUse {
            path: shown.to_string(),
            other: if write { "uses" } else { "writes" },
        }),
        Err(e) => Err(TargetError::Open {
            path: shown.to_string(),
            err: e.into(),
        }),
    }
}

/// Whether `given` (a --destroy-data path) is the object `st` describes.
fn names_object(given: &str, st: &rustix::fs::Stat) -> bool {
    std::fs::metadata(given).is_ok_and(|m| (m.dev(), m.ino()) == (st.st_dev, st.st_ino))
}

fn fit_size(req: &TargetRequest, have: u64, shown: &str) -> Result<u64, TargetError> {
    let size = if req.size_explicit { req.size } else { have };
    if size > have || size < req.bs {
        return Err(TargetError::TooSmall {
            path: shown.to_string(),
            have: units::bytes(have),
            want: units::bytes(size.max(req.bs)),
        });
    }
    Ok(size / req.bs * req.bs)
}

/// Writes every byte of a fresh temp file with stamped, incompressible data, so reads return
/// real data from the device rather than unwritten extents. `progress` gets bytes done so far.
pub fn fill(
    target: &Target,
    stop: &AtomicBool,
    mut progress: impl FnMut(u64),
) -> Result<(), TargetError> {
    let mut buf = AlignedBuffer::new(FILL_CHUNK, target.align as usize)
        .map_err(|e| TargetError::Fill(io::Error::other(e.to_string())))?;
    pattern::fill_random(buf.as_mut_slice(), 0xf111);
    let fd = target.file.as_raw_fd();
    let mut offset = 0u64;
    while offset < target.size {
        if stop.load(Ordering::Relaxed) {
            return Err(TargetError::Interrupted);
        }
        let len = (target.size - offset).min(FILL_CHUNK as u64) as usize;
        pattern::stamp(&mut buf.as_mut_slice()[..len], offset, pattern::FILL_TAG);
        // SAFETY: buf holds at least len bytes and outlives the call.
        let n = unsafe { libc::pwrite(fd, buf.as_mut_ptr().cast(), len, offset as libc::off_t) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(if e.raw_os_error() == Some(libc::ENOSPC) {
                TargetError::FillNoSpace
            } else {
                TargetError::Fill(e)
            });
        }
        offset += n as u64;
        progress(offset);
    }
    // SAFETY: plain syscall on an open descriptor.
    if unsafe { libc::fdatasync(fd) } != 0 {
        return Err(TargetError::Fill(io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn request(path: &Path, write: bool) -> TargetRequest {
        TargetRequest {
            choice: TargetChoice::Path(path.to_path_buf()),
            size: 1 << 20,
            size_explicit: false,
            bs: 4096,
            write,
            direct: false,
            destroy_data: write.then(|| path.display().to_string()),
        }
    }

    /// At every step of opening, the path is swapped for a symbolic link to another file (as
    /// whoever controls the directory could): the other file is never written, and what is
    /// written is the file that was there when the path was resolved — or nothing at all.
    #[test]
    fn a_path_swapped_at_any_step_never_redirects_the_writes() {
        for swap_at in [OpenStep::Looked, OpenStep::Resolved, OpenStep::Checked] {
            let dir = tempfile::tempdir().unwrap();
            let (path, victim) = (dir.path().join("t.img"), dir.path().join("victim"));
            std::fs::write(&path, vec![b'o'; 1 << 20]).unwrap();
            std::fs::write(&victim, vec![b'v'; 1 << 20]).unwrap();
            let original = std::fs::metadata(&path).unwrap().ino();
            let req = request(&path, true);
            let mut swap = |at: OpenStep| {
                if at == swap_at {
                    let link = dir.path().join("t.link");
                    std::os::unix::fs::symlink(&victim, &link).unwrap();
                    std::fs::rename(&link, &path).unwrap();
                }
            };
            match open_existing_with(&req, &path, &SysRoot::default(), &mut swap) {
                Ok(target) => {
                    assert_ne!(swap_at, OpenStep::Looked, "a link that appeared is refused");
                    assert_eq!(target.file.metadata().unwrap().ino(), original);
                    target.file.write_all_at(b"written", 0).unwrap();
                }
                Err(e) => assert!(
                    matches!(
                        e,
                        TargetError::Changed(_) | TargetError::FileConsentMismatch { .. }
                    ),
                    "swap at {swap_at:?}: {e}"
                ),
            }
            assert!(
                std::fs::read(&victim).unwrap().iter().all(|&b| b == b'v'),
                "swap at {swap_at:?}: the file swapped in was written"
            );
        }
    }

    #[test]
    fn a_link_the_user_named_is_followed_and_checked_as_what_it_opens() {
        let dir = tempfile::tempdir().unwrap();
        let (file, link) = (dir.path().join("data.img"), dir.path().join("by-name"));
        std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let mut req = request(&link, false);
        let target = open(&req, &SysRoot::default()).unwrap();
        assert_eq!(target.kind, TargetKind::File);
        drop(target);
        // Consent names the object: the file's own path names the same one as the link.
        req.write = true;
        req.destroy_data = Some(file.display().to_string());
        assert!(open(&req, &SysRoot::default()).is_ok());
        req.destroy_data = Some(dir.path().join("other").display().to_string());
        let e = open(&req, &SysRoot::default()).unwrap_err();
        assert!(matches!(e, TargetError::FileConsentMismatch { .. }), "{e}");
    }

    #[test]
    fn one_writer_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.img");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let sys = SysRoot::default();
        let first = open(&request(&path, true), &sys).unwrap();
        let e = open(&request(&path, true), &sys).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "--target {} is in use by another virtgap run that uses it; wait for that run to end",
                path.display()
            )
        );
        let e = open(&request(&path, false), &sys).unwrap_err();
        assert!(
            e.to_string().contains("another virtgap run that writes it"),
            "{e}"
        );
        drop(first);
        // Readers share.
        let _a = open(&request(&path, false), &sys).unwrap();
        let _b = open(&request(&path, false), &sys).unwrap();
        assert!(open(&request(&path, true), &sys).is_err());
    }

    #[test]
    fn a_fifo_target_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path alive for the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open(&request(&fifo, false), &SysRoot::default()).unwrap_err();
        assert!(matches!(e, TargetError::NotFileOrDevice(_)), "{e}");
    }

    #[test]
    fn a_temp_file_never_has_a_name_in_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let req = TargetRequest {
            choice: TargetChoice::TempFile {
                dir: Some(dir.path().to_path_buf()),
            },
            size: 1 << 20,
            size_explicit: true,
            bs: 4096,
            write: true,
            direct: false,
            destroy_data: None,
        };
        let target = open(&req, &SysRoot::default()).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        target.file.write_all_at(b"data", 0).unwrap();
        assert_eq!(target.kind, TargetKind::TempFile);
    }
}
