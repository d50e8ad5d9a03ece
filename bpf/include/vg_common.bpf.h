/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Helpers shared by the probe families: reading a request's disk and op on every supported
 * kernel (CO-RE), lazily created map entries, and time deltas that refuse to run backwards.
 */
#ifndef VG_COMMON_BPF_H
#define VG_COMMON_BPF_H

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "virtgap.h"

#define VG_MINORBITS 20
#define VG_REQ_OP_MASK 0xff

/* Before 5.15 a request named its disk itself; since, only through its queue. */
struct request___with_rq_disk {
	struct gendisk *rq_disk;
} __attribute__((preserve_access_index));

/*
 * The whole disk of `rq` as the kernel's dev_t (major << 20 | first minor; 0 without a disk).
 * `btf`: a tp_btf program's typed pointer, read with plain loads (bpf_probe_read_kernel calls
 * there were a third of a request's issue); a raw_tp program's is read through the helper.
 */
static __always_inline __u32 vg_rq_dev(struct request *rq, bool btf)
{
	struct request___with_rq_disk *old = (void *)rq;
	struct gendisk *disk;

	if (bpf_core_field_exists(old->rq_disk))
		disk = btf ? old->rq_disk : BPF_CORE_READ(old, rq_disk);
	else
		disk = btf ? rq->q->disk : BPF_CORE_READ(rq, q, disk);
	if (!disk)
		return 0;
	if (btf)
		return ((__u32)disk->major << VG_MINORBITS) | disk->first_minor;
	return ((__u32)BPF_CORE_READ(disk, major) << VG_MINORBITS) | BPF_CORE_READ(disk, first_minor);
}

/* enum vg_block_op of a request's cmd_flags. */
static __always_inline __u8 vg_op_of(__u32 cmd_flags)
{
	__u32 op = cmd_flags & VG_REQ_OP_MASK;

	return op <= VG_OP_DISCARD ? op : VG_OP_OTHER;
}

/* The entry for `key`, created from `init` (a zeroed value) when missing; NULL when full. */
static __always_inline void *vg_lookup_or_init(void *map, const void *key, const void *init)
{
	void *value = bpf_map_lookup_elem(map, key);

	if (value)
		return value;
	bpf_map_update_elem(map, key, init, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, key);
}

/*
 * now - then, or false when the clock appears to run backwards (two CPUs' readings a few ns
 * apart, or a stale start): such a delta would wrap to ~2^64 and poison the maximum.
 */
static __always_inline bool vg_elapsed(__u64 then, __u64 now, __u64 *delta)
{
	if (!then || now < then)
		return false;
	*delta = now - then;
	return true;
}

#endif /* VG_COMMON_BPF_H */
