//! Generated skeletons, one module per `bpf/*.bpf.c`, and the plain-data impls that let Rust
//! copy map values into the generated ABI types.
#![allow(
    clippy::all,
    missing_debug_implementations,
    unused_imports,
    non_camel_case_types
)]

macro_rules! plain_types {
    ($($ty:ty),* $(,)?) => {
        // SAFETY: the generated types are #[repr(C)] structs of plain integers (and arrays of
        // them) mirroring bpf/include/virtgap.h: every byte pattern of their size is valid.
        $( unsafe impl plain::Plain for $ty {} )*
    };
}

/// Every skeleton generates its own copy of `vg_hist`; each converts to the one model type.
macro_rules! hist_type {
    () => {
        impl From<&types::vg_hist> for crate::KernelHist {
            fn from(h: &types::vg_hist) -> Self {
                crate::KernelHist::from_raw(&h.slots, h.count, h.sum_ns)
            }
        }
    };
}

pub mod block {
    include!(concat!(env!("OUT_DIR"), "/block.skel.rs"));
    hist_type!();
    plain_types!(
        types::vg_block_key,
        types::vg_hist,
        types::rq_track,
        types::vg_queue_key,
        types::vg_slow_request
    );
}

pub mod irq {
    include!(concat!(env!("OUT_DIR"), "/irq.skel.rs"));
    hist_type!();
    plain_types!(types::vg_irq_key, types::vg_irq_stats, types::vg_count_time);
}

pub mod sched {
    include!(concat!(env!("OUT_DIR"), "/sched.skel.rs"));
    hist_type!();
    plain_types!(types::vg_hist);
}

pub mod nvme {
    include!(concat!(env!("OUT_DIR"), "/nvme.skel.rs"));
    hist_type!();
    plain_types!(types::vg_nvme_key, types::vg_hist);
}

pub mod msr {
    include!(concat!(env!("OUT_DIR"), "/msr.skel.rs"));
    plain_types!(types::vg_msr_key);
}

pub mod sampler {
    include!(concat!(env!("OUT_DIR"), "/sampler.skel.rs"));
    plain_types!(types::vg_sample_key);
}

pub mod kvm {
    include!(concat!(env!("OUT_DIR"), "/kvm.skel.rs"));
    hist_type!();
    plain_types!(types::vg_kvm_key, types::vg_exit_key, types::vg_hist);
}

pub mod hist_check {
    include!(concat!(env!("OUT_DIR"), "/hist_check.skel.rs"));
    hist_type!();
    plain_types!(types::vg_hist);
}

pub mod bio_entry {
    include!(concat!(env!("OUT_DIR"), "/bio_entry.skel.rs"));
}

pub mod pvpath {
    include!(concat!(env!("OUT_DIR"), "/pvpath.skel.rs"));
    hist_type!();
    plain_types!(types::vg_hist);
}

// The ABI the C side declares; a mismatch breaks the build rather than the numbers.
const _: () = {
    use std::mem::size_of;
    assert!(size_of::<block::types::vg_block_key>() == 8);
    assert!(size_of::<block::types::vg_hist>() == (320 + 2) * 8);
    assert!(size_of::<irq::types::vg_irq_key>() == 8);
    assert!(size_of::<nvme::types::vg_nvme_key>() == 8);
    assert!(size_of::<irq::types::vg_count_time>() == 16);
};
