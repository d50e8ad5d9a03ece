// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Block layer stages per (device, hardware queue, op): queue time (request started -> its last
 * issue to the driver) and device time (last issue -> final completion), as in-kernel
 * log-linear histograms with exact counts and sums, both recorded when the request completes.
 * A requeued request is issued again: everything before its last issue is queueing. A request
 * completed in parts ends at its last part. A flush (REQ_OP_FLUSH, or an empty PREFLUSH write:
 * fsync's cache flush) is never issued itself; the block layer issues a per-queue flush command
 * on its behalf, so its one stage is start -> completion, recorded as op "flush", stage device.
 * Requests are tracked by `struct request *` from their start to their completion (or their
 * merge into another request). Also counts submitting CPU x completing CPU pairs.
 *
 * Device time ends where the guest learns of the completion: the entry of the interrupt
 * handler serving the request's hardware queue (user space maps queues to IRQs from sysfs and
 * /proc/interrupts; irq_handler_entry stamps each mapped IRQ's latest entry). From there to the
 * request's completion is the completion stage: the driver's completion path, plus the IPI or
 * softirq hop when the request completes on another CPU. A request whose queue has no known
 * IRQ, or whose IRQ has not entered since its issue, keeps device time to completion and is
 * counted as unsplit.
 *
 * Whose requests: the process filter must apply where a request is started, in its
 * submitter's context, because dispatch may happen later from kblockd or from another task's
 * plug. Linux 6.5+ fires block_io_start there. Before it, the followed process's bios are
 * noted at block_bio_queue (also the submitter's context) and a request is the process's when
 * its first bio was noted; its start is then the request's own start_time_ns, the moment
 * block_io_start would have fired.
 *
 * Where bio_entry.bpf.c could attach (fentry or kprobe on submit_bio_noacct), a request whose
 * first bio is in bio_entry starts when that bio entered the block layer, before blk-throttle
 * and the tag wait, and is the process's even when a worker builds it from a held bio. Where
 * it could not, block_bio_remap notes the same moment for the bios it sees: a partition's,
 * remapped to the whole disk at the top of submit_bio_noacct (and md's or dm's, passed on to
 * a member). A whole disk's bios then start at their request.
 *
 * Tracepoint layouts differ by kernel: before 5.11 (5.10.137 for block_rq_issue) block
 * tracepoints took the request queue first. Programs named *_q_* take that layout; user space
 * enables the one matching this kernel's BTF, and one flavour of each tp_btf / raw_tp twin.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "virtgap.h"
#include "vg_common.bpf.h"
#include "vg_filter.bpf.h"
#include "vg_hist.bpf.h"
#include "vg_maps.bpf.h"
#include "vg_bio_entry.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Set when block_io_start exists (and its program is enabled). */
const volatile bool have_io_start = false;

/*
 * Set where the kernel's own request stamps are exact and asked for: the completion program
 * alone measures a request from them (see complete_by_kernel_stamps); no start or issue
 * program is attached and no slot is taken.
 */
const volatile bool kernel_stamps = false;

struct rq_track {
	__u64 start_ns;
	/* The last issue to the driver (0: not issued). */
	__u64 issue_ns;
	/* First sector as issued, for the slow-request record (as `bytes`). */
	__u64 sector;
	/* Filled at issue so completion reads nothing but its byte count from the request. */
	struct vg_block_key key;
	/* Bytes not yet completed (a partial completion leaves the rest in flight). */
	__u32 bytes_left;
	__u32 bytes;
	/* The thread it was started or claimed for (the slow-request record's). */
	__u32 tid;
	/* The CPU it was submitted on (NR_CPUS is at most 8192). */
	__u16 submit_cpu;
	/* A cache flush (seen at start: the block layer clears REQ_PREFLUSH before completion). */
	__u8 flush;
	/* Its start is its first bio's entry into the block layer (see vg_bio_entry.bpf.h). */
	__u8 from_entry;
};

/*
 * A request slot: the request it serves (0: free) and that request's state, in one cache line:
 * the CPUs that start, issue and complete a request move one line between them, and requests
 * side by side in the array share none. `displaced` belongs to the slot as a first choice, not
 * to the request in it (see request_slot).
 */
struct rq_slot {
	__u64 rq;
	struct rq_track t;
	/* A request whose first choice this slot is was once placed at a later choice. */
	__u8 displaced;
	__u8 pad[7];
};
_Static_assert(sizeof(struct rq_slot) == 64, "a request slot is one cache line");

/*
 * Requests in flight, from start (or first issue) to completion, in slots placed by request
 * (request_place). An array rather than a hash map: the verifier inlines its lookups, and
 * taking or freeing a slot is a store, where the hash map took a bucket lock and an element
 * from its free list at every start and gave it back at every completion (half of the family's
 * cost per I/O). A request takes the first free slot of its VG_REQUEST_PROBES choices; when all
 * hold other requests it is not tracked (counted as dropped). Requests live in the block
 * layer's preallocated pools, so the address of one whose end went unseen comes back, and its
 * next start finds and reuses its old slot. Two CPUs taking the same free slot in the same few
 * nanoseconds would both write it (5.10's BPF has no compare-and-swap): the later keeps it, the
 * other request goes unseen. User space sizes it (a power of two) and sets the mask.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, VG_REQUEST_SLOTS);
	__type(key, __u32);
	__type(value, struct rq_slot);
} requests SEC(".maps");

/* The slot count less one (set by user space with the map's size). */
const volatile __u32 request_slot_mask = VG_REQUEST_SLOTS - 1;

/*
 * With a filter, before 6.5 or with the kernel's stamps: the followed process's bios not yet
 * seen as a request's first bio, each with the thread that submitted it. A direct-mapped array
 * of notes by the bio's address, four to a cache line: a bio is noted in the first of its
 * line's four that is free or already its own, else over the first (a note left by a bio
 * merged away, which nothing reads again; rarely one in flight, whose request then goes
 * uncounted). Noting and finding are stores and loads in one line, where the LRU hash map
 * these were took a lock and moved its lists at every update and delete: it was the costliest
 * part of these programs (the kernel-stamped completion's lookup and delete alone ~140 ns).
 */
struct bio_note {
	__u64 bio; /* 0: free */
	__u64 tid;
};

#define VG_BIO_NOTE_WAYS 4

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, VG_MAX_INFLIGHT);
	__type(key, __u32);
	__type(value, struct bio_note);
} bios SEC(".maps");

