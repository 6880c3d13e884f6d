"""Engine behaviour the conformance files do not cover well: limits, timeout/cancel, stats,
node hooks, result shapes, subquery alignment, error messages, and the big-group numeric paths.

Runs the real evaluator in-process over the in-memory SampleSource (promql/memory_source.py).
"""
from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from promql.engine import Engine, expr_type, parse
from promql.errors import BadData, ExecutionError, QueryCanceled, QueryTimeout, TooManySamples
from promql.memory_source import MemorySource
from promql.query_opts import QueryOpts
from promql.types import Scalar, VectorSteps
from storage.labels import make_labels
from storage.stale import STALE_NAN


def _src(series: dict[str, tuple[list[int], list[float]]]) -> MemorySource:
    src = MemorySource()
    for sel, (ts, vs) in series.items():
        name, _, rest = sel.partition("{")
        pairs = {"__name__": name}
        for kv in filter(None, rest.rstrip("}").split(",")):
            k, v = kv.split("=")
            pairs[k.strip()] = v.strip().strip('"')
        src.add_series(make_labels(pairs), ts, vs)
    return src


@pytest.fixture()
def counters() -> MemorySource:
    ts = list(range(0, 3_600_000 + 1, 15_000))
    return _src({
        'req_total{job="a",inst="1"}': (ts, [float(i) for i in range(len(ts))]),
        'req_total{job="a",inst="2"}': (ts, [2.0 * i for i in range(len(ts))]),
        'req_total{job="b",inst="3"}': (ts, [3.0 * i for i in range(len(ts))]),
    })


def vec_dict(res) -> dict:
    return {l: float(v) for l, v in zip(res.labels, res.values)}


def test_instant_vector_and_lookback(counters):
    eng = Engine(counters)
    res = eng.instant_query("req_total", 600_000)
    assert res.result_type == "vector" and len(res.labels) == 3
    assert vec_dict(res)[make_labels({"__name__": "req_total", "job": "a", "inst": "1"})] == 40.0
    # 5m after the last sample (t=3600s) the series are still visible, 5m+1ms later they are gone
    assert len(eng.instant_query("req_total", 3_600_000 + 300_000 - 1).labels) == 3
    assert len(eng.instant_query("req_total", 3_600_000 + 300_000).labels) == 0
    # per-query lookback override
    assert len(eng.instant_query("req_total", 3_600_000 + 60_000, QueryOpts(lookback_delta_ms=30_000)).labels) == 0


def test_stale_marker_hides_series():
    src = _src({"g": ([0, 10_000, 20_000], [1.0, STALE_NAN, 3.0])})
    eng = Engine(src)
    assert len(eng.instant_query("g", 5_000).labels) == 1
    assert len(eng.instant_query("g", 15_000).labels) == 0
    assert eng.instant_query("g", 25_000).values.tolist() == [3.0]
    # range selectors drop stale markers
    res = eng.instant_query("g[1m]", 30_000)
    off, ts, vals = res.csr
    assert ts.tolist() == [0, 20_000] and vals.tolist() == [1.0, 3.0]


def test_range_query_shape_sorted_and_scalar(counters):
    eng = Engine(counters)
    res = eng.range_query("sum by (job) (rate(req_total[1m]))", 600_000, 900_000, 60_000)
    assert res.result_type == "matrix"
    assert res.labels == sorted(res.labels) == [(("job", "a"),), (("job", "b"),)]
    assert res.values.shape == (2, 6) and res.present.all()
    assert np.allclose(res.values[0], 3 / 15) and np.allclose(res.values[1], 3 / 15)
    sc = eng.range_query("1 + 2", 0, 120_000, 60_000)
    assert sc.result_type == "matrix" and sc.labels == [()] and sc.values.tolist() == [[3.0, 3.0, 3.0]]
    inst = eng.instant_query("2 * 3", 1000)
    assert inst.result_type == "scalar" and inst.scalar == 6.0 and inst.timestamp == 1000
    s = eng.instant_query('"hello"', 1000)
    assert s.result_type == "string" and s.string == "hello"


