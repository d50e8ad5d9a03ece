//! Untrusted inputs and memory, end to end: a workload file or profile that is a device, a
//! FIFO or too large is refused at once in one line; the memory pre-flight honours a memory
//! cgroup's limit; profiles `record` writes are read back however short their run, and profiles
//! no run gives are refused.
//!
//! Every run of the binary has a deadline: a regression that blocks fails its test instead of
//! hanging the suite.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::root_allowed;

/// What a run left: its status and its output.
struct Ran {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Ran {
    /// A failure with exactly one line on stderr containing every one of `needles`.
    fn refused_in_one_line(&self, needles: &[&str]) {
        assert_eq!(self.status.code(), Some(1), "{}", self.stderr);
        assert_eq!(self.stderr.lines().count(), 1, "one line: {}", self.stderr);
        for n in needles {
            assert!(self.stderr.contains(n), "{n:?} not in: {}", self.stderr);
        }
    }
}

fn vg() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_virtgap"));
    c.stdin(Stdio::null());
    c
}

/// Reads a pipe to its end on a thread of its own (a full pipe would stall the child).
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_string(&mut text);
        }
        text
    })
}

/// Waits for `child` until `deadline`, killing it and failing the test past it.
fn finish(mut child: Child, deadline: Duration, what: &str) -> Ran {
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {deadline:?} (blocked?); killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ran {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// Runs `cmd` to its end, within `deadline`.
fn run(cmd: &mut Command, deadline: Duration) -> Ran {
    let what = format!("{cmd:?}");
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finish(child, deadline, &what)
}

/// Refusals of input files come before any work: a few seconds is generous.
const AT_ONCE: Duration = Duration::from_secs(20);

fn scratch() -> tempfile::TempDir {
    common::scratch("vg-inputs-")
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// A profile an earlier virtgap wrote (two runs, every probe).
fn seed_profile() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz-seeds/rand4k-two-runs.json")
}

/// `cmd` with its address space capped at 1 GiB: a regression that reads a device whole fails
/// to allocate instead of taking the host's memory.
fn capped(mut cmd: Command) -> Command {
    use std::os::unix::process::CommandExt;
    let cap = libc::rlimit {
        rlim_cur: 1 << 30,
        rlim_max: 1 << 30,
    };
    // SAFETY: setrlimit is async-signal-safe and `cap` is a copy owned by the closure.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_AS, &cap) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

#[test]
fn a_device_as_the_workload_file_is_refused_unread() {
    // Read whole, /dev/zero took all the host's memory.
    for dev in ["/dev/zero", "/dev/urandom"] {
        for sub in ["record", "tui"] {
            let ran = run(capped(vg()).args([sub, "-w", dev]), AT_ONCE);
            ran.refused_in_one_line(&[
                &format!("cannot read workload file {dev}"),
                "a character device, not a regular file",
            ]);
        }
    }
}

#[test]
fn a_fifo_as_the_workload_file_is_refused_at_once() {
    let dir = scratch();
    let fifo = dir.path().join("w.toml");
    mkfifo(&fifo);
    for sub in ["record", "tui"] {
        let ran = run(vg().arg(sub).arg("-w").arg(&fifo), AT_ONCE);
        ran.refused_in_one_line(&["w.toml: it is a FIFO, not a regular file"]);
    }
}

#[test]
fn a_workload_file_over_a_mebibyte_is_refused_unread() {
    let dir = scratch();
    let big = dir.path().join("big.toml");
    let mut text = String::from("name = \"big\"\n");
    while text.len() <= 1 << 20 {
        text.push_str("# padding padding padding padding padding padding padding padding\n");
    }
    std::fs::write(&big, &text).unwrap();
    let ran = run(vg().arg("record").arg("-w").arg(&big), AT_ONCE);
    ran.refused_in_one_line(&["big.toml", "over the 1 MiB limit"]);
    let binary = dir.path().join("bin.toml");
    std::fs::write(&binary, [0xff, 0xfe, b'\n']).unwrap();
    let ran = run(vg().arg("record").arg("-w").arg(&binary), AT_ONCE);
    ran.refused_in_one_line(&["bin.toml: it is not UTF-8 text"]);
}

#[test]
fn a_fifo_as_a_profile_is_refused_at_once() {
    let dir = scratch();
    let fifo = dir.path().join("b.json");
    mkfifo(&fifo);
    let ran = run(vg().arg("diff").arg(seed_profile()).arg(&fifo), AT_ONCE);
    ran.refused_in_one_line(&["b.json: not a virtgap profile (a FIFO, not a regular file)"]);
    let ran = run(vg().arg("diff").arg(&fifo).arg(seed_profile()), AT_ONCE);
    ran.refused_in_one_line(&["a FIFO, not a regular file"]);
    // The TUI reads its baseline before it looks for a terminal.
    let ran = run(vg().arg("tui").arg("--baseline").arg(&fifo), AT_ONCE);
    ran.refused_in_one_line(&["b.json: not a virtgap profile (a FIFO, not a regular file)"]);
    let ran = run(vg().args(["tui", "--baseline", "/dev/zero"]), AT_ONCE);
    ran.refused_in_one_line(&["a character device, not a regular file"]);
}

/// The seed profile with `edit` applied, written into `dir`.
fn edited(dir: &Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(seed_profile()).unwrap()).unwrap();
    edit(&mut doc);
    let path = dir.join(name);
    std::fs::write(&path, doc.to_string()).unwrap();
    path
}

#[test]
fn profiles_no_virtgap_wrote_are_refused_in_one_line() {
    let dir = scratch();
    let diff = |p: &Path| run(vg().arg("diff").arg(seed_profile()).arg(p), AT_ONCE);
    let v0 = edited(dir.path(), "v0.json", |d| d["schema_version"] = 0.into());
    diff(&v0).refused_in_one_line(&[
        "v0.json: profile schema version 0; this virtgap reads versions 1 to 3",
    ]);
    // A version-3 profile relabelled 2: its device stage would be read as running to completion.
    let v2 = edited(dir.path(), "v2.json", |d| {
        d["stages"]["completion"] = d["stages"]["queue"].clone();
    });
    diff(&v2).refused_in_one_line(&[
        "v2.json: profile schema version 2, but it has stages.completion, which version 3 added",
    ]);
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit, &str); 4] = [
        (
            "negative.json",
            |d| d["stages"]["app"]["sum_ns"] = (-1e20).into(),
            "stages.app: sum_ns -1e20 is not a finite, non-negative number",
        ),
        (
            "huge.json",
            |d| d["stages"]["device"]["sum_ns"] = 1.7e308.into(),
            "stages.device: count 195925 and sum_ns 1.7e308 are beyond any real run",
        ),
        (
            "count.json",
            |d| d["results"]["read"]["lat"]["count"] = 5.into(),
            "results.read.lat: its buckets hold",
        ),
        (
            "inverted.json",
            |d| d["stages"]["queue"]["buckets"][0][0] = 1_000_000_000_000u64.into(),
            "stages.queue: buckets[0]: low 1000000000000 above high",
        ),
    ];
    for (name, edit, why) in cases {
        let p = edited(dir.path(), name, edit);
        diff(&p).refused_in_one_line(&[name, "not a virtgap profile", why]);
    }
}

