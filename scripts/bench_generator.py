#!/usr/bin/env python3
"""Our rand4k generator against fio on the same file and the same job (4 KiB random reads,
QD 32, one worker, io_uring, O_DIRECT, registered file and buffers), alternating pairs so the
machine's drift hits both alike. Prints per-pair figures and the median ratios ours/fio of
IOPS and of CPU time per I/O (worker-thread CPU as each tool reports it, and whole-process CPU
from wait4)."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def measure(cmd):
    r_fd, w_fd = os.pipe()
    err_fd = os.open(os.devnull, os.O_WRONLY)
    pid = os.fork()
    if pid == 0:
        os.dup2(w_fd, 1)
        os.dup2(err_fd, 2)
        os.close(r_fd)
        try:
            os.execvp(cmd[0], cmd)
        finally:
            os._exit(127)
    os.close(w_fd)
    chunks = []
    while True:
        b = os.read(r_fd, 1 << 16)
        if not b:
            break
        chunks.append(b)
    os.close(r_fd)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"bench: {' '.join(cmd)} exited with {os.waitstatus_to_exitcode(status)}")
    doc = json.loads(b"".join(chunks))
    job = doc["jobs"][0]
    ios = job["read"]["total_ios"]
    runtime_s = job["read"]["runtime"] / 1000.0
    worker_cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * runtime_s
    process_cpu_s = usage.ru_utime + usage.ru_stime
    return {
        "iops": job["read"]["iops"],
        "worker_ns_per_io": worker_cpu_s / ios * 1e9,
        "process_ns_per_io": process_cpu_s / ios * 1e9,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--virtgap", default="target/release/virtgap")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--runtime", type=int, default=10, help="seconds per run")
    ap.add_argument("--dir", default=None, help="directory for the 1 GiB test file")
    args = ap.parse_args()
    if args.pairs < 5:
        sys.exit("bench: use at least 5 pairs")

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="virtgap-bench-") as d:
        path = os.path.join(d, "rand4k.bin")
        # Write the whole file so both tools read real data, not unwritten extents.
        subprocess.run(["dd", "if=/dev/urandom", f"of={path}", "bs=1M", "count=1024",
                        "oflag=direct", "status=none"], check=True)
        ours = [args.virtgap, "record", "--workload", "rand4k", "--target", path,
                "--duration", f"{args.runtime}s", "--json", "--quiet", "--no-probes"]
        fio = ["fio", "--name=rand4k", f"--filename={path}", "--direct=1", "--ioengine=io_uring",
               "--rw=randread", "--bs=4096", "--iodepth=32", "--numjobs=1", "--size=1G",
               "--norandommap", "--randrepeat=0", "--registerfiles", "--fixedbufs",
               "--time_based", f"--runtime={args.runtime}", "--group_reporting",
               "--output-format=json"]
        rows = []
        print(f"{'pair':>4} {'ours IOPS':>10} {'fio IOPS':>10} {'ratio':>6} "
              f"{'ours ns/IO':>10} {'fio ns/IO':>10} {'ratio':>6}")
        for i in range(args.pairs):
            # Alternate who goes first so a trend in the machine's speed favours neither.
            first, second = (ours, fio) if i % 2 == 0 else (fio, ours)
            a = measure(first)
            b = measure(second)
            o, f = (a, b) if i % 2 == 0 else (b, a)
            rows.append((o, f))
            print(f"{i + 1:>4} {o['iops']:>10.0f} {f['iops']:>10.0f} {o['iops'] / f['iops']:>6.3f} "
                  f"{o['worker_ns_per_io']:>10.0f} {f['worker_ns_per_io']:>10.0f} "
                  f"{o['worker_ns_per_io'] / f['worker_ns_per_io']:>6.3f}", flush=True)
        med = lambda xs: statistics.median(xs)
        iops_ratio = med([o["iops"] / f["iops"] for o, f in rows])
        worker_ratio = med([o["worker_ns_per_io"] / f["worker_ns_per_io"] for o, f in rows])
        process_ratio = med([o["process_ns_per_io"] / f["process_ns_per_io"] for o, f in rows])
        print(f"median IOPS: ours {med([o['iops'] for o, _ in rows]):.0f}, "
              f"fio {med([f['iops'] for _, f in rows]):.0f}")
        print(f"median IOPS ratio ours/fio: {iops_ratio:.3f} (target >= 1.00)")
        print(f"median CPU per I/O ratio ours/fio, worker thread: {worker_ratio:.3f} (target <= 1.00)")
        print(f"median CPU per I/O ratio ours/fio, whole process: {process_ratio:.3f}")


if __name__ == "__main__":
    main()
