//! Property-based fuzzing of the readers of untrusted input (profiles, workload TOML) and of
//! everything that consumes what they accept, on proptest.
//!
//! Profiles come from other hosts and workload files from other people, so their readers, and
//! everything that consumes what the readers accept, must never panic. A case is a recipe of
//! mutations applied to one seed — structure-aware (JSON or TOML values, keys, shapes,
//! histogram surgery) and as raw bytes; proptest draws the recipes and shrinks a failing one to
//! a smallest recipe that still fails.
//!
//! - Every `cargo test` runs a fixed number of cases from a fixed seed, so a failure in CI
//!   replays; `PROPTEST_CASES` and `PROPTEST_RNG_SEED` change them.
//! - `VIRTGAP_FUZZ_SECONDS=N` (`just fuzz N`) runs batches of cases from a fresh seed for N
//!   seconds, two thirds to profiles and one third to workload files, and reports every
//!   distinct panic (by location) rather than stopping at the first.
//! - A panic saves its shrunk input as `target/fuzz-failures/<hash>.json|toml`, with a note
//!   `<hash>.txt`: the message, the recipe, what it changes in its seed, how to replay it.
//! - Accepted inputs that make a consumer print NaN or inf, draw a broken SVG, and the like are
//!   saved under `target/fuzz-failures/oddities/` and listed, without failing the run.
//! - `VIRTGAP_FUZZ_REPLAY=FILE` runs one saved input through its target with panics uncaught.

pub mod bytes;
pub mod consumers;
pub mod json;
pub mod workload;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Write;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use proptest::strategy::BoxedStrategy;
use proptest::test_runner::{
    Config, RngSeed, TestCaseError, TestCaseResult, TestError, TestRunner,
};

/// The seed of the bounded run in every `cargo test`: CI replays the same cases, so a failure
/// there is reproducible rather than luck.
pub const DEFAULT_SEED: u64 = 0x0076_6972_7467_6170;
/// A case taking longer than this is listed as slow.
const SLOW_CASE: Duration = Duration::from_secs(2);
/// A case taking longer than this is a hang: its input is saved and the process aborted, since
/// a stuck thread cannot be unwound (proptest's own timeout forks a process per case).
const HANG_CASE: Duration = Duration::from_secs(60);
/// Generated inputs above this are skipped rather than fed: they only measure memory bandwidth.
const MAX_INPUT: usize = 4 << 20;
/// A timed run's batches last about this long, so it ends close to its deadline.
const BATCH: Duration = Duration::from_secs(5);

/// A fuzz target: its cases, how a case becomes input, and what checks an input.
pub trait Target {
    type Case: Clone + Debug;
    fn name(&self) -> &'static str;
    /// The extension of saved inputs, which also picks the target a replay goes to.
    fn ext(&self) -> &'static str;
    fn cases(&self) -> BoxedStrategy<Self::Case>;
    /// The input a case makes, and how it was made ("structure", "bytes", ...).
    fn input(&self, case: &Self::Case) -> (Vec<u8>, &'static str);
    /// Parses `input` and runs every consumer on what is accepted.
    fn check(&self, input: &[u8]) -> Outcome;
    /// What `input` changes in the seed `case` started from, for people reading a finding.
    fn explain(&self, case: &Self::Case, input: &[u8]) -> String;
}

/// Something wrong that is not a panic, in what a consumer made of an accepted input.
#[derive(Debug)]
pub struct Oddity {
    /// What kind of problem, without the values: findings are counted by it.
    pub key: String,
    /// One example, with values.
    pub detail: String,
}

#[derive(Debug, Default)]
pub struct Outcome {
    pub accepted: bool,
    pub oddities: Vec<Oddity>,
}

impl Outcome {
    pub fn accepted() -> Self {
        Self {
            accepted: true,
            oddities: Vec::new(),
        }
    }

