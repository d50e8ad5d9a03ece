// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Interrupt handling per CPU: hard-IRQ time, count and duration histogram per (CPU, IRQ);
 * softirq time and count per vector, less the hard interrupts that nested in it; the x86
 * system vectors (local timer, reschedule, call function, call function single, irq work); IPIs
 * actually sent, one per target CPU (reschedule or function call); and, where the kernel says
 * (6.4+), the cross-CPU calls queued and what for (a block completion redirected to the
 * submitting CPU, a wakeup queued to another CPU, anything else). From 6.6 the purpose comes
 * from csd_queue_cpu; in 6.4/6.5 ipi_send_* also fire per queued call, naming its function.
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
#include "vg_maps.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Addresses from kallsyms (0 if unknown). */
const volatile __u64 blk_complete_remote_fn = 0;
const volatile __u64 ttwu_pending_fn = 0;
/* The generic IPI handlers a real call-function IPI names since 6.4. */
const volatile __u64 generic_single_fn = 0;
const volatile __u64 generic_many_fn = 0;
/* 64-bit words of a cpumask on this host (nr_cpu_ids / 64, rounded up). */
const volatile __u32 cpumask_words = 1;

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
	__type(value, struct vg_softirq_start);
} softirq_start SEC(".maps");

/* Hard-IRQ and system-vector time so far on this CPU: what nests inside a softirq. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} hardirq_total SEC(".maps");

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

/* IPIs sent by kind, counted on the sending CPU; time_ns is unused. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, VG_NR_IPI_KINDS);
	__type(key, __u32);
	__type(value, struct vg_count_time);
} ipis SEC(".maps");

/* Cross-CPU calls queued by purpose, counted on the queueing CPU; time_ns is unused. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, VG_NR_CSD_KINDS);
	__type(key, __u32);
	__type(value, struct vg_count_time);
} csds SEC(".maps");

VG_DROPPED_MAP;

/*
 * Set where the block family loads too: this program also stamps the block object's
 * `irq_entered` (its map: this object's is handed to it), so one program, not two, runs at
 * every interrupt's entry.
 */
const volatile bool stamp_irq_entered = false;

/* The block family's IRQ entries (see vg_maps.bpf.h). */
VG_IRQ_ENTERED_MAP;

static __always_inline int hardirq_entry(int irq)
{
	__u32 zero = 0;
	struct irq_start *s = bpf_map_lookup_elem(&hardirq_start, &zero);
	__u64 now = bpf_ktime_get_ns();

	if (s) {
		s->ts = now;
		s->irq = irq;
	}
	if (stamp_irq_entered)
		vg_note_irq_entry(irq, now);
	return 0;
}

/* Hard-interrupt time on this CPU, which a softirq running underneath must not count. */
static __always_inline void add_nested(__u64 delta)
{
	__u32 zero = 0;
	__u64 *total = bpf_map_lookup_elem(&hardirq_total, &zero);

	if (total)
		*total += delta;
}

static __always_inline __u64 nested_so_far(void)
{
	__u32 zero = 0;
	__u64 *total = bpf_map_lookup_elem(&hardirq_total, &zero);

	return total ? *total : 0;
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
		vg_bump(&dropped, 0);
		return 0;
	}
	/* Keyed by CPU: only this CPU writes this entry, no atomics needed. */
	st->count++;
	st->time_ns += delta;
	vg_hist_add(&st->duration, delta, false);
	add_nested(delta);
	return 0;
}

static __always_inline void start_slot(void *map, __u32 idx)
{
	__u64 *ts = bpf_map_lookup_elem(map, &idx);

	if (ts)
		*ts = bpf_ktime_get_ns();
}

/* A system vector's exit: its time is also hard-interrupt time a softirq must not count. */
static __always_inline void end_vector(__u32 idx)
{
	__u64 *ts = bpf_map_lookup_elem(&vector_start, &idx);
	struct vg_count_time *ct = bpf_map_lookup_elem(&vectors, &idx);
	__u64 delta;

	if (!ts || !ct || !vg_elapsed(*ts, bpf_ktime_get_ns(), &delta))
		return;
	ct->count++;
	ct->time_ns += delta;
	*ts = 0;
	add_nested(delta);
}

static __always_inline void softirq_entry(__u32 vec)
{
	struct vg_softirq_start *s = bpf_map_lookup_elem(&softirq_start, &vec);

	if (s) {
		s->ts = bpf_ktime_get_ns();
		s->nested_base = nested_so_far();
	}
}

static __always_inline void softirq_exit(__u32 vec)
{
	struct vg_softirq_start *s = bpf_map_lookup_elem(&softirq_start, &vec);
	struct vg_count_time *ct = bpf_map_lookup_elem(&softirqs, &vec);
	__u64 delta, nested;

	if (!s || !ct || !vg_elapsed(s->ts, bpf_ktime_get_ns(), &delta))
		return;
	nested = nested_so_far() - s->nested_base;
	ct->count++;
	ct->time_ns += delta > nested ? delta - nested : 0;
	s->ts = 0;
}

