"""Counter and gauge rate family: rate, increase, delta, irate, idelta, deriv, predict_linear,
resets, changes. All vectorized over every (series, step) window of a ``RangeWindows``."""
from __future__ import annotations

import numpy as np

from promql.functions import FunctionContext, Histograms, register
from promql.functions.common import (
    iterate_window_positions,
    kahan_inc,
    pairwise_prev,
    scalar_arg,
    window_count_of,
    window_first_last,
    window_vector,
    windows_arg,
)
from promql.functions.extended import anchored_windows, extended_rate
from promql.types import RangeWindows, Value, VectorSteps
from storage.labels import metric_name

_COUNTER_SUFFIXES = ("_total", "_sum", "_count", "_bucket")


# Windows per pass of the extrapolation arithmetic: about 30 elementwise passes run over each
# chunk, so its temporaries (a few 256 KiB arrays) stay cache-resident instead of streaming
# (series x steps)-sized temporaries through memory once per pass.
_CHUNK_WINDOWS = 1 << 15


def extrapolation_factor(delta: np.ndarray, first_v: np.ndarray, first_t: np.ndarray, last_t: np.ndarray,
                         count: np.ndarray, range_start: np.ndarray | int, range_end: np.ndarray | int,
                         range_s: float, is_counter: bool, is_rate: bool) -> np.ndarray:
    """Prometheus's extrapolatedRate: the factor turning ``delta`` (last - first of each window,
    counter-reset corrected for counters) into rate (``is_rate``), increase or delta.

    The samples cover [first_t, last_t] (int64 ms) of the window [range_start, range_end]; each
    edge is extrapolated to the window's boundary, or by half the average sample interval when
    the boundary is further than 1.1 intervals away; a counter's start is never extrapolated below
    zero (``first_v``). Arrays broadcast; the arithmetic keeps Prometheus's operation order so the
    float64 results are bit-identical. Windows need ``count >= 2`` (the caller's presence mask).
    Shared by the raw path (``_extrapolated``), the native-histogram path and the planner's
    exact summaries, so all three answer alike."""
    with np.errstate(all="ignore"):
        sampled = np.array(np.subtract(last_t, first_t), dtype=np.float64)
        sampled /= 1000.0
        avg = np.array(np.subtract(count, 1), dtype=np.float64)
        np.divide(sampled, avg, out=avg)  # average interval between samples
        threshold = avg * 1.1
        avg *= 0.5  # extrapolate by half an interval where the window edge is far
        d_start = np.array(np.subtract(first_t, range_start), dtype=np.float64)
        d_start /= 1000.0
        shape = np.broadcast_shapes(d_start.shape, avg.shape)
        if d_start.shape != shape:
            d_start = np.broadcast_to(d_start, shape).copy()
        np.copyto(d_start, avg, where=d_start >= threshold)
        if is_counter:
            # Counters cannot go below zero: stop the extrapolation at the zero point.
            d_zero = first_v / delta
            d_zero = d_zero * sampled
            clamp = (delta > 0) & (first_v >= 0) & (d_zero < d_start)
            np.copyto(d_start, d_zero, where=clamp)
        d_end = np.array(np.subtract(range_end, last_t), dtype=np.float64)
        d_end /= 1000.0
        if d_end.shape != shape:
            d_end = np.broadcast_to(d_end, shape).copy()
        np.copyto(d_end, avg, where=d_end >= threshold)
        d_start += sampled
        d_start += d_end
        d_start /= sampled  # the extrapolation factor
        if is_rate:
            d_start /= range_s
    return d_start


