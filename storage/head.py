"""The in-memory head: recent samples as columnar runs.

Accepted batches are appended as (sid, ts, value) column triples to a pending list (O(1) per batch,
no sort on the ingest path). The maintenance thread (every second), a block cut, or a read that finds
more than ``SEAL_ON_READ_ROWS`` unsealed rows seals pending data into a *run*: the same columns
sorted by (sid, ts). Runs are merged LSM-style (a run is merged into its predecessor while that one is
at most twice its size), so a read touches a few sorted runs. Each run carries its time range and a
composite key (sid, ts) built when the run is built (off the read path), so a time-bounded read of k
series costs O(k log n + result) per run and skips runs and pending pieces outside its time range.
Runs are immutable once built; readers take a snapshot of the run list under the lock and work
outside it. One seal lock orders everything that replaces the run list (seal, merges, deletions).

Validation (``prepare``) is vectorized over the batch: future timestamps, in-batch duplicates,
out-of-order against each series' last timestamp, exact duplicates (idempotent) and conflicting
values at an existing timestamp (looked up in the head), and the out-of-order window.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from storage.columns import (INT64_MAX, INT64_MIN, dedupe_sorted, find_keys, group_bounds, grow, merge_sorted_parts,
                             order_by_series_time, ranges_index, sort_by_series_time, take_ranges, unique)
from storage.select_csr import Segment, segment_of_rows

R_FUTURE = "too_far_in_future"
R_OOO = "out_of_order"
R_TOO_OLD = "too_old"
R_DUP_TS = "duplicate_timestamp"
R_RETENTION = "beyond_retention"


# A read that finds more unsealed rows than this sorts them into a run first (when no other seal is
# running): bounded scan work per read; the sort is paid once for all later reads.
SEAL_ON_READ_ROWS = 1 << 16


class Run:
    """Rows sorted by (sid, ts) without repeated keys, plus what bounded reads search in.

    Rows are stored as ``key = sid * span + (ts - tmin)`` (monotone over the run), ``ts`` and
    ``val``: the key replaces the series-id column (same 24 bytes per row) and ``sid`` is derived
    from it when a background operation (merge, cut, deletion) needs it. When the key would not fit
    in int64 (huge time spans) the run keeps ``sid`` instead and reads filter the series' rows."""

    __slots__ = ("_sid", "ts", "val", "tmin", "tmax", "span", "key")

    def __init__(self, sid: np.ndarray, ts: np.ndarray, val: np.ndarray) -> None:
        self.ts, self.val = ts, val
        self._sid: np.ndarray | None = sid
        self.key: np.ndarray | None = None
        if len(sid) == 0:
            self.tmin, self.tmax, self.span = INT64_MAX, INT64_MIN, 0
            return
        self.tmin, self.tmax = int(ts.min()), int(ts.max())
        self.span = self.tmax - self.tmin + 1
        if int(sid[0]) >= 0 and (int(sid[-1]) + 1) * self.span < (1 << 62):
            key = sid * np.int64(self.span)
            key += ts
            key -= np.int64(self.tmin)
            self.key = key
            self._sid = None

    @property
    def sid(self) -> np.ndarray:
        """Series id per row (derived from the key: O(n), for background operations, not reads)."""
        if self._sid is not None:
            return self._sid
        return self.key // np.int64(self.span)

    def __len__(self) -> int:
        return len(self.ts)

    def overlaps(self, mint: int, maxt: int) -> bool:
        return self.tmin <= maxt and self.tmax >= mint

    def bounds(self, sids: np.ndarray, mint: int, maxt: int) -> tuple[np.ndarray, np.ndarray] | None:
        """[lo, hi) row ranges of ``sids`` restricted to [mint, maxt], or None if the run has no
        composite key (caller filters instead)."""
        lo_t, hi_t = max(mint, self.tmin), min(maxt, self.tmax)
        if lo_t > hi_t:
            none = np.zeros(len(sids), dtype=np.int64)
            return none, none
        key = self.key
        if key is None:
            return None
        # One search for both ends, needles interleaved (lo_0, hi_0, lo_1, ...; ascending): each end
        # is found next to the other (cache-warm). "right of hi" == "left of hi + 1" on int keys.
        base = sids * np.int64(self.span)
        needles = np.empty(2 * len(sids), dtype=np.int64)
        np.add(base, np.int64(lo_t - self.tmin), out=needles[0::2])
        np.add(base, np.int64(hi_t - self.tmin + 1), out=needles[1::2])
        pos = np.searchsorted(key, needles, "left")
        return pos[0::2], pos[1::2]