/* The note count less one (set by user space with the map's size, a power of two). */
const volatile __u32 bio_note_mask = VG_MAX_INFLIGHT - 1;

/*
 * Shared by every CPU (atomic updates): keys include the hardware queue, whose submitters and
 * completion IRQ are mostly a few CPUs, so a per-CPU copy would multiply memory by the CPU
 * count for little. User space sizes it from the devices' queue counts.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VG_MAX_BLOCK_HISTS);
	__type(key, struct vg_block_key);
	__type(value, struct vg_block_hists);
} block_hists SEC(".maps");

/* All zeroes: a new key's histograms (too large for the BPF stack). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vg_block_hists);
} zero_block_hists SEC(".maps");

/*
 * Completions by submitting CPU (the index), counted on the completing CPU (the per-CPU copy).
 * User space sizes it to the possible CPUs.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, VG_MAX_CPUS);
	__type(key, __u32);
	__type(value, __u64);
} completions_by_submitter SEC(".maps");

/*
 * Reads and writes completed per device whose queue time started at their first bio's entry:
 * set beside the queue stage's count, this says where that device's queue stage starts.
 * Per-CPU, as `issued`.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u64);
} from_bio_entry SEC(".maps");

/*
 * First issues per device: requests in flight = these - completions. Per-CPU (user space sums
 * the copies by device): one counter per device would be written by every CPU that issues to
 * it, each write a locked add on a line the others hold. An array searched from the device's
 * home entry (see count_first_issue) rather than a hash: the verifier inlines its lookups, and
 * each CPU's copy is written by that CPU alone (a program does not nest within itself on a
 * CPU), so claiming a free entry needs no lock. User space sizes it to twice the host's
 * disks (at least 16, at most 256 entries of 16 bytes: 256 B to 4 KiB per CPU).
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, VG_ISSUE_COUNTERS);
	__type(key, __u32);
	__type(value, struct vg_dev_issues);
} issued SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, VG_BLOCK_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* Fibonacci hashing: consecutive values spread over the whole array. */
static __always_inline __u32 spread(__u64 v)
{
	return (__u32)((v * 0x9e3779b97f4a7c15ULL) >> 32);
}

/*
 * A kernel pointer's value as a number. A tp_btf program's typed pointer allows no arithmetic
 * (the verifier refuses it); read back from the stack by a helper it is a plain value. A
 * raw_tp program's is one already.
 */
static __always_inline __u64 address_value(__u64 ptr, bool btf)
{
	__u64 value = 0;

	if (!btf)
		return ptr;
	bpf_probe_read_kernel(&value, sizeof(value), &ptr);
	return value;
}

/* `bio`'s note (NULL: none), or with `claim` and none, where to note it. */
static __always_inline struct bio_note *bio_note(__u64 bio, bool claim)
{
	__u32 line = (spread(bio >> 6) & bio_note_mask) & ~(__u32)(VG_BIO_NOTE_WAYS - 1);
	struct bio_note *first = NULL, *free = NULL;

	if (!bio)
		return NULL;
#pragma unroll
	for (__u32 i = 0; i < VG_BIO_NOTE_WAYS; i++) {
		__u32 index = line + i;
		struct bio_note *n = bpf_map_lookup_elem(&bios, &index);

		if (!n)
			return NULL;
		if (n->bio == bio)
			return n;
		if (!first)
			first = n;
		if (!free && !n->bio)
			free = n;
	}
	if (!claim)
		return NULL;
	return free ? free : first;
}

