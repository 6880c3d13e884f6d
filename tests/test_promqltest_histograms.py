"""Native-histogram samples beside floats: the ``{{...}}`` literal, the in-memory histogram store,
and what the engine does when a selection holds histograms (Prometheus 3 semantics: which
operations ignore them with an info annotation, which count them, which warn on a mix, and which
are refused because the result would be a histogram this engine cannot return).

The data are small literals; every expected value follows from the data by hand (comments say
how), and annotation texts are Prometheus's wording (util/annotations) with its " (line:col)"
position of the node Prometheus names.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from promql.engine import Engine
from promql.query_opts import QueryOpts
from promql.errors import PromQLError
from promql.memory_source import HistogramOverlay, MemorySource
from promql.promqltest import FileRunner
from promql.promqltest_classify import PLAIN
from promql.promqltest_script import Hist, expand_values, parse_histogram
from promql.types import FloatHistogram, HistogramError
from storage.matchers import Matcher

M = 60_000


def L(name: str, **kv: str) -> tuple:
    return tuple(sorted([("__name__", name)] + list(kv.items())))


H1 = parse_histogram("{{schema:0 count:4 sum:10 buckets:[1 2 1]}}")
H2 = parse_histogram("{{schema:0 count:6 sum:20 z_bucket:1 buckets:[2 2 1]}}")


def _source() -> MemorySource:
    """job="api": three float series (1, 2, 4) and one histogram series, all at t=0.
    mixed{}: floats at 0m and 1m, a histogram at 2m, a float at 3m, a histogram at 4m."""
    src = MemorySource()
    src.add_series(L("req", job="api", i="0"), [0], [1.0])
    src.add_series(L("req", job="api", i="1"), [0], [2.0])
    src.add_series(L("req", job="api", i="2"), [0], [4.0])
    src.add_histograms(L("req_hist", job="api", i="3"), [0], [H1])
    src.add_series(L("mixed"), [0, M, 3 * M], [5.0, 7.0, 6.0])
    src.add_histograms(L("mixed"), [2 * M, 4 * M], [H1, H2])
    return src


@pytest.fixture(scope="module")
def eng() -> Engine:
    return Engine(_source())


def _vec(res) -> dict:
    return {dict(l).get("i", dict(l).get("__name__", "")): float(v) for l, v in zip(res.labels, res.values)}


# --- literal parsing and the store -------------------------------------------------------------


def test_histogram_literal_fields():
    h = parse_histogram("{{schema:1 count:25 sum:3.5 z_bucket:4 z_bucket_w:0.001 buckets:[1 2] offset:3 "
                        "n_buckets:[5] n_offset:-1 counter_reset_hint:gauge}}")
    assert (h.schema, h.count, h.sum, h.zero_count, h.zero_threshold) == (1, 25.0, 3.5, 4.0, 0.001)
    assert h.positive == ((3, 1.0), (4, 2.0)) and h.negative == ((-1, 5.0),)
    assert h.counter_reset_hint == "gauge"
    c = parse_histogram("{{schema:-53 sum:1 count:1 custom_values:[5 10] buckets:[1]}}")
    assert c.uses_custom_buckets and c.custom_values == (5.0, 10.0)
    with pytest.raises(ValueError):
        parse_histogram("{{schema:0 bogus:1}}")


def test_histogram_series_expansion_adds_bucketwise():
    vals = expand_values("{{schema:0 count:1 sum:2 buckets:[1]}}+{{schema:0 count:2 sum:1 buckets:[1 1]}}x2")
    assert len(vals) == 3 and all(isinstance(v, Hist) for v in vals)
    counts = [v.value.count for v in vals]  # type: ignore[union-attr]
    assert counts == [1.0, 3.0, 5.0]
    assert vals[2].value.positive == ((0, 3.0), (1, 2.0))  # type: ignore[union-attr]


def test_histogram_add_reconciles_schema_and_refuses_custom_mix():
    fine = FloatHistogram(schema=1, count=3, sum=1, positive=((1, 1.0), (2, 2.0)))
    coarse = FloatHistogram(schema=0, count=1, sum=1, positive=((1, 1.0),))
    s = fine.add(coarse)
    # schema 1 buckets 1 and 2 both fall into schema 0 bucket 1: (1-1)>>1+1 = 1, (2-1)>>1+1 = 1
    assert s.schema == 0 and s.positive == ((1, 4.0),) and s.count == 4
    with pytest.raises(HistogramError):
        coarse.add(FloatHistogram(schema=-53, custom_values=(1.0,)))
    assert H1.equals(parse_histogram("{{schema:0 count:4 sum:10 buckets:[1 2 1 0]}}"))
    assert not H1.equals(H2)


def test_custom_bounds_are_reconciled_to_the_shared_ones():
    from promql.eval_histogram_rate import detect_reset

    # a: (-Inf,2]:1 (2,4]:2 (4,6]:3 (6,+Inf]:0; b: (-Inf,4]:5 (4,8]:1. Shared bounds: [4]; a's
    # buckets go to (-Inf,4]: 1+2, (4,+Inf]: 3; b's to (-Inf,4]: 5, (4,+Inf]: 1
    a = parse_histogram("{{schema:-53 count:6 sum:20 custom_values:[2 4 6] buckets:[1 2 3]}}")
    b = parse_histogram("{{schema:-53 count:6 sum:20 custom_values:[4 8] buckets:[5 1]}}")
    total, reconciled = a.combine(b)
    assert reconciled and total.custom_values == (4.0,) and total.positive == ((0, 8.0), (1, 4.0))
    assert total.count == 12 and total.sum == 40
    assert a.combine(a)[1] is False
    # counter resets compare the re-binned buckets: (4,+Inf] drops from 3 to 1
    assert detect_reset(b, a)
    same = parse_histogram("{{schema:-53 count:6 sum:20 custom_values:[4] buckets:[3 3]}}")
    assert not detect_reset(same, a) and not detect_reset(a, same)


def test_stats_iterator_selectors_and_hints():
    from promql import parser as pp
    from promql.ast_walk import walk
    from promql.eval_histogram import stats_selectors

    def marked(q: str) -> list[str]:
        ast = pp.parse(q)
        ids = stats_selectors(ast)
        return sorted(n.name for n in walk(ast) if isinstance(n, pp.VectorSelector) and id(n) in ids)

    assert marked("histogram_count(sum(a) + rate(b[5m]))") == ["a", "b"]
    assert marked("histogram_count(rate(a[5m:1m]))") == []  # a subquery needs the buckets
    assert marked("histogram_sum(histogram_quantile(0.5, a))") == []
    assert marked("histogram_avg(a </ 3) + histogram_count(b)") == ["b"]
    assert marked("sum(a)") == []
    # c: counts 4, 6, then 2 (a reset, stored as "unknown" like the first sample of a TSDB chunk);
    # d: counts 1, 2 ("not_reset"). Read through the stats iterator, c's last sample becomes
    # "reset" (its previous one is inside the lookback), so a sum warns -- the full histograms
    # (hint unknown) do not
    src = MemorySource()
    c = [parse_histogram(f"{{{{schema:0 count:{n} sum:{n} buckets:[{n}]}}}}") for n in (4, 6, 2)]
    d = [parse_histogram(f"{{{{schema:0 count:{n} sum:{n} buckets:[{n}] counter_reset_hint:{h}}}}}")
         for n, h in ((1, "unknown"), (2, "not_reset"))]
    src.add_histograms(L("c"), [0, M, 2 * M], c)
    src.add_histograms(L("d"), [M, 2 * M], d)
    e = Engine(src)
    res = e.instant_query("histogram_count(sum({__name__=~\"c|d\"}))", 2 * M)
    assert res.values.tolist() == [4.0]
    assert res.annotations.warnings == [
        "PromQL warning: conflicting counter resets during histogram aggregation (1:21)"]
    assert e.instant_query("count(sum({__name__=~\"c|d\"}))", 2 * M).annotations.warnings == []
    # with the previous sample outside the lookback the iterator starts at c's last sample: stored hint
    assert e.instant_query("histogram_count(sum({__name__=~\"c|d\"}))", 2 * M,
                           QueryOpts(lookback_delta_ms=30_000)).annotations.warnings == []


def test_memory_source_keeps_histograms_apart():
    src = _source()
    ms = [Matcher("__name__", "=", "mixed")]
    ss = src.select(ms, 0, 10 * M)
    assert ss.num_samples == 3  # floats only
    hs = src.select_histograms(ms, 0, 10 * M)
    assert hs is not None and hs.timestamps.tolist() == [2 * M, 4 * M] and hs.hists[1] is H2
    assert src.select_histograms(ms, 5 * M, 10 * M) is None
    over = HistogramOverlay(MemorySource(), src)
    assert over.select(ms, 0, 10 * M).num_samples == 0 and over.select_histograms(ms, 0, 10 * M) is not None
    assert not MemorySource().has_histograms


# --- aggregations --------------------------------------------------------------------------------


@pytest.mark.parametrize("op,expect", [("max", 4.0), ("min", 1.0), ("quantile(0.5,", 2.0), ("stdvar", 14 / 9)])
def test_aggregations_ignore_histograms_with_info(eng, op, expect):
    q = f'{op}({{job="api"}})' if not op.endswith(",") else f'{op} {{job="api"}})'
    res = eng.instant_query(q, 0)
    assert [float(v) for v in res.values] == pytest.approx([expect])  # floats 1, 2, 4 only
    name = op.split("(")[0]
    col = q.index("{") + 1
    assert res.annotations.infos == [f"PromQL info: ignored histogram in {name} aggregation (1:{col})"]
    assert res.annotations.warnings == []


def test_aggregation_over_histograms_only_is_empty_with_info(eng):
    res = eng.instant_query('max(req_hist)', 0)
    assert res.labels == [] and res.annotations.infos == ["PromQL info: ignored histogram in max aggregation (1:5)"]


def test_topk_ignores_histograms_naming_the_aggregation(eng):
    res = eng.instant_query('topk(10, {job="api"})', 0)
    assert sorted(_vec(res).values()) == [1.0, 2.0, 4.0]
    assert res.annotations.infos == ["PromQL info: ignored histogram in topk aggregation (1:1)"]
    res = eng.instant_query('sum(bottomk by (job) (1, {job="api"}))', 0)
    assert [float(v) for v in res.values] == [1.0]
    assert res.annotations.infos == ["PromQL info: ignored histogram in bottomk aggregation (1:5)"]


def test_count_and_group_see_histograms(eng):
    assert [float(v) for v in eng.instant_query('count({job="api"})', 0).values] == [4.0]
    assert [float(v) for v in eng.instant_query('count(group by (i) ({job="api"}))', 0).values] == [4.0]
    res = eng.instant_query('count(req_hist)', 0)
    assert [float(v) for v in res.values] == [1.0] and not res.annotations.infos


def test_limitk_keeps_histograms(eng):
    assert eng.instant_query('count(limitk(10, {job="api"}))', 0).values.tolist() == [4.0]
    assert eng.instant_query("histogram_count(limitk(1, req_hist))", 0).values.tolist() == [4.0]
    assert eng.instant_query('count(limit_ratio(1, {job="api"}))', 0).values.tolist() == [4.0]


def test_sum_of_floats_and_histograms_warns_and_drops_the_group(eng):
    res = eng.instant_query('sum({job="api"})', 0)
    assert res.labels == []
    assert res.annotations.warnings == ["PromQL warning: encountered a mix of histograms and floats for aggregation (1:5)"]
    # per name: the float group sums to 7, the histogram group is a histogram: no mix, no warning
    res = eng.instant_query('count(sum by (__name__) ({job="api"}))', 0)
    assert res.values.tolist() == [2.0] and not res.annotations.warnings
    res = eng.instant_query('sum by (__name__) ({job="api"}) unless on(__name__) req_hist', 0)
    assert res.values.tolist() == [7.0]


def test_sum_and_avg_of_histograms_add_bucketwise():
    src = MemorySource()
    src.add_histograms(L("h", i="a"), [0], [H1])
    src.add_histograms(L("h", i="b"), [0], [H2])
    eng = Engine(src)
    # counts 4 + 6, sums 10 + 20; avg halves them
    assert [float(v) for v in eng.instant_query("histogram_count(sum(h))", 0).values] == [10.0]
    assert [float(v) for v in eng.instant_query("histogram_sum(avg(h))", 0).values] == [15.0]
    assert [float(v) for v in eng.instant_query("histogram_avg(h)", 0).values] == [2.5, 20 / 6]
    with pytest.raises(PromQLError, match="native histogram"):
        eng.instant_query("sum(h)", 0)  # a histogram result is refused, not dropped


# --- selection -------------------------------------------------------------------------------------


def test_newest_sample_wins_between_float_and_histogram(eng):
    # at 2m30s the newest sample of `mixed` is the histogram at 2m; at 3m30s the float 6 at 3m
    assert eng.instant_query("histogram_count(mixed)", 150_000).values.tolist() == [4.0]
    assert eng.instant_query("mixed + 0", 150_000).labels == []  # no float sample then (the histogram wins)
    assert eng.instant_query("mixed", 210_000).values.tolist() == [6.0]
    assert eng.instant_query("timestamp(mixed)", 150_000).values.tolist() == [120.0]


def test_top_level_histogram_result_is_refused(eng):
    with pytest.raises(PromQLError, match="native histogram"):
        eng.instant_query("mixed", 150_000)
    with pytest.raises(PromQLError, match="native histogram"):
        eng.range_query("mixed", 0, 5 * M, M)


# --- binary operators ------------------------------------------------------------------------------


def test_comparison_with_histogram_is_incompatible(eng):
    res = eng.instant_query('{job="api"} > 1', 0)
    assert sorted(_vec(res)) == ["1", "2"]
    assert res.annotations.infos == [
        'PromQL info: incompatible sample types encountered for binary operator ">": histogram > float (1:1)']
    res = eng.instant_query('1 < bool {job="api"}', 0)
    assert sorted(_vec(res).values()) == [0.0, 1.0, 1.0]  # the histogram gives no sample even with bool
    assert res.annotations.infos == [
        'PromQL info: incompatible sample types encountered for binary operator "<": float < histogram (1:1)']


def test_histogram_arithmetic(eng):
    # histogram * scalar scales, histogram + scalar is incompatible
    assert eng.instant_query("histogram_count(req_hist * 3)", 0).values.tolist() == [12.0]
    assert eng.instant_query("histogram_sum(2 * req_hist)", 0).values.tolist() == [20.0]
    assert eng.instant_query("histogram_sum(-req_hist)", 0).values.tolist() == [-10.0]
    res = eng.instant_query("count(req_hist + 1)", 0)
    assert res.labels == []
    assert res.annotations.infos == [
        'PromQL info: incompatible sample types encountered for binary operator "+": histogram + float (1:7)']
    # vector/vector: histogram + histogram adds, histogram / histogram is incompatible
    assert eng.instant_query("histogram_count(req_hist + req_hist)", 0).values.tolist() == [8.0]
    res = eng.instant_query("count(req_hist / req_hist)", 0)
    assert res.labels == [] and res.annotations.infos == [
        'PromQL info: incompatible sample types encountered for binary operator "/": histogram / histogram (1:7)']
    assert eng.instant_query("count(req_hist == req_hist)", 0).values.tolist() == [1.0]


def test_trim_operators(eng):
    # req_hist: (0.5,1]:1 (1,2]:2 (2,4]:1. "</ 2" keeps the first two buckets whole: count 3, sum
    # rebuilt from the geometric bucket midpoints, sqrt(0.5)*1 + sqrt(2)*2
    res = eng.instant_query("histogram_sum(req_hist </ 2)", 0)
    assert res.values.tolist() == [pytest.approx(math.sqrt(0.5) + 2 * math.sqrt(2))]
    assert eng.instant_query("histogram_count(req_hist </ 2)", 0).values.tolist() == [3.0]
    # ">/ sqrt(2)" cuts (1,2] in the middle on the log scale: half of its 2, plus the (2,4] bucket
    assert eng.instant_query("histogram_count(req_hist >/ 1.4142135623730951)", 0).values.tolist() == [
        pytest.approx(2.0)]
    # the result keeps the metric name (a trim does not change what is measured)
    res = eng.instant_query("count by (__name__) (req_hist </ 2)", 0)
    assert [dict(l) for l in res.labels] == [{"__name__": "req_hist"}]
    # float samples give no sample, with Prometheus's info; so does a float on the left
    res = eng.instant_query('count({job="api"} </ 2)', 0)
    assert res.values.tolist() == [1.0]
    assert res.annotations.infos == [
        'PromQL info: incompatible sample types encountered for binary operator "</": float </ float (1:7)']
    res = eng.instant_query("count(2 >/ req_hist)", 0)
    assert res.labels == [] and res.annotations.infos == [
        'PromQL info: incompatible sample types encountered for binary operator ">/": float >/ histogram (1:7)']
    # vector/vector: the right-hand float of each match is the cut point
    res = eng.instant_query('histogram_count(req_hist </ on(job) req{i="1"})', 0)
    assert res.values.tolist() == [3.0]
    with pytest.raises(PromQLError, match='operator "</" not allowed for Scalar operations'):
        eng.instant_query("1 </ 2", 0)


def test_set_operators_keep_histograms(eng):
    assert eng.instant_query('count({job="api"} and on(i) {job="api", i=~"2|3"})', 0).values.tolist() == [2.0]
    assert eng.instant_query('count({job="api"} unless on(i) req)', 0).values.tolist() == [1.0]
    assert eng.instant_query('count(req or on(i) req_hist)', 0).values.tolist() == [4.0]


# --- range functions -------------------------------------------------------------------------------


def test_over_time_functions_with_mixed_ranges(eng):
    t = 4 * M  # window (0, 4m]: floats 7 @1m, 6 @3m; histograms @2m, @4m
    assert eng.instant_query("count_over_time(mixed[4m])", t).values.tolist() == [4.0]
    assert eng.instant_query("present_over_time(mixed[4m])", t).values.tolist() == [1.0]
    res = eng.instant_query("max_over_time(mixed[4m])", t)
    assert res.values.tolist() == [7.0]
    assert res.annotations.infos == [
        'PromQL info: ignored histograms in a range containing both floats and histograms for metric name "mixed" (1:15)']
    res = eng.instant_query("quantile_over_time(0.5, mixed[4m])", t)
    assert res.values.tolist() == [6.5]  # Prometheus names the q argument's position here
    assert res.annotations.infos[0].endswith('"mixed" (1:20)')
    res = eng.instant_query("sum_over_time(mixed[4m])", t)
    assert res.labels == []
    assert res.annotations.warnings == [
        'PromQL warning: encountered a mix of histograms and floats for metric name "mixed" (1:15)']
    # last sample is the histogram H2 @4m, first the float 7 @1m
    assert eng.instant_query("histogram_count(last_over_time(mixed[4m]))", t).values.tolist() == [6.0]
    assert eng.instant_query("first_over_time(mixed[4m])", t).values.tolist() == [7.0]
    assert eng.instant_query("ts_of_last_over_time(mixed[4m])", t).values.tolist() == [240.0]
    # changes: 7 -> H1 -> 6 -> H2 is three changes of kind
    assert eng.instant_query("changes(mixed[4m])", t).values.tolist() == [3.0]
    assert eng.instant_query("histogram_sum(sum_over_time(req_hist[1m]))", 0).values.tolist() == [10.0]


def test_rate_over_histograms(eng):
    res = eng.instant_query("rate(mixed[4m])", 4 * M)
    assert res.labels == [] and res.annotations.warnings == [
        'PromQL warning: encountered a mix of histograms and floats for metric name "mixed" (1:6)']

    def hist(count: float, s: float) -> FloatHistogram:
        return FloatHistogram(schema=0, count=count, sum=s, positive=((0, count),))

    src = MemorySource()
    src.add_histograms(L("h"), [0, M, 2 * M], [hist(1, 1), hist(3, 5), hist(5, 9)])
    src.add_histograms(L("r"), [0, M, 2 * M], [hist(5, 5), hist(2, 2), hist(4, 4)])
    e2 = Engine(src)

    def val(q: str) -> float:
        res = e2.instant_query(q, 2 * M)
        assert len(res.values) == 1, q
        return float(res.values[0])

    # window (0, 2m] holds 1m and 2m: raw increase count 5-3 = 2, sum 9-5 = 4; the first sample
    # is one interval (60 s, below 1.1 x average) from the window start -> extrapolated x2
    assert val("histogram_count(increase(h[2m]))") == pytest.approx(4.0)
    assert val("histogram_sum(rate(h[2m]))") == pytest.approx(8.0 / 120)
    assert val("histogram_count(irate(h[2m]))") == pytest.approx(2.0 / 60)
    # r resets between 0 and 1m (count 5 -> 2): increase = 2 + 2 = 4 over 120 s sampled,
    # extrapolated by 60 s at the start -> 6
    assert val("histogram_count(increase(r[3m]))") == pytest.approx(6.0)
    assert val("resets(r[3m])") == 1.0 and val("resets(h[3m])") == 0.0
    res = e2.instant_query("histogram_count(delta(h[2m]))", 2 * M)
    assert res.values.tolist() == [4.0]
    assert res.annotations.warnings == ['PromQL warning: this native histogram metric is not a gauge: "h" (1:23)']
    with pytest.raises(PromQLError, match="native histogram"):
        e2.instant_query("rate(h[2m])", 2 * M)  # a histogram result is refused at the top


def test_subquery_carries_histograms(eng):
    # inner steps 1m..4m at t=4m: float 7, histogram (2m), float 6, histogram (4m)
    assert eng.instant_query("count_over_time(mixed[4m:1m])", 4 * M).values.tolist() == [4.0]
    assert eng.instant_query("absent_over_time(mixed[1m:1m])", 150_000).labels == []


def test_float_only_functions_drop_histograms(eng):
    res = eng.instant_query('abs({job="api"})', 0)
    assert sorted(res.values.tolist()) == [1.0, 2.0, 4.0]  # the histogram series has no output
    assert not res.annotations.infos and not res.annotations.warnings
    assert eng.instant_query('scalar({job="api", i=~"2|3"})', 0).scalar == 4.0  # the one float
    assert math.isnan(eng.instant_query("scalar(req_hist)", 0).scalar)
    assert eng.instant_query("absent(req_hist)", 0).labels == []


# --- the runner: histograms loaded beside the real storage -----------------------------------------

SCRIPT = """
load 5m
  m{job="a", i="0"} 1 2
  m{job="a", i="1"} 3 4
  m_hist{job="a", i="2"} {{schema:0 count:4 sum:10 buckets:[1 2 1]}}x1

