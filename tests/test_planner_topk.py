"""Frequent-items top-k (algorithm ``fi``): ``topk(k, sum by (L) (count_over_time(x[w])))`` served from
per-pane frequent-items sketches only when every step's top-k set is provable; then it equals raw
evaluation (exact counts while every item is tracked; within the offset after evictions); otherwise
the query runs raw. Adoption above ``fi_min_series`` and restart."""
from __future__ import annotations

import numpy as np
import pytest

from planner.canary import Canary
from planner.rewrite import RewriteHook
from planner.rewrite_rules import RewriteContext
from planner.sds import SDS, SDSSpec
from planner.stack import build
from promql.engine import Engine
from promql.query_opts import QueryOpts
from storage.labels import make_labels
from tests.test_planner_exact import _compare
from tests.test_planner_fixtures import SMALL_DATA_PRIOR_S, T0, feed, load, summarized

HOURS = 4


def _tenant_items(seed: int, heavy: tuple[int, ...] = (40, 28, 17, 9), light: int = 120,
                  interval_ms: int = 30_000) -> list:
    """Series per tenant: a few heavy tenants (distinct sizes) and many light ones; samples every
    ``interval_ms`` with random gaps, so per-tenant sample counts differ from window to window."""
    rng = np.random.default_rng(seed)
    items = []
    sizes = list(heavy) + [1] * light
    for t, n in enumerate(sizes):
        for i in range(n):
            ts = T0 + np.arange(0, HOURS * 3_600_000, interval_ms) + int(rng.integers(0, interval_ms))
            ts = ts[rng.random(len(ts)) < 0.9]
            items.append((make_labels({"__name__": "reqs", "tenant": f"t{t}", "pod": f"p{t}-{i}"}), ts,
                          rng.random(len(ts))))
    return items


