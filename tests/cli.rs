//! End-to-end tests of the `virtgap` binary: every bad input gets one clear line on stderr, a
//! non-zero exit and leaves nothing behind; good runs print what a user expects.

use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::Command;
use predicates::prelude::*;

mod common;
use common::{is_root, names_in, root_allowed};

fn scratch() -> tempfile::TempDir {
    common::scratch("vg-cli-")
}

fn vg() -> Command {
    Command::cargo_bin("virtgap").unwrap()
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect()
}

/// Asserts a failed run printed exactly one line on stderr containing `needle`.
fn fails_with(cmd: &mut Command, needle: &str) {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {stderr}"
    );
    assert!(stderr.contains(needle), "stderr lacks {needle:?}: {stderr}");
    let lines = stderr.lines().filter(|l| !l.trim().is_empty()).count();
    assert_eq!(lines, 1, "one line of error expected, got: {stderr}");
    assert!(out.stdout.is_empty(), "nothing on stdout for a failure");
}

/// A small, fast null-engine record with a temp file in `dir`; `args` replace the defaults
/// for the flags they name.
fn quick_with(dir: &Path, args: &[&str]) -> Command {
    let defaults = [
        ("--engine", "null"),
        ("--size", "4MiB"),
        ("--duration", "1s"),
    ];
    let mut c = vg();
    c.args(["record", "--quiet"]);
    for (flag, value) in defaults {
        if !args.contains(&flag) {
            c.args([flag, value]);
        }
    }
    if !args.contains(&"--dir") && !args.contains(&"--target") {
        c.arg("--dir").arg(dir);
    }
    c.args(args);
    c
}

fn quick(dir: &Path) -> Command {
    quick_with(dir, &[])
}

#[test]
fn help_explains_the_commands() {
    vg().arg("--help")
        .assert()
        .success()
        .stdout(predicate::str::contains("record").and(predicate::str::contains("workloads")));
    vg().args(["record", "--help"]).assert().success().stdout(
        predicate::str::contains("--destroy-data").and(predicate::str::contains("--rate-iops")),
    );
}

#[test]
fn workloads_lists_presets_and_prints_one() {
    vg().arg("workloads")
        .assert()
        .success()
        .stdout(predicate::str::contains("rand4k").and(predicate::str::contains("seq1m")));
    let out = vg().args(["workloads", "seq1m"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("pattern = \"sequential\""), "{text}");
    fails_with(
        vg().args(["workloads", "nope"]),
        "unknown workload preset 'nope'",
    );
}

#[test]
fn an_edited_copy_of_a_preset_runs() {
    let dir = scratch();
    let file = dir.path().join("mine.toml");
    let text =
        String::from_utf8(vg().args(["workloads", "rand4k"]).output().unwrap().stdout).unwrap();
    std::fs::write(
        &file,
        text.replace("qd = 32", "qd = 4")
            .replace("name = \"rand4k\"", "name = \"mine\""),
    )
    .unwrap();
    let out = quick(dir.path())
        .arg("--workload")
        .arg(&file)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["jobs"][0]["jobname"], "mine");
    assert_eq!(doc["jobs"][0]["job options"]["iodepth"], "4");
}

#[test]
fn bad_workload_input_is_refused_with_one_line() {
    let dir = scratch();
    fails_with(
        &mut quick_with(dir.path(), &["--workload", "rand5k"]),
        "unknown workload preset 'rand5k'",
    );
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        "name = \"x\"\npattern = \"random\"\nrw = \"read\"\nbs = \"4KiB\"\nqd = \"lots\"\n",
    )
    .unwrap();
    fails_with(quick(dir.path()).arg("--workload").arg(&file), "line 5");
    fails_with(
        &mut quick_with(dir.path(), &["--workload", "/nonexistent/w.toml"]),
        "cannot read workload file",
    );
    fails_with(&mut quick_with(dir.path(), &["--qd", "0"]), "--qd = 0");
    fails_with(
        &mut quick_with(dir.path(), &["--bs", "1000"]),
        "multiple of 512",
    );
    fails_with(
        &mut quick_with(dir.path(), &["--duration", "0s"]),
        "--duration",
    );
    fails_with(&mut quick_with(dir.path(), &["--size", "2PiB"]), "1 PiB");
    let out = quick_with(dir.path(), &["--size", "-5"]).output().unwrap();
    assert!(!out.status.success());
    assert_eq!(
        entries(dir.path()).len(),
        1,
        "only bad.toml: nothing written"
    );
}

