#!/usr/bin/env python3
"""`virtgap iotune` against the best fio reaches on the same target: for each of the four
figures (sequential 1 MiB read and write bandwidth, random 4 KiB read and write IOPS), fio runs
a sweep of numjobs x iodepth (io_uring, O_DIRECT) to find its best point. The best of a sweep's
noisy points is biased up (the luckiest of many), so the yardstick is fio measured again at that
point: each round runs iotune (probes off, as fio has none, search included) and then fio at its
best point for as long as iotune's measured runs, and the ratio is the median over the rounds.
Targets: a 1 GiB file in a directory on this machine's disk, and a loop device over memory
(/dev/shm), a device far from a disk's limits. Root (the loop device); fio and virtgap run one
after the other, never together."""

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile

from memory_loop import memory_loop

PHASES = [
    # (key, fio rw, block size, bandwidth?)
    ("read_bandwidth", "read", "1M", True),
    ("write_bandwidth", "write", "1M", True),
    ("read_iops", "randread", "4k", False),
    ("write_iops", "randwrite", "4k", False),
]


def fio_figure(filename, rw, bs, numjobs, iodepth, runtime, size):
    """One fio job's figure: bytes/s or IOPS over its jobs together."""
    cmd = ["fio", "--name=sweep", f"--filename={filename}", f"--rw={rw}", f"--bs={bs}",
           "--ioengine=io_uring", "--direct=1", f"--numjobs={numjobs}", f"--iodepth={iodepth}",
           "--time_based", f"--runtime={runtime}", "--ramp_time=1", "--group_reporting",
           f"--size={size}", "--output-format=json"]
    if numjobs > 1 and rw in ("read", "write"):
        # Each job its own region, as iotune's workers each stream through their own.
        cmd.append("--offset_increment=" + str(size // numjobs))
        cmd[cmd.index(f"--size={size}")] = f"--size={size // numjobs}"
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench: fio failed: {out.stderr.strip()[-400:]}")
    job = json.loads(out.stdout)["jobs"][0]
    side = job["write"] if rw in ("write", "randwrite") else job["read"]
    return side["bw_bytes"] if rw in ("read", "write") else side["iops"]


def fio_best(filename, size, runtime, jobs, depths):
    best = {}
    for key, rw, bs, _ in PHASES:
        points = []
        for numjobs, iodepth in itertools.product(jobs, depths):
            points.append((fio_figure(filename, rw, bs, numjobs, iodepth, runtime, size), numjobs, iodepth))
        best[key] = max(points)
        print(f"  fio {key}: best {show(key, best[key][0])} at numjobs {best[key][1]} x iodepth {best[key][2]}",
              file=sys.stderr)
    return best


def iotune(virtgap, target, size, extra, out):
    cmd = [virtgap, "iotune", "--target", target, "--size", str(size), "--no-probes", "--quiet",
           "--force", "-o", out] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)}: {r.stderr.strip()[-400:]}")
    with open(out) as f:
        doc = json.load(f)
    return {p["phase"]: p for p in doc["phases"]}


def show(key, v):
    return f"{v / (1 << 20):.0f} MiB/s" if "bandwidth" in key else f"{v / 1000:.1f}k IOPS"


def compare(name, virtgap, target, size, extra, args, scratch):
    print(f"== {name}: {target}", file=sys.stderr)
    fio_target = target if not os.path.isdir(target) else os.path.join(target, "fio.data")
    if os.path.isdir(target):
        # Written through first, as iotune writes its file: fio lays its file out with
        # fallocate, and reads of unwritten extents return zeros without touching the disk.
        subprocess.run(["dd", "if=/dev/urandom", f"of={fio_target}", "bs=1M", f"count={size >> 20}",
                        "oflag=direct", "status=none"], check=True)
    best = fio_best(fio_target, size, args.runtime, args.jobs, args.depths)
    seconds = int(args.duration.rstrip("s"))
    rounds = {key: [] for key, *_ in PHASES}
    for r in range(args.rounds):
        ours = iotune(virtgap, target, size, extra, os.path.join(scratch, "iotune.json"))
        for key, rw, bs, _ in PHASES:
            _, numjobs, iodepth = best[key]
            f = fio_figure(fio_target, rw, bs, numjobs, iodepth, seconds, size)
            p = ours[key]
            rounds[key].append((p["figure"], f"{p['workers']} x qd {p['qd']}", f))
            print(f"  round {r + 1} {key}: iotune {show(key, p['figure'])}, fio again at its best "
                  f"{show(key, f)}, ratio {p['figure'] / f:.3f}", file=sys.stderr)
    rows = []
    for key, *_ in PHASES:
        f_sweep, numjobs, iodepth = best[key]
        got = rounds[key]
        rows.append((name, key, statistics.median(o for o, _, _ in got), got[-1][1],
                     statistics.median(f for _, _, f in got), f"{numjobs} x {iodepth}",
                     statistics.median(o / f for o, _, f in got), f_sweep))
    if os.path.isdir(target):
        os.unlink(fio_target)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--virtgap", default="target/release/virtgap")
    ap.add_argument("--dir", default="target/tmp", help="directory on the disk to measure (a 1 GiB file in it)")
    ap.add_argument("--no-disk", action="store_true", help="skip the disk-backed target")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory-backed loop device")
    ap.add_argument("--runtime", type=int, default=3, help="seconds per fio point")
    ap.add_argument("--jobs", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4])
    ap.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1, 4, 16, 32, 64, 128])
    ap.add_argument("--duration", default="5s", help="iotune's measured run length (and fio's, again at its best)")
    ap.add_argument("--rounds", type=int, default=3, help="iotune then fio at its best, this many times")
    args = ap.parse_args()
    if args.rounds < 1:
        sys.exit("bench: --rounds must be at least 1")
    if not args.duration.endswith("s") or not args.duration[:-1].isdigit():
        sys.exit("bench: --duration takes whole seconds, such as 5s")
    if os.geteuid() != 0:
        sys.exit("bench: run as root (a loop device over /dev/shm)")
    size = 1 << 30
    extra = ["--duration", args.duration]
    rows = []
    with tempfile.TemporaryDirectory(prefix="vg-bench-iotune-") as scratch:
        if not args.no_disk:
            os.makedirs(args.dir, exist_ok=True)
            rows += compare("disk", args.virtgap, args.dir, size, extra, args, scratch)
        if not args.no_memory:
            with memory_loop(size, "vg-bench-iotune") as (loop, backing):
                rows += compare("memory", args.virtgap, loop, size,
                                extra + ["--destroy-data", backing], args, scratch)
    print(f"medians over {args.rounds} rounds; 'fio sweep' is the best point's figure in the sweep "
          f"(biased up), 'fio best' that point measured again beside each iotune")
    print(f"{'target':<8} {'figure':<16} {'virtgap iotune':>16} {'at':>12} {'fio best':>16} {'at':>10} "
          f"{'ratio':>7} {'fio sweep':>16} {'ratio':>7}")
    for name, key, ours, at, fio, fio_at, ratio, sweep in rows:
        print(f"{name:<8} {key:<16} {show(key, ours):>16} {at:>12} {show(key, fio):>16} {fio_at:>10} "
              f"{ratio:>7.3f} {show(key, sweep):>16} {ours / sweep:>7.3f}")


if __name__ == "__main__":
    main()
