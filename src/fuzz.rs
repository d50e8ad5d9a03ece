//! Fuzzing the readers of untrusted input (profiles, workload TOML) for a bounded time.
//!
//! Profiles come from other hosts and workload files from other people, so their readers, and
//! everything that consumes what the readers accept, must never panic. Each target mutates its
//! seeds — structure-aware (JSON or TOML values, keys, shapes) and as raw bytes — and feeds every
//! accepted input to its consumers, for a share of `VIRTGAP_FUZZ_SECONDS` (default 20, so the
//! normal `cargo test` does a short run; `just fuzz 600` a long one): two thirds to profiles,
//! whose consumers are many, one third to workload specs.
//!
//! - The run's seed is printed; `VIRTGAP_FUZZ_SEED=N` replays the same sequence of cases. The
//!   default bounded run uses a fixed seed (reproducible in CI); `just fuzz` a fresh one.
//! - A panic fails the test once the budget is spent. Each distinct panic (by location) is
//!   saved as `target/fuzz-failures/<hash>.json|toml`, with a shrunk copy `<hash>.min.*` and a
//!   `<hash>.txt` note: the message, and what the input changes in the nearest seed.
//! - Accepted inputs that make a consumer print NaN or inf, draw a broken SVG, and the like are
//!   saved under `target/fuzz-failures/oddities/` and listed, without failing the test.
//! - `VIRTGAP_FUZZ_REPLAY=FILE` runs one saved input through its target with panics uncaught.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use virtgap_workloads::spec::{self, Pattern};

use crate::model::profile::{self, Profile};

/// Budget when `VIRTGAP_FUZZ_SECONDS` is not set: short enough for every `cargo test`.
const DEFAULT_SECONDS: f64 = 20.0;
/// A case taking longer than this is listed as slow.
const SLOW_CASE: Duration = Duration::from_secs(2);
/// A case taking longer than this is a hang: its input is saved and the process aborted, since
/// a stuck thread cannot be unwound.
const HANG_CASE: Duration = Duration::from_secs(60);
/// Generated inputs above this are dropped rather than fed: they only measure memory bandwidth.
const MAX_INPUT: usize = 4 << 20;

// ---------------------------------------------------------------------------------------------
// Settings, randomness, panic capture

fn budget() -> Duration {
    let secs = std::env::var("VIRTGAP_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(DEFAULT_SECONDS);
    Duration::from_secs_f64(secs)
}

/// The seed of the default bounded run (no `VIRTGAP_FUZZ_SECONDS`): every `cargo test`, CI's
/// included, replays the same cases, so a failure there is reproducible rather than luck.
const DEFAULT_SEED: u64 = 0x0076_6972_7467_6170;

fn master_seed() -> u64 {
    if std::env::var_os("VIRTGAP_FUZZ_SECONDS").is_none()
        && std::env::var_os("VIRTGAP_FUZZ_SEED").is_none()
    {
        return DEFAULT_SEED;
    }
    if let Ok(s) = std::env::var("VIRTGAP_FUZZ_SEED") {
        let s = s.trim();
        let parsed = match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => s.parse().ok(),
        };
        return parsed.unwrap_or_else(|| panic!("VIRTGAP_FUZZ_SEED={s} is not a number"));
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}

fn failures_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("fuzz-failures")
}

/// FNV-1a: a stable name for a finding across runs and platforms.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// xorshift64*, seeded through splitmix64 so that nearby seeds give unrelated sequences.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        // Zero is xorshift's fixed point.
        Self((z ^ (z >> 31)).max(1))
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in 0..n (0 when n is 0).
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

struct Caught {
    message: String,
    location: String,
}

thread_local! {
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
    static CAUGHT: RefCell<Option<Caught>> = const { RefCell::new(None) };
}

/// Keeps panics inside `catching` quiet and remembers their message and location; panics of
/// other tests' threads still go to the previous hook.
fn install_panic_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if CAPTURING.with(Cell::get) {
                let caught = Caught {
                    message: info
                        .payload_as_str()
                        .unwrap_or("(non-text panic)")
                        .to_string(),
                    location: info.location().map_or("unknown location".into(), |l| {
                        let at = format!("{}:{}:{}", l.file(), l.line(), l.column());
                        outside_project(l.file())
                            .then(project_caller)
                            .flatten()
                            .map_or(at.clone(), |caller| {
                                // "/rustc/<commit>/library/core/…" -> "core/…"
                                let inner = at.split_once("/library/").map_or(&*at, |(_, p)| p);
                                format!("{caller} (in {inner})")
                            })
                    }),
                };
                CAUGHT.with(|c| *c.borrow_mut() = Some(caught));
            } else {
                previous(info);
            }
        }));
    });
}

/// A file of the standard library or a dependency: its line says little about the bug.
fn outside_project(file: &str) -> bool {
    file.starts_with("/rustc/") || file.contains("/.cargo/registry/")
}

/// The innermost frame in virtgap's own code (not the fuzzer's) on the panicking stack.
fn project_caller() -> Option<String> {
    let trace = std::backtrace::Backtrace::force_capture().to_string();
    trace
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("at "))
        .find(|file| !outside_project(file) && !file.contains("src/fuzz.rs"))
        .map(|file| file.trim_start_matches("./").to_string())
}

fn catching<T>(f: impl FnOnce() -> T) -> Result<T, Caught> {
    install_panic_hook();
    CAPTURING.with(|c| c.set(true));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    CAPTURING.with(|c| c.set(false));
    result.map_err(|_| {
        CAUGHT.with(|c| c.borrow_mut().take()).unwrap_or(Caught {
            message: "(panic not seen by the hook)".into(),
            location: "unknown location".into(),
        })
    })
}

// ---------------------------------------------------------------------------------------------
// The campaign: generate, check, record, shrink, save, report

/// Something wrong that is not a panic, in what a consumer made of an accepted input.
struct Oddity {
    /// What kind of problem, without the values: findings are counted by it.
    key: String,
    /// One example, with values.
    detail: String,
}

#[derive(Default)]
struct Outcome {
    accepted: bool,
    oddities: Vec<Oddity>,
}

impl Outcome {
    fn odd(&mut self, key: impl Into<String>, detail: impl Into<String>) {
        self.oddities.push(Oddity {
            key: key.into(),
            detail: detail.into(),
        });
    }
}

struct Case {
    input: Vec<u8>,
    /// How it was made ("structure", "structure+bytes", "bytes"), for the acceptance figures.
    how: &'static str,
}

trait Target {
    fn name(&self) -> &'static str;
    fn ext(&self) -> &'static str;
    fn generate(&self, rng: &mut Rng) -> Case;
    /// Parses `input` and runs every consumer on what is accepted.
    fn check(&self, input: &[u8]) -> Outcome;
    /// A smaller input for which `reproduces` still holds, found before `deadline`.
    fn shrink(
        &self,
        input: &[u8],
        reproduces: &mut dyn FnMut(&[u8]) -> bool,
        deadline: Instant,
    ) -> Vec<u8>;
    /// What `input` changes in the seed it is closest to, for people reading a finding.
    fn nearest_seed(&self, input: &[u8]) -> String;
}

struct Finding {
    panic: bool,
    key: String,
    detail: String,
    hits: u64,
    first_case: u64,
    /// The smallest input seen that shows it.
    input: Vec<u8>,
}

/// Keeps the input being checked where a watchdog thread can save it if the case never ends.
struct Watchdog {
    busy_since_ms: Arc<AtomicU64>,
    input: Arc<Mutex<Vec<u8>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    epoch: Instant,
}

