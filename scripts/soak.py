#!/usr/bin/env python3
"""Soak: one long `virtgap record` of rand4k with every probe, watched from outside.

Every --every seconds it samples the recorder's resident memory (VmRSS, VmHWM from
/proc/PID/status) and the BPF maps the recorder holds: for hash maps the entries in use (a
`bpftool map dump`) against max_entries; arrays are fixed-size and only listed. At the end it
prints RSS growth after the first minute (PASS under 5%), each hash map's peak occupancy, the
profile's size, and linear projections of RSS and profile size to a 24 h run.

Exits non-zero when the recorder fails or RSS grows by 5% or more after the first minute.
Needs root (the probes, /proc of the recorder, bpftool). Python standard library only.

    scripts/soak.py --duration 1h [--every 10s] [--interval 1s] [--dir DIR] [--csv FILE] [--virtgap BIN]
"""

import argparse
import csv
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GROWTH_LIMIT_PCT = 5.0
WARMUP_S = 60.0
DAY_S = 24 * 3600.0
HASH_TYPES = {"hash", "lru_hash", "percpu_hash", "lru_percpu_hash"}


def seconds(text):
    """'90s', '10m', '1h', '1h30m' or a plain number of seconds."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(h|m|s)", text)
    if not parts or re.sub(r"\s", "", text) != "".join(n + u for n, u in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 10m or 1h")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


def status_kib(pid):
    """VmRSS and VmHWM of `pid` in KiB (None once it has exited)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(rest.split()[0])
    except (FileNotFoundError, ProcessLookupError):
        return None, None
    return out.get("VmRSS"), out.get("VmHWM")


