//! The `[kv]` table of a workload file: ACT's load model (x-rating or explicit rates, a
//! read:write ratio), the record and defrag parameters, and the verdict's slice and lag limit.

use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::act::{ActError, ActLoad, READS_PER_X, WRITES_PER_X};
use crate::kv::store::KvStore;
use crate::values::{de_from_str, ser_display, ByteSize, Distribution, Span};
// Where the app imports the ratio from, beside the kv flags it belongs to.
pub use crate::values::Ratio;

/// The kv workload's own settings. The large-block size is the spec's `bs`, the service
/// threads its `workers`, the key distribution its `distribution`, the store size its `size`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvSpec {
    /// ACT x-rating: x × 2000 client reads/s (and writes by `ratio`; 2:1 gives x × 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x: Option<u64>,
    /// Client reads per second; overrides the x-rating's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_rps: Option<u64>,
    /// Client writes per second; overrides the x-rating's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_rps: Option<u64>,
    #[serde(
        default = "act_ratio",
        serialize_with = "ser_display",
        deserialize_with = "de_from_str"
    )]
    pub ratio: Ratio,
    /// Bytes per record, its 32-byte header included.
    #[serde(default = "act_record")]
    pub record_bytes: ByteSize,
    /// With this, record sizes are uniform from `record_bytes` to here (ACT's
    /// `record-bytes-range-max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_bytes_max: Option<ByteSize>,
    /// Blocks whose live data falls below this percentage are defragmented.
    #[serde(default = "fifty")]
    pub defrag_lwm_pct: u64,
    /// Percent of the store's record capacity loaded with keys before measuring.
    #[serde(default = "fifty")]
    pub fill_pct: u64,
    /// Length of one verdict slice [default: 1 h, or the whole run when shorter].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice: Option<Span>,
    /// Stop with "can't keep up" when a stream falls this far behind.
    #[serde(default = "ten_seconds")]
    pub max_lag: Span,
    /// Large-block writes with O_DSYNC (ACT's default).
    #[serde(default = "yes")]
    pub dsync: bool,
    /// A ring keeps fewer than `qd` reads in flight while they queue at the device (see
    /// `kv::inflight`; `--adaptive-qd`); false: up to `qd` always.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adaptive_qd: bool,
}

fn act_ratio() -> Ratio {
    Ratio {
        reads: 2,
        writes: 1,
    }
}

fn act_record() -> ByteSize {
    ByteSize(1536)
}

fn fifty() -> u64 {
    50
}

fn ten_seconds() -> Span {
    Span(Duration::from_secs(10))
}

fn yes() -> bool {
    true
}

/// ACT's slice: one hour.
pub const DEFAULT_SLICE: Duration = Duration::from_secs(3600);

