"""Write-ahead log: segmented files of checksummed, columnar records.

Record = header (payload length u32, crc32 of type+payload u32, type u8) + payload. Types:
  SERIES     orjson [[sid, [[name, value], ...]], ...] - ids as used by the sample records that follow
  SAMPLES    count u32, then sid int64[count], ts int64[count], value-bits uint64[count] (raw numpy bytes)
  TOMBSTONE  orjson {"series": [labels...], "mint": int, "maxt": int}
A batch is one or two records written with a single os.write on an unbuffered fd, so a SIGKILL
after the write returns cannot lose it; the fsync policy decides what survives power loss
(always: fsync before the append returns, shared by concurrent appenders = group commit;
batch: a background fsync every 100 ms; never: the OS decides).

Series ids in the WAL are the writing process's ids; a later process redefines the ids it uses with
fresh SERIES records before using them, and replay applies records in order (last definition wins).
A checkpoint (``checkpoint.NNNNNNNN``, same record format) holds the head as of the cut of segment
NNNNNNNN; replay reads the newest checkpoint and then the segments after it.

The hand-written framing exists because no named library offers an append-only, torn-tail-tolerant
record log; the payloads themselves are numpy buffers and orjson.
"""
from __future__ import annotations

import logging
import os
import re
import struct
import threading
import time
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
import orjson

from storage import metrics as M
from storage.columns import grow, unique
from storage.labels import Labels

log = logging.getLogger("turboprom.storage.wal")

HEADER = struct.Struct("<IIB")
T_SERIES, T_SAMPLES, T_TOMBSTONE = 1, 2, 3
_SEGMENT_RE = re.compile(r"^(\d{8})$")
_CHECKPOINT_RE = re.compile(r"^checkpoint\.(\d{8})$")
MAX_RECORD = 1 << 31


def encode_record(rtype: int, payload: bytes) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(bytes((rtype,))))
    return HEADER.pack(len(payload), crc, rtype) + payload


def encode_series(items: list[tuple[int, Labels]]) -> bytes:
    return encode_record(T_SERIES, orjson.dumps([[sid, list(lbl)] for sid, lbl in items]))


_RTYPE_CRC = {t: zlib.crc32(bytes((t,))) for t in (T_SERIES, T_SAMPLES, T_TOMBSTONE)}


def encode_samples(sid: np.ndarray, ts: np.ndarray, val: np.ndarray) -> memoryview:
    """The same bytes as ``encode_record(T_SAMPLES, n + sid + ts + val)``, written into one buffer
    (one copy of each column instead of four)."""
    n = len(sid)
    h = HEADER.size
    buf = np.empty(h + 4 + 24 * n, dtype=np.uint8)
    struct.pack_into("<I", buf, h, n)
    for k, (col, dt) in enumerate(((sid, "<i8"), (ts, "<i8"), (val, "<f8"))):
        start = h + 4 + 8 * n * k
        buf[start:start + 8 * n] = np.ascontiguousarray(col, dtype=dt).view(np.uint8)
    payload = memoryview(buf)[h:]
    HEADER.pack_into(buf, 0, len(payload), zlib.crc32(payload, _RTYPE_CRC[T_SAMPLES]), T_SAMPLES)
    return memoryview(buf)


def decode_samples(payload: bytes | memoryview) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    (n,) = struct.unpack_from("<I", payload, 0)
    if len(payload) != 4 + 24 * n:
        raise ValueError("samples record length mismatch")
    sid = np.frombuffer(payload, dtype="<i8", count=n, offset=4)
    ts = np.frombuffer(payload, dtype="<i8", count=n, offset=4 + 8 * n)
    val = np.frombuffer(payload, dtype="<f8", count=n, offset=4 + 16 * n)
    return sid, ts, val


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


class Handler:
    """Replay callbacks."""

    def __init__(self, on_series: Callable[[list], None], on_samples: Callable[[np.ndarray, np.ndarray, np.ndarray], None],
                 on_tombstone: Callable[[list, int, int], None]) -> None:
        self.on_series, self.on_samples, self.on_tombstone = on_series, on_samples, on_tombstone


