/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * When the sampler last ran on each CPU: the sampler object stamps it, the msr object (which
 * shares the map, user space passing its fd) counts writes right after a sample as the
 * sampler's own. Both objects include this one definition so the map can be shared.
 */
#ifndef VG_SAMPLER_STAMP_BPF_H
#define VG_SAMPLER_STAMP_BPF_H

#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} sampler_stamp SEC(".maps");

#endif /* VG_SAMPLER_STAMP_BPF_H */
