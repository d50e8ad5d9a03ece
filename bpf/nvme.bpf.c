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
#include "vg_hist.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Only a pointer to it is passed; its layout is never read. */
struct nvme_command;

#define VG_MINORBITS 20
#define VG_REQ_OP_MASK 0xff

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VG_MAX_INFLIGHT);
	__type(key, __u64);
	__type(value, __u64);
} commands SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, VG_MAX_BLOCK_HISTS);
	__type(key, struct vg_nvme_key);
	__type(value, struct vg_hist);
} nvme_hists SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vg_hist);
} zero_hist SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} dropped SEC(".maps");

static __always_inline int on_setup(struct request *rq)
{
	__u64 key = (__u64)rq, now = bpf_ktime_get_ns();
	__u64 *ts = bpf_map_lookup_elem(&commands, &key);

	if (ts) {
		*ts = now;
		return 0;
	}
	if (bpf_map_update_elem(&commands, &key, &now, BPF_NOEXIST)) {
		__u32 zero = 0;
		__u64 *d = bpf_map_lookup_elem(&dropped, &zero);

		if (d)
			(*d)++;
	}
	return 0;
}

static __always_inline int on_complete(struct request *rq)
{
	__u64 key = (__u64)rq, *ts = bpf_map_lookup_elem(&commands, &key);
	struct gendisk *disk;
	struct vg_hist *h;
	__u32 zero = 0, op;

	if (!ts || !*ts)
		return 0;
	disk = BPF_CORE_READ(rq, q, disk);
	op = BPF_CORE_READ(rq, cmd_flags) & VG_REQ_OP_MASK;
	struct vg_nvme_key k = {
		.dev = disk ? ((__u32)BPF_CORE_READ(disk, major) << VG_MINORBITS) | BPF_CORE_READ(disk, first_minor) : 0,
		/* The admin queue's requests have no queuedata. */
		.qid = BPF_CORE_READ(rq, q, queuedata) ? BPF_CORE_READ(rq, mq_hctx, queue_num) + 1 : 0,
		.op = op <= VG_OP_DISCARD ? op : VG_OP_OTHER,
	};
	h = bpf_map_lookup_elem(&nvme_hists, &k);
	if (!h) {
		void *init = bpf_map_lookup_elem(&zero_hist, &zero);

		if (!init)
			return 0;
		bpf_map_update_elem(&nvme_hists, &k, init, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&nvme_hists, &k);
	}
	if (h)
		vg_hist_add(h, bpf_ktime_get_ns() - *ts, false);
	*ts = 0;
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
	return on_complete(rq);
}

SEC("raw_tp/nvme_complete_rq")
int BPF_PROG(nvme_complete_rq_raw, struct request *rq)
{
	return on_complete(rq);
}

struct vg_nvme_key vg_abi_nvme_key = {};
struct vg_hist vg_abi_hist = {};
