#!/usr/bin/env python3
"""The hostile-input sweep (issue 31, and the earlier sweep's cases that hold) as a script: each
case runs the release binary against one hostile input or fault and prints one line,
`ok   CASE` or `DEFECT CASE: what happened`, then a count. Exits 1 when any case says DEFECT
(or, under CI, was skipped for a missing tool), 2 when not run as root.

Every case builds its own fixtures in a temp dir and removes them whatever happens: loop devices
over files it creates (an ext4 filesystem mounted read-only on one of them, whose image is
checksummed before and after to prove nothing was written), tmpfs and ramfs mounts, memory
cgroups, FIFOs. Races are widened with `strace -e inject=...:delay_exit=...` and the path is
swapped while the syscall is held. Every virtgap child runs under a memory limit (RLIMIT_AS, or
a memory cgroup where the memory is not the process's own), and with a timeout: a hang is a
DEFECT, never a hung script. Needs root (loop devices, mounts, cgroups, the probes), strace and
e2fsprogs. Python standard library only.

    scripts/hostile.py [--virtgap BIN] [--only REGEX[,REGEX...]] [--list] [--verbose]
"""

import argparse
import fcntl
import glob
import hashlib
import json
import os
import pty
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30
MIB = 1 << 20
BLKFLSBUF = 0x1261
# Fast settings for runs whose workload is not the point.
FAST = ["--no-probes", "--engine", "null", "--size", "4MiB", "--duration", "1s"]
# The same on an existing --target (read, not written): no temp file to fill and sync first.
NO_FILL = ["--no-probes", "--engine", "null", "--duration", "1s"]
# What every virtgap child may map at most, unless a case says otherwise: a regression that
# reads or allocates without bound fails here instead of taking the host down.
DEFAULT_AS = 4 * GIB
ESC = b"\x1b"


class Defect(Exception):
    """The case saw virtgap misbehave; the message says how."""


class Skip(Exception):
    """The case cannot run here (a missing tool or kernel feature); the message says why."""


# --- running processes -----------------------------------------------------------------------

class Proc:
    """A child in its own process group, its output collected by threads as it comes."""

    def __init__(self, argv, *, cwd, env=None, stdin=None, stdout=None, stderr=None,
                 limit_as=DEFAULT_AS, cgroup=None):
        self.argv = argv
        # The limits are set by a shell that then execs the child (same pid): no preexec_fn,
        # which is unsafe beside the reader threads.
        setup = []
        if limit_as:
            setup.append(f"ulimit -v {limit_as // 1024} || exit 125")
        if cgroup:
            setup.append(f"echo $$ > {shlex.quote(cgroup.procs)} || exit 125")
        if setup:
            argv = ["/bin/sh", "-c", "; ".join(setup + ['exec "$@"']), "sh", *argv]
        self.started = time.monotonic()
        self.out, self.err = bytearray(), bytearray()
        self.rc = None
        self.maxrss_kib = 0
        self.secs = None
        self.timed_out = False
        self.p = subprocess.Popen(
            argv, cwd=cwd, env=env, start_new_session=True,
            stdin=subprocess.DEVNULL if stdin is None else stdin,
            stdout=subprocess.PIPE if stdout is None else stdout,
            stderr=subprocess.PIPE if stderr is None else stderr)
        self.pid = self.p.pid
        self.readers = []
        for stream, buf in ((self.p.stdout, self.out), (self.p.stderr, self.err)):
            if stream is not None:
                t = threading.Thread(target=self._drain, args=(stream, buf), daemon=True)
                t.start()
                self.readers.append(t)

    @staticmethod
    def _drain(stream, buf):
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk:
                break
            buf.extend(chunk)

    def running(self):
        return self.rc is None and not self._reap(os.WNOHANG)

    def _reap(self, flags):
        try:
            pid, status, usage = os.wait4(self.pid, flags)
        except ChildProcessError:
            return True
        if pid == 0:
            return False
        self.rc = os.waitstatus_to_exitcode(status)
        self.p.returncode = self.rc
        self.maxrss_kib = usage.ru_maxrss
        self.secs = time.monotonic() - self.started
        return True

    def wait_for(self, pattern, timeout):
        """Waits until stderr matches `pattern` (bytes regex); False if it exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, bytes(self.err)):
                return True
            if not self.running():
                return bool(re.search(pattern, bytes(self.err)))
            time.sleep(0.01)
        return False

    def signal(self, sig):
        if self.rc is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill_group(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def finish(self, timeout):
        """Waits up to `timeout` s; past it the whole process group is killed (timed_out)."""
        deadline = self.started + timeout if self.rc is None else 0
        while self.rc is None:
            if self._reap(os.WNOHANG):
                break
            if time.monotonic() > deadline:
                self.timed_out = True
                self.kill_group()
                self._reap(0)
                break
            time.sleep(0.01)
        # Anything the child left in its group (a grandchild) goes too.
        self.kill_group()
        for t in self.readers:
            t.join(timeout=5)
        for s in (self.p.stdout, self.p.stderr):
            if s is not None:
                s.close()
        return self

    @property
    def text(self):
        return (bytes(self.out) + bytes(self.err)).decode(errors="replace")

    @property
    def errtext(self):
        return bytes(self.err).decode(errors="replace").strip()

    def says(self):
        """The child's stderr in a few words, for a DEFECT line."""
        lines = [l for l in self.errtext.splitlines() if l.strip() and not l.startswith("strace: ")]
        tail = lines[-1] if lines else "(nothing on stderr)"
        return f"exit {self.rc}{' (timed out)' if self.timed_out else ''}, said {tail[:160]!r}"


def panicked(r):
    return r.rc == 101 or b"panicked" in bytes(r.err)


def killed(r):
    return r.rc is not None and (r.rc < 0 or r.rc in (134, 137))


def expect_one_line_refusal(r, what, within=None):
    if r.timed_out:
        raise Defect(f"{what}: still running after {r.secs:.0f} s (killed)")
    if panicked(r):
        raise Defect(f"{what}: panicked ({r.says()})")
    if killed(r):
        raise Defect(f"{what}: killed ({r.says()}, peak RSS {r.maxrss_kib // 1024} MiB)")
    if r.rc == 0:
        raise Defect(f"{what}: accepted (exit 0)")
    lines = [l for l in r.errtext.splitlines() if l.strip()]
    if len(lines) != 1:
        raise Defect(f"{what}: {len(lines)} lines on stderr, not one: {r.errtext[:200]!r}")
    if within is not None and r.secs > within:
        raise Defect(f"{what}: refused only after {r.secs:.1f} s")


def no_escapes(r, what):
    for name, buf in (("stdout", r.out), ("stderr", r.err)):
        i = bytes(buf).find(ESC)
        if i >= 0:
            around = bytes(buf)[max(0, i - 40):i + 20].decode(errors="replace")
            raise Defect(f"{what}: a raw ESC on {name}: ...{around!r}")
        if b"\x07" in bytes(buf) or b"\x9b" in bytes(buf):
            raise Defect(f"{what}: a raw BEL or CSI byte on {name}")


