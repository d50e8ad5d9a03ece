# virtgap's recipes: the front door for people and CI alike. `just --list` shows them.

set shell := ["bash", "-euo", "pipefail", "-c"]

# List the recipes
default:
    @just --list

# Build the release binary
build:
    cargo build --release --locked

# The main job: the live TUI on the default workload (random 4 KiB reads on a temp file); q quits
run *ARGS: build
    ./target/release/virtgap {{ARGS}}

# Headless: record 10 s of the default workload and print its summary
record *ARGS: build
    ./target/release/virtgap record --duration 10s {{ARGS}}

# Every test tier: unit, workload I/O, BPF (load and attach for real; needs root), CLI; then
# the tests that skipped and why (under CI, `CI` set, a missing capability fails instead)
test:
    #!/usr/bin/env bash
    set -uo pipefail
    mkdir -p target
    skips="$PWD/target/skipped-tests.log"
    : > "$skips"
    VIRTGAP_SKIP_LOG="$skips" cargo test --workspace --locked --no-fail-fast
    status=$?
    if [[ -s $skips ]]; then
        echo "skipped: $(wc -l < "$skips") test(s), each passed as \"ok\" above without its checks:"
        sed 's/^/  /' "$skips"
    else
        echo "skipped: none"
    fi
    exit $status

# The VM tier: boot Debian's 5.10, 6.1 and 6.12 kernels (or those named: 6.1, a package, a
# vmlinuz path) under QEMU with NVMe, virtio-blk and md RAID0; check every probe family inside
vmtest *KERNELS: build
    python3 scripts/vmtest.py {{KERNELS}}

# The VM tier's Xen step: Debian's Xen 4.17 under QEMU with a 6.1 dom0 and an NVMe disk, then the
# same kernel bare; checks Xen's paths are called and diffs the two as a user would
vmtest-xen *ARGS: build
    python3 scripts/vmtest_xen.py {{ARGS}}

# Regenerate schema/profile.schema.json from the profile's types (a test fails when it is stale)
schema: build
    target/release/virtgap schema > schema/profile.schema.json.new
    mv schema/profile.schema.json.new schema/profile.schema.json

# Formatting and lints
lint:
    cargo fmt --all --check
    cargo clippy --workspace --all-targets --locked -- -D warnings

# Our rand4k generator against fio, alternating pairs: median IOPS and CPU-per-I/O ratios
bench-generator PAIRS="5" RUNTIME="10": build
    python3 scripts/bench_generator.py --virtgap target/release/virtgap --pairs {{PAIRS}} --runtime {{RUNTIME}}

# Regenerate bpf/vmlinux/<arch>/vmlinux.h from the running kernel's BTF
vmlinux:
    #!/usr/bin/env bash
    set -euo pipefail
    arch=$(uname -m)
    release=$(uname -r | cut -d. -f1,2)
    out=bpf/vmlinux/$arch/vmlinux_$release.h
    mkdir -p bpf/vmlinux/$arch
    bpftool btf dump file /sys/kernel/btf/vmlinux format c > "$out"
    ln -sf "vmlinux_$release.h" bpf/vmlinux/$arch/vmlinux.h
    echo "wrote $out; record its provenance in bpf/vmlinux/README.md"

# What attaching costs the program measured: fio alone and with `record --pid` on it, per engine
bench-attach ROUNDS="5" RUNTIME="10": build
    python3 scripts/bench_attach.py --virtgap target/release/virtgap --rounds {{ROUNDS}} --runtime {{RUNTIME}}

# `virtgap serve`'s scrape latency alone, beside 50 slowloris connections and beside 200 open
# ones, from one run: p50, p99, max and each p99 over the alone one's
bench-serve-clients SCRAPES="40": build
    python3 scripts/bench_serve_clients.py --virtgap target/release/virtgap --scrapes {{SCRAPES}}

# `virtgap serve` scraped every second by two clients for MINUTES while fio reads beside it: RSS
# growth after the first minute (PASS under 5%) and scrape latency p50/p99 (root)
bench-serve MINUTES="10": build
    python3 scripts/soak_serve.py --virtgap target/release/virtgap --minutes {{MINUTES}}

# Probe overhead: rand4k with no probes, all of ours, and bpftrace's biolatency; IOPS ratios, ns
# per event and per I/O, and the mean latency each adds per read. DEVICE: `file` (on this disk)
# or `memory` (a loop device over /dev/shm); QD: reads in flight (`preset`, or 1 for the latency
# a one-read-at-a-time database feels)
bench-overhead ROUNDS="5" RUNTIME="10" DEVICE="file" QD="preset": build
    python3 scripts/bench_overhead.py --virtgap target/release/virtgap --rounds {{ROUNDS}} --runtime {{RUNTIME}} --device {{DEVICE}} {{ if QD == "preset" { "" } else { "--qd " + QD } }}

