"""Helpers shared by the function families: argument access, element-wise vector maps,
window indexing over ``RangeWindows`` and a sequential per-window kernel.

The kernel exists because several Prometheus functions are defined by a sequential algorithm over
the samples of a window (Kahan/Neumaier compensated sums, incremental means, Welford variance) whose
exact floating-point result the conformance tests check. Instead of a Python loop per window we
iterate over the *position inside the window* (k = 0, 1, ...) and advance every window that still
has a k-th sample at once, so the Python loop runs max-window-length times, not once per sample.
"""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

from promql.errors import ExecutionError
from promql.types import RangeWindows, Scalar, StringValue, Value, VectorSteps
from storage.labels import Labels, metric_name

__all__ = [
    "scalar_arg",
    "string_arg",
    "vector_arg",
    "windows_arg",
    "map_vector",
    "window_first_last",
    "windows_from",
    "iterate_window_positions",
    "kahan_inc",
    "name_of",
    "per_step_scalar",
]


def scalar_arg(v: Value, num_steps: int) -> np.ndarray:
    """A scalar argument as a float64 (T,) array."""
    if isinstance(v, Scalar):
        arr = np.asarray(v.values, dtype=np.float64)
        if arr.shape == ():
            arr = np.full(num_steps, float(arr))
        return arr
    raise ExecutionError(f"expected scalar argument, got {type(v).__name__}")


def string_arg(v: Value) -> str:
    if isinstance(v, StringValue):
        return v.value
    raise ExecutionError(f"expected string argument, got {type(v).__name__}")


def vector_arg(v: Value) -> VectorSteps:
    if isinstance(v, VectorSteps):
        return v
    raise ExecutionError(f"expected instant vector argument, got {type(v).__name__}")


def windows_arg(v: Value) -> RangeWindows:
    if isinstance(v, RangeWindows):
        return v
    raise ExecutionError(f"expected range vector argument, got {type(v).__name__}")


def per_step_scalar(values: np.ndarray) -> Scalar:
    return Scalar(np.asarray(values, dtype=np.float64))


def name_of(labels: Labels) -> str:
    return metric_name(labels)


def map_vector(vec: VectorSteps, fn: Callable[[np.ndarray], np.ndarray], drop_name: bool = True) -> VectorSteps:
    """Apply an element-wise float function to every present sample; marks the name for removal."""
    with np.errstate(all="ignore"):
        vals = fn(vec.values)
    vals = np.asarray(vals, dtype=np.float64)
    dn = np.ones(vec.num_series, dtype=bool) if drop_name else vec.drop_name
    return VectorSteps(list(vec.labels), vals, vec.present.copy(), dn)


def windows_from(rw: RangeWindows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lo, hi, n) of every (series, step) window, each (S, T) int64."""
    lo = np.asarray(rw.lo, dtype=np.int64)
    hi = np.asarray(rw.hi, dtype=np.int64)
    return lo, hi, hi - lo


def window_first_last(rw: RangeWindows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Index of the first and last sample of each window (clipped to valid indices) and n."""
    lo, hi, n = windows_from(rw)
    top = max(len(rw.vals) - 1, 0)
    first = np.clip(lo, 0, top)
    last = np.clip(hi - 1, 0, top)
    return first, last, n


def iterate_window_positions(lo: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, Iterator[tuple[int, int, np.ndarray]]]:
    """Order windows by length (longest first) and yield, for k = 0.., how many windows have a
    k-th sample (they are a prefix of that order) and those samples' indices.

    Returns (order, iterator). ``order`` maps kernel slot -> flat window index.
    """
    lo_f = lo.reshape(-1)
    n_f = n.reshape(-1)
    order = np.argsort(-n_f, kind="stable")
    n_sorted = n_f[order]
    lo_sorted = lo_f[order]
    maxn = int(n_sorted[0]) if n_sorted.size else 0
    active = np.searchsorted(-n_sorted, -np.arange(maxn), side="left") if maxn else np.empty(0, np.int64)

    def gen() -> Iterator[tuple[int, int, np.ndarray]]:
        for k in range(maxn):
            m = int(active[k])
            yield k, m, lo_sorted[:m] + k

    return order, gen()


