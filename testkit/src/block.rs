//! Block devices for tests that need one of a given shape: a partition on a loop device, a
//! loop device over memory, and a cgroup v1 blkio group that throttles reads from a disk. Each
//! undoes itself on drop.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Runs `cmd`, returning its trimmed stdout, or one line saying what failed.
fn run(cmd: &mut Command) -> Result<String, String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| format!("{shown}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{shown}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A loop device over a file of real data (direct I/O, so reads reach the file's disk) with
/// one partition, `p1`, from 1 MiB to the end: a partition's bios pass `block_bio_remap`.
/// Detached on drop (the partition goes with it).
#[derive(Debug)]
pub struct PartitionedLoop {
    /// `/dev/loopN`.
    pub disk: PathBuf,
    /// `/dev/loopNp1`.
    pub partition: PathBuf,
    backing: PathBuf,
}

/// The partition's first sector (512-byte sectors): 1 MiB, as partitioning tools align.
const PARTITION_START: u64 = 2048;

impl PartitionedLoop {
    /// A loop device over `dir/loop.img`, written with `partition_bytes` + 1 MiB of data.
    pub fn new(dir: &Path, partition_bytes: u64) -> Result<Self, String> {
        if !Path::new("/dev/loop-control").exists() {
            return Err("no /dev/loop-control (loop module not loaded?)".into());
        }
        let backing = dir.join("loop.img");
        write_data(&backing, PARTITION_START * 512 + partition_bytes)?;
        let disk = run(Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on", "--partscan"])
            .arg(&backing))?;
        let disk = PathBuf::from(disk);
        let mut this = Self {
            partition: PathBuf::from(format!("{}p1", disk.display())),
            disk,
            backing,
        };
        run(Command::new("addpart").arg(&this.disk).args([
            "1".to_string(),
            PARTITION_START.to_string(),
            (partition_bytes / 512).to_string(),
        ]))?;
        // devtmpfs adds the node shortly after the partition appears.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !this.partition.exists() {
            if Instant::now() > deadline {
                let p = std::mem::take(&mut this.partition);
                return Err(format!("{} did not appear", p.display()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(this)
    }

    /// The loop disk's `major:minor` (what a blkio throttle names).
    pub fn disk_dev(&self) -> String {
        device_number(&self.disk)
    }
}

impl Drop for PartitionedLoop {
    fn drop(&mut self) {
        let _ = run(Command::new("losetup").arg("--detach").arg(&self.disk));
        let _ = std::fs::remove_file(&self.backing);
    }
}

/// A loop device over a file in memory (`/dev/shm`): the loop driver serves it from the page
/// cache, so the device is far from the limit a disk sets. Detached and removed on drop.
#[derive(Debug)]
pub struct MemoryLoop {
    /// `/dev/loopN`.
    pub disk: PathBuf,
    /// The file behind it: the identity `--destroy-data` names.
    pub backing: PathBuf,
}

impl MemoryLoop {
    /// A loop device over `bytes` of data in a new file in /dev/shm.
    pub fn new(bytes: u64) -> Result<Self, String> {
        if !Path::new("/dev/loop-control").exists() {
            return Err("no /dev/loop-control (loop module not loaded?)".into());
        }
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let backing = PathBuf::from(format!(
            "/dev/shm/vg-memloop-{}-{stamp}.img",
            std::process::id()
        ));
        write_data(&backing, bytes)?;
        match run(Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&backing))
        {
            Ok(disk) => Ok(Self {
                disk: PathBuf::from(disk),
                backing,
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&backing);
                Err(e)
            }
        }
    }

    /// The device's `major:minor` (what a blkio throttle names).
    pub fn disk_dev(&self) -> String {
        device_number(&self.disk)
    }
}

impl Drop for MemoryLoop {
    fn drop(&mut self) {
        let _ = run(Command::new("losetup").arg("--detach").arg(&self.disk));
        let _ = std::fs::remove_file(&self.backing);
    }
}

/// A device node's `major:minor`.
fn device_number(node: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata(node).map_or(0, |m| m.rdev());
    format!("{}:{}", libc::major(rdev), libc::minor(rdev))
}

/// Writes `bytes` of non-zero data to `path` and syncs it: holes and unwritten extents would
/// be read as zeros without touching the disk.
fn write_data(path: &Path, bytes: u64) -> Result<(), String> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8 ^ 0x5a).collect();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])
            .map_err(|e| format!("{}: {e}", path.display()))?;
        left -= n as u64;
    }
    f.sync_all().map_err(|e| format!("{}: {e}", path.display()))
}

