/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The process filter: which process's activity a family counts. The recorder names its
 * workload by the pid it sees, which inside a container is a namespace-local number, so the
 * comparison happens in the recorder's own pid namespace (dev and inode of /proc/self/ns/pid);
 * in the initial namespace the plain, cheaper helper is enough.
 */
#ifndef VG_FILTER_BPF_H
#define VG_FILTER_BPF_H

#include <bpf/bpf_helpers.h>

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

static __always_inline bool vg_current_wanted(void)
{
	struct bpf_pidns_info ns = {};

	if (!filter_tgid)
		return true;
	if (!filter_pidns_ino)
		return (bpf_get_current_pid_tgid() >> 32) == filter_tgid;
	if (bpf_get_ns_current_pid_tgid(filter_pidns_dev, filter_pidns_ino, &ns, sizeof(ns)))
		return false;
	return ns.tgid == filter_tgid;
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
	return !filter_tgid || (filter_tgid_global && tgid == filter_tgid_global);
}

#endif /* VG_FILTER_BPF_H */
