//! The asynchronous kv client: one io_uring ring per client thread. Operations are taken from
//! the thread's share of the schedule in batches — every operation due by the time the thread
//! wakes — so a busy thread arms one timer per batch, not one sleep per operation. Writes are
//! appends to the store's write buffer, done at once; reads of records on the device go to the
//! ring (up to `qd` in flight; with `--adaptive-qd`, fewer while they queue: see `inflight`) and
//! are checked against the index as they complete, as the synchronous engine checks them.
//!
//! Timing: a read's service time runs from just before the batch holding it is submitted to
//! when the thread reaps its completion. A thread held up elsewhere (a write waiting for a free
//! block) reaps late, so that figure can run long; the block probes time the device exactly.

use std::time::Duration;

use io_uring::{opcode, types, IoUring};

use super::client::{ClientContext, ClientOp, ClientOps, ClientTally, OpTimes, ServiceResult};
use super::inflight::InFlightLimit;
use super::store::{DeviceRead, KvError, OpDone, PlannedRead};
use crate::engine::{AlignedBuffer, Registered};
use crate::run::WorkloadError;
use crate::stats::IntervalSample;

/// The shortest sleep: a thread with nothing to reap sleeps until its next operation is due,
/// but never less than this, so at high rates one timer serves a batch of operations. An
/// operation starts at most this late by design (ACT's smallest latency threshold is 1 ms).
pub const TICK: Duration = Duration::from_micros(250);

/// The longest sleep, so a stop or the end of the run is seen promptly at low rates.
const LONGEST_SLEEP: Duration = Duration::from_millis(50);

/// user_data of the tick's timeout; reads carry their slot number.
const TICK_TAG: u64 = u64::MAX;

/// A read in flight.
struct InFlight {
    read: DeviceRead,
    due: u64,
    /// When the client operation started (its first submission).
    started: u64,
    /// When this submission went out (a retried read is timed from its last one); set when the
    /// batch is submitted.
    submitted: Option<u64>,
    /// None of the ring's other reads was in flight when it went out.
    alone: bool,
}

impl InFlight {
    fn times(&self, now: u64) -> OpTimes {
        OpTimes {
            due: self.due,
            started: self.started,
            now,
        }
    }
}

struct Slot {
    buf: AlignedBuffer,
    read: Option<InFlight>,
}

/// A thread's ring and the buffers its reads land in. Dropping it — at the end, on an error or
/// in a panic — first waits for every read in flight; if the ring cannot be waited on, the
/// buffers are leaked rather than freed under the kernel's feet.
struct Reads {
    /// Dropped before `slots`: the buffers registered with it outlive it.
    ring: IoUring,
    /// How reads reach the store's file and the slots' buffers.
    access: Registered,
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// How many of the slots may be in flight now.
    limit: InFlightLimit,
    tick_pending: bool,
}

impl Reads {
    /// A ring with `qd` slots (the context's queue depth) and room for the tick's timeout; the
    /// ring's features are added to `features`.
    fn new(ctx: &ClientContext, features: &mut Vec<&'static str>) -> Result<Self, WorkloadError> {
        let qd = ctx.qd.max(1) as usize;
        // Room for every read and the tick's timeout.
        let ring = crate::engine::build_ring((qd as u32 + 1).next_power_of_two(), features)
            .map_err(|e| {
                io_failure(
                    ctx.worker,
                    "io_uring setup (where io_uring is disabled, use --engine psync)",
                    e,
                )
            })?;
        let mut slots = Vec::with_capacity(qd);
        for _ in 0..qd {
            slots.push(Slot {
                buf: ctx.store.read_buffer().map_err(|error| WorkloadError::Kv {
                    worker: ctx.worker,
                    error,
                })?,
                read: None,
            });
        }
        // As fio's registerfiles and fixedbufs: at a few hundred thousand reads a second the
        // per-read file lookup and page pinning were a tenth of the thread's CPU.
        // SAFETY: the slots' buffers are owned by this struct, their heap allocations do not
        // move, and they outlive the ring (`ring` is dropped before `slots`; `Drop` leaks the
        // buffers rather than free them under a read in flight).
        let access = unsafe {
            Registered::register(
                &ring,
                ctx.store.read_fd(),
                slots.iter_mut().map(|s| &mut s.buf),
                true,
                features,
            )
        };
        Ok(Self {
            ring,
            access,
            slots,
            free: (0..qd).rev().collect(),
            limit: InFlightLimit::new(qd as u32, ctx.adaptive_qd),
            tick_pending: false,
        })
    }

    fn in_flight(&self) -> bool {
        self.free.len() < self.slots.len()
    }

    /// Whether the limit lets one more read out now.
    fn has_room(&self) -> bool {
        self.limit.allows(self.slots.len() - self.free.len())
    }

    /// Queues a read into a free slot (the caller checked `has_room`).
    fn queue(&mut self, read: DeviceRead, due: u64, started: u64) {
        let alone = !self.in_flight();
        let index = self.free.pop().expect("a free slot");
        self.requeue(index, read, due, started, alone);
    }

