//! Profile files: reading one (bounded, regular files only), parsing it straight into the typed
//! model, the checks serde cannot make, and the JSON Schema.

use schemars::JsonSchema;
use serde::Deserialize;

use crate::model::devices::DeviceStages;
use crate::model::histogram::Histogram;
use crate::model::interval::{CpuLoad, Interval};
use crate::model::iotune::{IotuneProfile, IOTUNE_VERSION};
use crate::model::profile::{Profile, RunRecord, SCHEMA_VERSION};
use crate::model::stages::{Stage, Stages};

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("{path}: cannot read: {err}")]
    Read { path: String, err: std::io::Error },
    #[error("{path}: not a virtgap profile ({err})")]
    NotProfile { path: String, err: String },
    #[error("{path}: schema version {found} is newer than this virtgap understands ({SCHEMA_VERSION}); upgrade virtgap")]
    Newer { path: String, found: u64 },
    #[error("{path}: profile schema version {found}; this virtgap reads versions {MIN_SCHEMA_VERSION} to {SCHEMA_VERSION}")]
    Unsupported { path: String, found: u64 },
    #[error("{path}: profile schema version {found}, but it has {field}, which version {since} added: its schema_version is wrong (set it to the version that wrote the file)")]
    VersionMismatch {
        path: String,
        found: u64,
        field: String,
        since: u32,
    },
    #[error(
        "{path} is {size} bytes, over the {MAX_PROFILE_BYTES}-byte limit for a profile; is it one?"
    )]
    TooLarge { path: String, size: u64 },
}

/// The oldest schema version virtgap reads (there was never a version 0).
pub const MIN_SCHEMA_VERSION: u32 = 1;

/// The largest profile virtgap reads: far above a day-long run's, far below what would exhaust
/// memory when a wrong file is named.
pub const MAX_PROFILE_BYTES: u64 = 256 << 20;

/// The JSON Schema of a profile file, generated from the types above (`virtgap schema` prints
/// it; `schema/profile.schema.json` is this, and a test keeps it so).
pub fn json_schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(Profile);
    schema.insert(
        "$id".into(),
        format!("https://virtgap.dev/schema/profile-{SCHEMA_VERSION}.json").into(),
    );
    schema.insert("title".into(), "virtgap profile".into());
    schema.to_value()
}

/// Reads a profile, refusing files that are not profiles, are not regular files (a FIFO without
/// waiting for a writer), are implausibly large or come from a newer virtgap; a value that does
/// not fit says where it is (`stages.device.count: …`).
pub fn load(path: &std::path::Path) -> Result<Profile, ProfileError> {
    let bytes = read(path)?;
    parse(&bytes, &path.display().to_string())
}

/// A file `diff` reads: a profile, or an iotune result (each phase's profile inside).
#[derive(Debug)]
pub enum Document {
    Profile(Box<Profile>),
    Iotune(Box<IotuneProfile>),
}

/// Reads a profile or an iotune result, with the checks of [`load`] (an iotune result's
/// phases' profiles get each profile's checks, their fields named from the phase).
pub fn load_document(path: &std::path::Path) -> Result<Document, ProfileError> {
    let bytes = read(path)?;
    parse_document(&bytes, &path.display().to_string())
}

