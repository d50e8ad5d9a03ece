/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The process filter: which process's activity a family counts. The recorder names its
 * workload by the pid it sees, which inside a container is a namespace-local number, so the
 * comparison happens in the recorder's own pid namespace (dev and inode of /proc/self/ns/pid);
 * in the initial namespace the plain, cheaper helper is enough.
 *
 * Attach mode follows a set of processes instead (`filter_followed`): the tgids in `followed`,
 * one map shared by every object of a session. User space fills it with the processes it was
 * asked to attach to and keeps it current; a followed process's fork adds the child at once
 * (vg_follow_fork), so children started later are followed from their first I/O.
 */
#ifndef VG_FILTER_BPF_H
#define VG_FILTER_BPF_H

#include <bpf/bpf_helpers.h>
#include "virtgap.h"

/* The process to follow, in the recorder's pid namespace (0: every process). */
const volatile __u32 filter_tgid = 0;
/* The recorder's pid namespace; ino 0 means the initial namespace. */
const volatile __u64 filter_pidns_dev = 0;
const volatile __u64 filter_pidns_ino = 0;

/*
 * The followed process's tgid as task structs hold it (initial namespace). User space sets it
 * when it runs in the initial namespace; otherwise vg_learn_global_tgid fills it from one of
 * the process's own threads.
 */
__u32 filter_tgid_global = 0;

/* Attach mode: follow the processes in `followed`, not filter_tgid. */
const volatile bool filter_followed = false;

/* Whose: the followed processes' tgids (initial namespace); the value is unused. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VG_MAX_FOLLOWED);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, __u8);
} followed SEC(".maps");

/* Whether any filter applies (else every process is counted). */
static __always_inline bool vg_filtering(void)
{
	return filter_tgid || filter_followed;
}

static __always_inline bool vg_tgid_followed(__u32 tgid)
{
	return bpf_map_lookup_elem(&followed, &tgid) != NULL;
}

/* Whether `current`, whose bpf_get_current_pid_tgid() the caller already read, is followed. */
static __always_inline bool vg_current_wanted_as(__u64 pid_tgid)
{
	struct bpf_pidns_info ns = {};

	if (filter_followed)
		return vg_tgid_followed(pid_tgid >> 32);
	if (!filter_tgid)
		return true;
	if (!filter_pidns_ino)
		return (pid_tgid >> 32) == filter_tgid;
	if (bpf_get_ns_current_pid_tgid(filter_pidns_dev, filter_pidns_ino, &ns, sizeof(ns)))
		return false;
	return ns.tgid == filter_tgid;
}

static __always_inline bool vg_current_wanted(void)
{
	return vg_current_wanted_as(bpf_get_current_pid_tgid());
}

/* Call where `current` may be the followed process: records its global tgid once. */
static __always_inline void vg_learn_global_tgid(void)
{
	if (filter_tgid && !filter_tgid_global && vg_current_wanted())
		filter_tgid_global = bpf_get_current_pid_tgid() >> 32;
}

/* Whether task `tgid` (a task struct's, initial namespace) is the followed process. */
static __always_inline bool vg_tgid_wanted(__u32 tgid)
{
	if (filter_followed)
		return vg_tgid_followed(tgid);
	return !filter_tgid || (filter_tgid_global && tgid == filter_tgid_global);
}

/*
 * At a fork (sched_process_fork: `current` is the parent): a new process of a followed one is
 * followed too. A new thread shares its process's tgid and needs nothing.
 */
static __always_inline int vg_follow_fork(__u32 child_pid, __u32 child_tgid)
{
	__u8 one = 1;

	if (!filter_followed || child_pid != child_tgid ||
	    !vg_tgid_followed(bpf_get_current_pid_tgid() >> 32))
		return 0;
	bpf_map_update_elem(&followed, &child_tgid, &one, BPF_NOEXIST);
	return 0;
}

/*
 * The sched_process_fork twins that call vg_follow_fork, for the objects of the families that
 * follow processes. A macro, as VG_ZERO_HIST_MAP: objects that include this header for the
 * filter alone (bio_entry, kvm) get no programs. User space attaches them in one object only.
 */
#define VG_FOLLOW_FORK_PROGRAMS                                                             \
	SEC("tp_btf/sched_process_fork")                                                    \
	int BPF_PROG(sched_process_fork_btf, struct task_struct *parent,                    \
		     struct task_struct *child)                                             \
	{                                                                                   \
		return vg_follow_fork(child->pid, child->tgid);                             \
	}                                                                                   \
	SEC("raw_tp/sched_process_fork")                                                    \
	int BPF_PROG(sched_process_fork_raw, struct task_struct *parent,                    \
		     struct task_struct *child)                                             \
	{                                                                                   \
		return vg_follow_fork(BPF_CORE_READ(child, pid), BPF_CORE_READ(child, tgid)); \
	}                                                                                   \
	struct vg_follow_fork_programs_end

#endif /* VG_FILTER_BPF_H */
