"""Native-histogram bucket geometry and the functions that read it: ``histogram_quantile``,
``histogram_fraction``, ``histogram_stddev``/``histogram_stdvar`` over native histograms (the
classic, float-bucket versions live in promql/functions/histogram.py) and Prometheus's
``FloatHistogram.String()`` form that ``count_values`` uses as a label value.

Hand-written after Prometheus's quantile.go semantics: no library computes quantiles of
Prometheus's exponential bucket layout. Per-histogram Python, histogram cells only.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from promql.eval_labels import merge_same_labels
from promql.functions.histogram import format_openmetrics_float
from promql.histogram_planes import strip
from promql.types import FloatHistogram, Scalar, StringValue, Value, VectorSteps
from storage.go_format import format_float_g, go_quote
from storage.labels import metric_name, set_label

_FRAC_CACHE: dict[tuple[int, int], float] = {}
_MAX_FLOAT = 1.7976931348623157e308


def _frac(schema: int, j: int) -> float:
    """2^(j / 2^schema) / 2, correctly rounded (Prometheus uses a precomputed table of these;
    a few of its entries differ from the correctly rounded value in the last bit)."""
    key = (schema, j)
    v = _FRAC_CACHE.get(key)
    if v is None:
        from decimal import Decimal, localcontext

        with localcontext() as c:
            c.prec = 40
            v = float((Decimal(2) ** (Decimal(j) / Decimal(2 ** schema))) / 2)
        _FRAC_CACHE[key] = v
    return v


def _ldexp(frac: float, exp: int) -> float:
    try:
        return math.ldexp(frac, exp)
    except OverflowError:
        return math.inf


def exp_bound(idx: int, schema: int) -> float:
    """Upper bound of exponential bucket ``idx`` (the last finite bucket ends at MaxFloat64)."""
    if schema < 0:
        e = idx << -schema
        return _MAX_FLOAT if e == 1024 else _ldexp(1.0, e)
    frac = _frac(schema, idx & ((1 << schema) - 1))
    e = (idx >> schema) + 1
    return _MAX_FLOAT if (frac == 0.5 and e == 1025) else _ldexp(frac, e)


def all_buckets(h: FloatHistogram) -> list[tuple[float, float, float]]:
    """(lower, upper, count) from the most negative bucket up (Prometheus's AllBucketIterator)."""
    if h.uses_custom_buckets:
        cv = h.custom_values
        out = []
        for i, c in h.positive:
            lo = -math.inf if i - 1 < 0 else (cv[i - 1] if i - 1 < len(cv) else math.inf)
            hi = math.inf if i >= len(cv) else cv[i]
            out.append((lo, hi, c))
        return out
    zt = h.zero_threshold
    out = []
    for i, c in reversed(h.negative):
        if exp_bound(i, h.schema) <= zt:
            continue
        lo, hi = -exp_bound(i, h.schema), -exp_bound(i - 1, h.schema)
        if -zt < hi < 0:
            hi = -zt
        out.append((lo, hi, c))
    if h.zero_count > 0:
        out.append((-zt, zt, h.zero_count))
    for i, c in h.positive:
        if exp_bound(i, h.schema) <= zt:
            continue
        lo, hi = exp_bound(i - 1, h.schema), exp_bound(i, h.schema)
        if 0 < lo < zt:
            lo = zt
        out.append((lo, hi, c))
    return out


def _with_name(msg: str, name: str) -> str:
    return f"{msg} for metric name {go_quote(name)}" if name else msg


def native_quantile(q: float, h: FloatHistogram, name: str, pos: str, ann: Any) -> float:
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if h.count == 0 or math.isnan(q):
        return math.nan
    buckets = all_buckets(h)
    forward = math.isnan(h.sum) or q < 0.5
    seq = buckets if forward else buckets[::-1]
    rank = q * h.count if forward else (1 - q) * h.count
    count = 0.0
    pos_i = -1
    lo = hi = bc = 0.0
    for pos_i, (lo, hi, bc) in enumerate(seq):
        if bc == 0:
            continue
        count += bc
        if count >= rank:
            break
    if not h.uses_custom_buckets and lo < 0 < hi:
        if not h.negative and h.positive:
            lo = 0.0
        elif not h.positive and h.negative:
            hi = 0.0
    elif h.uses_custom_buckets:
        if lo == -math.inf:
            if hi <= 0:
                return hi
            lo = 0.0
        elif hi == math.inf:
            return lo
    count = min(count, h.count)
    if count < rank:
        if math.isnan(h.sum):
            ann.info(_with_name("PromQL info: input to histogram_quantile has NaN observations, result is NaN", name) + pos)
            return math.nan
        return hi
    if forward:
        rank -= count - bc
    else:
        rank = count - rank
    if math.isnan(h.sum):
        total = count + sum(c for _, _, c in seq[pos_i + 1:])
        if total < h.count:
            ann.info(_with_name("PromQL info: input to histogram_quantile has NaN observations, result is skewed higher", name) + pos)
    fraction = rank / bc
    if h.uses_custom_buckets or (lo <= 0 <= hi):
        return lo + (hi - lo) * fraction
    log_lo, log_hi = math.log2(abs(lo)), math.log2(abs(hi))
    if lo > 0:
        return math.pow(2.0, log_lo + (log_hi - log_lo) * fraction)
    return -math.pow(2.0, log_hi + (log_lo - log_hi) * (1 - fraction))


def _fraction_below(lo: float, hi: float, v: float, linear: bool) -> float:
    if linear:
        return (v - lo) / (hi - lo)
    log_lo, log_hi, log_v = math.log2(abs(lo)), math.log2(abs(hi)), math.log2(abs(v))
    if v > 0:
        return (log_v - log_lo) / (log_hi - log_lo)
    return 1 - ((log_v - log_hi) / (log_lo - log_hi))


def native_fraction(lower: float, upper: float, h: FloatHistogram, name: str, pos: str, ann: Any) -> float:
    if h.count == 0 or math.isnan(lower) or math.isnan(upper):
        return math.nan
    if lower >= upper:
        return 0.0
    buckets = all_buckets(h)
    count = rank = lower_rank = upper_rank = 0.0
    lower_set = upper_set = False
    k = -1
    for k, (lo, hi, bc) in enumerate(buckets):
        count += bc
        zero = False
        if lo <= 0 <= hi:
            zero = True
            if not h.negative and h.positive:
                lo = 0.0
            elif not h.positive and h.negative:
                hi = 0.0
        linear = h.uses_custom_buckets or zero

        def interp(v: float) -> float:
            if linear and lo == -math.inf:
                return bc
            return rank + bc * _fraction_below(lo, hi, v, linear)

        if not lower_set and lo >= lower:
            lower_rank, lower_set = rank, True
        if not upper_set and lo >= upper:
            upper_rank, upper_set = rank, True
        if lower_set and upper_set:
            break
        if not lower_set and lo < lower < hi:
            lower_rank, lower_set = interp(lower), True
        if not upper_set and lo < upper < hi:
            upper_rank, upper_set = interp(upper), True
        if lower_set and upper_set:
            break
        rank += bc
    if math.isnan(h.sum):
        count += sum(c for _, _, c in buckets[k + 1:])
        if count < h.count:
            ann.info(_with_name("PromQL info: input to histogram_fraction has NaN observations, which are excluded from all fractions", name) + pos)
    else:
        count = h.count
    if not lower_set or lower_rank > count:
        lower_rank = count
    if not upper_set or upper_rank > count:
        upper_rank = count
    return (upper_rank - lower_rank) / h.count


def _surviving_midpoint(lo: float, hi: float, positive: bool, linear: bool) -> float:
    """Where the kept part ``[lo, hi]`` of a bucket is taken to sit when the sum is rebuilt after
    a trim: the arithmetic mean for linear buckets, the geometric mean for exponential ones; an
    infinite bound falls back to the finite one (half of it for a positive upper bound)."""
    if math.isinf(lo):
        if math.isinf(hi):
            return 0.0
        return hi / 2 if hi > 0 else hi
    if math.isinf(hi):
        return lo
    if linear:
        return (lo + hi) / 2
    g = math.sqrt(abs(lo * hi))
    return g if positive else -g


def _trim_infinite_bucket(lo: float, hi: float, count: float, rhs: float, upper: bool) -> tuple[float, float]:
    """(kept count, midpoint) of a custom bucket with an infinite bound: what is kept of it is
    unknowable, so it is kept whole or dropped whole, except that a finite positive upper bound
    lets the (-Inf, u] bucket be read as (0, u] and interpolated linearly."""
    fin = (lambda x: 0.0 if math.isinf(x) else x)
    if math.isinf(lo) and lo < 0:
        if upper:
            if rhs >= hi:
                return count, 0.0
            if rhs > 0 and hi > 0 and not math.isinf(hi):
                return count * rhs / hi, rhs / 2
            if hi <= 0:
                return count, rhs
            return 0.0, fin(hi)
        if rhs <= lo:
            return count, 0.0
        if rhs >= 0 and hi > rhs and not math.isinf(hi):
            return count * (1 - rhs / hi), (rhs + hi) / 2
        return 0.0, fin(hi)
    # (l, +Inf]
    if upper:
        return 0.0, fin(lo)
    if rhs >= lo:
        return count, rhs
    return 0.0, fin(lo)


def _trim_zero_bucket(h: FloatHistogram, rhs: float, has_neg: bool, has_pos: bool, upper: bool) -> tuple[float, float]:
    """(kept count, midpoint) of the zero bucket, interpolated linearly; the bucket is taken as
    [0, zt] (or [-zt, 0]) when only positive (only negative) buckets are populated."""
    lo, hi = -h.zero_threshold, h.zero_threshold
    if has_neg and not has_pos:
        hi = 0.0
    if has_pos and not has_neg:
        lo = 0.0
    if upper:
        if rhs <= lo:
            return 0.0, 0.0
        if rhs >= hi:
            return h.zero_count, (lo + hi) / 2
        return h.zero_count * (rhs - lo) / (hi - lo), (lo + rhs) / 2
    if rhs <= lo:
        return h.zero_count, (lo + hi) / 2
    if rhs >= hi:
        return 0.0, 0.0
    return h.zero_count * (hi - rhs) / (hi - lo), (rhs + hi) / 2


def trim_histogram(h: FloatHistogram, rhs: float, upper: bool) -> FloatHistogram:
    """``h </ rhs`` (``upper``: keep the observations below ``rhs``) or ``h >/ rhs`` (keep those
    above), Prometheus 3's TRIM_UPPER / TRIM_LOWER. A bucket cut by ``rhs`` keeps the share on
    the kept side, interpolated linearly in custom buckets and the zero bucket and on a log scale
    in exponential buckets. When anything was cut, count is the kept counts' total and sum is
    rebuilt from each kept part's midpoint times its count (in Prometheus's order: positive
    buckets, negative buckets, zero bucket); otherwise the histogram is returned unchanged."""
    custom = h.uses_custom_buckets
    cv = h.custom_values
    new_count = new_sum = 0.0
    trimmed = False
    seen = {True: False, False: False}
    out: dict[bool, list[tuple[int, float]]] = {True: [], False: []}
    for positive, buckets in ((True, h.positive), (False, h.negative)):
        for idx, c in buckets:  # per bucket of one histogram
            if c == 0:
                out[positive].append((idx, c))
                continue
            seen[positive] = True
            if custom:
                lo = -math.inf if idx == 0 else (cv[idx - 1] if idx - 1 < len(cv) else math.inf)
                hi = math.inf if idx >= len(cv) else cv[idx]
            elif positive:
                lo, hi = exp_bound(idx - 1, h.schema), exp_bound(idx, h.schema)
            else:
                lo, hi = -exp_bound(idx, h.schema), -exp_bound(idx - 1, h.schema)
            whole = hi <= rhs if upper else lo >= rhs
            cut = lo < rhs if upper else hi > rhs
            if whole:
                keep, mid = c, _surviving_midpoint(lo, hi, positive, custom)
            elif cut:
                if math.isinf(lo) or math.isinf(hi):
                    keep, mid = _trim_infinite_bucket(lo, hi, c, rhs, upper)
                else:
                    below = c * _fraction_below(lo, hi, rhs, custom)
                    if upper:
                        keep, mid = below, _surviving_midpoint(lo, rhs, positive, custom)
                    else:
                        keep, mid = c - below, _surviving_midpoint(rhs, hi, positive, custom)
                trimmed = trimmed or keep != c
            else:
                keep, mid = 0.0, 0.0
                trimmed = True
            if keep or whole or cut:
                new_count += keep
                new_sum += mid * keep
            out[positive].append((idx, keep))
    zero_count = h.zero_count
    if zero_count > 0:
        keep, mid = _trim_zero_bucket(h, rhs, seen[False], seen[True], upper)
        trimmed = trimmed or keep != zero_count
        zero_count = keep
        new_sum += mid * keep
        new_count += keep
    if not trimmed:
        return h
    return FloatHistogram(h.schema, new_count, new_sum, h.zero_threshold, zero_count, tuple(out[True]), tuple(out[False]),
                          h.custom_values, h.counter_reset_hint).compact()


def native_variance(h: FloatHistogram) -> float:
    """Variance of the observations, each bucket at its (geometric, for exponential buckets) mean."""
    mean = h.sum / h.count if h.count else math.nan
    s = c = 0.0
    for lo, hi, bc in all_buckets(h):
        if bc == 0:
            continue
        if h.uses_custom_buckets:
            val = (hi + lo) / 2.0
        elif lo <= 0 <= hi:
            val = 0.0
        else:
            val = math.sqrt(hi * lo)
            if hi < 0:
                val = -val
        d = val - mean
        x = bc * d * d
        t = s + x  # Kahan-Neumaier increment, as Prometheus (compensation reset at infinity)
        if math.isinf(t):
            c = 0.0
        elif abs(s) >= abs(x):
            c += (s - t) + x
        else:
            c += (x - t) + s
        s = t
    return (s + c) / h.count if h.count else math.nan


def _drop_classic_native_conflicts(classic: VectorSteps, native: VectorSteps, ann: Any, pos: str) -> None:
    """A classic bucket set and a native histogram of the same series at the same step: neither
    is used, with Prometheus's warning (in place)."""
    rows = {l: i for i, l in enumerate(native.labels)}
    for i, l in enumerate(classic.labels):
        j = rows.get(l)
        if j is None:
            continue
        both = classic.present[i] & native.present[j]
        if both.any():
            ann.warn(_with_name("PromQL warning: vector contains a mix of classic and native histograms", metric_name(l)) + pos)
            classic.present[i] &= ~both
            native.present[j] &= ~both


def native_histogram_function(name: str, call: Callable[[list[Value]], Value], args: list[Value], fctx: Any) -> Value:
    """The classic part through the float implementation, the native part here; merged."""

    vi = {"histogram_quantile": 1, "histogram_fraction": 2}.get(name, 0)
    vec = args[vi]
    assert isinstance(vec, VectorSteps)
    floats = call([strip(a) for a in args])
    hm = vec.hist_mask()
    assert hm is not None and vec.hist is not None
    t = vec.num_steps
    ann = fctx.annotations
    pos = fctx.pos(vi)
    params = [np.asarray(a.values, dtype=np.float64) if isinstance(a, Scalar) else None for a in args]
    if name == "histogram_quantile":
        for q in params[0][hm.any(axis=0)]:  # type: ignore[index]
            if math.isnan(q) or q < 0 or q > 1:
                ann.warn(f"PromQL warning: quantile value should be between 0 and 1, got {format_float_g(float(q))}{fctx.pos(0)}")
    rows_idx = np.flatnonzero(hm.any(axis=1))
    values = np.zeros((len(rows_idx), t))
    present = hm[rows_idx]
    for k, r in enumerate(rows_idx.tolist()):  # histogram cells only
        mname = metric_name(vec.labels[r])
        for c in np.flatnonzero(hm[r]).tolist():
            h = vec.hist[r, c]
            if name == "histogram_quantile":
                v = native_quantile(float(params[0][c]), h, mname, pos, ann)  # type: ignore[index]
            elif name == "histogram_fraction":
                v = native_fraction(float(params[0][c]), float(params[1][c]), h, mname, pos, ann)  # type: ignore[index]
            else:
                v = native_variance(h)
                v = math.sqrt(v) if name == "histogram_stddev" and not math.isnan(v) else v
            values[k, c] = v
    native = VectorSteps([vec.labels[r] for r in rows_idx.tolist()], values, present, np.ones(len(rows_idx), dtype=bool))
    if not isinstance(floats, VectorSteps) or floats.num_series == 0:
        return native

    assert isinstance(floats, VectorSteps)
    fs = VectorSteps(floats.labels, floats.values, floats.present.copy(), floats.drop_name)
    _drop_classic_native_conflicts(fs, native, ann, pos)
    return merge_same_labels(VectorSteps(list(fs.labels) + list(native.labels), np.concatenate([fs.values, native.values]),
                                         np.concatenate([fs.present, native.present]),
                                         np.concatenate([fs.drop_name_mask(), native.drop_name_mask()])))


def histogram_string(h: FloatHistogram) -> str:
    """Prometheus's FloatHistogram.String(): count, sum, then the non-empty buckets from the most
    negative up, e.g. ``{count:20, sum:10, [-2,-1):2, [-0.001,0.001]:2, (0.5,1]:1}`` (Go %g
    numbers). count_values uses it as the label value of a histogram sample."""
    g = format_float_g
    parts = [f"{{count:{g(h.count)}, sum:{g(h.sum)}"]
    if h.uses_custom_buckets:
        for (i, _), (lo, hi, c) in zip(h.positive, all_buckets(h)):
            if c != 0:
                parts.append(f"{'[' if i == 0 else '('}{g(lo)},{g(hi)}]:{g(c)}")
    else:
        for i, c in reversed(h.negative):
            if c != 0:
                parts.append(f"[{g(-exp_bound(i, h.schema))},{g(-exp_bound(i - 1, h.schema))}):{g(c)}")
        if h.zero_count != 0:
            parts.append(f"[{g(-h.zero_threshold)},{g(h.zero_threshold)}]:{g(h.zero_count)}")
        for i, c in h.positive:
            if c != 0:
                parts.append(f"({g(exp_bound(i - 1, h.schema))},{g(exp_bound(i, h.schema))}]:{g(c)}")
    return ", ".join(parts) + "}"


def native_histogram_quantiles(call: Callable[[list[Value]], Value], args: list[Value], fctx: Any) -> Value:
    """histogram_quantiles(v, "label", q...) where ``v`` holds native histograms: one output
    series per (histogram series, quantile), the quantile in ``label`` (OpenMetrics float form,
    as the classic path in promql/functions/histogram.py writes it)."""

    vec, lab = args[0], args[1]
    assert isinstance(vec, VectorSteps) and isinstance(lab, StringValue) and vec.hist is not None
    floats = call([strip(a) for a in args])  # classic buckets (and the quantile warnings)
    hm = np.not_equal(vec.hist, None)
    t = vec.num_steps
    ann, pos = fctx.annotations, fctx.pos(0)
    labels, rows, pres = [], [], []
    for a in args[2:]:
        qs = np.asarray(a.values, dtype=np.float64) if isinstance(a, Scalar) else np.full(t, math.nan)
        used = qs[hm.any(axis=0)]
        uniq = np.unique(used[~np.isnan(used)]).tolist() + ([math.nan] if np.isnan(used).any() else [])
        for qv in uniq:
            at = np.isnan(qs) if math.isnan(qv) else (qs == qv)
            qstr = format_openmetrics_float(float(qv))
            for r in np.flatnonzero((hm & at[None, :]).any(axis=1)).tolist():  # histogram series only
                p = hm[r] & at
                vals = np.zeros(t)
                for c in np.flatnonzero(p).tolist():
                    vals[c] = native_quantile(qv, vec.hist[r, c], metric_name(vec.labels[r]), pos, ann)
                labels.append(set_label(vec.labels[r], lab.value, qstr))
                rows.append(vals)
                pres.append(p)
    fs = floats if isinstance(floats, VectorSteps) else VectorSteps.empty(t)
    fs = VectorSteps(fs.labels, fs.values, fs.present.copy(), fs.drop_name)
    if not labels:
        return fs
    native = VectorSteps(labels, np.array(rows), np.array(pres, dtype=bool), np.ones(len(labels), dtype=bool))
    _drop_classic_native_conflicts(fs, native, ann, pos)
    return merge_same_labels(VectorSteps(list(fs.labels) + labels, np.concatenate([fs.values, native.values]),
                                         np.concatenate([fs.present, native.present]),
                                         np.concatenate([fs.drop_name_mask(), native.drop_name_mask()])))
