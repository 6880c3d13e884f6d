"""Unit tests of the PromQL function table, called directly on small columnar inputs.

Expected values are worked out by hand from Prometheus's documented semantics (comments show the
arithmetic); the end-to-end behaviour is covered by the conformance files (tests/test_promqltest*).
"""
from __future__ import annotations

import math

import numpy as np
from promql import parser as promql_parser
import pytest

from promql.errors import ExecutionError
from promql.functions import FunctionContext, load_all
from promql.types import Annotations, RangeWindows, Scalar, StringValue, VectorSteps
from storage.labels import make_labels

F = load_all()
M = 60_000  # one minute in ms
NAN = float("nan")
INF = float("inf")


def windows(series: list[tuple[dict, list[int], list[float]]], steps: list[int], range_ms: int) -> RangeWindows:
    """Build a RangeWindows the way the evaluator does: window (t - range, t] per step."""
    labels, ts, vals, offs = [], [], [], [0]
    for lb, t, v in series:
        labels.append(make_labels(lb))
        ts += list(t)
        vals += list(v)
        offs.append(len(ts))
    ts_a = np.array(ts, dtype=np.int64)
    st = np.array(steps, dtype=np.int64)
    S, T = len(labels), len(steps)
    lo = np.zeros((S, T), np.int64)
    hi = np.zeros((S, T), np.int64)
    for s in range(S):
        a, b = offs[s], offs[s + 1]
        lo[s] = a + np.searchsorted(ts_a[a:b], st - range_ms, side="right")
        hi[s] = a + np.searchsorted(ts_a[a:b], st, side="right")
    return RangeWindows(labels, np.array(offs), ts_a, np.array(vals, dtype=float), lo, hi, st, range_ms)


def regular(name: str, step_ms: int, vals: list[float], **lbls: str) -> tuple[dict, list[int], list[float]]:
    return ({"__name__": name, **lbls}, [i * step_ms for i in range(len(vals))], vals)


def vector(rows: list[tuple[dict, list[float]]]) -> VectorSteps:
    labels = [make_labels(lb) for lb, _ in rows]
    vals = np.array([v for _, v in rows], dtype=float).reshape(len(rows), -1)
    present = ~np.isnan(vals) | np.array([[True] * vals.shape[1]] * len(rows), dtype=bool)
    return VectorSteps(labels, vals, present)


def call(name: str, steps: list[int], *args, query: str | None = None):
    node = promql_parser.parse(query) if query else None
    ctx = FunctionContext(np.array(steps, dtype=np.int64), Annotations(), node,
                          position=(1, 1), arg_positions=[(1, 10), (1, 20), (1, 30), (1, 40)])
    return F[name](ctx, list(args)), ctx.annotations


def by_label(vec: VectorSteps, label: str) -> dict[str, float]:
    out = {}
    for i, lb in enumerate(vec.labels):
        d = dict(lb)
        out[d.get(label, "")] = float(vec.values[i, 0]) if vec.present[i, 0] else None
    return out


# --- rate family -------------------------------------------------------------------------------

def test_rate_extrapolates_to_window_edges():
    # 0,10,...,100 every 5m; rate over [50m] at 50m: samples at 5m..50m (0m is outside the
    # left-open window): increase 90 over 45m, extrapolated by 5m on the left (< 1.1 * 5m)
    # -> 100 over 3000 s.
    rw = windows([regular("req_total", 5 * M, [10.0 * i for i in range(11)])], [50 * M], 50 * M)
    out, ann = call("rate", [50 * M], rw)
    assert out.values[0, 0] == pytest.approx(100 / 3000)
    assert out.drop_name.all()
    assert ann.infos == []


def test_increase_counter_zero_clamp_and_half_interval():
    # value 1 at t=0 rising 10 per 5m; window [100m] at 50m covers everything.
    # Left gap 50m > 1.1 * avg (5m) -> extrapolate half an interval (150 s), but the counter
    # would hit zero after 30 s (5m * 1/100 * ... = 300 s * 1/10) -> only 30 s.
    # result 100 * (3000 + 30 + 0) / 3000 = 101.
    rw = windows([regular("c_total", 5 * M, [1 + 10.0 * i for i in range(11)])], [50 * M], 100 * M)
    out, _ = call("increase", [50 * M], rw)
    assert out.values[0, 0] == pytest.approx(101)


