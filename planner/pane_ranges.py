"""Merged exact stats of pane ranges [klo_j, khi_j) for every series and step, without a per-step loop.

Additive fields come from prefix sums over panes (int64 exact; float sums in extended precision so a
difference of two long prefixes keeps the digits Prometheus's compensated sum keeps). Min/max come
from a sparse table (O(1) per window), first/last from next/previous non-empty pane indexes, and the
counter corrections from prefix sums of (inner + entry) corrections minus the entry of the first pane.

A float prefix difference is only as precise as the prefixes are large: each of a window's pane sums
is added to the running prefix at the prefix's magnitude, so one huge value (a gauge reporting 1e300,
or 1.8e19 from an unsigned overflow, a counter reset from such a value) or a squared value past the
float range would leave every later window's difference with no correct digit. Each window's error
bound is checked against its own panes' magnitude (``_window_sums``); the windows it does not hold
for are summed pane by pane, which costs their length instead of O(1).
"""
from __future__ import annotations

import numpy as np

from planner.algorithms.exact import SegStats

_ADD_INT = ("count", "nnan", "npinf", "nninf")
_ADD_FLOAT = ("s1", "s2")


def _prefix(a: np.ndarray, dtype: type) -> np.ndarray:
    out = np.zeros((a.shape[0], a.shape[1] + 1), dtype=dtype)
    np.cumsum(a.astype(dtype, copy=False), axis=1, out=out[:, 1:])
    return out


EPS_LD = float(np.finfo(np.longdouble).eps)
# a window's prefix difference is kept when its rounding bound is at most this share of the
# magnitude of its own panes (float64 keeps ~1.1e-16 of that magnitude in the pane sums themselves)
PREFIX_TOL = 1e-13


def _window_sums(a: np.ndarray, klo: np.ndarray, khi: np.ndarray) -> np.ndarray:
    """Sum of ``a[:, klo_j:khi_j]`` for every series and window j, in extended precision.

    From prefix sums where that is exact enough: a difference P[khi] - P[klo] is the rounded sum of
    the window's own additions, each rounded at the running prefix's magnitude, so its error is at
    most (khi - klo) * eps * max |P| over the window, and |P| there is at most the prefix of |a| at
    khi. Windows whose bound exceeds ``PREFIX_TOL`` of the magnitude of their own panes (or that
    meet an infinity in the prefix) are summed directly over their panes."""
    pre = _prefix(a, np.longdouble)
    out = pre[:, khi] - pre[:, klo]
    # the check in float64: its own rounding (eps64 * prefix) is far below the margin it tests
    with np.errstate(invalid="ignore", over="ignore"):
        mag = _prefix(np.abs(a), np.float64)
        hi = mag[:, khi]
        bound = (khi - klo).astype(np.float64)[None, :] * EPS_LD * hi
        bad = ~(bound <= PREFIX_TOL * (hi - mag[:, klo]))  # NaN (an infinity in the prefix) is bad too
    bad &= (khi > klo)[None, :]
    if bad.any():
        cols = np.flatnonzero(bad.any(axis=0))
        padded = np.zeros((a.shape[0], a.shape[1] + 1), np.longdouble)  # index K closes the last window
        padded[:, :-1] = a
        idx = np.empty(2 * len(cols), np.int64)
        idx[0::2], idx[1::2] = klo[cols], khi[cols]
        direct = np.add.reduceat(padded, idx, axis=1)[:, 0::2]
        out[:, cols] = np.where(bad[:, cols], direct, out[:, cols])
    return out


