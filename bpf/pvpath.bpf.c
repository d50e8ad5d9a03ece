// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Paravirt path timing: entry -> return time of the hypervisor-interface callbacks a guest
 * kernel uses (xen_send_IPI_one, kvm_send_ipi_mask, lapic_next_deadline, ...). The same pair of
 * programs is used two ways: as fentry/fexit, retargeted per symbol by user space before load,
 * or as kprobe/kretprobe attached to each symbol with the symbol's index as the attach cookie.
 * Hosts may block both (ftrace disabled, CONFIG_KPROBES off); user space reports which.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "virtgap.h"
#include "vg_common.bpf.h"
#include "vg_hist.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* For the fentry flavour: which symbol index this object's programs are bound to. */
const volatile __u32 symbol_index = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u64); /* thread id << 8 | symbol index */
	__type(value, __u64);
} entered SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, struct vg_hist);
} durations SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vg_hist);
} zero_hist SEC(".maps");

static __always_inline int enter(__u32 index)
{
	__u64 key = ((__u64)(__u32)bpf_get_current_pid_tgid() << 8) | (index & 0xff), now = bpf_ktime_get_ns();

	bpf_map_update_elem(&entered, &key, &now, BPF_ANY);
	return 0;
}

static __always_inline int leave(__u32 index)
{
	__u64 key = ((__u64)(__u32)bpf_get_current_pid_tgid() << 8) | (index & 0xff);
	__u64 *ts = bpf_map_lookup_elem(&entered, &key), delta;
	struct vg_hist *h;
	__u32 zero = 0;
	void *init = bpf_map_lookup_elem(&zero_hist, &zero);

	if (!ts || !init)
		return 0;
	if (vg_elapsed(*ts, bpf_ktime_get_ns(), &delta)) {
		h = vg_lookup_or_init(&durations, &index, init);
		if (h)
			vg_hist_add(h, delta, true);
	}
	bpf_map_delete_elem(&entered, &key);
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

struct vg_hist vg_abi_hist = {};