def test_increase_handles_counter_reset():
    # 0 1 2 3 2 3 4 every 5m, increase over [30m] at 30m: samples 5m..30m = 1 2 3 2 3 4.
    # raw 4 - 1 = 3, the drop 3 -> 2 is a reset and adds 3 -> 6 over 1500 s. The left gap (300 s)
    # is within 1.1 * 300 s, but the counter reaches zero after 1500 * 1/6 = 250 s -> 250 s.
    # 6 * (1500 + 250) / 1500 = 7.
    rw = windows([regular("c_total", 5 * M, [0, 1, 2, 3, 2, 3, 4])], [30 * M], 30 * M)
    out, _ = call("increase", [30 * M], rw)
    assert out.values[0, 0] == pytest.approx(7)


def test_rate_non_counter_name_info_and_too_few_samples():
    rw = windows([regular("queue_depth", 5 * M, [1, 2, 3])], [10 * M, 20 * M], 10 * M)
    out, ann = call("rate", [10 * M, 20 * M], rw)
    assert out.present.tolist() == [[True, False]]  # at 20m only one sample is in (10m, 20m]
    assert ann.infos == ['PromQL info: metric might not be a counter, name does not end in '
                         '_total/_sum/_count/_bucket: "queue_depth" (1:10)']


def test_delta_is_not_counter_aware():
    rw = windows([regular("g", 5 * M, [200, 150, 100, 50, 0])], [20 * M], 20 * M)
    out, _ = call("delta", [20 * M], rw)
    # samples 5m..20m: 150 -> 0 = -150 over 15m, extrapolated to 20m: -200
    assert out.values[0, 0] == pytest.approx(-200)


def test_irate_and_idelta_use_last_two_samples():
    rw = windows([regular("c_total", 5 * M, [0, 10, 20, 5])], [15 * M], 20 * M)
    out, _ = call("irate", [15 * M], rw)
    assert out.values[0, 0] == pytest.approx(5 / 300)  # reset: last value / 300 s
    out, _ = call("idelta", [15 * M], rw)
    assert out.values[0, 0] == pytest.approx(-15)


def test_deriv_and_predict_linear():
    # y = 2 per minute, exact line: slope 2/60 per second
    rw = windows([regular("g", M, [2.0 * i for i in range(11)])], [10 * M], 10 * M)
    out, _ = call("deriv", [10 * M], rw)
    assert out.values[0, 0] == pytest.approx(2 / 60)
    # predict 60 s ahead of the step time: value at 10m is 20 -> 22
    out, _ = call("predict_linear", [10 * M], rw, Scalar(np.array([60.0])))
    assert out.values[0, 0] == pytest.approx(22)


def test_deriv_constant_infinite_is_nan():
    rw = windows([regular("g", M, [INF, INF, INF])], [2 * M], 5 * M)
    out, _ = call("deriv", [2 * M], rw)
    assert math.isnan(out.values[0, 0])


def test_resets_and_changes():
    rw = windows([regular("c", 5 * M, [1, 2, 3, 0, 1, 0, 0, 1, 2, 0])], [45 * M], 50 * M)
    out, _ = call("resets", [45 * M], rw)
    assert out.values[0, 0] == 3  # 3->0, 1->0, 2->0
    out, _ = call("changes", [45 * M], rw)
    assert out.values[0, 0] == 8  # every step changes except 0->0
    rw = windows([regular("x", 5 * M, [NAN, NAN, NAN])], [15 * M], 20 * M)
    out, _ = call("changes", [15 * M], rw)
    assert out.values[0, 0] == 0  # NaN -> NaN is not a change


# --- *_over_time -----------------------------------------------------------------------------

