#!/usr/bin/env python3
"""The VM tier's Xen step: a real Xen, its paths called, and the mission's diff end to end.

Debian 12's Xen 4.17 boots under QEMU's TCG (as Xen's own CI runs it) with Debian's 6.1 kernel as
its PV dom0 and an emulated NVMe disk; the same kernel and disk then boot bare, CPUID's
hypervisor bit clear (the "metal" side: no paravirt at all). In each, virtgap records QD-1
random reads on the NVMe disk with every probe, several runs; this script then checks what
each saw and diffs the two profiles as a user would (`diff bare.json xen.json`):

- dom0 is found to run on Xen, the bare boot on no hypervisor;
- Xen's paths are called, not only attached: the IPI hypercall (`xen_send_IPI_one`, its
  lock-kick calls timed apart as the kick's), the
  timer (at `clockevents_program_event`, its traceable caller), the event-channel upcall, the
  frontends' doorbell (`notify_remote_via_irq`, less the IPI sender's calls through it), and
  the NVMe interrupt's end (`eoi_pirq`, MSI-X arriving as a pirq), each with calls and a
  plausible time per call;
- the diff's hypervisor block names Xen against no hypervisor, with Xen's mechanisms.

Functional checks only: TCG's timing means nothing, so no figure is compared with another's
size. The profiles and the diff stay in the run directory (`--keep`, or on a failure).

Needs root, qemu-system-x86, busybox-static, cpio, apt (for Debian's kernel and Xen packages,
unpacked into the cache, never installed); `./setup.sh vmtest` installs them.

    scripts/vmtest_xen.py [--virtgap BIN] [--cache DIR] [--keep] [--runs N]
"""

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vmtest  # noqa: E402 - the VM tier's kernels, initramfs and boot helpers

# The dom0 kernel: the series Xen's Debian release ships with.
SERIES = "6.1"
XEN_PACKAGE = "xen-hypervisor-4.17-amd64"
VCPUS = 2
NVME_SERIAL = vmtest.NVME_SERIAL
OUT_SERIAL = vmtest.OUT_SERIAL
# xenstored, its client and the libraries they link (unpacked, never installed).
TOOL_PACKAGES = ["xen-utils-4.17", "xenstore-utils", "libxenstore4", "libxenmisc4.17",
                 "libxentoolcore1", "libxenevtchn1", "libxengnttab1", "libxencall1",
                 "libxentoollog1", "libxenforeignmemory1", "libxendevicemodel1", "libxenhypfs1"]
# The frontend's disk: xenstored's devices (privcmd, event channels, grant maps), the backend
# and the frontend. Each refuses to load on the bare boot, where nothing needs it.
XEN_MODULES = ["xenfs", "xen-privcmd", "xen-evtchn", "xen-gntdev", "xen-blkback", "xen-blkfront"]
# Doorbells per read on the frontend's disk: each read kicks the backend once (blkfront's
# flush_requests); in dom0 the backend runs beside it, and its response to each read goes out
# through the same function.
DOORBELLS_PER_READ = (0.9, 2.5)
# Seconds each guest may run: boot, doctor, and the recording's runs under TCG.
GUEST_TIMEOUT = 600
# One recording's step limit in the guest.
RECORD_TIMEOUT = 420

