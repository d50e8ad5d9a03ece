//! Workload specifications: the TOML files in `presets/` (embedded in the binary) and user copies
//! of them, plus command-line overrides. A spec is plain data; validation names the key at fault.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::kv::spec::{KvOverrides, KvSpec};
use crate::values::{de_from_str, ser_display};
// The values a spec is written in, where the app has always imported them from.
pub use crate::values::{ByteSize, Distribution, Span};

/// Built-in presets: (name, TOML text).
pub const PRESETS: &[(&str, &str)] = &[
    ("rand4k", include_str!("../presets/rand4k.toml")),
    ("rand4k-write", include_str!("../presets/rand4k-write.toml")),
    ("rand4k-mix", include_str!("../presets/rand4k-mix.toml")),
    ("rand4k-qd1", include_str!("../presets/rand4k-qd1.toml")),
    ("rand4k-paced", include_str!("../presets/rand4k-paced.toml")),
    ("seq1m", include_str!("../presets/seq1m.toml")),
    ("seq1m-write", include_str!("../presets/seq1m-write.toml")),
    ("fio-randread", include_str!("../presets/fio-randread.toml")),
    ("kv-act", include_str!("../presets/kv-act.toml")),
    ("kv-scylla", include_str!("../presets/kv-scylla.toml")),
    ("kv-readonly", include_str!("../presets/kv-readonly.toml")),
];

/// The preset `virtgap` runs when none is named.
pub const DEFAULT_PRESET: &str = "rand4k";

/// Largest block size accepted: larger requests are split by the block layer anyway.
pub const MAX_BS: u64 = 64 << 20;
/// Largest per-worker queue depth accepted (io_uring's own ring limit is 32768).
pub const MAX_QD: u32 = 4096;
pub const MAX_WORKERS: u32 = 1024;
/// One pebibyte: anything larger is a typo, not a target.
pub const MAX_SIZE: u64 = 1 << 50;
/// The fastest pacing accepted (a billion I/Os per second is past any device). It also keeps
/// the rate within TOML's signed 64-bit integers, so the effective spec always serializes.
pub const MAX_RATE_IOPS: u64 = 1_000_000_000;

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("{flag} applies only to kv workloads (e.g. -w kv-act), not to {workload}")]
    NotKv {
        flag: &'static str,
        workload: String,
    },
    #[error("unknown workload preset '{0}'; `virtgap workloads` lists the presets, or pass a path to a .toml file")]
    UnknownPreset(String),
    #[error("cannot read workload file {path}: {err}")]
    Read { path: String, err: std::io::Error },
    #[error("workload file {origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("{origin}{key} = {value}: {reason}")]
    Invalid {
        origin: String,
        key: &'static str,
        value: String,
        reason: String,
    },
}

/// Random offsets, one sequential stream per worker, or the key-value store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    Random,
    Sequential,
    /// The log-structured key-value store (`[kv]` table).
    Kv,
}

/// Read, write, or a mix of both chosen per I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadWrite {
    Read,
    Write,
    Mix,
}

impl FromStr for ReadWrite {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "read" => Ok(Self::Read),
            "write" => Ok(Self::Write),
            "mix" | "rw" | "randrw" => Ok(Self::Mix),
            _ => Err(format!("'{s}' is not one of read, write, mix")),
        }
    }
}

/// The I/O engine a worker uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EngineKind {
    /// One io_uring per worker, batched submission and reaping.
    #[serde(rename = "io_uring")]
    IoUring,
    /// Blocking pread/pwrite, one I/O in flight per worker.
    #[serde(rename = "psync")]
    Psync,
    /// No I/O at all: completes every request at once. Measures the generator's own cost.
    #[serde(rename = "null")]
    Null,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::IoUring => "io_uring",
            Self::Psync => "psync",
            Self::Null => "null",
        }
    }
}

impl FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "io_uring" | "uring" => Ok(Self::IoUring),
            "psync" => Ok(Self::Psync),
            "null" => Ok(Self::Null),
            _ => Err(format!("'{s}' is not one of io_uring, psync, null")),
        }
    }
}

fn read() -> ReadWrite {
    ReadWrite::Read
}

fn default_rwmix_read() -> u8 {
    70
}

fn default_true() -> bool {
    true
}

fn one() -> u32 {
    1
}

fn zero_span() -> Span {
    Span(Duration::ZERO)
}

fn uniform() -> Distribution {
    Distribution::Uniform
}

