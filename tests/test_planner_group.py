"""Cross-series group panes (algorithm ``group``): ``sum/max/min by (L) (sum/count/max/min_over_time)``
served from one payload per group per pane equal raw evaluation (1e-9) for random data, ranges, steps,
offsets and late samples; other shapes fall back; the planner adopts a group SDS from the pattern and
restores it after a restart; the canary re-evaluates the whole aggregate on raw data."""
from __future__ import annotations

import numpy as np
import pytest

from planner.canary import Canary
from planner.rewrite import RewriteHook
from planner.rewrite_rules import RewriteContext
from planner.sds import SDS, SDSSpec
from planner.stack import build
from planner.summarizer import Summarizer
from promql.engine import Engine
from promql.query_opts import QueryOpts
from storage.batch import SampleBatch
from tests.test_planner_exact import _compare
from tests.test_planner_fixtures import SMALL_DATA_PRIOR_S, feed, load, random_series

QUERIES = [
    "sum by (job) (sum_over_time(g[{r}]))", "sum(count_over_time(g[{r}]))", "max by (job) (max_over_time(g[{r}]))",
    "min(min_over_time(g[{r}] offset 7m))", "sum by (job) (count_over_time(x_total[{r}]))",
    "sum by (job, inst) (sum_over_time(x_total[{r}]))", "sum(sum_over_time(x_total[{r}]))",
]


@pytest.fixture(scope="module")
def group_world():
    items = random_series(seed=41)
    _, full = load(items)
    tmin, tmax = int(full.timestamps.min()), int(full.timestamps.max())
    live_from = tmin + (tmax - tmin) // 2 + 4_321
    rng = np.random.default_rng(42)
    held = (rng.random(len(full)) < 0.03) & (full.timestamps >= live_from - 2 * 3_600_000)
    keep = ~held
    on_time = SampleBatch(full.series, full.series_index[keep], full.timestamps[keep], full.values[keep])
    late = SampleBatch(full.series, full.series_index[held], full.timestamps[held], full.values[held])
    src, _ = load([])
    src.append(on_time)
    summ = Summarizer(src)
    sdss = [SDS(SDSSpec("g", "group", 60_000, grouping=("job",))),
            SDS(SDSSpec("x_total", "group", 60_000, grouping=("inst", "job")))]
    for s in sdss:
        s.seal_delay_ms = 0
        summ.start_live(s, live_from_ts=live_from)
    feed(summ, on_time)
    for s in sdss:
        summ.backfill(s, 30 * 86_400_000)
    src.append(late)  # late samples (stored first, as the pipeline does), in shuffled chunks
    perm = rng.permutation(len(late))
    for ch in np.array_split(perm, 5):
        summ.consume(SampleBatch(late.series, late.series_index[ch], late.timestamps[ch], late.values[ch]))

    def find_group(metric, matchers, by, algorithm):
        have = {(m.name, m.op, m.value) for m in matchers if m.name != "__name__"}
        for s in sdss:
            if s.metric == metric and set(s.spec.matchers) == have and set(by) <= set(s.spec.grouping):
                return s
        return None

    served: list = []
    hook = RewriteHook(RewriteContext(lambda m, a, ms, func=None: None, lambda s, c: served.append((s, c)), cost_based=False,
                                      find_group=find_group))
    return src, sdss, hook, served, tmin, tmax, live_from


@pytest.mark.parametrize("qi", range(len(QUERIES)))
def test_group_panes_equal_raw(group_world, qi):
    src, sdss, hook, served, tmin, tmax, live_from = group_world
    eng = Engine(src)
    rng = np.random.default_rng(500 + qi)
    n_served = 0
    for _ in range(5):
        r_ms = int(rng.choice([300_000, 1_000_000 + int(rng.integers(0, 999)), 3_600_000, 4 * 3_600_000]))
        step = int(rng.choice([60_000, 137_000, 600_000]))
        start = int(rng.integers(tmin + 600_000, tmax - 3_600_000))
        end = min(start + step * int(rng.integers(1, 90)), tmax + 600_000)
        q = QUERIES[qi].format(r=f"{r_ms // 1000}s")
        raw = eng.range_query(q, start, end, step)
        fast = eng.range_query(q, start, end, step, QueryOpts(node_hooks=[hook]))
        _compare(raw, fast, q)
        if any(p.startswith("summary:group-") for p in fast.stats.paths):
            n_served += 1
            assert any("algorithm group" in i for i in fast.annotations.infos)
    assert n_served >= 3
    assert sum(s.stats.late_folded for s in sdss) > 0 and all(s.stats.late_dropped == 0 for s in sdss)


