"""The rewrite's rules (planner/rewrite_rules.py): one immutable table covering every algorithm, pure
decisions, and ``plan explain`` saying what the hook then does, query by query."""
from __future__ import annotations

import numpy as np

from planner.algorithm_registry import ALGORITHMS
from planner.rewrite_rules import RULES, WHY_APPROX, WHY_MEASURING, WHY_NO_SDS, WHY_SLOWER
from planner.sds import SDSSpec, shape_of
from planner.stack import build
from promql.engine import Engine
from promql.eval_context import EvalContext
from promql.query_guard import parse
from promql.query_opts import QueryOpts
from promql.types import Annotations, QueryStats
from tests.test_planner_fixtures import feed, load, random_series


def _stack(src, raw_cfg=None):
    cfg = {"background_backfill": False, "seal_delay": "0s", "step_cache_bytes": 0, "canary_fraction": 0.0,
           "min_count": 1000}  # no adoption from these queries: the plans are the test's own
    cfg.update(raw_cfg or {})
    return build(src, Engine(src), None, cfg)


def test_one_rule_per_algorithm_in_an_immutable_table():
    assert isinstance(RULES, tuple)
    assert sorted(r.algorithm for r in RULES) == sorted(ALGORITHMS)
    assert len({r.name for r in RULES}) == len(RULES)
    assert {r.node_kind for r in RULES} == {"Call", "AggregateExpr"}
    # REQ is tried before KLL: the same phi from the sketch with the smaller rank error
    names = [r.name for r in RULES]
    assert names.index("req") < names.index("kll")


def _ectx(times, approx=False):
    return EvalContext(step_times=times, query_start_ms=int(times[0]), query_end_ms=int(times[-1]), query_step_ms=0,
                       lookback_delta_ms=300_000, source=None, annotations=Annotations(), stats=QueryStats(),
                       budget=None, extra={"approx": approx})


def test_decisions_are_pure_and_state_why():
    src, batch = load(random_series(seed=21))
    tmax = int(batch.timestamps.max())
    st = _stack(src)
    feed(st.summarizer, batch)
    sds = st.planner.adopt(SDSSpec("x_total", "exact", 60_000), reason="test")
    rctx = st.hook.rctx
    call = parse("rate(x_total[30m])")
    exact_rule = next(r for r in RULES if r.name == "exact")
    times = np.arange(tmax - 3_600_000, tmax + 1, 600_000, dtype=np.int64)
    shape = shape_of("rate", 1_800_000, len(times))
    # a shape of use not measured yet: raw while the summary path is measured beside it
    d = exact_rule.decide(call, _ectx(times), rctx)
    assert not d.served and d.trial and d.why == WHY_MEASURING and d.sds is sds
    for _ in range(sds.stats.SHAPE_MIN_RUNS):  # measured faster than raw: served from then on
        sds.stats.record(shape, 0.001, 0.001, 0.010, 0.010)
    before = (sds.stats.hits, dict(sds.stats.shape_hits), sds.stats.shadow_runs, sds.store.epoch)
    d1 = exact_rule.decide(call, _ectx(times), rctx)
    d2 = exact_rule.decide(call, _ectx(times), rctx)
    assert d1.served and d2.served and d1.sds is d2.sds is sds and np.array_equal(d1.ends, d2.ends)
    assert (sds.stats.hits, dict(sds.stats.shape_hits), sds.stats.shadow_runs, sds.store.epoch) == before
    # not its shape: no decision at all; a quantile without approximation: raw, saying why
    assert exact_rule.decide(parse("quantile_over_time(0.5, g[30m])"), _ectx(times), rctx) is None
    kll = next(r for r in RULES if r.name == "kll")
    d = kll.decide(parse("quantile_over_time(0.5, g[30m])"), _ectx(times), rctx)
    assert not d.served and d.why == WHY_APPROX
    d = kll.decide(parse("quantile_over_time(0.5, g[30m])"), _ectx(times, approx=True), rctx)
    assert not d.served and d.why == WHY_NO_SDS
    # a shape the shadow runs measured slower stays raw, for that shape only
    sds.stats.shapes.clear()
    for _ in range(sds.stats.SHAPE_MIN_RUNS):
        sds.stats.record(shape, 0.010, 0.010, 0.001, 0.001)
    d = exact_rule.decide(call, _ectx(times), rctx)
    assert not d.served and d.why == WHY_SLOWER and not d.trial
    other = np.arange(tmax - 3_600_000, tmax + 1, 300_000, dtype=np.int64)  # another steps bucket: its own verdict
    if shape_of("rate", 1_800_000, len(other)) != shape:
        assert exact_rule.decide(call, _ectx(other), rctx).why == WHY_MEASURING


