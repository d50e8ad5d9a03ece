//! The command line (clap derive). Every flag says what it does and its unit.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use virtgap_workloads::kv::spec::{KvOverrides, Ratio, RecordBytes};
use virtgap_workloads::spec::{ByteSize, Distribution, EngineKind, Overrides, ReadWrite, Span};

#[derive(Debug, Parser)]
#[command(
    name = "virtgap",
    version,
    about = "Find where a VM's storage latency goes: run a workload, trace each I/O, compare hosts",
    long_about = "virtgap runs a built-in storage workload (random 4 KiB, sequential 1 MiB, ...) and \
measures where each I/O's time goes. Record a profile on two hosts and compare them to see which \
stage makes one slower.\n\nNeeds root (or CAP_BPF + CAP_PERFMON) for tracing.",
    after_help = "Examples:\n  virtgap                                    the live TUI on the default workload\n  \
virtgap record --duration 10s            random 4 KiB reads on a 1 GiB temp file\n  \
virtgap record -w seq1m --json            sequential 1 MiB reads, fio-style JSON on stdout\n  \
virtgap record -w kv-act --x 4             Aerospike ACT's load at 4x and its pass/fail verdict\n  \
virtgap workloads                          list presets\n  virtgap workloads rand4k > my.toml          \
copy a preset to edit, then: virtgap record -w ./my.toml"
)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Without a command: the live TUI, with these options (see `virtgap tui --help`)
    #[command(flatten)]
    pub tui: TuiArgs,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once
pub enum Command {
    /// The live terminal UI (what plain `virtgap` runs): the workload, traced, as it runs
    Tui(TuiArgs),
    /// Run a workload headless and print its summary (or JSON with --json)
    Record(RecordArgs),
    /// List the built-in workload presets, or print one to copy and edit
    Workloads(WorkloadsArgs),
    /// Check this host: platform fingerprint, which probes attach and how, which views degrade
    Doctor(DoctorArgs),
    /// Compare two profiles: which stage makes B slower than A, by how much, and how sure
    #[command(
        after_help = "Exit status: 0 compared (and the --fail-on condition not met); \
        1 an error (a file that cannot be read, different workloads without --force); \
        2 a usage error; 3 the --fail-on condition met."
    )]
    Diff(DiffArgs),
    /// Time exit-causing operations (cpuid, timer reprogramming, IPIs, clock reads)
    Calibrate(CalibrateArgs),
    /// Serve the probes' figures as Prometheus metrics at /metrics, continuously
    Serve(ServeArgs),
    /// Find the storage's four IOTune figures — sequential read and write bandwidth, random
    /// 4 KiB read and write IOPS — raising concurrency until each stops growing, then measuring
    /// there with the probes; writes ScyllaDB's io_properties.yaml on request
    Iotune(IotuneArgs),
    /// Print the JSON Schema of the profile files `record` writes
    Schema,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Without --pid, --cgroup or --comm every process of the host is followed (as --all).\n\
Scrape with Prometheus: scrape_configs: [{job_name: virtgap, static_configs: [{targets: ['HOST:9477']}]}]\n\
Stop with Ctrl-C or SIGTERM: the probes are detached and the process exits 0."
)]
pub struct ServeArgs {
    /// Address to serve /metrics on; 0.0.0.0:PORT or :PORT exposes it to the network
    #[arg(long, default_value = "127.0.0.1:9477", value_name = "ADDR:PORT", value_parser = parse_listen)]
    pub listen: std::net::SocketAddr,

    /// How often the probes' totals are read and the page rebuilt (100ms to 1h)
    #[arg(long, default_value = "1s", value_name = "DURATION")]
    pub interval: Span,

    /// Stop after this long, e.g. 10m [default: until Ctrl-C or SIGTERM]
    #[arg(short, long, value_name = "DURATION", value_parser = typed::<Span>)]
    pub duration: Option<Typed<Span>>,

    /// Say nothing on stderr but errors
    #[arg(short, long)]
    pub quiet: bool,

    /// Label block stages by hardware queue, and NVMe commands by queue id, too (up to 4 a
    /// device, the rest "other"): about five times the series
    #[arg(long)]
    pub per_queue: bool,

    /// Histogram buckets: fine (four per power of two, 512 ns to 17 s: 101 bounds) or coarse
    /// (one per power of two: 26 bounds); both are exact sums of the kernel's slots
    #[arg(long, value_enum, default_value = "fine", value_name = "fine|coarse")]
    pub buckets: Buckets,

    #[command(flatten)]
    pub attach: AttachArgs,

    #[command(flatten)]
    pub probe: ProbeArgs,
}