def test_over_time_basics():
    rw = windows([regular("m", 10_000, [3, 1, 4, 1, 5])], [55_000], 60_000)
    expect = {
        "sum_over_time": 14, "avg_over_time": 2.8, "min_over_time": 1, "max_over_time": 5,
        "count_over_time": 5, "last_over_time": 5, "first_over_time": 3, "present_over_time": 1,
        "ts_of_last_over_time": 40, "ts_of_first_over_time": 0,
        "ts_of_max_over_time": 40, "ts_of_min_over_time": 30,  # last occurrence of the minimum
        "stdvar_over_time": 2.56,  # mean 2.8; squared deviations 0.04+3.24+1.44+3.24+4.84 = 12.8; /5
    }
    for fn, want in expect.items():
        out, _ = call(fn, [55_000], rw)
        assert out.values[0, 0] == pytest.approx(want), fn
    out, _ = call("stddev_over_time", [55_000], rw)
    assert out.values[0, 0] == pytest.approx(math.sqrt(2.56))
    out, _ = call("last_over_time", [55_000], rw)
    assert not out.drop_name.any()  # last_over_time keeps the metric name
    out, _ = call("sum_over_time", [55_000], rw)
    assert out.drop_name.all()


def test_compensated_sum_keeps_small_terms():
    rw = windows([regular("m", 10_000, [1, 1e100, 1, -1e100])], [60_000], 120_000)
    out, _ = call("sum_over_time", [60_000], rw)
    assert out.values[0, 0] == 2
    out, _ = call("avg_over_time", [60_000], rw)
    assert out.values[0, 0] == 0.5


def test_avg_over_time_does_not_overflow():
    big = 9.988465674311579e307
    rw = windows([regular("m", 10_000, [big, big])], [55_000], 60_000)
    out, _ = call("avg_over_time", [55_000], rw)
    assert out.values[0, 0] == big
    out, _ = call("sum_over_time", [55_000], rw)
    assert out.values[0, 0] == INF


def test_min_max_ignore_nan_unless_all_nan():
    rw = windows([regular("m", 10_000, [NAN, 2, NAN, 1]), regular("n", 10_000, [NAN, NAN])], [55_000], 60_000)
    out, _ = call("max_over_time", [55_000], rw)
    assert out.values[0, 0] == 2 and math.isnan(out.values[1, 0])
    out, _ = call("min_over_time", [55_000], rw)
    assert out.values[0, 0] == 1


def test_quantile_over_time_interpolates_and_warns():
    rw = windows([regular("m", 10_000, [0, 10, 20, 30, 40])], [55_000], 60_000)
    out, ann = call("quantile_over_time", [55_000], Scalar(np.array([0.9])), rw)
    assert out.values[0, 0] == pytest.approx(36)  # rank 0.9*4 = 3.6 -> 30 + 0.6*10
    out, ann = call("quantile_over_time", [55_000], Scalar(np.array([1.5])), rw)
    assert out.values[0, 0] == INF
    assert ann.warnings == ["PromQL warning: quantile value should be between 0 and 1, got 1.5 (1:10)"]


def test_mad_over_time():
    rw = windows([regular("m", 10_000, [1, 2, 3, 4, 100])], [55_000], 60_000)
    out, _ = call("mad_over_time", [55_000], rw)
    assert out.values[0, 0] == 1  # median 3; deviations 2 1 0 1 97 -> median 1


def test_range_query_windows_slide():
    rw = windows([regular("m", M, [1, 2, 3, 4, 5, 6])], [2 * M, 4 * M, 6 * M], 2 * M)
    out, _ = call("sum_over_time", [2 * M, 4 * M, 6 * M], rw)
    assert out.values[0].tolist() == [5, 9, 6]  # (0,2m]={2,3}, (2m,4m]={4,5}, (4m,6m]={6}