/// One workload, as written in a preset file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    /// Short name shown in reports.
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub pattern: Pattern,
    /// For kv, derived from the client rates.
    #[serde(default = "read")]
    pub rw: ReadWrite,
    /// Percent of I/Os that are reads when `rw = "mix"`.
    #[serde(default = "default_rwmix_read")]
    pub rwmix_read: u8,
    /// Bytes per I/O (for kv: the large-block size).
    pub bs: ByteSize,
    /// I/Os in flight per worker.
    pub qd: u32,
    /// Worker threads (for kv: client threads, each an io_uring ring or a psync service
    /// thread; 0 = one ring per CPU, or ACT's 5 service threads per CPU).
    pub workers: u32,
    pub engine: EngineKind,
    #[serde(
        default = "uniform",
        serialize_with = "ser_display",
        deserialize_with = "de_from_str"
    )]
    pub distribution: Distribution,
    /// Total I/Os per second over all workers; absent for a closed loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_iops: Option<u64>,
    /// Size of the temp file (or of the region used on an existing target).
    pub size: ByteSize,
    /// Measured time.
    pub duration: Span,
    /// Time run before measuring starts, excluded from the results.
    #[serde(default = "zero_span")]
    pub ramp: Span,
    /// O_DIRECT (bypass the page cache).
    #[serde(default = "default_true")]
    pub direct: bool,
    /// Queued I/Os handed to the kernel per submission (fio's iodepth_batch_submit). 1 submits
    /// each I/O at once, which keeps a paravirtual device busiest; larger batches save syscalls.
    #[serde(default = "one")]
    pub submit_batch: u32,
    /// The key-value store's settings (`pattern = "kv"` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv: Option<KvSpec>,
    /// Whether `resolve` chose `workers` (the spec said 0), so that an engine given on the
    /// command line chooses again for its own engine (ACT's 5 psync threads per CPU).
    #[serde(skip)]
    pub workers_chosen: WorkersChosen,
}

/// Whether a spec's worker count was chosen for its engine rather than written. How the count
/// came about is not part of what the spec is: two specs with the same fields are equal.
#[derive(Clone, Copy, Debug, Default)]
pub struct WorkersChosen(pub bool);

impl PartialEq for WorkersChosen {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// A spec together with where it came from and its original text.
#[derive(Clone, Debug)]
pub struct LoadedSpec {
    pub spec: WorkloadSpec,
    /// "preset rand4k" or the file path.
    pub origin: String,
    /// The preset or file text exactly as read.
    pub source_text: String,
}

/// Looks up a preset by name.
pub fn preset_text(name: &str) -> Option<&'static str> {
    PRESETS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// The largest workload file read: a hand-written spec is a few hundred bytes; past this the
/// file named is not one, and reading it whole could take all memory (`-w /dev/zero`).
pub const MAX_WORKLOAD_FILE_BYTES: u64 = 1 << 20;

/// Resolves `name_or_path`: a preset name, or a path to a TOML file (anything containing a '/'
/// or ending in ".toml", or an existing file).
pub fn load(name_or_path: &str) -> Result<LoadedSpec, SpecError> {
    let looks_like_path = name_or_path.contains('/')
        || name_or_path.ends_with(".toml")
        || (preset_text(name_or_path).is_none() && Path::new(name_or_path).is_file());
    if !looks_like_path {
        let text = preset_text(name_or_path)
            .ok_or_else(|| SpecError::UnknownPreset(name_or_path.to_string()))?;
        let origin = format!("preset {name_or_path}");
        let spec = parse(text, &origin)?;
        return Ok(LoadedSpec {
            spec,
            origin,
            source_text: text.to_string(),
        });
    }
    let read_err = |err: std::io::Error| SpecError::Read {
        path: name_or_path.to_string(),
        err,
    };
    let bytes = crate::input::read_bounded(Path::new(name_or_path), MAX_WORKLOAD_FILE_BYTES)
        .map_err(|e| read_err(e.into()))?;
    let text = String::from_utf8(bytes).map_err(|_| {
        read_err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "it is not UTF-8 text",
        ))
    })?;
    let spec = parse(&text, name_or_path)?;
    Ok(LoadedSpec {
        spec,
        origin: name_or_path.to_string(),
        source_text: text,
    })
}

/// Parses and validates TOML text; errors name the key and its line.
pub fn parse(text: &str, origin: &str) -> Result<WorkloadSpec, SpecError> {
    let spec: WorkloadSpec = toml::from_str(text).map_err(|e| SpecError::Parse {
        origin: origin.to_string(),
        message: describe_toml_error(&e, text),
    })?;
    spec.validate().map_err(|e| match e {
        SpecError::Invalid {
            key, value, reason, ..
        } => {
            let line = line_of_key(text, key)
                .map(|l| format!(":{l}"))
                .unwrap_or_default();
            SpecError::Invalid {
                origin: format!("{origin}{line}: "),
                key,
                value,
                reason,
            }
        }
        other => other,
    })?;
    let mut spec = spec;
    spec.resolve();
    Ok(spec)
}

fn describe_toml_error(e: &toml::de::Error, text: &str) -> String {
    let msg = e.message().trim().to_string();
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!("line {line}: {msg}")
        }
        None => msg,
    }
}

/// 1-based line where `key = ...` is set, if it is.
fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            let l = l.trim_start();
            l.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map(|i| i + 1)
}