/// The Prometheus histograms' bucket bounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Buckets {
    #[default]
    Fine,
    Coarse,
}

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Also time a micro-guest's exit round trip through /dev/kvm (on a KVM host)
    #[arg(long)]
    pub host: bool,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TuiArgs {
    /// Preset name (see `virtgap workloads`) or path to a workload .toml file
    #[arg(short, long, default_value = virtgap_workloads::spec::DEFAULT_PRESET, value_name = "NAME|FILE")]
    pub workload: String,

    /// Refresh period of the screen and the probes' interval (100ms to 1h)
    #[arg(long, default_value = "1s", value_name = "DURATION")]
    pub interval: Span,

    /// Also serve the probes' figures as Prometheus metrics at http://ADDR/metrics while the
    /// run lasts (as `virtgap serve` does), e.g. 127.0.0.1:9477 (:PORT: every interface)
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_listen)]
    pub listen: Option<std::net::SocketAddr>,

    /// Show a recorded profile's stage latencies beside the live ones
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,

    /// Where `s` saves a profile [default: virtgap-<workload>-<time>.json; attached:
    /// virtgap-attached-<time>.json]
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,

    #[command(flatten)]
    pub attach: AttachArgs,

    #[command(flatten)]
    pub target: TargetArgs,

    #[command(flatten)]
    pub overrides: WorkloadOverrides,

    #[command(flatten)]
    pub probe: ProbeArgs,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// Reference profile (e.g. the bare-metal host); a directory or a quoted glob
    /// ('metal-*.json') names a group of hosts, whose runs pool as replicates. With
    /// --prometheus: a label selector of virtgap_host_info naming the reference hosts
    /// ('platform="metal"')
    pub a: PathBuf,
    /// Profile to explain (e.g. the VM); a directory or a quoted glob as for A. With
    /// --prometheus: the selector of the hosts to explain ('platform="kvm"')
    pub b: PathBuf,
    /// Another profile of host A (repeatable; a directory or quoted glob too): its runs pool
    /// with A's as replicates
    #[arg(long, value_name = "FILE")]
    pub with_a: Vec<PathBuf>,
    /// Another profile of host B (repeatable; a directory or quoted glob too): its runs pool
    /// with B's as replicates
    #[arg(long, value_name = "FILE")]
    pub with_b: Vec<PathBuf>,
    /// Smallest difference worth a verdict, in percent: rows whose 95% interval lies within
    /// ±this are "equivalent", rows beyond it "significant", the rest "inconclusive"
    #[arg(long, value_name = "PCT", default_value = "5%", value_parser = parse_min_effect)]
    pub min_effect: f64,
    /// Compare even when the two profiles ran different workloads
    #[arg(long)]
    pub force: bool,
    /// Replace existing --csv, --svg and --html files (never an input profile)
    #[arg(long)]
    pub overwrite: bool,
    /// Print Markdown instead of the terminal report
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
    /// Print the diff as JSON
    #[arg(long)]
    pub json: bool,
    /// Also write one CSV row per metric (a, b, delta, ci_low, ci_high, verdict) to FILE
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Also write the charts into DIR: percentiles.svg (each stage's latency by percentile,
    /// p50 to p99.99, every run drawn), waterfall.svg (the mean and tail waterfalls) and
    /// hypervisor.svg (each mechanism per I/O)
    #[arg(long, value_name = "DIR")]
    pub svg: Option<PathBuf>,
    /// Also write the whole diff as one self-contained HTML page to FILE: the verdict, every
    /// table, the charts and the warnings, nothing fetched (to attach to a ticket)
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Exit 3 (after the report) when the diff finds: `slower` — B significantly slower (mean
    /// or tail latency up, IOPS or an iotune figure down); `significant` — any row called
    /// significant, either way; `never` — exit 0 whatever it finds. With one run a host, or
    /// one recording a host, nothing is significant (a difference is provisional): to gate,
    /// give each side two recordings or more, made at different times (--with-a, --with-b)
    #[arg(long, value_name = "WHEN", value_enum, default_value_t = FailOn::Never)]
    pub fail_on: FailOn,
    /// Compare two groups of hosts as a Prometheus server holds them, scraped from `virtgap
    /// serve`: A and B are then label selectors, and each instance's figures over each --slice
    /// of the range are one replicate (http:// only)
    #[arg(long, value_name = "URL", conflicts_with_all = ["with_a", "with_b"])]
    pub prometheus: Option<String>,
    /// With --prometheus: how long a range to compare, ending at --until [default: 1h]
    #[arg(long, value_name = "DURATION", requires = "prometheus")]
    pub since: Option<Span>,
    /// With --prometheus: the range's end, in unix seconds or RFC 3339
    /// (2026-12-06T15:00:00Z) [default: now]
    #[arg(long, value_name = "TIME", requires = "prometheus", value_parser = parse_time)]
    pub until: Option<f64>,
    /// With --prometheus: each instance's figures over each slice this long are one replicate
    /// [default: 10m, or the whole range when shorter]
    #[arg(long, value_name = "DURATION", requires = "prometheus")]
    pub slice: Option<Span>,
}

/// A point in time as unix seconds: "1796561310" (or with a fraction) or RFC 3339.
fn parse_time(text: &str) -> Result<f64, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok(secs);
        }
    }
    humantime::parse_rfc3339_weak(text)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64())
        .ok_or_else(|| {
            format!(
                "{text:?} is not a time: give unix seconds or RFC 3339, e.g. 2026-12-06T15:00:00Z"
            )
        })
}

