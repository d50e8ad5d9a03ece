//! ACT's text log, as act_latency.py reads it: the preamble (configuration and derived rates)
//! and a dump of the cumulative histograms every report interval.

use std::fmt::Write as _;

use crate::act::{ActHistogram, Derived};
use crate::spec::WorkloadSpec;

/// ACT's cumulative histograms at one moment: the log dumps them, and a slice is judged on the
/// difference of two.
#[derive(Clone, Debug, Default)]
pub(super) struct HistogramSnapshot {
    pub reads: ActHistogram,
    pub reads_intended: ActHistogram,
    pub lb_reads: ActHistogram,
    pub lb_writes: ActHistogram,
}

impl HistogramSnapshot {
    /// ACT's histogram block: all-device reads, the one device's reads, then large blocks.
    fn dump(&self, device: &str) -> String {
        let mut s = self.reads.dump("reads");
        s.push_str(&self.reads.dump(&format!("{device}-reads")));
        s.push_str(&self.lb_reads.dump("large-block-reads"));
        s.push_str(&self.lb_writes.dump("large-block-writes"));
        s
    }
}

/// ACT's log preamble: its configuration and derived rates, in its key: value form.
pub(super) fn act_log_header(
    spec: &WorkloadSpec,
    device: &str,
    read_rps: u64,
    write_rps: u64,
    d: &Derived,
    report_s: u64,
) -> String {
    let kv = spec.kv.as_ref().expect("a kv spec");
    let mut s = String::from("ACT version 6.6\n");
    let _ = writeln!(s, "(written by virtgap {})\n", env!("CARGO_PKG_VERSION"));
    s.push_str("ACT-STORAGE CONFIGURATION\n");
    let lines = [
        ("device-names", device.to_string()),
        ("num-devices", "1".into()),
        ("service-threads", spec.workers.to_string()),
        ("test-duration-sec", spec.duration.0.as_secs().to_string()),
        ("report-interval-sec", report_s.to_string()),
        ("microsecond-histograms", "no".into()),
        ("read-reqs-per-sec", read_rps.to_string()),
        ("write-reqs-per-sec", write_rps.to_string()),
        ("record-bytes", kv.record_bytes.0.to_string()),
        (
            "record-bytes-range-max",
            kv.record_bytes_max.map_or(0, |m| m.0).to_string(),
        ),
        ("large-block-op-kbytes", (spec.bs.0 / 1024).to_string()),
        ("replication-factor", "1".into()),
        ("update-pct", "0".into()),
        ("defrag-lwm-pct", kv.defrag_lwm_pct.to_string()),
        ("disable-odsync", if kv.dsync { "no" } else { "yes" }.into()),
        ("max-lag-sec", kv.max_lag.0.as_secs().to_string()),
    ];
    for (k, v) in lines {
        let _ = writeln!(s, "{k}: {v}");
    }
    s.push_str("\nDERIVED CONFIGURATION\n");
    let _ = writeln!(
        s,
        "record-stored-bytes: {} ... {}",
        d.record_stored, d.record_stored_max
    );
    let _ = writeln!(s, "internal-read-reqs-per-sec: {}", d.internal_read_rps);
    let _ = writeln!(s, "internal-write-reqs-per-sec: {}", d.internal_write_rps);
    let _ = writeln!(s, "large-block-reads-per-sec: {:.2}", d.lb_reads_per_s);
    let _ = writeln!(s, "large-block-writes-per-sec: {:.2}", d.lb_writes_per_s);
    s.push_str("\nHISTOGRAM NAMES\nreads\n");
    let _ = writeln!(s, "{device}-reads");
    s.push_str("large-block-reads\nlarge-block-writes\n\n");
    s
}

/// One entry of the log: the histograms `seconds` into the measured run.
pub(super) fn write_dump(log: &mut String, seconds: u64, now: &HistogramSnapshot, device: &str) {
    let _ = write!(log, "after {seconds} sec:\n{}", now.dump(device));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn act_log_matches_its_snapshot() {
        let mut spec = crate::spec::load("kv-act").unwrap().spec;
        spec.workers = 10;
        let kv = spec.kv.clone().unwrap();
        let (r, w) = kv.rates();
        let d = crate::act::derive(&kv.act_load(spec.bs.0));
        let mut log = act_log_header(&spec, "/dev/vdb", r, w, &d, 1);
        let mut snap = HistogramSnapshot::default();
        for (ns, n) in [(200_000, 1990), (1_200_000, 9), (5_000_000, 2)] {
            for _ in 0..n {
                snap.reads.record_ns(ns);
            }
        }
        for _ in 0..23 {
            snap.lb_reads.record_ns(900_000);
            snap.lb_writes.record_ns(2_500_000);
        }
        write_dump(&mut log, 1, &snap, "/dev/vdb");
        insta::assert_snapshot!("act_log", log);
    }
}
