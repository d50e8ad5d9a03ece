//! Aerospike ACT's load model and verdict, as its code computes them (act_storage 6.6,
//! `cfg_storage.c: derive_configuration`, `histogram.c`), for the `kv` workload: the large-block
//! rates a client load implies, the per-slice pass/fail thresholds, and ACT's text histogram
//! format so `act_latency.py` can read our logs.

use std::fmt::Write as _;

/// Client reads and writes per second per device at 1x.
pub const READS_PER_X: u64 = 2000;
pub const WRITES_PER_X: u64 = 1000;

/// A client load, as ACT's configuration keys describe it.
#[derive(Clone, Debug, PartialEq)]
pub struct ActLoad {
    /// Total client reads per second over all devices (`read-reqs-per-sec`).
    pub read_rps: u64,
    /// Total client writes per second (`write-reqs-per-sec`).
    pub write_rps: u64,
    pub record_bytes: u64,
    /// Upper end of a uniform record-size range (`record-bytes-range-max`), if any.
    pub record_bytes_max: Option<u64>,
    /// Large-block size in bytes (`large-block-op-kbytes` × 1024).
    pub lb_bytes: u64,
    pub defrag_lwm_pct: u64,
    pub replication_factor: u64,
    pub update_pct: u64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ActError {
    #[error("record size {record} B is larger than the large block ({lb} B); use a smaller --record-bytes or a larger --lb-bytes")]
    RecordTooLarge { record: u64, lb: u64 },
    #[error("no load: pass --x N (N >= 1) or --read-rps / --write-rps")]
    NoLoad,
    #[error("--defrag-lwm-pct {0} is outside 1..=99")]
    Lwm(u64),
    #[error("--lb-bytes {0} must be a power of two between 4 KiB and 8 MiB")]
    LargeBlock(u64),
}

impl ActLoad {
    /// ACT's x-rating on `devices` devices, with ACT's default record and block sizes.
    pub fn x_rating(x: u64, devices: u64) -> Self {
        Self {
            read_rps: x * devices * READS_PER_X,
            write_rps: x * devices * WRITES_PER_X,
            record_bytes: 1536,
            record_bytes_max: None,
            lb_bytes: 128 * 1024,
            defrag_lwm_pct: 50,
            replication_factor: 1,
            update_pct: 0,
        }
    }

    pub fn validate(&self) -> Result<(), ActError> {
        if self.read_rps == 0 && self.write_rps == 0 {
            return Err(ActError::NoLoad);
        }
        if !(1..=99).contains(&self.defrag_lwm_pct) {
            return Err(ActError::Lwm(self.defrag_lwm_pct));
        }
        if !self.lb_bytes.is_power_of_two() || !(4096..=8 << 20).contains(&self.lb_bytes) {
            return Err(ActError::LargeBlock(self.lb_bytes));
        }
        let biggest = self
            .record_bytes_max
            .unwrap_or(self.record_bytes)
            .max(self.record_bytes);
        if roundup16(biggest) > self.lb_bytes {
            return Err(ActError::RecordTooLarge {
                record: biggest,
                lb: self.lb_bytes,
            });
        }
        Ok(())
    }
}

/// Records are stored in 16-byte units ("RBLOCK").
pub fn roundup16(n: u64) -> u64 {
    n.div_ceil(16).saturating_mul(16)
}

/// What ACT derives from a load.
#[derive(Clone, Debug, PartialEq)]
pub struct Derived {
    pub record_stored: u64,
    pub record_stored_max: u64,
    pub avg_record_stored: u64,
    /// Records per large block: an integer division, as in ACT's code.
    pub records_per_lb: u64,
    pub internal_read_rps: f64,
    pub internal_write_rps: u64,
    pub lb_reads_per_s: f64,
    pub lb_writes_per_s: f64,
}

/// ACT's derived rates. Note the integer division `lb_bytes / avg_record_stored` in the
/// denominator: the code, not the README's arithmetic (which divides exactly).
pub fn derive(load: &ActLoad) -> Derived {
    let record_stored = roundup16(load.record_bytes);
    let record_stored_max = load.record_bytes_max.map_or(record_stored, roundup16);
    let avg_record_stored = (record_stored + record_stored_max) / 2;
    let records_per_lb = load.lb_bytes / avg_record_stored;
    let internal_write_rps = load.replication_factor * load.write_rps;
    let orig_lb_writes = internal_write_rps as f64 / records_per_lb as f64;
    let amp = 100.0 / (100 - load.defrag_lwm_pct) as f64;
    Derived {
        record_stored,
        record_stored_max,
        avg_record_stored,
        records_per_lb,
        internal_read_rps: load.read_rps as f64
            + load.write_rps as f64 * load.update_pct as f64 / 100.0,
        internal_write_rps,
        lb_reads_per_s: orig_lb_writes * amp,
        lb_writes_per_s: orig_lb_writes * amp,
    }
}

/// ACT's histogram: 65 buckets of power-of-two milliseconds (bucket 0 = [0, 1 ms), bucket i =
/// [2^(i-1), 2^i) ms), values truncated to whole milliseconds first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActHistogram {
    pub buckets: [u64; 65],
}

