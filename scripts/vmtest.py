#!/usr/bin/env python3
"""The VM tier: boot real distribution kernels under QEMU (TCG) with emulated NVMe, virtio-blk,
md RAID0 and device-mapper devices, run virtgap inside, and check what it measured.

Each kernel gets one boot. A busybox initramfs carries the release binary, the kernel's own
storage modules, mdadm and dmsetup; /init runs `virtgap doctor --json`, the same with
`--hypervisor` for each hypervisor table (what each of its paths attaches to on this kernel), and
one short rand4k recording per device, then writes its results as a tar archive onto a scratch virtio disk that this
script reads back after the guest powers off. The checks are functional (what loads, what
attaches, what is counted, which queue and CPU), never timings: TCG is far slower than
hardware and its timing means nothing.

Kernels are named by series (5.10, 6.1, 6.12), by a Debian package name, or by a path to a
vmlinuz with --modroot. A series' package comes from Debian's archive through a sources list of
the tier's own (bullseye for 5.10, bookworm for 6.1 and 6.12), used only for the download, so the
host's own apt configuration does not matter; packages are unpacked into the cache, never
installed.

Needs root (for nothing but reading /boot-style files and QEMU's speed), qemu-system-x86,
busybox-static, mdadm, dmsetup, cpio and apt; `./setup.sh vmtest` installs them.
"""

import argparse
import bisect
import csv
import dataclasses
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_KERNELS = ["5.10", "6.1", "6.12"]

# Debian series -> (package name pattern, the Debian release that ships it).
SERIES = {
    "5.10": (r"^linux-image-5\.10\.0-\d+-amd64$", "bullseye"),
    "6.1": (r"^linux-image-6\.1\.0-\d+-amd64$", "bookworm"),
    "6.12": (r"^linux-image-6\.12\.\d+\+deb12-amd64$", "bookworm"),
}
DEBIAN_SOURCES = """\
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian {suite} main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security {suite}-security main
"""

# Modules the guest loads, by name; their dependencies come from the kernel's modules.dep.
# kvm has no hardware to drive under TCG, but loading it gives the kvm-host family its module
# tracepoints and module BTF to attach to.
MODULES = ["nvme", "virtio_blk", "virtio_pci", "raid0", "dm_mod", "kvm"]

# Tracepoints that do not exist before a kernel version: missing there is expected (and the
# family must still work without them); missing on a newer kernel is a failure.
INTRODUCED = {
    "block_io_start": (6, 5),
    "ipi_send_cpu": (6, 4),
    "ipi_send_cpumask": (6, 4),
    "csd_queue_cpu": (6, 6),
    # io_uring_submit_sqe renamed when it began to take the request (after 6.1: Debian's 6.1
    # lacks it, its 6.12 has it); before it the app family times no io_uring request (and
    # leaves io_uring_complete, keyed otherwise, out).
    "io_uring_submit_req": (6, 2),
}

# Families that must attach in every guest. kvm-host and pv-paths watch things a TCG guest
# does not have (a KVM module in use, paravirt callbacks) and are checked only for a reason.
REQUIRED_FAMILIES = ["block", "irq", "wakeup", "app", "nvme", "msr", "sampler"]

# The hypervisor tables (probes/src/hypervisor.rs) checked on each kernel with `virtgap doctor
# --hypervisor NAME`: Debian's kernels carry the Xen, KVM and Hyper-V guest code, so each
# table's timed paths attach here as they would in such a guest.
HYPERVISORS = ["xen", "kvm", "hyperv"]

# Timed paths that do not attach under their first name on every series, by that name: per
# series, the function attached instead, or (doctor's state, words its detail must contain).
# Every other timed path of every table attaches (fentry or kprobe) under its first name on
# every series, and one that does not fails: a function gone from a series that had it. Other
# kernels than the pinned series are checked for a state and a reason.
PINNED_SERIES = [(5, 10), (6, 1), (6, 12)]
NO_FTRACE_SITE = ("not_traceable", "kprobe events refuse functions without an ftrace site")
TIMED_PATH_EXCEPTIONS = {
    # arch/x86/xen is built without ftrace: no fentry, and kprobe events refuse its functions
    # (CONFIG_KPROBE_EVENTS_ON_NOTRACE is off); the timer and the kick are timed at their
    # callers, the lock wait is not traceable.
    "xen_vcpuop_set_next_event": {s: "clockevents_program_event" for s in PINNED_SERIES},
    "xen_qlock_kick": {s: "__pv_queued_spin_unlock_slowpath" for s in PINNED_SERIES},
    "xen_qlock_wait": {s: NO_FTRACE_SITE for s in PINNED_SERIES},
    # The HVM upcall's 2023 rename, which Debian's 6.1 carries.
    "xen_hvm_evtchn_do_upcall": {(6, 1): "xen_evtchn_do_upcall", (6, 12): "xen_evtchn_do_upcall"},
    # The PV TLB flushes were *_others before 5.13.
    "xen_flush_tlb_multi": {(5, 10): "xen_flush_tlb_others"},
    "kvm_flush_tlb_multi": {(5, 10): "kvm_flush_tlb_others"},
    "hyperv_flush_tlb_multi": {(5, 10): "hyperv_flush_tlb_others"},
    # notrace, and called through apic->eoi at every interrupt's end: no caller stands in.
    "kvm_guest_apic_eoi_write": {s: NO_FTRACE_SITE for s in PINNED_SERIES},
    # The halt (native_safe_halt before 6.5) has no ftrace site: timed at its caller
    # default_idle, which 6.12 makes noinstr (on the kprobe blacklist) like pv_native_safe_halt.
    "pv_native_safe_halt": {(5, 10): "default_idle", (6, 1): "default_idle",
                            (6, 12): ("not_traceable", "kprobe blacklist")},
    # In the hv_vmbus module, which loads only on Hyper-V.
    "vmbus_isr": {s: ("absent", "absent on this kernel") for s in PINNED_SERIES},
    "vmbus_set_event": {s: ("absent", "absent on this kernel") for s in PINNED_SERIES},
    # virtio's MMIO transport (virtio_mmio), which the guest does not load: its disks are PCI
    # (virtio_pci, whose vp_notify attaches).
    "vm_notify": {s: ("absent", "absent on this kernel") for s in PINNED_SERIES},
}

VCPUS = 4
RUN_SECONDS = 5
# The throttle step's read limit: 8 reads in flight then wait ~40 ms each, nearly all of it
# held by blk-throttle before the request exists.
THROTTLE_IOPS = 200
# Boots with multi-threaded TCG before falling back to one thread.
MULTI_ATTEMPTS = 6
# A step that takes longer is stuck; it is killed so the others still report.
STEP_TIMEOUT = 60
# A guest whose console says nothing for this long is stuck (steps report every start and end).
STALL_SECONDS = STEP_TIMEOUT + 30
# Devices by the serial QEMU gives them; the guest finds their kernel names by serial.
NVME_SERIAL = "vgnvme0"
RAID_SERIALS = ["vgraid1", "vgraid2"]
VIRTIO_SERIAL = "vgvirtio"
OUT_SERIAL = "vgout"
# Where on the results disk the guest leaves its symbol table (the archive starts at 0).
SYMBOLS_MIB = 48

GUEST_FAULTS = [
    (re.compile(r"Oops|BUG: |general protection fault|Kernel panic|Call Trace:"), "kernel oops"),
    (re.compile(r"nvme\d+: I/O \d+ (QID \d+ )?timeout|I/O tag \d+ .*timeout|blk_update_request: I/O error"),
     "I/O stall or timeout"),
]


def tool(name):
    """A system tool's path: on PATH, or in the sbin directories a non-login shell may lack."""
    for path in [shutil.which(name), f"/usr/sbin/{name}", f"/sbin/{name}"]:
        if path and os.path.exists(path):
            return path
    return None