def sh(*argv, check=True, timeout=120, input=None):
    """A helper tool (losetup, mount, mkfs): its stdout, or an exception naming its stderr."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()[:200]}")
    return r.stdout.strip()


def need_tool(*names):
    for n in names:
        if shutil.which(n) is None:
            raise Skip(f"{n} is not installed (setup.sh installs it)")


# --- fixtures ----------------------------------------------------------------------------------

def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def flush_devices(devs):
    """Pushes every dirty page of these block devices down to their backing files."""
    os.sync()
    for dev in devs:
        try:
            fd = os.open(dev, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.ioctl(fd, BLKFLSBUF)
        except OSError:
            pass
        finally:
            os.close(fd)
    os.sync()


def write_random(path, size):
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, MIB)
            f.write(os.urandom(n))
            left -= n


def is_profile(path):
    try:
        with open(path, "rb") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "schema_version" in doc and "runs" in doc


def named_profiles(text, cwd):
    """Files named on stderr that hold a profile (a run's result saved somewhere else)."""
    found = []
    for token in re.split(r"[\s'\"`,;()]+", text):
        token = token.rstrip(".:")
        if not token:
            continue
        path = token if os.path.isabs(token) else os.path.join(cwd, token)
        if os.path.isfile(path) and is_profile(path):
            found.append(path)
    return found


class Cgroup:
    """A memory cgroup of our own (v2, or v1's memory hierarchy), removed at the end."""

    def __init__(self, limit):
        self.path = None
        self.v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
        name = f"vg-hostile-{os.getpid()}-{time.monotonic_ns()}"
        try:
            if self.v2:
                # Children of the root cgroup: it holds processes and still has children.
                with open("/sys/fs/cgroup/cgroup.subtree_control") as f:
                    if "memory" not in f.read().split():
                        raise Skip("the root cgroup does not enable the memory controller")
                path = os.path.join("/sys/fs/cgroup", name)
                os.mkdir(path)
                self.path = path
                self._write("memory.max", str(limit))
                self._write("memory.swap.max", "0", optional=True)
            else:
                path = os.path.join(self._v1_base(), name)
                os.mkdir(path)
                self.path = path
                self._write("memory.limit_in_bytes", str(limit))
                self._write("memory.memsw.limit_in_bytes", str(limit), optional=True)
        except OSError as e:
            self.remove()
            raise Skip(f"cannot make a memory cgroup: {e}")

    @staticmethod
    def _v1_base():
        mount = None
        with open("/proc/mounts") as f:
            for line in f:
                dev, where, fstype, opts = line.split()[:4]
                if fstype == "cgroup" and "memory" in opts.split(","):
                    mount = where
        if mount is None:
            raise Skip("no memory cgroup (neither v2 nor v1's memory hierarchy)")
        own = "/"
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                if "memory" in ctrls.split(","):
                    own = path
        return os.path.join(mount, own.lstrip("/"))

    def _write(self, name, value, optional=False):
        try:
            with open(os.path.join(self.path, name), "w") as f:
                f.write(value)
        except OSError:
            if not optional:
                raise

    @property
    def procs(self):
        return os.path.join(self.path, "cgroup.procs")

    def oom_killed(self):
        for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
            try:
                with open(os.path.join(self.path, name)) as f:
                    for line in f:
                        k, _, v = line.partition(" ")
                        if k == key and int(v) > 0:
                            return True
            except (OSError, ValueError):
                continue
        return False

    def remove(self):
        if not self.path:
            return
        for _ in range(50):
            try:
                with open(os.path.join(self.path, "cgroup.procs")) as f:
                    pids = [int(p) for p in f.read().split()]
            except OSError:
                pids = []
            for pid in pids:
                # Only what this script put there: its own children.
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


class Case:
    """One case's context: its temp dir, the virtgap binary, and what must be undone."""

    def __init__(self, suite, name):
        self.suite = suite
        self.vgbin = suite.vg
        self.dir = tempfile.mkdtemp(prefix=f"{name}-", dir=suite.scratch)
        self.undo = []
        self.procs = []
        self.env = dict(os.environ, TMPDIR=self.dir, NO_COLOR="1")
        self.env.pop("VIRTGAP_SKIP_LOG", None)

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def spawn(self, argv, **kw):
        kw.setdefault("cwd", self.dir)
        kw.setdefault("env", self.env)
        p = Proc(argv, **kw)
        self.procs.append(p)
        return p

    def start(self, *args, **kw):
        """virtgap with these arguments, running."""
        return self.spawn([self.vgbin, *args], **kw)

    def vg(self, *args, timeout=60, **kw):
        """virtgap with these arguments, finished (or killed after `timeout` s)."""
        return self.start(*args, **kw).finish(timeout)

    def cleanup(self):
        for p in self.procs:
            if p.rc is None:
                p.finish(0)
        for fn in reversed(self.undo):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - undo the rest whatever one of them says
                print(f"    (cleanup: {e})", file=sys.stderr)
        shutil.rmtree(self.dir, ignore_errors=True)

    # Fixtures, each undone by cleanup().

    def file(self, name, size=16 * MIB):
        p = self.path(name)
        write_random(p, size)
        return p

    def loop(self, backing):
        need_tool("losetup")
        try:
            dev = sh("losetup", "-f", "--show", backing)
        except RuntimeError as e:
            raise Skip(f"no loop device: {e}")
        self.undo.append(lambda: sh("losetup", "-d", dev, check=False))
        return dev

    def mount(self, source, where, *opts):
        os.makedirs(where, exist_ok=True)
        try:
            sh("mount", *opts, source, where)
        except RuntimeError as e:
            raise Skip(f"cannot mount: {e}")

        def unmount():
            sh("umount", where, check=False)
            if os.path.ismount(where):
                sh("umount", "-l", where, check=False)
        self.undo.append(unmount)
        return where

    def mounted_ext4(self, size=32 * MIB):
        """An ext4 image on a loop device, mounted read-only: (image, device, mountpoint)."""
        need_tool("mkfs.ext4", "fsck.ext4")
        img = self.path("fs.img")
        with open(img, "wb") as f:
            f.truncate(size)
        sh("mkfs.ext4", "-q", "-F", img)
        dev = self.loop(img)
        mnt = self.mount(dev, self.path("mnt"), "-o", "ro")
        return img, dev, mnt

    def fs_damage(self, img, dev, devs, before):
        """None when the image is byte for byte what it was; else what fsck says of it."""
        flush_devices(devs)
        if sha256_file(img) == before:
            return None
        sh("umount", self.path("mnt"), check=False)
        r = subprocess.run(["fsck.ext4", "-fn", dev], capture_output=True, text=True)
        verdict = "fsck finds it clean" if r.returncode == 0 else \
            f"fsck.ext4 -fn exit {r.returncode}: {(r.stdout + r.stderr).strip().splitlines()[0][:100]}"
        return f"the mounted filesystem's image changed ({verdict})"

    def cgroup(self, limit):
        cg = Cgroup(limit)
        self.undo.append(cg.remove)
        return cg

    def profile(self):
        """A copy of the suite's small profile (recorded once with --no-probes --engine null)."""
        p = self.path(f"p{len(os.listdir(self.dir))}.json")
        shutil.copyfile(self.suite.base_profile(), p)
        return p

    def fifo(self, name):
        p = self.path(name)
        os.mkfifo(p)
        return p


# --- BPF objects -------------------------------------------------------------------------------

def bpftool_json(*args):
    try:
        r = subprocess.run(["bpftool", "-j", *args], capture_output=True, text=True, timeout=30)
        return json.loads(r.stdout or "[]") if r.returncode == 0 else []
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []


def virtgap_bpf_names():
    """Program and map names declared in bpf/*.bpf.c (maps cut to the kernel's 15 characters),
    and the prefixes of libbpf's internal maps (`block_bp.rodata`)."""
    progs, maps, prefixes = set(), set(), set()
    for path in glob.glob(os.path.join(REPO, "bpf", "*.bpf.c")):
        with open(path) as f:
            text = f.read()
        maps.update(n[:15] for n in re.findall(r"\}\s*(\w+)\s+SEC\(\"\.maps\"\)", text))
        for m in re.finditer(r"SEC\(\"[^\".]+[^\"]*\"\)\s*\n\s*int\s+(?:BPF_\w+\()?(\w+)", text):
            progs.add(m.group(1))
        prefixes.add(os.path.basename(path).replace(".bpf.c", "_bpf")[:8])
    return progs, maps, prefixes


def held_bpf_ids():
    """Ids of the BPF programs, maps and links some process holds open (from fdinfo)."""
    held = {"prog": set(), "map": set(), "link": set()}
    for info in glob.glob("/proc/[0-9]*/fdinfo/*"):
        try:
            with open(info) as f:
                for line in f:
                    for kind in held:
                        if line.startswith(f"{kind}_id:"):
                            held[kind].add(int(line.split()[1]))
        except OSError:
            continue
    return held


def virtgap_bpf_objects():
    """(kind, id, name) of every loaded program, map and link that is virtgap's by name."""
    progs, maps, prefixes = virtgap_bpf_names()
    internal = re.compile(r"^(%s)\.(rodata|bss|data|kconfig)" % "|".join(map(re.escape, prefixes)))
    found, prog_ids = set(), set()
    for p in bpftool_json("prog", "show"):
        if p.get("name") in progs or any(p.get("name", "").startswith(n[:15]) for n in progs
                                           if len(n) > 15):
            found.add(("prog", p["id"], p["name"]))
            prog_ids.add(p["id"])
    for m in bpftool_json("map", "show"):
        name = m.get("name", "")
        if name in maps or internal.match(name):
            found.add(("map", m["id"], name))
    for link in bpftool_json("link", "show"):
        if link.get("prog_id") in prog_ids:
            found.add(("link", link["id"], f"prog {link.get('prog_id')}"))
    return found


def orphaned(objects):
    """Those of `objects` no live process holds, directly or through a link or program."""
    held = held_bpf_ids()
    reach_progs, reach_maps = set(held["prog"]), set(held["map"])
    links = {l["id"]: l for l in bpftool_json("link", "show")}
    for lid in held["link"]:
        if lid in links and "prog_id" in links[lid]:
            reach_progs.add(links[lid]["prog_id"])
    for p in bpftool_json("prog", "show"):
        if p["id"] in reach_progs:
            reach_maps.update(p.get("map_ids", []))
    out = set()
    for kind, oid, name in objects:
        reach = {"prog": reach_progs, "map": reach_maps, "link": held["link"]}[kind]
        if oid not in reach:
            out.add((kind, oid, name))
    return out


# --- the cases ---------------------------------------------------------------------------------

CASES = []


def case(name, item, *, probes=False):
    """Registers a case: `item` is the issue's list number it reproduces ("sweep" for the
    earlier sweep's fixed cases that must still hold)."""
    def register(fn):
        CASES.append((name, item, probes, fn))
        return fn
    return register


def strace_race(c, path, argv, swap, timeout=90):
    """Runs virtgap under strace, each statx/stat/open of `path` held 1.5 s after it returns,
    and calls swap() while the first one is held. Returns (the finished run, swapped?)."""
    need_tool("strace")
    log = c.path("strace.log")
    calls = "statx,newfstatat,openat,openat2"
    p = c.spawn(["strace", "-f", "-qq", "-o", log, "-P", path, "-e", f"trace={calls}",
                 "-e", f"inject={calls}:delay_exit=1500000", c.vgbin, *argv])
    swapped = False
    deadline = time.monotonic() + timeout
    while not swapped and p.running() and time.monotonic() < deadline:
        try:
            with open(log, errors="replace") as f:
                if path in f.read():
                    swap()
                    swapped = True
        except FileNotFoundError:
            pass
        time.sleep(0.005)
    return p.finish(timeout), swapped


def replace_with_symlink(path, dest):
    tmp = path + ".swap"
    os.symlink(dest, tmp)
    os.rename(tmp, path)


# Item 1: targets checked by path, then reopened by path.

@case("target-swapped-for-mounted-fs", 1)
def _(c):
    img, dev, _ = c.mounted_ext4()
    t = c.file("t.img")
    before = sha256_file(img)
    r, swapped = strace_race(
        c, t, ["record", "--no-probes", "-q", "-d", "2s", "-w", "rand4k-write",
               "--target", t, "--destroy-data", t],
        lambda: replace_with_symlink(t, dev))
    damage = c.fs_damage(img, dev, [dev], before)
    if damage:
        raise Defect(f"t.img swapped for a symlink to {dev} (ext4 mounted) during the held "
                     f"syscall: {damage}; virtgap {r.says()}")
    if not swapped:
        raise Defect(f"virtgap never touched {t} where strace could hold it ({r.says()})")
    if panicked(r):
        raise Defect(f"panicked: {r.says()}")


@case("target-device-swapped-for-another", 1)
def _(c):
    a, b = c.file("a.img"), c.file("b.img")
    dev_a, dev_b = c.loop(a), c.loop(b)
    link = c.path("dev")
    os.symlink(dev_a, link)
    before = sha256_file(b)
    r, swapped = strace_race(
        c, link, ["record", "--no-probes", "-q", "-d", "2s", "-w", "rand4k-write",
                  "--target", link, "--destroy-data", a],
        lambda: replace_with_symlink(link, dev_b))
    flush_devices([dev_a, dev_b])
    if sha256_file(b) != before:
        named = re.search(r"target: (\S+)", r.out.decode(errors="replace"))
        raise Defect(f"the link swapped from {dev_a} to {dev_b} during the held syscall: "
                     f"{dev_b} was written while the summary names "
                     f"{named.group(1) if named else '?'} ({r.says()})")
    if not swapped:
        raise Defect(f"virtgap never touched {link} where strace could hold it ({r.says()})")


# Item 2: loop devices not followed to what backs them.

@case("loop-device-over-mounted-loop-device", 2)
def _(c):
    img, dev, _ = c.mounted_ext4()
    upper = c.loop(dev)
    before = sha256_file(img)
    r = c.vg("record", "--no-probes", "-q", "-d", "1s", "-w", "rand4k-write",
             "--target", upper, "--destroy-data", dev)
    damage = c.fs_damage(img, dev, [upper, dev], before)
    if damage or r.rc == 0:
        raise Defect(f"--target {upper} (a loop device over {dev}, mounted) --destroy-data "
                     f"{dev}: {r.says()}; {damage or 'the image is unchanged'}")


@case("backing-file-of-mounted-loop-device", 2)
def _(c):
    img, dev, _ = c.mounted_ext4()
    before = sha256_file(img)
    r = c.vg("record", "--no-probes", "-q", "-d", "1s", "-w", "rand4k-write",
             "--target", img, "--destroy-data", img)
    damage = c.fs_damage(img, dev, [dev], before)
    if damage or r.rc == 0:
        raise Defect(f"--target {os.path.basename(img)} (backing {dev}, mounted): {r.says()}; "
                     f"{damage or 'the image is unchanged'}")


# Item 3: diff's outputs replaced without --force.

@case("diff-csv-replaces-its-input", 3)
def _(c):
    a, b = c.profile(), c.profile()
    before = sha256_file(a)
    r = c.vg("diff", a, b, "--csv", a)
    if sha256_file(a) != before:
        raise Defect(f"diff A B --csv A replaced the input A ({r.says()})")
    if r.rc == 0:
        raise Defect("diff A B --csv A exit 0 without writing the CSV")


@case("diff-csv-replaces-a-file-without-force", 3)
def _(c):
    a, b = c.profile(), c.profile()
    mine = c.path("mine.csv")
    with open(mine, "w") as f:
        f.write("mine\n")
    r = c.vg("diff", a, b, "--csv", mine)
    with open(mine) as f:
        if f.read() != "mine\n":
            raise Defect(f"diff --csv over an existing file replaced it without --force ({r.says()})")


@case("diff-svg-replaces-files-without-force", 3)
def _(c):
    a, b = c.profile(), c.profile()
    d = c.path("svg")
    os.mkdir(d)
    with open(os.path.join(d, "waterfall.svg"), "w") as f:
        f.write("mine\n")
    r = c.vg("diff", a, b, "--svg", d)
    with open(os.path.join(d, "waterfall.svg")) as f:
        if f.read() != "mine\n":
            raise Defect(f"diff --svg DIR replaced DIR/waterfall.svg without --force ({r.says()})")


@case("diff-html-overwrites-an-input-profile", 3)
def _(c):
    a, b = c.profile(), c.profile()
    with open(a, "rb") as f:
        before = f.read()
    r = c.vg("diff", a, b, "--html", a, "--overwrite")
    with open(a, "rb") as f:
        if f.read() != before:
            raise Defect(f"diff --html A --overwrite replaced input profile A ({r.says()})")
    if r.rc == 0:
        raise Defect("diff --html naming an input profile succeeded")


@case("iotune-output-over-its-target", 3)
def _(c):
    data = c.file("data.bin", 16 * MIB)
    with open(data, "rb") as f:
        before = f.read()
    r = c.vg("iotune", "--target", data, "--destroy-data", data, "-o", data, "--force",
             "--phases", "write_iops", "--runs", "1", "--step", "200ms", "--duration", "300ms",
             "--no-probes")
    with open(data, "rb") as f:
        if f.read() != before:
            raise Defect(f"iotune -o naming its own target wrote over it ({r.says()})")
    if r.rc == 0:
        raise Defect("iotune -o naming its own target succeeded")


# Item 4: profiles lost.

def sync_held_run(c, argv, out_dir, hold_s=4.0, prefix=()):
    """virtgap under strace with fsync/fdatasync held `hold_s` s after they return. Returns the
    process and, once it is held in a sync of a file in `out_dir` (the output being written),
    the thread's id (None if it never got there)."""
    need_tool("strace")
    log = c.path(f"sync-{len(c.procs)}.log")
    p = c.spawn(["strace", "-f", "-qq", "-y", "-o", log, "-e", "trace=fsync,fdatasync",
                 "-e", f"inject=fsync,fdatasync:delay_exit={int(hold_s * 1e6)}",
                 *prefix, c.vgbin, *argv])
    held = re.compile(r"^(\d+) +f(?:data)?sync\(\d+<%s/" % re.escape(out_dir), re.M)
    deadline = time.monotonic() + 60
    while p.running() and time.monotonic() < deadline:
        try:
            with open(log, errors="replace") as f:
                m = held.search(f.read())
        except FileNotFoundError:
            m = None
        if m:
            return p, int(m.group(1))
        time.sleep(0.005)
    return p, None


@case("same-pid-in-two-namespaces", 4)
def _(c):
    need_tool("unshare")
    out_dir = c.path("out")
    os.mkdir(out_dir)
    out = os.path.join(out_dir, "shared.json")
    ns = ["unshare", "--pid", "--fork", "--mount-proc"]
    # Existing targets, read: no temp file to fill, so the first syncs are the profile's.
    args = lambda t: ["record", *NO_FILL, "--target", c.file(t, 4 * MIB), "-o", out]
    a, held = sync_held_run(c, args("a.img"), out_dir, prefix=ns)
    if held is None:
        raise Defect(f"run A never reached its profile's sync ({a.finish(5).says()})")
    b = c.spawn([*ns, c.vgbin, *args("b.img")]).finish(60)
    a.finish(60)
    lost = []
    if not is_profile(out):
        lost.append("shared.json holds no profile")
    for who, r in (("A", a), ("B", b)):
        if r.rc != 0 and not named_profiles(r.errtext, c.dir):  # kept aside, and said where
            lost.append(f"{who} {r.says()} and saved its profile nowhere")
    if lost:
        raise Defect("two runs as pid 1 of their namespaces with -o shared.json: " + "; ".join(lost))


@case("full-filesystem-at-the-end", 4)
def _(c):
    full = c.mount("tmpfs", c.path("full"), "-t", "tmpfs", "-o", "size=64k")
    p = c.start("record", *FAST, "-o", os.path.join(full, "p.json"),
                "--csv", os.path.join(full, "csv"))
    # Full from the workload's start on: the outputs' checks up front saw room.
    if p.wait_for(rb"running ", 60):
        fd = os.open(os.path.join(full, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
    r = p.finish(60)
    problems = []
    if b"IOPS" not in bytes(r.out):
        problems.append("no summary on stdout")
    if not [p for p in named_profiles(r.errtext, c.dir) if not p.startswith(full)]:
        problems.append("the profile saved nowhere that stderr names")
    if panicked(r) or killed(r):
        problems.append("crashed")
    if problems:
        raise Defect(f"-o and --csv on a tmpfs full by the run's end: {', '.join(problems)} "
                     f"({r.says()})")


@case("output-dir-with-trailing-slash-refused-up-front", 4)
def _(c):
    r = c.vg("record", "--no-probes", "--engine", "null", "--size", "4MiB", "-d", "5s",
             "-q", "-o", c.path("newdir") + "/")
    if r.rc == 0:
        raise Defect("-o newdir/ accepted (exit 0)")
    if r.secs > 1.0:
        raise Defect(f"-o newdir/ failed only after {r.secs:.1f} s (the 5 s run): {r.says()}")


@case("output-in-missing-dir-refused-up-front", 4)
def _(c):
    r = c.vg("record", "--no-probes", "--engine", "null", "--size", "4MiB", "-d", "5s",
             "-q", "-o", c.path("newdir", "p.json"))
    if r.rc == 0:
        raise Defect("-o newdir/p.json accepted (exit 0)")
    if r.secs > 1.0:
        raise Defect(f"-o newdir/p.json failed only after {r.secs:.1f} s: {r.says()}")


@case("act-log-same-file-as-output", 4)
def _(c):
    x = c.path("X")
    r = c.vg("record", "-w", "kv-act", "--no-probes", "--size", "64MiB", "-d", "1s", "-q",
             "-o", x, "--act-log", x, "--force", timeout=120)
    if r.rc == 0:
        kept = "the profile" if is_profile(x) else "the ACT log"
        raise Defect(f"-o X --act-log X --force: exit 0, X holds only {kept}")
    if r.secs > 1.0:
        raise Defect(f"-o X --act-log X refused only after {r.secs:.1f} s ({r.says()})")


@case("csv-dir-holds-the-output", 4)
def _(c):
    d = c.path("D")
    os.mkdir(d)
    r = c.vg("record", *FAST, "-q", "-o", os.path.join(d, "summary.csv"), "--csv", d, "--force")
    if r.rc == 0:
        kept = "the profile" if is_profile(os.path.join(d, "summary.csv")) else "the CSV"
        raise Defect(f"-o D/summary.csv --csv D --force: exit 0, summary.csv holds only {kept}")
    if r.secs > 1.0:
        raise Defect(f"-o D/summary.csv --csv D refused only after {r.secs:.1f} s ({r.says()})")


@case("stale-temp-file-of-the-same-pid", 4)
def _(c):
    need_tool("unshare")
    out = c.path("p.json")
    stale = c.path(".p.json.tmp-1")
    with open(stale, "w") as f:
        f.write("left by a run killed earlier\n")
    r = c.spawn(["unshare", "--pid", "--fork", "--mount-proc", c.vgbin, "record", *FAST,
                 "-q", "-o", out]).finish(60)
    if r.rc != 0 or not is_profile(out):
        raise Defect(f"a stale .p.json.tmp-1 beside -o p.json, run as pid 1: {r.says()}")
    if not os.path.exists(stale):
        raise Defect("the run deleted .p.json.tmp-1, a file it did not create")


@case("sigkill-while-writing-leaves-nothing", 4)
def _(c):
    out_dir = c.path("out")
    os.mkdir(out_dir)
    p, tid = sync_held_run(c, ["record", *NO_FILL, "--target", c.file("t.img", 4 * MIB),
                               "-o", os.path.join(out_dir, "p.json")], out_dir)
    if tid is None:
        raise Defect(f"the run never reached its profile's sync ({p.finish(5).says()})")
    os.kill(tid, signal.SIGKILL)
    p.finish(30)
    left = os.listdir(out_dir)
    if left:
        raise Defect(f"SIGKILL while the profile was being written left {', '.join(left)}")


# Item 5: memory that takes the host down.

def unbounded_read(c, argv, what, tty=False):
    kw = dict(limit_as=2 * GIB)
    if tty:
        master, slave = pty.openpty()
        c.undo.append(lambda: os.close(master))
        threading.Thread(target=lambda: drain_fd(master), daemon=True).start()
        kw.update(stdin=slave, stdout=slave)
        p = c.start(*argv, **kw)
        os.close(slave)
    else:
        p = c.start(*argv, **kw)
    r = p.finish(30)
    # Under the 2 GiB limit an unbounded read fails in one line too: what it held tells.
    if r.maxrss_kib > 256 * 1024:
        raise Defect(f"{what}: read {r.maxrss_kib // 1024} MiB before it stopped ({r.says()})")
    expect_one_line_refusal(r, what, within=5)


def drain_fd(fd):
    try:
        while os.read(fd, 65536):
            pass
    except OSError:
        pass


@case("workload-file-dev-zero", 5)
def _(c):
    unbounded_read(c, ["record", "-w", "/dev/zero", "--no-probes"], "record -w /dev/zero")


@case("workload-file-dev-urandom", 5)
def _(c):
    unbounded_read(c, ["record", "-w", "/dev/urandom", "--no-probes"], "record -w /dev/urandom")


@case("tui-workload-file-dev-zero", 5)
def _(c):
    unbounded_read(c, ["tui", "-w", "/dev/zero", "--no-probes"], "tui -w /dev/zero (on a pty)",
                   tty=True)


def mem_total():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 64 * GIB


@case("ramfs-dir-larger-than-memory", 5)
def _(c):
    cg = c.cgroup(256 * MIB)
    ram = c.mount("ramfs", c.path("ram"), "-t", "ramfs")
    size = (mem_total() + GIB) // MIB
    r = c.vg("record", "--no-probes", "--engine", "null", "--buffered", "-d", "1s", "-q", "--dir", ram,
             "--size", f"{size}MiB", cgroup=cg, timeout=60)
    if r.rc == 0 or killed(r) or cg.oom_killed():
        raise Defect(f"--dir on ramfs with --size {size} MiB (over this host's memory), in a "
                     f"256 MiB cgroup: {r.says()}{', OOM-killed' if cg.oom_killed() else ''}")
    expect_one_line_refusal(r, "--dir on ramfs larger than memory", within=5)


@case("memory-cgroup-limit-honoured", 5)
def _(c):
    cg = c.cgroup(64 * MIB)
    r = c.vg("record", "--no-probes", "-q", "-d", "1s", "--size", "4MiB", "--qd", "4096",
             "--bs", "64KiB", cgroup=cg, timeout=60)
    if killed(r) or cg.oom_killed():
        raise Defect(f"--qd 4096 --bs 64KiB (256 MiB of buffers) in a 64 MiB cgroup: "
                     f"{r.says()}, OOM-killed")
    if r.rc != 0:
        expect_one_line_refusal(r, "--qd 4096 --bs 64KiB in a 64 MiB cgroup")


def refused_as_invalid(r):
    """The synthetic profile itself refused: the generator below is behind the validation."""
    if "not a virtgap profile" in r.errtext:
        raise Defect(f"the case's synthetic profile was refused as invalid, so memory was not "
                     f"tested (update big_profile): {r.says()}")


def big_profile(c, name, size):
    """A valid profile of about `size` bytes: a real one's probed intervals, repeated."""
    src = c.suite.probed_profile()
    with open(src) as f:
        p = json.load(f)
    ivs = p["intervals"][1:-1] or p["intervals"]
    per = sum(len(json.dumps(i)) + 2 for i in ivs) / len(ivs)
    n = int(size / per)
    step = p["run"]["interval_s"]
    out = []
    for i in range(n):
        d = dict(ivs[i % len(ivs)])
        d["index"], d["start_s"], d["end_s"] = i, round(i * step, 6), round((i + 1) * step, 6)
        out.append(d)
    p["intervals"] = out
    p["runs"][0]["intervals"] = n
    p["runs"][0]["measured_s"] = p["results"]["measured_s"] = n * step
    path = c.path(name)
    with open(path, "w") as f:
        json.dump(p, f)
    return path


@case("diff-inputs-under-one-budget", 5)
def _(c):
    first = big_profile(c, "big0.json", 100 * MIB)
    paths = [first]
    for i in range(1, 6):
        paths.append(c.path(f"big{i}.json"))
        shutil.copyfile(first, paths[-1])
    cg = c.cgroup(GIB)
    r = c.vg("diff", paths[0], paths[1], "--with-a", paths[2], "--with-a", paths[3],
             "--with-b", paths[4], "--with-b", paths[5], cgroup=cg, limit_as=0, timeout=180)
    total = sum(os.path.getsize(p) for p in paths)
    refused_as_invalid(r)
    if killed(r) or cg.oom_killed():
        raise Defect(f"diff of six 100 MiB profiles ({total // MIB} MiB) in a 1 GiB cgroup: "
                     f"{r.says()}, OOM-killed (peak {r.maxrss_kib // 1024} MiB)")
    if panicked(r) or r.timed_out:
        raise Defect(f"diff of six 100 MiB profiles: {r.says()}")
    if r.rc == 0 and r.maxrss_kib * 1024 > 768 * MIB:
        raise Defect(f"diff of six 100 MiB profiles peaked at {r.maxrss_kib // 1024} MiB RSS")


# Item 6: --fio-equivalent must be a shell command that means what it says.

def fio_tokens(r):
    line = next((l for l in r.out.decode(errors="replace").splitlines() if l.startswith("fio")), None)
    if line is None:
        raise Defect(f"--fio-equivalent printed no fio line ({r.says()})")
    try:
        return shlex.split(line)
    except ValueError as e:
        raise Defect(f"the fio line does not parse as shell words ({e}): {line[:120]}")


@case("fio-equivalent-quotes-the-target", 6)
def _(c):
    name = c.path("x; echo INJECTED #")
    with open(name, "wb") as f:
        f.truncate(16 * MIB)
    r = c.vg("record", "--fio-equivalent", "--target", name)
    tokens = fio_tokens(r)
    if f"--filename={name}" not in tokens and name not in tokens:
        raise Defect(f"--target {os.path.basename(name)!r}: the fio line's words are "
                     f"{[t for t in tokens if 'file' in t or 'echo' in t or 'INJECTED' in t]}")


@case("fio-equivalent-quotes-the-workload-name", 6)
def _(c):
    wl = c.path("x; id #.toml")
    text = sh(c.vgbin, "workloads", "rand4k")
    with open(wl, "w") as f:
        f.write(re.sub(r'(?m)^name = .*$', lambda _: 'name = "x; id #"', text))
    r = c.vg("record", "--fio-equivalent", "-w", wl)
    tokens = fio_tokens(r)
    if "--name=x; id #" not in tokens:
        raise Defect(f"workload named 'x; id #': the fio line's words are "
                     f"{[t for t in tokens if 'name' in t or t in ('id', '#', ';')]}")


# Item 7: panics.

@case("rate-iops-beyond-i64", 7)
def _(c):
    r = c.vg("record", *FAST, "-q", "--rate-iops", "9223372036854775808")
    if panicked(r) or killed(r):
        raise Defect(f"--rate-iops 9223372036854775808: {r.says()}")
    if r.rc != 0:
        expect_one_line_refusal(r, "--rate-iops 9223372036854775808")


@case("closed-stderr-pipe", 7)
def _(c):
    out = c.path("p.json")
    rfd, wfd = os.pipe()
    p = c.start("record", *FAST, "-o", out, stdout=subprocess.DEVNULL, stderr=wfd)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as f:
        f.read(5)
    r = p.finish(60)
    if r.rc == 101 or killed(r) or not is_profile(out):
        raise Defect(f"stderr a pipe closed after 5 bytes: exit {r.rc}, "
                     f"{'a profile' if is_profile(out) else 'no profile'} written")


@case("workloads-into-a-closed-pipe", 7)
def _(c):
    rfd, wfd = os.pipe()
    os.close(rfd)
    r = c.start("workloads", stdout=wfd).finish(30)
    os.close(wfd)
    if panicked(r) or r.errtext:
        raise Defect(f"`workloads | head -0`: exit {r.rc}, stderr {r.errtext[:120]!r}")


# diff --prometheus against a server that answers what no Prometheus would.

def fake_prometheus(c, answer):
    """A local HTTP server answering every query with `answer(query)` (bytes, or a str of
    JSON); its base URL. Stopped with the case."""
    import http.server
    import urllib.parse

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query).get("query", [""])[0]
            body = answer(query)
            body = body.encode() if isinstance(body, str) else body
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    c.undo.append(server.shutdown)
    return f"http://127.0.0.1:{server.server_address[1]}"


def vector(samples):
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [1, value]} for labels, value in samples]}})