def test_range_query_rejects_range_vector_type(counters):
    eng = Engine(counters)
    with pytest.raises(BadData, match='invalid expression type "range vector" for range query'):
        eng.range_query("req_total[5m]", 0, 60_000, 15_000)
    with pytest.raises(BadData, match="zero or negative query resolution step"):
        eng.range_query("req_total", 0, 60_000, 0)


def test_parse_errors_are_bad_data():
    with pytest.raises(BadData, match="parse error"):
        parse("sum(")
    with pytest.raises(BadData, match="no expression found"):
        parse("   ")
    with pytest.raises(BadData, match="expected type range vector|matrix"):
        parse("rate(foo)")
    assert expr_type(parse("foo[5m:]")) == "Matrix"
    assert expr_type(parse("1 + 2")) == "Scalar"


def test_instant_matrix_selector_is_ragged_csr(counters):
    res = Engine(counters).instant_query('req_total{inst="2"}[1m]', 600_000)
    assert res.result_type == "matrix" and res.csr is not None
    off, ts, vals = res.csr
    # left-open window (540s, 600s]
    assert ts.tolist() == [555_000, 570_000, 585_000, 600_000]
    assert vals.tolist() == [74.0, 76.0, 78.0, 80.0]
    assert off.tolist() == [0, 4]


def test_subquery_steps_are_aligned_to_absolute_multiples(counters):
    eng = Engine(counters)
    res = eng.instant_query('req_total{inst="1"}[5m:1m]', 630_000)
    off, ts, _ = res.csr
    assert ts.tolist() == [360_000, 420_000, 480_000, 540_000, 600_000]
    # default step (engine option) when omitted
    res = Engine(counters, default_subquery_step_ms=120_000).instant_query('req_total{inst="1"}[5m:]', 630_000)
    assert res.csr[1].tolist() == [360_000, 480_000, 600_000]


def test_offset_negative_and_at_start_end(counters):
    eng = Engine(counters)
    a = eng.instant_query('req_total{inst="1"} offset 1m', 600_000).values.tolist()
    b = eng.instant_query('req_total{inst="1"} offset -1m', 600_000).values.tolist()
    assert a == [36.0] and b == [44.0]
    res = eng.range_query('req_total{inst="1"} @ start()', 600_000, 900_000, 60_000)
    assert res.values.tolist() == [[40.0] * 6]
    res = eng.range_query('req_total{inst="1"} @ end()', 600_000, 900_000, 60_000)
    assert res.values.tolist() == [[60.0] * 6]
    res = eng.range_query('req_total{inst="1"} @ 300', 600_000, 660_000, 60_000)
    assert res.values.tolist() == [[20.0, 20.0]]


def test_max_samples_limit(counters):
    eng = Engine(counters, max_samples=10)
    with pytest.raises(TooManySamples, match="query processing would load too many samples"):
        eng.instant_query("req_total[5m]", 600_000)
    # 3 series x 1 step is within the limit
    assert len(eng.instant_query("req_total", 600_000).labels) == 3
    # per-query override beats the engine default
    res = eng.instant_query("req_total[5m]", 600_000, QueryOpts(max_samples=1000))
    assert res.csr[0][-1] == 60
    with pytest.raises(TooManySamples):
        Engine(counters).range_query("req_total", 0, 3_600_000, 15_000, QueryOpts(max_samples=100))


def test_timeout_and_cancel(counters):
    eng = Engine(counters)
    with pytest.raises(QueryTimeout):
        eng.instant_query("sum(rate(req_total[5m]))", 600_000, QueryOpts(timeout_s=0.0))
    ev = threading.Event()
    ev.set()
    with pytest.raises(QueryCanceled):
        eng.instant_query("sum(rate(req_total[5m]))", 600_000, QueryOpts(cancel=ev))
    assert QueryTimeout.error_type == "timeout" and QueryCanceled.error_type == "canceled"


