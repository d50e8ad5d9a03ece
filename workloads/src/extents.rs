//! Where a target's bytes sit on a whole disk, in the terms the kernel's block tracepoints use.
//!
//! `block_rq_*` tracepoints report the *whole* disk's device number and sectors already shifted
//! by the partition start. [`ExtentMap::of_file`] maps a target (a regular file, possibly an
//! unlinked temp file, or a block device node) to that disk and those 512-byte sectors:
//!
//! - a block device node: one extent starting at the partition's first sector (0 for a whole disk);
//! - a regular file: the FIEMAP ioctl gives byte offsets on the filesystem's device (`st_dev`),
//!   shifted by that device's partition start.
//!
//! The disk of a device-mapper or md filesystem device is that device itself (it has no parent
//! disk in sysfs), so the sectors then refer to it, not to the disks underneath.
//!
//! Known limits, not detected here: on a multi-device filesystem (btrfs, f2fs with extra devices,
//! XFS with a realtime device) FIEMAP's physical offsets are not offsets on `st_dev`; btrfs at least
//! reports an anonymous `st_dev` (major 0), which is refused. Reading an unwritten (preallocated)
//! extent issues no I/O at all; writing one does, at the sectors given here.
//!
//! No crate is used for FIEMAP: the one on crates.io (`fiemap` 0.2) hard-codes the x86/arm ioctl
//! number (wrong on powerpc, mips, sparc), always asks for the whole file (no way to stop at a
//! span), and fetches 8 extents a call, each call with FIEMAP_FLAG_SYNC re-syncing the file. The
//! ioctl is small enough to write against `libc`, whose `_IOWR` encodes the number per architecture.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Where a target's bytes sit on a whole disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtentMap {
    /// The whole disk (major, minor) the sectors are on.
    pub disk: (u32, u32),
    /// Sorted, non-overlapping: (logical byte offset in the target, first 512-byte sector on the disk, length in bytes).
    pub extents: Vec<(u64, u64, u64)>,
}

impl ExtentMap {
    /// Maps the file's first `span` bytes. Errors (as a String saying why, one line) when the map
    /// cannot be known: FIEMAP unsupported by the filesystem (e.g. tmpfs, btrfs compressed),
    /// extents flagged unknown/delalloc/encoded/not-aligned/inline, a file on a non-block
    /// filesystem (st_dev major 0), a device with no entry in /sys/dev/block, etc. A device-mapper
    /// or md *file system* device is fine: the sectors then refer to that device.
    ///
    /// Holes are absent from the map. FIEMAP runs with FIEMAP_FLAG_SYNC, so dirty data is
    /// written (and so allocated) first.
    pub fn of_file(file: &File, span: u64) -> Result<Self, String> {
        Self::of_file_in(file, span, Path::new("/"))
    }

    /// The disk and sector holding byte `offset`, or None when outside the map.
    pub fn sector_of(&self, offset: u64) -> Option<u64> {
        // Extents are sorted by logical offset: the candidate is the last one starting at or
        // before `offset`.
        let idx = self
            .extents
            .partition_point(|&(logical, _, _)| logical <= offset);
        let &(logical, sector, len) = self.extents.get(idx.checked_sub(1)?)?;
        let within = offset - logical; // logical <= offset by the partition point
        if within >= len {
            return None;
        }
        sector.checked_add(within / 512)
    }

    /// [`ExtentMap::of_file`] with sysfs looked up under `root` (tests use a fake tree).
    fn of_file_in(file: &File, span: u64, root: &Path) -> Result<Self, String> {
        let meta = file
            .metadata()
            .map_err(|e| one_line(&format!("cannot stat the target: {e}")))?;
        let ft = meta.file_type();
        if ft.is_block_device() {
            let (maj, min) = split_dev(meta.rdev());
            let (disk, start) = disk_and_start(root, maj, min)?;
            let extents = if span == 0 {
                Vec::new()
            } else {
                vec![(0, start, span)]
            };
            return Ok(Self { disk, extents });
        }
        if !ft.is_file() {
            return Err(format!(
                "the target is neither a regular file nor a block device ({ft:?})"
            ));
        }
        let (maj, min) = split_dev(meta.dev());
        if maj == 0 {
            return Err(format!(
                "{NOT_ON_BLOCK}: its st_dev {maj}:{min} is an anonymous device (tmpfs, overlayfs, btrfs, NFS, FUSE…)"
            ));
        }
        let (disk, start) = disk_and_start(root, maj, min)?;
        let raw = fiemap(file, span)?;
        let mut extents: Vec<(u64, u64, u64)> = Vec::with_capacity(raw.len());
        for ext in raw {
            if let Some(bad) = refused_flags(ext.fe_flags) {
                return Err(format!(
                    "the extent at byte {} of the file is flagged {bad}: its place on the disk is not known",
                    ext.fe_logical
                ));
            }
            let ext_end = ext.fe_logical.checked_add(ext.fe_length).ok_or_else(|| {
                format!(
                    "FIEMAP returned an extent past 2^64 bytes (at {})",
                    ext.fe_logical
                )
            })?;
            // Clip to [end of the previous extent, span): keeps the map within the span and
            // non-overlapping even if the filesystem repeats part of an extent.
            let prev_end = extents.last().map_or(0, |&(l, _, n)| l + n);
            let lo = ext.fe_logical.max(prev_end);
            let hi = ext_end.min(span);
            if hi <= lo {
                continue;
            }
            let phys = ext
                .fe_physical
                .checked_add(lo - ext.fe_logical)
                .ok_or("FIEMAP returned a physical offset past 2^64 bytes")?;
            if !phys.is_multiple_of(512) {
                return Err(format!(
                    "the extent at byte {lo} of the file starts at byte {phys} of the device, not on a 512-byte sector"
                ));
            }
            let sector = start
                .checked_add(phys / 512)
                .ok_or("the sector number overflows")?;
            let len = hi - lo;
            // Merge with the previous extent when contiguous both in the file and on the disk
            // (FIEMAP splits at the filesystem's maximum extent size).
            if let Some(last) = extents.last_mut() {
                if last.0 + last.2 == lo
                    && last.2.is_multiple_of(512)
                    && last.1.checked_add(last.2 / 512) == Some(sector)
                {
                    last.2 += len;
                    continue;
                }
            }
            extents.push((lo, sector, len));
        }
        Ok(Self { disk, extents })
    }
}