/// When `diff` exits non-zero on what it found, for a CI to gate on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FailOn {
    /// B is significantly slower: latency up, throughput down.
    Slower,
    /// Any row is significant, in either direction.
    Significant,
    Never,
}

/// The exit status of a diff whose `--fail-on` condition was met.
pub const FOUND_EXIT: u8 = 3;

/// A listening address as servers take it: "127.0.0.1:9477", "[::1]:9477", "localhost:9477"
/// (loopback), or ":9477" (every interface, as Prometheus' exporters read it).
fn parse_listen(text: &str) -> Result<std::net::SocketAddr, String> {
    let spelled = if let Some(port) = text.strip_prefix(':') {
        format!("0.0.0.0:{port}")
    } else if let Some(port) = text.strip_prefix("localhost:") {
        format!("127.0.0.1:{port}")
    } else {
        text.to_string()
    };
    spelled.parse().map_err(|_| {
        format!("{text:?} is not ADDR:PORT; give e.g. 127.0.0.1:9477, or :9477 for every interface")
    })
}

/// "5%" or "5" -> 0.05: a smallest effect between 0.1% and 100%.
fn parse_min_effect(text: &str) -> Result<f64, String> {
    let number = text.trim().trim_end_matches('%').trim();
    let pct: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a percentage (e.g. 5%)"))?;
    if !(0.1..=100.0).contains(&pct) {
        return Err(format!("{text:?} is out of range: give 0.1% to 100%"));
    }
    Ok(pct / 100.0)
}

#[derive(Debug, Args)]
pub struct IotuneArgs {
    /// What to measure: a directory (a temp file in it), an existing file, or a block device
    /// (an md or dm array is measured as the aggregate its members give)
    #[arg(long, value_name = "PATH")]
    pub target: PathBuf,

    /// Allow the write phases on an existing file or block device, naming it: its serial or
    /// WWN, an md array's UUID (/sys/block/mdN/md/uuid), a loop device's backing file, a file's
    /// path. They overwrite its data. Without it only the read phases run there
    #[arg(long, value_name = "IDENTITY")]
    pub destroy_data: Option<String>,

    /// Only these phases, comma-separated: read_bandwidth, write_bandwidth, read_iops,
    /// write_iops [default: all four; the write phases only where writing is allowed]
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = ["read_bandwidth", "write_bandwidth", "read_iops", "write_iops"])]
    pub phases: Option<Vec<String>>,

    /// Measured runs per phase at its saturation point: the replicates `diff` compares
    #[arg(long, default_value_t = 3, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: u32,

    /// Name this host ("vm", "metal"): shown on its side of the summary and of every diff
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,

    /// Length of each measured run
    #[arg(long, default_value = "5s", value_name = "DURATION")]
    pub duration: Span,

    /// Length of each step of the concurrency search
    #[arg(long, default_value = "2s", value_name = "DURATION")]
    pub step: Span,

    /// Time run before each step and run, left out of its figure
    #[arg(long, default_value = "500ms", value_name = "DURATION")]
    pub ramp: Span,

    /// A search step whose figure beats the best so far by less than this counts as no growth;
    /// two in a row end the search
    #[arg(long, default_value = "3%", value_name = "PCT", value_parser = parse_min_effect)]
    pub tolerance: f64,

    /// Workers (threads issuing I/O) [default: one per CPU, as a shard-per-core database does]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub workers: Option<u32>,

    /// The most I/Os in flight over all workers the search tries
    #[arg(long, default_value_t = 1024, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_in_flight: u32,

    /// Bytes of the target to use [default: 1 GiB for a temp file; all of a file or device]
    #[arg(long, value_name = "SIZE")]
    pub size: Option<ByteSize>,

    /// Write the result (each phase's search and its measured runs as a profile) to FILE, for
    /// `virtgap diff`
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Write the four figures as ScyllaDB's io_properties.yaml to FILE (needs all four phases)
    #[arg(long, value_name = "FILE")]
    pub yaml: Option<PathBuf>,

    /// Overwrite an existing --output or --yaml file
    #[arg(long)]
    pub force: bool,

    /// Print only the result, no progress
    #[arg(short, long)]
    pub quiet: bool,

    #[command(flatten)]
    pub probe: ProbeArgs,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print a JSON document instead of the table
    #[arg(long)]
    pub json: bool,
    /// Check another hypervisor's paths on this kernel: load the hypervisor probes (msr,
    /// sampler, pv-paths) as in a guest of NAME and list what each of its paths would attach
    /// to here, is absent, or why it cannot be traced
    #[arg(long, value_name = "NAME", value_parser = ["xen", "kvm", "hyperv"])]
    pub hypervisor: Option<String>,
    /// Compare the block family's own stamps with the kernel's on the same I/Os: read PATH (a
    /// file or block device, opened read-only) with O_DIRECT, both attached, and print each
    /// one's stages and cost per read
    #[arg(long, value_name = "PATH", conflicts_with = "hypervisor")]
    pub compare_stamps: Option<PathBuf>,
    /// Reads for --compare-stamps
    #[arg(long, value_name = "N", default_value_t = 2000, requires = "compare_stamps",
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub reads: u64,
}