eval instant at 5m max({job="a"})
  expect info msg: PromQL info: ignored histogram in max aggregation (1:5)
  {} 4

eval instant at 5m count({job="a"})
  expect no_info
  {} 3

eval instant at 5m sum({job="a"})
  expect warn msg: PromQL warning: encountered a mix of histograms and floats for aggregation (1:5)

eval instant at 5m {job="a"} == 4
  expect info
  m{job="a", i="1"} 4

eval range from 0 to 5m step 5m count_over_time({job="a"}[10m])
  {i="0", job="a"} 1 2
  {i="1", job="a"} 1 2
  {i="2", job="a"} 1 2
"""


@pytest.mark.parametrize("storage", ["memory", "tsdb"])
def test_runner_loads_histograms_beside_the_storage(storage):
    outs = FileRunner(storage=storage).run_text("hist.test", SCRIPT)
    assert [o.kind for o in outs] == [PLAIN] * 5
    bad = [f"{o.case_id}: {o.message}" for o in outs if o.status != "pass"]
    assert not bad, bad


def test_runner_catches_a_wrong_histogram_annotation():
    wrong = SCRIPT.replace("ignored histogram in max aggregation", "ignored histogram in min aggregation")
    outs = FileRunner(storage="memory").run_text("hist.test", wrong)
    assert outs[0].status == "fail" and all(o.status == "pass" for o in outs[1:])


def test_float_path_has_no_histogram_plane():
    src = MemorySource()
    src.add_series(L("x"), np.arange(10) * M, np.arange(10.0))
    eng = Engine(src)
    res = eng.range_query("sum(rate(x[5m]))", 5 * M, 9 * M, M)
    assert res.values.shape == (1, 5)
    assert not src.has_histograms


# --- native histogram_quantile / histogram_fraction / histogram_stddev ------------------------------


def test_native_quantile_fraction_stddev():
    # H1: schema 0 buckets (0.5,1]:1 (1,2]:2 (2,4]:1, count 4, sum 10
    src = MemorySource()
    src.add_histograms(L("h", k="exp"), [0], [H1])
    src.add_histograms(L("h", k="nhcb"), [0], [parse_histogram("{{schema:-53 count:4 sum:6 custom_values:[1 2] buckets:[1 2 1]}}")])
    eng = Engine(src)

    def one(q: str, k: str) -> float:
        res = eng.instant_query(q.replace("SEL", f'h{{k="{k}"}}'), 0)
        assert len(res.labels) == 1 and dict(res.labels[0]) == {"k": k}  # name dropped
        return float(res.values[0])

    # q=0.25: rank 1 lands at the top of (0.5,1]: exponential interpolation gives 2^0 = 1
    assert one("histogram_quantile(0.25, SEL)", "exp") == pytest.approx(1.0)
    # q=0.5 (from the top): 1 of the 2 observations of (1,2] -> 2^(0 + 0.5) = sqrt(2)
    assert one("histogram_quantile(0.5, SEL)", "exp") == pytest.approx(math.sqrt(2))
    # custom buckets interpolate linearly; the +Inf bucket answers its lower bound
    assert one("histogram_quantile(0.5, SEL)", "nhcb") == pytest.approx(1.5)
    assert one("histogram_quantile(0.99, SEL)", "nhcb") == pytest.approx(2.0)
    # fraction of observations in (0, 2]: buckets 1 and 2 = 3 of 4
    assert one("histogram_fraction(0, 2, SEL)", "exp") == pytest.approx(0.75)
    # (1.5, 3]: log-scale share of (1,2] above 1.5 plus share of (2,4] below 3
    expect = (2 * (1 - math.log2(1.5)) + 1 * (math.log2(3) - 1)) / 4
    assert one("histogram_fraction(1.5, 3, SEL)", "exp") == pytest.approx(expect)
    mids = [(math.sqrt(0.5), 1), (math.sqrt(2), 2), (math.sqrt(8), 1)]  # geometric bucket means
    var = sum(c * (m - 2.5) ** 2 for m, c in mids) / 4
    assert one("histogram_stdvar(SEL)", "exp") == pytest.approx(var)
    assert one("histogram_stddev(SEL)", "exp") == pytest.approx(math.sqrt(var))
    res = eng.instant_query('histogram_quantile(1.5, h{k="exp"})', 0)
    assert res.values.tolist() == [math.inf]
    assert res.annotations.warnings == ["PromQL warning: quantile value should be between 0 and 1, got 1.5 (1:20)"]


def test_load_with_nhcb_builds_custom_bucket_histograms():
    from promql.promqltest import nhcb_histograms
    from promql.promqltest_script import LoadCmd, parse_script

    cmds = parse_script("""
