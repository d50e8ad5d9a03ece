//! The synchronous kv client, as ACT's service threads: each takes its share of the schedule
//! one operation at a time, sleeping until the next is due.

use std::time::Duration;

use super::client::{ClientContext, ClientOp, ClientTally, OpTimes, ServiceResult};
use super::store::{KvError, OpDone};
use crate::run::WorkloadError;
use crate::stats::IntervalSample;

/// One synchronous service thread, as ACT's: client operations on its share of the schedule,
/// one at a time, sleeping until each is due.
pub(super) fn run_service_thread(
    ctx: &ClientContext,
    send_interval: &dyn Fn(IntervalSample),
) -> Result<ServiceResult, WorkloadError> {
    let worker = ctx.worker;
    let mut ops = ctx.operations();
    let mut scratch = ctx
        .store
        .read_buffer()
        .map_err(|error| WorkloadError::Kv { worker, error })?;
    let sh = &ctx.shared;
    let mut tally = ClientTally::new(ctx);
    let mut now = sh.now_ns();
    loop {
        tally.at(now);
        if ctx.over(now) {
            break;
        }
        let due = ops.next_due_ns();
        if due > now {
            let wait = (due - now).min(sh.end_ns - now).min(50_000_000);
            std::thread::sleep(Duration::from_nanos(wait));
            now = sh.now_ns();
            continue;
        }
        let lag = ops.lag(now);
        if ctx.fell_behind(lag) {
            break;
        }
        let ClientOp { due, write, key } = ops.take(now);
        tally.issued_late_by(lag.as_nanos() as u64);
        let started = sh.now_ns();
        let result = if write {
            ctx.store.put(key).map(|bytes| OpDone {
                service_ns: None,
                bytes,
                offset: None,
            })
        } else {
            ctx.store.get(key, &mut scratch)
        };
        let done = match result {
            Ok(s) => s,
            // Stopping while waiting for space is the end of the run, not a failure.
            Err(KvError::Stopped) => break,
            Err(error) => return Err(WorkloadError::Kv { worker, error }),
        };
        now = sh.now_ns();
        tally.done(write, OpTimes { due, started, now }, done, send_interval);
    }
    Ok(tally.finish("psync", None, send_interval))
}
