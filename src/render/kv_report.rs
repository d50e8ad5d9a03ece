//! The kv workload's part of a report: ACT's derived and achieved rates, the store's integrity
//! figures, and the per-slice verdict table (text and JSON).

use std::io::{self, Write};

use crate::model::kv::{
    JudgedOn, KvBehind, KvOutcome, KvReadQueueing, KvSection, KvSlice, KvSliceShares,
};
use virtgap_workloads::kv::DELIVERED_MIN;
use virtgap_workloads::units;

/// Why the run stopped, when a stream fell too far behind.
pub fn behind_text(b: &KvBehind) -> String {
    let by = b.by_ns as f64 / 1e9;
    match &b.stream {
        None => format!(
            "can't keep up: client operations fell {by:.1} s behind schedule (the generator: try more client threads with --workers, or more reads in flight per ring with --qd)"
        ),
        Some(stream) => format!("can't keep up: {stream} fell {by:.1} s behind (the device)"),
    }
}

/// The one-line verdict.
pub fn verdict_text(k: &KvSection) -> String {
    let load = format!(
        "{:.0} reads/s + {:.0} writes/s",
        k.target.client_reads_per_s, k.target.client_writes_per_s
    );
    match k.outcome {
        KvOutcome::Pass => format!(
            "PASS at {load} on this target{}",
            match (k.service_pass, k.intended_pass) {
                (Some(true), Some(true)) =>
                    " (within ACT's limits on the device reads and from the schedule)",
                _ => "",
            }
        ),
        KvOutcome::Fail => format!(
            "FAIL at {load} on this target{}",
            match (k.service_pass, k.intended_pass) {
                (Some(false), Some(true)) =>
                    ": the device reads were over ACT's limits (from the schedule: within them)",
                (Some(true), Some(false)) =>
                    ": reads from their schedule were over ACT's limits (the device reads alone: within them, as ACT would judge them)",
                (Some(false), Some(false)) =>
                    ": over ACT's limits on the device reads and from the schedule",
                _ => "",
            }
        ),
        KvOutcome::NotDelivered => {
            let (client, large_blocks) = (
                k.delivered.client_fraction,
                k.delivered.large_block_fraction,
            );
            let who = match &k.behind {
                Some(b) if !b.is_device() => "the generator was behind",
                Some(_) => "the device was behind",
                None if large_blocks < DELIVERED_MIN => "the device was behind on large blocks",
                None => "client operations fell behind their schedule: the generator, or reads waiting on the device",
            };
            format!(
                "NO VERDICT: did not deliver the load of {load} ({:.1}% of client operations, {:.1}% of large-block operations done; {who}); a pass needs {:.0}% of both",
                client * 100.0,
                large_blocks * 100.0,
                DELIVERED_MIN * 100.0
            )
        }
        KvOutcome::Mismatches => format!(
            "FAIL: {} reads returned data other than what was written",
            k.mismatches
        ),
        KvOutcome::NoCompleteSlice => {
            "no verdict: no complete slice (set --slice no longer than the run)".into()
        }
    }
}

/// A slice's reads on each definition: (device service time, from the schedule). An older
/// profile kept one of them, the one its `judged_on` names.
pub fn slice_shares(s: &KvSlice) -> (Option<&KvSliceShares>, Option<&KvSliceShares>) {
    match (&s.reads_intended, s.judged_on) {
        (Some(intended), _) => (Some(&s.reads), Some(intended)),
        (None, JudgedOn::Service) => (Some(&s.reads), None),
        (None, JudgedOn::Intended) => (None, Some(&s.reads)),
    }
}

/// One definition's percentages in a sentence ("0.61%, 0.00%, 0.00% >= 1/8/64 ms"; "-").
pub fn shares_words(v: Option<&KvSliceShares>) -> String {
    match v {
        Some(v) if v.ops > 0 => format!(
            "{:.2}%, {:.2}%, {:.2}% >= 1/8/64 ms",
            v.pct_at_or_over_1ms, v.pct_at_or_over_8ms, v.pct_at_or_over_64ms
        ),
        _ => "-".into(),
    }
}

/// A slice's word in the table: a slice of a run that did not deliver its load never reads
/// PASS (its `pass` is None then).
pub fn slice_result(s: &KvSlice) -> &'static str {
    match (s.complete, s.pass) {
        (false, _) => "(partial, not judged)",
        (true, Some(true)) => "PASS",
        (true, Some(false)) => "FAIL",
        (true, None) => "within limits at the lighter load done",
    }
}

fn shares_text(v: Option<&KvSliceShares>) -> String {
    let Some(v) = v.filter(|v| v.ops > 0) else {
        return format!("{:>23}", "-");
    };
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
    write_client_latencies(out, k)?;
    if let Some(q) = &k.read_queueing {
        for line in queueing_text(q) {
            writeln!(out, "    {line}")?;
        }
    }
    write_rates(out, k)?;
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
    write_slices(out, k)?;
    if let Some(behind) = &k.behind {
        writeln!(out, "  {}", behind_text(behind))?;
    }
    writeln!(out, "  {}", verdict_text(k))
}

/// How the rings' device reads queued, and their limit on reads in flight: two lines.
pub fn queueing_text(q: &KvReadQueueing) -> [String; 2] {
    let queued = match q.queued_share {
        Some(share) => format!(
            "{:.1}% of device-read time spent queued (beyond the device's own time: its fastest read sent alone)",
            share * 100.0
        ),
        None => "device-read time queued: not measured (no read went out alone)".into(),
    };
    let limit = if q.adaptive {
        let mean = q
            .limit_mean
            .map_or(String::new(), |m| format!(", {m:.1} on average"));
        format!(
            "reads in flight per ring: adaptive, {} to {}{mean} (at most {})",
            q.limit_min, q.limit_max, q.ceiling
        )
    } else {
        format!(
            "reads in flight per ring: up to {} (fixed; --adaptive-qd lowers it while reads queue)",
            q.ceiling
        )
    };
    [queued, limit]
}