load_with_nhcb 1m
  lat_bucket{job="a", le="0.5"} 1 2
  lat_bucket{job="a", le="1"} 3 5
  lat_bucket{job="a", le="+Inf"} 4 5
  lat_sum{job="a"} 2 3
  lat_count{job="a"} 4 5
""")
    load = cmds[0]
    assert isinstance(load, LoadCmd) and load.with_nhcb
    hs = nhcb_histograms(load)
    (base, samples), = hs.items()
    assert dict(base) == {"__name__": "lat", "job": "a"}
    assert [t for t, _ in samples] == [0, M]
    h0, h1 = samples[0][1], samples[1][1]
    # cumulative 1, 3, 4 -> per-bucket 1, 2, 1 over bounds (0.5, 1, +Inf)
    assert h0.schema == -53 and h0.custom_values == (0.5, 1.0)
    assert h0.positive == ((0, 1.0), (1, 2.0), (2, 1.0)) and (h0.count, h0.sum) == (4.0, 2.0)
    assert h1.positive == ((0, 2.0), (1, 3.0), (2, 0.0)) and h1.count == 5.0
    # the runner stores them beside the floats: a label selector sees both kinds
    # (two bucket series + the count series + the histogram `lat` = 4)
    outs = FileRunner(storage="tsdb").run_text("nhcb.test", """
