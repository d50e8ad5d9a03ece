// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * MSR accesses through the kernel's native accessors (msr:write_msr / msr:read_msr), counted
 * per CPU and MSR. In a guest some of these writes trap to the hypervisor: IA32_TSC_DEADLINE
 * (0x6e0, timer reprogramming), the x2APIC ICR (0x830, IPIs), TMICT (0x838), Hyper-V's
 * synthetic MSRs; user space labels which ones exit on the detected hypervisor. Accesses
 * through __wrmsr or paravirt overrides do not fire these tracepoints.
 *
 * virtgap's own sampler interrupts every CPU it samples, and each of its interrupts ends in a
 * timer reprogram (and, with x2APIC, an EOI): writes within VG_SAMPLER_WINDOW_NS after one of
 * its samples on the same CPU are counted apart, as the tool's own. (The sampler stamps
 * `sampler_stamp`, a map it shares with this object.) What the sampler costs beyond its own
 * interrupts -- idle CPUs reprogramming their timer around its expiries -- is not told apart.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "virtgap.h"
#include "vg_sampler_stamp.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* How long after a sample a write on the same CPU is the sampler's interrupt's doing. */
#define VG_SAMPLER_WINDOW_NS 100000

/* Distinct MSRs the kernel touches are a few dozen. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 256);
	__type(key, struct vg_msr_key);
	__type(value, __u64);
} msrs SEC(".maps");


static __always_inline bool samplers_write(void)
{
	__u32 zero = 0;
	__u64 *stamp = bpf_map_lookup_elem(&sampler_stamp, &zero);

	return stamp && *stamp && bpf_ktime_get_ns() - *stamp < VG_SAMPLER_WINDOW_NS;
}

static __always_inline int count(unsigned int msr, __u32 access)
{
	struct vg_msr_key key = { .msr = msr, .access = access };
	__u64 one = 1, *n;

	if (access == VG_MSR_WRITE && samplers_write())
		key.access = VG_MSR_WRITE_BY_SAMPLER;
	n = bpf_map_lookup_elem(&msrs, &key);
	if (n)
		(*n)++;
	else
		bpf_map_update_elem(&msrs, &key, &one, BPF_NOEXIST);
	return 0;
}

SEC("tp_btf/write_msr")
int BPF_PROG(write_msr_btf, unsigned int msr, u64 val, int failed)
{
	return count(msr, VG_MSR_WRITE);
}

SEC("raw_tp/write_msr")
int BPF_PROG(write_msr_raw, unsigned int msr, u64 val, int failed)
{
	return count(msr, VG_MSR_WRITE);
}

SEC("tp_btf/read_msr")
int BPF_PROG(read_msr_btf, unsigned int msr, u64 val, int failed)
{
	return count(msr, VG_MSR_READ);
}

SEC("raw_tp/read_msr")
int BPF_PROG(read_msr_raw, unsigned int msr, u64 val, int failed)
{
	return count(msr, VG_MSR_READ);
}

struct vg_msr_key vg_abi_msr_key = {};
enum vg_msr_access vg_abi_msr_access = VG_MSR_READ;