    pub fn odd(&mut self, key: impl Into<String>, detail: impl Into<String>) {
        self.oddities.push(Oddity {
            key: key.into(),
            detail: detail.into(),
        });
    }
}

/// Runs `target` as the environment says (see the crate's doc) and fails on any panic found.
pub fn fuzz<T: Target>(target: &T, default_cases: u32, share: f64) {
    if let Some(path) = std::env::var_os("VIRTGAP_FUZZ_REPLAY") {
        replay(target, Path::new(&path));
        return;
    }
    let (seed, plan) = plan(default_cases, share);
    let name = target.name();
    match plan {
        Plan::Cases(n) => println!(
            "fuzz {name}: seed {seed}, {n} cases (PROPTEST_RNG_SEED={seed} PROPTEST_CASES={n} replays)"
        ),
        Plan::Until(end) => println!(
            "fuzz {name}: seed {seed}, {:.0} s",
            end.saturating_duration_since(Instant::now()).as_secs_f64()
        ),
    }
    let panics = campaign(target, seed, plan);
    let list: Vec<String> = panics
        .iter()
        .map(|(at, file)| format!("\n  {at}: {}", file.display()))
        .collect();
    assert!(
        panics.is_empty(),
        "fuzz {name}: {} distinct panic(s), shrunk inputs and notes saved:{}\nreplay one: \
         VIRTGAP_FUZZ_REPLAY=FILE cargo test -p virtgap-fuzz --test fuzz -- --nocapture",
        panics.len(),
        list.concat()
    );
}

enum Plan {
    Cases(u32),
    Until(Instant),
}

/// A fixed number of cases from a fixed seed, or a time budget from a fresh one.
fn plan(default_cases: u32, share: f64) -> (u64, Plan) {
    let seed = env::<u64>("PROPTEST_RNG_SEED");
    match env::<f64>("VIRTGAP_FUZZ_SECONDS") {
        Some(secs) => {
            let budget = Duration::try_from_secs_f64(secs * share)
                .unwrap_or_else(|e| panic!("VIRTGAP_FUZZ_SECONDS={secs}: {e}"));
            (
                seed.unwrap_or_else(fresh_seed),
                Plan::Until(Instant::now() + budget),
            )
        }
        None => {
            let cases = env::<u32>("PROPTEST_CASES").unwrap_or(default_cases);
            (seed.unwrap_or(DEFAULT_SEED), Plan::Cases(cases))
        }
    }
}

fn env<T: std::str::FromStr>(var: &str) -> Option<T> {
    let s = std::env::var(var).ok()?;
    let value = s.trim().parse().ok();
    Some(value.unwrap_or_else(|| panic!("{var}={s} is not a number")))
}

fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}

/// Batch `i`'s seed: the run's own for the first, so a bounded run is its first batch.
fn batch_seed(seed: u64, i: u64) -> u64 {
    if i == 0 {
        return seed;
    }
    let mut z = seed.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn config(cases: u32, seed: u64) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        // Findings are saved as inputs under target/, not as seeds beside the sources.
        failure_persistence: None,
        max_shrink_time: 60_000,
        ..Config::default()
    }
}

/// Cases run, accepted, and oddities seen, across a target's batches.
#[derive(Default)]
struct Tally {
    cases: u64,
    accepted: u64,
    by_how: BTreeMap<&'static str, (u64, u64)>,
    slowest: Duration,
    /// Cases that hit a panic already saved.
    repeats: u64,
    /// By kind: one example and the smallest input that shows it, and how often it was seen.
    oddities: BTreeMap<String, (String, Vec<u8>, u64)>,
}

impl Tally {
    fn note(&mut self, how: &'static str, outcome: Outcome, took: Duration, input: &[u8]) {
        self.cases += 1;
        self.slowest = self.slowest.max(took);
        let by_how = self.by_how.entry(how).or_default();
        by_how.0 += 1;
        if outcome.accepted {
            self.accepted += 1;
            by_how.1 += 1;
        }
        let mut odd = outcome.oddities;
        if took > SLOW_CASE {
            odd.push(Oddity {
                key: "slow case".into(),
                detail: format!("{:.1} s for one case", took.as_secs_f64()),
            });
        }
        for o in odd {
            let seen = self
                .oddities
                .entry(o.key)
                .or_insert_with(|| (o.detail.clone(), input.to_vec(), 0));
            seen.2 += 1;
            if input.len() < seen.1.len() {
                (seen.0, seen.1) = (o.detail, input.to_vec());
            }
        }
    }
}

