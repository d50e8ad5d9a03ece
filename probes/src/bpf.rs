//! Generated skeletons, one module per `bpf/*.bpf.c` (listed by `build.rs`), and the
//! plain-data impls that let Rust copy map values into the generated ABI types.
#![allow(
    clippy::all,
    clippy::too_many_lines,
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

/// A skeleton's `struct vg_hist`: every skeleton generates its own copy, and `hist_type!` makes
/// each one this, so that the model type (`hist.rs`) converts from any of them.
pub(crate) trait RawHist {
    /// Counts per slot, as the kernel keeps them.
    fn slots(&self) -> &[u64];
    fn sum_ns(&self) -> u64;
}

macro_rules! hist_type {
    () => {
        impl crate::bpf::RawHist for types::vg_hist {
            fn slots(&self) -> &[u64] {
                &self.slots
            }
            fn sum_ns(&self) -> u64 {
                self.sum_ns
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