/* Notes `bio` as submitted by thread `tid`. */
static __always_inline void note_bio(__u64 bio, __u64 tid)
{
	struct bio_note *n = bio_note(bio, true);

	if (!n)
		return;
	/* The thread first: another CPU that finds the bio reads its thread. */
	n->tid = tid;
	n->bio = bio;
}

/* `bio`'s submitting thread, its note used up (false: not noted). */
static __always_inline bool take_bio_note(__u64 bio, __u32 *tid)
{
	struct bio_note *n = bio_note(bio, false);

	if (!n)
		return false;
	if (tid)
		*tid = (__u32)n->tid;
	n->bio = 0;
	return true;
}

/*
 * Where `rq` may be kept: `*first`, its first choice, and `*name`, from which the others are
 * hashed. First choices keep a queue's requests side by side, so the requests in flight share
 * cache lines and pages (the array is far larger than a cache; spread first choices cost about
 * a sixth of the family's time per I/O in a VM). A raw_tp program sees the request's address as
 * an integer (requests are cache-line aligned and side by side in their pools); a tp_btf program
 * sees a typed pointer, on which the verifier allows no arithmetic, so it takes the request's
 * place in its pool: its queue's id and hardware queue, spread, plus its tag (the scheduler's
 * tag where the queue has a scheduler: a driver tag is given only at dispatch). The other
 * choices step from the first by an odd stride hashed from the name (double hashing: distinct
 * slots, and two requests that share a first choice part ways), for when another queue's
 * requests hold it.
 */
static __always_inline void request_place(struct request *rq, bool btf, __u32 *first, __u64 *name)
{
	if (btf) {
		__u64 queue = ((__u64)(__u32)rq->q->id << 20) ^ rq->mq_hctx->queue_num;
		int tag = rq->internal_tag;

		if (tag < 0)
			tag = rq->tag;
		*first = spread(queue) + (__u32)tag;
		*name = (queue << 32) ^ (__u32)tag;
	} else {
		*first = (__u32)((__u64)rq >> 6);
		*name = (__u64)rq >> 6;
	}
}

/*
 * `rq`'s slot, or with `claim` and none yet, the first free one of its choices (NULL: none).
 * A first choice whose `displaced` is clear never sent a request further on, so `rq` is there
 * or nowhere: the common case reads one line, where scanning every choice read four (a third
 * of the start's time in a VM). The flag is never cleared while loaded; a request placed
 * further on sets it before the request's own issue and completion look for it.
 */
static __always_inline struct rq_slot *request_slot(struct request *rq, bool btf, bool claim)
{
	struct rq_slot *home, *free = NULL;
	bool free_elsewhere = false;
	__u32 first, stride;
	__u64 name;

	request_place(rq, btf, &first, &name);
	first &= request_slot_mask;
	home = bpf_map_lookup_elem(&requests, &first);
	if (!home)
		return NULL;
	if (home->rq == (__u64)rq)
		return home;
	if (!home->rq)
		free = home;
	if (!home->displaced && (free || !claim))
		return claim ? free : NULL;
	stride = spread(name) | 1;
#pragma unroll
	for (__u32 i = 1; i < VG_REQUEST_PROBES; i++) {
		__u32 index = (first + i * stride) & request_slot_mask;
		struct rq_slot *s = bpf_map_lookup_elem(&requests, &index);

		if (!s)
			break;
		if (s->rq == (__u64)rq)
			return s;
		if (!free && !s->rq) {
			free = s;
			free_elsewhere = true;
		}
	}
	if (!claim)
		return NULL;
	if (free_elsewhere)
		home->displaced = 1;
	return free;
}

/* Forgets `rq` (merged away, or not the followed process's). */
static __always_inline void release_request(struct request *rq, bool btf)
{
	struct rq_slot *s = request_slot(rq, btf, false);

	if (s)
		s->rq = 0;
}

/* `rq`'s slot, taken for `fresh` (NULL: every probe holds another request). */
static __always_inline struct rq_slot *track_request(struct request *rq, bool btf,
						    struct rq_track *fresh)
{
	struct rq_slot *s = request_slot(rq, btf, true);

	if (!s) {
		vg_bump(&counters, VG_BLOCK_DROPPED);
		return NULL;
	}
	s->t = *fresh;
	s->rq = (__u64)rq;
	return s;
}

/* The IRQ serving each hardware queue (filled by user space before attaching). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VG_MAX_QUEUE_IRQS);
	__type(key, struct vg_queue_key);
	__type(value, __u32);
} queue_irqs SEC(".maps");

/* When each IRQ last entered its handler (where the irq family loads, its program stamps it). */
VG_IRQ_ENTERED_MAP;

/*
 * Requests of the followed process that took at least `slow_request_ns` from start to
 * completion, for the tail autopsy. User space moves the threshold with the application's
 * running tail and drains the buffer every interval (no reader waits on it: records are
 * submitted without a wakeup); a full buffer counts drops.
 */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} slow_requests SEC(".maps");

/* Written by user space while attached (0: every request, until the tail is known). */
__u64 slow_request_ns = 0;