def test_double_exponential_smoothing():
    # sf=0.5, tf=0.5 on 1 2 4: s1=1, b=1; i=1: x=1, y=0.5*(1+1)=1 -> s=2 (s0=1);
    # i=2: b = 0.5*(2-1) + 0.5*1 = 1; x=2, y=0.5*(2+1)=1.5 -> 3.5
    rw = windows([regular("g", M, [1, 2, 4])], [2 * M], 5 * M)
    out, _ = call("double_exponential_smoothing", [2 * M], rw, Scalar(np.array([0.5])), Scalar(np.array([0.5])))
    assert out.values[0, 0] == pytest.approx(3.5)
    with pytest.raises(ExecutionError, match="invalid smoothing factor"):
        call("double_exponential_smoothing", [2 * M], rw, Scalar(np.array([1.0])), Scalar(np.array([0.5])))


# --- histograms ------------------------------------------------------------------------------

def _buckets(pairs: list[tuple[str, float]], **lbls: str) -> VectorSteps:
    return vector([({"__name__": "h_bucket", "le": le, **lbls}, [c]) for le, c in pairs])


def test_histogram_quantile_interpolates():
    vec = _buckets([("1", 10), ("2", 20), ("+Inf", 20)])
    out, _ = call("histogram_quantile", [0], Scalar(np.array([0.75])), vec)
    # rank 15 falls in (1, 2]: 1 + (15-10)/(20-10) = 1.5; output drops le and the name
    assert out.values[0, 0] == pytest.approx(1.5)
    assert out.labels == [make_labels({"__name__": "h_bucket"})] and out.drop_name.all()
    out, _ = call("histogram_quantile", [0], Scalar(np.array([0.99])), _buckets([("1", 10), ("2", 10), ("+Inf", 20)]))
    assert out.values[0, 0] == 2  # rank in the +Inf bucket -> upper bound of the second highest


def test_histogram_quantile_lowest_bucket_and_missing_inf():
    out, _ = call("histogram_quantile", [0], Scalar(np.array([0.5])), _buckets([("-1", 10), ("+Inf", 10)]))
    assert out.values[0, 0] == -1  # lowest bucket with upper bound <= 0 returns that bound
    out, _ = call("histogram_quantile", [0], Scalar(np.array([0.5])), _buckets([("1", 10), ("2", 20)]))
    assert math.isnan(out.values[0, 0])


def test_histogram_quantile_forces_monotonicity_with_info():
    vec = _buckets([("1", 10), ("2", 8), ("+Inf", 20)])
    out, ann = call("histogram_quantile", [0], Scalar(np.array([0.5])), vec)
    # bucket 2 fixed to 10: rank 10 hits bucket 1 (count 10 >= 10) -> 1.0
    assert out.values[0, 0] == pytest.approx(1.0)
    assert len(ann.infos) == 1
    assert ann.infos[0].startswith("PromQL info: input to histogram_quantile needed to be fixed for monotonicity")
    assert 'for metric name "h_bucket", from buckets 2 to 2, with a max diff of 2, over 1 samples' in ann.infos[0]
    assert ann.infos[0].endswith("(1:20)")


def test_histogram_quantile_bad_le_and_invalid_q():
    vec = _buckets([("1", 1), ("Hello World", 2), ("+Inf", 3)])
    out, ann = call("histogram_quantile", [0], Scalar(np.array([NAN])), vec)
    assert math.isnan(out.values[0, 0])
    assert 'PromQL warning: bucket label "le" is missing or has a malformed value of "Hello World" for metric name "h_bucket" (1:20)' in ann.warnings
    assert "PromQL warning: quantile value should be between 0 and 1, got NaN (1:10)" in ann.warnings


def test_histogram_quantile_groups_by_labels_without_le():
    vec = VectorSteps(
        [make_labels({"__name__": "h", "le": le, "job": j}) for j in ("a", "b") for le in ("1", "+Inf")],
        np.array([[5.0], [10.0], [0.0], [10.0]]), np.ones((4, 1), dtype=bool))
    out, _ = call("histogram_quantile", [0], Scalar(np.array([0.5])), vec)
    got = by_label(out, "job")
    assert got["a"] == pytest.approx(1.0)  # rank 5 in (0, 1] with 5 -> 1
    assert got["b"] == pytest.approx(1.0)  # all in +Inf -> upper bound of second highest


