"""Counter and gauge rate family: rate, increase, delta, irate, idelta, deriv, predict_linear,
resets, changes. All vectorized over every (series, step) window of a ``RangeWindows``."""
from __future__ import annotations

import numpy as np

from promql.functions import FunctionContext, register
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
from promql.types import RangeWindows, Value, VectorSteps
from storage.labels import metric_name

_COUNTER_SUFFIXES = ("_total", "_sum", "_count", "_bucket")


def _extrapolated(ctx: FunctionContext, rw: RangeWindows, is_counter: bool, is_rate: bool) -> VectorSteps:
    """Prometheus's extrapolatedRate for every window at once (in-place arithmetic on (S, T)
    arrays: this is the hottest function of dashboard queries)."""
    ts = np.asarray(rw.ts, dtype=np.int64)
    vals = np.asarray(rw.vals, dtype=np.float64)
    lo = np.asarray(rw.lo, dtype=np.int64)
    hi = np.asarray(rw.hi, dtype=np.int64)
    n = hi - lo
    present = n >= 2
    if not len(vals) or not present.any():
        return window_vector(rw, np.zeros(n.shape), np.zeros(n.shape, dtype=bool))
    top = len(vals) - 1
    first = np.minimum(lo, top)
    last = hi - 1
    np.clip(last, 0, top, out=last)
    with np.errstate(all="ignore"):
        v_first = vals[first]
        result = vals[last]
        result -= v_first
        if is_counter:
            # Counter resets inside the window: each drop adds the value before it (the counter
            # is assumed to have restarted from zero).
            prev, same = pairwise_prev(rw)
            is_reset = same & (vals < prev)
            if is_reset.any():
                has_reset = (window_count_of(is_reset, lo, hi) > 0) & present
                if has_reset.any():
                    # Only windows containing a reset: add the pre-reset values one at a time, in
                    # sample order like Prometheus (the order matters under cancellation).
                    sel = np.flatnonzero(has_reset.reshape(-1))
                    order, it = iterate_window_positions(lo.reshape(-1)[sel], n.reshape(-1)[sel])
                    acc = result.reshape(-1)[sel][order]
                    reset_add = np.where(is_reset, prev, 0.0)
                    for k, m, idx in it:
                        if k:
                            acc[:m] += reset_add[idx]
                    flat = result.reshape(-1)
                    flat[sel[order]] = acc
        t_first = ts[first]
        t_last = ts[last]
        range_end = np.asarray(rw.window_end, dtype=np.int64)[None, :]
        # durations in seconds
        sampled = (t_last - t_first).astype(np.float64)
        sampled /= 1000.0
        dur_start = (t_first - (range_end - rw.range_ms)).astype(np.float64)
        dur_start /= 1000.0
        dur_end = (range_end - t_last).astype(np.float64)
        dur_end /= 1000.0
        half = np.maximum(n - 1, 1).astype(np.float64)
        np.divide(sampled, half, out=half)  # average interval between samples
        threshold = half * 1.1
        half *= 0.5
        np.copyto(dur_start, half, where=dur_start >= threshold)
        if is_counter:
            # Counters cannot go below zero: stop the extrapolation at the zero point.
            dur_zero = v_first / result
            dur_zero *= sampled
            clamp = (result > 0) & (v_first >= 0) & (dur_zero < dur_start)
            np.copyto(dur_start, dur_zero, where=clamp)
        np.copyto(dur_end, half, where=dur_end >= threshold)
        dur_start += sampled
        dur_start += dur_end
        factor = dur_start
        np.divide(factor, sampled, out=factor, where=sampled != 0)
        factor[sampled == 0] = 1.0
        if is_rate:
            factor /= rw.range_ms / 1000.0
        result *= factor
    out = window_vector(rw, result, present)
    if is_counter:
        _possible_non_counter(ctx, out)
    return out


def _possible_non_counter(ctx: FunctionContext, out: VectorSteps) -> None:
    """Prometheus's info for rate()/increase() over a metric whose name does not look like a counter."""
    for lbls in out.labels:
        name = metric_name(lbls)
        if name and not name.endswith(_COUNTER_SUFFIXES):
            ctx.annotations.info(
                f'PromQL info: metric might not be a counter, name does not end in '
                f'_total/_sum/_count/_bucket: "{name}"{ctx.pos(0)}'
            )


@register("rate")
def rate(ctx: FunctionContext, args: list[Value]) -> Value:
    return _extrapolated(ctx, windows_arg(args[0]), True, True)