/// (key, value, reason) of the first invalid setting.
pub type Invalid = (&'static str, String, String);

impl KvSpec {
    /// Client reads and writes per second.
    pub fn rates(&self) -> (u64, u64) {
        let x = self.x.unwrap_or(0);
        // Saturating: validate() bounds the load, but a spec is described before it is checked.
        let (mut reads, mut writes) = if self.ratio.reads == 0 {
            (0, x.saturating_mul(WRITES_PER_X))
        } else {
            let reads = x.saturating_mul(READS_PER_X);
            let writes =
                u128::from(reads) * u128::from(self.ratio.writes) / u128::from(self.ratio.reads);
            (reads, u64::try_from(writes).unwrap_or(u64::MAX))
        };
        if let Some(r) = self.read_rps {
            reads = r;
        }
        if let Some(w) = self.write_rps {
            writes = w;
        }
        (reads, writes)
    }

    /// The load in ACT's terms, on one device with large blocks of `lb_bytes`.
    pub fn act_load(&self, lb_bytes: u64) -> ActLoad {
        let (read_rps, write_rps) = self.rates();
        ActLoad {
            read_rps,
            write_rps,
            record_bytes: self.record_bytes.0,
            record_bytes_max: self.record_bytes_max.map(|m| m.0),
            lb_bytes,
            defrag_lwm_pct: self.defrag_lwm_pct,
            ..ActLoad::x_rating(0, 1)
        }
    }

    /// The verdict's slice for a run of `duration`.
    pub fn slice_for(&self, duration: Duration) -> Duration {
        self.slice.map_or(DEFAULT_SLICE.min(duration), |s| s.0)
    }

    pub fn validate(&self, lb_bytes: u64) -> Result<(), Invalid> {
        // Far past any device (x 100000 is 200M reads/s): beyond it the arithmetic of a load
        // means nothing.
        const MAX_X: u64 = 100_000;
        const MAX_RATE: u64 = 1_000_000_000;
        if let Some(x) = self.x.filter(|&x| x > MAX_X) {
            return Err((
                "x",
                x.to_string(),
                format!("the load is beyond any device: x must be at most {MAX_X}"),
            ));
        }
        // The key at fault is the one that set the rate: an explicit rate, else the x-rating
        // (through the ratio, for writes).
        let (reads, writes) = self.rates();
        for (rate, explicit, key, what) in [
            (reads, self.read_rps, "read_rps", "reads"),
            (writes, self.write_rps, "write_rps", "writes"),
        ] {
            if rate <= MAX_RATE {
                continue;
            }
            return Err(match explicit {
                Some(r) => (
                    key,
                    r.to_string(),
                    format!("the load is beyond any device: give at most {MAX_RATE} client {what}/s"),
                ),
                None => (
                    "x",
                    self.x.unwrap_or(0).to_string(),
                    format!(
                        "the load is beyond any device: at ratio {} this x-rating asks for {rate} client {what}/s, over {MAX_RATE}",
                        self.ratio
                    ),
                ),
            });
        }
        // ACT's own rules (a load, the low-water mark, the block and record sizes), named by
        // the key at fault.
        if let Err(e) = self.act_load(lb_bytes).validate() {
            return Err(match e {
                ActError::NoLoad => ("x", self.x.unwrap_or(0).to_string(), e.to_string()),
                ActError::Lwm(v) => (
                    "defrag_lwm_pct",
                    v.to_string(),
                    "must be 1..=99 (percent of a block still live)".into(),
                ),
                ActError::LargeBlock(v) => (
                    "bs",
                    ByteSize(v).to_string(),
                    "the kv large block must be a power of two from 4 KiB to 8 MiB".into(),
                ),
                ActError::RecordTooLarge { record, lb } => (
                    "record_bytes",
                    ByteSize(record).to_string(),
                    format!(
                        "a record ({} B stored, header included) must fit one large block ({}); use a smaller --record-bytes or a larger --lb-bytes",
                        KvStore::stored_bytes(record),
                        ByteSize(lb)
                    ),
                ),
            });
        }
        if !(1..=90).contains(&self.fill_pct) {
            return Err((
                "fill_pct",
                self.fill_pct.to_string(),
                "must be 1..=90 (percent of the store's capacity)".into(),
            ));
        }
        if self
            .record_bytes_max
            .is_some_and(|m| m.0 < self.record_bytes.0)
        {
            return Err((
                "record_bytes_max",
                self.record_bytes_max
                    .unwrap_or(self.record_bytes)
                    .to_string(),
                format!(
                    "the range's upper end is below record_bytes ({})",
                    self.record_bytes
                ),
            ));
        }
        if self.record_bytes.0 == 0 {
            return Err((
                "record_bytes",
                "0".into(),
                "a record needs at least one byte".into(),
            ));
        }
        if self.slice.is_some_and(|s| s.0 < Duration::from_secs(1)) {
            return Err((
                "slice",
                "below 1s".into(),
                "a verdict slice must be at least 1 s".into(),
            ));
        }
        Ok(())
    }

    pub fn describe(&self, lb_bytes: u64) -> String {
        let (reads, writes) = self.rates();
        let rating = match (self.x, self.read_rps, self.write_rps) {
            (Some(x), None, None) => format!(" ({x}x, {})", self.ratio),
            _ => String::new(),
        };
        let records = match self.record_bytes_max {
            Some(max) => format!("{}-{}", self.record_bytes.0, max.0),
            None => self.record_bytes.0.to_string(),
        };
        format!(
            "{records} B records in {} blocks, {reads} reads/s + {writes} writes/s{rating}, defrag below {}%, {}% full{}",
            crate::units::bytes(lb_bytes),
            self.defrag_lwm_pct,
            self.fill_pct,
            if self.dsync { ", O_DSYNC" } else { "" }
        )
    }
}

/// `--record-bytes`: one size ("1536") or a uniform range ("1KiB-2KiB").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordBytes {
    pub min: ByteSize,
    pub max: Option<ByteSize>,
}

impl FromStr for RecordBytes {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('-') {
            Some((a, b)) => Ok(Self {
                min: a.parse()?,
                max: Some(b.parse()?),
            }),
            None => Ok(Self {
                min: s.parse()?,
                max: None,
            }),
        }
    }
}

/// Command-line settings of the `[kv]` table; `None` keeps the file's value.
#[derive(Clone, Debug, Default)]
pub struct KvOverrides {
    pub x: Option<u64>,
    pub read_rps: Option<u64>,
    pub write_rps: Option<u64>,
    pub ratio: Option<Ratio>,
    pub record_bytes: Option<RecordBytes>,
    /// The spec's `bs`.
    pub lb_bytes: Option<ByteSize>,
    /// The spec's `distribution`.
    pub keys: Option<Distribution>,
    pub defrag_lwm_pct: Option<u64>,
    pub fill_pct: Option<u64>,
    pub slice: Option<Span>,
    pub max_lag: Option<Span>,
    pub no_dsync: bool,
    pub adaptive_qd: bool,
}