/// One target's run: what it has seen so far, across its batches.
struct Campaign<'a, T: Target> {
    target: &'a T,
    started: Instant,
    tally: RefCell<Tally>,
    watchdog: Watchdog,
    /// Panics saved so far, by location, with their input's file. Seen again, they pass: a
    /// batch looks for new ones rather than shrinking a known one again.
    known: RefCell<BTreeMap<String, PathBuf>>,
    /// Whether the batch has failed yet: its first panic is announced before the shrinking.
    failing: Cell<bool>,
}

impl<T: Target> Campaign<'_, T> {
    fn case(&self, case: &T::Case) -> TestCaseResult {
        let (input, how) = self.target.input(case);
        if input.len() > MAX_INPUT {
            return Ok(());
        }
        self.watchdog.begin(&input);
        let t0 = Instant::now();
        let result = catching(|| self.target.check(&input));
        let took = t0.elapsed();
        self.watchdog.end();
        let mut tally = self.tally.borrow_mut();
        let caught = match result {
            Ok(outcome) => {
                tally.note(how, outcome, took, &input);
                return Ok(());
            }
            Err(caught) => caught,
        };
        tally.cases += 1;
        if self.known.borrow().contains_key(&caught.location) {
            tally.repeats += 1;
            return Ok(());
        }
        if !self.failing.replace(true) {
            println!(
                "fuzz {}: case {}, {:.1} s in: panic at {}: {}; shrinking it",
                self.target.name(),
                tally.cases,
                self.started.elapsed().as_secs_f64(),
                caught.location,
                one_line(&caught.message, 200)
            );
        }
        Err(TestCaseError::fail(format!("panic at {}", caught.location)))
    }
}

/// Runs batches until the plan is done; returns the distinct panics, by location, with the
/// file each one's input was saved to.
fn campaign<T: Target>(target: &T, seed: u64, plan: Plan) -> BTreeMap<String, PathBuf> {
    let run = Campaign {
        target,
        started: Instant::now(),
        tally: RefCell::default(),
        watchdog: Watchdog::start(target.name(), target.ext()),
        known: RefCell::default(),
        failing: Cell::new(false),
    };
    let strategy = target.cases();
    let mut cases = match plan {
        Plan::Cases(n) => n,
        Plan::Until(_) => 64,
    };
    for batch in 0.. {
        let batch_seed = batch_seed(seed, batch);
        let batch_started = Instant::now();
        run.failing.set(false);
        let mut runner = TestRunner::new(config(cases, batch_seed));
        match runner.run(&strategy, |case| run.case(&case)) {
            Ok(()) => {}
            Err(TestError::Fail(reason, case)) => {
                let found = save_panic(&run, (reason.message(), &case), (batch_seed, cases));
                run.known.borrow_mut().extend(found);
            }
            Err(TestError::Abort(why)) => panic!("fuzz {}: aborted: {why}", target.name()),
        }
        let Plan::Until(end) = plan else { break };
        let now = Instant::now();
        if now >= end {
            break;
        }
        // Sized from the last batch's pace, so the run stops close to its deadline.
        let rate = f64::from(cases) / batch_started.elapsed().as_secs_f64().max(1e-3);
        let next = rate * BATCH.min(end - now).as_secs_f64();
        cases = next.clamp(1.0, 1e6) as u32;
    }
    let Campaign {
        started,
        tally,
        watchdog,
        known,
        ..
    } = run;
    drop(watchdog);
    let known = known.into_inner();
    report(target, &tally.into_inner(), started.elapsed(), known.len());
    known
}

