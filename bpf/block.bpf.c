// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Block layer: completions and bytes per device, counted at block_rq_complete. Attached as a
 * BTF-enabled tracepoint (direct access to struct request), with a raw tracepoint twin for
 * kernels without tp_btf; user space enables exactly one of the two.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "virtgap.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The kernel's dev_t layout: 12 bits of major above 20 bits of minor. */
#define VG_MINORBITS 20

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VG_MAX_DEVICES);
	__type(key, __u32);
	__type(value, struct vg_block_counts);
} block_counts SEC(".maps");

static __always_inline void count_completion(struct request *rq, unsigned int nr_bytes)
{
	struct gendisk *disk = BPF_CORE_READ(rq, q, disk);
	struct vg_block_counts zero = {}, *counts;
	__u32 dev;

	if (!disk)
		return;
	dev = ((__u32)BPF_CORE_READ(disk, major) << VG_MINORBITS) | BPF_CORE_READ(disk, first_minor);
	counts = bpf_map_lookup_elem(&block_counts, &dev);
	if (!counts) {
		bpf_map_update_elem(&block_counts, &dev, &zero, BPF_NOEXIST);
		counts = bpf_map_lookup_elem(&block_counts, &dev);
		if (!counts)
			return;
	}
	__sync_fetch_and_add(&counts->completions, 1);
	__sync_fetch_and_add(&counts->bytes, nr_bytes);
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(block_rq_complete_btf, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	count_completion(rq, nr_bytes);
	return 0;
}

SEC("raw_tp/block_rq_complete")
int BPF_PROG(block_rq_complete_raw, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	count_completion(rq, nr_bytes);
	return 0;
}

/* Emit the shared types into BTF so the skeleton generates their Rust definitions. */
struct vg_block_counts vg_abi_block_counts = {};