@case("diff-prometheus-answers-garbage", "sweep")
def _(c):
    for what, answer in [("an HTML page", lambda q: "<html>not here</html>"),
                         ("an empty body", lambda q: b""),
                         ("a JSON error", lambda q: '{"status":"error","error":"boom"}'),
                         ("a result that is no vector", lambda q: '{"status":"success","data":{"result":7}}')]:
        url = fake_prometheus(c, answer)
        r = c.vg("diff", "--prometheus", url, 'job="a"', 'job="b"', "--since", "10s", "--slice", "5s", timeout=30)
        if r.timed_out or r.rc == 0 or panicked(r) or len(r.errtext.strip().splitlines()) != 1:
            raise Defect(f"diff --prometheus against {what}: {r.says()}")


@case("diff-prometheus-absurd-values", "sweep")
def _(c):
    host = {"__name__": "virtgap_host_info", "instance": "h:1", "job": "a", "hypervisor": "kvm"}
    other = dict(host, instance="h:2", job="b")

    calls = [0]

    def answer(q):
        if q.startswith("max_over_time"):
            return vector([(host if 'job="a"' in q else other, "1")])
        # Each boundary's counters larger than the last, so every slice has increases.
        calls[0] += 1
        grown = lambda v: v if v in ("NaN", "+Inf") else repr(float(v) * calls[0])
        base = {"instance": "h:1", "device": "vda", "op": "read", "stage": "device"}
        bucket = lambda le, v: (dict(base, __name__="virtgap_block_stage_seconds_bucket", le=le), grown(v))
        return vector([
            bucket("abc", "5"), bucket("-1", "3"), bucket("0", "2"), bucket("1e308", "NaN"),
            bucket("+Inf", "1e300"), bucket("0.001", "-7"),
            (dict(base, __name__="virtgap_block_stage_seconds_sum"), "+Inf"),
            (dict(base, __name__="virtgap_block_stage_seconds_count"), grown("1e300")),
            ({"__name__": "virtgap_block_requests_total", "op": "read"}, grown("1e300")),
            ({"__name__": "virtgap_hypervisor_mechanism_events_total", "mechanism": "timer",
              "how": "msr_write"}, grown("1e18")),
            ({"__name__": "virtgap_hypervisor_mechanism_seconds_total", "mechanism": "timer"},
             grown("1e300")),
            ({"__name__": "virtgap_msr_counted_seconds_total"}, "0"),
        ])

    url = fake_prometheus(c, answer)
    r = c.vg("diff", "--prometheus", url, 'job="a"', 'job="b"', "--since", "10s", "--slice", "5s", timeout=30)
    if r.timed_out or panicked(r) or killed(r):
        raise Defect(f"diff --prometheus with absurd counter values: {r.says()}")


