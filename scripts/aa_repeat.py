#!/usr/bin/env python3
"""The diff's false-positive rate on this host: REPEATS times, record RUNS plain runs per side
(interleaved A B, B A, A B, ... so a drift of the host, and whatever one run leaves for the
next, falls on both), diff them, and count the rows called significant. Every difference found
is a false positive: both sides are one host running one workload.

With --defaults each side is one plain `virtgap record` (its default runs sharing its default
duration, on a temp file in a scratch directory): the first diff a newcomer makes. Its
differences are provisional (one session a host: noise between sessions unknown), counted apart;
--sessions N records N plain `virtgap record`s a side, interleaved, and pools them
(--with-a/--with-b): the diff that judges.

Prints one line per repeat and a total: significant rows out of judged rows, and how many of
the repeats had any.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile


def record(vg, args, out):
    subprocess.run([vg, "record", "--quiet", "--force", "-o", out] + args, check=True,
                   stdout=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--virtgap", default="target/release/virtgap")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--runs", type=int, default=5, help="runs per side in each repeat")
    ap.add_argument("--duration", default="4s")
    ap.add_argument("--workload", default="rand4k")
    ap.add_argument("--min-effect", default="5%")
    ap.add_argument("--keep", metavar="DIR",
                    help="copy the profiles and the diff of every repeat with a significant row "
                         "into DIR/repeat-N/ (to read what moved, and why)")
    ap.add_argument("--defaults", action="store_true",
                    help="each side one `virtgap record` with its defaults (--runs, --duration, "
                         "--workload, --min-effect ignored)")
    ap.add_argument("--sessions", type=int, default=1,
                    help="with --defaults: plain records per side, interleaved and pooled")
    opts = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("aa_repeat: needs root (the probes)")
    total_rows = total_sig = repeats_with_any = total_hv_sig = total_provisional = 0
    with tempfile.TemporaryDirectory(prefix="vg-aa-") as tmp:
        args = ["-w", opts.workload, "--size", "256MiB", "--duration", opts.duration, "--dir", tmp]
        for rep in range(1, opts.repeats + 1):
            a, b = [], []
            if opts.defaults:
                # Plain records a side, interleaved, the order swapped every other repeat.
                sides = [("a", a), ("b", b)] if rep % 2 else [("b", b), ("a", a)]
                for s in range(opts.sessions):
                    for side, paths in sides:
                        out = os.path.join(tmp, f"{side}{s}.json")
                        record(opts.virtgap, ["--dir", tmp], out)
                        paths.append(out)
            for k in range(0 if opts.defaults else opts.runs):
                order = (("a", a), ("b", b)) if k % 2 == 0 else (("b", b), ("a", a))
                for side, paths in order:
                    out = os.path.join(tmp, f"{side}{k}.json")
                    record(opts.virtgap, args, out)
                    paths.append(out)
            cmd = [opts.virtgap, "diff", "--json", a[0], b[0]]
            if not opts.defaults:
                cmd += ["--min-effect", opts.min_effect]
            for p in a[1:]:
                cmd += ["--with-a", p]
            for p in b[1:]:
                cmd += ["--with-b", p]
            d = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            rows = (d["waterfall"] + d["throughput"] + [t["row"] for t in d["tails"]]
                    + d["hypervisor"]["rows"])
            judged = [r for r in rows if r["verdict"] in
                      ("significant", "within_runs", "one_session", "equivalent", "inconclusive")]
            sig = [r for r in judged if r["verdict"] == "significant"]
            # One run or one session a side: differences found are provisional, counted apart.
            provisional = sum(r["verdict"] in ("within_runs", "one_session") for r in judged)
            total_provisional += provisional
            total_rows += len(judged)
            total_sig += len(sig)
            repeats_with_any += bool(sig)
            eq = sum(r["verdict"] == "equivalent" for r in judged)
            names = ", ".join(f'{r["metric"].strip()} {r["effect"] * 100:+.1f}%' for r in sig) or "none"
            if sig and opts.keep:
                kept = os.path.join(opts.keep, f"repeat-{rep}")
                os.makedirs(kept, exist_ok=True)
                for p in a + b:
                    shutil.copy(p, kept)
                with open(os.path.join(kept, "diff.json"), "w") as f:
                    json.dump(d, f, indent=1)
            hv = [r for r in d["hypervisor"]["rows"] if r["verdict"] == "significant"]
            total_hv_sig += len(hv)
            print(f"repeat {rep}/{opts.repeats} ({d['runs_a']} + {d['runs_b']} runs): "
                  f"{len(judged)} rows judged, {eq} equivalent, "
                  f"{len(sig)} significant ({names}), {provisional} provisional; "
                  f"app mean {d['waterfall'][0]['verdict']}; "
                  f"hypervisor rows significant: {len(hv)} of {len(d['hypervisor']['rows'])}",
                  flush=True)
    print(f"A/A false positives: {total_sig} of {total_rows} judged rows "
          f"({total_sig / max(total_rows, 1) * 100:.1f}%); repeats with any: "
          f"{repeats_with_any} of {opts.repeats}; hypervisor rows among them: {total_hv_sig}; "
          f"provisional rows (one run or one session a side, never significant): "
          f"{total_provisional}")


if __name__ == "__main__":
    main()
