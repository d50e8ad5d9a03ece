//! End-to-end tests of what virtgap writes: every output path is checked before anything runs
//! (its directory, collisions between outputs, never an input), files are placed by a link that
//! replaces nothing and leaves no temp file behind, existing files are replaced only with
//! consent, a full filesystem does not lose the run, and diff's inputs have one memory budget.

use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::Command;

mod common;
use common::{names_in, root_allowed};

fn scratch() -> tempfile::TempDir {
    common::scratch("vg-out-")
}

fn vg() -> Command {
    Command::cargo_bin("virtgap").unwrap()
}

/// Asserts a failed run printed exactly one line on stderr containing `needle`, and nothing
/// on stdout.
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

/// A fast null-engine record without probes, its temp file in `dir`.
fn record_args(dir: &Path) -> Vec<String> {
    record_for(dir, "1s")
}

fn record_for(dir: &Path, duration: &str) -> Vec<String> {
    [
        "record",
        "--engine",
        "null",
        "--size",
        "4MiB",
        "--duration",
        duration,
        "--no-probes",
        "--dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([dir.display().to_string()])
    .collect()
}

fn quick(dir: &Path) -> Command {
    let mut c = vg();
    c.args(record_args(dir)).arg("--quiet");
    c
}

/// A profile recorded into `path`.
fn profile(dir: &Path, path: &Path) {
    quick(dir).arg("-o").arg(path).assert().success();
}

fn is_profile(path: &Path) -> bool {
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    serde_json::from_slice::<serde_json::Value>(&bytes)
        .map(|v| v["schema_version"].is_u64() && v["intervals"].is_array())
        .unwrap_or(false)
}

fn has_strace() -> Result<(), String> {
    match StdCommand::new("strace").arg("-V").output() {
        Ok(out) if out.status.success() => Ok(()),
        _ => Err("strace is not installed".into()),
    }
}

#[test]
fn diff_never_writes_over_an_input_even_with_consent() {
    let dir = scratch();
    let a = dir.path().join("a.json");
    let b = dir.path().join("b.json");
    profile(dir.path(), &a);
    std::fs::copy(&a, &b).unwrap();
    let before = std::fs::read(&a).unwrap();
    let diff = |extra: &[&str]| {
        let mut c = vg();
        c.arg("diff").arg(&a).arg(&b).args(extra);
        c
    };
    let a_str = a.to_str().unwrap();
    fails_with(&mut diff(&["--csv", a_str]), "which this command reads");
    fails_with(
        &mut diff(&["--csv", a_str, "--overwrite"]),
        "which this command reads",
    );
    // Another spelling of it, and a hard link to it.
    let spelled = dir.path().join(".").join("b.json");
    fails_with(
        &mut diff(&["--csv", spelled.to_str().unwrap(), "--overwrite"]),
        "which this command reads",
    );
    let hard = dir.path().join("hard.csv");
    std::fs::hard_link(&a, &hard).unwrap();
    fails_with(
        &mut diff(&["--csv", hard.to_str().unwrap(), "--overwrite"]),
        "which this command reads",
    );
    // A pooled replicate, and an input that --svg would write over.
    let c = dir.path().join("c.json");
    std::fs::copy(&a, &c).unwrap();
    fails_with(
        &mut diff(&[
            "--with-a",
            c.to_str().unwrap(),
            "--csv",
            c.to_str().unwrap(),
        ]),
        "which this command reads",
    );
    let charts = dir.path().join("charts");
    std::fs::create_dir(&charts).unwrap();
    let as_chart = charts.join("waterfall.svg");
    std::fs::copy(&a, &as_chart).unwrap();
    fails_with(
        &mut diff(&[
            "--with-b",
            as_chart.to_str().unwrap(),
            "--svg",
            charts.to_str().unwrap(),
            "--overwrite",
        ]),
        "which this command reads",
    );
    assert_eq!(std::fs::read(&a).unwrap(), before, "a.json is intact");
    assert_eq!(std::fs::read(&as_chart).unwrap(), before);
    assert!(is_profile(&a) && is_profile(&b) && is_profile(&c));
}

#[test]
fn diff_replaces_existing_files_only_with_overwrite() {
    let dir = scratch();
    let a = dir.path().join("a.json");
    profile(dir.path(), &a);
    let csv = dir.path().join("d.csv");
    std::fs::write(&csv, "keep me").unwrap();
    let svg = dir.path().join("svg");
    std::fs::create_dir(&svg).unwrap();
    std::fs::write(svg.join("percentiles.svg"), "keep me too").unwrap();
    let diff = || {
        let mut c = vg();
        c.arg("diff").arg(&a).arg(&a);
        c
    };
    fails_with(
        diff().arg("--csv").arg(&csv),
        "already exists; pass --overwrite to replace it",
    );
    fails_with(
        diff().arg("--svg").arg(&svg),
        "percentiles.svg already exists; pass --overwrite to replace it",
    );
    let html = dir.path().join("report.html");
    std::fs::write(&html, "keep me three").unwrap();
    fails_with(
        diff().arg("--html").arg(&html),
        "already exists; pass --overwrite to replace it",
    );
    assert_eq!(std::fs::read_to_string(&html).unwrap(), "keep me three");
    assert_eq!(std::fs::read_to_string(&csv).unwrap(), "keep me");
    assert_eq!(
        std::fs::read_to_string(svg.join("percentiles.svg")).unwrap(),
        "keep me too"
    );
    // New files need no consent; existing ones are replaced with it.
    let fresh = dir.path().join("fresh");
    diff()
        .arg("--csv")
        .arg(dir.path().join("new.csv"))
        .arg("--svg")
        .arg(&fresh)
        .assert()
        .success();
    assert_eq!(
        names_in(&fresh),
        ["hypervisor.svg", "percentiles.svg", "waterfall.svg"]
    );
    diff()
        .arg("--csv")
        .arg(&csv)
        .arg("--svg")
        .arg(&svg)
        .arg("--overwrite")
        .assert()
        .success();
    assert!(std::fs::read_to_string(&csv)
        .unwrap()
        .starts_with("metric,"));
    assert!(std::fs::read_to_string(svg.join("percentiles.svg"))
        .unwrap()
        .contains("<svg"));
    assert!(
        names_in(dir.path()).iter().all(|n| !n.contains(".tmp")),
        "{:?}",
        names_in(dir.path())
    );
}

/// All of diff's inputs together are bounded from their sizes, before any is read.
#[test]
fn diff_inputs_share_one_size_budget_checked_before_reading() {
    let dir = scratch();
    // Sparse: their size is what is judged, and nothing is read.
    let big: Vec<PathBuf> = ["a", "b", "c"]
        .iter()
        .map(|n| {
            let p = dir.path().join(format!("{n}.json"));
            std::fs::File::create(&p)
                .unwrap()
                .set_len(200 << 20)
                .unwrap();
            p
        })
        .collect();
    let started = Instant::now();
    fails_with(
        vg().arg("diff")
            .arg(&big[0])
            .arg(&big[1])
            .arg("--with-a")
            .arg(&big[2]),
        "the 3 profiles to compare total 600 MiB, over the 512 MiB diff reads at once",
    );
    assert!(started.elapsed() < Duration::from_secs(2), "nothing parsed");
}

/// `-o newdir/` (a directory) and `-o missing/p.json` fail at once, not after the run.
#[test]
fn an_output_that_cannot_be_written_fails_before_the_run() {
    let dir = scratch();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    for (target, needle) in [
        (format!("{}/newdir/", out.display()), "names a directory"),
        (
            format!("{}/missing/p.json", out.display()),
            "does not exist",
        ),
    ] {
        let started = Instant::now();
        fails_with(
            vg().args(record_for(dir.path(), "5s"))
                .args(["--quiet", "-o", &target]),
            needle,
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{target}: refused only after {:?}",
            started.elapsed()
        );
    }
    assert!(names_in(&out).is_empty(), "{:?}", names_in(&out));
}

/// Two outputs naming one file are refused before the run, --force or not: one would
/// silently replace the other.
#[test]
fn outputs_that_collide_are_refused_before_the_run() {
    let dir = scratch();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let x = out.join("X");
    let started = Instant::now();
    fails_with(
        vg().args(["record", "--quiet", "-w", "kv-act", "--no-probes", "--dir"])
            .arg(dir.path())
            .args(["--size", "32MiB", "--duration", "3s", "--force", "-o"])
            .arg(&x)
            .arg("--act-log")
            .arg(&x),
        "--act-log",
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    let csv = out.join("csv");
    std::fs::create_dir(&csv).unwrap();
    fails_with(
        quick(dir.path())
            .arg("--force")
            .arg("-o")
            .arg(csv.join("summary.csv"))
            .arg("--csv")
            .arg(&csv),
        "is the same file as --output",
    );
    // The same when the path is spelled otherwise.
    fails_with(
        vg().args(["record", "--quiet", "-w", "kv-act", "--no-probes", "--dir"])
            .arg(dir.path())
            .args(["--force", "--csv"])
            .arg(&csv)
            .arg("--act-log")
            .arg(out.join("csv/../csv/host.csv")),
        "is the same file as --csv",
    );
    assert_eq!(names_in(&out), ["csv"]);
    assert!(names_in(&csv).is_empty());
}

/// Neither the workload file nor the --target is ever an output, whatever --force says.
#[test]
fn record_never_writes_over_what_it_reads() {
    let dir = scratch();
    let workload = dir.path().join("w.toml");
    let text = vg().args(["workloads", "rand4k"]).output().unwrap().stdout;
    std::fs::write(&workload, &text).unwrap();
    fails_with(
        quick(dir.path())
            .arg("-w")
            .arg(&workload)
            .arg("--force")
            .arg("-o")
            .arg(&workload),
        "is the workload file",
    );
    let target = dir.path().join("t.img");
    std::fs::write(&target, vec![7u8; 1 << 20]).unwrap();
    fails_with(
        vg().args([
            "record",
            "--quiet",
            "--engine",
            "null",
            "--no-probes",
            "--target",
        ])
        .arg(&target)
        .arg("--force")
        .arg("-o")
        .arg(dir.path().join("./t.img")),
        "is the --target",
    );
    assert_eq!(std::fs::read(&workload).unwrap(), text);
    assert_eq!(std::fs::read(&target).unwrap(), vec![7u8; 1 << 20]);
    // The TUI's --save is never its --baseline.
    let baseline = dir.path().join("base.json");
    profile(dir.path(), &baseline);
    fails_with(
        vg().arg("tui")
            .arg("--baseline")
            .arg(&baseline)
            .arg("--save")
            .arg(&baseline)
            .write_stdin(""),
        "is the --baseline profile",
    );
    assert!(is_profile(&baseline));
}

/// An image behind a loop device is never an output, whatever the consent: not the target's
/// own backing file (record, and iotune, which only reads its target here), not the image of
/// another loop device. Replacing it left the loop device on a deleted file.
#[test]
fn an_image_behind_a_loop_device_is_never_replaced_by_an_output() {
    if !common::root_allowed("outputs over a loop device's backing file") {
        return;
    }
    let dir = scratch();
    let img = dir.path().join("h.img");
    std::fs::write(&img, vec![9u8; 16 << 20]).unwrap();
    let other = dir.path().join("o.img");
    std::fs::write(&other, vec![3u8; 16 << 20]).unwrap();
    let attach = |f: &Path| {
        let out = StdCommand::new("losetup")
            .args(["-f", "--show"])
            .arg(f)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let (dev, other_dev) = (attach(&img), attach(&other));
    let plain = |dev: &str| {
        let mut c = vg();
        c.args([
            "record",
            "--quiet",
            "--engine",
            "null",
            "--no-probes",
            "--duration",
            "1s",
            "--target",
            dev,
            "--force",
        ]);
        c
    };
    fails_with(plain(&dev).arg("-o").arg(&img), "backs /dev/loop");
    fails_with(plain(&dev).arg("--svg").arg(&img), "backs /dev/loop");
    fails_with(plain(&other_dev).arg("-o").arg(&img), "backs /dev/loop");
    fails_with(
        vg().args([
            "iotune",
            "--target",
            &dev,
            "--phases",
            "read_iops",
            "--no-probes",
            "-o",
        ])
        .arg(&img)
        .arg("--force"),
        "backs /dev/loop",
    );
    for d in [&dev, &other_dev] {
        let _ = StdCommand::new("losetup").args(["-d", d]).status();
    }
    assert_eq!(std::fs::read(&img).unwrap(), vec![9u8; 16 << 20]);
}

/// A full filesystem at the end of a run: the summary still reaches stdout, the profile (and
/// the CSV files) are saved under the temp directory with their path said, and the exit is
/// non-zero.
#[test]
fn a_full_filesystem_keeps_the_summary_and_saves_the_profile_aside() {
    if !root_allowed("full-filesystem test (mounts a tmpfs)") {
        return;
    }
    let dir = scratch();
    let full = dir.path().join("full");
    let rescue = dir.path().join("tmp");
    std::fs::create_dir(&full).unwrap();
    std::fs::create_dir(&rescue).unwrap();
    // A private mount namespace: the tiny tmpfs goes away with the command.
    let script = format!(
        "mount -t tmpfs -o size=256k tmpfs {full} && \
         (dd if=/dev/zero of={full}/filler bs=4k 2>/dev/null; true) && exec \"$@\"",
        full = full.display()
    );
    let out = StdCommand::new("unshare")
        .args(["-m", "sh", "-c", &script, "sh"])
        .arg(env!("CARGO_BIN_EXE_virtgap"))
        .args(record_args(dir.path()))
        .arg("-o")
        .arg(full.join("p.json"))
        .arg("--csv")
        .arg(full.join("csv"))
        .env("TMPDIR", &rescue)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stdout.contains("IOPS") && stdout.contains("latency"),
        "the summary is on stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(stderr.contains("No space left on device"), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("profile is saved as"))
        .unwrap_or_else(|| panic!("no saved-as line: {stderr}"));
    let saved = line
        .split("saved as ")
        .nth(1)
        .and_then(|rest| rest.split(" instead").next())
        .map(PathBuf::from)
        .unwrap();
    assert!(saved.starts_with(&rescue), "{line}");
    assert!(is_profile(&saved), "{} is a profile", saved.display());
    let aside = saved.parent().unwrap();
    for name in ["intervals.csv", "summary.csv", "host.csv"] {
        assert!(aside.join(name).is_file(), "{name}: {stderr}");
    }
}

/// Killed while the output is being placed: no temp file is left, as the file had no name
/// until the link that gives it its final one.
#[test]
fn sigkill_while_placing_the_output_leaves_nothing_behind() {
    if !virtgap_testkit::require("SIGKILL-while-writing test", has_strace()) {
        return;
    }
    let dir = scratch();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let trace = dir.path().join("trace");
    let target = out.join("p.json");
    // Every call that could give the file its name waits 5 s: the data is written by then.
    let mut child = StdCommand::new("strace")
        .args(["-f", "-qq", "-o"])
        .arg(&trace)
        .args([
            "-e",
            "trace=openat,linkat,link,rename,renameat,renameat2",
            "-e",
            "inject=linkat,link,rename,renameat,renameat2:delay_enter=5000000",
        ])
        .arg(env!("CARGO_BIN_EXE_virtgap"))
        .args(record_args(dir.path()))
        .arg("--quiet")
        .arg("-o")
        .arg(&target)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let quoted = format!("\"{}\"", target.display());
    let deadline = Instant::now() + Duration::from_secs(60);
    let placing = loop {
        let text = std::fs::read_to_string(&trace).unwrap_or_default();
        let line = text
            .lines()
            .find(|l| (l.contains("link") || l.contains("rename")) && l.contains(&quoted));
        if let Some(line) = line {
            break line.to_string();
        }
        assert!(Instant::now() < deadline, "never placed: {text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let pid: i32 = placing.split_whitespace().next().unwrap().parse().unwrap();
    // Mid-placement: nothing of this run has a name yet.
    let seen = names_in(&out);
    // SAFETY: plain kill(2) of the traced virtgap, a process of this test.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    child.wait().unwrap();
    let text = std::fs::read_to_string(&trace).unwrap();
    let out_dir = format!("\"{}\"", out.display());
    assert!(
        text.lines()
            .any(|l| l.contains(&out_dir) && l.contains("O_TMPFILE")),
        "written into an anonymous file in its directory: {text}"
    );
    assert!(seen.is_empty(), "named while placing: {seen:?}");
    assert!(names_in(&out).is_empty(), "left: {:?}", names_in(&out));
}

/// Two runs in two pid namespaces, both pid 1, writing one path at the same moment: neither
/// touches the other's file, and both profiles are kept (the second beside the first).
#[test]
fn two_runs_with_one_pid_in_two_namespaces_both_keep_their_profile() {
    if !root_allowed("pid-namespace test")
        || !virtgap_testkit::require("two-namespace test", has_strace())
    {
        return;
    }
    let dir = scratch();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let shared = out.join("shared.json");
    // Placing waits 3 s in each: the two writes overlap for certain.
    let spawn = || {
        StdCommand::new("strace")
            .args([
                "-f",
                "-qq",
                "-o",
                "/dev/null",
                "-e",
                "trace=linkat,link,rename,renameat,renameat2",
                "-e",
                "inject=linkat,link,rename,renameat,renameat2:delay_enter=3000000",
                "unshare",
                "-pf",
            ])
            .arg(env!("CARGO_BIN_EXE_virtgap"))
            .args(record_args(dir.path()))
            .arg("--quiet")
            .arg("-o")
            .arg(&shared)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (first, second) = (spawn(), spawn());
    let results = [first, second].map(|c| c.wait_with_output().unwrap());
    let stderrs: Vec<String> = results
        .iter()
        .map(|r| String::from_utf8_lossy(&r.stderr).into_owned())
        .collect();
    let ok = results.iter().filter(|r| r.status.success()).count();
    assert_eq!(ok, 1, "one run places the file: {stderrs:?}");
    let other = stderrs
        .iter()
        .find(|s| s.contains("not replacing it"))
        .unwrap_or_else(|| panic!("{stderrs:?}"));
    let beside = other
        .split("this run's file is ")
        .nth(1)
        .map(|s| PathBuf::from(s.trim()))
        .unwrap();
    assert!(is_profile(&shared) && is_profile(&beside), "{stderrs:?}");
    assert_eq!(names_in(&out).len(), 2, "{:?}", names_in(&out));
}

/// A temp file named as older versions named theirs, `.NAME.tmp-<pid>`, with this run's pid
/// (pid 1 in a new pid namespace): left alone, and not in the way.
#[test]
fn a_stale_pid_named_temp_file_is_neither_touched_nor_in_the_way() {
    if !root_allowed("pid-namespace test") {
        return;
    }
    let dir = scratch();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let stale = out.join(".p.json.tmp-1");
    std::fs::write(&stale, "another run's").unwrap();
    let res = StdCommand::new("unshare")
        .arg("-pf")
        .arg(env!("CARGO_BIN_EXE_virtgap"))
        .args(record_args(dir.path()))
        .arg("--quiet")
        .arg("-o")
        .arg(out.join("p.json"))
        .output()
        .unwrap();
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
    assert!(is_profile(&out.join("p.json")));
    assert_eq!(std::fs::read_to_string(&stale).unwrap(), "another run's");
    assert_eq!(names_in(&out), [".p.json.tmp-1", "p.json"]);
}

/// Names of outputs on stderr are shown with their escapes neutralised.
#[test]
fn escapes_in_output_names_are_shown_not_obeyed() {
    let dir = scratch();
    let p = dir.path().join("p\u{1b}[31m.json");
    let csv = dir.path().join("c\u{1b}]0;title\u{7}");
    let out = vg()
        .args(record_args(dir.path()))
        .arg("-o")
        .arg(&p)
        .arg("--csv")
        .arg(&csv)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("wrote profile") && stderr.contains("CSV files into"),
        "{stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}') && !stderr.contains('\u{7}'),
        "raw escapes on stderr: {stderr:?}"
    );
    assert!(stderr.contains("\\u{1b}[31m.json"), "{stderr}");
    // The error for an existing one too.
    let out = quick(dir.path()).arg("-o").arg(&p).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("already exists"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}
