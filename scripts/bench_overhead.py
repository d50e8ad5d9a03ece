#!/usr/bin/env python3
"""What tracing costs the workload. Runs rand4k on one target with no probes, with all of
virtgap's probes, and with no virtgap probes but a bpftrace biolatency one-liner running,
rotating the order each round so the machine's drift hits all alike. Prints the median IOPS
ratio of each traced variant to the untraced one, and from the kernel's BPF run statistics
virtgap's own cost per event and per I/O beside bpftrace's per I/O, and their ratio.

Targets: a 1 GiB file on this machine's disk (`--device file`, the default), or a loop device
over a file in /dev/shm (`--device memory`), which serves reads from memory at several times a
virtio disk's rate, so a probe's cost per I/O weighs more in the IOPS ratio.

`--short-vs-long 4,20` asks whether a short recording costs the workload what a long one does
(the first interval, where every request goes through the ring to user space, weighs more in a
short one): each round runs untraced and with all probes at both durations, and the bench prints
the IOPS ratio kept at each, their paired difference with its interval, and the whole tool's CPU
per I/O at each (the BPF programs' and the recorder's own threads') with the difference's interval,
also in points of IOPS (at worst, all of it on one thread's path at the untraced rate; and at
the host's busy CPU time per untraced I/O), which the machine's noise moves far less than the
IOPS themselves.

`--qd 1` measures what a latency-bound database feels instead: one read in flight, so each
probe's time lands on the read's own path; the bench then also prints the mean latency each
traced variant adds per read (its mean minus the untraced run's of the same round), in µs."""

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from memory_loop import memory_loop

BIOLATENCY = (
    "tracepoint:block:block_rq_issue { @start[args->dev, args->sector] = nsecs; } "
    "tracepoint:block:block_rq_complete /@start[args->dev, args->sector]/ { "
    "@usecs = hist((nsecs - @start[args->dev, args->sector]) / 1000); "
    "delete(@start[args->dev, args->sector]); } "
    # At exit bpftrace prints every map; the requests still in flight need not be among them.
    "END { clear(@start); }"
)


def ensure_tracefs():
    if not os.path.exists("/sys/kernel/tracing/events"):
        subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], check=True)
        print("bench: mounted tracefs on /sys/kernel/tracing (bpftrace's tracepoints need it)")


def record(virtgap, path, runtime, probes, qd=None):
    cmd = [virtgap, "record", "-w", "rand4k", "--target", path, "--duration", f"{runtime}s",
           "--json", "--quiet"]
    if qd is not None:
        cmd += ["--qd", str(qd)]
    if not probes:
        cmd.append("--no-probes")
    out = subprocess.run(cmd, check=True, capture_output=True).stdout
    return json.loads(out)


