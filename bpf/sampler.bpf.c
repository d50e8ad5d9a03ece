// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * The hypervisor sampler: attached to a cpu-clock perf event on every CPU, it counts where each
 * sample landed — the kernel instruction pointer, or "user". User space resolves the IPs against
 * kallsyms and sorts them into hypervisor interface, idle, IRQ, softirq, block, other kernel and
 * user: `perf top -C <cpu>` for every CPU at once, kept per interval. A sample in an MMIO or
 * port accessor keeps its caller, so a device's doorbell (an exit per kick) is told apart.
 *
 * Samples go to one of two maps; every interval user space flips `fill_second` and drains the
 * map no longer being filled, so keys never pile up over a long run.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "virtgap.h"
#include "vg_maps.bpf.h"
#include "vg_sampler_stamp.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Which map the program fills (user space flips it). */
__u32 fill_second = 0;

/*
 * [lo, hi) of each notify accessor (user space sets them from kallsyms; 0, 0 where absent).
 * A virtio queue notify is a write to the device's notify register through iowrite16 (PCI) or
 * a writel (MMIO), which exits to the hypervisor: the sample after the exit lands in the
 * accessor, and only its caller says whether it was a doorbell.
 */
const volatile __u64 notify_lo[VG_NOTIFY_ACCESSORS] = {};
const volatile __u64 notify_hi[VG_NOTIFY_ACCESSORS] = {};

/* perf_event programs may only use preallocated hash maps: user space sizes both. */
struct samples_map {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VG_MAX_SAMPLE_KEYS);
	__type(key, struct vg_sample_key);
	__type(value, __u64);
};

struct samples_map samples_first SEC(".maps");
struct samples_map samples_second SEC(".maps");

VG_DROPPED_MAP;

SEC("perf_event")
int sample(struct bpf_perf_event_data *ctx)
{
	struct vg_sample_key key = { .cpu = bpf_get_smp_processor_id() };
	void *map = fill_second ? (void *)&samples_second : (void *)&samples_first;
	__u64 *stamp;
	__u32 zero = 0;

	/*
	 * User or kernel mode, from the interrupted address: kernel addresses have the top bit set.
	 * (pt_regs' CS changed name and type in 6.9, so the IP is the portable test.)
	 */
	stamp = bpf_map_lookup_elem(&sampler_stamp, &zero);
	if (stamp)
		*stamp = bpf_ktime_get_ns();
	key.ip = PT_REGS_IP(&ctx->regs);
	key.user = (__s64)key.ip >= 0;
	if (key.user)
		key.ip = 0;
	for (int i = 0; i < VG_NOTIFY_ACCESSORS && !key.user; i++) {
		if (key.ip >= notify_lo[i] && key.ip < notify_hi[i]) {
			/* The interrupted IP, then the address its function returns to. */
			__u64 frames[2] = {};

			if (bpf_get_stack(ctx, frames, sizeof(frames), 0) >= (long)sizeof(frames))
				key.caller = frames[1];
			break;
		}
	}
	if (!vg_count(map, &key, true))
		vg_bump(&dropped, 0);
	return 0;
}

struct vg_sample_key vg_abi_sample_key = {};
