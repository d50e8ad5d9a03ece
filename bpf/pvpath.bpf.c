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
 * are kept on a small per-CPU stack (see `stacks`), which user space shares between all the
 * objects it loads, so that a path's time is its own: what timed paths and hard-IRQ handlers
 * nested in it took is left out (a Xen upcall runs the guest's own handlers, and an EOI hypercall
 * inside it is timed as its own path).
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
 * For a function whose calls serve two mechanisms, told apart by its second argument (Xen's
 * xen_send_IPI_one sends a spinlock kick as an IPI on XEN_SPIN_UNLOCK_VECTOR: a lock
 * mechanism, not an IPI): calls with that argument equal to `split_value` are timed under
 * `split_index`. Bound to one symbol, like `symbol_index`; the *_split programs only.
 */
const volatile __u64 split_value = 0;
const volatile __u32 split_index = 0;

/* No index: no path's frame holds it. */
#define NO_PATH 0xfffffffeu

/*
 * For a function that is also called from inside another timed path, where the call is that
 * path's own work (Xen's notify_remote_via_irq is the device doorbell, and also what
 * xen_send_IPI_one sends through): a call made directly inside a frame of either of these
 * indexes is not timed apart. Bound to one symbol, like `symbol_index`.
 */
const volatile __u32 inside_of[2] = { NO_PATH, NO_PATH };

/*
 * The calls in progress on each CPU, innermost last. These callbacks run from idle (pid 0 on
 * every CPU) and from hard-IRQ context nested in another call, so neither a thread id nor a
 * single slot per CPU can hold their start: a small stack per CPU does.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vg_pv_stack);
} stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, struct vg_hist);
} durations SEC(".maps");

VG_ZERO_HIST_MAP;

static __always_inline struct vg_pv_stack *this_cpus_stack(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&stacks, &zero);
}

/*
 * Frame `d` of a stack: masked where the verifier can see it (the compiler, knowing d is in
 * range, would otherwise drop the mask and leave the verifier an unbounded offset).
 */
static __always_inline struct vg_pv_frame *frame(struct vg_pv_stack *s, __u32 d)
{
	barrier_var(d);
	return &s->frames[d & (VG_PV_DEPTH - 1)];
}

static __always_inline int push(struct vg_pv_stack *s, __u32 index)
{
	__u32 d = s->depth;
	struct vg_pv_frame *f;

	/*
	 * Full: frames whose return was never seen (a missed fexit or kretprobe) fill it, not
	 * real nesting this deep. Start afresh: the calls in flight lose their time (their exits
	 * find nothing), and no stale frame keeps the paths on this CPU untimed for good.
	 */
	if (d >= VG_PV_DEPTH)
		d = 0;
	f = frame(s, d);
	f->ts = bpf_ktime_get_ns();
	f->nested_ns = 0;
	f->index = index;
	s->depth = d + 1;
	return 0;
}

/*
 * Pops the innermost frame of `index` or `or_index` (the same but for a split function, whose
 * return does not say which of its two it was), naming it in `popped`: its elapsed time is
 * added to its parent's nested time, and its own time (less what nested in it) returned in
 * `own`. Frames above it are calls whose return was missed: dropped with it. False when no
 * frame is either's (its entry was not seen: attached mid-call, or the stack started afresh),
 * the stack left as it is.
 */
static __always_inline bool pop(struct vg_pv_stack *s, __u32 index, __u32 or_index, __u64 *own,
				__u32 *popped)
{
	__u32 depth = s->depth, d = VG_PV_DEPTH, at;
	struct vg_pv_frame *top;
	__u64 elapsed;

	for (__u32 k = 0; k < VG_PV_DEPTH; k++) {
		if (k >= depth)
			break;
		at = frame(s, depth - 1 - k)->index;
		if (at == index || at == or_index) {
			d = depth - 1 - k;
			*popped = at;
			break;
		}
	}
	if (d >= VG_PV_DEPTH)
		return false;
	top = frame(s, d);
	s->depth = d;
	if (!vg_elapsed(top->ts, bpf_ktime_get_ns(), &elapsed))
		return false;
	if (d)
		frame(s, d - 1)->nested_ns += elapsed;
	*own = elapsed > top->nested_ns ? elapsed - top->nested_ns : 0;
	return true;
}

