//! Block stages (`bpf/block.bpf.c`): queue and device time per (device, hardware queue, op),
//! and completions by submitting x completing CPU.

use libbpf_rs::skel::Skel;
use libbpf_rs::{Link, Object};

use super::{
    apply_filter, dev_of, entries, load_tracepoints, percpu_entry, percpu_sum, LoadContext,
    LoadResult, LoadedFamily, Slots,
};
use crate::bpf::block::{types, BlockSkel, BlockSkelBuilder};
use crate::hist::KernelHist;
use crate::model::{
    BlockOp, BlockSnapshot, BlockStage, BlockStageHist, CpuPair, DeviceGauge, ProbeSnapshot,
};
use crate::report::Family;

/// Stages x ops a hardware queue can fill.
const KEYS_PER_QUEUE: u32 = 2 * 5;

struct BlockProbe<'obj> {
    skel: BlockSkel<'obj>,
    _links: Vec<Link>,
    possible_cpus: u32,
}

pub(super) fn load<'obj>(cx: &LoadContext<'_>, slots: &'obj mut Slots) -> LoadResult<'obj> {
    let have_io_start = cx.kernel.has("block_io_start");
    let filter = cx.filter;
    // Before block_io_start, the filter notes the process's bios at block_bio_queue.
    let unused = |tp: &str| tp == "block_bio_queue" && (have_io_start || filter.is_none());
    let inflight = cx.host.inflight_capacity();
    let hists = cx.host.hist_keys(|_| true, KEYS_PER_QUEUE);
    let cpus = cx.host.possible_cpus;
    let setup = |open: &mut crate::bpf::block::OpenBlockSkel<'_>, _kind| {
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.have_io_start = have_io_start;
        }
        apply_filter!(open, filter);
        // A map that cannot be resized keeps its compiled-in default.
        let _ = open.maps.requests.set_max_entries(inflight);
        let _ = open.maps.bios.set_max_entries(inflight);
        let _ = open.maps.block_hists.set_max_entries(hists);
        let _ = open.maps.completions_by_submitter.set_max_entries(cpus);
    };
    let (skel, links, report) = load_tracepoints(
        Family::Block,
        BlockSkelBuilder::default,
        slots,
        cx.kernel,
        &unused,
        &setup,
    )?;
    let probe = BlockProbe {
        skel,
        _links: links,
        possible_cpus: cpus,
    };
    Ok((Box::new(probe), report))
}

fn stage_of(raw: u8) -> BlockStage {
    if u32::from(raw) == types::vg_block_stage::VG_STAGE_QUEUE.0 {
        BlockStage::Queue
    } else {
        BlockStage::Device
    }
}

pub(crate) fn op_of(raw: u8) -> BlockOp {
    use types::vg_block_op as op;
    match u32::from(raw) {
        r if r == op::VG_OP_READ.0 => BlockOp::Read,
        r if r == op::VG_OP_WRITE.0 => BlockOp::Write,
        r if r == op::VG_OP_FLUSH.0 => BlockOp::Flush,
        r if r == op::VG_OP_DISCARD.0 => BlockOp::Discard,
        _ => BlockOp::Other,
    }
}

impl LoadedFamily for BlockProbe<'_> {
    fn read(&self, snap: &mut ProbeSnapshot) {
        let maps = &self.skel.maps;
        let mut block = BlockSnapshot::default();
        for (k, h) in entries::<types::vg_block_key, types::vg_hist>(&maps.block_hists) {
            block.stages.push(BlockStageHist {
                dev: dev_of(k.dev),
                hctx: k.hctx,
                op: op_of(k.op),
                stage: stage_of(k.stage),
                hist: KernelHist::from(&h),
            });
        }
        block.stages.sort_by_key(|s| (s.dev, s.hctx, s.op, s.stage));
        // Issued requests are the queue stage's count, completed ones the device stage's.
        let mut devs: Vec<_> = block.stages.iter().map(|s| s.dev).collect();
        devs.dedup();
        for dev in devs {
            let count = |stage| {
                block
                    .stages
                    .iter()
                    .filter(|s| s.dev == dev && s.stage == stage)
                    .map(|s| s.hist.count)
                    .sum::<u64>()
            };
            let (issued, completed) = (count(BlockStage::Queue), count(BlockStage::Device));
            block.devices.push(DeviceGauge {
                dev,
                inflight: issued as i64 - completed as i64,
                issued,
                completed,
            });
        }
        for submit_cpu in 0..self.possible_cpus {
            let per_cpu =
                percpu_entry::<u64>(&maps.completions_by_submitter, &submit_cpu.to_ne_bytes());
            for (complete_cpu, count) in per_cpu.into_iter().enumerate() {
                if count > 0 {
                    block.cpu_pairs.push(CpuPair {
                        submit_cpu,
                        complete_cpu: complete_cpu as u32,
                        count,
                    });
                }
            }
        }
        block
            .cpu_pairs
            .sort_by_key(|p| (p.submit_cpu, p.complete_cpu));
        block.dropped = percpu_sum(&maps.counters, types::vg_block_counter::VG_BLOCK_DROPPED.0);
        block.unseen = percpu_sum(&maps.counters, types::vg_block_counter::VG_BLOCK_UNSEEN.0);
        snap.block = Some(block);
    }

    fn objects(&self) -> Vec<&Object> {
        vec![self.skel.object()]
    }

    fn cpu_sized_maps(&self) -> &'static [&'static str] {
        &["completions_by_submitter"]
    }
}
