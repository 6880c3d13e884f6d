"""The *_over_time family, vectorized over every (series, step) window.

* count/first/last/present/ts_of_first/ts_of_last: straight from the window bounds.
* min/max: ``np.fmin/fmax.reduceat`` over the windows (NaN only when every sample is NaN, as
  Prometheus's "replace while the current max is NaN" loop gives).
* sum/avg: exact integer prefix sums when every value is an integer and no partial sum can exceed
  2^53 (then Prometheus's compensated sum is that exact number too); otherwise one C-level
  ``reduceat`` sum per window, accepted when its rounding-error bound is below 2^-40 of the result,
  and for the remaining windows (cancellation, overflow, non-finite values) the kernel replicating
  Prometheus's Kahan-Neumaier sum / overflow-safe incremental mean bit for bit.
* stddev/stdvar: two-pass mean/variance on dense blocks of each window's samples; windows with
  non-finite values or a mean far from zero relative to the spread use the kernel replicating
  Prometheus's compensated Welford recurrence (its rounding then matters).
* quantile/mad: per-window sorts of dense blocks grouped by window length.
* ts_of_min/ts_of_max: the kernel (last occurrence of the extreme, NaN rules as Prometheus).

Native-histogram samples (``RangeWindows.hist``, only from sources that hold them) are counted by
count/present, returned by first/last (as the histogram plane), summed/averaged by sum/avg when a
window holds only histograms (a mix warns and gives no sample), and ignored with an info
annotation by the float-only functions (min, max, quantile, stddev, stdvar, mad, ts_of_min/max).
"""
from __future__ import annotations

import numpy as np

from promql.functions import FunctionContext, Histograms, register
from promql.functions.common import (
    dense_blocks,
    iterate_window_positions,
    kahan_inc,
    scalar_arg,
    scatter_back,
    window_first_last,
    window_vector,
    windows_arg,
)
from promql.eval_histogram import collision_warning, sum_histograms
from promql.histogram_planes import (
    mixed_exponential_custom,
    mixed_floats_histograms,
    mixed_range_ignored,
    reconciled_info,
    window_histograms,
)
from storage.go_format import format_float_g
from promql.types import HistogramError, RangeWindows, Value, VectorSteps
from storage.labels import metric_name

_EXACT_LIMIT = float(2**53)


def _nonempty(rw: RangeWindows) -> np.ndarray:
    return (rw.hi - rw.lo) > 0


def _hist_counts(rw: RangeWindows) -> np.ndarray | None:
    """Histogram samples per window, or None when the windows hold none."""
    if rw.hist is None:
        return None
    nh = rw.hist.hi - rw.hist.lo
    return nh if nh.any() else None


def _info_mixed(ctx: FunctionContext, rw: RangeWindows, arg: int) -> None:
    """Float-only functions: an info per series whose window mixes floats and histograms."""
    nh = _hist_counts(rw)
    if nh is None:
        return
    mixed = (nh > 0) & ((rw.hi - rw.lo) > 0)
    for s in np.flatnonzero(mixed.any(axis=1)).tolist():
        ctx.annotations.info(mixed_range_ignored(metric_name(rw.labels[s]), ctx.pos(arg)))


def _ignores_histograms(range_arg: int = 0, pos_arg: int = 0):
    """Decorator: the function works on the float samples only; mixed windows are annotated
    (at argument ``pos_arg``'s position, as Prometheus does)."""

    def deco(fn):
        def wrapped(ctx: FunctionContext, args: list[Value]) -> Value:
            rw = args[range_arg]
            if isinstance(rw, RangeWindows):
                _info_mixed(ctx, rw, pos_arg)
            return fn(ctx, args)

        wrapped.__name__ = fn.__name__
        wrapped.__doc__ = fn.__doc__
        return wrapped

    return deco


@register("count_over_time", histograms=Histograms.READS)
def count_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    n = (rw.hi - rw.lo).astype(np.float64)
    nh = _hist_counts(rw)
    if nh is not None:  # histogram samples count too
        n = n + nh
    return window_vector(rw, n, n > 0)


