//! How an experiment is judged: on whether the diff's answer is wrong, not on whether one set
//! of runs on a shared machine was enough to give it.
//!
//! A look at a diff ends in one of three calls. **Right**: every row the injection must move is
//! significant in its direction and nothing contradicts it. **Wrong**: the diff says something
//! the injection rules out — a significant verdict on the wrong stage or in the wrong direction,
//! a share of the gap on a stage that did not move, a significant row in an A/A pair, a size
//! far from the injected one. **Open**: nothing wrong, but a row the injection must move is
//! still inconclusive — the tool being right about its own uncertainty.
//!
//! An open look records more runs a side, as the diff itself advises, up to the plan's cap;
//! at the cap the experiment reports "inconclusive under this machine's noise" with the
//! host's steal and run-to-run spread, and passes. A wrong look is confirmed on more runs (all
//! the runs so far pooled with `step` new ones a side) before it fails: a single false positive
//! at the diff's stated 5% error rate per family of rows does not repeat, a real error does.
//!
//! Every outcome is one line in the file `VIRTGAP_EXPERIMENT_LOG` names (`just
//! attribution-check` prints them at the end), so a reader sees each experiment's outcome, its
//! runs and the noise it ran under without reading the tables above.
#![allow(dead_code)] // the iotune experiment uses its own noise figure

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::Value;

/// What one look at a diff found.
#[derive(Debug, Default)]
pub struct Look {
    /// Findings the injection rules out.
    wrong: Vec<String>,
    /// Effects the injection must show that the diff does not (yet) call.
    open: Vec<String>,
}

impl Look {
    pub fn new() -> Self {
        Self::default()
    }

    /// A wrong answer when `found`.
    pub fn wrong_if(&mut self, found: bool, what: impl FnOnce() -> String) {
        if found {
            self.wrong.push(what());
        }
    }

    /// Still open unless `shown`.
    pub fn open_unless(&mut self, shown: bool, what: impl FnOnce() -> String) {
        if !shown {
            self.open.push(what());
        }
    }

    /// The row `metric` must move in `direction` (+1: B higher, −1: B lower): significant the
    /// other way is wrong, not significant is open.
    pub fn must_move(&mut self, d: &Value, metric: &str, direction: f64) {
        let r = row(d, metric);
        let effect = r["effect"].as_f64().unwrap_or(0.0);
        let significant = r["verdict"] == "significant";
        self.wrong_if(significant && effect * direction < 0.0, || {
            format!("{metric} moved the wrong way: {}", brief(r))
        });
        self.open_unless(significant && effect * direction > 0.0, || {
            format!("{metric}: {}", brief(r))
        });
    }

    /// The diff's verdict (the stage with the largest significant share of the mean gap) must
    /// not name another stage than `metric`'s row; when `required`, none named is open (where
    /// the injection moves the mean too little to be sure of, it need not name one).
    pub fn must_name_stage(&mut self, d: &Value, metric: &str, required: bool) {
        let expected = &row(d, metric)["label"];
        let named = &d["verdict"];
        self.wrong_if(!named.is_null() && named != expected, || {
            format!("the verdict names {named}, not {expected}")
        });
        self.open_unless(!required || !named.is_null(), || {
            format!("no stage named (app_mean: {})", brief(row(d, "app_mean")))
        });
    }

    /// Each stage in `others` that did not take the injection must not carry `limit` or more
    /// of the gap while significantly slower: a share on a stage that did not move. (One whose
    /// change is inconclusive is not judged by its share: its point estimate is noise.)
    pub fn no_share_on(&mut self, d: &Value, others: &[&str], limit: f64) {
        for metric in others {
            let r = row(d, metric);
            let slower = r["verdict"] == "significant" && r["delta"].as_f64().unwrap_or(0.0) > 0.0;
            let share = r["share"].as_f64().unwrap_or(0.0);
            self.wrong_if(slower && share >= limit, || {
                format!(
                    "{metric} is significantly slower and takes {:.0}% of the gap: {}",
                    share * 100.0,
                    brief(r)
                )
            });
        }
    }

