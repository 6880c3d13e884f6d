"""Function semantics fixed or pinned, checked through the engine
against values worked out from Prometheus's definitions (the arithmetic is in the test):

* predict_linear(v[r] @ T, d): the window stays pinned at T, the regression line is evaluated at
  each step's evaluation time + d (Prometheus: linearRegression(samples, enh.Ts), and
  predict_linear is "@-unsafe", so it is evaluated per step) -- also under offset and subqueries;
* date functions of NaN/Inf/out-of-range values: Go's int64(float) gives the minimum int64 on
  amd64, which Go's calendar (uint64 "absolute" seconds) reads as 292277026596-12-04 15:30:08;
* double_exponential_smoothing with a NaN factor: NaN results, not an error;
* sort_by_label's natural order with digit runs too long for Go's strconv.Atoi.
"""
from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest

from promql.engine import Engine
from promql.errors import PromQLError
from promql.functions.sort import natsort_less
from promql.memory_source import MemorySource
from storage.labels import make_labels

M = 60_000


def engine_with(series: dict[str, tuple[np.ndarray, np.ndarray]]) -> Engine:
    src = MemorySource()
    for sel, (ts, vals) in series.items():
        name, _, rest = sel.partition("{")
        lbls = {"__name__": name}
        for kv in filter(None, rest.rstrip("}").split(",")):
            k, v = kv.split("=")
            lbls[k] = v.strip('"')
        src.add_series(make_labels(lbls), np.asarray(ts, np.int64), np.asarray(vals, np.float64))
    return Engine(src)


def least_squares_at(ts_ms: np.ndarray, vals: np.ndarray, at_ms: int) -> tuple[float, float]:
    """Slope (per second) and the line's value at ``at_ms`` (plain two-pass formulas)."""
    x = (ts_ms - at_ms) / 1000.0
    xm, ym = x.mean(), vals.mean()
    slope = float(((x - xm) * (vals - ym)).sum() / ((x - xm) ** 2).sum())
    return slope, float(ym - slope * xm)


@pytest.fixture(scope="module")
def gauge():
    rng = np.random.default_rng(9)
    ts = np.arange(0, 120 * M, 15_000, dtype=np.int64) + 7_000
    vals = np.round(np.cumsum(rng.normal(0.2, 1.0, ts.size)) + 50, 3)
    return ts, vals


def test_predict_linear_at_pins_window_and_extrapolates_from_eval_time(gauge):
    ts, vals = gauge
    eng = engine_with({"g": gauge})
    at_s, rng_ms, d = 3000, 15 * M, 600
    res = eng.range_query(f"predict_linear(g[15m] @ {at_s}, {d})", 40 * M, 100 * M, 5 * M)
    assert res.present.all()
    sel = (ts > at_s * 1000 - rng_ms) & (ts <= at_s * 1000)
    for k, step in enumerate(res.timestamps.tolist()):
        slope, icpt = least_squares_at(ts[sel], vals[sel], step)
        want = slope * d + icpt
        assert res.values[0, k] == pytest.approx(want, rel=1e-9)
    # the pinned window gives one slope, so the prediction moves by slope * step between steps
    slope, _ = least_squares_at(ts[sel], vals[sel], 0)
    assert np.diff(res.values[0]) == pytest.approx(np.full(res.values.shape[1] - 1, slope * 300), rel=1e-6)
    # and it is not "intercept at T" (which would be constant over the steps)
    _, at_t = least_squares_at(ts[sel], vals[sel], at_s * 1000)
    assert abs(res.values[0, -1] - (slope * d + at_t)) > 1.0


def test_predict_linear_at_matches_instant_queries_per_step(gauge):
    eng = engine_with({"g": gauge})
    q = "predict_linear(g[20m] @ 2500, 120)"
    res = eng.range_query(q, 30 * M, 90 * M, 10 * M)
    for k, step in enumerate(res.timestamps.tolist()):
        inst = eng.instant_query(q, step)
        assert inst.values[0] == pytest.approx(res.values[0, k], rel=1e-12)


@pytest.mark.parametrize("query,window_end", [
    ("predict_linear(g[15m] offset 10m, 300)", lambda step: step - 10 * M),
    ("predict_linear(g[15m] @ 3000 offset 5m, 300)", lambda step: 3000_000 - 5 * M),
    ("predict_linear(g[15m] @ end(), 300)", lambda step: 100 * M),
    ("predict_linear(g[15m] @ start(), 300)", lambda step: 40 * M),
])
def test_predict_linear_intercept_is_eval_time_under_offset_and_at(gauge, query, window_end):
    ts, vals = gauge
    eng = engine_with({"g": gauge})
    res = eng.range_query(query, 40 * M, 100 * M, 5 * M)
    assert res.present.all()
    for k, step in enumerate(res.timestamps.tolist()):
        end = window_end(step)
        sel = (ts > end - 15 * M) & (ts <= end)
        slope, icpt = least_squares_at(ts[sel], vals[sel], step)
        assert res.values[0, k] == pytest.approx(slope * 300 + icpt, rel=1e-9)


