// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * MSR accesses through the kernel's native accessors (msr:write_msr / msr:read_msr), counted
 * per CPU and MSR. In a guest some of these writes trap to the hypervisor: IA32_TSC_DEADLINE
 * (0x6e0, timer reprogramming), the x2APIC ICR (0x830, IPIs), TMICT (0x838), Hyper-V's
 * synthetic MSRs; user space labels which ones exit on the detected hypervisor. Accesses
 * through __wrmsr or paravirt overrides do not fire these tracepoints.
 *
 * virtgap's own sampler keeps a timer armed on every CPU it samples, so the kernel writes
 * IA32_TSC_DEADLINE for it: at the end of each sampling interrupt, and whenever an idle CPU
 * goes back to sleep with the sampler's expiry as its next event. A TSC-deadline write whose
 * deadline is the sampler's next expiry on that CPU (its last sample + its period) is counted
 * apart, as the tool's own; so is any other write right after one of its samples (within
 * VG_SAMPLER_WINDOW_NS). The sampler stamps `sampler_stamp`, a map it shares with this object;
 * user space keeps the TSC <-> ktime relation in `tsc_base`/`ns_base`.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "virtgap.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* How long after a sample a write on the same CPU is the sampler's interrupt's doing. */
#define VG_SAMPLER_WINDOW_NS 100000
/* How close a TSC deadline must be to the sampler's next expiry to be programmed for it. */
#define VG_DEADLINE_MATCH_NS 50000
#define VG_MSR_TSC_DEADLINE 0x6e0

/* The sampler's period (0: no sampler) and TSC ticks per ns in 8.24 fixed point (0: unknown). */
const volatile __u64 sampler_period_ns = 0;
const volatile __u64 tsc_per_ns_q24 = 0;
/* A recent (TSC, ktime) pair, refreshed by user space every interval. */
__u64 tsc_base = 0;
__u64 ns_base = 0;

/* Distinct MSRs the kernel touches are a few dozen. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 256);
	__type(key, struct vg_msr_key);
	__type(value, __u64);
} msrs SEC(".maps");

/* When the sampler last ran on each CPU (written by the sampler object). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} sampler_stamp SEC(".maps");

/* Whether a TSC deadline `val` written now is the sampler's next expiry after `stamp`. */
static __always_inline bool deadline_is_samplers(__u64 val, __u64 now, __u64 stamp)
{
	__u64 tsc_now, deadline, expected = stamp + sampler_period_ns;

	if (!tsc_per_ns_q24 || !ns_base || now < ns_base)
		return false;
	tsc_now = tsc_base + (((now - ns_base) * tsc_per_ns_q24) >> 24);
	if (val <= tsc_now)
		return false;
	deadline = now + (((val - tsc_now) << 24) / tsc_per_ns_q24);
	return deadline + VG_DEADLINE_MATCH_NS > expected && deadline < expected + VG_DEADLINE_MATCH_NS;
}

static __always_inline bool samplers_write(unsigned int msr, __u64 val)
{
	__u32 zero = 0;
	__u64 *stamp = bpf_map_lookup_elem(&sampler_stamp, &zero), now;

	if (!stamp || !*stamp)
		return false;
	now = bpf_ktime_get_ns();
	if (now - *stamp < VG_SAMPLER_WINDOW_NS)
		return true;
	return msr == VG_MSR_TSC_DEADLINE && sampler_period_ns && deadline_is_samplers(val, now, *stamp);
}

static __always_inline int count(unsigned int msr, __u64 val, __u32 access)
{
	struct vg_msr_key key = { .msr = msr, .access = access };
	__u64 one = 1, *n;

	if (access == VG_MSR_WRITE && samplers_write(msr, val))
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
	return count(msr, val, VG_MSR_WRITE);
}

SEC("raw_tp/write_msr")
int BPF_PROG(write_msr_raw, unsigned int msr, u64 val, int failed)
{
	return count(msr, val, VG_MSR_WRITE);
}

SEC("tp_btf/read_msr")
int BPF_PROG(read_msr_btf, unsigned int msr, u64 val, int failed)
{
	return count(msr, val, VG_MSR_READ);
}

SEC("raw_tp/read_msr")
int BPF_PROG(read_msr_raw, unsigned int msr, u64 val, int failed)
{
	return count(msr, val, VG_MSR_READ);
}

struct vg_msr_key vg_abi_msr_key = {};
enum vg_msr_access vg_abi_msr_access = VG_MSR_READ;