# Item 8: hangs on FIFOs.

@case("diff-of-a-fifo", 8)
def _(c):
    a = c.profile()
    r = c.vg("diff", a, c.fifo("b.json"), timeout=10)
    if r.timed_out:
        raise Defect("diff A FIFO: blocked (killed after 10 s)")
    if r.rc == 0 or panicked(r):
        raise Defect(f"diff A FIFO: {r.says()}")


@case("workload-file-is-a-fifo", 8)
def _(c):
    r = c.vg("record", "--no-probes", "-w", c.fifo("w.toml"), timeout=10)
    if r.timed_out:
        raise Defect("record -w FIFO.toml: blocked (killed after 10 s)")
    if r.rc == 0 or panicked(r):
        raise Defect(f"record -w FIFO.toml: {r.says()}")


@case("tui-baseline-is-a-fifo", 8)
def _(c):
    master, slave = pty.openpty()
    c.undo.append(lambda: os.close(master))
    threading.Thread(target=lambda: drain_fd(master), daemon=True).start()
    p = c.start("tui", "--no-probes", "--engine", "null", "--size", "4MiB",
                "--baseline", c.fifo("base.json"), stdin=slave, stdout=slave)
    os.close(slave)
    r = p.finish(10)
    if r.timed_out:
        raise Defect("tui --baseline FIFO (on a pty): blocked or ran on (killed after 10 s)")
    if r.rc == 0 or panicked(r):
        raise Defect(f"tui --baseline FIFO: {r.says()}")