/// Start of the error for a file on a filesystem with no block device behind its st_dev.
const NOT_ON_BLOCK: &str = "the file is not on a block device";
/// Start of the error when the filesystem has no FIEMAP.
const NO_FIEMAP: &str = "the filesystem does not support FIEMAP";

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

fn split_dev(dev: u64) -> (u32, u32) {
    let dev = dev as libc::dev_t;
    (libc::major(dev), libc::minor(dev))
}

/// The whole disk holding device `maj:min`, and the device's first sector on that disk.
///
/// `/sys/dev/block/MAJ:MIN` links to the device's sysfs directory; a partition has a `start` file
/// (in 512-byte sectors) and sits in its disk's directory, whose `dev` file names the disk.
fn disk_and_start(root: &Path, maj: u32, min: u32) -> Result<((u32, u32), u64), String> {
    let link = root.join(format!("sys/dev/block/{maj}:{min}"));
    let dir = std::fs::canonicalize(&link).map_err(|e| {
        one_line(&format!(
            "device {maj}:{min} has no usable entry {}: {e}",
            link.display()
        ))
    })?;
    let start_file = dir.join("start");
    if !start_file.exists() {
        return Ok(((maj, min), 0));
    }
    let start = read_trimmed(&start_file)?
        .parse::<u64>()
        .map_err(|e| format!("{}: not a sector number: {e}", start_file.display()))?;
    let parent: PathBuf = dir
        .parent()
        .ok_or_else(|| format!("partition {maj}:{min} has no parent disk directory in sysfs"))?
        .to_path_buf();
    let dev_file = parent.join("dev");
    let disk = parse_devnum(&read_trimmed(&dev_file)?)
        .ok_or_else(|| format!("{}: not a MAJ:MIN device number", dev_file.display()))?;
    Ok((disk, start))
}

/// How an md RAID0 device stripes its sectors over its members: a sector of the md device
/// followed to the member disk and sector its request lands on. Only a single-zone array
/// (members of one usable size) is mapped; with members of different sizes md adds zones, each
/// striped over fewer members, and those are refused rather than guessed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Raid0 {
    /// Sectors per chunk (md's `chunk_size` / 512).
    pub chunk_sectors: u64,
    /// In md's device order (`rd0`, `rd1`, …): each member's whole disk and the sector on it
    /// where the member's data starts (partition start + md's data offset).
    pub members: Vec<((u32, u32), u64)>,
}

impl Raid0 {
    /// The striping of md device `name` (e.g. "md0"), from sysfs.
    pub fn of_md(name: &str) -> Result<Self, String> {
        Self::of_md_in(Path::new("/"), name)
    }

    fn of_md_in(root: &Path, name: &str) -> Result<Self, String> {
        let md = root.join("sys/block").join(name).join("md");
        if !md.exists() {
            return Err(format!(
                "{name} is not an md device: only md RAID0 striping is mapped"
            ));
        }
        let level = read_trimmed(&md.join("level"))?;
        if level != "raid0" {
            return Err(format!(
                "{name} is md {level}: only RAID0 striping is mapped"
            ));
        }
        let number = |file: &str| -> Result<u64, String> {
            let path = md.join(file);
            read_trimmed(&path)?
                .parse()
                .map_err(|e| format!("{}: not a number: {e}", path.display()))
        };
        let chunk_sectors = number("chunk_size")? / 512;
        let disks = number("raid_disks")?;
        if chunk_sectors == 0 || disks == 0 {
            return Err(format!("{name}: RAID0 with no chunk size or no members"));
        }
        let mut members = Vec::new();
        let mut sizes = Vec::new();
        for k in 0..disks {
            let slot = std::fs::canonicalize(md.join(format!("rd{k}")))
                .map_err(|e| one_line(&format!("{name}: member {k} not in sysfs: {e}")))?;
            let member = |file: &str| read_trimmed(&slot.join(file));
            let dev_file = slot.join("block/dev");
            let (maj, min) = parse_devnum(&read_trimmed(&dev_file)?)
                .ok_or_else(|| format!("{}: not a MAJ:MIN device number", dev_file.display()))?;
            let data_offset: u64 = member("offset")?
                .parse()
                .map_err(|e| format!("{name}: member {k}'s data offset: {e}"))?;
            sizes.push(member("size")?);
            let (disk, start) = disk_and_start(root, maj, min)?;
            members.push((disk, start + data_offset));
        }
        sizes.dedup();
        if sizes.len() > 1 {
            return Err(format!(
                "{name} is a RAID0 over members of different sizes: its zones are not mapped"
            ));
        }
        Ok(Self {
            chunk_sectors,
            members,
        })
    }

    /// The member disk and sector holding `sector` of the md device (md's `map_sector` for
    /// its one zone).
    pub fn locate(&self, sector: u64) -> Option<((u32, u32), u64)> {
        let n = self.members.len() as u64;
        let chunk = sector / self.chunk_sectors;
        let (disk, start) = *self.members.get(usize::try_from(chunk % n).ok()?)?;
        let on_member = (chunk / n) * self.chunk_sectors + sector % self.chunk_sectors;
        Some((disk, start.checked_add(on_member)?))
    }
}

/// How a stacked device lays its sectors on the disks below it: md RAID0's striping, or a
/// device-mapper table of linear and striped targets (LVM's volumes), as segments of the
/// stacked device each striped over one or more members (a linear target: one member).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackMap {
    /// Sorted, non-overlapping: (first sector of the stacked device, sectors, the layout there,
    /// its sectors counted from the segment's start).
    pub segments: Vec<(u64, u64, Raid0)>,
}

impl StackMap {
    /// The layout of stacked device `name` ("md0", "dm-3"), from sysfs and, for dm, its table.
    pub fn of(name: &str) -> Result<Self, String> {
        if name.starts_with("dm-") {
            let dm_name = read_trimmed(&Path::new("/sys/block").join(name).join("dm/name"))?;
            Self::of_dm_table(Path::new("/"), name, &crate::dm::table(&dm_name)?)
        } else {
            Raid0::of_md(name).map(|raid0| Self {
                segments: vec![(0, u64::MAX, raid0)],
            })
        }
    }

