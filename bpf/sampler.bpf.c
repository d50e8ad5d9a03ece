// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * The hypervisor sampler: attached to a cpu-clock perf event on every CPU, it counts where each
 * sample landed — the kernel instruction pointer, or "user". User space resolves the IPs against
 * kallsyms and sorts them into hypervisor interface, idle, IRQ, softirq, block, other kernel and
 * user: `perf top -C <cpu>` for every CPU at once, kept per interval.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "virtgap.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct vg_sample_key);
	__type(value, __u64);
} samples SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} dropped SEC(".maps");

SEC("perf_event")
int sample(struct bpf_perf_event_data *ctx)
{
	struct vg_sample_key key = { .cpu = bpf_get_smp_processor_id() };
	__u64 one = 1, *n;

	/*
	 * The low two bits of CS are the privilege level the CPU was interrupted in. The context
	 * only allows full-word reads, so read the 64-bit word that holds CS.
	 */
	key.user = (ctx->regs.csx & 3) != 0;
	key.ip = key.user ? 0 : PT_REGS_IP(&ctx->regs);
	n = bpf_map_lookup_elem(&samples, &key);
	if (n) {
		__sync_fetch_and_add(n, 1);
	} else if (bpf_map_update_elem(&samples, &key, &one, BPF_NOEXIST)) {
		__u32 zero = 0;
		__u64 *d = bpf_map_lookup_elem(&dropped, &zero);

		if (d)
			(*d)++;
	}
	return 0;
}

struct vg_sample_key vg_abi_sample_key = {};
