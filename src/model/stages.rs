//! Where an I/O's time goes: the stages a profile keeps histograms of, and where the queue stage
//! starts.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use virtgap_probes::model::BlockStage;

use crate::model::histogram::Histogram;

/// A stage of an I/O's time that a profile keeps a histogram of (and, but for `App`, a
/// per-interval count and sum under `Interval::stages`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    App,
    Queue,
    Device,
    Completion,
    Wakeup,
}

impl Stage {
    pub const ALL: [Stage; 5] = [
        Stage::App,
        Stage::Queue,
        Stage::Device,
        Stage::Completion,
        Stage::Wakeup,
    ];
    /// The block and scheduler stages the probes measure.
    pub const PROBED: [Stage; 4] = [
        Stage::Queue,
        Stage::Device,
        Stage::Completion,
        Stage::Wakeup,
    ];

    /// Its name in profiles, CSV files and the diff.
    pub fn name(self) -> &'static str {
        match self {
            Stage::App => "app",
            Stage::Queue => BlockStage::Queue.name(),
            Stage::Device => BlockStage::Device.name(),
            Stage::Completion => BlockStage::Completion.name(),
            Stage::Wakeup => "wakeup",
        }
    }
}

/// The stage histograms of the workload's own I/Os, over the measured window (the ramp left out).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Stages {
    /// Application-visible latency (`lat`, both directions).
    pub app: Histogram,
    /// Block layer: request start -> issue (None when the block probe did not attach).
    pub queue: Option<Histogram>,
    /// Issue -> entry of the completing queue's interrupt handler (-> completion for requests
    /// whose queue IRQ is unknown: see `completion`).
    pub device: Option<Histogram>,
    /// Interrupt handler entry -> request completion, for the requests whose queue IRQ is known
    /// (absent: none was, as on loop or md-only targets, or a profile from before the stage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<Histogram>,
    /// Wakeup -> on CPU of the workload's threads.
    pub wakeup: Option<Histogram>,
    /// The workload's cache flushes: request start -> completion (none counted before 6.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush: Option<Histogram>,
}

impl Stages {
    /// Adds `other`'s probed stages (all but `app`, which each caller pools its own way) into
    /// these: several runs' or slices' stages as one.
    pub fn merge_probed(&mut self, other: &Stages) {
        for (mine, theirs) in [
            (&mut self.queue, &other.queue),
            (&mut self.device, &other.device),
            (&mut self.completion, &other.completion),
            (&mut self.wakeup, &other.wakeup),
            (&mut self.flush, &other.flush),
        ] {
            Histogram::merge_into(mine, theirs.as_ref());
        }
    }
}

/// Block requests per app I/O (see [`Stages::requests_per_io`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RequestsPerIo {
    pub requests: u64,
    pub ios: u64,
}

impl RequestsPerIo {
    pub fn ratio(self) -> f64 {
        self.requests as f64 / self.ios as f64
    }

    /// Whether the block layer kept one request per I/O, within 5%: the probes' window and the
    /// workload's differ by the I/Os in flight at their edges (the requests of those drained at
    /// the end count, the I/Os do not), and a split or a merge moves the figure far more.
    pub fn one_to_one(self) -> bool {
        (self.ratio() - 1.0).abs() <= 0.05
    }
}

impl Stages {
    /// Block requests completed per app I/O over (nearly) the same window: 1 when every I/O was
    /// one request, more when the block layer split them or a mirror wrote them to each disk,
    /// fewer when it merged them or served some without one. The block stages are per request and the app's latency per I/O, so where
    /// this is not 1 the two are not the same unit. None without the block stages.
    pub fn requests_per_io(&self) -> Option<RequestsPerIo> {
        let requests = self.device.as_ref()?.count;
        let ios = self.app.count;
        (requests > 0 && ios > 0).then_some(RequestsPerIo { requests, ios })
    }

    /// The whole-run histogram of `stage` (None when its probe did not attach).
    pub fn get(&self, stage: Stage) -> Option<&Histogram> {
        match stage {
            Stage::App => Some(&self.app),
            Stage::Queue => self.queue.as_ref(),
            Stage::Device => self.device.as_ref(),
            Stage::Completion => self.completion.as_ref(),
            Stage::Wakeup => self.wakeup.as_ref(),
        }
    }

