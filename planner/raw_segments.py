"""Exact stats of raw edge runs: S x T [x, y] time ranges over raw samples of S series, vectorized.

Raw samples of all series sit in one array sorted by (series, time). Run bounds come from two
``searchsorted`` calls on a composite (series, time) key; additive fields from prefix sums; min/max
from one interleaved ``reduceat``; counter corrections from prefix sums of per-sample corrections
(the predecessor of every sample inside a run is inside the same fetched interval, so it is exact).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.algorithms.exact import SegStats
from planner.served_functions import ALL_NEEDS as ALL

_TS_BITS = 42  # time offsets below 2^42 ms (~139 years) leave 21 bits for the series index


@dataclass
class RawSamples:
    sid: np.ndarray  # int64 (N,) local series index, sorted with ts
    ts: np.ndarray  # int64 (N,)
    vals: np.ndarray  # float64 (N,) stale markers already removed
    num_series: int

    @classmethod
    def build(cls, sid: np.ndarray, ts: np.ndarray, vals: np.ndarray, num_series: int) -> "RawSamples":
        order = np.lexsort((ts, sid))
        sid, ts, vals = sid[order], ts[order], vals[order]
        if len(ts):  # drop duplicates (overlapping reads)
            keep = np.ones(len(ts), bool)
            keep[1:] = (sid[1:] != sid[:-1]) | (ts[1:] != ts[:-1])
            sid, ts, vals = sid[keep], ts[keep], vals[keep]
        return cls(sid, ts, vals, num_series)




class RawPrefix:
    """Raw samples indexed for edge-run statistics. Sums over a run are taken directly over the run's
    samples (``reduceat`` on interleaved bounds: O(N + runs), no prefix-difference cancellation)."""

    def __init__(self, raw: RawSamples, shift: np.ndarray, fields: frozenset[str] = ALL):
        self.raw = raw
        self.fields = fields
        n = len(raw.ts)
        self.n = n
        self.base = int(raw.ts.min()) - 1 if n else 0
        self.key = (raw.sid << _TS_BITS) | (raw.ts - self.base)
        v = raw.vals
        sid = raw.sid
        # every column is built straight into an array one longer than the samples (the trailing 0 /
        # NaN closes the last run for ``reduceat``), and only the columns ``fields`` needs
        cols: dict[str, np.ndarray] = {}

        def pad(dtype: type) -> np.ndarray:
            return np.zeros(n + 1, dtype)

        if fields & {"s1", "s2"}:
            x = pad(np.float64)
            if n:
                np.subtract(v, shift[sid], out=x[:n])
                x[:n][~np.isfinite(v)] = 0.0
            cols["s1"] = x
            if "s2" in fields:
                with np.errstate(over="ignore"):  # squares past the float range: refused at read time
                    cols["s2"] = x * x
        if "nnan" in fields:
            for k, m in (("nnan", np.isnan(v)), ("npinf", v == np.inf), ("nninf", v == -np.inf)):
                a = pad(np.int64)
                a[:n] = m
                cols[k] = a
        if fields & {"corr", "resets", "changes"} and n > 1:
            # pair (i-1, i) inside one series, as ``exact.boundary``: a drop adds prev and counts a
            # reset; a change is cur != prev unless both are NaN. The first sample of a run has its
            # predecessor outside the run: zeroed per run in ``stats``.
            same = sid[1:] == sid[:-1]
            prev, cur = v[:-1], v[1:]
            with np.errstate(invalid="ignore"):
                if fields & {"corr", "resets"}:
                    drop = same & (cur < prev)
                    if "corr" in fields:
                        c = pad(np.float64)
                        c[1:n] = np.where(drop, prev, 0.0)
                        cols["corr"] = c
                    if "resets" in fields:
                        r = pad(np.int64)
                        r[1:n] = drop
                        cols["resets"] = r
                if "changes" in fields:
                    ch = pad(np.int64)
                    ch[1:n] = same & (cur != prev) & ~(np.isnan(cur) & np.isnan(prev))
                    cols["changes"] = ch
        elif fields & {"corr", "resets", "changes"}:
            for k in ("corr", "resets", "changes"):
                if k in fields:
                    cols[k] = pad(np.float64 if k == "corr" else np.int64)
        self.cols = {k: a for k, a in cols.items() if k in fields}
        self.vals_pad = np.empty(n + 1)
        self.vals_pad[:n] = v
        self.vals_pad[n] = np.nan

    def bounds(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[lo, hi) sample indexes of runs with x <= t <= y for every series (S, T)."""
        S = self.raw.num_series
        T = len(x)
        sids = np.arange(S, dtype=np.int64)[:, None]
        xs = np.clip(x - self.base, 0, (1 << _TS_BITS) - 1)[None, :]
        ys = np.clip(y - self.base + 1, 0, (1 << _TS_BITS) - 1)[None, :]
        lo = np.searchsorted(self.key, (sids << _TS_BITS) | xs)
        hi = np.searchsorted(self.key, (sids << _TS_BITS) | ys)
        hi = np.maximum(hi, lo)
        empty = (x > y)[None, :]
        hi = np.where(empty, lo, hi)
        return lo.reshape(S, T), hi.reshape(S, T)

    def stats(self, x: np.ndarray, y: np.ndarray) -> SegStats:
        lo, hi = self.bounds(x, y)
        n = self.n
        cnt = hi - lo
        has = cnt > 0
        st = SegStats.empty(lo.shape)
        st.count = cnt
        if not n:
            return st
        f = self.fields
        flat_idx = np.minimum(np.stack([lo.ravel(), hi.ravel()], axis=1).ravel(), n)

        def run_sum(a: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
            idx = flat_idx if start is None else np.minimum(np.stack([start.ravel(), hi.ravel()], axis=1).ravel(), n)
            out = np.add.reduceat(a, idx)[0::2].reshape(lo.shape)
            ok = has if start is None else (hi > start)
            return np.where(ok, out, 0)

        for k in ("nnan", "npinf", "nninf", "s1", "s2"):
            if k in self.cols:
                setattr(st, k, run_sum(self.cols[k]))
        with np.errstate(invalid="ignore"):
            if "vmin" in f:
                st.vmin = np.where(has, np.fmin.reduceat(self.vals_pad, flat_idx)[0::2].reshape(lo.shape), np.nan)
            if "vmax" in f:
                st.vmax = np.where(has, np.fmax.reduceat(self.vals_pad, flat_idx)[0::2].reshape(lo.shape), np.nan)
        if "first_v" in f:
            li = np.minimum(lo, n - 1)
            hi1 = np.clip(hi - 1, 0, n - 1)
            st.first_t = np.where(has, self.raw.ts[li], 0)
            st.first_v = np.where(has, self.raw.vals[li], 0.0)
            st.last_t = np.where(has, self.raw.ts[hi1], 0)
            st.last_v = np.where(has, self.raw.vals[hi1], 0.0)
        l1 = np.minimum(lo + 1, hi)  # pairs inside the run: from its second sample on
        for k in ("corr", "resets", "changes"):
            if k in self.cols:
                setattr(st, k, run_sum(self.cols[k], l1))
        return st
