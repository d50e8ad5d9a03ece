// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Block layer stages per (device, hardware queue, op): queue time (request started ->
 * issued to the driver) and device time (issued -> completed), as in-kernel log-linear
 * histograms with exact counts and sums. Requests are keyed by `struct request *`. Also
 * counts submitting CPU x completing CPU pairs. Requests issued and completed per device are
 * the stage histograms' counts.
 *
 * Every program has a BTF-typed tracepoint version and a raw-tracepoint twin with the same
 * body; user space enables exactly one of each pair. `block_io_start` (Linux 6.5+) marks the
 * start of a request in its submitter's context, which is also where the optional process
 * filter applies; without it the request's own start_time_ns is used at issue.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "virtgap.h"
#include "vg_hist.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Only count requests started by this process (0: every process). */
const volatile __u32 filter_tgid = 0;
/* Set when the block_io_start program is enabled. */
const volatile bool have_io_start = false;

#define VG_MINORBITS 20
#define VG_REQ_OP_MASK 0xff

struct rq_track {
	__u64 start_ns;
	__u64 issue_ns;
	/* Set at start, cleared at completion: entries are reused, never deleted. */
	__u64 active;
	/* Filled at issue so completion reads nothing from the request. */
	struct vg_block_key key;
	__u32 submit_cpu;
	__u32 pad;
};

/*
 * In-flight requests. Keys are request addresses, which the block layer recycles from fixed
 * pools, so the map holds at most one entry per request structure ever used. Entries are
 * marked inactive at completion and rewritten in place when the address comes back, which
 * avoids a hash insert and delete per I/O; no LRU needed.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VG_MAX_INFLIGHT);
	__type(key, __u64);
	__type(value, struct rq_track);
} requests SEC(".maps");

/* Per-CPU maps below: each CPU updates its own copy without atomics; user space sums. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, VG_MAX_BLOCK_HISTS);
	__type(key, struct vg_block_key);
	__type(value, struct vg_hist);
} block_hists SEC(".maps");

/* Completions by submitting CPU (the index), counted on the completing CPU (the per-CPU copy). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, VG_MAX_CPUS);
	__type(key, __u32);
	__type(value, __u64);
} completions_by_submitter SEC(".maps");


struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, VG_BLOCK_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* All zeroes: the initial value of a new histogram (too large for the BPF stack). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vg_hist);
} zero_hist SEC(".maps");

static __always_inline void bump(__u32 counter)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &counter);

	if (c)
		(*c)++;
}

/*
 * Reads from the request. tp_btf programs dereference kernel pointers directly (plain loads
 * the verifier guards); raw_tp twins must go through bpf_probe_read_kernel. `btf` is a
 * constant in each caller, so each program keeps only its own branch.
 */
static __always_inline void fill_key(struct request *rq, bool btf, struct vg_block_key *key,
				     __u32 *submit_cpu)
{
	struct gendisk *disk;
	__u32 op;

	if (btf) {
		disk = rq->q->disk;
		key->dev = disk ? ((__u32)disk->major << VG_MINORBITS) | disk->first_minor : 0;
		key->hctx = rq->mq_hctx->queue_num;
		op = rq->cmd_flags & VG_REQ_OP_MASK;
		*submit_cpu = rq->mq_ctx->cpu;
	} else {
		disk = BPF_CORE_READ(rq, q, disk);
		key->dev = disk ? ((__u32)BPF_CORE_READ(disk, major) << VG_MINORBITS) |
					  BPF_CORE_READ(disk, first_minor)
				: 0;
		key->hctx = BPF_CORE_READ(rq, mq_hctx, queue_num);
		op = BPF_CORE_READ(rq, cmd_flags) & VG_REQ_OP_MASK;
		*submit_cpu = BPF_CORE_READ(rq, mq_ctx, cpu);
	}
	key->op = op <= VG_OP_DISCARD ? op : VG_OP_OTHER;
}

static __always_inline bool wanted_task(void)
{
	return !filter_tgid || (bpf_get_current_pid_tgid() >> 32) == filter_tgid;
}