    /// The layout of a dm table's targets; only linear and striped ones are followed.
    fn of_dm_table(root: &Path, name: &str, table: &[crate::dm::DmTarget]) -> Result<Self, String> {
        let member = |dev: &str, offset: &str| -> Result<((u32, u32), u64), String> {
            let (maj, min) = parse_devnum(dev)
                .ok_or_else(|| format!("{name}: {dev:?} is not a MAJ:MIN device"))?;
            let offset: u64 = offset
                .parse()
                .map_err(|e| format!("{name}: offset {offset:?}: {e}"))?;
            let (disk, start) = disk_and_start(root, maj, min)?;
            Ok((disk, start + offset))
        };
        let mut segments = Vec::new();
        for t in table {
            let p: Vec<&str> = t.params.split_whitespace().collect();
            let layout = match (t.kind.as_str(), p.as_slice()) {
                ("linear", [dev, offset]) => Raid0 {
                    chunk_sectors: t.length.max(1),
                    members: vec![member(dev, offset)?],
                },
                ("striped", [stripes, chunk, rest @ ..]) => {
                    let n: usize = stripes
                        .parse()
                        .map_err(|e| format!("{name}: stripe count {stripes:?}: {e}"))?;
                    let chunk_sectors: u64 = chunk
                        .parse()
                        .map_err(|e| format!("{name}: chunk size {chunk:?}: {e}"))?;
                    if n == 0 || chunk_sectors == 0 || rest.len() != 2 * n {
                        return Err(format!(
                            "{name}: striped target {:?} not understood",
                            t.params
                        ));
                    }
                    Raid0 {
                        chunk_sectors,
                        members: rest
                            .chunks(2)
                            .map(|m| member(m[0], m[1]))
                            .collect::<Result<_, _>>()?,
                    }
                }
                (kind, _) => {
                    return Err(format!(
                        "{name} has a dm {kind} target: only linear and striped ones are mapped"
                    ))
                }
            };
            segments.push((t.start, t.length, layout));
        }
        segments.sort_by_key(|s| s.0);
        Ok(Self { segments })
    }

    /// The member disk and sector holding `sector` of the stacked device.
    pub fn locate(&self, sector: u64) -> Option<((u32, u32), u64)> {
        let i = self
            .segments
            .partition_point(|s| s.0 <= sector)
            .checked_sub(1)?;
        let (start, length, layout) = &self.segments[i];
        let within = sector - start;
        (within < *length).then(|| layout.locate(within))?
    }
}

fn read_trimmed(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| one_line(&format!("{}: {e}", path.display())))
}

fn parse_devnum(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

// ---- FIEMAP (linux/fiemap.h) ----

/// `struct fiemap` without its flexible array of extents.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct FiemapHeader {
    fm_start: u64,
    fm_length: u64,
    fm_flags: u32,
    fm_mapped_extents: u32,
    fm_extent_count: u32,
    fm_reserved: u32,
}

/// `struct fiemap_extent`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct FiemapExtent {
    fe_logical: u64,
    fe_physical: u64,
    fe_length: u64,
    fe_reserved64: [u64; 2],
    fe_flags: u32,
    fe_reserved: [u32; 3],
}

/// Extents asked for per ioctl call.
const BATCH: usize = 512;

/// A `struct fiemap` with room for `BATCH` extents, laid out as the kernel expects.
#[repr(C)]
#[derive(Debug)]
struct FiemapRequest {
    header: FiemapHeader,
    extents: [FiemapExtent; BATCH],
}

const _: () = assert!(std::mem::size_of::<FiemapHeader>() == 32);
const _: () = assert!(std::mem::size_of::<FiemapExtent>() == 56);
const _: () = assert!(std::mem::offset_of!(FiemapRequest, extents) == 32);

/// `FS_IOC_FIEMAP = _IOWR('f', 11, struct fiemap)`; the size is the header's (flexible array).
const FS_IOC_FIEMAP: libc::Ioctl = libc::_IOWR::<FiemapHeader>(b'f' as u32, 11);

const FIEMAP_FLAG_SYNC: u32 = 0x0001;

const FIEMAP_EXTENT_LAST: u32 = 0x0001;
const FIEMAP_EXTENT_UNKNOWN: u32 = 0x0002;
const FIEMAP_EXTENT_DELALLOC: u32 = 0x0004;
const FIEMAP_EXTENT_ENCODED: u32 = 0x0008;
const FIEMAP_EXTENT_DATA_ENCRYPTED: u32 = 0x0080;
const FIEMAP_EXTENT_NOT_ALIGNED: u32 = 0x0100;
const FIEMAP_EXTENT_DATA_INLINE: u32 = 0x0200;
const FIEMAP_EXTENT_DATA_TAIL: u32 = 0x0400;

/// The flags that make an extent's sectors unknowable, with their names.
const REFUSED: [(u32, &str); 7] = [
    (FIEMAP_EXTENT_UNKNOWN, "UNKNOWN"),
    (FIEMAP_EXTENT_DELALLOC, "DELALLOC"),
    (FIEMAP_EXTENT_ENCODED, "ENCODED"),
    (FIEMAP_EXTENT_DATA_ENCRYPTED, "DATA_ENCRYPTED"),
    (FIEMAP_EXTENT_NOT_ALIGNED, "NOT_ALIGNED"),
    (FIEMAP_EXTENT_DATA_INLINE, "DATA_INLINE"),
    (FIEMAP_EXTENT_DATA_TAIL, "DATA_TAIL"),
];

/// The names of the refused flags set in `flags`, joined with `|`, if any.
fn refused_flags(flags: u32) -> Option<String> {
    let names: Vec<&str> = REFUSED
        .iter()
        .filter(|(bit, _)| flags & bit != 0)
        .map(|&(_, name)| name)
        .collect();
    (!names.is_empty()).then(|| names.join("|"))
}

