"""Immutable time-partitioned blocks on disk.

``blocks/<id>/`` holds
  data.parquet    series_id int64 (block-local, series ordered by labels), timestamp int64 ms,
                  value float64 - sorted by series then time; DELTA_BINARY_PACKED for ids and
                  timestamps, BYTE_STREAM_SPLIT for values, zstd; row groups of ROW_GROUP rows
  series.parquet  series_id, metric, labels (JSON), row_start, row_end, min_time, max_time
  meta.json       id, minTime, maxTime (inclusive sample bounds), numSamples, numSeries, level,
                  parents (blocks a compaction replaced), bytes
A block is written to ``<id>.tmp`` and renamed into place, so a visible block is complete.

Reads gather the row ranges of the requested series from cached, decoded row groups (timestamp and
value columns only; ids follow from the ranges), all with numpy index arithmetic.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from storage.columns import EMPTY_F64, EMPTY_I64, group_bounds, ranges_index
from storage.labels import Labels, metric_name
from storage.select_csr import Segment, segment_of_rows

ROW_GROUP = 1 << 17
DATA_FILE, SERIES_FILE, META_FILE = "data.parquet", "series.parquet", "meta.json"


def new_block_id(mint: int) -> str:
    # Sortable by time like a ULID: zero-padded min time, creation time, random suffix.
    return f"b{max(mint, 0):015d}-{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:6]}"


class _RowGroupCache:
    """LRU of decoded (timestamp, value) row groups, bounded by bytes, shared by all blocks.

    A read may pass a token (any object, one per read): an entry that read has used is never
    evicted to make room for another row group of the same read; that row group is then not kept.
    So a read touching more row groups than fit (a wide 24 h panel) keeps the cache's first part
    and repeats of it hit there, instead of each row group evicting the one it needs next (plain
    LRU over a loop larger than the cache hits nothing)."""

    def __init__(self, max_bytes: int = 256 << 20) -> None:
        self.max_bytes = max_bytes
        # key -> (timestamps, values, token of the read that used it last)
        self._d: OrderedDict[tuple[str, int], tuple[np.ndarray, np.ndarray, object]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int], token: object = None) -> tuple[np.ndarray, np.ndarray] | None:
        with self._lock:
            e = self._d.get(key)
            if e is None:
                return None
            self._d.move_to_end(key)
            if token is not None and e[2] is not token:
                self._d[key] = (e[0], e[1], token)
            return e[0], e[1]

    def put(self, key: tuple[str, int], v: tuple[np.ndarray, np.ndarray], token: object = None) -> None:
        size = v[0].nbytes + v[1].nbytes
        with self._lock:
            if key in self._d:
                return
            self._d[key] = (v[0], v[1], token)
            self._bytes += size
            while self._bytes > self.max_bytes and len(self._d) > 1:
                oldest = next(iter(self._d))
                if token is not None and self._d[oldest][2] is token:
                    del self._d[key]  # this read needs what it would evict: do not keep this one
                    self._bytes -= size
                    return
                old = self._d.pop(oldest)
                self._bytes -= old[0].nbytes + old[1].nbytes

    def drop_block(self, block_id: str) -> None:
        with self._lock:
            for k in [k for k in self._d if k[0] == block_id]:
                old = self._d.pop(k)
                self._bytes -= old[0].nbytes + old[1].nbytes


CACHE = _RowGroupCache()


def labels_json(labels: Labels) -> str:
    """The label-set encoding of series.parquet (deterministic for equal label sets)."""
    return orjson.dumps(dict(labels)).decode()


def parse_labels_json(text: str) -> Labels:
    return tuple(sorted(orjson.loads(text).items()))


def write_block(blocks_dir: Path, labels: list[Labels], sid: np.ndarray, ts: np.ndarray, val: np.ndarray, *,
                level: int = 1, parents: list[str] | None = None) -> Path:
    """Write rows (``sid`` indexes ``labels``; rows sorted by sid then ts) as a new block."""
    u, starts, ends = group_bounds(sid)
    lbls = [labels[i] for i in u.tolist()]
    perm = sorted(range(len(u)), key=lbls.__getitem__)
    p = np.asarray(perm, dtype=np.int64)
    idx = ranges_index(starts[p], ends[p])
    ts, val = np.ascontiguousarray(ts[idx]), np.ascontiguousarray(val[idx])
    lens = (ends - starts)[p]
    lbls = [lbls[i] for i in perm]
    local = np.repeat(np.arange(len(lbls), dtype=np.int64), lens)
    row_end = np.cumsum(lens)
    row_start = row_end - lens
    mint, maxt = int(ts.min()), int(ts.max())
    bid = new_block_id(mint)
    tmp = blocks_dir / f"{bid}.tmp"
    tmp.mkdir(parents=True)
    table = pa.table({"series_id": pa.array(local, pa.int64()), "timestamp": pa.array(ts, pa.int64()),
                      "value": pa.array(val, pa.float64())})
    pq.write_table(table, tmp / DATA_FILE, row_group_size=ROW_GROUP, compression="zstd", compression_level=6,
                   use_dictionary=False, write_statistics=["series_id", "timestamp"],
                   column_encoding={"series_id": "DELTA_BINARY_PACKED", "timestamp": "DELTA_BINARY_PACKED",
                                    "value": "BYTE_STREAM_SPLIT"})
    ser_min = ts[row_start] if len(ts) else EMPTY_I64
    ser_max = ts[row_end - 1] if len(ts) else EMPTY_I64
    series_table = pa.table({
        "series_id": pa.array(np.arange(len(lbls), dtype=np.int64)),
        "metric": pa.array([metric_name(lb) for lb in lbls], pa.string()),
        "labels": pa.array([labels_json(lb) for lb in lbls], pa.string()),
        "row_start": pa.array(row_start, pa.int64()), "row_end": pa.array(row_end, pa.int64()),
        "min_time": pa.array(ser_min, pa.int64()), "max_time": pa.array(ser_max, pa.int64()),
    })
    pq.write_table(series_table, tmp / SERIES_FILE, compression="zstd")
    data_bytes = (tmp / DATA_FILE).stat().st_size + (tmp / SERIES_FILE).stat().st_size
    meta = {"id": bid, "minTime": mint, "maxTime": maxt, "numSamples": int(len(ts)), "numSeries": len(lbls),
            "level": level, "parents": parents or [], "bytes": data_bytes, "createdMs": int(time.time() * 1000)}
    (tmp / META_FILE).write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    for name in (DATA_FILE, SERIES_FILE, META_FILE):
        fd = os.open(tmp / name, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    final = blocks_dir / bid
    os.replace(tmp, final)
    fd = os.open(blocks_dir, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return final


@dataclass(frozen=True)
class UnreadableBlock:
    """A block directory skipped at start-up because it could not be opened (left on disk for
    inspection). Its time range is None when its meta.json itself is unreadable."""

    name: str
    reason: str
    min_time: int | None = None
    max_time: int | None = None

    def overlaps(self, mint: int, maxt: int) -> bool:
        if self.min_time is None or self.max_time is None:
            return True  # unknown range: it may hold any time
        return self.min_time <= maxt and mint <= self.max_time

    def to_json(self) -> dict:
        return {"name": self.name, "reason": self.reason, "minTime": self.min_time, "maxTime": self.max_time}


class BlockGone(Exception):
    """The block was replaced (compaction) or deleted (retention) while a reader held it."""


class Block:
    """An opened block: series mapped to global ids, data read lazily by row group.

    Readers hold a reference while reading; ``remove`` deletes the files once no reader does, and a
    reader that arrives after removal gets BlockGone (the caller retries with a fresh block list)."""

    def __init__(self, path: Path, global_ids_of) -> None:
        # global_ids_of: callable(list of label-JSON strings) -> int64 array of global series ids
        self.path = Path(path)
        meta = orjson.loads((self.path / META_FILE).read_bytes())
        self.meta = meta
        self.id: str = meta["id"]
        self.mint: int = int(meta["minTime"])
        self.maxt: int = int(meta["maxTime"])
        self.num_samples: int = int(meta["numSamples"])
        self.level: int = int(meta.get("level", 1))
        self.parents: list[str] = list(meta.get("parents", []))
        st = pq.read_table(self.path / SERIES_FILE)
        label_json = st.column("labels").to_pylist()
        self._num_series = len(label_json)
        self.row_start = st.column("row_start").to_numpy().astype(np.int64)
        self.row_end = st.column("row_end").to_numpy().astype(np.int64)
        self.ser_min = st.column("min_time").to_numpy().astype(np.int64)
        self.ser_max = st.column("max_time").to_numpy().astype(np.int64)
        self.local_to_global = np.asarray(global_ids_of(label_json), dtype=np.int64)
        self._g_order = np.argsort(self.local_to_global, kind="stable")
        self._g_sorted = self.local_to_global[self._g_order]
        self._pf: pq.ParquetFile | None = None
        self._pf_lock = threading.Lock()
        self._refs = 0
        self._removed = False
        self.size_bytes = sum(p.stat().st_size for p in self.path.iterdir() if p.is_file())

    @property
    def num_series(self) -> int:
        return self._num_series

    def _file(self) -> pq.ParquetFile:
        with self._pf_lock:
            if self._pf is None:
                self._pf = pq.ParquetFile(self.path / DATA_FILE)
                md = self._pf.metadata
                sizes = np.array([md.row_group(i).num_rows for i in range(md.num_row_groups)], dtype=np.int64)
                self._rg_start = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
                self._rg_len = sizes
            return self._pf

    def _row_group(self, g: int, token: object = None) -> tuple[np.ndarray, np.ndarray]:
        key = (self.id, g)
        v = CACHE.get(key, token)
        if v is None:
            pf = self._file()
            with self._pf_lock:
                t = pf.read_row_group(g, columns=["timestamp", "value"])
            v = (t.column("timestamp").to_numpy(), t.column("value").to_numpy())
            CACHE.put(key, v, token)
        return v

    def local_ids(self, sids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(global ids present in this block, their local ids), in ascending global id order."""
        if len(self._g_sorted) == 0 or len(sids) == 0:
            return EMPTY_I64, EMPTY_I64
        pos = np.searchsorted(self._g_sorted, sids)
        pos_c = np.minimum(pos, len(self._g_sorted) - 1)
        present = (pos < len(self._g_sorted)) & (self._g_sorted[pos_c] == sids)
        return sids[present], self._g_order[pos_c[present]]

    def gather(self, sids: np.ndarray, mint: int, maxt: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows of sorted unique global ids within [mint, maxt], sorted by (global id, ts)."""
        with self._in_use():
            return self._gather(sids, mint, maxt)

    @contextmanager
    def _in_use(self) -> Iterator[None]:
        """A read of this block's files: refused once the block is removed (a compaction replaced
        it), and the files of a removed block are deleted only when its last read ends."""
        with self._pf_lock:
            if self._removed:
                raise BlockGone(self.id)
            self._refs += 1
        try:
            yield
        finally:
            with self._pf_lock:
                self._refs -= 1
                delete_now = self._removed and self._refs == 0
            if delete_now:
                shutil.rmtree(self.path, ignore_errors=True)

    def _gather(self, sids: np.ndarray, mint: int, maxt: int,
                token: object = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        g, loc = self.local_ids(sids)
        if len(g):
            overlap = (self.ser_min[loc] <= maxt) & (self.ser_max[loc] >= mint)
            g, loc = g[overlap], loc[overlap]
        if not len(g):
            return EMPTY_I64, EMPTY_I64, EMPTY_F64
        self._file()
        starts, ends = self.row_start[loc], self.row_end[loc]
        rows = ranges_index(starts, ends)
        rg = np.searchsorted(self._rg_start, rows, "right") - 1
        local_row = rows - self._rg_start[rg]
        n = len(rows)
        if n == 0:
            return EMPTY_I64, EMPTY_I64, EMPTY_F64
        if int(rg[0]) == int(rg[-1]) and (n == 1 or (rg == rg[0]).all()):
            ts_g, val_g = self._row_group(int(rg[0]), token)
            t, v = ts_g[local_row], val_g[local_row]
        else:
            # Gather row group by row group (no concatenation of whole decoded row groups).
            order = np.argsort(rg, kind="stable")
            rg_sorted = rg[order]
            groups, gstart, gend = group_bounds(rg_sorted)
            t = np.empty(n, dtype=np.int64)
            v = np.empty(n, dtype=np.float64)
            for gi, a, b in zip(groups.tolist(), gstart.tolist(), gend.tolist()):
                ts_g, val_g = self._row_group(gi, token)
                pos = order[a:b]
                lr = local_row[pos]
                t[pos] = ts_g[lr]
                v[pos] = val_g[lr]
        s = np.repeat(g, ends - starts)
        if mint > self.mint or maxt < self.maxt:
            m = (t >= mint) & (t <= maxt)
            s, t, v = s[m], t[m], v[m]
        return s, t, v

    def segments(self, sids: np.ndarray, mint: int, maxt: int, token: object = None) -> list[Segment]:
        """This block's rows of sorted unique global ids within [mint, maxt] as segments
        (storage/select_csr.py), all with the block's ``mint`` as their time (they keep row-group
        order, which is time order per series): row ranges of the cached decoded row groups the
        series touch (no copy here); for series the range cuts, found in a composite key of each
        row group (where that key would not fit in int64: gathered and filtered into one more
        segment)."""
        with self._in_use():
            return self._segments(sids, mint, maxt, token)

    def _groups_touched(self, starts: np.ndarray, ends: np.ndarray) -> list[int]:
        """Row groups holding any of the row ranges [starts[i], ends[i]) (each non-empty)."""
        rg_start = self._rg_start
        ng = len(rg_start)
        g_first = np.searchsorted(rg_start, starts, "right") - 1
        g_last = np.searchsorted(rg_start, ends - 1, "right") - 1
        marks = np.bincount(g_first, minlength=ng + 1) - np.bincount(g_last + 1, minlength=ng + 1)
        return np.flatnonzero(np.cumsum(marks[:ng]) > 0).tolist()

    def _segments(self, sids: np.ndarray, mint: int, maxt: int, token: object) -> list[Segment]:
        k, g_sorted = len(sids), self._g_sorted
        if not len(g_sorted) or not k:
            return []
        pos = np.minimum(np.searchsorted(g_sorted, sids), len(g_sorted) - 1)
        loc = self._g_order[pos]  # meaningful where present
        smin, smax = self.ser_min[loc], self.ser_max[loc]
        present = (g_sorted[pos] == sids) & (smin <= maxt) & (smax >= mint)
        if not present.any():
            return []
        self._file()
        rg_start, rg_len = self._rg_start, self._rg_len
        rs, re_ = self.row_start[loc], self.row_end[loc]
        inside = present & (smin >= mint) & (smax <= maxt)
        partial = present & ~inside
        out: list[Segment] = []
        if inside.any():
            starts = np.where(inside, rs, 0)
            ends = np.where(inside, re_, 0)
            for g in self._groups_touched(starts[inside], ends[inside]):
                ts_g, val_g = self._row_group(g, token)
                base, n_g = int(rg_start[g]), int(rg_len[g])
                lo = starts - base
                np.clip(lo, 0, n_g, out=lo)
                hi = ends - base
                np.clip(hi, 0, n_g, out=hi)
                out.append(Segment(self.mint, ts_g, val_g, lo, hi))
        span = self.maxt - self.mint + 1
        groups = self._groups_touched(rs[partial], re_[partial]) if partial.any() else []
        # Series the range cuts: when they hold a good part of the row groups they touch, their
        # rows in [mint, maxt] are found by two binary searches each in a row group's composite key
        # (local id * span + ts - block mint), built on the fly (the rows stay where they are: no
        # gather, no filter); a few series in big row groups are gathered and filtered instead.
        if groups and (self._num_series + 1) * span < (1 << 62) and \
                4 * int((re_[partial] - rs[partial]).sum()) >= int(rg_len[groups].sum()):
            p_loc = np.where(partial, loc, -1)
            lo_off = max(mint, self.mint) - self.mint
            hi_off = min(maxt, self.maxt) - self.mint + 1
            for g in groups:
                ts_g, val_g = self._row_group(g, token)
                base, n_g = int(rg_start[g]), int(rg_len[g])
                first = int(np.searchsorted(self.row_end, base, "right"))  # block series with rows in g
                last = int(np.searchsorted(self.row_start, base + n_g, "left"))
                counts = np.minimum(self.row_end[first:last], base + n_g) - np.maximum(self.row_start[first:last], base)
                key = np.arange(first, last, dtype=np.int64).repeat(counts)
                key *= np.int64(span)
                key += ts_g
                key -= np.int64(self.mint)
                needle = p_loc * np.int64(span)
                lo = np.searchsorted(key, needle + lo_off)
                hi = np.searchsorted(key, needle + hi_off)
                hi[~partial] = 0
                lo[~partial] = 0
                out.append(Segment(self.mint, ts_g, val_g, lo, hi))
            partial = np.zeros(k, dtype=bool)
        if partial.any():  # a few series in big row groups: gathered and filtered
            ps, pt, pv = self._gather(sids[partial], mint, maxt, token)
            out.append(segment_of_rows(self.mint, sids, ps, pt, pv))
        return out

    def read_all(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All rows as (local id, ts, value)."""
        t = pq.read_table(self.path / DATA_FILE)
        return (t.column("series_id").to_numpy().astype(np.int64), t.column("timestamp").to_numpy().astype(np.int64),
                t.column("value").to_numpy().astype(np.float64))

    def series_mask(self, n: int, mint: int, maxt: int) -> np.ndarray:
        mask = np.zeros(n, dtype=bool)
        sel = (self.ser_min <= maxt) & (self.ser_max >= mint)
        g = self.local_to_global[sel]
        mask[g[g < n]] = True
        return mask

    def remove(self) -> None:
        with self._pf_lock:
            self._removed = True
            delete_now = self._refs == 0
        CACHE.drop_block(self.id)
        if delete_now:
            shutil.rmtree(self.path, ignore_errors=True)
