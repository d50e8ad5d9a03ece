/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The ABI shared by virtgap's BPF programs and its Rust code. Only fixed-width types and
 * explicit padding; values Rust needs are enums (BTF carries enums, not macros), and Rust reads
 * these types from the generated skeletons, never from hand-written mirrors.
 */
#ifndef VIRTGAP_H
#define VIRTGAP_H

enum vg_limits {
	/* Log-linear histogram: values 0..7 exactly, then 8 sub-buckets per power of two, up to
	 * 2^42 ns (about 73 minutes); larger values land in the last slot. */
	VG_HIST_SUB_BITS = 3,
	VG_HIST_SLOTS = 320,
	/*
	 * Map sizes below are compile-time defaults; user space resizes each map before load to
	 * what this host needs (devices, queues, CPUs, IRQs), see probes/src/families/.
	 */
	/* Requests tracked between their start and completion. */
	VG_MAX_INFLIGHT = 16384,
	/*
	 * The block family's request slots (a power of two; user space sizes it), and how many
	 * consecutive slots from its home a request may take.
	 */
	VG_REQUEST_SLOTS = 32768,
	VG_REQUEST_PROBES = 4,
	/*
	 * Devices the block family counts first issues of, per CPU (a power of two), and how many
	 * consecutive entries from its home a device may take.
	 */
	VG_ISSUE_COUNTERS = 256,
	VG_ISSUE_PROBES = 8,
	/* Histogram keys: (device, hardware queue, op, stage) combinations. */
	VG_MAX_BLOCK_HISTS = 256,
	/* Hardware queues with a known IRQ, and those IRQs (user space sizes both). */
	VG_MAX_QUEUE_IRQS = 1024,
	/* CPUs a per-CPU-indexed array covers. */
	VG_MAX_CPUS = 1024,
	/* (CPU, IRQ) pairs. */
	VG_MAX_IRQS = 1024,
	VG_NR_SOFTIRQS = 10,
	/* Processes followed in attach mode (a database's, a cgroup's, every one named so). */
	VG_MAX_FOLLOWED = 65536,
	/* Threads of an attached process with a call in flight (the app family). */
	VG_MAX_TASKS = 4096,
	/* Slots of the wakeup family's direct-mapped stamps by thread id (a power of two). */
	VG_WAIT_SLOTS = 16384,
	/* Distinct (CPU, user/kernel, IP) sampler keys per interval (user space drains them). */
	VG_MAX_SAMPLE_KEYS = 16384,
};

/*
 * A latency histogram with an exact sum (ns). Its count is the sum of its slots (user space
 * adds them): one add fewer per value, an atomic one in shared maps.
 */
struct vg_hist {
	__u64 slots[VG_HIST_SLOTS];
	__u64 sum_ns;
};

/* Stage of a block request's life. */
enum vg_block_stage {
	/* Request started (allocated and accounted) -> its last issue to the driver. */
	VG_STAGE_QUEUE = 0,
	/*
	 * Last issue to the driver -> the entry of the interrupt handler of the request's hardware
	 * queue that completed it (device service plus interrupt delivery); where that IRQ is not
	 * known (no per-queue IRQ, polled queues, loop and other virtual devices), -> final
	 * completion. For a flush, request start -> completion.
	 */
	VG_STAGE_DEVICE = 1,
	/*
	 * That interrupt handler's entry -> the request's final completion: the driver's completion
	 * path, and the cross-CPU hop (an IPI, a softirq) when the request completes elsewhere.
	 */
	VG_STAGE_COMPLETION = 2,
	VG_BLOCK_STAGES = 3,
};

/* A hardware queue, for the map from queues to the IRQ that serves them. */
struct vg_queue_key {
	__u32 dev; /* major << 20 | minor of the whole disk */
	__u32 hctx;
};

/* Request operation, from cmd_flags & REQ_OP_MASK. */
enum vg_block_op {
	VG_OP_READ = 0,
	VG_OP_WRITE = 1,
	VG_OP_FLUSH = 2,
	VG_OP_DISCARD = 3,
	VG_OP_OTHER = 4,
};

struct vg_block_key {
	__u32 dev; /* major << 20 | minor of the whole disk */
	__u16 hctx; /* hardware queue index */
	__u8 op; /* enum vg_block_op */
	__u8 pad;
};

/*
 * Every stage's histogram of one (device, hardware queue, op), indexed by enum vg_block_stage:
 * a completion records its stages with one lookup. A stage never recorded stays empty.
 */
struct vg_block_hists {
	struct vg_hist stage[VG_BLOCK_STAGES];
	/*
	 * The IRQ serving the key's hardware queue (0: none known; IRQ 0 serves no queue), looked
	 * up once when the key is first used, so a completion finds it with its histograms.
	 */
	__u32 queue_irq;
	__u32 pad;
};