@register("increase")
def increase(ctx: FunctionContext, args: list[Value]) -> Value:
    return _extrapolated(ctx, windows_arg(args[0]), True, False)


@register("delta")
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


@register("irate")
def irate(ctx: FunctionContext, args: list[Value]) -> Value:
    return _instant(windows_arg(args[0]), True)


@register("idelta")
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
        e_cov = e_dy_err / 1000 + np.abs(sx / nf) * e_y_err + 4 * _EPS * (np.abs(sxy) + np.abs(sx * sy / nf))
        ok = fits & np.isfinite(slope) & (e_cov <= _REG_REL_ERR * np.abs(cov))
        if need_intercept:
            e_int = e_y_err / nf + np.abs(sx / nf) * np.abs(slope) * (e_cov / np.abs(cov)) + 4 * _EPS * np.abs(sy / nf)
            ok &= np.isfinite(intercept) & (e_int <= _REG_REL_ERR * np.abs(intercept))
        const = (e_chg[hi_c] - e_chg[np.minimum(lo_c + 1, hi_c)]) == 0
        y0 = vals[lo_g]
        fin0 = np.isfinite(y0)
        slope = np.where(const, 0.0, slope)
        intercept = np.where(const, y0, intercept)
        ok = np.where(const, fin0, ok)
    return slope, intercept, ok


def _linear_regression(rw: RangeWindows, intercept_ms: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least-squares slope and intercept per window (windows with at least two samples).

    intercept_ms: (T,) intercept time per step, or None for "the window's first sample".
    Most windows come from per-series prefix sums with an error bound (``_regression_prefix``);
    the others (cancellation, NaN/Inf, huge windows) use the exact replica of Prometheus's
    compensated-sum algorithm, so results agree with Prometheus even where its own rounding
    dominates. Returns (slope, intercept, present).
    """
    S, T = rw.lo.shape
    lo = np.asarray(rw.lo, dtype=np.int64)
    n = np.asarray(rw.hi, dtype=np.int64) - lo
    ts = np.asarray(rw.ts, dtype=np.int64)
    vals = np.asarray(rw.vals, dtype=np.float64)
    present = n >= 2
    slope = np.zeros(S * T)
    intercept = np.zeros(S * T)
    sel = np.flatnonzero(present.reshape(-1))
    if not sel.size:
        return slope.reshape(S, T), intercept.reshape(S, T), present
    lo_f = lo.reshape(-1)
    n_f = n.reshape(-1)
    steps = None if intercept_ms is None else np.asarray(intercept_ms, dtype=np.int64)
    # Fast path: prefix sums with a per-window error bound; the rest below.
    p_slope, p_icpt, p_ok = _regression_prefix(rw, steps, sel, need_intercept=steps is not None)
    slope[sel[p_ok]] = p_slope[p_ok]
    intercept[sel[p_ok]] = p_icpt[p_ok]
    sel = sel[~p_ok]
    if sel.size:
        # Windows the fast path cannot vouch for (ill-conditioned, non-finite, huge): the exact
        # replica of Prometheus's algorithm, so even its rounding is reproduced.
        t0 = ts[lo_f[sel]] if steps is None else steps[sel % T]
        slope[sel], intercept[sel] = _regression_kernel(rw, lo_f[sel], n_f[sel], t0)
    return slope.reshape(S, T), intercept.reshape(S, T), present


@register("deriv")
def deriv(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    slope, _, present = _linear_regression(rw, None)
    return window_vector(rw, slope, present)


@register("predict_linear")
def predict_linear(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    duration = scalar_arg(args[1], rw.num_steps)
    slope, intercept, present = _linear_regression(rw, np.asarray(ctx.step_times, dtype=np.int64))
    with np.errstate(all="ignore"):
        res = slope * duration[None, :] + intercept
    return window_vector(rw, res, present)


@register("resets")
def resets(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    prev, same = pairwise_prev(rw)
    with np.errstate(invalid="ignore"):
        flags = same & (np.asarray(rw.vals) < prev)
    n = rw.hi - rw.lo
    return window_vector(rw, window_count_of(flags, rw.lo, rw.hi), n >= 1)


@register("changes")
def changes(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    vals = np.asarray(rw.vals, dtype=np.float64)
    prev, same = pairwise_prev(rw)
    with np.errstate(invalid="ignore"):
        flags = same & (vals != prev) & ~(np.isnan(vals) & np.isnan(prev))
    n = rw.hi - rw.lo
    return window_vector(rw, window_count_of(flags, rw.lo, rw.hi), n >= 1)
