//! What `virtgap iotune` leaves: the storage's four figures — sequential read and write
//! bandwidth, random 4 KiB read and write IOPS — each with the concurrency search that found its
//! saturation point and the profile of the runs measured there (pure data).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::host::Fingerprint;
use crate::model::profile::Profile;

/// The version of the iotune file's layout (the profiles inside carry their own).
pub const IOTUNE_VERSION: u32 = 1;

/// One of the four measurements, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Sequential 1 MiB reads: bytes per second.
    ReadBandwidth,
    /// Sequential 1 MiB writes: bytes per second.
    WriteBandwidth,
    /// Random 4 KiB reads: I/Os per second.
    ReadIops,
    /// Random 4 KiB writes: I/Os per second.
    WriteIops,
}

impl Phase {
    pub const ALL: [Phase; 4] = [
        Phase::ReadBandwidth,
        Phase::WriteBandwidth,
        Phase::ReadIops,
        Phase::WriteIops,
    ];

    /// The key ScyllaDB's io_properties.yaml gives this figure ("read_iops").
    pub fn key(self) -> &'static str {
        match self {
            Phase::ReadBandwidth => "read_bandwidth",
            Phase::WriteBandwidth => "write_bandwidth",
            Phase::ReadIops => "read_iops",
            Phase::WriteIops => "write_iops",
        }
    }

    pub fn writes(self) -> bool {
        matches!(self, Phase::WriteBandwidth | Phase::WriteIops)
    }

    /// Bandwidth (bytes/s), not IOPS.
    pub fn is_bandwidth(self) -> bool {
        matches!(self, Phase::ReadBandwidth | Phase::WriteBandwidth)
    }
}

/// One point of the search: a concurrency and the figure a short run reached there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SearchStep {
    pub workers: u32,
    /// I/Os each worker keeps in flight.
    pub qd: u32,
    /// Bytes/s for a bandwidth phase, I/Os per second for an IOPS phase.
    pub figure: f64,
}

/// One phase: how its saturation point was found and what was measured there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct IotunePhase {
    pub phase: Phase,
    /// Request size in bytes.
    pub block_size: u64,
    /// The short runs of the search, in the order they ran.
    pub search: Vec<SearchStep>,
    /// The concurrency measured: where the search's figure peaked.
    pub workers: u32,
    pub qd: u32,
    /// The mean of the measured runs' figures (bytes/s or I/Os per second).
    pub figure: f64,
    /// Each measured run's figure, in order: the replicates a diff compares.
    pub runs: Vec<f64>,
    /// The measured runs as a profile (one run record each): the stages, the CPUs' interrupt
    /// load and the hypervisor section at saturation.
    pub profile: Profile,
}

/// The file `iotune -o` writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct IotuneProfile {
    pub iotune_version: u32,
    pub tool_version: String,
    pub command_line: Vec<String>,
    pub started_unix_ms: u64,
    pub ended_unix_ms: u64,
    /// False when a signal cut the search or a measurement short.
    pub complete: bool,
    pub host: Fingerprint,
    /// What was measured, as the user named it, and where ScyllaDB would mount it.
    pub target: String,
    pub mountpoint: String,
    /// A step that grew the figure by less than this fraction counts as no growth.
    pub tolerance: f64,
    /// The phases that ran, in order (the write phases only with consent to write).
    pub phases: Vec<IotunePhase>,
}

/// The fewest I/Os a figure may rest on: below it a figure is a handful of I/Os over a short
/// window (66 I/Os in 1 ms read as 66,000 IOPS), not the storage's.
pub const MIN_FIGURE_IOS: u64 = 100;

impl IotuneProfile {
    pub fn phase(&self, phase: Phase) -> Option<&IotunePhase> {
        self.phases.iter().find(|p| p.phase == phase)
    }