    fn call(self) -> Call {
        if !self.wrong.is_empty() {
            Call::Wrong(self.wrong.join("; "))
        } else if !self.open.is_empty() {
            Call::Open(self.open.join("; "))
        } else {
            Call::Right
        }
    }
}

enum Call {
    Right,
    Wrong(String),
    Open(String),
}

/// How many runs a side an experiment starts with, adds per look, and stops at.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub first: usize,
    pub step: usize,
    pub cap: usize,
}

/// The diff's row of `metric`, by its identifier: a waterfall, throughput or tail row
/// ("app_p99_9").
pub fn row<'a>(d: &'a Value, metric: &str) -> &'a Value {
    let rows = |section: &str| d[section].as_array().into_iter().flatten();
    rows("waterfall")
        .chain(rows("throughput"))
        .chain(rows("tails").map(|t| &t["row"]))
        .find(|r| r["metric"] == metric)
        .unwrap_or_else(|| panic!("no row {metric}"))
}

/// A row in a line: its verdict, effect and interval.
pub fn brief(r: &Value) -> String {
    let pct = |k: &str| {
        r[k].as_f64()
            .map_or("-".to_string(), |x| format!("{:+.1}%", x * 100.0))
    };
    let mut s = format!(
        "{} {} [{}, {}]",
        r["verdict"].as_str().unwrap_or("?"),
        pct("effect"),
        pct("effect_low"),
        pct("effect_high")
    );
    if let Some(n) = r["runs_needed"].as_u64() {
        s.push_str(&format!(", ≈{n} runs per host would resolve it"));
    }
    s
}

/// The diff of A's runs against B's under a title (printing its table), as JSON.
pub type DiffFn<'a> = dyn Fn(&str, &[PathBuf], &[PathBuf]) -> Value + 'a;
/// One look at a diff and the runs behind it: what it got right, wrong or left open.
pub type JudgeFn<'a> = dyn Fn(&Value, &[PathBuf], &[PathBuf]) -> Look + 'a;
/// The host's noise over the runs, in words.
pub type NoiseFn<'a> = dyn Fn(&[PathBuf], &[PathBuf]) -> String + 'a;

/// One experiment judged sequentially: its runs, and how it records and judges them.
pub struct Experiment<'a> {
    pub name: &'a str,
    pub plan: Plan,
    pub dir: &'a Path,
    /// Records one of host A's runs into the path.
    pub record_a: &'a mut dyn FnMut(&Path),
    /// Records one of host B's runs into the path, given host A's runs so far.
    pub record_b: &'a mut dyn FnMut(&Path, &[PathBuf]),
    pub diff: &'a DiffFn<'a>,
    pub judge: &'a JudgeFn<'a>,
    pub noise: &'a NoiseFn<'a>,
}

/// How an experiment ended (a wrong answer panics instead).
#[derive(Debug)]
pub struct Ended {
    /// The last look's diff.
    pub diff: Value,
    pub a: Vec<PathBuf>,
    pub b: Vec<PathBuf>,
    /// True when the injected effect was found; false when it stayed inconclusive at the cap.
    pub found: bool,
}

