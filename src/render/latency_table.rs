//! fio's latency table, as the summary and the kv report print it: one row per latency
//! (min, mean, p50, p99, p99.9, max, stddev) under one header.

use std::io::{self, Write};

use virtgap_workloads::units;

use crate::model::histogram::Histogram;

/// The column heads above `write_latency_row`s.
pub fn write_latency_header(out: &mut impl Write) -> io::Result<()> {
    writeln!(
        out,
        "    {:<13} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "latency", "min", "mean", "p50", "p99", "p99.9", "max", "stddev"
    )
}

pub fn write_latency_row(out: &mut impl Write, name: &str, h: &Histogram) -> io::Result<()> {
    let f = |v: Option<f64>| v.map(units::latency).unwrap_or_else(|| "-".into());
    writeln!(
        out,
        "    {:<13} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        name,
        f(h.min_ns.map(|v| v as f64)),
        f(h.mean_ns()),
        f(h.percentile_ns(50.0)),
        f(h.percentile_ns(99.0)),
        f(h.percentile_ns(99.9)),
        f(h.max_ns.map(|v| v as f64)),
        f(h.stddev_ns()),
    )
}