def log(msg):
    print(f"vmtest: {msg}", flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


# --- kernels -----------------------------------------------------------------------------

@dataclasses.dataclass
class Kernel:
    label: str
    vmlinuz: str
    modroot: str  # the directory holding lib/modules/<version>
    version: str


def apt_options(cache, suite):
    """apt options for the tier's private sources list of one Debian release."""
    base = os.path.join(cache, "apt", suite)
    lists = os.path.join(base, "lists")
    os.makedirs(os.path.join(lists, "partial"), exist_ok=True)
    os.makedirs(os.path.join(base, "cache", "archives", "partial"), exist_ok=True)
    sources = os.path.join(base, "sources.list")
    with open(sources, "w") as f:
        f.write(DEBIAN_SOURCES.format(suite=suite))
    opts = ["-o", f"Dir::Etc::SourceList={sources}", "-o", "Dir::Etc::SourceParts=/nonexistent",
            "-o", f"Dir::State::Lists={lists}", "-o", f"Dir::Cache={os.path.join(base, 'cache')}"]
    stale = time.time() - os.path.getmtime(lists) > 86400
    if stale or os.listdir(lists) == ["partial"]:
        log(f"fetching the {suite} package lists (used only to download its kernel)")
        run(["apt-get", *opts, "update", "-qq"])
        os.utime(lists)
    return opts


def newest_package(cache, pattern, suite):
    opts = apt_options(cache, suite)
    names = subprocess.run(["apt-cache", *opts, "pkgnames", "linux-image-"], check=True,
                           capture_output=True, text=True).stdout.split()
    found = [n for n in names if re.match(pattern, n)]
    if not found:
        sys.exit(f"vmtest: no package matches {pattern} in the apt sources; run apt-get update")

    def key(name):
        return [int(x) for x in re.findall(r"\d+", name)]
    return max(found, key=key), opts


def unpack_package(cache, package, opts):
    dest = os.path.join(cache, "kernels", package)
    if os.path.exists(os.path.join(dest, ".unpacked")):
        return dest
    debs = os.path.join(cache, "debs")
    os.makedirs(debs, exist_ok=True)
    if not any(f.startswith(package + "_") for f in os.listdir(debs)):
        log(f"downloading {package}")
        run(["apt-get", *opts, "download", "-q", package], cwd=debs,
            stderr=subprocess.DEVNULL)
    deb = next(os.path.join(debs, f) for f in os.listdir(debs) if f.startswith(package + "_"))
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    run(["dpkg-deb", "-x", deb, dest])
    version = os.listdir(os.path.join(dest, "lib", "modules"))[0]
    run([tool("depmod"), "-b", dest, version])
    open(os.path.join(dest, ".unpacked"), "w").close()
    return dest


def resolve_kernel(name, cache, modroot):
    if os.path.exists(name):
        vmlinuz = os.path.abspath(name)
        version = os.path.basename(vmlinuz).removeprefix("vmlinuz-")
        root = modroot or "/"
        return Kernel(version, vmlinuz, root, version)
    if name in SERIES:
        pattern, suite = SERIES[name]
        package, opts = newest_package(cache, pattern, suite)
    else:
        # A package name from the host's own apt sources.
        package, opts = name, []
    dest = unpack_package(cache, package, opts)
    version = os.listdir(os.path.join(dest, "lib", "modules"))[0]
    return Kernel(name, os.path.join(dest, "boot", f"vmlinuz-{version}"), dest, version)


# --- the guest ---------------------------------------------------------------------------

def module_files(kernel):
    """Module files in load order (dependencies first), skipping built-in ones."""
    files = []
    for m in MODULES:
        out = subprocess.run([tool("modprobe"), "-d", kernel.modroot, "-S", kernel.version,
                              "--show-depends", m], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"vmtest: {kernel.label}: module {m}: {out.stderr.strip()}")
        for line in out.stdout.splitlines():
            parts = line.split()
            if parts and parts[0] == "insmod" and parts[1] not in files:
                files.append(parts[1])
    return files


def copy_with_libs(binary, root, lib_dirs=()):
    """Copies `binary` into the guest's /bin with the libraries it links (also found in
    `lib_dirs`, for binaries unpacked from packages rather than installed)."""
    dest = os.path.join(root, "bin", os.path.basename(binary))
    shutil.copy2(binary, dest)
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(lib_dirs)) if lib_dirs else None
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, env=env).stdout
    for line in out.splitlines():
        m = re.search(r"=>\s+(/\S+)", line) or re.match(r"\s*(/\S+ld-linux\S*)", line)
        if m:
            lib = m.group(1)
            target = os.path.join(root, lib.lstrip("/"))
            if any(lib.startswith(d.rstrip("/") + "/") for d in lib_dirs):
                target = os.path.join(root, "usr", "lib", "x86_64-linux-gnu", os.path.basename(lib))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(os.path.realpath(lib), target)
    # Debian's loader path and the lib64 one both resolve.
    os.makedirs(os.path.join(root, "lib64"), exist_ok=True)
    loader = os.path.join(root, "lib64", "ld-linux-x86-64.so.2")
    if not os.path.exists(loader):
        shutil.copy2(os.path.realpath("/lib64/ld-linux-x86-64.so.2"), loader)


# What every guest init of the tier starts with: busybox, the filesystems, the modules, and
# disk_by_serial.
GUEST_SETUP = r"""/bin/busybox --install -s /bin
export PATH=/bin
# BPF run statistics on for the whole of each run: switching them flips a static key, whose
# text patching multi-threaded TCG sometimes leaves stale on another vCPU.
export VIRTGAP_RUN_STATS_EVERY=1
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
mount -t tmpfs tmp /tmp
mkdir -p /out /run
echo 1 > /proc/sys/kernel/panic_on_oops
for m in $(cat /mods/order); do insmod /mods/$m || echo "insmod $m failed" >> /out/setup.log; done

# The kernel name of the disk with serial $1 (NVMe: the controller's serial).
disk_by_serial() {
    for d in /sys/block/*; do
        s=$(cat $d/serial $d/device/serial 2>/dev/null | head -1 | tr -d ' ')
        [ "$s" = "$1" ] && { basename $d; return; }
    done
}
"""

