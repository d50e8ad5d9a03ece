//! `virtgap iotune` end to end: the four figures on a temp file, io_properties.yaml read back by
//! PyYAML (what ScyllaDB's own setup scripts read it with), the write phases refused on a file
//! it was not allowed to write (and the file left as it was), and the diff of two results.
// Test progress, on the harness's stderr: eprintln! is fine here.
#![allow(clippy::disallowed_macros)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;

mod common;
use common::{is_root, which};

fn vg() -> Command {
    Command::new(env!("CARGO_BIN_EXE_virtgap"))
}

/// Short steps and runs: the figures' accuracy is the benchmark's business, not this test's.
const QUICK: [&str; 6] = ["--step", "500ms", "--duration", "1s", "--ramp", "200ms"];

fn output(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn four_figures_on_a_temp_file_with_the_yaml_scylla_reads() {
    let dir = common::scratch("vg-iotune-");
    let (result, yaml) = (dir.path().join("r.json"), dir.path().join("io.yaml"));
    let mut cmd = vg();
    cmd.arg("iotune")
        .arg("--target")
        .arg(dir.path())
        .args(QUICK)
        .args(["--size", "64MiB", "--runs", "2", "--label", "metal"])
        .arg("-o")
        .arg(&result)
        .arg("--yaml")
        .arg(&yaml);
    // With the probes where they can load (root), so each phase's profile has its stages.
    if !is_root() {
        cmd.arg("--no-probes");
    }
    let (ok, stdout, stderr) = output(&mut cmd);
    assert!(ok, "{stderr}");
    eprintln!("{stdout}");
    let doc: Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
    // The host's name, kept in the result and shown on its side of the summary.
    assert_eq!(doc["host"]["label"], "metal");
    assert!(stdout.contains("metal ("), "{stdout}");
    let phases = doc["phases"].as_array().unwrap();
    let keys: Vec<&str> = phases
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        [
            "read_bandwidth",
            "write_bandwidth",
            "read_iops",
            "write_iops"
        ]
    );
    for p in phases {
        let figure = p["figure"].as_f64().unwrap();
        assert!(figure > 0.0, "{p}");
        let runs: Vec<f64> = p["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_f64().unwrap())
            .collect();
        assert_eq!(runs.len(), 2);
        assert!((runs.iter().sum::<f64>() / 2.0 - figure).abs() <= 1e-6 * figure);
        // The search doubled the depth from 1 and the peak is one of its steps.
        let search = p["search"].as_array().unwrap();
        assert_eq!(search[0]["qd"], 1);
        assert!(search.iter().any(|s| s["qd"] == p["qd"]));
        assert_eq!(p["profile"]["runs"].as_array().unwrap().len(), 2);
        if is_root() {
            assert!(
                p["profile"]["stages"]["device"]["count"].as_u64().unwrap() > 0,
                "the block probe saw the phase's requests"
            );
        }
        assert!(stdout.contains(p["phase"].as_str().unwrap()));
    }
    // A bandwidth phase's figure is its bytes over its seconds: 1 MiB requests.
    assert_eq!(phases[0]["block_size"], 1 << 20);
    assert_eq!(phases[2]["block_size"], 4096);

    // PyYAML, as ScyllaDB's scylla_io_setup reads io_properties.yaml.
    let Some(python) = which("python3") else {
        panic!("python3 (installed by setup.sh) is missing");
    };
    let script = r#"
import sys, json, yaml
doc = yaml.safe_load(open(sys.argv[1]))
print(json.dumps(doc))
"#;
    let parsed = Command::new(python)
        .arg("-c")
        .arg(script)
        .arg(&yaml)
        .output()
        .unwrap();
    assert!(
        parsed.status.success(),
        "PyYAML (python3-yaml, installed by setup.sh): {}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    let y: Value = serde_json::from_slice(&parsed.stdout).unwrap();
    let disks = y["disks"].as_array().unwrap();
    assert_eq!(disks.len(), 1);
    let disk = disks[0].as_object().unwrap();
    let mut names: Vec<&str> = disk.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "mountpoint",
            "read_bandwidth",
            "read_iops",
            "write_bandwidth",
            "write_iops"
        ]
    );
    assert_eq!(y.as_object().unwrap().len(), 1, "only `disks`: {y}");
    for p in phases {
        let key = p["phase"].as_str().unwrap();
        let figure = p["figure"].as_f64().unwrap();
        assert_eq!(disk[key].as_u64(), Some(figure.round() as u64), "{key}");
    }
    let mountpoint = disk["mountpoint"].as_str().unwrap();
    assert!(
        dir.path().canonicalize().unwrap().starts_with(mountpoint),
        "{mountpoint} holds {}",
        dir.path().display()
    );

    // The result diffs against itself: four judged rows, and JSON on request.
    let (ok, text, stderr) = output(vg().arg("diff").arg(&result).arg(&result));
    assert!(ok, "{stderr}");
    for key in keys {
        assert!(text.lines().any(|l| l.starts_with(key)), "{text}");
    }
    let (ok, json, _) = output(vg().arg("diff").arg("--json").arg(&result).arg(&result));
    assert!(ok);
    let d: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(d["phases"].as_array().unwrap().len(), 4);
    assert_eq!(d["phases"][2]["a"], d["phases"][2]["b"]);
}

