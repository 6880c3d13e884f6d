"""REQ (relative-error quantiles, high ranks accurate) for tail quantile_over_time: observed rank error
within the library's stated bound in >= 99% of windows over random data, honesty (paths + infos),
fallbacks, planner adoption from the query pattern, persistence across a restart."""
from __future__ import annotations

import numpy as np
import pytest

from planner.canary import Canary
from planner.kll_store import rank_error, req_rank_error
from planner.planner import PlannerConfig
from planner.rewrite import RewriteHook
from planner.rewrite_rules import RewriteContext, candidates
from planner.stack import build
from promql.engine import Engine
from promql.query_opts import QueryOpts
from storage.labels import make_labels
from tests.test_planner_fixtures import T0, feed, load, summarized


def _lat_items(seed: int, n_series: int = 4, n: int = 20_000) -> list:
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n_series):
        ts = T0 + np.cumsum(rng.integers(500, 1500, n))
        # heavy-tailed latencies around a large offset (the float32 shift keeps them precise)
        vals = 250.0 + rng.lognormal(0, 1.2, n) * (i + 1)
        items.append((make_labels({"__name__": "lat", "inst": str(i)}), ts, vals))
    return items


@pytest.fixture(scope="module")
def req_world():
    src, batch = load(_lat_items(3))
    tmin, tmax = int(batch.timestamps.min()), int(batch.timestamps.max())
    summ, sdss = summarized(src, batch, [("lat", "req"), ("lat", "kll")], live_from=tmin + (tmax - tmin) // 3)
    by = {s.spec.algorithm: s for s in sdss}
    return src, by, tmin, tmax


def _hook(by, served):
    return RewriteHook(RewriteContext(lambda m, a, ms, func=None: by.get(a) if m == "lat" else None,
                                      lambda s, ctx: served.append((s, ctx)), cost_based=False, approximate=True))


def test_req_rank_error_within_stated_bound(req_world):
    src, by, tmin, tmax = req_world
    served: list = []
    hook, eng, canary = _hook(by, served), Engine(src), Canary(fraction=0.0)
    within = total = 0
    for phi, rng_s, step in [(0.9, 3600, 60), (0.95, 1800, 97), (0.99, 7200, 300), (0.999, 5400, 120), (0.9, 600, 15)]:
        q = f"quantile_over_time({phi}, lat[{rng_s}s])"
        res = eng.range_query(q, tmin + 2 * 3_600_000, tmin + 4 * 3_600_000, step * 1000, QueryOpts(node_hooks=[hook]))
        assert any(p.startswith("summary:req-lat") for p in res.stats.paths), q
        assert any("algorithm req" in i and "rank error <=" in i for i in res.annotations.infos), res.annotations.infos
        rec = canary.check_now(*served[-1])
        assert rec["algorithm"] == "req" and rec["checked"] > 0
        assert rec["rank_bound"] == pytest.approx(req_rank_error(by["req"].store.k, phi))
        within += rec["rank_within_bound"]
        total += rec["rank_checked"]
        assert rec["within_bound"] >= 0.99 * rec["checked"], rec  # the value interval holds Prometheus's answer
    assert within / total >= 0.99, (within, total)
    # the stated tail bound is far tighter than KLL's
    assert req_rank_error(20, 0.99) < rank_error(200) / 20


def test_req_bound_comes_from_the_library():
    from datasketches import req_floats_sketch

    for k, phi in [(12, 0.9), (20, 0.99), (40, 0.999)]:
        one_sd = phi - req_floats_sketch.get_RSE(k, phi, True, 1 << 40)
        assert req_rank_error(k, phi) == pytest.approx(3 * one_sd)
    # estimation-mode bound at phi matches the sketch instance's own 3-sd rank bounds
    sk = req_floats_sketch(20, True)
    sk.update(np.random.default_rng(0).random(200_000).astype(np.float32))
    assert sk.is_estimation_mode()
    assert sk.get_rank_upper_bound(0.95, 3) - 0.95 == pytest.approx(req_rank_error(20, 0.95), rel=1e-6)


def test_low_phi_uses_kll_and_non_literal_phi_runs_raw(req_world):
    src, by, tmin, tmax = req_world
    served: list = []
    hook, eng = _hook(by, served), Engine(src)
    t = tmin + 3 * 3_600_000 + 123
    res = eng.instant_query("quantile_over_time(0.5, lat[1h])", t, QueryOpts(node_hooks=[hook]))
    assert res.stats.paths[0].startswith("summary:kll-lat")
    res = eng.instant_query("quantile_over_time(scalar(vector(0.99)), lat[1h])", t, QueryOpts(node_hooks=[hook]))
    assert res.stats.paths == ["raw"]
    # phi above 1 follows Prometheus (+Inf) from the summary; exact=true-style (no hook) is raw
    res = eng.instant_query("quantile_over_time(0.99, lat[1h])", t)
    assert res.stats.paths == ["raw"]


def test_req_value_is_a_sample_within_float32_rounding(req_world):
    src, by, tmin, tmax = req_world
    hook, eng = _hook(by, []), Engine(src)
    t = tmin + 3 * 3_600_000 + 777
    res = eng.instant_query("quantile_over_time(0.99, lat[10m])", t, QueryOpts(node_hooks=[hook]))
    assert res.stats.paths[0].startswith("summary:req-")
    items = {l: (ts, v) for l, ts, v in _lat_items(3)}
    for lbl, v in zip(res.labels, res.values):
        full = next(val for key, val in items.items() if dict(key)["inst"] == dict(lbl)["inst"])
        w = full[1][(full[0] > t - 600_000) & (full[0] <= t)]
        assert np.min(np.abs(w - v)) <= abs(v - 250.0) * 2.0 ** -22 + 1e-9


def test_candidates_choose_req_for_tail_quantiles():
    cs = candidates("quantile_over_time(0.99, lat[5m]) - quantile_over_time(0.5, lat[5m])")
    assert {(c.algorithm, c.func) for c in cs} == {("req", "quantile_over_time"), ("kll", "quantile_over_time")}
    assert [c.algorithm for c in candidates("quantile_over_time(0.95, lat[5m])", req_min_phi=0.97)] == ["kll"]
    with pytest.raises(ValueError):
        PlannerConfig.from_raw({"req_min_phi": 1.5})


def test_planner_adopts_req_and_it_survives_a_restart(tmp_path):
    items = _lat_items(4, n_series=3, n=12_000)
    src, batch = load(items)
    tmax = int(batch.timestamps.max())
    # step answers off: every refresh here must reach the summary (that is what this test is about)
    cfg = {"background_backfill": False, "seal_delay": "0s", "canary_fraction": 0.0, "step_cache_bytes": 0,
           "measure_first": False}  # served while measured: this test is about the REQ plan's answers
    st = build(src, Engine(src), tmp_path, cfg)
    feed(st.summarizer, batch)
    q = "quantile_over_time(0.99, lat[1h])"
    for _ in range(4):  # approximation off (the default): a recurring quantile panel stays on the raw path
        res = st.engine.range_query(q, tmax - 3 * 3_600_000, tmax, 300_000)
    assert not st.planner.sds and "summary:" not in " ".join(res.stats.paths)
    for _ in range(3):  # the request opts in (approx=true): adopted after the third (default min_count)
        st.engine.range_query(q, tmax - 3 * 3_600_000, tmax, 300_000, QueryOpts(approx=True))
    assert [s.spec.algorithm for s in st.planner.sds.values()] == ["req"]
    plain = st.engine.range_query(q, tmax - 3 * 3_600_000, tmax, 300_000)
    assert "summary:" not in " ".join(plain.stats.paths)  # a sketch never answers a query that did not opt in
    fast = st.engine.range_query(q, tmax - 3 * 3_600_000, tmax, 300_000, QueryOpts(approx=True))
    assert fast.stats.paths[0].startswith("summary:req-lat")
    ex = st.planner.explain(q, approx=True)  # explain decides as the hook does: with the request's policy
    assert ex["subtrees"][0]["path"].startswith("summary:req-") and "REQ" in ex["subtrees"][0]["error_bound"]
    plain_ex = st.planner.explain(q)["subtrees"][0]
    assert plain_ex["path"] == "raw" and plain_ex["why"].startswith("approximation off"), plain_ex
    st.planner.stop()
    st.query_log.close()
    st2 = build(src, Engine(src), tmp_path, cfg)
    try:
        (sds2,) = st2.planner.sds.values()
        assert sds2.spec.algorithm == "req" and sds2.backfill_state == "restored"
        again = st2.engine.range_query(q, tmax - 3 * 3_600_000, tmax, 300_000, QueryOpts(approx=True))
        assert again.stats.paths[0].startswith("summary:req-lat")
        np.testing.assert_array_equal(again.values, fast.values)
        np.testing.assert_array_equal(again.present, fast.present)
    finally:
        st2.planner.stop()
        st2.query_log.close()


def test_quantile_by_over_rates_is_served_exactly_from_per_series_panes():
    """The bench's "quantile by" pattern: per-series rates (exact SDS), then the phi-quantile across
    the series of each group at each step (the engine, on S values). No cross-series sketch is used:
    a sketch of all samples of the group would be a different quantity."""
    from planner.rewrite import RewriteHook
    from tests.test_planner_exact import _compare
    from tests.test_planner_fixtures import random_series

    src, batch = load(random_series(seed=9))
    tmin, tmax = int(batch.timestamps.min()), int(batch.timestamps.max())
    _, (sds,) = summarized(src, batch, [("x_total", "exact")], live_from=tmin + (tmax - tmin) // 2)
    hook = RewriteHook(RewriteContext(lambda m, a, ms, func=None: sds if (m, a) == ("x_total", "exact") else None,
                                      cost_based=False, approximate=True))
    eng = Engine(src)
    for q in ["quantile by (job) (0.9, rate(x_total[1h]))", "quantile(0.5, increase(x_total[30m]))"]:
        raw = eng.range_query(q, tmin + 3_600_000, tmax, 600_000)
        fast = eng.range_query(q, tmin + 3_600_000, tmax, 600_000, QueryOpts(node_hooks=[hook]))
        assert fast.stats.paths[0].startswith("summary:exact-x_total")
        _compare(raw, fast, q)


@pytest.mark.parametrize("interval_s", [5, 15])
def test_value_interval_holds_prometheus_answer_on_noisy_gauges(interval_s):
    """The bound a reader can use: Prometheus's exact quantile_over_time lies inside the stated value
    interval in >= 99% of windows, on log-normal gauges scraped every 5 s / 15 s, phi 0.5 / 0.9 / 0.99,
    from KLL and REQ alike (the canary's check)."""
    rng = np.random.default_rng(interval_s)
    n = 6 * 3600 // interval_s
    items = []
    for i in range(6):
        ts = T0 + np.arange(n) * interval_s * 1000 + i * 137
        items.append((make_labels({"__name__": "lat", "inst": str(i)}), ts, rng.lognormal(-1.0 + 0.2 * i, 0.9, n)))
        # a small-integer gauge (queue length): many ties, where a rank bound alone says little
        items.append((make_labels({"__name__": "lat", "inst": f"q{i}"}), ts, rng.poisson(2.0 + i, n).astype(float)))
    src, batch = load(items)
    tmin, tmax = int(batch.timestamps.min()), int(batch.timestamps.max())
    _, sdss = summarized(src, batch, [("lat", "req"), ("lat", "kll")], live_from=tmin + (tmax - tmin) // 3)
    by = {s.spec.algorithm: s for s in sdss}
    served: list = []
    hook, eng, canary = _hook(by, served), Engine(src), Canary(fraction=0.0)
    within = total = 0
    for phi in (0.5, 0.9, 0.99):
        for rng_s, step in ((600, 60), (3600, 300)):
            q = f"quantile_over_time({phi}, lat[{rng_s}s])"
            res = eng.range_query(q, tmin + 2 * 3_600_000, tmax, step * 1000, QueryOpts(node_hooks=[hook]))
            assert any(p.startswith("summary:") for p in res.stats.paths), q
            rec = canary.check_now(*served[-1])
            within += rec["within_bound"]
            total += rec["checked"]
    assert total > 1000 and within >= 0.99 * total, (within, total)
