#!/usr/bin/env bash
# Installs what virtgap needs on Debian/Ubuntu (idempotent), then runs the given `just` recipe:
# `./setup.sh run` (the main job: what building and running need, nothing more) or
# `./setup.sh test` (the test suite: adds the tests' tools and servers).
set -euo pipefail
cd "$(dirname "$0")"

# What each recipe needs, and no more: a host being profiled gets no database, browser or
# monitoring server from `./setup.sh run`.
# Build and run: clang (BPF objects), libelf/zlib + pkg-config + make + a C compiler (libbpf-sys
# builds libbpf from source).
PACKAGES=(clang libelf-dev zlib1g-dev pkg-config make gcc libc6-dev)
# The tests, the hostile sweep, the experiments and the benchmarks: fio (the generator's
# yardstick), bpftool, python3, tmux, util-linux (unshare, addpart), mount (mount, losetup),
# procps, strace and e2fsprogs (the hostile sweep's held syscalls and its ext4 fixtures),
# postgresql (pgbench; the attach-mode test starts a throwaway cluster), rocksdb-tools (db_bench,
# read under attach mode) and prometheus (Prometheus and promtool, which scrape and check
# `virtgap serve`), chromium and a font (the HTML report's test loads `diff --html` in headless
# Chromium), python3-yaml (PyYAML reads back iotune's io_properties.yaml as ScyllaDB's scripts
# do), python3-pandas (the CSV docs' pandas example is run on a recording), bpftrace (the
# overhead bench's yardstick).
TEST_PACKAGES=(fio bpftool python3 tmux util-linux mount procps strace e2fsprogs postgresql
               rocksdb-tools prometheus chromium fonts-dejavu-core python3-yaml python3-pandas
               bpftrace)
# The VM tier (`vmtest`): QEMU, a static busybox, mdadm and dmsetup for the guest,
# cpio/xz/zstd/kmod to pack it, dpkg-dev's tools to unpack kernels.
VM_PACKAGES=(qemu-system-x86 busybox-static mdadm dmsetup cpio xz-utils zstd kmod
             debian-archive-keyring)
case "${1:-}" in
    run | build | record | "") ;;
    vmtest | vmtest-xen) PACKAGES+=("${TEST_PACKAGES[@]}" "${VM_PACKAGES[@]}") ;;
    *) PACKAGES+=("${TEST_PACKAGES[@]}") ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "setup: missing packages: ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
        exit 1
    fi
    echo "setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# rustup installs cargo under ~/.cargo/bin, which a non-login shell may not have on PATH.
if ! command -v cargo >/dev/null && [[ -f "$HOME/.cargo/env" ]]; then
    # shellcheck source=/dev/null
    . "$HOME/.cargo/env"
fi
command -v cargo >/dev/null || { echo "setup: cargo not found; install Rust with rustup first" >&2; exit 1; }

if ! command -v just >/dev/null; then
    # Debian 13 / Ubuntu 24.04 package it; older releases build it from crates.io.
    if ! { [[ $(id -u) -eq 0 ]] && apt-get install -y -qq just >/dev/null 2>&1; }; then
        echo "setup: installing just from crates.io" >&2
        cargo install --locked --quiet just
    fi
fi
export PATH="$HOME/.cargo/bin:$PATH"

exec just "$@"
