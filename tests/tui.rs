//! The real binary's TUI under tmux: it starts the workload, shows a nonzero IOPS, switches
//! views on keys, quits on `q`, and leaves no BPF program of ours loaded and no temp file.
// Test progress, on the harness's stderr: eprintln! is fine here.
#![allow(clippy::disallowed_macros)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use virtgap::model::stages::Stage;
use virtgap_workloads::units;

mod common;

/// One virtgap at a time: a test checks that no program of ours stays loaded after its run.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The start of every test here: tmux present (else a skip, or in CI a failure), one virtgap
/// at a time, and a scratch directory named `prefix`….
fn tmux_test(prefix: &str) -> Option<(std::sync::MutexGuard<'static, ()>, tempfile::TempDir)> {
    if !virtgap_testkit::require(
        "the TUI under tmux",
        Command::new("tmux").arg("-V").output().map(drop),
    ) {
        return None;
    }
    let serial = serial();
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    Some((serial, dir))
}

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux")
        .args(args)
        .output()
        .expect("tmux (installed by setup.sh)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn wait_for(session: &str, what: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let screen = tmux(&["capture-pane", "-p", "-t", session]);
        if screen.contains(what) || Instant::now() > deadline {
            return screen;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A detached 120x40 tmux session running `cmd`.
fn start_session(session: &str, cmd: &str) {
    tmux(&[
        "new-session",
        "-d",
        "-s",
        session,
        "-x",
        "120",
        "-y",
        "40",
        cmd,
    ]);
}

/// What the session's shell wrote to `file` as virtgap's exit status (empty after 20 s).
fn exit_status(file: &std::path::Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !file.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::read_to_string(file).unwrap_or_default()
}

/// Names (as the kernel truncates them) of programs only virtgap loads.
const OUR_PROGRAMS: [&str; 4] = [
    "block_io_start_",
    "local_timer_ent",
    "sched_wakeup_bt",
    "softirq_entry_b",
];

fn our_programs_loaded() -> Vec<String> {
    let out = Command::new("bpftool")
        .args(["prog", "show"])
        .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
        .output()
        .expect("bpftool (installed by setup.sh)");
    let text = String::from_utf8_lossy(&out.stdout);
    OUR_PROGRAMS
        .iter()
        .filter(|n| text.contains(&format!("name {n}")))
        .map(|n| n.to_string())
        .collect()
}

/// The IOPS figure of the header line ("… · 63.9k IOPS · …").
fn header_iops(screen: &str) -> Option<f64> {
    let line = screen.lines().find(|l| l.contains(" IOPS · "))?;
    let word = line.split(" IOPS").next()?.rsplit(' ').next()?;
    let (num, mult) = match word.chars().last()? {
        'k' => (&word[..word.len() - 1], 1e3),
        'M' => (&word[..word.len() - 1], 1e6),
        _ => (word, 1.0),
    };
    num.parse::<f64>().ok().map(|v| v * mult)
}

#[test]
fn the_tui_runs_under_tmux_switches_views_and_quits_cleanly() {
    let Some((_serial, dir)) = tmux_test("vg-tui-") else {
        return;
    };
    let exit_file = dir.path().join("exit-status");
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let session = format!("vg-tui-{}", std::process::id());
    let cmd = format!(
        "{} --size 64MiB --dir {}; echo $? > {}",
        env!("CARGO_BIN_EXE_virtgap"),
        work.display(),
        exit_file.display()
    );
    start_session(&session, &cmd);
    let kill = || tmux(&["kill-session", "-t", &session]);

    wait_for(&session, "IOPS ·", Duration::from_secs(30));
    // The first measured interval arrives a second or so after the header.
    let deadline = Instant::now() + Duration::from_secs(15);
    let screen = loop {
        let screen = tmux(&["capture-pane", "-p", "-t", &session]);
        if header_iops(&screen).is_some_and(|v| v > 0.0) || Instant::now() > deadline {
            break screen;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let iops = header_iops(&screen);
    assert!(
        iops.is_some_and(|v| v > 0.0),
        "no IOPS in the header:\n{screen}"
    );
    assert!(screen.contains("Where the time goes"), "{screen}");

    tmux(&["send-keys", "-t", &session, "2"]);
    let cpus = wait_for(&session, "CPU time by state", Duration::from_secs(5));
    assert!(
        cpus.contains("CPU time by state"),
        "view 2 did not show:\n{cpus}"
    );
    tmux(&["send-keys", "-t", &session, "4"]);
    let devices = wait_for(&session, "queue -> IRQ -> CPU", Duration::from_secs(5));
    assert!(
        devices.contains("queue -> IRQ -> CPU"),
        "view 4 did not show:\n{devices}"
    );

    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0 && Path::new("/sys/kernel/btf/vmlinux").exists();
    if root {
        assert!(
            !our_programs_loaded().is_empty(),
            "the probes were not loaded while the TUI ran"
        );
    }
    tmux(&["send-keys", "-t", &session, "q"]);
    let status = exit_status(&exit_file);
    kill();
    assert_eq!(status.trim(), "0", "virtgap exited with {status:?}");
    let left: Vec<_> = std::fs::read_dir(&work).unwrap().collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
    if root {
        let loaded = our_programs_loaded();
        assert!(
            loaded.is_empty(),
            "programs still loaded after quit: {loaded:?}"
        );
    }
}

/// With --duration the run ends on its own: the screen says finished, its clock stops, and the
/// view stays until a key; SIGTERM then exits 143 (128 + SIGTERM), as a shell reports it.
#[test]
fn a_timed_run_finishes_on_screen_and_sigterm_exits_143() {
    let Some((_serial, dir)) = tmux_test("vg-tui-") else {
        return;
    };
    let (exit_file, pid_file) = (dir.path().join("exit-status"), dir.path().join("pid"));
    let session = format!("vg-tui-timed-{}", std::process::id());
    let cmd = format!(
        "{} --size 16MiB --duration 2s --no-probes --dir {} </dev/tty & echo $! > {}; wait $!; echo $? > {}",
        env!("CARGO_BIN_EXE_virtgap"),
        dir.path().display(),
        pid_file.display(),
        exit_file.display()
    );
    start_session(&session, &cmd);
    let kill = || tmux(&["kill-session", "-t", &session]);
    let first = wait_for(&session, "run finished · q quit", Duration::from_secs(30));
    assert!(
        first.contains("run finished · q quit"),
        "never finished:\n{first}"
    );
    std::thread::sleep(Duration::from_millis(1500));
    let later = tmux(&["capture-pane", "-p", "-t", &session]);
    let header = |s: &str| s.lines().nth(1).unwrap_or("").to_string();
    assert_eq!(
        header(&first),
        header(&later),
        "the clock kept running after the end"
    );
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: plain kill(2) on the TUI process this test started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = exit_status(&exit_file);
    kill();
    assert_eq!(status.trim(), "143", "virtgap exited with {status:?}");
}

/// Every JSON path under `v` (array elements merged as `[]`), each with whether any value there
/// was non-null.
fn json_paths(v: &serde_json::Value, at: &str, out: &mut std::collections::BTreeMap<String, bool>) {
    use serde_json::Value;
    let seen = out.entry(at.to_string()).or_insert(false);
    *seen |= !v.is_null();
    match v {
        Value::Object(map) => {
            for (k, x) in map {
                // Maps keyed by what the host had or did (IRQ names, vectors, IPI kinds,
                // sample categories) are data, not fields.
                let data = [
                    ".irqs",
                    ".irq_time_ns",
                    ".vectors",
                    ".ipis_sent",
                    ".categories",
                ];
                let k = if data.iter().any(|d| at.ends_with(d)) {
                    "*"
                } else {
                    k.as_str()
                };
                json_paths(x, &format!("{at}.{k}"), out);
            }
        }
        Value::Array(items) => {
            for x in items {
                json_paths(x, &format!("{at}[]"), out);
            }
        }
        _ => {}
    }
}

/// A profile saved with `s` from the TUI is a `record` profile: the same fields, measured or
/// not alike, the same run record and the same interval join. The paths listed below are the
/// ones a mid-run save cannot fill, or that name the run rather than measure it.
#[test]
fn a_profile_saved_from_the_tui_has_the_fields_of_a_recorded_one() {
    let Some((_serial, dir)) = tmux_test("vg-tui-save-") else {
        return;
    };
    let (saved, recorded) = (dir.path().join("tui.json"), dir.path().join("record.json"));
    let exit_file = dir.path().join("exit-status");
    let bin = env!("CARGO_BIN_EXE_virtgap");
    let args = format!("--size 16MiB --duration 3s --dir {}", dir.path().display());
    let session = format!("vg-tui-save-{}", std::process::id());
    start_session(
        &session,
        &format!(
            "{bin} {args} --save {}; echo $? > {}",
            saved.display(),
            exit_file.display()
        ),
    );
    let kill = || tmux(&["kill-session", "-t", &session]);
    let screen = wait_for(&session, "run finished · q quit", Duration::from_secs(60));
    assert!(screen.contains("run finished"), "never finished:\n{screen}");
    tmux(&["send-keys", "-t", &session, "s"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !saved.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    tmux(&["send-keys", "-t", &session, "q"]);
    let status = exit_status(&exit_file);
    kill();
    assert_eq!(status.trim(), "0", "the TUI exited with {status:?}");
    let out = Command::new(bin)
        .args(["record", "--output"])
        .arg(&recorded)
        .args(args.split(' '))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let read = |p: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
            .unwrap()
    };
    let (tui, rec) = (read(&saved), read(&recorded));
    let (mut tui_paths, mut rec_paths) = Default::default();
    json_paths(&tui, "", &mut tui_paths);
    json_paths(&rec, "", &mut rec_paths);
    // What a save mid-run or from the live view cannot know, or what names the run itself.
    let allowed = |path: &str| {
        [
            // Per-direction submission/completion splits and the exact per-direction
            // histograms are the workers' end-of-run tallies.
            ".results.read.",
            ".results.write.",
            // `record` measures its own CPU and calibrates; the TUI does neither.
            ".self_overhead.",
            ".calibration",
        ]
        .iter()
        .any(|p| path.starts_with(p))
    };
    let every: std::collections::BTreeSet<&String> =
        tui_paths.keys().chain(rec_paths.keys()).collect();
    let mut differences = Vec::new();
    let mut explained = Vec::new();
    for path in every {
        let list = if allowed(path) {
            &mut explained
        } else {
            &mut differences
        };
        match (tui_paths.get(path), rec_paths.get(path)) {
            (Some(a), Some(b)) if a == b => {}
            (a, b) => list.push(format!(
                "{path}: TUI {}, record {}",
                a.map_or("absent", |&v| if v { "measured" } else { "null" }),
                b.map_or("absent", |&v| if v { "measured" } else { "null" })
            )),
        }
    }
    eprintln!("differences a save cannot avoid:\n{}", explained.join("\n"));
    assert!(
        differences.is_empty(),
        "the TUI's profile differs from record's:\n{}",
        differences.join("\n")
    );
    for p in [&tui, &rec] {
        assert_eq!(p["runs"].as_array().map(Vec::len), Some(1), "one run each");
        let intervals = p["intervals"].as_array().unwrap();
        assert!(
            (2..=4).contains(&intervals.len()),
            "{} intervals for a 3 s run",
            intervals.len()
        );
        assert_eq!(p["runs"][0]["intervals"], intervals.len());
    }
}

/// Attached to a running process (`virtgap --pid`): no workload runs, the view shows the
/// process's block requests, stays up marked finished once it exits, `s` saves what it saw as
/// `record --pid` would, and `q` exits 0 with every probe detached.
#[test]
fn the_tui_attached_to_a_pid_shows_its_requests_and_its_end() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !virtgap_testkit::require(
        "the attached TUI",
        if root { Ok(()) } else { Err("needs root") },
    ) {
        return;
    }
    let Some((_serial, dir)) = tmux_test("vg-tui-") else {
        return;
    };
    let file = dir.path().join("data");
    std::fs::write(&file, vec![0x5a_u8; 8 << 20]).unwrap();
    std::fs::File::open(&file).unwrap().sync_all().unwrap();
    // dd waits for a line before it reads, so the view is attached before its first I/O.
    let mut dd = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "read go && exec dd if={} of=/dev/null bs=4k iflag=direct",
            file.display()
        ))
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let exit_file = dir.path().join("exit-status");
    let session = format!("vg-tui-attached-{}", std::process::id());
    let saved = dir.path().join("attached.json");
    let cmd = format!(
        "{} --pid {} --probes block,irq,app --save {}; echo $? > {}",
        env!("CARGO_BIN_EXE_virtgap"),
        dd.id(),
        saved.display(),
        exit_file.display()
    );
    start_session(&session, &cmd);
    let kill = || tmux(&["kill-session", "-t", &session]);
    let attached = wait_for(&session, "attached to pid", Duration::from_secs(60));
    if !attached.contains("attached to pid") {
        kill();
        let _ = dd.kill();
        panic!("the attached view did not start:\n{attached}");
    }
    std::thread::sleep(Duration::from_millis(500));
    use std::io::Write;
    dd.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(dd.wait().unwrap().success());
    let end = wait_for(
        &session,
        "every followed process has exited",
        Duration::from_secs(20),
    );
    let device_row = end
        .lines()
        .find(|l| l.contains("│device "))
        .unwrap_or_default()
        .to_string();
    tmux(&["send-keys", "-t", &session, "s"]);
    let after_save = wait_for(&session, "saved profile", Duration::from_secs(20));
    tmux(&["send-keys", "-t", &session, "q"]);
    let status = exit_status(&exit_file);
    kill();
    assert!(end.contains("every followed process has exited"), "{end}");
    assert!(after_save.contains("saved profile"), "{after_save}");
    // The saved profile is an attached run's, as `record --pid` writes it: dd's pid and
    // command, its 2,048 direct reads as block requests, complete since dd exited.
    let profile: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&saved).expect("the saved profile")).unwrap();
    let attached = &profile["attached"];
    assert_eq!(attached["kind"], "pid", "{attached}");
    assert!(
        attached["pids"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p.as_u64() == Some(u64::from(dd.id())))),
        "{attached}"
    );
    assert!(
        attached["commands"].to_string().contains("dd if="),
        "{attached}"
    );
    let reads = attached["io"]["read_requests"].as_u64().unwrap_or(0);
    assert!((2_048..2_200).contains(&reads), "{reads} reads: {attached}");
    assert_eq!(attached["end"], "processes_exited", "{attached}");
    assert_eq!(profile["runs"].as_array().map(Vec::len), Some(1));
    assert!(
        profile["stages"]["device"]["count"].as_u64().unwrap_or(0) >= 2_048,
        "{}",
        profile["stages"]["device"]
    );
    assert!(
        end.contains("mean block request of the attached processes"),
        "{end}"
    );
    // dd's 2048 reads have a device time.
    assert!(
        device_row.contains("µs") || device_row.contains("ms"),
        "no device time: {device_row:?}\n{end}"
    );
    assert_eq!(status.trim(), "0", "virtgap exited with {status:?}");
    let loaded = our_programs_loaded();
    assert!(
        loaded.is_empty(),
        "programs still loaded after quit: {loaded:?}"
    );
}