GUEST_INIT = r"""#!/bin/sh
# virtgap's Xen step: one recording on the NVMe disk, archived onto the results disk.
""" + vmtest.GUEST_SETUP + r"""for i in $(seq 1 200); do
    [ -n "$(disk_by_serial @OUT@)" ] && [ -n "$(disk_by_serial @NVME@)" ] && break
    sleep 0.1
done
step() {
    name=$1; limit=$2; shift 2
    echo "vmtest-guest: $name" > /dev/console
    timeout -s KILL $limit "$@" > /out/$name.out 2> /out/$name.err
    echo $? > /out/$name.rc
    echo "vmtest-guest: $name exited $(cat /out/$name.rc)" > /dev/console
}
uname -r > /out/uname
cat /sys/hypervisor/type > /out/hypervisor.type 2>/dev/null
cat /proc/interrupts > /out/interrupts.before
NVME=$(disk_by_serial @NVME@); OUT=$(disk_by_serial @OUT@)
echo "nvme=$NVME out=$OUT" > /out/devices
step doctor 120 /bin/virtgap doctor --json
step record @RECORD_TIMEOUT@ /bin/virtgap record -w rand4k-qd1 --runs @RUNS@ --duration 2s \
    --quiet --target /dev/$NVME -o /out/profile.json
cat /proc/interrupts > /out/interrupts.after
# A Xen frontend's disk, as a domU's is attached: blkfront in dom0 on a blkback backend over
# the NVMe disk, their handshake through xenstored (the nodes the toolstack writes for a disk).
# Its reads kick the backend through the frontends' doorbell.
if [ "$(cat /sys/hypervisor/type 2>/dev/null)" = xen ]; then
    mkdir -p /proc/xen /var/run/xenstored /var/lib/xenstored /var/log/xen
    mount -t xenfs xenfs /proc/xen
    /bin/xenstored --pid-file /run/xenstored.pid > /out/xenstored.log 2>&1
    be=/local/domain/0/backend/vbd/0/51712; fe=/local/domain/0/device/vbd/51712
    dev=$(cat /sys/block/$NVME/dev)
    xenstore-write /local/domain/0/name Domain-0 /local/domain/0/domid 0 \
        $be/frontend $fe $be/frontend-id 0 $be/online 1 $be/state 1 $be/mode w \
        $be/type phy $be/device-type disk $be/dev xvda $be/params /dev/$NVME \
        $fe/backend $be $fe/backend-id 0 $fe/state 1 $fe/virtual-device 51712 \
        $fe/device-type disk > /out/xenstore.log 2>&1
    # What the toolstack's hotplug script writes last: the backend opens the disk on it.
    xenstore-write $be/physical-device $(printf %x:%x ${dev%:*} ${dev#*:}) >> /out/xenstore.log 2>&1
    for i in $(seq 1 300); do [ -e /sys/block/xvda ] && break; sleep 0.1; done
    xenstore-ls -f /local/domain/0 > /out/xenstore.nodes 2>&1
    step frontend @RECORD_TIMEOUT@ /bin/virtgap record -w rand4k-qd1 --runs @RUNS@ --duration 2s --quiet \
        --target /dev/xvda -o /out/frontend.json
    cat /proc/interrupts > /out/interrupts.frontend
fi
dmesg > /out/dmesg
tar -cf /dev/$OUT -C /out . && sync
echo "vmtest-guest: done" > /dev/console
poweroff -f
"""


def xen_hypervisor(cache):
    """Debian's Xen 4.17, unpacked into the cache: the hypervisor as the ELF QEMU loads."""
    dest = os.path.join(cache, "xen", XEN_PACKAGE)
    elf = os.path.join(dest, "xen.elf")
    if os.path.exists(elf):
        return elf
    opts = vmtest.apt_options(cache, "bookworm")
    debs = os.path.join(cache, "debs")
    os.makedirs(debs, exist_ok=True)
    if not any(f.startswith(XEN_PACKAGE + "_") for f in os.listdir(debs)):
        vmtest.log(f"downloading {XEN_PACKAGE}")
        vmtest.run(["apt-get", *opts, "download", "-q", XEN_PACKAGE], cwd=debs,
                   stderr=subprocess.DEVNULL)
    deb = next(os.path.join(debs, f) for f in os.listdir(debs) if f.startswith(XEN_PACKAGE + "_"))
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    vmtest.run(["dpkg-deb", "-x", deb, dest])
    packed = next(os.path.join(dest, "boot", f) for f in os.listdir(os.path.join(dest, "boot"))
                  if f.startswith("xen-") and f.endswith(".gz"))
    # An ELF32 with multiboot headers: QEMU's -kernel loads it as it is.
    with gzip.open(packed) as src, open(elf, "wb") as out:
        shutil.copyfileobj(src, out)
    return elf