/* Counters of the block probe's own trouble. */
/* What an app latency histogram of attach mode holds (bpf/app.bpf.c). */
enum vg_app_kind {
	/* Synchronous system calls on files: read family, write family, fsync/fdatasync. */
	VG_APP_CALL_READ = 0,
	VG_APP_CALL_WRITE = 1,
	VG_APP_CALL_SYNC = 2,
	/* io_uring requests on files, submission to completion. */
	VG_APP_RING_READ = 3,
	VG_APP_RING_WRITE = 4,
	VG_APP_RING_SYNC = 5,
	VG_APP_KINDS = 6,
};

/* Counters of bpf/app.bpf.c. */
enum vg_app_counter {
	/* io_submit calls (libaio): their I/O completes out of sight, no app-level time. */
	VG_APP_IO_SUBMIT = 0,
	/* File I/O calls that returned an error. */
	VG_APP_FAILED = 1,
	/* Calls or requests not timed: a map was full. */
	VG_APP_DROPPED = 2,
	/* Slow calls lost for the tail autopsy: its ring buffer was full. */
	VG_APP_SLOW_DROPPED = 3,
	VG_APP_COUNTERS = 4,
};

enum vg_block_counter {
	/* A map was full: the request, histogram or device's issue count was not recorded. */
	VG_BLOCK_DROPPED = 0,
	/*
	 * Requests that completed without an issue to the driver having been seen: issued before
	 * the probes attached, or never issued at all (a flush sequence's empty request).
	 */
	VG_BLOCK_UNSEEN = 1,
	/* The driver handed a tracked request back to be issued again. */
	VG_BLOCK_REQUEUED = 2,
	/* A tracked request completed with an error (its status was not OK). */
	VG_BLOCK_ERRORS = 3,
	/* ... of which the block layer's timeout ended it. */
	VG_BLOCK_TIMEOUTS = 4,
	/*
	 * Requests whose device time ran to completion: their queue's IRQ is not known, or had not
	 * entered since the issue (polled, or completed outside it). No completion stage for them.
	 */
	VG_BLOCK_UNSPLIT = 5,
	/* Slow requests not sent to user space: the ring buffer was full. */
	VG_BLOCK_SLOW_DROPPED = 6,
	VG_BLOCK_COUNTERS = 7,
};

/*
 * One request whose start -> completion took at least the threshold user space keeps near the
 * application's running tail (for the tail autopsy, which joins it to the application's I/O by
 * disk and sector). Times are bpf_ktime_get_ns (CLOCK_MONOTONIC).
 */
struct vg_slow_request {
	__u64 start_ns;
	__u64 issue_ns;
	/* Entry of the queue's interrupt handler ending device time; 0: unsplit. */
	__u64 irq_ns;
	__u64 complete_ns;
	/* First 512-byte sector on the whole disk, as issued. */
	__u64 sector;
	__u32 dev; /* major << 20 | minor of the whole disk */
	__u32 bytes; /* as issued */
	__u8 op; /* enum vg_block_op */
	__u8 pad[3];
	/* The thread the request was started (or claimed) for: the attached tail autopsy joins a
	 * slow system call to the requests its thread waited for. */
	__u32 tid;
};

/* One slow file I/O call or io_uring request of a followed process, for the attached tail
 * autopsy (bpf/app.bpf.c). */
struct vg_slow_call {
	__u64 start_ns;
	__u64 end_ns;
	/* The thread that made the call or submitted the request. */
	__u32 tid;
	__u32 kind; /* enum vg_app_kind */
};

/* NVMe command latency key. qid = hardware queue index + 1; 0 is the admin queue. */
struct vg_nvme_key {
	__u32 dev;
	__u16 qid;
	__u8 op; /* enum vg_block_op */
	__u8 pad;
};

struct vg_irq_key {
	__u32 cpu;
	__u32 irq;
};

struct vg_irq_stats {
	__u64 count;
	__u64 time_ns;
	struct vg_hist duration;
};

/* Requests first issued to one device, on one CPU (the block family's `issued`). */
struct vg_dev_issues {
	/* major << 20 | minor; 0: the entry is free. */
	__u32 dev;
	__u32 pad;
	__u64 count;
};

/* Count and time of one kind of event on one CPU (per-CPU maps). */
struct vg_count_time {
	__u64 count;
	__u64 time_ns;
};

/* x86 system vectors, from the irq_vectors tracepoints. */
enum vg_vector {
	VG_VEC_LOCAL_TIMER = 0,
	VG_VEC_RESCHEDULE = 1,
	VG_VEC_CALL_FUNCTION = 2,
	VG_VEC_CALL_FUNCTION_SINGLE = 3,
	VG_VEC_IRQ_WORK = 4,
	VG_NR_VECTORS = 5,
};

