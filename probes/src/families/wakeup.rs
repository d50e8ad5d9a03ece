//! Wakeup -> on-CPU latency of the workload's threads (`bpf/sched.bpf.c`).

use libbpf_rs::skel::Skel;
use libbpf_rs::{Link, Object};

use super::{
    apply_filter, load_tracepoints, note_forks, percpu_entry, percpu_sum, sections_of, takes_forks,
    FamilyDef, LoadContext, LoadResult, LoadedFamily, Signals, Slots, FORK,
};
use crate::bpf::sched::{types, SchedSkel, SchedSkelBuilder};
use crate::error::Unavailable;
use crate::hist::KernelHist;
use crate::model::{ProbeSnapshot, WakeupSnapshot};
use crate::report::{Family, FamilyReport};

pub(super) const FAMILY: FamilyDef = FamilyDef {
    name: "wakeup",
    gives: "wakeup latency of the workload",
    view: "Where the time goes: wakeup delay",
    signals: Signals::Named(&[
        ("sched_wakeup", "wakeup latency of the workload"),
        ("sched_wakeup_new", "wakeup latency of the workload"),
        ("sched_switch", "wakeup latency of the workload"),
        (
            FORK,
            "attach mode: children of followed processes join them",
        ),
    ]),
    modules: &[],
    load,
    sections: sections_of::<SchedSkelBuilder>,
};

struct WakeupProbe<'obj> {
    skel: SchedSkel<'obj>,
    _links: Vec<Link>,
}

fn load<'obj>(cx: &LoadContext<'_>, slots: &'obj mut Slots) -> LoadResult<'obj> {
    let Some(filter) = cx.filter else {
        return Err(FamilyReport::unavailable(
            Family::Wakeup,
            Unavailable::NothingToWatch(crate::error::Absent::FollowedProcesses),
        ));
    };
    let following_self = filter.tgid == std::process::id();
    let setup = |open: &mut crate::bpf::sched::OpenSchedSkel<'_>, _kind| {
        apply_filter!(open, Some(filter));
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.skip_main_thread = following_self;
        }
    };
    let forks = takes_forks(cx);
    let (skel, links, report) = load_tracepoints(
        Family::Wakeup,
        SchedSkelBuilder::default,
        slots,
        cx.kernel,
        &|tp| tp == FORK && !forks,
        &setup,
    )?;
    note_forks(cx, &report);
    Ok((
        Box::new(WakeupProbe {
            skel,
            _links: links,
        }),
        report,
    ))
}

impl LoadedFamily for WakeupProbe<'_> {
    fn read(&self, snap: &mut ProbeSnapshot) {
        let maps = &self.skel.maps;
        let mut latency = KernelHist::default();
        for h in percpu_entry::<types::vg_hist>(&maps.wakeup_hist, &0u32.to_ne_bytes()) {
            latency.merge(&KernelHist::from(&h));
        }
        snap.wakeups = Some(WakeupSnapshot {
            latency,
            dropped: percpu_sum(&maps.dropped, 0),
        });
    }

    fn objects(&self) -> Vec<&Object> {
        vec![self.skel.object()]
    }
}
