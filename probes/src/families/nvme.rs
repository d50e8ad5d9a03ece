//! NVMe command latency per (disk, queue id, op) (`bpf/nvme.bpf.c`). The tracepoints live in
//! the nvme_core module; on kernels without module BTF (5.10) only the raw_tp twins load.

use libbpf_rs::skel::Skel;
use libbpf_rs::{Link, Object};

use super::block::op_of;
use super::{
    dev_of, entries, load_tracepoints, percpu_sum, sections_of, FamilyDef, LoadContext, LoadResult,
    LoadedFamily, Signals, Slots,
};
use crate::attach::TracedModule;
use crate::bpf::nvme::{types, NvmeSkel, NvmeSkelBuilder};
use crate::error::{Absent, Unavailable};
use crate::hist::KernelHist;
use crate::model::{NvmeQueueHist, NvmeSnapshot, ProbeSnapshot};
use crate::report::{Family, FamilyReport};

pub(super) const FAMILY: FamilyDef = FamilyDef {
    name: "nvme",
    gives: "NVMe latency per queue (qid)",
    view: "Devices: NVMe latency per queue",
    signals: Signals::Named(&[
        ("nvme_setup_cmd", "NVMe latency per queue (qid)"),
        ("nvme_complete_rq", "NVMe latency per queue (qid)"),
    ]),
    modules: &[NVME_CORE],
    load,
    sections: sections_of::<NvmeSkelBuilder>,
};

/// The NVMe tracepoints' module.
const NVME_CORE: TracedModule = TracedModule {
    name: "nvme_core",
    prefix: "nvme_",
    system: "nvme",
};

/// Ops per queue id a histogram key can take.
const KEYS_PER_QUEUE: u32 = 5;

struct NvmeProbe<'obj> {
    skel: NvmeSkel<'obj>,
    _links: Vec<Link>,
}

fn load<'obj>(cx: &LoadContext<'_>, slots: &'obj mut Slots) -> LoadResult<'obj> {
    let present = NVME_CORE.loaded() || cx.kernel.has("nvme_setup_cmd");
    if !present {
        return Err(FamilyReport::unavailable(
            Family::Nvme,
            Unavailable::NothingToWatch(Absent::Nvme),
        ));
    }
    let inflight = cx.host.inflight_capacity();
    // The admin queue adds one queue id per controller.
    let keys = cx
        .host
        .hist_keys(|d| d.name.starts_with("nvme"), KEYS_PER_QUEUE)
        + 64;
    let setup = |open: &mut crate::bpf::nvme::OpenNvmeSkel<'_>, _kind| {
        let _ = open.maps.commands.set_max_entries(inflight);
        let _ = open.maps.nvme_hists.set_max_entries(keys);
    };
    let (skel, links, report) = load_tracepoints(
        Family::Nvme,
        NvmeSkelBuilder::default,
        slots,
        cx.kernel,
        &|_| false,
        &setup,
    )?;
    Ok((
        Box::new(NvmeProbe {
            skel,
            _links: links,
        }),
        report,
    ))
}

impl LoadedFamily for NvmeProbe<'_> {
    fn read(&self, snap: &mut ProbeSnapshot) {
        let maps = &self.skel.maps;
        let mut nvme = NvmeSnapshot::default();
        for (k, h) in entries::<types::vg_nvme_key, types::vg_hist>(&maps.nvme_hists) {
            nvme.queues.push(NvmeQueueHist {
                dev: dev_of(k.dev),
                qid: k.qid,
                op: op_of(k.op),
                hist: KernelHist::from(&h),
            });
        }
        nvme.queues.sort_by_key(|q| (q.dev, q.qid, q.op));
        nvme.dropped = percpu_sum(&maps.dropped, 0);
        snap.nvme = Some(nvme);
    }

    fn objects(&self) -> Vec<&Object> {
        vec![self.skel.object()]
    }
}
