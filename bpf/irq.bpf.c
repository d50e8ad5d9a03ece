// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Interrupt handling per CPU: hard-IRQ time, count and duration histogram per (CPU, IRQ);
 * softirq time and count per vector; the x86 system vectors (local timer, reschedule, call
 * function, call function single, irq work); and IPI sends by what they are for (a block
 * completion redirected to the submitting CPU, a reschedule, anything else).
 *
 * Programs come as tp_btf / raw_tp twins; user space enables one of each pair, and leaves
 * out the ones whose tracepoint this kernel lacks.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "virtgap.h"
#include "vg_common.bpf.h"
#include "vg_hist.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Address of __blk_mq_complete_request_remote, from kallsyms (0 if unknown). */
const volatile __u64 blk_complete_remote_fn = 0;

struct irq_start {
	__u64 ts;
	__u32 irq;
	__u32 pad;
};

/* Start of the hard IRQ running on this CPU (handlers do not nest on one CPU). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct irq_start);
} hardirq_start SEC(".maps");

/* Per (CPU, IRQ); user space sizes it from the IRQs and CPUs this host has. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VG_MAX_IRQS);
	__type(key, struct vg_irq_key);
	__type(value, struct vg_irq_stats);
} hardirqs SEC(".maps");

/* All zeroes: the initial value of a new per-IRQ entry (too large for the BPF stack). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vg_irq_stats);
} zero_irq SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, VG_NR_SOFTIRQS);
	__type(key, __u32);
	__type(value, __u64);
} softirq_start SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, VG_NR_SOFTIRQS);
	__type(key, __u32);
	__type(value, struct vg_count_time);
} softirqs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, VG_NR_VECTORS);
	__type(key, __u32);
	__type(value, __u64);
} vector_start SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, VG_NR_VECTORS);
	__type(key, __u32);
	__type(value, struct vg_count_time);
} vectors SEC(".maps");

/* IPI sends by kind, counted on the sending CPU; time_ns is unused. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, VG_NR_IPI_KINDS);
	__type(key, __u32);
	__type(value, struct vg_count_time);
} ipis SEC(".maps");

/* Map-full events: entries not recorded. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} dropped SEC(".maps");

static __always_inline int hardirq_entry(int irq)
{
	__u32 zero = 0;
	struct irq_start *s = bpf_map_lookup_elem(&hardirq_start, &zero);

	if (s) {
		s->ts = bpf_ktime_get_ns();
		s->irq = irq;
	}
	return 0;
}

static __always_inline int hardirq_exit(int irq)
{
	__u32 zero = 0;
	struct irq_start *s = bpf_map_lookup_elem(&hardirq_start, &zero);
	struct vg_irq_key key = { .cpu = bpf_get_smp_processor_id(), .irq = irq };
	struct vg_irq_stats *st;
	void *init;
	__u64 delta;

	if (!s || s->irq != (__u32)irq || !vg_elapsed(s->ts, bpf_ktime_get_ns(), &delta))
		return 0;
	s->ts = 0;
	init = bpf_map_lookup_elem(&zero_irq, &zero);
	if (!init)
		return 0;
	st = vg_lookup_or_init(&hardirqs, &key, init);
	if (!st) {
		__u64 *d = bpf_map_lookup_elem(&dropped, &zero);

		if (d)
			(*d)++;
		return 0;
	}
	/* Keyed by CPU: only this CPU writes this entry, no atomics needed. */
	st->count++;
	st->time_ns += delta;
	vg_hist_add(&st->duration, delta, false);
	return 0;
}

static __always_inline void start_slot(void *map, __u32 idx)
{
	__u64 *ts = bpf_map_lookup_elem(map, &idx);

	if (ts)
		*ts = bpf_ktime_get_ns();
}

static __always_inline void end_slot(void *start_map, void *stats_map, __u32 idx)
{
	__u64 *ts = bpf_map_lookup_elem(start_map, &idx);
	struct vg_count_time *ct = bpf_map_lookup_elem(stats_map, &idx);
	__u64 delta;

	if (!ts || !ct || !vg_elapsed(*ts, bpf_ktime_get_ns(), &delta))
		return;
	ct->count++;
	ct->time_ns += delta;
	*ts = 0;
}

static __always_inline int ipi_sent(void *callback)
{
	__u32 kind = VG_IPI_OTHER;
	struct vg_count_time *ct;

	if (!callback)
		kind = VG_IPI_RESCHEDULE;
	else if (blk_complete_remote_fn && (__u64)callback == blk_complete_remote_fn)
		kind = VG_IPI_BLOCK_COMPLETE;
	ct = bpf_map_lookup_elem(&ipis, &kind);
	if (ct)
		ct->count++;
	return 0;
}