def bpftool(*args):
    try:
        out = subprocess.run(["bpftool", "-j", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        return json.loads(out.stdout or "null")
    except json.JSONDecodeError:
        return None


def map_ids_from_fds(pid):
    """Ids of the BPF maps `pid` holds open, from /proc/PID/fdinfo (needs no bpftool feature)."""
    ids = set()
    for info in glob.glob(f"/proc/{pid}/fdinfo/*"):
        try:
            with open(info) as f:
                for line in f:
                    if line.startswith("map_id:"):
                        ids.add(int(line.split()[1]))
        except OSError:
            continue
    return ids


def virtgap_map_names():
    """Map names declared in bpf/*.bpf.c, cut to the kernel's 15 characters: the last resort."""
    names = set()
    for path in glob.glob(os.path.join(REPO, "bpf", "*.bpf.c")):
        with open(path) as f:
            names.update(n[:15] for n in re.findall(r"\}\s*(\w+)\s+SEC\(\"\.maps\"\)", f.read()))
    return names


def maps_of(pid, names):
    """The BPF maps owned by `pid`, and how they were attributed to it."""
    shown = bpftool("map", "show") or []
    if any("pids" in m for m in shown):
        return [m for m in shown if any(p.get("pid") == pid for p in m.get("pids", []))], "bpftool pids"
    held = map_ids_from_fds(pid)
    if held:
        return [m for m in shown if m.get("id") in held], "fdinfo"
    # Also counts another running virtgap's maps: said so in the summary.
    return [m for m in shown if m.get("name") in names], "map names"


def hash_entries(map_id):
    dump = bpftool("map", "dump", "id", str(map_id))
    return len(dump) if isinstance(dump, list) else None


def mib(kib):
    return "-" if kib is None else f"{kib / 1024:.1f}"


def slope_per_s(points):
    """Least-squares slope of (t, y) points."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 0.0 if var == 0 else sum((t - mt) * (y - my) for t, y in points) / var


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--virtgap", default=os.path.join(REPO, "target", "release", "virtgap"))
    ap.add_argument("--duration", type=seconds, default=3600.0, help="90s, 10m, 1h (default 1h)")
    ap.add_argument("--every", type=seconds, default=10.0, help="sampling period (default 10s)")
    ap.add_argument("--dir", help="directory for the temp-file target (default: a temp dir under target/)")
    ap.add_argument("--csv", help="also write the samples to this CSV file")
    ap.add_argument("--interval", default="1s",
                    help="the recorder's --interval (default 1s; 100ms fills its series 10x sooner)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("soak: needs root (BPF probes, the recorder's /proc entries, bpftool)")
    if not os.access(a.virtgap, os.X_OK):
        sys.exit(f"soak: no virtgap binary at {a.virtgap} (run `just build`)")
    have_bpftool = shutil.which("bpftool") is not None
    if not have_bpftool:
        print("soak: bpftool not found: BPF map occupancy is not sampled", flush=True)

    os.makedirs(os.path.join(REPO, "target"), exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="soak-", dir=os.path.join(REPO, "target"))
    workdir = a.dir or scratch
    profile = os.path.join(scratch, "soak-profile.json")
    log_path = os.path.join(scratch, "recorder.log")
    cmd = [a.virtgap, "record", "-w", "rand4k", "--duration", f"{a.duration:g}s", "--dir", workdir,
           "--interval", a.interval, "--quiet", "-o", profile]
    print("soak:", " ".join(cmd), flush=True)
    print(f"soak: sampling every {a.every:g} s; recorder output in {log_path}", flush=True)
    log = open(log_path, "w")
    rec = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    start = time.monotonic()
    names = virtgap_map_names()
    samples, capacity, peak, arrays = [], {}, {}, {}
    attribution, sample_cost = None, []

    def stop(signum, _frame):
        # The recorder writes a partial profile on SIGTERM; the summary still follows.
        rec.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    tick = 1
    while rec.poll() is None:
        # Fixed cadence: the next tick, not "every seconds after the last sample's work".
        delay = start + tick * a.every - time.monotonic()
        tick += 1
        if delay > 0:
            try:
                rec.wait(timeout=delay)
                break
            except subprocess.TimeoutExpired:
                pass
        t0 = time.monotonic()
        t = t0 - start
        rss, hwm = status_kib(rec.pid)
        if rss is None:
            break
        used_total, fullest = 0, None
        if have_bpftool:
            maps, attribution = maps_of(rec.pid, names)
            hash_names = [m.get("name") for m in maps if m.get("type") in HASH_TYPES]
            for m in maps:
                name, cap = m.get("name") or str(m["id"]), m.get("max_entries") or 0
                if m.get("type") not in HASH_TYPES:
                    arrays[name] = (m.get("type"), cap)
                    continue
                n = hash_entries(m["id"])
                if n is None:
                    continue
                # Two hash maps of one name (two objects' "dropped") are told apart by id.
                key = name if hash_names.count(name) == 1 else f"{name}#{m['id']}"
                capacity[key] = cap
                peak[key] = max(peak.get(key, 0), n)
                used_total += n
                if fullest is None or n / max(cap, 1) > fullest[1] / max(fullest[2], 1):
                    fullest = (key, n, cap)
        sample_cost.append(time.monotonic() - t0)
        fullest = fullest or ("-", 0, 0)
        samples.append({"elapsed_s": round(t, 1), "rss_kib": rss, "hwm_kib": hwm,
                        "hash_entries": used_total, "fullest_map": fullest[0],
                        "fullest_used": fullest[1], "fullest_max": fullest[2]})
        print(f"[{t:7.0f} s] RSS {mib(rss):>7} MiB (peak {mib(hwm)}), hash-map entries {used_total}, "
              f"fullest {fullest[0]} {fullest[1]}/{fullest[2]}", flush=True)
    rc = rec.wait()
    elapsed = time.monotonic() - start
    log.close()

    if a.csv:
        with open(a.csv, "w", newline="") as f:
            fields = ["elapsed_s", "rss_kib", "hwm_kib", "hash_entries", "fullest_map", "fullest_used", "fullest_max"]
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(samples)
        print(f"\nsoak: {len(samples)} samples written to {a.csv}")

    print(f"\nsoak: recorder exited {rc} after {elapsed:.0f} s ({len(samples)} samples)")
    ok = rc == 0
    if rc != 0:
        with open(log_path) as f:
            tail = f.read().splitlines()[-15:]
        print("recorder output (last lines):\n  " + "\n  ".join(tail))
    if sample_cost:
        print(f"sampling cost: {max(sample_cost) * 1e3:.0f} ms at most per sample")

    with_rss = [s for s in samples if s["rss_kib"]]
    warm = [s for s in with_rss if s["elapsed_s"] >= WARMUP_S]
    if len(warm) >= 2:
        first, last = warm[0], warm[-1]
        growth = (last["rss_kib"] - first["rss_kib"]) / first["rss_kib"] * 100
        slope = slope_per_s([(s["elapsed_s"], s["rss_kib"]) for s in warm])
        day = last["rss_kib"] + slope * max(DAY_S - last["elapsed_s"], 0)
        verdict = "PASS" if growth < GROWTH_LIMIT_PCT else "FAIL"
        print(f"RSS at {first['elapsed_s']:.0f} s: {mib(first['rss_kib'])} MiB; at end ({last['elapsed_s']:.0f} s): "
              f"{mib(last['rss_kib'])} MiB; peak (VmHWM) {mib(last['hwm_kib'])} MiB")
        print(f"RSS growth after the first minute: {growth:+.2f}% -> {verdict} (limit {GROWTH_LIMIT_PCT:g}%)")
        print(f"RSS projected to 24 h (linear, {slope * 3600 / 1024:+.2f} MiB/h after the first minute): "
              f"{mib(day)} MiB")
        if elapsed < 3600:
            print("  note: in a run this short the recorder's interval series (one entry per interval, "
                  "bounded by coarsening) is still filling, so some growth is expected; the 5% criterion "
                  "is meant for runs of an hour or more")
        ok = ok and growth < GROWTH_LIMIT_PCT
    elif with_rss:
        print(f"RSS at end: {mib(with_rss[-1]['rss_kib'])} MiB; the run is too short to judge growth after "
              f"the first minute (needs two samples past {WARMUP_S:.0f} s)")
    else:
        print("RSS: no sample taken")

    if peak:
        print(f"hash maps of the recorder (found by {attribution}; peak entries over max_entries):")
        for name in sorted(peak, key=lambda k: -peak[k] / max(capacity[k], 1)):
            cap = capacity[name]
            print(f"  {name:<16} {peak[name]:>7} / {cap:<7} {peak[name] / max(cap, 1) * 100:6.1f}%")
    if arrays:
        listed = ", ".join(f"{n} {cap}" for n, (_, cap) in sorted(arrays.items()))
        print(f"array maps (fixed size, max_entries): {listed}")

    if os.path.exists(profile):
        size = os.path.getsize(profile)
        try:
            with open(profile) as f:
                doc = json.load(f)
            intervals = len(doc.get("intervals", []))
            interval_s = doc.get("run", {}).get("interval_s")
            shape = f", {intervals} intervals of {interval_s} s"
        except (OSError, ValueError):
            shape = ""
        per_hour = size / max(elapsed, 1) * 3600
        print(f"profile: {size / 1e6:.2f} MB after {elapsed:.0f} s{shape}; {per_hour / 1e6:.2f} MB per hour; "
              f"projected to 24 h (linear): {per_hour * 24 / 1e6:.1f} MB")
        print("  (the recorder bounds its interval series, coarsening it past a fixed number of intervals, so "
              "the profile's size should level off rather than grow linearly; the projection above is only "
              "what this run measured)")
        print(f"profile kept at {profile}")
    else:
        print("profile: not written")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