def xen_tools(cache):
    """Debian's xenstored and xenstore client, unpacked into the cache with the Xen libraries
    they link: the lib directory to find those in."""
    dest = os.path.join(cache, "xen", "tools")
    libs = os.path.join(dest, "usr", "lib", "x86_64-linux-gnu")
    if os.path.exists(os.path.join(dest, "done")):
        return dest, libs
    opts = vmtest.apt_options(cache, "bookworm")
    debs = os.path.join(cache, "debs", "xen-tools")
    os.makedirs(debs, exist_ok=True)
    vmtest.log("downloading xenstored and its libraries")
    vmtest.run(["apt-get", *opts, "download", "-q", *TOOL_PACKAGES], cwd=debs,
               stderr=subprocess.DEVNULL)
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    for f in sorted(os.listdir(debs)):
        vmtest.run(["dpkg-deb", "-x", os.path.join(debs, f), dest])
    open(os.path.join(dest, "done"), "w").close()
    return dest, libs


def build_initramfs(kernel, virtgap, work, runs, tools):
    """The tier's initramfs with this step's init: the NVMe and virtio modules, Xen's device
    modules and xenstored for the frontend's disk, virtgap."""
    init = (GUEST_INIT.replace("@NVME@", NVME_SERIAL).replace("@OUT@", OUT_SERIAL)
            .replace("@RUNS@", str(runs)).replace("@RECORD_TIMEOUT@", str(RECORD_TIMEOUT)))
    tools_root, libs = tools

    def add_xen_tools(root):
        xenstored = os.path.join(tools_root, "usr", "lib", "xen-4.17", "bin", "xenstored")
        vmtest.copy_with_libs(xenstored, root, [libs])
        vmtest.copy_with_libs(os.path.join(tools_root, "usr", "bin", "xenstore"), root, [libs])
        # One client binary; what it does is the name it is called by.
        for name in ["xenstore-write", "xenstore-ls"]:
            os.symlink("xenstore", os.path.join(root, "bin", name))

    saved = vmtest.GUEST_INIT, vmtest.MODULES
    vmtest.GUEST_INIT, vmtest.MODULES = init, ["nvme", "virtio_blk", "virtio_pci", *XEN_MODULES]
    try:
        return vmtest.build_initramfs(kernel, virtgap, work, extra=add_xen_tools)
    finally:
        vmtest.GUEST_INIT, vmtest.MODULES = saved


def boot(kernel, initrd, work, xen_elf):
    """Boots the kernel on Xen (`xen_elf`) or bare (None); returns (console, results or None)."""
    os.makedirs(work, exist_ok=True)
    disks = {}
    for serial, mib in [(NVME_SERIAL, 256), (OUT_SERIAL, 64)]:
        disks[serial] = os.path.join(work, f"{serial}.img")
        with open(disks[serial], "wb") as f:
            f.truncate(mib << 20)
    linux_args = "panic=-1 oops=panic loglevel=4 nowatchdog rcupdate.rcu_cpu_stall_suppress=1"
    # One TCG thread: multi-threaded TCG now and then hangs a guest while its probes patch
    # kernel text (the VM tier boots such guests again); a Xen dom0 hung that way twice here.
    cmd = ["qemu-system-x86_64", "-accel", "tcg,thread=single", "-smp", str(VCPUS), "-m", "2048",
           "-nographic", "-no-reboot",
           "-drive", f"file={disks[NVME_SERIAL]},if=none,id=n0,format=raw",
           "-device", f"nvme,serial={NVME_SERIAL},drive=n0",
           "-drive", f"file={disks[OUT_SERIAL]},if=none,id=out,format=raw",
           "-device", f"virtio-blk-pci,drive=out,serial={OUT_SERIAL}"]
    if xen_elf:
        # Xen loads dom0's kernel and initramfs as multiboot modules; dom0's console is
        # Xen's, on the serial port.
        cmd += ["-cpu", "qemu64,+svm", "-kernel", xen_elf,
                "-append", "dom0_mem=1024M dom0_max_vcpus=2 console=com1 loglvl=warning",
                "-initrd", f"{kernel.vmlinuz} console=hvc0 {linux_args},{initrd}"]
    else:
        # The same CPU model with the hypervisor bit clear: the kernel finds bare hardware.
        cmd += ["-cpu", "qemu64,-hypervisor", "-kernel", kernel.vmlinuz, "-initrd", initrd,
                "-append", f"console=ttyS0 {linux_args}"]
    console_path = os.path.join(work, "console.log")
    with open(console_path, "wb") as out:
        try:
            subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           timeout=GUEST_TIMEOUT)
        except subprocess.TimeoutExpired:
            out.write(f"\n[vmtest: timed out past {GUEST_TIMEOUT} s]\n".encode())
    with open(console_path, "rb") as f:
        console = f.read().decode(errors="replace")
    results = os.path.join(work, "out")
    os.makedirs(results, exist_ok=True)
    try:
        import tarfile
        with tarfile.open(disks[OUT_SERIAL]) as t:
            t.extractall(results, filter="data")
    except Exception:  # noqa: BLE001 - an unwritten disk is "no results", said below
        return console, None
    return console, results if os.path.exists(os.path.join(results, "uname")) else None


