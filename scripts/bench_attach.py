#!/usr/bin/env python3
"""What attaching costs the program it measures: fio (4 KiB random reads, O_DIRECT, on a file
of this disk) run alone and run with `virtgap record --pid` attached to it (all probes, the app
probe's system call and io_uring timing included), alternating rounds so the machine's drift
hits both alike. Prints each round's IOPS and the median ratio attached / alone, per engine.
Root (the probes); fio from Debian's package."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def fio_cmd(path, engine, runtime):
    return ["fio", "--name=bench", f"--filename={path}", "--rw=randread", "--bs=4k",
            "--direct=1", f"--ioengine={engine}", "--iodepth=16" if engine != "psync" else "--iodepth=1",
            "--size=1G", f"--runtime={runtime}", "--time_based", "--randrepeat=0",
            "--output-format=json"]


def fio_iops(out):
    text = out.decode(errors="replace")
    doc = json.loads(text[text.index("{"):])
    return doc["jobs"][0]["read"]["iops"]


def alone(path, engine, runtime):
    out = subprocess.run(fio_cmd(path, engine, runtime), check=True, capture_output=True).stdout
    return fio_iops(out)


def attached(virtgap, path, engine, runtime):
    """fio held on a pipe until virtgap says its probes are attached, then released."""
    script = "read go && exec " + " ".join(fio_cmd(path, engine, runtime))
    fio = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL)
    vg = subprocess.Popen([virtgap, "record", "--pid", str(fio.pid)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    for line in vg.stderr:
        if line.startswith("probes attached"):
            break
    else:
        fio.kill()
        sys.exit(f"bench: virtgap did not attach (exit {vg.wait()})")
    fio.stdin.write(b"go\n")
    fio.stdin.close()
    out = fio.stdout.read()
    fio.wait()
    vg.stderr.read()
    if vg.wait() != 0:
        sys.exit("bench: virtgap record --pid failed")
    return fio_iops(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--virtgap", default="target/release/virtgap")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runtime", type=int, default=10, help="seconds per fio run")
    ap.add_argument("--engines", default="psync,io_uring")
    ap.add_argument("--dir", default=None, help="directory for the 1 GiB test file (a disk)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: the probes need root")
    with tempfile.TemporaryDirectory(dir=args.dir or os.getcwd()) as tmp:
        path = os.path.join(tmp, "bench.dat")
        subprocess.run(["fio", "--name=lay", f"--filename={path}", "--size=1G", "--rw=write",
                        "--bs=1M", "--direct=1", "--output-format=terse"],
                       check=True, capture_output=True)
        for engine in args.engines.split(","):
            ratios = []
            for k in range(args.rounds):
                # Alternate which goes first, so a drift over the pair hits both alike.
                if k % 2 == 0:
                    a = alone(path, engine, args.runtime)
                    b = attached(args.virtgap, path, engine, args.runtime)
                else:
                    b = attached(args.virtgap, path, engine, args.runtime)
                    a = alone(path, engine, args.runtime)
                ratios.append(b / a)
                print(f"{engine} round {k + 1}: alone {a:,.0f} IOPS, attached {b:,.0f} IOPS, "
                      f"ratio {b / a:.3f}", flush=True)
                time.sleep(1)
            print(f"{engine}: fio's IOPS attached / alone, median of {args.rounds}: "
                  f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