# Whether a short recording costs the workload what a long one does: the IOPS kept and the whole
# tool's CPU per I/O (BPF programs and recorder threads) at SHORT and LONG seconds, paired by round
bench-short-long ROUNDS="7" SHORT="4" LONG="20" DEVICE="memory": build
    python3 scripts/bench_overhead.py --virtgap target/release/virtgap --rounds {{ROUNDS}} --short-vs-long {{SHORT}},{{LONG}} --device {{DEVICE}}

# `virtgap iotune`'s four figures against the best of a fio sweep (numjobs x iodepth) on the same
# target, on a file on this disk and on a loop device over memory; ratios ours/fio (root)
bench-iotune *ARGS: build
    python3 scripts/bench_iotune.py --virtgap target/release/virtgap {{ARGS}}

# The injected-overhead experiments (root; CI runs them after `just test`): each prints its diff
# tables and fails only on a wrong answer (an inconclusive one records more runs, up to a cap);
# each one's outcome, runs and noise are listed at the end
attribution-check *ARGS:
    #!/usr/bin/env bash
    set -uo pipefail
    mkdir -p target
    log="$PWD/target/experiments.log"
    : > "$log"
    VIRTGAP_EXPERIMENT_LOG="$log" cargo test --locked --test attribution -- --ignored --nocapture --test-threads=1 {{ARGS}}
    status=$?
    echo "experiments:"
    sed 's/^/  /' "$log"
    exit $status

# Redraws the README's pictures from the charts the last `just attribution-check` left in
# target/tmp (needs rsvg-convert: apt-get install librsvg2-bin)
pictures:
    @command -v rsvg-convert >/dev/null || { echo "pictures: rsvg-convert is missing; apt-get install librsvg2-bin" >&2; exit 1; }
    @test -f target/tmp/slow-tail/percentiles.svg || { echo "pictures: no slow-tail charts; run just attribution-check first" >&2; exit 1; }
    rsvg-convert -w 960 -b white target/tmp/slow-tail/percentiles.svg -o docs/slow-tail-percentiles.png

# The diff's false-positive rate here: REPEATS A/A pairs of RUNS interleaved runs per side,
# counting the rows called significant (each one a false positive)
aa-check REPEATS="10" RUNS="5": build
    python3 scripts/aa_repeat.py --virtgap target/release/virtgap --repeats {{REPEATS}} --runs {{RUNS}}

# A newcomer's diff, REPEATS times: SESSIONS plain `virtgap record`s a side (their default runs
# and duration), interleaved and pooled; every row called significant is a false positive (with
# one a side, differences are provisional and counted apart)
aa-defaults REPEATS="10" SESSIONS="2": build
    python3 scripts/aa_repeat.py --virtgap target/release/virtgap --repeats {{REPEATS}} --defaults --sessions {{SESSIONS}}

# ACT's ladder on a temp file: kv-act at each x-rating in turn, printing each run's verdict line
kv-ladder DURATION="60s" +RATINGS="1 4 8 16 20": build
    #!/usr/bin/env bash
    set -uo pipefail
    for x in {{RATINGS}}; do
        line=$(./target/release/virtgap record -w kv-act --x "$x" --duration {{DURATION}} --quiet 2>&1 \
            | grep -E "^  (PASS|FAIL|NO VERDICT|no verdict|delivered:|can't keep up)" | tr -s ' ' | paste -sd'|' -)
        echo "x=$x: $line"
    done

# Root; ACT_SRC is a checkout of github.com/aerospike/act (built here, not vendored); ARGS go to
# scripts/bench_kv_vs_act.py (--ratings 20 30 40 60, --duration 30, --size 2GiB, --dir DIR).
# kv-act against ACT on one loop device: load delivered, verdict and CPU per read at each x-rating
bench-kv-vs-act ACT_SRC *ARGS: build
    python3 scripts/bench_kv_vs_act.py --act-src {{ACT_SRC}} --virtgap target/release/virtgap {{ARGS}}

# From a fresh seed (every `cargo test` runs a short seeded pass); panics fail the run, each one's
# shrunk input and a note on replaying it land in target/fuzz-failures/.
# Fuzz the profile and workload-file readers and their consumers for DURATION seconds
fuzz DURATION="600":
    VIRTGAP_FUZZ_SECONDS={{DURATION}} cargo test --locked -p virtgap-fuzz --test fuzz -- --nocapture --test-threads=1

# Root (loop devices, mounts, memory cgroups, strace); ARGS go to scripts/hostile.py (--only fifo,pipe, --list).
# The hostile-input sweep (CI runs it after `just test`): each case prints ok or DEFECT; any DEFECT fails
hostile *ARGS: build
    python3 scripts/hostile.py --virtgap target/release/virtgap {{ARGS}}

# Root; ARGS go to scripts/soak.py (--every 10s, --interval 1s, --dir DIR, --csv FILE).
# Soak: rand4k with every probe for DURATION (90s, 10m, 1h): RSS growth, BPF map use, profile size
soak DURATION="1h" *ARGS: build
    python3 scripts/soak.py --virtgap target/release/virtgap --duration {{DURATION}} {{ARGS}}