def mechanism(profile, name):
    """A mechanism's figure in a profile's hypervisor section, or None."""
    section = profile.get("hypervisor") or {}
    return next((m for m in section.get("mechanisms", []) if m.get("mechanism") == name), None)


def timed_path(profile, mech, symbols):
    """The timed path of `mech` measured at one of `symbols`: (symbol, calls, ns per call)."""
    m = mechanism(profile, mech) or {}
    for p in m.get("paths", []):
        how = p.get("how", {})
        if how.get("kind") == "timed" and how.get("symbol") in symbols:
            calls = p.get("count") or 0
            per_call = (p.get("time_ns") or 0) / calls if calls else None
            return how.get("symbol"), calls, per_call
    return None


def check(c, side, console, results, virtgap):
    c.check(results is not None, f"{side}: the guest wrote its results")
    for fault in vmtest.guest_faults(console):
        c.check(False, f"{side}: {fault}")
    if results is None:
        return None
    rc = (vmtest.read_text(results, "record.rc") or "").strip()
    err = (vmtest.read_text(results, "record.err") or "")[-300:]
    c.check(rc == "0", f"{side}: record exited {rc}" + (f": {err}" if rc != "0" else ""))
    profile = vmtest.read_json(results, "profile.json")
    c.check(profile is not None, f"{side}: a profile")
    return profile


def diff(c, virtgap, name, a, b, text_path):
    """`virtgap diff A B` as a user reads it (printed, and kept at `text_path`), and its
    `--json` form, checked to succeed: the parsed JSON, or {}."""
    text = subprocess.run([virtgap, "diff", a, b], capture_output=True, text=True)
    with open(text_path, "w") as f:
        f.write(text.stdout + text.stderr)
    print(text.stdout)
    out = subprocess.run([virtgap, "diff", "--json", a, b], capture_output=True, text=True)
    c.check(out.returncode == 0, f"diff {name}: exit {out.returncode}: {out.stderr[-300:]}")
    return json.loads(out.stdout) if out.returncode == 0 else {}