#[test]
fn a_complete_run_shorter_than_a_millisecond_diffs() {
    let dir = scratch();
    let short = dir.path().join("short.json");
    let ran = run(
        vg().args([
            "record",
            "--engine",
            "null",
            "--size",
            "4MiB",
            "--duration",
            "100us",
            "--quiet",
            "--no-probes",
            "--dir",
        ])
        .arg(dir.path())
        .arg("-o")
        .arg(&short),
        Duration::from_secs(120),
    );
    assert!(ran.status.success(), "{}", ran.stderr);
    let ran = run(vg().arg("diff").arg(&short).arg(&short), AT_ONCE);
    assert!(ran.status.success(), "{}", ran.stderr);
}

/// Record interrupted while it measures the idle host, before the workload ran a millisecond:
/// the partial profile it writes is one `diff` reads, and says is incomplete.
#[test]
fn a_profile_interrupted_during_the_idle_interval_diffs_as_incomplete() {
    if !root_allowed("a run interrupted during the idle interval (probes)") {
        return;
    }
    let dir = scratch();
    let out = dir.path().join("p.json");
    let mut child = vg()
        .args([
            "record",
            "--engine",
            "null",
            "--size",
            "16MiB",
            "--duration",
            "10s",
            "--dir",
        ])
        .arg(dir.path())
        .arg("-o")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let pid = child.id() as i32;
    // Signal as soon as the idle interval starts; the rest of stderr is kept for the message.
    let watcher = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut signalled = false;
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if !signalled && line.contains("measuring the idle host") {
                // SAFETY: plain kill(2) on our own child, which has not been waited for.
                unsafe { libc::kill(pid, libc::SIGINT) };
                signalled = true;
            }
            seen.push(line);
        }
        (signalled, seen.join("\n"))
    });
    let ran = finish(
        child,
        Duration::from_secs(120),
        "record interrupted while idle",
    );
    let (signalled, stderr) = watcher.join().unwrap();
    if !signalled {
        // No probes attached (no BPF here): no idle interval to interrupt.
        virtgap_testkit::require::<String>(
            "a run interrupted during the idle interval",
            Err(format!("record measured no idle interval: {stderr}")),
        );
        return;
    }
    assert_eq!(ran.status.code(), Some(130), "{stderr}");
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("a partial profile")).unwrap();
    assert_eq!(doc["complete"], false);
    let measured = doc["results"]["measured_s"].as_f64().unwrap();
    assert!(
        measured < 0.5,
        "interrupted before the workload ran: {measured} s"
    );
    let ran = run(vg().arg("diff").arg(&out).arg(&out), AT_ONCE);
    assert!(ran.status.success(), "{}", ran.stderr);
    assert!(
        ran.stderr
            .contains("is incomplete (its run was interrupted)"),
        "{}",
        ran.stderr
    );
    assert!(!ran.stdout.is_empty());
}

#[test]
fn the_memory_preflight_honours_a_cgroup_limit() {
    if !root_allowed("a record under a 64 MiB memory cgroup") {
        return;
    }
    let Some(group) = virtgap_testkit::ready(
        "a 64 MiB memory cgroup",
        common::MemoryCgroup::new(64 << 20),
    ) else {
        return;
    };
    let dir = scratch();
    // 4096 x 64 KiB of buffers is 256 MiB: far over the cgroup's limit, far under the host's.
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("echo $$ > \"$0\"/cgroup.procs && exec \"$@\"")
        .arg(&group.dir)
        .arg(env!("CARGO_BIN_EXE_virtgap"))
        .args([
            "record",
            "--no-probes",
            "--qd",
            "4096",
            "--bs",
            "64KiB",
            "--size",
            "16MiB",
            "--duration",
            "2s",
            "--dir",
        ])
        .arg(dir.path())
        .stdin(Stdio::null());
    let ran = run(&mut cmd, Duration::from_secs(120));
    let name = group
        .dir
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    ran.refused_in_one_line(&[
        "the workload's buffers need about 256.50 MiB",
        "under the memory cgroup",
        &name,
        "limit of 64 MiB",
        "raise the cgroup's limit",
    ]);
    assert!(ran.stdout.is_empty(), "{}", ran.stdout);
}
