"""Prometheus 3.x extended range selectors (experimental): ``anchored`` and ``smoothed``.

The selection (promql/eval_selectors.py) also holds the samples up to the lookback delta before
each window (and, smoothed, after it). Here, per (series, step) window ``(start, end]``:

* rate/increase/delta (Prometheus's ``extendedRate``): the value at each boundary is the last
  sample at or before it (anchored), or the straight line between the samples around it
  (smoothed); the result is ``right - left`` (plus the counter-reset correction), per second for
  rate, never extrapolated;
* resets/changes, anchored: the last sample at or before the window start joins the window.

Floats only: windows holding native-histogram samples are answered by promql/eval_histogram_rate.py
(rate/increase/delta) and promql/eval_histogram.py (resets/changes, smoothed instant selectors).
"""
from __future__ import annotations

import numpy as np

from promql.errors import ExecutionError
from promql.functions.common import window_vector
from promql.types import RangeWindows, VectorSteps
from promql.sample_windows import window_index

SAFE = {"anchored": ("changes", "delta", "increase", "rate", "resets"), "smoothed": ("delta", "increase", "rate")}


def check_function(modifier: str, func: str) -> None:
    """Prometheus refuses the modifiers on functions that would read the extra samples as data."""
    allowed = SAFE[modifier]
    if func not in allowed:
        raise ExecutionError(f"{modifier} modifier can only be used with: {', '.join(allowed)} - not with {func}")


def _first_after(rw: RangeWindows, times: np.ndarray) -> np.ndarray:
    """Per window: index of the series' first sample with t > times (CSR-global), (S, T)."""

    return window_index(rw.offsets, rw.ts, times)


def _interpolate(ts: np.ndarray, vals: np.ndarray, i1: np.ndarray, t: np.ndarray, is_counter: bool) -> np.ndarray:
    """Prometheus's ``interpolate`` between samples i1 and i1 + 1 at time t (a counter that drops
    restarts from zero)."""
    y1 = vals[i1]
    y2 = vals[i1 + 1]
    if is_counter:
        y1 = np.where(y2 < y1, 0.0, y1)
    return y1 + (y2 - y1) * (t - ts[i1]).astype(np.float64) / (ts[i1 + 1] - ts[i1]).astype(np.float64)


def extended_rate(rw: RangeWindows, is_counter: bool, is_rate: bool) -> VectorSteps:
    smoothed = rw.extended == "smoothed"
    ts = np.asarray(rw.ts, dtype=np.int64)
    vals = np.asarray(rw.vals, dtype=np.float64)
    lo, hi = rw.lo, rw.hi
    S, T = lo.shape
    ends = np.broadcast_to(np.asarray(rw.window_end, dtype=np.int64)[None, :], (S, T))
    starts = ends - rw.range_ms
    present = hi > lo
    out = np.zeros((S, T))
    if not present.any():
        return window_vector(rw, out, present)
    top = max(len(ts) - 1, 0)
    last = np.clip(hi - 1, 0, top)
    j = np.minimum(np.maximum(_first_after(rw, starts[0]), lo), last)  # first sample after the start
    first = np.maximum(lo, j - 1)
    if smoothed:
        last = np.minimum(np.maximum(_first_after(rw, ends[0] - 1), lo), last)  # first at or after the end
    with np.errstate(all="ignore"):
        present &= ts[last] > starts
        if smoothed:
            present &= ts[first] <= ends
        safe_first = np.where(present, first, 0)
        safe_last = np.where(present, last, 0)
        left = vals[safe_first]
        right = vals[safe_last]
        if smoothed:
            li = present & (ts[safe_first] < starts)
            if li.any():
                left = np.where(li, _interpolate(ts, vals, np.where(li, safe_first, 0), starts, is_counter), left)
            ri = present & (safe_last > lo) & (ts[safe_last] > ends)
            if ri.any():
                right = np.where(ri, _interpolate(ts, vals, np.where(ri, safe_last - 1, 0), ends, is_counter), right)
        res = right - left
        if is_counter:
            f1 = safe_first + (ts[safe_first] <= starts)
            l1 = safe_last - (ts[safe_last] >= ends)
            res = res + _corrections(vals, left, right, f1, l1, present)
        if is_rate:
            res = res / (rw.range_ms / 1000.0)
    return window_vector(rw, np.where(present, res, 0.0), present)


