//! The in-kernel histogram self-test: feeds known values through the BPF histogram helper with
//! BPF_PROG_TEST_RUN (`bpf/hist_check.bpf.c`) and checks that each landed in the slot whose
//! bounds contain it, with exact counts and sums, in both the plain and the atomic variant.
//! It proves the arithmetic on the running kernel's verifier and JIT.

use std::mem::MaybeUninit;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, ProgramInput};

use crate::bpf::hist_check::{types, HistCheckSkelBuilder};
use crate::error::{BpfError, HistMismatch, SelfTestError};
use crate::hist::{slot_bounds, KernelHist, SLOTS};

/// Values that probe every part of the layout: the exact range, each power of two and its
/// neighbours, typical latencies, and values past the last slot.
pub fn probe_values() -> Vec<u64> {
    let mut v: Vec<u64> = (0..16).collect();
    for e in 4..64 {
        let p = 1u64 << e;
        v.extend([p - 1, p, p + 1, p + p / 3]);
    }
    v.extend([
        1_000,
        4_096,
        52_000,
        1_000_000,
        8_000_000,
        64_000_000,
        1_500_000_000,
        u64::MAX,
    ]);
    v
}

/// Runs the self-test; Ok(values checked) or what went wrong.
pub fn histogram_self_test() -> Result<usize, SelfTestError> {
    crate::bpf_permission()?;
    crate::libbpf_log::install();
    let mut slot = MaybeUninit::uninit();
    let (skel, log) = crate::libbpf_log::captured(|| {
        HistCheckSkelBuilder::default()
            .open(&mut slot)
            .and_then(|open| open.load())
    });
    let skel = skel.map_err(|e| BpfError::load(None, e, &log, 4))?;
    let values = probe_values();
    for atomic in [0u64, 1] {
        for &v in &values {
            let mut ctx: Vec<u8> = [v, atomic].iter().flat_map(|x| x.to_ne_bytes()).collect();
            let input = ProgramInput {
                context_in: Some(&mut ctx),
                ..Default::default()
            };
            let out = skel
                .progs
                .hist_feed
                .test_run(input)
                .map_err(SelfTestError::TestRun)?;
            if out.return_value != 0 {
                return Err(SelfTestError::NoHistogram);
            }
        }
        let raw = skel
            .maps
            .hist_check
            .lookup(&(atomic as u32).to_ne_bytes(), MapFlags::ANY)
            .map_err(SelfTestError::Read)?
            .ok_or(SelfTestError::Missing)?;
        let mut h = types::vg_hist::default();
        plain::copy_from_bytes(&mut h, &raw).map_err(|_| SelfTestError::SizeMismatch)?;
        check(&KernelHist::from(&h), &values).map_err(|wrong| SelfTestError::Wrong {
            atomic: atomic == 1,
            wrong,
        })?;
    }
    Ok(values.len())
}

/// Whether `h` holds exactly `values`: per slot, the values whose bounds contain them.
fn check(h: &KernelHist, values: &[u64]) -> Result<(), HistMismatch> {
    let mut expected = vec![0u64; SLOTS];
    for &v in values {
        let slot = (0..SLOTS)
            .find(|&s| {
                let (lo, hi) = slot_bounds(s);
                lo <= v && v <= hi
            })
            .ok_or(HistMismatch::NoSlot(v))?;
        expected[slot] += 1;
    }
    if let Some(s) = (0..SLOTS).find(|&s| h.slots[s] != expected[s]) {
        let (low, high) = slot_bounds(s);
        return Err(HistMismatch::Slot {
            slot: s,
            low,
            high,
            held: h.slots[s],
            expected: expected[s],
        });
    }
    let sum = values.iter().fold(0u64, |a, &v| a.wrapping_add(v));
    if h.count != values.len() as u64 || h.sum_ns != sum {
        return Err(HistMismatch::Totals {
            count: h.count,
            sum: h.sum_ns,
            added: values.len() as u64,
            added_sum: sum,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_catches_a_value_in_the_wrong_slot() {
        let values = [100u64, 5_000];
        let mut h = KernelHist::default();
        for v in values {
            h.record(v);
        }
        assert_eq!(check(&h, &values), Ok(()));
        // One value moved a slot up: the check must notice.
        let s = crate::hist::slot_of(5_000);
        h.slots[s] -= 1;
        h.slots[s + 1] += 1;
        assert!(matches!(
            check(&h, &values),
            Err(HistMismatch::Slot { slot, .. }) if slot == s
        ));
    }
}
