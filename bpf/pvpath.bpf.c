// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Paravirt path timing: entry -> return time of the kernel functions through which a guest asks
 * its hypervisor for something (xen_send_IPI_one, xen_vcpuop_set_next_event, kvm_send_ipi_mask,
 * ...; the table is probes/src/hypervisor.rs). Three pairs of programs, user space loads one
 * pair per object: fentry/fexit retargeted per symbol before load, each object bound to its
 * symbol's index (`symbol_index`); kprobe/kretprobe attached to every symbol of one object with
 * the symbol's index as the attach cookie (5.15+); or, where bpf_get_attach_cookie is missing,
 * kprobe/kretprobe bound to `symbol_index` like the fentry pair, one object per symbol. Hosts
 * may block both kinds (ftrace disabled, CONFIG_KPROBES off); user space reports which. Starts
 * are kept on a small per-CPU stack (see `stacks`).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "virtgap.h"
#include "vg_common.bpf.h"
#include "vg_hist.bpf.h"
#include "vg_maps.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* For the flavours bound to one symbol: which symbol index this object's programs time. */
const volatile __u32 symbol_index = 0;

/*
 * The calls in progress on each CPU, innermost last. These callbacks run from idle (pid 0 on
 * every CPU) and from hard-IRQ context nested in another call, so neither a thread id nor a
 * single slot per CPU can hold their start: a small stack per CPU does.
 */
#define VG_PV_DEPTH 8

struct pv_frame {
	__u64 ts;
	__u32 index;
	__u32 pad;
};

struct pv_stack {
	struct pv_frame frames[VG_PV_DEPTH];
	__u32 depth;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pv_stack);
} stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, struct vg_hist);
} durations SEC(".maps");

VG_ZERO_HIST_MAP;

static __always_inline int enter(__u32 index)
{
	__u32 zero = 0;
	struct pv_stack *s = bpf_map_lookup_elem(&stacks, &zero);
	__u32 d;

	if (!s)
		return 0;
	d = s->depth;
	/* Deeper than the stack: this call goes untimed (its exit finds another frame on top). */
	if (d >= VG_PV_DEPTH)
		return 0;
	s->frames[d & (VG_PV_DEPTH - 1)].ts = bpf_ktime_get_ns();
	s->frames[d & (VG_PV_DEPTH - 1)].index = index;
	s->depth = d + 1;
	return 0;
}

static __always_inline int leave(__u32 index)
{
	__u32 zero = 0, d;
	struct pv_stack *s = bpf_map_lookup_elem(&stacks, &zero);
	struct pv_frame *top;
	struct vg_hist *h;
	void *init = bpf_map_lookup_elem(&zero_hist, &zero);
	__u64 delta;

	if (!s || !init || !s->depth)
		return 0;
	d = (s->depth - 1) & (VG_PV_DEPTH - 1);
	top = &s->frames[d];
	/* A return whose entry was not seen (attached mid-call): leave the stack as it is. */
	if (top->index != index)
		return 0;
	s->depth = d;
	if (vg_elapsed(top->ts, bpf_ktime_get_ns(), &delta)) {
		h = vg_lookup_or_init(&durations, &index, init);
		if (h)
			vg_hist_add(h, delta, true);
	}
	return 0;
}

SEC("fentry")
int BPF_PROG(pv_fentry)
{
	return enter(symbol_index);
}

SEC("fexit")
int BPF_PROG(pv_fexit)
{
	return leave(symbol_index);
}

SEC("kprobe")
int pv_kprobe(struct pt_regs *ctx)
{
	return enter(bpf_get_attach_cookie(ctx));
}

SEC("kretprobe")
int pv_kretprobe(struct pt_regs *ctx)
{
	return leave(bpf_get_attach_cookie(ctx));
}

SEC("kprobe")
int pv_kprobe_one(struct pt_regs *ctx)
{
	return enter(symbol_index);
}

SEC("kretprobe")
int pv_kretprobe_one(struct pt_regs *ctx)
{
	return leave(symbol_index);
}

struct vg_hist vg_abi_hist = {};