def block_attachments():
    """Every BPF program attached to a block tracepoint, as (pid, prog_id, tracepoint), from
    `bpftool perf` (it lists tracepoint and raw tracepoint attachments with their owner)."""
    out = subprocess.run(["bpftool", "-j", "perf"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench: bpftool perf failed: {out.stderr.strip()}")
    return [(a["pid"], a["prog_id"], a["tracepoint"]) for a in json.loads(out.stdout or "[]")
            if a.get("tracepoint", "").startswith("block_")]


def refuse_other_block_tracers():
    """The bench counts the programs on the block tracepoints as the yardstick's, and any other
    tracer's would slow every variant: it starts only when there are none."""
    found = block_attachments()
    if not found:
        return
    owners = {}
    for pid, prog, tp in found:
        owners.setdefault(pid, []).append(f"{tp} (prog {prog})")
    names = []
    for pid, tps in sorted(owners.items()):
        try:
            comm = open(f"/proc/{pid}/comm").read().strip()
        except OSError:
            comm = "?"
        names.append(f"pid {pid} {comm}: {', '.join(tps)}")
    sys.exit("bench: other tracing programs are attached to the block tracepoints, and their "
             "cost would count in every variant: stop them first (" + "; ".join(names) + ")")


def bpftrace_costs(pid):
    """(runs, ns) of the block tracepoint programs process `pid` attached, from the kernel's
    run statistics."""
    ids = {prog for owner, prog, _ in block_attachments() if owner == pid}
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True)
    if out.returncode != 0 or not ids:
        return None
    runs = ns = 0
    for p in json.loads(out.stdout):
        if p.get("id") in ids:
            runs += p.get("run_cnt", 0)
            ns += p.get("run_time_ns", 0)
    return (runs, ns) if runs else None


@contextlib.contextmanager
def run_statistics():
    """The kernel's run statistics on for the block (bpftrace's programs need the switch; ours
    hold their own fd for a share of the time, and the other variants run without them)."""
    switch = "/proc/sys/kernel/bpf_stats_enabled"
    before = open(switch).read().strip()
    with open(switch, "w") as f:
        f.write("1")
    try:
        yield
    finally:
        with open(switch, "w") as f:
            f.write(before)


def with_bpftrace(virtgap, path, runtime, costs, qd=None):
    """A run with bpftrace attached; appends (ns per event, ns per I/O) to `costs`."""
    with run_statistics():
        bt = subprocess.Popen(["bpftrace", "-e", BIOLATENCY], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        # bpftrace's output is read to its end on a thread: a pipe left unread can block its
        # exit. The main thread waits until it says its probes are attached.
        attached = threading.Event()
        said = []

        def drain():
            for line in bt.stdout:
                said.append(line)
                if "Attaching" in line:
                    attached.set()
            attached.set()

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        if not attached.wait(30) or bt.poll() is not None:
            bt.kill()
            sys.exit("bench: bpftrace did not attach: " + "".join(said).strip())
        time.sleep(1)
        try:
            doc = record(virtgap, path, runtime, probes=False, qd=qd)
            cost = bpftrace_costs(bt.pid)
            if cost:
                runs, ns = cost
                # bpftrace also saw the I/O of its second of settling: a few I/Os at most.
                ios = doc["jobs"][0]["read"]["total_ios"]
                costs.append((ns / runs, ns / max(ios, 1)))
            return doc
        finally:
            bt.send_signal(signal.SIGINT)
            try:
                bt.wait(timeout=30)
            except subprocess.TimeoutExpired:
                bt.kill()
                bt.wait()
                print("bench: bpftrace did not exit within 30 s of SIGINT: killed")
            reader.join(timeout=5)


def median_interval(values, confidence=0.95):
    """A distribution-free interval for the median: the order statistics x(k) and x(n+1-k)
    with the largest k whose binomial coverage is at least `confidence` (None below 6 values).
    Rounds on this machine move by +-10%, so a median ratio alone cannot say whether a 2%
    target is met; the interval says when it cannot."""
    xs, n = sorted(values), len(values)
    best = None
    for k in range(1, n // 2 + 1):
        # P(x(k) <= median <= x(n+1-k)) = 1 - 2 P(Binomial(n, 1/2) <= k - 1)
        tail = sum(math.comb(n, i) for i in range(k)) / 2 ** n
        if 1 - 2 * tail >= confidence:
            best = (xs[k - 1], xs[n - k], 1 - 2 * tail)
    return best


def judged(values, target):
    """'median m, 95% interval [lo, hi]: meets / misses / cannot tell' against `target`."""
    m = statistics.median(values)
    iv = median_interval(values)
    if not iv:
        return f"{m:.3f} (too few rounds for an interval)"
    lo, hi, cover = iv
    word = "meets" if lo >= target else "misses" if hi < target else "cannot tell"
    return f"{m:.3f}, {cover:.0%} interval [{lo:.3f}, {hi:.3f}]: {word} >= {target}"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--virtgap", default="target/release/virtgap")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runtime", type=int, default=10, help="seconds per run")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--device", choices=["file", "memory"], default="file",
                    help="a file on this machine's disk, or a loop device over /dev/shm")
    ap.add_argument("--short-vs-long", default=None, metavar="SHORT,LONG",
                    help="compare a short and a long recording's cost instead (seconds, e.g. 4,20)")
    ap.add_argument("--qd", type=int, default=None,
                    help="reads in flight (default: the rand4k preset's); 1 also prints the "
                         "latency the probes add per read")
    args = ap.parse_args()
    if args.rounds < 5:
        sys.exit("bench: use at least 5 rounds")
    if os.geteuid() != 0:
        sys.exit("bench: needs root (BPF)")
    os.environ["PATH"] += ":/usr/sbin:/sbin"
    for tool, why in [("bpftrace", "the yardstick"), ("bpftool", "reads the programs' costs")]:
        if not shutil.which(tool):
            sys.exit(f"bench: {tool} ({why}) is missing: apt-get install {tool}, "
                     "or run ./setup.sh bench-overhead")
    ensure_tracefs()
    refuse_other_block_tracers()
    run(args)


def run(args):
    if args.device == "memory":
        with memory_loop(1 << 30, "virtgap-bench") as (loop, backing):
            print(f"bench: {loop}, a loop device over {backing}")
            (short_vs_long if args.short_vs_long else rounds)(args, loop)
        return
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="virtgap-bench-") as d:
        path = os.path.join(d, "rand4k.bin")
        subprocess.run(["dd", "if=/dev/urandom", f"of={path}", "bs=1M", "count=1024",
                        "oflag=direct", "status=none"], check=True)
        (short_vs_long if args.short_vs_long else rounds)(args, path)


