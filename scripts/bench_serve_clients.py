#!/usr/bin/env python3
"""Scrape latency of `virtgap serve` alone and beside hostile clients, in one run.

Starts `serve` (block and irq probes, every process), then times --scrapes GET /metrics
(connect to last byte) in each of three phases: alone; beside --slow slowloris connections
(each sending its request a byte every 0.5 s) and 12 idle ones; beside 200 connections held
open. Prints p50, p99 and max per phase and each phase's p99 over the alone one's, then stops
the server with SIGTERM.

Exits non-zero when a scrape fails or serve does not stop cleanly. A scrape's time is the
machine's as much as serve's: read the ratios, not the figures. Needs root (the probes).
Python standard library only.

    scripts/bench_serve_clients.py [--virtgap BIN] [--scrapes 40] [--slow 50]
"""

import argparse
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    """One GET /metrics: seconds from connect to the last byte."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        head = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            head = head or chunk[:16]
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"scrape answered {head!r}")
    return time.monotonic() - start


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def phase(port, n):
    times = []
    for _ in range(n):
        times.append(scrape(port))
        time.sleep(0.05)
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--virtgap", default="target/release/virtgap")
    p.add_argument("--scrapes", type=int, default=40, help="scrapes per phase")
    p.add_argument("--slow", type=int, default=50, help="slowloris connections")
    args = p.parse_args()
    port = free_port()
    server = subprocess.Popen([args.virtgap, "serve", "--listen", f"127.0.0.1:{port}",
                               "--probes", "block,irq", "--quiet"])
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                scrape(port)
                break
            except (OSError, RuntimeError):
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit("bench-serve-clients: serve never served a page")
                time.sleep(0.5)
        results = [("alone", phase(port, args.scrapes))]

        slow = [socket.create_connection(("127.0.0.1", port), timeout=5)
                for _ in range(args.slow + 12)]
        stop = threading.Event()

        def trickle():
            while not stop.is_set():
                for s in slow[:args.slow]:
                    try:
                        s.send(b"G")
                    except OSError:
                        pass
                stop.wait(0.5)
        threading.Thread(target=trickle, daemon=True).start()
        time.sleep(1)
        results.append((f"beside {args.slow} slowloris + 12 idle", phase(port, args.scrapes)))
        stop.set()
        for s in slow:
            s.close()

        held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(200)]
        results.append(("beside 200 open connections", phase(port, args.scrapes)))
        for s in held:
            s.close()
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            rc = server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            rc = "killed after 30 s"
    alone_p99 = percentile(results[0][1], 99)
    print(f"scrape latency, {args.scrapes} scrapes a phase (connect to last byte):")
    print(f"  {'phase':<36} {'p50':>9} {'p99':>9} {'max':>9} {'p99 / alone':>12}")
    for name, times in results:
        print(f"  {name:<36} {percentile(times, 50) * 1e3:7.2f}ms {percentile(times, 99) * 1e3:7.2f}ms "
              f"{max(times) * 1e3:7.2f}ms {percentile(times, 99) / alone_p99:11.2f}x")
    print(f"serve stopped: {rc}")
    sys.exit(0 if rc == 0 else 1)


if __name__ == "__main__":
    main()
