"""Host-wide GPU leases: concurrent launches on one host get disjoint GPUs.

    with GpuLease(["0", "1", "2", "3"], count=1, holder="train#2") as gpus:   # waits until one is free
        ...                                                                   # gpus == ["2"], say

A lease is an exclusive `flock` on one file per GPU in LEASE_DIR (NBHELPERS_GPU_LEASE_DIR, by default
/tmp/nbhelpers-gpu-leases), so every process on the host that uses this directory sees it, and the
kernel drops it when the holder ends, however it ends: a crashed notebook leaves no stale lease. A GPU is
named as CUDA_VISIBLE_DEVICES names it (an index or a UUID); processes that name one GPU both ways
would not see each other's lease.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time

POLL_S = 0.25


def lease_dir() -> str:
    return os.environ.get("NBHELPERS_GPU_LEASE_DIR", "/tmp/nbhelpers-gpu-leases")


class LeaseCancelled(Exception):
    """The launch was cancelled while it waited for GPUs."""


class GpuLease:
    """Exclusive use of `count` of the GPUs named in `visible` for as long as the `with` lasts.

    Precondition: 1 <= count <= len(visible). Waits (printing one line that says for what) until enough
    of them are free at once; `cancel` (a threading.Event) ends the wait with LeaseCancelled.
    """

    def __init__(self, visible: list[str], count: int, holder: str, cancel=None):
        self.visible, self.count, self.holder, self.cancel = list(visible), count, holder, cancel
        self.files = {}  # GPU name -> the open, locked file

    def __enter__(self) -> list[str]:
        directory = lease_dir()
        if not os.path.isdir(directory):
            os.makedirs(directory, exist_ok=True)
            with contextlib.suppress(PermissionError):  # like /tmp: every user may lease, none may steal
                os.chmod(directory, 0o1777)
        said = False
        try:
            while True:
                for gpu in self.visible:  # all or nothing: two launches holding half each would wait for ever
                    if len(self.files) < self.count:
                        self._try(directory, gpu)
                if len(self.files) == self.count:
                    return list(self.files)
                self.__exit__(None, None, None)
                if not said:
                    print(f"[{self.holder}] waiting for {self.count} GPU(s); leased by other launches: "
                          f"{self._holders(directory)}", file=sys.stderr, flush=True)
                    said = True
                if self.cancel is None:
                    time.sleep(POLL_S)
                elif self.cancel.wait(POLL_S):
                    raise LeaseCancelled(f"{self.holder} was cancelled while it waited for GPUs")
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc):
        for f in self.files.values():
            f.close()  # closing the file drops its lock
        self.files.clear()

    def _try(self, directory: str, gpu: str) -> None:
        f = open(_open_lock_file(os.path.join(directory, f"gpu-{gpu.replace(os.sep, '_')}.lock")), "r+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return
        f.truncate(0)
        f.write(f"{self.holder} (pid {os.getpid()})\n")
        f.flush()
        self.files[gpu] = f

    def _holders(self, directory: str) -> str:
        held = []
        for gpu in self.visible:
            with contextlib.suppress(OSError):
                with open(os.path.join(directory, f"gpu-{gpu.replace(os.sep, '_')}.lock")) as f:
                    held.append(f"GPU {gpu}: {f.read().strip() or '?'}")
        return "; ".join(held) or "?"


def _open_lock_file(path: str) -> int:
    """The GPU's lock file, opened read-write. One per GPU, shared by every user of the host (not one per user: the
    leases keep launches of different users off each other's GPUs), so its creator makes it rw for everyone: fchmod,
    as the umask cuts os.open's mode to 0644 and the next user got PermissionError. An existing file is opened without
    O_CREAT, which fs.protected_regular refuses on another user's file in a sticky directory."""
    while True:
        with contextlib.suppress(FileNotFoundError):
            return os.open(path, os.O_RDWR)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue  # another launch created it just now
        os.fchmod(fd, 0o666)
        return fd
