"""Columnar helpers shared by head, blocks and the read path (vectorized numpy; the merge of two
sorted parts is compiled, storage/csrc/merge_native.c, with the numpy merge as its fallback)."""
from __future__ import annotations

import os

import numpy as np

try:  # built by `make native` (setup.py); optional: the numpy merge gives the same rows
    from storage._merge_native import merge2 as _merge2_native
except ImportError:  # pragma: no cover - exercised by the fallback tests through USE_NATIVE_MERGE
    _merge2_native = None

# The compiled two-way merge when it is built, unless TURBOPROM_NATIVE_MERGE=0 (tests run both).
USE_NATIVE_MERGE = _merge2_native is not None and os.environ.get("TURBOPROM_NATIVE_MERGE", "1") != "0"

INT64_MIN = np.iinfo(np.int64).min
INT64_MAX = np.iinfo(np.int64).max
EMPTY_I64 = np.empty(0, dtype=np.int64)
EMPTY_F64 = np.empty(0, dtype=np.float64)


def ranges_index(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of arange(starts[i], ends[i]) for all i, without a Python loop."""
    starts = np.asarray(starts, dtype=np.int64)
    lens = np.asarray(ends, dtype=np.int64) - starts
    lens = np.maximum(lens, 0)
    total = int(lens.sum())
    if total == 0:
        return EMPTY_I64
    nz = lens > 0
    starts, lens = starts[nz], lens[nz]
    # Each output position = its range's start + position within the range.
    run_begin = np.cumsum(lens) - lens
    out = np.arange(total, dtype=np.int64)
    out += np.repeat(starts - run_begin, lens)
    return out


def is_sorted_by_series_time(sid: np.ndarray, ts: np.ndarray) -> bool:
    if len(sid) <= 1:
        return True
    ds = np.diff(sid)
    return bool(((ds > 0) | ((ds == 0) & (ts[1:] >= ts[:-1]))).all())


def order_by_series_time(sid: np.ndarray, ts: np.ndarray) -> np.ndarray | None:
    """Permutation sorting rows by (sid, ts), stable; None when already sorted.

    One int64 key (sid * span + ts - tmin) when it fits: a single-key sort is several times
    faster than np.lexsort on two keys."""
    n = len(sid)
    if n <= 1 or is_sorted_by_series_time(sid, ts):
        return None
    tmin, tmax = int(ts.min()), int(ts.max())
    smax = int(sid.max())
    span = tmax - tmin + 1
    if smax >= 0 and int(sid.min()) >= 0 and (smax + 1) * span < (1 << 62):
        key = sid * np.int64(span) + (ts - np.int64(tmin))
        return np.argsort(key, kind="stable")
    return np.lexsort((ts, sid))


def take_ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray | slice:
    """Like ranges_index, but a slice when the ascending, non-overlapping ranges are back to
    back (big selections): no index array, no gather copy."""
    if len(starts):
        lens = ends - starts
        total = int(lens.sum())
        if total and int(ends[-1]) - int(starts[0]) == total and (lens >= 0).all():
            return slice(int(starts[0]), int(ends[-1]))
    return ranges_index(starts, ends)


def sort_by_series_time(sid: np.ndarray, ts: np.ndarray, val: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = order_by_series_time(sid, ts)
    if order is None:
        return sid, ts, val
    return sid[order], ts[order], val[order]


def dedupe_sorted(sid: np.ndarray, ts: np.ndarray, val: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Drop rows repeating the previous row's (sid, ts); keeps the first of each key."""
    if len(sid) <= 1:
        return sid, ts, val
    rep = (sid[1:] == sid[:-1]) & (ts[1:] == ts[:-1])
    if not rep.any():
        return sid, ts, val
    keep = np.concatenate(([True], ~rep))
    return sid[keep], ts[keep], val[keep]


def find_keys(a_sid: np.ndarray, a_ts: np.ndarray, b_sid: np.ndarray, b_ts: np.ndarray) -> np.ndarray:
    """For each (a_sid, a_ts) (unique keys), the index of the equal key in b (unique keys), or -1."""
    na, nb = len(a_sid), len(b_sid)
    out = np.full(na, -1, dtype=np.int64)
    if na == 0 or nb == 0:
        return out
    sid = np.concatenate((b_sid, a_sid))
    ts = np.concatenate((b_ts, a_ts))
    tag = np.concatenate((np.zeros(nb, np.int8), np.ones(na, np.int8)))
    order = np.lexsort((tag, ts, sid))  # b before a on equal keys
    pos = np.empty(na + nb, dtype=np.int64)
    pos[order] = np.arange(na + nb)
    a_pos = pos[nb:]
    prev = a_pos - 1
    ok = prev >= 0
    prev_c = np.where(ok, prev, 0)
    prev_row = order[prev_c]
    hit = ok & (prev_row < nb) & (sid[prev_row] == a_sid) & (ts[prev_row] == a_ts)
    out[hit] = prev_row[hit]
    return out


def group_bounds(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unique keys of a sorted array and the [start, end) of each key's rows."""
    if len(sorted_keys) == 0:
        return EMPTY_I64, EMPTY_I64, EMPTY_I64
    change = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
    starts = np.concatenate(([0], change)).astype(np.int64)
    ends = np.concatenate((change, [len(sorted_keys)])).astype(np.int64)
    return sorted_keys[starts], starts, ends


def unique(a: np.ndarray, is_sorted: bool = False) -> np.ndarray:
    """Sorted unique values (np.unique's hash path is slow on the sizes seen here)."""
    if len(a) == 0:
        return a
    if not is_sorted:
        a = np.sort(a)
    keep = np.empty(len(a), dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def grow(arr: np.ndarray, n: int, fill: int | float) -> np.ndarray:
    if len(arr) >= n:
        return arr
    cap = max(n, 2 * len(arr), 1024)
    out = np.full(cap, fill, dtype=arr.dtype)
    out[: len(arr)] = arr
    return out


def _merge2(a: tuple[np.ndarray, np.ndarray, np.ndarray],
            b: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The compiled merge: one pass, rows of ``a`` first on equal keys (as ``_concat_sorted``)."""
    n = len(a[0]) + len(b[0])
    out_s, out_t, out_v = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.float64)
    cols = [np.ascontiguousarray(c, dt) for c, dt in zip((*a, *b), (np.int64, np.int64, np.float64) * 2)]
    m = _merge2_native(*cols, out_s, out_t, out_v)
    if m < n:
        return out_s[:m], out_t[:m], out_v[:m]
    return out_s, out_t, out_v


def _concat_sorted(parts):
    s, t, v = sort_by_series_time(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                                  np.concatenate([p[2] for p in parts]))
    return dedupe_sorted(s, t, v)


def merge_sorted_parts(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge (sid, ts, val) parts, each sorted by (sid, ts) without duplicate keys, into one.

    With the compiled merge: linear two-way merges, pairwise. Without it, the common case - parts
    that follow each other in time for every series they share (blocks, then the head; head runs
    sealed one after another) - is an O(n) scatter: per series, part after part. Parts that
    interleave in time for some series fall back to one sort + dedupe."""
    parts = [p for p in parts if len(p[0])]
    if not parts:
        return EMPTY_I64, EMPTY_I64, EMPTY_F64
    if len(parts) == 1:
        return parts[0]
    parts.sort(key=lambda p: int(p[1].min()))
    if USE_NATIVE_MERGE:  # pairwise, a balanced tree: on equal keys the earlier part's row stays
        while len(parts) > 1:
            parts = [_merge2(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
        return parts[0]
    groups = [group_bounds(p[0]) for p in parts]
    k = len(parts)
    for i in range(k):
        ui, si, ei = groups[i]
        last_i = parts[i][1][ei - 1]
        for j in range(i + 1, k):
            uj, sj, _ = groups[j]
            pos = np.searchsorted(uj, ui)
            posc = np.minimum(pos, len(uj) - 1)
            common = (pos < len(uj)) & (uj[posc] == ui)
            if common.any() and not (last_i[common] < parts[j][1][sj[posc[common]]]).all():
                return _concat_sorted(parts)
    u = unique(np.concatenate([g[0] for g in groups]))
    counts = np.zeros((k, len(u)), dtype=np.int64)
    pos_of = []
    for i, (ug, st, en) in enumerate(groups):
        pos = np.searchsorted(u, ug)
        counts[i, pos] = en - st
        pos_of.append(pos)
    total = counts.sum(axis=0)
    start = np.cumsum(total) - total
    n = int(total.sum())
    out_t = np.empty(n, dtype=np.int64)
    out_v = np.empty(n, dtype=np.float64)
    offset = start.copy()
    for i, (ug, st, en) in enumerate(groups):
        pos = pos_of[i]
        dest = ranges_index(offset[pos], offset[pos] + (en - st))
        out_t[dest] = parts[i][1]
        out_v[dest] = parts[i][2]
        offset += counts[i]
    return np.repeat(u, total), out_t, out_v
