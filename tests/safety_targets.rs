//! Targets are checked on what is opened: end-to-end runs against a real ext4 filesystem
//! mounted on a loop device, which each test proves intact afterwards (fsck and a canary file).
//! Root only (loop devices, mounts); a skip elsewhere, a failure under CI.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::root_allowed;

fn scratch() -> tempfile::TempDir {
    common::scratch("vg-target-")
}

fn vg() -> Command {
    Command::new(env!("CARGO_BIN_EXE_virtgap"))
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

const CANARY: &str = "this filesystem must survive";

/// An ext4 filesystem on a loop device over `dir/fs.img`, mounted on `dir/mnt` with a canary
/// file. Unmounted and detached on drop.
struct MountedImage {
    image: PathBuf,
    device: String,
    mountpoint: PathBuf,
}

impl MountedImage {
    fn new(dir: &Path) -> Result<Self, String> {
        let image = dir.join("fs.img");
        std::fs::write(&image, vec![0u8; 32 << 20]).map_err(|e| e.to_string())?;
        let device = run(Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&image))?;
        let this = Self {
            image,
            device,
            mountpoint: dir.join("mnt"),
        };
        run(Command::new("mkfs.ext4").args(["-q", "-F", &this.device]))?;
        std::fs::create_dir(&this.mountpoint).map_err(|e| e.to_string())?;
        run(Command::new("mount")
            .arg(&this.device)
            .arg(&this.mountpoint))?;
        std::fs::write(this.mountpoint.join("canary"), CANARY).map_err(|e| e.to_string())?;
        run(&mut Command::new("sync"))?;
        Ok(this)
    }

    /// Unmounts, checks the filesystem read-only, and reads the canary back.
    fn assert_intact(&self) {
        run(Command::new("umount").arg(&self.mountpoint)).unwrap();
        let fsck = Command::new("e2fsck")
            .args(["-f", "-n", &self.device])
            .output()
            .unwrap();
        assert!(
            fsck.status.success(),
            "the mounted filesystem was damaged: {}{}",
            String::from_utf8_lossy(&fsck.stdout),
            String::from_utf8_lossy(&fsck.stderr)
        );
        run(Command::new("mount")
            .args(["-o", "ro"])
            .arg(&self.device)
            .arg(&self.mountpoint))
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(self.mountpoint.join("canary")).unwrap(),
            CANARY
        );
    }
}

impl Drop for MountedImage {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mountpoint).status();
        let _ = Command::new("losetup")
            .args(["--detach", &self.device])
            .status();
    }
}

/// A loop device over `backing` (a file or a device), detached on drop.
struct Loop(String);

impl Loop {
    fn over(backing: &Path) -> Result<Self, String> {
        run(Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing))
        .map(Self)
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["--detach", &self.0]).status();
    }
}

/// A quick write run (no probes, a few MiB, one second) on `target` with `consent`.
fn write_run(target: &str, consent: &str) -> Command {
    write_run_for(target, consent, "1s")
}

fn write_run_for(target: &str, consent: &str, duration: &str) -> Command {
    let mut c = vg();
    c.args([
        "record",
        "--quiet",
        "--no-probes",
        "-w",
        "rand4k-write",
        "--size",
        "4MiB",
        "--duration",
        duration,
        "--ramp",
        "0s",
        "--target",
        target,
        "--destroy-data",
        consent,
    ]);
    c
}

fn refused(cmd: &mut Command, needle: &str) {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected a refusal; stderr: {stderr}"
    );
    assert!(stderr.contains(needle), "stderr lacks {needle:?}: {stderr}");
    assert_eq!(
        stderr.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "one line: {stderr}"
    );
}

fn setup(what: &str) -> Option<(tempfile::TempDir, MountedImage)> {
    if !root_allowed(what) {
        return None;
    }
    let dir = scratch();
    let image = virtgap_testkit::ready(what, MountedImage::new(dir.path()))?;
    Some((dir, image))
}