def _world(lg_max: int, seed: int = 3):
    src, batch = load(_tenant_items(seed))
    summ, _ = summarized(src, batch, [], live_from=T0 + HOURS * 3_600_000 // 2)
    sds = SDS(SDSSpec("reqs", "fi", 60_000, grouping=("tenant",), params=(("lg_max", lg_max),)))
    sds.seal_delay_ms = 0
    summ.start_live(sds, live_from_ts=T0 + HOURS * 3_600_000 // 2)
    feed(summ, batch)
    summ.backfill(sds, 30 * 86_400_000)
    served: list = []

    def find(metric, matchers, items, algorithm="group"):
        return sds if algorithm == "fi" and tuple(items) == ("tenant",) and not [m for m in matchers if m.name != "__name__"] else None

    hook = RewriteHook(RewriteContext(lambda m, a, ms, func=None: None, lambda s, c: served.append((s, c)), cost_based=False, approximate=True, find_group=find))
    return src, sds, hook, served


@pytest.mark.parametrize("q", ["topk(3, sum by (tenant) (count_over_time(reqs[1h])))",
                               "topk(1, sum by (tenant) (count_over_time(reqs[20m])))",
                               "topk(200, sum by (tenant) (count_over_time(reqs[15m])))"])
def test_tracked_items_give_exact_topk(q):
    src, sds, hook, served = _world(lg_max=10)
    eng = Engine(src)
    raw = eng.range_query(q, T0 + 3_600_000, T0 + HOURS * 3_600_000, 300_000)
    fast = eng.range_query(q, T0 + 3_600_000, T0 + HOURS * 3_600_000, 300_000, QueryOpts(node_hooks=[hook]))
    assert fast.stats.paths[0].startswith("summary:fi-reqs"), fast.stats.paths
    assert any("algorithm fi" in i and "top-k set proven" in i for i in fast.annotations.infos)
    _compare(raw, fast, q)
    rec = Canary(fraction=0.0).check_now(*served[-1])
    assert rec["algorithm"] == "fi" and rec["max_error"] == 0.0


def test_after_evictions_served_only_when_provable():
    """lg_max=5 (24 tracked items of 124 tenants, so the sketch evicts): the heavy tenants' top-2 stays
    provable and equals raw as a set, values within epsilon x the window's samples; top-12 reaches into
    the evicted light tenants, is not provable and runs raw."""
    from planner.topk_store import epsilon_for

    src, sds, hook, served = _world(lg_max=5)
    eng = Engine(src)
    args = (T0 + 3_600_000, T0 + HOURS * 3_600_000, 600_000)
    q = "topk(2, sum by (tenant) (count_over_time(reqs[1h])))"
    raw = eng.range_query(q, *args)
    fast = eng.range_query(q, *args, QueryOpts(node_hooks=[hook]))
    assert fast.stats.paths[0].startswith("summary:fi-reqs")
    total = eng.range_query("sum(count_over_time(reqs[1h]))", *args).values[0]
    rl = {l: i for i, l in enumerate(raw.labels)}
    assert sorted(rl) == sorted(fast.labels)
    for j, l in enumerate(fast.labels):
        p = fast.present[j]
        assert (raw.present[rl[l]] == p).all()
        assert (np.abs(fast.values[j][p] - raw.values[rl[l]][p]) <= epsilon_for(5) * total[p]).all()
    q12 = "topk(12, sum by (tenant) (count_over_time(reqs[1h])))"
    res = eng.range_query(q12, *args, QueryOpts(node_hooks=[hook]))
    assert res.stats.paths == ["raw"]
    _compare(eng.range_query(q12, *args), res, q12)


@pytest.mark.parametrize("q", [
    "topk(3, sum by (tenant) (increase(reqs[1h])))",  # per-series extrapolation: not a per-pane weight
    "topk(3, sum by (tenant) (sum_over_time(reqs[1h])))",  # weights could be negative / non-integer
    "bottomk(3, sum by (tenant) (count_over_time(reqs[1h])))",
    "topk(3, sum by (pod) (count_over_time(reqs[1h])))",  # no SDS for these labels
])
def test_other_shapes_run_raw(q):
    src, sds, hook, served = _world(lg_max=10)
    eng = Engine(src)
    fast = eng.instant_query(q, T0 + 3 * 3_600_000, QueryOpts(node_hooks=[hook]))
    assert fast.stats.paths == ["raw"]


def test_planner_adopts_fi_above_threshold_and_restores(tmp_path):
    # 10 s samples: the raw path's cost clearly above the sketch's, whatever the machine's load
    src, batch = load(_tenant_items(5, interval_ms=10_000))
    tmax = T0 + HOURS * 3_600_000
    q = "topk(3, sum by (tenant) (count_over_time(reqs[1h])))"
    # step answers off: each refresh here must reach the summaries this test is about
    cfg = {"background_backfill": False, "seal_delay": "0s", "canary_fraction": 0.0, "summary_cost_prior": SMALL_DATA_PRIOR_S, "fi_min_series": 100,
           "approximate": True, "step_cache_bytes": 0, "measure_first": False}  # served while measured
    st = build(src, Engine(src), tmp_path, cfg)
    feed(st.summarizer, batch)
    for _ in range(3):
        st.engine.range_query(q, tmax - 2 * 3_600_000, tmax, 600_000)
    # fi, and the inner aggregate's own SDS (per-series exact at this size) for steps fi cannot prove
    assert sorted(s.spec.algorithm for s in st.planner.sds.values()) == ["exact", "fi"]
    fast = st.engine.range_query(q, tmax - 2 * 3_600_000, tmax, 600_000)
    assert fast.stats.paths[0].startswith("summary:fi-reqs")
    _compare(st.engine.range_query(q, tmax - 2 * 3_600_000, tmax, 600_000, QueryOpts(exact=True)), fast, q)
    st.planner.stop()
    st.query_log.close()
    st2 = build(src, Engine(src), tmp_path, cfg)
    try:
        again = st2.engine.range_query(q, tmax - 2 * 3_600_000, tmax, 600_000)
        assert again.stats.paths[0].startswith("summary:fi-reqs")
        _compare(fast, again, q)
    finally:
        st2.planner.stop()
        st2.query_log.close()


def test_explain_names_the_aggregate_paths():
    # 10 s samples: the raw path's cost clearly above the sketch's, whatever the machine's load
    src, batch = load(_tenant_items(6, interval_ms=10_000))
    tmax = T0 + HOURS * 3_600_000
    st = build(src, Engine(src), None, {"background_backfill": False, "seal_delay": "0s", "summary_cost_prior": SMALL_DATA_PRIOR_S, "fi_min_series": 10,
                                        "group_min_series": 10, "approximate": True, "measure_first": False,
                                        "step_cache_bytes": 0})  # every refresh reaches the summaries
    feed(st.summarizer, batch)
    q = "topk(3, sum by (tenant) (count_over_time(reqs[1h])))"
    for _ in range(3):
        st.engine.range_query(q, tmax - 7_200_000, tmax, 600_000)
    paths = [(s["algorithm"], s["path"]) for s in st.planner.explain(q, tmax - 7_200_000, tmax, 600_000)["subtrees"]]
    assert [a for a, _ in paths] == ["fi", "group", "exact"]
    assert paths[0][1].startswith("summary:fi-") and paths[1][1].startswith("summary:group-")
    assert paths[2][1].startswith("inside summary:group-")
