//! Block stages (`bpf/block.bpf.c`): queue and device time per (device, hardware queue, op),
//! and completions by submitting x completing CPU.

use libbpf_rs::skel::Skel;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use libbpf_rs::{Link, MapCore, MapFlags, Object, RingBuffer, RingBufferBuilder};

use super::{
    apply_filter, dev_of, entries, kprobes_unavailable, leaked_object_slot, load_tracepoints,
    note_forks, percpu_entry, percpu_sum, percpu_sums, plain_bytes, sections_of, takes_forks,
    BlockStamps, FamilyDef, HostShape, LoadContext, LoadResult, LoadedFamily, ProcessFilter,
    QueueShape, Signals, Slots, FORK,
};
use crate::attach::{AttachKind, AttachOutcome, KernelTracepoints};
use crate::bpf::bio_entry::{BioEntrySkel, BioEntrySkelBuilder};
use crate::bpf::block::{types, BlockSkel, BlockSkelBuilder, OpenBlockSkel};
use crate::error::BpfError;
use crate::hist::KernelHist;
use crate::model::{
    BlockOp, BlockSnapshot, BlockStage, BlockStageHist, CpuPair, DeviceGauge, ProbeSnapshot,
    SlowRequest,
};
use crate::report::{Family, FamilyReport, BIO_ENTRY_HOOK};

pub(super) const FAMILY: FamilyDef = FamilyDef {
    name: "block",
    gives: "block queue and device time",
    view: "Where the time goes: queue and device stages",
    signals: Signals::Named(&[
        ("block_io_start", "request start, process filter"),
        ("block_bio_queue", "process filter before block_io_start"),
        (
            "block_split",
            "split bios keep their process (and bio-entry time)",
        ),
        (
            REMAP,
            "a partition's bio entry where submit_bio_noacct has no hook",
        ),
        ("block_rq_merge", "requests merged away"),
        (
            FORK,
            "attach mode: children of followed processes join them",
        ),
        ("block_rq_requeue", "requests handed back by the driver"),
        (
            BIO_ENTRY_HOOK,
            "queue from the bio's entry (blk-throttle, tag waits)",
        ),
        ("block_rq_issue", "block queue time"),
        ("block_rq_complete", "device time, cross-CPU completions"),
        ("irq_handler_entry", "device time ends at the queue's IRQ"),
    ]),
    modules: &[],
    load,
    sections,
};

/// The block object's sections and the bio-entry hook's.
fn sections() -> Result<Vec<String>, BpfError> {
    let mut sections = sections_of::<BlockSkelBuilder>()?;
    sections.extend(sections_of::<BioEntrySkelBuilder>()?);
    Ok(sections)
}

/// Ops a hardware queue can fill (each key holds every stage).
const KEYS_PER_QUEUE: u32 = 5;

/// Slots of the in-flight request array for `inflight` tags: twice as many, so that a request
/// rarely finds every slot it may take held by others, and a power of two (the programs mask a
/// hash of the request into it).
fn request_slots(inflight: u32) -> u32 {
    inflight.saturating_mul(2).next_power_of_two()
}

/// Entries of the per-CPU first-issue counters for a host with `disks` block devices: twice as
/// many, so a device finds its entry within a few steps of its home, with room for devices made
/// while attached (device-mapper, loop); a power of two (the programs mask a hash into it).
fn issue_counters(disks: usize) -> u32 {
    let compiled = types::vg_limits::VG_ISSUE_COUNTERS.0;
    (disks as u32)
        .saturating_mul(2)
        .clamp(16, compiled)
        .next_power_of_two()
}

struct BlockProbe<'obj> {
    skel: BlockSkel<'obj>,
    _links: Vec<Link>,
    /// The bio-entry hook, where it attached (queue time then starts at the bio's entry).
    bio_entry_hook: Option<BioEntry>,
    possible_cpus: u32,
    /// The slow-request ring buffer (None: it could not be set up; the autopsy then has none).
    slow_ring: Option<RingBuffer<'obj>>,
    /// What the ring buffer's callback decoded since the last drain.
    slow_seen: Rc<RefCell<Vec<SlowRequest>>>,
}

fn load<'obj>(cx: &LoadContext<'_>, slots: &'obj mut Slots) -> LoadResult<'obj> {
    let have_io_start =
        cx.kernel.has("block_io_start") && std::env::var_os(NO_IO_START_VAR).is_none();
    let kernel_stamps = uses_kernel_stamps(cx);
    let inflight = cx.host.inflight_capacity();
    // The bio-entry hook first: where it attaches, its map is the one both objects share and
    // block_bio_remap is left out; where it cannot, the block object notes a partition's bios
    // itself at block_bio_remap.
    let (bio_entry, hook_outcome) = attach_bio_entry(cx.filter, inflight);
    let found = Sharing::default();
    let setup = BlockSetup {
        cx,
        have_io_start,
        kernel_stamps,
        inflight,
        // Before block_io_start, the filter notes the process's bios at block_bio_queue; a
        // split bio inherits its original's notes (and, with a filter, its bio-entry time).
        forks: takes_forks(cx),
        bio_entry: bio_entry.as_ref(),
        found: &found,
    };
    let (mut skel, links, mut report) = load_tracepoints(
        Family::Block,
        BlockSkelBuilder::default,
        slots,
        cx.kernel,
        &|tp: &str| setup.unused(tp),
        &|open: &mut OpenBlockSkel<'_>, _kind| setup.apply(open),
    )?;
    note_forks(cx, &report);
    found.note_irq_stamps(cx, &mut report);
    map_queue_irqs(&skel, &cx.host.devices);
    let (bio_entry, hook_outcome) = found.hook_kept(bio_entry, hook_outcome);
    // With block_bio_remap instead, the first bio it notes sets the flag in the kernel.
    if let (true, Some(bss)) = (bio_entry.is_some(), skel.maps.bss_data.as_deref_mut()) {
        bss.bio_entry_noted = true;
    }
    report.tracepoints.push(hook_outcome);
    report
        .tracepoints
        .sort_by(|a, b| a.tracepoint.cmp(&b.tracepoint));
    let slow_seen = Rc::new(RefCell::new(Vec::new()));
    let slow_ring = slow_request_ring(&skel, Rc::clone(&slow_seen));
    if slow_ring.is_none() {
        cx.notes
            .borrow_mut()
            .push("block: the slow-request ring buffer did not open; no tail autopsy".into());
    }
    let probe = BlockProbe {
        skel,
        _links: links,
        bio_entry_hook: bio_entry,
        possible_cpus: cx.host.possible_cpus,
        slow_ring,
        slow_seen,
    };
    Ok((Box::new(probe), report))
}

