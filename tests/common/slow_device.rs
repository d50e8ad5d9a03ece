//! A block device with a known service time or a known stall: a read-only loop device over the
//! one file of a FUSE filesystem that delays (or, for a while, holds) every read.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

pub mod slow_fuse {
    //! A one-file FUSE filesystem whose every read waits a fixed time: a device with a known,
    //! adjustable service time. Files are opened with FOPEN_DIRECT_IO, so no page cache hides the
    //! delay.

    use std::ffi::OsStr;
    use std::time::{Duration, Instant, UNIX_EPOCH};

    use fuser::{
        FileAttr, FileType, Filesystem, ReplyAttr, ReplyData, ReplyEntry, ReplyOpen, Request,
    };

    pub const SIZE: u64 = 128 << 20;
    const FILE_INO: u64 = 2;
    const TTL: Duration = Duration::from_secs(3600);

    pub struct SlowDisk {
        pub delay: Duration,
        /// With `n`, only reads of every `n`-th 4 KiB block (block number a multiple of n)
        /// wait `delay`: a device whose tail, not its typical read, is slow.
        pub delay_one_block_in: Option<u64>,
        /// Once `after` has passed since the first read, reads wait until `len` later: the
        /// device stops answering for a while, then comes back.
        pub stall: Option<Stall>,
        first_read: Option<Instant>,
    }

    #[derive(Clone, Copy)]
    pub struct Stall {
        pub after: Duration,
        pub len: Duration,
    }

    impl SlowDisk {
        pub fn delaying(delay: Duration) -> Self {
            Self {
                delay,
                delay_one_block_in: None,
                stall: None,
                first_read: None,
            }
        }

        /// Reads of one 4 KiB block in `n` (fixed offsets) take `delay` longer; the rest none.
        pub fn delaying_one_block_in(n: u64, delay: Duration) -> Self {
            Self {
                delay_one_block_in: Some(n),
                ..Self::delaying(delay)
            }
        }

        pub fn stalling(stall: Stall) -> Self {
            Self {
                delay: Duration::ZERO,
                delay_one_block_in: None,
                stall: Some(stall),
                first_read: None,
            }
        }
    }

    fn attr(ino: u64) -> FileAttr {
        let (kind, size, perm) = if ino == 1 {
            (FileType::Directory, 0, 0o755)
        } else {
            (FileType::RegularFile, SIZE, 0o444)
        };
        FileAttr {
            ino,
            size,
            blocks: size / 512,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind,
            perm,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    impl Filesystem for SlowDisk {
        fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
            if parent == 1 && name == "disk.img" {
                reply.entry(&TTL, &attr(FILE_INO), 0);
            } else {
                reply.error(libc::ENOENT);
            }
        }

        fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
            match ino {
                1 | FILE_INO => reply.attr(&TTL, &attr(ino)),
                _ => reply.error(libc::ENOENT),
            }
        }

        fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
            if ino == FILE_INO {
                reply.opened(0, fuser::consts::FOPEN_DIRECT_IO);
            } else {
                reply.error(libc::EISDIR);
            }
        }

        fn read(
            &mut self,
            _req: &Request<'_>,
            _ino: u64,
            _fh: u64,
            offset: i64,
            size: u32,
            _flags: i32,
            _lock: Option<u64>,
            reply: ReplyData,
        ) {
            let chosen = self
                .delay_one_block_in
                .is_none_or(|n| (offset as u64 / 4096).is_multiple_of(n.max(1)));
            if !self.delay.is_zero() && chosen {
                std::thread::sleep(self.delay);
            }
            let first = *self.first_read.get_or_insert_with(Instant::now);
            if let Some(stall) = self.stall {
                let (from, until) = (first + stall.after, first + stall.after + stall.len);
                let now = Instant::now();
                if now >= from && now < until {
                    std::thread::sleep(until - now);
                }
            }
            let len = (SIZE.saturating_sub(offset as u64)).min(u64::from(size)) as usize;
            reply.data(&vec![0x42; len]);
        }
    }
}

/// A mounted slow filesystem with a read-only loop device over its file; undone on drop.
pub struct SlowDevice {
    pub loop_dev: String,
    _session: fuser::BackgroundSession,
}

impl SlowDevice {
    pub fn new(mountpoint: &Path, disk: slow_fuse::SlowDisk) -> Result<Self, String> {
        std::fs::create_dir_all(mountpoint).map_err(|e| e.to_string())?;
        let options = [
            fuser::MountOption::RO,
            fuser::MountOption::FSName("virtgap-slow".into()),
        ];
        let session = fuser::spawn_mount2(disk, mountpoint, &options)
            .map_err(|e| format!("FUSE mount: {e}"))?;
        let out = Command::new("losetup")
            .args(["--direct-io=on", "--read-only", "--show", "-f"])
            .arg(mountpoint.join("disk.img"))
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let loop_dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Ok(Self {
            loop_dev,
            _session: session,
        })
    }
}

impl Drop for SlowDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup")
            .args(["-d", &self.loop_dev])
            .status();
        // Give the loop device a moment to let go of the file before the unmount.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && Command::new("losetup")
                .arg(&self.loop_dev)
                .output()
                .is_ok_and(|o| o.status.success())
        {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