def _extrapolated(ctx: FunctionContext, rw: RangeWindows, is_counter: bool, is_rate: bool) -> VectorSteps:
    """Prometheus's extrapolatedRate for every window at once: the hottest function of
    dashboard queries. Counter-reset windows are found from the (usually few) reset samples and
    corrected up front (``_reset_corrected``); the extrapolation then runs over row chunks of
    the (S, T) window grid with in-place arithmetic in Prometheus's operation order, so results
    are bit-identical to its float64 evaluation."""
    if rw.extended:
        return extended_rate(rw, is_counter, is_rate)
    ts = np.asarray(rw.ts, dtype=np.int64)
    vals = np.asarray(rw.vals, dtype=np.float64)
    lo = np.asarray(rw.lo, dtype=np.int64)
    hi = np.asarray(rw.hi, dtype=np.int64)
    S, T = lo.shape
    n = hi - lo
    present = n >= 2
    out = np.zeros((S, T))
    if not len(vals) or not present.any():
        return window_vector(rw, out, present)
    ends = np.asarray(rw.window_end, dtype=np.int64)
    starts = ends - rw.range_ms
    range_s = rw.range_ms / 1000.0
    top = len(vals) - 1
    reset_w, reset_res = _reset_corrected(rw, lo, hi, n, vals) if is_counter else (None, None)
    rows = max(1, _CHUNK_WINDOWS // max(T, 1))
    with np.errstate(all="ignore"):
        for a in range(0, S, rows):
            b = min(S, a + rows)
            nn = n[a:b]
            first = np.minimum(lo[a:b], top)  # an empty window past the last sample: clamp (value unused)
            last = hi[a:b] - 1  # -1 for an empty window at index 0 wraps around (value unused)
            v_first = vals[first]
            res = out[a:b]
            np.take(vals, last, out=res, mode="wrap")
            res -= v_first
            if reset_w is not None and reset_w.size:
                i0, i1 = np.searchsorted(reset_w, (a * T, b * T))
                if i1 > i0:
                    res.reshape(-1)[reset_w[i0:i1] - a * T] = reset_res[i0:i1]
            res *= extrapolation_factor(res, v_first, ts[first], np.take(ts, last, mode="wrap"), nn,
                                        starts, ends, range_s, is_counter, is_rate)
    out = window_vector(rw, out, present)
    if is_counter:
        _possible_non_counter(ctx, out)
    return out


def _reset_corrected(rw: RangeWindows, lo: np.ndarray, hi: np.ndarray, n: np.ndarray,
                     vals: np.ndarray, allow_sparse: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Windows holding a counter reset and their reset-corrected ``last - first``.

    Returns (flat window indices ascending, corrected increase). A reset is a sample below its
    predecessor in the same series; each adds the value before it, one at a time in sample order
    like Prometheus (the order matters under cancellation).
    """
    N = len(vals)
    S, T = lo.shape
    W = S * T
    with np.errstate(invalid="ignore"):
        # drop[i - 1]: sample i is below sample i - 1. A "drop" onto a series' first sample
        # (from the previous series' last) is harmless: no window has that sample strictly
        # inside, so it is never counted.
        drop = vals[1:] < vals[:-1]
    resets = np.flatnonzero(drop) + 1
    empty = (np.zeros(0, np.int64), np.zeros(0))
    if not resets.size:
        return empty
    lo_f = lo.reshape(-1)
    hi_f = hi.reshape(-1)
    n_f = n.reshape(-1)
    ends = np.asarray(rw.window_end, dtype=np.int64)
    win = None
    ordered = ((T < 2 or (np.diff(ends) >= 0).all())
               and (S < 2 or ((lo[1:, 0] >= lo[:-1, -1]).all() and (hi[1:, 0] >= hi[:-1, -1]).all())))
    if allow_sparse and resets.size * 8 < W and ordered:
        # Window ends never decrease and rows follow the CSR order, so lo and hi never decrease
        # in row-major order (each series' windows lie inside its CSR slice): the windows with
        # lo < i < hi for a reset at sample i are one contiguous run, found by two binary
        # searches per reset.
        a = np.searchsorted(hi_f, resets, side="right")
        b = np.searchsorted(lo_f, resets, side="left")
        cnt = np.maximum(b - a, 0)
        total = int(cnt.sum())
        if total <= W:
            run_start = np.cumsum(cnt) - cnt
            win = np.unique(np.repeat(a - run_start, cnt) + np.arange(total))
    if win is None:
        # Many resets (or unordered window ends): count them per window with an integer prefix.
        upto = np.zeros(N, np.int64)  # upto[i]: resets at samples 1..i
        np.cumsum(drop, out=upto[1:])
        first = np.minimum(lo_f, N - 1)
        last = np.clip(hi_f - 1, 0, N - 1)
        win = np.flatnonzero((upto[last] > upto[first]) & (n_f >= 2))
    if not win.size:
        return empty
    lo_w = lo_f[win]
    n_w = n_f[win]
    acc = vals[lo_w + n_w - 1] - vals[lo_w]
    # The resets inside window w are resets[r0[w]:r1[w]] (samples lo < i < lo + n, ascending). They
    # are added one reset rank at a time, so each window adds its resets in sample order as Prometheus
    # does: as many passes as the most resets in one window, not as many as its samples.
    r0 = np.searchsorted(resets, lo_w, side="right")
    r1 = np.searchsorted(resets, lo_w + n_w - 1, side="right")
    cnt = r1 - r0
    for r in range(int(cnt.max()) if cnt.size else 0):
        sel = np.flatnonzero(cnt > r)
        acc[sel] += vals[resets[r0[sel] + r] - 1]
    return win, acc


def _possible_non_counter(ctx: FunctionContext, out: VectorSteps) -> None:
    """Prometheus's info for rate()/increase() over a metric whose name does not look like a counter."""
    for name in dict.fromkeys(metric_name(lbls) for lbls in out.labels):
        if name and not name.endswith(_COUNTER_SUFFIXES):
            ctx.annotations.info(
                f'PromQL info: metric might not be a counter, name does not end in '
                f'_total/_sum/_count/_bucket: "{name}"{ctx.pos(0)}'
            )


@register("rate", histograms=Histograms.EXTRAPOLATED)
def rate(ctx: FunctionContext, args: list[Value]) -> Value:
    return _extrapolated(ctx, windows_arg(args[0]), True, True)


@register("increase", histograms=Histograms.EXTRAPOLATED)
def increase(ctx: FunctionContext, args: list[Value]) -> Value:
    return _extrapolated(ctx, windows_arg(args[0]), True, False)


@register("delta", histograms=Histograms.EXTRAPOLATED)
def delta(ctx: FunctionContext, args: list[Value]) -> Value:
    return _extrapolated(ctx, windows_arg(args[0]), False, False)


def _instant(rw: RangeWindows, is_rate: bool) -> VectorSteps:
    _, last, n = window_first_last(rw)
    ts = np.asarray(rw.ts, dtype=np.int64)
    vals = np.asarray(rw.vals, dtype=np.float64)
    if not len(vals):
        return window_vector(rw, np.zeros(n.shape), np.zeros(n.shape, dtype=bool))
    prev_i = np.maximum(last - 1, 0)
    dt = ts[last] - ts[prev_i]
    present = (n >= 2) & (dt != 0)
    with np.errstate(all="ignore"):
        v1 = vals[last]
        v0 = vals[prev_i]
        if is_rate:
            res = np.where(v1 < v0, v1, v1 - v0)
            res = res / (np.where(dt == 0, 1, dt) / 1000.0)
        else:
            res = v1 - v0
    return window_vector(rw, res, present)


@register("irate", histograms=Histograms.INSTANT_PAIR)
def irate(ctx: FunctionContext, args: list[Value]) -> Value:
    return _instant(windows_arg(args[0]), True)


@register("idelta", histograms=Histograms.INSTANT_PAIR)
def idelta(ctx: FunctionContext, args: list[Value]) -> Value:
    return _instant(windows_arg(args[0]), False)


def _regression_kernel(rw: RangeWindows, lo: np.ndarray, n: np.ndarray, t0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Prometheus's linearRegression with compensated sums, bit for bit, for flat windows."""
    ts = np.asarray(rw.ts, dtype=np.int64)
    vals = np.asarray(rw.vals, dtype=np.float64)
    order, it = iterate_window_positions(lo, n)
    W = order.size
    t0 = t0[order]
    cnt = np.zeros(W)
    sx = np.zeros(W); cx = np.zeros(W)
    sy = np.zeros(W); cy = np.zeros(W)
    sxy = np.zeros(W); cxy = np.zeros(W)
    sx2 = np.zeros(W); cx2 = np.zeros(W)
    init_y = np.zeros(W)
    const_y = np.ones(W, dtype=bool)
    with np.errstate(all="ignore"):
        for k, m, idx in it:
            y = vals[idx]
            x = (ts[idx] - t0[:m]) / 1e3
            if k == 0:
                init_y[:m] = y
            else:
                const_y[:m] &= ~(y != init_y[:m])
            cnt[:m] += 1.0
            sx[:m], cx[:m] = kahan_inc(x, sx[:m], cx[:m])
            sy[:m], cy[:m] = kahan_inc(y, sy[:m], cy[:m])
            sxy[:m], cxy[:m] = kahan_inc(x * y, sxy[:m], cxy[:m])
            sx2[:m], cx2[:m] = kahan_inc(x * x, sx2[:m], cx2[:m])
        sx = sx + cx
        sy = sy + cy
        sxy = sxy + cxy
        sx2 = sx2 + cx2
        cnt_safe = np.where(cnt == 0, 1.0, cnt)
        cov = sxy - sx * sy / cnt_safe
        var = sx2 - sx * sx / cnt_safe
        slope = cov / var
        intercept = sy / cnt_safe - slope * sx / cnt_safe
        inf_y = np.isinf(init_y)
        slope = np.where(const_y, np.where(inf_y, np.nan, 0.0), slope)
        intercept = np.where(const_y, np.where(inf_y, np.nan, init_y), intercept)
    out_s = np.empty(W)
    out_i = np.empty(W)
    out_s[order] = slope
    out_i[order] = intercept
    return out_s, out_i


_EPS_LD = float(np.finfo(np.longdouble).eps)
_EPS = float(np.finfo(np.float64).eps)
_REG_REL_ERR = 1e-9


def _regression_prefix(rw: RangeWindows, intercept_ms: np.ndarray | None, sel: np.ndarray,
                       need_intercept: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Slope/intercept of the selected flat windows from per-series prefix sums: O(samples + windows)
    instead of O(samples per window x windows).

    Time sums are exact integers (int64 milliseconds; the sum of squares uses wrapping int64
    arithmetic, exact because the window's true value fits), value sums accumulate per series in
    extended precision. Each window gets a rounding-error bound; windows whose bound exceeds
    1e-9 of the result (cancellation, non-finite values, huge windows) are reported not ok and
    recomputed by the caller. Returns (slope, intercept, ok) for ``sel``.
    """
    S, T = rw.lo.shape
    offs = np.asarray(rw.offsets, dtype=np.int64)
    lens = np.diff(offs)
    N = int(offs[-1])
    maxl = int(lens.max()) if S else 0
    W = sel.size
    bad = (np.zeros(W), np.zeros(W), np.zeros(W, dtype=bool))
    if W == 0 or maxl == 0 or S * (maxl + 1) > 2 * N + 4096:
        return bad
    ts = np.asarray(rw.ts, dtype=np.int64)[:N]
    vals = np.asarray(rw.vals, dtype=np.float64)[:N]
    series_of = np.repeat(np.arange(S), lens)
    col = np.arange(N) - offs[:-1][series_of]
    base = ts[np.minimum(offs[:-1], max(N - 1, 0))]
    d = ts - base[series_of]
    stride = maxl + 1
    flat = series_of * stride + col + 1  # slot of "sum including sample" in the (S, maxl+1) grid

    def prefix(x: np.ndarray, dtype) -> np.ndarray:
        g = np.zeros(S * stride, dtype=dtype)
        g[flat] = x
        g = g.reshape(S, stride)
        with np.errstate(over="ignore"):
            np.cumsum(g, axis=1, out=g)
        return g.reshape(-1)

    with np.errstate(all="ignore"):
        yl = vals.astype(np.longdouble)
        dl = d.astype(np.longdouble)
        e_d = prefix(d, np.int64)
        e_d2 = prefix(d * d, np.int64)  # wraps modulo 2^64 for long series; differences stay exact
        e_y = prefix(yl, np.longdouble)
        e_dy = prefix(dl * yl, np.longdouble)
        a_y = prefix(np.abs(vals), np.float64)
        a_dy = prefix(np.abs(d.astype(np.float64) * vals), np.float64)
        prev = np.empty(N)
        if N:
            prev[0] = np.nan
            prev[1:] = vals[:-1]
        chg = (vals != prev).astype(np.int64)
        chg[col == 0] = 0
        e_chg = prefix(chg, np.int64)

        s_idx = sel // T
        t_idx = sel % T
        lo_g = rw.lo.reshape(-1)[sel]
        hi_g = rw.hi.reshape(-1)[sel]
        lo_c = s_idx * stride + (lo_g - offs[s_idx])
        hi_c = s_idx * stride + (hi_g - offs[s_idx])
        n = (hi_g - lo_g).astype(np.int64)
        nf = n.astype(np.float64)
        if intercept_ms is None:
            t0 = ts[lo_g]
        else:
            t0 = np.asarray(intercept_ms, dtype=np.int64)[t_idx]
        d0 = t0 - base[s_idx]
        sd = e_d[hi_c] - e_d[lo_c]
        sx_int = sd - n * d0
        sx2_int = (e_d2[hi_c] - e_d2[lo_c]) - 2 * d0 * sd + n * d0 * d0
        far = np.maximum(np.abs(ts[hi_g - 1] - t0), np.abs(ts[lo_g] - t0)).astype(np.float64)
        fits = nf * far * far < 2.0**62
        sx = sx_int / 1e3
        sx2 = sx2_int / 1e6
        sy_l = e_y[hi_c] - e_y[lo_c]
        sy = sy_l.astype(np.float64)
        sxy = ((e_dy[hi_c] - e_dy[lo_c] - d0.astype(np.longdouble) * sy_l) / 1000).astype(np.float64)
        cov = sxy - sx * sy / nf
        var = sx2 - sx * sx / nf
        slope = cov / var
        intercept = sy / nf - slope * sx / nf
        k = lens[s_idx].astype(np.float64) + 2
        e_y_err = k * _EPS_LD * a_y[hi_c]
        e_dy_err = k * _EPS_LD * a_dy[hi_c] + np.abs(d0) * e_y_err
        # Prometheus's own rounding: the products x*y (each x = (t - t0) / 1000 rounded) up to
        # max|x| * sum|y| ulps, and varX = sumX2 - sumX^2/n, relative error ~ ulps of
        # sumX2 / varX (large when the intercept time is far from the window).
        say = a_y[hi_c] - a_y[lo_c]
        e_cov = (e_dy_err / 1000 + np.abs(sx / nf) * e_y_err + 4 * _EPS * (np.abs(sxy) + np.abs(sx * sy / nf))
                 + 8 * _EPS * (far / 1000) * say)
        rel = e_cov / np.abs(cov) + 8 * _EPS * sx2 / np.abs(var)
        ok = fits & np.isfinite(slope) & (rel <= _REG_REL_ERR)
        if need_intercept:
            e_int = (e_y_err / nf + np.abs(sx / nf) * np.abs(slope) * rel
                     + 4 * _EPS * (np.abs(sy / nf) + np.abs(slope * sx / nf)))
            ok &= np.isfinite(intercept) & (e_int <= _REG_REL_ERR * np.abs(intercept))
        const = (e_chg[hi_c] - e_chg[np.minimum(lo_c + 1, hi_c)]) == 0
        y0 = vals[lo_g]
        fin0 = np.isfinite(y0)
        slope = np.where(const, 0.0, slope)
        intercept = np.where(const, y0, intercept)
        ok = np.where(const, fin0, ok)
    return slope, intercept, ok


# Windows of at most this many samples take the dense path (``_regression_dense``): a gather of
# their samples costs about as much as the per-window arithmetic of the prefix-sum path once
# windows reach a few dozen samples.
_DENSE_MAX_N = 32
_DENSE_CHUNK = 1 << 16  # samples gathered per dense block (cache-sized temporaries)


def _width_groups(lo_sel: np.ndarray, n_sel: np.ndarray, chunk: int):
    """Windows grouped by sample count and chunked: yields (positions, idx) with idx the
    (width, rows) sample indices of those windows (one row of the matrix per position inside
    the window, so per-window sums are contiguous vector adds down axis 0). Positions are a
    slice when every window has the same width (the common case: no scatter needed)."""
    if not n_sel.size:
        return
    uniform = n_sel.min() == n_sel.max()
    if uniform:
        order = None
        bounds = [0, n_sel.size]
    else:
        order = np.argsort(n_sel, kind="stable")
        ns = n_sel[order]
        bounds = [0, *(np.flatnonzero(np.diff(ns)) + 1).tolist(), n_sel.size]
    for a, b in zip(bounds[:-1], bounds[1:]):
        width = int(n_sel[a] if order is None else n_sel[order[a]])
        rows = max(1, chunk // max(width, 1))
        offs = np.arange(width, dtype=np.int64)[:, None]
        for c0 in range(a, b, rows):
            c1 = min(b, c0 + rows)
            pos = slice(c0, c1) if order is None else order[c0:c1]
            yield pos, lo_sel[pos][None, :] + offs


_STAT_FIELDS = ("base", "span", "sy", "say", "var_n", "ubar", "cov", "syy", "const", "y0", "usable")


def _dense_stats(ts: np.ndarray, vals: np.ndarray, idx: np.ndarray) -> dict[str, np.ndarray]:
    """Per-window sums of one (width, rows) block of sample indices: first timestamp, span
    (ms), sum y, sum |y|, n * sum((u - mean u)^2) (exact integers, u = ms since the first
    sample), mean u, centred covariance sum((u - mean u)(y - mean y)) and sum((y - mean y)^2)
    (two-pass), whether all values equal the first, the first value, and usable (False where
    the integer sums could overflow: those go to the exact replica)."""
    width, rows = idx.shape
    y = vals[idx]
    t = ts[idx]
    base = t[0].copy()
    t -= base
    span = t[-1]
    if width * width * float(span.max()) ** 2 >= 2.0**62:
        z = np.zeros(rows)
        return dict(base=base, span=span, sy=z, say=z, var_n=np.ones(rows, np.int64), ubar=z, cov=z, syy=z,
                    const=np.zeros(rows, bool), y0=z, usable=np.zeros(rows, bool))
    first = y[0].copy()
    # Prometheus: a window whose values all equal the first has slope 0 and intercept that
    # value (NaN/NaN when it is infinite; NaN never equals itself).
    const = (y[1:] == first).all(axis=0)
    say = np.abs(y).sum(axis=0)
    sy = y.sum(axis=0)
    su = t.sum(axis=0)
    var_n = width * np.einsum("ij,ij->j", t, t) - su * su
    ubar = su / width
    y -= sy / width  # centred values
    uc = t - ubar  # centred times (float)
    cov = np.einsum("ij,ij->j", uc, y)
    syy = np.einsum("ij,ij->j", y, y)
    return dict(base=base, span=span, sy=sy, say=say, var_n=var_n, ubar=ubar, cov=cov, syy=syy,
                const=const, y0=first, usable=np.ones(rows, bool))


def _dense_finish(st: dict[str, np.ndarray], width: np.ndarray | float, t0: np.ndarray | None,
                  need_intercept: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Slope, intercept at t0 (None: the window's first sample) and ok, from ``_dense_stats``.

    Error terms (seconds units): ours ~ (n + 3) ulps of sum(|u - mean u| |y - mean y|) <=
    sqrt(sum (u - mean u)^2 * sum (y - mean y)^2) (Cauchy-Schwarz), plus the mean's rounding
    carried through sum(u - mean u) ~ n ulps of mean u. Prometheus's: ~ ulps of |cov| and of
    sum(|x| |y|) <= max|x| * sum|y| (the products x*y, sumX*sumY/n and the final subtraction),
    x = (t - t0) / 1000; and of its varX = sumX2 - sumX^2/n, ~ ulps of sumX2 / varX (ours is
    exact). ok only when they stay below 1e-9 of the result.
    """
    var_n, cov, say, sy = st["var_n"], st["cov"], st["say"], st["sy"]
    slope = cov * width / var_n * 1000.0  # per second
    ybar = sy / width
    cov_s = cov / 1000.0
    var_s = var_n / (width * 1e6)
    ubar, span = st["ubar"], st["span"]
    if t0 is None:
        xbar = ubar / 1000.0
        xmax = span / 1000.0
    else:
        d0 = st["base"] - t0
        xbar = (d0 + ubar) / 1000.0
        xmax = np.maximum(np.abs(d0), np.abs(d0 + span)) / 1000.0
    err = _EPS * (4 * width * np.sqrt(var_n / width * st["syy"]) / 1000.0
                  + width * width * _EPS * say * ubar / 1000.0
                  + 8 * (np.abs(cov_s) + xmax * say))
    rel = err / np.abs(cov_s) + 8 * _EPS * (var_s + width * xbar * xbar) / var_s
    usable, const, y0 = st["usable"], st["const"], st["y0"]
    ok = usable & np.isfinite(sy) & np.isfinite(slope) & (rel <= _REG_REL_ERR)
    icpt = ybar - slope * xbar
    if need_intercept:
        e_int = 8 * _EPS * (np.abs(ybar) + np.abs(slope * xbar)) + np.abs(slope * xbar) * rel
        ok &= np.isfinite(icpt) & (e_int <= _REG_REL_ERR * np.abs(icpt))
    return (np.where(const, 0.0, slope), np.where(const, y0, icpt),
            np.where(const, usable & np.isfinite(y0), ok))


def _regression_dense(rw: RangeWindows, intercept_ms: np.ndarray | None, sel: np.ndarray,
                      need_intercept: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Slope/intercept of short windows from a dense gather of their samples, grouped by
    width (``_dense_stats``: exact integer time sums, two-pass centred covariance) with an
    error bound covering both our rounding and Prometheus's (``_dense_finish``); windows it
    cannot vouch for (ill-conditioned, non-finite, constant-infinite) are reported not ok and go
    to the bit-exact replica. Windows that repeat (steps finer than the sample interval select
    the same samples again) are summed once. Returns (slope, intercept, ok) for ``sel``.
    """
    T = rw.lo.shape[1]
    ts = np.asarray(rw.ts, dtype=np.int64)
    vals = np.asarray(rw.vals, dtype=np.float64)
    lo_sel = np.asarray(rw.lo, dtype=np.int64).reshape(-1)[sel]
    n_sel = np.asarray(rw.hi, dtype=np.int64).reshape(-1)[sel] - lo_sel
    W = sel.size
    t0_all = None if intercept_ms is None else intercept_ms[sel % T]
    # The same window again is the next one in row-major order (lo never decreases along a
    # series' steps, and different series hold different samples).
    new = np.ones(W, dtype=bool)
    new[1:] = (lo_sel[1:] != lo_sel[:-1]) | (n_sel[1:] != n_sel[:-1])
    uniq = np.flatnonzero(new)
    slope = np.zeros(W)
    icpt = np.zeros(W)
    ok = np.zeros(W, dtype=bool)
    with np.errstate(all="ignore"):
        if uniq.size >= 0.8 * W:
            for pos, idx in _width_groups(lo_sel, n_sel, _DENSE_CHUNK):
                st = _dense_stats(ts, vals, idx)
                t0 = None if t0_all is None else t0_all[pos]
                slope[pos], icpt[pos], ok[pos] = _dense_finish(st, float(idx.shape[0]), t0, need_intercept)
            return slope, icpt, ok
        lo_u, n_u = lo_sel[uniq], n_sel[uniq]
        U = uniq.size
        acc = {k: np.zeros(U, dtype=np.int64 if k in ("base", "span", "var_n") else bool if k in ("const", "usable") else np.float64)
               for k in _STAT_FIELDS}
        for pos, idx in _width_groups(lo_u, n_u, _DENSE_CHUNK):
            st = _dense_stats(ts, vals, idx)
            for k in _STAT_FIELDS:
                acc[k][pos] = st[k]
        if t0_all is None:
            # deriv: everything depends on the window only; finish once per distinct window
            s_u, i_u, ok_u = _dense_finish(acc, n_u.astype(np.float64), None, False)
            inv = np.cumsum(new) - 1
            return s_u[inv], i_u[inv], ok_u[inv]
        # predict_linear: the intercept time differs per step. What does not depend on it is
        # finished once per distinct window; per output window remain the intercept and the
        # error terms that grow with the distance to the intercept time (one gather of a
        # (fields, windows) table, rows contiguous for the arithmetic that follows).
        width = n_u.astype(np.float64)
        var_n, cov, say, sy = acc["var_n"], acc["cov"], acc["say"], acc["sy"]
        s_u = cov * width / var_n * 1000.0
        cov_s = np.abs(cov / 1000.0)
        var_s = var_n / (width * 1e6)
        ours = _EPS * (4 * width * np.sqrt(var_n / width * acc["syy"]) / 1000.0
                       + width * width * _EPS * say * acc["ubar"] / 1000.0 + 8 * cov_s)
        ok_u = acc["usable"] & np.isfinite(sy) & np.isfinite(s_u)
        const = acc["const"]
        table = np.stack([acc["base"].astype(np.float64), acc["ubar"], acc["span"].astype(np.float64), s_u,
                          sy / width, ours / cov_s, 8 * _EPS * say / cov_s, 8 * _EPS / var_s, var_s, width,
                          np.where(const, 1.0, 0.0), acc["y0"], np.where(ok_u, 1.0, 0.0)])
        inv = np.cumsum(new) - 1
        for a in range(0, W, 1 << 15):  # per output window, in cache-sized chunks
            part = slice(a, min(W, a + (1 << 15)))
            (base, ubar, span, sl, ybar, rel0, rel_x, rel_v, var_w, wid, cst, first, okb) = np.take(
                table, inv[part], axis=1)
            d0 = base - t0_all[part]
            xbar = (d0 + ubar) / 1000.0
            xmax = np.maximum(np.abs(d0), np.abs(d0 + span)) / 1000.0
            rel = rel0 + xmax * rel_x + rel_v * (var_w + wid * xbar * xbar)
            ic = ybar - sl * xbar
            sx = np.abs(sl * xbar)
            e_int = 8 * _EPS * (np.abs(ybar) + sx) + sx * rel
            good = (okb != 0) & (rel <= _REG_REL_ERR) & np.isfinite(ic) & (e_int <= _REG_REL_ERR * np.abs(ic))
            c = cst != 0
            slope[part] = np.where(c, 0.0, sl)
            icpt[part] = np.where(c, first, ic)
            ok[part] = np.where(c, (okb != 0) & np.isfinite(first), good)
    return slope, icpt, ok


def _linear_regression(rw: RangeWindows, intercept_ms: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least-squares slope and intercept per window (windows with at least two samples).

    intercept_ms: (T,) intercept time per step, or None for "the window's first sample".
    Short windows come from a dense gather (``_regression_dense``), longer ones from per-series
    prefix sums (``_regression_prefix``), each with an error bound; the windows neither can
    vouch for (cancellation, NaN/Inf, huge windows) use the exact replica of Prometheus's
    compensated-sum algorithm, so results agree with Prometheus even where its own rounding
    dominates. Returns (slope, intercept, present).
    """
    S, T = rw.lo.shape
    lo = np.asarray(rw.lo, dtype=np.int64)
    n = np.asarray(rw.hi, dtype=np.int64) - lo
    ts = np.asarray(rw.ts, dtype=np.int64)
    present = n >= 2
    slope = np.zeros(S * T)
    intercept = np.zeros(S * T)
    sel = np.flatnonzero(present.reshape(-1))
    if not sel.size:
        return slope.reshape(S, T), intercept.reshape(S, T), present
    lo_f = lo.reshape(-1)
    n_f = n.reshape(-1)
    steps = None if intercept_ms is None else np.asarray(intercept_ms, dtype=np.int64)
    need_icpt = steps is not None
    short = n_f[sel] <= _DENSE_MAX_N
    todo = []
    if short.any():
        d_sel = sel[short]
        d_slope, d_icpt, d_ok = _regression_dense(rw, steps, d_sel, need_icpt)
        slope[d_sel[d_ok]] = d_slope[d_ok]
        intercept[d_sel[d_ok]] = d_icpt[d_ok]
        todo.append(d_sel[~d_ok])
    long_sel = sel[~short]
    if long_sel.size:
        p_slope, p_icpt, p_ok = _regression_prefix(rw, steps, long_sel, need_intercept=need_icpt)
        slope[long_sel[p_ok]] = p_slope[p_ok]
        intercept[long_sel[p_ok]] = p_icpt[p_ok]
        todo.append(long_sel[~p_ok])
    rest = np.sort(np.concatenate(todo)) if todo else np.zeros(0, np.int64)
    if rest.size:
        # Windows the fast paths cannot vouch for (ill-conditioned, non-finite, huge): the exact
        # replica of Prometheus's algorithm, so even its rounding is reproduced.
        t0 = ts[lo_f[rest]] if steps is None else steps[rest % T]
        slope[rest], intercept[rest] = _regression_kernel(rw, lo_f[rest], n_f[rest], t0)
    return slope.reshape(S, T), intercept.reshape(S, T), present


@register("deriv", histograms=Histograms.FLOATS_MIXED_INFO)
def deriv(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    slope, _, present = _linear_regression(rw, None)
    return window_vector(rw, slope, present)


@register("predict_linear", histograms=Histograms.FLOATS_MIXED_INFO)
def predict_linear(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    duration = scalar_arg(args[1], rw.num_steps)
    slope, intercept, present = _linear_regression(rw, np.asarray(ctx.step_times, dtype=np.int64))
    with np.errstate(all="ignore"):
        res = slope * duration[None, :] + intercept
    return window_vector(rw, res, present)


@register("resets", histograms=Histograms.RESETS)
def resets(ctx: FunctionContext, args: list[Value]) -> Value:
    rw, found = _anchored(windows_arg(args[0]))
    prev, same = pairwise_prev(rw)
    with np.errstate(invalid="ignore"):
        flags = same & (np.asarray(rw.vals) < prev)
    n = rw.hi - rw.lo
    return window_vector(rw, window_count_of(flags, rw.lo, rw.hi), (n >= 1) & found)


def _anchored(rw: RangeWindows) -> tuple[RangeWindows, np.ndarray | bool]:
    return anchored_windows(rw) if rw.extended else (rw, True)


@register("changes", histograms=Histograms.CHANGES)
def changes(ctx: FunctionContext, args: list[Value]) -> Value:
    rw, found = _anchored(windows_arg(args[0]))
    vals = np.asarray(rw.vals, dtype=np.float64)
    prev, same = pairwise_prev(rw)
    with np.errstate(invalid="ignore"):
        flags = same & (vals != prev) & ~(np.isnan(vals) & np.isnan(prev))
    n = rw.hi - rw.lo
    return window_vector(rw, window_count_of(flags, rw.lo, rw.hi), (n >= 1) & found)