def test_stats_are_filled(counters):
    res = Engine(counters).range_query("sum(rate(req_total[5m]))", 600_000, 1_200_000, 60_000)
    st = res.stats
    assert st.series_touched == 3
    # 3 series x samples in (300s, 1200s]
    assert st.samples_scanned == 3 * len(range(315_000, 1_200_001, 15_000))
    assert st.peak_samples >= 3 * 20  # one step's windows at least
    assert st.wall_seconds > 0 and st.cpu_seconds >= 0
    assert st.paths == ["raw"]


def test_node_hooks_replace_subtrees(counters):
    from promql import parser as pp

    seen = []

    def hook(node, ctx):
        seen.append(type(node).__name__)
        if isinstance(node, pp.AggregateExpr) and str(node.op) == "sum":
            ctx.stats.paths.append("summary:test")
            t = ctx.num_steps
            return VectorSteps([(("job", "x"),)], np.full((1, t), 42.0), np.ones((1, t), bool))
        return None

    eng = Engine(counters)
    res = eng.range_query("sum by (job) (req_total) * 2", 0, 120_000, 60_000, QueryOpts(node_hooks=[hook]))
    assert res.labels == [(("job", "x"),)] and res.values.tolist() == [[84.0, 84.0, 84.0]]
    assert "AggregateExpr" in seen and "VectorSelector" not in seen  # sub-tree not evaluated
    assert res.stats.paths == ["summary:test"]

    # hooks inside a subquery see the subquery's own steps
    steps_seen = []

    def hook2(node, ctx):
        if isinstance(node, pp.VectorSelector):
            steps_seen.append(ctx.step_times.tolist())
        return None

    eng.instant_query("max_over_time(req_total[3m:1m])", 600_000, QueryOpts(node_hooks=[hook2]))
    assert steps_seen == [[480_000, 540_000, 600_000]]


def test_hook_can_return_scalar(counters):
    from promql import parser as pp

    def hook(node, ctx):
        if isinstance(node, pp.Call) and node.func.name == "scalar":
            return Scalar(np.full(ctx.num_steps, 7.0))
        return None

    res = Engine(counters).instant_query("scalar(req_total) + 1", 600_000, QueryOpts(node_hooks=[hook]))
    assert res.result_type == "scalar" and res.scalar == 8.0


def test_many_to_many_and_duplicate_errors():
    ts = [0]
    src = _src({
        'a{x="1",y="1"}': (ts, [1.0]),
        'a{x="1",y="2"}': (ts, [2.0]),
        'b{x="1"}': (ts, [10.0]),
    })
    eng = Engine(src)
    with pytest.raises(ExecutionError) as ei:
        eng.instant_query("b + on(x) a", 0)
    assert str(ei.value) == (
        'found duplicate series for the match group {x="1"} on the right hand-side of the operation: '
        '[{__name__="a", x="1", y="1"}, {__name__="a", x="1", y="2"}];'
        "many-to-many matching not allowed: matching labels must be unique on one side"
    )
    with pytest.raises(ExecutionError, match="multiple matches for labels: many-to-one matching must be explicit"):
        eng.instant_query("a + on(x) b", 0)
    res = eng.instant_query("a + on(x) group_left b", 0)
    assert sorted(res.values.tolist()) == [11.0, 12.0]
    with pytest.raises(ExecutionError, match="vector cannot contain metrics with the same labelset"):
        eng.instant_query('label_replace(a, "y", "z", "", "")', 0)


def test_sum_is_compensated_like_prometheus():
    ts = [0]
    vals = [1e100, 1.0, -1e100]
    src = _src({f'v{{i="{i}"}}': (ts, [v]) for i, v in enumerate(vals)})
    res = Engine(src).instant_query("sum(v)", 0)
    assert res.values.tolist() == [1.0]


def _random_source(n_series: int, seed: int = 7) -> tuple[MemorySource, np.ndarray]:
    rng = np.random.default_rng(seed)
    vals = rng.normal(1000.0, 50.0, size=(n_series, 5))
    src = MemorySource()
    ts = np.arange(5, dtype=np.int64) * 60_000
    for i in range(n_series):
        src.add_series(make_labels({"__name__": "m", "i": str(i), "g": str(i % 2)}), ts, vals[i])
    return src, vals


