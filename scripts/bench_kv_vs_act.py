#!/usr/bin/env python3
"""virtgap's kv workload against Aerospike's ACT (act_storage), on two loop devices.

Builds ACT from a source tree you give it (it is not vendored: `--act-src` is a checkout of
github.com/aerospike/act) and climbs a ladder of x-ratings on each device asked for:

  disk    a loop device with direct I/O over a file written in full on the disk under --dir
          (every read reaches the disk: the disk is usually the limit)
  memory  a loop device over a file in /dev/shm (the loop driver serves it from memory: the
          CPUs are the limit, and a generator's own cost shows)

At each rating it runs ACT, then virtgap's kv-act with probes off and with every probe attached,
each for the same duration on the same device, and prints per run:

  delivered  share of the scheduled client reads done (ACT: its reads histogram's total;
             virtgap: its delivered client share, reads and writes)
  device     ACT's definition: % of reads whose device read took >= 1, 8, 64 ms (virtgap: its
             worst complete slice)
  intended   the client's definition, from each read's scheduled start (virtgap only: ACT does
             not record when a read was due)
  verdict    ACT's thresholds (< 5% of reads >= 1 ms, < 1% >= 8 ms, < 0.1% >= 64 ms); virtgap
             passes when both definitions hold in every complete slice; a run that did not
             deliver its load has no PASS
  CPU/read   CPU time of every thread of the run per client read done (virtgap: its workload
             threads in the measured window — service or ring threads, writer, defragmenter;
             ACT: the whole process). virtgap's writes are real appends that ACT does not
             model per operation, so the ratio counts them against virtgap.

A fourth row, when fio is installed, is the device's own ceiling: fio doing the rating's device
I/O with nothing to index or verify — 1536-byte random reads at the client read rate (Poisson
arrivals, io_uring, one job per CPU) beside 128 KiB writes and 128 KiB reads at ACT's large-block
rate. Where fio cannot deliver those reads with under 5% of them >= 1 ms, no generator passes
that rating on this device. fio's latency buckets do not split at 8 and 64 ms, so only its
>= 1 ms share is shown.

Then the ratios per device: highest rating delivered and passed (ours / ACT) and CPU per client
read (ours / ACT) at each rating.

--contend PCT runs a fixed CPU load beside every run, the same for each: one process pinned to
each CPU, busy PCT% of every 10 ms. Root only (loop devices)."""

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_loop import memory_loop  # noqa: E402

