//! The asynchronous kv client: one io_uring ring per client thread. Operations are taken from
//! the thread's share of the schedule in batches — every operation due by the time the thread
//! wakes — so a busy thread arms one timer per tick, not one sleep per operation. Writes are
//! appends to the store's write buffer, done at once; reads of records on the device go to the
//! ring (up to `qd` in flight) and are checked against the index as they complete, as the
//! synchronous engine checks them.

use std::time::Duration;

use io_uring::{opcode, types};

use super::runner::{ClientContext, ClientOp, ClientTally, OpTimes, ServiceResult};
use super::store::{DeviceRead, KvError, OpDone, PlannedRead};
use crate::engine::AlignedBuffer;
use crate::run::WorkloadError;
use crate::stats::IntervalSample;

/// The shortest sleep: a thread with nothing to reap sleeps until its next operation is due,
/// but never less than this, so at high rates one timer serves a batch of operations. An
/// operation starts at most this late by design (ACT's smallest latency threshold is 1 ms).
pub const TICK: Duration = Duration::from_micros(250);

/// user_data of the tick's timeout; reads carry their slot number.
const TICK_TAG: u64 = u64::MAX;

/// A read in flight.
struct Slot {
    buf: AlignedBuffer,
    read: Option<InFlight>,
}

struct InFlight {
    read: DeviceRead,
    due: u64,
    /// When the client operation started (its first submission).
    started: u64,
    /// When this submission went out (a retried read is timed from its last one).
    submitted: u64,
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

/// One ring thread: runs until the end of the run, then waits for its reads in flight (their
/// buffers must outlive them).
pub(super) fn run_ring(
    ctx: &ClientContext,
    send_interval: &dyn Fn(IntervalSample),
) -> Result<ServiceResult, WorkloadError> {
    let worker = ctx.worker;
    let fail = |error: KvError| WorkloadError::Kv { worker, error };
    let io_fail = |op: &'static str, err: std::io::Error| {
        fail(KvError::Io {
            op,
            offset: 0,
            len: 0,
            err,
        })
    };
    let qd = ctx.qd.max(1) as usize;
    let mut features = Vec::new();
    // Room for every read and the tick's timeout.
    let mut ring = crate::engine::build_ring((qd as u32 + 1).next_power_of_two(), &mut features)
        .map_err(|e| io_fail("io_uring setup", e))?;
    let mut slots = Vec::with_capacity(qd);
    for _ in 0..qd {
        slots.push(Slot {
            buf: ctx.store.read_buffer().map_err(fail)?,
            read: None,
        });
    }
    let mut free: Vec<usize> = (0..qd).rev().collect();
    let fd = types::Fd(ctx.store.read_fd());
    let sh = &ctx.shared;
    let mut ops = ctx.operations();
    let mut tally = ClientTally::new(ctx);
    let mut tick_pending = false;
    // The kernel copies the timeout when the SQE is submitted; it lives here until then.
    let mut tick_ts: types::Timespec;
    let mut result = Ok(());
    'run: loop {
        let now = sh.now_ns();
        tally.at(now);
        if ctx.over(now) {
            break;
        }
        // Everything due by now, as far as there are free slots for its reads.
        while ops.next_due_ns() <= now {
            let lag = ops.lag(now);
            if ctx.fell_behind(lag) {
                break 'run;
            }
            if free.is_empty() {
                // Reads wait for a slot; a write would overtake them.
                break;
            }
            let ClientOp { due, write, key } = ops.take(now);
            tally.issued_late_by(lag.as_nanos() as u64);
            let started = sh.now_ns();
            let planned = if write {
                match ctx.store.put(key) {
                    Ok(bytes) => PlannedRead::Done { bytes },
                    Err(KvError::Stopped) => break 'run,
                    Err(e) => {
                        result = Err(fail(e));
                        break 'run;
                    }
                }
            } else {
                match ctx.store.plan_read(key) {
                    Ok(p) => p,
                    Err(e) => {
                        result = Err(fail(e));
                        break 'run;
                    }
                }
            };
            match planned {
                PlannedRead::Done { bytes } => {
                    let end = sh.now_ns();
                    let times = OpTimes {
                        due,
                        started,
                        now: end,
                    };
                    let done = OpDone {
                        service_ns: None,
                        bytes,
                    };
                    tally.done(write, times, done, send_interval);
                }
                PlannedRead::Device(read) => {
                    let slot = free.pop().expect("checked above");
                    submit_read(
                        &mut ring,
                        fd,
                        &mut slots[slot],
                        slot,
                        read,
                        due,
                        started,
                        sh.now_ns(),
                    );
                }
            }
        }
        // Sleep until a read completes or the next operation is due (at least a tick). With
        // the next one already due, only a completion can help when every slot is busy; with a
        // slot free, it became due while this batch was issued: go round again.
        let next_due = ops.next_due_ns().min(ctx.end_ns());
        let now = sh.now_ns();
        if !tick_pending && next_due > now {
            let sleep = (next_due - now).max(TICK.as_nanos() as u64);
            tick_ts = types::Timespec::from(Duration::from_nanos(sleep));
            let timeout = opcode::Timeout::new(&tick_ts).build().user_data(TICK_TAG);
            // SAFETY: `tick_ts` outlives the submission below, which copies it.
            if unsafe { ring.submission().push(&timeout) }.is_ok() {
                tick_pending = true;
            }
        }
        let in_flight = free.len() < qd;
        let wait_for = if tick_pending || (in_flight && free.is_empty()) {
            1
        } else {
            0
        };
        if let Err(e) = ring.submit_and_wait(wait_for) {
            if !transient(&e) {
                result = Err(io_fail("io_uring wait", e));
                break;
            }
        }
        if let Err(e) = reap(
            ctx,
            &mut ring,
            fd,
            &mut slots,
            &mut free,
            &mut tick_pending,
            &mut tally,
            send_interval,
        ) {
            result = Err(e);
            break;
        }
    }
    // Reads still in flight write into this thread's buffers: wait for every one.
    while free.len() < qd {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if transient(&e) => {}
            Err(e) => return Err(io_fail("io_uring wait", e)),
        }
        for cqe in ring.completion() {
            if cqe.user_data() != TICK_TAG {
                let slot = cqe.user_data() as usize;
                slots[slot].read = None;
                free.push(slot);
            }
        }
    }
    result?;
    let engine = features.join(", ");
    Ok(tally.finish(&engine, send_interval))
}

