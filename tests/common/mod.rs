//! Helpers shared by the end-to-end tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::{Duration, Instant};

/// Numbers the memory cgroups one test binary makes.
static NEXT_CGROUP: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

pub mod slow_device;

/// A scratch directory on the build tree's disk-backed filesystem (O_DIRECT works there).
pub fn scratch(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Root-only tests: in CI (`CI` set) not being root is a failure, elsewhere a recorded skip.
pub fn root_allowed(what: &str) -> bool {
    virtgap_testkit::require(what, if is_root() { Ok(()) } else { Err("needs root") })
}

/// A file of `blocks` 4 KiB blocks of data, on disk.
pub fn data_file(dir: &Path, name: &str, blocks: usize) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, vec![0x5a_u8; blocks * 4096]).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    f.sync_all().unwrap();
    path
}

/// A shell that waits for a line on its stdin, then runs `script`: a test attaches to it
/// before it does any I/O.
pub fn held(script: &str) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg(format!("read go && {script}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Starts `cmd` and waits (up to 2 minutes) until a line of its stderr starts with `ready`:
/// the child and the rest of its stderr, for the caller to wait on.
// The child goes back to the caller, which waits for it.
#[allow(clippy::zombie_processes)]
pub fn started(mut cmd: Command, ready: &str) -> (Child, BufReader<ChildStderr>) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        let n = stderr.read_line(&mut line).unwrap_or(0);
        if n == 0 {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ended before saying '{ready}': {seen}");
        }
        seen.push_str(&line);
        if line.starts_with(ready) {
            return (child, stderr);
        }
        assert!(
            Instant::now() < deadline,
            "not '{ready}' after 2 minutes: {seen}"
        );
    }
}

/// The path of `program` on PATH.
pub fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// The file names in `dir`, sorted.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A memory cgroup of `limit` bytes, a child of this process's own, removed on drop.
pub struct MemoryCgroup {
    pub dir: PathBuf,
}

impl MemoryCgroup {
    pub fn new(limit: u64) -> Result<Self, String> {
        let mountinfo =
            std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| e.to_string())?;
        let membership = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        // Where the v2 hierarchy, or the v1 one of the memory controller, is mounted (whole).
        let mount = |v2: bool| {
            mountinfo.lines().find_map(|l| {
                let (head, tail) = l.split_once(" - ")?;
                let head: Vec<&str> = head.split(' ').collect();
                let mut tail = tail.split(' ');
                let (fstype, _, options) = (tail.next()?, tail.next()?, tail.next()?);
                let fits = if v2 {
                    fstype == "cgroup2"
                } else {
                    fstype == "cgroup" && options.split(',').any(|o| o == "memory")
                };
                (fits && head.get(3) == Some(&"/")).then(|| PathBuf::from(head[4]))
            })
        };
        let own = |v2: bool| {
            membership.lines().find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                let fits = if v2 {
                    id == "0" && controllers.is_empty()
                } else {
                    controllers.split(',').any(|c| c == "memory")
                };
                fits.then(|| path.trim_start_matches('/').to_string())
            })
        };
        let name = format!(
            "vg-test-{}-{}",
            std::process::id(),
            NEXT_CGROUP.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let (dir, limit_file) = if let (Some(m), Some(own)) = (mount(false), own(false)) {
            (m.join(own).join(&name), "memory.limit_in_bytes")
        } else if let (Some(m), Some(own)) = (mount(true), own(true)) {
            // A v2 cgroup with processes cannot enable controllers for children: then the group
            // goes beside this process's, under its parent.
            let own = m.join(own);
            let parent = [own.as_path(), own.parent().unwrap_or(&own)]
                .into_iter()
                .find(|dir| {
                    std::fs::read_to_string(dir.join("cgroup.subtree_control"))
                        .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
                })
                .ok_or_else(|| {
                    format!(
                        "the memory controller is not enabled for children of {} or its parent",
                        own.display()
                    )
                })?;
            (parent.join(&name), "memory.max")
        } else {
            return Err("no memory cgroup hierarchy mounted at its root".into());
        };
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let group = Self { dir };
        std::fs::write(group.dir.join(limit_file), limit.to_string())
            .map_err(|e| format!("{limit_file}: {e}"))?;
        Ok(group)
    }
}

impl MemoryCgroup {
    /// `program` run inside the group (a shell moves itself in, then execs it).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c")
            .arg("echo $$ > \"$0\"/cgroup.procs && exec \"$@\"")
            .arg(&self.dir)
            .arg(program);
        cmd
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Empty once its one process has exited.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A port free on 127.0.0.1 now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET `path` from 127.0.0.1:`port` with `accept`: (status line, body). HTTP/1.0, so the
/// server closes the connection after the body.
pub fn get(port: u16, path: &str, accept: &str) -> std::io::Result<(String, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: {accept}\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    ))
}