/* IPIs actually sent (ipi_send_cpu / ipi_send_cpumask, one per target CPU), by kind. */
enum vg_ipi_kind {
	/* No callback: a reschedule. */
	VG_IPI_RESCHEDULE = 0,
	/* The generic call-function handlers: one or more queued cross-CPU calls to run. */
	VG_IPI_FUNCTION_CALL = 1,
	VG_NR_IPI_KINDS = 2,
};

/* Cross-CPU calls queued (csd_queue_cpu; 6.4/6.5: ipi_send_* naming the call), by purpose. */
enum vg_csd_kind {
	/* __blk_mq_complete_request_remote: a block completion redirected to the submitter. */
	VG_CSD_BLOCK_COMPLETE = 0,
	/* sched_ttwu_pending: a wakeup queued to the woken task's CPU. */
	VG_CSD_WAKEUP = 1,
	VG_CSD_OTHER = 2,
	VG_NR_CSD_KINDS = 3,
};

/* A softirq's start, and how much hard-IRQ time its CPU had had by then. */
struct vg_softirq_start {
	__u64 ts;
	__u64 nested_base;
};

enum vg_msr_access {
	VG_MSR_READ = 0,
	VG_MSR_WRITE = 1,
	/* A write in the wake of virtgap's own sampler interrupt on that CPU. */
	VG_MSR_WRITE_BY_SAMPLER = 2,
	/*
	 * Any other write while the sampler runs: its timer changes when and how the host's own
	 * timers are reprogrammed, so the host's figures come from the sampler's pauses.
	 */
	VG_MSR_WRITE_WHILE_SAMPLING = 3,
};

/* MSR accesses, per CPU (the per-CPU map copy) and MSR number. */
struct vg_msr_key {
	__u32 msr;
	__u32 access; /* enum vg_msr_access */
};

/* The x2APIC ICR: an IPI's send is a write to it, which exits in a guest without posted IPIs. */
#define VG_MSR_X2APIC_ICR 0x830

/*
 * IPIs to one CPU timed from the generic send (ipi:ipi_send_cpu, 6.4+) to the return of the ICR
 * write that sends them (msr:write_msr): the native work between them, and the write's exit in
 * a guest. Per CPU (the per-CPU map copy).
 */
struct vg_icr_sends {
	__u64 sends;
	__u64 ns;
	/* Sends no ICR write ended: a paravirt send, an xAPIC's MMIO write, or a stale stamp. */
	__u64 unpaired;
};

/* MMIO and port accessors a device doorbell writes through (iowrite16, iowrite32, ...): a
 * sample in one also keeps its caller, so a virtio queue notify is told from other writes. */
#define VG_NOTIFY_ACCESSORS 4

/* One CPU-clock sample: the interrupted kernel IP, or 0 for user mode; where the IP is in a
 * notify accessor, the address it returns to (its caller), else 0. */
struct vg_sample_key {
	__u32 cpu;
	__u32 user;
	__u64 ip;
	__u64 caller;
};

/* Host-side KVM events of one VMM process. */
enum vg_kvm_event {
	VG_KVM_PIO = 0,
	VG_KVM_MMIO = 1,
	VG_KVM_MSR = 2,
	VG_KVM_HYPERCALL = 3,
	VG_KVM_EXIT = 4,
	VG_KVM_EVENTS = 5,
};

struct vg_kvm_key {
	__u32 tgid;
	__u32 event; /* enum vg_kvm_event */
};

/* Time from kvm_exit to the next kvm_entry, by exit reason. */
struct vg_exit_key {
	__u32 isa; /* 1 VMX, 2 SVM (KVM_ISA_*) */
	__u32 reason;
};

/*
 * The paravirt-path timer's calls in progress on one CPU, innermost last (bpf/pvpath.bpf.c):
 * one per-CPU stack shared by every object user space loads, so that a path or hard-IRQ handler
 * nested in another is left out of the other's time.
 */
#define VG_PV_DEPTH 8
/* The index of a hard-IRQ handler's frame: not a path, only time to leave out of its parent. */
#define VG_PV_HANDLER 0xffffffffu

struct vg_pv_frame {
	__u64 ts;
	/* Time of the frames nested in this one, to leave out of its own. */
	__u64 nested_ns;
	__u32 index;
	__u32 pad;
};

struct vg_pv_stack {
	struct vg_pv_frame frames[VG_PV_DEPTH];
	__u32 depth;
	__u32 pad;
};

#endif /* VIRTGAP_H */