# Item 9: a partial profile record wrote, refused by diff.

@case("partial-profile-from-the-idle-interval", 9, probes=True)
def _(c):
    out = c.path("p.json")
    p = c.start("record", "--probes", "irq", "--engine", "null", "--size", "4MiB", "-d", "5s",
                "-o", out)
    if not p.wait_for(rb"measuring the idle host", 60):
        raise Defect(f"no idle measurement announced ({p.finish(10).says()})")
    p.signal(signal.SIGINT)
    r = p.finish(30)
    if r.rc != 130:
        raise Defect(f"SIGINT during the idle interval: {r.says()}")
    if not os.path.exists(out):
        return  # nothing measured, nothing written: nothing for diff to refuse
    d = c.vg("diff", out, out)
    if d.rc != 0:
        raise Defect(f"diff of the partial profile record wrote: {d.says()}")


# Item 10: the smaller ones.

@case("interval-10s-idle-wait", 10, probes=True)
def _(c):
    r = c.vg("record", "--probes", "irq", "--engine", "null", "--size", "4MiB", "-d", "1s",
             "-q", "--interval", "10s", timeout=60)
    if r.rc != 0:
        raise Defect(f"--interval 10s -d 1s: {r.says()}")
    if r.secs > 8:
        raise Defect(f"--interval 10s -d 1s took {r.secs:.1f} s (an idle interval first)")


@case("read-rps-error-names-its-flag", 10)
def _(c):
    r = c.vg("record", "-w", "kv-act", "--no-probes", "--read-rps", "1000000001")
    if "--read-rps" not in r.errtext or "--x " in r.errtext:
        raise Defect(f"--read-rps 1000000001: {r.says()}")


@case("ramp-error-names-its-flag", 10)
def _(c):
    r = c.vg("record", *FAST, "-q", "--ramp", "100y", timeout=15)
    if r.timed_out or "--ramp" not in r.errtext:
        raise Defect(f"--ramp 100y: {r.says()}")


HOSTILE = "\x1b]0;owned\x07\x1b[31m"


@case("escapes-in-dir-name", 10)
def _(c):
    d = c.path(f"d{HOSTILE}")
    os.mkdir(d)
    r = c.vg("record", *FAST, "--dir", d)
    no_escapes(r, "--dir with escapes in its name")


@case("escapes-in-output-name", 10)
def _(c):
    r = c.vg("record", *FAST, "-o", c.path(f"p{HOSTILE}.json"))
    no_escapes(r, "-o with escapes in its name")


@case("escapes-in-csv-name", 10)
def _(c):
    r = c.vg("record", *FAST, "--csv", c.path(f"csv{HOSTILE}"))
    no_escapes(r, "--csv with escapes in its name")


@case("escapes-in-target-name", 10)
def _(c):
    t = c.path(f"t{HOSTILE}.img")
    with open(t, "wb") as f:
        f.truncate(16 * MIB)  # sparse: the warning names it
    r = c.vg("record", "--no-probes", "-d", "1s", "--target", t)
    no_escapes(r, "--target with escapes in its name")


def edited_profile(c, edit):
    """The suite's small profile with `edit` applied to every histogram in it."""
    with open(c.suite.base_profile()) as f:
        p = json.load(f)

    def walk(o):
        if isinstance(o, dict):
            if "buckets" in o and "sum_ns" in o and "count" in o and o["buckets"]:
                edit(o)
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)
    walk(p)
    path = c.path("edited.json")
    with open(path, "w") as f:
        json.dump(p, f)
    return path


def expect_profile_refused(c, path, what):
    r = c.vg("diff", c.profile(), path)
    if r.rc == 0 or panicked(r):
        raise Defect(f"a profile with {what}: diff {r.says() if r.rc else 'accepted it (exit 0)'}")


@case("profile-negative-sum", 10)
def _(c):
    expect_profile_refused(c, edited_profile(c, lambda h: h.update(sum_ns=-1e20)),
                           "sum_ns = -1e20")


@case("profile-huge-sum", 10)
def _(c):
    expect_profile_refused(c, edited_profile(c, lambda h: h.update(sum_ns=1.7e308)),
                           "sum_ns = 1.7e308")


@case("profile-buckets-not-summing-to-count", 10)
def _(c):
    expect_profile_refused(c, edited_profile(c, lambda h: h.update(count=h["count"] + 1000)),
                           "buckets that do not sum to the count")


@case("profile-bucket-low-above-high", 10)
def _(c):
    def swap(h):
        low, high, n = h["buckets"][0]
        h["buckets"][0] = [high + 1, low, n] if low == high else [high, low, n]
    expect_profile_refused(c, edited_profile(c, swap), "a bucket whose low is above its high")


def with_version(c, version, source=None):
    with open(source or c.suite.base_profile()) as f:
        p = json.load(f)
    p["schema_version"] = version
    path = c.path(f"v{version}.json")
    with open(path, "w") as f:
        json.dump(p, f)
    return path


@case("profile-schema-version-0", 10)
def _(c):
    r = c.vg("diff", c.profile(), with_version(c, 0))
    if r.rc == 0 or panicked(r):
        raise Defect(f"schema_version 0: {r.says() if r.rc else 'read as the current version'}")


