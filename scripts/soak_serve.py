#!/usr/bin/env python3
"""Soak of `virtgap serve`: the exporter following every process while fio reads beside it,
scraped every --period seconds by --scrapers clients at once, for --minutes.

Every 10 s it samples the server's resident memory (VmRSS from /proc/PID/status). At the end it
prints the RSS after the first minute and at the end (growth, PASS under 5%), each scraper's
request count and failures, and the scrape latency (request sent to last byte read) at p50,
p99 and max, then stops the server with SIGTERM and checks it exited 0.

Exits non-zero when a scrape fails, RSS grows by 5% or more after the first minute, or the
server does not stop cleanly. Needs root (the probes) and fio. Python standard library only.

    scripts/soak_serve.py [--minutes 10] [--scrapers 2] [--period 1] [--virtgap BIN]
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

GROWTH_LIMIT_PCT = 5.0
WARMUP_S = 60.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def scrape(port):
    """One GET /metrics; the seconds it took and the body's length."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\nAccept: application/openmetrics-text\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    took = time.monotonic() - start
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head[:80])
    return took, len(body)


def percentile(values, p):
    v = sorted(values)
    if not v:
        return float("nan")
    k = min(len(v) - 1, max(0, int(round(p / 100.0 * (len(v) - 1)))))
    return v[k]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--scrapers", type=int, default=2)
    ap.add_argument("--period", type=float, default=1.0, help="seconds between one scraper's requests")
    ap.add_argument("--virtgap", default="target/release/virtgap")
    args = ap.parse_args()
    duration = args.minutes * 60.0
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="vg-soak-serve-", dir="/var/tmp") as tmp:
        fio = subprocess.Popen(
            ["fio", "--name=soak", f"--filename={tmp}/fio.dat", "--size=64M", "--rw=randread",
             "--bs=4k", "--direct=1", "--ioengine=psync", "--rate_iops=2000",
             f"--runtime={int(duration) + 120}", "--time_based", "--output-format=terse"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        serve = subprocess.Popen(
            [args.virtgap, "serve", "--all", "--listen", f"127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        line = serve.stderr.readline()
        if not line.startswith("serving http://"):
            print(f"serve did not start: {line}{serve.stderr.read()}", file=sys.stderr)
            fio.kill()
            return 1
        print(f"soak: serve pid {serve.pid} on port {port}, {args.scrapers} scrapers every "
              f"{args.period:g} s for {args.minutes:g} min, fio reading at 2000 IOPS beside it",
              flush=True)
        stop = threading.Event()
        latencies = [[] for _ in range(args.scrapers)]
        failures = [0] * args.scrapers
        sizes = []

        def scraper(i):
            next_at = time.monotonic()
            while not stop.is_set():
                try:
                    took, size = scrape(port)
                    latencies[i].append(took)
                    sizes.append(size)
                except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                    failures[i] += 1
                    print(f"scraper {i}: {e}", file=sys.stderr)
                next_at += args.period
                stop.wait(max(0.0, next_at - time.monotonic()))

        threads = [threading.Thread(target=scraper, args=(i,), daemon=True) for i in range(args.scrapers)]
        for t in threads:
            t.start()
        start = time.monotonic()
        samples = []
        while time.monotonic() - start < duration:
            time.sleep(10)
            elapsed = time.monotonic() - start
            rss = rss_kib(serve.pid)
            samples.append((elapsed, rss))
            print(f"  {elapsed:6.0f} s  RSS {rss / 1024:.1f} MiB  scrapes {sum(len(l) for l in latencies)}",
                  flush=True)
        stop.set()
        for t in threads:
            t.join()
        serve.send_signal(signal.SIGTERM)
        try:
            code = serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            code = None
        fio.kill()
        fio.wait()

    after_warmup = [r for t, r in samples if t >= WARMUP_S]
    base = after_warmup[0] if after_warmup else samples[0][1]
    end = samples[-1][1]
    growth = (end - base) * 100.0 / base
    every = [x for l in latencies for x in l]
    print(f"RSS after the first minute {base / 1024:.1f} MiB, at the end {end / 1024:.1f} MiB: "
          f"{growth:+.2f}% ({'PASS' if growth < GROWTH_LIMIT_PCT else 'FAIL'}, limit {GROWTH_LIMIT_PCT:g}%)")
    for i, l in enumerate(latencies):
        print(f"scraper {i}: {len(l)} scrapes, {failures[i]} failed")
    print(f"scrape latency: p50 {percentile(every, 50) * 1e3:.2f} ms, p99 {percentile(every, 99) * 1e3:.2f} ms, "
          f"max {max(every) * 1e3:.2f} ms; page {percentile(sizes, 50) / 1024:.0f} KiB")
    print(f"serve exited {code} on SIGTERM")
    ok = growth < GROWTH_LIMIT_PCT and not any(failures) and code == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
