//! What an attached run measured (`record --pid/--cgroup/--comm/--all`): which processes, how
//! the run ended, and the kinds of I/O they sent, so a diff of two attached profiles can check
//! what it can. Pure data, filled in `run::attached`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How the processes were named.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AttachKind {
    Pid,
    Cgroup,
    Comm,
    /// Every process of the host.
    All,
}

/// Why an attached run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AttachEnd {
    /// `--duration` ran out.
    Duration,
    /// Ctrl-C or a termination signal.
    Interrupted,
    /// Every followed process exited.
    ProcessesExited,
}

/// The I/O the attached processes sent, from their block requests over the measured window
/// (the requests' sizes are not measured; the app section has the calls' bytes).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AttachedIo {
    pub read_requests: u64,
    pub write_requests: u64,
    pub flushes: u64,
    /// Their reads and writes in the block layer at once, on average over the window (Little's
    /// law: the requests' queue, device and completion time over the window's length): under
    /// a steady load, the queue depth it ran at. None without the block probe's stages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_in_flight: Option<f64>,
}

impl AttachedIo {
    /// The share of data requests that are reads (None: no data request).
    pub fn read_share(&self) -> Option<f64> {
        let all = self.read_requests + self.write_requests;
        (all > 0).then(|| self.read_requests as f64 / all as f64)
    }
}

/// One kind of app-level I/O of the attached processes, timed where the kernel shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AppLatency {
    /// "syscall" (entry to exit) or "io_uring" (submission to completion).
    pub via: String,
    /// "read", "write" or "sync" (fsync, fdatasync).
    pub op: String,
    pub latency: crate::model::histogram::Histogram,
    /// Bytes the calls returned (None for io_uring, whose result is not read, and for syncs).
    pub bytes: Option<u64>,
}

/// The processes an attached run followed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Attached {
    pub kind: AttachKind,
    /// What was named, as given: "1234,1240", a cgroup path, a process name; empty for all.
    pub named: String,
    /// `--label`: the workload's name for the diff.
    pub label: Option<String>,
    /// The processes followed at any point of the run (at most [`Attached::MAX_PIDS`]);
    /// empty for every process.
    pub pids: Vec<u32>,
    /// Distinct command lines of those processes (at most [`Attached::MAX_COMMANDS`]).
    pub commands: Vec<String>,
    pub end: AttachEnd,
    pub io: AttachedIo,
    /// App latency by kind (file system calls, io_uring requests); None where the app probe
    /// did not run (--all, or it did not attach): `capabilities` says why.
    pub app: Option<Vec<AppLatency>>,
    /// libaio io_submit calls: their I/O completes out of sight and has no app-level time.
    pub io_submits: u64,
}

impl Attached {
    pub const MAX_PIDS: usize = 4096;
    pub const MAX_COMMANDS: usize = 32;
}