@case("profile-schema-version-2-with-version-3-fields", 10)
def _(c):
    # A version-2 profile has no `stages.completion` and its device stage ends at completion:
    # a document saying 2 is either read as 2 (and said so) or refused, never taken for a 3.
    probed = c.suite.probed_profile()
    with open(probed) as f:
        if '"completion"' not in f.read():
            raise Skip("no probe here measured the completion stage (a version-3 field)")
    r = c.vg("diff", probed, with_version(c, 2, probed))
    if panicked(r):
        raise Defect(f"schema_version 2: {r.says()}")
    if r.rc == 0 and not re.search(r"version 2|schema.version", r.text):
        raise Defect("schema_version 2 on a version-3 document: read as version 3, silently")


@case("sigstop-is-not-a-device-stall", 10)
def _(c):
    p = c.start("record", "--no-probes", "-d", "5s", "--size", "16MiB")
    if not p.wait_for(rb"running ", 60):
        raise Defect(f"the run never started ({p.finish(10).says()})")
    time.sleep(1.2)
    p.signal(signal.SIGSTOP)
    time.sleep(2.5)
    p.signal(signal.SIGCONT)
    r = p.finish(60)
    stalled = [l.strip() for l in r.out.decode(errors="replace").splitlines() if "STALLED" in l]
    if stalled and not re.search(r"stopped|SIGSTOP|suspend|not running|paused", stalled[0], re.I):
        raise Defect(f"stopped 2.5 s by SIGSTOP, reported as a device stall: {stalled[0][:140]}")
    if r.rc != 0:
        raise Defect(f"after SIGSTOP/SIGCONT: {r.says()}")


@case("two-writers-on-one-target", 10)
def _(c):
    f = c.file("f.img")
    args = ["record", "--no-probes", "-w", "rand4k-write", "--target", f, "--destroy-data", f]
    first = c.start(*args, "-d", "3s")
    if not first.wait_for(rb"running ", 60):
        raise Defect(f"the first writer never started ({first.finish(10).says()})")
    second = c.vg(*args, "-d", "1s")
    first.finish(60)
    if second.rc == 0:
        raise Defect("a second record writing the same --target file ran beside the first (exit 0)")


# The earlier sweep's cases, fixed then: they must still hold.

def refused_output(c, path, what, check_still):
    r = c.vg("record", *FAST, "-q", "-o", path, "--force")
    if r.rc == 0 or panicked(r):
        raise Defect(f"-o {what} --force: {r.says()}")
    if not check_still():
        raise Defect(f"-o {what} --force: the {what} was replaced")


@case("output-device-node-refused", "sweep")
def _(c):
    node = c.path("null")  # a /dev/null of our own: c 1 3
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    refused_output(c, node, "device node", lambda: stat.S_ISCHR(os.lstat(node).st_mode))


@case("output-fifo-refused", "sweep")
def _(c):
    fifo = c.fifo("fifo")
    refused_output(c, fifo, "FIFO", lambda: stat.S_ISFIFO(os.lstat(fifo).st_mode))


@case("output-directory-refused", "sweep")
def _(c):
    d = c.path("dir")
    os.mkdir(d)
    refused_output(c, d, "directory", lambda: os.path.isdir(d) and not os.listdir(d))


@case("output-symlink-refused", "sweep")
def _(c):
    mine = c.path("mine.txt")
    with open(mine, "w") as f:
        f.write("mine\n")
    link = c.path("link.json")
    os.symlink(mine, link)
    refused_output(c, link, "symbolic link",
                   lambda: os.path.islink(link) and open(mine).read() == "mine\n")


@case("flag-bounds", "sweep")
def _(c):
    bad = [
        (["--interval", "1ns"], "--interval"),
        (["--interval", "2h"], "--interval"),
        (["--qd", "4294967296"], "4096"),
        (["--workers", "1025"], "1024"),
        (["--bs", "128MiB"], "bs"),
        (["--size", "2PiB"], "size"),
        (["--sample-hz", "10001"], "sample-hz"),
        (["--runs", "0"], "runs"),
    ]
    problems = []
    for args, says in bad:
        r = c.vg("record", *FAST, "-q", *args, timeout=15)
        if r.rc == 0 or r.timed_out or panicked(r) or says not in r.errtext:
            problems.append(f"{' '.join(args)}: {r.says()}")
    if problems:
        raise Defect("; ".join(problems))


@case("buffers-over-memory-refused-up-front", "sweep")
def _(c):
    r = c.vg("record", "--no-probes", "--engine", "null", "--size", "4MiB", "-d", "1s",
             "--workers", "1024", "--qd", "4096", "--bs", "1MiB", timeout=30)
    expect_one_line_refusal(r, "--workers 1024 --qd 4096 --bs 1MiB", within=5)


@case("tui-without-a-terminal", "sweep")
def _(c):
    r = c.vg("tui", "--no-probes", timeout=15)
    expect_one_line_refusal(r, "tui without a terminal")
    if "record" not in r.errtext:
        raise Defect(f"tui without a terminal does not point at record: {r.errtext!r}")


def signalled_run(c, sig, code):
    out = c.path("p.json")
    p = c.start("record", "--no-probes", "--engine", "null", "--size", "4MiB", "-d", "30s",
                "-o", out)
    if not p.wait_for(rb"running ", 60):
        raise Defect(f"the run never started ({p.finish(10).says()})")
    time.sleep(0.5)
    p.signal(sig)
    r = p.finish(30)
    if r.rc != code:
        raise Defect(f"{signal.Signals(sig).name} mid-run: {r.says()}, not {code}")
    if not is_profile(out):
        raise Defect(f"{signal.Signals(sig).name} mid-run: no partial profile written")
    with open(out) as f:
        if json.load(f).get("complete") is not False:
            raise Defect(f"{signal.Signals(sig).name} mid-run: the profile is not marked incomplete")


@case("sigint-exits-130-with-a-partial-profile", "sweep")
def _(c):
    signalled_run(c, signal.SIGINT, 130)


@case("sigterm-exits-143-with-a-partial-profile", "sweep")
def _(c):
    signalled_run(c, signal.SIGTERM, 143)


@case("sighup-exits-129-with-a-partial-profile", "sweep")
def _(c):
    signalled_run(c, signal.SIGHUP, 129)


@case("escapes-in-workload-name", "sweep")
def _(c):
    wl = c.path("w.toml")
    text = sh(c.vgbin, "workloads", "rand4k")
    with open(wl, "w") as f:
        f.write(re.sub(r'(?m)^name = .*$', lambda _: 'name = "w\\u001b]0;owned\\u0007\\u001b[31m"',
                       text))
    r = c.vg("record", *FAST, "-w", wl)
    no_escapes(r, "a workload named with escapes")


@case("escapes-in-a-diffed-profile", "sweep")
def _(c):
    with open(c.suite.base_profile()) as f:
        p = json.load(f)
    p["host"]["cpu_model"] = f"cpu{HOSTILE}"
    p["host"]["kernel"] = f"kernel{HOSTILE}"
    p["workload"]["name"] = f"w{HOSTILE}"
    b = c.path("b.json")
    with open(b, "w") as f:
        json.dump(p, f)
    for fmt in ([], ["--markdown"]):
        r = c.vg("diff", c.profile(), b, "--force", *fmt)
        no_escapes(r, f"diff {' '.join(fmt)} of a profile with escapes in its names".replace("  ", " "))


# --- round two (issue 49): outputs over backing images, the fio line, iotune's small targets,
# slow clients, forged lines, copies as replicates. Each failed on 39c9580.

def image_kept(img, before, devs, what, r):
    flush_devices(devs)
    if not os.path.exists(img) or sha256_file(img) != before:
        raise Defect(f"{what}: the image was replaced ({r.says()})")
    if r.rc == 0:
        raise Defect(f"{what}: exit 0")


@case("output-over-the-targets-loop-backing", "2.1")
def _(c):
    img = c.file("h.img", 64 * MIB)
    dev = c.loop(img)
    before = sha256_file(img)
    for flag, extra in (("-o", []), ("--svg", [])):
        r = c.vg("record", *NO_FILL, "-q", "--target", dev, flag, img, "--force", *extra)
        image_kept(img, before, [dev], f"record --target {dev} {flag} IMG --force (IMG backs it)", r)
        if "backs" not in r.errtext:
            raise Defect(f"{flag} over the target's backing: refused without saying it backs "
                         f"the loop device ({r.says()})")
    r = c.vg("iotune", "--target", dev, "--phases", "read_iops", "--runs", "1", "--step",
             "200ms", "--duration", "300ms", "--no-probes", "-o", img, "--force", "-q")
    image_kept(img, before, [dev], "iotune --target LOOP -o IMG --force (read phases only)", r)


@case("output-over-a-mounted-filesystems-image", "2.1")
def _(c):
    img, dev, _ = c.mounted_ext4()
    other = c.loop(c.file("o.img", 16 * MIB))
    before = sha256_file(img)
    r = c.vg("record", *NO_FILL, "-q", "--target", other, "-o", img, "--force")
    image_kept(img, before, [dev, other], "record -o <a mounted ext4's image> --force", r)
    expect_one_line_refusal(r, "record -o over a mounted filesystem's image", within=10)


@case("fio-equivalent-spans-the-file-and-only-reads-it", "2.2")
def _(c):
    data = c.file("data.bin", 16 * MIB)
    r = c.vg("record", "--target", data, "--fio-equivalent")
    line = r.out.decode(errors="replace").strip()
    if r.rc != 0:
        raise Defect(f"--fio-equivalent on a 16 MiB file: {r.says()}")
    words = shlex.split(line)
    if f"--size={16 * MIB}" not in words:
        raise Defect(f"the fio line's region is not the 16 MiB the run uses: {line}")
    if "--readonly" not in words:
        raise Defect(f"the fio line of a read workload lacks --readonly: {line}")
    if shutil.which("fio"):
        before, size = sha256_file(data), os.path.getsize(data)
        argv = [w for w in words if not w.startswith(("--runtime=", "--ramp_time="))]
        subprocess.run(argv + ["--runtime=1"], cwd=c.dir, capture_output=True, timeout=60)
        if os.path.getsize(data) != size or sha256_file(data) != before:
            raise Defect(f"running the printed fio line changed the file ({line})")