/*
 * Reads from the request. tp_btf programs dereference kernel pointers directly (plain loads
 * the verifier guards); raw_tp twins go through bpf_probe_read_kernel. `btf` is a constant in
 * each caller, so each program keeps only its own branch.
 */
/* REQ_OP_FLUSH, or a write with REQ_PREFLUSH and no data: a cache flush. */
static __always_inline __u8 op_of_request(__u32 cmd_flags, __u32 data_len)
{
	__u32 preflush = 1U << bpf_core_enum_value(enum req_flag_bits, __REQ_PREFLUSH);

	if ((cmd_flags & preflush) && !data_len)
		return VG_OP_FLUSH;
	return vg_op_of(cmd_flags);
}

/*
 * Reads from the request. tp_btf programs dereference kernel pointers directly (plain loads
 * the verifier guards); raw_tp twins go through bpf_probe_read_kernel. `btf` is a constant in
 * each caller, so each program keeps only its own branch.
 */
static __always_inline void fill_key(struct request *rq, bool btf, struct rq_track *t)
{
	__u32 cmd_flags;

	t->key.dev = vg_rq_dev(rq, btf);
	if (btf) {
		t->key.hctx = rq->mq_hctx->queue_num;
		cmd_flags = rq->cmd_flags;
		t->bytes_left = rq->__data_len;
		t->submit_cpu = rq->mq_ctx->cpu;
		t->sector = rq->__sector;
	} else {
		t->key.hctx = BPF_CORE_READ(rq, mq_hctx, queue_num);
		cmd_flags = BPF_CORE_READ(rq, cmd_flags);
		t->bytes_left = BPF_CORE_READ(rq, __data_len);
		t->submit_cpu = BPF_CORE_READ(rq, mq_ctx, cpu);
		t->sector = BPF_CORE_READ(rq, __sector);
	}
	t->bytes = t->bytes_left;
	t->key.op = op_of_request(cmd_flags, t->bytes_left);
}

/*
 * The histograms of `key`'s stages, created empty on first use with the IRQ serving its queue
 * (NULL: the map is full).
 */
static __always_inline struct vg_block_hists *hists_of(struct vg_block_key *key)
{
	struct vg_block_hists *h = bpf_map_lookup_elem(&block_hists, key);
	struct vg_queue_key queue;
	__u32 zero = 0, *irq;
	void *init;

	if (h)
		return h;
	init = bpf_map_lookup_elem(&zero_block_hists, &zero);
	if (!init)
		return NULL;
	h = vg_lookup_or_init(&block_hists, key, init);
	if (!h) {
		vg_bump(&counters, VG_BLOCK_DROPPED);
		return NULL;
	}
	queue = (struct vg_queue_key){ .dev = key->dev, .hctx = key->hctx };
	irq = bpf_map_lookup_elem(&queue_irqs, &queue);
	if (irq)
		h->queue_irq = *irq;
	return h;
}

/*
 * Whether bio_entry may hold notes: set by user space when bio_entry.bpf.c attached, and here by
 * the first bio block_bio_remap notes (a whole disk's bios are never remapped: every request
 * start on it is then spared a lookup that cannot find anything).
 */
bool bio_entry_noted = false;

/*
 * When `rq`'s first bio entered the block layer, if bio_entry noted it (0: not noted, or too
 * long ago to be this bio's). The note is used up.
 */
static __always_inline __u64 take_bio_entry(struct request *rq, bool btf, __u64 now)
{
	__u64 bio, *entered, at;

	/* Every request start of every process passes here: no lookup where nothing is noted. */
	if (!bio_entry_noted)
		return 0;
	bio = btf ? (__u64)rq->bio : (__u64)BPF_CORE_READ(rq, bio);
	if (!bio)
		return 0;
	entered = bpf_map_lookup_elem(&bio_entry, &bio);
	if (!entered)
		return 0;
	at = *entered;
	bpf_map_delete_elem(&bio_entry, &bio);
	return at <= now && now - at < VG_BIO_ENTRY_MAX_AGE_NS ? at : 0;
}

static __always_inline int on_io_start(struct request *rq, bool btf)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	struct rq_track fresh = {
		.start_ns = bpf_ktime_get_ns(),
		.tid = (__u32)pid_tgid,
	};
	__u32 cmd_flags, data_len;
	__u64 entered;

	/* Newer verifiers type tracepoint pointers as maybe-NULL: check before any use. */
	if (!rq)
		return 0;
	/* A held bio's request is built by the throttle's worker: its bio says whose it is. */
	entered = take_bio_entry(rq, btf, fresh.start_ns);
	if (!entered && !vg_current_wanted_as(pid_tgid)) {
		/* The address may have served one of ours that was merged away. */
		release_request(rq, btf);
		return 0;
	}
	if (entered) {
		fresh.start_ns = entered;
		fresh.from_entry = 1;
	}
	cmd_flags = btf ? rq->cmd_flags : BPF_CORE_READ(rq, cmd_flags);
	data_len = btf ? rq->__data_len : BPF_CORE_READ(rq, __data_len);
	fresh.flush = op_of_request(cmd_flags, data_len) == VG_OP_FLUSH;
	track_request(rq, btf, &fresh);
	return 0;
}