load_with_nhcb 1m
  lat_bucket{job="a", le="0.5"} 1 2
  lat_bucket{job="a", le="+Inf"} 4 5
  lat_count{job="a"} 4 5

eval instant at 1m count({job="a"})
  {} 4

eval instant at 1m max({job="a"})
  expect info msg: PromQL info: ignored histogram in max aggregation (1:5)
  {} 5
""")
    assert [(o.kind, o.status) for o in outs] == [(PLAIN, "pass"), (PLAIN, "pass")], [o.message for o in outs]


def test_runner_can_run_native_histogram_evals_on_request():
    from promql.promqltest_classify import NH

    script = """
load 1m
  lat{job="a"} {{schema:0 count:4 sum:10 buckets:[1 2 1]}}x2

eval instant at 1m histogram_count(lat)
  {job="a"} 4

eval instant at 1m lat
  lat{job="a"} {{schema:0 count:4 sum:10 buckets:[1 2 1]}}
"""
    default = FileRunner(storage="memory").run_text("nh.test", script)
    assert [(o.kind, o.status) for o in default] == [(NH, "skip"), (NH, "skip")]
    opted = FileRunner(storage="memory", run_native_histograms=True).run_text("nh.test", script)
    # both run: a float expectation, and a histogram one compared like FORMAT.md 4.3
    assert [(o.kind, o.status) for o in opted] == [(NH, "pass"), (NH, "pass")], [o.message for o in opted]
    wrong = FileRunner(storage="memory", run_native_histograms=True).run_text(
        "nh.test", script.replace("} 4", "} 5").replace("buckets:[1 2 1]}}\n", "buckets:[1 3]}}\n"))
    assert [o.status for o in wrong] == ["fail", "fail"], [o.message for o in wrong]


def test_count_values_names_histograms_by_their_string_form():
    from promql.eval_histogram_buckets import histogram_string

    h = parse_histogram("{{schema:0 sum:10 count:20 z_bucket_w:0.001 z_bucket:2 buckets:[1 2] n_buckets:[1 2]}}")
    # negative buckets from the most negative, the zero bucket, then positive; empty ones left out
    assert histogram_string(h) == "{count:20, sum:10, [-2,-1):2, [-1,-0.5):1, [-0.001,0.001]:2, (0.5,1]:1, (1,2]:2}"
    c = parse_histogram("{{schema:-53 sum:1 count:3 custom_values:[5 10] buckets:[1 0 2]}}")
    assert histogram_string(c) == "{count:3, sum:1, [-Inf,5]:1, (10,+Inf]:2}"
    src = MemorySource()
    src.add_series(L("v", i="0"), [0], [6.0])
    src.add_histograms(L("v", i="1"), [0], [h])
    src.add_histograms(L("v", i="2"), [0], [h])
    res = Engine(src).instant_query('count_values("version", v)', 0)
    got = {dict(l)["version"]: float(x) for l, x in zip(res.labels, res.values)}
    assert got == {"6": 1.0, histogram_string(h): 2.0}


def test_label_functions_keep_histograms_whatever_they_reorder_or_merge(eng):
    q = 'label_replace({job="api", i=~"2|3"}, "i", "x", "", "")'
    assert eng.instant_query(f"count({q})", 0).values.tolist() == [2.0]  # req and req_hist: two series
    # renaming both to one label set at the same step is Prometheus's duplicate-labelset error
    with pytest.raises(PromQLError, match="same labelset"):
        eng.instant_query(f'label_replace({q}, "__name__", "same", "", "")', 0)
    assert eng.instant_query('histogram_count(label_replace(req_hist, "a", "b", "", ""))', 0).values.tolist() == [4.0]
    assert eng.instant_query('count(sort_by_label_desc({job="api"}, "i"))', 0).values.tolist() == [4.0]
    assert eng.instant_query('histogram_count(sort_by_label({job="api"}, "i"))', 0).values.tolist() == [4.0]


def test_runner_stores_histograms_with_tsdb_style_reset_hints():
    from promql.promqltest import _Store
    from promql.promqltest_script import LoadCmd, parse_script

    load = parse_script("""
