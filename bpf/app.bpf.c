// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * App latency of the processes attach mode follows, where the kernel shows it:
 *
 * - synchronous file I/O system calls (read, write, pread64, pwrite64, readv, writev, preadv,
 *   pwritev, preadv2, pwritev2, fsync, fdatasync) on a block device or a regular file of a
 *   filesystem on one, from entry to exit, per operation, with the bytes they returned.
 *   Sockets, pipes, /proc, /sys and tmpfs are left out. x86-64 system call numbers.
 * - io_uring requests of file reads, writes and fsyncs, from io_uring_submit_req (or 6.1's
 *   io_uring_submit_sqe, which takes the request too) to io_uring_complete; earlier kernels key
 *   these tracepoints otherwise and are reported as not measured.
 *
 * Asynchronous submissions that complete out of sight (libaio's io_submit) are counted, so the
 * summary can say which I/O had no app-level time.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "virtgap.h"
#include "vg_common.bpf.h"
#include "vg_filter.bpf.h"
#include "vg_hist.bpf.h"
#include "vg_maps.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define VG_S_IFMT 0170000
#define VG_S_IFREG 0100000
#define VG_S_IFBLK 0060000

/* x86-64 system call numbers. */
enum {
	NR_READ = 0,
	NR_WRITE = 1,
	NR_PREAD64 = 17,
	NR_PWRITE64 = 18,
	NR_READV = 19,
	NR_WRITEV = 20,
	NR_FSYNC = 74,
	NR_FDATASYNC = 75,
	NR_IO_SUBMIT = 209,
	NR_PREADV = 295,
	NR_PWRITEV = 296,
	NR_PREADV2 = 327,
	NR_PWRITEV2 = 328,
};

/* io_uring opcodes of file I/O. */
enum {
	URING_OP_READV = 1,
	URING_OP_WRITEV = 2,
	URING_OP_FSYNC = 3,
	URING_OP_READ_FIXED = 4,
	URING_OP_WRITE_FIXED = 5,
	URING_OP_READ = 22,
	URING_OP_WRITE = 23,
};

/* A system call or io_uring request in progress: when it started, what it is, whose. */
struct app_call {
	__u64 start_ns;
	__u32 kind;
	/* The thread that made the call or submitted the request. */
	__u32 tid;
};

/* Thread id -> the file I/O call it is in. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VG_MAX_TASKS);
	__type(key, __u32);
	__type(value, struct app_call);
} in_call SEC(".maps");

/* io_uring request -> its submission. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VG_MAX_INFLIGHT);
	__type(key, __u64);
	__type(value, struct app_call);
} in_ring SEC(".maps");

/* One histogram per kind (enum vg_app_kind), per CPU; user space sums them. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, VG_APP_KINDS);
	__type(key, __u32);
	__type(value, struct vg_hist);
} app_hists SEC(".maps");

/* Bytes the calls of each kind returned, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, VG_APP_KINDS);
	__type(key, __u32);
	__type(value, __u64);
} app_bytes SEC(".maps");

/*
 * Calls and requests that took at least `slow_call_ns`, for the attached tail autopsy. User
 * space moves the threshold with the processes' running tail and drains the buffer every
 * interval (no reader waits on it: records are submitted without a wakeup); a full buffer
 * counts drops.
 */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} slow_calls SEC(".maps");

/* Written by user space as soon as the object is loaded (0 would send every call). */
__u64 slow_call_ns = 0;

/* enum vg_app_counter, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, VG_APP_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} app_counters SEC(".maps");

/*
 * Whether `f` is I/O that can reach a disk: a block device, or a regular file of a filesystem on
 * one (not /proc, /sys, tmpfs, whose "files" are memory).
 */
static __always_inline bool disk_file(struct file *f)
{
	umode_t mode = BPF_CORE_READ(f, f_inode, i_mode) & VG_S_IFMT;

	if (mode == VG_S_IFBLK)
		return true;
	return mode == VG_S_IFREG && BPF_CORE_READ(f, f_inode, i_sb, s_bdev);
}

