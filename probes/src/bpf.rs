//! Generated skeletons, one module per `bpf/*.bpf.c`.
#![allow(
    clippy::all,
    missing_debug_implementations,
    unused_imports,
    non_camel_case_types
)]

pub mod block {
    include!(concat!(env!("OUT_DIR"), "/block.skel.rs"));

    // SAFETY: the generated type is #[repr(C)] plain integers with no padding or invalid bit
    // patterns, so any byte string of its size is a valid value.
    unsafe impl plain::Plain for types::vg_block_counts {}
    const _: () = assert!(std::mem::size_of::<types::vg_block_counts>() == 16);
}
