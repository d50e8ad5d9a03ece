//! The tail autopsy (pure): joins the workload's slow I/Os to the kernel's slow requests by
//! disk, sector and time (an attached run's slow calls by thread and time), and says where the
//! I/Os above the run's p99 and p99.9 spent their time.

use virtgap_probes::model::{BlockOp, SlowRequest};
use virtgap_workloads::extents::{ExtentMap, StackMap};
use virtgap_workloads::slow::SlowIo;

use crate::model::stages::{StageBreakdown, Stages};
use crate::model::tail::{SoftwareSplit, TailAutopsy, TailSet};

/// The tail percentiles: the sets the autopsy opens, and the tails the diff compares.
pub const TAIL_PERCENTILES: [f64; 2] = [99.0, 99.9];

/// What one run left for the autopsy.
#[derive(Debug)]
pub struct TailInputs<'a> {
    /// The workload's kept I/Os (measured window only).
    pub ios: &'a [SlowIo],
    /// The block probe's slow requests.
    pub requests: &'a [SlowRequest],
    /// How an I/O finds its request.
    pub join: Join<'a>,
    /// The run's stages (app from the workload, block stages over the measured window).
    pub stages: &'a Stages,
    pub requests_dropped: u64,
}

/// How a slow I/O finds the block request it waited for.
#[derive(Debug)]
pub enum Join<'a> {
    /// The workload's I/Os, by disk, sector and time.
    Extents {
        /// Where the target's bytes sit (Err: why they cannot be joined).
        extents: Result<&'a ExtentMap, String>,
        /// When the target is stacked (md RAID0, dm linear or striped): how its sectors lie on
        /// the member disks, where the requests are.
        stripes: Option<&'a StackMap>,
    },
    /// An attached run's calls, by thread and time: the thread of each (beside `ios`, index
    /// for index), whose requests started and completed within the call. A file's extents are
    /// not needed: a system call's thread waits for the requests it started (an io_uring
    /// request issued by a worker thread is not joined).
    Threads(&'a [u32]),
}

/// The run's autopsy; None when it had no app latency at all.
pub fn autopsy(input: &TailInputs<'_>) -> Option<TailAutopsy> {
    let app = &input.stages.app;
    let baseline = baseline(input.stages)?;
    let mut requests: Vec<&SlowRequest> = input
        .requests
        .iter()
        .filter(|r| matches!(r.op, BlockOp::Read | BlockOp::Write))
        .collect();
    requests.sort_by_key(|r| r.complete_ns);
    let mut sets = Vec::new();
    for p in TAIL_PERCENTILES {
        let expected = ((100.0 - p) / 100.0 * app.count as f64).floor() as u64;
        let Some(threshold) = app.percentile_ns(p) else {
            continue;
        };
        if expected == 0 {
            continue;
        }
        let slow: Vec<(usize, &SlowIo)> = input
            .ios
            .iter()
            .enumerate()
            .filter(|(_, io)| io.latency_ns() as f64 > threshold)
            .collect();
        if slow.is_empty() {
            continue;
        }
        let mut per_io = Vec::with_capacity(slow.len());
        let mut joined = 0;
        let mut split = SoftwareSplit::default();
        for &(index, io) in &slow {
            let app_ns = io.latency_ns() as f64;
            let block = match &input.join {
                Join::Extents { extents, stripes } => extents
                    .as_ref()
                    .ok()
                    .and_then(|map| request_of(io, map, *stripes, &requests)),
                Join::Threads(tids) => tids
                    .get(index)
                    .and_then(|&tid| request_of_thread(io, tid, &requests)),
            };
            let (queue, device, completion) = match block {
                Some(r) => {
                    joined += 1;
                    split.before_request_ns += r.start_ns.saturating_sub(io.start_ns) as f64;
                    split.after_request_ns += io.end_ns.saturating_sub(r.complete_ns) as f64;
                    let irq = r.irq_ns.unwrap_or(r.complete_ns);
                    (
                        r.issue_ns.saturating_sub(r.start_ns) as f64,
                        irq.saturating_sub(r.issue_ns) as f64,
                        r.complete_ns.saturating_sub(irq) as f64,
                    )
                }
                // Its request was shorter than the kernel's threshold (or could not be joined):
                // counted at the run's means, so the I/O's excess lands outside the block layer.
                None => (
                    baseline.queue_ns,
                    baseline.device_ns,
                    baseline.completion_ns,
                ),
            };
            per_io.push(StageBreakdown::of(app_ns, queue, device, completion));
        }
        sets.push(TailSet {
            percentile: p,
            threshold_ns: threshold,
            expected_ios: expected,
            ios: slow.len() as u64,
            joined,
            mean: StageBreakdown::mean_of(&per_io).unwrap_or_default(),
            joined_software: (joined > 0).then(|| SoftwareSplit {
                before_request_ns: split.before_request_ns / joined as f64,
                after_request_ns: split.after_request_ns / joined as f64,
            }),
            baseline,
        });
    }
    Some(TailAutopsy {
        sets,
        requests_dropped: input.requests_dropped,
        unjoinable: match &input.join {
            Join::Extents { extents, .. } => extents.as_ref().err().cloned(),
            Join::Threads(_) => None,
        },
        by_thread: matches!(input.join, Join::Threads(_)),
    })
}

