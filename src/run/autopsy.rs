//! The tail autopsy of a finished run, shared by `record` and the TUI: the target's extent map
//! read from the open target, then the pure join (`analysis::tail`).

use virtgap_probes::model::SlowRequest;
use virtgap_workloads::extents::{ExtentMap, StackMap};
use virtgap_workloads::slow::SlowIo;

use crate::model::host::TargetDisks;
use crate::model::stages::Stages;
use crate::model::tail::TailAutopsy;

/// What the run's workers kept and the block probe sent, joined on `target`'s disk.
pub fn tail_autopsy(
    ios: &[SlowIo],
    requests: &[SlowRequest],
    requests_dropped: u64,
    target: &virtgap_workloads::Target,
    disks: &TargetDisks,
    stages: &Stages,
) -> Option<TailAutopsy> {
    // Requests are the leaves': a stacked device's I/O lands on its members at other sectors,
    // which md RAID0's striping and dm's linear and striped tables let us follow.
    let mut stripes = None;
    let extents = match (&disks.top, disks.leaves.as_slice()) {
        (Some(top), [leaf]) if top == leaf => ExtentMap::of_file(&target.file, target.size),
        (Some(top), leaves) if !leaves.is_empty() => StackMap::of(&top.name)
            .map_err(|why| {
                format!(
                    "{} is stacked over {}: its I/Os are not joined to the requests below it ({why})",
                    top.name,
                    leaves
                        .iter()
                        .map(|d| d.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
            .and_then(|stack| {
                stripes = Some(stack);
                ExtentMap::of_file(&target.file, target.size)
            }),
        _ => Err("the target's disk is unknown".into()),
    };
    crate::analysis::tail::autopsy(&crate::analysis::tail::TailInputs {
        ios,
        requests,
        join: crate::analysis::tail::Join::Extents {
            extents: extents.as_ref().map_err(Clone::clone),
            stripes: stripes.as_ref(),
        },
        stages,
        requests_dropped,
    })
}