@pytest.mark.parametrize("q", [
    "sum by (inst) (sum_over_time(g[1h]))",  # inst is not in the g SDS's grouping
    'sum by (job) (sum_over_time(g{job="j1"}[1h]))',  # scope differs: a group payload cannot drop series
    "sum without (inst) (sum_over_time(g[1h]))",
    "sum by (job) (rate(x_total[1h]))",  # per-series extrapolation: not a function of merged panes
    "avg by (job) (avg_over_time(g[1h]))",
    "max by (job) (sum_over_time(g[1h]))",
])
def test_other_shapes_fall_back_to_raw(group_world, q):
    src, sdss, hook, served, tmin, tmax, live_from = group_world
    eng = Engine(src)
    t = tmin + (tmax - tmin) * 3 // 4 + 999
    fast = eng.instant_query(q, t, QueryOpts(node_hooks=[hook]))
    assert fast.stats.paths == ["raw"], q
    _compare(eng.instant_query(q, t), fast, q)


def test_canary_reevaluates_the_aggregate(group_world):
    src, sdss, hook, served, tmin, tmax, live_from = group_world
    eng = Engine(src)
    served.clear()
    eng.range_query("sum by (job) (sum_over_time(g[2h]))", live_from - 3_600_000, tmax, 300_000, QueryOpts(node_hooks=[hook]))
    rec = Canary(fraction=0.0).check_now(*served[-1])
    assert rec["algorithm"] == "group" and rec["max_error"] <= 1e-9 and rec["checked"] == 1


def test_few_series_keep_shared_per_series_panes():
    """Below group_min_series (default 1000) the pattern adopts the metric's per-series exact SDS,
    which serves it exactly and is shared with every other pattern on the metric."""
    src, batch = load(random_series(seed=44))
    tmax = int(batch.timestamps.max())
    st = build(src, Engine(src), None, {"background_backfill": False, "seal_delay": "0s", "canary_fraction": 0.0, "summary_cost_prior": SMALL_DATA_PRIOR_S,
                                        "measure_first": False,
                                        "step_cache_bytes": 0})  # every refresh reaches the summaries
    feed(st.summarizer, batch)
    q = "sum by (job) (sum_over_time(g[1h]))"
    for _ in range(3):
        st.engine.range_query(q, tmax - 3 * 3_600_000, tmax, 600_000)
    assert [s.spec.algorithm for s in st.planner.sds.values()] == ["exact"]
    assert st.engine.range_query(q, tmax - 3 * 3_600_000, tmax, 600_000).stats.paths[0].startswith("summary:exact-g")
    assert "group_min_series" in st.planner.keys[next(k for k in st.planner.keys if k[1].startswith("group"))].last_decision