impl Watchdog {
    fn start(name: &'static str, ext: &'static str) -> Self {
        let busy_since_ms = Arc::new(AtomicU64::new(0));
        let input = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let epoch = Instant::now();
        let thread = {
            let (busy, input, stop) = (busy_since_ms.clone(), input.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                    let since = busy.load(Ordering::Relaxed);
                    let now = epoch.elapsed().as_millis() as u64;
                    if since == 0 || now.saturating_sub(since) < HANG_CASE.as_millis() as u64 {
                        continue;
                    }
                    let bytes = input.lock().map(|b| b.clone()).unwrap_or_default();
                    let dir = failures_dir();
                    let path = dir.join(format!("hang-{:016x}.{ext}", fnv1a(&bytes)));
                    let saved =
                        std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, &bytes));
                    eprintln!(
                        "fuzz {name}: a case has run for over {} s: input saved to {} ({saved:?}); aborting",
                        HANG_CASE.as_secs(),
                        path.display()
                    );
                    std::process::abort();
                }
            })
        };
        Self {
            busy_since_ms,
            input,
            stop,
            thread: Some(thread),
            epoch,
        }
    }

    fn begin(&self, input: &[u8]) {
        if let Ok(mut held) = self.input.lock() {
            held.clear();
            held.extend_from_slice(input);
        }
        let now = self.epoch.elapsed().as_millis() as u64;
        self.busy_since_ms.store(now.max(1), Ordering::Relaxed);
    }

    fn end(&self) {
        self.busy_since_ms.store(0, Ordering::Relaxed);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs one input; a panic becomes a finding keyed by its location.
fn run_one(target: &dyn Target, input: &[u8]) -> Result<Outcome, Caught> {
    catching(|| target.check(input))
}

/// The finding keys one input produces (for shrinking: does the smaller input still show it?).
fn keys_of(target: &dyn Target, input: &[u8]) -> BTreeSet<String> {
    match run_one(target, input) {
        Ok(o) => o.oddities.into_iter().map(|o| o.key).collect(),
        Err(c) => BTreeSet::from([panic_key(&c)]),
    }
}

fn panic_key(c: &Caught) -> String {
    format!("panic at {}", c.location)
}

fn record(
    findings: &mut BTreeMap<String, Finding>,
    panic: bool,
    key: String,
    detail: String,
    input: &[u8],
    case: u64,
) -> bool {
    match findings.get_mut(&key) {
        Some(f) => {
            f.hits += 1;
            if input.len() < f.input.len() {
                f.input = input.to_vec();
                f.detail = detail;
            }
            false
        }
        None => {
            findings.insert(
                key.clone(),
                Finding {
                    panic,
                    key,
                    detail,
                    hits: 1,
                    first_case: case,
                    input: input.to_vec(),
                },
            );
            true
        }
    }
}

fn finding_paths(f: &Finding, ext: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = if f.panic {
        failures_dir()
    } else {
        failures_dir().join("oddities")
    };
    let stem = format!("{:016x}", fnv1a(f.key.as_bytes()));
    (
        dir.join(format!("{stem}.{ext}")),
        dir.join(format!("{stem}.min.{ext}")),
        dir.join(format!("{stem}.txt")),
    )
}

fn save(path: &Path, bytes: &[u8]) {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = std::fs::write(path, bytes) {
        eprintln!("fuzz: cannot write {}: {e}", path.display());
    }
}

struct Summary {
    cases: u64,
    accepted: u64,
    panics: usize,
}

fn campaign(target: &dyn Target, seed: u64, budget: Duration) -> Summary {
    let name = target.name();
    let ext = target.ext();
    println!(
        "fuzz {name}: seed {seed} (VIRTGAP_FUZZ_SEED={seed} replays), budget {:.0} s",
        budget.as_secs_f64()
    );
    let mut rng = Rng::new(seed);
    let started = Instant::now();
    let watchdog = Watchdog::start(name, ext);
    let mut findings: BTreeMap<String, Finding> = BTreeMap::new();
    let mut by_how: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
    let (mut cases, mut accepted) = (0u64, 0u64);
    let mut slowest = Duration::ZERO;
    while started.elapsed() < budget {
        let case = rng_case(target, &mut rng);
        cases += 1;
        watchdog.begin(&case.input);
        let t0 = Instant::now();
        let result = run_one(target, &case.input);
        let took = t0.elapsed();
        watchdog.end();
        slowest = slowest.max(took);
        let tally = by_how.entry(case.how).or_default();
        tally.0 += 1;
        match result {
            Ok(outcome) => {
                if outcome.accepted {
                    accepted += 1;
                    tally.1 += 1;
                }
                for o in outcome.oddities {
                    record(&mut findings, false, o.key, o.detail, &case.input, cases);
                }
                if took > SLOW_CASE {
                    let detail = format!("{:.1} s for one case", took.as_secs_f64());
                    record(
                        &mut findings,
                        false,
                        "slow case".into(),
                        detail,
                        &case.input,
                        cases,
                    );
                }
            }
            Err(c) => {
                let key = panic_key(&c);
                if record(
                    &mut findings,
                    true,
                    key.clone(),
                    c.message.clone(),
                    &case.input,
                    cases,
                ) {
                    // Saved at once, so a later hang or abort cannot lose it.
                    let (raw, _, _) = finding_paths(&findings[&key], ext);
                    save(&raw, &case.input);
                    println!(
                        "fuzz {name}: case {cases}: PANIC at {}: {} (input: {})",
                        c.location,
                        one_line(&c.message, 200),
                        raw.display()
                    );
                }
            }
        }
    }
    drop(watchdog);
    let fuzzed_s = started.elapsed().as_secs_f64();

    // Shrink what was found (panics first), within a time cap of its own.
    let shrink_started = Instant::now();
    let shrink_cap = Duration::from_secs(30) + budget / 10;
    let mut ordered: Vec<&mut Finding> = findings.values_mut().collect();
    ordered.sort_by_key(|f| !f.panic);
    let mut report = Vec::new();
    for f in ordered {
        let (raw, min, note) = finding_paths(f, ext);
        save(&raw, &f.input);
        let per_finding = if f.panic {
            Duration::from_secs(15)
        } else {
            Duration::from_secs(3)
        };
        let left = shrink_cap.saturating_sub(shrink_started.elapsed());
        let shrunk = if f.key == "slow case" || left.is_zero() {
            f.input.clone()
        } else {
            let deadline = Instant::now() + per_finding.min(left);
            let key = f.key.clone();
            let mut reproduces = |b: &[u8]| keys_of(target, b).contains(&key);
            target.shrink(&f.input, &mut reproduces, deadline)
        };
        save(&min, &shrunk);
        let nearest = target.nearest_seed(&shrunk);
        let text = format!(
            "{}\n{}\nseen in {} of {cases} cases (first: case {}, seed {seed})\ninput: {}\nshrunk: {}\n\n{nearest}\n\nreplay: VIRTGAP_FUZZ_REPLAY={} cargo test -p virtgap --lib fuzz -- --nocapture\n",
            f.key,
            f.detail,
            f.hits,
            f.first_case,
            raw.display(),
            min.display(),
            min.display()
        );
        save(&note, text.as_bytes());
        report.push((
            f.panic,
            f.key.clone(),
            f.detail.clone(),
            f.hits,
            min,
            nearest,
        ));
    }

    let pct = |a: u64, n: u64| {
        if n == 0 {
            0.0
        } else {
            a as f64 * 100.0 / n as f64
        }
    };
    println!(
        "fuzz {name}: {cases} cases in {fuzzed_s:.1} s ({:.0}/s), {accepted} accepted ({:.1}%), slowest case {:.0} ms",
        cases as f64 / fuzzed_s.max(1e-9),
        pct(accepted, cases),
        slowest.as_secs_f64() * 1e3
    );
    for (how, (n, ok)) in &by_how {
        println!(
            "  {how:<16} {n:>8} cases, {ok:>8} accepted ({:.1}%)",
            pct(*ok, *n)
        );
    }
    let panics = report.iter().filter(|r| r.0).count();
    println!(
        "  {panics} distinct panic(s), {} kind(s) of oddity; shrinking took {:.1} s",
        report.len() - panics,
        shrink_started.elapsed().as_secs_f64()
    );
    for (panic, key, detail, hits, min, nearest) in &report {
        let label = if *panic { "PANIC " } else { "oddity" };
        println!("  {label} {key} ({hits} hits)");
        println!("         {}", one_line(detail, 300));
        println!("         shrunk input: {}", min.display());
        for line in nearest.lines().take(8) {
            println!("           {line}");
        }
    }
    Summary {
        cases,
        accepted,
        panics,
    }
}

/// Generates a case, dropping the rare input that grew past the size cap.
fn rng_case(target: &dyn Target, rng: &mut Rng) -> Case {
    loop {
        let case = target.generate(rng);
        if case.input.len() <= MAX_INPUT {
            return case;
        }
    }
}

fn one_line(s: &str, max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() > max {
        format!("{}…", flat.chars().take(max).collect::<String>())
    } else {
        flat
    }
}

/// Runs a target for its share of the budget, or replays one saved input.
fn fuzz(target: &dyn Target, share: f64, salt: u64) {
    if let Some(path) = std::env::var_os("VIRTGAP_FUZZ_REPLAY") {
        let path = PathBuf::from(path);
        if path.extension().and_then(|e| e.to_str()) != Some(target.ext()) {
            return;
        }
        let input =
            std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        // Uncaught: a panic here shows its own backtrace.
        let outcome = target.check(&input);
        println!(
            "replay {}: {}",
            path.display(),
            if outcome.accepted {
                "accepted"
            } else {
                "rejected"
            }
        );
        for o in &outcome.oddities {
            println!("  oddity: {}: {}", o.key, one_line(&o.detail, 300));
        }
        return;
    }
    let seed = master_seed();
    let summary = campaign(target, seed ^ salt, budget().mul_f64(share));
    assert!(summary.cases > 0 || budget().is_zero(), "no case ran");
    let _ = summary.accepted;
    assert_eq!(
        summary.panics,
        0,
        "fuzz {}: {} distinct panic(s); inputs under {} (seed {seed})",
        target.name(),
        summary.panics,
        failures_dir().display()
    );
}

#[test]
fn fuzz_profile_reader() {
    fuzz(&ProfileTarget::load(), 2.0 / 3.0, 0);
}

#[test]
fn fuzz_workload_spec() {
    fuzz(&SpecTarget::load(), 1.0 / 3.0, 0x5bec_5bec);
}

// ---------------------------------------------------------------------------------------------
// Shared mutation pieces

/// Raw byte mutations: flips, deletions, duplications, splices from other seeds, tokens.
fn mutate_bytes(rng: &mut Rng, data: &mut Vec<u8>, donors: &[&[u8]], tokens: &[&[u8]]) {
    let len = data.len();
    let at = |rng: &mut Rng| rng.below(len + 1);
    let span = |rng: &mut Rng| {
        let wide = rng.one_in(4);
        1 + rng.below(if wide { 512 } else { 16 })
    };
    match rng.below(9) {
        0 if len > 0 => {
            let i = rng.below(len);
            data[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            data[i] = *rng.pick(b"{}[]\":,-+.eE0123456789 \\\n\t\x00\xff'=#");
        }
        2 => {
            let start = at(rng);
            let end = (start + span(rng)).min(len);
            data.drain(start..end);
        }
        3 => {
            let start = at(rng);
            let end = (start + span(rng)).min(len);
            let chunk = data[start..end].to_vec();
            let to = rng.below(len + 1);
            data.splice(to..to, chunk);
        }
        4 => {
            let to = at(rng);
            let token = rng.pick(tokens).to_vec();
            data.splice(to..to, token);
        }
        5 => data.truncate(at(rng)),
        6 => {
            let donor = rng.pick(donors);
            let from = rng.below(donor.len() + 1);
            let take = (from + span(rng)).min(donor.len());
            let start = at(rng);
            let end = (start + span(rng)).min(len);
            data.splice(start..end, donor[from..take].iter().copied());
        }
        7 => {
            // Repeat a short run many times: deep nesting from "[", long digit strings.
            let start = at(rng);
            let end = (start + 1 + rng.below(4)).min(len);
            let chunk = data[start..end].to_vec();
            let times = 1 + rng.below(300);
            let repeated: Vec<u8> = chunk
                .iter()
                .copied()
                .cycle()
                .take(chunk.len() * times)
                .collect();
            data.splice(end..end, repeated);
        }
        _ => {
            let start = at(rng);
            let end = (start + span(rng)).min(len);
            data[start..end].reverse();
        }
    }
}

/// Words a float prints as when it is not finite, found as whole words in `text`.
fn non_finite_words(text: &str) -> BTreeSet<&'static str> {
    let mut found = BTreeSet::new();
    for word in ["NaN", "inf"] {
        let hit = text.match_indices(word).any(|(i, _)| {
            let before = text[..i].chars().next_back();
            let after = text[i + word.len()..].chars().next();
            !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphabetic)
        });
        if hit {
            found.insert(word);
        }
    }
    found
}

