//! Reading a fleet's figures back from Prometheus (`diff --prometheus`): which instances a
//! label selector names over a time range, and each one's virtgap series at the range's slice
//! boundaries, through the HTTP query API (instant queries, one per instance and boundary).

use std::collections::BTreeMap;
use std::time::Duration;

use thiserror::Error;

use crate::analysis::fleet::{FleetHost, PromSample, METRICS_PATTERN};

/// Why Prometheus could not be read.
#[derive(Debug, Error)]
pub enum PrometheusError {
    #[error("{0:?} is not an http:// URL of a Prometheus server (e.g. http://prometheus:9090)")]
    Url(String),
    #[error("{url}: {why}")]
    Request { url: String, why: String },
    #[error("{url}: Prometheus refused the query {query}: {why}")]
    Query {
        url: String,
        query: String,
        why: String,
    },
    #[error("no instance's virtgap_host_info matches {selector} between {from} and {to} (unix seconds) at {url}; check the selector against the virtgap_host_info series in Prometheus")]
    NoHost {
        url: String,
        selector: String,
        from: i64,
        to: i64,
    },
    #[error("instance {0} matches both selectors; make them tell the two groups apart")]
    OnBothSides(String),
    #[error("the range and --slice make {0} slices; at most {MAX_SLICES} — give a longer --slice")]
    TooManySlices(usize),
}

/// The most slices a diff reads: each is a query per instance.
pub const MAX_SLICES: usize = 1000;
/// The largest answer read from one query.
const MAX_ANSWER_BYTES: u64 = 256 << 20;

/// A Prometheus server's query API.
pub struct Prometheus {
    url: String,
    agent: ureq::Agent,
}

impl std::fmt::Debug for Prometheus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prometheus")
            .field("url", &self.url)
            .finish()
    }
}

impl Prometheus {
    /// The server at `url` (http://HOST:PORT, with a path prefix if it has one). TLS is not
    /// built in: reach an https Prometheus through a local tunnel or proxy.
    pub fn new(url: &str) -> Result<Self, PrometheusError> {
        let trimmed = url.trim().trim_end_matches('/');
        let host = trimmed
            .strip_prefix("http://")
            .ok_or_else(|| PrometheusError::Url(url.to_string()))?;
        if host.is_empty() || host.starts_with('/') || trimmed.contains(char::is_whitespace) {
            return Err(PrometheusError::Url(url.to_string()));
        }
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(60)))
            .http_status_as_error(false)
            .build();
        Ok(Self {
            url: trimmed.to_string(),
            agent: config.into(),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// An instant query at `at` (unix seconds): its result vector.
    pub fn instant(&self, query: &str, at: f64) -> Result<Vec<PromSample>, PrometheusError> {
        let endpoint = format!("{}/api/v1/query", self.url);
        let failed = |why: String| PrometheusError::Request {
            url: self.url.clone(),
            why,
        };
        let mut response = self
            .agent
            .get(&endpoint)
            .query("query", query)
            .query("time", format!("{at:.3}"))
            .call()
            .map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        let body = response
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER_BYTES)
            .read_to_string()
            .map_err(|e| failed(e.to_string()))?;
        let answer: serde_json::Value = serde_json::from_str(&body).map_err(|_| {
            failed(format!(
                "answered HTTP {status} with no Prometheus JSON; is this the Prometheus server's address?"
            ))
        })?;
        if answer["status"] != "success" {
            return Err(PrometheusError::Query {
                url: self.url.clone(),
                query: query.to_string(),
                why: answer["error"]
                    .as_str()
                    .unwrap_or("no reason given")
                    .to_string(),
            });
        }
        let Some(result) = answer["data"]["result"].as_array() else {
            return Err(failed(format!(
                "answered {query} with no result vector; is this a Prometheus server?"
            )));
        };
        Ok(result.iter().filter_map(sample).collect())
    }
}

/// One result of an instant vector: its labels and value (Prometheus sends the value as a
/// string, "NaN" and "+Inf" included).
fn sample(v: &serde_json::Value) -> Option<PromSample> {
    let labels = v["metric"]
        .as_object()?
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect();
    let value = v["value"][1].as_str()?.parse().ok()?;
    Some(PromSample { labels, value })
}