@register("present_over_time", histograms=Histograms.READS)
def present_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    p = _nonempty(rw)
    nh = _hist_counts(rw)
    if nh is not None:
        p = p | (nh > 0)
    return window_vector(rw, np.ones(p.shape), p)


def _edge_with_histograms(rw: RangeWindows, vals: np.ndarray, ts: np.ndarray, n: np.ndarray, last: bool,
                          keep_name: bool, as_timestamp: bool) -> VectorSteps | None:
    """first/last sample of windows that may hold histograms: the older (first) or newer (last)
    of the window's first/last float and first/last histogram. None when no histogram."""
    nh = _hist_counts(rw)
    if nh is None:
        return None
    hw = rw.hist
    assert hw is not None
    top = max(len(hw.ts) - 1, 0)
    hidx = np.clip(hw.hi - 1 if last else hw.lo, 0, top)
    hts = hw.ts[hidx] if len(hw.ts) else np.zeros(n.shape, np.int64)
    hhas = nh > 0
    fhas = n > 0
    if last:
        hwins = hhas & (~fhas | (hts > ts))
    else:
        hwins = hhas & (~fhas | (hts < ts))
    if as_timestamp:
        out = np.where(hwins, hts / 1000.0, vals)
        return window_vector(rw, out, fhas | hhas, keep_name=keep_name)
    plane = np.full(n.shape, None, dtype=object)
    plane[hwins] = hw.objs[hidx[hwins]]
    return window_vector(rw, vals, fhas & ~hwins, keep_name=keep_name, plane=plane)


@register("last_over_time", histograms=Histograms.READS, keeps_name=True)
def last_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    _, last, n = window_first_last(rw)
    vals = rw.vals[last] if len(rw.vals) else np.zeros(n.shape)
    if rw.hist is not None:
        ts = rw.ts[last] if len(rw.ts) else np.zeros(n.shape, np.int64)
        out = _edge_with_histograms(rw, vals, ts, n, True, True, False)
        if out is not None:
            return out
    return window_vector(rw, vals, n > 0, keep_name=True)


@register("first_over_time", histograms=Histograms.READS, keeps_name=True)
def first_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    first, _, n = window_first_last(rw)
    vals = rw.vals[first] if len(rw.vals) else np.zeros(n.shape)
    if rw.hist is not None:
        ts = rw.ts[first] if len(rw.ts) else np.zeros(n.shape, np.int64)
        out = _edge_with_histograms(rw, vals, ts, n, False, True, False)
        if out is not None:
            return out
    return window_vector(rw, vals, n > 0, keep_name=True)


@register("ts_of_last_over_time", histograms=Histograms.READS, experimental=True)
def ts_of_last_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    _, last, n = window_first_last(rw)
    vals = rw.ts[last] / 1000.0 if len(rw.ts) else np.zeros(n.shape)
    if rw.hist is not None:
        ts = rw.ts[last] if len(rw.ts) else np.zeros(n.shape, np.int64)
        out = _edge_with_histograms(rw, vals, ts, n, True, False, True)
        if out is not None:
            return out
    return window_vector(rw, vals, n > 0)


@register("ts_of_first_over_time", histograms=Histograms.READS, experimental=True)
def ts_of_first_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    first, _, n = window_first_last(rw)
    vals = rw.ts[first] / 1000.0 if len(rw.ts) else np.zeros(n.shape)
    if rw.hist is not None:
        ts = rw.ts[first] if len(rw.ts) else np.zeros(n.shape, np.int64)
        out = _edge_with_histograms(rw, vals, ts, n, False, False, True)
        if out is not None:
            return out
    return window_vector(rw, vals, n > 0)