    fn requeue(&mut self, index: usize, read: DeviceRead, due: u64, started: u64, alone: bool) {
        let slot = &mut self.slots[index];
        let sqe = self
            .access
            .sqe(
                false,
                slot.buf.as_mut_ptr(),
                read.len as u32,
                read.offset,
                index as u16,
            )
            .user_data(index as u64);
        slot.read = Some(InFlight {
            read,
            due,
            started,
            submitted: None,
            alone,
        });
        // The ring has room for every slot and the tick's timeout, and a slot is queued at
        // most once before it completes, so the queue cannot be full.
        // SAFETY: the slot's buffer stays alive and untouched until this read's completion is
        // reaped: the slot is not free until then, and `Drop` waits for every slot.
        let pushed = unsafe { self.ring.submission().push(&sqe) };
        debug_assert!(pushed.is_ok(), "a slot's read always has room in the ring");
    }

    /// Hands queued reads to the kernel, stamping them with `now`.
    fn submit(&mut self, now: u64) -> std::io::Result<()> {
        for slot in &mut self.slots {
            if let Some(f) = slot.read.as_mut() {
                f.submitted.get_or_insert(now);
            }
        }
        match self.ring.submit() {
            Err(e) if !transient(&e) => Err(e),
            _ => Ok(()),
        }
    }

    /// Waits for every read in flight, dropping their results.
    fn drain(&mut self) -> std::io::Result<()> {
        while self.in_flight() {
            match self.ring.submit_and_wait(1) {
                Err(e) if !transient(&e) => return Err(e),
                _ => {}
            }
            for cqe in self.ring.completion() {
                if cqe.user_data() != TICK_TAG {
                    let index = cqe.user_data() as usize;
                    self.slots[index].read = None;
                    self.free.push(index);
                }
            }
        }
        Ok(())
    }
}

impl Drop for Reads {
    fn drop(&mut self) {
        if self.drain().is_err() {
            std::mem::forget(std::mem::take(&mut self.slots));
        }
    }
}

/// One ring thread: runs until the end of the run, then waits for its reads in flight.
pub(super) fn run_ring(
    ctx: &ClientContext,
    send_interval: &dyn Fn(IntervalSample),
) -> Result<ServiceResult, WorkloadError> {
    let worker = ctx.worker;
    let mut features = Vec::new();
    let mut reads = Reads::new(ctx, &mut features)?;
    let sh = &ctx.shared;
    let mut ops = ctx.operations();
    let mut tally = ClientTally::new(ctx);
    // The kernel copies the timeout when the SQE is submitted; it lives here until then.
    let mut tick_ts: types::Timespec;
    let mut result = Ok(());
    loop {
        let now = sh.now_ns();
        tally.at(now);
        if ctx.over(now) {
            break;
        }
        match issue_due(ctx, &mut ops, &mut reads, &mut tally, now, send_interval) {
            Ok(Issued::Batch) => {}
            Ok(Issued::RunOver) => break,
            Err(e) => {
                result = Err(e);
                break;
            }
        }
        if let Err(e) = reads.submit(sh.now_ns()) {
            result = Err(io_failure(worker, "io_uring submit", e));
            break;
        }
        // Sleep until a read completes or the next operation is due (at least a tick, at most
        // LONGEST_SLEEP). With the next one already due, only a completion can help when every
        // slot is busy; with a slot free, it became due while this batch was issued: go round.
        let next_due = ops.next_due_ns().min(ctx.end_ns());
        let now = sh.now_ns();
        if !reads.tick_pending && next_due > now {
            let sleep = Duration::from_nanos(next_due - now).clamp(TICK, LONGEST_SLEEP);
            tick_ts = types::Timespec::from(sleep);
            let timeout = opcode::Timeout::new(&tick_ts).build().user_data(TICK_TAG);
            // SAFETY: `tick_ts` outlives the submission below, which copies it.
            if unsafe { reads.ring.submission().push(&timeout) }.is_ok() {
                reads.tick_pending = true;
            }
        }
        let wait_for = usize::from(reads.tick_pending || !reads.has_room());
        if let Err(e) = reads.ring.submit_and_wait(wait_for) {
            if !transient(&e) {
                result = Err(io_failure(worker, "io_uring wait", e));
                break;
            }
        }
        if let Err(e) = reap(ctx, &mut reads, &mut tally, send_interval) {
            result = Err(e);
            break;
        }
    }
    reads
        .drain()
        .map_err(|e| io_failure(worker, "io_uring wait at the end", e))?;
    result?;
    let engine = features.join(", ");
    let queue = reads.limit.finish(sh.now_ns());
    Ok(tally.finish(&engine, Some(queue), send_interval))
}

/// How a round of issuing ended.
enum Issued {
    /// Everything due is issued, or waits for a free slot: submit the batch.
    Batch,
    /// The run is over: a stream fell behind, or the store stopped.
    RunOver,
}