def _read_records(path: Path, handler: Handler, *, repair: bool) -> tuple[bool, int]:
    """Apply the records of one file. Returns (ok, good_bytes). A bad record stops the file."""
    data = path.read_bytes()
    mv = memoryview(data)
    pos, n = 0, len(data)
    while pos < n:
        if n - pos < HEADER.size:
            return False, pos
        length, crc, rtype = HEADER.unpack_from(mv, pos)
        end = pos + HEADER.size + length
        if end > n or rtype not in (T_SERIES, T_SAMPLES, T_TOMBSTONE):
            return False, pos
        payload = mv[pos + HEADER.size:end]
        if zlib.crc32(payload, zlib.crc32(bytes((rtype,)))) != crc:
            return False, pos
        try:
            if rtype == T_SAMPLES:
                handler.on_samples(*decode_samples(payload))
            elif rtype == T_SERIES:
                handler.on_series(orjson.loads(payload))
            else:
                d = orjson.loads(payload)
                handler.on_tombstone(d["series"], int(d["mint"]), int(d["maxt"]))
        except (ValueError, KeyError, TypeError, struct.error):
            return False, pos
        pos = end
    return True, pos


def list_wal(dirpath: Path) -> tuple[list[int], list[int]]:
    segs, cps = [], []
    if dirpath.exists():
        for p in dirpath.iterdir():
            if m := _SEGMENT_RE.match(p.name):
                segs.append(int(m.group(1)))
            elif m := _CHECKPOINT_RE.match(p.name):
                cps.append(int(m.group(1)))
    return sorted(segs), sorted(cps)


def replay_wal(dirpath: Path, handler: Handler, *, repair: bool = True) -> dict:
    """Replay newest checkpoint + later segments. A torn/corrupt record truncates the log there
    (``repair=False``: reading stops there and nothing is changed, for readers beside a running server)."""
    segs, cps = list_wal(dirpath)
    stats = {"checkpoint": None, "segments": 0, "truncated": False}
    after = -1
    if cps:
        cp = cps[-1]
        ok, _ = _read_records(dirpath / f"checkpoint.{cp:08d}", handler, repair=False)
        if not ok:
            # Checkpoints are renamed into place only when complete; a bad one is a disk fault.
            log.warning("WAL checkpoint %s is corrupt; replaying what was readable", cp)
            M.WAL_CORRUPTIONS.inc()
        stats["checkpoint"] = cp
        after = cp
    todo = [s for s in segs if s > after]
    for i, s in enumerate(todo):
        path = dirpath / f"{s:08d}"
        ok, good = _read_records(path, handler, repair=True)
        stats["segments"] += 1
        if not ok and not repair:
            stats["truncated"] = True
            break
        if not ok:
            size = path.stat().st_size
            log.warning("WAL segment %s: torn or corrupt record at byte %d of %d; truncating the log there%s",
                        path.name, good, size, f" and dropping {len(todo) - i - 1} later segment(s)" if i + 1 < len(todo) else "")
            M.WAL_CORRUPTIONS.inc()
            with open(path, "r+b") as f:
                f.truncate(good)
                f.flush()
                os.fsync(f.fileno())
            for later in todo[i + 1:]:
                (dirpath / f"{later:08d}").unlink(missing_ok=True)
            stats["truncated"] = True
            break
    return stats


