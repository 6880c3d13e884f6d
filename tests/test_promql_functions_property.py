"""Property tests: the vectorized window functions against straightforward per-window Python
written from Prometheus's documented algorithms, on random series, windows and special values."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from promql.functions import FunctionContext, load_all
from promql.types import Annotations, RangeWindows, Scalar
from storage.labels import make_labels

F = load_all()

values = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.integers(min_value=-50, max_value=50).map(float),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 0.0]),
)


@st.composite
def window_sets(draw):
    S = draw(st.integers(1, 3))
    series = []
    for s in range(S):
        n = draw(st.integers(0, 12))
        gaps = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
        ts = np.cumsum(np.array(gaps, dtype=np.int64)) * 10_000
        vals = draw(st.lists(values, min_size=n, max_size=n))
        series.append((ts, np.array(vals, dtype=float)))
    T = draw(st.integers(1, 5))
    steps = np.sort(np.array(draw(st.lists(st.integers(0, 160), min_size=T, max_size=T)), dtype=np.int64)) * 1000
    rng = draw(st.integers(1, 8)) * 10_000
    return series, steps, rng


def build(series, steps, rng, name: str = "x_total") -> RangeWindows:
    """RangeWindows over ``series`` ([(ts, values)]) with Prometheus's left-open windows at ``steps``."""
    offs = np.concatenate(([0], np.cumsum([len(t) for t, _ in series]))).astype(np.int64)
    ts = np.concatenate([t for t, _ in series]) if offs[-1] else np.zeros(0, np.int64)
    vals = np.concatenate([v for _, v in series]) if offs[-1] else np.zeros(0)
    S, T = len(series), len(steps)
    lo = np.zeros((S, T), np.int64)
    hi = np.zeros((S, T), np.int64)
    for s, (t, _) in enumerate(series):
        lo[s] = offs[s] + np.searchsorted(t, steps - rng, side="right")
        hi[s] = offs[s] + np.searchsorted(t, steps, side="right")
    labels = [make_labels({"__name__": name, "i": str(s)}) for s in range(S)]
    return RangeWindows(labels, offs, ts.astype(np.int64), np.asarray(vals, np.float64), lo, hi, np.asarray(steps, np.int64), rng)


def run(name, rw, *extra):
    ctx = FunctionContext(rw.window_end, Annotations(), None)
    out = F[name](ctx, [*extra, rw])
    got = {}
    for i, lb in enumerate(out.labels):
        for t in range(out.num_steps):
            if out.present[i, t]:
                got[(lb, t)] = float(out.values[i, t])
    return got


def reference(rw, fn):
    want = {}
    for s, lb in enumerate(rw.labels):
        for t in range(rw.num_steps):
            a, b = rw.lo[s, t], rw.hi[s, t]
            r = fn(rw.ts[a:b], rw.vals[a:b], int(rw.window_end[t]), rw.range_ms)
            if r is not None:
                want[(lb, t)] = r
    return want


def close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if a == b:
        return True
    return abs(a - b) <= 1e-9 * (abs(a) + abs(b))


def check(name, rw, fn, *extra):
    got, want = run(name, rw, *extra), reference(rw, fn)
    assert got.keys() == want.keys(), name
    for k in want:
        assert close(got[k], want[k]), (name, k, got[k], want[k])


def ref_rate(counter: bool, per_second: bool):
    def fn(ts, v, end, rng):
        if len(v) < 2:
            return None
        res = v[-1] - v[0]
        if counter:
            for i in range(1, len(v)):
                if v[i] < v[i - 1]:
                    res += v[i - 1]
        start = end - rng
        d_start = (ts[0] - start) / 1000
        d_end = (end - ts[-1]) / 1000
        sampled = (ts[-1] - ts[0]) / 1000
        avg = sampled / (len(v) - 1)
        if d_start >= avg * 1.1:
            d_start = avg / 2
        if counter and res > 0 and v[0] >= 0:
            d_zero = sampled * (v[0] / res)
            if d_zero < d_start:
                d_start = d_zero
        if d_end >= avg * 1.1:
            d_end = avg / 2
        factor = (sampled + d_start + d_end) / sampled
        if per_second:
            factor /= rng / 1000
        return res * factor

    return fn


def ref_minmax(better):
    def fn(ts, v, end, rng):
        if len(v) == 0:
            return None
        best = v[0]
        for x in v:
            if better(x, best) or math.isnan(best):
                best = x
        return float(best)

    return fn