/// Parses a profile or an iotune result, told apart by the iotune result's `iotune_version`.
pub fn parse_document(bytes: &[u8], shown: &str) -> Result<Document, ProfileError> {
    let not_profile = |err: String| ProfileError::NotProfile {
        path: shown.to_string(),
        err,
    };
    #[derive(Deserialize)]
    struct Kind {
        iotune_version: Option<serde_json::Value>,
    }
    let head: Kind =
        serde_json::from_slice(bytes).map_err(|e| not_profile(format!("not JSON: {e}")))?;
    let Some(version) = head.iotune_version else {
        return parse(bytes, shown).map(|p| Document::Profile(Box::new(p)));
    };
    if version.as_u64() != Some(u64::from(IOTUNE_VERSION)) {
        return Err(not_profile(format!(
            "an iotune result of version {version}; this virtgap reads version {IOTUNE_VERSION}"
        )));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let result: IotuneProfile = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let at = e.path().to_string();
        not_profile(format!("{at}: {}", e.into_inner()))
    })?;
    for (n, phase) in result.phases.iter().enumerate() {
        let at = format!("phases[{n}]");
        if phase.profile.schema_version != SCHEMA_VERSION {
            return Err(not_profile(format!(
                "{at}.profile.schema_version: {}, where an iotune result of this version holds {SCHEMA_VERSION}",
                phase.profile.schema_version
            )));
        }
        for (k, v) in std::iter::once(phase.figure)
            .chain(phase.runs.iter().copied())
            .enumerate()
        {
            at_most(&format!("{at}.figure or runs[{k}]"), v, MAX_NS_SUM).map_err(&not_profile)?;
        }
        if phase.runs.is_empty() {
            return Err(not_profile(format!("{at}.runs: no measured run")));
        }
        validate(&phase.profile).map_err(|e| not_profile(format!("{at}.profile.{e}")))?;
    }
    Ok(Document::Iotune(Box::new(result)))
}

/// A profile file's bytes: a regular file, within [`MAX_PROFILE_BYTES`].
fn read(path: &std::path::Path) -> Result<Vec<u8>, ProfileError> {
    use virtgap_workloads::input::{read_bounded, InputError};
    let shown = path.display().to_string();
    // A FIFO, a device or a file over the limit is refused before anything is read from it.
    read_bounded(path, MAX_PROFILE_BYTES).map_err(|e| match e {
        InputError::Io(err) => ProfileError::Read {
            path: shown.clone(),
            err,
        },
        InputError::NotRegular(kind) => ProfileError::NotProfile {
            path: shown.clone(),
            err: format!("{kind}, not a regular file"),
        },
        InputError::TooLarge { size, .. } => ProfileError::TooLarge {
            path: shown.clone(),
            size,
        },
    })
}

/// Parses a profile's bytes (`shown` names it in errors): the schema version first, then the
/// whole document straight into the typed model (no intermediate JSON tree), then the values
/// serde cannot check (finite, in range, consistent).
pub fn parse(bytes: &[u8], shown: &str) -> Result<Profile, ProfileError> {
    let not_profile = |err: String| ProfileError::NotProfile {
        path: shown.to_string(),
        err,
    };
    /// Only the version: every other field is skipped without being kept.
    #[derive(Deserialize, JsonSchema)]
    struct VersionOnly {
        schema_version: Option<serde_json::Value>,
    }
    let head: VersionOnly =
        serde_json::from_slice(bytes).map_err(|e| not_profile(format!("not JSON: {e}")))?;
    let version = match head.schema_version {
        None => return Err(not_profile("no schema_version".into())),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| not_profile(format!("schema_version is {v}, not a version number")))?,
    };
    if version > u64::from(SCHEMA_VERSION) {
        return Err(ProfileError::Newer {
            path: shown.to_string(),
            found: version,
        });
    }
    if version < u64::from(MIN_SCHEMA_VERSION) {
        return Err(ProfileError::Unsupported {
            path: shown.to_string(),
            found: version,
        });
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let profile: Profile = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let at = e.path().to_string();
        not_profile(format!("{at}: {}", e.into_inner()))
    })?;
    if let Some((field, since)) = newer_than(&profile, version) {
        return Err(ProfileError::VersionMismatch {
            path: shown.to_string(),
            found: version,
            field,
            since,
        });
    }
    validate(&profile).map_err(not_profile)?;
    Ok(profile)
}

/// A section a profile of schema `version` cannot have, with the version that added it: read
/// as its version says, such a profile would be misread (before version 3, `stages.device` runs
/// to the request's completion).
fn newer_than(p: &Profile, version: u64) -> Option<(String, u32)> {
    if version >= 3 {
        return None;
    }
    let stages = std::iter::once(("stages".to_string(), p.stages.completion.is_some())).chain(
        p.runs
            .iter()
            .enumerate()
            .map(|(n, r)| (format!("runs[{n}].stages"), r.stages.completion.is_some())),
    );
    let devices = p.devices.iter().enumerate().flat_map(|(n, d)| {
        std::iter::once((
            format!("devices[{n}].stages"),
            d.stages.completion.is_some(),
        ))
        .chain(d.ops.iter().enumerate().map(move |(m, o)| {
            (
                format!("devices[{n}].ops[{m}].stages"),
                o.stages.completion.is_some(),
            )
        }))
    });
    let intervals = p.intervals.iter().enumerate().map(|(n, iv)| {
        (
            format!("intervals[{n}].stages"),
            iv.stages.contains_key(Stage::Completion.name()),
        )
    });
    let (at, _) = stages
        .chain(devices)
        .chain(intervals)
        .find(|(_, has)| *has)?;
    Some((format!("{at}.completion"), 3))
}

