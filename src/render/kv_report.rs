//! The kv workload's part of a report: ACT's derived and achieved rates, the store's integrity
//! figures, and the per-slice verdict table (text and JSON).

use std::io::{self, Write};

use crate::model::profile::{
    Histogram, KvClientLatency, KvDelivered, KvRates, KvSection, KvSlice, KvSliceShares,
};
use virtgap_workloads::act::SliceVerdict;
use virtgap_workloads::kv::{Behind, KvOutcome, KvVerdict, DELIVERED_MIN, SLIPPED_LAG};
use virtgap_workloads::units;

pub fn behind_text(who: &Behind, by: std::time::Duration) -> String {
    match who {
        Behind::Generator => format!(
            "can't keep up: client operations fell {:.1} s behind schedule (the generator: try more client threads with --workers, or more reads in flight per ring with --qd)",
            by.as_secs_f64()
        ),
        Behind::Device(stream) => format!(
            "can't keep up: {stream} fell {:.1} s behind (the device)",
            by.as_secs_f64()
        ),
    }
}

/// The one-line verdict.
pub fn verdict_text(k: &KvOutcome) -> String {
    let load = format!("{} reads/s + {} writes/s", k.read_rps, k.write_rps);
    match k.verdict() {
        KvVerdict::Pass => format!("PASS at {load} on this target"),
        KvVerdict::Fail => format!("FAIL at {load} on this target"),
        KvVerdict::NotDelivered {
            client,
            large_blocks,
            behind,
        } => {
            let who = match behind {
                Some(Behind::Generator) => "the generator was behind",
                Some(Behind::Device(_)) => "the device was behind",
                None if large_blocks < DELIVERED_MIN => {
                    "the device was behind on large blocks"
                }
                None => "client operations fell behind their schedule: the generator, or reads waiting on the device",
            };
            format!(
                "NO VERDICT: did not deliver the load of {load} ({:.1}% of client operations, {:.1}% of large-block operations done; {who}); a pass needs {:.0}% of both",
                client * 100.0,
                large_blocks * 100.0,
                DELIVERED_MIN * 100.0
            )
        }
        KvVerdict::Mismatches(n) => {
            format!("FAIL: {n} reads returned data other than what was written")
        }
        KvVerdict::NoCompleteSlice => {
            "no verdict: no complete slice (set --slice no longer than the run)".into()
        }
    }
}

/// A slice's result: a slice of a run that did not deliver its load never reads PASS.
pub fn slice_word(k: &KvOutcome, s: &virtgap_workloads::kv::SliceResult) -> &'static str {
    let delivered = !matches!(k.verdict(), KvVerdict::NotDelivered { .. });
    match (s.complete, s.reads.pass) {
        (false, _) => "(partial, not judged)",
        (true, true) if delivered => "PASS",
        (true, true) => "within limits at the lighter load done",
        (true, false) => "FAIL",
    }
}

/// The verdict as a word, for JSON and CSV.
fn outcome_word(v: &KvVerdict) -> &'static str {
    match v {
        KvVerdict::Pass => "pass",
        KvVerdict::Fail => "fail",
        KvVerdict::NotDelivered { .. } => "not_delivered",
        KvVerdict::Mismatches(_) => "mismatches",
        KvVerdict::NoCompleteSlice => "no_complete_slice",
    }
}

/// A slice's word in the table, from the profile: a slice of a run that did not deliver its
/// load never reads PASS (`slice_word` decided it when the profile was made).
fn slice_result(s: &KvSlice) -> &'static str {
    match (s.complete, s.pass) {
        (false, _) => "(partial, not judged)",
        (true, Some(true)) => "PASS",
        (true, Some(false)) => "FAIL",
        (true, None) => "within limits at the lighter load done",
    }
}

fn shares_text(v: &KvSliceShares) -> String {
    if v.ops == 0 {
        return format!("{:>23}", "-");
    }
    format!(
        "{:>6.2}% {:>6.2}% {:>6.2}%",
        v.pct_at_or_over_1ms, v.pct_at_or_over_8ms, v.pct_at_or_over_64ms
    )
}