/// Flags `NaN`/`inf` in a consumer's output that the input did not already contain as text.
fn scan_output(out: &mut Outcome, consumer: &str, text: &str, in_input: &BTreeSet<&str>) {
    for word in non_finite_words(text) {
        if in_input.contains(word) {
            continue;
        }
        let line = text
            .lines()
            .find(|l| non_finite_words(l).contains(word))
            .unwrap_or("");
        out.odd(
            format!("{consumer} prints {word}"),
            one_line(line.trim(), 200),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// JSON documents: paths, structure-aware mutation, shrinking

#[derive(Clone, Debug, PartialEq)]
enum Seg {
    Key(String),
    Index(usize),
}

fn show_path(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) if s.is_empty() => s.push_str(k),
            Seg::Key(k) => {
                s.push('.');
                s.push_str(k);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    if s.is_empty() {
        "(document)".into()
    } else {
        s
    }
}

fn node<'a>(mut v: &'a Value, path: &[Seg]) -> Option<&'a Value> {
    for seg in path {
        v = match (seg, v) {
            (Seg::Key(k), Value::Object(m)) => m.get(k)?,
            (Seg::Index(i), Value::Array(a)) => a.get(*i)?,
            _ => return None,
        };
    }
    Some(v)
}

fn node_mut<'a>(mut v: &'a mut Value, path: &[Seg]) -> Option<&'a mut Value> {
    for seg in path {
        v = match (seg, v) {
            (Seg::Key(k), Value::Object(m)) => m.get_mut(k)?,
            (Seg::Index(i), Value::Array(a)) => a.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(v)
}

fn children(v: &Value) -> Vec<(Seg, &Value)> {
    match v {
        Value::Object(m) => m.iter().map(|(k, c)| (Seg::Key(k.clone()), c)).collect(),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, c)| (Seg::Index(i), c))
            .collect(),
        _ => Vec::new(),
    }
}

/// Every node's path, the document's own (empty) path first.
fn all_paths(v: &Value) -> Vec<Vec<Seg>> {
    let mut out = Vec::new();
    let mut stack = vec![(Vec::new(), v)];
    while let Some((path, v)) = stack.pop() {
        for (seg, c) in children(v) {
            let mut p = path.clone();
            p.push(seg);
            stack.push((p, c));
        }
        out.push(path);
    }
    out
}

/// A path chosen by walking down from the top, stopping early now and then: favours the
/// document's structure over its thousands of histogram buckets.
fn descend(rng: &mut Rng, doc: &Value) -> Vec<Seg> {
    let mut path = Vec::new();
    let mut v = doc;
    loop {
        let kids = children(v);
        if kids.is_empty() || (!path.is_empty() && rng.one_in(4)) {
            return path;
        }
        let (seg, c) = kids
            .into_iter()
            .nth(rng.below(children(v).len()))
            .expect("in range");
        path.push(seg);
        v = c;
    }
}

fn interesting_number(rng: &mut Rng) -> Value {
    let fixed = [
        json!(0),
        json!(1),
        json!(-1),
        json!(2),
        json!(255),
        json!(256),
        json!(65535),
        json!(65536),
        json!(u32::MAX),
        json!(u64::from(u32::MAX) + 1),
        json!(i64::MAX),
        json!(i64::MIN),
        json!(u64::MAX),
        json!(u64::MAX - 1),
        json!(u64::MAX / 2),
        json!(u64::MAX / 2 + 1),
        json!((1u64 << 53) + 1),
        json!(1.5),
        json!(0.5),
        json!(-0.5),
        json!(-0.0),
        json!(1e-300),
        json!(5e-324),
        json!(1e308),
        json!(-1e308),
        json!(f64::MAX),
        json!(f64::EPSILON),
        json!(1e19),
        json!(1.8446744073709552e19),
        json!(1e9),
        json!(1e12),
    ];
    rng.pick(&fixed).clone()
}

/// A number near `v`: off by one, doubled, scaled far up or down, negated.
fn nearby_number(rng: &mut Rng, v: &Value) -> Value {
    if let Some(n) = v.as_u64() {
        return match rng.below(7) {
            0 => json!(n.saturating_add(1)),
            1 => json!(n.saturating_sub(1)),
            2 => json!(n.saturating_mul(2)),
            3 => json!(n.saturating_mul(1_000_000)),
            4 => json!(n / 2),
            5 => json!(-(n.min(i64::MAX as u64) as i64)),
            _ => json!(n as f64 + 0.5),
        };
    }
    let x = v.as_f64().unwrap_or(0.0);
    let y = match rng.below(6) {
        0 => x * 1e300,
        1 => -x,
        2 => x + 0.5,
        3 => x / 1e300,
        4 => x * 1e6,
        _ => x.trunc(),
    };
    if y.is_finite() {
        json!(y)
    } else {
        json!(f64::MAX)
    }
}