ACT_THRESHOLDS = ((1, 5.0), (8, 1.0), (64, 0.1))


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def build_act(src):
    binary = os.path.join(src, "target", "bin", "act_storage")
    r = subprocess.run(["make", "-C", src, "act_storage"], text=True, capture_output=True)
    if r.returncode != 0 or not os.access(binary, os.X_OK):
        sys.exit(f"bench: building ACT in {src} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return binary


def timed(cmd):
    """Runs cmd; returns (exit code, stdout, CPU seconds of the whole process tree)."""
    with tempfile.TemporaryFile() as out:
        pid = os.fork()
        if pid == 0:
            os.dup2(out.fileno(), 1)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            try:
                os.execvp(cmd[0], cmd)
            finally:
                os._exit(127)
        _, status, usage = os.wait4(pid, 0)
        out.seek(0)
        text = out.read().decode(errors="replace")
    return os.waitstatus_to_exitcode(status), text, usage.ru_utime + usage.ru_stime


def act_verdict(buckets, total):
    """ACT's pass rule on a histogram of power-of-two millisecond buckets: bucket 0 is under
    1 ms, bucket k covers [2^(k-1), 2^k) ms."""
    if total == 0:
        return False, {}
    pct = {}
    for ms, limit in ACT_THRESHOLDS:
        first = ms.bit_length()  # the first bucket whose range starts at >= ms
        over = sum(n for b, n in buckets.items() if b >= first)
        pct[ms] = 100.0 * over / total
    return all(pct[ms] < limit for ms, limit in ACT_THRESHOLDS), pct


def run_act(binary, device, x, duration, workdir):
    conf = os.path.join(workdir, f"act-{x}x.conf")
    with open(conf, "w") as f:
        f.write(
            f"device-names: {device}\n"
            f"test-duration-sec: {duration}\n"
            f"read-reqs-per-sec: {2000 * x}\n"
            f"write-reqs-per-sec: {1000 * x}\n"
        )
    code, out, cpu = timed([binary, conf])
    with open(os.path.join(workdir, f"act-{x}x.log"), "w") as f:
        f.write(out)
    # The last cumulative dump of the "reads" histogram.
    reads_total, buckets = 0, {}
    for block in re.finditer(r"^reads \((\d+) total\)\n((?: \(\d+: \d+\).*\n)*)", out, re.M):
        reads_total = int(block.group(1))
        buckets = {int(b): int(n) for b, n in re.findall(r"\((\d+): (\d+)\)", block.group(2))}
    stopped = "can't keep up" in out
    delivered = reads_total / (2000 * x * duration)
    ok, pct = act_verdict(buckets, reads_total)
    verdict = "PASS" if ok and not stopped and delivered >= 0.99 else "FAIL"
    if stopped:
        verdict = "stopped: " + next(
            (l.strip() for l in out.splitlines() if "can't keep up" in l), "behind"
        )
    return {
        "delivered": delivered,
        "verdict": verdict,
        "pct": pct,
        "cpu_per_read_us": cpu / reads_total * 1e6 if reads_total else None,
        "exit": code,
    }


def run_fio(device, x, duration, workdir):
    """fio doing the rating's device I/O with nothing to verify or index: what the device gives
    any generator. Client reads: 1536-byte random reads at 2000 x/s, Poisson arrivals, one job
    per CPU. Large blocks: 128 KiB writes and as many 128 KiB reads (the defragmenter's) at
    ACT's rate for the rating, writes x 1536 B / 128 KiB x 2 (defrag at 50% live doubles it)."""
    jobs = os.cpu_count() or 1
    rate = 2000 * x
    large_blocks = max(1, round(1000 * x * 1536 * 2 / (128 * 1024)))
    out_json = os.path.join(workdir, f"fio-{x}x.json")
    common = [f"--filename={device}", "--direct=1", "--ioengine=io_uring", "--time_based",
              f"--runtime={duration}", "--norandommap", "--randrepeat=0"]
    cmd = [
        "fio", "--output-format=json", f"--output={out_json}",
        "--name=reads", *common, "--rw=randread", "--bs=1536", "--iodepth=32",
        f"--numjobs={jobs}", f"--rate_iops={max(1, rate // jobs)}", "--rate_process=poisson",
        "--name=lb-writes", *common, "--rw=randwrite", "--bs=128k", "--iodepth=4",
        f"--rate_iops={large_blocks}",
        "--name=lb-reads", *common, "--rw=randread", "--bs=128k", "--iodepth=4",
        f"--rate_iops={large_blocks}",
    ]
    code, _, cpu = timed(cmd)
    try:
        with open(out_json) as f:
            reads = [j for j in json.load(f)["jobs"] if j["jobname"] == "reads"]
        done = sum(j["read"]["total_ios"] for j in reads)
        # Each job's latency_ms holds the percentage of its I/Os in each bucket above 1 ms
        # ("2" is (1, 2] ms).
        over = sum(sum(j["latency_ms"].values()) / 100.0 * j["read"]["total_ios"] for j in reads)
    except (OSError, ValueError, KeyError, IndexError):
        return {"delivered": 0.0, "verdict": f"error (exit {code})", "pct": {}, "cpu_per_read_us": None}
    over_1ms = 100.0 * over / done if done else 0.0
    delivered = done / (rate * duration)
    keeps_up = delivered >= 0.99 and over_1ms < 5.0
    return {
        "delivered": delivered,
        "verdict": "device keeps up" if keeps_up else "device cannot",
        "pct": {1: over_1ms},
        "cpu_per_read_us": cpu / done * 1e6 if done else None,
        "exit": code,
    }


def run_virtgap(binary, device, backing, size, x, duration, probes, workdir):
    out_json = os.path.join(workdir, f"virtgap-{x}x-{'probes' if probes else 'noprobes'}.json")
    cmd = [
        binary, "record", "-w", "kv-act", "--x", str(x), "--duration", f"{duration}s",
        "--target", device, "--destroy-data", backing, "--size", size,
        "--json", "--force", "-o", out_json,
    ]
    if not probes:
        cmd.append("--no-probes")
    code, out, _ = timed(cmd)
    try:
        doc = json.loads(out)
    except json.JSONDecodeError:
        return {"delivered": 0.0, "verdict": f"error (exit {code})", "pct": {}, "cpu_per_read_us": None}
    kv = doc["kv"]
    measured_s = max(s["end_s"] for s in kv["slices"]) if kv["slices"] else duration
    reads = kv["achieved"]["client_reads_per_s"] * measured_s
    cpu_s = sum((j["usr_cpu"] + j["sys_cpu"]) / 100.0 for j in doc["jobs"]) * measured_s
    complete = [s for s in kv["slices"] if s["complete"]] or kv["slices"]

    def worst(field):
        return {
            ms: max(s[field][f"pct_at_or_over_{ms}ms"] for s in complete if s.get(field))
            for ms, _ in ACT_THRESHOLDS
        } if any(s.get(field) for s in complete) else {}

    verdict = {"pass": "PASS", "fail": "FAIL", "not_delivered": "NO VERDICT (load not delivered)"}.get(
        kv["outcome"], kv["outcome"]
    )
    failed = [name for name, key in (("device", "service_pass"), ("intended", "intended_pass"))
              if kv.get(key) is False]
    if verdict == "FAIL" and failed:
        verdict += f" ({' and '.join(failed)})"
    # Every client read is checked against the index: say how many, and how many were wrong.
    verdict += f"; {reads / 1e6:.2f}M reads checked, {kv['mismatches']} mismatches"
    return {
        "delivered": kv["delivered"]["client_fraction"],
        "lb_delivered": kv["delivered"]["large_block_fraction"],
        "verdict": verdict,
        "pct": worst("reads"),
        "pct_intended": worst("reads_intended"),
        "cpu_per_read_us": cpu_s / reads * 1e6 if reads else None,
        "exit": code,
    }


def row(name, r):
    def pcts(p):
        return " ".join(f"{p[ms]:6.2f}%" if ms in p else f"{'-':>7}" for ms, _ in ACT_THRESHOLDS)

    cpu = f"{r['cpu_per_read_us']:8.2f} µs" if r.get("cpu_per_read_us") else "       - µs"
    return (f"  {name:<18} {100 * r['delivered']:7.2f}%  {pcts(r['pct'])}  "
            f"{pcts(r.get('pct_intended', {}))}  {cpu}  {r['verdict']}")


@contextlib.contextmanager
def contention(pct):
    """One process pinned to each CPU, busy `pct`% of every 10 ms, until the block ends (none
    for 0)."""
    procs = []
    if pct > 0:
        busy, period = pct / 100.0 * 0.010, 0.010
        for cpu in sorted(os.sched_getaffinity(0)):
            pid = os.fork()
            if pid == 0:
                try:
                    os.sched_setaffinity(0, {cpu})
                    while True:
                        start = time.monotonic()
                        while time.monotonic() - start < busy:
                            pass
                        time.sleep(max(0.0, period - (time.monotonic() - start)))
                finally:
                    os._exit(0)
            procs.append(pid)
    try:
        yield
    finally:
        for pid in procs:
            os.kill(pid, 9)
            os.waitpid(pid, 0)


@contextlib.contextmanager
def disk_loop(size, directory):
    """A loop device with direct I/O over a file written in full under `directory`."""
    backing = os.path.abspath(os.path.join(directory, "loop.img"))
    mib = int(run(["numfmt", "--from=iec-i", "--to-unit=1048576", size.replace("B", "")]).stdout)
    print(f"bench: writing a {mib} MiB backing file in {directory} (every block allocated) ...", flush=True)
    run(["dd", "if=/dev/zero", f"of={backing}", "bs=1M", f"count={mib}", "oflag=direct", "status=none"])
    try:
        device = run(["losetup", "--direct-io=on", "--find", "--show", backing]).stdout.strip()
        try:
            yield device, backing
        finally:
            subprocess.run(["losetup", "-d", device])
    finally:
        with contextlib.suppress(OSError):
            os.unlink(backing)


def ladder(act, args, device, backing, ratings, workdir, label):
    """Every run at every rating on one device: {(x, name): result}."""
    results = {}
    header = (f"  {'':<18} {'delivered':>8}  {'device >=1/8/64 ms':^23}  {'intended >=1/8/64 ms':^23}"
              f"  {'CPU/read':>11}  verdict")
    for x in ratings:
        print(f"{label}, {x}x ({2000 * x} reads/s + {1000 * x} writes/s)")
        print(header)
        runs = {
            "ACT 6.6": lambda: run_act(act, device, x, args.duration, workdir),
            "virtgap, no probes": lambda: run_virtgap(args.virtgap, device, backing, args.size, x, args.duration, False, workdir),
            "virtgap, probes": lambda: run_virtgap(args.virtgap, device, backing, args.size, x, args.duration, True, workdir),
        }
        if shutil.which("fio"):
            runs["fio, same I/O"] = lambda: run_fio(device, x, args.duration, workdir)
        for name, go in runs.items():
            with contention(args.contend):
                r = go()
            results[(x, name)] = r
            print(row(name, r), flush=True)
        print()
    return results


def summary(results, ratings, label):
    def highest(name, passed):
        ok = [
            x
            for x in ratings
            if results[(x, name)]["delivered"] >= 0.99
            and (not passed or results[(x, name)]["verdict"].startswith("PASS"))
        ]
        return max(ok) if ok else None

    def ratio(ours, act):
        return f"{ours / act:.2f}" if ours and act else "-"

    if (ratings[0], "fio, same I/O") in results:
        ceiling = [x for x in ratings if results[(x, "fio, same I/O")]["verdict"] == "device keeps up"]
        print(
            f"{label} ceiling (fio, the same client reads and large blocks, < 5% of reads >= 1 ms): "
            + (f"keeps up to {max(ceiling)}x" if ceiling else "keeps up at no rating tried")
            + "; a rating above it cannot pass on this device, whatever generates it"
        )
    print(f"{label}: ratios (ours / ACT)")
    for name in ("virtgap, no probes", "virtgap, probes"):
        for what, passed in (("delivered (>= 99%)", False), ("passed at its full load", True)):
            ours, act_x = highest(name, passed), highest("ACT 6.6", passed)
            print(f"  {name}: highest rating {what} {ours or '-'}x vs ACT {act_x or '-'}x -> {ratio(ours, act_x)}")
        for x in ratings:
            a, v = results[(x, "ACT 6.6")], results[(x, name)]
            a_reads = a["delivered"] * 2000 * x
            v_reads = v["delivered"] * 2000 * x
            print(
                f"    {x}x: reads done {v_reads:,.0f}/s vs {a_reads:,.0f}/s -> {ratio(v_reads, a_reads)}; "
                f"CPU per client read {v['cpu_per_read_us'] or 0:.2f} vs {a['cpu_per_read_us'] or 0:.2f} µs "
                f"-> {ratio(v['cpu_per_read_us'], a['cpu_per_read_us'])}"
            )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--act-src", required=True, help="an ACT source tree (github.com/aerospike/act)")
    ap.add_argument("--virtgap", default="target/release/virtgap")
    ap.add_argument("--devices", nargs="+", choices=("disk", "memory"), default=["disk", "memory"])
    ap.add_argument("--ratings", type=int, nargs="+", default=[20, 30, 40, 60], help="the disk ladder")
    ap.add_argument("--memory-ratings", type=int, nargs="+", default=[40, 60, 90, 120],
                    help="the memory ladder")
    ap.add_argument("--duration", type=int, default=30, help="seconds per run")
    ap.add_argument("--size", default="2GiB", help="loop device size")
    ap.add_argument("--dir", default="target/bench-kv", help="where the disk's backing file goes")
    ap.add_argument("--contend", type=int, default=0, metavar="PCT",
                    help="a CPU load beside every run: each CPU busy PCT%% of the time (0: none)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: needs root (loop devices, BPF)")
    if not os.path.isdir(args.act_src):
        sys.exit(f"bench: --act-src {args.act_src} is not a directory (a checkout of github.com/aerospike/act)")
    if not 0 <= args.contend <= 100:
        sys.exit(f"bench: --contend {args.contend} is not a percentage (0-100)")
    act = build_act(args.act_src)
    os.makedirs(args.dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="run-", dir=args.dir)
    load = f"; beside a CPU load of {args.contend}% on every CPU" if args.contend else ""
    print(f"bench: {args.duration} s per run; logs in {workdir}{load}\n", flush=True)
    for kind in args.devices:
        if kind == "disk":
            setup, ratings, label = disk_loop(args.size, workdir), args.ratings, "disk-backed loop"
        else:
            mib = int(run(["numfmt", "--from=iec-i", "--to-unit=1048576", args.size.replace("B", "")]).stdout)
            setup, ratings, label = memory_loop(mib << 20, "vg-bench-kv"), args.memory_ratings, "memory-backed loop"
        with setup as (device, backing):
            print(f"bench: {label}: {device} over {backing}\n", flush=True)
            results = ladder(act, args, device, backing, ratings, workdir, label)
        summary(results, ratings, label)
        print()


if __name__ == "__main__":
    main()