def ref_quantile(q):
    def fn(ts, v, end, rng):
        if len(v) == 0:
            return None
        nan = [x for x in v if math.isnan(x)]
        vals = nan + sorted(x for x in v if not math.isnan(x))
        rank = q * (len(vals) - 1)
        lo_i = max(0, math.floor(rank))
        hi_i = min(len(vals) - 1, lo_i + 1)
        w = rank - math.floor(rank)
        return vals[lo_i] * (1 - w) + vals[hi_i] * w

    return fn


def ref_changes(ts, v, end, rng):
    if len(v) == 0:
        return None
    return float(sum(1 for i in range(1, len(v)) if v[i] != v[i - 1] and not (math.isnan(v[i]) and math.isnan(v[i - 1]))))


def ref_resets(ts, v, end, rng):
    if len(v) == 0:
        return None
    return float(sum(1 for i in range(1, len(v)) if v[i] < v[i - 1]))


def ref_irate(ts, v, end, rng):
    if len(v) < 2:
        return None
    d = v[-1] - v[-2] if not v[-1] < v[-2] else v[-1]
    return d / ((ts[-1] - ts[-2]) / 1000)


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(window_sets())
def test_rate_family_matches_reference(ws):
    rw = build(*ws)
    with np.errstate(all="ignore"):
        check("rate", rw, ref_rate(True, True))
        check("increase", rw, ref_rate(True, False))
        check("delta", rw, ref_rate(False, False))
        check("irate", rw, ref_irate)
        check("changes", rw, ref_changes)
        check("resets", rw, ref_resets)


@SETTINGS
@given(window_sets(), st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0]))
def test_over_time_family_matches_reference(ws, q):
    rw = build(*ws)
    with np.errstate(all="ignore"):
        check("max_over_time", rw, ref_minmax(lambda a, b: a > b))
        check("min_over_time", rw, ref_minmax(lambda a, b: a < b))
        check("count_over_time", rw, lambda ts, v, e, r: float(len(v)) if len(v) else None)
        check("last_over_time", rw, lambda ts, v, e, r: float(v[-1]) if len(v) else None)
        check("quantile_over_time", rw, ref_quantile(q), Scalar(np.full(rw.num_steps, q)))
        check("sum_over_time", rw, ref_sum)


def ref_sum(ts, v, end, rng):
    if len(v) == 0:
        return None
    if not np.isfinite(v).all():
        return float(np.sum(v))  # +-Inf/NaN propagate the same way in every summation order
    return math.fsum(v)  # the exactly rounded sum: what compensated summation achieves here


# --- ports of Prometheus's sequential algorithms (compensated sums), one window at a time ---------

def kahan_inc(inc: float, s: float, c: float) -> tuple[float, float]:
    t = s + inc
    if math.isinf(t):
        c = 0.0
    elif abs(s) >= abs(inc):
        c += (s - t) + inc
    else:
        c += (inc - t) + s
    return t, c


def ref_avg(ts, v, end, rng):
    if len(v) == 0:
        return None
    s, c, mean, incr = float(v[0]), 0.0, 0.0, False
    for i, f in enumerate(v[1:]):
        count = i + 2.0
        if not incr:
            ns, nc = kahan_inc(float(f), s, c)
            if not math.isinf(ns):
                s, c = ns, nc
                continue
            incr = True
            mean = s / (count - 1)
            c /= count - 1
        q = (count - 1) / count
        mean, c = kahan_inc(float(f) / count, q * mean, q * c)
    return mean + c if incr else s / len(v) + c / len(v)


def ref_stdvar(ts, v, end, rng):
    if len(v) == 0:
        return None
    count = mean = cm = aux = ca = 0.0
    for f in v:
        f = float(f)
        count += 1
        d = f - (mean + cm)
        mean, cm = kahan_inc(d / count, mean, cm)
        aux, ca = kahan_inc(d * (f - (mean + cm)), aux, ca)
    return (aux + ca) / count