#[derive(Debug, Args)]
pub struct WorkloadsArgs {
    /// Preset to print (as TOML, ready to save and edit)
    pub name: Option<String>,
}

/// Runs `record` makes when neither --runs nor --duration is given: the workload's measured
/// time is shared among them, so a first diff has replicates for no more time (a diff of one
/// run a side can only compare batches within a run, and between-run noise is larger here).
pub const DEFAULT_RUNS: u32 = 3;

impl RecordArgs {
    /// The runs to record: --runs, else 3 sharing the workload's duration, else (--duration
    /// given) 1.
    pub fn runs(&self) -> u32 {
        match (self.runs, &self.overrides.duration) {
            (Some(n), _) => n,
            (None, Some(_)) => 1,
            (None, None) => DEFAULT_RUNS,
        }
    }

    /// The runs share the workload's measured time (neither --runs nor --duration given).
    pub fn runs_share_duration(&self) -> bool {
        self.runs.is_none() && self.overrides.duration.is_none()
    }
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Preset name (see `virtgap workloads`) or path to a workload .toml file
    #[arg(short, long, default_value = virtgap_workloads::spec::DEFAULT_PRESET, value_name = "NAME|FILE")]
    pub workload: String,

    /// Check every sector read carries the data written there (temp-file targets only)
    #[arg(long)]
    pub verify: bool,

    /// Length of one interval sample (100ms to 1h; a run longer than 2048 intervals keeps
    /// 2048 coarser ones, each twice as long per halving, so memory stays flat)
    #[arg(long, default_value = "1s", value_name = "DURATION")]
    pub interval: Span,

    /// Also serve the probes' figures as Prometheus metrics at http://ADDR/metrics while the
    /// run lasts (as `virtgap serve` does), e.g. 127.0.0.1:9477 (:PORT: every interface)
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_listen)]
    pub listen: Option<std::net::SocketAddr>,

    /// Record N runs back to back, each on a freshly prepared target with its own ramp; the
    /// profile keeps every run, and `diff` compares runs (5 per host resolve gaps of ~5%)
    /// [default: 3 sharing the workload's duration, so a first diff has replicates; 1 when
    /// --duration is given]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: Option<u32>,

    /// Write the profile (a JSON document `virtgap diff` compares) to this file
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Also write intervals.csv, histograms.csv, summary.csv, host.csv and runs.csv into this
    /// directory
    #[arg(long, value_name = "DIR")]
    pub csv: Option<PathBuf>,

    /// Also draw each stage's latency by percentile (p50 to p99.99, each run a line) as an SVG
    /// chart in FILE
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,

    /// Overwrite an existing --output file, CSV files or --svg chart
    #[arg(long)]
    pub force: bool,

    /// Print only a JSON document on stdout, laid out like fio's --output-format=json
    #[arg(long)]
    pub json: bool,

    /// Print the fio command line that runs the same job, and exit
    #[arg(long)]
    pub fio_equivalent: bool,

    /// No progress line on stderr
    #[arg(short, long)]
    pub quiet: bool,

    /// Time exit-causing operations first and store the figures in the profile
    #[arg(long)]
    pub calibrate: bool,

    /// kv workloads: also write ACT's text log (histogram dumps every second), which ACT's
    /// act_latency.py reads
    #[arg(long, value_name = "FILE")]
    pub act_log: Option<PathBuf>,

    #[command(flatten)]
    pub target: TargetArgs,

    #[command(flatten)]
    pub overrides: WorkloadOverrides,

    #[command(flatten)]
    pub probe: ProbeArgs,

    #[command(flatten)]
    pub attach: AttachArgs,
}

/// `record` on processes already running instead of a built-in workload.
#[derive(Debug, Args)]
#[command(next_help_heading = "Attach to running processes (no workload runs)")]
pub struct AttachArgs {
    /// Measure these running processes (comma-separated pids), their threads and every child
    /// they start; the run ends at --duration, Ctrl-C, or when they have all exited
    #[arg(short, long, value_name = "PID[,PID…]", value_delimiter = ',', group = "attach_to",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub pid: Vec<u32>,