/// Whether stage times come from the kernel's request stamps rather than our own programs, as
/// configured; the notes say which, and why not the kernel's where they were not taken.
fn uses_kernel_stamps(cx: &LoadContext<'_>) -> bool {
    match cx.config.block_stamps {
        BlockStamps::Own => false,
        BlockStamps::KernelUnchecked => true,
        BlockStamps::Kernel => match kernel_stamps_exact(cx.kernel)
            .map_err(str::to_string)
            .and_then(|()| every_queue_stamps_issues(&cx.host.devices))
        {
            Ok(()) => {
                cx.notes.borrow_mut().push(
                    "block: stage times from the kernel's request stamps (start_time_ns, \
                     io_start_time_ns), read at completion: no start or issue program"
                        .into(),
                );
                true
            }
            Err(why) => {
                cx.notes.borrow_mut().push(format!(
                    "block: our own stamps are used, not the kernel's request stamps: {why}"
                ));
                false
            }
        },
    }
}

/// Ok where every request-based device's queue keeps request statistics, so that the kernel
/// stamps each request's issue (`io_start_time_ns`; a request without it would count as never
/// issued). Else the first device it cannot be said of, in words.
fn every_queue_stamps_issues(devices: &[QueueShape]) -> Result<(), String> {
    match devices.iter().find(|d| d.request_stats != Some(true)) {
        None => Ok(()),
        Some(d) if d.request_stats == Some(false) => Err(format!(
            "{}'s queue keeps no request statistics, so the kernel does not stamp its \
             requests' issue",
            d.name
        )),
        Some(d) => Err(format!(
            "nothing here says whether {}'s queue keeps request statistics (no writeback \
             throttling on it, and debugfs not mounted), without which the kernel does not \
             stamp its requests' issue",
            d.name
        )),
    }
}

/// What sharing maps found while the block object opened (set by `BlockSetup::apply`, before
/// `unused` is asked).
#[derive(Default)]
struct Sharing {
    /// Whether the block object shares the bio-entry hook's map; else why not.
    shared: Cell<bool>,
    share_error: RefCell<Option<String>>,
    /// Whether the irq family's interrupt-entry program stamps this object's IRQ entries (its
    /// map taken): then this object's program for that tracepoint is left out. Else why not.
    irq_stamps: Cell<bool>,
    irq_share_error: RefCell<Option<String>>,
}

impl Sharing {
    /// Notes an irq map that could not be shared; where it was, the tracepoint is still this
    /// family's signal, served by the irq family's program.
    fn note_irq_stamps(&self, cx: &LoadContext<'_>, report: &mut FamilyReport) {
        if let (false, Some(e)) = (self.irq_stamps.get(), self.irq_share_error.take()) {
            cx.notes.borrow_mut().push(format!(
                "block: the irq family's interrupt entries could not be shared ({e}); \
                 its own {IRQ_ENTRY} program stamps them"
            ));
        }
        if let (true, Some((_, kind))) = (self.irq_stamps.get(), &cx.shared.borrow().irq_entered) {
            report.tracepoints.push(AttachOutcome {
                tracepoint: IRQ_ENTRY.into(),
                attached: Some(*kind),
                reason: Some("by the irq family's program".into()),
            });
        }
    }

    /// The hook, kept only where its map was shared: one whose map could not be shared notes
    /// nothing the block object reads; block_bio_remap took its place.
    fn hook_kept(
        &self,
        bio_entry: Option<BioEntry>,
        hook_outcome: AttachOutcome,
    ) -> (Option<BioEntry>, AttachOutcome) {
        match (bio_entry, self.shared.get()) {
            (Some(_), false) => (
                None,
                AttachOutcome {
                    attached: None,
                    reason: Some(format!(
                        "sharing its map: {}; {SO_REQUEST}",
                        self.share_error.take().unwrap_or_default()
                    )),
                    ..hook_outcome
                },
            ),
            (hook, _) => (hook, hook_outcome),
        }
    }
}

/// How the block object is opened: its maps sized for this host, its settings, the maps it
/// shares, and the programs it leaves out.
struct BlockSetup<'a> {
    cx: &'a LoadContext<'a>,
    have_io_start: bool,
    kernel_stamps: bool,
    inflight: u32,
    forks: bool,
    bio_entry: Option<&'a BioEntry>,
    found: &'a Sharing,
}