static __always_inline void bump_kind(void *map, __u32 kind, __u64 n)
{
	struct vg_count_time *ct = bpf_map_lookup_elem(map, &kind);

	if (ct)
		ct->count += n;
}

/* A queued cross-CPU call, by what it runs. */
static __always_inline void csd_queued(void *func)
{
	__u32 kind = VG_CSD_OTHER;

	if (blk_complete_remote_fn && (__u64)func == blk_complete_remote_fn)
		kind = VG_CSD_BLOCK_COMPLETE;
	else if (ttwu_pending_fn && (__u64)func == ttwu_pending_fn)
		kind = VG_CSD_WAKEUP;
	bump_kind(&csds, kind, 1);
}

/*
 * An ipi_send_* event to `targets` CPUs: a real IPI when it names no function (reschedule) or
 * a generic handler; otherwise (6.4/6.5) a queued call naming its function. Without
 * csd_queue_cpu that is where purposes come from; with it, such events do not occur.
 */
static __always_inline int ipi_event(void *callback, __u64 targets)
{
	__u64 fn = (__u64)callback;

	if (!fn)
		bump_kind(&ipis, VG_IPI_RESCHEDULE, targets);
	else if (fn == generic_single_fn || fn == generic_many_fn)
		bump_kind(&ipis, VG_IPI_FUNCTION_CALL, targets);
	else
		csd_queued(callback);
	return 0;
}

/* CPUs set in a cpumask (the IPI's targets). */
static __always_inline __u64 cpumask_weight(const struct cpumask *mask, bool btf)
{
	__u64 n = 0;

	for (__u32 i = 0; i < 16; i++) {
		unsigned long word;

		if (i >= cpumask_words)
			break;
		if (btf)
			word = mask->bits[i];
		else
			bpf_probe_read_kernel(&word, sizeof(word), &mask->bits[i]);
		n += __builtin_popcountll(word);
	}
	return n;
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
		softirq_entry(vec);
	return 0;
}

SEC("raw_tp/softirq_entry")
int BPF_PROG(softirq_entry_raw, unsigned int vec)
{
	if (vec < VG_NR_SOFTIRQS)
		softirq_entry(vec);
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(softirq_exit_btf, unsigned int vec)
{
	if (vec < VG_NR_SOFTIRQS)
		softirq_exit(vec);
	return 0;
}

SEC("raw_tp/softirq_exit")
int BPF_PROG(softirq_exit_raw, unsigned int vec)
{
	if (vec < VG_NR_SOFTIRQS)
		softirq_exit(vec);
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
		end_vector(idx);              \
		return 0;                                            \
	}                                                            \
	SEC("raw_tp/" #name "_exit")                                 \
	int BPF_PROG(name##_exit_raw, int vector)                    \
	{                                                            \
		end_vector(idx);              \
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
	return ipi_event(callback, 1);
}

SEC("raw_tp/ipi_send_cpu")
int BPF_PROG(ipi_send_cpu_raw, const unsigned int cpu, unsigned long callsite, void *callback)
{
	return ipi_event(callback, 1);
}

SEC("tp_btf/ipi_send_cpumask")
int BPF_PROG(ipi_send_cpumask_btf, const struct cpumask *mask, unsigned long callsite, void *callback)
{
	return mask ? ipi_event(callback, cpumask_weight(mask, true)) : 0;
}

SEC("raw_tp/ipi_send_cpumask")
int BPF_PROG(ipi_send_cpumask_raw, const struct cpumask *mask, unsigned long callsite, void *callback)
{
	return ipi_event(callback, cpumask_weight(mask, false));
}

/*
 * csd_queue_cpu's third argument is a function pointer, which tp_btf's typed context refuses
 * to load ("not a struct"): copy the raw argument word instead.
 */
SEC("tp_btf/csd_queue_cpu")
int csd_queue_cpu_btf(unsigned long long *ctx)
{
	void *func = 0;

	bpf_probe_read_kernel(&func, sizeof(func), &ctx[2]);
	csd_queued(func);
	return 0;
}

SEC("raw_tp/csd_queue_cpu")
int BPF_PROG(csd_queue_cpu_raw, const unsigned int cpu, unsigned long callsite, void *func, void *csd)
{
	csd_queued(func);
	return 0;
}

struct vg_irq_key vg_abi_irq_key = {};
struct vg_irq_stats vg_abi_irq_stats = {};
struct vg_count_time vg_abi_count_time = {};
enum vg_vector vg_abi_vector = VG_VEC_LOCAL_TIMER;
enum vg_ipi_kind vg_abi_ipi_kind = VG_IPI_RESCHEDULE;
enum vg_csd_kind vg_abi_csd_kind = VG_CSD_OTHER;
struct vg_softirq_start vg_abi_softirq_start = {};