def test_predict_linear_of_pinned_subquery(gauge):
    """Subquery points are the inner expression at multiples of the resolution inside
    (T - 10m, T]; the line is still evaluated at the outer step's time."""
    ts, vals = gauge
    eng = engine_with({"g": gauge})
    res = eng.range_query("predict_linear(g[10m:1m] @ 3030, 60)", 60 * M, 90 * M, 10 * M)
    inner_t = np.arange(3030_000 - 10 * M + 1, 3030_000 + 1)
    inner_t = inner_t[inner_t % M == 0]
    inner_v = np.array([vals[np.searchsorted(ts, t, side="right") - 1] for t in inner_t])
    for k, step in enumerate(res.timestamps.tolist()):
        slope, icpt = least_squares_at(inner_t, inner_v, step)
        assert res.values[0, k] == pytest.approx(slope * 60 + icpt, rel=1e-9)


GO_WRAPPED = dt.datetime(2000, 12, 4, 15, 30, 8)  # month/day/time of 292277026596-12-04 15:30:08


@pytest.mark.parametrize("value", ["NaN", "Inf", "-Inf", "1e19", "-1e19", "9.3e18"])
def test_date_functions_of_unconvertible_values(value):
    eng = engine_with({"e": (np.array([0]), np.array([float(value)]))})
    want = {"year": 292277026596, "month": 12, "day_of_month": 4, "day_of_year": 339, "days_in_month": 31,
            "day_of_week": 0, "hour": GO_WRAPPED.hour, "minute": GO_WRAPPED.minute}
    for fn, w in want.items():
        res = eng.instant_query(f"{fn}(e)", 60_000)
        assert res.values[0] == w, (fn, value)


@pytest.mark.parametrize("secs", [-86401.5, 951782400.0, 1700000000.9, 4102444800.0, -62135596800.0, 1e15])
def test_date_functions_of_ordinary_values(secs):
    """Truncation toward zero (Go int64(f)), then the proleptic Gregorian UTC calendar."""
    eng = engine_with({"e": (np.array([0]), np.array([secs]))})
    t = int(math.trunc(secs))
    days, sod = divmod(t, 86400)
    if -719162 <= days <= 2932896:  # inside Python's datetime range: use it as the reference
        d = dt.datetime(1970, 1, 1) + dt.timedelta(days=days, seconds=sod)
        want = {"year": d.year, "month": d.month, "day_of_month": d.day,
                "day_of_year": d.timetuple().tm_yday, "day_of_week": (d.weekday() + 1) % 7,
                "hour": d.hour, "minute": d.minute}
    else:  # 1e15 s: 31.7 million years; 400-year cycles of 146097 days repeat the calendar
        cycles, rem = divmod(days, 146097)
        d = dt.datetime(1970, 1, 1) + dt.timedelta(days=rem, seconds=sod)
        want = {"year": d.year + 400 * cycles, "month": d.month, "day_of_month": d.day, "hour": d.hour}
    for fn, w in want.items():
        res = eng.instant_query(f"{fn}(e)", 60_000)
        assert res.values[0] == w, (fn, secs)


def test_double_exponential_smoothing_nan_factor_is_nan_not_error(gauge):
    eng = engine_with({"g": gauge})
    for q in ("double_exponential_smoothing(g[10m], NaN, 0.5)", "double_exponential_smoothing(g[10m], 0.5, NaN)"):
        res = eng.range_query(q, 40 * M, 60 * M, 5 * M)
        assert res.present.all() and np.isnan(res.values).all()
    with pytest.raises(PromQLError, match=r"invalid smoothing factor. Expected: 0 < sf < 1, got: \+Inf"):
        eng.instant_query("double_exponential_smoothing(g[10m], Inf, 0.5)", 60 * M)
    with pytest.raises(PromQLError, match=r"invalid trend factor. Expected: 0 < tf < 1, got: 1.000000"):
        eng.instant_query("double_exponential_smoothing(g[10m], 0.5, 1)", 60 * M)


def test_natural_sort_digit_runs_beyond_int64_compare_as_strings():
    # 20-digit runs overflow strconv.Atoi: facette/natsort then compares the chunks as strings
    assert natsort_less("a99999999999999999999", "a100000000000000000000") is False
    assert natsort_less("a100000000000000000000", "a99999999999999999999") is True
    assert natsort_less("a9", "a10") is True  # in range: numeric
    assert natsort_less("x9223372036854775807", "x10000000000000000000") is False  # only one fits: strings