fn digest(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[test]
fn an_existing_file_is_only_read_without_consent_and_yaml_says_why_not() {
    let dir = common::scratch("vg-iotune-file-");
    let data = common::data_file(dir.path(), "data.bin", 16 * 256);
    let before = digest(&data);
    let yaml = dir.path().join("io.yaml");
    // io_properties.yaml needs the write figures: refused before anything runs.
    let (ok, _, stderr) = output(
        vg().arg("iotune")
            .arg("--target")
            .arg(&data)
            .arg("--yaml")
            .arg(&yaml),
    );
    assert!(!ok);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("--yaml needs all four figures")
            && stderr.contains("pass --destroy-data naming it"),
        "{stderr}"
    );
    assert!(!yaml.exists());
    // Without --yaml the read phases run; the file is untouched.
    let (ok, stdout, stderr) = output(
        vg().arg("iotune")
            .arg("--target")
            .arg(&data)
            .args(QUICK)
            .args(["--runs", "1", "--no-probes"]),
    );
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("skipping write_bandwidth and write_iops"),
        "{stderr}"
    );
    assert!(
        stdout.contains("read_iops") && !stdout.contains("write_iops "),
        "{stdout}"
    );
    assert_eq!(digest(&data), before, "the target's data is as it was");
}

#[test]
fn a_profile_and_an_iotune_result_are_not_compared() {
    let dir = common::scratch("vg-iotune-mixed-");
    let result = dir.path().join("r.json");
    let (ok, _, stderr) = output(
        vg().arg("iotune")
            .arg("--target")
            .arg(dir.path())
            .args(QUICK)
            .args(["--size", "64MiB", "--runs", "1", "--no-probes"])
            .args(["--phases", "read_iops", "-o"])
            .arg(&result),
    );
    assert!(ok, "{stderr}");
    let profile = dir.path().join("p.json");
    std::fs::write(&profile, include_str!("data/minimal-profile.json")).unwrap();
    let (ok, _, stderr) = output(vg().arg("diff").arg(&profile).arg(&result));
    assert!(!ok);
    assert!(
        stderr.contains("host A has a profile among iotune results"),
        "{stderr}"
    );
}