/// The run's mean I/O: app from the workload, block stages per request, software the rest (all
/// of app when the block stages are missing).
fn baseline(stages: &Stages) -> Option<StageBreakdown> {
    stages
        .breakdown()
        .or_else(|| Some(StageBreakdown::of(stages.app.mean_ns()?, 0.0, 0.0, 0.0)))
}

/// The request that served `io`: on the I/O's disk (a stacked target's member holding it),
/// covering its first sector, started after the I/O was created and completed before it was
/// reaped. When the I/O was split, the one that completed last (the one it waited for).
fn request_of<'r>(
    io: &SlowIo,
    map: &ExtentMap,
    stripes: Option<&StackMap>,
    by_completion: &[&'r SlowRequest],
) -> Option<&'r SlowRequest> {
    let sector = map.sector_of(io.offset)?;
    let (disk, sector) = match stripes {
        Some(stack) => stack.locate(sector)?,
        None => (map.disk, sector),
    };
    let first = by_completion.partition_point(|r| r.complete_ns < io.start_ns);
    by_completion[first..]
        .iter()
        .take_while(|r| r.complete_ns <= io.end_ns)
        .filter(|r| {
            let sectors = u64::from(r.bytes.max(512)) / 512;
            r.dev == disk
                && r.start_ns >= io.start_ns
                && r.sector <= sector
                && sector < r.sector + sectors
                && matches!(r.op, BlockOp::Write) == io.write
        })
        .max_by_key(|r| r.complete_ns)
        .copied()
}