    /// Mean completion stage per block request, the requests without one counting 0: what
    /// the stage adds to queue + device, so the means still decompose a request's time.
    pub fn completion_per_request(&self) -> Option<f64> {
        let (c, d) = (self.completion.as_ref()?, self.device.as_ref()?);
        (d.count > 0).then(|| c.sum_ns / d.count as f64)
    }

    /// The mean I/O split into its stages (None without an app mean or the block stages).
    pub fn breakdown(&self) -> Option<StageBreakdown> {
        Some(StageBreakdown::of(
            self.app.mean_ns()?,
            self.queue.as_ref()?.mean_ns()?,
            self.device.as_ref()?.mean_ns()?,
            self.completion_per_request().unwrap_or(0.0),
        ))
    }
}

/// Where a profile's queue stage starts (see [`Profile::queue_start`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueStart {
    /// Where each bio entered the block layer: blk-throttle and tag waits are queue.
    /// `remap`: noted at block_bio_remap (a partition's bios) for want of a hook on
    /// submit_bio_noacct.
    BioEntry { remap: bool },
    /// At the request: blk-throttle and tag waits fall before it, in the software residual.
    Request,
    /// At the bio's entry for `from_entry` of `requests` (those block_bio_remap saw), at the
    /// request for the rest.
    Mixed { from_entry: u64, requests: u64 },
}

impl QueueStart {
    /// Share of requests from the bio's entry above which a remap-noted stage counts as
    /// starting there (a few requests built without a noted bio: at the window's edges).
    pub const WHOLE: f64 = 0.95;

    pub fn from_bio_entry(self) -> bool {
        matches!(self, Self::BioEntry { .. })
    }
}

/// The mean I/O split into the stages that add up to it — app = queue + device + completion +
/// software — in nanoseconds: the block stages per request (completion counting 0 for a request
/// without one), software what they leave of app (submission, reaping and anything else outside
/// the block layer; negative when the block layer served an I/O as more than one request).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StageBreakdown {
    pub app_ns: f64,
    pub queue_ns: f64,
    pub device_ns: f64,
    pub completion_ns: f64,
    pub software_ns: f64,
}

impl StageBreakdown {
    /// The split of a mean `app_ns` whose block stages took `queue_ns`, `device_ns` and
    /// `completion_ns`: the one place software is worked out.
    pub fn of(app_ns: f64, queue_ns: f64, device_ns: f64, completion_ns: f64) -> Self {
        Self {
            app_ns,
            queue_ns,
            device_ns,
            completion_ns,
            software_ns: app_ns - queue_ns - device_ns - completion_ns,
        }
    }

    /// The stages that add up to app, with their names as the waterfall prints them.
    pub fn parts(&self) -> [(&'static str, f64); 4] {
        [
            ("queue", self.queue_ns),
            ("device", self.device_ns),
            ("completion", self.completion_ns),
            ("software", self.software_ns),
        ]
    }

    pub fn minus(&self, other: &Self) -> Self {
        Self {
            app_ns: self.app_ns - other.app_ns,
            queue_ns: self.queue_ns - other.queue_ns,
            device_ns: self.device_ns - other.device_ns,
            completion_ns: self.completion_ns - other.completion_ns,
            software_ns: self.software_ns - other.software_ns,
        }
    }

    /// The mean of several runs' figures.
    pub fn mean_of<'a>(all: impl IntoIterator<Item = &'a StageBreakdown>) -> Option<Self> {
        let mut sum = Self::default();
        let mut n = 0.0;
        for s in all {
            sum.app_ns += s.app_ns;
            sum.queue_ns += s.queue_ns;
            sum.device_ns += s.device_ns;
            sum.completion_ns += s.completion_ns;
            sum.software_ns += s.software_ns;
            n += 1.0;
        }
        (n > 0.0).then(|| Self {
            app_ns: sum.app_ns / n,
            queue_ns: sum.queue_ns / n,
            device_ns: sum.device_ns / n,
            completion_ns: sum.completion_ns / n,
            software_ns: sum.software_ns / n,
        })
    }
}