def kahan_inc(inc: np.ndarray, s: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vectorized Kahan-Neumaier increment exactly as Prometheus's kahansum.Inc."""
    t = s + inc
    big = np.abs(s) >= np.abs(inc)
    add = np.where(big, (s - t) + inc, (inc - t) + s)
    c = np.where(np.isinf(t), 0.0, c + add)
    return t, c


def scatter_back(order: np.ndarray, slot_values: np.ndarray, shape: tuple[int, ...], fill: float = np.nan) -> np.ndarray:
    out = np.full(int(np.prod(shape)), fill, dtype=np.float64)
    out[order] = slot_values
    return out.reshape(shape)


def window_vector(rw: RangeWindows, values: np.ndarray, present: np.ndarray, keep_name: bool = False,
                  plane: np.ndarray | None = None) -> VectorSteps:
    """Result of a range-vector function: one output series per input series (``plane``: a
    histogram plane for results that are native histograms)."""
    if keep_name:
        dn = rw.drop_name if rw.drop_name is not None else np.zeros(rw.num_series, dtype=bool)
    else:
        dn = np.ones(rw.num_series, dtype=bool)
    vals = np.where(present, values, 0.0) if values.size else values
    out = VectorSteps(list(rw.labels), np.asarray(vals, dtype=np.float64), np.asarray(present, dtype=bool), dn, None, plane)
    return drop_empty_series(out)


def drop_empty_series(vec: VectorSteps) -> VectorSteps:
    """Remove series that have no output at any step (they are not part of the result)."""
    if vec.num_series == 0:
        return vec
    keep = vec.present.any(axis=1) if vec.hist is None else vec.any_present().any(axis=1)
    if keep.all():
        return vec
    idx = np.flatnonzero(keep)
    return VectorSteps(
        [vec.labels[i] for i in idx],
        vec.values[idx],
        vec.present[idx],
        None if vec.drop_name is None else vec.drop_name[idx],
        None if vec.sample_ts is None else vec.sample_ts[idx],
        None if vec.hist is None else vec.hist[idx],
    )


def pairwise_prev(rw: RangeWindows) -> tuple[np.ndarray, np.ndarray]:
    """For every sample i: the previous sample's value and whether it belongs to the same series."""
    vals = rw.vals
    n = len(vals)
    prev = np.empty(n, dtype=np.float64)
    if n:
        prev[0] = np.nan
        prev[1:] = vals[:-1]
    same = np.ones(n, dtype=bool)
    starts = np.asarray(rw.offsets[:-1], dtype=np.int64)
    starts = starts[starts < n]
    same[starts] = False
    return prev, same


def window_count_of(flags: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Number of i in [lo + 1, hi) with flags[i] (pairs inside each window), exact (integer prefix)."""
    cs = np.concatenate(([0], np.cumsum(flags.astype(np.int64))))
    start = np.minimum(lo + 1, hi)
    return (cs[hi] - cs[start]).astype(np.float64)


def dense_blocks(lo: np.ndarray, n: np.ndarray, sel: np.ndarray, chunk_elems: int = 4_000_000):
    """Group the selected flat windows by length and yield (positions, idx) blocks, where idx is a
    (rows, width) matrix of sample indices: every window of a block has exactly ``width`` samples,
    so gathers are dense (no padding) and row-wise numpy reductions do the per-window work.
    Blocks are chunked to about ``chunk_elems`` elements."""
    lo_f = lo.reshape(-1)[sel]
    n_f = n.reshape(-1)[sel]
    order = np.argsort(n_f, kind="stable")
    n_sorted = n_f[order]
    bounds = np.flatnonzero(np.diff(n_sorted)) + 1
    starts = np.concatenate(([0], bounds)).astype(np.int64)
    stops = np.concatenate((bounds, [order.size])).astype(np.int64)
    for a, b in zip(starts.tolist(), stops.tolist()):
        if a >= b:
            continue
        width = int(n_sorted[a])
        rows = max(1, chunk_elems // max(width, 1))
        for c0 in range(a, b, rows):
            part = order[c0 : min(b, c0 + rows)]
            yield sel[part], lo_f[part][:, None] + np.arange(width)[None, :]