def test_histogram_fraction():
    vec = _buckets([("1", 10), ("2", 20), ("+Inf", 40)])
    out, _ = call("histogram_fraction", [0], Scalar(np.array([0.0])), Scalar(np.array([1.5])), vec)
    assert out.values[0, 0] == pytest.approx(15 / 40)  # 10 + half of (1,2]'s 10
    out, _ = call("histogram_fraction", [0], Scalar(np.array([2.0])), Scalar(np.array([INF])), vec)
    assert out.values[0, 0] == pytest.approx(20 / 40)


# --- instant-vector functions ------------------------------------------------------------------

def test_math_functions_drop_name():
    vec = vector([({"__name__": "x"}, [-2.5]), ({"__name__": "y"}, [4.0])])
    out, _ = call("abs", [0], vec)
    assert out.values[:, 0].tolist() == [2.5, 4.0] and out.drop_name.all()
    assert call("sqrt", [0], vec)[0].values[1, 0] == 2.0
    assert call("sgn", [0], vec)[0].values[:, 0].tolist() == [-1, 1]
    assert call("round", [0], vec)[0].values[:, 0].tolist() == [-2, 4]  # ties round up
    assert call("round", [0], vec, Scalar(np.array([3.0])))[0].values[:, 0].tolist() == [-3, 3]
    assert call("deg", [0], vector([({}, [math.pi])]))[0].values[0, 0] == pytest.approx(180)


def test_clamp():
    vec = vector([({"a": "1"}, [-5.0]), ({"a": "2"}, [5.0]), ({"a": "3"}, [NAN])])
    out, _ = call("clamp", [0], vec, Scalar(np.array([-1.0])), Scalar(np.array([1.0])))
    assert out.values[:2, 0].tolist() == [-1, 1] and math.isnan(out.values[2, 0])
    out, _ = call("clamp", [0], vec, Scalar(np.array([2.0])), Scalar(np.array([1.0])))
    assert not out.present.any()  # max < min: no output


def test_sort_orders_and_nan_last():
    vec = vector([({"a": "1"}, [2.0]), ({"a": "2"}, [NAN]), ({"a": "3"}, [1.0])])
    out, ann = call("sort", [0], vec)
    assert [dict(lb)["a"] for lb in out.labels] == ["3", "1", "2"]
    out, _ = call("sort_desc", [0], vec)
    assert [dict(lb)["a"] for lb in out.labels] == ["1", "3", "2"]
    assert ann.warnings == []


def test_sort_by_label_is_natural():
    vec = vector([({"i": v}, [0.0]) for v in ("10", "9", "a2", "a10")])
    out, _ = call("sort_by_label", [0], vec, StringValue("i"))
    assert [dict(lb)["i"] for lb in out.labels] == ["9", "10", "a2", "a10"]
    out, _ = call("sort_by_label_desc", [0], vec, StringValue("i"))
    assert [dict(lb)["i"] for lb in out.labels] == ["a10", "a2", "10", "9"]


def test_label_replace_and_join():
    vec = vector([({"__name__": "m", "src": "source-value-10"}, [0.0]), ({"__name__": "m", "src": "source-value-20"}, [1.0])])
    out, _ = call("label_replace", [0], vec, StringValue("dst"), StringValue("x-$1-${1}$$"), StringValue("src"),
                  StringValue("source-value-(.*)"))
    assert [dict(lb)["dst"] for lb in out.labels] == ["x-10-10$", "x-20-20$"]
    out, _ = call("label_replace", [0], vec, StringValue("dst"), StringValue("$1"), StringValue("src"), StringValue("nomatch"))
    assert all("dst" not in dict(lb) for lb in out.labels)
    out, _ = call("label_join", [0], vec, StringValue("dst"), StringValue("+"), StringValue("__name__"), StringValue("src"))
    assert dict(out.labels[0])["dst"] == "m+source-value-10"
    with pytest.raises(ExecutionError, match="vector cannot contain metrics with the same labelset"):
        call("label_replace", [0], vec, StringValue("src"), StringValue(""), StringValue(""), StringValue(""))
    with pytest.raises(ExecutionError, match="invalid regular expression in label_replace"):
        call("label_replace", [0], vec, StringValue("dst"), StringValue(""), StringValue("src"), StringValue("(.*"))


