"""A loop device over a file in /dev/shm, for the benchmarks that need a device far from a
disk's limits: the loop driver serves it from memory."""

import contextlib
import os
import subprocess


@contextlib.contextmanager
def memory_loop(size, name):
    """Yields (loop device, backing file): `size` bytes of random data in /dev/shm/NAME-PID.img,
    attached as a loop device; both removed on exit."""
    backing = os.path.join("/dev/shm", f"{name}-{os.getpid()}.img")
    try:
        with open(backing, "wb") as f:
            block = os.urandom(1 << 20)
            for _ in range(size >> 20):
                f.write(block)
        loop = subprocess.run(["losetup", "--find", "--show", backing], capture_output=True,
                              text=True, check=True).stdout.strip()
        try:
            yield loop, backing
        finally:
            subprocess.run(["losetup", "--detach", loop])
    finally:
        if os.path.exists(backing):
            os.unlink(backing)
