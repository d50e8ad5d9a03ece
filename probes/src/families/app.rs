//! App latency of the processes attach mode follows (`bpf/app.bpf.c`): their synchronous file
//! system calls, entry to exit, and their io_uring file requests, submission to completion.
//! Only in attach mode: a built-in workload times its own I/O.

use std::cell::RefCell;
use std::rc::Rc;

use libbpf_rs::skel::Skel;
use libbpf_rs::{Link, Object, RingBuffer, RingBufferBuilder};

use super::{
    apply_filter, load_tracepoints, note_forks, percpu_entry, percpu_sum, sections_of, takes_forks,
    FamilyDef, LoadContext, LoadResult, LoadedFamily, Signals, Slots, FORK,
};
use crate::bpf::app::{types, AppSkel, AppSkelBuilder};
use crate::error::Unavailable;
use crate::hist::KernelHist;
use crate::model::{AppHist, AppOp, AppSnapshot, AppVia, ProbeSnapshot, SlowCall};
use crate::report::{Family, FamilyReport};

/// The io_uring submission tracepoint that takes the request (kernels after 6.1), and its
/// name before (6.1 takes the request first too; earlier kernels do not). Where neither takes
/// it, io_uring_complete has another layout and is left out too.
const RING_SUBMIT: &str = "io_uring_submit_req";
const RING_SUBMIT_OLD: &str = "io_uring_submit_sqe";
const RING_COMPLETE: &str = "io_uring_complete";

pub(super) const FAMILY: FamilyDef = FamilyDef {
    name: "app",
    gives: "app latency of attached processes",
    view: "Where the time goes: app latency (attach mode)",
    signals: Signals::Named(&[
        (
            "sys_enter",
            "file system calls of attached processes: start",
        ),
        (
            "sys_exit",
            "file system calls of attached processes: latency",
        ),
        (RING_SUBMIT, "io_uring file requests: submission"),
        (RING_SUBMIT_OLD, "io_uring file requests: submission (6.1)"),
        (RING_COMPLETE, "io_uring file requests: latency"),
        (
            FORK,
            "attach mode: children of followed processes join them",
        ),
    ]),
    modules: &[],
    load,
    sections: sections_of::<AppSkelBuilder>,
};

struct AppProbe<'obj> {
    skel: AppSkel<'obj>,
    _links: Vec<Link>,
    /// Over `slow_calls`; its callback decodes each record into `slow_seen`.
    slow_ring: Option<RingBuffer<'obj>>,
    slow_seen: Rc<RefCell<Vec<SlowCall>>>,
}

fn load<'obj>(cx: &LoadContext<'_>, slots: &'obj mut Slots) -> LoadResult<'obj> {
    let Some(filter) = cx.filter.filter(|f| f.followed.is_some()) else {
        return Err(FamilyReport::unavailable(
            Family::App,
            Unavailable::NothingToWatch(crate::error::Absent::AttachedProcesses),
        ));
    };
    if !cfg!(target_arch = "x86_64") {
        return Err(FamilyReport::unavailable(
            Family::App,
            Unavailable::Other("knows x86-64's system call numbers only".into()),
        ));
    }
    let inflight = cx.host.inflight_capacity();
    let setup = |open: &mut crate::bpf::app::OpenAppSkel<'_>, _kind| {
        apply_filter!(open, Some(filter));
        // A map that cannot be resized keeps its compiled-in default.
        let _ = open.maps.in_ring.set_max_entries(inflight);
    };
    let ring = cx.kernel.has(RING_SUBMIT);
    let old_ring = !ring && cx.kernel.first_arg_is(RING_SUBMIT_OLD, "io_kiocb") == Some(true);
    let forks = takes_forks(cx);
    let (skel, links, report) = load_tracepoints(
        Family::App,
        AppSkelBuilder::default,
        slots,
        cx.kernel,
        &|tp| {
            (tp == FORK && !forks)
                || (tp == RING_SUBMIT_OLD && !old_ring)
                || (tp == RING_COMPLETE && !ring && !old_ring)
        },
        &setup,
    )?;
    note_forks(cx, &report);
    let slow_seen = Rc::new(RefCell::new(Vec::new()));
    let slow_ring = slow_call_ring(&skel, Rc::clone(&slow_seen));
    if slow_ring.is_none() {
        cx.notes
            .borrow_mut()
            .push("app: the slow-call ring buffer did not open; no attached tail autopsy".into());
    }
    let probe = AppProbe {
        skel,
        _links: links,
        slow_ring,
        slow_seen,
    };
    // Nothing is sent until user space sets a threshold.
    probe.set_slow_call_threshold(u64::MAX);
    Ok((Box::new(probe), report))
}