@pytest.mark.parametrize("n_series", [10, 300])  # rank-loop path and big-group path
def test_group_aggregations_match_reference(n_series):
    src, vals = _random_source(n_series)
    eng = Engine(src)
    res = eng.range_query("sum by (g) (m)", 0, 240_000, 60_000)
    for gi, lbl in enumerate(res.labels):
        g = int(dict(lbl)["g"])
        ref = [math.fsum(vals[g::2, t]) for t in range(5)]
        assert np.allclose(res.values[gi], ref, rtol=1e-12)
    x = vals[:, 2]
    checks = {
        "avg(m)": float(np.mean(x)),
        "stddev(m)": float(np.std(x)),
        "stdvar(m)": float(np.var(x)),
        "quantile(0.9, m)": float(np.quantile(x, 0.9)),
        "count(m)": float(n_series),
        "max(m)": float(x.max()),
        "min(m)": float(x.min()),
    }
    for q, want in checks.items():
        got = eng.instant_query(q, 120_000).values[0]
        assert got == pytest.approx(want, rel=1e-9), q


def test_topk_bottomk_order_and_membership():
    src, vals = _random_source(20)
    eng = Engine(src)
    res = eng.instant_query("topk(3, m)", 60_000)
    want = sorted(vals[:, 1].tolist(), reverse=True)[:3]
    assert res.values.tolist() == want  # instant topk is ordered, largest first
    res = eng.instant_query("bottomk by (g) (2, m)", 60_000)
    assert len(res.labels) == 4
    res = eng.range_query("topk(1, m)", 0, 240_000, 60_000)
    assert res.present.sum(axis=0).tolist() == [1] * 5
    for t in range(5):
        row = int(np.flatnonzero(res.present[:, t])[0])
        assert res.values[row, t] == vals[:, t].max()


def test_count_values_formats_like_go():
    src = _src({'v{i="1"}': ([0], [1.0]), 'v{i="2"}': ([0], [1.0]), 'v{i="3"}': ([0], [2.5]), 'v{i="4"}': ([0], [1e21])})
    res = Engine(src).instant_query('count_values("val", v)', 0)
    got = {dict(l)["val"]: v for l, v in zip(res.labels, res.values.tolist())}
    assert got == {"1": 2.0, "2.5": 1.0, "1000000000000000000000": 1.0}


def test_quantile_warning_has_position():
    src = _src({'v{i="1"}': ([0], [1.0])})
    res = Engine(src).instant_query("quantile(2, v)", 0)
    assert res.annotations.warnings == ["PromQL warning: quantile value should be between 0 and 1, got 2 (1:10)"]


def test_delayed_name_removal_end_of_query():
    src = _src({'a_total{e="1"}': ([0, 60_000], [0.0, 60.0]), 'b_total{e="1"}': ([0, 60_000], [0.0, 120.0])})
    eng = Engine(src)
    with pytest.raises(ExecutionError, match="vector cannot contain metrics with the same labelset"):
        eng.instant_query("rate({e=\"1\"}[2m])", 60_000)
    res = eng.instant_query('label_replace(rate({e="1"}[2m]), "__name__", "r_$1", "__name__", "(.+)")', 60_000)
    assert sorted(dict(l)["__name__"] for l in res.labels) == ["r_a_total", "r_b_total"]


def _ref_select(vals: np.ndarray, groups: list[int], k: int, largest: bool) -> set[tuple[int, int]]:
    """(row, step) pairs topk/bottomk must select: per group and step, Prometheus's heap
    selection over the present rows in input order (straight port, one cell at a time)."""
    from promql.eval_aggregate import _go_heap_select

    out = set()
    for t in range(vals.shape[1]):
        by_group: dict[int, list[int]] = {}
        for r, gr in enumerate(groups):
            by_group.setdefault(gr, []).append(r)
        for rows in by_group.values():
            items = [(float(vals[r, t]), r) for r in rows]
            for r in _go_heap_select("topk" if largest else "bottomk", items, k):
                out.add((r, t))
    return out