def trickling_clients(port, n, idle=0):
    """n connections sending a request a byte every 0.5 s, and `idle` sending nothing."""
    import socket
    socks = []
    for _ in range(n + idle):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        socks.append(s)
    stop = threading.Event()

    def trickle():
        while not stop.is_set():
            for s in socks[:n]:
                try:
                    s.send(b"G")
                except OSError:
                    pass
            stop.wait(0.5)
    threading.Thread(target=trickle, daemon=True).start()
    return socks, stop


def scrape_secs(port, timeout=10):
    import urllib.request
    t = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
            r.read()
            status = r.status
    except Exception as e:  # noqa: BLE001 - any failure is the finding
        return None, f"{type(e).__name__}: {e}"
    return time.monotonic() - t, status


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@case("serve-listen-port-0-says-its-port", "2.11", probes=True)
def _(c):
    p = c.start("serve", "--listen", "127.0.0.1:0", "--probes", "block")
    if not p.wait_for(rb"serving http://127\.0\.0\.1:\d+/", 60):
        raise Defect(f"serve never said where it listens ({p.finish(10).says()})")
    port = int(re.search(rb"127\.0\.0\.1:(\d+)/", bytes(p.err)).group(1))
    if port == 0:
        raise Defect("serve --listen 127.0.0.1:0 says it serves on port 0")
    secs, status = scrape_secs(port)
    if status != 200:
        raise Defect(f"a scrape of the port it named: {status}")


@case("serve-slow-clients-do-not-stall-a-scrape", "2.3", probes=True)
def _(c):
    port = free_port()
    p = c.start("serve", "--listen", f"127.0.0.1:{port}", "--probes", "block")
    if not p.wait_for(rb"serving http://", 60):
        raise Defect(f"serve never served ({p.finish(10).says()})")
    socks, stop = trickling_clients(port, 50, idle=12)
    try:
        time.sleep(1)
        for k in range(3):
            secs, status = scrape_secs(port)
            if secs is None or secs > 1.0:
                raise Defect(f"scrape {k + 1} beside 50 trickling and 12 idle connections: "
                             f"{status if secs is None else f'{secs:.1f} s'}")
        t = time.monotonic()
        p.signal(signal.SIGTERM)
        r = p.finish(30)
        if time.monotonic() - t > 3:
            raise Defect(f"serve took {time.monotonic() - t:.1f} s to exit after SIGTERM "
                         f"with slow clients connected ({r.says()})")
    finally:
        stop.set()
        for s in socks:
            s.close()


@case("record-with-listen-ends-on-time-beside-a-slow-client", "2.3", probes=True)
def _(c):
    port = free_port()
    p = c.start("record", "--engine", "null", "--size", "4MiB", "-d", "2s", "--probes", "block",
                "--listen", f"127.0.0.1:{port}", "-o", c.path("p.json"))
    if not p.wait_for(rb"http://127\.0\.0\.1:\d+/", 60):
        raise Defect(f"record --listen never said where it listens ({p.finish(10).says()})")
    socks, stop = trickling_clients(port, 1)
    try:
        r = p.finish(60)
    finally:
        stop.set()
        for s in socks:
            s.close()
    if r.secs > 20 or r.rc != 0 or not is_profile(c.path("p.json")):
        raise Defect(f"record -d 2s --listen beside a slow client: {r.secs:.0f} s, {r.says()}")


def raw_exchange(port, data, timeout=3):
    """Sends `data` on a fresh connection and reads until the server closes or `timeout`: what
    came back (b"" when nothing did)."""
    import socket
    got = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(data)
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
    except OSError:
        pass
    return got


@case("serve-odd-http-is-answered-and-never-stalls-a-scrape", "ecosystem 1", probes=True)
def _(c):
    port = free_port()
    p = c.start("serve", "--listen", f"127.0.0.1:{port}", "--probes", "block")
    if not p.wait_for(rb"serving http://", 60):
        raise Defect(f"serve never served ({p.finish(10).says()})")
    get = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    # (what, bytes sent, a status line the answer may begin with; None: any answer or none)
    odd = [
        ("an HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", None),
        ("two pipelined requests", get + get, b"HTTP/1.1 200"),
        ("a 100 KB header line", b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 100_000 + b"\r\n\r\n",
         None),
        ("DELETE /metrics", b"DELETE /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 405"),
        ("OPTIONS *", b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", None),
        ("a path with NUL and ..", b"GET /../metrics%00 HTTP/1.1\r\nHost: x\r\n\r\n",
         b"HTTP/1.1 404"),
        ("binary noise", bytes(range(256)) * 4, None),
    ]
    for what, data, expect in odd:
        got = raw_exchange(port, data)
        if expect is not None and not got.startswith(expect):
            raise Defect(f"{what}: answered {got[:60]!r}, not {expect.decode()}")
        secs, status = scrape_secs(port)
        if secs is None or secs > 1.0:
            raise Defect(f"a scrape after {what}: {status if secs is None else f'{secs:.1f} s'}")
    # 200 connections held open at once: the oldest are let go, a scrape still answers.
    import socket
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(200)]
    try:
        secs, status = scrape_secs(port)
        if secs is None or secs > 1.0:
            raise Defect(f"a scrape beside 200 open connections: "
                         f"{status if secs is None else f'{secs:.1f} s'}")
    finally:
        for s in held:
            s.close()
    p.signal(signal.SIGTERM)
    r = p.finish(30)
    if r.rc != 0:
        raise Defect(f"serve after odd clients: {r.says()}")


@case("iotune-on-a-small-file-never-grows-it", "2.4")
def _(c):
    data = c.file("w2.bin", 2 * MIB)
    before = sha256_file(data)
    for phases, extra in (("write_bandwidth", ["--destroy-data", data]), ("read_bandwidth", [])):
        r = c.vg("iotune", "--target", data, *extra, "--phases", phases, "--runs", "1",
                 "--duration", "500ms", "--step", "200ms", "--ramp", "100ms", "--workers", "4",
                 "--no-probes", "-q")
        if os.path.getsize(data) != 2 * MIB:
            raise Defect(f"iotune {phases} on a 2 MiB file grew it to {os.path.getsize(data)} B")
        if sha256_file(data) != before:
            raise Defect(f"iotune {phases} on a 2 MiB file changed it before refusing")
        expect_one_line_refusal(r, f"iotune {phases} on a 2 MiB file, 4 workers", within=15)


@case("iotune-figures-from-no-time-are-refused", "2.5")
def _(c):
    for duration in ("1ns", "1ms"):
        r = c.vg("iotune", "--target", c.dir, "--runs", "1", "--duration", duration,
                 "--step", duration, "--ramp", "0s", "--no-probes", "--yaml", c.path("io.yaml"))
        if os.path.exists(c.path("io.yaml")):
            raise Defect(f"--duration {duration}: io_properties.yaml written ({r.says()})")
        expect_one_line_refusal(r, f"iotune --duration {duration}", within=5)


@case("diff-copies-are-not-replicates", "2.6")
def _(c):
    a, b = c.profile(), c.path("b.json")
    with open(c.suite.base_profile()) as f:
        doc = json.load(f)
    doc["runs"][0]["started_unix_ms"] += 1
    doc["run"]["started_unix_ms"] += 1
    with open(b, "w") as f:
        json.dump(doc, f)
    copies = []
    for k in range(4):
        copies.append(c.path(f"a{k}.json"))
        shutil.copyfile(a, copies[-1])
    argv = ["diff", a, b]
    for p in copies:
        argv += ["--with-a", p]
    r = c.vg(*argv)
    expect_one_line_refusal(r, "diff with four copies of A's profile pooled on A")
    r = c.vg("diff", a, b, "--with-a", a)
    expect_one_line_refusal(r, "diff naming A's profile twice on A")


