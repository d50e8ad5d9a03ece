//! Generated skeletons, one module per `bpf/*.bpf.c` (listed by `build.rs`), and the
//! plain-data impls that let Rust copy map values into the generated ABI types.
#![allow(
    clippy::all,
    missing_debug_implementations,
    unused_imports,
    non_camel_case_types
)]

macro_rules! plain_types {
    ($($ty:ty),* $(,)?) => {
        // SAFETY: the generated types given here are #[repr(C)] structs of plain integers (and
        // arrays of them, explicit padding included) mirroring bpf/include/virtgap.h, or the
        // u32 newtypes of its enums: every byte pattern of their size is valid.
        $( unsafe impl plain::Plain for $ty {} )*
    };
}
pub(crate) use plain_types;

/// Every skeleton generates its own copy of `vg_hist`; each converts to the one model type.
macro_rules! hist_type {
    () => {
        impl From<&types::vg_hist> for crate::KernelHist {
            fn from(h: &types::vg_hist) -> Self {
                crate::KernelHist::from_raw(&h.slots, h.sum_ns)
            }
        }
    };
}

// One module per `bpf/*.bpf.c`, each with the plain-data impls of its ABI types (`build.rs`).
include!(concat!(env!("OUT_DIR"), "/skeletons.rs"));

// The ABI the C side declares; a mismatch breaks the build rather than the numbers.
const _: () = {
    use std::mem::size_of;
    assert!(size_of::<block::types::vg_block_key>() == 8);
    assert!(size_of::<block::types::vg_dev_issues>() == 16);
    let slots = hist_check::types::vg_limits::VG_HIST_SLOTS.0 as usize;
    assert!(size_of::<block::types::vg_hist>() == (slots + 1) * 8);
    assert!(size_of::<irq::types::vg_irq_key>() == 8);
    assert!(size_of::<nvme::types::vg_nvme_key>() == 8);
    assert!(size_of::<irq::types::vg_count_time>() == 16);
};
