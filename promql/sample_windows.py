"""Where each (series, time) window starts and ends in a CSR block of samples.

The selectors (floats and histograms) and the extended-range functions share these: one
vectorized search per call, no loop over points. They depend on numpy and the stale-marker test
only, so every evaluator module can import them.
"""
from __future__ import annotations

import numpy as np

from storage.series_set import SeriesSet
from storage.stale import is_stale


def window_index(offsets: np.ndarray, ts: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For every series s and time e: the index one past the last sample of s with t <= e.

    Returns int64 (S, T). ``times`` is non-decreasing (step times shifted by a constant
    offset, or one pinned ``@`` time): every sample is binned to the first step whose time is
    >= its timestamp (one searchsorted of the samples into the T step times), the per-(series,
    step) bin counts are accumulated along the steps, and the result is the series' CSR offset
    plus that running count. O(N log T + S*T), no per-point Python.
    """
    s = len(offsets) - 1
    t = len(times)
    if s == 0:
        return np.zeros((0, t), dtype=np.int64)
    starts = offsets[:-1].astype(np.int64)
    if len(ts) == 0 or t == 0:
        return np.repeat(starts[:, None], t, axis=1)
    times = np.asarray(times, dtype=np.int64)
    if t > 1 and (np.diff(times) < 0).any():
        out = np.empty((s, t), dtype=np.int64)  # unordered times: per-series search
        for i in range(s):
            a, b = int(offsets[i]), int(offsets[i + 1])
            out[i] = a + np.searchsorted(ts[a:b], times, side="right")
        return out
    if t > 1 and times[0] == times[-1]:
        col = window_index(offsets, ts, times[:1])
        return np.repeat(col, t, axis=1)
    d = np.diff(times)
    if t > 1 and d[0] > 0 and (d == d[0]).all():
        # evenly spaced steps: the bin is ceil((ts - t0) / step), clipped to [0, T]
        step = int(d[0])
        b = -((int(times[0]) - ts) // step)
        np.clip(b, 0, t, out=b)
    else:
        b = np.searchsorted(times, ts, side="left")  # first step with time >= sample time
    counts = np.diff(offsets)
    key = np.repeat(np.arange(0, s * (t + 1), t + 1, dtype=np.int64), counts)
    key += b
    cells = np.bincount(key, minlength=s * (t + 1)).reshape(s, t + 1)
    cells[:, 0] += starts  # fold the CSR offset into the running count
    return np.cumsum(cells[:, :t], axis=1)


def drop_stale(ss: SeriesSet) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The selection's (timestamps, values, CSR offsets) without stale markers."""
    ts, vals, off = ss.timestamps, ss.values, ss.offsets
    stale = is_stale(vals)
    if not stale.any():
        return ts, vals, off
    keep = ~stale
    counts = np.add.reduceat(keep.astype(np.int64), off[:-1]) if len(ts) else np.zeros(len(off) - 1, np.int64)
    counts = np.where(np.diff(off) == 0, 0, counts)  # reduceat on an empty segment: the next element
    new_off = np.zeros(len(off), np.int64)
    np.cumsum(counts, out=new_off[1:])
    return ts[keep], vals[keep], new_off

