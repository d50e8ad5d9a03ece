// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Notes when each of the followed process's bios enters the block layer: submit_bio_noacct,
 * which every bio passes in its submitter's context before blk-throttle (5.9+). No tracepoint
 * fires there (block_bio_queue comes after the throttle, in its dispatch worker for a held
 * bio), so this needs fentry or, where fentry is refused, a kprobe; user space loads one of
 * the two. The map is the block object's (see vg_bio_entry.bpf.h).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "vg_filter.bpf.h"
#include "vg_bio_entry.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

static __always_inline int on_bio_entry(struct bio *bio)
{
	__u64 key = (__u64)bio, now;

	if (!bio || !vg_current_wanted())
		return 0;
	/* The latest submission wins: md passes a bio on again, a recycled bio starts anew. */
	now = bpf_ktime_get_ns();
	bpf_map_update_elem(&bio_entry, &key, &now, BPF_ANY);
	return 0;
}

SEC("fentry/submit_bio_noacct")
int BPF_PROG(bio_entry_fentry, struct bio *bio)
{
	return on_bio_entry(bio);
}

SEC("kprobe/submit_bio_noacct")
int BPF_KPROBE(bio_entry_kprobe, struct bio *bio)
{
	return on_bio_entry(bio);
}