    /// Measure every process in this cgroup and below it: a directory under /sys/fs/cgroup or a
    /// path relative to it (cgroup v2, or a v1 hierarchy); a container's cgroup works from the
    /// host
    #[arg(long, value_name = "PATH", group = "attach_to")]
    pub cgroup: Option<PathBuf>,

    /// Measure every process with this name (as `ps -e -o comm` shows it) and its children
    #[arg(long, value_name = "NAME", group = "attach_to")]
    pub comm: Option<String>,

    /// Measure every process of the host (no wakeup probe: it follows processes by name)
    #[arg(long, group = "attach_to")]
    pub all: bool,

    /// Name this host (a workload run: "vm", "metal") or what was attached to ("postgres, 16
    /// clients"): shown on its side of every report, diff, chart and page
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,

    /// Count only this disk's requests, by its name in /sys/block, e.g. nvme0n1 (repeatable):
    /// the database's disk, not the root disk its processes page their programs in from
    /// [default: every disk]
    #[arg(long = "device", value_name = "NAME")]
    pub devices: Vec<String>,
}

impl AttachArgs {
    /// What to attach to, checked: the processes named are in this pid namespace and each
    /// `--device` is a disk of this host. With how many processes the target holds now (None:
    /// every process).
    pub fn plan(
        &self,
        interval: std::time::Duration,
        duration: Option<std::time::Duration>,
        probes: crate::run::session::ProbeChoice,
    ) -> anyhow::Result<(crate::run::attached::AttachPlan, Option<usize>)> {
        crate::run::attached::AttachPlan::checked(
            (self.target(), self.label.clone(), &self.devices),
            interval,
            duration,
            probes,
        )
    }

    /// Refuses `--device` for a built-in workload (no target named), whose disk is its target's.
    pub fn check_no_devices(&self) -> anyhow::Result<()> {
        if !self.devices.is_empty() {
            anyhow::bail!("--device picks the disks of processes --pid, --cgroup, --comm or --all name; a built-in workload measures the disk its --target is on");
        }
        Ok(())
    }

    /// Whether a target to attach to was named.
    pub fn any(&self) -> bool {
        !self.pid.is_empty() || self.cgroup.is_some() || self.comm.is_some() || self.all
    }

    /// The processes named (None: every process, with --all or nothing named).
    pub fn target(&self) -> Option<virtgap_probes::follow::AttachTarget> {
        use virtgap_probes::follow::AttachTarget;
        if !self.pid.is_empty() {
            Some(AttachTarget::Pids(self.pid.clone()))
        } else if let Some(cgroup) = &self.cgroup {
            Some(AttachTarget::Cgroup(cgroup.clone()))
        } else {
            self.comm.clone().map(AttachTarget::Comm)
        }
    }
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Probes")]
pub struct ProbeArgs {
    /// Run the workload without any probe attached
    #[arg(long, conflicts_with = "probes")]
    pub no_probes: bool,

    // The help names the families as the probes crate defines them.
    #[arg(long, value_name = "LIST", help = format!(
        "Probe families to attach, comma-separated: {} [default: all]",
        virtgap_probes::Family::ALL.map(virtgap_probes::Family::name).join(", ")
    ))]
    pub probes: Option<String>,

    /// Sampler rate per CPU; each sample interrupts its CPU and reprograms its timer (the
    /// MSR writes this causes are counted apart). 0 turns the sampler off
    #[arg(long, value_name = "HZ", default_value_t = 99, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub sample_hz: u64,

    /// kvm-host: count only this VMM process's exits (a pid as this shell sees it)
    /// [default: every process running a VM]
    #[arg(long, value_name = "PID")]
    pub vmm_pid: Option<u32>,

    /// Where block stage times come from: `auto`, the kernel's own request stamps read at
    /// completion (one program per request) where they are exact (before 6.9) and every
    /// device's queue stamps issues, else our own, the notes saying which and why; or `own`
    /// clock readings at a request's start, issue and completion (three programs per request,
    /// any kernel). `virtgap doctor --compare-stamps PATH` shows both on the same reads
    #[arg(long, value_enum, default_value_t = StampSource::Auto, value_name = "SOURCE")]
    pub block_stamps: StampSource,
}

/// `--block-stamps`' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StampSource {
    #[value(alias = "kernel")]
    Auto,
    Own,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Target")]
pub struct TargetArgs {
    /// Directory for the temp file [default: current directory, else $TMPDIR]
    #[arg(long, value_name = "DIR", conflicts_with = "target")]
    pub dir: Option<PathBuf>,

    /// Existing file or block device to use instead of a temp file (block devices are read-only
    /// unless --destroy-data names them)
    #[arg(long, value_name = "PATH")]
    pub target: Option<PathBuf>,

