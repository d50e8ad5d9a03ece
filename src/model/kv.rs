//! The kv workload's outcome as a profile keeps it: rates, integrity figures and ACT's verdict
//! per slice.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::histogram::Histogram;

/// The kv workload's outcome, as a profile keeps it (and `--json` prints it): numbers and
/// kinds; the sentences a report says of them are the renderers'.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct KvSection {
    /// True only for a pass at the delivered load (both definitions below); None without a
    /// complete slice.
    pub verdict: Option<bool>,
    /// Every complete slice within ACT's limits on ACT's definition: each read's device time
    /// (None without a complete slice, and in older profiles).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_pass: Option<bool>,
    /// The same on the client's definition: each read from its scheduled start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intended_pass: Option<bool>,
    /// What the run came to (the verdict and, when there is none, why).
    pub outcome: KvOutcome,
    pub delivered: KvDelivered,
    /// Who fell behind and by how much, when the run stopped for it.
    #[serde(deserialize_with = "behind_of_any_version")]
    pub behind: Option<KvBehind>,
    pub keys: u64,
    pub records_per_block: u64,
    pub read_bytes_min: u64,
    pub read_bytes_max: u64,
    pub service_threads: u32,
    pub achieved_fraction: f64,
    pub worst_lag_ns: u64,
    pub target: KvRates,
    pub achieved: KvRates,
    pub relocated: u64,
    pub read_retries: u64,
    pub mismatches: u64,
    pub slices: Vec<KvSlice>,
    /// Client reads' latencies (absent in older profiles, and with no read done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_reads: Option<KvClientLatency>,
    /// Client writes' latencies (an append to the write buffer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_writes: Option<KvClientLatency>,
    /// How the rings' device reads queued and how many they kept in flight (absent for ACT's
    /// synchronous service threads, and in older profiles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_queueing: Option<KvReadQueueing>,
}

/// The rings' device reads: the share of their time spent queued behind other reads, and the
/// limit on reads in flight per ring that kept it down.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KvReadQueueing {
    /// Of the reads' time with the device, the part beyond the device's own time (the fastest
    /// read that went out alone in the two seconds before): 0 to 1. None when no read went
    /// out alone.
    pub queued_share: Option<f64>,
    /// Whether the limit adapted (false: fixed at `ceiling` by `--qd`).
    pub adaptive: bool,
    /// The most reads a ring could keep in flight (`qd`).
    pub ceiling: u32,
    /// The limit per ring: lowest, highest, and its mean over time.
    pub limit_min: u32,
    pub limit_max: u32,
    pub limit_mean: Option<f64>,
}

/// What a kv run came to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KvOutcome {
    /// Every complete slice within ACT's limits, at the load scheduled.
    Pass,
    /// A complete slice over ACT's limits.
    Fail,
    /// Less than `virtgap_workloads::kv::DELIVERED_MIN` of the client or large-block load was done, or a
    /// stream fell too far behind: no verdict on latency.
    NotDelivered,
    /// Reads returned data other than what was written.
    Mismatches,
    /// No slice ran to its end.
    #[default]
    NoCompleteSlice,
}

/// The stream that fell too far behind its schedule, and by how much.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct KvBehind {
    /// A large-block stream ("large-block writes", "defrag reads": the device); None for the
    /// client operations (the generator).
    pub stream: Option<String>,
    pub by_ns: u64,
}

impl KvBehind {
    /// Whether the device (a large-block stream) fell behind rather than the generator.
    pub fn is_device(&self) -> bool {
        self.stream.is_some()
    }
}

/// Profiles before this one kept `behind` as a sentence: read it for its stream and lag.
fn behind_of_any_version<'de, D: serde::Deserializer<'de>>(
    de: D,
) -> Result<Option<KvBehind>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Typed(KvBehind),
        Sentence(String),
    }
    Ok(match Option::<Either>::deserialize(de)? {
        None => None,
        Some(Either::Typed(b)) => Some(b),
        Some(Either::Sentence(text)) => {
            // "can't keep up: client operations fell 1.2 s behind schedule (…)" or
            // "can't keep up: large-block writes fell 1.2 s behind (the device)".
            let what = text.trim_start_matches("can't keep up: ");
            let (stream, rest) = what.split_once(" fell ").unwrap_or((what, ""));
            let seconds: f64 = rest
                .split_whitespace()
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0.0);
            Some(KvBehind {
                stream: (stream != "client operations").then(|| stream.to_string()),
                by_ns: (seconds * 1e9) as u64,
            })
        }
    })
}