@pytest.mark.parametrize("n_groups", [1, 5, 300, 40])  # partition path, per-group sort, rank loop, lexsort
def test_topk_paths_agree_with_reference(n_groups):
    rng = np.random.default_rng(3)
    n_series = 1200 if n_groups == 40 else max(n_groups * 3, 60)
    vals = rng.integers(0, 5, size=(n_series, 4)).astype(float)  # many ties
    vals[rng.random(vals.shape) < 0.05] = np.nan
    src = MemorySource()
    ts = np.arange(4, dtype=np.int64) * 60_000
    groups = [i % n_groups for i in range(n_series)]
    labels = [make_labels({"__name__": "m", "i": f"{i:05d}", "g": str(groups[i])}) for i in range(n_series)]
    for i in range(n_series):
        src.add_series(labels[i], ts, vals[i])
    order = sorted(range(n_series), key=lambda i: labels[i])  # engine input order = label order
    svals = vals[order]
    sgroups = [groups[i] for i in order]
    eng = Engine(src)
    for op, largest in (("topk", True), ("bottomk", False)):
        res = eng.range_query(f"{op} by (g) (2, m)", 0, 180_000, 60_000)
        got = set()
        for li, lbl in enumerate(res.labels):
            r = order.index(labels.index(lbl))
            for t in np.flatnonzero(res.present[li]).tolist():
                got.add((r, t))
        assert got == _ref_select(svals, sgroups, 2, largest), op
    # quantile over many groups matches numpy per group
    res = eng.instant_query("quantile by (g) (0.5, m)", 60_000)
    for lbl, v in zip(res.labels, res.values.tolist()):
        gr = int(dict(lbl)["g"])
        xs = vals[[i for i in range(n_series) if groups[i] == gr], 1]
        if np.isnan(xs).any():
            continue  # NaN sorts first in Prometheus's quantile; numpy's differs
        assert v == pytest.approx(float(np.quantile(xs, 0.5)))


def test_count_values_rejects_invalid_utf8_label_name():
    src = _src({'v{i="1"}': ([0], [1.0])})
    eng = Engine(src)
    with pytest.raises(ExecutionError) as ei:
        eng.instant_query('count_values("a\\xc5z", v)', 0)  # \xc5 is a lone byte: not UTF-8
    assert str(ei.value) == 'invalid label name "a\\xc5z"'
    res = eng.instant_query('count_values("aÅz", v)', 0)  # a real code point is fine
    assert res.labels == [(("aÅz", "1"),)]


def test_queryable_samples_per_step(counters):
    res = Engine(counters).range_query("rate(req_total[1m])", 600_000, 720_000, 60_000)
    st = res.stats
    steps, counts = st.samples_per_step
    assert steps.tolist() == [600_000, 660_000, 720_000]
    assert counts.tolist() == [12, 12, 12]  # 3 series x 4 samples in each (t-1m, t]
    assert st.total_queryable_samples == 36
    res = Engine(counters).instant_query("req_total", 600_000)
    assert res.stats.total_queryable_samples == 3


def test_series_blocks_give_identical_results(monkeypatch):
    """Range-vector functions are fed blocks of series; results must not depend on the block size."""
    import promql.evaluator as evaluator_mod

    rng = np.random.default_rng(11)
    src = MemorySource()
    ts = np.arange(0, 1_800_000, 15_000, dtype=np.int64)
    for i in range(40):
        vals = np.cumsum(rng.integers(0, 5, size=len(ts))).astype(float)
        vals[rng.random(len(ts)) < 0.05] = STALE_NAN
        src.add_series(make_labels({"__name__": "c_total", "i": str(i)}), ts, vals)
    eng = Engine(src)
    queries = ["rate(c_total[2m])", "quantile_over_time(0.3, c_total[5m])", "last_over_time(c_total[1m])",
               "absent_over_time(c_total[1m])", "max_over_time(rate(c_total[2m])[5m:30s])", "resets(c_total[10m])"]
    whole = {q: eng.range_query(q, 300_000, 1_500_000, 30_000) for q in queries}
    monkeypatch.setattr(evaluator_mod, "_CHUNK_CELLS", 50)  # 16-series blocks
    for q in queries:
        part = eng.range_query(q, 300_000, 1_500_000, 30_000)
        assert part.labels == whole[q].labels, q
        assert np.array_equal(part.present, whole[q].present), q
        assert np.allclose(part.values, whole[q].values, equal_nan=True), q