/// The kv part of the summary, from the profile's kv section.
pub fn write(out: &mut impl Write, k: &KvSection) -> io::Result<()> {
    writeln!(
        out,
        "  kv store: {} keys, {} records per large block, client reads of {} (every read checked against the index)",
        units::count(k.keys as f64),
        k.records_per_block,
        match (k.read_bytes_min, k.read_bytes_max) {
            (a, b) if a == b => units::bytes(a),
            (a, b) => format!("{} to {}", units::bytes(a), units::bytes(b)),
        }
    )?;
    for (name, d, what) in [
        (
            "client reads",
            &k.client_reads,
            "service time = the device read",
        ),
        (
            "client writes",
            &k.client_writes,
            "an append to the write buffer",
        ),
    ] {
        let Some(d) = d.as_ref().filter(|d| d.ops > 0) else {
            continue;
        };
        writeln!(
            out,
            "    {name}: {what}; lat_intended counts from the schedule"
        )?;
        crate::render::summary::write_latency_header(out)?;
        let mut rows = vec![("lat", &d.lat), ("lat_intended", &d.lat_intended)];
        if let Some(service) = &d.service {
            rows.insert(0, ("service", service));
        }
        for (row, h) in rows {
            crate::render::summary::write_latency_row(out, row, h)?;
        }
    }
    writeln!(
        out,
        "    {:<22} {:>12} {:>12}",
        "per second", "target", "achieved"
    )?;
    let (t, a) = (&k.target, &k.achieved);
    let rows = [
        (
            "client reads",
            format!("{:.0}", t.client_reads_per_s),
            a.client_reads_per_s,
        ),
        (
            "client writes",
            format!("{:.0}", t.client_writes_per_s),
            a.client_writes_per_s,
        ),
        (
            "large-block reads",
            format!("{:.2}", t.lb_reads_per_s),
            a.lb_reads_per_s,
        ),
        (
            "large-block writes",
            format!("{:.2}", t.lb_writes_per_s),
            a.lb_writes_per_s,
        ),
    ];
    for (name, target, got) in rows {
        writeln!(out, "    {name:<22} {target:>12} {got:>12.2}")?;
    }
    writeln!(
        out,
        "    (large-block targets are ACT's derived rates: writes / floor(block / record) x 100 / (100 - defrag-lwm))"
    )?;
    writeln!(
        out,
        "  delivered: {:.1}% of the scheduled client operations, {:.1}% of the large-block operations the store asked for; worst lag {}",
        k.delivered.client_fraction * 100.0,
        k.delivered.large_block_fraction * 100.0,
        units::latency(k.worst_lag_ns as f64)
    )?;
    writeln!(
        out,
        "  store: {} records relocated by defrag, {} reads retried after a move, {} mismatches",
        units::count(k.relocated as f64),
        k.read_retries,
        k.mismatches
    )?;
    writeln!(
        out,
        "  verdict per slice (ACT: < 5% of reads >= 1 ms, < 1% >= 8 ms, < 0.1% >= 64 ms; large blocks informational)"
    )?;
    writeln!(
        out,
        "    reads are judged on their device service time, or from their scheduled start (\"intended\") in a slice where operations started {} or more late",
        units::latency(SLIPPED_LAG.as_nanos() as f64)
    )?;
    writeln!(
        out,
        "    {:<15} {:>9}  {:>23}  {:>8}  {:>23}  {:>23}",
        "slice",
        "reads",
        "reads >=1/8/64 ms",
        "judged",
        "LB reads >=1/8/64 ms",
        "LB writes >=1/8/64 ms"
    )?;
    for s in &k.slices {
        writeln!(
            out,
            "    {:<15} {:>9}  {}  {:>8}  {}  {}  {}",
            format!("{:.0}-{:.0} s", s.start_s, s.end_s),
            units::count(s.reads.ops as f64),
            shares_text(&s.reads),
            s.judged_on,
            shares_text(&s.lb_reads),
            shares_text(&s.lb_writes),
            slice_result(s),
        )?;
    }
    if let Some(behind) = &k.behind {
        writeln!(out, "  {behind}")?;
    }
    writeln!(out, "  {}", k.verdict_text)
}

fn client_latency(d: &virtgap_workloads::stats::DirStats, reads: bool) -> Option<KvClientLatency> {
    (d.ios > 0).then(|| KvClientLatency {
        ops: d.ios,
        service: reads.then(|| Histogram::from_latency(&d.clat)),
        lat: Histogram::from_latency(&d.lat),
        lat_intended: Histogram::from_latency(&d.lat_intended),
    })
}

fn shares(v: &SliceVerdict) -> KvSliceShares {
    KvSliceShares {
        ops: v.reads,
        pct_at_or_over_1ms: v.over_1ms_pct,
        pct_at_or_over_8ms: v.over_8ms_pct,
        pct_at_or_over_64ms: v.over_64ms_pct,
    }
}

/// The profile's (and `--json`'s) kv section.
pub fn section(k: &KvOutcome) -> KvSection {
    KvSection {
        verdict: match k.verdict() {
            KvVerdict::Pass => Some(true),
            KvVerdict::NoCompleteSlice => None,
            _ => Some(false),
        },
        outcome: outcome_word(&k.verdict()).to_string(),
        delivered: KvDelivered {
            client_fraction: k.achieved_fraction(),
            large_block_fraction: k.large_block_fraction(),
        },
        behind: k.behind.as_ref().map(|(who, by)| behind_text(who, *by)),
        keys: k.keys,
        records_per_block: k.records_per_block,
        read_bytes_min: k.read_bytes.0,
        read_bytes_max: k.read_bytes.1,
        service_threads: k.service_threads,
        achieved_fraction: k.achieved_fraction(),
        worst_lag_ns: k.worst_lag.as_nanos() as u64,
        target: KvRates {
            client_reads_per_s: k.read_rps as f64,
            client_writes_per_s: k.write_rps as f64,
            lb_reads_per_s: k.derived.lb_reads_per_s,
            lb_writes_per_s: k.derived.lb_writes_per_s,
        },
        achieved: KvRates {
            client_reads_per_s: k.rate(k.client_read.ios),
            client_writes_per_s: k.rate(k.client_write.ios),
            lb_reads_per_s: k.rate(k.lb_reads),
            lb_writes_per_s: k.rate(k.lb_writes),
        },
        relocated: k.counters.relocated,
        read_retries: k.counters.read_retries,
        mismatches: k.counters.mismatches,
        slices: k
            .slices
            .iter()
            .map(|s| KvSlice {
                start_s: s.start_s,
                end_s: s.end_s,
                complete: s.complete,
                pass: match slice_word(k, s) {
                    "PASS" => Some(true),
                    "FAIL" => Some(false),
                    _ => None,
                },
                judged_on: s.judged_on.label().to_string(),
                worst_lag_ns: s.worst_lag.as_nanos() as u64,
                reads: shares(&s.reads),
                lb_reads: shares(&s.lb_reads),
                lb_writes: shares(&s.lb_writes),
            })
            .collect(),
        verdict_text: verdict_text(k),
        client_reads: client_latency(&k.client_read, true),
        client_writes: client_latency(&k.client_write, false),
    }
}