static __always_inline int on_bio_queue(struct bio *bio, bool btf)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid(), key;

	if (!bio)
		return 0;
	key = address_value((__u64)bio, btf);
	if (!vg_current_wanted_as(pid_tgid)) {
		/* A recycled bio of ours must not make another process's request look ours. */
		take_bio_note(key, NULL);
		return 0;
	}
	note_bio(key, (__u32)pid_tgid);
	return 0;
}

/*
 * A bio too large for one request is split: the block layer carves `split` off the front and
 * chains it to the original (its bi_private), which goes on as the rest. Only the original
 * passed block_bio_queue and submit_bio_noacct, so the split inherits its notes: else, before
 * block_io_start, every request but the last of a split I/O would be nobody's.
 */
static __always_inline int on_split(struct bio *split, bool btf)
{
	__u64 key = (__u64)split, parent, *noted;
	struct bio_note *note;

	if (!split)
		return 0;
	parent = btf ? (__u64)split->bi_private : (__u64)BPF_CORE_READ(split, bi_private);
	if (!parent)
		return 0;
	note = bio_note(address_value(parent, btf), false);
	if (note)
		note_bio(address_value(key, btf), note->tid);
	if (bio_entry_noted) {
		noted = bpf_map_lookup_elem(&bio_entry, &parent);
		if (noted) {
			__u64 at = *noted;

			bpf_map_update_elem(&bio_entry, &key, &at, BPF_ANY);
		}
	}
	return 0;
}

/* Before block_io_start: whether `rq` is the followed process's, and when it started. */
static __always_inline bool claim_by_bio(struct request *rq, bool btf, __u64 now, __u64 *start,
					 __u8 *from_entry)
{
	__u64 bio = btf ? (__u64)rq->bio : (__u64)BPF_CORE_READ(rq, bio);
	__u64 rq_start = btf ? rq->start_time_ns : BPF_CORE_READ(rq, start_time_ns);
	__u64 entered = take_bio_entry(rq, btf, now);

	if (vg_filtering()) {
		if (!take_bio_note(address_value(bio, btf), NULL) && !entered)
			return false;
	}
	/* start_time_ns is 0 when the queue keeps no I/O statistics: no queue time then. */
	*start = rq_start && rq_start <= now ? rq_start : now;
	if (entered && entered <= *start) {
		*start = entered;
		*from_entry = 1;
	}
	return true;
}

/* `issued`'s entries - 1 (user space sizes the map to the host's disks, a power of two). */
const volatile __u32 issue_counter_mask = VG_ISSUE_COUNTERS - 1;

/*
 * Counts a first issue to `dev` in this CPU's copy of `issued`: its entry is the first from its
 * home that holds it or is free (linear probing; entries are never freed while loaded). A
 * device that finds none counts as dropped.
 */
static __always_inline void count_first_issue(__u32 dev)
{
	__u32 home = spread(dev);

#pragma unroll
	for (__u32 i = 0; i < VG_ISSUE_PROBES; i++) {
		__u32 index = (home + i) & issue_counter_mask;
		struct vg_dev_issues *c = bpf_map_lookup_elem(&issued, &index);

		if (!c)
			return;
		if (c->dev == dev) {
			c->count++;
			return;
		}
		if (!c->dev) {
			c->dev = dev;
			c->count = 1;
			return;
		}
	}
	vg_bump(&counters, VG_BLOCK_DROPPED);
}

static __always_inline int on_issue(struct request *rq, bool btf)
{
	__u64 now = bpf_ktime_get_ns();
	struct rq_slot *s;
	struct rq_track *t;
	bool first_issue;

	if (!rq)
		return 0;
	s = request_slot(rq, btf, false);
	if (!s) {
		struct rq_track fresh = { .tid = (__u32)bpf_get_current_pid_tgid() };

		/* With block_io_start, a request not seen starting is not ours (or predates us). */
		if (have_io_start ||
		    !claim_by_bio(rq, btf, now, &fresh.start_ns, &fresh.from_entry))
			return 0;
		s = track_request(rq, btf, &fresh);
		if (!s)
			return 0;
	}
	t = &s->t;
	first_issue = !t->issue_ns;
	/* A requeued request is issued again: its device time counts from this issue. */
	fill_key(rq, btf, t);
	if (first_issue)
		count_first_issue(t->key.dev);
	t->issue_ns = now;
	return 0;
}

static __always_inline int on_merge(struct request *rq, bool btf)
{
	/* Merged into another request: it will never complete under this address. */
	release_request(rq, btf);
	return 0;
}

