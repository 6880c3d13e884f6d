"""A shared-memory board holding the newest encoded congestion snapshot, for the poll process.

Why hand-written: the poll process must read the newest body with no thread, socket or decode of
its own (each of those takes its GIL away from the poll it is answering), and the server must post
a body without waiting for the reader. ``multiprocessing.shared_memory`` would do the mapping but
registers every attachment with a resource tracker that may unlink the segment when the reader
exits; a plain file on tmpfs mapped with ``mmap`` has neither problem.

Layout (little-endian u64 words): a 64-byte header ``[magic, generation, epoch, capacity, last read, ...]``,
then two slots of ``capacity`` bytes, each ``[length, version, body...]``. The writer fills the slot
the readers are not told about (``(generation + 1) % 2``), then bumps ``generation``; a reader reads
``generation``, copies slot ``generation % 2``, and reads ``generation`` again: unchanged means the
copy is whole (the writer touches that slot only after the next bump), changed means read again.
One writer (the server's refresher thread, serialized by a lock), any number of readers. A reader
also stamps the header's "last read" word (``time.monotonic()`` in microseconds, the same clock in
every process of the machine) at most every ``READ_STAMP_S``, so the server knows the poll port has
readers and keeps publishing promptly (the tracker's ``idle_after``).
"""
from __future__ import annotations

import mmap
import os
import struct
import tempfile
import threading
import time

_MAGIC = 0x54504B42_43474E31  # "TPKBCGN1"
_HEADER = 64
_SLOT_HEADER = 16
_TOO_LARGE = (1 << 64) - 1  # slot length meaning: the body did not fit (its size is the version word)
DEFAULT_CAPACITY = 64 * 1024 * 1024  # per slot; tmpfs pages are only used once written
_LAST_READ = 32  # header offset of the readers' last-read stamp
READ_STAMP_S = 0.1


class BoardBodyTooLarge(Exception):
    """The newest body did not fit the board's slots."""

    def __init__(self, size: int, capacity: int) -> None:
        super().__init__(f"the newest congestion snapshot is {size} bytes, over the poll process's shared buffer "
                         f"of {capacity} bytes per slot; poll the main server instead")


def _shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class BoardWriter:
    """Creates the board file (removed by ``close``) and posts bodies to it."""

    def __init__(self, *, epoch: int, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self.epoch = epoch  # tells one server run's snapshot versions from another's (ETag)
        fd, self.path = tempfile.mkstemp(prefix="turboprom-congestion-", suffix=".board", dir=_shm_dir())
        try:
            os.ftruncate(fd, _HEADER + 2 * (_SLOT_HEADER + capacity))
            self._mm = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        self._gen = 0
        self._lock = threading.Lock()
        struct.pack_into("<QQQQ", self._mm, 0, _MAGIC, 0, self.epoch, capacity)
        struct.pack_into("<QQ", self._mm, _HEADER, 0, 0)  # slot 0: empty body, version 0

    def post(self, version: int, body: bytes) -> None:
        with self._lock:
            if self._mm.closed:
                return
            slot = (self._gen + 1) % 2
            off = _HEADER + slot * (_SLOT_HEADER + self.capacity)
            if len(body) > self.capacity:
                struct.pack_into("<QQ", self._mm, off, _TOO_LARGE, len(body))
            else:
                self._mm[off + _SLOT_HEADER: off + _SLOT_HEADER + len(body)] = body
                struct.pack_into("<QQ", self._mm, off, len(body), version)
            self._gen += 1
            struct.pack_into("<Q", self._mm, 8, self._gen)

    def last_read(self) -> float:
        """``time.monotonic()`` of a reader's last stamped read (-inf before any). Without the
        writer's lock: it is read on the event loop (a poll's idle check), which must not wait for a
        post copying a large body; one aligned 8-byte word needs no lock."""
        try:
            us = struct.unpack_from("<Q", self._mm, _LAST_READ)[0]
        except ValueError:  # closed
            return -float("inf")
        return us / 1e6 if us else -float("inf")

    def close(self) -> None:
        with self._lock:
            if not self._mm.closed:
                self._mm.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class BoardReader:
    """Maps a board; ``read()`` returns the newest (version, body), copying only when it changed, and
    stamps the last-read word (the only word a reader writes)."""

    def __init__(self, path: str) -> None:
        with open(path, "r+b") as f:
            self._mm = mmap.mmap(f.fileno(), 0)
        self._stamped = 0.0
        magic, _, self.epoch, self.capacity = struct.unpack_from("<QQQQ", self._mm, 0)
        if magic != _MAGIC:
            raise ValueError(f"{path} is not a congestion snapshot board")
        self._gen = -1
        self._current: tuple[int, bytes] = (0, b"")
        self._too_large = 0

    def generation(self) -> int:
        return struct.unpack_from("<Q", self._mm, 8)[0]

    def read(self) -> tuple[int, bytes]:
        """Raises ``BoardBodyTooLarge`` while the newest body does not fit."""
        now = time.monotonic()
        if now - self._stamped >= READ_STAMP_S:
            self._stamped = now
            struct.pack_into("<Q", self._mm, _LAST_READ, int(now * 1e6))
        for _ in range(100):
            g = self.generation()
            if g == self._gen:
                break
            off = _HEADER + (g % 2) * (_SLOT_HEADER + self.capacity)
            length, version = struct.unpack_from("<QQ", self._mm, off)
            if length == _TOO_LARGE:
                body, too_large = b"", version
            else:
                body, too_large = self._mm[off + _SLOT_HEADER: off + _SLOT_HEADER + length], 0
            if self.generation() == g:  # the writer did not reach this slot meanwhile: the copy is whole
                self._gen, self._too_large = g, too_large
                if not too_large:
                    self._current = (version, body)
                break
        if self._too_large:
            raise BoardBodyTooLarge(self._too_large, self.capacity)
        return self._current

    def close(self) -> None:
        self._mm.close()