/// One kind of client operation's latencies: from submission (`lat`; for a read, `service`
/// is its device read alone) and from its scheduled start (`lat_intended`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KvClientLatency {
    pub ops: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<Histogram>,
    pub lat: Histogram,
    pub lat_intended: Histogram,
}

/// Shares of the scheduled load done (a pass needs 0.99 of both).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KvDelivered {
    pub client_fraction: f64,
    pub large_block_fraction: f64,
}

/// Operations per second of each of ACT's streams.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KvRates {
    pub client_reads_per_s: f64,
    pub client_writes_per_s: f64,
    pub lb_reads_per_s: f64,
    pub lb_writes_per_s: f64,
}

impl KvRates {
    /// (stream name, rate) in a fixed order: client reads and writes, large-block reads and
    /// writes.
    pub fn streams(&self) -> [(&'static str, f64); 4] {
        [
            ("client_reads", self.client_reads_per_s),
            ("client_writes", self.client_writes_per_s),
            ("lb_reads", self.lb_reads_per_s),
            ("lb_writes", self.lb_writes_per_s),
        ]
    }
}

/// One slice of ACT's verdict table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KvSlice {
    pub start_s: f64,
    pub end_s: f64,
    pub complete: bool,
    /// Within limits on both definitions at the load scheduled; None for a partial slice, and
    /// for one within limits at a load not delivered.
    pub pass: Option<bool>,
    /// Each definition's own outcome for a complete slice (None: partial, or an older profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_pass: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intended_pass: Option<bool>,
    /// Which latency `reads` holds: the service time in every profile since slices were judged
    /// on both definitions; older ones judged a slice whose schedule slipped on the intended
    /// latency alone, and said so here.
    #[serde(default)]
    pub judged_on: JudgedOn,
    #[serde(default)]
    pub worst_lag_ns: u64,
    pub reads: KvSliceShares,
    /// The same reads from their scheduled start (absent in older profiles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reads_intended: Option<KvSliceShares>,
    pub lb_reads: KvSliceShares,
    pub lb_writes: KvSliceShares,
}

/// What a slice's reads were judged on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum JudgedOn {
    /// From submission to completion: the device read.
    #[default]
    Service,
    /// From the scheduled start (older profiles: a slice where operations started late).
    Intended,
}

/// Operations in a slice and the percentages at or over ACT's limits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KvSliceShares {
    pub ops: u64,
    pub pct_at_or_over_1ms: f64,
    pub pct_at_or_over_8ms: f64,
    pub pct_at_or_over_64ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_fell_behind_reads_from_this_version_and_from_the_sentence_older_ones_kept() {
        let read = |json: &str| -> Option<KvBehind> {
            serde_json::from_str::<KvSection>(&format!(r#"{{"behind": {json}}}"#))
                .unwrap()
                .behind
        };
        let device = KvBehind {
            stream: Some("large-block writes".into()),
            by_ns: 1_200_000_000,
        };
        assert_eq!(
            read(r#"{"stream": "large-block writes", "by_ns": 1200000000}"#),
            Some(device.clone())
        );
        assert_eq!(
            read(r#""can't keep up: large-block writes fell 1.2 s behind (the device)""#),
            Some(device)
        );
        assert_eq!(
            read(
                r#""can't keep up: client operations fell 3.0 s behind schedule (the generator: …)""#
            ),
            Some(KvBehind {
                stream: None,
                by_ns: 3_000_000_000
            })
        );
        assert_eq!(read("null"), None);
    }

    #[test]
    fn outcomes_are_written_as_the_words_older_profiles_hold() {
        for (outcome, word) in [
            (KvOutcome::Pass, "pass"),
            (KvOutcome::NotDelivered, "not_delivered"),
            (KvOutcome::NoCompleteSlice, "no_complete_slice"),
        ] {
            assert_eq!(serde_json::to_value(outcome).unwrap(), word);
        }
        assert_eq!(
            serde_json::to_value(JudgedOn::Intended).unwrap(),
            "intended"
        );
    }
}