/// The value of each sample of `family` on a Prometheus text page whose labels include all
/// of `want` (`name="value"` pairs), summed.
fn page_sum(page: &str, family: &str, want: &[(&str, &str)]) -> f64 {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name_labels, value) = l.rsplit_once(' ')?;
            let (name, labels) = name_labels.split_once('{').unwrap_or((name_labels, "}"));
            (name == family
                && want
                    .iter()
                    .all(|(k, v)| labels.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())
            .flatten()
        })
        .sum()
}

/// One finished run read every way a user reads it: the live view's stage table, the page
/// its `--listen` endpoint serves, the profile `s` saves, that profile's CSV files
/// (summary.csv and intervals.csv) and the summary `record` would print of it. Each block
/// stage's request count is the same number everywhere (the scrape's over the profile's
/// disks, the intervals' summed), its total time agrees to the page's rounding, and the screen
/// prints what the profile's own histogram gives for its mean and percentiles. The workload is
/// over and the probes follow its threads, so nothing moves these figures between the reads.
#[test]
fn a_finished_run_reads_the_same_on_screen_on_the_scrape_in_its_profile_and_its_csv() {
    if !common::root_allowed("one run's figures read every way") {
        return;
    }
    let Some((_serial, dir)) = tmux_test("vg-tui-same-") else {
        return;
    };
    let (saved, exit_file) = (dir.path().join("tui.json"), dir.path().join("exit-status"));
    let port = common::free_port();
    let session = format!("vg-tui-same-{}", std::process::id());
    start_session(
        &session,
        &format!(
            "{} --size 16MiB --duration 3s --ramp 0 --dir {} --listen 127.0.0.1:{port} --save {}; echo $? > {}",
            env!("CARGO_BIN_EXE_virtgap"),
            dir.path().display(),
            saved.display(),
            exit_file.display()
        ),
    );
    let kill = || tmux(&["kill-session", "-t", &session]);
    let finished = wait_for(&session, "run finished · q quit", Duration::from_secs(60));
    assert!(
        finished.contains("run finished"),
        "never finished:\n{finished}"
    );
    // The snapshot after the workload's last completion: two more probe intervals.
    std::thread::sleep(Duration::from_millis(2500));
    let screen = tmux(&["capture-pane", "-p", "-t", &session]);
    let (status, page) = common::get(port, "/metrics", "text/plain").unwrap();
    assert!(status.contains("200"), "{status}");
    tmux(&["send-keys", "-t", &session, "s"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !saved.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    // The screen again after the save: the figures did not move meanwhile.
    let after = tmux(&["capture-pane", "-p", "-t", &session]);
    tmux(&["send-keys", "-t", &session, "q"]);
    let status = exit_status(&exit_file);
    kill();
    assert_eq!(status.trim(), "0", "the TUI exited with {status:?}");

    let profile = virtgap::model::file::load(&saved).unwrap();
    let disks = &profile.target.stage_devices;
    assert!(
        !disks.is_empty(),
        "the profile names no disk for its stages"
    );
    let summary_csv = virtgap::render::csv_export::summary(&profile);
    let csv_value = |metric: &str| -> Option<f64> {
        summary_csv.lines().find_map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            (cells.get(3) == Some(&metric))
                .then(|| cells.get(4)?.parse().ok())
                .flatten()
        })
    };
    let mut printed = Vec::new();
    virtgap::render::summary::write(&mut printed, &profile).unwrap();
    let printed = String::from_utf8(printed).unwrap();
    let row_of = |screen: &str, name: &str| -> Vec<String> {
        let line = screen
            .lines()
            .find(|l| l.trim_start_matches('│').starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row on the screen:\n{screen}"));
        let cells = line.trim_start_matches('│')[name.len()..].trim_end_matches('│');
        // "1.9 µs     1.5 µs ...": a number and its unit per cell.
        let words: Vec<&str> = cells.split_whitespace().collect();
        words.chunks(2).map(|c| c.join(" ")).collect()
    };
    for (stage, row) in [
        (Stage::Queue, "block queue"),
        (Stage::Device, "device"),
        (Stage::Completion, "completion"),
    ] {
        let name = stage.name();
        let h = profile
            .stages
            .get(stage)
            .unwrap_or_else(|| panic!("no {name} stage in the profile"));
        assert!(h.count > 0, "{name}: no requests");
        // The scrape: the profile's disks, every operation.
        let (mut count, mut seconds) = (0.0, 0.0);
        for disk in disks {
            let labels = [("device", disk.as_str()), ("stage", name)];
            count += page_sum(&page, "virtgap_block_stage_seconds_count", &labels);
            seconds += page_sum(&page, "virtgap_block_stage_seconds_sum", &labels);
        }
        let intervals: u64 = profile
            .intervals
            .iter()
            .filter_map(|i| i.stage(stage))
            .map(|s| s.count)
            .sum();
        let in_csv = csv_value(&format!("{name}_count"));
        println!(
            "{name}: profile {} requests, scrape {count}, intervals {intervals}, summary.csv {in_csv:?}; \
             {:.6} s in the profile, {seconds:.6} s scraped",
            h.count,
            h.sum_ns / 1e9
        );
        assert_eq!(count, h.count as f64, "{name}: the scrape's count");
        assert_eq!(intervals, h.count, "{name}: the intervals' counts summed");
        assert_eq!(in_csv, Some(h.count as f64), "{name}: summary.csv's count");
        assert!(
            (seconds - h.sum_ns / 1e9).abs() <= 1e-6 * seconds.max(1e-3),
            "{name}: {seconds} s scraped, {} s in the profile",
            h.sum_ns / 1e9
        );
        let mean = h.mean_ns().unwrap();
        let csv_mean = csv_value(&format!("{name}_mean_ns")).unwrap();
        assert!(
            (csv_mean - mean).abs() <= 1e-3 * mean,
            "{name}: summary.csv's mean {csv_mean} vs {mean}"
        );
        // The screen prints the profile's own figures.
        let want: Vec<String> = [
            Some(mean),
            h.percentile_ns(50.0),
            h.percentile_ns(99.0),
            h.percentile_ns(99.9),
        ]
        .into_iter()
        .map(|v| units::latency(v.unwrap()))
        .collect();
        for shown in [&screen, &after] {
            assert_eq!(
                row_of(shown, row),
                want,
                "{name}: the live view's row\n{shown}"
            );
        }
        assert!(
            printed.contains(&units::latency(mean)),
            "{name}: the summary does not print the mean {}:\n{printed}",
            units::latency(mean)
        );
    }
}