impl WorkloadSpec {
    fn invalid(
        key: &'static str,
        value: impl fmt::Display,
        reason: impl Into<String>,
    ) -> SpecError {
        SpecError::Invalid {
            origin: String::new(),
            key,
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    /// Checks every value is usable; the error names the first key at fault.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.validate_labels()?;
        self.validate_io()?;
        self.validate_size()?;
        self.validate_times()?;
        self.validate_pacing()?;
        self.validate_kv()
    }

    /// The name and description.
    fn validate_labels(&self) -> Result<(), SpecError> {
        // Names and descriptions are labels: one short line of text (which also keeps them
        // within what the TOML writer escapes correctly).
        for (key, text, max) in [
            ("name", &self.name, 64),
            ("description", &self.description, 200),
        ] {
            if text.chars().count() > max || text.chars().any(char::is_control) {
                return Err(Self::invalid(
                    key,
                    format!("{:?}", text.chars().take(40).collect::<String>()),
                    format!("must be one line of at most {max} characters"),
                ));
            }
        }
        Ok(())
    }

    /// The I/Os each worker issues: queue depth, worker count, block size, read share.
    fn validate_io(&self) -> Result<(), SpecError> {
        if self.qd == 0 || self.qd > MAX_QD {
            return Err(Self::invalid(
                "qd",
                self.qd,
                format!("queue depth must be 1..={MAX_QD}"),
            ));
        }
        let auto_workers = self.workers == 0 && self.pattern == Pattern::Kv;
        if (self.workers == 0 && !auto_workers) || self.workers > MAX_WORKERS {
            return Err(Self::invalid(
                "workers",
                self.workers,
                format!("worker count must be 1..={MAX_WORKERS}"),
            ));
        }
        let bs = self.bs.0;
        if bs == 0 || bs > MAX_BS {
            return Err(Self::invalid(
                "bs",
                self.bs,
                "block size must be between 512 B and 64 MiB",
            ));
        }
        if self.direct && !bs.is_multiple_of(512) {
            return Err(Self::invalid(
                "bs",
                self.bs,
                "O_DIRECT needs a multiple of 512 B (the device's logical block size is checked too)",
            ));
        }
        if self.rwmix_read > 100 {
            return Err(Self::invalid(
                "rwmix_read",
                self.rwmix_read,
                "a percentage must be 0..=100",
            ));
        }
        Ok(())
    }

    /// The target's size, bounded and large enough for the workers (or the kv store).
    fn validate_size(&self) -> Result<(), SpecError> {
        let bs = self.bs.0;
        if self.size.0 == 0 || self.size.0 > MAX_SIZE {
            return Err(Self::invalid(
                "size",
                self.size,
                "size must be above zero and at most 1 PiB",
            ));
        }
        let (min_size, what) = if self.pattern == Pattern::Kv {
            (
                bs.saturating_mul(4),
                "the kv store needs at least 4 large blocks",
            )
        } else {
            (
                bs.saturating_mul(u64::from(self.workers)),
                "must hold at least one block per worker",
            )
        };
        if self.size.0 < min_size {
            return Err(Self::invalid(
                "size",
                self.size,
                format!("{what} ({})", ByteSize(min_size)),
            ));
        }
        Ok(())
    }

    /// The measured duration and the ramp: above zero, and within a year.
    fn validate_times(&self) -> Result<(), SpecError> {
        if self.duration.0.is_zero() {
            return Err(Self::invalid(
                "duration",
                "0s",
                "the measured duration must be above zero",
            ));
        }
        if self.duration.0 > Duration::from_secs(366 * 24 * 3600) {
            return Err(Self::invalid(
                "duration",
                humantime::format_duration(self.duration.0),
                "longer than a year; pick a shorter run",
            ));
        }
        if self.ramp.0 > Duration::from_secs(366 * 24 * 3600) {
            return Err(Self::invalid(
                "ramp",
                humantime::format_duration(self.ramp.0),
                "longer than a year; pick a shorter warm-up",
            ));
        }
        Ok(())
    }

    /// Submission batches and open-loop pacing.
    fn validate_pacing(&self) -> Result<(), SpecError> {
        if self.submit_batch == 0 || self.submit_batch > self.qd {
            return Err(Self::invalid(
                "submit_batch",
                self.submit_batch,
                format!("must be 1..=qd ({})", self.qd),
            ));
        }
        if let Some(rate) = self.rate_iops {
            if rate == 0 {
                return Err(Self::invalid(
                    "rate_iops",
                    rate,
                    "must be above zero; remove the key for a closed-loop run",
                ));
            }
            if rate > MAX_RATE_IOPS {
                return Err(Self::invalid(
                    "rate_iops",
                    rate,
                    format!("beyond any device: give at most {MAX_RATE_IOPS} I/Os per second"),
                ));
            }
        }
        Ok(())
    }

    fn validate_kv(&self) -> Result<(), SpecError> {
        let Some(kv) = &self.kv else {
            if self.pattern == Pattern::Kv {
                return Err(Self::invalid(
                    "pattern",
                    "kv",
                    "a kv workload needs a [kv] table (see `virtgap workloads kv-act`)",
                ));
            }
            return Ok(());
        };
        if self.pattern != Pattern::Kv {
            return Err(Self::invalid(
                "pattern",
                self.fio_rw(),
                "a [kv] table needs pattern = \"kv\"",
            ));
        }
        if self.engine == EngineKind::Null {
            return Err(Self::invalid(
                "engine",
                self.engine.name(),
                "a kv store does real I/O: engine = \"io_uring\" (rings) or \"psync\" (ACT's synchronous service threads)",
            ));
        }
        if self.engine == EngineKind::Psync && self.qd != 1 {
            return Err(Self::invalid(
                "qd",
                self.qd,
                "kv psync service threads do one operation at a time like ACT's: qd = 1 (set workers for concurrency)",
            ));
        }
        if !self.direct {
            return Err(Self::invalid(
                "direct",
                "false",
                "the kv store does O_DIRECT I/O only",
            ));
        }
        if self.rate_iops.is_some() {
            return Err(Self::invalid(
                "rate_iops",
                self.rate_iops.unwrap_or(0),
                "kv is paced by its client rates (x, read_rps, write_rps)",
            ));
        }
        kv.validate(self.bs.0)
            .map_err(|(key, value, reason)| Self::invalid(key, value, reason))
    }

    /// Fills in what a kv spec leaves to the machine and its rates: the client-thread count
    /// when 0 (one io_uring ring per CPU, or ACT's 5 psync service threads per CPU) and the
    /// read/write mix.
    pub fn resolve(&mut self) {
        let Some(kv) = &self.kv else { return };
        if self.workers == 0 {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
            let per_cpu = if self.engine == EngineKind::Psync {
                5
            } else {
                1
            };
            self.workers = (per_cpu * cpus).min(MAX_WORKERS);
            self.workers_chosen = WorkersChosen(true);
        }
        let (reads, writes) = kv.rates();
        self.rw = if writes == 0 {
            ReadWrite::Read
        } else {
            ReadWrite::Mix
        };
        self.rwmix_read =
            (u128::from(reads) * 100 / (u128::from(reads) + u128::from(writes)).max(1)) as u8;
    }

    /// Serializes the spec back to TOML (the effective spec, after overrides).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a workload spec always serializes")
    }