def rounds(args, path):
    qd = args.qd
    variants = {
        "none": lambda: record(args.virtgap, path, args.runtime, probes=False, qd=qd),
        "virtgap": lambda: record(args.virtgap, path, args.runtime, probes=True, qd=qd),
        "bpftrace": lambda: with_bpftrace(args.virtgap, path, args.runtime, bpftrace_ns, qd=qd),
    }
    names = list(variants)
    iops = {n: [] for n in names}
    # Each run's mean read latency, ns.
    lat = {n: [] for n in names}
    per_event = {"block": [], "irq": [], "wakeup": [], "msr": [], "sampler": []}
    # Each family's CPU per I/O: where the all-probes figure goes (a family may run several
    # times per I/O, or on events the I/O causes: wakeups, softirqs, IPIs).
    family_per_io = {fam: [] for fam in per_event}
    bpftrace_ns = []
    cpu_share = []
    all_per_io = []
    print(f"{'round':>5} " + " ".join(f"{n + ' IOPS':>14}" for n in names))
    for r in range(args.rounds):
        order = names[r % 3:] + names[:r % 3]
        row = {}
        for n in order:
            doc = variants[n]()
            row[n] = doc["jobs"][0]["read"]["iops"]
            iops[n].append(row[n])
            lat[n].append(doc["jobs"][0]["read"]["lat_ns"]["mean"])
            if n == "virtgap":
                probes = doc["probes"]
                progs = probes["programs"]
                secs = probes["seconds"]
                ios, stats_share = ios_with_run_stats(doc)
                for fam in per_event:
                    runs = sum(p["runs"] for p in progs if p["family"] == fam)
                    ns = sum(p["run_time_ns"] for p in progs if p["family"] == fam)
                    if runs:
                        per_event[fam].append(ns / runs)
                    family_per_io[fam].append(ns / max(ios, 1))
                all_ns = sum(p["run_time_ns"] for p in progs)
                cpu_share.append(all_ns / 1e9 / (secs * stats_share) * 100)
                all_per_io.append(all_ns / max(ios, 1))
        print(f"{r + 1:>5} " + " ".join(f"{row[n]:>14.0f}" for n in names), flush=True)

    med = statistics.median
    # Each round's ratio pairs runs minutes apart, so the machine's drift between rounds cancels.
    ratios = lambda n: [a / b for a, b in zip(iops[n], iops["none"])]
    print(f"median IOPS: " + ", ".join(f"{n} {med(iops[n]):.0f}" for n in names))
    print(f"IOPS ratio virtgap probes / none, median of rounds: {judged(ratios('virtgap'), 0.98)}")
    print(f"IOPS ratio bpftrace biolatency / none, median of rounds: {judged(ratios('bpftrace'), 0.98)}")
    # What each traced variant adds to a read's mean latency, paired by round as the ratios are.
    added = lambda n: [(t - u) / 1e3 for t, u in zip(lat[n], lat["none"])]
    for n, what in [("virtgap", "virtgap probes"), ("bpftrace", "bpftrace biolatency")]:
        iv = median_interval(added(n))
        span = f", {iv[2]:.0%} interval [{iv[0]:+.2f}, {iv[1]:+.2f}]" if iv else ""
        print(f"mean read latency added by {what}: median {med(added(n)):+.2f} µs{span} "
              f"(untraced mean {med(lat['none']) / 1e3:.1f} µs)")
    for fam, values in per_event.items():
        if values:
            print(f"virtgap {fam} programs: median {med(values):.0f} ns per event, "
                  f"{med(family_per_io[fam]):.0f} ns per I/O"
                  + (" (target <= 100 ns per event for block and irq)"
                     if fam in ("block", "irq") else ""))
    per_io = family_per_io["block"]
    print(f"virtgap block probes per I/O (3 programs): median {med(per_io):.0f} ns")
    if bpftrace_ns:
        print(f"bpftrace biolatency programs, same machine: median "
              f"{med([e for e, _ in bpftrace_ns]):.0f} ns per event, "
              f"{med([i for _, i in bpftrace_ns]):.0f} ns per I/O (2 programs per I/O)")
        print(f"virtgap block family per I/O / bpftrace biolatency per I/O (medians): "
              f"{med(per_io) / med([i for _, i in bpftrace_ns]):.2f} (target <= 1.00)")
    print(f"virtgap all probes' CPU per I/O: median {med(all_per_io):.0f} ns")
    if bpftrace_ns:
        print(f"virtgap all probes per I/O / bpftrace biolatency per I/O (medians): "
              f"{med(all_per_io) / med([i for _, i in bpftrace_ns]):.2f} (target <= 0.50)")
    print(f"virtgap probes' CPU: median {med(cpu_share):.2f}% of one CPU")


