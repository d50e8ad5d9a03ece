//! What the workload reads and writes: a temp file (the default), an existing file, or a block
//! device. Temp files are unlinked as soon as they are open, so no exit path — error, Ctrl-C,
//! SIGTERM, even SIGKILL — can leave one behind. Writes to anything the user already had need
//! `--destroy-data` naming it; block devices are also checked by [`crate::safety`].

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
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
    let name = format!(
        ".virtgap-{}-{:x}.tmp",
        std::process::id(),
        rand::random::<u32>()
    );
    let path = dir.join(name);
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).create_new(true).mode(0o600);
    if req.direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    let file = match opts.open(&path) {
        Ok(f) => f,
        Err(e) => {
            // Some filesystems create the file and then refuse O_DIRECT at open.
            let _ = std::fs::remove_file(&path);
            return Err(match e.raw_os_error() {
                Some(libc::EINVAL) if req.direct => TargetError::NoDirectIo {
                    dir: dir.display().to_string(),
                },
                Some(libc::EACCES) | Some(libc::EROFS) | Some(libc::EPERM) => {
                    TargetError::DirNotWritable {
                        dir: dir.display().to_string(),
                        err: e,
                    }
                }
                _ => TargetError::Open {
                    path: path.display().to_string(),
                    err: e,
                },
            });
        }
    };
    // From here on the file has no name: it disappears when the last descriptor closes.
    let _ = std::fs::remove_file(&path);
    let align = dio_alignment(&file).unwrap_or(512);
    check_bs(req.bs, align, &dir.display().to_string())?;
    preallocate(&file, req.size)?;
    Ok(Target {
        file: Arc::new(file),
        kind: TargetKind::TempFile,
        path,
        size: req.size,
        align,
        warning: None,
    })
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

fn open_existing(req: &TargetRequest, path: &Path, sys: &SysRoot) -> Result<Target, TargetError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => TargetError::Missing(shown.clone()),
        _ => TargetError::Open {
            path: shown.clone(),
            err: e,
        },
    })?;
    let ft = meta.file_type();
    if ft.is_dir() {
        return Err(TargetError::IsDirectory(shown));
    }
    let mut flags = 0;
    if req.direct {
        flags |= libc::O_DIRECT;
    }
    if ft.is_block_device() {
        let (major, minor) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
        let dev = sys
            .block_device(major, minor)
            .map_err(|reason| SafetyError::UnknownDevice {
                path: shown.clone(),
                reason,
            })?;
        if req.write {
            sys.check_writable(&dev, req.destroy_data.as_deref())?;
            // The kernel refuses O_EXCL on a block device something else has claimed.
            flags |= libc::O_EXCL;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(req.write)
            .custom_flags(flags)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EBUSY) => TargetError::Busy(dev.name.clone()),
                _ => TargetError::Open {
                    path: shown.clone(),
                    err: e,
                },
            })?;
        let have = sys.size_bytes(&dev).unwrap_or(0);
        let size = fit_size(req, have, &shown)?;
        let align = sys.logical_block_size(&dev).unwrap_or(512);
        check_bs(req.bs, align, &format!("/dev/{}", dev.name))?;
        return Ok(Target {
            file: Arc::new(file),
            kind: TargetKind::BlockDevice { name: dev.name },
            path: path.to_path_buf(),
            size,
            align,
            warning: None,
        });
    }
    if !ft.is_file() {
        return Err(TargetError::NotFileOrDevice(shown));
    }
    if req.write {
        match req.destroy_data.as_deref() {
            None => return Err(TargetError::FileNeedsConsent(shown)),
            Some(given) if !same_file(given, path) => {
                return Err(TargetError::FileConsentMismatch {
                    given: given.to_string(),
                    path: shown,
                })
            }
            Some(_) => {}
        }
    }
    let file = OpenOptions::new()
        .read(true)
        .write(req.write)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
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
    let size = fit_size(req, meta.len(), &shown)?;
    let align = dio_alignment(&file).unwrap_or(512);
    check_bs(req.bs, align, &shown)?;
    let warning = (meta.blocks() * 512 < meta.len()).then(|| {
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

fn same_file(given: &str, path: &Path) -> bool {
    let canon = |p: &Path| std::fs::canonicalize(p).ok();
    given == path.to_string_lossy()
        || canon(Path::new(given)).is_some_and(|g| Some(g) == canon(path))
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