impl BlockSetup<'_> {
    /// Whether tracepoint `tp`'s program is left out. With the kernel's stamps, the completion
    /// alone measures a request; a filter knows the followed process's requests by their bios,
    /// noted at block_bio_queue.
    fn unused(&self, tp: &str) -> bool {
        let (kernel_stamps, filter) = (self.kernel_stamps, self.cx.filter);
        (kernel_stamps && KERNEL_STAMPED.contains(&tp))
            || (tp == "block_bio_queue"
                && ((self.have_io_start && !kernel_stamps) || filter.is_none()))
            || (tp == "block_io_start" && !self.have_io_start)
            || (tp == "block_split" && filter.is_none())
            || (tp == REMAP && self.found.shared.get())
            || (tp == FORK && !self.forks)
            || (tp == IRQ_ENTRY && self.found.irq_stamps.get())
    }

    /// Sizes, settings and shared maps of the opened object, before it loads.
    fn apply(&self, open: &mut OpenBlockSkel<'_>) {
        use std::os::fd::AsFd;
        let host = self.cx.host;
        let (kernel_stamps, inflight) = (self.kernel_stamps, self.inflight);
        // A map that cannot be resized keeps its compiled-in default (and its mask).
        // With the kernel's stamps no request takes a slot.
        let slots = if kernel_stamps {
            1
        } else {
            request_slots(inflight)
        };
        let resized = open.maps.requests.set_max_entries(slots).is_ok();
        let counters = issue_counters(host.devices.len());
        let counters_resized = open.maps.issued.set_max_entries(counters).is_ok();
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.have_io_start = self.have_io_start;
            ro.kernel_stamps = kernel_stamps;
            if resized {
                ro.request_slot_mask = slots - 1;
            }
            if counters_resized {
                ro.issue_counter_mask = counters - 1;
            }
        }
        apply_filter!(open, self.cx.filter);
        // The followed process's bio notes: four to a line, lines indexed by a mask.
        let notes = inflight.next_power_of_two();
        if open.maps.bios.set_max_entries(notes).is_ok() {
            if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
                ro.bio_note_mask = notes - 1;
            }
        }
        let _ = open.maps.bio_entry.set_max_entries(inflight);
        if let Some(hook) = self.bio_entry {
            // The hook's map: what that object writes, this one reads.
            match open
                .maps
                .bio_entry
                .reuse_fd(hook.skel.maps.bio_entry.as_fd())
            {
                Ok(()) => self.found.shared.set(true),
                Err(e) => {
                    self.found.shared.set(false);
                    *self.found.share_error.borrow_mut() = Some(e.to_string());
                }
            }
        }
        let _ = open
            .maps
            .block_hists
            .set_max_entries(host.hist_keys(|_| true, KEYS_PER_QUEUE));
        let _ = open
            .maps
            .completions_by_submitter
            .set_max_entries(host.possible_cpus);
        let _ = open.maps.queue_irqs.set_max_entries(queue_irq_count(host));
        let _ = open
            .maps
            .irq_entered
            .set_max_entries(irq_entered_slots(&host.devices));
        if let Some((fd, _)) = &self.cx.shared.borrow().irq_entered {
            match open.maps.irq_entered.reuse_fd(fd.as_fd()) {
                Ok(()) => self.found.irq_stamps.set(true),
                Err(e) => {
                    self.found.irq_stamps.set(false);
                    *self.found.irq_share_error.borrow_mut() = Some(e.to_string());
                }
            }
        }
    }
}

/// Entries of `queue_irqs`: one per hardware queue's IRQ on the host (at least one).
fn queue_irq_count(host: &HostShape) -> u32 {
    (host
        .devices
        .iter()
        .map(|d| d.queue_irqs.len())
        .sum::<usize>() as u32)
        .max(1)
}

/// Where the kernel's stamps replace our own: a request's start, issue and merge (which only
/// frees a slot).
const KERNEL_STAMPED: [&str; 3] = ["block_io_start", "block_rq_issue", "block_rq_merge"];

/// Ok where the kernel's request stamps are exact: struct request has both, and the plug does
/// not cache the clock (6.9+'s `cur_ktime` gives every request of a batch one time, so a
/// request's queue stage would read 0). Else why not, in words.
pub(crate) fn kernel_stamps_exact(kernel: &KernelTracepoints) -> Result<(), &'static str> {
    let has = |s: &str, m: &str| kernel.has_member(s, m);
    match (
        has("request", "start_time_ns"),
        has("request", "io_start_time_ns"),
        has("blk_plug", "cur_ktime"),
    ) {
        (Some(true), Some(true), Some(false)) => Ok(()),
        (Some(true), Some(true), Some(true)) => {
            Err("this kernel's plug caches one clock reading for a whole batch of requests (6.9+)")
        }
        (None, ..) | (_, None, _) | (.., None) => {
            Err("the kernel's BTF does not say whether they are exact")
        }
        _ => Err("this kernel's struct request lacks them"),
    }
}

/// The highest IRQ number `irq_entered` (an array by IRQ number) holds; a queue's IRQ above it
/// is left unmapped (its requests' device time runs to completion, counted as unsplit).
const MAX_QUEUE_IRQ: u32 = 1 << 17;

/// The tracepoint where device time ends (stamped by the irq family's program where it loads).
const IRQ_ENTRY: &str = "irq_handler_entry";

/// `irq_entered`'s size: one slot per IRQ number up to the highest a queue maps to (the irq
/// object's copy is sized the same, so this object can take it).
pub(super) fn irq_entered_slots(devices: &[QueueShape]) -> u32 {
    devices
        .iter()
        .flat_map(|d| d.queue_irqs.iter().map(|&(_, irq)| irq))
        .filter(|&irq| irq <= MAX_QUEUE_IRQ)
        .max()
        .map_or(1, |irq| irq + 1)
}