impl KvOverrides {
    /// The first flag given, for "only applies to kv" errors.
    pub fn first_given(&self) -> Option<&'static str> {
        [
            (self.x.is_some(), "--x"),
            (self.read_rps.is_some(), "--read-rps"),
            (self.write_rps.is_some(), "--write-rps"),
            (self.ratio.is_some(), "--ratio"),
            (self.record_bytes.is_some(), "--record-bytes"),
            (self.lb_bytes.is_some(), "--lb-bytes"),
            (self.keys.is_some(), "--keys"),
            (self.defrag_lwm_pct.is_some(), "--defrag-lwm-pct"),
            (self.fill_pct.is_some(), "--fill-pct"),
            (self.slice.is_some(), "--slice"),
            (self.max_lag.is_some(), "--max-lag"),
            (self.no_dsync, "--no-dsync"),
            (self.adaptive_qd, "--adaptive-qd"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }

    pub fn apply(&self, kv: &mut KvSpec) {
        if self.x.is_some() {
            // An x-rating on the command line replaces the file's load entirely.
            kv.read_rps = None;
            kv.write_rps = None;
            kv.x = self.x;
        }
        if let Some(r) = self.read_rps {
            kv.read_rps = Some(r);
        }
        if let Some(w) = self.write_rps {
            kv.write_rps = Some(w);
        }
        if let Some(r) = self.ratio {
            kv.ratio = r;
        }
        if let Some(b) = self.record_bytes {
            kv.record_bytes = b.min;
            kv.record_bytes_max = b.max;
        }
        if let Some(p) = self.defrag_lwm_pct {
            kv.defrag_lwm_pct = p;
        }
        if let Some(p) = self.fill_pct {
            kv.fill_pct = p;
        }
        if let Some(s) = self.slice {
            kv.slice = Some(s);
        }
        if let Some(l) = self.max_lag {
            kv.max_lag = l;
        }
        if self.no_dsync {
            kv.dsync = false;
        }
        if self.adaptive_qd {
            kv.adaptive_qd = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(text: &str) -> KvSpec {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn x_rating_and_ratio_set_the_rates() {
        assert_eq!(kv("x = 1").rates(), (2000, 1000));
        assert_eq!(kv("x = 3\nratio = \"1:1\"").rates(), (6000, 6000));
        assert_eq!(kv("x = 1\nratio = \"19:1\"").rates(), (2000, 105));
        assert_eq!(kv("x = 2\nratio = \"1:0\"").rates(), (4000, 0));
        assert_eq!(kv("x = 1\nread_rps = 500").rates(), (500, 1000));
    }

    #[test]
    fn a_record_range_averages_like_acts() {
        let d = crate::act::derive(
            &kv("x = 1\nrecord_bytes = 1024\nrecord_bytes_max = 2048").act_load(128 << 10),
        );
        assert_eq!((d.record_stored, d.record_stored_max), (1024, 2048));
        assert_eq!(d.records_per_lb, 85, "131072 / ((1024 + 2048) / 2)");
        let e = kv("x = 1\nrecord_bytes = 2048\nrecord_bytes_max = 1024")
            .validate(128 << 10)
            .unwrap_err();
        assert_eq!(e.0, "record_bytes_max");
        let r: RecordBytes = "1KiB-2KiB".parse().unwrap();
        assert_eq!((r.min, r.max), (ByteSize(1024), Some(ByteSize(2048))));
    }

    #[test]
    fn bad_settings_name_their_key() {
        assert_eq!(kv("x = 0").validate(128 << 10).unwrap_err().0, "x");
        assert_eq!(
            kv("x = 1\ndefrag_lwm_pct = 100")
                .validate(128 << 10)
                .unwrap_err()
                .0,
            "defrag_lwm_pct"
        );
        let e = kv("x = 1\nrecord_bytes = \"200KiB\"")
            .validate(128 << 10)
            .unwrap_err();
        assert_eq!(e.0, "record_bytes");
        assert!(e.2.contains("must fit one large block"), "{}", e.2);
        assert!(kv("x = 1").validate(128 << 10).is_ok());
        assert!("3".parse::<Ratio>().is_err());
        assert!("0:0".parse::<Ratio>().is_err());
    }

    #[test]
    fn a_load_beyond_any_device_names_the_key_that_set_it() {
        let e = kv("x = 1\nread_rps = 1000000001")
            .validate(128 << 10)
            .unwrap_err();
        assert_eq!((e.0, e.1.as_str()), ("read_rps", "1000000001"));
        let e = kv("write_rps = 9223372036854775807\nread_rps = 1")
            .validate(128 << 10)
            .unwrap_err();
        assert_eq!(e.0, "write_rps");
        // The x-rating through the ratio: x is the key to change.
        let e = kv("x = 1000\nratio = \"1:1000\"")
            .validate(128 << 10)
            .unwrap_err();
        assert_eq!((e.0, e.1.as_str()), ("x", "1000"));
        assert!(e.2.contains("2000000000 client writes/s"), "{}", e.2);
        assert_eq!(kv("x = 100001").validate(128 << 10).unwrap_err().0, "x");
    }

    #[test]
    fn short_runs_are_one_slice() {
        assert_eq!(
            kv("x = 1").slice_for(Duration::from_secs(60)),
            Duration::from_secs(60)
        );
        assert_eq!(
            kv("x = 1").slice_for(Duration::from_secs(86400)),
            DEFAULT_SLICE
        );
    }
}
