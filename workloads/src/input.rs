//! Reading a file a user named (a workload file, a profile) without trusting it: only a regular
//! file, opened so that a FIFO or a terminal cannot block or take over the process, and never
//! more than a cap read into memory, however large the file is or grows.

use std::fs::{File, Metadata, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::units;

#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("it is {0}, not a regular file")]
    NotRegular(&'static str),
    #[error("it is {} ({size} bytes), over the {} limit", units::bytes(*size), units::bytes(*cap))]
    TooLarge { size: u64, cap: u64 },
}

impl From<InputError> for std::io::Error {
    fn from(e: InputError) -> Self {
        match e {
            InputError::Io(e) => e,
            other => std::io::Error::new(std::io::ErrorKind::InvalidInput, other.to_string()),
        }
    }
}

/// What kind of file `meta` describes, when it is not a regular file.
fn not_regular(meta: &Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    Some(if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a special file"
    })
}

/// The whole of the regular file at `path`, at most `cap` bytes of it.
///
/// The path is checked before it is opened (a device is not even opened: opening some has
/// effects) and the opened descriptor is checked again, since the path may have been swapped in
/// between. The open is non-blocking, so a FIFO swapped in returns at once instead of waiting
/// for a writer, and takes no controlling terminal. A file over `cap` bytes, or one that grows
/// past it while being read, is refused without reading more than `cap + 1` bytes.
pub fn read_bounded(path: &Path, cap: u64) -> Result<Vec<u8>, InputError> {
    if let Some(kind) = not_regular(&std::fs::metadata(path)?) {
        return Err(InputError::NotRegular(kind));
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    if let Some(kind) = not_regular(&meta) {
        return Err(InputError::NotRegular(kind));
    }
    if meta.len() > cap {
        return Err(InputError::TooLarge {
            size: meta.len(),
            cap,
        });
    }
    blocking(&file)?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(InputError::TooLarge {
            size: bytes.len() as u64,
            cap,
        });
    }
    Ok(bytes)
}

/// Clears O_NONBLOCK: a regular file ignores it, but a FUSE filesystem sees it and may answer
/// EAGAIN.
fn blocking(file: &File) -> std::io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: `fd` is open for the life of `file`; F_GETFL takes no argument.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above; F_SETFL takes an int of file status flags.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_regular_file_is_read_whole_up_to_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.toml");
        std::fs::write(&p, b"bs = \"4KiB\"\n").unwrap();
        assert_eq!(read_bounded(&p, 64).unwrap(), b"bs = \"4KiB\"\n");
        assert_eq!(read_bounded(&p, 12).unwrap().len(), 12);
        let err = read_bounded(&p, 11).unwrap_err();
        assert!(
            matches!(err, InputError::TooLarge { size: 12, cap: 11 }),
            "{err}"
        );
    }

    #[test]
    fn a_fifo_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.toml");
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let started = Instant::now();
        let err = read_bounded(&p, 1 << 20).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(err.to_string(), "it is a FIFO, not a regular file");
    }

    #[test]
    fn devices_and_directories_are_refused_unread() {
        for (path, kind) in [
            ("/dev/zero", "a character device"),
            ("/dev/urandom", "a character device"),
            ("/", "a directory"),
        ] {
            let err = read_bounded(Path::new(path), 1 << 20).unwrap_err();
            assert_eq!(err.to_string(), format!("it is {kind}, not a regular file"));
        }
    }

    #[test]
    fn the_size_is_said_in_units() {
        let err = InputError::TooLarge {
            size: 3 << 30,
            cap: 1 << 20,
        };
        assert_eq!(
            err.to_string(),
            "it is 3 GiB (3221225472 bytes), over the 1 MiB limit"
        );
    }
}
