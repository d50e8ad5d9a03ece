// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Host-side KVM, for when virtgap runs on a hypervisor: exit -> entry time by exit reason (as
 * `perf kvm stat`), and port I/O, MMIO, MSR and hypercall exits per VMM process. kvm_exit and
 * kvm_entry are classic tracepoints here because only their formatted fields carry the exit
 * reason and vCPU; the rest are BTF-typed with raw twins. KVM is usually a module: its
 * tracepoints' types come from its module BTF. Counted for every VMM process, or only the one
 * the user names (the filter, in the recorder's pid namespace).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "virtgap.h"
#include "vg_common.bpf.h"
#include "vg_filter.bpf.h"
#include "vg_hist.bpf.h"
#include "vg_maps.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct exit_start {
	__u64 ts;
	struct vg_exit_key key;
};

/* Per vCPU thread: the exit being handled. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct exit_start);
} in_exit SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct vg_exit_key);
	__type(value, struct vg_hist);
} exits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct vg_kvm_key);
	__type(value, __u64);
} events SEC(".maps");

VG_ZERO_HIST_MAP;

static __always_inline int count_event(__u32 event)
{
	struct vg_kvm_key key = { .tgid = bpf_get_current_pid_tgid() >> 32, .event = event };

	if (vg_current_wanted())
		vg_count(&events, &key, true);
	return 0;
}

SEC("tracepoint/kvm/kvm_exit")
int kvm_exit_tp(struct trace_event_raw_kvm_exit *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct exit_start s = { .ts = bpf_ktime_get_ns() };

	if (!vg_current_wanted())
		return 0;
	s.key.isa = ctx->isa;
	s.key.reason = ctx->exit_reason;
	bpf_map_update_elem(&in_exit, &tid, &s, BPF_ANY);
	return count_event(VG_KVM_EXIT);
}

SEC("tracepoint/kvm/kvm_entry")
int kvm_entry_tp(struct trace_event_raw_kvm_entry *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid(), zero = 0;
	struct exit_start *s = bpf_map_lookup_elem(&in_exit, &tid);
	struct vg_hist *h;
	void *init = bpf_map_lookup_elem(&zero_hist, &zero);
	__u64 delta;

	if (!s || !init)
		return 0;
	if (vg_elapsed(s->ts, bpf_ktime_get_ns(), &delta)) {
		h = vg_lookup_or_init(&exits, &s->key, init);
		if (h)
			vg_hist_add(h, delta, true);
	}
	bpf_map_delete_elem(&in_exit, &tid);
	return 0;
}

SEC("tp_btf/kvm_pio")
int BPF_PROG(kvm_pio_btf, unsigned int rw, unsigned int port, unsigned int size, unsigned int count, const void *data)
{
	return count_event(VG_KVM_PIO);
}

SEC("raw_tp/kvm_pio")
int BPF_PROG(kvm_pio_raw, unsigned int rw, unsigned int port, unsigned int size, unsigned int count, const void *data)
{
	return count_event(VG_KVM_PIO);
}

SEC("tp_btf/kvm_mmio")
int BPF_PROG(kvm_mmio_btf, int type, int len, u64 gpa, void *val)
{
	return count_event(VG_KVM_MMIO);
}

SEC("raw_tp/kvm_mmio")
int BPF_PROG(kvm_mmio_raw, int type, int len, u64 gpa, void *val)
{
	return count_event(VG_KVM_MMIO);
}

SEC("tp_btf/kvm_msr")
int BPF_PROG(kvm_msr_btf, unsigned int write, u32 ecx, u64 data, bool exception)
{
	return count_event(VG_KVM_MSR);
}

SEC("raw_tp/kvm_msr")
int BPF_PROG(kvm_msr_raw, unsigned int write, u32 ecx, u64 data, bool exception)
{
	return count_event(VG_KVM_MSR);
}

SEC("tp_btf/kvm_hypercall")
int BPF_PROG(kvm_hypercall_btf, unsigned long nr, unsigned long a0, unsigned long a1, unsigned long a2, unsigned long a3)
{
	return count_event(VG_KVM_HYPERCALL);
}

SEC("raw_tp/kvm_hypercall")
int BPF_PROG(kvm_hypercall_raw, unsigned long nr, unsigned long a0, unsigned long a1, unsigned long a2, unsigned long a3)
{
	return count_event(VG_KVM_HYPERCALL);
}

struct vg_kvm_key vg_abi_kvm_key = {};
struct vg_exit_key vg_abi_exit_key = {};
enum vg_kvm_event vg_abi_kvm_event = VG_KVM_PIO;
struct vg_hist vg_abi_hist = {};