def test_limitk_and_limit_ratio():
    src = MemorySource()
    for i in range(20):
        src.add_series(make_labels({"__name__": "m", "i": f"{i:02d}", "g": str(i % 2)}), [0], [float(i)])
    eng = Engine(src)
    res = eng.instant_query("limitk by (g) (3, m)", 0)
    assert sorted(dict(l)["i"] for l in res.labels) == ["00", "01", "02", "03", "04", "05"]  # first 3 per group
    a = set(eng.instant_query("limit_ratio(0.5, m)", 0).labels)
    b = set(eng.instant_query("limit_ratio(-0.5, m)", 0).labels)
    assert a and b and not (a & b) and len(a | b) == 20  # r and -(1-r) split the series exactly
    assert eng.instant_query("limit_ratio(1, m)", 0).labels.__len__() == 20
    with pytest.raises(ExecutionError, match="Ratio value is NaN"):
        eng.instant_query("limit_ratio(NaN, m)", 0)
    with pytest.raises(ExecutionError, match="Parameter value is NaN"):
        eng.instant_query("limitk(NaN, m)", 0)
    from promql.eval_aggregate import xxhash64
    assert xxhash64(b"") == 0xEF46DB3751D8E999  # reference vectors of xxHash64
    assert xxhash64(b"Nobody inspects the spammish repetition") == 0xFBCEA83C8A378BF1


def test_topk_ties_follow_prometheus_heap():
    # values 2, 2, 3 (in label order a, b, c): Prometheus's heap keeps b and c, not a and c
    src = _src({'m{s="a"}': ([0], [2.0]), 'm{s="b"}': ([0], [2.0]), 'm{s="c"}': ([0], [3.0])})
    eng = Engine(src)
    res = eng.instant_query("topk(2, m)", 0)
    assert sorted(dict(l)["s"] for l in res.labels) == ["b", "c"]
    res = eng.range_query("topk(2, m)", 0, 60_000, 60_000)
    assert sorted(dict(l)["s"] for l in res.labels) == ["b", "c"]
    src = _src({'m{s="a"}': ([0], [3.0]), 'm{s="b"}': ([0], [3.0]), 'm{s="c"}': ([0], [2.0])})
    res = Engine(src).instant_query("bottomk(2, m)", 0)
    assert sorted(dict(l)["s"] for l in res.labels) == ["b", "c"]


def test_parsed_trees_are_kept_per_text_except_those_with_duration_expressions(counters: MemorySource) -> None:
    """Recurring texts are parsed once; a tree whose durations are filled in per query
    (``[step()*4]``) is parsed anew, so two queries with different steps never share it."""
    q = 'sum(rate(http_requests_total{job="api"}[5m]))'
    assert parse(q) is parse(q)
    assert parse(q) is not parse(q + " ")
    dyn = "sum(rate(req_total[step()*4]))"
    assert parse(dyn) is not parse(dyn)
    eng = Engine(counters)
    a = eng.range_query(dyn, 600_000, 1_200_000, 15_000)  # windows of 60 s
    b = eng.range_query(dyn, 600_000, 1_200_000, 60_000)  # windows of 240 s
    assert a.values[0][0] == pytest.approx(0.4) and b.values[0][0] == pytest.approx(0.4)  # steady counters
    assert a.values.shape[1] == 41 and b.values.shape[1] == 11
    with pytest.raises(BadData):
        parse("sum(")
    with pytest.raises(BadData):  # refused texts are not kept: the same error every time
        parse("sum(")