def check_frontend(c, results):
    """The frontend's disk in dom0: its reads each kick the backend through the doorbell."""
    rc = (vmtest.read_text(results, "frontend.rc") or "").strip()
    err = (vmtest.read_text(results, "frontend.err") or "")[-300:]
    c.check(rc == "0", f"xen: recorded on the frontend's disk (xvda): exit {rc!r}"
            + (f": {err} (xenstore: {vmtest.read_text(results, 'xenstore.log')!r})" if rc != "0" else ""))
    front = vmtest.read_json(results, "frontend.json")
    if front is None:
        return
    # The profile's hypervisor section is its first run's; each run keeps its own counts.
    runs = front.get("runs") or []
    reads = sum(r.get("read_ios") or 0 for r in runs)
    calls = sum(((r.get("hypervisor") or {}).get("counts") or {}).get("device_notify", 0)
                for r in runs)
    time_ns = sum(((r.get("hypervisor") or {}).get("times_ns") or {}).get("device_notify", 0)
                  for r in runs)
    per_read = calls / reads if reads else None
    per_call = time_ns / calls if calls else None
    vmtest.log(f"xen: frontend disk: {len(runs)} runs, {reads} reads, {calls} doorbells "
               f"({per_read} per read), {per_call} ns each")
    low, high = DOORBELLS_PER_READ
    c.check(per_read is not None and low <= per_read <= high
            and per_call is not None and 10 <= per_call <= 1e7,
            f"xen: the frontend's reads ring the doorbell: {calls} calls for {reads} reads "
            f"({per_read} per read), {per_call} ns per call")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--virtgap", default=os.path.join(vmtest.ROOT, "target", "release", "virtgap"))
    p.add_argument("--cache", default=os.path.join(vmtest.ROOT, "target", "vmtest"))
    p.add_argument("--keep", action="store_true", help="keep the run directory")
    p.add_argument("--runs", type=int, default=3, help="runs per side (the diff's replicates)")
    args = p.parse_args()
    if not os.access(args.virtgap, os.X_OK):
        sys.exit(f"vmtest-xen: no virtgap binary at {args.virtgap}; run `just build` first")
    for name in ["qemu-system-x86_64", "cpio", "modprobe", "depmod", "dpkg-deb"]:
        if not vmtest.tool(name):
            sys.exit(f"vmtest-xen: {name} not found; `./setup.sh vmtest` installs what the tier needs")
    os.makedirs(os.path.join(args.cache, "runs"), exist_ok=True)
    kernel = vmtest.resolve_kernel(SERIES, args.cache, None)
    xen_elf = xen_hypervisor(args.cache)
    work = tempfile.mkdtemp(prefix="xen-", dir=os.path.join(args.cache, "runs"))
    initrd = build_initramfs(kernel, args.virtgap, work, args.runs, xen_tools(args.cache))
    c = vmtest.Checks("xen")
    profiles, outputs = {}, {}
    for side, elf in [("xen", xen_elf), ("bare", None)]:
        vmtest.log(f"{side}: booting {kernel.version}{' as Xen dom0' if elf else ' bare'}")
        console, outputs[side] = boot(kernel, initrd, os.path.join(work, side), elf)
        profiles[side] = check(c, side, console, outputs[side], args.virtgap)
    xen, bare = profiles["xen"], profiles["bare"]
    if xen:
        hv = (xen.get("hypervisor") or {}).get("hypervisor")
        c.check(hv == "xen", f"xen: dom0's profile says it runs on {hv!r}")
        # Each Xen path called, with a time per call between 10 ns and 10 ms (TCG is slow,
        # but a figure outside that is no call's).
        for mech, symbols in [
            ("ipi", ["xen_send_IPI_one"]),
            ("timer", ["xen_vcpuop_set_next_event", "clockevents_program_event"]),
            ("upcall", ["xen_hvm_evtchn_do_upcall", "xen_evtchn_do_upcall"]),
            ("interrupt_delivery", ["eoi_pirq"]),
        ]:
            found = timed_path(xen, mech, symbols)
            c.check(found is not None and found[1] > 0
                    and found[2] is not None and 10 <= found[2] <= 1e7,
                    f"xen: {mech} called and timed at {symbols}: {found}")
        # Handlers run inside the upcall get frames of their own, left out of its time.
        pv = next((f for f in (xen.get("capabilities") or {}).get("families", [])
                   if f.get("family") == "pv_paths"), {})
        c.check(pv and not pv.get("fallback"),
                f"xen: nested IRQ handlers left out of the paths' times ({pv.get('fallback')!r})")
        # Lock kicks go out through the IPI sender on their own vector (its value read from
        # the kernel's BTF): those calls are timed as the kick's, not as IPIs.
        kick_send = "xen_send_IPI_one:XEN_SPIN_UNLOCK_VECTOR"
        split = next((t for t in pv.get("tracepoints", []) if t.get("tracepoint") == kick_send), {})
        c.check(split.get("attached") is not None,
                f"xen: the IPI sender's lock-kick calls timed apart: {split}")
        kicks = timed_path(xen, "spinlock_kick", [kick_send])
        vmtest.log(f"xen: lock kicks sent on the kick vector: {kicks}")
        # The doorbell (a frontend's kick to its backend) is the function the IPI sender sends
        # through: timed, with the calls made inside the sender left to the IPIs. dom0 here runs
        # no frontend, so its doorbell calls are far fewer than the IPIs.
        doorbell = next((t for t in pv.get("tracepoints", [])
                         if t.get("tracepoint") == "notify_remote_via_irq"), {})
        c.check(doorbell.get("attached") is not None,
                f"xen: the frontends' doorbell timed at notify_remote_via_irq: {doorbell}")
        notify = timed_path(xen, "device_notify", ["notify_remote_via_irq"])
        ipi = timed_path(xen, "ipi", ["xen_send_IPI_one"])
        c.check(notify is not None and ipi is not None and notify[1] < max(ipi[1] / 2, 1),
                f"xen: the IPIs' sends are not counted as doorbells: doorbell {notify}, IPIs {ipi}")
    if xen:
        check_frontend(c, outputs["xen"])
    if bare:
        hv = (bare.get("hypervisor") or {}).get("hypervisor")
        c.check(hv == "none", f"bare: the profile says {hv!r}, no hypervisor")
        # Metal times the native callers a guest's paths share: the timer programming here.
        found = timed_path(bare, "timer", ["clockevents_program_event"])
        c.check(found is not None and found[1] > 0
                and found[2] is not None and 10 <= found[2] <= 1e7,
                f"bare: native timer programming timed at clockevents_program_event: {found}")
    bare_path = os.path.join(work, "bare", "out", "profile.json")
    if xen and bare:
        d = diff(c, args.virtgap, "bare xen", bare_path, os.path.join(work, "xen", "out", "profile.json"),
                 os.path.join(work, "diff.txt"))
        block = d.get("hypervisor", {})
        c.check(block.get("a") == "none" and block.get("b") == "xen",
                f"the diff's hypervisor block: A {block.get('a')!r}, B {block.get('b')!r}")
        rows = {r.get("metric"): r for r in block.get("rows", [])}
        for metric in ["ipi_per_io", "upcall_per_io", "timer_per_io", "hypervisor_time_per_io"]:
            c.check(metric in rows, f"the diff compares {metric} ({sorted(rows)})")
        # Both timed the timer at clockevents_program_event: the row compares the two hosts'
        # figures (Xen's excess over the native work), not Xen's figure against none.
        timer = rows.get("timer_time_per_io") or {}
        c.check(timer.get("a") is not None and timer.get("verdict") != "no_hypervisor",
                f"the timer's time compared with metal's native time: A {timer.get('a')}, "
                f"B {timer.get('b')}, {timer.get('verdict')}")
        # Every row has an interval: against metal's native figure, or the guest's own runs'.
        bare_points = [m for m, r in rows.items() if r.get("ci_low") is None or r.get("ci_high") is None]
        c.check(not bare_points, f"every hypervisor row has an interval (not: {bare_points})")
        total = rows.get("hypervisor_time_per_io") or {}
        c.check(total.get("share") is not None,
                f"the hypervisor's share of the gap: {total.get('share')} "
                f"[{total.get('share_low')}, {total.get('share_high')}]")
    front = os.path.join(work, "xen", "out", "frontend.json")
    if bare and os.path.exists(front):
        # The same reads through a Xen frontend's disk, against metal's: the doorbell's row.
        d = diff(c, args.virtgap, "bare frontend", bare_path, front, os.path.join(work, "diff-frontend.txt"))
        rows = {r.get("metric"): r for r in d.get("hypervisor", {}).get("rows", [])}
        kicks = rows.get("device_notify_per_io") or {}
        low, high = DOORBELLS_PER_READ
        c.check(kicks.get("b") is not None and low <= kicks["b"] <= high
                and kicks.get("ci_low") is not None and kicks.get("ci_high") is not None,
                f"the frontend's doorbells per I/O against metal, with an interval: B {kicks.get('b')} "
                f"[{kicks.get('ci_low')}, {kicks.get('ci_high')}], {kicks.get('verdict')}")
        kick_time = rows.get("device_notify_time_per_io") or {}
        c.check(kick_time.get("b") is not None and kick_time["b"] > 0,
                f"the frontend's doorbell time per I/O: B {kick_time.get('b')} ns")
    if args.keep or c.failures:
        vmtest.log(f"xen: kept {work} (console.log, out/, diff.txt per side)")
    else:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nvmtest-xen: {c.passed} passed, {len(c.failures)} failed")
    sys.exit(1 if c.failures else 0)


if __name__ == "__main__":
    main()