static __always_inline int enter(__u32 index)
{
	struct vg_pv_stack *s = this_cpus_stack();

	if (!s)
		return 0;
	return push(s, index);
}

/*
 * Starts a call of the one symbol this object is bound to, unless it is made directly inside a
 * frame of `inside_of` (then its exit finds no frame of its own, and its time stays its
 * caller's).
 */
static __always_inline int enter_bound(void)
{
	struct vg_pv_stack *s;
	__u32 top;

	if (inside_of[0] == NO_PATH)
		return enter(symbol_index);
	s = this_cpus_stack();
	if (!s)
		return 0;
	if (s->depth) {
		top = frame(s, s->depth - 1)->index;
		if (top == inside_of[0] || top == inside_of[1])
			return 0;
	}
	return push(s, symbol_index);
}

/* Ends the innermost call of `index` or `or_index`, keeping its own time under its index. */
static __always_inline int leave_either(__u32 index, __u32 or_index)
{
	__u32 zero = 0, popped = index;
	struct vg_pv_stack *s = this_cpus_stack();
	void *init = bpf_map_lookup_elem(&zero_hist, &zero);
	struct vg_hist *h;
	__u64 own;

	if (!s || !init || !pop(s, index, or_index, &own, &popped))
		return 0;
	h = vg_lookup_or_init(&durations, &popped, init);
	if (h)
		vg_hist_add(h, own, true);
	return 0;
}

static __always_inline int leave(__u32 index)
{
	return leave_either(index, index);
}

/* The index a split function's call is timed under, by its second argument. */
static __always_inline __u32 split_by(__u64 arg)
{
	return arg == split_value ? split_index : symbol_index;
}

/*
 * A hard-IRQ handler run inside a timed path (Xen's upcall runs them all): a frame of its own,
 * so that its time, and that of any path timed inside it, is left out of the path's. Outside
 * every timed path there is nothing to do. Loaded in one object only: the stack is shared.
 */
static __always_inline int handler_entry(void)
{
	struct vg_pv_stack *s = this_cpus_stack();

	if (!s || !s->depth)
		return 0;
	return push(s, VG_PV_HANDLER);
}

static __always_inline int handler_exit(void)
{
	struct vg_pv_stack *s = this_cpus_stack();
	__u64 own;
	__u32 popped;

	if (s)
		pop(s, VG_PV_HANDLER, VG_PV_HANDLER, &own, &popped);
	return 0;
}

SEC("tp_btf/irq_handler_entry")
int BPF_PROG(pv_handler_entry_btf)
{
	return handler_entry();
}

SEC("raw_tp/irq_handler_entry")
int BPF_PROG(pv_handler_entry_raw)
{
	return handler_entry();
}

SEC("tp_btf/irq_handler_exit")
int BPF_PROG(pv_handler_exit_btf)
{
	return handler_exit();
}

SEC("raw_tp/irq_handler_exit")
int BPF_PROG(pv_handler_exit_raw)
{
	return handler_exit();
}

SEC("fentry")
int BPF_PROG(pv_fentry)
{
	return enter_bound();
}

SEC("fexit")
int BPF_PROG(pv_fexit)
{
	return leave(symbol_index);
}

/*
 * A split function (see `split_value`) by fentry/fexit: its second argument says which index
 * a call is timed under, at entry and again at return (fexit sees the arguments too).
 */
SEC("fentry")
int BPF_PROG(pv_fentry_split)
{
	return enter(split_by(ctx[1]));
}

SEC("fexit")
int BPF_PROG(pv_fexit_split)
{
	__u32 index = split_by(ctx[1]);

	return leave_either(index, index);
}

/* A split function by kprobe: the return does not see the argument, so ends either index. */
SEC("kprobe")
int pv_kprobe_split(struct pt_regs *ctx)
{
	return enter(split_by(PT_REGS_PARM2(ctx)));
}

SEC("kretprobe")
int pv_kretprobe_split(struct pt_regs *ctx)
{
	return leave_either(symbol_index, split_index);
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
	return enter_bound();
}

SEC("kretprobe")
int pv_kretprobe_one(struct pt_regs *ctx)
{
	return leave(symbol_index);
}

struct vg_hist vg_abi_hist = {};
/* The stack's layout for user space, which shares it and reads it in tests. */
struct vg_pv_stack vg_abi_pv_stack = {};
