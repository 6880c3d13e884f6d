"""Exact mergeable statistics of a contiguous run of samples ("segment"): moments and counter state.

One segment is a pane of one series, or a raw edge run of one series inside a query window. Every
field is an array so that S x K panes (or S x T windows) are handled at once with numpy.

Fields (``v`` = sample value, ``c`` = the series' shift constant, finite values only in the moments):

* ``count``: samples; ``nnan``/``npinf``/``nninf``: NaN / +Inf / -Inf samples.
* ``s1``/``s2``: sum of (v - c) and of (v - c)^2 over finite samples. Shifting by a per-series constant
  keeps stddev/stdvar from cancelling catastrophically when the mean is large relative to the spread.
* ``vmin``/``vmax``: NaN-ignoring min/max (NaN only when every sample is NaN, as Prometheus).
* ``first_t``/``first_v``/``last_t``/``last_v``: first and last sample.
* ``corr``: counter-reset correction inside the segment: sum of the previous value at every drop
  (Prometheus adds ``prev`` whenever ``cur < prev``), excluding the pair entering the segment.
* ``resets``/``changes``: drops / value changes inside the segment (entry pair excluded).

``combine(a, b)`` concatenates two segments (a before b) and accounts for the boundary pair, so
segments merge associatively: panes across time, and raw edges around whole panes, exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from promql.functions.rate import extrapolation_factor

FLOAT_FIELDS = ("s1", "s2", "vmin", "vmax", "first_v", "last_v", "corr")
INT_FIELDS = ("count", "nnan", "npinf", "nninf", "first_t", "last_t", "resets", "changes")
FIELDS = INT_FIELDS + FLOAT_FIELDS


@dataclass
class SegStats:
    count: np.ndarray
    nnan: np.ndarray
    npinf: np.ndarray
    nninf: np.ndarray
    s1: np.ndarray
    s2: np.ndarray
    vmin: np.ndarray
    vmax: np.ndarray
    first_t: np.ndarray
    first_v: np.ndarray
    last_t: np.ndarray
    last_v: np.ndarray
    corr: np.ndarray
    resets: np.ndarray
    changes: np.ndarray

    @classmethod
    def empty(cls, shape: tuple[int, ...]) -> "SegStats":
        d = {f: np.zeros(shape, np.int64) for f in INT_FIELDS}
        d.update({f: np.zeros(shape, np.float64) for f in FLOAT_FIELDS})
        d["vmin"][...] = np.nan
        d["vmax"][...] = np.nan
        return cls(**d)

    def arrays(self) -> dict[str, np.ndarray]:
        return {f: getattr(self, f) for f in FIELDS}

    def take(self, idx: object) -> "SegStats":
        return SegStats(**{f: getattr(self, f)[idx] for f in FIELDS})


def boundary(prev_v: np.ndarray, cur_v: np.ndarray, has_prev: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(correction, reset, change) contributed by the consecutive pair prev -> cur where ``has_prev``.

    As Prometheus: a drop (``cur < prev``, false for NaN) adds ``prev`` and counts a reset; a change is
    ``cur != prev`` unless both are NaN.
    """
    with np.errstate(invalid="ignore"):
        drop = has_prev & (cur_v < prev_v)
        change = has_prev & (cur_v != prev_v) & ~(np.isnan(cur_v) & np.isnan(prev_v))
    corr = np.where(drop, prev_v, 0.0)
    return corr, drop.astype(np.int64), change.astype(np.int64)