def linreg(ts, v, t0):
    n = sx = cx = sy = cy = sxy = cxy = sx2 = cx2 = 0.0
    const = True
    for i, (t, y) in enumerate(zip(ts, v)):
        y = float(y)
        if i > 0 and y != float(v[0]):
            const = False
        n += 1
        x = (int(t) - t0) / 1e3
        sx, cx = kahan_inc(x, sx, cx)
        sy, cy = kahan_inc(y, sy, cy)
        sxy, cxy = kahan_inc(x * y, sxy, cxy)
        sx2, cx2 = kahan_inc(x * x, sx2, cx2)
    if const:
        return (math.nan, math.nan) if math.isinf(float(v[0])) else (0.0, float(v[0]))
    sx, sy, sxy, sx2 = sx + cx, sy + cy, sxy + cxy, sx2 + cx2
    cov = sxy - sx * sy / n
    var = sx2 - sx * sx / n
    slope = cov / var if var != 0 else (math.copysign(math.inf, cov) if cov != 0 and not math.isnan(cov) else math.nan)
    return slope, sy / n - slope * sx / n


def ref_deriv(ts, v, end, rng):
    return None if len(v) < 2 else linreg(ts, v, int(ts[0]))[0]


def ref_predict(ts, v, end, rng):
    if len(v) < 2:
        return None
    slope, icpt = linreg(ts, v, end)
    return slope * 600 + icpt


def ref_idelta(ts, v, end, rng):
    return None if len(v) < 2 else float(v[-1] - v[-2])


def close_loose(a: float, b: float) -> bool:
    """Agreement for results that cancel: relative 1e-9, or tiny next to the inputs' scale."""
    if close(a, b):
        return True
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def check_loose(name, rw, fn, *extra):
    got, want = run(name, rw, *extra), reference(rw, fn)
    assert got.keys() == want.keys(), name
    for k in want:
        assert close(got[k], want[k]) or (np.isfinite(want[k]) and close_loose(got[k], want[k])), (name, k, got[k], want[k])


@SETTINGS
@given(window_sets())
def test_compensated_functions_match_prometheus_ports(ws):
    rw = build(*ws)
    with np.errstate(all="ignore"):
        check("avg_over_time", rw, ref_avg)
        check_loose("stdvar_over_time", rw, ref_stdvar)
        check("idelta", rw, ref_idelta)
        check_loose("deriv", rw, ref_deriv)
        ctx = FunctionContext(rw.window_end, Annotations(), None)
        out = F["predict_linear"](ctx, [rw, Scalar(np.full(rw.num_steps, 600.0))])
        want = reference(rw, ref_predict)
        got = {(lb, t): float(out.values[i, t]) for i, lb in enumerate(out.labels)
               for t in range(out.num_steps) if out.present[i, t]}
        assert got.keys() == want.keys()
        for k in want:
            assert close(got[k], want[k]) or (np.isfinite(want[k]) and close_loose(got[k], want[k])), (k, got[k], want[k])


def ref_ts_of(better):
    def fn(ts, v, end, rng):
        if len(v) == 0:
            return None
        best, at = float(v[0]), int(ts[0])
        for t, x in zip(ts, v):
            if better(float(x), best) or math.isnan(best):
                best, at = float(x), int(t)
        return at / 1000

    return fn


def ref_mad(ts, v, end, rng):
    if len(v) == 0:
        return None
    if any(math.isnan(x) for x in v):
        return math.nan
    med = ref_quantile(0.5)(ts, v, end, rng)
    return ref_quantile(0.5)(ts, [abs(x - med) for x in v], end, rng)


@SETTINGS
@given(window_sets())
def test_selection_functions_match_reference(ws):
    rw = build(*ws)
    with np.errstate(all="ignore"):
        check("ts_of_max_over_time", rw, ref_ts_of(lambda a, b: a >= b))
        check("ts_of_min_over_time", rw, ref_ts_of(lambda a, b: a <= b))
        check("ts_of_first_over_time", rw, lambda ts, v, e, r: int(ts[0]) / 1000 if len(v) else None)
        check("first_over_time", rw, lambda ts, v, e, r: float(v[0]) if len(v) else None)
        check("present_over_time", rw, lambda ts, v, e, r: 1.0 if len(v) else None)
        check("mad_over_time", rw, ref_mad)


# --- classic histograms ----------------------------------------------------------------------

def almost_equal(a: float, b: float, eps: float) -> bool:
    if math.isnan(a) and math.isnan(b):
        return True
    if a == b:
        return True
    abs_sum = abs(a) + abs(b)
    diff = abs(a - b)
    if a == 0 or b == 0 or abs_sum < 2.2250738585072014e-308:
        return diff < eps * 2.2250738585072014e-308
    return diff / min(abs_sum, 1.7976931348623157e308) < eps


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    return bucket_quantile_fixed(q, buckets)[0]