/// Saves a shrunk failing case, unless its panic is one already saved; prints where it went.
fn save_panic<T: Target>(
    run: &Campaign<'_, T>,
    (reason, case): (&str, &T::Case),
    (seed, cases): (u64, u32),
) -> Option<(String, PathBuf)> {
    let target = run.target;
    let (input, _) = target.input(case);
    let caught = catching(|| target.check(&input))
        .err()
        .unwrap_or_else(|| Caught {
            message: "it did not fail when run again: the check depends on more than its input"
                .into(),
            location: format!("{reason} (not reproduced)"),
        });
    if run.known.borrow().contains_key(&caught.location) {
        return None;
    }
    let dir = failures_dir();
    let stem = format!("{:016x}", fnv1a(caught.location.as_bytes()));
    let file = dir.join(format!("{stem}.{}", target.ext()));
    save(&file, &input);
    let note = format!(
        "panic at {}\n{}\n\nshrunk case: {}\n\n{}\n\nreplay: VIRTGAP_FUZZ_REPLAY={} cargo test -p virtgap-fuzz --test fuzz -- --nocapture\n\
         the batch that found it: PROPTEST_RNG_SEED={seed} PROPTEST_CASES={cases} cargo test -p virtgap-fuzz --test fuzz {}\n",
        caught.location,
        caught.message,
        one_line(&format!("{case:?}"), 4000),
        target.explain(case, &input),
        file.display(),
        target.name(),
    );
    save(&dir.join(format!("{stem}.txt")), note.as_bytes());
    println!(
        "fuzz {}: PANIC at {}, {:.1} s in: {} (shrunk input: {}, note: {stem}.txt)",
        target.name(),
        caught.location,
        run.started.elapsed().as_secs_f64(),
        one_line(&caught.message, 200),
        file.display()
    );
    Some((caught.location, file))
}

/// Prints the run's figures and its oddities, saving each oddity's smallest input.
fn report<T: Target>(target: &T, tally: &Tally, took: Duration, panics: usize) {
    let name = target.name();
    let pct = |a: u64, n: u64| a as f64 * 100.0 / n.max(1) as f64;
    let secs = took.as_secs_f64();
    println!(
        "fuzz {name}: {} cases in {secs:.1} s ({:.0}/s), {} accepted ({:.1}%), slowest case {:.0} ms",
        tally.cases,
        tally.cases as f64 / secs.max(1e-9),
        tally.accepted,
        pct(tally.accepted, tally.cases),
        tally.slowest.as_secs_f64() * 1e3
    );
    for (how, (n, ok)) in &tally.by_how {
        println!(
            "  {how:<16} {n:>8} cases, {ok:>8} accepted ({:.1}%)",
            pct(*ok, *n)
        );
    }
    println!(
        "  {panics} distinct panic(s) ({} more case(s) hit one again), {} kind(s) of oddity",
        tally.repeats,
        tally.oddities.len()
    );
    let dir = failures_dir().join("oddities");
    for (key, (detail, input, hits)) in &tally.oddities {
        let stem = format!("{:016x}", fnv1a(key.as_bytes()));
        let file = dir.join(format!("{stem}.{}", target.ext()));
        save(&file, input);
        save(
            &dir.join(format!("{stem}.txt")),
            format!(
                "{key}\n{detail}\nseen {hits} times\ninput: {}\n",
                file.display()
            )
            .as_bytes(),
        );
        println!("  oddity {key} ({hits} hits)");
        println!("         {}", one_line(detail, 300));
        println!("         input: {}", file.display());
    }
}

/// Runs one saved input with panics uncaught, so that it shows its own backtrace.
fn replay<T: Target>(target: &T, path: &Path) {
    if path.extension().and_then(|e| e.to_str()) != Some(target.ext()) {
        return;
    }
    // cargo runs tests in fuzz/: a relative path is taken from the workspace's root.
    let path = &workspace().join(path);
    let input =
        std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let outcome = target.check(&input);
    let verdict = if outcome.accepted {
        "accepted"
    } else {
        "rejected"
    };
    println!("replay {}: {verdict}", path.display());
    for o in &outcome.oddities {
        println!("  oddity: {}: {}", o.key, one_line(&o.detail, 300));
    }
}

