"""Quantile-sketch pane payloads for one SDS, plus a dyadic merge cache.

Two sketches from ``datasketches``, one store:

* ``kll``: ``kll_doubles_sketch(k)``; additive normalized rank error ``rank_error(k)`` at every rank.
* ``req``: ``req_floats_sketch(k, is_hra=True)`` (relative-error quantiles, high ranks accurate): the
  rank error shrinks with ``1 - phi``, so tail quantiles (phi >= 0.9) are far more accurate than KLL's
  for a similar size (``req_rank_error(k, phi)``). REQ holds float32: each series' values are stored
  as ``float32(v - c)`` with a per-series shift ``c`` (its first finite value), so the returned value
  is within ``|v - c| * 2^-24`` of a real sample.

A window's whole-pane part is answered by merging O(log K) cached dyadic nodes (node (l, j) = panes
[j*2^l, (j+1)*2^l)) instead of every pane, and the merged result for a given (series, klo, khi) is
kept in a small LRU: steps finer than the pane share it, and dashboard refreshes reuse it. KLL merge
costs a few microseconds, so this is what keeps long ranges cheap.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
from datasketches import kll_doubles_sketch, req_floats_sketch

from planner.pane_store import PaneStoreParts, SeriesShift

DEFAULT_K = 200
REQ_DEFAULT_K = 20
REQ_CONFIDENCE_SD = 3  # stated REQ bounds are 3 standard deviations (~99.7%)


class ResultCache:
    """LRU of final per-window answers keyed (series, window end, range, phi): (value, low, high)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.d: OrderedDict[tuple, tuple[float, float, float]] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple) -> tuple[float, float, float] | None:
        v = self.d.get(key)
        return v

    def put(self, key: tuple, v: tuple[float, float, float]) -> None:
        with self.lock:
            self.d[key] = v
            if len(self.d) > self.capacity:
                self.d.popitem(last=False)

    def drop_series(self, sids: set[int]) -> None:
        if not self.d:
            return
        with self.lock:
            for k in [k for k in self.d if k[0] in sids]:
                del self.d[k]


def rank_error(k: int) -> float:
    """Normalized single-quantile rank error (99% confidence) of a KLL sketch with parameter k."""
    return float(kll_doubles_sketch.get_normalized_rank_error(k, False))


def req_rank_error(k: int, phi: float) -> float:
    """A-priori normalized rank error of a high-rank-accuracy REQ sketch at rank ``phi`` (3 sd).

    The library's ``get_RSE(k, rank, hra, n)`` returns the one-standard-deviation *lower rank bound*
    for ``rank`` (its C++ source: ``get_rank_lb(k, 2, rank, 1, n, hra)``), so one sd is
    ``rank - get_RSE(...)``; ``n`` large = the estimation-mode bound.
    """
    p = min(max(float(phi), 0.0), 1.0)
    sd = p - float(req_floats_sketch.get_RSE(int(k), p, True, 1 << 40))
    return REQ_CONFIDENCE_SD * max(sd, 0.0)