def bucket_quantile_fixed(q: float, buckets: list[tuple[float, float]]) -> tuple[float, bool]:
    """Port of Prometheus's BucketQuantile (with coalescing and the monotonicity fix): the quantile
    and whether the fix raised a falling bucket (the info annotation's condition)."""
    if math.isnan(q):
        return math.nan, False
    if q < 0:
        return -math.inf, False
    if q > 1:
        return math.inf, False
    buckets = sorted(buckets, key=lambda b: b[0])
    if not buckets or not math.isinf(buckets[-1][0]) or buckets[-1][0] < 0:
        return math.nan, False
    co: list[list[float]] = []
    for ub, c in buckets:
        if co and co[-1][0] == ub:
            co[-1][1] += c
        else:
            co.append([ub, c])
    prev = co[0][1]
    forced = False
    for i in range(1, len(co)):
        cur = co[i][1]
        if cur == prev:
            continue
        if almost_equal(prev, cur, 1e-12):
            co[i][1] = prev
            continue
        if cur < prev:
            co[i][1] = prev
            forced = True
            continue
        prev = cur
    if len(co) < 2:
        return math.nan, forced
    obs = co[-1][1]
    if obs == 0:
        return math.nan, forced
    rank = q * obs
    b = len(co) - 1
    for i in range(len(co) - 1):
        if co[i][1] >= rank:
            b = i
            break
    if b == len(co) - 1:
        return co[-2][0], forced
    if b == 0 and co[0][0] <= 0:
        return co[0][0], forced
    start, end, count = 0.0, co[b][0], co[b][1]
    if b > 0:
        start = co[b - 1][0]
        count -= co[b - 1][1]
        rank -= co[b - 1][1]
    with np.errstate(all="ignore"):  # Go's float division: x/0 is ±Inf or NaN
        frac = float(np.float64(rank) / np.float64(count))
    return start + (end - start) * frac, forced


LES = ["-1", "0", "0.5", "1", "1.0", "2", "10", "+Inf"]


@st.composite
def histograms(draw):
    T = draw(st.integers(1, 4))
    groups = draw(st.integers(1, 3))
    rows, labels, pres = [], [], []
    for g in range(groups):
        les = draw(st.lists(st.sampled_from(LES), min_size=1, max_size=6, unique=True))
        for le in les:
            labels.append(make_labels({"__name__": "h_bucket", "g": str(g), "le": le}))
            rows.append(draw(st.lists(st.one_of(st.integers(0, 20).map(float), st.just(float("nan"))), min_size=T, max_size=T)))
            pres.append(draw(st.lists(st.booleans(), min_size=T, max_size=T)))
    qs = draw(st.lists(st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0, -0.5, 1.5, float("nan")]), min_size=T, max_size=T))
    return labels, np.array(rows), np.array(pres, dtype=bool), np.array(qs)


@SETTINGS
@given(histograms())
def test_histogram_quantile_matches_port(h):
    from promql.types import VectorSteps

    labels, vals, pres, qs = h
    T = len(qs)
    vec = VectorSteps(labels, vals, pres)
    ctx = FunctionContext(np.arange(T, dtype=np.int64) * 60_000, Annotations(), None)
    with np.errstate(all="ignore"):
        out = F["histogram_quantile"](ctx, [Scalar(qs), vec])
    got = {(lb, t): float(out.values[i, t]) for i, lb in enumerate(out.labels) for t in range(T) if out.present[i, t]}
    want = {}
    groups: dict = {}
    for i, lb in enumerate(labels):
        key = tuple(p for p in lb if p[0] != "le")
        groups.setdefault(key, []).append(i)
    for key, idx in groups.items():
        for t in range(T):
            b = [(float(dict(labels[i])["le"]), float(vals[i, t])) for i in idx if pres[i, t]]
            if b:
                want[(key, t)] = bucket_quantile(float(qs[t]), b)
    assert got.keys() == want.keys()
    for k in want:
        assert close(got[k], want[k]), (k, got[k], want[k])


