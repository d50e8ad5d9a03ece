//! Refusing to destroy data. Before a write workload may touch a block device or an existing
//! file, everything the write reaches is checked against the mount table, the swap list and
//! sysfs holders: the device itself, a whole disk's partitions, and everything below it — a
//! partition's disk, md and dm members, the file or device backing a loop device, and every loop
//! device a backing file serves. The user must also name the target's identity (serial or WWN;
//! a loop device's backing file). Every path is read under a root directory so tests can feed
//! fixture trees of real /proc and /sys layouts.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Deepest stack of loop, md and dm devices followed down before giving up (real stacks are a
/// few levels; a cycle of loop devices is cut by remembering what was seen).
pub const MAX_DEPTH: usize = 16;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SafetyError {
    #[error("{path} is not a block device known to sysfs ({reason})")]
    UnknownDevice { path: String, reason: String },
    #[error("refusing to write to {target}: /dev/{part} is mounted on {mountpoint}{via}")]
    Mounted {
        target: String,
        part: String,
        mountpoint: String,
        via: String,
    },
    #[error("refusing to write to {target}: /dev/{part} is in use as swap{via}")]
    Swap {
        target: String,
        part: String,
        via: String,
    },
    #[error("refusing to write to {target}: {file} is in use as swap{via}")]
    SwapFile {
        target: String,
        file: String,
        via: String,
    },
    #[error("refusing to write to {target}: /dev/{part} is held by {holder} (LVM, MD, dm-crypt or similar){via}")]
    Held {
        target: String,
        part: String,
        holder: String,
        via: String,
    },
    #[error("refusing to write to {target}: it sits on over {MAX_DEPTH} levels of loop, md or dm devices, too deep to check")]
    TooDeep { target: String },
    #[error("refusing to write to /dev/{device}: writes destroy its data; pass --destroy-data=<its serial or WWN> (see `lsblk -o NAME,SERIAL,WWN`; an md array's UUID from /sys/block/mdN/md/uuid){hint}")]
    NeedsIdentity { device: String, hint: String },
    #[error("refusing to write to /dev/{device}: --destroy-data={given} does not match its identity ({known})")]
    WrongIdentity {
        device: String,
        given: String,
        known: String,
    },
    #[error("refusing to write to /dev/{device}: it reports no serial or WWN, so virtgap cannot confirm which device it is")]
    NoIdentity { device: String },
}

/// A block device as sysfs describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockDevice {
    /// Kernel name, e.g. "vda1".
    pub name: String,
    /// The whole disk it belongs to ("vda"), or itself.
    pub disk: String,
    pub is_partition: bool,
}

/// What backs a loop device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopBacking {
    /// The backing file's path as the kernel reports it.
    pub path: String,
    /// The backing file's filesystem device and inode (0, 0 when it cannot be found).
    pub dev: u64,
    pub ino: u64,
    /// The block device behind it, when the backing file is a block device node.
    pub block: Option<(u32, u32)>,
}

/// Reads /proc and /sys under `root` ("/" in production).
#[derive(Clone, Debug)]
pub struct SysRoot {
    root: PathBuf,
}

impl Default for SysRoot {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/"),
        }
    }
}

