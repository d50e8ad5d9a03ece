//! The binary under hostile names, values and pipes: `--fio-equivalent` prints a command a shell
//! runs as it reads, out-of-range values are refused before anything runs and name the flag as
//! typed, closed pipes neither panic nor lose the profile, a long `--interval` does not hold the
//! workload back, and a stopped process is not a stalled device.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command as StdCommand, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use assert_cmd::Command;

mod common;
use common::root_allowed;

fn scratch() -> tempfile::TempDir {
    common::scratch("vg-safety-")
}

fn bin() -> std::path::PathBuf {
    assert_cmd::cargo::cargo_bin("virtgap")
}

fn vg() -> Command {
    let mut c = Command::new(bin());
    // Whatever a test gets wrong, it does not hang the suite.
    c.timeout(Duration::from_secs(120));
    c
}

/// A small, fast null-engine record with a temp file in `dir`; `args` replace the defaults for
/// the flags they name.
fn quick(dir: &Path, args: &[&str]) -> Command {
    let mut c = vg();
    c.arg("record");
    for (flag, value) in [
        ("--engine", "null"),
        ("--size", "4MiB"),
        ("--duration", "1s"),
    ] {
        if !args.contains(&flag) {
            c.args([flag, value]);
        }
    }
    c.arg("--dir").arg(dir).args(args);
    c
}

/// The write end of a pipe whose read end is already closed: every write to it fails with EPIPE.
fn closed_pipe() -> std::io::PipeWriter {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    writer
}

/// Asserts a failed run printed one line on stderr that contains `needle`, and nothing else.
fn fails_with_one_line(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.contains(needle), "stderr lacks {needle:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line expected: {stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn fio_equivalent_quotes_hostile_target_and_workload_names() {
    let dir = scratch();
    let name = "x; id #";
    let file = dir.path().join(name);
    let preset = virtgap_workloads::spec::preset_text("rand4k").unwrap();
    std::fs::write(
        &file,
        preset.replace("name = \"rand4k\"", &format!("name = {name:?}")),
    )
    .unwrap();
    let target = "/tmp/x; echo INJECTED #";
    let out = vg()
        .current_dir(dir.path())
        .args(["record", "-w", name, "--target", target, "--fio-equivalent"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).unwrap();
    let line = line.trim_end_matches('\n');

    let spec = virtgap_workloads::spec::load(file.to_str().unwrap())
        .unwrap()
        .spec;
    let argv = spec
        .fio_argv(&virtgap_workloads::spec::FioTarget {
            filename: target,
            size: spec.size.0,
            existing: false,
        })
        .unwrap();
    assert!(argv.contains(&format!("--filename={target}")), "{argv:?}");
    assert!(argv.contains(&format!("--name={name}")), "{argv:?}");
    assert_eq!(shlex::split(line), Some(argv.clone()), "{line}");

    // A real shell reads the same words, and runs nothing else: `fio` here prints its
    // arguments, NUL-separated.
    let shell = StdCommand::new("sh")
        .arg("-c")
        .arg(format!("fio() {{ printf '%s\\0' \"$@\"; }}\n{line}"))
        .output()
        .unwrap();
    assert!(shell.status.success());
    let words: Vec<String> = String::from_utf8(shell.stdout)
        .unwrap()
        .split_terminator('\0')
        .map(String::from)
        .collect();
    assert_eq!(words, argv[1..], "{line}");
}

#[test]
fn a_rate_past_toml_integers_is_refused_before_anything_runs() {
    let dir = scratch();
    let started = Instant::now();
    let out = quick(
        dir.path(),
        &["--rate-iops", "9223372036854775808", "--duration", "30s"],
    )
    .output()
    .unwrap();
    fails_with_one_line(&out, "--rate-iops = 9223372036854775808: ");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "refused at once, not after the workload: {:?}",
        started.elapsed()
    );
    assert_eq!(common::names_in(dir.path()), Vec::<String>::new());
}

#[test]
fn errors_name_the_flag_given_and_its_value_as_typed() {
    let dir = scratch();
    let out = vg()
        .args(["record", "-w", "kv-act", "--read-rps", "1000000001"])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    fails_with_one_line(&out, "--read-rps = 1000000001: ");
    let out = quick(dir.path(), &["--ramp", "100y"]).output().unwrap();
    fails_with_one_line(&out, "--ramp = 100y: ");
    let out = quick(dir.path(), &["--qd", "5000000000"]).output().unwrap();
    fails_with_one_line(&out, "--qd = 5000000000: ");
}

#[test]
fn a_closed_stderr_neither_panics_nor_loses_the_profile() {
    let dir = scratch();
    let profile = dir.path().join("p.json");
    let out = StdCommand::new(bin())
        .args([
            "record",
            "--engine",
            "null",
            "--size",
            "4MiB",
            "--duration",
            "1s",
        ])
        .args(["--no-probes", "--dir"])
        .arg(dir.path())
        .arg("-o")
        .arg(&profile)
        .stdout(Stdio::null())
        .stderr(closed_pipe())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&profile).unwrap()).unwrap();
    assert!(doc["schema_version"].is_number(), "{doc}");
}

#[test]
fn a_closed_stdout_exits_quietly_like_a_pipeline_cut_short() {
    for args in [&["workloads"][..], &["workloads", "rand4k"], &["schema"]] {
        let out = StdCommand::new(bin())
            .args(args)
            .stdout(closed_pipe())
            .output()
            .unwrap();
        assert!(
            out.stderr.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(141), "{args:?}: 128 + SIGPIPE");
    }
}