def bucket_fraction(lower: float, upper: float, buckets: list[tuple[float, float]]) -> float:
    """Port of Prometheus's BucketFraction (classic buckets; no monotonicity fix)."""
    buckets = sorted(buckets, key=lambda b: b[0])
    if not math.isinf(buckets[-1][0]):
        return math.nan
    co: list[list[float]] = []
    for ub, c in buckets:
        if co and co[-1][0] == ub:
            co[-1][1] += c
        else:
            co.append([ub, c])
    count = co[-1][1]
    if count == 0 or math.isnan(lower) or math.isnan(upper):
        return math.nan
    if lower >= upper:
        return 0.0
    rank = lower_rank = upper_rank = 0.0
    lower_set = upper_set = False
    lower_bound = 0.0 if co[0][0] > 0 else -math.inf
    for i, (ub, c) in enumerate(co):
        if i > 0:
            lower_bound = co[i - 1][0]

        def interp(v: float) -> float:
            if lower_bound == -math.inf:
                return c
            return rank + (c - rank) * (v - lower_bound) / (ub - lower_bound)

        if not lower_set and lower_bound >= lower:
            lower_rank, lower_set = rank, True
        if not upper_set and lower_bound >= upper:
            upper_rank, upper_set = rank, True
        if lower_set and upper_set:
            break
        if not lower_set and lower_bound < lower < ub:
            lower_rank, lower_set = interp(lower), True
        if not upper_set and lower_bound < upper < ub:
            upper_rank, upper_set = interp(upper), True
        if lower_set and upper_set:
            break
        rank = c
    if not lower_set or lower_rank > count:
        lower_rank = count
    if not upper_set or upper_rank > count:
        upper_rank = count
    return (upper_rank - lower_rank) / count


@SETTINGS
@given(histograms(), st.sampled_from([-math.inf, -1.0, 0.0, 0.25, 1.0, 3.0]),
       st.sampled_from([-0.5, 0.5, 1.0, 2.0, 5.0, math.inf, math.nan]))
def test_histogram_fraction_matches_port(h, lower, upper):
    from promql.types import VectorSteps

    labels, vals, pres, qs = h
    T = len(qs)
    vec = VectorSteps(labels, vals, pres)
    ctx = FunctionContext(np.arange(T, dtype=np.int64) * 60_000, Annotations(), None)
    with np.errstate(all="ignore"):
        out = F["histogram_fraction"](ctx, [Scalar(np.full(T, lower)), Scalar(np.full(T, upper)), vec])
    got = {(lb, t): float(out.values[i, t]) for i, lb in enumerate(out.labels) for t in range(T) if out.present[i, t]}
    want = {}
    groups: dict = {}
    for i, lb in enumerate(labels):
        groups.setdefault(tuple(p for p in lb if p[0] != "le"), []).append(i)
    for key, idx in groups.items():
        for t in range(T):
            b = [(float(dict(labels[i])["le"]), float(vals[i, t])) for i in idx if pres[i, t]]
            if b:
                with np.errstate(all="ignore"):
                    want[(key, t)] = bucket_fraction(lower, upper, b)
    assert got.keys() == want.keys()
    for k in want:
        assert close(got[k], want[k]), (k, got[k], want[k])