impl Experiment<'_> {
    /// Records `plan.first` runs a side, interleaved, and looks; records `plan.step` more a
    /// side while the look is open and the cap allows, or once to confirm a wrong look. Panics
    /// on a wrong answer that holds on more runs.
    pub fn run(mut self) -> Ended {
        let started = Instant::now();
        let Plan { first, step, cap } = self.plan;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        self.record(&mut a, &mut b, first);
        let mut unconfirmed: Option<String> = None;
        loop {
            let n = a.len().min(b.len());
            let d = (self.diff)(
                &format!("{} — {} + {} runs", self.name, a.len(), b.len()),
                &a,
                &b,
            );
            let noise = (self.noise)(&a, &b);
            eprintln!("noise: {noise}");
            let runs = format!(
                "{} + {} runs, {:.0} s",
                a.len(),
                b.len(),
                started.elapsed().as_secs_f64()
            );
            match self.judge_look(&d, &a, &b) {
                Call::Right => {
                    let note = unconfirmed.map_or(String::new(), |w| {
                        format!(" (an earlier look's \"{w}\" did not hold on more runs)")
                    });
                    self.log(&format!(
                        "PASS {} ({runs}): the right answer{note}; {noise}",
                        self.name
                    ));
                    return Ended {
                        diff: d,
                        a,
                        b,
                        found: true,
                    };
                }
                Call::Wrong(why) if unconfirmed.is_some() => {
                    self.log(&format!(
                        "FAIL {} ({runs}): wrong answer, held on more runs: {why}; {noise}",
                        self.name
                    ));
                    panic!(
                        "{}: wrong answer at {n} + {n} runs, held on more runs: {why}",
                        self.name
                    );
                }
                Call::Wrong(why) => {
                    eprintln!(
                        "{}: wrong at {n} + {n} runs: {why}\n  confirming on {step} more runs a side",
                        self.name
                    );
                    unconfirmed = Some(why);
                }
                Call::Open(why) if n + step <= cap => {
                    eprintln!(
                        "{}: open at {n} + {n} runs: {why}\n  {step} more runs a side",
                        self.name
                    );
                    unconfirmed = None;
                }
                Call::Open(why) => {
                    self.log(&format!(
                        "INCONCLUSIVE {} ({runs}): {why}; inconclusive under this machine's noise: {noise}",
                        self.name
                    ));
                    return Ended {
                        diff: d,
                        a,
                        b,
                        found: false,
                    };
                }
            }
            self.record(&mut a, &mut b, step);
        }
    }

    fn judge_look(&self, d: &Value, a: &[PathBuf], b: &[PathBuf]) -> Call {
        (self.judge)(d, a, b).call()
    }

    /// `more` runs a side, interleaved A B, B A, A B, … (numbered on from the runs so far), so
    /// a drift of the host over the experiment, and whatever one run leaves for the next
    /// (writeback, caches), falls on both sides alike.
    fn record(&mut self, a: &mut Vec<PathBuf>, b: &mut Vec<PathBuf>, more: usize) {
        for k in a.len()..a.len() + more {
            let (fa, fb) = (
                self.dir.join(format!("a{k}.json")),
                self.dir.join(format!("b{k}.json")),
            );
            if k % 2 == 0 {
                (self.record_a)(&fa);
                a.push(fa);
                (self.record_b)(&fb, a);
            } else {
                (self.record_b)(&fb, a);
                (self.record_a)(&fa);
                a.push(fa);
            }
            b.push(fb);
        }
    }

    fn log(&self, line: &str) {
        eprintln!("{line}");
        if let Some(path) = std::env::var_os("VIRTGAP_EXPERIMENT_LOG") {
            let written = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
            if let Err(e) = written {
                eprintln!(
                    "(could not add the outcome to {}: {e})",
                    path.to_string_lossy()
                );
            }
        }
    }
}

/// Steal and run-to-run spread of each side's recorded runs, in words: the noise an
/// inconclusive experiment ran under.
pub fn profile_noise(a: &[PathBuf], b: &[PathBuf]) -> String {
    let side = |paths: &[PathBuf]| {
        let profiles: Vec<_> = paths
            .iter()
            .map(|p| virtgap::model::file::load(p).unwrap())
            .collect();
        let (mut stolen, mut cpu) = (0.0, 0.0);
        for p in &profiles {
            if let Some(s) = virtgap::analysis::diff::HostEvidence::of(&[p]).steal {
                stolen += s.steal_ns;
                cpu += s.cpu_ns;
            }
        }
        let iops: Vec<f64> = profiles
            .iter()
            .map(|p| (p.results.read.ios + p.results.write.ios) as f64 / p.results.measured_s)
            .collect();
        let steal = if cpu > 0.0 {
            format!("steal {:.1}%", stolen / cpu * 100.0)
        } else {
            "steal not measured".to_string()
        };
        format!("{steal}, IOPS spread {}", spread(&iops))
    };
    format!("A: {}; B: {}", side(a), side(b))
}

/// The coefficient of variation of `xs`, in words ("4.2%"; "-" with fewer than two).
pub fn spread(xs: &[f64]) -> String {
    if xs.len() < 2 {
        return "-".into();
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    format!("{:.1}%", var.sqrt() / mean * 100.0)
}