/// Issues everything due by `now`, as far as there are free slots for its reads: writes and
/// reads of records in memory are done at once, device reads are queued on the ring.
fn issue_due(
    ctx: &ClientContext,
    ops: &mut ClientOps,
    reads: &mut Reads,
    tally: &mut ClientTally<'_>,
    mut now: u64,
    send_interval: &dyn Fn(IntervalSample),
) -> Result<Issued, WorkloadError> {
    let sh = &ctx.shared;
    while ops.next_due_ns() <= now {
        let lag = ops.lag(now);
        if ctx.fell_behind(lag) {
            return Ok(Issued::RunOver);
        }
        if !reads.has_room() {
            // Reads wait for room; a write would overtake them.
            reads.limit.waited();
            break;
        }
        let ClientOp { due, write, key } = ops.take(now);
        tally.issued_late_by(lag.as_nanos() as u64);
        let planned = if write {
            ctx.store.put(key).map(|bytes| PlannedRead::Done { bytes })
        } else {
            ctx.store.plan_read(key)
        };
        let planned = match planned {
            Ok(p) => p,
            Err(KvError::Stopped) => return Ok(Issued::RunOver),
            Err(error) => {
                return Err(WorkloadError::Kv {
                    worker: ctx.worker,
                    error,
                })
            }
        };
        match planned {
            PlannedRead::Done { bytes } => {
                let end = sh.now_ns();
                let times = OpTimes {
                    due,
                    started: now,
                    now: end,
                };
                let done = OpDone {
                    service_ns: None,
                    bytes,
                    offset: None,
                };
                tally.done(write, times, done, send_interval);
            }
            PlannedRead::Device(read) => reads.queue(read, due, now),
        }
        // A write can wait for a free block: the next operation's lag is from now.
        now = sh.now_ns();
    }
    Ok(Issued::Batch)
}

/// Handles every completion waiting: records and checks finished reads (re-reading a record
/// that moved while it was read, or a read the device asked to retry), notes an expired tick.
fn reap(
    ctx: &ClientContext,
    reads: &mut Reads,
    tally: &mut ClientTally<'_>,
    send_interval: &dyn Fn(IntervalSample),
) -> Result<(), WorkloadError> {
    let sh = &ctx.shared;
    let done: Vec<(u64, i32)> = reads
        .ring
        .completion()
        .map(|c| (c.user_data(), c.result()))
        .collect();
    // After a failure the remaining completions only free their slots.
    let mut failed = None;
    for (tag, res) in done {
        if tag == TICK_TAG {
            reads.tick_pending = false;
            continue;
        }
        let now = sh.now_ns();
        let index = tag as usize;
        let flight = reads.slots[index]
            .read
            .take()
            .expect("a completion for a slot in flight");
        if failed.is_some() {
            reads.free.push(index);
            continue;
        }
        if res == -libc::EAGAIN || res == -libc::EINTR {
            reads.requeue(index, flight.read, flight.due, flight.started, false);
            continue;
        }
        if res != flight.read.len as i32 {
            reads.free.push(index);
            let err = if res < 0 {
                std::io::Error::from_raw_os_error(-res)
            } else {
                std::io::Error::other(format!("short read of {res} B"))
            };
            failed = Some(KvError::Io {
                op: "record read",
                offset: flight.read.offset,
                len: flight.read.len,
                err,
            });
            continue;
        }
        let data = &reads.slots[index].buf.as_slice()[..flight.read.len];
        match ctx.store.verify_read(&flight.read, data) {
            Ok(None) => {
                reads.free.push(index);
                let service_ns = now - flight.submitted.unwrap_or(flight.started).min(now);
                reads.limit.completed(service_ns, flight.alone, now);
                let done = OpDone {
                    service_ns: Some(service_ns),
                    bytes: flight.read.len as u64,
                    offset: Some(flight.read.offset),
                };
                tally.done(false, flight.times(now), done, send_interval);
            }
            Ok(Some(PlannedRead::Done { bytes })) => {
                reads.free.push(index);
                let done = OpDone {
                    service_ns: None,
                    bytes,
                    offset: None,
                };
                tally.done(false, flight.times(now), done, send_interval);
            }
            Ok(Some(PlannedRead::Device(again))) => {
                reads.requeue(index, again, flight.due, flight.started, false);
            }
            Err(error) => {
                reads.free.push(index);
                failed = Some(error);
            }
        }
    }
    match failed {
        Some(error) => Err(WorkloadError::Kv {
            worker: ctx.worker,
            error,
        }),
        None => Ok(()),
    }
}

/// A ring call that failed on `op`, as the worker's error.
fn io_failure(worker: u32, op: &'static str, err: std::io::Error) -> WorkloadError {
    WorkloadError::Kv {
        worker,
        error: KvError::Io {
            op,
            offset: 0,
            len: 0,
            err,
        },
    }
}

fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::ETIME) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}