impl SysRoot {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }

    fn read(&self, rel: &str) -> Option<String> {
        fs::read_to_string(self.path(rel))
            .ok()
            .map(|s| s.trim().to_string())
    }

    fn is_host(&self) -> bool {
        self.root == Path::new("/")
    }

    /// Finds the device with number `major:minor` via /sys/dev/block.
    pub fn block_device(&self, major: u32, minor: u32) -> Result<BlockDevice, String> {
        let link = self.path(&format!("sys/dev/block/{major}:{minor}"));
        let target = fs::read_link(&link).map_err(|e| format!("{}: {e}", link.display()))?;
        let name = file_name(&target).ok_or("empty sysfs link")?;
        self.named(&name, &target)
    }

    fn by_name(&self, name: &str) -> Option<BlockDevice> {
        let link = self.path(&format!("sys/class/block/{name}"));
        let target = fs::read_link(link).ok()?;
        self.named(name, &target).ok()
    }

    fn named(&self, name: &str, sysfs_target: &Path) -> Result<BlockDevice, String> {
        let is_partition = self
            .path(&format!("sys/class/block/{name}/partition"))
            .exists();
        let disk = if is_partition {
            sysfs_target
                .parent()
                .and_then(file_name)
                .ok_or("partition without a parent disk")?
        } else {
            name.to_string()
        };
        Ok(BlockDevice {
            name: name.to_string(),
            disk,
            is_partition,
        })
    }

    /// The partitions of `disk` (names), from the sysfs directory of the disk.
    pub fn partitions(&self, disk: &str) -> Vec<String> {
        let dir = self.path(&format!("sys/class/block/{disk}"));
        let mut parts: Vec<String> = fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().join("partition").exists())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        parts.sort();
        parts
    }

    /// Entries of a sysfs directory of names (`holders`, `slaves`), sorted.
    fn names_in(&self, name: &str, dir: &str) -> Vec<String> {
        let mut names: Vec<String> =
            fs::read_dir(self.path(&format!("sys/class/block/{name}/{dir}")))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect();
        names.sort();
        names
    }

    fn dev_number(&self, name: &str) -> Option<String> {
        self.read(&format!("sys/class/block/{name}/dev"))
    }

    /// Every loop device bound to a backing file (names, sorted).
    fn bound_loop_devices(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.path("sys/class/block"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| {
                self.path(&format!("sys/class/block/{n}/loop/backing_file"))
                    .exists()
            })
            .collect();
        names.sort();
        names
    }

    /// What backs loop device `name`, if it is one and is bound. On the host the loop driver is
    /// asked (LOOP_GET_STATUS64 gives the backing file's device and inode even when the file was
    /// renamed); otherwise, and where that fails, the path sysfs reports is looked up.
    pub fn loop_backing(&self, name: &str) -> Option<LoopBacking> {
        let path = self.read(&format!("sys/class/block/{name}/loop/backing_file"))?;
        if self.is_host() {
            if let Some((dev, ino, rdev)) = self.loop_status(name) {
                let block = (rdev != 0).then(|| (libc::major(rdev), libc::minor(rdev)));
                return Some(LoopBacking {
                    path,
                    dev,
                    ino,
                    block,
                });
            }
        }
        let found = fs::metadata(self.path(&path)).ok();
        Some(LoopBacking {
            dev: found.as_ref().map_or(0, MetadataExt::dev),
            ino: found.as_ref().map_or(0, MetadataExt::ino),
            block: found
                .filter(|m| m.file_type().is_block_device())
                .map(|m| (libc::major(m.rdev()), libc::minor(m.rdev()))),
            path,
        })
    }

    /// (device, inode, rdev) of loop device `name`'s backing file, from the loop driver.
    fn loop_status(&self, name: &str) -> Option<(u64, u64, u64)> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let want = self.dev_number(name)?;
        let node = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(format!("/dev/{name}"))
            .ok()?;
        // The node must be the device sysfs names, not something else under that name.
        let rdev = node.metadata().ok()?.rdev();
        if format!("{}:{}", libc::major(rdev), libc::minor(rdev)) != want {
            return None;
        }
        let mut info = std::mem::MaybeUninit::<linux_raw_sys::loop_device::loop_info64>::zeroed();
        // SAFETY: a valid descriptor of a loop device, and `info` is writable memory of the type
        // LOOP_GET_STATUS64 fills.
        let rc = unsafe {
            libc::ioctl(
                node.as_raw_fd(),
                linux_raw_sys::loop_device::LOOP_GET_STATUS64 as _,
                info.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return None;
        }
        // SAFETY: the ioctl succeeded and the struct was zeroed before, so every field is set.
        let info = unsafe { info.assume_init() };
        Some((info.lo_device, info.lo_inode, info.lo_rdevice))
    }

    /// Identities a user may name in --destroy-data: serials, WWNs, a loop device's backing file,
    /// an md array's UUID or a dm device's (as sysfs prints them; `mdadm --detail` shows the md
    /// UUID with colons, sysfs with dashes).
    pub fn identities(&self, disk: &str) -> Vec<String> {
        let mut ids: Vec<String> = [
            "serial",
            "device/serial",
            "wwid",
            "device/wwid",
            "device/wwn",
            "loop/backing_file",
            "md/uuid",
            "dm/uuid",
        ]
        .iter()
        .filter_map(|f| self.read(&format!("sys/class/block/{disk}/{f}")))
        .filter(|s| !s.is_empty())
        .collect();
        ids.dedup();
        ids
    }

    /// Logical block size of a device (partitions use their disk's queue).
    pub fn logical_block_size(&self, dev: &BlockDevice) -> Option<u32> {
        self.read(&format!(
            "sys/class/block/{}/queue/logical_block_size",
            dev.disk
        ))?
        .parse()
        .ok()
    }

    /// Size in bytes of a device or partition.
    pub fn size_bytes(&self, dev: &BlockDevice) -> Option<u64> {
        let sectors: u64 = self
            .read(&format!("sys/class/block/{}/size", dev.name))?
            .parse()
            .ok()?;
        Some(sectors * 512)
    }

    /// What the regular file with filesystem device `dev` and inode `ino` serves, in words,
    /// when replacing or truncating it would destroy data something else uses: a swap file,
    /// or the backing of a loop device (its data; a mounted filesystem's image among them).
    /// None: nothing known serves from it.
    pub fn file_in_service(&self, dev: u64, ino: u64) -> Option<String> {
        let swaps = self.read("proc/swaps").unwrap_or_default();
        let swap = swaps
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next().map(unescape_octal))
            .find(|swap| {
                fs::metadata(self.path(swap))
                    .is_ok_and(|m| m.file_type().is_file() && (m.dev(), m.ino()) == (dev, ino))
            });
        if let Some(swap) = swap {
            return Some(format!("is in use as swap ({swap})"));
        }
        let loops: Vec<String> = self
            .bound_loop_devices()
            .into_iter()
            .filter(|lo| {
                self.loop_backing(lo)
                    .is_some_and(|b| b.block.is_none() && (b.dev, b.ino) == (dev, ino))
            })
            .map(|lo| format!("/dev/{lo}"))
            .collect();
        (!loops.is_empty()).then(|| format!("backs {}", loops.join(" and ")))
    }

    /// Whether the kernel refuses writes to `dev` (its `ro` attribute: a read-only loop
    /// device, `blockdev --setro`).
    pub fn read_only(&self, dev: &BlockDevice) -> bool {
        self.read(&format!("sys/class/block/{}/ro", dev.name))
            .is_some_and(|ro| ro.trim() == "1")
    }

    /// Checks that writing to `dev` cannot hit a mounted filesystem, swap, or a holder (of the
    /// device or of anything below it), and that `destroy_data` names the device.
    pub fn check_writable(
        &self,
        dev: &BlockDevice,
        destroy_data: Option<&str>,
    ) -> Result<(), SafetyError> {
        self.check_device_in_use(dev)?;
        self.check_identity(dev, destroy_data)
    }

    /// Refuses a write to `dev` when it, a whole disk's partitions, or anything below it is
    /// mounted, in use as swap, or held by another device.
    pub fn check_device_in_use(&self, dev: &BlockDevice) -> Result<(), SafetyError> {
        let mut walk = Walk::new(self, format!("/dev/{}", dev.name));
        walk.device(dev, None, 0)
    }

    /// Refuses a write to the regular file with filesystem device `dev` and inode `ino` when it
    /// is a swap file or backs a loop device that is mounted, swapped on or held (directly, or
    /// through loop devices stacked on it). `shown` names the file in the error.
    pub fn check_file_in_use(&self, shown: &str, dev: u64, ino: u64) -> Result<(), SafetyError> {
        let mut walk = Walk::new(self, shown.to_string());
        walk.file(shown, dev, ino, None, 0)
    }

    /// Checks that `destroy_data` names `dev`: one of its serials or WWNs, or for a loop device
    /// its backing file (by path, or as the same file under another path).
    pub fn check_identity(
        &self,
        dev: &BlockDevice,
        destroy_data: Option<&str>,
    ) -> Result<(), SafetyError> {
        let known = self.identities(&dev.disk);
        let backing = self.loop_backing(&dev.disk);
        let Some(given) = destroy_data else {
            let hint = if backing.is_some() {
                "; a loop device is identified by its backing file's path".to_string()
            } else {
                String::new()
            };
            return Err(SafetyError::NeedsIdentity {
                device: dev.name.clone(),
                hint,
            });
        };
        if known.is_empty() {
            return Err(SafetyError::NoIdentity {
                device: dev.name.clone(),
            });
        }
        let given = given.trim();
        // On the host a relative path is the user's, from the working directory.
        let given_path = if self.is_host() {
            PathBuf::from(given)
        } else {
            self.path(given)
        };
        let same_backing = backing.is_some_and(|b| {
            b.ino != 0
                && fs::metadata(&given_path).is_ok_and(|m| (m.dev(), m.ino()) == (b.dev, b.ino))
        });
        if !same_backing && !known.iter().any(|k| k == given) {
            return Err(SafetyError::WrongIdentity {
                device: dev.name.clone(),
                given: given.to_string(),
                known: format!(
                    "{} identit{} on record",
                    known.len(),
                    if known.len() == 1 { "y" } else { "ies" }
                ),
            });
        }
        Ok(())
    }
}