    /// Memory the run's workers hold whatever the target: an I/O buffer per queue slot, and a
    /// few latency histograms each (about 40 KiB apiece). A kv store's index and write buffers
    /// come on top and depend on the target's size.
    pub fn worker_memory_bytes(&self) -> u64 {
        const PER_WORKER_BOOKKEEPING: u64 = 512 << 10;
        u64::from(self.workers)
            .saturating_mul(u64::from(self.qd).saturating_mul(self.bs.0) + PER_WORKER_BOOKKEEPING)
    }

    /// Whether the workload never writes the target (a kv store always does: it loads itself).
    pub fn is_read_only(&self) -> bool {
        self.rw == ReadWrite::Read && self.pattern != Pattern::Kv
    }

    /// fio's `--rw` value for this spec.
    pub fn fio_rw(&self) -> &'static str {
        match (self.pattern, self.rw) {
            (Pattern::Random, ReadWrite::Read) => "randread",
            (Pattern::Random, ReadWrite::Write) => "randwrite",
            (Pattern::Random, ReadWrite::Mix) => "randrw",
            (Pattern::Sequential, ReadWrite::Read) => "read",
            (Pattern::Sequential, ReadWrite::Write) => "write",
            (Pattern::Sequential, ReadWrite::Mix) => "rw",
            (Pattern::Kv, _) => "kv",
        }
    }

    /// A one-line description: "random read, bs 4 KiB, qd 32 x 1 worker, io_uring, O_DIRECT".
    pub fn describe(&self) -> String {
        if let Some(kv) = &self.kv {
            return format!(
                "kv store: {}, {} service threads, {} keys",
                kv.describe(self.bs.0),
                self.workers,
                self.distribution
            );
        }
        let pattern = match self.pattern {
            Pattern::Random => "random",
            Pattern::Sequential => "sequential",
            Pattern::Kv => "kv",
        };
        let rw = match self.rw {
            ReadWrite::Read => "read".to_string(),
            ReadWrite::Write => "write".to_string(),
            ReadWrite::Mix => format!(
                "{}% read / {}% write",
                self.rwmix_read,
                100 - self.rwmix_read
            ),
        };
        let workers = if self.workers == 1 {
            "worker"
        } else {
            "workers"
        };
        let mut s = format!(
            "{pattern} {rw}, bs {}, qd {} x {} {workers}, {}, {}",
            crate::units::bytes(self.bs.0),
            self.qd,
            self.workers,
            self.engine.name(),
            if self.direct { "O_DIRECT" } else { "buffered" }
        );
        if self.pattern == Pattern::Random && self.distribution != Distribution::Uniform {
            s.push_str(&format!(", {}", self.distribution));
        }
        if let Some(rate) = self.rate_iops {
            s.push_str(&format!(", paced at {rate} IOPS"));
        }
        s
    }

    /// The fio command line that runs the same job on `on`, each argument shell-quoted so
    /// that any name or path pastes into a shell as one word (None for kv: fio has no
    /// log-structured store).
    pub fn fio_command(&self, on: &FioTarget<'_>) -> Option<String> {
        let words = self.fio_argv(on)?;
        let quoted: Vec<String> = words
            .iter()
            .map(|w| match w.split_once('=') {
                // `--filename='a b'`: the option stays readable, its value is quoted.
                Some((opt, value)) if opt.starts_with("--") && is_plain_option(opt) => {
                    format!("{opt}={}", shell_word(value))
                }
                _ => shell_word(w),
            })
            .collect();
        Some(quoted.join(" "))
    }

    /// The fio argument vector that runs the same job on `on`, unquoted (None for kv).
    pub fn fio_argv(&self, on: &FioTarget<'_>) -> Option<Vec<String>> {
        if self.pattern == Pattern::Kv {
            return None;
        }
        let FioTarget {
            filename,
            size,
            existing,
        } = *on;
        let mut args = vec![
            "fio".to_string(),
            format!("--name={}", self.name),
            format!("--filename={filename}"),
            format!("--direct={}", u8::from(self.direct)),
            format!("--ioengine={}", self.engine.name()),
            format!("--rw={}", self.fio_rw()),
            format!("--bs={}", self.bs.0),
            format!("--iodepth={}", self.qd),
            format!("--numjobs={}", self.workers),
        ];
        if self.rw == ReadWrite::Mix {
            args.push(format!("--rwmixread={}", self.rwmix_read));
        }
        match self.pattern {
            Pattern::Random => {
                args.push(format!("--size={size}"));
                args.push("--norandommap".into());
                args.push("--randrepeat=0".into());
                if let Distribution::Zipf(t) = self.distribution {
                    args.push(format!("--random_distribution=zipf:{t}"));
                }
            }
            Pattern::Kv => {}
            Pattern::Sequential => {
                // Each worker owns a disjoint region, as ours do.
                let region = size / u64::from(self.workers) / self.bs.0 * self.bs.0;
                args.push(format!("--size={region}"));
                args.push(format!("--offset_increment={region}"));
            }
        }
        if self.engine == EngineKind::IoUring {
            args.push("--registerfiles".into());
            args.push("--fixedbufs".into());
        }
        if let Some(rate) = self.rate_iops {
            args.push(format!(
                "--rate_iops={}",
                (rate / u64::from(self.workers)).max(1)
            ));
            args.push("--io_submit_mode=offload".into());
        }
        if self.submit_batch > 1 {
            args.push(format!("--iodepth_batch_submit={}", self.submit_batch));
        }
        // fio lays out (and may grow) a file it is allowed to write: a read-only job on a file
        // or device that exists must not touch it.
        if existing && self.is_read_only() {
            args.push("--readonly".into());
        }
        args.push("--time_based".into());
        args.push(format!("--runtime={}", self.duration.0.as_secs().max(1)));
        if !self.ramp.0.is_zero() {
            args.push(format!("--ramp_time={}", self.ramp.0.as_secs().max(1)));
        }
        args.push("--group_reporting".into());
        args.push("--output-format=json".into());
        Some(args)
    }
}