/// The request an attached call waited for: started for its thread after the call began and
/// completed before it returned, of its direction; the one that completed last.
fn request_of_thread<'r>(
    io: &SlowIo,
    tid: u32,
    by_completion: &[&'r SlowRequest],
) -> Option<&'r SlowRequest> {
    let first = by_completion.partition_point(|r| r.complete_ns < io.start_ns);
    by_completion[first..]
        .iter()
        .take_while(|r| r.complete_ns <= io.end_ns)
        .filter(|r| {
            r.tid == tid && r.start_ns >= io.start_ns && matches!(r.op, BlockOp::Write) == io.write
        })
        .max_by_key(|r| r.complete_ns)
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::histogram::Histogram;
    use virtgap_workloads::extents::Raid0;

    fn hist(values: &[u64]) -> Histogram {
        Histogram::of_values(values)
    }

    /// The autopsy of `ios` and `requests` on `extents`, nothing dropped.
    fn open(
        ios: &[SlowIo],
        requests: &[SlowRequest],
        extents: Result<&ExtentMap, String>,
        stages: &Stages,
    ) -> TailAutopsy {
        autopsy(&TailInputs {
            ios,
            requests,
            join: Join::Extents {
                extents,
                stripes: None,
            },
            stages,
            requests_dropped: 0,
        })
        .unwrap()
    }

    fn map() -> ExtentMap {
        // Target bytes 0..1 MiB at sector 2048 of disk 8:0, the next MiB at sector 100000.
        ExtentMap {
            disk: (8, 0),
            extents: vec![(0, 2048, 1 << 20), (1 << 20, 100_000, 1 << 20)],
        }
    }

    fn read(offset: u64, start: u64, lat: u64) -> SlowIo {
        SlowIo {
            offset,
            len: 4096,
            write: false,
            start_ns: start,
            end_ns: start + lat,
        }
    }

    fn request(sector: u64, start: u64, queue: u64, device: u64, completion: u64) -> SlowRequest {
        SlowRequest {
            dev: (8, 0),
            sector,
            bytes: 4096,
            op: BlockOp::Read,
            start_ns: start,
            issue_ns: start + queue,
            irq_ns: Some(start + queue + device),
            complete_ns: start + queue + device + completion,
            tid: 7,
        }
    }

    /// 1000 reads of 100 µs (10 queue, 80 device, 5 completion, 5 software); ten of them
    /// 1 ms slower in software with a fast request, and (`device_tail`) ten 3 ms slower on
    /// the device.
    fn run(device_tail: bool) -> (Vec<SlowIo>, Vec<SlowRequest>, Stages) {
        let mut lats = Vec::new();
        let (mut ios, mut requests) = (Vec::new(), Vec::new());
        for i in 0..1000u64 {
            let start = i * 10_000_000;
            let offset = (i % 256) * 4096;
            let sector = 2048 + offset / 512;
            let (device, software) = match i % 100 {
                7 if device_tail => (3_080_000, 5_000),
                9 => (80_000, 1_005_000),
                _ => (80_000, 5_000),
            };
            let lat = 10_000 + device + 5_000 + software;
            lats.push(lat);
            // The workload keeps what is near its tail, the kernel what took over 1 ms.
            if lat > 1_000_000 {
                ios.push(read(offset, start, lat));
            }
            if device > 1_000_000 {
                requests.push(request(sector, start + 2_000, 10_000, device, 5_000));
            }
        }
        let devices: Vec<u64> = (0..1000)
            .map(|i| {
                if device_tail && i % 100 == 7 {
                    3_080_000
                } else {
                    80_000
                }
            })
            .collect();
        let stages = Stages {
            app: hist(&lats),
            queue: Some(hist(&vec![10_000; 1000])),
            device: Some(hist(&devices)),
            completion: Some(hist(&vec![5_000; 1000])),
            ..Stages::default()
        };
        (ios, requests, stages)
    }

    #[test]
    fn the_slow_ios_excess_lands_on_the_stage_that_was_slow_for_them() {
        let (ios, requests, stages) = run(true);
        let map = map();
        let tail = open(&ios, &requests, Ok(&map), &stages);
        let p99 = tail.set(99.0).unwrap();
        assert_eq!(p99.expected_ios, 10);
        // The 20 slow I/Os straddle p99: the ten device-slow ones are above it.
        assert_eq!((p99.ios, p99.joined), (10, 10), "{p99:?}");
        let excess = p99.excess();
        assert!(
            excess.device_ns > 0.95 * excess.app_ns,
            "device {:.0} of {:.0} ns",
            excess.device_ns,
            excess.app_ns
        );
        assert!(
            excess.software_ns.abs() < 0.02 * excess.app_ns,
            "{excess:?}"
        );
        // The request started 2 µs after the I/O; the I/O was reaped 3 µs after it completed.
        let split = p99.joined_software.unwrap();
        assert_eq!(
            (split.before_request_ns, split.after_request_ns),
            (2_000.0, 3_000.0)
        );
    }

    #[test]
    fn a_slow_io_whose_request_was_fast_is_put_outside_the_block_layer() {
        let (ios, requests, stages) = run(false);
        assert!(requests.is_empty());
        let map = map();
        let tail = open(&ios, &[], Ok(&map), &stages);
        let p99 = tail.set(99.0).unwrap();
        assert_eq!(p99.joined, 0);
        let excess = p99.excess();
        assert!((excess.device_ns).abs() < 1.0, "{excess:?}");
        assert!(excess.software_ns > 0.9 * excess.app_ns, "{excess:?}");
    }

    #[test]
    fn requests_elsewhere_or_at_other_times_are_not_joined() {
        let (ios, requests, stages) = run(true);
        let map = map();
        let moved: Vec<SlowRequest> = requests
            .iter()
            .flat_map(|r| {
                [
                    SlowRequest { dev: (8, 16), ..*r },
                    SlowRequest {
                        sector: r.sector + 8,
                        ..*r
                    },
                    SlowRequest {
                        start_ns: r.start_ns + 1_000_000_000,
                        issue_ns: r.issue_ns + 1_000_000_000,
                        irq_ns: r.irq_ns.map(|t| t + 1_000_000_000),
                        complete_ns: r.complete_ns + 1_000_000_000,
                        ..*r
                    },
                ]
            })
            .collect();
        let tail = open(&ios, &moved, Ok(&map), &stages);
        assert_eq!(tail.set(99.0).unwrap().joined, 0);
        let unjoinable = open(
            &ios,
            &requests,
            Err("md0 is a stacked device".into()),
            &stages,
        );
        assert_eq!(unjoinable.set(99.0).unwrap().joined, 0);
        assert_eq!(
            unjoinable.unjoinable.as_deref(),
            Some("md0 is a stacked device")
        );
    }

    #[test]
    fn a_raid0_targets_slow_ios_are_joined_on_the_members_through_its_striping() {
        let (ios, requests, stages) = run(true);
        // The map's disk (8, 0) as a RAID0 of 8-sector chunks over (8, 16) and (8, 32), data at
        // sector 100 of each: the kernel saw every request on a member.
        let raid0 = Raid0 {
            chunk_sectors: 8,
            members: vec![((8, 16), 100), ((8, 32), 100)],
        };
        let on_members: Vec<SlowRequest> = requests
            .iter()
            .map(|r| {
                let (dev, sector) = raid0.locate(r.sector).unwrap();
                SlowRequest { dev, sector, ..*r }
            })
            .collect();
        let map = map();
        let striped = autopsy(&TailInputs {
            ios: &ios,
            requests: &on_members,
            join: Join::Extents {
                extents: Ok(&map),
                stripes: Some(&StackMap {
                    segments: vec![(0, u64::MAX, raid0.clone())],
                }),
            },
            stages: &stages,
            requests_dropped: 0,
        })
        .unwrap();
        let p99 = striped.set(99.0).unwrap();
        assert_eq!((p99.ios, p99.joined), (10, 10), "{p99:?}");
        // Read as if the md device itself had them, none matches.
        let flat = open(&ios, &on_members, Ok(&map), &stages);
        assert_eq!(flat.set(99.0).unwrap().joined, 0);
    }

    /// An attached run's slow calls find their requests by thread and time, whatever their
    /// offset: another thread's request in the same window is not theirs.
    #[test]
    fn attached_calls_join_their_threads_requests() {
        // Ten reads of 1 ms; the block request of each took 900 µs of device time.
        let ios: Vec<SlowIo> = (0..10u64)
            .map(|i| read(0, i * 10_000_000, 1_000_000))
            .collect();
        let mut requests: Vec<SlowRequest> = (0..10u64)
            .map(|i| request(5_000, i * 10_000_000 + 20_000, 10_000, 900_000, 5_000))
            .collect();
        // Another thread's request inside the first call's window, slower: not joined to it.
        requests.push(SlowRequest {
            tid: 8,
            ..request(9_000, 30_000, 10_000, 950_000, 5_000)
        });
        let tids = vec![7u32; ios.len()];
        let mut values: Vec<u64> = vec![100_000; 990];
        values.extend(std::iter::repeat_n(1_000_000, 10));
        let stages = Stages {
            app: hist(&values),
            queue: Some(hist(&[10_000; 1000])),
            device: Some(hist(&[80_000; 1000])),
            completion: Some(hist(&[5_000; 1000])),
            ..Stages::default()
        };
        let a = autopsy(&TailInputs {
            ios: &ios,
            requests: &requests,
            join: Join::Threads(&tids),
            stages: &stages,
            requests_dropped: 0,
        })
        .unwrap();
        let p99 = a.set(99.0).unwrap();
        assert_eq!((p99.ios, p99.joined), (10, 10), "{p99:?}");
        assert!((p99.mean.device_ns - 900_000.0).abs() < 1.0, "{p99:?}");
        assert_eq!(a.unjoinable, None);
        // Under another thread id, nothing joins.
        let other = vec![9u32; ios.len()];
        let none = autopsy(&TailInputs {
            ios: &ios,
            requests: &requests,
            join: Join::Threads(&other),
            stages: &stages,
            requests_dropped: 0,
        })
        .unwrap();
        assert_eq!(none.set(99.0).unwrap().joined, 0);
    }
}