/// Each hardware queue's IRQ, so device time can end at its handler's entry.
fn map_queue_irqs(skel: &BlockSkel<'_>, devices: &[QueueShape]) {
    for d in devices {
        for &(hctx, irq) in d.queue_irqs.iter().filter(|q| q.1 <= MAX_QUEUE_IRQ) {
            let queue = types::vg_queue_key { dev: d.dev, hctx };
            let _ =
                skel.maps
                    .queue_irqs
                    .update(plain_bytes(&queue), &irq.to_ne_bytes(), MapFlags::ANY);
        }
    }
}

/// The tracepoint that notes a partition's bios where the hook cannot (see `bpf/block.bpf.c`).
const REMAP: &str = "block_bio_remap";

/// Set (to anything), the hook is not tried: queue time starts as on a kernel without it.
const NO_HOOK_VAR: &str = "VIRTGAP_NO_BIO_ENTRY_HOOK";

/// Set (to anything), block_io_start is left out as on a kernel before 6.5: to measure what the
/// programs cost there on this machine (`doctor --compare-stamps`).
const NO_IO_START_VAR: &str = "VIRTGAP_NO_BLOCK_IO_START";

/// The end of the hook's reason when it did not attach: where queue time starts instead.
const SO_REQUEST: &str = "so queue time starts at the bio's entry only for bios block_bio_remap sees (on a partition, or passed on by md or dm), else when the request starts (blk-throttle and tag waits count as software)";

/// The bio-entry hook (`bpf/bio_entry.bpf.c`): its object (whose map the block object shares)
/// and link, kept for their life.
struct BioEntry {
    skel: BioEntrySkel<'static>,
    _link: Link,
}

/// One way to hook the bio entry: fentry, or a kprobe.
fn try_bio_entry(
    kind: AttachKind,
    filter: Option<ProcessFilter>,
    inflight: u32,
) -> Result<BioEntry, BpfError> {
    use libbpf_rs::skel::{OpenSkel, SkelBuilder};
    let mut open = BioEntrySkelBuilder::default()
        .open(leaked_object_slot())
        .map_err(BpfError::Open)?;
    apply_filter!(open, filter);
    let _ = open.maps.bio_entry.set_max_entries(inflight);
    let fentry = kind == AttachKind::Fentry;
    open.progs.bio_entry_fentry.set_autoload(fentry);
    open.progs.bio_entry_kprobe.set_autoload(!fentry);
    let (skel, log) = crate::libbpf_log::captured(|| open.load());
    let skel = skel.map_err(|e| BpfError::load(None, e, &log, 3))?;
    let link = if fentry {
        skel.progs.bio_entry_fentry.attach()
    } else {
        skel.progs.bio_entry_kprobe.attach()
    }
    .map_err(BpfError::Attach)?;
    Ok(BioEntry { skel, _link: link })
}

/// Hooks the bio entry with fentry, or a kprobe where fentry is refused; the outcome says how,
/// or why neither could.
fn attach_bio_entry(
    filter: Option<ProcessFilter>,
    inflight: u32,
) -> (Option<BioEntry>, AttachOutcome) {
    let outcome = |attached: Option<AttachKind>, reason: Option<String>| AttachOutcome {
        tracepoint: BIO_ENTRY_HOOK.into(),
        attached,
        reason,
    };
    // For the VM tier: block_bio_remap's notes on kernels where the hook would load.
    if std::env::var_os(NO_HOOK_VAR).is_some() {
        let why = format!("left out ({NO_HOOK_VAR} is set); {SO_REQUEST}");
        return (None, outcome(None, Some(why)));
    }
    let fentry = match try_bio_entry(AttachKind::Fentry, filter, inflight) {
        Ok(hook) => return (Some(hook), outcome(Some(AttachKind::Fentry), None)),
        Err(e) => format!("fentry: {e}"),
    };
    if let Some(why) = kprobes_unavailable() {
        return (
            None,
            outcome(None, Some(format!("{fentry}; {why}; {SO_REQUEST}"))),
        );
    }
    match try_bio_entry(AttachKind::Kprobe, filter, inflight) {
        Ok(hook) => (Some(hook), outcome(Some(AttachKind::Kprobe), None)),
        Err(e) => (
            None,
            outcome(None, Some(format!("{fentry}; kprobe: {e}; {SO_REQUEST}"))),
        ),
    }
}

/// A ring buffer over `slow_requests` whose callback decodes each record into `seen`.
fn slow_request_ring<'obj>(
    skel: &BlockSkel<'obj>,
    seen: Rc<RefCell<Vec<SlowRequest>>>,
) -> Option<RingBuffer<'obj>> {
    let mut builder = RingBufferBuilder::new();
    builder
        .add(&skel.maps.slow_requests, move |bytes: &[u8]| {
            if let Some(r) = super::copy::<types::vg_slow_request>(bytes) {
                seen.borrow_mut().push(slow_request_of(&r));
            }
            0
        })
        .ok()?;
    builder.build().ok()
}

fn slow_request_of(r: &types::vg_slow_request) -> SlowRequest {
    SlowRequest {
        dev: dev_of(r.dev),
        sector: r.sector,
        bytes: r.bytes,
        op: op_of(r.op),
        start_ns: r.start_ns,
        issue_ns: r.issue_ns,
        irq_ns: (r.irq_ns != 0).then_some(r.irq_ns),
        complete_ns: r.complete_ns,
        tid: r.tid,
    }
}

/// Each stage's histogram of a key, as `struct vg_block_hists` indexes them, empty ones left
/// out (a stage never recorded: a flush's queue, an unsplit request's completion).
fn stages_of(h: &types::vg_block_hists) -> impl Iterator<Item = (BlockStage, KernelHist)> + '_ {
    use types::vg_block_stage as kernel;
    [
        (kernel::VG_STAGE_QUEUE, BlockStage::Queue),
        (kernel::VG_STAGE_DEVICE, BlockStage::Device),
        (kernel::VG_STAGE_COMPLETION, BlockStage::Completion),
    ]
    .into_iter()
    .map(|(index, stage)| (stage, KernelHist::from(&h.stage[index.0 as usize])))
    .filter(|(_, hist)| !hist.is_empty())
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