def combine(a: SegStats, b: SegStats) -> SegStats:
    """Concatenation a·b (a's samples all precede b's), elementwise over the arrays."""
    ha = a.count > 0
    hb = b.count > 0
    both = ha & hb
    bc, br, bch = boundary(a.last_v, b.first_v, both)
    with np.errstate(invalid="ignore"):
        out = SegStats(
            count=a.count + b.count,
            nnan=a.nnan + b.nnan,
            npinf=a.npinf + b.npinf,
            nninf=a.nninf + b.nninf,
            s1=a.s1 + b.s1,
            s2=a.s2 + b.s2,
            vmin=np.fmin(a.vmin, b.vmin),
            vmax=np.fmax(a.vmax, b.vmax),
            first_t=np.where(ha, a.first_t, b.first_t),
            first_v=np.where(ha, a.first_v, b.first_v),
            last_t=np.where(hb, b.last_t, a.last_t),
            last_v=np.where(hb, b.last_v, a.last_v),
            corr=a.corr + b.corr + bc,
            resets=a.resets + b.resets + br,
            changes=a.changes + b.changes + bch,
        )
    return out


def segments_from_sorted(
    group_start: np.ndarray, values: np.ndarray, timestamps: np.ndarray, shift: np.ndarray
) -> SegStats:
    """Stats of G contiguous groups of sorted samples; group g is [group_start[g], group_start[g+1]).

    ``shift`` is the per-sample shift constant (the series' ``c``). Groups must be non-empty.
    Vectorized with ``reduceat``; corrections use the previous sample *within the group* only.
    """
    n = len(values)
    g_end = np.append(group_start[1:], n)
    fin = np.isfinite(values)
    x = np.where(fin, values - shift, 0.0)
    pos = values == np.inf
    neg = values == -np.inf
    nan = np.isnan(values)
    prev = np.empty(n)
    if n:
        prev[0] = np.nan
        prev[1:] = values[:-1]
    has_prev = np.ones(n, bool)
    has_prev[group_start] = False  # first sample of a group has no in-group predecessor
    c, r, ch = boundary(prev, values, has_prev)
    with np.errstate(over="ignore"):  # squares past the float range: infinities, refused at read time
        x2 = x * x
    vmin = np.fmin.reduceat(values, group_start) if n else np.empty(0)
    vmax = np.fmax.reduceat(values, group_start) if n else np.empty(0)
    red = lambda arr: np.add.reduceat(arr, group_start) if n else np.empty(0, arr.dtype)  # noqa: E731
    return SegStats(
        count=(g_end - group_start).astype(np.int64),
        nnan=red(nan.astype(np.int64)),
        npinf=red(pos.astype(np.int64)),
        nninf=red(neg.astype(np.int64)),
        s1=red(x),
        s2=red(x2),
        vmin=vmin,
        vmax=vmax,
        first_t=timestamps[group_start].astype(np.int64),
        first_v=values[group_start].astype(np.float64),
        last_t=timestamps[g_end - 1].astype(np.int64),
        last_v=values[g_end - 1].astype(np.float64),
        corr=red(c),
        resets=red(r),
        changes=red(ch),
    )


# --- final functions over merged window stats -------------------------------------------------


def _constant(st: SegStats) -> np.ndarray:
    """Windows whose finite samples all have one value (an idle gauge's zeros): their sum is n times
    it and their variance 0, as the raw path's compensated sums give, where the shifted form
    ``s1 + n * c`` leaves rounding residue of a non-integer ``c`` (1e-17 for an all-zero window)."""
    return (st.vmin == st.vmax) & (st.count > 0)


def sum_values(st: SegStats, shift: np.ndarray) -> np.ndarray:
    """Sum of the raw values with IEEE semantics for NaN/Inf (finite part = s1 + n_finite * c)."""
    nfin = st.count - st.nnan - st.npinf - st.nninf
    finite = np.where(_constant(st), nfin * st.vmin, st.s1 + nfin * shift)
    out = finite.astype(np.float64)
    out = np.where(st.npinf > 0, np.inf, out)
    out = np.where(st.nninf > 0, -np.inf, out)
    out = np.where((st.nnan > 0) | ((st.npinf > 0) & (st.nninf > 0)), np.nan, out)
    return out


def variance(st: SegStats) -> np.ndarray:
    n = st.count.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        var = (st.s2 - st.s1 * st.s1 / n) / n
    # A constant (or single-sample) window has variance exactly 0 (Prometheus's Welford gives 0);
    # the sum-of-squares form leaves rounding residue of order eps * mean((v - c)^2): drop it.
    var = np.where(_constant(st) | (st.count <= 1), 0.0, var)
    bad = (st.nnan + st.npinf + st.nninf) > 0
    return np.where(bad, np.nan, var)