/* Whether descriptor `fd` of the current task is disk I/O (disk_file). */
static __always_inline bool file_fd(long fd)
{
	struct task_struct *task = (void *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	struct file **fds;
	struct file *f = NULL;
	unsigned int max;

	if (!fdt || fd < 0)
		return false;
	max = BPF_CORE_READ(fdt, max_fds);
	if ((unsigned long)fd >= max)
		return false;
	fds = BPF_CORE_READ(fdt, fd);
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]) || !f)
		return false;
	return disk_file(f);
}

/* The kind of file I/O system call `id` is, or VG_APP_KINDS for none. */
static __always_inline __u32 call_kind(long id)
{
	switch (id) {
	case NR_READ:
	case NR_PREAD64:
	case NR_READV:
	case NR_PREADV:
	case NR_PREADV2:
		return VG_APP_CALL_READ;
	case NR_WRITE:
	case NR_PWRITE64:
	case NR_WRITEV:
	case NR_PWRITEV:
	case NR_PWRITEV2:
		return VG_APP_CALL_WRITE;
	case NR_FSYNC:
	case NR_FDATASYNC:
		return VG_APP_CALL_SYNC;
	default:
		return VG_APP_KINDS;
	}
}

/* Sends a finished call or request to user space when it was slow enough (slow_calls). */
static __always_inline void emit_if_slow(const struct app_call *call, __u64 now, __u64 delta)
{
	struct vg_slow_call *r;

	if (delta < slow_call_ns)
		return;
	r = bpf_ringbuf_reserve(&slow_calls, sizeof(*r), 0);
	if (!r) {
		vg_bump(&app_counters, VG_APP_SLOW_DROPPED);
		return;
	}
	r->start_ns = call->start_ns;
	r->end_ns = now;
	r->tid = call->tid;
	r->kind = call->kind;
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
}

static __always_inline void record(const struct app_call *call, long ret)
{
	__u64 delta, *bytes, now = bpf_ktime_get_ns();
	__u32 kind = call->kind;
	struct vg_hist *h;

	if (kind >= VG_APP_KINDS || !vg_elapsed(call->start_ns, now, &delta))
		return;
	emit_if_slow(call, now, delta);
	h = bpf_map_lookup_elem(&app_hists, &kind);
	if (h)
		vg_hist_add(h, delta, false);
	bytes = bpf_map_lookup_elem(&app_bytes, &kind);
	if (bytes && ret > 0)
		*bytes += ret;
	if (ret < 0)
		vg_bump(&app_counters, VG_APP_FAILED);
}

static __always_inline int on_sys_enter(struct pt_regs *regs, long id)
{
	struct app_call call = {};
	__u32 tid;

	if (id == NR_IO_SUBMIT) {
		if (vg_current_wanted())
			vg_bump(&app_counters, VG_APP_IO_SUBMIT);
		return 0;
	}
	call.kind = call_kind(id);
	if (call.kind >= VG_APP_KINDS || !vg_current_wanted())
		return 0;
	if (!file_fd(BPF_CORE_READ(regs, di)))
		return 0;
	call.start_ns = bpf_ktime_get_ns();
	tid = (__u32)bpf_get_current_pid_tgid();
	call.tid = tid;
	if (bpf_map_update_elem(&in_call, &tid, &call, BPF_ANY))
		vg_bump(&app_counters, VG_APP_DROPPED);
	return 0;
}

static __always_inline int on_sys_exit(long ret)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct app_call *call = bpf_map_lookup_elem(&in_call, &tid);

	if (!call)
		return 0;
	record(call, ret);
	bpf_map_delete_elem(&in_call, &tid);
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(sys_enter_btf, struct pt_regs *regs, long id)
{
	return on_sys_enter(regs, id);
}

SEC("raw_tp/sys_enter")
int BPF_PROG(sys_enter_raw, struct pt_regs *regs, long id)
{
	return on_sys_enter(regs, id);
}