def _corrections(vals: np.ndarray, left: np.ndarray, right: np.ndarray, f1: np.ndarray, l1: np.ndarray,
                 present: np.ndarray) -> np.ndarray:
    """Prometheus's ``correctForCounterResets`` over left, samples f1..l1, right: each drop adds
    the value before it, in sample order. Computed one window at a time only for windows where
    some drop occurs (counter resets are rare)."""
    corr = np.zeros(left.shape)
    if not len(vals):
        return corr
    drop = np.zeros(len(vals) + 1, np.int64)  # drop prefix: drop[i] = drops among pairs (k-1, k), k < i
    np.cumsum(np.concatenate([[0], (vals[1:] < vals[:-1]).astype(np.int64)]), out=drop[1:])
    nonempty = l1 >= f1
    fi = np.clip(f1, 0, len(vals) - 1)
    li = np.clip(l1, 0, len(vals) - 1)
    with np.errstate(invalid="ignore"):
        inner = nonempty & (drop[li + 1] - drop[fi + 1] > 0)
        edge = np.where(nonempty, (vals[fi] < left) | (right < vals[li]), right < left)
    for w in np.flatnonzero((present & (inner | edge)).reshape(-1)).tolist():
        s, t = divmod(w, left.shape[1])
        prev = left[s, t]
        c = 0.0
        for k in range(int(f1[s, t]), int(l1[s, t]) + 1):
            v = vals[k]
            if v < prev:
                c += prev
            prev = v
        if right[s, t] < prev:
            c += prev
        corr[s, t] = c
    return corr


def anchored_windows(rw: RangeWindows) -> tuple[RangeWindows, np.ndarray]:
    """The windows of an anchored selection for resets/changes: the last sample at or before each
    window start, then the samples inside; and where there is a sample inside at all."""
    S, T = rw.lo.shape
    starts = np.asarray(rw.window_end, dtype=np.int64) - rw.range_ms
    j = _first_after(rw, starts)
    found = j < rw.hi
    lo = np.minimum(np.maximum(rw.lo, j - 1), rw.hi)
    return RangeWindows(rw.labels, rw.offsets, rw.ts, rw.vals, lo, rw.hi, rw.window_end, rw.range_ms, rw.drop_name,
                        rw.hist), found


def matrix_points(rw: RangeWindows) -> RangeWindows:
    """An extended range selector shown as a range vector (an instant query's result; Prometheus's
    ``extendFloats``): per series the boundary value at the window start (the last sample at or
    before it, or interpolated when smoothed), the samples strictly inside, the boundary value at
    the window end. One step only (a range vector is never a range query's result)."""
    smoothed = rw.extended == "smoothed"
    end = int(rw.window_end[0])
    start = end - rw.range_ms
    ts_parts, val_parts, counts = [], [], []
    for s in range(rw.num_series):  # per series, only for a result shown as a range vector
        a, b = int(rw.lo[s, 0]), int(rw.hi[s, 0])
        t, v = rw.ts[a:b], rw.vals[a:b]
        n = len(t)
        if n == 0:
            counts.append(0)
            continue
        last = n - 1
        first = max(0, int(np.searchsorted(t[:last], start, side="right")) - 1)
        if smoothed:
            last = int(np.searchsorted(t[:last], end, side="left"))
        if t[last] <= start:
            counts.append(0)
            continue
        left, right = float(v[first]), float(v[last])
        if smoothed and t[first] < start:
            left = float(v[first] + (v[first + 1] - v[first]) * float(start - t[first]) / float(t[first + 1] - t[first]))
        if smoothed and last > 0 and t[last] > end:
            right = float(v[last - 1] + (v[last] - v[last - 1]) * float(end - t[last - 1]) / float(t[last] - t[last - 1]))
        if t[first] <= start:
            first += 1
        if t[last] >= end:
            last -= 1
        inner = slice(first, max(last + 1, first))
        ts_parts.append(np.concatenate([[start], t[inner], [end]]).astype(np.int64))
        val_parts.append(np.concatenate([[left], v[inner], [right]]))
        counts.append(len(ts_parts[-1]))
    off = np.zeros(rw.num_series + 1, np.int64)
    np.cumsum(np.asarray(counts, np.int64), out=off[1:])
    ts = np.concatenate(ts_parts) if ts_parts else np.empty(0, np.int64)
    vals = np.concatenate(val_parts) if val_parts else np.empty(0)
    return RangeWindows(rw.labels, off, ts, vals, off[:-1, None].copy(), off[1:, None].copy(), rw.window_end,
                        rw.range_ms, rw.drop_name)