// ---------------------------------------------------------------------------------------------
// Panic capture and the hang watchdog

struct Caught {
    message: String,
    location: String,
}

thread_local! {
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
    static CAUGHT: RefCell<Option<Caught>> = const { RefCell::new(None) };
}

/// Runs `f`, turning a panic into its message and location, quietly: proptest sees a failed
/// case and shrinks it, while the location tells distinct panics apart.
fn catching<T>(f: impl FnOnce() -> T) -> Result<T, Caught> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !CAPTURING.with(Cell::get) {
                return previous(info);
            }
            let caught = Caught {
                message: payload_text(info.payload()),
                location: info.location().map_or("unknown location".into(), |l| {
                    let at = format!("{}:{}:{}", l.file(), l.line(), l.column());
                    match outside_project(l.file()).then(project_caller).flatten() {
                        // "/rustc/<commit>/library/core/…" -> "core/…"
                        Some(caller) => {
                            let inner = at.split_once("/library/").map_or(&*at, |(_, p)| p);
                            format!("{caller} (in {inner})")
                        }
                        None => at,
                    }
                }),
            };
            CAUGHT.with(|c| *c.borrow_mut() = Some(caught));
        }));
    });
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

/// A file of the standard library or a dependency: its line says little about the bug.
fn outside_project(file: &str) -> bool {
    file.starts_with("/rustc/") || file.contains("/.cargo/registry/")
}

/// The innermost frame in virtgap's own code (not the fuzzer's) on the panicking stack.
fn project_caller() -> Option<String> {
    let trace = std::backtrace::Backtrace::force_capture().to_string();
    // The workspace's files show with their full path; the fuzzer's own relative to fuzz/.
    let root = format!("{}/", workspace().display());
    trace
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("at ")?.strip_prefix(&root))
        .find(|file| !file.starts_with("fuzz/"))
        .map(String::from)
}

fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    match (
        payload.downcast_ref::<&str>(),
        payload.downcast_ref::<String>(),
    ) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "(non-text panic)".into(),
    }
}

/// The case in flight (since when, its input), for a thread that saves it if it never ends.
type InFlight = Mutex<(Option<Instant>, Vec<u8>)>;

struct Watchdog {
    in_flight: Arc<InFlight>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(name: &'static str, ext: &'static str) -> Self {
        let in_flight: Arc<InFlight> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (held, stopped) = (in_flight.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                std::thread::park_timeout(Duration::from_millis(250));
                let Ok(held) = held.lock() else { return };
                if held.0.is_none_or(|since| since.elapsed() <= HANG_CASE) {
                    continue;
                }
                let path = failures_dir().join(format!("hang-{:016x}.{ext}", fnv1a(&held.1)));
                save(&path, &held.1);
                let _ = writeln!(
                    std::io::stderr(),
                    "fuzz {name}: a case has run for over {} s: input saved to {}; aborting",
                    HANG_CASE.as_secs(),
                    path.display()
                );
                std::process::abort();
            }
        });
        Self {
            in_flight,
            stop,
            thread: Some(thread),
        }
    }

    fn begin(&self, input: &[u8]) {
        if let Ok(mut held) = self.in_flight.lock() {
            held.0 = Some(Instant::now());
            held.1.clear();
            held.1.extend_from_slice(input);
        }
    }

    fn end(&self) {
        if let Ok(mut held) = self.in_flight.lock() {
            held.0 = None;
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Small helpers

/// The workspace's root, where the seeds and target/ are.
pub fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("fuzz/ sits in the workspace")
}

pub fn failures_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
        .join("fuzz-failures")
}

fn save(path: &Path, bytes: &[u8]) {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = std::fs::write(path, bytes) {
        println!("fuzz: cannot write {}: {e}", path.display());
    }
}

/// FNV-1a: a stable name for a finding across runs and platforms.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `s` on one line, cut to `max` characters.
pub fn one_line(s: &str, max: usize) -> String {
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