impl Default for ActHistogram {
    fn default() -> Self {
        Self { buckets: [0; 65] }
    }
}

/// ACT's bucket for a latency: whole milliseconds (truncated), then the position of the
/// highest set bit.
fn bucket_of(ns: u64) -> usize {
    let ms = ns / 1_000_000;
    (64 - ms.leading_zeros() as usize).min(64)
}

impl ActHistogram {
    pub fn record_ns(&mut self, ns: u64) {
        self.buckets[bucket_of(ns)] += 1;
    }

    pub fn total(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Counts since `earlier` (ACT's histograms are cumulative).
    pub fn since(&self, earlier: &Self) -> Self {
        let mut out = Self::default();
        for (i, b) in out.buckets.iter_mut().enumerate() {
            *b = self.buckets[i].saturating_sub(earlier.buckets[i]);
        }
        out
    }

    /// Percent of operations at or above 2^`i` ms (act_latency.py's column "2^i").
    pub fn pct_at_or_over(&self, i: usize) -> f64 {
        let total = self.total();
        if total == 0 {
            return 0.0;
        }
        let below: u64 = self.buckets[..=i.min(64)].iter().sum();
        100.0 * (total - below) as f64 / total as f64
    }

    /// ACT's dump: `name (N total)`, then the non-empty buckets from the first to the last as
    /// ` (ii: cccccccccc)`, four per line.
    pub fn dump(&self, name: &str) -> String {
        let mut s = format!("{name} ({} total)\n", self.total());
        let filled: Vec<(usize, u64)> = self
            .buckets
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, c)| *c > 0)
            .collect();
        for line in filled.chunks(4) {
            for (i, c) in line {
                let _ = write!(s, " ({i:02}: {c:010})");
            }
            s.push('\n');
        }
        s
    }
}

/// An ActHistogram many threads record into at once (ACT's own are atomic adds too).
#[derive(Debug)]
pub struct AtomicActHistogram {
    buckets: [std::sync::atomic::AtomicU64; 65],
}

impl Default for AtomicActHistogram {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| std::sync::atomic::AtomicU64::new(0)),
        }
    }
}