def test_explain_says_what_the_hook_does():
    src, batch = load(random_series(seed=22))
    tmax = int(batch.timestamps.max())
    # served while measured: a measuring run finishing between explain and the query would change the
    # answer under the test (test_planner_measure_first covers explain while measuring)
    st = _stack(src, {"group_min_series": 1, "measure_first": False})
    feed(st.summarizer, batch)
    st.planner.adopt(SDSSpec("x_total", "exact", 60_000), reason="test")
    st.planner.adopt(SDSSpec("g", "exact", 60_000), reason="test")
    st.planner.adopt(SDSSpec("g", "kll", 60_000), reason="test")
    queries = ["sum(rate(x_total[30m]))", "sum by (job) (increase(x_total[1h]))", "avg_over_time(g[10m])",
               "max_over_time(g[1h])", "quantile_over_time(0.5, g[1h])", "rate(h_bucket[5m])",
               "sum(rate(x_total[30m])) / sum(count_over_time(g[1h]))"]
    grids = [(tmax - 3_600_000, tmax, 600_000), (tmax - 3_600_000, tmax, 15_000), (tmax - 7_200_000, tmax, 300_000)]
    seen = {"served": 0, "raw": 0}
    for q in queries:
        for approx in (False, True):
            for start, end, step in grids:
                ex = st.planner.explain(q, start, end, step, approx=approx)
                served = sorted(s["path"] for s in ex["subtrees"] if s["path"].startswith("summary:"))
                res = st.engine.range_query(q, start, end, step, QueryOpts(approx=approx))
                used = sorted(p for p in res.stats.paths if p.startswith("summary:"))
                assert served == used, (q, approx, step, ex["subtrees"], res.stats.paths)
                seen["served" if used else "raw"] += 1
    assert seen["served"] >= 10 and seen["raw"] >= 5, seen  # both outcomes, each agreed on
    # the quantile needs approximation; explain says so instead of naming the plan
    (item,) = st.planner.explain("quantile_over_time(0.5, g[1h])", tmax - 3_600_000, tmax, 600_000)["subtrees"]
    assert item["path"] == "raw" and item["why"] == WHY_APPROX
    (item,) = st.planner.explain("quantile_over_time(0.5, g[1h])", tmax - 3_600_000, tmax, 600_000, approx=True)["subtrees"]
    assert item["path"].startswith("summary:kll-g") and item["algorithm"] == "kll"


def test_every_store_answers_the_whole_pane_store_protocol_and_survives_a_restart(tmp_path):
    """Persistence and the SDS runtime call the same methods on every algorithm's store (no probing
    which store it is): per-series shifts, store metadata, series assignment, the restored chain."""
    src, batch = load(random_series(seed=23, n_series=4, n=400))
    cfg = {"background_backfill": False, "seal_delay": "0s", "canary_fraction": 0.0, "min_count": 1000}
    st = build(src, Engine(src), tmp_path, cfg)
    feed(st.summarizer, batch)
    made = {}
    for alg in ALGORITHMS:
        spec = SDSSpec("g", alg, 60_000, grouping=("job",) if ALGORITHMS[alg].scope == "fixed" else ())
        sds = st.planner.adopt(spec, reason="test")
        n = len(sds.registry.labels)
        made[sds.id] = (list(sds.registry.labels), sds.store.series_shift()[:n].copy(), sds.store.export_meta(),
                        sds.coverage())
    assert len(made) == len(ALGORITHMS)
    st.planner.stop()
    st.query_log.close()
    st2 = build(src, Engine(src), tmp_path, cfg)
    try:
        restored = {s.id: s for s in st2.planner.sds.values()}
        assert set(restored) == set(made)
        for sds_id, (labels, shift, meta, cov) in made.items():
            b = restored[sds_id]
            assert b.registry.labels == labels
            np.testing.assert_array_equal(b.store.series_shift()[: len(labels)], shift)
            assert b.store.export_meta() == meta
            assert b.coverage()[0] == cov[0] and b.store.nbytes() > 0
    finally:
        st2.planner.stop()
        st2.query_log.close()


def test_queries_without_a_plan_for_their_candidates_skip_the_rules():
    """Queries no summary can serve pay no rule checks per node: the hook is attached only when some
    candidate sub-tree's metric has a plan."""
    src, batch = load(random_series(seed=24))
    tmax = int(batch.timestamps.max())
    st = _stack(src, {"measure_first": False})
    feed(st.summarizer, batch)
    calls = []
    real = st.engine.hook

    def counting(node, ectx):
        calls.append(type(node).__name__)
        return real(node, ectx)

    st.engine.hook = counting
    for q in ("sum(rate(x_total[30m]))", "vector(1)", "histogram_quantile(0.9, sum by (le) (rate(h_bucket[5m])))"):
        st.engine.range_query(q, tmax - 3_600_000, tmax, 600_000)
    assert calls == []
    st.planner.adopt(SDSSpec("x_total", "exact", 60_000), reason="test")
    res = st.engine.range_query("sum(rate(x_total[30m]))", tmax - 3_600_000, tmax, 600_000)
    assert "Call" in calls and res.stats.paths[0].startswith("summary:exact-x_total")
    calls.clear()
    st.engine.range_query("rate(h_bucket[5m])", tmax - 3_600_000, tmax, 600_000)  # no plan for h_bucket
    assert calls == []