/// Beyond these no run of any length gets: rates and sums of such figures would overflow into
/// inf rather than say anything.
const MAX_SECONDS: f64 = 1e9;
const MAX_NS_SUM: f64 = 1e24;
const MAX_PCT: f64 = 1e6;
/// Per-CPU times and counts are added up across CPUs and intervals: bounded far above a real
/// run (3 years of nanoseconds) so those sums cannot overflow.
const MAX_U64: u64 = 100_000_000_000_000_000;
/// Windows are measured with nanosecond clocks: a shorter one is no measurement, and rates over
/// it could be infinite. Anything longer is a window record writes (`-d 100us`, or a run
/// interrupted at its start).
const MIN_WINDOW_S: f64 = 1e-9;

fn non_negative(at: &str, v: f64) -> Result<(), String> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(format!("{at}: {v} is not a finite, non-negative number"))
    }
}

fn at_most(at: &str, v: f64, max: f64) -> Result<(), String> {
    non_negative(at, v)?;
    if v > max {
        return Err(format!("{at}: {v} is beyond any real run (at most {max})"));
    }
    Ok(())
}

/// A measured window's length.
fn window(at: &str, v: f64) -> Result<(), String> {
    at_most(at, v, MAX_SECONDS)?;
    if v > 0.0 && v < MIN_WINDOW_S {
        return Err(format!("{at}: {} s is shorter than any run", number(v)));
    }
    Ok(())
}

/// Counts that later sums add up: the first over [`MAX_U64`] is named.
fn counts<'a>(
    at: &str,
    named: impl IntoIterator<Item = (&'a str, Option<u64>)>,
) -> Result<(), String> {
    match named
        .into_iter()
        .find_map(|(name, v)| v.filter(|v| *v > MAX_U64).map(|v| (name, v)))
    {
        Some((name, v)) => Err(format!("{at}.{name}: {v} is beyond any real run")),
        None => Ok(()),
    }
}

/// Checks what the types cannot: times and rates finite and not negative, intervals that end
/// after they start, histograms whose buckets, count and sum agree. The first problem found is
/// named by its field path.
fn validate(p: &Profile) -> Result<(), String> {
    check_run_figures(p)?;
    for (n, c) in p.cpus.iter().enumerate() {
        check_cpu(&format!("cpus[{n}]"), c)?;
    }
    if let Some(n) = p.cpu_pairs.iter().position(|x| x[2] > MAX_U64) {
        return Err(format!("cpu_pairs[{n}]: a count beyond any real run"));
    }
    for (n, r) in p.runs.iter().enumerate() {
        check_run_record(&format!("runs[{n}]"), r)?;
    }
    let listed: u64 = p
        .runs
        .iter()
        .map(|r| r.intervals)
        .fold(0, u64::saturating_add);
    if !p.runs.is_empty() && listed != p.intervals.len() as u64 {
        return Err(format!(
            "runs: list {listed} intervals, the profile has {}",
            p.intervals.len()
        ));
    }
    for (n, iv) in p.intervals.iter().enumerate() {
        check_interval(&format!("intervals[{n}]"), iv)?;
    }
    for (at, h) in histograms(p) {
        histogram_ok(h, MAX_U64, MAX_NS_SUM).map_err(|e| format!("{at}: {e}"))?;
    }
    Ok(())
}