/// Client reads' and writes' latency tables.
fn write_client_latencies(out: &mut impl Write, k: &KvSection) -> io::Result<()> {
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
        crate::render::latency_table::write_latency_header(out)?;
        let mut rows = vec![("lat", &d.lat), ("lat_intended", &d.lat_intended)];
        if let Some(service) = &d.service {
            rows.insert(0, ("service", service));
        }
        for (row, h) in rows {
            crate::render::latency_table::write_latency_row(out, row, h)?;
        }
    }
    Ok(())
}

/// ACT's streams per second: target and achieved.
fn write_rates(out: &mut impl Write, k: &KvSection) -> io::Result<()> {
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
    Ok(())
}

/// The verdict table, one row per slice.
fn write_slices(out: &mut impl Write, k: &KvSection) -> io::Result<()> {
    writeln!(
        out,
        "  verdict per slice (ACT: < 5% of reads >= 1 ms, < 1% >= 8 ms, < 0.1% >= 64 ms; large blocks informational)"
    )?;
    writeln!(
        out,
        "    client reads on two definitions: ACT's, each read's device time (\"device\"), and the client's, from each read's scheduled start (\"intended\"); a slice passes when both do"
    )?;
    writeln!(
        out,
        "    {:<15} {:>9}  {:>23}  {:>23}  {:>23}  {:>23}",
        "slice",
        "reads",
        "device >=1/8/64 ms",
        "intended >=1/8/64 ms",
        "LB reads >=1/8/64 ms",
        "LB writes >=1/8/64 ms"
    )?;
    for s in &k.slices {
        let (device, intended) = slice_shares(s);
        writeln!(
            out,
            "    {:<15} {:>9}  {}  {}  {}  {}  {}",
            format!("{:.0}-{:.0} s", s.start_s, s.end_s),
            units::count(s.reads.ops as f64),
            shares_text(device),
            shares_text(intended),
            shares_text(Some(&s.lb_reads)),
            shares_text(Some(&s.lb_writes)),
            slice_result(s),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(pct_1ms: f64) -> KvSliceShares {
        KvSliceShares {
            ops: 1_000,
            pct_at_or_over_1ms: pct_1ms,
            pct_at_or_over_8ms: 0.0,
            pct_at_or_over_64ms: 0.0,
        }
    }

    fn slice(service: f64, intended: Option<f64>, judged_on: JudgedOn) -> KvSlice {
        KvSlice {
            start_s: 0.0,
            end_s: 30.0,
            complete: true,
            reads: shares(service),
            reads_intended: intended.map(shares),
            judged_on,
            ..KvSlice::default()
        }
    }

    fn table(k: &KvSection) -> String {
        let mut out = Vec::new();
        write_slices(&mut out, k).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_slice_shows_both_definitions_and_an_older_one_the_one_it_kept() {
        let k = KvSection {
            slices: vec![
                slice(0.61, Some(9.35), JudgedOn::Service),
                slice(7.5, None, JudgedOn::Intended),
            ],
            ..KvSection::default()
        };
        let text = table(&k);
        let rows: Vec<&str> = text.lines().filter(|l| l.contains("0-30 s")).collect();
        assert_eq!(rows.len(), 2, "{text}");
        let cells =
            |row: &str| -> Vec<String> { row.split_whitespace().map(str::to_string).collect() };
        // "0-30", "s", reads, then device's three shares, intended's three.
        let new = cells(rows[0]);
        assert_eq!(
            new[3..9],
            ["0.61%", "0.00%", "0.00%", "9.35%", "0.00%", "0.00%"]
        );
        let old = cells(rows[1]);
        assert_eq!(old[3..7], ["-", "7.50%", "0.00%", "0.00%"], "{}", rows[1]);
    }

    #[test]
    fn queueing_says_what_was_measured_and_whether_the_limit_adapted() {
        let mut q = KvReadQueueing {
            queued_share: Some(0.25),
            adaptive: true,
            ceiling: 64,
            limit_min: 12,
            limit_max: 64,
            limit_mean: Some(30.04),
        };
        assert_eq!(
            queueing_text(&q),
            [
                "25.0% of device-read time spent queued (beyond the device's own time: its fastest read sent alone)",
                "reads in flight per ring: adaptive, 12 to 64, 30.0 on average (at most 64)",
            ]
        );
        q.adaptive = false;
        q.queued_share = None;
        let [queued, limit] = queueing_text(&q);
        assert!(queued.contains("not measured"), "{queued}");
        assert_eq!(
            limit,
            "reads in flight per ring: up to 64 (fixed; --adaptive-qd lowers it while reads queue)"
        );
    }

    #[test]
    fn a_fail_says_which_definition_failed() {
        let mut k = KvSection {
            outcome: KvOutcome::Fail,
            service_pass: Some(true),
            intended_pass: Some(false),
            ..KvSection::default()
        };
        let text = verdict_text(&k);
        assert!(text.starts_with("FAIL at"), "{text}");
        assert!(
            text.contains("reads from their schedule were over"),
            "{text}"
        );
        k.service_pass = Some(false);
        k.intended_pass = Some(true);
        assert!(verdict_text(&k).contains("the device reads were over"));
        // An older profile knows neither: the verdict alone.
        k.service_pass = None;
        assert!(verdict_text(&k).ends_with("on this target"));
    }
}