    /// Allow writes to the --target: its serial or WWN for a block device (see `lsblk -o
    /// NAME,SERIAL,WWN`), an md array's UUID (/sys/block/mdN/md/uuid), its backing file for a
    /// loop device, its path for a file
    #[arg(long, value_name = "IDENTITY")]
    pub destroy_data: Option<String>,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Workload overrides (default: the preset's values)")]
pub struct WorkloadOverrides {
    /// Measured time, e.g. 10s, 2m
    #[arg(short, long, value_name = "DURATION", value_parser = typed::<Span>)]
    pub duration: Option<Typed<Span>>,
    /// Time run before measuring, excluded from results
    #[arg(long, value_name = "DURATION", value_parser = typed::<Span>)]
    pub ramp: Option<Typed<Span>>,
    /// Temp file size, or region of --target, e.g. 1GiB
    #[arg(long, value_name = "BYTES", allow_hyphen_values = true, value_parser = typed::<ByteSize>)]
    pub size: Option<Typed<ByteSize>>,
    /// Bytes per I/O, e.g. 4k, 1MiB
    #[arg(long, value_name = "BYTES", allow_hyphen_values = true, value_parser = typed::<ByteSize>)]
    pub bs: Option<Typed<ByteSize>>,
    /// I/Os in flight per worker
    #[arg(long, value_name = "N", value_parser = clamp_u32)]
    pub qd: Option<Typed<u32>>,
    /// Worker threads, each with its own ring
    #[arg(long, value_name = "N", value_parser = clamp_u32)]
    pub workers: Option<Typed<u32>>,
    /// read, write or mix
    #[arg(long, value_name = "RW")]
    pub rw: Option<ReadWrite>,
    /// Percent reads in a mix (implies --rw mix)
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u8).range(0..=100))]
    pub rwmix_read: Option<u8>,
    /// io_uring, psync (blocking, one I/O per worker) or null (no I/O)
    #[arg(long, value_name = "ENGINE")]
    pub engine: Option<EngineKind>,
    /// uniform or zipf:THETA (e.g. zipf:0.99)
    #[arg(long, value_name = "DIST")]
    pub distribution: Option<Distribution>,
    /// Pace I/Os at this total rate (open loop; also records lat_intended)
    #[arg(long, value_name = "IOPS", value_parser = typed::<u64>)]
    pub rate_iops: Option<Typed<u64>>,
    /// Use the page cache instead of O_DIRECT
    #[arg(long)]
    pub buffered: bool,
    /// I/Os handed to the kernel per submission (1 = each at once)
    #[arg(long, value_name = "N", value_parser = typed::<u32>)]
    pub submit_batch: Option<Typed<u32>>,

    #[command(flatten)]
    pub kv: KvArgs,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "KV workload (kv-act, kv-scylla, kv-readonly)")]
pub struct KvArgs {
    /// ACT x-rating: N x 2000 client reads/s (and N x 1000 writes/s at the default 2:1)
    #[arg(long = "x", value_name = "N", value_parser = typed::<u64>)]
    pub x: Option<Typed<u64>>,
    /// Client reads per second (instead of the x-rating's)
    #[arg(long, value_name = "OPS", value_parser = typed::<u64>)]
    pub read_rps: Option<Typed<u64>>,
    /// Client writes per second (instead of the x-rating's)
    #[arg(long, value_name = "OPS", value_parser = typed::<u64>)]
    pub write_rps: Option<Typed<u64>>,
    /// Client reads:writes for --x, e.g. 2:1 (ACT), 1:1, 9:1, 19:1, 1:0 (read-only)
    #[arg(long, value_name = "R:W")]
    pub ratio: Option<Ratio>,
    /// Bytes per record, header included (ACT: 1536), or a uniform range like 1KiB-2KiB
    #[arg(long, value_name = "BYTES[-MAX]", value_parser = typed::<RecordBytes>)]
    pub record_bytes: Option<Typed<RecordBytes>>,
    /// Large-block (write buffer) size, a power of two (ACT: 128KiB)
    #[arg(long, value_name = "BYTES", conflicts_with = "bs", value_parser = typed::<ByteSize>)]
    pub lb_bytes: Option<Typed<ByteSize>>,
    /// Defragment blocks whose live data fell below this percent (1-99)
    #[arg(long, value_name = "PCT", value_parser = typed::<u64>)]
    pub defrag_lwm_pct: Option<Typed<u64>>,
    /// Load the store to this percent of its record capacity before measuring (1-90)
    #[arg(long, value_name = "PCT", value_parser = typed::<u64>)]
    pub fill_pct: Option<Typed<u64>>,
    /// Key choice: uniform (ACT) or zipf:THETA, e.g. zipf:0.99
    #[arg(long, value_name = "DIST", conflicts_with = "distribution")]
    pub keys: Option<Distribution>,
    /// Length of one verdict slice [default: 1h, or the whole run when shorter]
    #[arg(long, value_name = "DURATION", value_parser = typed::<Span>)]
    pub slice: Option<Typed<Span>>,
    /// Stop with "can't keep up" when a stream falls this far behind schedule
    #[arg(long, value_name = "DURATION", value_parser = typed::<Span>)]
    pub max_lag: Option<Typed<Span>>,
    /// Large-block writes without O_DSYNC (ACT's disable-odsync)
    #[arg(long)]
    pub no_dsync: bool,
    /// Let each ring keep fewer than --qd reads in flight while they queue at the device: the
    /// device reads get faster, and the reads held back wait in the ring (the client's
    /// definition still counts that wait)
    #[arg(long)]
    pub adaptive_qd: bool,
}

