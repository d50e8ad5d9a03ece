// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * The histogram self-test: a program run only through BPF_PROG_TEST_RUN, one value per run,
 * that adds ctx[0] to a histogram with the very helper every probe uses (ctx[1] != 0: the
 * atomic variant). User space then checks each value landed in the slot the layout says, so
 * the slot arithmetic is proven by this kernel's verifier and JIT, not by a transcription.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "virtgap.h"
#include "vg_hist.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* [0]: filled with plain adds, [1]: with atomic adds. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct vg_hist);
} hist_check SEC(".maps");

SEC("raw_tp")
int hist_feed(__u64 *ctx)
{
	__u32 key = ctx[1] ? 1 : 0;
	struct vg_hist *h = bpf_map_lookup_elem(&hist_check, &key);

	if (!h)
		return 1;
	vg_hist_add(h, ctx[0], key == 1);
	return 0;
}

struct vg_hist vg_abi_hist = {};
/* Puts the histogram's layout constants in this skeleton's types, for `probes/src/hist.rs`. */
enum vg_limits vg_abi_limits = VG_HIST_SLOTS;
