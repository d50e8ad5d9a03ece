/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Log-linear histogram slots, computed without a count-leading-zeros instruction (BPF has
 * none). The layout is mirrored by `probes/src/hist.rs`, which unit-tests it. */
#ifndef VG_HIST_BPF_H
#define VG_HIST_BPF_H

#include <bpf/bpf_helpers.h>
#include "virtgap.h"

static __always_inline __u32 vg_log2(__u64 v)
{
	__u32 r = 0, shift;

	shift = (v > 0xffffffffULL) << 5; v >>= shift; r |= shift;
	shift = (v > 0xffff) << 4; v >>= shift; r |= shift;
	shift = (v > 0xff) << 3; v >>= shift; r |= shift;
	shift = (v > 0xf) << 2; v >>= shift; r |= shift;
	shift = (v > 0x3) << 1; v >>= shift; r |= shift;
	r |= (v >> 1);
	return r;
}

static __always_inline __u32 vg_hist_slot(__u64 v)
{
	__u32 e, slot;

	if (v < (1 << VG_HIST_SUB_BITS))
		return v;
	e = vg_log2(v);
	slot = ((e - VG_HIST_SUB_BITS + 1) << VG_HIST_SUB_BITS) +
	       ((v >> (e - VG_HIST_SUB_BITS)) & ((1 << VG_HIST_SUB_BITS) - 1));
	return slot < VG_HIST_SLOTS ? slot : VG_HIST_SLOTS - 1;
}

/* Adds one value; `atomic` when other CPUs may update the same histogram. */
static __always_inline void vg_hist_add(struct vg_hist *h, __u64 v, bool atomic)
{
	__u64 slot = vg_hist_slot(v);

	/*
	 * vg_hist_slot already clamps, so the compiler would drop this check; verifiers before
	 * about 6.8 cannot carry the clamp's bound across the 32-bit arithmetic and reject the
	 * index as unbounded. The barrier keeps the check, on the very register used to index.
	 */
	barrier_var(slot);
	if (slot >= VG_HIST_SLOTS)
		return;
	if (atomic) {
		__sync_fetch_and_add(&h->slots[slot], 1);
		__sync_fetch_and_add(&h->sum_ns, v);
	} else {
		h->slots[slot]++;
		h->sum_ns += v;
	}
}

#endif /* VG_HIST_BPF_H */