class WAL:
    def __init__(self, dirpath: Path, *, segment_bytes: int, fsync: str) -> None:
        if fsync not in ("always", "batch", "never"):
            raise ValueError(f"invalid wal_fsync {fsync!r}: want always, batch or never")
        self.dir = Path(dirpath)
        self.dir.mkdir(parents=True, exist_ok=True)
        for p in self.dir.glob("checkpoint.*.tmp"):  # an interrupted checkpoint write
            p.unlink(missing_ok=True)
        self.segment_bytes = segment_bytes
        self.fsync_mode = fsync
        self._lock = threading.Lock()  # file position / rotation
        self._sync_lock = threading.Lock()
        self._fd = -1
        self._seg = 0
        self._seg_size = 0
        self._written = 0
        self._synced = 0
        self._logged = np.zeros(0, dtype=bool)  # series ids defined in this process's WAL
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------------

    def open_for_append(self) -> None:
        segs, cps = list_wal(self.dir)
        last = max(segs + cps + [0])
        self._open_segment(last + 1)
        if self.fsync_mode == "batch":
            self._syncer = threading.Thread(target=self._sync_loop, name="wal-fsync", daemon=True)
            self._syncer.start()

    def _open_segment(self, n: int) -> None:
        self._seg = n
        self._fd = os.open(self.dir / f"{n:08d}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._seg_size = os.fstat(self._fd).st_size
        _fsync_dir(self.dir)

    def close(self) -> None:
        self._stop.set()
        if self._syncer is not None:
            self._syncer.join(timeout=5)
        with self._lock:
            if self._fd >= 0:
                if self.fsync_mode != "never":
                    os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1

    def _sync_loop(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.sync(self._written, force=True)
            except OSError:
                log.exception("WAL background fsync failed")

    # --- writing ------------------------------------------------------------------------------

    def _write(self, data: bytes | memoryview) -> int:
        with self._lock:
            if self._seg_size > 0 and self._seg_size + len(data) > self.segment_bytes:
                self._rotate_locked()
            view = memoryview(data)
            try:
                while view:
                    k = os.write(self._fd, view)
                    view = view[k:]
            except OSError:
                # e.g. disk full: cut the partial record off so later records are not stranded
                # behind a torn one (replay stops at the first bad record).
                try:
                    os.ftruncate(self._fd, self._seg_size)
                except OSError:
                    log.exception("WAL: could not remove a partially written record")
                raise
            self._seg_size += len(data)
            self._written += 1
            M.WAL_BYTES.inc(len(data))
            return self._written

    def _rotate_locked(self) -> int:
        old_fd, old = self._fd, self._seg
        if self.fsync_mode != "never":
            os.fsync(old_fd)
        os.close(old_fd)
        self._open_segment(old + 1)
        return old

    def log_samples(self, sid: np.ndarray, ts: np.ndarray, val: np.ndarray, labels: list[Labels]) -> int:
        """Write one batch (caller holds the storage write lock). Returns its sequence number."""
        u = unique(sid, is_sorted=True)
        self._logged = grow(self._logged, int(u[-1]) + 1, False)
        new = u[~self._logged[u]]
        parts = []
        if len(new):
            parts.append(encode_series([(i, labels[i]) for i in new.tolist()]))
        parts.append(encode_samples(sid, ts, val))
        seq = self._write(parts[0] if len(parts) == 1 else b"".join(parts))
        self._logged[new] = True
        return seq

    def log_tombstone(self, series: list[Labels], mint: int, maxt: int) -> int:
        payload = orjson.dumps({"series": [list(lbl) for lbl in series], "mint": mint, "maxt": maxt})
        return self._write(encode_record(T_TOMBSTONE, payload))

    def sync(self, seq: int, force: bool = False) -> None:
        if self.fsync_mode == "never" or (self.fsync_mode == "batch" and not force):
            return
        if self._synced >= seq:
            return
        with self._sync_lock:
            if self._synced >= seq:
                return
            with self._lock:
                target, fd = self._written, self._fd
            if fd < 0:
                return
            t0 = time.perf_counter()
            os.fsync(fd)
            M.WAL_FSYNC.observe(time.perf_counter() - t0)
            self._synced = max(self._synced, target)

    # --- checkpointing ------------------------------------------------------------------------

    def cut_segment(self) -> int:
        """Close the current segment; later writes go to a new one. Returns the closed number."""
        with self._lock:
            return self._rotate_locked()

    def forget_series(self, keep: np.ndarray) -> None:
        """After a checkpoint: only ``keep`` ids stay defined; others are re-logged on next use."""
        logged = np.zeros(len(self._logged), dtype=bool)
        k = keep[keep < len(logged)]
        logged[k] = self._logged[k]
        self._logged = logged

    def write_checkpoint(self, upto: int, series: list[tuple[int, Labels]], sid: np.ndarray, ts: np.ndarray,
                         val: np.ndarray) -> None:
        """Persist the head as of segment ``upto`` and delete the segments it covers."""
        tmp = self.dir / f"checkpoint.{upto:08d}.tmp"
        with open(tmp, "wb") as f:
            f.write(encode_series(series))
            step = 1 << 20
            for i in range(0, len(sid), step):
                f.write(encode_samples(sid[i:i + step], ts[i:i + step], val[i:i + step]))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / f"checkpoint.{upto:08d}")
        _fsync_dir(self.dir)
        segs, cps = list_wal(self.dir)
        for s in segs:
            if s <= upto:
                (self.dir / f"{s:08d}").unlink(missing_ok=True)
        for c in cps:
            if c < upto:
                (self.dir / f"checkpoint.{c:08d}").unlink(missing_ok=True)

    def size_bytes(self) -> int:
        total = 0
        for p in self.dir.iterdir():
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                pass
        return total