/// First issues per device, summed over the CPUs' copies of `issued` (each CPU places a device
/// on its own; a device may sit at different entries on different CPUs).
fn issues_by_device(map: &dyn MapCore) -> Vec<(u32, u64)> {
    let mut by_dev = std::collections::BTreeMap::<u32, u64>::new();
    for index in 0..map.max_entries() {
        for c in percpu_entry::<types::vg_dev_issues>(map, &index.to_ne_bytes()) {
            if c.dev != 0 {
                *by_dev.entry(c.dev).or_default() += c.count;
            }
        }
    }
    by_dev.into_iter().collect()
}

impl LoadedFamily for BlockProbe<'_> {
    fn read(&self, snap: &mut ProbeSnapshot) {
        let maps = &self.skel.maps;
        let mut block = BlockSnapshot::default();
        for (k, h) in entries::<types::vg_block_key, types::vg_block_hists>(&maps.block_hists) {
            for (stage, hist) in stages_of(&h) {
                block.stages.push(BlockStageHist {
                    dev: dev_of(k.dev),
                    hctx: k.hctx,
                    op: op_of(k.op),
                    stage,
                    hist,
                });
            }
        }
        block.stages.sort_by_key(|s| (s.dev, s.hctx, s.op, s.stage));
        // Completed requests are the device stage's count (flushes included).
        let from_entry: Vec<(u32, u64)> = percpu_sums::<u32>(&maps.from_bio_entry);
        for (raw_dev, issued) in issues_by_device(&maps.issued) {
            let dev = dev_of(raw_dev);
            let completed: u64 = block
                .stages
                .iter()
                .filter(|s| s.dev == dev && s.stage == BlockStage::Device)
                .map(|s| s.hist.count)
                .sum();
            block.devices.push(DeviceGauge {
                dev,
                inflight: issued as i64 - completed as i64,
                issued,
                completed,
                from_bio_entry: from_entry
                    .iter()
                    .find(|(d, _)| *d == raw_dev)
                    .map_or(0, |(_, n)| *n),
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
        block.requeued = percpu_sum(&maps.counters, types::vg_block_counter::VG_BLOCK_REQUEUED.0);
        block.errors = percpu_sum(&maps.counters, types::vg_block_counter::VG_BLOCK_ERRORS.0);
        block.timeouts = percpu_sum(&maps.counters, types::vg_block_counter::VG_BLOCK_TIMEOUTS.0);
        block.unsplit = percpu_sum(&maps.counters, types::vg_block_counter::VG_BLOCK_UNSPLIT.0);
        block.slow_dropped = percpu_sum(
            &maps.counters,
            types::vg_block_counter::VG_BLOCK_SLOW_DROPPED.0,
        );

        block.devices.sort_by_key(|d| d.dev);
        snap.block = Some(block);
    }

    fn objects(&self) -> Vec<&Object> {
        let mut objects = vec![self.skel.object()];
        objects.extend(self.bio_entry_hook.as_ref().map(|h| h.skel.object()));
        objects
    }

    fn cpu_sized_maps(&self) -> &'static [&'static str] {
        &["completions_by_submitter"]
    }

    fn drain_slow_requests(&self, out: &mut Vec<SlowRequest>) {
        if let Some(ring) = &self.slow_ring {
            let _ = ring.consume();
        }
        out.append(&mut self.slow_seen.borrow_mut());
    }

    fn set_slow_request_threshold(&self, ns: u64) {
        let Some(bss) = self.skel.maps.bss_data.as_deref() else {
            return;
        };
        super::store_bss_u64(std::ptr::addr_of!(bss.slow_request_ns), ns);
    }
}

/// The request state machine run for real in this kernel (BPF_PROG_TEST_RUN on the raw_tp
/// twins, with made-up request addresses: the raw twins' reads of them come back as zeroes).
#[cfg(test)]
mod tests {
    use std::mem::MaybeUninit;
    use std::os::fd::AsFd;

    use libbpf_rs::skel::{OpenSkel, SkelBuilder};
    use libbpf_rs::{MapCore, MapFlags, OpenObject};

    use super::super::copy;
    use super::super::test_run::{bpf_allowed, now_ns, raw_only, run};
    use super::*;

    const RQ: u64 = 0xffff_8880_dead_0000;

    #[test]
    fn the_kernels_stamps_need_every_queue_to_stamp_issues() {
        let queue = |name: &str, request_stats| QueueShape {
            name: name.into(),
            hw_queues: 1,
            nr_requests: 128,
            dev: 0,
            queue_irqs: vec![],
            request_stats,
        };
        assert_eq!(every_queue_stamps_issues(&[]), Ok(()));
        let vda = queue("vda", Some(true));
        assert_eq!(
            every_queue_stamps_issues(&[vda.clone(), queue("loop0", Some(true))]),
            Ok(())
        );
        let off = every_queue_stamps_issues(&[vda.clone(), queue("sdb", Some(false))]);
        assert!(
            off.as_ref()
                .unwrap_err()
                .starts_with("sdb's queue keeps no request statistics"),
            "{off:?}"
        );
        let unknown = every_queue_stamps_issues(&[queue("nvme0n1", None), vda]);
        assert!(
            unknown
                .as_ref()
                .unwrap_err()
                .contains("whether nvme0n1's queue"),
            "{unknown:?}"
        );
    }

    const SLOTS: u32 = types::vg_limits::VG_REQUEST_PROBES.0;

    /// The block object following `filter_tgid`, with block_io_start; `share` reuses another
    /// object's request and histogram maps.
    fn load<'obj>(
        slot: &'obj mut MaybeUninit<OpenObject>,
        filter_tgid: u32,
        share: Option<&BlockSkel<'_>>,
    ) -> BlockSkel<'obj> {
        let mut open = BlockSkelBuilder::default().open(slot).unwrap();
        // As few request slots as one request may probe: every request's probes cover them
        // all, so the tests find a request by scanning, with no copy of the programs' hash.
        open.maps.requests.set_max_entries(SLOTS).unwrap();
        let ro = open.maps.rodata_data.as_deref_mut().unwrap();
        ro.have_io_start = true;
        ro.filter_tgid = filter_tgid;
        ro.request_slot_mask = SLOTS - 1;
        if let Some(other) = share {
            open.maps
                .requests
                .reuse_fd(other.maps.requests.as_fd())
                .unwrap();
            open.maps
                .block_hists
                .reuse_fd(other.maps.block_hists.as_fd())
                .unwrap();
            open.maps.bios.reuse_fd(other.maps.bios.as_fd()).unwrap();
        }
        raw_only(open.open_object_mut());
        open.load().unwrap()
    }

    /// Every recorded stage of every key.
    fn hists(skel: &BlockSkel<'_>) -> Vec<(types::vg_block_key, BlockStage, KernelHist)> {
        entries::<types::vg_block_key, types::vg_block_hists>(&skel.maps.block_hists)
            .into_iter()
            .flat_map(|(k, h)| {
                stages_of(&h)
                    .map(|(stage, hist)| (k, stage, hist))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn stage(skel: &BlockSkel<'_>, wanted: BlockStage) -> KernelHist {
        let mut total = KernelHist::default();
        for (_, s, h) in hists(skel) {
            if s == wanted {
                total.merge(&h);
            }
        }
        total
    }

    // The request state the tests read and plant: block.bpf.c's own structs, all integers.
    crate::bpf::plain_types!(types::rq_track, types::rq_slot);

    /// Every entry of array map `map`, by index.
    fn array_values<T: plain::Plain + Default>(map: &dyn MapCore) -> Vec<T> {
        (0..map.max_entries())
            .map(|i| {
                let v = map
                    .lookup(&i.to_ne_bytes(), MapFlags::ANY)
                    .unwrap()
                    .unwrap();
                copy::<T>(&v).unwrap()
            })
            .collect()
    }

    /// Every request slot, by index.
    fn slots(skel: &BlockSkel<'_>) -> Vec<types::rq_slot> {
        array_values(&skel.maps.requests)
    }

    fn tracked_at(skel: &BlockSkel<'_>, rq: u64) -> Vec<types::rq_track> {
        slots(skel)
            .into_iter()
            .filter(|s| s.rq == rq)
            .map(|s| s.t)
            .collect()
    }

    fn tracked(skel: &BlockSkel<'_>) -> Option<types::rq_track> {
        tracked_at(skel, RQ).first().copied()
    }

    /// `t` as RQ's state, in its slot or its first choice: slot 0, as a raw_tp program places a
    /// request by its address in 64-byte lines, and RQ / 64 is a multiple of the slot count.
    fn plant(skel: &BlockSkel<'_>, t: types::rq_track) {
        let all = slots(skel);
        let index = all
            .iter()
            .position(|s| s.rq == RQ)
            .or_else(|| (all[0].rq == 0).then_some(0))
            .expect("RQ's first choice is free") as u32;
        let slot = types::rq_slot {
            rq: RQ,
            t,
            ..Default::default()
        };
        let bytes = unsafe {
            // SAFETY: rq_slot is plain old data (see above); viewing it as bytes is sound.
            std::slice::from_raw_parts(
                (&slot as *const types::rq_slot).cast::<u8>(),
                std::mem::size_of_val(&slot),
            )
        };
        skel.maps
            .requests
            .update(&index.to_ne_bytes(), bytes, MapFlags::ANY)
            .unwrap();
    }

    fn ours() -> u32 {
        std::process::id()
    }

    crate::bpf::plain_types!(types::bio_note);

    /// Every bio note held: (bio, submitting thread).
    fn bio_notes(skel: &BlockSkel<'_>) -> Vec<(u64, u64)> {
        array_values::<types::bio_note>(&skel.maps.bios)
            .into_iter()
            .filter(|n| n.bio != 0)
            .map(|n| (n.bio, n.tid))
            .collect()
    }

    /// Bios of ours are noted with the thread that submitted them, each once however often it
    /// passes; a bio of ours recycled by another process is forgotten; notes sharing a line
    /// keep each other.
    #[test]
    fn our_bios_are_noted_once_and_a_recycled_one_is_forgotten() {
        if !bpf_allowed("block bio notes test") {
            return;
        }
        const BIO: u64 = 0xffff_8880_beef_0040;
        let (mut a_slot, mut b_slot) = (MaybeUninit::uninit(), MaybeUninit::uninit());
        let ours = load(&mut a_slot, ours(), None);
        let other = load(&mut b_slot, 1, Some(&ours));
        // SAFETY: gettid has no preconditions.
        let tid = u64::from(unsafe { libc::gettid() } as u32);
        run(&ours.progs.block_bio_queue_raw, &[BIO]);
        run(&ours.progs.block_bio_queue_raw, &[BIO]);
        assert_eq!(bio_notes(&ours), vec![(BIO, tid)]);
        // Bios a line apart and beyond: each has a note of its own.
        let more: Vec<u64> = (1..=6).map(|i| BIO + i * 0x40).collect();
        for &bio in &more {
            run(&ours.progs.block_bio_queue_raw, &[bio]);
        }
        let mut held: Vec<u64> = bio_notes(&ours).into_iter().map(|(b, _)| b).collect();
        held.sort_unstable();
        let mut want = vec![BIO];
        want.extend(&more);
        assert_eq!(held, want);
        run(&other.progs.block_bio_queue_raw, &[BIO]);
        assert!(
            !bio_notes(&ours).iter().any(|&(b, _)| b == BIO),
            "a bio another process recycled is still ours: {:?}",
            bio_notes(&ours)
        );
    }

    /// A request of ours merged away, its address then reused by another process's request:
    /// nothing of the other request may be counted (stale entries used to give it our old start).
    #[test]
    fn a_merged_request_address_reused_by_another_process_counts_nothing() {
        if !bpf_allowed("block state machine test") {
            return;
        }
        let (mut a_slot, mut b_slot) = (MaybeUninit::uninit(), MaybeUninit::uninit());
        let ours = load(&mut a_slot, ours(), None);
        // The same maps seen by a process that is not the one followed (pid 1 never runs this).
        let other = load(&mut b_slot, 1, Some(&ours));
        run(&ours.progs.block_io_start_raw, &[RQ]);
        assert!(
            tracked(&ours).is_some(),
            "our request is tracked from its start"
        );
        run(&ours.progs.block_rq_merge_raw, &[RQ]);
        assert!(tracked(&ours).is_none(), "a merged request is forgotten");

        // Without the merge seen: the other process's start of the reused address resets it.
        run(&ours.progs.block_io_start_raw, &[RQ]);
        run(&other.progs.block_io_start_raw, &[RQ]);
        run(&other.progs.block_rq_issue_raw, &[RQ]);
        run(&other.progs.block_rq_complete_raw, &[RQ, 0, 4096]);
        assert!(
            hists(&ours).is_empty(),
            "another process's request was counted: {:?}",
            hists(&ours)
        );
    }

    /// Issued, handed back, issued again: the device time counts from the last issue, and
    /// everything before it is queueing (the gap used to belong to no stage).
    #[test]
    fn a_requeued_request_queues_until_its_last_issue() {
        if !bpf_allowed("block state machine test") {
            return;
        }
        let mut slot = MaybeUninit::uninit();
        let skel = load(&mut slot, ours(), None);
        run(&skel.progs.block_io_start_raw, &[RQ]);
        run(&skel.progs.block_rq_issue_raw, &[RQ]);
        run(&skel.progs.block_rq_requeue_raw, &[RQ]);
        std::thread::sleep(std::time::Duration::from_millis(30));
        run(&skel.progs.block_rq_issue_raw, &[RQ]);
        run(&skel.progs.block_rq_complete_raw, &[RQ, 0, 0]);
        let queue = stage(&skel, BlockStage::Queue);
        let device = stage(&skel, BlockStage::Device);
        assert_eq!(
            (queue.count, device.count),
            (1, 1),
            "one request, one sample per stage"
        );
        assert!(
            queue.sum_ns >= 30_000_000,
            "queue {} ns holds the requeue gap",
            queue.sum_ns
        );
        assert!(
            device.sum_ns < 30_000_000,
            "device {} ns starts at the last issue",
            device.sum_ns
        );
        assert_eq!(
            percpu_sum(
                &skel.maps.counters,
                types::vg_block_counter::VG_BLOCK_REQUEUED.0
            ),
            1
        );
        let first_issues: u64 = (0..skel.maps.issued.max_entries())
            .flat_map(|i| percpu_entry::<types::vg_dev_issues>(&skel.maps.issued, &i.to_ne_bytes()))
            .map(|c| c.count)
            .sum();
        assert_eq!(
            first_issues, 1,
            "a request issued twice is issued once to its device"
        );
    }

    /// Each CPU places a device in its own copy of the first-issue counters: the gauge sums a
    /// device's entries wherever each CPU put it, and leaves free entries out.
    #[test]
    fn first_issues_sum_over_cpus_wherever_each_cpu_placed_the_device() {
        if !bpf_allowed("block state machine test") {
            return;
        }
        let mut slot = MaybeUninit::uninit();
        let skel = load(&mut slot, ours(), None);
        let cpus = crate::memory::possible_cpus() as usize;
        let entry = |dev: u32, count: u64| {
            let c = types::vg_dev_issues {
                dev,
                count,
                ..Default::default()
            };
            // SAFETY: vg_dev_issues is plain integers (no padding the kernel reads as a field).
            unsafe { plain::as_bytes(&c) }.to_vec()
        };
        let (sda, vdb) = (8 << 20, (254 << 20) | 16);
        // Entry 0: sda on CPU 0, vdb on every other CPU; entry 1: sda on every CPU but 0.
        let at0: Vec<Vec<u8>> = (0..cpus)
            .map(|cpu| {
                if cpu == 0 {
                    entry(sda, 5)
                } else {
                    entry(vdb, 7)
                }
            })
            .collect();
        let at1: Vec<Vec<u8>> = (0..cpus)
            .map(|cpu| if cpu == 0 { entry(0, 0) } else { entry(sda, 3) })
            .collect();
        for (index, values) in [(0u32, at0), (1, at1)] {
            skel.maps
                .issued
                .update_percpu(&index.to_ne_bytes(), &values, MapFlags::ANY)
                .unwrap();
        }
        let others = cpus as u64 - 1;
        let mut expected = vec![(sda, 5 + 3 * others)];
        if others > 0 {
            expected.push((vdb, 7 * others));
        }
        assert_eq!(issues_by_device(&skel.maps.issued), expected);
    }

    #[test]
    fn first_issue_counters_are_twice_the_disks_within_bounds() {
        assert_eq!(issue_counters(0), 16);
        assert_eq!(issue_counters(3), 16);
        assert_eq!(issue_counters(20), 64);
        assert_eq!(issue_counters(5000), types::vg_limits::VG_ISSUE_COUNTERS.0);
    }

    /// A request completed in two parts ends at its last part.
    #[test]
    fn a_partly_completed_request_ends_at_its_last_part() {
        if !bpf_allowed("block state machine test") {
            return;
        }
        let mut slot = MaybeUninit::uninit();
        let skel = load(&mut slot, ours(), None);
        let now = now_ns();
        plant(
            &skel,
            types::rq_track {
                start_ns: now - 2_000_000,
                issue_ns: now - 1_000_000,
                bytes_left: 8192,
                ..Default::default()
            },
        );
        run(&skel.progs.block_rq_complete_raw, &[RQ, 0, 4096]);
        assert_eq!(
            stage(&skel, BlockStage::Device).count,
            0,
            "half done is not done"
        );
        assert_eq!(tracked(&skel).map(|t| t.bytes_left), Some(4096));
        run(&skel.progs.block_rq_complete_raw, &[RQ, 0, 4096]);
        assert_eq!(stage(&skel, BlockStage::Device).count, 1);
        assert!(tracked(&skel).is_none());
    }

    /// A start or issue stamped later than the completion (two CPUs' clocks a hair apart) is
    /// skipped, not recorded as a delta of ~2^64 in the last slot.
    #[test]
    fn time_running_backwards_records_nothing() {
        if !bpf_allowed("block state machine test") {
            return;
        }
        let mut slot = MaybeUninit::uninit();
        let skel = load(&mut slot, ours(), None);
        let later = now_ns() + 10_000_000_000;
        plant(
            &skel,
            types::rq_track {
                start_ns: later - 5,
                issue_ns: later,
                ..Default::default()
            },
        );
        run(&skel.progs.block_rq_complete_raw, &[RQ, 0, 0]);
        let device = stage(&skel, BlockStage::Device);
        assert_eq!(
            device.count, 0,
            "a negative device time was recorded: {:?}",
            device.sum_ns
        );
        assert!(
            tracked(&skel).is_none(),
            "the request is still forgotten at completion"
        );
    }

    /// Requests beyond the slots a request may probe are counted as dropped, never written over
    /// another's; a request whose end went unseen takes its old slot again at its next start,
    /// and a completed one frees its slot for the next.
    #[test]
    fn requests_beyond_their_slots_are_counted_and_an_unseen_end_keeps_one_slot() {
        if !bpf_allowed("block state machine test") {
            return;
        }
        let mut slot = MaybeUninit::uninit();
        let skel = load(&mut slot, ours(), None);
        let requests: Vec<u64> = (0..u64::from(SLOTS) + 1).map(|i| RQ + 512 * i).collect();
        for &rq in &requests {
            run(&skel.progs.block_io_start_raw, &[rq]);
        }
        let dropped = || {
            percpu_sum(
                &skel.maps.counters,
                types::vg_block_counter::VG_BLOCK_DROPPED.0,
            )
        };
        assert_eq!(dropped(), 1, "one request more than the slots");
        // They share a first choice (their addresses are 8 lines apart): the first took it,
        // the others went further on, and it says so.
        assert_eq!(slots(&skel)[0].rq, requests[0]);
        assert_eq!(slots(&skel)[0].displaced, 1);
        for &rq in &requests[..SLOTS as usize] {
            assert_eq!(
                tracked_at(&skel, rq).len(),
                1,
                "request {rq:#x} keeps its slot"
            );
        }
        assert!(tracked_at(&skel, requests[SLOTS as usize]).is_empty());

        // Started again with its first end unseen: still one slot, and nothing more dropped.
        run(&skel.progs.block_io_start_raw, &[requests[0]]);
        assert_eq!(tracked_at(&skel, requests[0]).len(), 1);
        assert_eq!(dropped(), 1);

        // One completes: its slot serves the request that found none.
        run(&skel.progs.block_rq_issue_raw, &[requests[1]]);
        run(&skel.progs.block_rq_complete_raw, &[requests[1], 0, 0]);
        assert!(tracked_at(&skel, requests[1]).is_empty());
        assert_eq!(stage(&skel, BlockStage::Device).count, 1);
        run(&skel.progs.block_io_start_raw, &[requests[SLOTS as usize]]);
        assert_eq!(tracked_at(&skel, requests[SLOTS as usize]).len(), 1);
        assert_eq!(dropped(), 1);
    }

    /// A request alone at its first choice is found there; one sent further on because another
    /// held its first choice is found by its issue and completion too.
    #[test]
    fn a_request_past_its_first_choice_is_found_at_issue_and_completion() {
        if !bpf_allowed("block state machine test") {
            return;
        }
        let mut slot = MaybeUninit::uninit();
        let skel = load(&mut slot, ours(), None);
        let (holder, moved) = (RQ, RQ + 64 * u64::from(SLOTS));
        run(&skel.progs.block_io_start_raw, &[holder]);
        assert_eq!(slots(&skel)[0].displaced, 0, "nothing went further yet");
        run(&skel.progs.block_io_start_raw, &[moved]);
        assert_eq!(slots(&skel)[0].rq, holder);
        assert_eq!(slots(&skel)[0].displaced, 1);
        assert_eq!(tracked_at(&skel, moved).len(), 1);
        for rq in [moved, holder] {
            run(&skel.progs.block_rq_issue_raw, &[rq]);
            run(&skel.progs.block_rq_complete_raw, &[rq, 0, 0]);
            assert!(
                tracked_at(&skel, rq).is_empty(),
                "{rq:#x} freed at completion"
            );
        }
        assert_eq!(stage(&skel, BlockStage::Device).count, 2);
    }
}