/* A flush sequence's own request: never issued, its one stage is start -> completion. */
static __always_inline void complete_unissued(struct request *rq, bool btf, struct rq_track *t, __u64 now)
{
	struct vg_block_hists *h;
	__u64 delta;

	if (!t->flush) {
		vg_bump(&counters, VG_BLOCK_UNSEEN);
		return;
	}
	t->key.dev = vg_rq_dev(rq, btf);
	t->key.hctx = btf ? rq->mq_hctx->queue_num : BPF_CORE_READ(rq, mq_hctx, queue_num);
	t->key.op = VG_OP_FLUSH;
	if (!vg_elapsed(t->start_ns, now, &delta))
		return;
	h = hists_of(&t->key);
	if (h)
		vg_hist_add(&h->stage[VG_STAGE_DEVICE], delta, true);
}

/*
 * block_rq_complete's error argument is a negative errno before 5.17 (int) and a blk_status_t
 * (u8) since: the two never overlap, so a timeout is -ETIMEDOUT or BLK_STS_TIMEOUT (2).
 */
static __always_inline void count_error(__u64 raw_error)
{
	__s32 err = (__s32)raw_error;

	if (!err)
		return;
	vg_bump(&counters, VG_BLOCK_ERRORS);
	if (err == -110 || err == 2)
		vg_bump(&counters, VG_BLOCK_TIMEOUTS);
}

/*
 * When the IRQ serving `t`'s queue (`h`'s) last entered its handler, if that was after the
 * request's issue and not after `now` (the completion); else 0: the split is unknown.
 */
static __always_inline __u64 irq_entry_since(struct vg_block_hists *h, struct rq_track *t, __u64 now)
{
	__u32 irq = h->queue_irq;
	__u64 *entered;

	if (!irq)
		return 0;
	entered = bpf_map_lookup_elem(&irq_entered, &irq);
	if (!entered || *entered < t->issue_ns || *entered > now)
		return 0;
	return *entered;
}

/* Sends a finished request to user space when it was slow enough (see slow_requests). */
static __always_inline void emit_if_slow(struct rq_track *t, __u64 device_end, __u64 now)
{
	struct vg_slow_request *r;

	if (t->key.op == VG_OP_FLUSH || now < t->start_ns || now - t->start_ns < slow_request_ns)
		return;
	r = bpf_ringbuf_reserve(&slow_requests, sizeof(*r), 0);
	if (!r) {
		vg_bump(&counters, VG_BLOCK_SLOW_DROPPED);
		return;
	}
	r->start_ns = t->start_ns;
	r->issue_ns = t->issue_ns;
	r->irq_ns = device_end;
	r->complete_ns = now;
	r->sector = t->sector;
	r->dev = t->key.dev;
	r->bytes = t->bytes;
	r->op = t->key.op;
	__builtin_memset(r->pad, 0, sizeof(r->pad));
	r->tid = t->tid;
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
}

/* The queue stage, start -> issue; false when there is none (no start, or clocks apart). */
static __always_inline bool record_queue(struct vg_block_hists *h, struct rq_track *t)
{
	__u64 delta;

	if (!vg_elapsed(t->start_ns, t->issue_ns, &delta))
		return false;
	vg_hist_add(&h->stage[VG_STAGE_QUEUE], delta, true);
	if (t->from_entry && (t->key.op == VG_OP_READ || t->key.op == VG_OP_WRITE)) {
		__u32 dev = t->key.dev;

		vg_count(&from_bio_entry, &dev, false);
	}
	return true;
}

/*
 * The device stage, issue -> the queue's IRQ entry (or the completion when no entry was seen:
 * counted unsplit), then the completion stage; the submitting CPU's completions, and the
 * slow-request record.
 */
static __always_inline void record_device_on(struct vg_block_hists *h, struct rq_track *t, __u64 now)
{
	__u64 device_end = irq_entry_since(h, t, now), delta, *n;
	__u32 submit_cpu = t->submit_cpu;

	if (!vg_elapsed(t->issue_ns, device_end ? device_end : now, &delta))
		return;
	vg_hist_add(&h->stage[VG_STAGE_DEVICE], delta, true);
	n = bpf_map_lookup_elem(&completions_by_submitter, &submit_cpu);
	if (n)
		(*n)++;
	if (!device_end)
		vg_bump(&counters, VG_BLOCK_UNSPLIT);
	else if (vg_elapsed(device_end, now, &delta))
		vg_hist_add(&h->stage[VG_STAGE_COMPLETION], delta, true);
	emit_if_slow(t, device_end, now);
}

/*
 * Whether a completing request is the followed process's, when no program saw it start: its
 * bio was noted at block_bio_queue (the note, the submitting thread, is used up into `*tid`)
 * or entered the block layer under the bio-entry hook. Every request is, without a filter.
 */
static __always_inline bool owned_at_completion(struct request *rq, bool btf, __u64 now,
						__u32 *tid, __u64 *entered)
{
	__u64 bio = btf ? (__u64)rq->bio : (__u64)BPF_CORE_READ(rq, bio);

	*entered = take_bio_entry(rq, btf, now);
	if (!vg_filtering())
		return true;
	return take_bio_note(address_value(bio, btf), tid) || *entered != 0;
}