fn interesting_string(rng: &mut Rng) -> String {
    match rng.below(14) {
        0 => String::new(),
        1 => " ".into(),
        2 => "0".into(),
        3 => "-1".into(),
        4 => "A".repeat(10_000),
        5 => "é漢字🙂\u{10FFFF}".into(),
        6 => "\u{0}\u{1b}[2J\u{1b}]0;title\u{7}\u{9b}".into(),
        7 => "\u{202e}evil\u{200b}".into(),
        8 => "a\"b<c>&d'e</text><script>".into(),
        9 => "\n\r\t\\".into(),
        10 => "%s%n{}{{}}".into(),
        11 => "🙂".repeat(2_000),
        12 => "0x6e0".into(),
        _ => {
            // A workload file as the effective spec: the diff parses it as TOML.
            let (_, text) = rng.pick(spec::PRESETS);
            text.to_string()
        }
    }
}

/// A string near `s`: cut, doubled, with a character inserted.
fn nearby_string(rng: &mut Rng, s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let at = rng.below(chars.len() + 1);
    match rng.below(4) {
        0 => chars[..at].iter().collect(),
        1 => format!("{s}{s}"),
        2 => {
            let mut c = chars.clone();
            c.insert(
                at,
                *rng.pick(&['\u{0}', '"', '<', '&', 'é', '\u{1b}', '\n', '%', ';']),
            );
            c.into_iter().collect()
        }
        _ => s.to_uppercase(),
    }
}

fn interesting_value(rng: &mut Rng) -> Value {
    match rng.below(8) {
        0..=2 => interesting_number(rng),
        3 | 4 => Value::String(interesting_string(rng)),
        5 => Value::Bool(rng.one_in(2)),
        6 => Value::Null,
        _ => {
            if rng.one_in(2) {
                json!([])
            } else {
                json!({})
            }
        }
    }
}

/// A replacement for `v`, mostly of the same JSON type so the reader gets past its type checks.
fn same_kind(rng: &mut Rng, v: &Value) -> Value {
    match v {
        Value::Number(_) if rng.one_in(2) => nearby_number(rng, v),
        Value::Number(_) => interesting_number(rng),
        Value::String(s) if rng.one_in(2) => Value::String(nearby_string(rng, s)),
        Value::String(_) => Value::String(interesting_string(rng)),
        Value::Bool(b) => Value::Bool(!b),
        _ => interesting_value(rng),
    }
}

fn mutate_array(rng: &mut Rng, a: &mut Vec<Value>) {
    let len = a.len();
    match rng.below(8) {
        0 if len > 0 => {
            a.remove(rng.below(len));
        }
        1 if len > 0 => {
            let v = a[rng.below(len)].clone();
            a.insert(rng.below(len + 1), v);
        }
        2 if len > 0 && len < 5_000 => {
            let copy = a.clone();
            a.extend(copy);
        }
        3 if len > 0 && len < 500 => {
            let copy = a.clone();
            for _ in 0..9 {
                a.extend(copy.iter().cloned());
            }
        }
        4 => a.reverse(),
        5 => a.truncate(rng.below(len + 1)),
        6 if len > 1 => {
            let (i, j) = (rng.below(len), rng.below(len));
            a.swap(i, j);
        }
        _ => a.clear(),
    }
}

fn mutate_object(rng: &mut Rng, m: &mut serde_json::Map<String, Value>) {
    let keys: Vec<String> = m.keys().cloned().collect();
    match rng.below(5) {
        0 if !keys.is_empty() => {
            m.remove(rng.pick(&keys));
        }
        1 => {
            m.insert("fuzz_unknown_key".into(), interesting_value(rng));
        }
        2 if !keys.is_empty() => {
            let k = rng.pick(&keys).clone();
            if let Some(v) = m.remove(&k) {
                m.insert(format!("{k}_"), v);
            }
        }
        3 if !keys.is_empty() => {
            // Another key's value under this key: a map of counts where a number was, etc.
            let (from, to) = (rng.pick(&keys).clone(), rng.pick(&keys).clone());
            if let Some(v) = m.get(&from).cloned() {
                m.insert(to, v);
            }
        }
        _ => m.clear(),
    }
}

/// One mutation of the node at `path`, grafting from `donors` (same path in another seed, or
/// any node of one).
fn mutate_node(rng: &mut Rng, doc: &mut Value, path: &[Seg], donors: &[JsonSeed]) {
    let donor = rng.pick(donors);
    let graft = match rng.below(3) {
        0 => node(&donor.value, path).cloned(),
        _ => node(&donor.value, rng.pick::<Vec<Seg>>(&donor.paths)).cloned(),
    };
    // Removing the node itself needs its parent.
    if !path.is_empty() && rng.one_in(10) {
        let (last, parent) = path.split_last().expect("not empty");
        match (node_mut(doc, parent), last) {
            (Some(Value::Object(m)), Seg::Key(k)) => {
                m.remove(k);
            }
            (Some(Value::Array(a)), Seg::Index(i)) if *i < a.len() => {
                a.remove(*i);
            }
            _ => {}
        }
        return;
    }
    let Some(v) = node_mut(doc, path) else { return };
    match rng.below(12) {
        0..=3 => *v = same_kind(rng, v),
        4 => *v = interesting_value(rng),
        5 => {
            if let Some(g) = graft {
                *v = g;
            }
        }
        6 | 7 => match v {
            Value::Array(a) => mutate_array(rng, a),
            Value::Object(m) => mutate_object(rng, m),
            _ => *v = same_kind(rng, v),
        },
        8 => *v = Value::Null,
        9 => {
            // Nesting deep enough to reach serde_json's recursion limit (128) and past it.
            let depth = 1 + rng.below(140);
            let mut inner = v.take();
            for _ in 0..depth {
                inner = if rng.one_in(2) {
                    json!([inner])
                } else {
                    json!({ "x": inner })
                };
            }
            *v = inner;
        }
        10 => {
            *v = if rng.one_in(2) { json!([]) } else { json!({}) };
        }
        _ => {
            if let Some(g) = graft {
                // Wrap or append: a list where one value was, or one more element.
                match v {
                    Value::Array(a) => a.push(g),
                    _ => *v = json!([g]),
                }
            }
        }
    }
}

/// Breaks a histogram in the ways a reader's arithmetic is most likely to trip on.
fn histogram_surgery(rng: &mut Rng, h: &mut serde_json::Map<String, Value>) {
    let buckets = h.entry("buckets").or_insert_with(|| json!([]));
    let Value::Array(b) = buckets else { return };
    let n = b.len();
    match rng.below(10) {
        0 if n > 0 => {
            // low above high
            // Indexing a mutated bucket could panic in the fuzzer itself: only real triples.
            let (i, by) = (rng.below(n), 1 + rng.below(1000) as u64);
            if let Some(Value::Array(bucket)) = b.get_mut(i) {
                if let Some(lo) = bucket.first().and_then(Value::as_u64) {
                    if let Some(high) = bucket.get_mut(1) {
                        *high = json!(lo.saturating_sub(by));
                    }
                }
            }
        }
        1 => {
            b.push(json!([1, 2, u64::MAX]));
            b.push(json!([3, 4, u64::MAX]));
        }
        2 => b.push(json!([u64::MAX - 1, u64::MAX, 1])),
        3 => b.push(json!([0, 0, 1])),
        4 if n > 0 => {
            let i = rng.below(n);
            if let Some(count) = b.get_mut(i).and_then(|bucket| bucket.get_mut(2)) {
                *count = json!(0);
            }
        }
        5 => b.reverse(),
        6 => {
            h.insert("count".into(), json!(*rng.pick(&[0, 1, u64::MAX])));
        }
        7 => {
            h.insert(
                "sum_ns".into(),
                rng.pick(&[json!(-1.0), json!(1e308), json!(0), json!(u64::MAX)])
                    .clone(),
            );
        }
        8 => {
            let (lo, hi) = *rng.pick(&[(5u64, 1u64), (0, 0), (u64::MAX, u64::MAX), (u64::MAX, 0)]);
            h.insert("min_ns".into(), json!(lo));
            h.insert("max_ns".into(), json!(hi));
        }
        _ => b.clear(),
    }
}

/// Sets one key of every object in an array: all intervals zero-length, every CPU the same.
fn broadcast(rng: &mut Rng, a: &mut [Value]) {
    let Some(Value::Object(first)) = a.first() else {
        return;
    };
    let keys: Vec<String> = first.keys().cloned().collect();
    if keys.is_empty() {
        return;
    }
    let key = rng.pick(&keys).clone();
    let from_key = rng.one_in(2).then(|| rng.pick(&keys).clone());
    let value = same_kind(rng, &first[&key]);
    for v in a.iter_mut() {
        if let Value::Object(m) = v {
            let new = match &from_key {
                Some(k) => m.get(k).cloned().unwrap_or(Value::Null),
                None => value.clone(),
            };
            m.insert(key.clone(), new);
        }
    }
}