/// The run's interval, windows and CPU shares.
fn check_run_figures(p: &Profile) -> Result<(), String> {
    non_negative("run.interval_s", p.run.interval_s)?;
    if p.run.interval_s == 0.0 {
        return Err("run.interval_s: 0 is not an interval length".into());
    }
    at_most("run.interval_s", p.run.interval_s, MAX_SECONDS)?;
    window("results.measured_s", p.results.measured_s)?;
    if let Some(s) = p.probe_seconds {
        window("probe_seconds", s)?;
    }
    // Counts the renderers add up (read + write I/Os, every program's runs).
    let r = &p.results;
    counts(
        "results",
        [
            ("read.ios", Some(r.read.ios)),
            ("read.bytes", Some(r.read.bytes)),
            ("write.ios", Some(r.write.ios)),
            ("write.bytes", Some(r.write.bytes)),
            ("context_switches", Some(r.context_switches)),
        ],
    )?;
    for (n, c) in p.self_overhead.programs.iter().flatten().enumerate() {
        counts(
            &format!("self_overhead.programs[{n}]"),
            [
                ("runs", Some(c.runs)),
                ("run_time_ns", Some(c.run_time_ns)),
                ("missed", Some(c.missed)),
            ],
        )?;
    }
    for (at, v) in [
        ("results.usr_cpu_pct", Some(p.results.usr_cpu_pct)),
        ("results.sys_cpu_pct", Some(p.results.sys_cpu_pct)),
        ("self_overhead.probe_cpu_pct", p.self_overhead.probe_cpu_pct),
        (
            "self_overhead.recorder_cpu_pct",
            p.self_overhead.recorder_cpu_pct,
        ),
    ] {
        if let Some(v) = v {
            at_most(at, v, MAX_PCT)?;
        }
    }
    Ok(())
}

fn check_cpu(at: &str, c: &CpuLoad) -> Result<(), String> {
    counts(
        at,
        [
            ("hardirq_ns", Some(c.hardirq_ns)),
            ("softirq_ns", Some(c.softirq_ns)),
            ("hardirq_count", Some(c.hardirq_count)),
            ("softirq_count", Some(c.softirq_count)),
            ("user_ns", c.user_ns),
            ("system_ns", c.system_ns),
            ("idle_ns", c.idle_ns),
            ("steal_ns", c.steal_ns),
        ],
    )?;
    let maps = [&c.irqs, &c.ipis_sent, &c.cross_cpu_calls, &c.vectors];
    counts(
        at,
        maps.iter()
            .flat_map(|m| m.iter())
            .map(|(k, v)| (k.as_str(), Some(*v))),
    )
}

fn check_run_record(at: &str, r: &RunRecord) -> Result<(), String> {
    window(&format!("{at}.measured_s"), r.measured_s)?;
    if let Some(s) = r.probe_seconds {
        window(&format!("{at}.probe_seconds"), s)?;
    }
    counts(
        at,
        [
            ("read_ios", Some(r.read_ios)),
            ("write_ios", Some(r.write_ios)),
            ("hardirq_ns", r.hardirq_ns),
            ("softirq_ns", r.softirq_ns),
            ("ipis_sent", r.ipis_sent),
            ("msr_writes", r.msr_writes),
        ],
    )?;
    if let Some(idle) = &r.idle {
        window(&format!("{at}.idle.seconds"), idle.seconds)?;
        let idle_counts = [
            idle.hardirq_ns,
            idle.softirq_ns,
            idle.ipis_sent,
            idle.msr_writes,
        ];
        if idle_counts.iter().flatten().any(|v| *v > MAX_U64) {
            return Err(format!("{at}.idle: a count beyond any real run"));
        }
    }
    for (m, set) in r.tail.iter().flat_map(|t| t.sets.iter().enumerate()) {
        let mean = &set.mean;
        let finite = [
            mean.app_ns,
            mean.queue_ns,
            mean.device_ns,
            mean.completion_ns,
            mean.software_ns,
        ]
        .iter()
        .chain([&set.threshold_ns, &set.baseline.app_ns])
        .all(|v| v.is_finite() && v.abs() <= MAX_U64 as f64);
        if !finite || set.joined > set.ios || !(0.0..=100.0).contains(&set.percentile) {
            return Err(format!(
                "{at}.tail.sets[{m}]: figures no run gives (joined {} of {} I/Os, p{})",
                set.joined, set.ios, set.percentile
            ));
        }
    }
    Ok(())
}