/// A label selector as PromQL wants it: `platform="metal"` or `{platform="metal"}` both give
/// `{platform="metal"}`.
pub fn braced(selector: &str) -> String {
    let s = selector.trim();
    if s.starts_with('{') {
        s.to_string()
    } else {
        format!("{{{s}}}")
    }
}

/// `value` as a PromQL string literal.
fn quoted(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The instances whose `virtgap_host_info` matches `selector` at any time in `[from, to]`, each
/// with its series at every boundary. `progress` is told each query done and how many there
/// are.
pub fn fleet_side(
    prometheus: &Prometheus,
    selector: &str,
    boundaries: &[f64],
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<FleetHost>, PrometheusError> {
    if boundaries.len() > MAX_SLICES + 1 {
        return Err(PrometheusError::TooManySlices(boundaries.len() - 1));
    }
    let (from, to) = (boundaries[0], boundaries[boundaries.len() - 1]);
    let range_s = (to - from).ceil().max(1.0) as u64;
    let info = prometheus.instant(
        &format!(
            "max_over_time(virtgap_host_info{}[{range_s}s])",
            braced(selector)
        ),
        to,
    )?;
    // One entry per (job, instance): the first labels seen win (a host whose kernel changed
    // within the range is still one host).
    let mut hosts: BTreeMap<(String, String), BTreeMap<String, String>> = BTreeMap::new();
    for s in info {
        let job = s.labels.get("job").cloned().unwrap_or_default();
        let instance = s.labels.get("instance").cloned().unwrap_or_default();
        hosts.entry((job, instance)).or_insert(s.labels);
    }
    if hosts.is_empty() {
        return Err(PrometheusError::NoHost {
            url: prometheus.url().to_string(),
            selector: braced(selector),
            from: from as i64,
            to: to as i64,
        });
    }
    let total = hosts.len() * boundaries.len();
    let mut done = 0;
    let mut out = Vec::new();
    for ((job, instance), info) in hosts {
        let query = format!(
            "{{__name__=~{},job={},instance={}}}",
            quoted(METRICS_PATTERN),
            quoted(&job),
            quoted(&instance)
        );
        let mut at = Vec::new();
        for &t in boundaries {
            at.push((t, prometheus.instant(&query, t)?));
            done += 1;
            progress(done, total);
        }
        out.push(FleetHost {
            instance,
            job,
            info,
            boundaries: at,
        });
    }
    Ok(out)
}

/// Fails when an instance is on both sides.
pub fn apart(a: &[FleetHost], b: &[FleetHost]) -> Result<(), PrometheusError> {
    for h in a {
        if b.iter().any(|o| o.instance == h.instance && o.job == h.job) {
            return Err(PrometheusError::OnBothSides(h.instance.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_http_address_is_taken() {
        assert!(Prometheus::new("http://prometheus:9090").is_ok());
        assert!(Prometheus::new("http://10.0.0.1:9090/prom/").is_ok());
        for bad in [
            "https://p:9090",
            "prometheus:9090",
            "http://",
            "http:// x",
            "ftp://p",
        ] {
            assert!(
                matches!(Prometheus::new(bad), Err(PrometheusError::Url(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn selectors_are_braced_once_and_values_quoted() {
        assert_eq!(braced("platform=\"metal\""), "{platform=\"metal\"}");
        assert_eq!(braced(" {job=\"vm\"} "), "{job=\"vm\"}");
        assert_eq!(quoted("a\"b\\c"), "\"a\\\"b\\\\c\"");
    }

    #[test]
    fn a_result_vector_reads_labels_and_string_values() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"metric":{"__name__":"x","le":"+Inf"},"value":[1700000000.5,"+Inf"]}"#,
        )
        .unwrap();
        let s = sample(&v).unwrap();
        assert_eq!(s.labels["le"], "+Inf");
        assert!(s.value.is_infinite());
        let v: serde_json::Value =
            serde_json::from_str(r#"{"metric":{},"value":[1,"12.5"]}"#).unwrap();
        assert_eq!(sample(&v).unwrap().value, 12.5);
    }
}