load 1m
  c {{schema:0 count:1 sum:1 buckets:[1]}}+{{schema:0 count:1 sum:1 buckets:[1]}}x2 {{schema:0 count:1 sum:1 buckets:[1]}} 5 {{schema:0 count:2 sum:2 buckets:[2]}}
  g {{schema:0 count:1 sum:1 counter_reset_hint:gauge}}x1
""")[0]
    assert isinstance(load, LoadCmd)
    store = _Store("memory")
    try:
        store.load(load)
        hints = {}
        for name in ("c", "g"):
            hs = store.engine_source.select_histograms([Matcher("__name__", "=", name)], 0, 10 * M)
            hints[name] = [h.counter_reset_hint for h in hs.hists]
    finally:
        store.close()
    # counts 1, 2, 3 continue a chunk; 1 is a counter reset (new chunk); after the float 5 a new chunk
    assert hints["c"] == ["unknown", "not_reset", "not_reset", "unknown", "unknown"]
    assert hints["g"] == ["gauge", "gauge"]


def test_native_histogram_quantiles_labels_each_quantile():
    src = MemorySource()
    src.add_histograms(L("h", k="exp"), [0], [H1])
    res = Engine(src).instant_query('histogram_quantiles(h, "q", 0.25, 0.5)', 0)
    got = {dict(l)["q"]: float(v) for l, v in zip(res.labels, res.values)}
    # same quantiles as histogram_quantile above: 1 and sqrt(2); the name is dropped
    assert got == pytest.approx({"0.25": 1.0, "0.5": math.sqrt(2)})
    assert all("__name__" not in dict(l) for l in res.labels)