fn check_interval(at: &str, iv: &Interval) -> Result<(), String> {
    for (m, c) in iv.cpus.iter().enumerate() {
        check_cpu(&format!("{at}.cpus[{m}]"), c)?;
    }
    for (name, st) in &iv.stages {
        if st.count > MAX_U64 || st.sum_ns > MAX_U64 {
            return Err(format!("{at}.stages.{name}: beyond any real run"));
        }
    }
    counts(
        at,
        [
            ("read_ios", Some(iv.read_ios)),
            ("write_ios", Some(iv.write_ios)),
            ("read_bytes", Some(iv.read_bytes)),
            ("write_bytes", Some(iv.write_bytes)),
            ("lat_count", Some(iv.lat_count)),
        ],
    )?;
    at_most(&format!("{at}.start_s"), iv.start_s, MAX_SECONDS)?;
    at_most(&format!("{at}.end_s"), iv.end_s, MAX_SECONDS)?;
    at_most(&format!("{at}.lat_sum_ns"), iv.lat_sum_ns, MAX_NS_SUM)?;
    if iv.end_s <= iv.start_s {
        return Err(format!(
            "{at}: ends ({} s) no later than it starts ({} s)",
            iv.end_s, iv.start_s
        ));
    }
    Ok(())
}

/// `v` as an error shows it: in exponent form where the plain one would run to dozens of digits.
fn number(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-6..1e16).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        v.to_string()
    }
}

/// Every histogram of a profile, named by its field path.
fn histograms<'a>(p: &'a Profile) -> Vec<(String, &'a Histogram)> {
    fn named<'a>(
        at: String,
        found: impl IntoIterator<Item = (&'static str, Option<&'a Histogram>)>,
    ) -> impl Iterator<Item = (String, &'a Histogram)> {
        found
            .into_iter()
            .filter_map(move |(name, h)| Some((format!("{at}.{name}"), h?)))
    }
    let stages = |at: String, s: &'a Stages| {
        named(
            at,
            [
                ("app", Some(&s.app)),
                ("queue", s.queue.as_ref()),
                ("device", s.device.as_ref()),
                ("completion", s.completion.as_ref()),
                ("wakeup", s.wakeup.as_ref()),
                ("flush", s.flush.as_ref()),
            ],
        )
    };
    let mut out: Vec<(String, &'a Histogram)> = stages("stages".into(), &p.stages).collect();
    for (n, r) in p.runs.iter().enumerate() {
        out.extend(stages(format!("runs[{n}].stages"), &r.stages));
    }
    for (dir, d) in [("read", &p.results.read), ("write", &p.results.write)] {
        let at = format!("results.{dir}");
        out.push((format!("{at}.slat"), &d.slat));
        out.push((format!("{at}.clat"), &d.clat));
        out.push((format!("{at}.lat"), &d.lat));
        if let Some(h) = &d.lat_intended {
            out.push((format!("{at}.lat_intended"), h));
        }
    }
    let device_stages = |at: String, s: &'a DeviceStages| {
        named(
            at,
            [
                ("queue", s.queue.as_ref()),
                ("device", s.device.as_ref()),
                ("completion", s.completion.as_ref()),
            ],
        )
    };
    for (n, d) in p.devices.iter().enumerate() {
        out.extend(device_stages(format!("devices[{n}].stages"), &d.stages));
        for (m, o) in d.ops.iter().enumerate() {
            out.extend(device_stages(
                format!("devices[{n}].ops[{m}].stages"),
                &o.stages,
            ));
        }
        for (m, q) in d.nvme_queues.iter().enumerate() {
            if let Some(h) = &q.latency {
                out.push((format!("devices[{n}].nvme_queues[{m}].latency"), h));
            }
        }
    }
    if let Some(kv) = &p.kv {
        for (name, c) in [
            ("client_reads", &kv.client_reads),
            ("client_writes", &kv.client_writes),
        ] {
            let Some(c) = c else { continue };
            let at = format!("kv.{name}");
            if let Some(h) = &c.service {
                out.push((format!("{at}.service"), h));
            }
            out.push((format!("{at}.lat"), &c.lat));
            out.push((format!("{at}.lat_intended"), &c.lat_intended));
        }
    }
    out
}

