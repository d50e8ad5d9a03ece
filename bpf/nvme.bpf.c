// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * NVMe command latency per (disk, queue id, op): nvme_setup_cmd -> nvme_complete_rq, keyed by
 * `struct request *` (the command id is not needed: the request pointer is unique while the
 * command is outstanding). qid follows the driver: hardware queue index + 1, 0 for the admin
 * queue. These tracepoints live in the nvme_core module, so user space loads this object only
 * when the module is present.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "virtgap.h"
#include "vg_common.bpf.h"
#include "vg_hist.bpf.h"
#include "vg_maps.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Only a pointer to it is passed; its layout is never read. */
struct nvme_command;

/* Commands outstanding: request -> setup time; deleted at completion. User space sizes it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VG_MAX_INFLIGHT);
	__type(key, __u64);
	__type(value, __u64);
} commands SEC(".maps");

/* Shared, atomic updates: a queue id is mostly one CPU's (see block.bpf.c). Sized by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VG_MAX_BLOCK_HISTS);
	__type(key, struct vg_nvme_key);
	__type(value, struct vg_hist);
} nvme_hists SEC(".maps");

VG_ZERO_HIST_MAP;
VG_DROPPED_MAP;

static __always_inline int on_setup(struct request *rq)
{
	__u64 key = (__u64)rq, now = bpf_ktime_get_ns();

	/* Newer verifiers type tracepoint pointers as maybe-NULL: check before any use. */
	if (!rq)
		return 0;
	if (bpf_map_update_elem(&commands, &key, &now, BPF_ANY))
		vg_bump(&dropped, 0);
	return 0;
}

/* `btf`: a tp_btf program's typed pointer, read with plain loads (constant per caller). */
static __always_inline int on_complete(struct request *rq, bool btf)
{
	__u64 key = (__u64)rq, *ts = bpf_map_lookup_elem(&commands, &key), delta;
	struct vg_hist *h;
	__u32 zero = 0;
	void *init;

	if (!rq || !ts)
		return 0;
	struct vg_nvme_key k = { .dev = vg_rq_dev(rq, btf) };

	/* The admin queue's requests have no queuedata. */
	if (btf) {
		k.qid = rq->q->queuedata ? rq->mq_hctx->queue_num + 1 : 0;
		k.op = vg_op_of(rq->cmd_flags);
	} else {
		k.qid = BPF_CORE_READ(rq, q, queuedata) ? BPF_CORE_READ(rq, mq_hctx, queue_num) + 1 : 0;
		k.op = vg_op_of(BPF_CORE_READ(rq, cmd_flags));
	}
	init = bpf_map_lookup_elem(&zero_hist, &zero);
	if (init && vg_elapsed(*ts, bpf_ktime_get_ns(), &delta)) {
		h = vg_lookup_or_init(&nvme_hists, &k, init);
		if (h)
			vg_hist_add(h, delta, true);
		else
			vg_bump(&dropped, 0);
	}
	bpf_map_delete_elem(&commands, &key);
	return 0;
}

SEC("tp_btf/nvme_setup_cmd")
int BPF_PROG(nvme_setup_cmd_btf, struct request *rq, struct nvme_command *cmd)
{
	return on_setup(rq);
}

SEC("raw_tp/nvme_setup_cmd")
int BPF_PROG(nvme_setup_cmd_raw, struct request *rq, struct nvme_command *cmd)
{
	return on_setup(rq);
}

SEC("tp_btf/nvme_complete_rq")
int BPF_PROG(nvme_complete_rq_btf, struct request *rq)
{
	return on_complete(rq, true);
}

SEC("raw_tp/nvme_complete_rq")
int BPF_PROG(nvme_complete_rq_raw, struct request *rq)
{
	return on_complete(rq, false);
}

struct vg_nvme_key vg_abi_nvme_key = {};
struct vg_hist vg_abi_hist = {};
