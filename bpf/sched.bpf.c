// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Runnable -> on-CPU latency of the workload's threads (as runqlat): from sched_wakeup (or
 * sched_wakeup_new) of a thread of the followed process, or from its preemption while still
 * runnable, until sched_switch puts it on a CPU. A thread switched out to sleep drops any stamp
 * it holds, so a wakeup of a thread that was already running leaves nothing stale behind.
 * When virtgap follows itself, its own threads (the main thread, and those named "vgtool-...")
 * are not the workload's.
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
#include "vg_maps.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Set when the followed process is virtgap itself: its main thread runs the recorder. */
const volatile bool skip_main_thread = false;

/* A workload thread's stamp: since when it has waited to run (0: it is not waiting). */
struct wait_stamp {
	__u32 pid;
	__u32 pad;
	__u64 since;
};

/*
 * Stamps by thread id, direct-mapped (pid % VG_WAIT_SLOTS): a stamp is written, read and
 * cleared in place, where a hash took a bucket lock and a free-list operation at every
 * wakeup and every switch of a workload thread (an insert, then a delete: a wakeup program's
 * run went from ~300 to ~165 ns on the disk here). A process's threads mostly have neighbouring ids, so they rarely share a
 * slot; one waiting while another of the same slot is stamped loses its stamp (counted as
 * dropped). A thread's wakeup and switches are serialized by its runqueue's lock.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, VG_WAIT_SLOTS);
	__type(key, __u32);
	__type(value, struct wait_stamp);
} woken SEC(".maps");

static __always_inline struct wait_stamp *slot_of(__u32 pid)
{
	__u32 index = pid & (VG_WAIT_SLOTS - 1);

	return bpf_map_lookup_elem(&woken, &index);
}

/* One histogram per CPU (the CPU the thread ran on); user space sums them. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vg_hist);
} wakeup_hist SEC(".maps");

VG_DROPPED_MAP;

/* Before 5.14 the task state was a `long state`. */
struct task_struct___old_state {
	long state;
} __attribute__((preserve_access_index));

static __always_inline bool still_runnable(struct task_struct *t, bool btf)
{
	struct task_struct___old_state *old = (void *)t;

	if (bpf_core_field_exists(t->__state))
		return (btf ? t->__state : BPF_CORE_READ(t, __state)) == 0;
	return (btf ? old->state : BPF_CORE_READ(old, state)) == 0;
}

/* A thread of the workload: the followed process, not one of virtgap's own threads. */
static __always_inline bool workload_thread(struct task_struct *p, bool btf)
{
	char comm[8] = {};
	__u32 tgid, pid;

	if (!p || !vg_filtering())
		return false;
	tgid = btf ? p->tgid : BPF_CORE_READ(p, tgid);
	pid = btf ? p->pid : BPF_CORE_READ(p, pid);
	if (!vg_tgid_wanted(tgid) || (skip_main_thread && pid == tgid))
		return false;
	/* tp_btf: plain byte loads, most names ending at the first (no helper call per switch). */
	if (btf)
		return !(p->comm[0] == 'v' && p->comm[1] == 'g' && p->comm[2] == 't' &&
			 p->comm[3] == 'o' && p->comm[4] == 'o' && p->comm[5] == 'l' &&
			 p->comm[6] == '-');
	bpf_probe_read_kernel(comm, sizeof(comm), p->comm);
	return !(comm[0] == 'v' && comm[1] == 'g' && comm[2] == 't' && comm[3] == 'o' &&
		 comm[4] == 'o' && comm[5] == 'l' && comm[6] == '-');
}

static __always_inline void stamp(__u32 pid, __u64 now)
{
	struct wait_stamp *w = slot_of(pid);

	if (!w)
		return;
	/* Another thread's stamp in the slot: its wait is lost to this one. */
	if (w->since && w->pid != pid)
		vg_bump(&dropped, 0);
	w->pid = pid;
	w->since = now;
}

/* `pid`'s stamp, or NULL when it holds none (the slot empty or another thread's). */
static __always_inline struct wait_stamp *stamp_of(__u32 pid)
{
	struct wait_stamp *w = slot_of(pid);

	return w && w->since && w->pid == pid ? w : NULL;
}

static __always_inline int on_wakeup(struct task_struct *p, bool btf)
{
	if (workload_thread(p, btf))
		stamp(btf ? p->pid : BPF_CORE_READ(p, pid), bpf_ktime_get_ns());
	return 0;
}

/* `btf` is constant per caller: tp_btf programs read task fields with plain loads. */
static __always_inline int on_switch(struct task_struct *prev, struct task_struct *next, bool btf)
{
	__u32 pid, zero = 0;
	struct wait_stamp *w;
	struct vg_hist *h;
	__u64 delta;

	/* `current` is the task switching out: a chance to learn the global tgid. */
	vg_learn_global_tgid();
	if (workload_thread(prev, btf)) {
		pid = btf ? prev->pid : BPF_CORE_READ(prev, pid);
		/* Preempted: it waits on the runqueue from now. Going to sleep: no wait yet. */
		if (still_runnable(prev, btf))
			stamp(pid, bpf_ktime_get_ns());
		else if ((w = stamp_of(pid)))
			w->since = 0;
	}
	if (!workload_thread(next, btf))
		return 0;
	pid = btf ? next->pid : BPF_CORE_READ(next, pid);
	w = stamp_of(pid);
	if (!w)
		return 0;
	h = bpf_map_lookup_elem(&wakeup_hist, &zero);
	if (h && vg_elapsed(w->since, bpf_ktime_get_ns(), &delta))
		vg_hist_add(h, delta, false);
	w->since = 0;
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
	return on_switch(prev, next, true);
}

SEC("raw_tp/sched_switch")
int BPF_PROG(sched_switch_raw, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return on_switch(prev, next, false);
}

VG_FOLLOW_FORK_PROGRAMS;

struct vg_hist vg_abi_hist = {};