def test_label_replace_merges_non_overlapping_series():
    vec = VectorSteps([make_labels({"a": "1", "b": "x"}), make_labels({"a": "2", "b": "x"})],
                      np.array([[1.0, 0.0], [0.0, 2.0]]), np.array([[True, False], [False, True]]))
    out, _ = call("label_replace", [0, M], vec, StringValue("a"), StringValue(""), StringValue("a"), StringValue(".*"))
    assert out.labels == [make_labels({"b": "x"})]
    assert out.values.tolist() == [[1.0, 2.0]] and out.present.all()


def test_time_and_date_functions():
    t = 1_700_000_000_000  # 2023-11-14T22:13:20Z, a Tuesday
    out, _ = call("time", [t])
    assert out.values[0] == 1_700_000_000
    vec = vector([({"__name__": "ts"}, [t / 1000])])
    want = {"year": 2023, "month": 11, "day_of_month": 14, "day_of_year": 318, "days_in_month": 30,
            "day_of_week": 2, "hour": 22, "minute": 13}
    for fn, v in want.items():
        out, _ = call(fn, [0], vec)
        assert out.values[0, 0] == v, fn
        assert out.drop_name.all()
    out, _ = call("days_in_month", [t])  # no argument: the evaluation time
    assert out.values[0, 0] == 30 and out.labels == [()]
    out, _ = call("day_of_week", [0], vector([({}, [-1.0])]))
    assert out.values[0, 0] == 3  # 1969-12-31 was a Wednesday


def test_timestamp_uses_sample_time():
    vec = vector([({"__name__": "m"}, [7.0])])
    vec.sample_ts = np.array([[5_000]])
    out, _ = call("timestamp", [10_000], vec)
    assert out.values[0, 0] == 5.0 and out.drop_name.all()


def test_absent_labels_from_equality_matchers():
    empty = VectorSteps.empty(2)
    out, _ = call("absent", [0, M], empty, query='absent(nonexistent{job="a", job="b", foo="bar", x=~"y"})')
    assert out.labels == [make_labels({"foo": "bar"})]
    assert out.present.tolist() == [[True, True]]
    present = vector([({"__name__": "x"}, [1.0, NAN])])
    present.present = np.array([[True, False]])
    out, _ = call("absent", [0, M], present, query='absent(x{a="b"})')
    assert out.present.tolist() == [[False, True]] and out.labels == [make_labels({"a": "b"})]


def test_absent_over_time():
    rw = windows([regular("m", M, [1, 2])], [M, 10 * M], 2 * M)
    out, _ = call("absent_over_time", [M, 10 * M], rw, query='absent_over_time(m{a="b"}[2m])')
    assert out.present.tolist() == [[False, True]] and out.labels == [make_labels({"a": "b"})]


def test_scalar_and_vector():
    vec = VectorSteps([make_labels({"a": "1"}), make_labels({"a": "2"})], np.array([[3.0, 1.0], [4.0, 2.0]]),
                      np.array([[True, True], [False, True]]))
    out, _ = call("scalar", [0, M], vec)
    assert out.values[0] == 3.0 and math.isnan(out.values[1])
    out, _ = call("vector", [0, M], Scalar(np.array([1.0, 2.0])))
    assert out.labels == [()] and out.values.tolist() == [[1.0, 2.0]]


