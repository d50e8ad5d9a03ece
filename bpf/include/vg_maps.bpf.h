/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Map boilerplate the families share: the all-zero histogram new entries start from, the
 * per-CPU count of events a full map lost, and counters created on first use. The two maps are
 * macros, not definitions, so an object declares only those it uses (libbpf creates every map
 * an object defines) and user space finds each under the same name in every object.
 */
#ifndef VG_MAPS_BPF_H
#define VG_MAPS_BPF_H

#include <bpf/bpf_helpers.h>
#include "virtgap.h"
#include "vg_common.bpf.h"

/* `zero_hist`: all zeroes, the initial value of a new histogram (too large for the BPF stack). */
#define VG_ZERO_HIST_MAP                                                                    \
	struct {                                                                            \
		__uint(type, BPF_MAP_TYPE_ARRAY);                                           \
		__uint(max_entries, 1);                                                     \
		__type(key, __u32);                                                         \
		__type(value, struct vg_hist);                                              \
	} zero_hist SEC(".maps")

/* `dropped`: events not recorded because a map was full, per CPU (user space sums them). */
#define VG_DROPPED_MAP                                                                      \
	struct {                                                                            \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);                                    \
		__uint(max_entries, 1);                                                     \
		__type(key, __u32);                                                         \
		__type(value, __u64);                                                       \
	} dropped SEC(".maps")

/*
 * `irq_entered`: the latest handler entry of each IRQ, indexed by IRQ number up to the highest a
 * block queue maps to (user space sizes it): an array, whose lookups the verifier inlines, on
 * the path of every interrupt and every completion. IRQs no queue maps to are stamped too, and
 * never read. The block object reads it; where the irq family loads too, the block object takes
 * the irq object's copy and the irq family's irq_handler_entry program stamps it (one program
 * per interrupt, not two). vg_note_irq_entry stamps it.
 */
#define VG_IRQ_ENTERED_MAP                                                                  \
	struct {                                                                            \
		__uint(type, BPF_MAP_TYPE_ARRAY);                                           \
		__uint(max_entries, 1);                                                     \
		__type(key, __u32);                                                         \
		__type(value, __u64);                                                       \
	} irq_entered SEC(".maps");                                                         \
	static __always_inline void vg_note_irq_entry(__u32 irq, __u64 now)                 \
	{                                                                                   \
		__u64 *entered = bpf_map_lookup_elem(&irq_entered, &irq);                   \
                                                                                            \
		if (entered)                                                                \
			*entered = now;                                                     \
	}                                                                                   \
	struct vg_irq_entered_map_end

/* One more in slot `index` of a per-CPU array of u64 counters (this CPU's copy: no atomics). */
static __always_inline void vg_bump(void *counters, __u32 index)
{
	__u64 *c = bpf_map_lookup_elem(counters, &index);

	if (c)
		(*c)++;
}

/*
 * One more for `key` in a map of u64 counters, the entry created at zero on first use; false
 * when the map is full. `atomic` where other CPUs update the same entry (shared maps); a per-CPU
 * map's entry is this CPU's copy.
 */
static __always_inline bool vg_count(void *map, const void *key, bool atomic)
{
	__u64 zero = 0, *n = vg_lookup_or_init(map, key, &zero);

	if (!n)
		return false;
	if (atomic)
		__sync_fetch_and_add(n, 1);
	else
		(*n)++;
	return true;
}

#endif /* VG_MAPS_BPF_H */