SEC("tp_btf/irq_handler_entry")
int BPF_PROG(irq_handler_entry_btf, int irq, struct irqaction *action)
{
	return hardirq_entry(irq);
}

SEC("raw_tp/irq_handler_entry")
int BPF_PROG(irq_handler_entry_raw, int irq, struct irqaction *action)
{
	return hardirq_entry(irq);
}

SEC("tp_btf/irq_handler_exit")
int BPF_PROG(irq_handler_exit_btf, int irq, struct irqaction *action, int ret)
{
	return hardirq_exit(irq);
}

SEC("raw_tp/irq_handler_exit")
int BPF_PROG(irq_handler_exit_raw, int irq, struct irqaction *action, int ret)
{
	return hardirq_exit(irq);
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(softirq_entry_btf, unsigned int vec)
{
	if (vec < VG_NR_SOFTIRQS)
		start_slot(&softirq_start, vec);
	return 0;
}

SEC("raw_tp/softirq_entry")
int BPF_PROG(softirq_entry_raw, unsigned int vec)
{
	if (vec < VG_NR_SOFTIRQS)
		start_slot(&softirq_start, vec);
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(softirq_exit_btf, unsigned int vec)
{
	if (vec < VG_NR_SOFTIRQS)
		end_slot(&softirq_start, &softirqs, vec);
	return 0;
}

SEC("raw_tp/softirq_exit")
int BPF_PROG(softirq_exit_raw, unsigned int vec)
{
	if (vec < VG_NR_SOFTIRQS)
		end_slot(&softirq_start, &softirqs, vec);
	return 0;
}

/* One entry/exit pair per x86 system vector, each as tp_btf and raw_tp. */
#define VG_VECTOR_PROGS(name, idx)                                   \
	SEC("tp_btf/" #name "_entry")                                \
	int BPF_PROG(name##_entry_btf, int vector)                   \
	{                                                            \
		start_slot(&vector_start, idx);                      \
		return 0;                                            \
	}                                                            \
	SEC("raw_tp/" #name "_entry")                                \
	int BPF_PROG(name##_entry_raw, int vector)                   \
	{                                                            \
		start_slot(&vector_start, idx);                      \
		return 0;                                            \
	}                                                            \
	SEC("tp_btf/" #name "_exit")                                 \
	int BPF_PROG(name##_exit_btf, int vector)                    \
	{                                                            \
		end_slot(&vector_start, &vectors, idx);              \
		return 0;                                            \
	}                                                            \
	SEC("raw_tp/" #name "_exit")                                 \
	int BPF_PROG(name##_exit_raw, int vector)                    \
	{                                                            \
		end_slot(&vector_start, &vectors, idx);              \
		return 0;                                            \
	}

VG_VECTOR_PROGS(local_timer, VG_VEC_LOCAL_TIMER)
VG_VECTOR_PROGS(reschedule, VG_VEC_RESCHEDULE)
VG_VECTOR_PROGS(call_function, VG_VEC_CALL_FUNCTION)
VG_VECTOR_PROGS(call_function_single, VG_VEC_CALL_FUNCTION_SINGLE)
VG_VECTOR_PROGS(irq_work, VG_VEC_IRQ_WORK)

SEC("tp_btf/ipi_send_cpu")
int BPF_PROG(ipi_send_cpu_btf, const unsigned int cpu, unsigned long callsite, void *callback)
{
	return ipi_sent(callback);
}

SEC("raw_tp/ipi_send_cpu")
int BPF_PROG(ipi_send_cpu_raw, const unsigned int cpu, unsigned long callsite, void *callback)
{
	return ipi_sent(callback);
}

SEC("tp_btf/ipi_send_cpumask")
int BPF_PROG(ipi_send_cpumask_btf, const struct cpumask *mask, unsigned long callsite, void *callback)
{
	return ipi_sent(callback);
}

SEC("raw_tp/ipi_send_cpumask")
int BPF_PROG(ipi_send_cpumask_raw, const struct cpumask *mask, unsigned long callsite, void *callback)
{
	return ipi_sent(callback);
}

struct vg_irq_key vg_abi_irq_key = {};
struct vg_irq_stats vg_abi_irq_stats = {};
struct vg_count_time vg_abi_count_time = {};
enum vg_vector vg_abi_vector = VG_VEC_LOCAL_TIMER;
enum vg_ipi_kind vg_abi_ipi_kind = VG_IPI_OTHER;