/// A device written run after run by one process: iotune's write and read phases on one open,
/// and `record --runs 2` reopening it (the kernel releases a closed io_uring's claim on the
/// device in the background: the second open must not call the device busy).
#[test]
fn a_device_is_written_run_after_run() {
    if !common::root_allowed("iotune and record --runs 2 on a loop device") {
        return;
    }
    let Some(lo) = virtgap_testkit::ready(
        "a loop device over /dev/shm",
        virtgap_testkit::block::MemoryLoop::new(64 << 20),
    ) else {
        return;
    };
    let (ok, stdout, stderr) = output(
        vg().arg("iotune")
            .arg("--target")
            .arg(&lo.disk)
            .arg("--destroy-data")
            .arg(&lo.backing)
            .args(QUICK)
            .args([
                "--runs",
                "1",
                "--no-probes",
                "--phases",
                "write_iops,read_iops",
            ]),
    );
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("write_iops") && stdout.contains("read_iops"),
        "{stdout}"
    );
    let (ok, _, stderr) = output(
        vg().args([
            "record",
            "-w",
            "rand4k-write",
            "--runs",
            "2",
            "--duration",
            "1s",
        ])
        .args(["--no-probes", "--quiet", "--target"])
        .arg(&lo.disk)
        .arg("--destroy-data")
        .arg(&lo.backing),
    );
    assert!(ok, "{stderr}");
}

/// A file smaller than a block per worker is refused before anything is written: each worker
/// would get a region past its end (writes grew a 2 MiB file to 4 and 32 MiB; reads returned
/// nothing). Nothing of the file changes, its size least of all.
#[test]
fn a_file_smaller_than_a_block_per_worker_is_refused_and_left_as_it_was() {
    let dir = common::scratch("vg-iotune-small-");
    let data = common::data_file(dir.path(), "w2.bin", 512);
    let before = digest(&data);
    for (phase, consent) in [("write_bandwidth", true), ("read_bandwidth", false)] {
        let mut cmd = vg();
        cmd.arg("iotune").arg("--target").arg(&data);
        if consent {
            cmd.arg("--destroy-data").arg(&data);
        }
        let (ok, _, stderr) = output(cmd.args(QUICK).args([
            "--runs",
            "1",
            "--no-probes",
            "--workers",
            "4",
            "--phases",
            phase,
        ]));
        assert!(!ok, "{phase} on a 2 MiB file ran");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("the target holds 2 MiB") && stderr.contains("name a larger target"),
            "{stderr}"
        );
        assert_eq!(digest(&data), before, "{phase}: the file changed");
    }
}

/// Runs too short to measure anything are refused before they run: 1 ns gave every figure 0,
/// 1 ms gave 66 I/Os as 66,000 IOPS, and both went into io_properties.yaml.
#[test]
fn runs_too_short_for_a_figure_are_refused() {
    let dir = common::scratch("vg-iotune-short-");
    let yaml = dir.path().join("io.yaml");
    for (flag, span, other) in [
        ("--duration", "1ns", "--step"),
        ("--duration", "1ms", "--step"),
        ("--step", "50ms", "--duration"),
    ] {
        let (ok, _, stderr) = output(
            vg().arg("iotune")
                .arg("--target")
                .arg(dir.path())
                .args([flag, span, other, "1s", "--no-probes", "--yaml"])
                .arg(&yaml),
        );
        assert!(!ok, "{flag} {span} ran");
        assert!(
            stderr.contains(&format!("{flag} {span} is too short")),
            "{stderr}"
        );
        assert!(!yaml.exists());
    }
}

/// A read-only block device is refused for the write phases before any phase runs (it used to
/// fail with EPERM after the read phases had run).
#[test]
fn a_read_only_device_is_refused_for_writes_up_front() {
    if !common::root_allowed("iotune on a read-only loop device") {
        return;
    }
    let dir = common::scratch("vg-iotune-ro-");
    let img = common::data_file(dir.path(), "ro.img", 16 * 256);
    let out = Command::new("losetup")
        .args(["-r", "-f", "--show"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (ok, stdout, stderr) = output(
        vg().args(["iotune", "--target", &dev, "--destroy-data"])
            .arg(&img)
            .args(QUICK)
            .args(["--runs", "1", "--no-probes"]),
    );
    let _ = Command::new("losetup").args(["-d", &dev]).status();
    assert!(!ok);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("is read-only"), "{stderr}");
    assert!(
        !stdout.contains("read_bandwidth"),
        "a phase ran first: {stdout}"
    );
}
