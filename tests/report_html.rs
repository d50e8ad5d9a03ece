//! `diff --html`, opened in a real browser: headless Chromium, driven over the DevTools protocol
//! on a pipe, loads the page from disk and must report no console error, no exception and no
//! network request but the page itself; the DOM must hold every verdict row the text diff
//! prints, each side's label and file must be on screen in the header and every chart's legend,
//! and a screenshot is taken (kept at `target/tmp/diff-report.png`).
// Test progress, on the harness's stderr: eprintln! is fine here.
#![allow(clippy::disallowed_macros)]

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::{root_allowed, which};

/// The width of the text report's label column.
const LABEL_COLUMNS: usize = 44;

/// How long the browser may take to answer one command or to load the page.
const PATIENCE: Duration = Duration::from_secs(60);

/// A pipe's two ends, moved to descriptors 10 and up (so they cannot collide with 3 and 4,
/// where the browser expects its own), close-on-exec.
fn pipe_above_ten() -> (RawFd, RawFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let moved = fds.map(|fd| {
        // SAFETY: fd is a descriptor this process just opened; F_DUPFD_CLOEXEC makes a copy.
        let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) };
        assert!(high >= 10);
        // SAFETY: the original is ours and no longer used.
        unsafe { libc::close(fd) };
        high
    });
    (moved[0], moved[1])
}