impl WorkloadOverrides {
    pub fn to_overrides(&self) -> Overrides {
        let mut typed: Vec<(&'static str, String)> = [
            ("--duration", Typed::text_of(&self.duration)),
            ("--ramp", Typed::text_of(&self.ramp)),
            ("--size", Typed::text_of(&self.size)),
            ("--bs", Typed::text_of(&self.bs)),
            ("--qd", Typed::text_of(&self.qd)),
            ("--workers", Typed::text_of(&self.workers)),
            ("--rate-iops", Typed::text_of(&self.rate_iops)),
            ("--submit-batch", Typed::text_of(&self.submit_batch)),
            ("--x", Typed::text_of(&self.kv.x)),
            ("--read-rps", Typed::text_of(&self.kv.read_rps)),
            ("--write-rps", Typed::text_of(&self.kv.write_rps)),
            ("--record-bytes", Typed::text_of(&self.kv.record_bytes)),
            ("--lb-bytes", Typed::text_of(&self.kv.lb_bytes)),
            ("--defrag-lwm-pct", Typed::text_of(&self.kv.defrag_lwm_pct)),
            ("--fill-pct", Typed::text_of(&self.kv.fill_pct)),
            ("--slice", Typed::text_of(&self.kv.slice)),
            ("--max-lag", Typed::text_of(&self.kv.max_lag)),
        ]
        .into_iter()
        .filter_map(|(flag, text)| Some((flag, text?.to_string())))
        .collect();
        if self.buffered {
            typed.push(("--buffered", "true".into()));
        }
        Overrides {
            rw: self.rw,
            rwmix_read: self.rwmix_read,
            bs: Typed::value_of(&self.bs),
            qd: Typed::value_of(&self.qd),
            workers: Typed::value_of(&self.workers),
            engine: self.engine,
            distribution: self.distribution,
            rate_iops: Typed::value_of(&self.rate_iops),
            size: Typed::value_of(&self.size),
            duration: Typed::value_of(&self.duration),
            ramp: Typed::value_of(&self.ramp),
            direct: self.buffered.then_some(false),
            submit_batch: Typed::value_of(&self.submit_batch),
            kv: KvOverrides {
                x: Typed::value_of(&self.kv.x),
                read_rps: Typed::value_of(&self.kv.read_rps),
                write_rps: Typed::value_of(&self.kv.write_rps),
                ratio: self.kv.ratio,
                record_bytes: Typed::value_of(&self.kv.record_bytes),
                lb_bytes: Typed::value_of(&self.kv.lb_bytes),
                keys: self.kv.keys,
                defrag_lwm_pct: Typed::value_of(&self.kv.defrag_lwm_pct),
                fill_pct: Typed::value_of(&self.kv.fill_pct),
                slice: Typed::value_of(&self.kv.slice),
                max_lag: Typed::value_of(&self.kv.max_lag),
                no_dsync: self.kv.no_dsync,
                adaptive_qd: self.kv.adaptive_qd,
            },
            typed,
        }
    }
}

/// A flag's parsed value with its text as typed, so an error can quote what the user wrote
/// ("--ramp = 100y") rather than the value's own spelling ("100years").
#[derive(Clone, Debug, PartialEq)]
pub struct Typed<T> {
    pub value: T,
    pub text: String,
}

impl<T: Clone> Typed<T> {
    fn value_of(t: &Option<Self>) -> Option<T> {
        t.as_ref().map(|t| t.value.clone())
    }

    fn text_of(t: &Option<Self>) -> Option<&str> {
        t.as_ref().map(|t| t.text.as_str())
    }
}

fn typed<T: std::str::FromStr>(s: &str) -> Result<Typed<T>, String>
where
    T::Err: std::fmt::Display,
{
    let value = s.parse().map_err(|e: T::Err| e.to_string())?;
    Ok(Typed {
        value,
        text: s.to_string(),
    })
}

/// A count that the workload spec range-checks (with the real range in its message): values
/// past u32 become u32::MAX here so they reach that check instead of clap's "0..=4294967295".
fn clamp_u32(s: &str) -> Result<Typed<u32>, String> {
    s.trim()
        .parse::<u64>()
        .map(|n| Typed {
            value: u32::try_from(n).unwrap_or(u32::MAX),
            text: s.to_string(),
        })
        .map_err(|_| format!("{s:?} is not a whole number"))
}

