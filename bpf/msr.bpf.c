// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * MSR accesses through the kernel's native accessors (msr:write_msr / msr:read_msr), counted
 * per CPU and MSR. In a guest the interesting ones trap to the hypervisor: IA32_TSC_DEADLINE
 * (0x6e0, timer reprogramming), the x2APIC ICR (0x830, IPIs), TMICT (0x838), Hyper-V's
 * synthetic MSRs. Accesses through __wrmsr or paravirt overrides do not fire these.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "virtgap.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Distinct MSRs the kernel touches are a few dozen. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 256);
	__type(key, struct vg_msr_key);
	__type(value, __u64);
} msrs SEC(".maps");

static __always_inline int count(unsigned int msr, __u32 write)
{
	struct vg_msr_key key = { .msr = msr, .write = write };
	__u64 one = 1, *n = bpf_map_lookup_elem(&msrs, &key);

	if (n)
		(*n)++;
	else
		bpf_map_update_elem(&msrs, &key, &one, BPF_NOEXIST);
	return 0;
}

SEC("tp_btf/write_msr")
int BPF_PROG(write_msr_btf, unsigned int msr, u64 val, int failed)
{
	return count(msr, 1);
}

SEC("raw_tp/write_msr")
int BPF_PROG(write_msr_raw, unsigned int msr, u64 val, int failed)
{
	return count(msr, 1);
}

SEC("tp_btf/read_msr")
int BPF_PROG(read_msr_btf, unsigned int msr, u64 val, int failed)
{
	return count(msr, 0);
}

SEC("raw_tp/read_msr")
int BPF_PROG(read_msr_raw, unsigned int msr, u64 val, int failed)
{
	return count(msr, 0);
}

struct vg_msr_key vg_abi_msr_key = {};