impl AtomicActHistogram {
    pub fn record_ns(&self, ns: u64) {
        self.buckets[bucket_of(ns)].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> ActHistogram {
        let mut h = ActHistogram::default();
        for (out, b) in h.buckets.iter_mut().zip(&self.buckets) {
            *out = b.load(std::sync::atomic::Ordering::Relaxed);
        }
        h
    }
}

/// ACT's pass criteria for one slice: under 5% of reads at or over 1 ms, under 1% at or over
/// 8 ms, under 0.1% at or over 64 ms.
#[derive(Clone, Debug, PartialEq)]
pub struct SliceVerdict {
    pub reads: u64,
    pub over_1ms_pct: f64,
    pub over_8ms_pct: f64,
    pub over_64ms_pct: f64,
    pub pass: bool,
}

pub fn slice_verdict(reads: &ActHistogram) -> SliceVerdict {
    // Column "1" of act_latency.py is everything from bucket 1 ([1, 2) ms) up.
    let over_1ms_pct = reads.pct_at_or_over(0);
    let over_8ms_pct = reads.pct_at_or_over(3);
    let over_64ms_pct = reads.pct_at_or_over(6);
    SliceVerdict {
        reads: reads.total(),
        over_1ms_pct,
        over_8ms_pct,
        over_64ms_pct,
        pass: over_1ms_pct < 5.0 && over_8ms_pct < 1.0 && over_64ms_pct < 0.1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 0.005
    }

    #[test]
    fn x_ratings_match_acts_worked_figures() {
        // 1536-byte records in 128 KiB blocks: 85 records per block, defrag doubles the rate.
        for (x, lb) in [(1, 23.53), (30, 705.88), (60, 1411.76)] {
            let d = derive(&ActLoad::x_rating(x, 1));
            assert_eq!(d.records_per_lb, 85);
            assert!(close(d.lb_reads_per_s, lb), "{x}x: {}", d.lb_reads_per_s);
            assert!(close(d.lb_writes_per_s, lb), "{x}x: {}", d.lb_writes_per_s);
            assert!(close(d.internal_read_rps, x as f64 * 2000.0));
        }
    }

    #[test]
    fn follows_the_code_not_the_readme_on_integer_division() {
        // README: 1504 × 1000 / 131072 = 11.4746 LB writes/s before defrag amplification;
        // code: 1000 / floor(131072 / 1504) = 1000 / 87 = 11.494.
        let load = ActLoad {
            record_bytes: 1500,
            defrag_lwm_pct: 50,
            ..ActLoad::x_rating(1, 1)
        };
        let d = derive(&load);
        assert_eq!(d.record_stored, 1504);
        assert_eq!(d.records_per_lb, 87);
        assert!(
            close(d.lb_writes_per_s / 2.0, 11.494),
            "{}",
            d.lb_writes_per_s / 2.0
        );
        assert!(!close(d.lb_writes_per_s / 2.0, 11.4746));
    }

    #[test]
    fn bad_loads_are_refused() {
        let mut l = ActLoad::x_rating(1, 1);
        l.record_bytes = 200_000;
        assert!(matches!(l.validate(), Err(ActError::RecordTooLarge { .. })));
        assert_eq!(ActLoad::x_rating(0, 1).validate(), Err(ActError::NoLoad));
        let mut l = ActLoad::x_rating(1, 1);
        l.defrag_lwm_pct = 100;
        assert_eq!(l.validate(), Err(ActError::Lwm(100)));
        assert_eq!(ActLoad::x_rating(1, 1).validate(), Ok(()));
    }

    #[test]
    fn slices_pass_and_fail_on_acts_thresholds() {
        let mut h = ActHistogram::default();
        for _ in 0..9_600 {
            h.record_ns(300_000); // 0.3 ms
        }
        for _ in 0..390 {
            h.record_ns(2_500_000); // 2.5 ms
        }
        for _ in 0..10 {
            h.record_ns(20_000_000); // 20 ms
        }
        let v = slice_verdict(&h);
        assert!(
            close(v.over_1ms_pct, 4.0) && close(v.over_8ms_pct, 0.1) && v.over_64ms_pct == 0.0,
            "{v:?}"
        );
        assert!(v.pass);
        for _ in 0..20 {
            h.record_ns(100_000_000); // 100 ms
        }
        assert!(!slice_verdict(&h).pass, "0.2% at or over 64 ms fails");
    }

    #[test]
    fn dumps_in_acts_format() {
        let mut h = ActHistogram::default();
        for (ns, n) in [
            (100_000, 1990),
            (1_500_000, 9),
            (3_000_000, 2),
            (40_000_000, 1),
        ] {
            for _ in 0..n {
                h.record_ns(ns);
            }
        }
        assert_eq!(
            h.dump("reads"),
            "reads (2002 total)\n (00: 0000001990) (01: 0000000009) (02: 0000000002) (06: 0000000001)\n"
        );
        let mut more = h.clone();
        more.record_ns(300_000_000);
        assert!(
            more.dump("reads")
                .ends_with("(06: 0000000001)\n (09: 0000000001)\n"),
            "{}",
            more.dump("reads")
        );
    }
}
