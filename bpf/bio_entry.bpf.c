// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Notes when each of the followed process's bios enters the block layer: submit_bio_noacct,
 * which every bio passes in its submitter's context before blk-throttle (5.9+). No tracepoint
 * fires there (block_bio_queue comes after the throttle, in its dispatch worker for a held
 * bio), so this needs fentry or, where fentry is refused, a kprobe; user space loads one of
 * the two. This object creates the map and the block object shares it (see vg_bio_entry.bpf.h);
 * where neither loads, block.bpf.c notes a partition's bios at block_bio_remap instead.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "vg_filter.bpf.h"
#include "vg_bio_entry.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("fentry/submit_bio_noacct")
int BPF_PROG(bio_entry_fentry, struct bio *bio)
{
	vg_note_bio_entry(bio);
	return 0;
}

SEC("kprobe/submit_bio_noacct")
int BPF_KPROBE(bio_entry_kprobe, struct bio *bio)
{
	vg_note_bio_entry(bio);
	return 0;
}