/// What fio runs a job on: the path, the bytes of it the run spans (the whole of an existing
/// file or device unless `--size` narrowed it), and whether it exists already (then a read
/// job gets `--readonly`).
#[derive(Clone, Copy, Debug)]
pub struct FioTarget<'a> {
    pub filename: &'a str,
    pub size: u64,
    pub existing: bool,
}

/// An option name that needs no quoting: `--` then letters, digits, `_` and `-`.
fn is_plain_option(opt: &str) -> bool {
    opt.len() > 2
        && opt[2..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `text` as one POSIX shell word. A NUL cannot be passed in an argument at all; no name or path
/// that reaches here holds one (spec names refuse control characters, paths come from argv), and
/// it is dropped rather than let the quoting fail.
fn shell_word(text: &str) -> String {
    match shlex::try_quote(text) {
        Ok(word) => word.into_owned(),
        Err(_) => shell_word(&text.replace('\0', "")),
    }
}

/// Command-line overrides; `None` keeps the spec's value.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub rw: Option<ReadWrite>,
    pub rwmix_read: Option<u8>,
    pub bs: Option<ByteSize>,
    pub qd: Option<u32>,
    pub workers: Option<u32>,
    pub engine: Option<EngineKind>,
    pub distribution: Option<Distribution>,
    pub rate_iops: Option<u64>,
    pub size: Option<ByteSize>,
    pub duration: Option<Span>,
    pub ramp: Option<Span>,
    pub direct: Option<bool>,
    pub submit_batch: Option<u32>,
    pub kv: KvOverrides,
    /// Each flag's value as the user typed it ("--ramp", "100y"): an error about that flag
    /// quotes it instead of the parsed value's own spelling.
    pub typed: Vec<(&'static str, String)>,
}

impl Overrides {
    /// Applies the overrides and re-validates; errors name the command-line flag.
    /// On error `spec` is left unchanged.
    pub fn apply(&self, spec: &mut WorkloadSpec) -> Result<(), SpecError> {
        let mut next = spec.clone();
        if self.engine.is_some() && self.workers.is_none() && next.workers_chosen.0 {
            next.workers = 0;
        }
        macro_rules! set {
            ($($field:ident),*) => { $( if let Some(v) = self.$field { next.$field = v; } )* };
        }
        set!(
            rw,
            rwmix_read,
            bs,
            qd,
            workers,
            engine,
            distribution,
            size,
            duration,
            ramp,
            direct,
            submit_batch
        );
        if let Some(r) = self.rate_iops {
            next.rate_iops = Some(r);
        }
        if self.rwmix_read.is_some() && self.rw.is_none() {
            next.rw = ReadWrite::Mix;
        }
        match (&mut next.kv, self.kv.first_given()) {
            (Some(kv), _) => {
                self.kv.apply(kv);
                // ACT's synchronous threads do one operation at a time: `--engine psync`
                // alone switches a kv workload to them.
                if self.engine == Some(EngineKind::Psync) && self.qd.is_none() {
                    next.qd = 1;
                }
                if let Some(lb) = self.kv.lb_bytes {
                    next.bs = lb;
                }
                if let Some(keys) = self.kv.keys {
                    next.distribution = keys;
                }
            }
            (None, Some(flag)) => {
                return Err(SpecError::NotKv {
                    flag,
                    workload: next.name.clone(),
                })
            }
            (None, None) => {}
        }
        next.validate().map_err(|e| match e {
            SpecError::Invalid {
                key, value, reason, ..
            } => {
                let flag = flag_for_key(key, next.kv.is_some());
                let value = self
                    .typed
                    .iter()
                    .find(|(f, _)| *f == flag)
                    .map_or(value, |(_, text)| text.clone());
                SpecError::Invalid {
                    origin: String::new(),
                    key: flag,
                    value,
                    reason,
                }
            }
            other => other,
        })?;
        next.resolve();
        *spec = next;
        Ok(())
    }
}

/// The command-line flag that sets a spec key (keys no flag sets, such as `name`, stay as
/// they are).
fn flag_for_key(key: &'static str, kv: bool) -> &'static str {
    match key {
        "bs" if kv => "--lb-bytes",
        "distribution" if kv => "--keys",
        "qd" => "--qd",
        "workers" => "--workers",
        "bs" => "--bs",
        "size" => "--size",
        "duration" => "--duration",
        "ramp" => "--ramp",
        "rw" => "--rw",
        "engine" => "--engine",
        "distribution" => "--distribution",
        "direct" => "--buffered",
        "rate_iops" => "--rate-iops",
        "rwmix_read" => "--rwmix-read",
        "submit_batch" => "--submit-batch",
        "x" => "--x",
        "read_rps" => "--read-rps",
        "write_rps" => "--write-rps",
        "ratio" => "--ratio",
        "defrag_lwm_pct" => "--defrag-lwm-pct",
        "fill_pct" => "--fill-pct",
        "record_bytes" | "record_bytes_max" => "--record-bytes",
        "slice" => "--slice",
        "max_lag" => "--max-lag",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::spec::RecordBytes;

    #[test]
    fn every_preset_parses_and_validates() {
        for (name, text) in PRESETS {
            let spec = parse(text, name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(&spec.name, name, "preset {name} names itself");
            assert!(
                !spec.description.is_empty(),
                "preset {name} has a description"
            );
        }
        assert!(preset_text(DEFAULT_PRESET).is_some());
    }

    #[test]
    fn default_preset_is_random_4k_reads_at_qd32() {
        let spec = load(DEFAULT_PRESET).unwrap().spec;
        assert_eq!(spec.pattern, Pattern::Random);
        assert_eq!(spec.rw, ReadWrite::Read);
        assert_eq!(spec.bs, ByteSize(4096));
        assert_eq!(spec.qd, 32);
        assert_eq!(spec.engine, EngineKind::IoUring);
        assert_eq!(spec.size, ByteSize(1 << 30));
    }

    #[test]
    fn unknown_preset_is_named() {
        let e = load("rand5k").unwrap_err().to_string();
        assert!(e.contains("unknown workload preset 'rand5k'"), "{e}");
    }

    #[test]
    fn unknown_key_reports_key_and_line() {
        let text = preset_text("rand4k")
            .unwrap()
            .replace("qd = 32", "queue_depth = 32");
        let e = parse(&text, "my.toml").unwrap_err().to_string();
        assert!(e.contains("queue_depth"), "{e}");
        assert!(e.contains("line "), "{e}");
    }

    #[test]
    fn bad_value_reports_key_and_line() {
        let text = preset_text("rand4k")
            .unwrap()
            .replace("bs = \"4KiB\"", "bs = \"4 potatoes\"");
        let e = parse(&text, "my.toml").unwrap_err().to_string();
        let line = line_of_key(&text, "bs").unwrap();
        assert!(e.contains(&format!("line {line}")), "{e}");
        assert!(e.contains("4 potatoes"), "{e}");
    }

    #[test]
    fn zero_qd_in_a_file_names_key_and_line() {
        let text = preset_text("rand4k").unwrap().replace("qd = 32", "qd = 0");
        let e = parse(&text, "my.toml").unwrap_err().to_string();
        let line = line_of_key(&text, "qd").unwrap();
        assert!(e.starts_with(&format!("my.toml:{line}: qd = 0:")), "{e}");
    }

    #[test]
    fn overrides_are_validated_and_name_the_flag() {
        let mut spec = load("rand4k").unwrap().spec;
        let e = Overrides {
            qd: Some(0),
            ..Default::default()
        }
        .apply(&mut spec)
        .unwrap_err();
        assert!(e.to_string().starts_with("--qd = 0"), "{e}");
        let e = Overrides {
            bs: Some(ByteSize(1000)),
            ..Default::default()
        }
        .apply(&mut spec)
        .unwrap_err();
        assert!(e.to_string().contains("multiple of 512"), "{e}");
        let e = Overrides {
            duration: Some(Span(Duration::ZERO)),
            ..Default::default()
        }
        .apply(&mut spec)
        .unwrap_err();
        assert!(e.to_string().starts_with("--duration"), "{e}");
    }

    #[test]
    fn rwmix_override_implies_mix() {
        let mut spec = load("rand4k").unwrap().spec;
        Overrides {
            rwmix_read: Some(50),
            ..Default::default()
        }
        .apply(&mut spec)
        .unwrap();
        assert_eq!(spec.rw, ReadWrite::Mix);
        assert_eq!(spec.fio_rw(), "randrw");
    }

    #[test]
    fn absurd_sizes_are_refused() {
        let mut spec = load("rand4k").unwrap().spec;
        let e = Overrides {
            size: Some(ByteSize(1 << 60)),
            ..Default::default()
        }
        .apply(&mut spec)
        .unwrap_err();
        assert!(e.to_string().contains("1 PiB"), "{e}");
    }

    #[test]
    fn spec_round_trips_through_toml() {
        for (name, text) in PRESETS {
            let spec = parse(text, name).unwrap();
            let again = parse(&spec.to_toml(), name).unwrap();
            assert_eq!(spec, again, "{name}");
        }
    }

    #[test]
    fn fio_command_mirrors_the_job() {
        let spec = load("fio-randread").unwrap().spec;
        let on = |size| FioTarget {
            filename: "/data/f",
            size,
            existing: true,
        };
        let cmd = spec.fio_command(&on(16 << 20)).unwrap();
        for part in [
            "--size=16777216",
            "--readonly",
            "--rw=randread",
            "--bs=4096",
            "--iodepth=32",
            "--ioengine=io_uring",
            "--direct=1",
            "--filename=/data/f",
            "--registerfiles",
            "--fixedbufs",
        ] {
            assert!(cmd.contains(part), "{cmd} lacks {part}");
        }
        let seq = load("seq1m").unwrap().spec;
        assert!(seq
            .fio_command(&on(1 << 30))
            .unwrap()
            .contains("--offset_increment="));
        assert_eq!(load("kv-act").unwrap().spec.fio_command(&on(1 << 30)), None);
        // A new file fio creates and lays out itself: not read-only.
        let new = FioTarget {
            existing: false,
            ..on(1 << 30)
        };
        assert!(!spec.fio_command(&new).unwrap().contains("--readonly"));
    }

    #[test]
    fn kv_presets_resolve_threads_and_mix() {
        let spec = load("kv-act").unwrap().spec;
        let cpus = std::thread::available_parallelism().unwrap().get() as u32;
        assert_eq!(spec.engine, EngineKind::IoUring);
        assert_eq!(spec.workers, cpus, "one ring per CPU");
        let mut psync = load("kv-act").unwrap().spec;
        Overrides {
            engine: Some(EngineKind::Psync),
            ..Default::default()
        }
        .apply(&mut psync)
        .unwrap();
        assert_eq!(psync.workers, 5 * cpus, "ACT's 5 service threads per CPU");
        assert_eq!(psync.qd, 1, "--engine psync alone is enough for kv");
        // A count the user gave stays, whichever engine runs it.
        let mut given = load("kv-act").unwrap().spec;
        Overrides {
            engine: Some(EngineKind::Psync),
            workers: Some(3),
            ..Default::default()
        }
        .apply(&mut given)
        .unwrap();
        assert_eq!(given.workers, 3);
        let mut back = psync.clone();
        Overrides {
            engine: Some(EngineKind::IoUring),
            qd: Some(64),
            ..Default::default()
        }
        .apply(&mut back)
        .unwrap();
        assert_eq!(back.workers, cpus, "back to one ring per CPU");
        assert_eq!(spec.rw, ReadWrite::Mix);
        assert_eq!(spec.rwmix_read, 66);
        assert!(!spec.is_read_only(), "the store loads itself");
        let ro = load("kv-readonly").unwrap().spec;
        assert_eq!(ro.kv.as_ref().unwrap().rates(), (2000, 0));
        assert_eq!(ro.rw, ReadWrite::Read);
        // The effective spec (what a profile embeds) reads back the same.
        assert_eq!(parse(&spec.to_toml(), "effective").unwrap(), spec);
    }

    #[test]
    fn kv_bad_input_names_the_flag() {
        let base = load("kv-act").unwrap().spec;
        let try_kv = |kv: KvOverrides| {
            let mut s = base.clone();
            Overrides {
                kv,
                ..Default::default()
            }
            .apply(&mut s)
            .map(|()| s)
            .unwrap_err()
            .to_string()
        };
        let e = try_kv(KvOverrides {
            x: Some(0),
            ..Default::default()
        });
        assert!(e.starts_with("--x") && e.contains("no load"), "{e}");
        let e = try_kv(KvOverrides {
            record_bytes: Some(RecordBytes {
                min: ByteSize(256 << 10),
                max: None,
            }),
            ..Default::default()
        });
        assert!(
            e.starts_with("--record-bytes") && e.contains("fit one large block"),
            "{e}"
        );
        let e = try_kv(KvOverrides {
            defrag_lwm_pct: Some(0),
            ..Default::default()
        });
        assert!(e.starts_with("--defrag-lwm-pct"), "{e}");
        let e = try_kv(KvOverrides {
            lb_bytes: Some(ByteSize(100 << 10)),
            ..Default::default()
        });
        assert!(
            e.starts_with("--lb-bytes") && e.contains("power of two"),
            "{e}"
        );
        // kv flags on another workload are refused, not ignored.
        let mut rand = load("rand4k").unwrap().spec;
        let e = Overrides {
            kv: KvOverrides {
                x: Some(2),
                ..Default::default()
            },
            ..Default::default()
        }
        .apply(&mut rand)
        .unwrap_err()
        .to_string();
        assert!(e.contains("only to kv workloads"), "{e}");
    }

    #[test]
    fn fio_command_is_one_shell_word_per_argument() {
        let mut spec = load("rand4k").unwrap().spec;
        for (name, file) in [
            ("x; id #", "/tmp/x; echo INJECTED #"),
            ("$(id)", "/tmp/`id` 'q' \"d\" $HOME\nline2"),
            ("plain", "/data/f"),
            ("", "-"),
        ] {
            spec.name = name.into();
            let on = FioTarget {
                filename: file,
                size: 1 << 30,
                existing: false,
            };
            let argv = spec.fio_argv(&on).unwrap();
            assert!(argv.contains(&format!("--filename={file}")), "{argv:?}");
            assert!(argv.contains(&format!("--name={name}")), "{argv:?}");
            let line = spec.fio_command(&on).unwrap();
            assert_eq!(shlex::split(&line), Some(argv), "{line}");
        }
        spec.name = "rand4k".into();
        assert_eq!(
            spec.fio_command(&FioTarget {
                filename: "/data/f",
                size: 1 << 30,
                existing: false
            })
            .unwrap()
            .split(' ')
            .nth(2),
            Some("--filename=/data/f"),
            "plain words stay unquoted"
        );
    }

    #[test]
    fn rates_past_toml_integers_are_refused_before_anything_runs() {
        let mut spec = load("rand4k").unwrap().spec;
        let e = Overrides {
            rate_iops: Some(9_223_372_036_854_775_808),
            ..Default::default()
        }
        .apply(&mut spec)
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("--rate-iops = 9223372036854775808: "), "{e}");
        assert!(!e.contains('\n'), "{e}");
        // Every integer a spec serializes is bounded by validation, so to_toml cannot fail.
        let mut fast = load("rand4k").unwrap().spec;
        Overrides {
            rate_iops: Some(MAX_RATE_IOPS),
            ..Default::default()
        }
        .apply(&mut fast)
        .unwrap();
        assert!(fast.to_toml().contains("rate_iops = 1000000000"));
        let text = preset_text("rand4k").unwrap().to_string() + "rate_iops = 9223372036854775807\n";
        let e = parse(&text, "my.toml").unwrap_err().to_string();
        assert!(e.contains("rate_iops = 9223372036854775807"), "{e}");
        let kv = load("kv-act").unwrap().spec;
        for kv_overrides in [
            KvOverrides {
                x: Some(u64::MAX),
                ..Default::default()
            },
            KvOverrides {
                read_rps: Some(u64::MAX),
                ..Default::default()
            },
            KvOverrides {
                write_rps: Some(u64::MAX),
                ..Default::default()
            },
            KvOverrides {
                fill_pct: Some(u64::MAX),
                ..Default::default()
            },
            KvOverrides {
                defrag_lwm_pct: Some(u64::MAX),
                ..Default::default()
            },
        ] {
            let mut s = kv.clone();
            let o = Overrides {
                kv: kv_overrides,
                ..Default::default()
            };
            assert!(o.apply(&mut s).is_err(), "{o:?}");
        }
    }

    #[test]
    fn errors_name_the_flag_given_and_its_value_as_typed() {
        let kv = load("kv-act").unwrap().spec;
        let e = Overrides {
            kv: KvOverrides {
                read_rps: Some(1_000_000_001),
                ..Default::default()
            },
            ..Default::default()
        }
        .apply(&mut kv.clone())
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("--read-rps = 1000000001: "), "{e}");
        let e = Overrides {
            kv: KvOverrides {
                write_rps: Some(2_000_000_000),
                ..Default::default()
            },
            ..Default::default()
        }
        .apply(&mut kv.clone())
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("--write-rps = 2000000000: "), "{e}");
        let e = Overrides {
            kv: KvOverrides {
                x: Some(100_001),
                ..Default::default()
            },
            ..Default::default()
        }
        .apply(&mut kv.clone())
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("--x = 100001: "), "{e}");

        let mut spec = load("rand4k").unwrap().spec;
        let hundred_years: Span = "100y".parse().unwrap();
        let e = Overrides {
            ramp: Some(hundred_years),
            typed: vec![("--ramp", "100y".into())],
            ..Default::default()
        }
        .apply(&mut spec)
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("--ramp = 100y: longer than a year"), "{e}");
        // Without the text as typed, the flag is still named.
        let e = Overrides {
            ramp: Some(hundred_years),
            ..Default::default()
        }
        .apply(&mut spec)
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("--ramp = "), "{e}");
        let e = Overrides {
            qd: Some(u32::MAX),
            typed: vec![("--qd", "5000000000".into())],
            ..Default::default()
        }
        .apply(&mut spec)
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("--qd = 5000000000: "), "{e}");
    }
}