#[allow(clippy::too_many_arguments)]
fn submit_read(
    ring: &mut io_uring::IoUring,
    fd: types::Fd,
    slot: &mut Slot,
    index: usize,
    read: DeviceRead,
    due: u64,
    started: u64,
    now: u64,
) {
    let sqe = opcode::Read::new(fd, slot.buf.as_mut_ptr(), read.len as u32)
        .offset(read.offset)
        .build()
        .user_data(index as u64);
    slot.read = Some(InFlight {
        read,
        due,
        started,
        submitted: now,
    });
    // The ring has room for every slot and the tick's timeout, and a slot is queued at most
    // once before it completes, so the queue cannot be full.
    // SAFETY: the slot's buffer stays alive and untouched until this read's completion is
    // reaped (the slot is not free until then, and the thread waits for every slot at exit).
    let pushed = unsafe { ring.submission().push(&sqe) };
    debug_assert!(pushed.is_ok(), "a slot's read always has room in the ring");
}

/// Handles every completion waiting: records and checks finished reads (re-reading a
/// record that moved while it was read), notes an expired tick.
#[allow(clippy::too_many_arguments)]
fn reap(
    ctx: &ClientContext,
    ring: &mut io_uring::IoUring,
    fd: types::Fd,
    slots: &mut [Slot],
    free: &mut Vec<usize>,
    tick_pending: &mut bool,
    tally: &mut ClientTally<'_>,
    send_interval: &dyn Fn(IntervalSample),
) -> Result<(), WorkloadError> {
    let sh = &ctx.shared;
    let worker = ctx.worker;
    let done: Vec<(u64, i32)> = ring
        .completion()
        .map(|c| (c.user_data(), c.result()))
        .collect();
    // After a failure the remaining completions only free their slots (the thread then waits
    // for the rest before it returns).
    let mut failed = None;
    for (tag, res) in done {
        if tag == TICK_TAG {
            *tick_pending = false;
            continue;
        }
        let now = sh.now_ns();
        let index = tag as usize;
        let slot = &mut slots[index];
        let flight = slot.read.take().expect("a completion for a slot in flight");
        if failed.is_some() {
            free.push(index);
            continue;
        }
        if res != flight.read.len as i32 {
            free.push(index);
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
        let data = &slot.buf.as_slice()[..flight.read.len];
        match ctx.store.verify_read(&flight.read, data) {
            Ok(None) => {
                free.push(index);
                let done = OpDone {
                    service_ns: Some(now - flight.submitted),
                    bytes: flight.read.len as u64,
                };
                tally.done(false, flight.times(now), done, send_interval);
            }
            Ok(Some(PlannedRead::Done { bytes })) => {
                free.push(index);
                let done = OpDone {
                    service_ns: None,
                    bytes,
                };
                tally.done(false, flight.times(now), done, send_interval);
            }
            Ok(Some(PlannedRead::Device(again))) => {
                submit_read(
                    ring,
                    fd,
                    slot,
                    index,
                    again,
                    flight.due,
                    flight.started,
                    now,
                );
            }
            Err(error) => {
                free.push(index);
                failed = Some(error);
            }
        }
    }
    match failed {
        Some(error) => Err(WorkloadError::Kv { worker, error }),
        None => Ok(()),
    }
}

fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::ETIME) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}
