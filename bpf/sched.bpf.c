// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Wakeup -> on-CPU latency of the workload's threads: the time from sched_wakeup (or
 * sched_wakeup_new) of a thread of the followed process until sched_switch puts it on a CPU.
 * The process filter compares task structs' tgids, which are the initial namespace's; see
 * vg_filter.bpf.h for how that number is found from inside a container.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "virtgap.h"
#include "vg_common.bpf.h"
#include "vg_filter.bpf.h"
#include "vg_hist.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Thread id -> wakeup time; deleted when the thread runs. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VG_MAX_TASKS);
	__type(key, __u32);
	__type(value, __u64);
} woken SEC(".maps");

/* One histogram per CPU (the CPU the thread ran on); user space sums them. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vg_hist);
} wakeup_hist SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} dropped SEC(".maps");

static __always_inline int on_wakeup(struct task_struct *p, bool btf)
{
	__u32 pid;
	__u64 now;

	if (!p || !filter_tgid || !vg_tgid_wanted(btf ? p->tgid : BPF_CORE_READ(p, tgid)))
		return 0;
	pid = btf ? p->pid : BPF_CORE_READ(p, pid);
	now = bpf_ktime_get_ns();
	if (bpf_map_update_elem(&woken, &pid, &now, BPF_ANY)) {
		__u32 zero = 0;
		__u64 *d = bpf_map_lookup_elem(&dropped, &zero);

		if (d)
			(*d)++;
	}
	return 0;
}

/* `btf` is constant per caller: tp_btf programs read task fields with plain loads. */
static __always_inline int on_switch(struct task_struct *next, bool btf)
{
	__u32 pid, zero = 0;
	__u64 *ts, delta;
	struct vg_hist *h;

	/* `current` is the task switching out: a chance to learn the global tgid. */
	vg_learn_global_tgid();
	if (!next || !filter_tgid || !vg_tgid_wanted(btf ? next->tgid : BPF_CORE_READ(next, tgid)))
		return 0;
	pid = btf ? next->pid : BPF_CORE_READ(next, pid);
	ts = bpf_map_lookup_elem(&woken, &pid);
	if (!ts)
		return 0;
	h = bpf_map_lookup_elem(&wakeup_hist, &zero);
	if (h && vg_elapsed(*ts, bpf_ktime_get_ns(), &delta))
		vg_hist_add(h, delta, false);
	bpf_map_delete_elem(&woken, &pid);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(sched_wakeup_btf, struct task_struct *p)
{
	return on_wakeup(p, true);
}

SEC("raw_tp/sched_wakeup")
int BPF_PROG(sched_wakeup_raw, struct task_struct *p)
{
	return on_wakeup(p, false);
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(sched_wakeup_new_btf, struct task_struct *p)
{
	return on_wakeup(p, true);
}

SEC("raw_tp/sched_wakeup_new")
int BPF_PROG(sched_wakeup_new_raw, struct task_struct *p)
{
	return on_wakeup(p, false);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch_btf, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return on_switch(next, true);
}

SEC("raw_tp/sched_switch")
int BPF_PROG(sched_switch_raw, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return on_switch(next, false);
}

struct vg_hist vg_abi_hist = {};