/// One safety check's walk down from a target: what it has seen (so a cycle of loop devices
/// ends) and the steps from the target to where it is, for the error.
struct Walk<'a> {
    sys: &'a SysRoot,
    target: String,
    mounts: String,
    swaps: Vec<String>,
    seen_devices: Vec<String>,
    seen_files: Vec<(u64, u64)>,
    steps: Vec<String>,
}

impl<'a> Walk<'a> {
    fn new(sys: &'a SysRoot, target: String) -> Self {
        let swaps = sys
            .read("proc/swaps")
            .unwrap_or_default()
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next().map(unescape_octal))
            .collect();
        Self {
            sys,
            target,
            mounts: sys.read("proc/self/mountinfo").unwrap_or_default(),
            swaps,
            seen_devices: Vec::new(),
            seen_files: Vec::new(),
            steps: Vec::new(),
        }
    }

    fn via(&self) -> String {
        if self.steps.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.steps.join(", "))
        }
    }

    /// Checks `dev` (coming down from holder `from`, which is allowed to hold it), and
    /// everything below it.
    fn device(
        &mut self,
        dev: &BlockDevice,
        from: Option<&str>,
        depth: usize,
    ) -> Result<(), SafetyError> {
        if depth > MAX_DEPTH {
            return Err(SafetyError::TooDeep {
                target: self.target.clone(),
            });
        }
        if self.seen_devices.contains(&dev.name) {
            return Ok(());
        }
        self.seen_devices.push(dev.name.clone());
        // A write to a whole disk reaches its partitions; to a partition, only itself.
        let mut reached = vec![dev.name.clone()];
        if !dev.is_partition {
            reached.extend(self.sys.partitions(&dev.name));
        }
        for part in &reached {
            self.node_in_use(part, from)?;
        }
        // Below a partition: its disk (the disk node itself; its other partitions are not
        // written), and whatever the disk sits on.
        if dev.is_partition {
            if let Some(disk) = self.sys.by_name(&dev.disk) {
                self.steps
                    .push(format!("/dev/{} is on /dev/{}", dev.name, disk.name));
                self.node_in_use(&disk.name, Some(&dev.name))?;
                self.below(&disk, depth)?;
                self.steps.pop();
            }
        }
        self.below(dev, depth)
    }

    /// md and dm members, and a loop device's backing.
    fn below(&mut self, dev: &BlockDevice, depth: usize) -> Result<(), SafetyError> {
        for member in self.sys.names_in(&dev.name, "slaves") {
            let Some(below) = self.sys.by_name(&member) else {
                continue;
            };
            self.steps
                .push(format!("/dev/{} is built on /dev/{member}", dev.name));
            self.device(&below, Some(&dev.name), depth + 1)?;
            self.steps.pop();
        }
        let Some(backing) = self.sys.loop_backing(&dev.name) else {
            return Ok(());
        };
        self.steps
            .push(format!("/dev/{} is backed by {}", dev.name, backing.path));
        match backing.block {
            Some((major, minor)) => {
                if let Ok(below) = self.sys.block_device(major, minor) {
                    self.device(&below, None, depth + 1)?;
                }
            }
            None if backing.ino != 0 => {
                let path = backing.path.clone();
                self.file(&path, backing.dev, backing.ino, Some(&dev.name), depth + 1)?;
            }
            None => {}
        }
        self.steps.pop();
        Ok(())
    }

    /// A regular file written through: a swap file, or the backing of loop devices other than
    /// `except` (the loop device the walk came down from).
    fn file(
        &mut self,
        shown: &str,
        dev: u64,
        ino: u64,
        except: Option<&str>,
        depth: usize,
    ) -> Result<(), SafetyError> {
        if depth > MAX_DEPTH {
            return Err(SafetyError::TooDeep {
                target: self.target.clone(),
            });
        }
        if self.seen_files.contains(&(dev, ino)) {
            return Ok(());
        }
        self.seen_files.push((dev, ino));
        for swap in &self.swaps {
            let same = fs::metadata(self.sys.path(swap))
                .is_ok_and(|m| m.file_type().is_file() && (m.dev(), m.ino()) == (dev, ino));
            if same {
                return Err(SafetyError::SwapFile {
                    target: self.target.clone(),
                    file: swap.clone(),
                    via: self.via(),
                });
            }
        }
        for lo in self.sys.bound_loop_devices() {
            if Some(lo.as_str()) == except {
                continue;
            }
            let backs = self
                .sys
                .loop_backing(&lo)
                .is_some_and(|b| b.block.is_none() && (b.dev, b.ino) == (dev, ino));
            let Some(lo_dev) = backs.then(|| self.sys.by_name(&lo)).flatten() else {
                continue;
            };
            self.steps.push(format!("{shown} backs /dev/{lo}"));
            self.device(&lo_dev, None, depth + 1)?;
            self.steps.pop();
        }
        Ok(())
    }

    /// The device node `name` itself: mounted, swap, or held by anything but `from`.
    fn node_in_use(&self, name: &str, from: Option<&str>) -> Result<(), SafetyError> {
        if let Some(mountpoint) = self
            .sys
            .dev_number(name)
            .and_then(|devnum| mountpoint_of(&self.mounts, &devnum))
        {
            return Err(SafetyError::Mounted {
                target: self.target.clone(),
                part: name.to_string(),
                mountpoint,
                via: self.via(),
            });
        }
        let devnum = self.sys.dev_number(name);
        let swapped = self.swaps.iter().any(|swap| {
            Path::new(swap).file_name().and_then(|n| n.to_str()) == Some(name)
                || fs::metadata(self.sys.path(swap)).is_ok_and(|m| {
                    m.file_type().is_block_device()
                        && devnum.as_deref()
                            == Some(&format!(
                                "{}:{}",
                                libc::major(m.rdev()),
                                libc::minor(m.rdev())
                            ))
                })
        });
        if swapped {
            return Err(SafetyError::Swap {
                target: self.target.clone(),
                part: name.to_string(),
                via: self.via(),
            });
        }
        if let Some(holder) = self
            .sys
            .names_in(name, "holders")
            .into_iter()
            .find(|h| Some(h.as_str()) != from)
        {
            return Err(SafetyError::Held {
                target: self.target.clone(),
                part: name.to_string(),
                holder,
                via: self.via(),
            });
        }
        Ok(())
    }
}