def test_histogram_quantile_step_chunks_match_single_block(monkeypatch):
    import promql.functions.histogram as hmod

    T = 7
    rng = np.random.default_rng(3)
    base = np.cumsum(rng.integers(0, 5, (3, T)), axis=0).astype(float)  # monotonic over le
    labels = [make_labels({"__name__": "h", "le": le}) for le in ("1", "5", "+Inf")]
    present = np.ones((3, T), dtype=bool)
    present[1, 2] = False  # a bucket missing at one step
    vec = VectorSteps(labels, base, present)
    steps = [i * M for i in range(T)]
    whole, _ = call("histogram_quantile", steps, Scalar(np.full(T, 0.7)), vec)
    orig = hmod._Buckets.blocks
    monkeypatch.setattr(hmod._Buckets, "blocks", lambda self, max_cells=1: orig(self, 1))
    chunked, _ = call("histogram_quantile", steps, Scalar(np.full(T, 0.7)), vec)
    np.testing.assert_array_equal(whole.present, chunked.present)
    np.testing.assert_allclose(whole.values, chunked.values)
    # the step with the missing middle bucket interpolates between 0..1 or 1..+Inf buckets only
    c = base[:, 2]
    rank = 0.7 * c[2]
    want = 1.0 if rank > c[0] else rank / c[0]  # rank beyond le=1 lands in +Inf: second highest = 1
    assert whole.values[0, 2] == pytest.approx(want)


@pytest.mark.parametrize("offset", [0.0, 1e12])
def test_regression_fast_paths_match_prometheus_replica(offset):
    """deriv/predict_linear's prefix-sum and dense paths against the bit-exact replica of
    Prometheus's compensated-sum regression (the replica is what the conformance tests pin)."""
    import promql.functions.rate as rmod

    rng = np.random.default_rng(11)
    series = [regular("g", 15_000, (offset + np.cumsum(rng.normal(0, 1, 200))).tolist(), i=str(i)) for i in range(5)]
    steps = [600_000 + k * 30_000 for k in range(60)]
    rw = windows(series, steps, 300_000)
    n = (rw.hi - rw.lo).reshape(-1)
    sel = np.flatnonzero(n >= 2)
    for intercept in (None, np.array(steps, dtype=np.int64)):
        slope, icpt, present = rmod._linear_regression(rw, intercept)
        t0 = rw.ts[rw.lo.reshape(-1)[sel]] if intercept is None else intercept[sel % len(steps)]
        ref_s, ref_i = rmod._regression_kernel(rw, rw.lo.reshape(-1)[sel], n[sel], t0)
        np.testing.assert_allclose(slope.reshape(-1)[sel], ref_s, rtol=1e-7)
        if intercept is not None:
            np.testing.assert_allclose(icpt.reshape(-1)[sel], ref_i, rtol=1e-7)


@pytest.mark.parametrize("offset", [0.0, 1e9])
def test_variance_matches_prometheus_replica(offset):
    import promql.functions.over_time as omod

    rng = np.random.default_rng(5)
    series = [regular("g", 15_000, (offset + rng.normal(0, 1, 120)).tolist(), i=str(i)) for i in range(4)]
    steps = [600_000 + k * 30_000 for k in range(40)]
    rw = windows(series, steps, 300_000)
    n = (rw.hi - rw.lo).reshape(-1)
    sel = np.flatnonzero(n > 0)
    ref = omod._variance_kernel(rw.vals, rw.lo.reshape(-1)[sel], n[sel])
    np.testing.assert_allclose(omod._variance(rw).reshape(-1)[sel], ref, rtol=1e-9)


@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_variance_long_windows_prefix_path_matches_replica(offset):
    import promql.functions.over_time as omod

    rng = np.random.default_rng(9)
    series = [regular("g", 15_000, np.round(offset + np.cumsum(rng.normal(0, 1, 400)), 3).tolist(), i=str(i))
              for i in range(3)]
    series.append(regular("c", 15_000, [7.0] * 400, i="const"))
    steps = [1_800_000 + k * 60_000 for k in range(60)]
    rw = windows(series, steps, 1_800_000)  # 120-sample windows: the prefix-sum path
    n = (rw.hi - rw.lo).reshape(-1)
    assert n.mean() >= omod._PREFIX_MIN_WINDOW
    sel = np.flatnonzero(n > 0)
    ref = omod._variance_kernel(rw.vals, rw.lo.reshape(-1)[sel], n[sel])
    got = omod._variance(rw).reshape(-1)[sel]
    np.testing.assert_allclose(got, ref, rtol=1e-9)
    assert (got[ref == 0] == 0).all()  # the constant series is exactly 0