# The guest's /init: runs once per boot, writes /out, archives it onto the results disk.
GUEST_INIT = r"""#!/bin/sh
# virtgap's VM tier: runs once per boot, writes /out, archives it onto the results disk.
""" + GUEST_SETUP + r"""# Wait for every disk to appear (NVMe probes asynchronously).
for i in $(seq 1 100); do
    [ -n "$(disk_by_serial @OUT@)" ] && [ -n "$(disk_by_serial @NVME@)" ] \
        && [ -n "$(disk_by_serial @RAID1@)" ] && [ -n "$(disk_by_serial @RAID2@)" ] \
        && [ -n "$(disk_by_serial @VIRTIO@)" ] && break
    sleep 0.1
done

# step NAME CMD...: run a command (at most @STEP_TIMEOUT@ s), keep its stdout, stderr and exit status.
step() {
    name=$1; shift
    echo "vmtest-guest: $name" > /dev/console
    timeout -s KILL @STEP_TIMEOUT@ "$@" > /out/$name.out 2> /out/$name.err
    echo $? > /out/$name.rc
    echo "vmtest-guest: $name exited $(cat /out/$name.rc)" > /dev/console
}

uname -r > /out/uname
# The kernel's text symbols, early and apart from the results archive, so a guest that hangs
# later can still be told where its vCPUs were.
OUT=$(disk_by_serial @OUT@)
grep ' [tT] ' /proc/kallsyms | gzip -1 | dd of=/dev/$OUT bs=1M seek=@SYMBOLS_MIB@ conv=notrunc 2>/dev/null
sync
cat /proc/interrupts > /out/interrupts.before
NVME=$(disk_by_serial @NVME@); VIRTIO=$(disk_by_serial @VIRTIO@)
R1=$(disk_by_serial @RAID1@); R2=$(disk_by_serial @RAID2@)
echo "nvme=$NVME virtio=$VIRTIO raid=$R1,$R2" > /out/devices
for d in $NVME $VIRTIO $R1 $R2; do
    echo "$d $(cat /sys/block/$d/dev)" >> /out/devnums
done
RECORD="/bin/virtgap record -w rand4k --qd 8 --workers @VCPUS@ --duration @SECONDS@s --quiet"
# The steps after nvme check block stages only: the block probe alone, so fewer kernel text
# sites are patched while probes attach (multi-threaded TCG hangs now and then doing that).
BLOCK="--probes block"
step doctor /bin/virtgap doctor --json
# Every hypervisor table's paths on this kernel (the guest itself is TCG: "other").
for hv in @HYPERVISORS@; do step hv-$hv /bin/virtgap doctor --hypervisor $hv --json; done
# With a CPU taken offline the online set has a hole: the sampler must cover the CPUs online.
echo 0 > /sys/devices/system/cpu/cpu2/online
step offline /bin/virtgap doctor --json
echo 1 > /sys/devices/system/cpu/cpu2/online
step nvme $RECORD --target /dev/$NVME -o /out/nvme.json --csv /out/nvme-csv
# The paravirt timers at work, with the probes loaded as in a Xen guest: its timer path is
# timed at clockevents_program_event, which every CPU calls from idle and from interrupts. By
# fentry, then by kprobes (one object per function before 5.15, cookies since).
PV="/bin/virtgap record -w rand4k --qd 8 --workers 1 --duration @SECONDS@s --quiet --probes pv-paths"
step pv env VIRTGAP_HYPERVISOR=xen $PV --target /dev/$NVME -o /out/pv.json
step pv-kprobe env VIRTGAP_HYPERVISOR=xen VIRTGAP_PV_KPROBES=1 $PV --target /dev/$NVME -o /out/pv-kprobe.json
# Another process reads the same disk meanwhile: the process filter must not count its requests.
(while :; do dd if=/dev/$VIRTIO of=/dev/null bs=64k iflag=direct 2>/dev/null; done) &
OTHER=$!
cat /sys/block/$VIRTIO/stat > /out/virtio.stat.before
step virtio $RECORD $BLOCK --target /dev/$VIRTIO -o /out/virtio.json
cat /sys/block/$VIRTIO/stat > /out/virtio.stat.after
kill $OTHER
# The block family's stage times are the kernel's request stamps by default where exact (before
# 6.9): the steps above and below use them there. Our own on the same disk, and both sources on
# the same reads.
step ownstamps $RECORD $BLOCK --block-stamps own --target /dev/$VIRTIO -o /out/ownstamps.json
step stamps /bin/virtgap doctor --compare-stamps /dev/$VIRTIO --reads 2000 --json
# blk-throttle (cgroup v2 io.max) holds the reads before their requests start: with the
# bio-entry hook that wait is queue time, and the requests a throttle worker builds are still
# the workload's. The same reads unthrottled first, for the diff.
step unthrottled /bin/virtgap record -w rand4k --qd 8 --workers 1 --duration @SECONDS@s --quiet \
    $BLOCK --target /dev/$NVME -o /out/unthrottled.json
mount -t cgroup2 none /sys/fs/cgroup 2>> /out/setup.log
echo +io > /sys/fs/cgroup/cgroup.subtree_control
mkdir -p /sys/fs/cgroup/throttled
echo "$(cat /sys/block/$NVME/dev) riops=@THROTTLE_IOPS@" > /sys/fs/cgroup/throttled/io.max
step throttle sh -c 'echo $$ > /sys/fs/cgroup/throttled/cgroup.procs && exec "$@"' sh \
    /bin/virtgap record -w rand4k --qd 8 --workers 1 --duration @SECONDS@s --quiet --probes block \
    --target /dev/$NVME -o /out/throttle.json
# Where no fentry or kprobe loads, a partition's bios are noted at block_bio_remap, before the
# throttle: the same throttled reads on a partition of the NVMe disk with the hook left out.
step addpart addpart /dev/$NVME 1 2048 524288
step remap sh -c 'echo $$ > /sys/fs/cgroup/throttled/cgroup.procs && exec "$@"' sh \
    env VIRTGAP_NO_BIO_ENTRY_HOOK=1 /bin/virtgap record -w rand4k --qd 8 --workers 1 \
    --duration @SECONDS@s --probes block --target /dev/${NVME}p1 -o /out/remap.json
# 1 MiB reads on a disk that takes smaller requests (QEMU's NVMe: 512 KiB): each read is split,
# and the summary says how many requests an app I/O became.
cat /sys/block/$NVME/queue/max_sectors_kb > /out/split.max_sectors_kb
step split /bin/virtgap record -w seq1m --qd 4 --workers 1 --duration @SECONDS@s $BLOCK \
    --target /dev/$NVME -o /out/split.json
# An LVM-like device-mapper volume over the two RAID disks: a linear segment on the first,
# then a stripe over both (128-sector chunks); the tail autopsy follows its table's mapping.
half=$(( $(cat /sys/block/$R1/size) / 2 ))
printf '0 %s linear /dev/%s 0\n%s %s striped 2 128 /dev/%s %s /dev/%s 0\n' \
    $half $R1 $half $((2 * half)) $R1 $half $R2 > /tmp/dm.table
step dmsetup dmsetup create --noudevsync --noudevrules vgdm /tmp/dm.table
DM=$(basename $(readlink -f /sys/dev/block/$(dmsetup info -c --noheadings -o major,minor vgdm | tr -d ' ')))
echo "dm=$DM" >> /out/devices
step dm $RECORD $BLOCK --target /dev/$DM -o /out/dm.json
dmsetup remove --noudevsync vgdm 2>> /out/setup.log
step mdadm mdadm --create /dev/md0 --run --force --level=0 --raid-devices=2 --metadata=1.2 /dev/$R1 /dev/$R2
echo "md0 $(cat /sys/block/md0/dev 2>/dev/null)" >> /out/devnums
step md $RECORD $BLOCK --target /dev/md0 -o /out/md.json
# iotune on the array, writes allowed by its UUID: counts and completion only (TCG timing means
# nothing), kept short to fit one step.
step iotune /bin/virtgap iotune --target /dev/md0 --destroy-data "$(cat /sys/block/md0/md/uuid)" \
    $BLOCK --size 64MiB --step 300ms --ramp 100ms --duration 500ms --runs 1 --max-in-flight 32 \
    --quiet -o /out/iotune.json --yaml /out/io.yaml
cat /proc/interrupts > /out/interrupts.after
dmesg > /out/dmesg
tar -cf /dev/$OUT -C /out . && sync
echo "vmtest-guest: done" > /dev/console
poweroff -f
"""


def build_initramfs(kernel, virtgap, work, extra=None):
    """The guest's initramfs; `extra(root)` adds a step's own files before it is packed."""
    root = os.path.join(work, "root")
    for d in ["bin", "proc", "sys", "dev", "tmp", "mods", "out", "etc"]:
        os.makedirs(os.path.join(root, d), exist_ok=True)
    shutil.copy2("/bin/busybox", os.path.join(root, "bin", "busybox"))
    copy_with_libs(virtgap, root)
    copy_with_libs(tool("mdadm"), root)
    copy_with_libs(tool("addpart"), root)
    copy_with_libs(tool("dmsetup"), root)
    order = []
    for path in module_files(kernel):
        name = os.path.basename(path)
        dest = os.path.join(root, "mods", name.removesuffix(".xz").removesuffix(".zst"))
        if path.endswith(".xz"):
            with open(dest, "wb") as f:
                run(["xz", "-dc", path], stdout=f)
        elif path.endswith(".zst"):
            with open(dest, "wb") as f:
                run(["zstd", "-dc", path], stdout=f)
        else:
            shutil.copy2(path, dest)
        order.append(os.path.basename(dest))
    with open(os.path.join(root, "mods", "order"), "w") as f:
        f.write("\n".join(order) + "\n")
    if extra:
        extra(root)
    init = GUEST_INIT
    for key, value in {"@NVME@": NVME_SERIAL, "@RAID1@": RAID_SERIALS[0],
                       "@RAID2@": RAID_SERIALS[1], "@VIRTIO@": VIRTIO_SERIAL,
                       "@OUT@": OUT_SERIAL, "@VCPUS@": str(VCPUS),
                       "@SECONDS@": str(RUN_SECONDS),
                       "@THROTTLE_IOPS@": str(THROTTLE_IOPS),
                       "@STEP_TIMEOUT@": str(STEP_TIMEOUT),
                       "@SYMBOLS_MIB@": str(SYMBOLS_MIB),
                       "@HYPERVISORS@": " ".join(HYPERVISORS)}.items():
        init = init.replace(key, value)
    os.symlink("busybox", os.path.join(root, "bin", "sh"))
    with open(os.path.join(root, "init"), "w") as f:
        f.write(init)
    os.chmod(os.path.join(root, "init"), 0o755)
    initrd = os.path.join(work, "initrd.cpio.gz")
    files = subprocess.run(["find", "."], cwd=root, capture_output=True, check=True).stdout
    cpio = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root, input=files,
                          capture_output=True, check=True).stdout
    with gzip.open(initrd, "wb", compresslevel=1) as f:
        f.write(cpio)
    return initrd