#[test]
fn bad_targets_are_refused_before_anything_is_written() {
    let dir = scratch();
    fails_with(
        &mut quick_with(dir.path(), &["--dir", "/nonexistent-dir"]),
        "does not exist",
    );
    let file = dir.path().join("plain");
    std::fs::write(&file, b"keep me").unwrap();
    fails_with(
        &mut quick_with(dir.path(), &["--dir", file.to_str().unwrap()]),
        "is not a directory",
    );
    fails_with(
        vg().args(["record", "--quiet", "--target", "/nonexistent-target"]),
        "does not exist",
    );
    fails_with(
        vg().args(["record", "--quiet", "--target"]).arg(dir.path()),
        "is a directory",
    );
    // 100 TiB cannot fit here.
    fails_with(&mut quick_with(dir.path(), &["--size", "100TiB"]), "free");
    // Writing to an existing file needs consent naming it; the file stays intact.
    fails_with(
        vg().args(["record", "--quiet", "-w", "rand4k-write", "--target"])
            .arg(&file),
        "--destroy-data",
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    fails_with(
        vg().args([
            "record",
            "--quiet",
            "-w",
            "rand4k-write",
            "--destroy-data",
            "/other",
            "--target",
        ])
        .arg(&file),
        "does not match",
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
}

#[test]
fn writes_to_a_mounted_disk_are_refused() {
    // The root filesystem's disk is mounted, whatever identity is given.
    let root_dev = {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata("/").unwrap().dev();
        let link = format!("/sys/dev/block/{}:{}", libc::major(dev), libc::minor(dev));
        match std::fs::canonicalize(link) {
            Ok(p) => p.file_name().unwrap().to_string_lossy().to_string(),
            Err(_) => {
                virtgap_testkit::skip(
                    "the mounted-disk refusal",
                    "/ is not on a block device here",
                );
                return;
            }
        }
    };
    let dev = format!("/dev/{root_dev}");
    if !Path::new(&dev).exists() {
        virtgap_testkit::skip(
            "the mounted-disk refusal",
            format!("{dev} has no device node here"),
        );
        return;
    }
    for extra in [&[][..], &["--destroy-data", "whatever"][..]] {
        fails_with(
            vg().args(["record", "--quiet", "-w", "rand4k-write", "--target", &dev])
                .args(extra),
            "is mounted on /",
        );
    }
}

#[test]
fn read_only_dir_and_missing_o_direct_are_explained() {
    if !root_allowed("mount-based CLI test") {
        return;
    }
    struct Mount(PathBuf);
    impl Drop for Mount {
        fn drop(&mut self) {
            let _ = StdCommand::new("umount").arg(&self.0).status();
        }
    }
    let dir = scratch();
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    assert!(StdCommand::new("mount")
        .args(["-t", "tmpfs", "-o", "ro,size=8m", "none"])
        .arg(&ro)
        .status()
        .unwrap()
        .success());
    let _ro = Mount(ro.clone());
    fails_with(
        &mut quick_with(dir.path(), &["--dir", ro.to_str().unwrap()]),
        "not writable",
    );

    let ram = dir.path().join("ram");
    std::fs::create_dir(&ram).unwrap();
    assert!(StdCommand::new("mount")
        .args(["-t", "ramfs", "none"])
        .arg(&ram)
        .status()
        .unwrap()
        .success());
    let _ram = Mount(ram.clone());
    fails_with(
        &mut quick_with(dir.path(), &["--dir", ram.to_str().unwrap()]),
        "does not support O_DIRECT",
    );
    assert!(entries(&ram).is_empty(), "no file left on the ramfs");
    // The suggested way out works.
    let out = quick_with(
        dir.path(),
        &[
            "--dir",
            ram.to_str().unwrap(),
            "--buffered",
            "--engine",
            "psync",
        ],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(entries(&ram).is_empty());
}

#[test]
fn null_engine_json_follows_fio_layout_and_stdout_is_clean() {
    let dir = scratch();
    let profile = dir.path().join("p.json");
    let out = quick(dir.path())
        .arg("--json")
        .arg("-o")
        .arg(&profile)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is pure JSON");
    // Every figure is the saved profile's: the JSON rendered again from the file is the same.
    // (`record` adds the tail autopsy, which the profile keeps in its run record.)
    let saved = virtgap::model::file::load(&profile).unwrap();
    let mut recorded = doc.clone();
    let tail = recorded.as_object_mut().unwrap().remove("tail_autopsy");
    let tail_kept = saved.runs.last().and_then(|r| r.tail.as_ref());
    assert_eq!(tail, tail_kept.map(|t| serde_json::to_value(t).unwrap()));
    let again = virtgap::render::report::json(&saved);
    for (key, value) in recorded.as_object().unwrap() {
        assert_eq!(
            Some(value),
            again.get(key),
            "--json's {key} is not its profile's"
        );
    }
    assert_eq!(recorded, again);
    std::fs::remove_file(&profile).unwrap();
    let read = &doc["jobs"][0]["read"];
    assert!(read["iops"].as_f64().unwrap() > 1000.0);
    assert!(read["total_ios"].as_u64().unwrap() > 0);
    assert!(read["clat_ns"]["percentile"]["99.000000"]
        .as_u64()
        .is_some());
    assert!(read["lat_ns"]["mean"].as_f64().unwrap() > 0.0);
    assert!(read["slat_ns"]["N"].as_u64().unwrap() > 0);
    assert_eq!(doc["jobs"][0]["write"]["total_ios"], 0);
    assert!(doc["jobs"][0]["usr_cpu"].as_f64().is_some());
    assert!(entries(dir.path()).is_empty(), "temp file removed");
}

#[test]
fn real_run_prints_a_summary_with_units() {
    let dir = scratch();
    let out = vg()
        .args([
            "record",
            "--size",
            "16MiB",
            "--duration",
            "1s",
            "--quiet",
            "--dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "read: IOPS",
        "MiB/s",
        "slat",
        "clat",
        "p99.9",
        "µs",
        "cpu: usr",
    ] {
        assert!(text.contains(needle), "summary lacks {needle}:\n{text}");
    }
    assert!(entries(dir.path()).is_empty(), "temp file removed");
}

#[test]
fn fio_equivalent_prints_the_command() {
    vg().args(["record", "-w", "fio-randread", "--fio-equivalent"])
        .assert()
        .success()
        .stdout(
            predicate::str::starts_with("fio --name=fio-randread")
                .and(predicate::str::contains("--iodepth=32")),
        );
}

/// Starts `record` in `dir`, waits until it says it reached a phase (a stderr line starting with
/// `phase`; at most 60 s), then `extra`, then sends SIGINT: exit code, stdout and stderr.
fn interrupt_at(dir: &Path, args: &[&str], phase: &str, extra: Duration) -> (i32, String, String) {
    use std::io::BufRead;
    let mut child = StdCommand::new(env!("CARGO_BIN_EXE_virtgap"))
        .args(["record", "--dir"])
        .arg(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (line_tx, lines) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            all.push_str(&line);
            all.push('\n');
            let _ = line_tx.send(line);
        }
        all
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let reached = loop {
        let now = Instant::now();
        if now >= deadline {
            break false;
        }
        match lines.recv_timeout(deadline - now) {
            Ok(line) if line.starts_with(phase) => break true,
            Ok(_) => {}
            Err(_) => break false,
        }
    };
    std::thread::sleep(extra);
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let started = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "Ctrl-C took too long"
    );
    let stderr = reader.join().unwrap();
    assert!(
        reached,
        "the run never reached the phase to interrupt; stderr: {stderr}"
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        stderr,
    )
}

#[test]
fn ctrl_c_mid_run_prints_what_ran_and_leaves_no_temp_file() {
    let dir = scratch();
    // Past the ramp (1 s here) and into the measured intervals.
    let (code, stdout, stderr) = interrupt_at(
        dir.path(),
        &["--size", "16MiB", "--duration", "60s", "--ramp", "1s"],
        "running ",
        Duration::from_millis(2500),
    );
    assert_eq!(code, 130, "stderr: {stderr}");
    assert!(stdout.contains("interrupted"), "{stdout}");
    assert!(
        stderr.contains("interrupted after") && !stderr.contains("after 0.0 s"),
        "{stderr}"
    );
    assert!(entries(dir.path()).is_empty());
}

#[test]
fn ctrl_c_while_preparing_leaves_no_temp_file() {
    let dir = scratch();
    let (code, _, stderr) = interrupt_at(
        dir.path(),
        &["--size", "4GiB", "--duration", "60s"],
        "preparing ",
        Duration::ZERO,
    );
    assert_eq!(code, 130, "stderr: {stderr}");
    assert!(stderr.contains("interrupted while preparing"), "{stderr}");
    assert!(entries(dir.path()).is_empty());
}

/// `doctor --compare-stamps`: both stamp sources on the same reads of a file, as text and JSON;
/// a path that cannot be read is one line and a non-zero exit.
#[test]
fn doctor_compares_the_kernels_block_stamps_with_ours_on_the_same_reads() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let missing = dir.path().join("missing.img");
    let out = vg()
        .args(["doctor", "--compare-stamps"])
        .arg(&missing)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    if !root_allowed("doctor --compare-stamps on a file") {
        return;
    }
    assert!(err.contains("missing.img"), "{err}");
    let path = dir.path().join("reads.img");
    std::fs::write(&path, vec![0x5au8; 4 << 20]).unwrap();
    let out = vg()
        .args(["doctor", "--reads", "300", "--json", "--compare-stamps"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["reads"], 300);
    for side in ["own", "kernel"] {
        let n = doc[side]["requests"].as_u64().unwrap();
        assert!(
            (297..=303).contains(&n),
            "{side}: {n} requests for 300 reads"
        );
    }
    // Both sessions' records of each request, paired one to one.
    let paired = doc["per_request"]["paired"].as_u64().unwrap();
    assert!((297..=303).contains(&paired), "{paired} requests paired");
    let text = vg()
        .args(["doctor", "--reads", "100", "--compare-stamps"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    for needle in [
        "queue",
        "device",
        "completion",
        "less the order",
        "per request",
        "own programs:",
    ] {
        assert!(text.contains(needle), "{needle}:\n{text}");
    }
}

#[test]
fn doctor_fingerprints_the_host_and_lists_every_probe() {
    let out = vg().arg("doctor").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // Without root the probes cannot be tried, and doctor says so per family rather than per
    // tracepoint: the names are checked only where they can be listed.
    let tracepoints: &[&str] = if root_allowed("doctor's per-tracepoint rows") {
        &["block_rq_issue", "irq_handler_entry", "sched_switch"]
    } else {
        &[]
    };
    for needle in ["host: ", "clocksource", "views:"]
        .iter()
        .chain(tracepoints)
    {
        assert!(
            text.contains(needle),
            "doctor output lacks {needle}:\n{text}"
        );
    }
    let json = vg().args(["doctor", "--json"]).output().unwrap();
    let doc: serde_json::Value =
        serde_json::from_slice(&json.stdout).expect("doctor --json is JSON");
    let probes = doc["probes"].as_array().unwrap();
    assert!(probes.len() >= 20, "{} probe rows", probes.len());
    if is_root() {
        // Root on a kernel with these tracepoints: the block and IRQ probes attach.
        for tp in [
            "block_rq_issue",
            "block_rq_complete",
            "irq_handler_entry",
            "softirq_entry",
        ] {
            let row = probes.iter().find(|r| r["tracepoint"] == tp).unwrap();
            assert_eq!(row["available"], true, "{row}");
        }
        // Each family's cost over a second of the host's own activity: the wakeup family runs
        // on every context switch, which a second always has.
        let cost = &doc["probe_cost"];
        let families = cost["families"].as_array().expect("measured as root");
        let wakeup = families
            .iter()
            .find(|f| f["family"] == "wakeup")
            .unwrap_or_else(|| panic!("{cost}"));
        assert!(wakeup["events_per_s"].as_f64().unwrap() > 0.0, "{wakeup}");
        assert!(wakeup["ns_per_event"].as_f64().unwrap() > 0.0, "{wakeup}");
        assert!(text.contains("probe cost over 1 s"), "{text}");
    } else {
        assert!(probes
            .iter()
            .any(|r| r["status"].as_str().unwrap().contains("not root")));
    }
}

#[test]
fn record_reports_probe_stages_and_overhead() {
    if !root_allowed("probe record test") {
        return;
    }
    let dir = scratch();
    let profile = dir.path().join("p.json");
    let out = vg()
        .args([
            "record",
            "--size",
            "16MiB",
            "--duration",
            "2s",
            "--quiet",
            "-o",
        ])
        .arg(&profile)
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "block stages of this process's read",
        "queue",
        "device",
        "interrupt load per CPU",
        "probe overhead",
    ] {
        assert!(text.contains(needle), "summary lacks {needle}:\n{text}");
    }
    // The summary's probe figures cover the profile's window: the measured run, not the idle
    // interval before it or the ramp.
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&profile).unwrap()).unwrap();
    let window = doc["probe_seconds"].as_f64().unwrap();
    let shown: f64 = text
        .split("interrupt load per CPU (all sources, ")
        .nth(1)
        .and_then(|rest| rest.split(" s)").next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no interrupt load window in:\n{text}"));
    assert!(
        (shown - window).abs() < 0.06,
        "summary's probes cover {shown} s, the profile's {window} s"
    );
    // Every figure of the summary is the saved profile's: rendered again from the file, it is
    // the same text.
    let saved = virtgap::model::file::load(&profile).unwrap();
    let mut again = Vec::new();
    virtgap::render::summary::write(&mut again, &saved).unwrap();
    if let Some(tail) = saved.runs.last().and_then(|r| r.tail.as_ref()) {
        virtgap::render::report::write_tail(&mut again, tail).unwrap();
    }
    let again =
        virtgap_workloads::units::printable(&String::from_utf8(again).unwrap()).into_owned();
    assert_eq!(text, again, "the summary differs from its profile's");
    let out = quick_with(dir.path(), &["--probes", "block,bogus"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown probe family 'bogus'"));
}

/// Inside a container the workload's pid is a namespace-local number: the probes must still
/// follow it (block stages of its I/Os, wakeups of its threads).
#[test]
fn probes_follow_the_workload_inside_a_pid_namespace() {
    if !root_allowed("pid namespace probe test") {
        return;
    }
    let dir = scratch();
    let profile = dir.path().join("ns.json");
    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(assert_cmd::cargo::cargo_bin("virtgap"))
        .args([
            "record",
            "--size",
            "16MiB",
            "--duration",
            "2s",
            "--quiet",
            "--probes",
            "block,wakeup",
            "--dir",
        ])
        .arg(dir.path())
        .arg("-o")
        .arg(&profile)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&profile).unwrap()).unwrap();
    let ios = doc["stages"]["app"]["count"].as_u64().unwrap() as f64;
    let reqs = doc["stages"]["device"]["count"].as_u64().unwrap_or(0) as f64;
    assert!(ios > 0.0);
    assert!(
        (reqs - ios).abs() / ios < 0.02,
        "{reqs} requests seen for {ios} I/Os"
    );
    assert!(
        doc["stages"]["wakeup"]["count"].as_u64().unwrap_or(0) > 0,
        "wakeups of the workload's threads: {}",
        doc["stages"]["wakeup"]
    );
}

/// Outputs are regular files: a device node, FIFO or directory is refused whatever --force
/// says, in one line naming the flag that named it.
#[test]
fn outputs_that_are_not_regular_files_are_refused_naming_their_flag() {
    use std::os::unix::fs::FileTypeExt;
    let dir = scratch();
    fails_with(
        &mut quick_with(dir.path(), &["-o", "/dev/null", "--force"]),
        "--output /dev/null is a device node",
    );
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    fails_with(kv_quick(dir.path(), &["--act-log"]).arg(&sub), "--act-log");
    fails_with(
        vg().args(["tui", "--save", "/nonexistent-dir/x.json"]),
        "--save: directory /nonexistent-dir does not exist",
    );
    let profile = dir.path().join("p.json");
    quick_with(
        dir.path(),
        &["--no-probes", "-o", profile.to_str().unwrap()],
    )
    .assert()
    .success();
    fails_with(
        vg().arg("diff")
            .arg(&profile)
            .arg(&profile)
            .arg("--csv")
            .arg(&sub),
        "--csv",
    );
    fails_with(
        vg().arg("diff").arg(&profile).arg("/dev/zero"),
        "not a regular file",
    );
    fails_with(
        &mut quick_with(dir.path(), &["--qd", "4294967296"]),
        "queue depth must be 1..=4096",
    );
}

/// Flags that would make memory grow without bound are refused before anything runs: an
/// interval too short to be worth its bookkeeping, and buffers beyond half the host's memory.
#[test]
fn flags_that_would_exhaust_memory_are_refused_up_front() {
    let dir = scratch();
    fails_with(
        &mut quick_with(dir.path(), &["--interval", "1ns", "--duration", "3s"]),
        "--interval 1ns is outside 100ms..=1h",
    );
    fails_with(
        vg().args(["tui", "--interval", "2h"]),
        "--interval 2h is outside 100ms..=1h",
    );
    fails_with(
        &mut quick_with(dir.path(), &["--workers", "1024", "--qd", "4096"]),
        "(1024 workers x qd 4096 x 4 KiB bs), over half of the",
    );
    assert!(names_in(dir.path()).is_empty(), "nothing left behind");
}

/// Without a terminal the live view says so in one line and points at the headless command.
#[test]
fn the_live_view_without_a_terminal_points_at_record() {
    fails_with(
        vg().args(["tui", "--duration", "1s"]).write_stdin(""),
        "use `virtgap record`",
    );
}

/// A short kv run on a small temp file in `dir`, without probes.
fn kv_quick(dir: &Path, args: &[&str]) -> Command {
    let mut c = vg();
    c.args(["record", "--quiet", "-w", "kv-act", "--no-probes", "--dir"])
        .arg(dir);
    for (flag, value) in [("--size", "32MiB"), ("--duration", "3s")] {
        if !args.contains(&flag) {
            c.args([flag, value]);
        }
    }
    c.args(args);
    c
}

#[test]
fn bad_kv_input_is_refused_with_one_line_and_leaves_nothing() {
    let dir = scratch();
    for (args, needle) in [
        (&["--x", "0"][..], "no load"),
        (&["--record-bytes", "200KiB"][..], "fit one large block"),
        (
            &["--record-bytes", "1KiB-300KiB"][..],
            "fit one large block",
        ),
        (&["--record-bytes", "2KiB-1KiB"][..], "upper end is below"),
        (&["--defrag-lwm-pct", "100"][..], "--defrag-lwm-pct"),
        (&["--defrag-lwm-pct", "0"][..], "1..=99"),
        (&["--lb-bytes", "96KiB"][..], "power of two"),
        (&["--size", "256KiB"][..], "at least 4 large blocks"),
        (&["--size", "1MiB"][..], "the store is full"),
        (&["--verify"][..], "kv checks every read"),
        (&["--fio-equivalent"][..], "no fio equivalent"),
    ] {
        fails_with(&mut kv_quick(dir.path(), args), needle);
        assert!(entries(dir.path()).is_empty(), "{args:?} left a file");
    }
    kv_quick(dir.path(), &["--ratio", "2-1"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("is not a reads:writes ratio"));
    fails_with(
        &mut quick_with(dir.path(), &["--x", "2"]),
        "--x applies only to kv workloads",
    );
    fails_with(
        &mut quick_with(dir.path(), &["--act-log", "x.log"]),
        "--act-log applies only to kv",
    );
    let existing = dir.path().join("act.log");
    std::fs::write(&existing, "keep me").unwrap();
    fails_with(
        &mut kv_quick(dir.path(), &["--act-log", existing.to_str().unwrap()]),
        "--force",
    );
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep me");
}

#[test]
fn a_kv_run_that_did_not_deliver_its_load_never_passes() {
    let dir = scratch();
    // 2 M client reads/s from one service thread: no machine delivers it. A lag limit longer
    // than the run keeps it going to the end, so only the delivered share can tell.
    let out = kv_quick(
        dir.path(),
        &["--x", "1000", "--workers", "1", "--max-lag", "1h", "--json"],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("did not deliver the load"), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kv"]["verdict"], false, "{}", v["kv"]);
    assert_eq!(v["kv"]["outcome"], "not_delivered");
    let done = v["kv"]["delivered"]["client_fraction"].as_f64().unwrap();
    assert!(done < 0.5, "{done}");
    // A schedule that slipped by seconds fails the client's definition (from each read's
    // scheduled start), whatever the device reads took.
    let slice = &v["kv"]["slices"][0];
    assert_eq!(slice["intended_pass"], false, "{}", v["kv"]);
    assert!(
        slice["reads_intended"]["pct_at_or_over_64ms"]
            .as_f64()
            .unwrap()
            > 50.0,
        "{slice}"
    );
    assert_eq!(v["kv"]["intended_pass"], false, "{}", v["kv"]);

    let out = kv_quick(
        dir.path(),
        &["--x", "1000", "--workers", "1", "--max-lag", "1h"],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("PASS"), "{stdout}");
    assert!(
        stdout.contains("NO VERDICT: did not deliver the load of 2000000 reads/s"),
        "{stdout}"
    );
    assert!(entries(dir.path()).is_empty(), "the temp file is gone");
}

#[test]
fn kv_run_prints_the_verdict_and_writes_acts_log() {
    let dir = scratch();
    let out_dir = scratch();
    let log = out_dir.path().join("act.log");
    let out = kv_quick(
        dir.path(),
        &["--act-log", log.to_str().unwrap(), "--adaptive-qd"],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // A machine too busy to deliver 2,000 reads/s gets "no verdict" and exit 1: the tool being
    // right. The summary and the log are checked all the same.
    let undelivered = stdout.contains("NO VERDICT: did not deliver the load");
    assert!(
        out.status.success() || (undelivered && out.status.code() == Some(1)),
        "{stderr}"
    );
    for part in [
        "device write (large blocks): IOPS",
        "client reads: service time",
        "large-block writes",
        "23.53",
        "verdict per slice",
        "0-3 s",
        "0 mismatches",
        "of device-read time spent queued",
        "reads in flight per ring: adaptive,",
    ] {
        assert!(stdout.contains(part), "summary lacks {part:?}:\n{stdout}");
    }
    assert!(
        stdout.contains("PASS at 2000 reads/s")
            || stdout.contains("FAIL at 2000 reads/s")
            || undelivered,
        "{stdout}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.starts_with("ACT version 6.6\n"), "{text}");
    for part in ["large-block-reads-per-sec: 23.53", "after 3 sec:\nreads ("] {
        assert!(text.contains(part), "ACT log lacks {part:?}:\n{text}");
    }
    assert!(entries(dir.path()).is_empty(), "the temp file is gone");

    // By default the depth is fixed; the queueing is still measured (at 2000 reads/s most
    // reads go out alone).
    let out = kv_quick(dir.path(), &["--json", "--ratio", "1:0", "--qd", "8"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        out.status.success()
            || (out.status.code() == Some(1) && v["kv"]["outcome"] == "not_delivered"),
        "{}",
        v["kv"]
    );
    let q = &v["kv"]["read_queueing"];
    assert_eq!(
        (q["adaptive"].as_bool(), q["ceiling"].as_u64()),
        (Some(false), Some(8)),
        "{q}"
    );
    assert_eq!(
        (q["limit_min"].as_u64(), q["limit_max"].as_u64()),
        (Some(8), Some(8))
    );
    let share = q["queued_share"].as_f64().expect("measured");
    assert!((0.0..=1.0).contains(&share), "{q}");
    assert_eq!(v["kv"]["target"]["client_writes_per_s"].as_f64(), Some(0.0));
    assert_eq!(v["kv"]["mismatches"], 0);
    assert!(v["kv"]["verdict"].is_boolean(), "{}", v["kv"]);
    assert_eq!(v["workload"]["fio_equivalent"], serde_json::Value::Null);

    // A record-size range: 1-2 KiB averages 1536 B stored, so ACT's derived rates are 1x's.
    let out = kv_quick(dir.path(), &["--json", "--record-bytes", "1KiB-2KiB"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // As above: a machine too busy for the load says so (exit 1, "not delivered").
    assert!(
        out.status.success()
            || (out.status.code() == Some(1) && v["kv"]["outcome"] == "not_delivered"),
        "{}",
        v["kv"]
    );
    let lb = v["kv"]["target"]["lb_writes_per_s"].as_f64().unwrap();
    assert!((lb - 23.53).abs() < 0.01, "{lb}");
    assert!(v["kv"]["read_bytes_max"].as_u64().unwrap() >= 2048);
    assert_eq!(v["kv"]["mismatches"], 0);
}

#[test]
fn kv_load_beyond_the_generator_stops_with_cant_keep_up() {
    let dir = scratch();
    // A million client operations per second cannot be issued by ten synchronous threads.
    let out = kv_quick(
        dir.path(),
        &["--x", "500", "--max-lag", "1s", "--duration", "30s"],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("can't keep up"), "{stderr}");
    assert!(
        stdout.contains("NO VERDICT: did not deliver the load"),
        "{stdout}"
    );
    assert!(!stdout.contains("PASS"), "{stdout}");
    assert!(entries(dir.path()).is_empty());
}

#[test]
fn killing_a_kv_run_leaves_no_temp_file() {
    let dir = scratch();
    for after in [Duration::from_millis(300), Duration::from_millis(4000)] {
        let mut child = StdCommand::new(env!("CARGO_BIN_EXE_virtgap"))
            .args(["record", "--quiet", "-w", "kv-act", "--no-probes"])
            .args(["--size", "64MiB", "--duration", "60s", "--dir"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(after);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            entries(dir.path()).is_empty(),
            "SIGKILL after {after:?} left {:?}",
            entries(dir.path())
        );
    }
    // Ctrl-C while loading the store.
    let (code, _, stderr) = interrupt_at(
        dir.path(),
        &["-w", "kv-act", "--no-probes", "--size", "1GiB"],
        "loading the kv store",
        Duration::ZERO,
    );
    assert_eq!(code, 130, "{stderr}");
    assert!(
        stderr.contains("interrupted while loading the kv store"),
        "{stderr}"
    );
    assert!(entries(dir.path()).is_empty());
}

/// A group of hosts per side: a directory of profiles, or a quoted glob, pools like `--with-a`
/// and `--with-b` naming each file; an empty group is refused in one line.
#[test]
fn diff_takes_a_directory_or_a_glob_per_side() {
    let dir = scratch();
    let (metal, vm) = (dir.path().join("metal"), dir.path().join("vm"));
    std::fs::create_dir(&metal).unwrap();
    std::fs::create_dir(&vm).unwrap();
    for path in [
        metal.join("h1.json"),
        metal.join("h2.json"),
        vm.join("h1.json"),
        vm.join("h2.json"),
    ] {
        quick_with(dir.path(), &["--no-probes", "-o", path.to_str().unwrap()])
            .assert()
            .success();
    }
    let json = |args: &[&std::ffi::OsStr]| {
        let out = vg().arg("diff").arg("--json").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (by_files, _) = json(&[
        metal.join("h1.json").as_os_str(),
        vm.join("h1.json").as_os_str(),
        "--with-a".as_ref(),
        metal.join("h2.json").as_os_str(),
        "--with-b".as_ref(),
        vm.join("h2.json").as_os_str(),
    ]);
    let (by_dirs, said) = json(&[metal.as_os_str(), vm.as_os_str()]);
    assert_eq!(by_dirs, by_files);
    assert!(said.contains("host A: 2 profiles"), "{said}");
    let pattern = metal.join("h*.json");
    let (by_glob, _) = json(&[pattern.as_os_str(), vm.as_os_str()]);
    assert_eq!(by_glob, by_files);
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    fails_with(
        vg().arg("diff").arg(&empty).arg(&vm),
        "a directory with no .json profiles",
    );
    fails_with(
        vg().arg("diff").arg(dir.path().join("x*.json")).arg(&vm),
        "no profile matches",
    );
}
