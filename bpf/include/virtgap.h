/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The ABI shared by virtgap's BPF programs and its Rust code. Only fixed-width types and
 * explicit padding; values Rust needs are enums (BTF carries enums, not macros), and Rust
 * reads these types from the generated skeletons, never from hand-written mirrors.
 */
#ifndef VIRTGAP_H
#define VIRTGAP_H

enum virtgap_limits {
	/* Block devices tracked at once. */
	VG_MAX_DEVICES = 64,
};

/* Per-device block-layer counters, keyed by the device number (major << 20 | minor). */
struct vg_block_counts {
	__u64 completions;
	__u64 bytes;
};

#endif /* VIRTGAP_H */