fn file_name(p: &Path) -> Option<String> {
    p.file_name()?.to_str().map(str::to_string)
}

/// Undoes the octal escapes (`\040` for a space) /proc uses in paths.
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let digits = bytes.get(i + 1..i + 4);
        match digits {
            Some(d) if bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            _ => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount point of the first mount whose source device is `devnum` ("major:minor") in a
/// mountinfo text.
pub fn mountpoint_of(mountinfo: &str, devnum: &str) -> Option<String> {
    mountinfo.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let dev = fields.nth(2)?;
        let _root = fields.next()?;
        let mountpoint = fields.next()?;
        (dev == devnum).then(|| unescape_octal(mountpoint))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fixture tree shaped like this machine's: virtio disk vda with one partition-less root
    /// filesystem, plus disk sdb (serial ABC123) with partitions sdb1 and sdb2, and loop0.
    struct Fixture {
        dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let f = Self { dir };
            f.disk("vda", "254:0", None);
            f.disk("sdb", "8:16", Some("ABC123"));
            f.part("sdb", "sdb1", "8:17");
            f.part("sdb", "sdb2", "8:18");
            f.disk("loop0", "7:0", None);
            f.write("var/tmp/backing.img", "image");
            f.write(
                "sys/class/block/loop0/loop/backing_file",
                "/var/tmp/backing.img\n",
            );
            f.write("proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n");
            f.write("proc/self/mountinfo", "");
            f
        }

        fn write(&self, rel: &str, text: &str) {
            let p = self.dir.path().join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }

        fn disk(&self, name: &str, devnum: &str, serial: Option<&str>) {
            let base = format!("sys/devices/virtual/block/{name}");
            self.write(&format!("{base}/dev"), &format!("{devnum}\n"));
            self.write(&format!("{base}/size"), "2097152\n");
            self.write(&format!("{base}/queue/logical_block_size"), "512\n");
            fs::create_dir_all(self.dir.path().join(format!("{base}/holders"))).unwrap();
            if let Some(s) = serial {
                self.write(&format!("{base}/serial"), &format!("{s}\n"));
            }
            self.link(&base, name, devnum);
        }

        fn part(&self, disk: &str, name: &str, devnum: &str) {
            let base = format!("sys/devices/virtual/block/{disk}/{name}");
            self.write(&format!("{base}/dev"), &format!("{devnum}\n"));
            self.write(&format!("{base}/partition"), "1\n");
            self.write(&format!("{base}/size"), "1024\n");
            fs::create_dir_all(self.dir.path().join(format!("{base}/holders"))).unwrap();
            self.link(&base, name, devnum);
        }

        fn link(&self, base: &str, name: &str, devnum: &str) {
            let root = self.dir.path();
            fs::create_dir_all(root.join("sys/class/block")).unwrap();
            fs::create_dir_all(root.join("sys/dev/block")).unwrap();
            symlink(
                root.join(base),
                root.join(format!("sys/class/block/{name}")),
            )
            .unwrap();
            symlink(
                root.join(base),
                root.join(format!("sys/dev/block/{devnum}")),
            )
            .unwrap();
        }

        fn sys(&self) -> SysRoot {
            SysRoot::new(self.dir.path())
        }

        /// Another loop device over `backing` (a path under the fixture root).
        fn loop_over(&self, name: &str, devnum: &str, backing: &str) {
            self.disk(name, devnum, None);
            self.write(
                &format!("sys/class/block/{name}/loop/backing_file"),
                &format!("{backing}\n"),
            );
        }

        fn mount(&self, devnum: &str, mountpoint: &str) {
            let mut text = fs::read_to_string(self.dir.path().join("proc/self/mountinfo")).unwrap();
            text.push_str(&format!(
                "40 22 {devnum} / {mountpoint} rw - ext4 /dev/x rw\n"
            ));
            self.write("proc/self/mountinfo", &text);
        }

        /// `dev` built on `members` (md or dm): slaves and holders as sysfs links them.
        fn stack(&self, dev: &str, devnum: &str, members: &[&str]) {
            self.disk(dev, devnum, Some("STACK-1"));
            let root = self.dir.path();
            for m in members {
                let member = fs::canonicalize(root.join(format!("sys/class/block/{m}"))).unwrap();
                let holder = fs::canonicalize(root.join(format!("sys/class/block/{dev}"))).unwrap();
                fs::create_dir_all(holder.join("slaves")).unwrap();
                symlink(&member, holder.join("slaves").join(m)).unwrap();
                symlink(&holder, member.join("holders").join(dev)).unwrap();
            }
        }

        fn file_id(&self, rel: &str) -> (u64, u64) {
            let m = fs::metadata(self.dir.path().join(rel)).unwrap();
            (m.dev(), m.ino())
        }
    }

    #[test]
    fn resolves_disks_and_partitions() {
        let f = Fixture::new();
        let s = f.sys();
        let sdb1 = s.block_device(8, 17).unwrap();
        assert_eq!(
            sdb1,
            BlockDevice {
                name: "sdb1".into(),
                disk: "sdb".into(),
                is_partition: true
            }
        );
        let vda = s.block_device(254, 0).unwrap();
        assert!(!vda.is_partition);
        assert_eq!(s.partitions("sdb"), ["sdb1", "sdb2"]);
        assert_eq!(s.size_bytes(&vda), Some(1 << 30));
        assert_eq!(s.logical_block_size(&sdb1), Some(512));
    }

    #[test]
    fn a_mounted_disk_is_refused_even_with_the_right_identity() {
        let f = Fixture::new();
        f.write(
            "proc/self/mountinfo",
            "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n",
        );
        let s = f.sys();
        let vda = s.block_device(254, 0).unwrap();
        let e = s.check_writable(&vda, Some("anything")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "refusing to write to /dev/vda: /dev/vda is mounted on /"
        );
    }

    #[test]
    fn a_mounted_partition_protects_its_whole_disk() {
        let f = Fixture::new();
        f.write(
            "proc/self/mountinfo",
            "30 22 8:18 / /mnt/data\\040disk rw - xfs /dev/sdb2 rw\n",
        );
        let s = f.sys();
        let sdb = s.block_device(8, 16).unwrap();
        let e = s.check_writable(&sdb, Some("ABC123")).unwrap_err();
        assert!(
            matches!(&e, SafetyError::Mounted { part, mountpoint, .. }
            if part == "sdb2" && mountpoint == "/mnt/data disk"),
            "{e}"
        );
        // The unmounted sibling partition alone may be written.
        let sdb1 = s.block_device(8, 17).unwrap();
        assert_eq!(s.check_writable(&sdb1, Some("ABC123")), Ok(()));
    }

    #[test]
    fn swap_and_holders_are_refused() {
        let f = Fixture::new();
        f.write(
            "proc/swaps",
            "Filename\tType\tSize\tUsed\tPriority\n/dev/sdb1  partition\t1048572\t0\t-2\n",
        );
        let s = f.sys();
        let sdb = s.block_device(8, 16).unwrap();
        let e = s.check_writable(&sdb, Some("ABC123")).unwrap_err();
        assert!(matches!(e, SafetyError::Swap { .. }), "{e}");

        let f = Fixture::new();
        fs::create_dir_all(
            f.dir
                .path()
                .join("sys/devices/virtual/block/sdb/sdb2/holders/dm-0"),
        )
        .unwrap();
        let s = f.sys();
        let e = s
            .check_writable(&s.block_device(8, 16).unwrap(), Some("ABC123"))
            .unwrap_err();
        assert!(e.to_string().contains("held by dm-0"), "{e}");
    }

    #[test]
    fn identity_must_be_named_and_match() {
        let f = Fixture::new();
        let s = f.sys();
        let sdb = s.block_device(8, 16).unwrap();
        let e = s.check_writable(&sdb, None).unwrap_err();
        assert!(e.to_string().contains("--destroy-data="), "{e}");
        let e = s.check_writable(&sdb, Some("XYZ")).unwrap_err();
        assert!(matches!(e, SafetyError::WrongIdentity { .. }), "{e}");
        assert!(
            !e.to_string().contains("ABC123"),
            "the error must not hand out the identity"
        );
        assert_eq!(s.check_writable(&sdb, Some("ABC123")), Ok(()));
    }

    #[test]
    fn devices_without_identity_cannot_be_written() {
        let f = Fixture::new();
        let s = f.sys();
        let vda = s.block_device(254, 0).unwrap();
        assert!(matches!(
            s.check_writable(&vda, Some("x")),
            Err(SafetyError::NoIdentity { .. })
        ));
    }

    #[test]
    fn an_md_array_is_identified_by_its_uuid() {
        let f = Fixture::new();
        f.disk("md0", "9:0", None);
        f.write(
            "sys/class/block/md0/md/uuid",
            "3f0f0b1c-5c8e-4f0e-9b1a-2d7c6e5f4a3b\n",
        );
        let s = f.sys();
        let md = s.block_device(9, 0).unwrap();
        assert!(matches!(
            s.check_writable(&md, Some("x")),
            Err(SafetyError::WrongIdentity { .. })
        ));
        assert_eq!(
            s.check_writable(&md, Some("3f0f0b1c-5c8e-4f0e-9b1a-2d7c6e5f4a3b")),
            Ok(())
        );
    }

    #[test]
    fn loop_devices_are_identified_by_backing_file() {
        let f = Fixture::new();
        let s = f.sys();
        let lo = s.block_device(7, 0).unwrap();
        let e = s.check_writable(&lo, None).unwrap_err();
        assert!(e.to_string().contains("backing file"), "{e}");
        assert_eq!(s.check_writable(&lo, Some("/var/tmp/backing.img")), Ok(()));
    }

    #[test]
    fn a_loop_device_is_followed_to_the_file_behind_it_and_that_file_s_other_loop_devices() {
        // loop1 serves the same image as loop0 and is mounted: writing loop0 writes under it.
        let f = Fixture::new();
        f.loop_over("loop1", "7:1", "/var/tmp/backing.img");
        f.mount("7:1", "/mnt/img");
        let s = f.sys();
        let lo = s.block_device(7, 0).unwrap();
        let e = s
            .check_writable(&lo, Some("/var/tmp/backing.img"))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "refusing to write to /dev/loop0: /dev/loop1 is mounted on /mnt/img \
             (/dev/loop0 is backed by /var/tmp/backing.img, /var/tmp/backing.img backs /dev/loop1)"
        );
        // The image itself, as a --target file, is refused the same way.
        let (dev, ino) = f.file_id("var/tmp/backing.img");
        let e = s.check_file_in_use("img", dev, ino).unwrap_err();
        assert!(
            matches!(&e, SafetyError::Mounted { target, part, .. } if target == "img" && part == "loop1"),
            "{e}"
        );
        // Unmounted, both may be written.
        let f = Fixture::new();
        f.loop_over("loop1", "7:1", "/var/tmp/backing.img");
        let s = f.sys();
        assert_eq!(
            s.check_writable(&s.block_device(7, 0).unwrap(), Some("/var/tmp/backing.img")),
            Ok(())
        );
        let (dev, ino) = f.file_id("var/tmp/backing.img");
        assert_eq!(s.check_file_in_use("img", dev, ino), Ok(()));
    }

    #[test]
    fn a_loop_device_over_a_file_on_a_mounted_filesystem_is_not_refused_for_that_mount() {
        // The image lives on a mounted filesystem (of course): only what the image serves counts.
        let f = Fixture::new();
        f.mount("254:0", "/");
        let s = f.sys();
        assert_eq!(
            s.check_writable(&s.block_device(7, 0).unwrap(), Some("/var/tmp/backing.img")),
            Ok(())
        );
    }

    #[test]
    fn md_and_dm_members_are_checked_below_the_array() {
        // md0 on sdb1 and sdb2: its own hold on them is expected; a mounted disk below is not.
        let f = Fixture::new();
        f.stack("md0", "9:0", &["sdb1", "sdb2"]);
        let s = f.sys();
        let md0 = s.block_device(9, 0).unwrap();
        assert_eq!(s.check_device_in_use(&md0), Ok(()));
        // Another holder of a member (dm-0 also on sdb2) is a conflict.
        f.stack("dm-0", "253:0", &["sdb2"]);
        let e = s.check_device_in_use(&md0).unwrap_err();
        assert!(
            matches!(&e, SafetyError::Held { part, holder, .. } if part == "sdb2" && holder == "dm-0"),
            "{e}"
        );
        assert!(
            e.to_string().contains("(/dev/md0 is built on /dev/sdb2)"),
            "{e}"
        );
        // The whole disk under a member mounted directly.
        let f = Fixture::new();
        f.stack("md0", "9:0", &["sdb1"]);
        f.mount("8:16", "/mnt/raw");
        let s = f.sys();
        let e = s
            .check_device_in_use(&s.block_device(9, 0).unwrap())
            .unwrap_err();
        assert!(
            matches!(&e, SafetyError::Mounted { part, .. } if part == "sdb"),
            "{e}"
        );
    }

    #[test]
    fn a_swap_file_is_refused_as_a_target_and_below_a_loop_device() {
        let f = Fixture::new();
        f.write(
            "proc/swaps",
            "Filename\tType\tSize\tUsed\tPriority\n/var/tmp/backing.img file\t1024\t0\t-2\n",
        );
        let s = f.sys();
        let (dev, ino) = f.file_id("var/tmp/backing.img");
        let e = s
            .check_file_in_use("/var/tmp/backing.img", dev, ino)
            .unwrap_err();
        assert!(matches!(e, SafetyError::SwapFile { .. }), "{e}");
        let e = s
            .check_device_in_use(&s.block_device(7, 0).unwrap())
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("is in use as swap (/dev/loop0 is backed by"),
            "{e}"
        );
    }

    #[test]
    fn a_file_backing_a_loop_device_or_swap_is_in_service() {
        let f = Fixture::new();
        f.write("data/other", "x");
        f.write("data/swapfile", "x");
        f.write(
            "proc/swaps",
            "Filename\tType\tSize\tUsed\tPriority\n/data/swapfile\tfile\t4\t0\t-2\n",
        );
        let sys = f.sys();
        let (dev, ino) = f.file_id("var/tmp/backing.img");
        assert_eq!(
            sys.file_in_service(dev, ino).as_deref(),
            Some("backs /dev/loop0")
        );
        let (dev, ino) = f.file_id("data/swapfile");
        assert_eq!(
            sys.file_in_service(dev, ino).as_deref(),
            Some("is in use as swap (/data/swapfile)")
        );
        let (dev, ino) = f.file_id("data/other");
        assert_eq!(sys.file_in_service(dev, ino), None);
    }

    #[test]
    fn loop_devices_serving_each_other_end_the_walk() {
        // Two loop devices over one image, each reached from the other: seen once, no loop.
        let f = Fixture::new();
        f.loop_over("loop1", "7:1", "/var/tmp/backing.img");
        f.loop_over("loop2", "7:2", "/var/tmp/backing.img");
        let s = f.sys();
        assert_eq!(
            s.check_device_in_use(&s.block_device(7, 2).unwrap()),
            Ok(())
        );
    }

    #[test]
    fn a_loop_device_is_identified_by_its_backing_file_under_any_path() {
        let f = Fixture::new();
        let s = f.sys();
        let lo = s.block_device(7, 0).unwrap();
        // Relative to the fixture root, the same file by another path (a hard link).
        fs::hard_link(
            f.dir.path().join("var/tmp/backing.img"),
            f.dir.path().join("var/tmp/other-name.img"),
        )
        .unwrap();
        assert_eq!(
            s.check_identity(&lo, Some("/var/tmp/other-name.img")),
            Ok(())
        );
        assert!(s.check_identity(&lo, Some("/var/tmp/nothing.img")).is_err());
    }

    #[test]
    fn octal_escapes_in_proc_paths_are_undone() {
        assert_eq!(unescape_octal("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_octal("/plain\\"), "/plain\\");
    }
}