def sparse_query(a: np.ndarray, klo: np.ndarray, khi: np.ndarray, fn: np.ufunc) -> np.ndarray:
    """fn-reduction of a[:, klo_j:khi_j] for every j (empty ranges give NaN)."""
    S, K = a.shape
    T = len(klo)
    out = np.full((S, T), np.nan)
    length = khi - klo
    ok = length > 0
    if not ok.any() or K == 0:
        return out
    lev = np.zeros(T, np.int64)
    lev[ok] = np.floor(np.log2(length[ok])).astype(np.int64)
    tables = [a]
    maxlev = int(lev.max())
    for lv in range(1, maxlev + 1):
        prev = tables[-1]
        half = 1 << (lv - 1)
        tables.append(fn(prev[:, :-half], prev[:, half:]))
    for lv in np.unique(lev[ok]):
        cols = np.nonzero(ok & (lev == lv))[0]
        tab = tables[int(lv)]
        left = tab[:, klo[cols]]
        right = tab[:, khi[cols] - (1 << int(lv))]
        out[:, cols] = fn(left, right)
    return out


def range_stats(p: dict[str, np.ndarray], klo: np.ndarray, khi: np.ndarray, fields: frozenset[str] | None = None) -> SegStats:
    """Stats of panes [klo_j, khi_j) (column indexes into the (S, K) pane arrays ``p``); only
    ``fields`` (default all) are computed, the others keep their empty value."""
    count = p["count"]
    S, K = count.shape
    T = len(klo)
    klo = np.clip(klo, 0, K)
    khi = np.clip(np.maximum(khi, klo), 0, K)
    out = SegStats.empty((S, T))
    want = (lambda f: True) if fields is None else (lambda f: f in fields)  # noqa: E731
    for f in _ADD_INT:
        if want(f):
            pre = _prefix(p[f], np.int64)
            setattr(out, f, pre[:, khi] - pre[:, klo])
    for f in _ADD_FLOAT:
        if want(f):
            with np.errstate(over="ignore"):  # a sum past the float range is an infinity, as raw's
                setattr(out, f, _window_sums(p[f], klo, khi).astype(np.float64))
    with np.errstate(invalid="ignore"):
        if want("vmin"):
            out.vmin = sparse_query(p["vmin"], klo, khi, np.fmin)
        if want("vmax"):
            out.vmax = sparse_query(p["vmax"], klo, khi, np.fmax)
    if fields is not None and not (fields & {"first_v", "corr", "resets", "changes"}):
        return out
    nonempty = count > 0
    idx = np.arange(K, dtype=np.int64)
    # nxt[:, k] = first non-empty pane >= k (K if none); prv[:, k] = last non-empty pane < k (-1).
    nxt = np.full((S, K + 1), K, np.int64)
    nxt[:, :K] = np.minimum.accumulate(np.where(nonempty, idx, K)[:, ::-1], axis=1)[:, ::-1]
    prv = np.full((S, K + 1), -1, np.int64)
    prv[:, 1:] = np.maximum.accumulate(np.where(nonempty, idx, -1), axis=1)
    f = nxt[:, klo]
    l = prv[:, khi]
    has = f < khi[None, :]
    fc = np.clip(f, 0, max(K - 1, 0))
    lc = np.clip(l, 0, max(K - 1, 0))
    if K:
        out.first_t = np.where(has, np.take_along_axis(p["first_t"], fc, axis=1), 0)
        out.first_v = np.where(has, np.take_along_axis(p["first_v"], fc, axis=1), 0.0)
        out.last_t = np.where(has, np.take_along_axis(p["last_t"], lc, axis=1), 0)
        out.last_v = np.where(has, np.take_along_axis(p["last_v"], lc, axis=1), 0.0)
        for fld, entry, dtype in (("corr", "entry_corr", np.longdouble), ("resets", "entry_resets", np.int64),
                                  ("changes", "entry_changes", np.int64)):
            if not want(fld):
                continue
            if dtype is np.longdouble:
                tot = _window_sums(p[fld] + p[entry], klo, khi)
            else:
                pre = _prefix(p[fld] + p[entry], dtype)
                tot = pre[:, khi] - pre[:, klo]
            tot = tot - np.where(has, np.take_along_axis(p[entry], fc, axis=1), 0)
            setattr(out, fld, tot.astype(np.float64 if fld == "corr" else np.int64))
    return out