class KLLPaneStore(SeriesShift, PaneStoreParts):
    """Panes of one quantile sketch kind (``kind`` = "kll" or "req")."""

    def __init__(self, pane_ms: int, k: int = DEFAULT_K, cache_entries: int = 50_000, kind: str = "kll"):
        if kind not in ("kll", "req"):
            raise ValueError(f"unknown quantile sketch kind {kind!r}")
        self.kind = kind
        self.pane_ms = int(pane_ms)
        self.k = int(k)
        self.shift = np.zeros(0)  # req: per-series shift constant c (NaN = not chosen yet); kll: unused (0)
        self.lock = threading.RLock()
        self.panes: dict[tuple[int, int], kll_doubles_sketch] = {}
        self.last_t = np.zeros(0, np.int64)
        self._nodes: dict[tuple[int, int, int], kll_doubles_sketch | None] = {}
        self._windows: OrderedDict[tuple[int, int, int], kll_doubles_sketch | None] = OrderedDict()
        self._cache_entries = cache_entries
        self.results = ResultCache(4 * cache_entries)
        self._newest_pane = np.iinfo(np.int64).min
        self.ns = 0
        self.version = 0  # bumped by every write
        self._totals: tuple[int, int, np.ndarray] | None = None

    def new_sketch(self) -> kll_doubles_sketch | req_floats_sketch:
        return req_floats_sketch(self.k, True) if self.kind == "req" else kll_doubles_sketch(self.k)

    def deserialize(self, blob: bytes) -> kll_doubles_sketch | req_floats_sketch:
        return (req_floats_sketch if self.kind == "req" else kll_doubles_sketch).deserialize(blob)

    def encode(self, sid: np.ndarray, vals: np.ndarray) -> np.ndarray:
        """Sketch input for samples of series ``sid`` (req: float32 of the shifted values)."""
        if self.kind != "req":
            return vals
        return (vals - np.nan_to_num(self.shift[sid], nan=0.0)).astype(np.float32)

    def decode(self, s: int, q: float) -> float:
        return q if self.kind != "req" else float(q) + float(np.nan_to_num(self.shift[s], nan=0.0))

    def choose_shift(self, sid: np.ndarray, vals: np.ndarray) -> None:
        if self.kind == "req":  # KLL keeps the values themselves
            super().choose_shift(sid, vals)

    def ensure_series(self, n: int) -> None:
        if n > len(self.last_t):
            grow = max(n, 2 * len(self.last_t), 16) - len(self.last_t)
            self.last_t = np.concatenate([self.last_t, np.full(grow, np.iinfo(np.int64).min)])
            self.shift = np.concatenate([self.shift, np.full(grow, np.nan if self.kind == "req" else 0.0)])
        self.ns = max(self.ns, n)

    def pane_totals(self) -> tuple[int, np.ndarray]:
        """(first pane, samples per pane over all series): the raw-read cost model's density
        (``planner/window.coalesce_reads``); recomputed once per write batch (per pane item, not per sample)."""
        with self.lock:
            t = self._totals
            if t is None or t[0] != self.version:
                if self.panes:
                    ks = np.fromiter((k for _, k in self.panes), np.int64, len(self.panes))
                    ns = np.fromiter((sk.n for sk in self.panes.values()), np.int64, len(self.panes))
                    k0 = int(ks.min())
                    tot = np.bincount(ks - k0, weights=ns).astype(np.int64)
                else:
                    k0, tot = 0, np.zeros(0, np.int64)
                t = self._totals = (self.version, k0, tot)
            return t[1], t[2]

    def nbytes(self) -> int:
        with self.lock:
            # ~ serialized size: 8 bytes per retained item plus a small header and level table
            return int(sum(32 + 8 * s.num_retained for s in self.panes.values()))

    def _invalidate(self, keys: set[tuple[int, int]]) -> None:
        if not self._nodes and not self._windows:
            return
        touched = {s for s, _ in keys}
        self.results.drop_series(touched)
        self._nodes = {k: v for k, v in self._nodes.items() if k[0] not in touched}
        for key in [k for k in self._windows if k[0] in touched]:
            del self._windows[key]

    def ingest_sorted(self, sid: np.ndarray, ts: np.ndarray, vals: np.ndarray, *, live: bool = True) -> None:
        """Samples sorted by (sid, ts). One bulk ``update(array)`` per (series, pane) group."""
        n = len(ts)
        if n == 0:
            return
        k = ts // self.pane_ms
        new = np.ones(n, bool)
        new[1:] = (sid[1:] != sid[:-1]) | (k[1:] != k[:-1])
        gs = np.nonzero(new)[0]
        ge = np.append(gs[1:], n)
        keys = list(zip(sid[gs].tolist(), k[gs].tolist()))
        with self.lock:
            self.version += 1
            self.note_written(int(k.min()))
            self.choose_shift(sid, vals)
            x = self.encode(sid, vals)
            # per (series, pane) group, not per sample: the sketch takes the whole array at once
            for key, a, b in zip(keys, gs.tolist(), ge.tolist()):
                sk = self.panes.get(key)
                if sk is None:
                    sk = self.panes[key] = self.new_sketch()
                sk.update(x[a:b])
            # Cached merges/answers only cover sealed panes; live ingest touches the open panes, so
            # only backfill or late samples (panes behind the newest one) invalidate.
            newest = int(k.max())
            if not live:
                self._invalidate(set(keys))
            else:
                late = {key for key in keys if key[1] < self._newest_pane}
                if late:
                    self._invalidate(late)
            self._newest_pane = max(self._newest_pane, newest)
            if live:
                last = np.ones(n, bool)
                last[:-1] = sid[1:] != sid[:-1]
                # late samples (folded too: sketches are order-independent) never move the chain back
                self.last_t[sid[last]] = np.maximum(self.last_t[sid[last]], ts[last])

    def _node(self, s: int, level: int, j: int) -> kll_doubles_sketch | None:
        key = (s, level, j)
        if key in self._nodes:
            return self._nodes[key]
        if level == 0:
            res = self.panes.get((s, j))
        else:
            a = self._node(s, level - 1, 2 * j)
            b = self._node(s, level - 1, 2 * j + 1)
            if a is None or b is None:
                res = a if b is None else b
            else:
                res = self.new_sketch()
                res.merge(a)
                res.merge(b)
        self._nodes[key] = res
        return res

    def range_sketch(self, s: int, klo: int, khi: int) -> kll_doubles_sketch | req_floats_sketch | None:
        """Merged sketch of panes [klo, khi) of series s (None when empty). Do not mutate it."""
        key = (s, klo, khi)
        with self.lock:
            if key in self._windows:
                self._windows.move_to_end(key)
                return self._windows[key]
            parts = []
            lo, hi = klo, khi
            level = 0
            while lo < hi:  # dyadic decomposition: O(log(khi - klo)) nodes
                if lo & 1:
                    parts.append((level, lo))
                    lo += 1
                if hi & 1:
                    hi -= 1
                    parts.append((level, hi))
                lo >>= 1
                hi >>= 1
                level += 1
            nodes = [n for n in (self._node(s, lv, j) for lv, j in parts) if n is not None]
            if not nodes:
                res = None
            elif len(nodes) == 1:
                res = nodes[0]
            else:
                res = self.new_sketch()
                for n in nodes:
                    res.merge(n)
            self._windows[key] = res
            if len(self._windows) > self._cache_entries:
                self._windows.popitem(last=False)
            return res

    def drop_before(self, k: int) -> None:
        """Forget panes older than ``k`` and the merged sketches that start there (per pane item, not
        per sample). Cached answers stay true for the windows they were computed for."""
        k = int(k)
        with self.lock:
            old = [key for key in self.panes if key[1] < k]
            if not old:
                return
            for key in old:
                del self.panes[key]
            self._nodes = {key: v for key, v in self._nodes.items() if key[2] << key[1] >= k}
            for key in [w for w in self._windows if w[1] < k]:
                del self._windows[key]
            self.version += 1

    def clear_from(self, k: int) -> None:
        """Forget panes ``k`` and later and every merged or answered window (a restart folds those
        panes again from raw storage)."""
        k = int(k)
        with self.lock:
            for key in [key for key in self.panes if key[1] >= k]:
                del self.panes[key]
            self._nodes.clear()
            self._windows.clear()
            self.results = ResultCache(self.results.capacity)
            self.version += 1

    # --- persistence -------------------------------------------------------------------------
    def export_rows(self, k_lo: int, k_hi: int) -> dict[str, list]:
        with self.lock:
            items = [(s, k, sk.serialize()) for (s, k), sk in self.panes.items() if k_lo <= k < k_hi]
        return {"series": [i[0] for i in items], "pane": [i[1] for i in items], "sketch": [i[2] for i in items]}

    def import_rows(self, rows: dict[str, list]) -> None:
        with self.lock:
            self.version += 1
            for s, k, blob in zip(rows["series"], rows["pane"], rows["sketch"]):
                self.panes[(int(s), int(k))] = self.deserialize(bytes(blob))
            if rows["series"]:
                self.ensure_series(int(max(rows["series"])) + 1)