# The relative error exact answers must stay within (the raw path's own rounding is ~1e-16).
PRECISION_TOL = 1e-10
_EPS = float(np.finfo(np.float64).eps)


def sums_in_range(st: SegStats) -> bool:
    """Whether every window's sum of (v - c) stayed in the float range. Infinite and NaN samples are
    counted apart and never enter it, so only sums near 1e308 leave it; the raw path's compensated
    sum and running mean (``avg_over_time`` switches to one) answer those differently."""
    return bool(np.isfinite(st.s1).all())


def sum_precise(st: SegStats, shift: np.ndarray) -> bool:
    """Whether ``sum_values`` is within ``PRECISION_TOL`` of the raw path's compensated sum in every window.

    Pane sums add ``v - c`` in float64 one sample at a time, so a window whose values cancel (a gauge
    alternating between +x and -x, or +-1e6 around a small remainder) keeps the rounding of each
    addition at the values' magnitude while its sum is far smaller: Prometheus's Kahan-Neumaier sum
    gets 0 where the panes give 1e-15, or 0.0025219 where they give 0.0025189. The estimated rounding
    (``sqrt(n)`` additions' worth at the window's largest ``|v - c|``, the shift's products and the
    final sum's) must stay within the tolerance of the sum itself; constant windows are exact."""
    if not sums_in_range(st):
        return False
    nfin = (st.count - st.nnan - st.npinf - st.nninf).astype(np.float64)
    live = (nfin > 1) & ~_constant(st) & ((st.nnan + st.npinf + st.nninf) == 0)
    if not live.any():
        return True
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.fmax(np.abs(st.vmax - shift), np.abs(st.vmin - shift))
        total = np.abs(st.s1 + nfin * shift)
        err = _EPS * (np.sqrt(nfin) * nfin * m + 2 * np.abs(nfin * shift) + total)
        ok = err <= PRECISION_TOL * total
    return bool(np.all(~live | ok))


def variance_precise(st: SegStats, shift: np.ndarray | None = None) -> bool:
    """Whether ``variance`` is within ``PRECISION_TOL`` of the raw path in every window.

    ``s2 - s1^2 / n`` cancels: its rounding error is about eps * sqrt(n) * mean((v - c)^2), which is
    large next to the variance where the window's values sit far from the series' shift ``c`` (a
    counter hours after its first sample) or squares left the float range (values near 1e154).
    Constant windows are exact (0) whatever the shift."""
    if not (sums_in_range(st) and np.isfinite(st.s2).all()):
        return False
    n = st.count.astype(np.float64)
    live = (st.count > 1) & ~_constant(st) & ((st.nnan + st.npinf + st.nninf) == 0)
    if not live.any():
        return True
    with np.errstate(invalid="ignore", divide="ignore"):
        var = (st.s2 - st.s1 * st.s1 / n) / n
        ratio = (st.s2 / n) / var  # mean((v - c)^2) per unit of variance; inf where var <= 0
        err = 10 * _EPS * np.sqrt(n) * ratio
    return bool(np.all(~live | ((var > 0) & (err <= PRECISION_TOL))))


def extrapolated_rate(
    st: SegStats, range_start: np.ndarray, range_end: np.ndarray, range_s: float, is_counter: bool, is_rate: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Prometheus's extrapolatedRate (rate/increase/delta) from merged window stats.

    Returns (values, present); present needs at least two samples in the window.
    """
    present = st.count >= 2
    with np.errstate(invalid="ignore", divide="ignore"):
        result = st.last_v - st.first_v
        if is_counter:
            result = result + st.corr
        result = result * extrapolation_factor(result, st.first_v, st.first_t, st.last_t, st.count,
                                               range_start, range_end, range_s, is_counter, is_rate)
    return result, present