/*
 * A request measured at its completion from the kernel's own stamps, where user space found
 * them exact (before 6.9: since, the plug's cached clock gives a batch one time): start_time_ns,
 * taken when the request was made (0 where the queue keeps no I/O statistics: no queue stage
 * then), and io_start_time_ns, taken at each issue (where the queue keeps request statistics:
 * wbt, on by default, turns them on). One program per request instead of three, no slot.
 * A request the kernel never issued is a flush sequence's own (no bytes): its one stage runs
 * from start to completion, as with our stamps; any other counts as never seen issued. A
 * request completed in parts is measured at its last part (its bytes and sector: that part's).
 */
static __always_inline int complete_by_kernel_stamps(struct request *rq, __u64 raw_error,
						     unsigned int nr_bytes, bool btf)
{
	__u64 now = bpf_ktime_get_ns(), entered;
	struct rq_track t = {};
	struct vg_block_hists *h;
	__u32 data_len = btf ? rq->__data_len : BPF_CORE_READ(rq, __data_len);

	/* A partial completion: the rest of the request is still with the device. */
	if (nr_bytes < data_len)
		return 0;
	if (!owned_at_completion(rq, btf, now, &t.tid, &entered))
		return 0;
	count_error(raw_error);
	t.start_ns = btf ? rq->start_time_ns : BPF_CORE_READ(rq, start_time_ns);
	t.issue_ns = btf ? rq->io_start_time_ns : BPF_CORE_READ(rq, io_start_time_ns);
	if (entered && (!t.start_ns || entered <= t.start_ns)) {
		t.start_ns = entered;
		t.from_entry = 1;
	}
	if (!t.issue_ns) {
		t.flush = !data_len;
		complete_unissued(rq, btf, &t, now);
		return 0;
	}
	fill_key(rq, btf, &t);
	count_first_issue(t.key.dev);
	h = hists_of(&t.key);
	if (!h)
		return 0;
	/* Without a start the slow-request record starts at the issue. */
	if (!record_queue(h, &t))
		t.start_ns = t.issue_ns;
	record_device_on(h, &t, now);
	return 0;
}

static __always_inline int on_complete(struct request *rq, __u64 raw_error, unsigned int nr_bytes,
				       bool btf)
{
	__u64 now = bpf_ktime_get_ns();
	struct vg_block_hists *h;
	struct rq_slot *s;
	struct rq_track *t;

	if (!rq)
		return 0;
	if (kernel_stamps)
		return complete_by_kernel_stamps(rq, raw_error, nr_bytes, btf);
	s = request_slot(rq, btf, false);
	if (!s)
		return 0;
	t = &s->t;
	count_error(raw_error);
	if (!t->issue_ns) {
		complete_unissued(rq, btf, t, now);
		s->rq = 0;
		return 0;
	}
	/* A partial completion: the rest of the request is still with the device. */
	if (nr_bytes < t->bytes_left) {
		t->bytes_left -= nr_bytes;
		return 0;
	}
	/* One lookup for all of this request's stages. */
	h = hists_of(&t->key);
	if (h) {
		record_queue(h, t);
		record_device_on(h, t, now);
	}
	s->rq = 0;
	return 0;
}

static __always_inline int on_irq_entry(int irq)
{
	vg_note_irq_entry(irq, bpf_ktime_get_ns());
	return 0;
}

VG_FOLLOW_FORK_PROGRAMS;

SEC("tp_btf/irq_handler_entry")
int BPF_PROG(irq_handler_entry_btf, int irq, struct irqaction *action)
{
	return on_irq_entry(irq);
}

SEC("raw_tp/irq_handler_entry")
int BPF_PROG(irq_handler_entry_raw, int irq, struct irqaction *action)
{
	return on_irq_entry(irq);
}

SEC("tp_btf/block_io_start")
int BPF_PROG(block_io_start_btf, struct request *rq)
{
	return on_io_start(rq, true);
}

SEC("raw_tp/block_io_start")
int BPF_PROG(block_io_start_raw, struct request *rq)
{
	return on_io_start(rq, false);
}

SEC("tp_btf/block_bio_queue")
int BPF_PROG(block_bio_queue_btf, struct bio *bio)
{
	return on_bio_queue(bio, true);
}

SEC("raw_tp/block_bio_queue")
int BPF_PROG(block_bio_queue_raw, struct bio *bio)
{
	return on_bio_queue(bio, false);
}

SEC("tp_btf/block_bio_queue")
int BPF_PROG(block_bio_queue_q_btf, struct request_queue *q, struct bio *bio)
{
	return on_bio_queue(bio, true);
}

SEC("raw_tp/block_bio_queue")
int BPF_PROG(block_bio_queue_q_raw, struct request_queue *q, struct bio *bio)
{
	return on_bio_queue(bio, false);
}

SEC("tp_btf/block_split")
int BPF_PROG(block_split_btf, struct bio *bio, unsigned int new_sector)
{
	return on_split(bio, true);
}

SEC("raw_tp/block_split")
int BPF_PROG(block_split_raw, struct bio *bio, unsigned int new_sector)
{
	return on_split(bio, false);
}

SEC("tp_btf/block_split")
int BPF_PROG(block_split_q_btf, struct request_queue *q, struct bio *bio, unsigned int new_sector)
{
	return on_split(bio, true);
}