class Piece(NamedTuple):
    """Accepted rows not yet sealed, with their time range. One batch's rows come sorted by (sid, ts)
    (``by_series``), so a read finds its series by binary search; pieces joined together are in no
    particular order and are scanned whole."""

    sid: np.ndarray
    ts: np.ndarray
    val: np.ndarray
    tmin: int
    tmax: int
    by_series: bool = False


@dataclass
class Prepared:
    """Outcome of validating one batch: the accepted rows (sorted by sid, ts) plus counts."""

    sid: np.ndarray
    ts: np.ndarray
    val: np.ndarray
    duplicates: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    # (reason, batch sample position) of the first few rejections, for messages
    examples: list[tuple[str, int, int]] = field(default_factory=list)
    # batch position of each accepted row (parallel to sid/ts/val): maps the sort back to the batch
    positions: np.ndarray | None = None

    def accepted_mask(self, n: int) -> np.ndarray:
        """Bool per batch sample (batch order): True where this row was accepted."""
        mask = np.zeros(n, dtype=bool)
        if self.positions is not None:
            mask[self.positions] = True
        return mask


def _merge_segments(sids: np.ndarray, segs: list[tuple[Run, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Rows ``lo[i]:hi[i]`` of each run for series ``sids[i]``, as one (sid, ts) sorted result, by
    an O(result) scatter: per series, run after run in time order. None when, for some series, a
    run's rows do not all follow the earlier runs' rows in time (the caller then merges generically)."""
    segs = sorted(segs, key=lambda x: x[0].tmin)
    if len(segs) == 1:
        r, lo, hi = segs[0]
        idx = take_ranges(lo, hi)
        return np.repeat(sids, hi - lo), r.ts[idx], r.val[idx]
    lens = np.stack([hi - lo for _, lo, hi in segs])  # runs x series
    has = lens > 0
    first = np.full(lens.shape, INT64_MAX, dtype=np.int64)
    last = np.full(lens.shape, INT64_MIN, dtype=np.int64)
    for j, (r, lo, hi) in enumerate(segs):
        h = has[j]
        first[j, h] = r.ts[lo[h]]
        last[j, h] = r.ts[hi[h] - 1]
    if not (first[1:] > np.maximum.accumulate(last, axis=0)[:-1]).all():
        return None
    total = lens.sum(axis=0)
    n = int(total.sum())
    out_t = np.empty(n, dtype=np.int64)
    out_v = np.empty(n, dtype=np.float64)
    off = np.cumsum(total) - total
    for j, (r, lo, hi) in enumerate(segs):
        if has[j].any():
            src = take_ranges(lo, hi)
            dest = ranges_index(off, off + lens[j])
            out_t[dest] = r.ts[src]
            out_v[dest] = r.val[src]
            off = off + lens[j]
    return np.repeat(sids, total), out_t, out_v


def _piece_rows(pieces: list, sids: np.ndarray, mint: int, maxt: int,
                bounded: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Rows of the not yet sealed pieces (at most about SEAL_ON_READ_ROWS rows, unless a seal is
    running) for sorted unique ``sids`` (and, when ``bounded``, within [mint, maxt]), sorted by
    (sid, ts) without repeats: a membership test by binary search in the wanted ids; None if none."""
    pieces = [p for p in pieces if p.tmin <= maxt and p.tmax >= mint]
    if not pieces or not len(sids):
        return None
    got = []
    last = len(sids) - 1
    for p in pieces:
        if p.by_series and len(p.sid) > 8 * len(sids):  # O(k log n): the k wanted series' rows by binary search
            lo, hi = np.searchsorted(p.sid, sids, "left"), np.searchsorted(p.sid, sids, "right")
            if not (hi > lo).any():
                continue
            idx = take_ranges(lo, hi)
            ps, pt, pv = p.sid[idx], p.ts[idx], p.val[idx]
            if bounded:
                m = (pt >= mint) & (pt <= maxt)
                if not m.all():
                    ps, pt, pv = ps[m], pt[m], pv[m]
            if len(ps):
                got.append((ps, pt, pv))
            continue
        pos = np.minimum(np.searchsorted(sids, p.sid), last)
        m = sids[pos] == p.sid
        if bounded:
            m &= (p.ts >= mint) & (p.ts <= maxt)
        if m.any():
            got.append((p.sid[m], p.ts[m], p.val[m]))
    if not got:
        return None
    return dedupe_sorted(*sort_by_series_time(np.concatenate([g[0] for g in got]),
                                              np.concatenate([g[1] for g in got]),
                                              np.concatenate([g[2] for g in got])))


class Head:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._seal_lock = threading.RLock()  # held by whatever replaces the run list
        self._runs: list[Run] = []
        self._pending: list[Piece] = []
        self._sealing: list[Piece] = []
        self._pending_n = 0
        self.num_samples = 0
        self.mint = INT64_MAX
        self.maxt = INT64_MIN
        # Per series id: newest accepted timestamp (and its value bits), and the head's time range.
        self.last_ts = np.full(0, INT64_MIN, dtype=np.int64)
        self.last_bits = np.zeros(0, dtype=np.uint64)
        self.series_min = np.full(0, INT64_MAX, dtype=np.int64)
        self.series_max = np.full(0, INT64_MIN, dtype=np.int64)

    def ensure(self, n: int) -> None:
        if len(self.last_ts) < n:
            self.last_ts = grow(self.last_ts, n, INT64_MIN)
            self.last_bits = grow(self.last_bits, n, 0)
            self.series_min = grow(self.series_min, n, INT64_MAX)
            self.series_max = grow(self.series_max, n, INT64_MIN)

    # --- write path ---------------------------------------------------------------------------

    def prepare(self, sid: np.ndarray, ts: np.ndarray, val: np.ndarray, *, now_ms: int, future_tolerance_ms: int,
                ooo_window_ms: int, min_valid_time: int, lookup_persisted=None, retention_min: int = INT64_MIN) -> Prepared:
        """Validate a batch (caller holds the write lock). Does not modify the head.

        ``retention_min``: samples older than it are refused (``beyond_retention``): retention would
        delete them at once, so acknowledging them would lose them silently.

        ``lookup_persisted(sid, ts) -> (index or -1, value bits)`` finds samples in blocks; it is
        only asked about samples older than ``min_valid_time`` (the persisted range)."""
        n = len(ts)
        rejected: dict[str, int] = {}
        examples: list[tuple[str, int, int]] = []

        def reject(reason: str, rows: np.ndarray, positions: np.ndarray) -> None:
            c = int(rows.sum()) if rows.dtype == bool else len(rows)
            if c:
                rejected[reason] = rejected.get(reason, 0) + c
                if len(examples) < 5:
                    pos = positions[rows] if rows.dtype == bool else positions[rows]
                    for p in pos[: 5 - len(examples)]:
                        examples.append((reason, int(p), 0))

        positions = np.arange(n, dtype=np.int64)
        s, t, v = sid, ts, val
        if future_tolerance_ms > 0:
            fut = ts > now_ms + future_tolerance_ms
            if fut.any():
                reject(R_FUTURE, fut, positions)
                positions = positions[~fut]
                s, t, v = sid[positions], ts[positions], val[positions]
        if retention_min != INT64_MIN:
            gone = t < retention_min
            if gone.any():
                reject(R_RETENTION, gone, positions)
                positions = positions[~gone]
                s, t, v = sid[positions], ts[positions], val[positions]
        o = order_by_series_time(s, t)
        order = positions
        if o is not None:  # (already sorted, the common case: no copies)
            order = positions[o]
            s, t, v = s[o], t[o], v[o]
        bits = v.view(np.uint64)
        duplicates = 0
        # In-batch repeats of a key: identical value -> duplicate, different -> conflict.
        if len(s) > 1:
            same = np.concatenate(([False], (s[1:] == s[:-1]) & (t[1:] == t[:-1])))
            if same.any():
                first = np.maximum.accumulate(np.where(~same, np.arange(len(s)), 0))
                dup = same & (bits == bits[first])
                duplicates += int(dup.sum())
                reject(R_DUP_TS, same & ~dup, order)
                keep = ~same
                s, t, v, bits, order = s[keep], t[keep], v[keep], bits[keep], order[keep]
        prev = self.last_ts[s]
        # Fast path: newer than the series' newest sample and than everything persisted.
        accept = (t > prev) & (t >= min_valid_time)
        eq = t == prev
        if eq.any():
            dup = eq & (bits == self.last_bits[s])
            duplicates += int(dup.sum())
            reject(R_DUP_TS, eq & ~dup, order)
        slow = ~accept & ~eq
        if slow.any():
            # Older than the series' newest sample or than the persisted range: an exact
            # duplicate anywhere (head or blocks) is idempotent, a different value at an existing
            # timestamp a conflict; otherwise the out-of-order window decides.
            cand = np.flatnonzero(slow)
            cs, ct = s[cand], t[cand]
            found, found_bits = self._lookup(cs, ct)
            hit = found >= 0
            same = np.zeros(len(cand), dtype=bool)
            same[hit] = found_bits[found[hit]] == bits[cand[hit]]
            if lookup_persisted is not None:
                old = ~hit & (ct < min_valid_time)
                if old.any():
                    pf, pbits = lookup_persisted(cs[old], ct[old])
                    phit = pf >= 0
                    if phit.any():
                        oi = np.flatnonzero(old)
                        hit[oi[phit]] = True
                        same[oi[phit]] = pbits[pf[phit]] == bits[cand[oi[phit]]]
            duplicates += int((hit & same).sum())
            reject(R_DUP_TS, cand[hit & ~same], order)
            miss = cand[~hit]
            if len(miss):
                # Like Prometheus, the window is measured back from the newest sample in the head.
                ooo_min = (self.maxt - ooo_window_ms) if self.maxt != INT64_MIN else INT64_MIN
                tm = t[miss]
                ok = (tm >= ooo_min) if ooo_window_ms > 0 else np.zeros(len(miss), dtype=bool)
                accept[miss[ok]] = True
                bad = miss[~ok]
                if len(bad):
                    ooo = (t[bad] < prev[bad]) & (ooo_window_ms == 0)
                    reject(R_OOO, bad[ooo], order)
                    reject(R_TOO_OLD, bad[~ooo], order)
        if accept.all():
            # the head keeps these arrays: never the caller's own (a sink may still use the batch)
            return Prepared(s if s is not sid else s.copy(), t if t is not ts else t.copy(),
                            v if v is not val else v.copy(), duplicates, rejected, examples, order)
        return Prepared(s[accept], t[accept], v[accept], duplicates, rejected, examples, order[accept])

    def _lookup(self, sid: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Index of each (sid, ts) among the head rows of those series (or -1), and those rows' value bits."""
        rs, rt, rv = self.gather(unique(sid, is_sorted=True))
        return find_keys(sid, ts, rs, rt), rv.view(np.uint64)

    def commit(self, sid: np.ndarray, ts: np.ndarray, val: np.ndarray, as_run: bool = False) -> None:
        """Add accepted rows (sorted by sid, ts). Caller holds the write lock.

        ``as_run``: the rows become a sorted run directly (bulk loads such as WAL replay)."""
        if len(sid) == 0:
            return
        self.ensure(int(sid[-1]) + 1)  # rows are sorted by sid
        if len(sid) == 1 or bool((sid[1:] != sid[:-1]).all()):
            u, first_t, last_t, last_v = sid, ts, ts, val  # one row per series (scrape-shaped): no grouping
        else:
            u, starts, ends = group_bounds(sid)
            first_t, last_t, last_v = ts[starts], ts[ends - 1], val[ends - 1]
        newer = last_t > self.last_ts[u]
        if newer.all():
            self.last_ts[u] = last_t
            self.last_bits[u] = last_v.view(np.uint64)
        else:
            self.last_ts[u[newer]] = last_t[newer]
            self.last_bits[u[newer]] = last_v[newer].view(np.uint64)
        self.series_min[u] = np.minimum(self.series_min[u], first_t)
        self.series_max[u] = np.maximum(self.series_max[u], last_t)
        tmin, tmax = int(ts.min()), int(ts.max())
        if as_run:
            run = Run(sid, ts, val)
            with self._seal_lock:
                self.seal(merge=False)  # earlier pending rows stay ahead of this run
                with self.lock:
                    self._runs = self._runs + [run]
                    self._account(len(sid), tmin, tmax)
            return
        with self.lock:
            self._pending.append(Piece(sid, ts, val, tmin, tmax, by_series=True))  # rows come sorted by (sid, ts)
            self._pending_n += len(sid)
            self._account(len(sid), tmin, tmax)
            if len(self._pending) > 64:
                # bound the pieces a read iterates: the newest 64 become one (older such chunks stay
                # as they are, so pending rows are not copied again and again)
                self._pending = self._pending[:-64] + [self._concat_pending(self._pending[-64:])]

    def _account(self, n: int, tmin: int, tmax: int) -> None:
        self.num_samples += n
        self.mint = min(self.mint, tmin)
        self.maxt = max(self.maxt, tmax)

    @staticmethod
    def _concat_pending(p: list[Piece]) -> Piece:
        if len(p) == 1:
            return p[0]
        return Piece(np.concatenate([x.sid for x in p]), np.concatenate([x.ts for x in p]), np.concatenate([x.val for x in p]),
                     min(x.tmin for x in p), max(x.tmax for x in p))

    def seal(self, merge: bool = True) -> list[Run]:
        """Sort pending rows into a run, then (``merge``) do the LSM merges; return the run list.

        The sort and the merges run outside the read lock: readers see the rows as unsorted pieces
        until the sorted run is published (right after the sort), and the runs before a merge until
        the merged run replaces them."""
        with self._seal_lock:
            with self.lock:
                pieces = self._pending
                if pieces:
                    self._sealing = pieces
                    self._pending = []
                    self._pending_n = 0
            if pieces:
                s, t, v = sort_by_series_time(np.concatenate([x.sid for x in pieces]), np.concatenate([x.ts for x in pieces]),
                                              np.concatenate([x.val for x in pieces]))
                run = Run(s, t, v)
                with self.lock:
                    self._runs = self._runs + [run]
                    self._sealing = []
            if merge:
                runs = list(self._runs)  # only seal-lock holders replace the run list
                merged = False
                while len(runs) >= 2 and len(runs[-2]) <= 2 * len(runs[-1]):
                    b = runs.pop()
                    a = runs.pop()
                    runs.append(Run(*merge_sorted_parts([(a.sid, a.ts, a.val), (b.sid, b.ts, b.val)])))
                    merged = True
                if merged:
                    with self.lock:
                        self._runs = runs
            with self.lock:
                return list(self._runs)

    def _seal_for_read(self) -> None:
        """Sort pending rows into a run (no merges) unless another seal is running right now."""
        if self._seal_lock.acquire(blocking=False):
            try:
                self.seal(merge=False)
            finally:
                self._seal_lock.release()

    _seal = seal

    # --- read path ----------------------------------------------------------------------------

    def _snapshot(self) -> tuple[list[Run], list[Piece]]:
        with self.lock:
            return list(self._runs), list(self._pending) + list(self._sealing)

    snapshot = _snapshot

    @staticmethod
    def rows_of(snap: tuple[list[Run], list[Piece]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All rows of a snapshot, sorted by (sid, ts)."""
        runs, pieces = snap
        parts = [(r.sid, r.ts, r.val) for r in runs]
        if pieces:
            parts.append(dedupe_sorted(*sort_by_series_time(np.concatenate([p.sid for p in pieces]),
                                                            np.concatenate([p.ts for p in pieces]),
                                                            np.concatenate([p.val for p in pieces]))))
        return merge_sorted_parts(parts)

    def gather(self, sids: np.ndarray, mint: int = INT64_MIN, maxt: int = INT64_MAX) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows of the given sorted unique series ids within [mint, maxt], sorted by (sid, ts)."""
        runs, pieces = self._snapshot()
        if sum(len(p.sid) for p in pieces) > SEAL_ON_READ_ROWS:
            self._seal_for_read()
            runs, pieces = self._snapshot()
        bounded = mint != INT64_MIN or maxt != INT64_MAX
        parts = []
        segs = []  # (run, lo, hi): keyed runs, rows of sids[i] in [mint, maxt] are lo[i]:hi[i]
        for r in runs:
            if not r.overlaps(mint, maxt):
                continue
            b = r.bounds(sids, mint, maxt)
            if b is not None:
                segs.append((r, b[0], b[1]))
                continue
            rs = r.sid  # no key: this run keeps its sid column
            lo = np.searchsorted(rs, sids, "left")
            hi = np.searchsorted(rs, sids, "right")
            if not bounded:
                segs.append((r, lo, hi))
                continue
            idx = take_ranges(lo, hi)
            s, t, v = np.repeat(sids, hi - lo), r.ts[idx], r.val[idx]
            m = (t >= mint) & (t <= maxt)
            if not m.all():
                s, t, v = s[m], t[m], v[m]
            if len(s):
                parts.append((s, t, v))
        if segs:
            merged = _merge_segments(sids, segs)
            if merged is not None:
                parts.append(merged)
            else:  # runs interleave in time for some series (out-of-order data): generic merge
                for r, lo, hi in segs:
                    idx = take_ranges(lo, hi)
                    parts.append((np.repeat(sids, hi - lo), r.ts[idx], r.val[idx]))
        rows = _piece_rows(pieces, sids, mint, maxt, bounded)
        if rows is not None:
            parts.append(rows)
        return merge_sorted_parts(parts)

    def segments(self, sids: np.ndarray, mint: int, maxt: int) -> list[Segment]:
        """The head's rows of sorted unique ``sids`` within [mint, maxt] as segments
        (storage/select_csr.py): one per keyed run overlapping the range (its row ranges found by
        one search), the rest (runs without a key, unsealed pieces) as one sorted segment each."""
        runs, pieces = self._snapshot()
        if sum(len(p.sid) for p in pieces) > SEAL_ON_READ_ROWS:
            self._seal_for_read()
            runs, pieces = self._snapshot()
        out: list[Segment] = []
        for r in runs:
            if not r.overlaps(mint, maxt):
                continue
            b = r.bounds(sids, mint, maxt)
            if b is not None:
                out.append(Segment(r.tmin, r.ts, r.val, b[0], b[1]))
                continue
            rs = r.sid  # no key: this run keeps its sid column
            idx = take_ranges(np.searchsorted(rs, sids, "left"), np.searchsorted(rs, sids, "right"))
            t = r.ts[idx]
            m = (t >= mint) & (t <= maxt)
            if m.any():
                out.append(segment_of_rows(r.tmin, sids, rs[idx][m], t[m], r.val[idx][m]))
        rows = _piece_rows(pieces, sids, mint, maxt, True)
        if rows is not None:
            s, t, v = rows
            out.append(segment_of_rows(int(t.min()), sids, s, t, v))
        return out

    def rows_in_range(self, mint: int, maxt: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All rows with mint <= ts <= maxt, sorted by (sid, ts)."""
        runs = self.seal()
        parts = []
        for r in runs:
            if not r.overlaps(mint, maxt):
                continue
            if mint <= r.tmin and r.tmax <= maxt:
                parts.append((r.sid, r.ts, r.val))
                continue
            m = (r.ts >= mint) & (r.ts <= maxt)
            if m.any():
                parts.append((r.sid[m], r.ts[m], r.val[m]))
        return merge_sorted_parts(parts)

    def all_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.rows_in_range(INT64_MIN, INT64_MAX)

    def series_in_range(self, n: int, mint: int, maxt: int) -> np.ndarray:
        """Mask over ids [0, n) of series whose head time range overlaps [mint, maxt]."""
        with self.lock:
            m = min(n, len(self.series_min))
            out = np.zeros(n, dtype=bool)
            out[:m] = (self.series_min[:m] <= maxt) & (self.series_max[:m] >= mint)
            return out

    # --- truncation and deletion --------------------------------------------------------------

    def drop_rows(self, drop) -> None:  # drop: callable(Run) -> bool mask of rows to remove
        """Rebuild runs without the rows ``drop`` selects. Caller holds the write lock."""
        with self._seal_lock:  # no seal may publish a run list built before this one
            runs = self._seal()
            new_runs = []
            for r in runs:
                m = drop(r)
                if m.any():
                    keep = ~m
                    if keep.any():
                        new_runs.append(Run(r.sid[keep], r.ts[keep], r.val[keep]))
                else:
                    new_runs.append(r)
            with self.lock:
                self._runs = new_runs
                self._recompute_ranges()

    def truncate_before(self, t: int) -> None:
        self.drop_rows(lambda r: r.ts < t)

    def _recompute_ranges(self) -> None:
        # Built aside and swapped in: concurrent readers never see a half-reset range table.
        smin = np.full(len(self.series_min), INT64_MAX, dtype=np.int64)
        smax = np.full(len(self.series_max), INT64_MIN, dtype=np.int64)
        total, mint, maxt = 0, INT64_MAX, INT64_MIN
        for r in self._runs:
            if not len(r):
                continue
            u, starts, ends = group_bounds(r.sid)
            smin[u] = np.minimum(smin[u], r.ts[starts])
            smax[u] = np.maximum(smax[u], r.ts[ends - 1])
            total += len(r)
            mint = min(mint, int(r.ts.min()))
            maxt = max(maxt, int(r.ts.max()))
        self.series_min, self.series_max = smin, smax
        self.num_samples = total
        self.mint = mint
        # maxt keeps its high-water mark when rows remain (out-of-order window is relative to it).
        if total == 0:
            self.mint = INT64_MAX
        else:
            self.maxt = max(self.maxt, maxt)

    def rebuild_last(self) -> None:
        """After WAL replay: per-series newest timestamp and value from the head's rows."""
        s, t, v = self.all_rows()
        if not len(s):
            return
        self.ensure(int(s.max()) + 1)
        u, _, ends = group_bounds(s)
        last = ends - 1
        self.last_ts[u] = t[last]
        self.last_bits[u] = v[last].view(np.uint64)
        with self.lock:
            self._recompute_ranges()

    def series_count(self) -> int:
        with self.lock:
            return int(np.count_nonzero(self.series_max != INT64_MIN))
