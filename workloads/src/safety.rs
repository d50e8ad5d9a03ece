//! Refusing to destroy data. Before a write workload may touch a block device, the device, each
//! of its partitions and their holders are checked against the mount table, the swap list and
//! sysfs, and the user must name the device's identity (serial or WWN). Every path is read
//! under a root directory so tests can feed fixture trees of real /proc and /sys layouts.

use std::fs;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SafetyError {
    #[error("{path} is not a block device known to sysfs ({reason})")]
    UnknownDevice { path: String, reason: String },
    #[error("refusing to write to /dev/{device}: /dev/{part} is mounted on {mountpoint}")]
    Mounted {
        device: String,
        part: String,
        mountpoint: String,
    },
    #[error("refusing to write to /dev/{device}: /dev/{part} is in use as swap")]
    Swap { device: String, part: String },
    #[error("refusing to write to /dev/{device}: /dev/{part} is held by {holder} (LVM, MD, dm-crypt or similar)")]
    Held {
        device: String,
        part: String,
        holder: String,
    },
    #[error("refusing to write to /dev/{device}: writes destroy its data; pass --destroy-data=<its serial or WWN> (see `lsblk -o NAME,SERIAL,WWN`){hint}")]
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

    /// Finds the device with number `major:minor` via /sys/dev/block.
    pub fn block_device(&self, major: u32, minor: u32) -> Result<BlockDevice, String> {
        let link = self.path(&format!("sys/dev/block/{major}:{minor}"));
        let target = fs::read_link(&link).map_err(|e| format!("{}: {e}", link.display()))?;
        let name = file_name(&target).ok_or("empty sysfs link")?;
        let is_partition = self
            .path(&format!("sys/class/block/{name}/partition"))
            .exists();
        let disk = if is_partition {
            target
                .parent()
                .and_then(file_name)
                .ok_or("partition without a parent disk")?
        } else {
            name.clone()
        };
        Ok(BlockDevice {
            name,
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

    fn dev_number(&self, name: &str) -> Option<String> {
        self.read(&format!("sys/class/block/{name}/dev"))
    }

    /// Identities a user may name in --destroy-data: serials, WWNs, a loop device's backing file.
    pub fn identities(&self, disk: &str) -> Vec<String> {
        let mut ids: Vec<String> = [
            "serial",
            "device/serial",
            "wwid",
            "device/wwid",
            "device/wwn",
            "loop/backing_file",
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

    /// Checks that writing to `dev` cannot hit a mounted filesystem, swap, or a holder, and that
    /// `destroy_data` names the device.
    pub fn check_writable(
        &self,
        dev: &BlockDevice,
        destroy_data: Option<&str>,
    ) -> Result<(), SafetyError> {
        let mut affected = vec![dev.name.clone()];
        if !dev.is_partition {
            affected.extend(self.partitions(&dev.disk));
        }
        let mounts = self.read("proc/self/mountinfo").unwrap_or_default();
        for part in &affected {
            let Some(devnum) = self.dev_number(part) else {
                continue;
            };
            if let Some(mountpoint) = mountpoint_of(&mounts, &devnum) {
                return Err(SafetyError::Mounted {
                    device: dev.name.clone(),
                    part: part.clone(),
                    mountpoint,
                });
            }
        }
        let swaps = self.read("proc/swaps").unwrap_or_default();
        for line in swaps.lines().skip(1) {
            let Some(path) = line.split_whitespace().next() else {
                continue;
            };
            let swapped = Path::new(path)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            if let Some(part) = affected.iter().find(|p| *p == swapped) {
                return Err(SafetyError::Swap {
                    device: dev.name.clone(),
                    part: part.clone(),
                });
            }
        }
        for part in &affected {
            let holders = self.path(&format!("sys/class/block/{part}/holders"));
            if let Some(holder) = fs::read_dir(holders)
                .into_iter()
                .flatten()
                .flatten()
                .find_map(|e| e.file_name().into_string().ok())
            {
                return Err(SafetyError::Held {
                    device: dev.name.clone(),
                    part: part.clone(),
                    holder,
                });
            }
        }
        let known = self.identities(&dev.disk);
        let Some(given) = destroy_data else {
            let hint = if self
                .path(&format!("sys/class/block/{}/loop", dev.disk))
                .exists()
            {
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
        if !known.iter().any(|k| k == given.trim()) {
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

fn file_name(p: &Path) -> Option<String> {
    p.file_name()?.to_str().map(str::to_string)
}

/// The mount point of the first mount whose source device is `devnum` ("major:minor").
fn mountpoint_of(mountinfo: &str, devnum: &str) -> Option<String> {
    mountinfo.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let dev = fields.nth(2)?;
        let _root = fields.next()?;
        let mountpoint = fields.next()?;
        (dev == devnum).then(|| mountpoint.replace("\\040", " "))
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
    fn loop_devices_are_identified_by_backing_file() {
        let f = Fixture::new();
        let s = f.sys();
        let lo = s.block_device(7, 0).unwrap();
        let e = s.check_writable(&lo, None).unwrap_err();
        assert!(e.to_string().contains("backing file"), "{e}");
        assert_eq!(s.check_writable(&lo, Some("/var/tmp/backing.img")), Ok(()));
    }
}