/// Spawns `virtgap` with `args`, stderr's lines sent with the time each arrived.
fn spawn_with_lines(args: &[&str], dir: &Path) -> (Child, mpsc::Receiver<(Instant, String)>) {
    let mut child = StdCommand::new(bin())
        .args(args)
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Waits for a stderr line starting with `prefix`: when it came.
fn line_starting(
    rx: &mpsc::Receiver<(Instant, String)>,
    prefix: &str,
    seen: &mut Vec<String>,
) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(90);
    while let Ok((at, line)) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        let found = line.starts_with(prefix);
        seen.push(line);
        if found {
            return at;
        }
    }
    panic!("no line starting {prefix:?} on stderr: {seen:#?}");
}

fn stdout_of(child: Child) -> (std::process::ExitStatus, String) {
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn a_long_interval_does_not_hold_the_workload_back() {
    if !root_allowed("the idle-window test (probes)") {
        return;
    }
    let dir = scratch();
    let (child, rx) = spawn_with_lines(
        &[
            "record",
            "--engine",
            "null",
            "--size",
            "4MiB",
            "--duration",
            "1s",
            "--interval",
            "10s",
            "--probes",
            "block",
        ],
        dir.path(),
    );
    let mut seen = Vec::new();
    let idle = line_starting(&rx, "measuring the idle host", &mut seen);
    let running = line_starting(&rx, "running ", &mut seen);
    let (status, stdout) = stdout_of(child);
    assert!(status.success(), "{seen:#?}\n{stdout}");
    // The idle window is a second at most; the old one lasted the whole 10 s interval.
    let waited = running - idle;
    assert!(
        waited < Duration::from_secs(5),
        "waited {waited:?} for the idle host"
    );
}

#[test]
fn a_stopped_process_is_not_a_stalled_device() {
    let dir = scratch();
    let profile = dir.path().join("p.json");
    let (child, rx) = spawn_with_lines(
        &[
            "record",
            "--no-probes",
            "--engine",
            "io_uring",
            "--size",
            "64MiB",
            "--duration",
            "7s",
            "-o",
            profile.to_str().unwrap(),
        ],
        dir.path(),
    );
    let mut seen = Vec::new();
    line_starting(&rx, "running ", &mut seen);
    std::thread::sleep(Duration::from_millis(1500));
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill on the pid of a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    std::thread::sleep(Duration::from_secs(3));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let (status, summary) = stdout_of(child);
    assert!(status.success(), "{seen:#?}\n{summary}");
    assert!(!summary.contains("STALLED"), "{summary}");
    assert!(
        summary.contains("PAUSED: virtgap itself did not run for"),
        "{summary}"
    );
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&profile).unwrap()).unwrap();
    let stalls = &doc["stalls"];
    assert_eq!(stalls["stalled_intervals"], 0, "{stalls}");
    assert_eq!(stalls["slow_ios"], 0, "{stalls}");
    let paused: f64 = stalls["process_paused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["end_s"].as_f64().unwrap() - p["start_s"].as_f64().unwrap())
        .sum();
    assert!((2.5..5.0).contains(&paused), "{stalls}");
}

/// The fio line for an existing file spans what the run spans (its 16 MiB, not the preset's
/// 1 GiB) and, for a read workload, is read-only: running it grew the file to 1 GiB and
/// rewrote its first 16 MiB.
#[test]
fn fio_equivalent_on_a_file_spans_it_and_only_reads_it() {
    let dir = scratch();
    let data = common::data_file(dir.path(), "data.bin", 4096);
    let out = vg()
        .args(["record", "--fio-equivalent", "--target"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let words = shlex::split(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert!(words.contains(&"--size=16777216".to_string()), "{words:?}");
    assert!(words.contains(&"--readonly".to_string()), "{words:?}");
    // A write workload on it is refused as `record` would refuse it.
    let out = vg()
        .args([
            "record",
            "-w",
            "rand4k-write",
            "--fio-equivalent",
            "--target",
        ])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--destroy-data"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A run named twice on one side (or a copy of it) would pass for independent replicates and
/// give zero-width intervals: refused. The same run on both sides is only said.
#[test]
fn one_run_is_never_two_replicates() {
    let dir = scratch();
    let a = dir.path().join("a.json");
    quick(
        dir.path(),
        &["--quiet", "--no-probes", "-o", a.to_str().unwrap()],
    )
    .assert()
    .success();
    let copy = dir.path().join("copy.json");
    std::fs::copy(&a, &copy).unwrap();
    let mut b: serde_json::Value = serde_json::from_slice(&std::fs::read(&a).unwrap()).unwrap();
    b["runs"][0]["started_unix_ms"] =
        (b["runs"][0]["started_unix_ms"].as_u64().unwrap() + 1).into();
    let b_path = dir.path().join("b.json");
    std::fs::write(&b_path, serde_json::to_vec(&b).unwrap()).unwrap();
    let diff = |with_a: &Path| {
        vg().arg("diff")
            .arg(&a)
            .arg(&b_path)
            .arg("--with-a")
            .arg(with_a)
            .output()
            .unwrap()
    };
    for (with_a, says) in [
        (&copy, "hold the same recorded run"),
        (&a, "is named twice"),
    ] {
        let out = diff(with_a);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
    let out = vg().arg("diff").arg(&a).arg(&copy).output().unwrap();
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("compared with itself"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