struct JsonSeed {
    name: String,
    text: Vec<u8>,
    value: Value,
    paths: Vec<Vec<Seg>>,
    /// Objects holding a "buckets" list.
    histograms: Vec<Vec<Seg>>,
    /// Arrays whose first element is an object.
    tables: Vec<Vec<Seg>>,
}

impl JsonSeed {
    fn new(name: String, text: Vec<u8>) -> Option<Self> {
        let value: Value = serde_json::from_slice(&text).ok()?;
        let paths = all_paths(&value);
        let histograms = paths
            .iter()
            .filter(|p| node(&value, p).is_some_and(|v| v.get("buckets").is_some()))
            .cloned()
            .collect();
        let tables = paths
            .iter()
            .filter(|p| {
                node(&value, p)
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.first().is_some_and(Value::is_object))
            })
            .cloned()
            .collect();
        Some(Self {
            name,
            text,
            value,
            paths,
            histograms,
            tables,
        })
    }
}

/// Shrinks a JSON document while `reproduces` holds: subtrees reset to the base document's,
/// then array elements and keys the base does not have removed.
fn shrink_json(
    input: &[u8],
    base: &Value,
    reproduces: &mut dyn FnMut(&[u8]) -> bool,
    deadline: Instant,
) -> Vec<u8> {
    let Ok(mut cur) = serde_json::from_slice::<Value>(input) else {
        return input.to_vec();
    };
    let bytes = |v: &Value| serde_json::to_vec(v).unwrap_or_default();
    if !reproduces(&bytes(&cur)) {
        // Compact re-serialisation loses it (duplicate keys, number spelling): keep as is.
        return input.to_vec();
    }
    let mut attempt = |cur: &mut Value, edit: &dyn Fn(&mut Value) -> bool| -> bool {
        if Instant::now() > deadline {
            return false;
        }
        let mut cand = cur.clone();
        if !edit(&mut cand) || cand == *cur {
            return false;
        }
        if reproduces(&bytes(&cand)) {
            *cur = cand;
            true
        } else {
            false
        }
    };
    loop {
        let mut progress = false;
        // Toward the base, top-down: a whole subtree at once when that keeps the finding.
        let mut queue = VecDeque::from([Vec::<Seg>::new()]);
        while let Some(path) = queue.pop_front() {
            if Instant::now() > deadline {
                break;
            }
            let Some(theirs) = node(base, &path) else {
                continue;
            };
            let reset = |v: &mut Value| match node_mut(v, &path) {
                Some(n) => {
                    *n = theirs.clone();
                    true
                }
                None => false,
            };
            if attempt(&mut cur, &reset) {
                progress = true;
                continue;
            }
            if let Some(mine) = node(&cur, &path) {
                for (seg, _) in children(mine) {
                    let mut p = path.clone();
                    p.push(seg);
                    queue.push_back(p);
                }
            }
        }
        // What the base does not have: extra array elements and keys removed. Paths from the
        // end, so that removals do not shift the ones still to try; nothing the base shares is
        // touched, so the result reads as "the base, with these changes".
        let mut paths = all_paths(&cur);
        paths.reverse();
        for path in paths {
            if Instant::now() > deadline {
                break;
            }
            let theirs = node(base, &path);
            let Some(mine) = node(&cur, &path) else {
                continue;
            };
            if theirs == Some(mine) {
                continue;
            }
            if let Value::Array(a) = mine {
                let same_length = theirs
                    .and_then(Value::as_array)
                    .is_some_and(|b| b.len() == a.len());
                if a.len() > 1 && !same_length {
                    let half = a.len() / 2;
                    let keep_first = |v: &mut Value| match node_mut(v, &path) {
                        Some(Value::Array(a)) => {
                            a.truncate(half);
                            true
                        }
                        _ => false,
                    };
                    let keep_last = |v: &mut Value| match node_mut(v, &path) {
                        Some(Value::Array(a)) => {
                            a.drain(..half);
                            true
                        }
                        _ => false,
                    };
                    if attempt(&mut cur, &keep_first) || attempt(&mut cur, &keep_last) {
                        progress = true;
                    }
                }
            }
            if theirs.is_some() {
                continue;
            }
            let Some((last, parent)) = path.split_last() else {
                continue;
            };
            let remove = |v: &mut Value| match (node_mut(v, parent), last) {
                (Some(Value::Object(m)), Seg::Key(k)) => m.remove(k).is_some(),
                (Some(Value::Array(a)), Seg::Index(i)) if *i < a.len() => {
                    a.remove(*i);
                    true
                }
                _ => false,
            };
            if attempt(&mut cur, &remove) {
                progress = true;
            }
        }
        if !progress || Instant::now() > deadline {
            break;
        }
    }
    let mut out = serde_json::to_vec_pretty(&cur).unwrap_or_else(|_| bytes(&cur));
    out.push(b'\n');
    if reproduces(&out) {
        out
    } else {
        bytes(&cur)
    }
}

/// Leaf differences from `seed` to `doc`, as "path: seed value -> input value".
fn json_differences(seed: &Value, doc: &Value, path: &mut Vec<Seg>, out: &mut Vec<String>) {
    if out.len() > 200 {
        return;
    }
    let short = |v: Option<&Value>| match v {
        None => "(absent)".to_string(),
        Some(v) => one_line(&v.to_string(), 100),
    };
    match (seed, doc) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                path.push(Seg::Key(k.clone()));
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => json_differences(x, y, path, out),
                    (x, y) => {
                        out.push(format!("{}: {} -> {}", show_path(path), short(x), short(y)))
                    }
                }
                path.pop();
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                path.push(Seg::Index(i));
                json_differences(x, y, path, out);
                path.pop();
            }
        }
        (Value::Array(a), Value::Array(b)) => out.push(format!(
            "{}: {} elements -> {} elements: {}",
            show_path(path),
            a.len(),
            b.len(),
            one_line(&doc.to_string(), 160)
        )),
        (x, y) if x != y => out.push(format!(
            "{}: {} -> {}",
            show_path(path),
            short(Some(x)),
            short(Some(y))
        )),
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Target 1: profiles, and what reads them (diff, its renderers, the CSV export)

struct ProfileTarget {
    seeds: Vec<JsonSeed>,
    /// The other side of every diff: the minimal profile from tests/data.
    reference: Profile,
    reference_value: Value,
}

const PROFILE_TOKENS: &[&[u8]] = &[
    b"1e999",
    b"-1e999",
    b"NaN",
    b"Infinity",
    b"-0",
    b"0.0e0",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"\"\\ud800\"",
    b"\"\\u0000\"",
    b"null",
    b"true",
    b"[]",
    b"{}",
    b"\"schema_version\":1,",
    b",",
    b"1.7976931348623157e309",
    b"00",
    b"1.",
    b".5",
    b"[[[[[[[[[[[[[[[[[[[[",
];

impl ProfileTarget {
    fn load() -> Self {
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
        let minimal = data.join("minimal-profile.json");
        let reference = profile::load(&minimal)
            .unwrap_or_else(|e| panic!("the reference profile must parse: {e}"));
        let mut files = vec![minimal];
        if let Ok(dir) = std::fs::read_dir(data.join("fuzz-seeds")) {
            let mut more: Vec<PathBuf> = dir
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "json"))
                .collect();
            more.sort();
            files.extend(more);
        }
        let mut seeds = Vec::new();
        for path in files {
            let name = path
                .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                .unwrap_or(&path)
                .display()
                .to_string();
            let Ok(text) = std::fs::read(&path) else {
                continue;
            };
            // Seeds are profiles earlier versions wrote: one the reader refuses is a profile
            // users hold that no longer loads.
            if let Err(e) = profile::parse(&text, &name) {
                panic!("fuzz seed {name} no longer loads: {e}");
            }
            seeds.extend(JsonSeed::new(name, text));
        }
        let reference_value = seeds[0].value.clone();
        let target = Self {
            seeds,
            reference,
            reference_value,
        };
        // The seeds themselves must come out clean, or every finding would be noise.
        for s in &target.seeds {
            let outcome = target.check(&s.text);
            assert!(outcome.accepted, "seed {} is accepted", s.name);
            for o in outcome.oddities {
                println!(
                    "fuzz profile: note: seed {} already shows: {}: {}",
                    s.name, o.key, o.detail
                );
            }
        }
        target
    }
}

