//! Per disk under the target: its stages per operation and per hardware queue, and NVMe command
//! latency per queue id.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::histogram::Histogram;
use crate::model::interval::StageSample;

/// One request-based disk under the target: its read and write stages, per hardware queue,
/// and the NVMe command latency per queue id (NVMe only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DeviceProfile {
    pub name: String,
    pub major: u32,
    pub minor: u32,
    pub stages: DeviceStages,
    pub queues: Vec<QueueStages>,
    pub nvme_queues: Vec<NvmeQueueLatency>,
    /// The stages of each kind of request on its own: reads, writes, and cache flushes (a
    /// flush is never queued by the workload: its `device` runs from start to completion).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<OpStages>,
}

/// One kind of request's stages on one disk.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OpStages {
    /// "read", "write" or "flush".
    pub op: String,
    pub stages: DeviceStages,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DeviceStages {
    pub queue: Option<Histogram>,
    pub device: Option<Histogram>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<Histogram>,
}

/// One hardware queue's share of a disk's stages.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QueueStages {
    pub hctx: u16,
    pub queue: StageSample,
    pub device: StageSample,
    #[serde(default)]
    pub completion: StageSample,
}

/// NVMe command latency (setup -> completion) on one queue id (hardware queue + 1).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NvmeQueueLatency {
    pub qid: u16,
    pub count: u64,
    pub sum_ns: u64,
    pub p99_ns: Option<f64>,
    /// The commands' latency distribution (reads and writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<Histogram>,
}

/// One run's NVMe commands on one queue id, over every NVMe disk under the target: what the
/// diff compares queue by queue.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NvmeQueueRun {
    pub qid: u16,
    pub count: u64,
    pub sum_ns: u64,
}

impl NvmeQueueRun {
    /// The queues of `devices`' NVMe command latency, each queue id's disks added up, in queue
    /// id order.
    pub fn of_devices(devices: &[DeviceProfile]) -> Vec<Self> {
        let mut by_qid = std::collections::BTreeMap::<u16, Self>::new();
        for q in devices.iter().flat_map(|d| &d.nvme_queues) {
            let run = by_qid.entry(q.qid).or_insert_with(|| Self {
                qid: q.qid,
                ..Self::default()
            });
            run.count += q.count;
            run.sum_ns += q.sum_ns;
        }
        by_qid.into_values().filter(|q| q.count > 0).collect()
    }

    /// The mean command latency (None: no command).
    pub fn mean_ns(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ns as f64 / self.count as f64)
    }
}
