//! Block-layer probes: completions and bytes per device at `block_rq_complete`.

use std::collections::BTreeMap;
use std::mem::MaybeUninit;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

use crate::bpf::block::{types, BlockSkel, BlockSkelBuilder};
use crate::{AttachKind, ProbeError};

const PROBE: &str = "block";

/// Completions and bytes seen for one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockCounts {
    pub completions: u64,
    pub bytes: u64,
}

/// Kernel device number (major, minor) → counts.
pub type DeviceCounts = BTreeMap<(u32, u32), BlockCounts>;

/// Attaches the block probe, runs `work`, and returns what `work` returned together with the
/// completions counted per device while it ran, and how the probe attached.
pub fn count_block_completions<R>(
    work: impl FnOnce() -> R,
) -> Result<(R, DeviceCounts, AttachKind), ProbeError> {
    let mut slots = ObjectSlots {
        tp_btf: MaybeUninit::uninit(),
        raw_tp: MaybeUninit::uninit(),
    };
    let (skel, kind) = load_and_attach(&mut slots)?;
    let result = work();
    let counts = read_counts(&skel)?;
    Ok((result, counts, kind))
}

/// Storage for the object: one slot per attach attempt, since a failed load consumes its slot.
struct ObjectSlots {
    tp_btf: MaybeUninit<libbpf_rs::OpenObject>,
    raw_tp: MaybeUninit<libbpf_rs::OpenObject>,
}

/// Loads the object with exactly one twin enabled: tp_btf first, raw_tp if that fails.
fn load_and_attach(slots: &mut ObjectSlots) -> Result<(BlockSkel<'_>, AttachKind), ProbeError> {
    let ObjectSlots { tp_btf, raw_tp } = slots;
    let btf_error = match try_attach(tp_btf, AttachKind::TpBtf) {
        Ok(skel) => return Ok((skel, AttachKind::TpBtf)),
        Err(e) => e,
    };
    try_attach(raw_tp, AttachKind::RawTp)
        .map(|skel| (skel, AttachKind::RawTp))
        .map_err(|raw_error| ProbeError::Unsupported {
            probe: PROBE,
            reason: format!("tp_btf: {btf_error}; raw_tp: {raw_error}"),
        })
}

fn try_attach(
    object: &mut MaybeUninit<libbpf_rs::OpenObject>,
    kind: AttachKind,
) -> Result<BlockSkel<'_>, libbpf_rs::Error> {
    let mut open = BlockSkelBuilder::default().open(object)?;
    open.progs
        .block_rq_complete_btf
        .set_autoload(kind == AttachKind::TpBtf);
    open.progs
        .block_rq_complete_raw
        .set_autoload(kind == AttachKind::RawTp);
    let mut skel = open.load()?;
    skel.attach()?;
    Ok(skel)
}

fn read_counts(skel: &BlockSkel<'_>) -> Result<DeviceCounts, ProbeError> {
    let map = &skel.maps.block_counts;
    let mut out = DeviceCounts::new();
    for key in map.keys() {
        let value = map
            .lookup(&key, MapFlags::ANY)
            .map_err(|err| ProbeError::Read {
                probe: PROBE,
                map: "block_counts",
                err,
            })?;
        let (Some(value), Ok(dev)) = (value, <[u8; 4]>::try_from(key.as_slice())) else {
            continue;
        };
        let mut counts = types::vg_block_counts::default();
        if plain::copy_from_bytes(&mut counts, &value).is_err() {
            continue;
        }
        let dev = u32::from_ne_bytes(dev);
        out.insert(
            (dev >> 20, dev & 0xf_ffff),
            BlockCounts {
                completions: counts.completions,
                bytes: counts.bytes,
            },
        );
    }
    Ok(out)
}