/// A ring buffer over `slow_calls` whose callback decodes each record into `seen`.
fn slow_call_ring<'obj>(
    skel: &AppSkel<'obj>,
    seen: Rc<RefCell<Vec<SlowCall>>>,
) -> Option<RingBuffer<'obj>> {
    let mut builder = RingBufferBuilder::new();
    builder
        .add(&skel.maps.slow_calls, move |bytes: &[u8]| {
            if let Some(r) = super::copy::<types::vg_slow_call>(bytes) {
                if let Some(&(_, via, op)) = kinds().iter().find(|(k, ..)| *k == r.kind) {
                    seen.borrow_mut().push(SlowCall {
                        via,
                        op,
                        tid: r.tid,
                        start_ns: r.start_ns,
                        end_ns: r.end_ns,
                    });
                }
            }
            0
        })
        .ok()?;
    builder.build().ok()
}

/// What each histogram of `app_hists` holds, by its index (enum vg_app_kind).
fn kinds() -> [(u32, AppVia, AppOp); 6] {
    use types::vg_app_kind as k;
    [
        (k::VG_APP_CALL_READ.0, AppVia::Syscall, AppOp::Read),
        (k::VG_APP_CALL_WRITE.0, AppVia::Syscall, AppOp::Write),
        (k::VG_APP_CALL_SYNC.0, AppVia::Syscall, AppOp::Sync),
        (k::VG_APP_RING_READ.0, AppVia::IoUring, AppOp::Read),
        (k::VG_APP_RING_WRITE.0, AppVia::IoUring, AppOp::Write),
        (k::VG_APP_RING_SYNC.0, AppVia::IoUring, AppOp::Sync),
    ]
}

impl LoadedFamily for AppProbe<'_> {
    fn read(&self, snap: &mut ProbeSnapshot) {
        let maps = &self.skel.maps;
        let kinds = kinds()
            .into_iter()
            .map(|(index, via, op)| {
                let key = index.to_ne_bytes();
                let mut latency = KernelHist::default();
                for h in percpu_entry::<types::vg_hist>(&maps.app_hists, &key) {
                    latency.merge(&KernelHist::from(&h));
                }
                AppHist {
                    via,
                    op,
                    latency,
                    bytes: percpu_sum(&maps.app_bytes, index),
                }
            })
            .collect();
        use types::vg_app_counter as c;
        snap.app = Some(AppSnapshot {
            kinds,
            io_submits: percpu_sum(&maps.app_counters, c::VG_APP_IO_SUBMIT.0),
            failed: percpu_sum(&maps.app_counters, c::VG_APP_FAILED.0),
            dropped: percpu_sum(&maps.app_counters, c::VG_APP_DROPPED.0),
            slow_dropped: percpu_sum(&maps.app_counters, c::VG_APP_SLOW_DROPPED.0),
        });
    }

    fn objects(&self) -> Vec<&Object> {
        vec![self.skel.object()]
    }

    fn drain_slow_calls(&self, out: &mut Vec<SlowCall>) {
        if let Some(ring) = &self.slow_ring {
            let _ = ring.consume();
        }
        out.append(&mut self.slow_seen.borrow_mut());
    }

    fn set_slow_call_threshold(&self, ns: u64) {
        let Some(bss) = self.skel.maps.bss_data.as_deref() else {
            return;
        };
        super::store_bss_u64(std::ptr::addr_of!(bss.slow_call_ns), ns);
    }
}
