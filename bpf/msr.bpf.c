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
 * its timer's expiries on the same CPU are counted apart, as the tool's own. The expiry is
 * stamped twice over in `sampler_stamp`, a map shared with the sampler object: by the sampler's
 * program, and here when perf's cpu-clock hrtimer callback (`sampler_timer_fn`, resolved from
 * kallsyms by user space; 0 when the sampler is off) expires -- some kernels expire the timer
 * on a CPU without delivering the sample (seen on a PVM guest's second vCPU), and the wake and
 * reprogram still happen there.
 *
 * The sampler also moves the host's own timer writes (its timer becomes each CPU's next event,
 * cancelled and re-armed around idle), so they depend on its rate. User space pauses it for part
 * of every interval and says so in `sampler_running`; writes while it runs are counted apart, and
 * the host's figures come from the pauses.
 *
 * An IPI to one CPU is timed from its generic send (ipi:ipi_send_cpu, fired just before the arch
 * sender) to the return of the x2APIC ICR write that sends it: on metal the native send, in a KVM
 * guest that and the write's exit. Both tracepoints fire with preemption off, so the pair is on
 * one CPU. A send to a mask clears the stamp (its ICR writes, one per target or cluster, are not
 * one IPI's), and a send that writes no ICR (a PV hypercall, an event channel) leaves a stamp
 * that only a write within VG_ICR_SEND_MAX_NS may take.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "virtgap.h"
#include "vg_maps.bpf.h"
#include "vg_sampler_stamp.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* How long after a sample a write on the same CPU is the sampler's interrupt's doing. */
#define VG_SAMPLER_WINDOW_NS 100000

/* perf_swevent_hrtimer's address while virtgap's sampler runs, else 0 (set before load). */
const volatile __u64 sampler_timer_fn = 0;

/* 1 while virtgap's sampler is enabled; user space flips it around each pause. */
__u32 sampler_running = 0;

/* Longer than any send takes between its tracepoint and its ICR write, exit included. */
#define VG_ICR_SEND_MAX_NS 1000000

/* Distinct MSRs the kernel touches are a few dozen. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 256);
	__type(key, struct vg_msr_key);
	__type(value, __u64);
} msrs SEC(".maps");

/* When this CPU's pending IPI to one CPU was sent (0: none pending). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} icr_send_started SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vg_icr_sends);
} icr_sends SEC(".maps");

static __always_inline bool samplers_write(void)
{
	__u32 zero = 0;
	__u64 *stamp = bpf_map_lookup_elem(&sampler_stamp, &zero);

	return stamp && *stamp && bpf_ktime_get_ns() - *stamp < VG_SAMPLER_WINDOW_NS;
}

/* An ICR write ends the send stamped on this CPU, if one is pending. */
static __always_inline void end_icr_send(__u64 now)
{
	__u32 zero = 0;
	__u64 *started = bpf_map_lookup_elem(&icr_send_started, &zero);
	struct vg_icr_sends *sends = bpf_map_lookup_elem(&icr_sends, &zero);
	__u64 took;

	if (!started || !*started || !sends)
		return;
	took = now - *started;
	*started = 0;
	if (took < VG_ICR_SEND_MAX_NS) {
		sends->sends++;
		sends->ns += took;
	} else {
		sends->unpaired++;
	}
}

/* Stamps a send to one CPU (`now`), or clears the stamp for a mask's (0); a stamp still pending
 * was a send no ICR write ended. */
static __always_inline int stamp_icr_send(__u64 now)
{
	__u32 zero = 0;
	__u64 *started = bpf_map_lookup_elem(&icr_send_started, &zero);
	struct vg_icr_sends *sends = bpf_map_lookup_elem(&icr_sends, &zero);

	if (!started || !sends)
		return 0;
	if (*started)
		sends->unpaired++;
	*started = now;
	return 0;
}

static __always_inline int count(unsigned int msr, __u32 access)
{
	struct vg_msr_key key = { .msr = msr, .access = access };

	/* First, so that the time taken counts nothing of this program's. */
	if (access == VG_MSR_WRITE && msr == VG_MSR_X2APIC_ICR)
		end_icr_send(bpf_ktime_get_ns());

	if (access == VG_MSR_WRITE && samplers_write())
		key.access = VG_MSR_WRITE_BY_SAMPLER;
	else if (access == VG_MSR_WRITE && sampler_running)
		key.access = VG_MSR_WRITE_WHILE_SAMPLING;
	vg_count(&msrs, &key, false);
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

static __always_inline int stamp_sampler_timer(__u64 function)
{
	__u32 zero = 0;
	__u64 *stamp;

	if (!sampler_timer_fn || function != sampler_timer_fn)
		return 0;
	stamp = bpf_map_lookup_elem(&sampler_stamp, &zero);
	if (stamp)
		*stamp = bpf_ktime_get_ns();
	return 0;
}

SEC("tp_btf/hrtimer_expire_entry")
int BPF_PROG(hrtimer_expire_btf, struct hrtimer *timer, ktime_t *now)
{
	return stamp_sampler_timer((__u64)timer->function);
}

SEC("raw_tp/hrtimer_expire_entry")
int BPF_PROG(hrtimer_expire_raw, struct hrtimer *timer, ktime_t *now)
{
	return stamp_sampler_timer((__u64)BPF_CORE_READ(timer, function));
}

SEC("tp_btf/ipi_send_cpu")
int BPF_PROG(ipi_send_cpu_btf, const unsigned int cpu, unsigned long callsite, void *callback)
{
	return stamp_icr_send(bpf_ktime_get_ns());
}

SEC("raw_tp/ipi_send_cpu")
int BPF_PROG(ipi_send_cpu_raw, const unsigned int cpu, unsigned long callsite, void *callback)
{
	return stamp_icr_send(bpf_ktime_get_ns());
}

/* A mask's ICR writes are not one IPI's: no pending single send is theirs. */
SEC("tp_btf/ipi_send_cpumask")
int BPF_PROG(ipi_send_cpumask_btf, const struct cpumask *mask, unsigned long callsite, void *callback)
{
	return stamp_icr_send(0);
}

SEC("raw_tp/ipi_send_cpumask")
int BPF_PROG(ipi_send_cpumask_raw, const struct cpumask *mask, unsigned long callsite, void *callback)
{
	return stamp_icr_send(0);
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
struct vg_icr_sends vg_abi_icr_sends = {};
enum vg_msr_access vg_abi_msr_access = VG_MSR_READ;