#[test]
fn a_loop_device_over_a_mounted_loop_device_is_refused() {
    let Some((_dir, fs)) = setup("loop over a mounted loop device") else {
        return;
    };
    let above = Loop::over(Path::new(&fs.device)).unwrap();
    refused(
        &mut write_run(&above.0, &fs.device),
        &format!("{} is mounted on", fs.device),
    );
    fs.assert_intact();
}

#[test]
fn the_image_behind_a_mounted_loop_device_is_refused_as_a_target() {
    let Some((_dir, fs)) = setup("image behind a mounted loop device") else {
        return;
    };
    let image = fs.image.display().to_string();
    refused(&mut write_run(&image, &image), "is mounted on");
    // And through a second loop device over the same image.
    let second = Loop::over(&fs.image).unwrap();
    refused(&mut write_run(&second.0, &image), "is mounted on");
    fs.assert_intact();
}

/// The target is swapped for a symbolic link to the mounted device while virtgap looks at it:
/// every access to the path is held 1.5 s by strace (`-P` limits the delay to that path), and
/// the swap lands inside the first hold. Before targets were checked on what was opened, this
/// wrote two seconds of random 4 KiB blocks over the filesystem.
#[test]
fn a_target_swapped_for_a_mounted_device_while_being_opened_is_never_written() {
    let Some((dir, fs)) = setup("target swapped while being opened") else {
        return;
    };
    if !virtgap_testkit::require(
        "strace (to hold the target's path open)",
        run(Command::new("strace").arg("-V")).map(drop),
    ) {
        return;
    }
    let path = dir.path().join("t.img");
    std::fs::write(&path, vec![0u8; 8 << 20]).unwrap();
    let shown = path.display().to_string();
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-qq", "-o", "/dev/null", "-P", &shown])
        .arg("-e")
        .arg("inject=statx,newfstatat,openat,openat2:delay_exit=1500000")
        .arg(env!("CARGO_BIN_EXE_virtgap"));
    let args: Vec<String> = write_run(&shown, &shown)
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let child = cmd
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let link = dir.path().join("t.link");
    std::os::unix::fs::symlink(&fs.device, &link).unwrap();
    std::fs::rename(&link, &path).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Refused (the path changed, or the device is mounted), or it wrote the file it opened.
    if out.status.success() {
        assert!(
            std::fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink(),
            "{stderr}"
        );
    }
    fs.assert_intact();
}

#[test]
fn two_writers_on_one_file_are_refused() {
    let dir = scratch();
    let path = dir.path().join("t.img");
    std::fs::write(&path, vec![0u8; 8 << 20]).unwrap();
    let shown = path.display().to_string();
    let first = write_run_for(&shown, &shown, "4s")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    refused(
        &mut write_run(&shown, &shown),
        "is in use by another virtgap run",
    );
    let out = first.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A temp file on ramfs is memory with no size limit: under a 256 MiB memory cgroup a 512 MiB
/// one is refused up front (before, it was filled until the cgroup's OOM killer ended the run
/// with nothing said; on the host's own memory, until the global one did).
#[test]
fn a_ramfs_temp_file_is_counted_against_memory() {
    if !root_allowed("a temp file on ramfs") {
        return;
    }
    let Some(group) = virtgap_testkit::ready(
        "a 256 MiB memory cgroup",
        common::MemoryCgroup::new(256 << 20),
    ) else {
        return;
    };
    let dir = scratch();
    let ram = dir.path().join("ram");
    std::fs::create_dir(&ram).unwrap();
    run(Command::new("mount")
        .args(["-t", "ramfs", "ramfs"])
        .arg(&ram))
    .unwrap();
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _mounted = Unmount(ram.clone());
    let mut cmd = group.command(env!("CARGO_BIN_EXE_virtgap"));
    cmd.args([
        "record",
        "--quiet",
        "--no-probes",
        "--buffered",
        "--size",
        "512MiB",
        "--duration",
        "1s",
        "--dir",
    ])
    .arg(&ram);
    refused(&mut cmd, "is ramfs, which keeps files in memory");
    assert_eq!(std::fs::read_dir(&ram).unwrap().count(), 0);
}
