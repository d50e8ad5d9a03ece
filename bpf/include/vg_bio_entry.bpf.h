/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * When each of the followed process's bios entered the block layer (submit_bio_noacct, in the
 * submitter's context, before blk-throttle can hold it). bio_entry.bpf.c fills it where the
 * kernel lets a program attach to that function (its object creates the map and user space
 * hands the fd to block.bpf.c's); elsewhere block.bpf.c fills it itself at block_bio_remap,
 * which fires at the same point for a bio on a partition (and where md or dm remaps one).
 * block.bpf.c reads it when a request starts: the request's queue time then runs from its
 * first bio's entry, so throttling and tag waits are queueing, and a request a worker builds
 * from a held bio is still the process's.
 */
#ifndef VG_BIO_ENTRY_BPF_H
#define VG_BIO_ENTRY_BPF_H

#include <bpf/bpf_helpers.h>
#include "virtgap.h"
#include "vg_filter.bpf.h"

/* An entry older than this is a recycled bio's left-over (bios merged away are never read). */
#define VG_BIO_ENTRY_MAX_AGE_NS (10ULL * 1000 * 1000 * 1000)

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, VG_MAX_INFLIGHT);
	__type(key, __u64);
	__type(value, __u64);
} bio_entry SEC(".maps");

/*
 * Notes `bio` as entering now, if it is the followed process's (true: noted). The latest entry
 * wins: md and dm pass a bio on, and a recycled bio starts anew. Another context's submission
 * leaves the note alone: on older kernels (5.10) blk-throttle's worker submits a held bio
 * again, and the note is its entry (a note left by a bio merged away ages out:
 * VG_BIO_ENTRY_MAX_AGE_NS).
 */
static __always_inline bool vg_note_bio_entry(struct bio *bio)
{
	__u64 key = (__u64)bio, now;

	if (!bio || !vg_current_wanted())
		return false;
	now = bpf_ktime_get_ns();
	return bpf_map_update_elem(&bio_entry, &key, &now, BPF_ANY) == 0;
}

#endif /* VG_BIO_ENTRY_BPF_H */
