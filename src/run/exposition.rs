//! The endpoint's wire format: the exporter's families for Prometheus in the OpenMetrics text format by the
//! `prometheus-client` crate's encoder (what Prometheus asks for), and in the classic text
//! format 0.0.4 (what `promtool check metrics`, curl and older scrapers read), which that crate
//! does not write: there a counter's HELP and TYPE name it with its `_total`, and there is no
//! UNIT line and no `# EOF`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::model::metrics::{MetricFamily, MetricKind, MetricUnit, SampleValue};

/// One scrape's families, handed to the crate's registry as a collector.
#[derive(Debug)]
struct Page(Vec<MetricFamily>);

/// One labelled sample, encoded by its family's kind.
struct Encoded<'a>(MetricKind, &'a SampleValue);

impl EncodeMetric for Encoded<'_> {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        match (self.0, self.1) {
            (MetricKind::Counter, SampleValue::Count(n)) => {
                encoder.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(n, None)
            }
            (MetricKind::Counter, SampleValue::Number(x)) => {
                encoder.encode_counter::<prometheus_client::encoding::NoLabelSet, _, f64>(x, None)
            }
            (MetricKind::Gauge, SampleValue::Count(n)) => encoder.encode_gauge(&(*n as f64)),
            (MetricKind::Gauge, SampleValue::Number(x)) => encoder.encode_gauge(x),
            (
                _,
                SampleValue::Histogram {
                    sum,
                    count,
                    buckets,
                },
            ) => encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                *sum, *count, buckets, None,
            ),
            // A kind and a value that do not go together are a bug in the exporter.
            (_, SampleValue::Count(_) | SampleValue::Number(_)) => Err(std::fmt::Error),
        }
    }

    fn metric_type(&self) -> MetricType {
        metric_type(self.0)
    }
}

fn metric_type(kind: MetricKind) -> MetricType {
    match kind {
        MetricKind::Counter => MetricType::Counter,
        MetricKind::Gauge => MetricType::Gauge,
        MetricKind::Histogram => MetricType::Histogram,
    }
}

impl Collector for Page {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            if f.samples.is_empty() {
                continue;
            }
            let unit = f.unit.map(|u| match u {
                MetricUnit::Seconds => Unit::Seconds,
                MetricUnit::Bytes => Unit::Bytes,
            });
            let mut family =
                encoder.encode_descriptor(f.name, f.help, unit.as_ref(), metric_type(f.kind))?;
            for s in &f.samples {
                // The crate writes label values as given: escaped here, as both formats want.
                let labels: Vec<(&str, String)> = s
                    .labels
                    .iter()
                    .map(|(k, v)| (k.as_str(), escape_label(v)))
                    .collect();
                let sample = family.encode_family(&labels)?;
                Encoded(f.kind, &s.value).encode(sample)?;
            }
        }
        Ok(())
    }
}

/// The families as one OpenMetrics page; families without samples are left out.
pub fn encode(families: Vec<MetricFamily>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Page(families)));
    let mut text = String::new();
    // Writing to a String cannot fail; an error here is a kind/value mismatch, a bug.
    prometheus_client::encoding::text::encode(&mut text, &registry)
        .expect("every family's samples match its kind");
    text
}

/// The families in both formats: (OpenMetrics, classic), as the endpoint serves them.
pub fn pages(families: Vec<MetricFamily>) -> (String, String) {
    let classic = encode_classic(&families);
    (encode(families), classic)
}

/// A label value as both formats quote it.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A number as the classic format writes it.
fn number(x: f64) -> String {
    if x == f64::MAX || x == f64::INFINITY {
        "+Inf".into()
    } else {
        x.to_string()
    }
}

