"""The data dir's ``lock`` file: one process writes a data dir at a time (as Prometheus's lock file).

``turboprom serve`` holds an exclusive ``flock`` on ``<data-dir>/lock`` for its lifetime (the kernel
drops it when the process ends, also on SIGKILL, so a crash leaves no stale lock); the file holds the
pid for the message. ``turboprom import --data-dir`` takes the same lock, so it never writes blocks
under a running server (it points at ``--url`` instead).
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "lock"


class DataDirLocked(Exception):
    """Another process holds the data dir; ``pid`` is the holder's when known."""

    def __init__(self, path: Path, pid: str):
        super().__init__(f"data dir {path.parent} is in use by another TurboProm process"
                         + (f" (pid {pid})" if pid else ""))
        self.pid = pid


def lock_data_dir(data_dir: str | Path) -> int:
    """Take the lock (the data dir must exist); the returned fd keeps it until closed or exit."""
    path = Path(data_dir) / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
        finally:
            os.close(fd)
        raise DataDirLocked(path, pid) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def unlock_data_dir(fd: int) -> None:
    os.close(fd)