/// Headless Chromium with its DevTools protocol on descriptors 3 (commands in) and 4 (replies
/// and events out): messages are JSON, each ended by a NUL byte.
struct Browser {
    child: Child,
    commands: File,
    replies: mpsc::Receiver<Value>,
    next_id: u64,
    /// Events seen while waiting for replies, in order.
    events: Vec<Value>,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn launch(program: &Path) -> Self {
        let profile = common::scratch("vg-chromium-");
        let (to_browser_read, to_browser_write) = pipe_above_ten();
        let (from_browser_read, from_browser_write) = pipe_above_ten();
        let mut cmd = Command::new(program);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-pipe",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-default-apps",
            "--disable-extensions",
            "--disable-sync",
            "--mute-audio",
            "--window-size=1100,900",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        // SAFETY: between fork and exec only async-signal-safe calls (dup2, fcntl) are made,
        // on descriptors the parent opened above.
        unsafe {
            cmd.pre_exec(move || {
                for (from, to) in [(to_browser_read, 3), (from_browser_write, 4)] {
                    if libc::dup2(from, to) < 0 || libc::fcntl(to, libc::F_SETFD, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("chromium starts");
        // SAFETY: the parent's ends are descriptors this process owns, each wrapped once; the
        // child's ends are closed here (it has its copies at 3 and 4).
        let (commands, replies_file) = unsafe {
            libc::close(to_browser_read);
            libc::close(from_browser_write);
            (
                File::from_raw_fd(to_browser_write),
                File::from_raw_fd(from_browser_read),
            )
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(replies_file);
            loop {
                let mut message = Vec::new();
                match reader.read_until(0, &mut message) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        message.pop();
                        if let Ok(v) = serde_json::from_slice::<Value>(&message) {
                            if tx.send(v).is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        });
        Self {
            child,
            commands,
            replies: rx,
            next_id: 1,
            events: Vec::new(),
            _profile: profile,
        }
    }

    /// The next message, or a panic after `PATIENCE`.
    fn next_message(&mut self) -> Value {
        self.replies
            .recv_timeout(PATIENCE)
            .expect("chromium answered in time")
    }

    /// Sends `method` (to a page's session, when given) and waits for its reply's `result`.
    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            message["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.commands.write_all(&bytes).unwrap();
        loop {
            let m = self.next_message();
            if m["id"] == json!(id) {
                assert!(m.get("error").is_none(), "{method} failed: {m}");
                return m["result"].clone();
            }
            self.events.push(m);
        }
    }

    /// Waits for an event of `method`, keeping every event seen.
    fn wait_for(&mut self, method: &str) {
        let deadline = Instant::now() + PATIENCE;
        while !self.events.iter().any(|e| e["method"] == json!(method)) {
            assert!(Instant::now() < deadline, "no {method} from chromium");
            let m = self.next_message();
            self.events.push(m);
        }
    }

    /// Reads the events that arrive within `quiet` (late console messages, late requests).
    fn settle(&mut self, quiet: Duration) {
        while let Ok(m) = self.replies.recv_timeout(quiet) {
            self.events.push(m);
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn vg() -> Command {
    Command::new(env!("CARGO_BIN_EXE_virtgap"))
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Two runs of real 4 KiB random reads with the probes on, labelled `label`, into `out`.
fn record(dir: &Path, out: &Path, label: &str) {
    run_ok(
        vg().args([
            "record",
            "--size",
            "64MiB",
            "--duration",
            "2s",
            "--runs",
            "2",
            "--label",
            label,
        ])
        .arg("--dir")
        .arg(dir)
        .arg("-o")
        .arg(out),
    );
}

/// Every compared row of the text report, as (label, verdict): a row is its figures line (the
/// label in the first `LABEL_COLUMNS` columns) followed by "-> verdict".
fn text_rows(text: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .filter_map(|w| {
            let verdict = w[1].trim_start().strip_prefix("-> ")?;
            let label: String = w[0].chars().take(LABEL_COLUMNS).collect();
            Some((label.trim().to_string(), verdict.to_string()))
        })
        .collect()
}

/// Each side's label and file, as laid out by the browser: the header's two hosts and every
/// chart's legend must show them, each on screen (a box of some size, not hidden, and within
/// its chart), and the two sides must read differently.
fn sides_are_named_where_they_are_seen(chromium: &mut Browser, s: Option<&str>) {
    const SIDES: &str = r"(() => {
        const seen = el => {
            const r = el.getBoundingClientRect(), st = getComputedStyle(el);
            return r.width > 0 && r.height > 0 && st.visibility === 'visible'
                && st.display !== 'none' && parseFloat(st.opacity) > 0;
        };
        const within = (el, box) => {
            const r = el.getBoundingClientRect(), b = box.getBoundingClientRect();
            return r.left >= b.left - 1 && r.right <= b.right + 1
                && r.top >= b.top - 1 && r.bottom <= b.bottom + 1;
        };
        const header = Array.from(document.querySelectorAll('dl.hosts dd')).slice(0, 2)
            .map(dd => [dd.innerText, seen(dd)]);
        const legends = Array.from(document.querySelectorAll('figure svg')).map(svg =>
            Array.from(svg.querySelectorAll('text'))
                .filter(t => /^[AB]: /.test(t.textContent))
                .map(t => [t.textContent, seen(t) && within(t, svg)]));
        return JSON.stringify({header, legends});
    })()";
    let reply = chromium.call(
        s,
        "Runtime.evaluate",
        json!({"expression": SIDES, "returnByValue": true}),
    );
    let found: Value = serde_json::from_str(reply["result"]["value"].as_str().unwrap()).unwrap();
    let shown = |v: &Value| -> Vec<(String, bool)> { serde_json::from_value(v.clone()).unwrap() };
    let header = shown(&found["header"]);
    assert_eq!(header.len(), 2, "the header names two hosts: {found}");
    for ((text, seen), (label, file)) in header.iter().zip([("metal", "a.json"), ("vm", "b.json")])
    {
        assert!(*seen, "the header's side is not on screen: {text}");
        assert!(
            text.starts_with(&format!("{label} (")) && text.contains(file),
            "the header's side lacks its label {label} or file {file}: {text}"
        );
    }
    assert_ne!(header[0].0, header[1].0, "the two sides read alike");
    let charts = found["legends"].as_array().unwrap();
    assert!(charts.len() >= 2, "{found}");
    for legend in charts {
        let legend = shown(legend);
        for prefix in ["A: metal (", "B: vm ("] {
            assert!(
                legend
                    .iter()
                    .any(|(t, seen)| t.starts_with(prefix) && *seen),
                "a chart's legend lacks {prefix:?} on screen: {legend:?}"
            );
        }
    }
}

#[test]
fn the_html_report_loads_in_chromium_with_every_verdict_row_and_fetches_nothing() {
    if !root_allowed("the HTML report in Chromium (records with the probes)") {
        return;
    }
    let browser = which("chromium").or_else(|| which("chromium-browser"));
    let Some(program) = virtgap_testkit::ready(
        "the HTML report in Chromium",
        browser.ok_or("chromium is not installed (apt-get install chromium)"),
    ) else {
        return;
    };
    let dir = common::scratch("vg-html-");
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    record(dir.path(), &a, "metal");
    record(dir.path(), &b, "vm");
    let page = dir.path().join("report.html");
    let text = run_ok(vg().arg("diff").arg(&a).arg(&b).arg("--html").arg(&page));
    let expected = text_rows(&text);
    assert!(
        expected.len() >= 10,
        "the text diff's rows: {expected:?}\n{text}"
    );

    let mut chromium = Browser::launch(&program);
    let target = chromium.call(None, "Target.createTarget", json!({"url": "about:blank"}));
    let attached = chromium.call(
        None,
        "Target.attachToTarget",
        json!({"targetId": target["targetId"], "flatten": true}),
    );
    let session = attached["sessionId"].as_str().unwrap().to_string();
    let s = Some(session.as_str());
    for domain in ["Page", "Runtime", "Network", "Log"] {
        chromium.call(s, &format!("{domain}.enable"), json!({}));
    }
    let url = format!("file://{}", page.canonicalize().unwrap().display());
    chromium.call(s, "Page.navigate", json!({ "url": url }));
    chromium.wait_for("Page.loadEventFired");
    chromium.settle(Duration::from_millis(500));

    let of_session: Vec<Value> = chromium
        .events
        .iter()
        .filter(|e| e["sessionId"] == json!(session))
        .cloned()
        .collect();
    let requests: Vec<&str> = of_session
        .iter()
        .filter(|e| e["method"] == "Network.requestWillBeSent")
        .filter_map(|e| e["params"]["request"]["url"].as_str())
        .collect();
    assert_eq!(
        requests,
        [url.as_str()],
        "the page's only request is itself"
    );
    let errors: Vec<&Value> = of_session
        .iter()
        .filter(|e| {
            let p = &e["params"];
            match e["method"].as_str() {
                Some("Runtime.exceptionThrown") => true,
                Some("Runtime.consoleAPICalled") => {
                    matches!(p["type"].as_str(), Some("error" | "warning" | "assert"))
                }
                Some("Log.entryAdded") => {
                    matches!(p["entry"]["level"].as_str(), Some("error" | "warning"))
                }
                _ => false,
            }
        })
        .collect();
    assert!(errors.is_empty(), "console errors: {errors:?}");

    let rows = chromium.call(
        s,
        "Runtime.evaluate",
        json!({
            "expression": "JSON.stringify(Array.from(document.querySelectorAll('tr.row')).map(r => [r.cells[0].innerText.trim(), r.querySelector('.verdict').innerText.trim()]))",
            "returnByValue": true,
        }),
    );
    let in_dom: Vec<(String, String)> =
        serde_json::from_str(rows["result"]["value"].as_str().unwrap()).unwrap();
    for row in &expected {
        assert!(
            in_dom.contains(row),
            "the page lacks the text diff's row {row:?}; it has {in_dom:?}"
        );
    }
    assert_eq!(in_dom.len(), expected.len(), "no row the text diff lacks");
    let charts = chromium.call(
        s,
        "Runtime.evaluate",
        json!({"expression": "document.querySelectorAll('figure svg').length", "returnByValue": true}),
    );
    assert!(charts["result"]["value"].as_u64().unwrap() >= 2, "{charts}");

    sides_are_named_where_they_are_seen(&mut chromium, s);

    let shot = chromium.call(
        s,
        "Page.captureScreenshot",
        json!({"format": "png", "captureBeyondViewport": true}),
    );
    use base64::Engine as _;
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot["data"].as_str().unwrap())
        .expect("the screenshot is base64");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000);
    let keep = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("diff-report.png");
    std::fs::write(&keep, &png).unwrap();
    eprintln!(
        "{} rows, {} requests, screenshot {} ({} KiB)",
        in_dom.len(),
        requests.len(),
        keep.display(),
        png.len() / 1024
    );
    let _ = chromium.call(None, "Browser.close", json!({}));
}