SEC("tp_btf/sys_exit")
int BPF_PROG(sys_exit_btf, struct pt_regs *regs, long ret)
{
	return on_sys_exit(ret);
}

SEC("raw_tp/sys_exit")
int BPF_PROG(sys_exit_raw, struct pt_regs *regs, long ret)
{
	return on_sys_exit(ret);
}

/*
 * The kind of io_uring request `req` is by its opcode (file reads, writes, fsyncs), or
 * VG_APP_KINDS. Its file is checked at completion: at submission it may not be assigned yet.
 */
static __always_inline __u32 ring_kind(struct io_kiocb *req)
{
	switch (BPF_CORE_READ(req, opcode)) {
	case URING_OP_READV:
	case URING_OP_READ_FIXED:
	case URING_OP_READ:
		return VG_APP_RING_READ;
	case URING_OP_WRITEV:
	case URING_OP_WRITE_FIXED:
	case URING_OP_WRITE:
		return VG_APP_RING_WRITE;
	case URING_OP_FSYNC:
		return VG_APP_RING_SYNC;
	default:
		return VG_APP_KINDS;
	}
}

/* Whether request `req`'s file is disk I/O (disk_file). */
static __always_inline bool ring_file(struct io_kiocb *req)
{
	struct file *f = BPF_CORE_READ(req, file);

	return f && disk_file(f);
}

static __always_inline int on_ring_submit(struct io_kiocb *req)
{
	struct app_call call = {};
	__u64 key = (__u64)req;

	if (!req || !vg_current_wanted())
		return 0;
	call.kind = ring_kind(req);
	if (call.kind >= VG_APP_KINDS)
		return 0;
	call.start_ns = bpf_ktime_get_ns();
	call.tid = (__u32)bpf_get_current_pid_tgid();
	if (bpf_map_update_elem(&in_ring, &key, &call, BPF_ANY))
		vg_bump(&app_counters, VG_APP_DROPPED);
	return 0;
}

static __always_inline int on_ring_complete(void *req)
{
	__u64 key = (__u64)req;
	struct app_call *call;

	if (!req)
		return 0;
	call = bpf_map_lookup_elem(&in_ring, &key);
	if (!call)
		return 0;
	/* The result's place in the tracepoint moved between kernels: latency only. */
	if (ring_file(req))
		record(call, 0);
	bpf_map_delete_elem(&in_ring, &key);
	return 0;
}

SEC("tp_btf/io_uring_submit_req")
int BPF_PROG(io_uring_submit_req_btf, struct io_kiocb *req)
{
	return on_ring_submit(req);
}

SEC("raw_tp/io_uring_submit_req")
int BPF_PROG(io_uring_submit_req_raw, struct io_kiocb *req)
{
	return on_ring_submit(req);
}

/*
 * 6.1's submission tracepoint, before its rename, where it already takes the request first
 * (user space enables it only where BTF says so: 5.15's passes the ring first, 5.10's no
 * request at all).
 */
SEC("tp_btf/io_uring_submit_sqe")
int BPF_PROG(io_uring_submit_sqe_btf, struct io_kiocb *req)
{
	return on_ring_submit(req);
}

SEC("raw_tp/io_uring_submit_sqe")
int BPF_PROG(io_uring_submit_sqe_raw, struct io_kiocb *req)
{
	return on_ring_submit(req);
}

/* Every layout of the kernels with either submission tracepoint above passes the request second. */
SEC("raw_tp/io_uring_complete")
int BPF_PROG(io_uring_complete_raw, void *ring, void *req)
{
	return on_ring_complete(req);
}

SEC("tp_btf/io_uring_complete")
int BPF_PROG(io_uring_complete_btf, void *ring, void *req)
{
	return on_ring_complete(req);
}

VG_FOLLOW_FORK_PROGRAMS;

struct vg_hist vg_abi_app_hist = {};
struct vg_slow_call vg_abi_slow_call = {};
enum vg_app_kind vg_abi_app_kind = VG_APP_CALL_READ;
enum vg_app_counter vg_abi_app_counter = VG_APP_IO_SUBMIT;