def test_planner_adopts_group_sds_and_restores_it(tmp_path):
    src, batch = load(random_series(seed=43))
    tmax = int(batch.timestamps.max())
    cfg = {"background_backfill": False, "seal_delay": "0s", "canary_fraction": 0.0, "summary_cost_prior": SMALL_DATA_PRIOR_S, "group_min_series": 4,
           "measure_first": False,
           "step_cache_bytes": 0}  # every refresh reaches the summaries
    st = build(src, Engine(src), tmp_path, cfg)
    feed(st.summarizer, batch)
    q = "sum by (job) (sum_over_time(g[1h]))"
    for _ in range(3):
        assert st.engine.range_query(q, tmax - 3 * 3_600_000, tmax, 600_000).stats.paths == ["raw"]
    (sds,) = st.planner.sds.values()
    assert sds.spec.algorithm == "group" and sds.spec.grouping == ("job",) and sds.spec.matchers == ()
    fast = st.engine.range_query(q, tmax - 3 * 3_600_000, tmax, 600_000)
    assert fast.stats.paths[0].startswith("summary:group-g")
    _compare(st.engine.range_query(q, tmax - 3 * 3_600_000, tmax, 600_000, QueryOpts(exact=True)), fast, q)
    # the same SDS serves the coarser grouping and other range/step; explain names it
    q2 = "sum(sum_over_time(g[45m]))"
    f2 = st.engine.range_query(q2, tmax - 3 * 3_600_000, tmax, 300_000)
    assert f2.stats.paths[0].startswith("summary:group-g")
    assert st.planner.explain(q2)["subtrees"][0]["path"].startswith("summary:group-")
    assert len(st.planner.sds) == 1
    st.planner.stop()
    st.query_log.close()
    st2 = build(src, Engine(src), tmp_path, cfg)
    try:
        (sds2,) = st2.planner.sds.values()
        assert sds2.id == sds.id and sds2.backfill_state == "restored"
        again = st2.engine.range_query(q, tmax - 3 * 3_600_000, tmax, 600_000)
        assert again.stats.paths[0].startswith("summary:group-g")
        _compare(fast, again, q)
    finally:
        st2.planner.stop()
        st2.query_log.close()


def test_topk_over_group_sums_is_exact(group_world):
    """topk(k, sum by (L) (sum_over_time(...))): the inner aggregate from group panes (exact), topk by
    the engine on top: no frequent-items approximation is needed for this shape."""
    src, sdss, hook, served, tmin, tmax, live_from = group_world
    eng = Engine(src)
    q = "topk(2, sum by (inst, job) (sum_over_time(x_total[2h])))"
    raw = eng.range_query(q, live_from - 3_600_000, tmax, 600_000)
    fast = eng.range_query(q, live_from - 3_600_000, tmax, 600_000, QueryOpts(node_hooks=[hook]))
    assert fast.stats.paths[0].startswith("summary:group-x_total")
    _compare(raw, fast, q)


def test_refresh_reuses_sealed_steps_and_late_samples_invalidate():
    items = random_series(seed=45, n_series=4, n=1200)
    _, full = load(items)
    tmin, tmax = int(full.timestamps.min()), int(full.timestamps.max())
    live_from = tmin + (tmax - tmin) // 3
    held = (np.random.default_rng(46).random(len(full)) < 0.05) & (full.timestamps >= live_from)
    on_time = SampleBatch(full.series, full.series_index[~held], full.timestamps[~held], full.values[~held])
    late = SampleBatch(full.series, full.series_index[held], full.timestamps[held], full.values[held])
    src, _ = load([])
    src.append(on_time)
    summ = Summarizer(src)
    sds = SDS(SDSSpec("g", "group", 60_000, grouping=("job",)))
    sds.seal_delay_ms = 0
    summ.start_live(sds, live_from_ts=live_from)
    feed(summ, on_time)
    summ.backfill(sds, 30 * 86_400_000)
    served: list = []
    hook = RewriteHook(RewriteContext(lambda m, a, ms, func=None: None, lambda s, c: served.append(s), cost_based=False, find_group=lambda m, ms, by, al: sds if al == "group" else None))
    eng = Engine(src)
    q = "sum by (job) (sum_over_time(g[1h]))"
    args = (live_from + 3_600_000, tmax, 300_000)
    first = eng.range_query(q, *args, QueryOpts(node_hooks=[hook]))
    again = eng.range_query(q, *args, QueryOpts(node_hooks=[hook]))
    assert served[-2].scan.info["cached_steps"] == 0 and served[-1].scan.info["cached_steps"] > 0
    _compare(first, again, q)
    src.append(late)
    summ.consume(late)
    after = eng.range_query(q, *args, QueryOpts(node_hooks=[hook]))
    assert served[-1].scan.info["cached_steps"] == 0  # the late samples bumped the store's epoch
    _compare(eng.range_query(q, *args), after, q)