@st.composite
def long_windows(draw):
    """Few series with long windows (>= 64 samples on average), to exercise the prefix-sum paths."""
    S = draw(st.integers(1, 2))
    n = draw(st.integers(80, 160))
    base = draw(st.sampled_from([0.0, 50.0, 1e4]))
    series = []
    for _ in range(S):
        steps_ = np.array(draw(st.lists(st.floats(-3, 3, allow_nan=False), min_size=n, max_size=n)))
        vals = np.round(base + np.cumsum(steps_), 3)
        if draw(st.booleans()):
            k = draw(st.integers(0, n - 1))
            vals[k] = draw(st.sampled_from([np.nan, np.inf, -np.inf, base]))
        if draw(st.booleans()):
            vals[: n // 2] = base  # a constant stretch
        series.append((np.arange(1, n + 1, dtype=np.int64) * 15_000, vals))
    steps = np.array([n * 15_000 - k * 30_000 for k in range(draw(st.integers(1, 6)))][::-1], dtype=np.int64)
    return series, steps, 80 * 15_000


@SETTINGS
@given(long_windows())
def test_long_window_paths_match_prometheus_ports(ws):
    rw = build(*ws)
    with np.errstate(all="ignore"):
        check_loose("stdvar_over_time", rw, ref_stdvar)
        check("avg_over_time", rw, ref_avg)
        check_loose("deriv", rw, ref_deriv)


def test_bucket_quantiles_match_a_bucket_by_bucket_reference() -> None:
    from promql.functions.histogram import _Block, bucket_quantiles

    rng = np.random.default_rng(5)
    for trial in range(1500):
        G, B, T = int(rng.integers(1, 4)), int(rng.integers(1, 7)), int(rng.integers(1, 5))
        ub = np.sort(rng.choice([-1.0, 0.0, 0.1, 0.5, 1.0, 2.0, 10.0, np.inf], size=(G, B)), axis=1)
        c = np.cumsum(rng.integers(0, 4, size=(G, B, T)).astype(float), axis=1)
        if trial % 4 == 1:
            c += rng.normal(0, 1, size=c.shape)  # falling buckets: the monotonicity fix
        elif trial % 4 == 2:
            c *= 1 + rng.choice([0.0, 1e-13, -1e-13], size=c.shape)  # deltas below Prometheus's 1e-12
        elif trial % 4 == 3:
            c[rng.random(c.shape) < 0.1] = np.nan
        p = rng.random((G, B, T)) < (0.8 if trial % 3 else 1.0)
        for g in range(G):  # distinct bounds per group, as grouping by le makes them
            _, first = np.unique(ub[g], return_index=True)
            dup = np.setdiff1d(np.arange(B), first)
            p[g, dup, :] = False
        qs = rng.choice([0.5, 0.9, 0.99, 0.0, 1.0, -0.1, 1.5, np.nan], size=T)
        res, rep = bucket_quantiles(_Block(c, p, ub), qs)
        for g in range(G):
            for t in range(T):
                want, forced = bucket_quantile_fixed(float(qs[t]), [(float(ub[g, j]), float(c[g, j, t])) for j in range(B) if p[g, j, t]])
                got = float(res[g, t])
                assert (math.isnan(want) and math.isnan(got)) or got == want, (trial, g, t, got, want)
                assert bool(rep["forced"][g, t]) == (forced and 0 <= qs[t] <= 1), (trial, g, t)


def _ref_group_sum(xs: list[float]) -> float:
    """Prometheus's sum aggregation: the first value, then kahan_inc in input order, sum + c."""
    s, c = xs[0], 0.0
    for f in xs[1:]:
        s, c = kahan_inc(f, s, c)
    return s + c if math.isfinite(s) else s


def test_sum_and_avg_by_group_match_the_sequential_compensated_sums() -> None:
    """``sum``/``avg`` by label over small groups: the widened one-pass fast path where it is exact to
    rounding, the sequential recurrence elsewhere (cancellation, non-finite values) -- both within a few
    float64 roundings of Prometheus's sequential Kahan sum, and the cancellation cases exactly it."""
    from promql.eval_aggregate import aggregate
    from promql.types import VectorSteps

    rng = np.random.default_rng(11)
    shapes = [lambda n: rng.random(n) * 100, lambda n: np.round(rng.random(n) * 10),
              lambda n: rng.lognormal(0, 3, n), lambda n: rng.normal(0, 1, n),
              lambda n: rng.choice([1e100, 1.0, -1e100, 0.5, -0.0, 0.0], n),
              lambda n: rng.choice([1.0, np.inf, -np.inf, np.nan, 2.5], n)]
    for trial in range(300):
        S, T = int(rng.integers(1, 40 if trial % 3 else 160)), int(rng.integers(1, 6))  # groups above 64 rows too
        groups = rng.integers(0, int(rng.integers(1, 6)), S)
        vals = np.stack([shapes[trial % len(shapes)](S) for _ in range(T)], axis=1)
        pres = rng.random((S, T)) < 0.85
        labels = [make_labels({"__name__": "x", "g": str(groups[i]), "i": str(i)}) for i in range(S)]
        vec = VectorSteps(labels, vals, pres)
        for op in ("sum", "avg"):
            out = aggregate(op, vec, ["g"], False, None, Annotations())
            for r, lbl in enumerate(out.labels):
                rows = [i for i in range(S) if str(groups[i]) == dict(lbl)["g"]]
                for t in range(T):
                    xs = [float(vals[i, t]) for i in rows if pres[i, t]]
                    assert bool(out.present[r, t]) == bool(xs)
                    if not xs:
                        continue
                    want = _ref_group_sum(xs) if op == "sum" else None
                    if op == "avg":
                        ref = ref_avg(None, np.array(xs), None, None)
                        want = float("nan") if ref is None else ref
                    got = float(out.values[r, t])
                    if math.isnan(want) or math.isinf(want):
                        assert (math.isnan(want) and math.isnan(got)) or got == want, (trial, op, xs, got, want)
                    else:  # e.g. sum(1e100, 1, -1e100) is 1 here and in Prometheus, 0 in a plain or widened sum
                        assert abs(got - want) <= 4 * np.spacing(abs(want)) + 1e-300, (trial, op, xs, got, want)
