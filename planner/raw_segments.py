"""Exact stats of raw edge runs: S x T [x, y] time ranges over raw samples of S series, vectorized.

Raw samples of all series sit in one array sorted by (series, time). Run bounds come from two
``searchsorted`` calls on a composite (series, time) key; additive fields from prefix sums; min/max
from one interleaved ``reduceat``; counter corrections from prefix sums of per-sample corrections
(the predecessor of every sample inside a run is inside the same fetched interval, so it is exact).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.algorithms.exact import SegStats, boundary

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
    def __init__(self, raw: RawSamples, shift: np.ndarray):
        self.raw = raw
        n = len(raw.ts)
        self.base = int(raw.ts.min()) - 1 if n else 0
        self.key = (raw.sid << _TS_BITS) | (raw.ts - self.base)
        v = raw.vals
        fin = np.isfinite(v)
        x = np.where(fin, v - (shift[raw.sid] if n else 0.0), 0.0)

        def pre(a: np.ndarray, dtype: type) -> np.ndarray:
            out = np.zeros(n + 1, dtype)
            np.cumsum(a.astype(dtype, copy=False), out=out[1:])
            return out

        self.p_nan = pre(np.isnan(v), np.int64)
        self.p_pinf = pre(v == np.inf, np.int64)
        self.p_ninf = pre(v == -np.inf, np.int64)
        self.p_s1 = pre(x, np.longdouble)
        self.p_s2 = pre(x * x, np.longdouble)
        prev = np.full(n, np.nan)
        has_prev = np.zeros(n, bool)
        if n > 1:
            has_prev[1:] = raw.sid[1:] == raw.sid[:-1]
            prev[1:] = v[:-1]
        c, r, ch = boundary(prev, v, has_prev)
        self.p_corr = pre(c, np.longdouble)
        self.p_res = pre(r, np.int64)
        self.p_chg = pre(ch, np.int64)
        self.vals_pad = np.append(v, np.nan)

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
        n = len(self.raw.ts)
        cnt = hi - lo
        has = cnt > 0
        st = SegStats.empty(lo.shape)
        st.count = cnt
        st.nnan = self.p_nan[hi] - self.p_nan[lo]
        st.npinf = self.p_pinf[hi] - self.p_pinf[lo]
        st.nninf = self.p_ninf[hi] - self.p_ninf[lo]
        st.s1 = (self.p_s1[hi] - self.p_s1[lo]).astype(np.float64)
        st.s2 = (self.p_s2[hi] - self.p_s2[lo]).astype(np.float64)
        if n:
            idx = np.stack([lo.ravel(), hi.ravel()], axis=1).ravel()
            idx = np.minimum(idx, n)
            with np.errstate(invalid="ignore"):
                mn = np.fmin.reduceat(self.vals_pad, idx)[0::2].reshape(lo.shape)
                mx = np.fmax.reduceat(self.vals_pad, idx)[0::2].reshape(lo.shape)
            st.vmin = np.where(has, mn, np.nan)
            st.vmax = np.where(has, mx, np.nan)
            li = np.minimum(lo, n - 1)
            hi1 = np.clip(hi - 1, 0, n - 1)
            st.first_t = np.where(has, self.raw.ts[li], 0)
            st.first_v = np.where(has, self.raw.vals[li], 0.0)
            st.last_t = np.where(has, self.raw.ts[hi1], 0)
            st.last_v = np.where(has, self.raw.vals[hi1], 0.0)
            l1 = np.minimum(lo + 1, hi)
            st.corr = np.where(has, (self.p_corr[hi] - self.p_corr[l1]).astype(np.float64), 0.0)
            st.resets = np.where(has, self.p_res[hi] - self.p_res[l1], 0)
            st.changes = np.where(has, self.p_chg[hi] - self.p_chg[l1], 0)
        return st