SEC("raw_tp/block_split")
int BPF_PROG(block_split_q_raw, struct request_queue *q, struct bio *bio, unsigned int new_sector)
{
	return on_split(bio, false);
}

/*
 * A bio on a partition is remapped to its disk at the top of submit_bio_noacct, in its
 * submitter's context and before blk-throttle: where no hook on that function loaded, its
 * entry is noted here (user space leaves these programs out where the hook attached).
 */
static __always_inline int note_remapped_bio(struct bio *bio)
{
	if (vg_note_bio_entry(bio) && !bio_entry_noted)
		bio_entry_noted = true;
	return 0;
}

SEC("tp_btf/block_bio_remap")
int BPF_PROG(block_bio_remap_btf, struct bio *bio, dev_t dev, sector_t from)
{
	return note_remapped_bio(bio);
}

SEC("raw_tp/block_bio_remap")
int BPF_PROG(block_bio_remap_raw, struct bio *bio, dev_t dev, sector_t from)
{
	return note_remapped_bio(bio);
}

SEC("tp_btf/block_bio_remap")
int BPF_PROG(block_bio_remap_q_btf, struct request_queue *q, struct bio *bio, dev_t dev,
	     sector_t from)
{
	return note_remapped_bio(bio);
}

SEC("raw_tp/block_bio_remap")
int BPF_PROG(block_bio_remap_q_raw, struct request_queue *q, struct bio *bio, dev_t dev,
	     sector_t from)
{
	return note_remapped_bio(bio);
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(block_rq_issue_btf, struct request *rq)
{
	return on_issue(rq, true);
}

SEC("raw_tp/block_rq_issue")
int BPF_PROG(block_rq_issue_raw, struct request *rq)
{
	return on_issue(rq, false);
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(block_rq_issue_q_btf, struct request_queue *q, struct request *rq)
{
	return on_issue(rq, true);
}

SEC("raw_tp/block_rq_issue")
int BPF_PROG(block_rq_issue_q_raw, struct request_queue *q, struct request *rq)
{
	return on_issue(rq, false);
}

SEC("tp_btf/block_rq_merge")
int BPF_PROG(block_rq_merge_btf, struct request *rq)
{
	return on_merge(rq, true);
}

SEC("raw_tp/block_rq_merge")
int BPF_PROG(block_rq_merge_raw, struct request *rq)
{
	return on_merge(rq, false);
}

SEC("tp_btf/block_rq_merge")
int BPF_PROG(block_rq_merge_q_btf, struct request_queue *q, struct request *rq)
{
	return on_merge(rq, true);
}

SEC("raw_tp/block_rq_merge")
int BPF_PROG(block_rq_merge_q_raw, struct request_queue *q, struct request *rq)
{
	return on_merge(rq, false);
}

/*
 * Requeues of followed requests are counted (one holds a slot, or with the kernel's stamps its
 * bio's note); the next issue restarts device time (see on_issue).
 */
static __always_inline int on_requeue(struct request *rq, bool btf)
{
	bool followed;

	if (!rq)
		return 0;
	if (kernel_stamps) {
		__u64 bio = btf ? (__u64)rq->bio : (__u64)BPF_CORE_READ(rq, bio);

		followed = !vg_filtering() || bio_note(address_value(bio, btf), false);
	} else {
		followed = request_slot(rq, btf, false);
	}
	if (followed)
		vg_bump(&counters, VG_BLOCK_REQUEUED);
	return 0;
}

SEC("tp_btf/block_rq_requeue")
int BPF_PROG(block_rq_requeue_btf, struct request *rq)
{
	return on_requeue(rq, true);
}

SEC("raw_tp/block_rq_requeue")
int BPF_PROG(block_rq_requeue_raw, struct request *rq)
{
	return on_requeue(rq, false);
}

/* The error argument is taken as its whole word: its type changed (int errno, then blk_status_t). */
SEC("tp_btf/block_rq_complete")
int BPF_PROG(block_rq_complete_btf, struct request *rq, __u64 error, unsigned int nr_bytes)
{
	return on_complete(rq, error, nr_bytes, true);
}

SEC("raw_tp/block_rq_complete")
int BPF_PROG(block_rq_complete_raw, struct request *rq, __u64 error, unsigned int nr_bytes)
{
	return on_complete(rq, error, nr_bytes, false);
}

/* Emit the shared types into BTF so the skeleton generates their Rust definitions. */
struct vg_block_key vg_abi_block_key = {};
struct vg_hist vg_abi_hist = {};
struct vg_block_hists vg_abi_block_hists = {};
struct vg_slow_request vg_abi_slow_request = {};
enum vg_block_stage vg_abi_block_stage = VG_STAGE_QUEUE;
enum vg_block_op vg_abi_block_op = VG_OP_READ;
enum vg_block_counter vg_abi_block_counter = VG_BLOCK_DROPPED;
enum vg_limits vg_abi_limits = VG_REQUEST_PROBES;