/// What any histogram virtgap writes satisfies: finite, non-negative sums; buckets in order,
/// each `low <= high`, holding the histogram's count; a sum that values within its bounds can
/// give. Counts at most `max_count`, sums at most `max_sum` (beyond any real run).
///
/// A histogram with extremes (`min_ns`, `max_ns`) is the workload's, counted in one place: it
/// must hold exactly. One without is the kernel's, read while the probes may still be adding to
/// it: the read can catch a few values in flight, counted in one field and not yet in another.
fn histogram_ok(h: &Histogram, max_count: u64, max_sum: f64) -> Result<(), String> {
    for (name, v) in [("sum_ns", Some(h.sum_ns)), ("sum_sq_ns", h.sum_sq_ns)] {
        match v {
            Some(v) if !(v.is_finite() && v >= 0.0) => {
                return Err(format!(
                    "{name} {} is not a finite, non-negative number",
                    number(v)
                ))
            }
            _ => {}
        }
    }
    if h.count > max_count || h.sum_ns > max_sum {
        return Err(format!(
            "count {} and sum_ns {} are beyond any real run",
            h.count,
            number(h.sum_ns)
        ));
    }
    let mut total: u64 = 0;
    let mut previous_high: Option<u64> = None;
    for (i, &[low, high, n]) in h.buckets.iter().enumerate() {
        if low > high {
            return Err(format!("buckets[{i}]: low {low} above high {high}"));
        }
        if previous_high.is_some_and(|p| low <= p) {
            return Err(format!(
                "buckets[{i}]: starts at {low}, not after the bucket before it"
            ));
        }
        previous_high = Some(high);
        total = total
            .checked_add(n)
            .filter(|t| *t <= max_count)
            .ok_or_else(|| format!("buckets[{i}]: counts beyond any real run"))?;
    }
    // The float sum is rounded: bounds get a hair of room.
    let fits = |sum: f64, bound: f64| sum <= bound * (1.0 + 1e-9) + 1.0;
    match h.min_ns.zip(h.max_ns) {
        Some((min, max)) => {
            if h.count == 0 || min > max {
                return Err(format!(
                    "min_ns {min} and max_ns {max} for {} values",
                    h.count
                ));
            }
            if total != h.count {
                return Err(format!(
                    "its buckets hold {total} values, its count is {}",
                    h.count
                ));
            }
            let (low, high) = (h.count as f64 * min as f64, h.count as f64 * max as f64);
            if !fits(h.sum_ns, high) || !fits(low, h.sum_ns) {
                return Err(format!(
                    "sum_ns {} is not what {} values from {min} to {max} ns add up to",
                    number(h.sum_ns),
                    h.count
                ));
            }
        }
        None => {
            // At most one value in flight per CPU adding to it, on hosts of up to a few
            // hundred busy CPUs; more for a larger count (pooled runs each read once).
            let slack = 256 + h.count / 1024;
            if total.abs_diff(h.count) > slack {
                return Err(format!(
                    "its buckets hold {total} values, its count is {}",
                    h.count
                ));
            }
            // Values in flight may be in the sum but in no bucket yet: each at most u64::MAX.
            let top = previous_high.unwrap_or(0) as f64;
            let n = h.count.max(total) as f64;
            if !fits(h.sum_ns, n * top + slack as f64 * u64::MAX as f64) {
                return Err(format!(
                    "sum_ns {} is more than {} values of at most {} ns add up to",
                    number(h.sum_ns),
                    h.count,
                    previous_high.unwrap_or(0)
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kv_profile_from_before_slices_said_what_they_were_judged_on_still_loads() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/fuzz-seeds/kv-act-no-probes.json");
        let p = load(&path).unwrap();
        let kv = p.kv.expect("a kv profile");
        assert!(!kv.slices.is_empty());
        assert!(kv
            .slices
            .iter()
            .all(|s| s.judged_on == crate::model::kv::JudgedOn::Service));
    }

    #[test]
    fn newer_schema_and_non_profiles_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        std::fs::write(&p, r#"{"schema_version": 99}"#).unwrap();
        assert!(matches!(
            load(&p),
            Err(ProfileError::Newer { found: 99, .. })
        ));
        std::fs::write(&p, "not json").unwrap();
        assert!(load(&p)
            .unwrap_err()
            .to_string()
            .contains("not a virtgap profile"));
        std::fs::write(&p, r#"{"hello": 1}"#).unwrap();
        assert!(load(&p)
            .unwrap_err()
            .to_string()
            .contains("no schema_version"));
        std::fs::write(&p, r#"{"schema_version": "1"}"#).unwrap();
        let err = load(&p).unwrap_err().to_string();
        assert!(
            err.contains(r#"schema_version is "1", not a version number"#),
            "{err}"
        );
        std::fs::write(&p, r#"{"schema_version": 1, "complete": "yes"}"#).unwrap();
        let err = load(&p).unwrap_err().to_string();
        assert!(err.contains("complete:"), "the field path is named: {err}");
        let err = load(std::path::Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }

    /// A profile kept as test data, as a JSON tree to edit.
    fn seed(name: &str) -> serde_json::Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name);
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    fn parsed(doc: &serde_json::Value) -> Result<Profile, ProfileError> {
        parse(doc.to_string().as_bytes(), "p.json")
    }

    fn refusal(doc: &serde_json::Value) -> String {
        match parsed(doc) {
            Ok(_) => panic!("accepted: {doc}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("b.json");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(load(&fifo).map(|_| ()).map_err(|e| e.to_string())));
        let err = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("load returns at once, not blocked in open")
            .unwrap_err();
        assert!(
            err.ends_with("not a virtgap profile (a FIFO, not a regular file)"),
            "{err}"
        );
    }

    #[test]
    fn only_schema_versions_virtgap_wrote_are_read_and_as_themselves() {
        let mut doc = seed("fuzz-seeds/rand4k-two-runs.json");
        assert_eq!(doc["schema_version"], 2);
        parsed(&doc).unwrap();
        doc["schema_version"] = 0.into();
        assert_eq!(
            refusal(&doc),
            "p.json: profile schema version 0; this virtgap reads versions 1 to 3"
        );
        // A version-2 profile has no completion stage: one with it was version 3, and its
        // device stage would be read as running to completion.
        doc["stages"]["completion"] = doc["stages"]["queue"].clone();
        doc["schema_version"] = 3.into();
        parsed(&doc).unwrap();
        doc["schema_version"] = 2.into();
        assert_eq!(
            refusal(&doc),
            "p.json: profile schema version 2, but it has stages.completion, which version 3 \
             added: its schema_version is wrong (set it to the version that wrote the file)"
        );
        let mut doc = seed("minimal-profile.json");
        doc["schema_version"] = 1.into();
        parsed(&doc).unwrap();
    }

    #[test]
    fn histograms_no_run_gives_are_refused() {
        let base = seed("fuzz-seeds/rand4k-two-runs.json");
        parsed(&base).unwrap();
        let refused = |edit: &dyn Fn(&mut serde_json::Value), why: &str| {
            let mut doc = base.clone();
            edit(&mut doc);
            let err = refusal(&doc);
            assert!(err.contains(why), "{why:?} not in: {err}");
        };
        fn app(d: &mut serde_json::Value) -> &mut serde_json::Value {
            &mut d["stages"]["app"]
        }
        fn device(d: &mut serde_json::Value) -> &mut serde_json::Value {
            &mut d["stages"]["device"]
        }
        refused(
            &|d| app(d)["sum_ns"] = (-1e20).into(),
            "stages.app: sum_ns -1e20 is not a finite, non-negative number",
        );
        refused(
            &|d| app(d)["sum_ns"] = 1.7e308.into(),
            "stages.app: count 195915 and sum_ns 1.7e308 are beyond any real run",
        );
        refused(
            &|d| device(d)["sum_ns"] = 1.7e308.into(),
            "stages.device: count 195925 and sum_ns 1.7e308",
        );
        refused(
            &|d| d["runs"][1]["stages"]["app"]["sum_sq_ns"] = (-1.0).into(),
            "runs[1].stages.app: sum_sq_ns -1 is not",
        );
        // A mean outside the extremes, or past the top bucket's bound.
        refused(
            &|d| {
                let max = app(d)["max_ns"].as_f64().unwrap();
                app(d)["sum_ns"] = (max * 195915.0 * 1.01).into();
            },
            "stages.app: sum_ns",
        );
        refused(
            &|d| device(d)["sum_ns"] = 1e22.into(),
            "stages.device: sum_ns 1e22 is more than 195925 values",
        );
        // Buckets that do not hold the count.
        refused(
            &|d| {
                let n = app(d)["buckets"][0][2].as_u64().unwrap();
                app(d)["buckets"][0][2] = (n + 1).into();
            },
            "stages.app: its buckets hold 195916 values, its count is 195915",
        );
        refused(
            &|d| device(d)["count"] = 1_000_000.into(),
            "stages.device: its buckets hold 195925 values, its count is 1000000",
        );
        refused(
            &|d| d["results"]["read"]["clat"]["buckets"] = serde_json::json!([]),
            "results.read.clat: its buckets hold 0 values",
        );
        // Buckets upside down or out of order.
        refused(
            &|d| {
                let b = &mut device(d)["buckets"][0];
                let (lo, hi) = (b[0].clone(), b[1].clone());
                b[0] = hi;
                b[1] = lo;
            },
            "stages.device: buckets[0]: low",
        );
        refused(
            &|d| app(d)["buckets"].as_array_mut().unwrap().swap(0, 1),
            "stages.app: buckets[1]: starts at",
        );
        refused(
            &|d| {
                app(d)["min_ns"] = 10.into();
                app(d)["max_ns"] = 5.into();
            },
            "stages.app: min_ns 10 and max_ns 5",
        );
        refused(
            &|d| d["devices"][0]["stages"]["queue"]["buckets"][0][2] = u64::MAX.into(),
            "devices[0].stages.queue: buckets[0]: counts beyond any real run",
        );
        // The kernel's histograms are read while the probes run: a value in flight, counted and
        // summed but in no bucket yet, is what record writes.
        let mut doc = base.clone();
        let count = device(&mut doc)["count"].as_u64().unwrap();
        device(&mut doc)["count"] = (count + 3).into();
        let sum = device(&mut doc)["sum_ns"].as_f64().unwrap();
        device(&mut doc)["sum_ns"] = (sum + 3e9).into();
        parsed(&doc).unwrap();
    }

    #[test]
    fn windows_as_short_as_record_writes_are_read() {
        // Interrupted while measuring the idle host: the workload ran 0.2 ms.
        let mut doc = seed("fuzz-seeds/rand4k-two-runs.json");
        doc["complete"] = false.into();
        doc["results"]["measured_s"] = 0.000185487.into();
        doc["runs"][1]["measured_s"] = 0.000185487.into();
        doc["runs"][1]["complete"] = false.into();
        parsed(&doc).unwrap();
        // `record -d 100us` completes in 0.1 ms.
        doc["complete"] = true.into();
        doc["results"]["measured_s"] = 0.0001.into();
        parsed(&doc).unwrap();
        // Shorter than a nanosecond clock measures is no window.
        doc["results"]["measured_s"] = 1e-12.into();
        assert!(refusal(&doc).contains("results.measured_s: 1e-12 s is shorter than any run"));
    }

    /// Counts the summary adds up, beyond any run, are refused rather than overflowing there.
    #[test]
    fn counts_the_renderers_add_up_are_bounded() {
        let mut doc = seed("minimal-profile.json");
        doc["results"]["write"]["ios"] = u64::MAX.into();
        assert!(
            refusal(&doc).contains("results.write.ios"),
            "{}",
            refusal(&doc)
        );
        let mut doc = seed("minimal-profile.json");
        if let Some(programs) = doc["self_overhead"]["programs"].as_array_mut() {
            if let Some(first) = programs.first_mut() {
                first["run_time_ns"] = u64::MAX.into();
                assert!(refusal(&doc).contains("run_time_ns"), "{}", refusal(&doc));
            }
        }
    }
}