/// The raw FIEMAP extents overlapping `[0, span)`, in logical order.
fn fiemap(file: &File, span: u64) -> Result<Vec<FiemapExtent>, String> {
    let mut out = Vec::new();
    if span == 0 {
        return Ok(out); // the kernel refuses a zero-length range
    }
    let mut req = Box::new(FiemapRequest {
        header: FiemapHeader::default(),
        extents: [FiemapExtent::default(); BATCH],
    });
    let fd = file.as_raw_fd();
    let mut start = 0u64;
    while start < span {
        req.header = FiemapHeader {
            fm_start: start,
            fm_length: span - start,
            fm_flags: FIEMAP_FLAG_SYNC,
            fm_mapped_extents: 0,
            fm_extent_count: BATCH as u32,
            fm_reserved: 0,
        };
        let ptr: *mut FiemapRequest = &mut *req;
        // SAFETY: fd is open for the lifetime of `file`; ptr points to a live, exclusively
        // borrowed, repr(C) struct fiemap followed by room for fm_extent_count (= BATCH) extents,
        // which is all the kernel reads or writes.
        let rc = unsafe { libc::ioctl(fd, FS_IOC_FIEMAP, ptr) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                continue; // same request again
            }
            return Err(match err.raw_os_error() {
                Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) => format!("{NO_FIEMAP} ({err})"),
                Some(libc::EBADR) => format!(
                    "the filesystem refuses FIEMAP flags {:#x} ({err})",
                    req.header.fm_flags
                ),
                _ => one_line(&format!("FIEMAP failed: {err}")),
            });
        }
        let mapped = (req.header.fm_mapped_extents as usize).min(BATCH);
        if mapped == 0 {
            break; // the rest of the range is a hole
        }
        let batch = &req.extents[..mapped];
        out.extend_from_slice(batch);
        let next = batch
            .iter()
            .map(|e| e.fe_logical.saturating_add(e.fe_length))
            .max()
            .unwrap_or(start);
        if batch.iter().any(|e| e.fe_flags & FIEMAP_EXTENT_LAST != 0) || mapped < BATCH {
            break; // the last extent of the file, or every extent in the range fit
        }
        if next <= start {
            return Err(format!(
                "FIEMAP made no progress past byte {start} (a filesystem bug?)"
            ));
        }
        start = next;
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::disallowed_macros)] // skips and findings, on the harness's stderr
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::{FileExt, OpenOptionsExt};

    #[test]
    fn extents_sector_of_hand_built_map() {
        let map = ExtentMap {
            disk: (254, 0),
            extents: vec![
                (0, 2048, 8192),           // bytes 0..8192 at sector 2048
                (8192, 100_000, 4096),     // contiguous in the file, elsewhere on disk
                (65536, 500, 1 << 20),     // after a hole 12288..65536
                (2 << 20, u64::MAX, 4096), // a sector number that would overflow past its start
            ],
        };
        assert_eq!(map.sector_of(0), Some(2048));
        assert_eq!(map.sector_of(511), Some(2048));
        assert_eq!(map.sector_of(512), Some(2049));
        assert_eq!(map.sector_of(8191), Some(2048 + 15));
        assert_eq!(map.sector_of(8192), Some(100_000));
        assert_eq!(map.sector_of(12287), Some(100_007));
        assert_eq!(map.sector_of(12288), None); // hole
        assert_eq!(map.sector_of(40000), None); // hole
        assert_eq!(map.sector_of(65536), Some(500));
        assert_eq!(map.sector_of(65536 + 1024 + 3), Some(502));
        assert_eq!(map.sector_of(65536 + (1 << 20) - 1), Some(500 + 2047));
        assert_eq!(map.sector_of(65536 + (1 << 20)), None); // hole
        assert_eq!(map.sector_of(2 << 20), Some(u64::MAX));
        assert_eq!(map.sector_of((2 << 20) + 512), None); // overflow: None, not a panic
        assert_eq!(map.sector_of((2 << 20) + 4096), None); // beyond the end
        assert_eq!(map.sector_of(u64::MAX), None);

        let empty = ExtentMap {
            disk: (8, 0),
            extents: vec![],
        };
        assert_eq!(empty.sector_of(0), None);

        // An extent whose end passes 2^64 must not panic either.
        let huge = ExtentMap {
            disk: (8, 0),
            extents: vec![(u64::MAX - 10, 7, 100)],
        };
        assert_eq!(huge.sector_of(u64::MAX), Some(7));
        assert_eq!(huge.sector_of(5), None);
    }

    #[test]
    fn extents_refused_flags_named() {
        assert_eq!(refused_flags(0), None);
        assert_eq!(refused_flags(FIEMAP_EXTENT_LAST | 0x0800 | 0x2000), None); // LAST, UNWRITTEN, SHARED
        assert_eq!(
            refused_flags(FIEMAP_EXTENT_UNKNOWN | FIEMAP_EXTENT_DELALLOC).as_deref(),
            Some("UNKNOWN|DELALLOC")
        );
        assert_eq!(
            refused_flags(FIEMAP_EXTENT_NOT_ALIGNED | FIEMAP_EXTENT_DATA_INLINE).as_deref(),
            Some("NOT_ALIGNED|DATA_INLINE")
        );
    }

    #[test]
    fn extents_ioctl_number_matches_the_uapi_header() {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64", target_arch = "x86"))]
        assert_eq!(FS_IOC_FIEMAP as u32, 0xC020_660B);
    }

    /// A fake /sys: a disk vda (254:0) with a partition vda1 (254:1) starting at sector 2048,
    /// and a dm device (253:0) with no parent disk.
    #[test]
    fn extents_disk_and_start_from_a_fake_sysfs() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let vda = r.join("sys/devices/pci0000:00/virtio1/block/vda");
        std::fs::create_dir_all(vda.join("vda1")).unwrap();
        std::fs::write(vda.join("dev"), "254:0\n").unwrap();
        std::fs::write(vda.join("vda1/dev"), "254:1\n").unwrap();
        std::fs::write(vda.join("vda1/start"), "2048\n").unwrap();
        std::fs::write(vda.join("vda1/partition"), "1\n").unwrap();
        let dm = r.join("sys/devices/virtual/block/dm-0");
        std::fs::create_dir_all(&dm).unwrap();
        std::fs::write(dm.join("dev"), "253:0\n").unwrap();
        let links = r.join("sys/dev/block");
        std::fs::create_dir_all(&links).unwrap();
        for (num, target) in [
            ("254:0", "../../devices/pci0000:00/virtio1/block/vda"),
            ("254:1", "../../devices/pci0000:00/virtio1/block/vda/vda1"),
            ("253:0", "../../devices/virtual/block/dm-0"),
        ] {
            std::os::unix::fs::symlink(target, links.join(num)).unwrap();
        }
        assert_eq!(disk_and_start(r, 254, 0), Ok(((254, 0), 0)));
        assert_eq!(disk_and_start(r, 254, 1), Ok(((254, 0), 2048)));
        assert_eq!(disk_and_start(r, 253, 0), Ok(((253, 0), 0)));
        let err = disk_and_start(r, 8, 3).unwrap_err();
        assert!(err.contains("8:3") && !err.contains('\n'), "{err}");
        std::fs::write(vda.join("vda1/start"), "nope\n").unwrap();
        assert!(disk_and_start(r, 254, 1).is_err());
    }

    /// The file's st_dev: its major:minor.
    fn st_dev(file: &File) -> (u32, u32) {
        split_dev(file.metadata().unwrap().dev())
    }

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    /// A block device node for `maj:min`: /dev/block/MAJ:MIN, else /dev/NAME from sysfs's uevent.
    fn find_node(maj: u32, min: u32) -> Option<PathBuf> {
        let mut candidates = vec![PathBuf::from(format!("/dev/block/{maj}:{min}"))];
        if let Ok(uevent) = std::fs::read_to_string(format!("/sys/dev/block/{maj}:{min}/uevent")) {
            if let Some(name) = uevent.lines().find_map(|l| l.strip_prefix("DEVNAME=")) {
                candidates.push(PathBuf::from("/dev").join(name));
            }
        }
        candidates.into_iter().find(|p| {
            std::fs::metadata(p)
                .is_ok_and(|m| m.file_type().is_block_device() && split_dev(m.rdev()) == (maj, min))
        })
    }

    /// True (after printing why) when the error means this machine cannot map files at all.
    fn skip_reason(err: &str) -> bool {
        if err.starts_with(NOT_ON_BLOCK) || err.starts_with(NO_FIEMAP) {
            eprintln!("skipped: /var/tmp cannot be mapped here: {err}");
            return true;
        }
        false
    }

    #[test]
    fn extents_map_a_real_file_and_read_it_back_from_the_disk() {
        const SIZE: usize = 1 << 20;
        let mut file = match tempfile::tempfile_in("/var/tmp") {
            Ok(f) => f,
            Err(e) => {
                eprintln!("skipped: no temp file in /var/tmp: {e}");
                return;
            }
        };
        // A pattern unique to this run: each 4 KiB block names its offset and a nonce.
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            ^ u64::from(std::process::id());
        let mut data = vec![0u8; SIZE];
        for (i, chunk) in data.chunks_mut(8).enumerate() {
            let word =
                nonce.rotate_left((i % 64) as u32) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        file.write_all(&data).unwrap();
        file.sync_all().unwrap();

        let map = match ExtentMap::of_file(&file, SIZE as u64) {
            Ok(m) => m,
            Err(e) if skip_reason(&e) => return,
            Err(e) => panic!("mapping a 1 MiB file in /var/tmp: {e}"),
        };
        let dev = st_dev(&file);
        eprintln!(
            "file st_dev {}:{} -> disk {}:{}, {} extent(s): {:?}",
            dev.0,
            dev.1,
            map.disk.0,
            map.disk.1,
            map.extents.len(),
            map.extents
        );

        // Sorted, non-overlapping, within the span, and covering all of it (no holes written).
        let mut covered = 0u64;
        let mut prev_end = 0u64;
        for &(logical, _, len) in &map.extents {
            assert!(len > 0);
            assert!(logical >= prev_end, "overlap or disorder at {logical}");
            prev_end = logical + len;
            covered += len;
        }
        assert!(prev_end <= SIZE as u64);
        assert_eq!(covered, SIZE as u64, "the map should cover the whole 1 MiB");
        for off in [0u64, 4095, 4096, (SIZE / 2) as u64, SIZE as u64 - 1] {
            assert!(map.sector_of(off).is_some(), "offset {off} not mapped");
        }
        assert_eq!(map.sector_of(SIZE as u64), None);

        // The disk is the whole disk of st_dev.
        let sys = Path::new("/sys/dev/block");
        let is_partition = sys.join(format!("{}:{}/start", dev.0, dev.1)).exists();
        if is_partition {
            assert_ne!(
                map.disk, dev,
                "st_dev is a partition: the disk must be its parent"
            );
        } else {
            assert_eq!(map.disk, dev, "st_dev is a whole disk: the disk is st_dev");
        }
        let disk_dir = sys.join(format!("{}:{}", map.disk.0, map.disk.1));
        assert!(disk_dir.exists(), "{} missing", disk_dir.display());
        assert!(
            !disk_dir.join("start").exists(),
            "the disk is itself a partition"
        );

        // As root, read the sectors back from the disk with O_DIRECT (bypassing any cache).
        if !is_root() {
            eprintln!("disk read-back skipped: not root");
            return;
        }
        let Some(node) = find_node(map.disk.0, map.disk.1) else {
            eprintln!(
                "disk read-back skipped: no node for {}:{}",
                map.disk.0, map.disk.1
            );
            return;
        };
        let disk = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&node)
        {
            Ok(d) => d,
            Err(e) => {
                eprintln!("disk read-back skipped: {}: {e}", node.display());
                return;
            }
        };
        let mut raw = vec![0u8; 3 * 4096];
        let at = raw.as_ptr().align_offset(4096);
        let buf = &mut raw[at..at + 4096];
        let mut offsets: Vec<u64> = vec![0, 4096, (SIZE / 2) as u64, (SIZE - 4096) as u64];
        offsets.extend(map.extents.iter().map(|&(l, _, _)| l & !4095));
        for off in offsets {
            let sector = map.sector_of(off).unwrap();
            // Compare only what this extent holds physically contiguously (a filesystem with
            // blocks smaller than 4 KiB may end an extent inside the 4 KiB read).
            let &(l, _, n) = map
                .extents
                .iter()
                .find(|&&(l, _, n)| l <= off && off < l + n)
                .unwrap();
            let len = 4096.min(l + n - off) as usize;
            disk.read_exact_at(buf, sector * 512).unwrap();
            let want = &data[off as usize..off as usize + len];
            assert!(
                &buf[..len] == want,
                "file offset {off}: the disk's sector {sector} on {} does not hold the file's bytes",
                node.display()
            );
        }
        eprintln!(
            "disk read-back via {} (O_DIRECT): bytes match",
            node.display()
        );
    }

    #[test]
    fn extents_sparse_file_leaves_holes_out() {
        let file = match tempfile::tempfile_in("/var/tmp") {
            Ok(f) => f,
            Err(e) => {
                eprintln!("skipped: no temp file in /var/tmp: {e}");
                return;
            }
        };
        let block = vec![0xA5u8; 65536];
        file.write_all_at(&block, 0).unwrap();
        file.write_all_at(&block, 1 << 20).unwrap();
        file.sync_all().unwrap();
        let span = (2 << 20) as u64;
        let map = match ExtentMap::of_file(&file, span) {
            Ok(m) => m,
            Err(e) if skip_reason(&e) => return,
            Err(e) => panic!("mapping a sparse file: {e}"),
        };
        assert!(map.sector_of(0).is_some());
        assert!(map.sector_of(65535).is_some());
        assert_eq!(
            map.sector_of(512 << 10),
            None,
            "the hole at 512 KiB is mapped"
        );
        assert!(map.sector_of(1 << 20).is_some());
        assert!(map.extents.iter().all(|&(l, _, n)| l + n <= span));

        // A span inside the first extent: one extent, cut at the span.
        let small = ExtentMap::of_file(&file, 1000).unwrap();
        assert_eq!(small.extents.len(), 1);
        assert_eq!((small.extents[0].0, small.extents[0].2), (0, 1000));
        assert_eq!(small.extents[0].1, map.extents[0].1);

        // More extents than one FIEMAP batch: 4 KiB of data every 8 KiB.
        let many = BATCH as u64 * 2 + 100;
        for i in 0..many {
            file.write_all_at(&block[..4096], (4 << 20) + i * 8192)
                .unwrap();
        }
        file.sync_all().unwrap();
        let span = (4 << 20) + many * 8192;
        let map = ExtentMap::of_file(&file, span).unwrap();
        let tail: Vec<_> = map.extents.iter().filter(|e| e.0 >= 4 << 20).collect();
        eprintln!(
            "sparse file: {} extents in all, {} past 4 MiB (written: {many})",
            map.extents.len(),
            tail.len()
        );
        assert!(map.extents.windows(2).all(|w| w[0].0 + w[0].2 <= w[1].0));
        for i in 0..many {
            let off = (4 << 20) + i * 8192;
            assert!(
                map.sector_of(off).is_some(),
                "block {i} at {off} not mapped"
            );
            assert!(map.sector_of(off + 4095).is_some());
        }
        // With a filesystem block of 4 KiB or less, every gap between the blocks is a hole.
        if tail.len() as u64 == many {
            assert!((0..many).all(|i| map.sector_of((4 << 20) + i * 8192 + 4096).is_none()));
        }

        // An empty span: the disk, no extents.
        let none = ExtentMap::of_file(&file, 0).unwrap();
        assert_eq!((none.disk, none.extents.len()), (map.disk, 0));
    }

    #[test]
    fn extents_refuse_what_cannot_be_mapped() {
        // A character device.
        let null = File::open("/dev/null").unwrap();
        let err = ExtentMap::of_file(&null, 4096).unwrap_err();
        assert!(!err.contains('\n'), "{err}");
        // A directory.
        let dir = File::open("/var/tmp").unwrap();
        assert!(ExtentMap::of_file(&dir, 4096).is_err());
        // A file on tmpfs (anonymous st_dev), when /dev/shm is one.
        if let Ok(mut shm) = tempfile::tempfile_in("/dev/shm") {
            shm.write_all(&[1u8; 8192]).unwrap();
            if st_dev(&shm).0 == 0 {
                let err = ExtentMap::of_file(&shm, 8192).unwrap_err();
                assert!(
                    err.starts_with(NOT_ON_BLOCK) && !err.contains('\n'),
                    "{err}"
                );
                eprintln!("tmpfs refused: {err}");
            }
        }
    }

    /// A block device node (opened read-only, never written): one extent at the partition start.
    #[test]
    fn extents_block_device_node() {
        let probe = match tempfile::tempfile_in("/var/tmp") {
            Ok(f) => f,
            Err(_) => return,
        };
        let dev = st_dev(&probe);
        if dev.0 == 0 {
            eprintln!("skipped: /var/tmp is not on a block device");
            return;
        }
        let Some(node) = find_node(dev.0, dev.1) else {
            eprintln!("skipped: no device node for {}:{}", dev.0, dev.1);
            return;
        };
        let bdev = match File::open(&node) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("skipped: {}: {e}", node.display());
                return;
            }
        };
        let map = ExtentMap::of_file(&bdev, 1 << 20).unwrap();
        let start_file = format!("/sys/dev/block/{}:{}/start", dev.0, dev.1);
        let start = std::fs::read_to_string(&start_file)
            .map(|s| s.trim().parse::<u64>().unwrap())
            .unwrap_or(0);
        assert_eq!(map.extents, vec![(0, start, 1 << 20)]);
        assert_eq!(map.sector_of(4096), Some(start + 8));
        if start == 0 {
            assert_eq!(map.disk, dev);
        } else {
            assert_ne!(map.disk, dev);
        }
        eprintln!(
            "{} ({}:{}) -> disk {}:{}, start sector {start}",
            node.display(),
            dev.0,
            dev.1,
            map.disk.0,
            map.disk.1
        );
    }

    /// `struct loop_info64` (linux/loop.h).
    #[repr(C)]
    struct LoopInfo64 {
        lo_device: u64,
        lo_inode: u64,
        lo_rdevice: u64,
        lo_offset: u64,
        lo_sizelimit: u64,
        lo_number: u32,
        lo_encrypt_type: u32,
        lo_encrypt_key_size: u32,
        lo_flags: u32,
        lo_file_name: [u8; 64],
        lo_crypt_name: [u8; 64],
        lo_encrypt_key: [u8; 32],
        lo_init: [u64; 2],
    }

    /// `struct loop_config` (linux/loop.h).
    #[repr(C)]
    struct LoopConfig {
        fd: u32,
        block_size: u32,
        info: LoopInfo64,
        reserved: [u64; 8],
    }

    const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);

    const LOOP_CTL_GET_FREE: libc::Ioctl = 0x4C82;
    const LOOP_CONFIGURE: libc::Ioctl = 0x4C0A;
    const LO_FLAGS_AUTOCLEAR: u32 = 4;
    const LO_FLAGS_PARTSCAN: u32 = 8;

    /// Attaches `backing` to a free loop device with partition scanning and autoclear (the
    /// device detaches itself when its last descriptor closes, even if the test panics).
    /// Returns the loop device, open read-write, and its number.
    fn attach_loop(backing: &File) -> Result<(File, u32), String> {
        let ctl = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/loop-control")
            .map_err(|e| format!("/dev/loop-control: {e}"))?;
        for _ in 0..5 {
            // SAFETY: LOOP_CTL_GET_FREE takes no argument; ctl is an open descriptor.
            let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
            if n < 0 {
                return Err(format!(
                    "LOOP_CTL_GET_FREE: {}",
                    std::io::Error::last_os_error()
                ));
            }
            let path = format!("/dev/loop{n}");
            let dev = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| format!("{path}: {e}"))?;
            let cfg = LoopConfig {
                fd: backing.as_raw_fd() as u32,
                block_size: 0,
                info: LoopInfo64 {
                    lo_device: 0,
                    lo_inode: 0,
                    lo_rdevice: 0,
                    lo_offset: 0,
                    lo_sizelimit: 0,
                    lo_number: 0,
                    lo_encrypt_type: 0,
                    lo_encrypt_key_size: 0,
                    lo_flags: LO_FLAGS_AUTOCLEAR | LO_FLAGS_PARTSCAN,
                    lo_file_name: [0; 64],
                    lo_crypt_name: [0; 64],
                    lo_encrypt_key: [0; 32],
                    lo_init: [0; 2],
                },
                reserved: [0; 8],
            };
            // SAFETY: dev and backing are open descriptors; cfg is a live repr(C) struct
            // loop_config that the kernel only reads.
            let rc =
                unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &cfg as *const LoopConfig) };
            if rc == 0 {
                return Ok((dev, n as u32));
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EBUSY) {
                return Err(format!("LOOP_CONFIGURE {path}: {err}"));
            }
            // Someone else took it between GET_FREE and CONFIGURE: try another.
        }
        Err("no free loop device after 5 tries".into())
    }

    /// `struct blkpg_partition` (linux/blkpg.h).
    #[repr(C)]
    struct BlkpgPartition {
        start: i64,
        length: i64,
        pno: libc::c_int,
        devname: [u8; 64],
        volname: [u8; 64],
    }

    /// `struct blkpg_ioctl_arg` (linux/blkpg.h).
    #[repr(C)]
    struct BlkpgIoctlArg {
        op: libc::c_int,
        flags: libc::c_int,
        datalen: libc::c_int,
        data: *mut BlkpgPartition,
    }

    const BLKPG: libc::Ioctl = 0x1269;
    const BLKPG_ADD_PARTITION: libc::c_int = 1;

    /// Adds partition 1 at `[start, start + sectors)` (512-byte sectors) to the disk `dev` with
    /// BLKPG, which needs no partition-table parser in the kernel.
    fn add_partition(dev: &File, start: u64, sectors: u64) -> Result<(), String> {
        let mut part = BlkpgPartition {
            start: (start * 512) as i64,
            length: (sectors * 512) as i64,
            pno: 1,
            devname: [0; 64],
            volname: [0; 64],
        };
        let arg = BlkpgIoctlArg {
            op: BLKPG_ADD_PARTITION,
            flags: 0,
            datalen: std::mem::size_of::<BlkpgPartition>() as libc::c_int,
            data: &mut part,
        };
        // SAFETY: dev is an open block device; arg and the partition it points to are live
        // repr(C) structs laid out as linux/blkpg.h says, and outlive the call.
        let rc = unsafe { libc::ioctl(dev.as_raw_fd(), BLKPG, &arg as *const BlkpgIoctlArg) };
        if rc != 0 {
            return Err(format!(
                "BLKPG_ADD_PARTITION: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// A loop device over a 4 MiB image with one partition at sector 2048 (added with BLKPG):
    /// the partition's node maps to the loop disk at sector 2048, and the disk holds the
    /// partition's bytes there.
    #[test]
    fn extents_loop_partition() {
        if !is_root() || !Path::new("/dev/loop-control").exists() {
            eprintln!("skipped: needs root and /dev/loop-control");
            return;
        }
        let Ok(backing) = tempfile::tempfile_in("/var/tmp") else {
            eprintln!("skipped: no temp file in /var/tmp");
            return;
        };
        const START: u64 = 2048;
        const SECTORS: u64 = 4096;
        let mut image = vec![0u8; 4 << 20];
        for (i, b) in image[(START * 512) as usize..].iter_mut().enumerate() {
            *b = (i % 251) as u8 ^ 0x5A;
        }
        backing.write_all_at(&image, 0).unwrap();
        backing.sync_all().unwrap();
        let (disk, n) = match attach_loop(&backing) {
            Ok(x) => x,
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        let disk_dev = split_dev(disk.metadata().unwrap().rdev());
        if let Err(e) = add_partition(&disk, START, SECTORS) {
            eprintln!("skipped: {e}");
            return;
        }
        // devtmpfs adds the partition's node shortly after the partition appears.
        let part_path = PathBuf::from(format!("/dev/loop{n}p1"));
        let mut part = Err(std::io::Error::from(std::io::ErrorKind::NotFound));
        for _ in 0..200 {
            part = File::open(&part_path);
            if part.is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let part = match part {
            Ok(f) => f,
            Err(e) => {
                eprintln!("skipped: {}: {e}", part_path.display());
                return;
            }
        };
        let part_dev = split_dev(part.metadata().unwrap().rdev());
        let span = SECTORS * 512;
        let map = ExtentMap::of_file(&part, span).unwrap();
        eprintln!(
            "{} ({}:{}) -> disk {}:{} (/dev/loop{n}), extents {:?}",
            part_path.display(),
            part_dev.0,
            part_dev.1,
            map.disk.0,
            map.disk.1,
            map.extents
        );
        assert_ne!(part_dev, disk_dev);
        assert_eq!(map.disk, disk_dev);
        assert_eq!(map.extents, vec![(0, START, span)]);

        // The whole disk itself: start 0.
        let whole = ExtentMap::of_file(&disk, 4 << 20).unwrap();
        assert_eq!(
            whole,
            ExtentMap {
                disk: disk_dev,
                extents: vec![(0, 0, 4 << 20)]
            }
        );

        // Read the disk at the mapped sectors with O_DIRECT: the partition's bytes are there.
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(format!("/dev/loop{n}"))
            .unwrap();
        let mut raw = vec![0u8; 3 * 4096];
        let at = raw.as_ptr().align_offset(4096);
        let buf = &mut raw[at..at + 4096];
        let mut via_part = vec![0u8; 4096];
        for off in [0u64, 4096, 1 << 20, span - 4096] {
            let sector = map.sector_of(off).unwrap();
            direct.read_exact_at(buf, sector * 512).unwrap();
            part.read_exact_at(&mut via_part, off).unwrap();
            assert!(
                buf == &via_part[..],
                "partition offset {off} vs disk sector {sector}"
            );
            let want = &image[(START * 512 + off) as usize..][..4096];
            assert!(
                buf == want,
                "partition offset {off}: the disk's sector {sector} differs"
            );
        }
        eprintln!("loop disk read-back (O_DIRECT): bytes match");
        drop(part);
        drop(direct);
        drop(disk); // autoclear detaches the loop device
    }

    /// A fake sysfs with md0 striped over nvme1n1 (whole disk) and the partition nvme2n1p1.
    fn fake_md(root: &Path, level: &str, sizes: (&str, &str)) {
        let w = |path: &str, text: &str| {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        w("sys/block/md0/md/level", level);
        w("sys/block/md0/md/chunk_size", "524288\n");
        w("sys/block/md0/md/raid_disks", "2\n");
        w("sys/devices/nvme1n1/dev", "259:1\n");
        w("sys/devices/nvme2n1/dev", "259:2\n");
        w("sys/devices/nvme2n1/nvme2n1p1/dev", "259:3\n");
        w("sys/devices/nvme2n1/nvme2n1p1/start", "2048\n");
        for (k, (member, size)) in [("nvme1n1", sizes.0), ("nvme2n1/nvme2n1p1", sizes.1)]
            .into_iter()
            .enumerate()
        {
            let slot = format!("sys/block/md0/md/dev-{k}");
            w(&format!("{slot}/offset"), "4096\n");
            w(&format!("{slot}/size"), size);
            std::os::unix::fs::symlink(
                root.join("sys/devices").join(member),
                root.join(&slot).join("block"),
            )
            .unwrap();
            std::os::unix::fs::symlink(
                root.join(&slot),
                root.join(format!("sys/block/md0/md/rd{k}")),
            )
            .unwrap();
        }
        std::fs::create_dir_all(root.join("sys/dev/block")).unwrap();
        for (num, dir) in [
            ("259:1", "nvme1n1"),
            ("259:2", "nvme2n1"),
            ("259:3", "nvme2n1/nvme2n1p1"),
        ] {
            std::os::unix::fs::symlink(
                root.join("sys/devices").join(dir),
                root.join("sys/dev/block").join(num),
            )
            .unwrap();
        }
    }

    #[test]
    fn a_raid0_sector_is_followed_to_its_member() {
        let dir = tempfile::tempdir().unwrap();
        fake_md(dir.path(), "raid0\n", ("1000\n", "1000\n"));
        let r = Raid0::of_md_in(dir.path(), "md0").unwrap();
        // 512 KiB chunks = 1024 sectors; data at sector 4096 of nvme1n1, 2048 + 4096 of nvme2n1.
        assert_eq!(r.chunk_sectors, 1024);
        assert_eq!(r.members, vec![((259, 1), 4096), ((259, 2), 6144)]);
        assert_eq!(r.locate(0), Some(((259, 1), 4096)));
        assert_eq!(r.locate(1023), Some(((259, 1), 4096 + 1023)));
        assert_eq!(r.locate(1024), Some(((259, 2), 6144)));
        assert_eq!(r.locate(2048 + 5), Some(((259, 1), 4096 + 1024 + 5)));
        assert_eq!(r.locate(3 * 1024 + 7), Some(((259, 2), 6144 + 1024 + 7)));

        let other = tempfile::tempdir().unwrap();
        fake_md(other.path(), "raid0\n", ("1000\n", "2000\n"));
        let e = Raid0::of_md_in(other.path(), "md0").unwrap_err();
        assert!(e.contains("different sizes"), "{e}");
        let e = Raid0::of_md_in(other.path(), "dm-0").unwrap_err();
        assert!(e.contains("dm-0 is not an md device"), "{e}");
        let mirror = tempfile::tempdir().unwrap();
        fake_md(mirror.path(), "raid1\n", ("1000\n", "1000\n"));
        let e = Raid0::of_md_in(mirror.path(), "md0").unwrap_err();
        assert!(e.contains("md raid1: only RAID0"), "{e}");
    }

    /// An LVM-like table: a linear segment on a partition, then a striped one over two disks;
    /// each sector lands where dm's linear and stripe targets send it.
    #[test]
    fn a_dm_tables_sectors_are_followed_to_its_members() {
        use crate::dm::DmTarget;
        let dir = tempfile::tempdir().unwrap();
        fake_md(dir.path(), "raid0\n", ("1000\n", "1000\n"));
        let target = |start, length, kind: &str, params: &str| DmTarget {
            start,
            length,
            kind: kind.into(),
            params: params.into(),
        };
        let table = [
            target(1000, 4096, "striped", "2 128 259:1 0 259:2 2048"),
            target(0, 1000, "linear", "259:3 100"),
        ];
        let m = StackMap::of_dm_table(dir.path(), "dm-0", &table).unwrap();
        // Linear on nvme2n1p1 (which starts at 2048 of nvme2n1), 100 sectors in.
        assert_eq!(m.locate(0), Some(((259, 2), 2048 + 100)));
        assert_eq!(m.locate(999), Some(((259, 2), 2048 + 100 + 999)));
        // Striped in 128-sector chunks from sector 1000: chunk 0 on nvme1n1, chunk 1 on
        // nvme2n1 from 2048, chunk 2 back on nvme1n1 one chunk down.
        assert_eq!(m.locate(1000), Some(((259, 1), 0)));
        assert_eq!(m.locate(1000 + 130), Some(((259, 2), 2048 + 2)));
        assert_eq!(m.locate(1000 + 256 + 5), Some(((259, 1), 128 + 5)));
        // Past the table: not mapped.
        assert_eq!(m.locate(1000 + 4096), None);
        let e =
            StackMap::of_dm_table(dir.path(), "dm-0", &[target(0, 8, "crypt", "x")]).unwrap_err();
        assert!(
            e.contains("dm crypt target: only linear and striped"),
            "{e}"
        );
        let e = StackMap::of_dm_table(
            dir.path(),
            "dm-0",
            &[target(0, 8, "striped", "2 128 259:1 0")],
        )
        .unwrap_err();
        assert!(e.contains("not understood"), "{e}");
    }
}