impl Target for ProfileTarget {
    fn name(&self) -> &'static str {
        "profile"
    }

    fn ext(&self) -> &'static str {
        "json"
    }

    fn generate(&self, rng: &mut Rng) -> Case {
        let seed = rng.pick(&self.seeds);
        let how = match rng.below(10) {
            0..=6 => "structure",
            7 | 8 => "structure+bytes",
            _ => "bytes",
        };
        let mut input = if how == "bytes" {
            seed.text.clone()
        } else {
            let mut doc = seed.value.clone();
            let n = 1 + rng.below(3) + usize::from(rng.one_in(4)) * rng.below(6);
            for _ in 0..n {
                match rng.below(12) {
                    0 if !seed.histograms.is_empty() => {
                        let p = rng.pick(&seed.histograms);
                        if let Some(Value::Object(h)) = node_mut(&mut doc, p) {
                            histogram_surgery(rng, h);
                        }
                    }
                    1 if !seed.tables.is_empty() => {
                        let p = rng.pick(&seed.tables);
                        if let Some(Value::Array(a)) = node_mut(&mut doc, p) {
                            broadcast(rng, a);
                        }
                    }
                    2 => {
                        // The calibrated exit cost the diff multiplies by.
                        let cost = interesting_number(rng);
                        if let Value::Object(top) = &mut doc {
                            top.insert(
                                "calibration".into(),
                                json!({"figures": [{"name": "cpuid", "median_ns": cost}]}),
                            );
                        }
                    }
                    3..=6 => {
                        let path = descend(rng, &doc);
                        mutate_node(rng, &mut doc, &path, &self.seeds);
                    }
                    _ => {
                        let path = rng.pick(&seed.paths).clone();
                        mutate_node(rng, &mut doc, &path, &self.seeds);
                    }
                }
            }
            if rng.one_in(5) {
                serde_json::to_vec_pretty(&doc).unwrap_or_default()
            } else {
                serde_json::to_vec(&doc).unwrap_or_default()
            }
        };
        if how != "structure" {
            let donors: Vec<&[u8]> = self.seeds.iter().map(|s| s.text.as_slice()).collect();
            for _ in 0..1 + rng.below(3) {
                mutate_bytes(rng, &mut input, &donors, PROFILE_TOKENS);
            }
        }
        Case { input, how }
    }

    fn check(&self, input: &[u8]) -> Outcome {
        let p = match profile::parse(input, "fuzz-input.json") {
            Ok(p) => p,
            Err(e) => {
                // The refusal is shown to users: it must format.
                let _ = e.to_string();
                return Outcome::default();
            }
        };
        let mut out = Outcome {
            accepted: true,
            ..Outcome::default()
        };
        let in_input = non_finite_words(&String::from_utf8_lossy(input));
        let r = &self.reference;
        let diffs = [
            ("diff(p, p)", crate::analysis::diff::diff(&p, &p)),
            ("diff(ref, p)", crate::analysis::diff::diff(r, &p)),
            ("diff(p, ref)", crate::analysis::diff::diff(&p, r)),
        ];
        for (label, d) in &diffs {
            check_diff_values(&mut out, label, d);
            let _ =
                serde_json::to_string(d).map_err(|e| out.odd("diff --json fails", e.to_string()));
        }
        for (i, (_, d)) in diffs.iter().enumerate() {
            let (a, b) = match i {
                0 => (&p, &p),
                1 => (r, &p),
                _ => (&p, r),
            };
            let texts = [
                ("diff terminal", crate::render::diff_render::terminal(d)),
                ("diff markdown", crate::render::diff_render::markdown(d)),
                ("diff csv", crate::render::diff_render::csv(d)),
                (
                    "waterfall.svg",
                    crate::render::diff_render::waterfall_svg(d),
                ),
                (
                    "stages.svg",
                    crate::render::diff_render::stages_svg(a, b, d),
                ),
            ];
            for (consumer, text) in &texts {
                // As `virtgap diff` prints it.
                let shown = virtgap_workloads::units::printable(text);
                scan_output(&mut out, consumer, &shown, &in_input);
                if consumer.ends_with(".svg") {
                    if let Err(e) = roxmltree::Document::parse(text) {
                        out.odd(format!("{consumer} is not well-formed XML"), e.to_string());
                    }
                }
                if text.len() > 16 << 20 {
                    out.odd(
                        format!("{consumer} output is huge"),
                        format!("{} bytes", text.len()),
                    );
                }
            }
        }
        for (file, text) in crate::render::csv_export::export(&p) {
            scan_output(&mut out, file, &text, &in_input);
            check_csv_columns(&mut out, file, &text);
        }
        out
    }

    fn shrink(
        &self,
        input: &[u8],
        reproduces: &mut dyn FnMut(&[u8]) -> bool,
        deadline: Instant,
    ) -> Vec<u8> {
        shrink_json(input, &self.reference_value, reproduces, deadline)
    }

    fn nearest_seed(&self, input: &[u8]) -> String {
        let Ok(doc) = serde_json::from_slice::<Value>(input) else {
            return format!("not JSON ({} bytes); see the input file", input.len());
        };
        let best = self
            .seeds
            .iter()
            .map(|s| {
                let mut diffs = Vec::new();
                json_differences(&s.value, &doc, &mut Vec::new(), &mut diffs);
                (diffs, &s.name)
            })
            .min_by_key(|(d, _)| d.len());
        match best {
            Some((diffs, name)) => {
                let mut s = format!("{name} with {} change(s):", diffs.len());
                for d in diffs.iter().take(12) {
                    s.push_str(&format!("\n  {d}"));
                }
                if diffs.len() > 12 {
                    s.push_str("\n  …");
                }
                s
            }
            None => String::new(),
        }
    }
}

/// Numbers in a diff that no output can show sensibly, and percentages no measurement gives.
fn check_diff_values(out: &mut Outcome, label: &str, d: &crate::analysis::diff::ProfileDiff) {
    for r in d.rows() {
        let fields = [
            ("a", r.a),
            ("b", r.b),
            ("delta", r.delta),
            ("ci_low", r.ci_low),
            ("ci_high", r.ci_high),
            ("effect", r.effect),
            ("effect_low", r.effect_low),
            ("effect_high", r.effect_high),
            ("share", r.share),
        ];
        for (field, v) in fields {
            if let Some(x) = v.filter(|x| !x.is_finite()) {
                let what = if x.is_nan() { "NaN" } else { "infinite" };
                out.odd(
                    format!("diff row '{}' {field} is {what}", r.metric.trim()),
                    format!("{label}: {x}"),
                );
            }
        }
    }
    for e in &d.evidence {
        for text in [&e.a, &e.b] {
            if let Some(pct) = percentages(text)
                .into_iter()
                .find(|p| *p > 100.0 || *p < 0.0)
            {
                out.odd(
                    format!("evidence '{}' shows a percentage outside 0-100", e.item),
                    format!("{label}: {pct:.3e}% in \"{}\"", one_line(text, 120)),
                );
            }
        }
    }
}

/// The numbers written just before a '%' sign.
fn percentages(text: &str) -> Vec<f64> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices('%') {
        let head = &text[..i];
        let start = head
            .rfind(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
            .map_or(0, |j| j + 1);
        if let Ok(v) = head[start..].parse::<f64>() {
            out.push(v);
        }
    }
    out
}