def _reduce_windows(ufunc: np.ufunc, vals: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """ufunc.reduceat over arbitrary [lo, hi) windows (all non-empty)."""
    if lo.size == 0:
        return np.empty(0)
    ext = np.append(vals, vals[-1:] if len(vals) else [0.0])
    bounds = np.empty(2 * lo.size, dtype=np.int64)
    bounds[0::2] = lo
    bounds[1::2] = hi
    return ufunc.reduceat(ext, bounds)[0::2]


def _minmax(rw: RangeWindows, ufunc: np.ufunc) -> VectorSteps:
    n = rw.hi - rw.lo
    p = n > 0
    out = np.zeros(n.shape)
    sel = np.flatnonzero(p.reshape(-1))
    if sel.size:
        res = _reduce_windows(ufunc, np.asarray(rw.vals, dtype=np.float64), rw.lo.reshape(-1)[sel], rw.hi.reshape(-1)[sel])
        flat = out.reshape(-1)
        flat[sel] = res
    return window_vector(rw, out, p)


@register("max_over_time", histograms=Histograms.READS)
@_ignores_histograms()
def max_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    return _minmax(windows_arg(args[0]), np.fmax)


@register("min_over_time", histograms=Histograms.READS)
@_ignores_histograms()
def min_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    return _minmax(windows_arg(args[0]), np.fmin)


def _ts_of_extreme(rw: RangeWindows, want_max: bool) -> VectorSteps:
    lo, n = rw.lo, rw.hi - rw.lo
    order, it = iterate_window_positions(lo, n)
    W = order.size
    best = np.full(W, np.nan)
    best_t = np.zeros(W)
    vals = np.asarray(rw.vals, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        for k, m, idx in it:
            v = vals[idx]
            t = rw.ts[idx] / 1000.0
            cur = best[:m]
            take = (v >= cur) if want_max else (v <= cur)
            take |= np.isnan(cur)
            if k == 0:
                take[:] = True
            best[:m] = np.where(take, v, cur)
            best_t[:m] = np.where(take, t, best_t[:m])
    out = scatter_back(order, best_t, n.shape)
    return window_vector(rw, out, n > 0)


@register("ts_of_max_over_time", histograms=Histograms.READS, experimental=True)
@_ignores_histograms()
def ts_of_max_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    return _ts_of_extreme(windows_arg(args[0]), True)


@register("ts_of_min_over_time", histograms=Histograms.READS, experimental=True)
@_ignores_histograms()
def ts_of_min_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    return _ts_of_extreme(windows_arg(args[0]), False)


def _exact_prefix(vals: np.ndarray) -> np.ndarray | None:
    """Prefix sums that are exact (integers, every partial sum below 2^53), else None."""
    if not len(vals):
        return np.zeros(1)
    if not np.isfinite(vals).all():
        return None
    if not np.array_equal(vals, np.floor(vals)):
        return None
    with np.errstate(over="ignore"):
        total = float(np.abs(vals).sum())
    if total >= _EXACT_LIMIT:
        return None
    return np.concatenate(([0.0], np.cumsum(vals)))


def _kahan_sum_kernel(vals: np.ndarray, lo: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Prometheus's Kahan-Neumaier sum of each window (flat lo/n), bit for bit."""
    order, it = iterate_window_positions(lo, n)
    W = order.size
    s = np.zeros(W)
    c = np.zeros(W)
    with np.errstate(all="ignore"):
        for _, m, idx in it:
            s[:m], c[:m] = kahan_inc(vals[idx], s[:m], c[:m])
        res = np.where(np.isinf(s), s, s + c)
    out = np.empty(W)
    out[order] = res
    return out


def _avg_kernel(vals: np.ndarray, lo: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Prometheus's avg_over_time of each window (flat lo/n): compensated direct mean, switching
    to a compensated incremental mean once the running sum would overflow; bit for bit."""
    order, it = iterate_window_positions(lo, n)
    W = order.size
    total = np.zeros(W)
    comp = np.zeros(W)
    mean = np.zeros(W)
    incr = np.zeros(W, dtype=bool)
    with np.errstate(all="ignore"):
        for k, m, idx in it:
            f = vals[idx]
            if k == 0:
                total[:m] = f
                continue
            count = float(k + 1)
            s, c, mu, inc = total[:m], comp[:m], mean[:m], incr[:m]
            new_s, new_c = kahan_inc(f, s, c)
            direct = ~inc & ~np.isinf(new_s)
            switch = ~inc & np.isinf(new_s)
            # Windows switching to incremental mean now.
            mu = np.where(switch, s / (count - 1), mu)
            c = np.where(switch, c / (count - 1), c)
            inc = inc | switch
            q = (count - 1) / count
            inc_mean, inc_c = kahan_inc(f / count, q * mu, q * c)
            total[:m] = np.where(direct, new_s, s)
            comp[:m] = np.where(direct, new_c, np.where(inc, inc_c, c))
            mean[:m] = np.where(inc, inc_mean, mu)
            incr[:m] = inc
        cnt = n.reshape(-1)[order].astype(np.float64)
        cnt = np.where(cnt == 0, 1.0, cnt)
        res = np.where(incr, mean + comp, total / cnt + comp / cnt)
    out = np.empty(W)
    out[order] = res
    return out


# A plain per-window sum is accepted when its worst-case rounding error (n * eps * sum|v|) is below
# this fraction of the result; other windows (cancellation, overflow, non-finite values) are
# recomputed with the exact replica of Prometheus's compensated algorithm.
_PLAIN_SUM_REL_ERR = 2.0**-40


def _window_sums(rw: RangeWindows, avg: bool) -> np.ndarray:
    vals = np.asarray(rw.vals, dtype=np.float64)
    n = (rw.hi - rw.lo).reshape(-1)
    lo = rw.lo.reshape(-1)
    hi = rw.hi.reshape(-1)
    out = np.zeros(n.size)
    cs = _exact_prefix(vals)
    if cs is not None:
        with np.errstate(all="ignore"):
            tot = cs[hi] - cs[lo]
            out = tot / np.where(n == 0, 1, n) if avg else tot
        return out.reshape(rw.lo.shape)
    sel = np.flatnonzero(n > 0)
    if sel.size:
        with np.errstate(all="ignore"):
            plain = _reduce_windows(np.add, vals, lo[sel], hi[sel])
            absum = _reduce_windows(np.add, np.abs(vals), lo[sel], hi[sel])
            bound = n[sel] * np.finfo(np.float64).eps * absum
            ok = np.isfinite(plain) & np.isfinite(absum) & (bound <= _PLAIN_SUM_REL_ERR * np.abs(plain))
            res = plain / n[sel] if avg else plain
        bad = sel[~ok]
        if bad.size:
            kern = _avg_kernel if avg else _kahan_sum_kernel
            res[~ok] = kern(vals, lo[bad], n[bad])
        out[sel] = res
    return out.reshape(rw.lo.shape)


def _sum_avg_with_histograms(ctx: FunctionContext, rw: RangeWindows, vals: np.ndarray, avg: bool) -> VectorSteps | None:
    """Windows holding histograms: only histograms -> their sum (mean); floats and histograms
    mixed -> a warning and no sample (Prometheus). None when no window holds a histogram."""
    nh = _hist_counts(rw)
    if nh is None:
        return None
    hw = rw.hist
    assert hw is not None
    nf = rw.hi - rw.lo
    mixed = (nh > 0) & (nf > 0)
    for s in np.flatnonzero(mixed.any(axis=1)).tolist():
        ctx.annotations.warn(mixed_floats_histograms(metric_name(rw.labels[s]), ctx.pos(0)))
    plane = np.full(nf.shape, None, dtype=object)
    for r, c in zip(*np.nonzero((nh > 0) & (nf == 0))):  # histogram-only windows
        hs = window_histograms(hw, int(r), int(hw.lo[r, c]), int(hw.hi[r, c]), int(rw.window_end[c]) - rw.range_ms)
        try:
            total, collision, reconciled = sum_histograms(hs, mean=avg)
        except HistogramError:
            ctx.annotations.warn(mixed_exponential_custom(metric_name(rw.labels[r]), ctx.pos(0)))
            continue
        if collision:
            ctx.annotations.warn(collision_warning("aggregation", ctx.pos(0)))
        if reconciled:
            ctx.annotations.info(reconciled_info("aggregation", ctx.pos(0)))
        plane[r, c] = total
    return window_vector(rw, vals, (nf > 0) & ~mixed, plane=plane)


@register("sum_over_time", histograms=Histograms.READS)
def sum_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    vals = _window_sums(rw, False)
    out = _sum_avg_with_histograms(ctx, rw, vals, False) if rw.hist is not None else None
    return out if out is not None else window_vector(rw, vals, (rw.hi - rw.lo) > 0)


@register("avg_over_time", histograms=Histograms.READS)
def avg_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    vals = _window_sums(rw, True)
    out = _sum_avg_with_histograms(ctx, rw, vals, True) if rw.hist is not None else None
    return out if out is not None else window_vector(rw, vals, (rw.hi - rw.lo) > 0)


def _variance_kernel(vals: np.ndarray, lo: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Prometheus's compensated Welford recurrence, bit for bit, for flat windows."""
    order, it = iterate_window_positions(lo, n)
    W = order.size
    count = np.zeros(W)
    mean = np.zeros(W)
    c_mean = np.zeros(W)
    aux = np.zeros(W)
    c_aux = np.zeros(W)
    with np.errstate(all="ignore"):
        for _, m, idx in it:
            f = vals[idx]
            count[:m] += 1
            d = f - (mean[:m] + c_mean[:m])
            mean[:m], c_mean[:m] = kahan_inc(d / count[:m], mean[:m], c_mean[:m])
            aux[:m], c_aux[:m] = kahan_inc(d * (f - (mean[:m] + c_mean[:m])), aux[:m], c_aux[:m])
        var = (aux + c_aux) / np.where(count == 0, 1, count)
    out = np.empty(W)
    out[order] = var
    return out


_EPS_LD = float(np.finfo(np.longdouble).eps)
# Below this mean window length the dense two-pass path is cheaper than the extended-precision
# prefix sums (measured: 20-sample windows, dense 1.1-1.3 s vs prefix 1.9-2.2 s per 2.4M windows).
_PREFIX_MIN_WINDOW = 64


def _variance_prefix(rw: RangeWindows, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Variance of the selected flat windows from per-series prefix sums of (y - K) and (y - K)^2
    (K: the series' first value), accumulated in extended precision: O(samples + windows).
    Returns (variance, ok); windows whose rounding-error bound exceeds 1e-9 of the result, with
    non-finite values, or far from zero relative to their spread (where Prometheus's own Welford
    rounding shows) are not ok and left to the caller."""
    S, T = rw.lo.shape
    offs = np.asarray(rw.offsets, dtype=np.int64)
    lens = np.diff(offs)
    N = int(offs[-1])
    maxl = int(lens.max()) if S else 0
    W = sel.size
    if W == 0 or maxl == 0 or S * (maxl + 1) > 2 * N + 4096:
        return np.zeros(W), np.zeros(W, dtype=bool)
    vals = np.asarray(rw.vals, dtype=np.float64)[:N]
    series_of = np.repeat(np.arange(S), lens)
    col = np.arange(N) - offs[:-1][series_of]
    stride = maxl + 1
    flat = series_of * stride + col + 1
    first = vals[np.minimum(offs[:-1], max(N - 1, 0))]
    k_s = np.where(np.isfinite(first), first, 0.0)

    def prefix(x: np.ndarray, dtype) -> np.ndarray:
        g = np.zeros(S * stride, dtype=dtype)
        g[flat] = x
        g = g.reshape(S, stride)
        np.cumsum(g, axis=1, out=g)
        return g.reshape(-1)

    with np.errstate(all="ignore"):
        yk = vals - k_s[series_of]
        ykl = yk.astype(np.longdouble)
        e1 = prefix(ykl, np.longdouble)
        e2 = prefix(ykl * ykl, np.longdouble)
        a1 = prefix(np.abs(yk), np.float64)
        a2 = prefix(yk * yk, np.float64)
        prev = np.empty(N)
        if N:
            prev[0] = np.nan
            prev[1:] = vals[:-1]
        chg = (vals != prev).astype(np.int64)
        chg[col == 0] = 0
        e_chg = prefix(chg, np.int64)

        s_idx = sel // T
        lo_g = rw.lo.reshape(-1)[sel]
        hi_g = rw.hi.reshape(-1)[sel]
        lo_c = s_idx * stride + (lo_g - offs[s_idx])
        hi_c = s_idx * stride + (hi_g - offs[s_idx])
        nf = (hi_g - lo_g).astype(np.float64)
        s1 = e1[hi_c] - e1[lo_c]
        s2 = e2[hi_c] - e2[lo_c]
        var = ((s2 - s1 * s1 / nf) / nf).astype(np.float64)
        k = lens[s_idx].astype(np.float64) + 2
        m1 = np.abs((s1 / nf).astype(np.float64))
        err = (k * _EPS_LD * a2[hi_c] + 2 * m1 * k * _EPS_LD * a1[hi_c]) / nf + 4 * np.finfo(np.float64).eps * np.abs(var)
        mean = m1 * np.sign((s1).astype(np.float64)) + k_s[s_idx]
        ok = np.isfinite(var) & (var > 0) & (err <= 1e-9 * var) & ~(mean * mean > 1e8 * var)
        const = (e_chg[hi_c] - e_chg[np.minimum(lo_c + 1, hi_c)]) == 0
        const &= np.isfinite(vals[lo_g])
        var = np.where(const, 0.0, var)
        ok |= const
    return var, ok


def _variance(rw: RangeWindows) -> np.ndarray:
    """Population variance per window: prefix sums with an error bound for most windows
    (``_variance_prefix``), then a two-pass computation on dense blocks (at least as accurate as
    Prometheus's compensated Welford); windows holding non-finite values, or far from zero
    relative to their spread, use the exact replica. Constant windows are exactly 0 in all."""
    vals = np.asarray(rw.vals, dtype=np.float64)
    n = rw.hi - rw.lo
    out = np.zeros(n.size)
    sel = np.flatnonzero(n.reshape(-1) > 0)
    lo_f = rw.lo.reshape(-1)
    n_f = n.reshape(-1)
    if sel.size and float(n_f[sel].mean()) >= _PREFIX_MIN_WINDOW:
        # Long windows: prefix sums make the cost independent of the window length.
        p_var, p_ok = _variance_prefix(rw, sel)
        out[sel[p_ok]] = p_var[p_ok]
        sel = sel[~p_ok]
    all_finite = bool(np.isfinite(vals).all())
    with np.errstate(all="ignore"):
        for pos, idx in dense_blocks(rw.lo, n, sel):
            y = vals[idx]
            finite = np.ones(len(pos), dtype=bool) if all_finite else np.isfinite(y).all(axis=1)
            mu = y.mean(axis=1, keepdims=True)
            d = y - mu
            d *= d
            var = d.mean(axis=1)
            # Constant windows are exactly 0 (the mean of equal values may be off by an ulp).
            tiny = np.flatnonzero(var <= 1e-24 * (mu[:, 0] * mu[:, 0]))
            if tiny.size:
                yt = y[tiny]
                var[tiny[(yt == yt[:, :1]).all(axis=1)]] = 0.0
            # Far from zero relative to the spread, Prometheus's Welford recurrence carries
            # rounding error of its own; reproduce it there (and for non-finite values) exactly.
            replica = ~finite | ((mu[:, 0] * mu[:, 0] > 1e8 * var) & (var != 0.0))
            if replica.any():
                bad = pos[replica]
                var[replica] = _variance_kernel(vals, lo_f[bad], n_f[bad])
            out[pos] = var
    return out.reshape(n.shape)


@register("stdvar_over_time", histograms=Histograms.READS)
@_ignores_histograms()
def stdvar_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    return window_vector(rw, _variance(rw), (rw.hi - rw.lo) > 0)


@register("stddev_over_time", histograms=Histograms.READS)
@_ignores_histograms()
def stddev_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    with np.errstate(invalid="ignore"):
        out = np.sqrt(_variance(rw))
    return window_vector(rw, out, (rw.hi - rw.lo) > 0)


def _sorted_windows(rw: RangeWindows, sel: np.ndarray, chunk_elems: int = 4_000_000):
    """Yield (positions, sorted matrix, counts, nan_counts) for the selected flat windows, grouped
    by window length (so each block is a dense gather, no padding) and chunked to bound memory.

    Rows are the window's values sorted ascending with NaN placed *before* every number
    (Prometheus's sort order for quantiles).
    """
    lo_f = rw.lo.reshape(-1)[sel]
    n_f = (rw.hi - rw.lo).reshape(-1)[sel]
    vals = np.asarray(rw.vals, dtype=np.float64)
    has_nan = bool(np.isnan(vals).any())
    if n_f.size == 0:
        return
    order = np.argsort(n_f, kind="stable")
    n_sorted = n_f[order]
    bounds = np.flatnonzero(np.diff(n_sorted)) + 1
    starts = np.concatenate(([0], bounds))
    stops = np.concatenate((bounds, [order.size]))
    for a, b in zip(starts.tolist(), stops.tolist()):
        width = int(n_sorted[a])
        rows = max(1, chunk_elems // max(width, 1))
        for c0 in range(a, b, rows):
            part = order[c0 : min(b, c0 + rows)]
            idx = lo_f[part][:, None] + np.arange(width)[None, :]
            mat = vals[idx]
            if has_nan:
                nan = np.isnan(mat)
                nan_cnt = nan.sum(axis=1)
                # np.sort puts NaN last; Prometheus puts NaN first. Sort NaN as -Inf, then the
                # leading -Inf block's first nan_cnt entries are the NaNs.
                mat = np.sort(np.where(nan, -np.inf, mat), axis=1)
                mat = np.where(np.arange(width)[None, :] < nan_cnt[:, None], np.nan, mat)
            else:
                nan_cnt = np.zeros(len(part), dtype=np.int64)
                mat.sort(axis=1)
            yield sel[part], mat, n_f[part], nan_cnt


def _quantile_rows(q: np.ndarray, mat: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Prometheus's quantile() on each row's first ``counts`` values (already sorted)."""
    n = counts.astype(np.float64)
    with np.errstate(invalid="ignore"):
        rank = q * (n - 1)
        lower = np.maximum(0, np.floor(rank))
        upper = np.minimum(n - 1, lower + 1)
        weight = rank - np.floor(rank)
        li = np.clip(np.nan_to_num(lower, nan=0), 0, mat.shape[1] - 1).astype(np.int64)
        ui = np.clip(np.nan_to_num(upper, nan=0), 0, mat.shape[1] - 1).astype(np.int64)
        rows = np.arange(mat.shape[0])
        res = mat[rows, li] * (1 - weight) + mat[rows, ui] * weight
    res = np.where(np.isnan(q), np.nan, res)
    res = np.where(q < 0, -np.inf, res)
    res = np.where(q > 1, np.inf, res)
    return np.where(n == 0, np.nan, res)


@register("quantile_over_time", histograms=Histograms.READS)
@_ignores_histograms(range_arg=1, pos_arg=0)
def quantile_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[1])
    qs = scalar_arg(args[0], rw.num_steps)
    n = rw.hi - rw.lo
    p = n > 0
    bad = (np.isnan(qs) | (qs < 0) | (qs > 1)) & p.any(axis=0)
    for q in qs[bad]:
        ctx.annotations.warn(f"PromQL warning: quantile value should be between 0 and 1, got {format_float_g(float(q))}{ctx.pos(0)}")
    out = np.zeros(n.size)
    sel = np.flatnonzero(p.reshape(-1))
    T = rw.num_steps
    for pos, mat, counts, _ in _sorted_windows(rw, sel):
        out[pos] = _quantile_rows(qs[pos % T], mat, counts)
    return window_vector(rw, out.reshape(n.shape), p)


@register("mad_over_time", histograms=Histograms.READS, experimental=True)
@_ignores_histograms()
def mad_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    n = rw.hi - rw.lo
    p = n > 0
    out = np.zeros(n.size)
    sel = np.flatnonzero(p.reshape(-1))
    for pos, mat, counts, nan_cnt in _sorted_windows(rw, sel):
        half = np.full(len(pos), 0.5)
        med = _quantile_rows(half, mat, counts)
        width = mat.shape[1]
        valid = np.arange(width)[None, :] < counts[:, None]
        with np.errstate(invalid="ignore"):
            dev = np.where(valid, np.abs(mat - med[:, None]), np.inf)
        dev = np.sort(dev, axis=1)
        res = _quantile_rows(half, dev, counts)
        out[pos] = np.where(nan_cnt > 0, np.nan, res)
    return window_vector(rw, out.reshape(n.shape), p)