def boot(kernel, initrd, work, tcg_thread, timeout):
    """Boots the guest; returns (console text, results dir or None, seconds)."""
    disks = []

    def disk(name, size_mb):
        path = os.path.join(work, f"{name}.img")
        with open(path, "wb") as f:
            f.truncate(size_mb << 20)
        disks.append(path)
        return path
    cmd = ["qemu-system-x86_64", "-accel", f"tcg,thread={tcg_thread}", "-cpu", "max",
           "-smp", str(VCPUS), "-m", "2048", "-nographic", "-no-reboot",
           "-kernel", kernel.vmlinuz, "-initrd", initrd,
           # Under TCG a vCPU thread can starve for seconds on a busy host: the guest's lockup
           # and RCU stall watchdogs would report the emulator, not the kernel. A real hang
           # still shows as a step that runs past its timeout.
           "-append", "console=ttyS0 panic=-1 oops=panic loglevel=4 nowatchdog rcupdate.rcu_cpu_stall_suppress=1"
           # One host thread runs every vCPU in turn: a command can wait past NVMe's 30 s
           # default on the emulator alone. A real stall still shows as a step's timeout.
           + (" nvme_core.io_timeout=255" if tcg_thread == "single" else "")]
    for i, serial in enumerate([NVME_SERIAL, *RAID_SERIALS]):
        path = disk(serial, 512 if i == 0 else 256)
        cmd += ["-drive", f"file={path},if=none,id=n{i},format=raw",
                "-device", f"nvme,serial={serial},drive=n{i}"]
    for serial, size in [(VIRTIO_SERIAL, 256), (OUT_SERIAL, 64)]:
        path = disk(serial, size)
        cmd += ["-drive", f"file={path},if=none,id={serial},format=raw",
                "-device", f"virtio-blk-pci,drive={serial},serial={serial}"]
    monitor = os.path.join(work, "monitor.sock")
    cmd += ["-monitor", f"unix:{monitor},server,nowait"]
    started = time.monotonic()
    console_path = os.path.join(work, "console.raw")
    with open(console_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        stuck = ""
        size, last_growth = 0, time.monotonic()
        while proc.poll() is None:
            time.sleep(1)
            now = time.monotonic()
            grown = os.path.getsize(console_path)
            if grown != size:
                size, last_growth = grown, now
            # Every step prints when it starts and ends and none takes this long: silence
            # means the guest is stuck.
            silent = now - last_growth > STALL_SECONDS
            if silent or now - started > timeout:
                why = f"silent for {STALL_SECONDS} s" if silent else f"past {timeout} s"
                # Where each vCPU is, before the guest is killed: a hang names its own place.
                stuck = f"\n[vmtest: timed out ({why}); vCPUs at: {vcpu_places(monitor, work)}]\n"
                proc.kill()
                proc.wait()
    with open(console_path, "rb") as f:
        console = f.read().decode(errors="replace") + stuck
    seconds = time.monotonic() - started
    results = os.path.join(work, "out")
    os.makedirs(results, exist_ok=True)
    try:
        with tarfile.open(os.path.join(work, f"{OUT_SERIAL}.img")) as t:
            t.extractall(results, filter="data")
    except tarfile.TarError:
        return console, None, seconds
    # An all-zero disk reads as an empty archive: the guest never got to write it.
    if not os.path.exists(os.path.join(results, "uname")):
        return console, None, seconds
    return console, results, seconds


def guest_symbols(work):
    """The guest's text symbols, sorted, from where its init left them on the results disk."""
    import zlib
    try:
        with open(os.path.join(work, f"{OUT_SERIAL}.img"), "rb") as f:
            f.seek(SYMBOLS_MIB << 20)
            text = zlib.decompressobj(wbits=31).decompress(f.read(16 << 20)).decode(errors="replace")
    except (OSError, zlib.error):
        return []
    table = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            table.append((int(parts[0], 16), parts[2]))
    table.sort()
    return table


def vcpu_places(monitor, work):
    """Each vCPU's instruction pointer as a kernel symbol, through QEMU's monitor."""
    import socket
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(monitor)
            s.sendall(b"info registers -a\n")
            time.sleep(1)
            text = b""
            while True:
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    break
                if not chunk:
                    break
                text += chunk
                if text.count(b"RIP=") >= VCPUS:
                    break
    except OSError as e:
        return f"monitor unavailable ({e})"
    rips = [int(m, 16) for m in re.findall(r"RIP=([0-9a-f]{16})", text.decode(errors="replace"))]
    table = guest_symbols(work)
    places = []
    for rip in rips:
        i = bisect.bisect_right(table, (rip, "~")) - 1
        near = 0 <= i < len(table) and rip - table[i][0] < 1 << 16
        places.append(f"{table[i][1]}+{rip - table[i][0]:#x}" if near else hex(rip))
    return ", ".join(places) or "unknown"


def guest_faults(text):
    found = []
    for pattern, what in GUEST_FAULTS:
        m = pattern.search(text)
        if m:
            line = text[text.rfind("\n", 0, m.start()) + 1:text.find("\n", m.end())]
            found.append(f"{what}: {line.strip()[:160]}")
    return found


def stale_int3(console):
    """The emulator's stale code, if that is what the first oops is: an int3 trap whose RIP
    follows a byte that is no longer 0xcc in memory (the kernel's patching had finished: a CPU
    cannot trap on an int3 that is not there). None for any other oops."""
    at_trap = console.find("int3: 0000 [#1]")
    if at_trap < 0:
        return None
    lines = console[at_trap:].splitlines()[:12]
    rip = next((l.split("RIP: ", 1)[1].split()[-1] for l in lines if "RIP: " in l), "?")
    code_line = next((l for l in lines if "Code: " in l), None)
    if code_line is None:
        return None
    code = code_line.split("Code: ", 1)[1].split()
    at = next((i for i, b in enumerate(code) if b.startswith("<")), None)
    if at is None or at == 0 or code[at - 1] == "cc":
        return None
    return f"int3 trap at {rip} where memory holds {code[at - 1]}, not cc: the emulator ran stale code"


def int3_storm(console):
    """The emulator's stale code seen as a hang instead of an oops (6.1 loops where 6.12
    oopses): a guest that went silent with a vCPU inside the int3 trap handler, or parked on
    the first byte of a function, where ftrace patches its calls. None otherwise."""
    at = console.rfind("[vmtest: timed out")
    if at < 0:
        return None
    places = console[at:].split("vCPUs at:", 1)[-1]
    if re.search(r"\b(asm_exc_int3|exc_int3|poke_int3_handler)\+", places):
        return "a vCPU looping in the int3 trap handler: the emulator ran stale code"
    # The same loop seen from its other end: a vCPU parked on a function's first byte, the
    # call site ftrace patches to attach fentry and kprobe programs (5.10 has no endbr before
    # it), going back into the int3 its stale translation still holds. Seen at
    # submit_bio_noacct+0x0, the bio-entry hook's site, while another process read the disk.
    parked = re.search(r"\b([A-Za-z_][\w.]*)\+0x0\b", places)
    if parked:
        return f"a vCPU parked at {parked.group(1)}+0x0, a patched call site: the emulator ran stale code"
    return None


# --- checks ------------------------------------------------------------------------------

class Checks:
    def __init__(self, label):
        self.label = label
        self.failures = []
        self.passed = 0
        # Why nothing was judged (the emulator failed every boot), or None.
        self.not_judged = None

    def check(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failures.append(what)
        print(f"  {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        return ok


def read_json(results, name):
    try:
        with open(os.path.join(results, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_text(results, name):
    try:
        with open(os.path.join(results, name)) as f:
            return f.read()
    except OSError:
        return ""


def step_ok(c, results, name):
    rc = read_text(results, f"{name}.rc").strip()
    err = read_text(results, f"{name}.err").strip().splitlines()
    return c.check(rc == "0", f"`{name}` exited {rc or '?'}" + (f": {err[-1][:200]}" if rc != "0" and err else ""))


def kernel_version(release):
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def check_doctor(c, doctor, release):
    if not c.check(doctor is not None, "doctor --json parses"):
        return
    version = kernel_version(release)
    families = {f["family"]: f for f in doctor["capabilities"]["families"]}
    for name in REQUIRED_FAMILIES:
        f = families.get(name)
        if f is None:
            c.check(False, f"doctor reports family {name}")
            continue
        missing = [t for t in f["tracepoints"] if t.get("attached") is None]
        expected = [t["tracepoint"] for t in missing
                    if version < INTRODUCED.get(t["tracepoint"], (0, 0))
                    and t.get("reason") == "tracepoint not in this kernel"]
        unexpected = [t for t in missing if t["tracepoint"] not in expected]
        why = f.get("unavailable") or "; ".join(f"{t['tracepoint']}: {t.get('reason')}" for t in unexpected)
        pinned = f" (without {', '.join(expected)}: not in {release}, as expected)" if expected else ""
        c.check(not f.get("unavailable") and not unexpected and f["tracepoints"],
                f"{name} attached{pinned}" + (f" (not: {why[:300]})" if why else ""))
        # tp_btf loads wherever BTF types the tracepoint: vmlinux, or module BTF from 5.11.
        module_without_btf = name == "nvme" and version < (5, 11)
        if f.get("fallback") and not module_without_btf:
            c.check(False, f"{name} fell back to raw_tp: {f['fallback'][:300]}")
    # kvm.ko is loaded: with module BTF (5.11+) every kvm tracepoint attaches; without it the
    # family says why rather than guessing layouts.
    kvm = families.get("kvm_host") or {}
    if version >= (5, 11):
        missing = [t["tracepoint"] for t in kvm.get("tracepoints", []) if t.get("attached") is None]
        c.check(not kvm.get("unavailable") and kvm.get("tracepoints") and not missing,
                f"kvm_host attached through the kvm module's BTF (not: {kvm.get('unavailable') or missing})")
    else:
        c.check("no BTF" in (kvm.get("unavailable") or ""),
                f"kvm_host says the kvm module has no BTF ({kvm.get('unavailable')})")
    # 6.1's io_uring_submit_sqe already takes the request (AL2023's kernel): io_uring is timed
    # there through it; 5.10's and 6.12's leave it out (no request; renamed).
    app = {t["tracepoint"]: t for t in (families.get("app") or {}).get("tracepoints", [])}
    if tuple(version[:2]) == (6, 1):
        c.check(app.get("io_uring_submit_sqe", {}).get("attached") is not None,
                f"app: io_uring timed at 6.1's io_uring_submit_sqe ({app.get('io_uring_submit_sqe')})")
    else:
        c.check("io_uring_submit_sqe" not in app, "app: io_uring_submit_sqe left out where it does not take the request")
    pv = families.get("pv_paths")
    c.check(pv is not None and (pv.get("unavailable") or pv["tracepoints"]), "pv_paths attached or says why")
    selftest = doctor.get("histogram_self_test") or {}
    c.check(selftest.get("ok") is True, f"in-kernel histogram self-test: {selftest.get('detail')}")
    memory = doctor.get("map_memory") or {}
    c.check(memory.get("estimated_bytes", 0) > 0, f"map memory reported: {memory}")


def devnums(results):
    out = {}
    for line in read_text(results, "devnums").splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    return out


def stage_count(profile, stage):
    s = (profile.get("stages") or {}).get(stage)
    return s["count"] if s else 0


def within(a, b, tolerance):
    return b > 0 and abs(a - b) <= tolerance * b


def check_rand4k(c, results, name, profile, leaves):
    if not c.check(profile is not None, f"{name}: profile written"):
        return
    ios = profile["results"]["read"]["ios"]
    c.check(ios > 0, f"{name}: workload did {ios} reads")
    for stage in ["queue", "device"]:
        n = stage_count(profile, stage)
        c.check(within(n, ios, 0.01), f"{name}: {stage} stage counts {n} requests for {ios} reads (±1%)")
    # Each queue of virtio-blk and NVMe has its own named IRQ: device time ends at its handler's
    # entry for (nearly) every request, and the rest is the completion stage.
    done, split = stage_count(profile, "device"), stage_count(profile, "completion")
    completion = (profile.get("stages") or {}).get("completion") or {}
    mean = completion.get("sum_ns", 0) / max(split, 1)
    c.check(split >= 0.98 * done and 0 < mean < 1e8,
            f"{name}: completion stage for {split} of {done} requests, mean {mean:.0f} ns")
    devices = {d["name"]: d for d in profile.get("devices", [])}
    for leaf in leaves:
        d = devices.get(leaf)
        c.check(d is not None and d["stages"]["device"]["count"] > 0,
                f"{name}: member {leaf} has its own stages")
    if len(leaves) > 1 and all(l in devices for l in leaves):
        total = sum(devices[l]["stages"]["device"]["count"] for l in leaves)
        c.check(total == stage_count(profile, "device"),
                f"{name}: members' device stages sum to the target's ({total})")
    return devices


def check_throttle(c, profile, name="throttle"):
    """Reads held by blk-throttle: their wait is queue time (from the bio's entry), and every
    request counts, those a throttle worker built from a held bio included."""
    if not c.check(profile is not None, f"{name}: profile written"):
        return
    ios = profile["results"]["read"]["ios"]
    stages = profile.get("stages") or {}
    app, queue = stages.get("app") or {}, stages.get("queue") or {}
    mean = lambda h: h.get("sum_ns", 0) / max(h.get("count", 0), 1)
    c.check(ios > 0 and queue.get("count", 0) >= 0.95 * ios,
            f"{name}: queue stage counts {queue.get('count')} requests for {ios} reads (>= 95%)")
    c.check(mean(app) > 5e6 and mean(queue) >= 0.8 * mean(app),
            f"{name}: queue {mean(queue) / 1e6:.1f} ms of app {mean(app) / 1e6:.1f} ms per read (>= 80%)")


def check_kernel_stamps(c, results, release, virtio):
    """The block family on the kernel's request stamps by default: used where they are exact
    (before 6.9, whose plug caches one clock reading for a batch), our own kept with a note
    elsewhere; our own when asked for (`--block-stamps own`); and
    both sources on the same 2000 reads: the same requests, paired one to one, and each stage's
    median difference per request within 1% of a request's median time once the order of the
    two sessions' programs on a shared tracepoint is taken out (the second's clock reads come
    later by the first's programs' run time). Per request and by the median: under the
    emulator a vCPU descheduled between the two sessions' programs at a few completions moved
    a stage's mean by 4 µs (2.5% of a request, on a quiet host and beside a CPU hog alike).
    The order's correction is an estimate, from the programs' mean run times, which under the
    emulator vary call by call: what is left after it may be as large as the correction itself
    (2 µs of a 2.6 µs correction was seen on 5.10), so that much more is allowed. A stamp at the
    wrong boundary moves a stage by a whole stage, more than both together."""
    exact = kernel_version(release) < (6, 9)
    kernel_note = "stage times from the kernel's request stamps"
    notes = lambda p: " ".join((p.get("capabilities") or {}).get("notes") or [])
    if virtio:
        want = kernel_note if exact else "our own stamps are used"
        c.check(want in notes(virtio), f"virtio (the default stamps): the notes say {want!r}: {notes(virtio)[:300]}")
    profile = read_json(results, "ownstamps.json")
    if profile:
        c.check(kernel_note not in notes(profile),
                f"ownstamps: the kernel's stamps are not used when our own are asked for: {notes(profile)[:300]}")
    check_rand4k(c, results, "ownstamps", profile, [])
    doc = read_json(results, "stamps.out")
    if not c.check(doc is not None, "stamps: doctor --compare-stamps --json parses"):
        return
    c.check((doc["kernel_inexact"] is None) == exact,
            f"stamps: the kernel's stamps {'exact' if exact else 'not exact'} here: {doc['kernel_inexact']}")
    reads = doc["reads"]
    for name in ["own", "kernel"]:
        n = doc[name]["requests"]
        c.check(within(n, reads, 0.01), f"stamps: {name} stamps measured {n} requests for {reads} reads")
    if not exact:
        return
    own, kernel, lag = doc["own"], doc["kernel"], doc["order_lag_ns"]
    paired = doc["per_request"]
    c.check(paired["paired"] >= 0.99 * min(own["requests"], kernel["requests"]),
            f"stamps: {paired['paired']} requests paired of {own['requests']} (own) and "
            f"{kernel['requests']} (kernel), {paired['unpaired']} unpaired")
    whole = paired["median_whole_ns"]
    for stage in ["queue", "device", "completion"]:
        d = paired["median_difference_ns"][stage]
        if not c.check(d is not None and whole, f"stamps: {stage} measured by both"):
            continue
        off = d - lag[stage]
        c.check(abs(off) <= 0.01 * whole + abs(lag[stage]),
                f"stamps: {stage} {d:+.0f} ns apart (kernel - own, median per request; means "
                f"{kernel[stage + '_mean_ns'] or 0:.0f} vs {own[stage + '_mean_ns'] or 0:.0f} ns), "
                f"{lag[stage]:+.0f} ns of it the programs' order: {off:+.0f} ns, "
                f"{abs(off) / whole:.2%} of a request's median {whole:.0f} ns")


def check_remap(c, results):
    """The throttled reads again, on a partition with the bio-entry hook left out: noted at
    block_bio_remap, their wait is still queue time, and the summary says where it starts."""
    profile = read_json(results, "remap.json")
    check_throttle(c, profile, "remap")
    if profile is None:
        return
    outcomes = {t["tracepoint"]: t for f in (profile.get("capabilities") or {}).get("families", [])
                for t in f.get("tracepoints", [])}
    hook, remap = outcomes.get("submit_bio_noacct", {}), outcomes.get("block_bio_remap", {})
    c.check(hook.get("attached") is None and remap.get("attached") is not None,
            f"remap: hook left out, block_bio_remap attached ({remap.get('attached')})")
    entry = (profile.get("block") or {}).get("from_bio_entry", 0)
    requests = stage_count(profile, "queue")
    c.check(requests > 0 and entry >= 0.95 * requests,
            f"remap: {entry} of {requests} requests started at their bio's entry")
    c.check("noted at block_bio_remap" in read_text(results, "remap.err") + read_text(results, "remap.out"),
            "remap: the summary says the queue starts at the bio's entry, noted at block_bio_remap")


def check_tail(c, name, profile):
    """The tail autopsy: the I/Os above p99 kept, and joined to their requests by disk sector
    (on an md RAID0 or dm target, through its striping or table to the member's sector)."""
    if profile is None:
        return
    tail = (profile.get("runs") or [{}])[0].get("tail")
    if not c.check(tail is not None, f"{name}: tail autopsy recorded"):
        return
    sets = {s["percentile"]: s for s in tail["sets"]}
    p99 = sets.get(99.0)
    if not c.check(p99 is not None, f"{name}: tail autopsy has the I/Os above p99"):
        return
    # The workers keep I/Os above half their running p99; an emulator beside a CPU hog can hold
    # that estimate above twice the run's final p99 for a while (a dm target kept 63 of 76,
    # 83%; 90% and more on a quiet host). The autopsy says how many it kept; a retention that
    # is broken keeps few.
    c.check(p99["ios"] >= 0.5 * p99["expected_ios"],
            f"{name}: kept {p99['ios']} of the {p99['expected_ios']} I/Os above p99")
    c.check(tail["requests_dropped"] == 0, f"{name}: {tail['requests_dropped']} slow requests dropped")
    # Under emulation most tails are the guest's own scheduling (software), whose requests are
    # too short to be sent, and how many are depends on the emulator's day (8% to 57% seen on
    # one dm target): any joined shows the join works on this kernel and device, and a join
    # broken by a wrong sector mapping joins none.
    c.check(p99["joined"] >= 1 and "unjoinable" not in tail,
            f"{name}: {p99['joined']} of {p99['ios']} I/Os above p99 joined to their request")


def check_split(c, results):
    """1 MiB reads on a disk whose requests are smaller: requests per app I/O as the block layer
    split them, and the summary saying so."""
    profile = read_json(results, "split.json")
    if not c.check(profile is not None, "split: profile written"):
        return
    max_kb = int(read_text(results, "split.max_sectors_kb").strip() or 0)
    ios, requests = profile["stages"]["app"]["count"], stage_count(profile, "device")
    ratio = requests / max(ios, 1)
    least = -(-1024 // max_kb) if max_kb else 2
    c.check(ios > 0 and ratio >= 0.98 * least,
            f"split: {requests} requests for {ios} reads of 1 MiB ({ratio:.2f} per I/O; "
            f"max_sectors_kb {max_kb}: at least {least})")
    summary = read_text(results, "split.out")
    if least > 1:
        c.check(f"block requests per app I/O: {ratio:.2f} ({requests} requests for {ios} I/Os)" in summary,
                "split: the summary gives the requests per app I/O")


def check_idle(c, name, profile, release):
    """The idle interval before the workload: one interval long, host-wide figures measured;
    IPIs sent are "not measured" (null), never 0, before the ipi_send_* tracepoints (6.4)."""
    if profile is None:
        return
    run = (profile.get("runs") or [{}])[0]
    idle = run.get("idle")
    ok = idle is not None and 0.5 <= idle["seconds"] <= 3.0 and idle["hardirq_ns"] is not None
    c.check(ok, f"{name}: idle baseline {idle}")
    counted = kernel_version(release) >= (6, 4)
    c.check(idle is not None and (idle["ipis_sent"] is not None) == counted
            and (run.get("ipis_sent") is not None) == counted,
            f"{name}: IPIs sent {'counted' if counted else 'not measured'} "
            f"(run {run.get('ipis_sent')}, idle {idle and idle['ipis_sent']})")
    # The same tracepoint times IPIs to one CPU up to their ICR write (bpf/msr.bpf.c).
    sends = (profile.get("virtualization") or {}).get("icr_sends")
    c.check((sends is not None) == counted,
            f"{name}: IPIs to one CPU {'timed' if counted else 'not timed'} ({sends})")


def check_nvme_queues(c, profile, device):
    """Every hardware queue that took the workload's requests has NVMe latency and its IRQ ran."""
    used = [q for q in device.get("queues", []) if q["device"]["count"] > 0]
    c.check(len(used) >= 1, f"nvme: {len(used)} hardware queues took I/O")
    nvme = {q["qid"]: q for q in device.get("nvme_queues", [])}
    irq_cpus = {}
    for cpu in profile.get("cpus", []):
        for irq, n in cpu.get("irqs", {}).items():
            irq_cpus.setdefault(irq, {})[cpu["cpu"]] = n
    host = {d["name"]: d for d in profile["host"]["block_devices"]}.get(device["name"], {})
    queue_irqs = {i: q.get("irq") for i, q in enumerate(host.get("queues", []))}
    for q in used:
        hctx = q["hctx"]
        latency = nvme.get(hctx + 1)
        c.check(latency is not None and latency["count"] > 0,
                f"nvme: queue {hctx} (qid {hctx + 1}) has NVMe command latency")
        irq = queue_irqs.get(hctx)
        if not c.check(irq is not None, f"nvme: queue {hctx} has an IRQ in the fingerprint"):
            continue
        counts = irq_cpus.get(irq["name"], {})
        owners = cpu_list(irq.get("effective_affinity") or "")
        c.check(any(counts.get(cpu, 0) > 0 for cpu in owners) if owners else sum(counts.values()) > 0,
                f"nvme: {irq['name']} handled on its CPU(s) {owners}: {counts}")


def check_nvme_csv(c, results, device):
    """histograms.csv holds each NVMe queue's commands under its queue id, as many as the
    profile counts."""
    path = os.path.join(results, "nvme-csv", "histograms.csv")
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        c.check(False, f"nvme: histograms.csv: {e}")
        return
    in_csv = {}
    for r in rows:
        if r["stage"] == "nvme_command" and r["device"] == device["name"]:
            in_csv[int(r["queue"])] = in_csv.get(int(r["queue"]), 0) + int(r["count"])
    profile = {q["qid"]: q["count"] for q in device.get("nvme_queues", []) if q["count"] > 0}
    c.check(profile and in_csv == profile,
            f"nvme: histograms.csv's commands per queue id {in_csv} = the profile's {profile}")


def check_nvme_diff(c, results, virtgap, device):
    """The diff compares NVMe command latency per queue id: the profile against itself has a
    row for each queue id it used, at the profile's mean."""
    path = os.path.join(results, "nvme.json")
    out = subprocess.run([virtgap, "diff", "--json", path, path], capture_output=True, text=True)
    try:
        rows = {r["metric"]: r for r in json.loads(out.stdout).get("nvme_queues", [])}
    except ValueError:
        return c.check(False, f"nvme diff: `virtgap diff --json` parses ({out.stderr.strip()[:200]})")
    want = {f"nvme_q{q['qid']}_command_mean": q["sum_ns"] / q["count"]
            for q in device.get("nvme_queues", []) if q["count"] > 0}
    got = {k: r.get("a") for k, r in rows.items()}
    c.check(want and set(got) == set(want)
            and all(abs((got[k] or 0) - v) <= 1e-6 * v + 1 for k, v in want.items()),
            f"nvme diff: rows per queue id {sorted(got)} at the profile's means ({sorted(want)})")


def cpu_list(text):
    """"0-2,5" -> [0, 1, 2, 5]"""
    cpus = []
    for part in text.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-")
            cpus.extend(range(int(lo), int(hi) + 1))
        elif part:
            cpus.append(int(part))
    return cpus


def check_sampler_cpus(c, doctor):
    """CPU 2 offline: the sampler's events are on CPUs 0, 1 and 3, and none failed."""
    if not doctor:
        return c.check(False, "offline: doctor --json parses")
    sampler = next((f for f in doctor["capabilities"]["families"] if f["family"] == "sampler"), {})
    on = sorted(int(t["tracepoint"].rsplit("cpu", 1)[1]) for t in sampler.get("tracepoints", [])
                if t.get("attached"))
    failed = [t["tracepoint"] for t in sampler.get("tracepoints", []) if not t.get("attached")]
    c.check(on == [0, 1, 3] and not failed, f"offline CPU 2: sampler on CPUs {on}, failed {failed}")


def expected_timed(first, series):
    """What a timed path (by its first name) is on `series`: the function attached, or
    (state, words of the reason); None for a kernel outside the pinned series."""
    if series not in PINNED_SERIES:
        return None
    return TIMED_PATH_EXCEPTIONS.get(first, {}).get(series, first)


def check_hypervisor_paths(c, results, release):
    """Every timed path of every hypervisor's table: attached (fentry or kprobe) under the
    function this series has, or absent or untraceable for the reason pinned above."""
    series = kernel_version(release)
    for hv in HYPERVISORS:
        step_ok(c, results, f"hv-{hv}")
        doc = read_json(results, f"hv-{hv}.out")
        table = (doc or {}).get("hypervisor_paths") or {}
        timed = [p for p in table.get("paths", []) if p["measure"] == "timed"]
        if not c.check(table.get("hypervisor") == hv and table.get("checked_as") and timed,
                       f"{hv}: doctor --hypervisor {hv} lists the table's timed paths"):
            continue
        for p in timed:
            first = p["names"][0]
            expected = expected_timed(first, series)
            got = f"{p['state']} {p.get('attach') or ''} {p.get('symbol') or ''}: {p['detail'][:240]}"
            if expected is None:
                c.check(p["state"] in ("attached", "absent", "not_traceable") and p["detail"],
                        f"{hv}: {first}: {got}")
            elif isinstance(expected, tuple):
                state, words = expected
                c.check(p["state"] == state and words in p["detail"],
                        f"{hv}: {first}: {state} ({words}) as pinned; {got}")
            else:
                c.check(p["state"] == "attached" and p.get("attach") in ("fentry", "kprobe")
                        and p.get("symbol") == expected,
                        f"{hv}: {first}: attached at {expected}; {got}")


def check_pv_timer(c, results, name, attach, release):
    """As a Xen guest, the timer path timed from idle and IRQ context on every CPU (by `attach`):
    many calls, each a few µs (a start overwritten by another CPU or a nested call would show as
    a lost call or an absurd duration)."""
    profile = read_json(results, f"{name}.json")
    if not c.check(profile is not None, f"{name}: profile written"):
        return
    outcomes = {t["tracepoint"]: t for f in (profile.get("capabilities") or {}).get("families", [])
                if f["family"] == "pv_paths" for t in f.get("tracepoints", [])}
    v = profile.get("virtualization") or {}
    paths = {p["symbol"]: p for p in (v.get("pv_paths") or [])}
    expected = expected_timed("xen_vcpuop_set_next_event", kernel_version(release))
    timer = paths.get(expected) if expected else max(paths.values(), key=lambda p: p["count"], default=None)
    how = (outcomes.get(timer["symbol"]) or {}).get("attached") if timer else None
    if not c.check(timer is not None and timer["count"] > 100 and how == attach,
                   f"{name}: timed the timer path at {expected} by {how} ({paths})"):
        return
    # Functional, not timing: under TCG a vCPU thread can lose its host CPU mid-call for ms,
    # but a start taken from another CPU or a lost outer call shows as ~2^64 ns or hours.
    c.check(timer["p99_ns"] is not None and timer["p99_ns"] < 1e8 and timer["mean_ns"] < 1e7,
            f"{name}: {timer['symbol']} {timer['count']} calls, p99 {timer['p99_ns']:.0f} ns, "
            f"mean {timer['mean_ns']:.0f} ns: no impossible durations")
    # The hard-IRQ handler frames loaded beside the paths (typed or raw tracepoints), so that
    # a handler run inside a path is left out of its time.
    family = next((f for f in (profile.get("capabilities") or {}).get("families", [])
                   if f["family"] == "pv_paths"), {})
    c.check(not family.get("fallback"),
            f"{name}: IRQ handlers left out of the paths' times ({family.get('fallback')!r})")


def check_sampler(c, profile):
    sampler = ((profile.get("virtualization") or {}).get("sampler")) or {}
    cpus = {s["cpu"]: s["samples"] for s in sampler.get("cpus", [])}
    missing = [cpu for cpu in range(VCPUS) if cpus.get(cpu, 0) == 0]
    c.check(not missing, f"sampler: samples on every CPU ({cpus})")
    # With the msr probe beside it the sampler pauses for a quarter of every interval, and the
    # host's MSR writes are the ones counted in those pauses.
    virt = profile.get("virtualization") or {}
    seconds, quiet = virt.get("seconds") or 0, virt.get("msr_quiet_seconds")
    sampled = sampler.get("sampled_seconds")
    hosts = sum(w["count"] for w in virt.get("msr_writes") or []
                if not w.get("by_sampler") and not w.get("while_sampling"))
    c.check(quiet is not None and sampled is not None and seconds > 0
            and 0.15 <= quiet / seconds <= 0.4 and abs(quiet + sampled - seconds) < 0.05 * seconds,
            f"sampler paused {quiet} s and ran {sampled} s of {seconds} s; "
            f"{hosts} host MSR writes counted in the pauses")


def check_throttle_diff(c, results, virtgap):
    """The diff of the same reads unthrottled and throttled puts the gap on the queue stage."""
    a, b = (os.path.join(results, f) for f in ("unthrottled.json", "throttle.json"))
    if not (os.path.exists(a) and os.path.exists(b)):
        return c.check(False, "throttle diff: both profiles written")
    out = subprocess.run([virtgap, "diff", "--json", a, b], capture_output=True, text=True)
    try:
        d = json.loads(out.stdout)
    except ValueError:
        return c.check(False, f"throttle diff: `virtgap diff --json` parses ({out.stderr.strip()[:200]})")
    # Rows by their label (older diffs put it in "metric").
    rows = {(r.get("label") or r["metric"]).strip(): r for r in d.get("waterfall", [])}
    app, queue = rows.get("app latency (mean)", {}), rows.get("block queue", {})
    # One run or one recording a side: a difference found is provisional ("within_runs",
    # "one_session").
    found = ("significant", "within_runs", "one_session")
    c.check(app.get("verdict") in found and queue.get("verdict") in found
            and (queue.get("share") or 0) >= 0.8,
            f"throttle diff: app {app.get('verdict')} {app.get('delta', 0) / 1e6:+.1f} ms, "
            f"queue {queue.get('verdict')} with {100 * (queue.get('share') or 0):.0f}% of it (>= 80%)")


def check_guest(c, console, results, virtgap):
    faults = guest_faults(console + (read_text(results, "dmesg") if results else ""))
    c.check(not faults, "no guest oops or I/O stall" + (f": {'; '.join(faults)}" if faults else ""))
    if not c.check(results is not None, "guest wrote its results"):
        return
    c.check(read_text(results, "setup.log") == "", f"modules loaded {read_text(results, 'setup.log').strip()}")
    devices = read_text(results, "devices").split()
    names = dict(kv.split("=", 1) for kv in devices if "=" in kv)
    check_doctor(c, read_json(results, "doctor.out"), read_text(results, "uname").strip())
    check_hypervisor_paths(c, results, read_text(results, "uname").strip())
    for step in ["doctor", "offline", "nvme", "pv", "pv-kprobe", "virtio", "ownstamps", "stamps", "unthrottled", "throttle", "addpart", "remap", "split",
                 "dmsetup", "dm", "mdadm", "md", "iotune"]:
        step_ok(c, results, step)
    check_sampler_cpus(c, read_json(results, "offline.out"))
    nvme = read_json(results, "nvme.json")
    found = check_rand4k(c, results, "nvme", nvme, [names.get("nvme", "?")])
    if found and names.get("nvme") in found:
        check_nvme_queues(c, nvme, found[names["nvme"]])
        check_nvme_csv(c, results, found[names["nvme"]])
        check_nvme_diff(c, results, virtgap, found[names["nvme"]])
    check_tail(c, "nvme", nvme)
    check_idle(c, "nvme", nvme, read_text(results, "uname").strip())
    check_throttle(c, read_json(results, "throttle.json"))
    check_throttle_diff(c, results, virtgap)
    check_remap(c, results)
    check_split(c, results)
    if nvme:
        check_sampler(c, nvme)
    for name, attach in [("pv", "fentry"), ("pv-kprobe", "kprobe")]:
        check_pv_timer(c, results, name, attach, read_text(results, "uname").strip())
    virtio = read_json(results, "virtio.json")
    check_rand4k(c, results, "virtio", virtio, [names.get("virtio", "?")])
    check_tail(c, "virtio", virtio)
    # The disk served another process's reads too (field 0 of the stat file: reads completed).
    stat = [read_text(results, f"virtio.stat.{when}").split() for when in ("before", "after")]
    if virtio and all(stat):
        disk_reads = int(stat[1][0]) - int(stat[0][0])
        ios = virtio["results"]["read"]["ios"]
        c.check(disk_reads > ios * 1.05,
                f"virtio: another process's {disk_reads - ios} reads ran meanwhile and were not counted")
    check_kernel_stamps(c, results, read_text(results, "uname").strip(), virtio)
    raid = names.get("raid", "?,?").split(",")
    dm = read_json(results, "dm.json")
    check_rand4k(c, results, "dm", dm, raid)
    check_tail(c, "dm", dm)
    md = read_json(results, "md.json")
    check_rand4k(c, results, "md", md, raid)
    check_tail(c, "md", md)
    summary = read_text(results, "md.out")
    c.check(f"on md0 ({' + '.join(sorted(raid))}, summed)" in summary,
            "md: the summary shows md0's stages summed over its members")
    check_iotune(c, results)


IOTUNE_PHASES = ["read_bandwidth", "write_bandwidth", "read_iops", "write_iops"]


def check_iotune(c, results):
    """iotune on md0: all four phases searched and measured, the block probe seeing the members'
    requests, and io_properties.yaml with ScyllaDB's keys."""
    r = read_json(results, "iotune.json")
    if not c.check(r is not None, "iotune: wrote its result for md0"):
        return
    phases = {p["phase"]: p for p in r.get("phases", [])}
    c.check(sorted(phases) == sorted(IOTUNE_PHASES),
            f"iotune: all four phases on md0 ({', '.join(phases) or 'none'})")
    for key, p in phases.items():
        search = p.get("search", [])
        c.check(p.get("figure", 0) > 0 and len(p.get("runs", [])) == 1 and search and search[0]["qd"] == 1,
                f"iotune {key}: {p.get('figure', 0):.0f} from {len(search)} search steps and one measured run")
        device = ((p.get("profile") or {}).get("stages") or {}).get("device") or {}
        c.check(device.get("count", 0) > 0,
                f"iotune {key}: the block probe timed {device.get('count', 0)} requests on md0's members")
    yaml = read_text(results, "io.yaml")
    c.check(yaml.startswith("disks:") and all(f"{k}: " in yaml for k in IOTUNE_PHASES + ["mountpoint"]),
            "iotune: io_properties.yaml has ScyllaDB's five keys")


# --- main --------------------------------------------------------------------------------

def test_kernel(kernel, virtgap, cache, keep, timeout, tcg="auto"):
    log(f"{kernel.label}: {kernel.version}")
    work = tempfile.mkdtemp(prefix=f"vmtest-{kernel.version}-", dir=os.path.join(cache, "runs"))
    initrd = build_initramfs(kernel, virtgap, work)
    # Multi-threaded TCG sometimes runs a vCPU on stale code while kernel text is patched across
    # vCPUs (attaching tracepoints flips static keys): an int3 trap where memory holds no int3
    # any more. That is the emulator, not the kernel or virtgap, so boot again, up to a bound.
    # One host thread avoids it but is too slow for the steps' timeouts (`--tcg single` tries).
    attempts = ["single"] if tcg == "single" else ["multi"] * MULTI_ATTEMPTS
    emulator_only = True
    for n, mode in enumerate(attempts):
        shutil.rmtree(os.path.join(work, "out"), ignore_errors=True)
        console, results, secs = boot(kernel, initrd, work, mode, timeout * (2 if mode == "single" else 1))
        oops = [f for f in guest_faults(console) if f.startswith("kernel oops")]
        if results is None and "[vmtest: timed out" in console:
            oops.append(console[console.rfind("[vmtest: timed out"):].strip())
        if not oops:
            break
        stale = stale_int3(console) or int3_storm(console)
        emulator_only = emulator_only and stale is not None
        with open(os.path.join(work, f"console.attempt{n + 1}.log"), "w") as f:
            f.write(console)
        if n == len(attempts) - 1:
            break
        log(f"{kernel.label}: guest failed under thread={mode} TCG ({stale or oops[0]}); booting again")
    if oops and emulator_only:
        # Every boot ended on the emulator's stale code: nothing of virtgap was judged wrong,
        # and nothing of this kernel was judged at all. Said loudly; the other kernels stand.
        log(f"{kernel.label}: NOT JUDGED: every one of {len(attempts)} boots trapped on stale code "
            f"under multi-threaded TCG (consoles kept in {work})")
        c = Checks(kernel.label)
        c.not_judged = f"the emulator ran stale kernel text in {len(attempts)} boots"
        return c
    with open(os.path.join(work, "console.log"), "w") as f:
        f.write(console)
    log(f"{kernel.label}: guest ran {secs:.0f} s")
    c = Checks(kernel.label)
    check_guest(c, console, results, virtgap)
    if c.failures:
        tail = "\n".join(console.splitlines()[-25:])
        print(f"  last console lines:\n{tail}")
    if keep or c.failures:
        log(f"{kernel.label}: kept {work} (console.log, out/)")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return c


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kernels", nargs="*", help="5.10, 6.1, 6.12, a Debian package name, or a vmlinuz path "
                   f"(default: {' '.join(DEFAULT_KERNELS)})")
    p.add_argument("--virtgap", default=os.path.join(ROOT, "target", "release", "virtgap"))
    p.add_argument("--cache", default=os.path.join(ROOT, "target", "vmtest"),
                   help="downloaded kernels and run directories")
    p.add_argument("--modroot", help="for a vmlinuz path: the directory holding lib/modules/VERSION")
    p.add_argument("--keep", action="store_true", help="keep each run's directory (initramfs, disks, results)")
    p.add_argument("--timeout", type=int, default=240, help="seconds one guest may run")
    p.add_argument("--tcg", choices=["auto", "multi", "single"], default="auto",
                   help="QEMU's TCG threading (auto: multi-threaded, booted again after the emulator's stale-code traps)")
    args = p.parse_args()
    if not os.access(args.virtgap, os.X_OK):
        sys.exit(f"vmtest: no virtgap binary at {args.virtgap}; run `just build` first")
    for name in ["qemu-system-x86_64", "cpio", "mdadm", "addpart", "dmsetup", "modprobe", "depmod", "dpkg-deb", "xz"]:
        if not tool(name):
            sys.exit(f"vmtest: {name} not found; `./setup.sh vmtest` installs what the tier needs")
    if not os.path.exists("/bin/busybox"):
        sys.exit("vmtest: /bin/busybox not found; install busybox-static")
    os.makedirs(os.path.join(args.cache, "runs"), exist_ok=True)
    kernels = [resolve_kernel(k, args.cache, args.modroot) for k in (args.kernels or DEFAULT_KERNELS)]
    results = [test_kernel(k, args.virtgap, args.cache, args.keep, args.timeout, args.tcg) for k in kernels]
    print()
    for c in results:
        if c.not_judged:
            print(f"vmtest: {c.label:<8} NOT JUDGED: {c.not_judged}")
        else:
            print(f"vmtest: {c.label:<8} {c.passed} passed, {len(c.failures)} failed")
    # A tier with no kernel judged proves nothing: that fails.
    if all(c.not_judged for c in results):
        sys.exit(1)
    sys.exit(1 if any(c.failures for c in results) else 0)


if __name__ == "__main__":
    main()