/// Every row of an exported CSV file has the header's column count.
fn check_csv_columns(out: &mut Outcome, file: &str, text: &str) {
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(text.as_bytes());
    let width = reader.headers().map(|h| h.len()).unwrap_or(0);
    for record in reader.records() {
        match record {
            Ok(r) if r.len() == width => {}
            Ok(r) => {
                out.odd(
                    format!("{file} has a ragged row"),
                    format!("{} of {width} columns", r.len()),
                );
                return;
            }
            Err(e) => {
                out.odd(format!("{file} does not read back as CSV"), e.to_string());
                return;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Target 2: workload specs (TOML), and what runs them

struct SpecTarget {
    presets: Vec<(&'static str, &'static str, toml::Table)>,
}

/// Which dictionary a key's values come from.
#[derive(Clone, Copy, PartialEq)]
enum KeyKind {
    Size,
    Duration,
    Count,
    Percent,
    Rate,
    Choice(&'static [&'static str]),
    Text,
    Flag,
}

const TOP_KEYS: &[(&str, KeyKind)] = &[
    ("name", KeyKind::Text),
    ("description", KeyKind::Text),
    (
        "pattern",
        KeyKind::Choice(&["random", "sequential", "kv", "Random", "seq", ""]),
    ),
    (
        "rw",
        KeyKind::Choice(&["read", "write", "mix", "rw", "randrw", "Read", ""]),
    ),
    ("rwmix_read", KeyKind::Percent),
    ("bs", KeyKind::Size),
    ("qd", KeyKind::Count),
    ("workers", KeyKind::Count),
    (
        "engine",
        KeyKind::Choice(&["io_uring", "uring", "psync", "null", "libaio", ""]),
    ),
    (
        "distribution",
        KeyKind::Choice(&[
            "uniform",
            "zipf:0.99",
            "zipf:0",
            "zipf:-1",
            "zipf:10",
            "zipf:10.000001",
            "zipf:1e-300",
            "zipf:5e-324",
            "zipf:NaN",
            "zipf:inf",
            "zipf:",
            "zipf:1e309",
            "zipf:1",
            "zipf:1.0000000000000002",
            "Zipf:1",
            "uniform ",
        ]),
    ),
    ("rate_iops", KeyKind::Rate),
    ("size", KeyKind::Size),
    ("duration", KeyKind::Duration),
    ("ramp", KeyKind::Duration),
    ("direct", KeyKind::Flag),
    ("submit_batch", KeyKind::Count),
];

const KV_KEYS: &[(&str, KeyKind)] = &[
    ("x", KeyKind::Rate),
    ("read_rps", KeyKind::Rate),
    ("write_rps", KeyKind::Rate),
    (
        "ratio",
        KeyKind::Choice(&[
            "2:1",
            "1:0",
            "0:1",
            "0:0",
            "1:",
            "::",
            "4294967295:1",
            "4294967296:1",
            "1:4294967295",
            "4294967295:4294967295",
            "-1:1",
            " 2 : 1 ",
            "2:1:1",
        ]),
    ),
    ("record_bytes", KeyKind::Size),
    ("record_bytes_max", KeyKind::Size),
    ("defrag_lwm_pct", KeyKind::Percent),
    ("fill_pct", KeyKind::Percent),
    ("slice", KeyKind::Duration),
    ("max_lag", KeyKind::Duration),
    ("dsync", KeyKind::Flag),
];

fn toml_value(rng: &mut Rng, kind: KeyKind) -> toml::Value {
    use toml::Value as T;
    let text = |s: &str| T::String(s.to_string());
    match kind {
        KeyKind::Size => {
            if rng.one_in(3) {
                T::Integer(*rng.pick(&[
                    0,
                    1,
                    -1,
                    511,
                    512,
                    513,
                    4096,
                    i64::MAX,
                    i64::MIN,
                    1 << 50,
                    (1 << 50) + 1,
                    64 << 20,
                    (64 << 20) + 512,
                ]))
            } else {
                text(rng.pick::<&str>(&[
                    "0",
                    "1",
                    "511",
                    "512",
                    "513",
                    "4KiB",
                    "4 KiB",
                    "4kib",
                    "4k",
                    "4K",
                    "4KB",
                    "1.5KiB",
                    "0.5KiB",
                    "64MiB",
                    "65MiB",
                    "1GiB",
                    "1PiB",
                    "1025TiB",
                    "99999999TiB",
                    "16EiB",
                    "18446744073709551615",
                    "18446744073709551616",
                    "-1",
                    "-0",
                    "",
                    "  ",
                    "KiB",
                    "4 KiB KiB",
                    "1e3",
                    "0x1000",
                    "4\u{0}KiB",
                    "٤KiB",
                    "4KiB\n",
                    "+4KiB",
                    "4.KiB",
                    "8MiB",
                    "8MiB1",
                    "4MiB",
                    "1536",
                    "1KiB-2KiB",
                ]))
            }
        }
        KeyKind::Duration => {
            if rng.one_in(5) {
                T::Integer(*rng.pick(&[0, 10, -1, i64::MAX]))
            } else {
                text(rng.pick::<&str>(&[
                    "0s",
                    "0",
                    "1ns",
                    "999ms",
                    "1s",
                    "1s 1ns",
                    "10",
                    "10 s",
                    "1m 30s",
                    "366d",
                    "366days",
                    "367d",
                    "1y",
                    "1year",
                    "584942417355y",
                    "584y",
                    "18446744073709551615s",
                    "18446744073709551615ns",
                    "18446744073709551616s",
                    "99999999999999999999d",
                    "-1s",
                    "",
                    "1e3s",
                    "1.5s",
                    "0.5s",
                    "1h",
                    "P1D",
                    "\u{202e}10s",
                    "10s\u{0}",
                    "500ms",
                    "200y",
                    "100000000h",
                ]))
            }
        }
        KeyKind::Count => T::Integer(*rng.pick(&[
            0,
            1,
            2,
            31,
            32,
            33,
            1024,
            1025,
            4096,
            4097,
            i64::from(u32::MAX),
            i64::from(u32::MAX) + 1,
            -1,
            i64::MAX,
        ])),
        KeyKind::Percent => {
            T::Integer(*rng.pick(&[0, 1, 50, 89, 90, 91, 99, 100, 101, 255, 256, -1, i64::MAX]))
        }
        KeyKind::Rate => T::Integer(*rng.pick(&[
            0,
            1,
            2,
            1000,
            1_000_000,
            i64::MAX,
            i64::MAX / 2000,
            i64::MAX / 2000 + 1,
            i64::MAX / 1000,
            i64::MAX / 100,
            i64::MAX / 100 + 1,
            1 << 62,
            -1,
        ])),
        KeyKind::Choice(choices) => text(rng.pick::<&str>(choices)),
        KeyKind::Text => text(&interesting_string(rng)),
        KeyKind::Flag => match rng.below(3) {
            0 => T::Boolean(true),
            1 => T::Boolean(false),
            _ => text("true"),
        },
    }
}

/// Any TOML value, whatever the key: wrong types, floats that are not finite, dates, tables.
fn any_toml_value(rng: &mut Rng) -> toml::Value {
    use toml::Value as T;
    match rng.below(8) {
        0 => T::Float(*rng.pick(&[
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            1e308,
            1.5,
            4096.0,
        ])),
        1 => T::Integer(*rng.pick(&[0, -1, i64::MAX, i64::MIN])),
        2 => T::Boolean(rng.one_in(2)),
        3 => T::Array(vec![T::Integer(1), T::String("a".into())]),
        4 => T::Table(toml::Table::new()),
        5 => "1979-05-27T07:32:00Z"
            .parse::<toml::value::Datetime>()
            .map_or(T::Integer(0), T::Datetime),
        _ => T::String(interesting_string(rng)),
    }
}

const TOML_TOKENS: &[&[u8]] = &[
    b"inf",
    b"nan",
    b"-inf",
    b"0x10",
    b"0o17",
    b"0b101",
    b"1_000",
    b"9223372036854775808",
    b"-9223372036854775808",
    b"1e400",
    b"\"\"\"a\nb\"\"\"",
    b"'''x'''",
    b"1979-05-27T07:32:00Z",
    b"07:32:00",
    b"[1, 2]",
    b"{ a = 1 }",
    b"\"\\u0000\"",
    b"\"\\U0010FFFF\"",
    b"\"\\ud800\"",
    b"\n[kv]\n",
    b"\n[[kv]]\n",
    b"\nkv = { x = 1 }\n",
    b"\nrate_iops = 1\n",
    b"\nramp = \"584942417355y\"\n",
    b"\nslice = \"1y\"\n",
    b"=",
    b"#",
    b"\"",
];

impl SpecTarget {
    fn load() -> Self {
        let presets = spec::PRESETS
            .iter()
            .map(|(name, text)| {
                let table: toml::Table = text
                    .parse()
                    .unwrap_or_else(|e| panic!("preset {name} is TOML: {e}"));
                (*name, *text, table)
            })
            .collect();
        let target = Self { presets };
        for (name, text, _) in &target.presets {
            let outcome = target.check(text.as_bytes());
            assert!(outcome.accepted, "preset {name} is accepted");
            for o in outcome.oddities {
                println!(
                    "fuzz spec: note: preset {name} already shows: {}: {}",
                    o.key, o.detail
                );
            }
        }
        target
    }

    fn mutate_table(&self, rng: &mut Rng, t: &mut toml::Table) {
        let in_kv = rng.one_in(3);
        let keys = if in_kv { KV_KEYS } else { TOP_KEYS };
        let (key, kind) = *rng.pick(keys);
        let table = if in_kv {
            match t
                .entry("kv")
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            {
                toml::Value::Table(kv) => kv,
                _ => return,
            }
        } else {
            &mut *t
        };
        match rng.below(10) {
            0..=4 => {
                table.insert(key.into(), toml_value(rng, kind));
            }
            5 => {
                table.insert(key.into(), any_toml_value(rng));
            }
            6 => {
                table.remove(key);
            }
            7 => {
                // The same key's value in another preset.
                let (_, _, other) = rng.pick(&self.presets);
                let from = if in_kv {
                    other.get("kv").and_then(|k| k.get(key))
                } else {
                    other.get(key)
                };
                if let Some(v) = from {
                    table.insert(key.into(), v.clone());
                }
            }
            8 => {
                table.insert("fuzz_unknown".into(), any_toml_value(rng));
            }
            _ => {
                // A [kv] table moved in from a kv preset, or taken away.
                if t.remove("kv").is_none() {
                    let kv_presets: Vec<_> = self
                        .presets
                        .iter()
                        .filter(|p| p.2.contains_key("kv"))
                        .collect();
                    if let Some(kv) = rng.pick(&kv_presets).2.get("kv") {
                        t.insert("kv".into(), kv.clone());
                    }
                }
            }
        }
    }
}

/// Replaces the value on one `key = value` line with a raw TOML token.
fn replace_line_value(rng: &mut Rng, text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let assignments: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].contains('='))
        .collect();
    if assignments.is_empty() {
        return text.to_string();
    }
    let i = *rng.pick(&assignments);
    let key = lines[i].split('=').next().unwrap_or("").trim_end();
    let token = String::from_utf8_lossy(rng.pick::<&[u8]>(TOML_TOKENS)).into_owned();
    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    out[i] = format!("{key} = {token}");
    match rng.below(4) {
        0 => {
            // Duplicate the line: a key set twice.
            let dup = out[i].clone();
            out.insert(i, dup);
        }
        1 => {
            let j = rng.below(out.len());
            out.swap(i, j);
        }
        _ => {}
    }
    out.join("\n") + "\n"
}

impl Target for SpecTarget {
    fn name(&self) -> &'static str {
        "spec"
    }

    fn ext(&self) -> &'static str {
        "toml"
    }

    fn generate(&self, rng: &mut Rng) -> Case {
        let (_, text, table) = rng.pick(&self.presets);
        let how = match rng.below(10) {
            0..=5 => "structure",
            6 | 7 => "text",
            8 => "structure+bytes",
            _ => "bytes",
        };
        let mut input = match how {
            "structure" | "structure+bytes" => {
                let mut t = table.clone();
                for _ in 0..1 + rng.below(3) {
                    self.mutate_table(rng, &mut t);
                }
                toml::to_string(&t)
                    .unwrap_or_else(|_| text.to_string())
                    .into_bytes()
            }
            "text" => {
                let mut s = text.to_string();
                for _ in 0..1 + rng.below(2) {
                    s = replace_line_value(rng, &s);
                }
                s.into_bytes()
            }
            _ => text.as_bytes().to_vec(),
        };
        if how.ends_with("bytes") {
            let donors: Vec<&[u8]> = self.presets.iter().map(|p| p.1.as_bytes()).collect();
            for _ in 0..1 + rng.below(3) {
                mutate_bytes(rng, &mut input, &donors, TOML_TOKENS);
            }
        }
        Case { input, how }
    }

    fn check(&self, input: &[u8]) -> Outcome {
        // Workload files are read as UTF-8 text; anything else is refused before parsing.
        let Ok(text) = std::str::from_utf8(input) else {
            return Outcome::default();
        };
        let spec = match spec::parse(text, "fuzz.toml") {
            Ok(s) => s,
            Err(e) => {
                let _ = e.to_string();
                return Outcome::default();
            }
        };
        let mut out = Outcome {
            accepted: true,
            ..Outcome::default()
        };
        let in_input = non_finite_words(text);
        let describe = spec.describe();
        let effective = spec.to_toml();
        // The effective spec is stored in profiles and parsed again by `diff` and `record -w`.
        match spec::parse(&effective, "effective spec") {
            Err(e) => out.odd(
                "the effective spec (to_toml) is refused when read back",
                e.to_string(),
            ),
            Ok(again) if again != spec => out.odd(
                "the effective spec (to_toml) reads back different",
                one_line(&effective, 300),
            ),
            Ok(_) => {}
        }
        let fio = spec.fio_command("/tmp/fuzz-target").unwrap_or_default();
        let _ = (spec.fio_rw(), spec.is_read_only());
        let mut copy = spec.clone();
        if let Err(e) = spec::Overrides::default().apply(&mut copy) {
            out.odd("an accepted spec fails re-validation", e.to_string());
        }
        // The I/O loop's end time: ramp + duration in u64 nanoseconds (workloads/src/run.rs).
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).ok();
        let end = nanos(spec.ramp.0)
            .zip(nanos(spec.duration.0))
            .and_then(|(r, d)| r.checked_add(d));
        if end.is_none() {
            out.odd(
                "ramp + duration overflow the runner's u64 nanoseconds (run.rs: ramp_ns + duration)",
                format!("ramp {:?}, duration {:?}", spec.ramp.0, spec.duration.0),
            );
        }
        if spec.pattern != Pattern::Kv {
            // Where the first I/Os of the first and last worker go: inside the target, aligned.
            for worker in [0, spec.workers.saturating_sub(1)] {
                let mut offsets = virtgap_workloads::offsets::OffsetGenerator::new(
                    spec.pattern,
                    spec.distribution,
                    spec.size.0,
                    spec.bs.0,
                    worker,
                    spec.workers,
                    1,
                );
                for _ in 0..8 {
                    let at = offsets.next_offset();
                    if at
                        .checked_add(spec.bs.0)
                        .is_none_or(|end| end > spec.size.0)
                    {
                        out.odd(
                            "an I/O lands past the end of the target",
                            format!("offset {at} + bs {} > size {}", spec.bs.0, spec.size.0),
                        );
                        break;
                    }
                }
            }
        }
        if let Some(rate) = spec.rate_iops {
            let mut schedule = virtgap_workloads::schedule::RateSchedule::new(
                rate as f64 / f64::from(spec.workers),
            );
            let _ = (schedule.take_due(1_000_000), schedule.lag_ns(u64::MAX));
        }
        if let Some(kv) = &spec.kv {
            let load = kv.act_load(spec.bs.0);
            let derived = virtgap_workloads::act::derive(&load);
            let rates = [
                derived.internal_read_rps,
                derived.lb_reads_per_s,
                derived.lb_writes_per_s,
            ];
            if rates.iter().any(|r| !r.is_finite()) {
                out.odd("ACT's derived rates are not finite", format!("{derived:?}"));
            }
            let _ = kv.slice_for(spec.duration.0);
        }
        for (consumer, text) in [
            ("describe", &describe),
            ("to_toml", &effective),
            ("fio_command", &fio),
        ] {
            scan_output(&mut out, consumer, text, &in_input);
        }
        out
    }

    fn shrink(
        &self,
        input: &[u8],
        reproduces: &mut dyn FnMut(&[u8]) -> bool,
        deadline: Instant,
    ) -> Vec<u8> {
        // Line by line: drop every line the finding does not need.
        let Ok(text) = std::str::from_utf8(input) else {
            return input.to_vec();
        };
        let mut lines: Vec<&str> = text.lines().collect();
        let join = |ls: &[&str]| (ls.join("\n") + "\n").into_bytes();
        if !reproduces(&join(&lines)) {
            return input.to_vec();
        }
        loop {
            let mut progress = false;
            for i in (0..lines.len()).rev() {
                if Instant::now() > deadline {
                    return join(&lines);
                }
                let mut fewer = lines.clone();
                fewer.remove(i);
                if reproduces(&join(&fewer)) {
                    lines = fewer;
                    progress = true;
                }
            }
            if !progress {
                return join(&lines);
            }
        }
    }

    fn nearest_seed(&self, input: &[u8]) -> String {
        let text = String::from_utf8_lossy(input);
        let mine: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let best = self.presets.iter().min_by_key(|(_, t, _)| {
            let theirs: BTreeSet<&str> = t.lines().map(str::trim).collect();
            mine.iter().filter(|l| !theirs.contains(*l)).count()
        });
        let Some((name, preset, _)) = best else {
            return String::new();
        };
        let theirs: BTreeSet<&str> = preset.lines().map(str::trim).collect();
        let mut s = format!("preset {name}, lines not in it:");
        for l in mine.iter().filter(|l| !theirs.contains(*l)).take(12) {
            s.push_str(&format!("\n  {}", one_line(l, 160)));
        }
        s.push_str(&format!("\nshrunk input ({} lines):", mine.len()));
        for l in mine.iter().take(30) {
            s.push_str(&format!("\n  | {}", one_line(l, 160)));
        }
        s
    }
}
