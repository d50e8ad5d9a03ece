//! What `virtgap serve` exposes, as plain data: metric families with their samples, built from
//! the probes' cumulative snapshot (`run::exporter`) and encoded for Prometheus
//! (`run::exposition`).

/// How Prometheus reads a family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// Monotonic since the probes attached (exposed with a `_total` suffix).
    Counter,
    Gauge,
    /// Cumulative buckets since the probes attached.
    Histogram,
}

/// The unit a family's name ends with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricUnit {
    Seconds,
    Bytes,
}

/// One labelled value of a family.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: Vec<(String, String)>,
    pub value: SampleValue,
}

#[derive(Clone, Debug, PartialEq)]
pub enum SampleValue {
    Count(u64),
    Number(f64),
    /// Buckets as (upper bound, count in this bucket alone), ascending; the last bound is
    /// `f64::MAX` (+Inf).
    Histogram {
        sum: f64,
        count: u64,
        buckets: Vec<(f64, u64)>,
    },
}

/// One metric: its name without unit or `_total`, help text, kind and samples.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricFamily {
    pub name: &'static str,
    pub help: &'static str,
    pub unit: Option<MetricUnit>,
    pub kind: MetricKind,
    pub samples: Vec<Sample>,
}

impl MetricFamily {
    /// The name Prometheus stores: with the unit, and `_total` for a counter (histograms add
    /// `_bucket`, `_sum` and `_count` to it).
    pub fn exposed_name(&self) -> String {
        let unit = match self.unit {
            Some(MetricUnit::Seconds) => "_seconds",
            Some(MetricUnit::Bytes) => "_bytes",
            None => "",
        };
        let total = if self.kind == MetricKind::Counter {
            "_total"
        } else {
            ""
        };
        format!("{}{unit}{total}", self.name)
    }
}
