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
//! host's steal and run-to-run spread, and passes. A wrong look is confirmed on `step` fresh runs a
//! side, judged on their own, before it fails: it fails only when one of the same findings is
//! wrong again there. A false positive at the diff's stated 5% error rate per family of rows
//! repeats on independent runs at that rate or less; a real error repeats. (Pooling the fresh
//! runs with the first ones would carry the first look's chance extreme into the confirmation.)
//! A fresh look that is right passes; one that is open goes on with all the runs pooled.
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
    /// Findings the injection rules out, each under a name that stays the same from look to
    /// look (its figures change).
    wrong: Vec<(String, String)>,
    /// Effects the injection must show that the diff does not (yet) call.
    open: Vec<String>,
}

impl Look {
    pub fn new() -> Self {
        Self::default()
    }

    /// A wrong answer, named `finding`, when `found`.
    pub fn wrong_if(
        &mut self,
        found: bool,
        finding: impl Into<String>,
        what: impl FnOnce() -> String,
    ) {
        if found {
            self.wrong.push((finding.into(), what()));
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
        self.wrong_if(
            significant && effect * direction < 0.0,
            format!("{metric} way"),
            || format!("{metric} moved the wrong way: {}", brief(r)),
        );
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
        self.wrong_if(!named.is_null() && named != expected, "stage named", || {
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
            self.wrong_if(slower && share >= limit, format!("{metric} share"), || {
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
            Call::Wrong(self.wrong)
        } else if !self.open.is_empty() {
            Call::Open(self.open.join("; "))
        } else {
            Call::Right
        }
    }
}

enum Call {
    Right,
    /// The wrong findings, each (name, words).
    Wrong(Vec<(String, String)>),
    Open(String),
}

/// Wrong findings in words.
fn words(findings: &[(String, String)]) -> String {
    findings
        .iter()
        .map(|(_, what)| what.as_str())
        .collect::<Vec<_>>()
        .join("; ")
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

/// How an experiment ended (a wrong answer panics instead): the runs of its last look.
#[derive(Debug)]
pub struct Ended {
    pub a: Vec<PathBuf>,
    pub b: Vec<PathBuf>,
    /// True when the injected effect was found; false when it stayed inconclusive at the cap.
    pub found: bool,
}

impl Experiment<'_> {
    /// Records `plan.first` runs a side, interleaved, and looks; records `plan.step` more a
    /// side while the look is open and the cap allows. A wrong look is confirmed on `step`
    /// fresh runs a side, judged alone: it fails when one of its findings is found wrong again
    /// there. Panics on a wrong answer that holds.
    pub fn run(mut self) -> Ended {
        let started = Instant::now();
        let Plan { first, step, cap } = self.plan;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        self.record(&mut a, &mut b, first);
        // A wrong finding that did not hold on fresh runs, in words.
        let mut unheld: Option<String> = None;
        loop {
            let n = a.len().min(b.len());
            let d = (self.diff)(
                &format!("{} — {} + {} runs", self.name, a.len(), b.len()),
                &a,
                &b,
            );
            let noise = (self.noise)(&a, &b);
            eprintln!("noise: {noise}");
            let runs = |a: &[PathBuf], b: &[PathBuf]| {
                format!(
                    "{} + {} runs, {:.0} s",
                    a.len(),
                    b.len(),
                    started.elapsed().as_secs_f64()
                )
            };
            let note = unheld.as_ref().map_or(String::new(), |w| {
                format!(" (an earlier look's \"{w}\" did not hold on fresh runs)")
            });
            match self.judge_look(&d, &a, &b) {
                Call::Right => {
                    let line = format!(
                        "PASS {} ({}): the right answer{note}; {noise}",
                        self.name,
                        runs(&a, &b)
                    );
                    return self.end(&line, a, b, true);
                }
                Call::Wrong(found) => {
                    eprintln!(
                        "{}: wrong at {n} + {n} runs: {}\n  confirming on {step} fresh runs a side",
                        self.name,
                        words(&found)
                    );
                    self.record(&mut a, &mut b, step);
                    let (fresh_a, fresh_b) = (&a[a.len() - step..], &b[b.len() - step..]);
                    let fresh = (self.diff)(
                        &format!("{} — {step} + {step} fresh runs", self.name),
                        fresh_a,
                        fresh_b,
                    );
                    match self.judge_look(&fresh, fresh_a, fresh_b) {
                        Call::Right => {
                            let line = format!(
                                "PASS {} ({}): the right answer on fresh runs (the first look's \"{}\" did not hold); {}",
                                self.name,
                                runs(fresh_a, fresh_b),
                                words(&found),
                                (self.noise)(fresh_a, fresh_b)
                            );
                            return self.end(&line, fresh_a, fresh_b, true);
                        }
                        Call::Wrong(again) => {
                            let held: Vec<_> = again
                                .into_iter()
                                .filter(|(name, _)| found.iter().any(|(first, _)| first == name))
                                .collect();
                            if !held.is_empty() {
                                let why = words(&held);
                                self.log(&format!(
                                    "FAIL {} ({}): wrong answer, held on fresh runs: {why}; first: {}; {}",
                                    self.name,
                                    runs(fresh_a, fresh_b),
                                    words(&found),
                                    (self.noise)(fresh_a, fresh_b)
                                ));
                                panic!(
                                    "{}: wrong answer at {n} + {n} runs, held on {step} + {step} fresh runs: {why}",
                                    self.name
                                );
                            }
                        }
                        Call::Open(_) => {}
                    }
                    unheld = Some(words(&found));
                    // The pooled runs are looked at again only while the cap allows more.
                    if a.len().min(b.len()) > cap {
                        let line = format!(
                            "INCONCLUSIVE {} ({}): \"{}\" did not hold on fresh runs; {}",
                            self.name,
                            runs(&a, &b),
                            words(&found),
                            (self.noise)(&a, &b)
                        );
                        return self.end(&line, a, b, false);
                    }
                }
                Call::Open(why) if n + step <= cap => {
                    eprintln!(
                        "{}: open at {n} + {n} runs: {why}\n  {step} more runs a side",
                        self.name
                    );
                    self.record(&mut a, &mut b, step);
                }
                Call::Open(why) => {
                    let line = format!(
                        "INCONCLUSIVE {} ({}): {why}{note}; inconclusive under this machine's noise: {noise}",
                        self.name,
                        runs(&a, &b)
                    );
                    return self.end(&line, a, b, false);
                }
            }
        }
    }

    /// Logs how the experiment ended, with the runs of its last look.
    fn end(
        &self,
        line: &str,
        a: impl Into<Vec<PathBuf>>,
        b: impl Into<Vec<PathBuf>>,
        found: bool,
    ) -> Ended {
        self.log(line);
        Ended {
            a: a.into(),
            b: b.into(),
            found,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs an experiment whose looks are scripted by `judge` (given the runs' file numbers),
    /// recording nothing: how it ends, or the panic's words.
    fn scripted(plan: Plan, judge: &JudgeFn) -> Result<Ended, String> {
        let dir = std::env::temp_dir();
        let diff = |_: &str, _: &[PathBuf], _: &[PathBuf]| Value::Null;
        let noise = |_: &[PathBuf], _: &[PathBuf]| "no noise".to_string();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Experiment {
                name: "scripted",
                plan,
                dir: &dir,
                record_a: &mut |_| {},
                record_b: &mut |_, _| {},
                diff: &diff,
                judge,
                noise: &noise,
            }
            .run()
        }))
        .map_err(|e| e.downcast_ref::<String>().cloned().unwrap_or_default())
    }

    /// The numbers of the runs a look was given ("a3.json" → 3).
    fn numbers(runs: &[PathBuf]) -> Vec<usize> {
        runs.iter()
            .map(|p| {
                let name = p.file_stem().unwrap().to_str().unwrap();
                name[1..].parse().unwrap()
            })
            .collect()
    }

    const PLAN: Plan = Plan {
        first: 5,
        step: 5,
        cap: 5,
    };

    #[test]
    fn a_wrong_finding_that_does_not_repeat_on_fresh_runs_passes() {
        let judge = |_: &Value, a: &[PathBuf], _: &[PathBuf]| {
            let mut look = Look::new();
            // The first five runs hold a chance extreme; the fresh five do not.
            look.wrong_if(numbers(a).contains(&0), "row x", || "x moved".into());
            look
        };
        let ended = scripted(PLAN, &judge).unwrap();
        assert!(ended.found);
        assert_eq!(
            numbers(&ended.a),
            vec![5, 6, 7, 8, 9],
            "judged on the fresh runs"
        );
    }

    #[test]
    fn a_wrong_finding_that_repeats_on_fresh_runs_fails() {
        let judge = |_: &Value, _: &[PathBuf], _: &[PathBuf]| {
            let mut look = Look::new();
            look.wrong_if(true, "row x", || "x moved".into());
            look
        };
        let why = scripted(PLAN, &judge).unwrap_err();
        assert!(why.contains("held on 5 + 5 fresh runs: x moved"), "{why}");
    }

    #[test]
    fn another_finding_on_the_fresh_runs_is_not_the_first_one_holding() {
        let judge = |_: &Value, a: &[PathBuf], _: &[PathBuf]| {
            let mut look = Look::new();
            let first = numbers(a).contains(&0);
            look.wrong_if(first, "row x", || "x moved".into());
            look.wrong_if(!first, "row y", || "y moved".into());
            look
        };
        let ended = scripted(PLAN, &judge).unwrap();
        assert!(!ended.found, "at the cap with neither finding confirmed");
        assert_eq!(ended.a.len(), 10);
    }

    #[test]
    fn an_open_look_records_more_runs_up_to_the_cap() {
        let plan = Plan {
            first: 3,
            step: 3,
            cap: 6,
        };
        let judge = |_: &Value, a: &[PathBuf], _: &[PathBuf]| {
            let mut look = Look::new();
            look.open_unless(a.len() >= 9, || "not yet".into());
            look
        };
        let ended = scripted(plan, &judge).unwrap();
        assert!(!ended.found);
        assert_eq!(ended.a.len(), 6);
    }
}