@case("newlines-in-argv-and-label-forge-no-line", "2.7", probes=True)
def _(c):
    forged = "  block requests: 999 reads FORGED"
    script = f"exec -a $'x\\n{forged}\\n' sleep 4"
    holder = c.spawn(["bash", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    r = c.vg("record", "--pid", str(holder.pid), "-d", "1s", "-q", "--probes", "block",
             "--label", "L1\n  attached 999 s; ended: FORGED-BY-LABEL")
    out = r.out.decode(errors="replace")
    for line in out.splitlines():
        if line.strip().startswith(("block requests: 999", "attached 999")):
            raise Defect(f"a followed process's argv or --label made a line of its own: {line!r}")
    if r.rc != 0:
        raise Defect(f"record --pid with a hostile argv and label: {r.says()}")


@case("markdown-shows-profile-html-as-text", "2.8")
def _(c):
    with open(c.suite.base_profile()) as f:
        p = json.load(f)
    p["host"]["cpu_model"] = "<script>alert(9)</script><img src=x onerror=alert(8)>|x|`y`"
    p["run"]["started_unix_ms"] += 1
    p["runs"][0]["started_unix_ms"] += 1
    b = c.path("b.json")
    with open(b, "w") as f:
        json.dump(p, f)
    r = c.vg("diff", c.profile(), b, "--force", "--markdown")
    out = r.out.decode(errors="replace")
    for tag in ("<script", "<img", "|x|", "`y`"):
        if tag in out:
            raise Defect(f"diff --markdown copied {tag!r} from a profile as is")
    if r.rc != 0:
        raise Defect(f"diff --markdown of a hostile profile: {r.says()}")


@case("closed-stdout-keeps-the-csv", "2.9")
def _(c):
    for tail in ("| true", "2>&1 | head -1"):
        csv, prof = c.path(f"csv{len(c.procs)}"), c.path(f"p{len(c.procs)}.json")
        cmd = (f"{shlex.quote(c.vgbin)} record {' '.join(FAST)} --json -o {shlex.quote(prof)} "
               f"--csv {shlex.quote(csv)} {tail}")
        p = c.spawn(["bash", "-c", cmd]).finish(60)
        files = os.listdir(csv) if os.path.isdir(csv) else []
        if not is_profile(prof) or len(files) < 5:
            raise Defect(f"record ... --csv DIR {tail}: profile {'kept' if is_profile(prof) else 'lost'}, "
                         f"{len(files)} CSV files ({p.says()})")


@case("back-to-back-runs-on-one-target", "2.10")
def _(c):
    # A closed io_uring's files are released by the kernel in the background: the next run on
    # the same target, started at once, must not be told another run holds it.
    img = c.file("d.img", 64 * MIB)
    dev = c.loop(img)
    runs = [
        ["iotune", "--target", dev, "--destroy-data", img, "--phases", "write_iops", "--runs",
         "1", "--step", "200ms", "--duration", "300ms", "--no-probes", "-q"],
        ["record", "--no-probes", "-q", "-d", "1s", "-w", "rand4k-write", "--target", dev,
         "--destroy-data", img],
        ["iotune", "--target", img, "--destroy-data", img, "--phases", "write_iops", "--runs",
         "1", "--step", "200ms", "--duration", "300ms", "--no-probes", "-q"],
        ["record", "--no-probes", "-q", "-d", "1s", "-w", "rand4k-write", "--target", img,
         "--destroy-data", img],
    ]
    for argv in runs * 2:
        r = c.vg(*argv)
        if r.rc != 0:
            raise Defect(f"{' '.join(argv[:3])} right after another run: {r.says()}")


@case("read-only-loop-refused-before-any-phase", "2.11")
def _(c):
    img = c.file("ro.img", 64 * MIB)
    need_tool("losetup")
    try:
        dev = sh("losetup", "-r", "-f", "--show", img)
    except RuntimeError as e:
        raise Skip(f"no loop device: {e}")
    c.undo.append(lambda: sh("losetup", "-d", dev, check=False))
    r = c.vg("iotune", "--target", dev, "--destroy-data", img, "--runs", "1", "--step",
             "200ms", "--duration", "300ms", "--no-probes", "-q")
    expect_one_line_refusal(r, "iotune --destroy-data on a read-only loop device", within=5)
    if "read-only" not in r.errtext:
        raise Defect(f"refused without saying the device is read-only: {r.says()}")


@case("a-zombie-pid-is-not-followed", "2.12", probes=True)
def _(c):
    # A parent that never reaps its child: the child stays a zombie.
    parent = c.spawn(["python3", "-c",
                      "import os, time, sys\npid = os.fork()\nif pid == 0: os._exit(0)\n"
                      "print(pid, flush=True)\ntime.sleep(30)"])
    deadline = time.monotonic() + 10
    while not parent.out.strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    zombie = parent.out.decode().strip()
    r = c.vg("record", "--pid", zombie, "-d", "20s", "-q", "--probes", "block", timeout=60)
    if r.rc == 0 and r.secs > 10:
        raise Defect(f"a zombie --pid was followed for the whole --duration ({r.secs:.0f} s)")


@case("no-bpf-objects-left-after-faults", "sweep", probes=True)
def _(c):
    need_tool("bpftool")
    runs = [
        ("SIGKILL mid-run", signal.SIGKILL, rb"running "),
        ("SIGKILL while attaching", signal.SIGKILL, None),
        ("SIGTERM mid-run", signal.SIGTERM, rb"running "),
        ("SIGINT in the idle interval", signal.SIGINT, rb"measuring the idle host"),
        ("SIGHUP mid-run", signal.SIGHUP, rb"running "),
    ]
    for what, sig, when in runs:
        p = c.start("record", "--engine", "null", "--size", "4MiB", "-d", "30s", "-o",
                    c.path(f"p{len(c.procs)}.json"))
        if when is None:
            time.sleep(0.3)
        elif not p.wait_for(when, 60):
            raise Defect(f"{what}: the run never got there ({p.finish(10).says()})")
        p.signal(sig)
        p.finish(30)
    # serve, stopped as a server is stopped (SIGTERM: it detaches and exits 0), and killed.
    for what, sig, code in (("serve on SIGTERM", signal.SIGTERM, 0),
                            ("serve on SIGKILL", signal.SIGKILL, None)):
        p = c.start("serve", "--listen", "127.0.0.1:0", "--probes", "block,irq")
        if not p.wait_for(rb"serving http://", 60):
            raise Defect(f"{what}: it never served ({p.finish(10).says()})")
        p.signal(sig)
        r = p.finish(30)
        if code is not None and r.rc != code:
            raise Defect(f"{what}: {r.says()}, not exit {code}")
    # One that fails on its own after the probes attached: a --target too small for --size.
    small = c.path("small.img")
    with open(small, "wb") as f:
        f.truncate(MIB)
    c.vg("record", "--size", "4MiB", "-d", "1s", "--target", small)
    # Every virtgap object no process holds, new since the suite began (this case runs last,
    # so the faults of every case before it count too).
    left = set()
    for _ in range(20):
        left = orphaned(virtgap_bpf_objects() - c.suite.bpf_before)
        if not left:
            return
        time.sleep(0.25)
    kinds = {k: sum(1 for o in left if o[0] == k) for k in ("prog", "map", "link")}
    names = sorted({o[2] for o in left})[:6]
    raise Defect(f"left behind: {kinds['prog']} programs, {kinds['map']} maps, "
                 f"{kinds['link']} links held by no process ({', '.join(names)})")


# --- the suite ---------------------------------------------------------------------------------

class Suite:
    def __init__(self, vg):
        self.vg = vg
        self.scratch = tempfile.mkdtemp(prefix="vg-hostile-")
        self._base = None
        self._probed = None
        self.bpf_before = virtgap_bpf_objects() if shutil.which("bpftool") else set()

    def _record(self, name, args):
        path = os.path.join(self.scratch, name)
        r = subprocess.run([self.vg, "record", "-q", "-o", path, *args], cwd=self.scratch,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           timeout=120, env=dict(os.environ, TMPDIR=self.scratch))
        if r.returncode != 0 or not is_profile(path):
            raise RuntimeError(f"recording the fixture profile: {r.stderr.strip()[:200]}")
        return path

    def base_profile(self):
        """A small real profile, recorded once: --no-probes --engine null."""
        if self._base is None:
            self._base = self._record("base.json", FAST)
        return self._base

    def probed_profile(self):
        """A real profile with probed intervals (per-CPU load, stages), 100 ms each."""
        if self._probed is None:
            self._probed = self._record("probed.json", [
                "--probes", "irq,block,wakeup", "--engine", "null", "--size", "4MiB",
                "-d", "2s", "--interval", "100ms"])
        return self._probed

    def probes_attach(self):
        """Whether the probes attach here (the probed profile's capabilities say)."""
        with open(self.probed_profile()) as f:
            families = json.load(f).get("capabilities", {}).get("families", [])
        return any(f.get("unavailable") is None and
                   any(t.get("attached") for t in f.get("tracepoints", [])) for f in families)

    def close(self):
        shutil.rmtree(self.scratch, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--virtgap", default=os.path.join(REPO, "target", "release", "virtgap"))
    ap.add_argument("--only", metavar="REGEX[,REGEX...]",
                    help="run only the cases whose name matches one of these regular expressions")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--verbose", action="store_true",
                    help="after each case, its commands, their exit codes and last stderr lines")
    a = ap.parse_args()
    patterns = [p for p in (a.only or "").split(",") if p]
    chosen = [cs for cs in CASES if not patterns or any(re.search(p, cs[0]) for p in patterns)]
    if a.list:
        for name, item, probes, _ in chosen:
            where = f"item {item}" if item != "sweep" else "earlier sweep"
            where = where.replace("item 2.", "round two, item ")
            print(f"{name:<52} {where}{' (probes)' if probes else ''}")
        return 0
    if os.geteuid() != 0:
        print("hostile: needs root (loop devices, mounts, cgroups, the probes)")
        return 2
    vg = os.path.abspath(a.virtgap)
    if not os.access(vg, os.X_OK):
        print(f"hostile: no virtgap binary at {a.virtgap} (run `just build`)")
        return 2
    if not chosen:
        print(f"hostile: no case matches {a.only!r} (--list shows them)")
        return 2
    # A SIGTERM or SIGHUP still unmounts and detaches what the current case set up.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    suite = Suite(vg)
    counts = {"ok": 0, "DEFECT": 0, "skip": 0}
    started = time.monotonic()
    try:
        for name, _item, probes, fn in chosen:
            c = Case(suite, name)
            t0 = time.monotonic()
            try:
                if probes and not suite.probes_attach():
                    raise Skip("no probe attaches here (see `virtgap doctor`)")
                fn(c)
                verdict, line = "ok", f"ok   {name}"
            except Defect as e:
                verdict, line = "DEFECT", f"DEFECT {name}: {e}"
            except Skip as e:
                verdict, line = "skip", f"skip {name}: {e}"
            except Exception as e:  # noqa: BLE001 - a case that cannot run is not a pass
                verdict, line = "DEFECT", f"DEFECT {name}: the case itself failed: {type(e).__name__}: {e}"
            finally:
                c.cleanup()
            counts[verdict] += 1
            print(line, flush=True)
            if a.verbose:
                print(f"    ({time.monotonic() - t0:.1f} s)")
                for p in c.procs:
                    argv = " ".join(shlex.quote(x) for x in p.argv).replace(vg, "virtgap")
                    argv = "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in argv)
                    print(f"    $ {argv[:200]}\n      -> {p.says()}", flush=True)
    finally:
        suite.close()
    print(f"{len(chosen)} cases: {counts['ok']} ok, {counts['DEFECT']} DEFECT, {counts['skip']} "
          f"skipped, in {time.monotonic() - started:.0f} s")
    # Under CI a skipped case fails the run, as a skipped test does.
    failed = counts["DEFECT"] or (counts["skip"] and os.environ.get("CI"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