/// A cgroup v1 blkio group limiting reads from one disk, removed on drop.
#[derive(Debug)]
pub struct BlkioGroup {
    dir: PathBuf,
    /// `major:minor` of the limited disk.
    disk: String,
}

impl BlkioGroup {
    /// A group limiting reads from `disk` (`major:minor`) to `read_iops`; Err where there is
    /// no cgroup v1 blkio controller.
    pub fn new(read_iops: u32, disk: &str) -> Result<Self, String> {
        let root = Path::new("/sys/fs/cgroup/blkio");
        if !root.join("blkio.throttle.read_iops_device").exists() {
            return Err("no cgroup v1 blkio controller".into());
        }
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = root.join(format!("virtgap-test-{}-{stamp}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let group = Self {
            dir,
            disk: disk.to_string(),
        };
        group.set_read_iops(read_iops)?;
        Ok(group)
    }

    /// Sets the group's read limit, in I/Os per second.
    pub fn set_read_iops(&self, read_iops: u32) -> Result<(), String> {
        let file = self.dir.join("blkio.throttle.read_iops_device");
        std::fs::write(&file, format!("{} {read_iops}\n", self.disk))
            .map_err(|e| format!("{}: {e}", file.display()))
    }

    /// A `sh -c` script that moves itself into the group, then runs its arguments.
    pub fn enter_script(&self) -> String {
        let procs = self.dir.join("cgroup.procs");
        format!("echo $$ > {} && exec \"$0\" \"$@\"", procs.display())
    }

    /// Moves the calling thread into the group until the guard drops.
    pub fn enter_thread(&self) -> Result<ThreadInGroup, String> {
        let home = blkio_cgroup_of_thread()?;
        move_thread(&self.dir.join("tasks"))?;
        Ok(ThreadInGroup {
            home,
            _same_thread: std::marker::PhantomData,
        })
    }
}

/// The calling thread's Linux thread id.
fn thread_id() -> Result<String, String> {
    let link =
        std::fs::read_link("/proc/thread-self").map_err(|e| format!("/proc/thread-self: {e}"))?;
    link.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| "/proc/thread-self names no thread".into())
}

/// The `tasks` file of the blkio group the calling thread is in.
fn blkio_cgroup_of_thread() -> Result<PathBuf, String> {
    let text = std::fs::read_to_string("/proc/thread-self/cgroup")
        .map_err(|e| format!("/proc/thread-self/cgroup: {e}"))?;
    let path = text
        .lines()
        .find_map(|l| {
            let mut fields = l.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            controllers.split(',').any(|c| c == "blkio").then_some(path)
        })
        .ok_or("this thread is in no blkio cgroup")?;
    Ok(Path::new("/sys/fs/cgroup/blkio")
        .join(path.trim_start_matches('/'))
        .join("tasks"))
}

fn move_thread(tasks: &Path) -> Result<(), String> {
    std::fs::write(tasks, thread_id()?).map_err(|e| format!("{}: {e}", tasks.display()))
}

/// A thread moved into a [`BlkioGroup`]: back to the group it came from on drop (on the same
/// thread: not `Send`).
#[derive(Debug)]
pub struct ThreadInGroup {
    /// The `tasks` file of the thread's group before.
    home: PathBuf,
    _same_thread: std::marker::PhantomData<*const ()>,
}

impl Drop for ThreadInGroup {
    fn drop(&mut self) {
        if let Err(e) = move_thread(&self.home) {
            // The group cannot be removed while the thread is in it: say why it stays.
            eprintln!("could not move the test thread back to its blkio group: {e}");
        }
    }
}

impl Drop for BlkioGroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}