    /// Why each of the four figures cannot go into io_properties.yaml, in words: not run,
    /// zero, or measured from fewer than [`MIN_FIGURE_IOS`] I/Os. Empty: all four are fit.
    pub fn unfit_figures(&self) -> Vec<String> {
        Phase::ALL
            .iter()
            .filter_map(|&phase| {
                let Some(p) = self.phase(phase) else {
                    return Some(format!("{} did not run", phase.key()));
                };
                let r = &p.profile.results;
                let ios = r.read.ios + r.write.ios;
                if p.figure.is_nan() || p.figure <= 0.0 {
                    Some(format!("{} measured 0", phase.key()))
                } else if ios < MIN_FIGURE_IOS {
                    Some(format!(
                        "{} rests on {ios} I/Os (at least {MIN_FIGURE_IOS} make a figure)",
                        phase.key()
                    ))
                } else {
                    None
                }
            })
            .collect()
    }
}

/// What iotune tells as it goes, for the caller to word.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum IotuneProgress {
    /// The target fits: the phases begin.
    Started {
        phases: usize,
        workers: u32,
        tolerance: f64,
        runs: u32,
        measure: std::time::Duration,
    },
    /// Phase `number` (from 1) of `of` begins.
    Phase {
        number: usize,
        of: usize,
        phase: Phase,
    },
    /// One step of the search measured `figure` (bytes/s or IOPS).
    Step {
        phase: Phase,
        workers: u32,
        qd: u32,
        figure: f64,
    },
    /// The search found its peak; `runs` runs of `measure` follow there.
    Peak {
        phase: Phase,
        workers: u32,
        qd: u32,
        runs: u32,
        measure: std::time::Duration,
    },
    /// Measured run `number` (from 1) at the peak gave `figure`.
    Run {
        phase: Phase,
        number: u32,
        figure: f64,
    },
}

/// An iotune result for tests: every phase on the minimal profile, `(phase, its measured runs'
/// figures)`, at 2 workers x qd 32.
#[cfg(test)]
pub(crate) fn fixture(
    target: &str,
    mountpoint: &str,
    phases: &[(Phase, Vec<f64>)],
) -> IotuneProfile {
    let profile: Profile =
        serde_json::from_str(include_str!("../../tests/data/minimal-profile.json")).unwrap();
    IotuneProfile {
        iotune_version: IOTUNE_VERSION,
        tool_version: "0".into(),
        command_line: vec![],
        started_unix_ms: 0,
        ended_unix_ms: 0,
        complete: true,
        host: profile.host.clone(),
        target: target.into(),
        mountpoint: mountpoint.into(),
        tolerance: 0.03,
        phases: phases
            .iter()
            .map(|(phase, runs)| IotunePhase {
                phase: *phase,
                block_size: if phase.is_bandwidth() { 1 << 20 } else { 4096 },
                search: vec![],
                workers: 2,
                qd: 32,
                figure: runs.iter().sum::<f64>() / runs.len() as f64,
                runs: runs.clone(),
                profile: profile.clone(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_of_zero_or_of_a_handful_of_ios_is_unfit_for_the_yaml() {
        let all = |read_iops: f64| {
            fixture(
                "/d",
                "/d",
                &[
                    (Phase::ReadBandwidth, vec![1e9]),
                    (Phase::WriteBandwidth, vec![5e8]),
                    (Phase::ReadIops, vec![read_iops]),
                    (Phase::WriteIops, vec![9e4]),
                ],
            )
        };
        assert!(all(1e5).unfit_figures().is_empty());
        assert_eq!(all(0.0).unfit_figures(), ["read_iops measured 0"]);
        let mut few = all(66_000.0);
        few.phases[2].profile.results.read.ios = 66;
        assert_eq!(
            few.unfit_figures(),
            ["read_iops rests on 66 I/Os (at least 100 make a figure)"]
        );
        few.phases.pop();
        assert_eq!(
            few.unfit_figures().last().unwrap(),
            "write_iops did not run"
        );
    }
}