/// The families in the classic text format (0.0.4); families without samples are left out.
pub fn encode_classic(families: &[MetricFamily]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let series = |out: &mut String, name: &str, labels: &[(String, String)], value: &str| {
        out.push_str(name);
        if !labels.is_empty() {
            out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{k}=\"{}\"", escape_label(v));
            }
            out.push('}');
        }
        let _ = writeln!(out, " {value}");
    };
    for f in families.iter().filter(|f| !f.samples.is_empty()) {
        let name = f.exposed_name();
        let kind = match f.kind {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        };
        let help = f.help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for s in &f.samples {
            match &s.value {
                SampleValue::Count(n) => series(&mut out, &name, &s.labels, &n.to_string()),
                SampleValue::Number(x) => series(&mut out, &name, &s.labels, &number(*x)),
                SampleValue::Histogram {
                    sum,
                    count,
                    buckets,
                } => {
                    let mut cumulative = 0;
                    for (le, n) in buckets {
                        cumulative += n;
                        let mut labels = s.labels.clone();
                        labels.push(("le".into(), number(*le)));
                        series(
                            &mut out,
                            &format!("{name}_bucket"),
                            &labels,
                            &cumulative.to_string(),
                        );
                    }
                    series(&mut out, &format!("{name}_sum"), &s.labels, &number(*sum));
                    series(
                        &mut out,
                        &format!("{name}_count"),
                        &s.labels,
                        &count.to_string(),
                    );
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::metrics::{MetricUnit, Sample};

    fn families() -> Vec<MetricFamily> {
        vec![
            MetricFamily {
                name: "virtgap_block_requests",
                help: "Requests",
                unit: None,
                kind: MetricKind::Counter,
                samples: vec![Sample {
                    labels: vec![("device".into(), "v\"d\\a".into())],
                    value: SampleValue::Count(7),
                }],
            },
            MetricFamily {
                name: "virtgap_block_stage",
                help: "Stage latency",
                unit: Some(MetricUnit::Seconds),
                kind: MetricKind::Histogram,
                samples: vec![Sample {
                    labels: vec![("stage".into(), "device".into())],
                    value: SampleValue::Histogram {
                        sum: 0.5,
                        count: 3,
                        buckets: vec![(0.001, 1), (0.002, 2), (f64::MAX, 0)],
                    },
                }],
            },
            MetricFamily {
                name: "virtgap_empty",
                help: "Nothing measured",
                unit: None,
                kind: MetricKind::Gauge,
                samples: vec![],
            },
        ]
    }

    #[test]
    fn the_classic_format_names_counters_with_total_and_accumulates_buckets() {
        let text = encode_classic(&families());
        assert_eq!(
            text,
            "# HELP virtgap_block_requests_total Requests\n\
             # TYPE virtgap_block_requests_total counter\n\
             virtgap_block_requests_total{device=\"v\\\"d\\\\a\"} 7\n\
             # HELP virtgap_block_stage_seconds Stage latency\n\
             # TYPE virtgap_block_stage_seconds histogram\n\
             virtgap_block_stage_seconds_bucket{stage=\"device\",le=\"0.001\"} 1\n\
             virtgap_block_stage_seconds_bucket{stage=\"device\",le=\"0.002\"} 3\n\
             virtgap_block_stage_seconds_bucket{stage=\"device\",le=\"+Inf\"} 3\n\
             virtgap_block_stage_seconds_sum{stage=\"device\"} 0.5\n\
             virtgap_block_stage_seconds_count{stage=\"device\"} 3\n"
        );
    }

    #[test]
    fn openmetrics_has_units_totals_and_an_end() {
        let text = encode(families());
        assert!(
            text.contains("# TYPE virtgap_block_requests counter\n"),
            "{text}"
        );
        assert!(
            text.contains("virtgap_block_requests_total{device="),
            "{text}"
        );
        assert!(
            text.contains("# UNIT virtgap_block_stage_seconds seconds\n"),
            "{text}"
        );
        assert!(
            text.contains("{le=\"+Inf\",stage=\"device\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("{device=\"v\\\"d\\\\a\"} 7\n"), "{text}");
        assert!(!text.contains("virtgap_empty"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