static __always_inline void record(struct vg_block_key *key, __u8 stage, __u64 delta)
{
	struct vg_hist *h;

	key->stage = stage;
	h = bpf_map_lookup_elem(&block_hists, key);

	if (!h) {
		__u32 zero = 0;
		void *init = bpf_map_lookup_elem(&zero_hist, &zero);

		if (!init)
			return;
		bpf_map_update_elem(&block_hists, key, init, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&block_hists, key);
		if (!h) {
			bump(VG_BLOCK_DROPPED);
			return;
		}
	}
	vg_hist_add(h, delta, false);
}

static __always_inline int on_io_start(struct request *rq)
{
	__u64 key = (__u64)rq;
	struct rq_track *t;

	if (!wanted_task())
		return 0;
	t = bpf_map_lookup_elem(&requests, &key);
	if (t) {
		t->start_ns = bpf_ktime_get_ns();
		t->issue_ns = 0;
		t->active = 1;
		return 0;
	}
	struct rq_track fresh = { .start_ns = bpf_ktime_get_ns(), .active = 1 };

	if (bpf_map_update_elem(&requests, &key, &fresh, BPF_NOEXIST))
		bump(VG_BLOCK_DROPPED);
	return 0;
}

static __always_inline int on_issue(struct request *rq, bool btf)
{
	__u64 key = (__u64)rq, now = bpf_ktime_get_ns();
	struct rq_track *t = bpf_map_lookup_elem(&requests, &key);

	if (!t || !t->active) {
		/* With block_io_start, a request not seen starting is not ours (or predates us). */
		if (have_io_start || !wanted_task())
			return 0;
		struct rq_track fresh = {
			.start_ns = btf ? rq->start_time_ns : BPF_CORE_READ(rq, start_time_ns),
			.active = 1,
		};

		if (bpf_map_update_elem(&requests, &key, &fresh, BPF_ANY)) {
			bump(VG_BLOCK_DROPPED);
			return 0;
		}
		t = bpf_map_lookup_elem(&requests, &key);
		if (!t)
			return 0;
	}
	/* A requeued request is issued again: its queue time counts from the first start. */
	if (!t->issue_ns) {
		fill_key(rq, btf, &t->key, &t->submit_cpu);
		if (t->start_ns && t->start_ns <= now)
			record(&t->key, VG_STAGE_QUEUE, now - t->start_ns);
	}
	t->issue_ns = now;
	return 0;
}

static __always_inline int on_complete(struct request *rq)
{
	__u64 key = (__u64)rq, now = bpf_ktime_get_ns();
	struct rq_track *t = bpf_map_lookup_elem(&requests, &key);

	if (!t || !t->active)
		return 0;
	t->active = 0;
	if (!t->issue_ns) {
		bump(VG_BLOCK_UNSEEN);
		return 0;
	}
	record(&t->key, VG_STAGE_DEVICE, now - t->issue_ns);
	__u64 *n = bpf_map_lookup_elem(&completions_by_submitter, &t->submit_cpu);

	if (n)
		(*n)++;
	return 0;
}

SEC("tp_btf/block_io_start")
int BPF_PROG(block_io_start_btf, struct request *rq)
{
	return on_io_start(rq);
}

SEC("raw_tp/block_io_start")
int BPF_PROG(block_io_start_raw, struct request *rq)
{
	return on_io_start(rq);
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

SEC("tp_btf/block_rq_complete")
int BPF_PROG(block_rq_complete_btf, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	return on_complete(rq);
}

SEC("raw_tp/block_rq_complete")
int BPF_PROG(block_rq_complete_raw, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	return on_complete(rq);
}

/* Emit the shared types into BTF so the skeleton generates their Rust definitions. */
struct vg_block_key vg_abi_block_key = {};
struct vg_hist vg_abi_hist = {};
enum vg_block_stage vg_abi_block_stage = VG_STAGE_QUEUE;
enum vg_block_op vg_abi_block_op = VG_OP_READ;
enum vg_block_counter vg_abi_block_counter = VG_BLOCK_DROPPED;