/// The shortest interval: below it the per-interval bookkeeping (a histogram per worker, a probe
/// snapshot) costs more than it shows, and the probes' own snapshot takes milliseconds.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// The longest: an interval is a sample of the run, not the run.
pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);

/// `--interval` within [`MIN_INTERVAL`, `MAX_INTERVAL`], said in one line.
pub fn check_interval(interval: &Span) -> anyhow::Result<()> {
    if interval.0 < MIN_INTERVAL || interval.0 > MAX_INTERVAL {
        anyhow::bail!(
            "--interval {} is outside 100ms..=1h; pick e.g. --interval 1s",
            humantime::format_duration(interval.0)
        );
    }
    Ok(())
}

impl WorkloadOverrides {
    /// The first override given that only a built-in workload takes (`--duration` is not one:
    /// an attached run lasts it too).
    pub fn workload_flag(&self) -> Option<&'static str> {
        let o = self.to_overrides();
        let given = |set: bool, flag: &'static str| set.then_some(flag);
        o.typed
            .iter()
            .map(|(flag, _)| *flag)
            .find(|flag| *flag != "--duration")
            .or(given(o.rw.is_some(), "--rw"))
            .or(given(o.rwmix_read.is_some(), "--rwmix-read"))
            .or(given(o.engine.is_some(), "--engine"))
            .or(given(o.distribution.is_some(), "--distribution"))
            .or(given(o.kv.ratio.is_some(), "--ratio"))
            .or(given(o.kv.keys.is_some(), "--keys"))
    }
}

impl TargetArgs {
    /// The first target flag given.
    pub fn given(&self) -> Option<&'static str> {
        let given = |set: bool, flag: &'static str| set.then_some(flag);
        given(self.target.is_some(), "--target")
            .or(given(self.dir.is_some(), "--dir"))
            .or(given(self.destroy_data.is_some(), "--destroy-data"))
    }

    /// The target as the run takes it.
    pub fn options(&self) -> crate::run::prepare::TargetOptions {
        crate::run::prepare::TargetOptions {
            target: self.target.clone(),
            dir: self.dir.clone(),
            destroy_data: self.destroy_data.clone(),
        }
    }
}

impl ProbeArgs {
    /// The probes as the run takes them.
    pub fn choice(&self) -> crate::run::session::ProbeChoice {
        crate::run::session::ProbeChoice {
            no_probes: self.no_probes,
            families: self.probes.clone(),
            sample_hz: self.sample_hz,
            vmm_pid: self.vmm_pid,
            block_stamps: match self.block_stamps {
                StampSource::Own => virtgap_probes::BlockStamps::Own,
                StampSource::Auto => virtgap_probes::BlockStamps::Kernel,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `record --help` names every file `--csv` writes.
    #[test]
    fn the_csv_help_names_every_file_written() {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        let record = cmd.find_subcommand_mut("record").unwrap();
        let help = record
            .get_arguments()
            .find(|a| a.get_id() == "csv")
            .and_then(|a| a.get_help())
            .unwrap()
            .to_string();
        for file in crate::render::csv_export::FILES {
            assert!(help.contains(file), "{file} in {help}");
        }
    }

    #[test]
    fn listen_addresses_are_read_as_servers_take_them() {
        let ok = |t: &str| parse_listen(t).unwrap().to_string();
        assert_eq!(ok("127.0.0.1:9477"), "127.0.0.1:9477");
        assert_eq!(ok(":9477"), "0.0.0.0:9477");
        assert_eq!(ok("localhost:9477"), "127.0.0.1:9477");
        assert_eq!(ok("[::1]:9477"), "[::1]:9477");
        let e = parse_listen("9477").unwrap_err();
        assert!(e.contains("is not ADDR:PORT"), "{e}");
    }

    #[test]
    fn pid_has_the_short_flag_perf_and_bcc_use() {
        let cli = Cli::try_parse_from(["virtgap", "record", "-p", "1,2", "-d", "1s"]).unwrap();
        let Some(Command::Record(args)) = cli.command else {
            panic!("not record");
        };
        assert_eq!(args.attach.pid, vec![1, 2]);
    }

    /// A plain `record` makes three runs sharing the workload's duration; --duration alone
    /// means one run of it; --runs is taken as given.
    #[test]
    fn record_runs_three_unless_told() {
        let record = |argv: &[&str]| {
            let cli = Cli::try_parse_from(["virtgap", "record"].iter().chain(argv)).unwrap();
            let Some(Command::Record(args)) = cli.command else {
                panic!("not record");
            };
            (args.runs(), args.runs_share_duration())
        };
        assert_eq!(record(&[]), (3, true));
        assert_eq!(record(&["-d", "10s"]), (1, false));
        assert_eq!(record(&["--runs", "5"]), (5, false));
        assert_eq!(record(&["--runs", "1", "-d", "10s"]), (1, false));
    }
}