def ios_with_run_stats(doc):
    """The I/Os of a traced run while the run statistics were on (the programs' figures count
    only then: the first two intervals, then one in four), and that share of the probe window."""
    probes = doc["probes"]
    secs = probes["seconds"]
    stats_share = min(1.0, (probes.get("stats_seconds") or secs) / secs)
    return doc["jobs"][0]["read"]["total_ios"] * stats_share, stats_share


def tool_cpu_per_io(doc):
    """The whole tool's CPU per I/O of a traced run, ns: its BPF programs' (over the I/Os while
    the run statistics were on) and its recorder's threads'."""
    probes = doc["probes"]
    job = doc["jobs"][0]
    ios, _ = ios_with_run_stats(doc)
    bpf = sum(p["run_time_ns"] for p in probes["programs"]) / max(ios, 1)
    recorder_pct = probes.get("recorder_cpu_pct")
    if recorder_pct is None:
        sys.exit("bench: this virtgap does not report its recorder's CPU (`probes.recorder_cpu_pct`)")
    # Its share of a CPU over the run's wall time, spread over the run's I/O rate.
    recorder = recorder_pct / 100 * 1e9 / max(job["read"]["iops"], 1)
    return bpf, recorder


def busy_cpu_ns():
    """Every CPU's non-idle time so far, ns (/proc/stat): the workload's threads and all the
    kernel work its I/O causes elsewhere (the loop device's worker, interrupts)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) * 1e9 / os.sysconf("SC_CLK_TCK")


def short_vs_long(args, path):
    try:
        short, long_ = (int(x) for x in args.short_vs_long.split(","))
    except ValueError:
        sys.exit(f"bench: --short-vs-long takes two durations in seconds, e.g. 4,20 "
                 f"(got {args.short_vs_long!r})")
    qd = args.qd
    variants = [(d, probes) for d in (short, long_) for probes in (False, True)]
    iops = {v: [] for v in variants}
    tool = {d: [] for d in (short, long_)}
    recorder = {d: [] for d in (short, long_)}
    workload_cpu = []
    print(f"{'round':>5} " + " ".join(f"{f'{d} s ' + ('traced' if p else 'none'):>14}"
                                      for d, p in variants))
    for r in range(args.rounds):
        # Rotated each round, so the machine's drift within a round hits every variant alike.
        order = variants[r % 4:] + variants[:r % 4]
        row = {}
        for d, probes in order:
            before = busy_cpu_ns()
            doc = record(args.virtgap, path, d, probes=probes, qd=qd)
            row[(d, probes)] = doc["jobs"][0]["read"]["iops"]
            iops[(d, probes)].append(row[(d, probes)])
            if probes:
                bpf, own = tool_cpu_per_io(doc)
                tool[d].append(bpf + own)
                recorder[d].append(own)
            elif d == long_:
                busy_ns = busy_cpu_ns() - before
                workload_cpu.append(busy_ns / max(doc["jobs"][0]["read"]["total_ios"], 1))
        print(f"{r + 1:>5} " + " ".join(f"{row[v]:>14.0f}" for v in variants), flush=True)

    med = statistics.median
    kept = {d: [t / u for t, u in zip(iops[(d, True)], iops[(d, False)])] for d in (short, long_)}
    for d in (short, long_):
        iv = median_interval(kept[d])
        span = f", {iv[2]:.0%} interval [{iv[0]:.3f}, {iv[1]:.3f}]" if iv else ""
        print(f"IOPS kept by all probes in {d} s runs: median {med(kept[d]):.3f}{span}")
    gap = [(a - b) * 100 for a, b in zip(kept[short], kept[long_])]
    iv = median_interval(gap)
    span = f", {iv[2]:.0%} interval [{iv[0]:+.1f}, {iv[1]:+.1f}]" if iv else ""
    print(f"IOPS kept, {short} s minus {long_} s, paired by round: median {med(gap):+.1f} points{span}")
    for d in (short, long_):
        print(f"whole tool's CPU per I/O in {d} s runs: median {med(tool[d]):.0f} ns "
              f"(of it the recorder's threads {med(recorder[d]):.0f} ns)")
    extra = [a - b for a, b in zip(tool[short], tool[long_])]
    iv = median_interval(extra)
    span = f", {iv[2]:.0%} interval [{iv[0]:+.0f}, {iv[1]:+.0f}]" if iv else ""
    print(f"whole tool's CPU per I/O, {short} s minus {long_} s, paired by round: "
          f"median {med(extra):+.0f} ns{span}")
    # IOPS scale with 1 / (time per I/O on the bottleneck): the tool's extra CPU per I/O over
    # that time is the share of IOPS it takes. The bottleneck is at worst one thread (the loop
    # device's worker), whose time per I/O is a second over the untraced rate; where the CPUs
    # are, it is the host's busy CPU time per I/O.
    for what, per_io in [("if all of it lands on one thread's path (the worst case)",
                          1e9 / med(iops[(long_, False)])),
                         ("at the host's busy CPU time per untraced I/O", med(workload_cpu))]:
        points = lambda ns: ns / per_io * 100
        iv_points = f" [{points(iv[0]):+.2f}, {points(iv[1]):+.2f}]" if iv else ""
        print(f"  in points of IOPS, {what} ({per_io:.0f} ns): {points(med(extra)):+.2f}"
              f"{iv_points} (target: within 2)")


if __name__ == "__main__":
    main()
