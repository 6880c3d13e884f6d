"""Planner behaviour: adoption after recurrence with default configuration, sharing one SDS across
ranges/steps/groupings/quantiles, exact=true and uncovered queries on raw, retirement, budget,
pinned plans, normalization, and restart recovery of open panes from raw data."""
from __future__ import annotations

import time

import numpy as np
import pytest

from planner.normalize import normalize
from planner.rewrite_rules import candidates
from planner.persist import SDSPersistence
from planner.planner import PlannerConfig
from planner.query_log import QueryLog
from planner.sds import SDS, SDSSpec
from planner.stack import build
from promql.engine import Engine
from promql.query_opts import QueryOpts
from storage.batch import SampleBatch
from tests.test_planner_fixtures import SMALL_DATA_PRIOR_S, feed, load, random_series


def _stack(src, raw_cfg=None, data_dir=None):
    # refreshes reach the summaries (no step answers); the prior these small data sets need (SMALL_DATA_PRIOR_S)
    cfg = {"background_backfill": False, "seal_delay": "0s", "step_cache_bytes": 0, "summary_cost_prior": SMALL_DATA_PRIOR_S}
    cfg.update(raw_cfg or {})
    return build(src, Engine(src), data_dir, cfg)


def test_normalize_abstracts_time_range_quantile_grouping():
    a = normalize('histogram_quantile(0.9, sum by (le) (rate(h_bucket{job="a"}[5m])))')
    b = normalize('histogram_quantile(0.99, sum by (le, inst) (rate(h_bucket{job="a"}[1h])))')
    c = normalize('histogram_quantile(0.9, sum by (le) (rate(h_bucket{job="b"}[5m])))')
    assert a == b and a != c
    assert normalize("quantile_over_time(0.5, g[10m] offset 5m)") == normalize("quantile_over_time(0.9, g[1h] offset 1h)")
    cs = candidates("sum(rate(x_total[5m])) / sum(count_over_time(g[1h]))")
    # sum of per-series rates: per-series panes (extrapolation is per series); sum of count_over_time:
    # a cross-series group SDS (planner/group_store.py; chosen at high cardinality) or per-series panes
    assert {(c.metric, c.algorithm, c.func) for c in cs} == {
        ("x_total", "exact", "rate"), ("g", "group", "count_over_time"), ("g", "exact", "count_over_time")}


def test_adopts_after_recurrence_with_defaults_and_shares_one_sds():
    items = random_series(seed=3)
    src, batch = load(items)
    tmin, tmax = int(batch.timestamps.min()), int(batch.timestamps.max())
    # default min_count (3) and period (10m); served while measured (measure_first has its own test)
    st = _stack(src, {"measure_first": False})
    assert st.config.min_count == 3 and st.config.period_ms == 600_000
    feed(st.summarizer, batch)
    eng = st.engine
    q = "sum by (job) (rate(x_total[30m]))"
    for i in range(2):
        r = eng.range_query(q, tmax - 3_600_000, tmax, 600_000)
        assert r.stats.paths == ["raw"]
    assert not st.planner.sds
    eng.range_query(q, tmax - 3_600_000, tmax, 600_000)  # third recurrence: adopt + backfill
    assert list(st.planner.sds) and next(iter(st.planner.sds.values())).metric == "x_total"
    # now served; and queries differing in range/step/grouping/matchers share the one SDS
    for q2, step in [(q, 600_000), ("sum(increase(x_total[2h]))", 300_000), ('rate(x_total{job="j1"}[45m])', 0)]:
        if step:
            fast = eng.range_query(q2, tmax - 3_600_000, tmax, step)
            raw = eng.range_query(q2, tmax - 3_600_000, tmax, step, QueryOpts(exact=True))
            fv, rv = fast.values[fast.present], raw.values[raw.present]
        else:  # an alert/rule-style instant evaluation
            fast = eng.instant_query(q2, tmax - 1234)
            raw = eng.instant_query(q2, tmax - 1234, QueryOpts(exact=True))
            fv, rv = fast.values, raw.values
        assert fast.stats.paths[0].startswith("summary:exact-x_total"), q2
        assert raw.stats.paths == ["raw"]
        np.testing.assert_allclose(fv, rv, rtol=1e-9)
    # a step finer than the pane would re-read nearly all raw samples: the cost check keeps it raw
    fine = eng.range_query(q, tmax - 3_600_000, tmax, 15_000)
    assert fine.stats.paths == ["raw"]
    assert len(st.planner.sds) == 1
    st.query_log.flush()
    rows = st.query_log.sql("SELECT count(*), count(DISTINCT pattern), sum(CASE WHEN exact THEN 1 ELSE 0 END) FROM query_log")
    assert rows[0][0] == 10 and rows[0][2] == 3
    ex = st.planner.explain("quantile_over_time(0.9, g[1h])")
    assert ex["subtrees"][0]["path"] == "raw"


def test_uncovered_and_exact_queries_run_raw_and_one_offs_are_not_adopted():
    items = random_series(seed=4)
    src, batch = load(items)
    tmax = int(batch.timestamps.max())
    st = _stack(src)
    feed(st.summarizer, batch)
    for q in ["avg_over_time(g[5m])", "max_over_time(g[1h])", "rate(x_total[5m])"]:  # different keys, once each...
        st.engine.instant_query(q, tmax)
    assert not any(s.metric == "x_total" for s in st.planner.sds.values())
    st.planner.adopt(SDSSpec("g", "exact", 60_000), reason="test")
    r = st.engine.instant_query("max_over_time(g[1h])", tmax, QueryOpts(exact=True))
    assert r.stats.paths == ["raw"] and not r.annotations.infos


def test_retire_unused_and_budget_and_pinned():
    items = random_series(seed=5)
    src, batch = load(items)
    st = _stack(src, {"pinned": [{"metric": "g", "algorithm": "kll"}], "retire_after": "1ms"})
    feed(st.summarizer, batch)
    assert any(s.pinned and s.spec.algorithm == "kll" for s in st.planner.sds.values())
    st.planner.adopt(SDSSpec("x_total", "exact", 60_000), reason="test")
    import time

    time.sleep(0.01)
    st.planner.maintain()
    ids = [s.id for s in st.planner.sds.values()]
    assert len(ids) == 1 and st.planner.sds[ids[0]].pinned, "unpinned plan without hits is retired, pinned kept"
    st.planner.config.retire_after_ms = 10**9
    st.planner.config.budget_bytes = 1
    st.planner.adopt(SDSSpec("x_total", "exact", 60_000), reason="test")
    st.planner.maintain()
    assert all(s.pinned for s in st.planner.sds.values()), "over budget: unpinned plans go first"


def test_a_refused_candidate_is_estimated_again_after_a_second_or_a_quarter_more_arrivals(monkeypatch):
    """An estimate costs ~0.3 ms; a pattern queried many times a second paid it per query. Refused on
    cost, a candidate is estimated again once its arrivals have grown by a quarter (a pattern that has
    just started to recur gains rate with each one) or a second later, not at every arrival."""
    from planner import cost_model
    from planner.planner import Planner

    calls = []
    real = cost_model.estimate

    def counted(**kw):
        calls.append(kw["queries"])
        return real(**kw)

    monkeypatch.setattr(cost_model, "estimate", counted)
    monkeypatch.setattr(Planner, "RECONSIDER_S", 0.5)
    src, batch = load(random_series(seed=3))
    tmax = int(batch.timestamps.max())
    st = _stack(src, {"summary_cost_prior": 10.0})  # every estimate refuses: no clear saving
    q = "sum by (job) (rate(x_total[30m]))"
    t0 = time.time()
    n = 40
    for _ in range(n):
        st.engine.range_query(q, tmax - 3_600_000, tmax, 600_000)
    fast = time.time() - t0 < Planner.RECONSIDER_S
    assert not st.planner.sds
    (cand,) = [c for c in st.planner.candidates_report() if c["metric"] == "x_total"]
    assert "no clear saving" in cand["last_decision"]
    # estimated at the arrivals 3, 4, 5, 7, 9, 12, 15, 19, 24, 30, 38 (each a quarter more than the last)
    if fast:  # (a slow machine may pass the second between arrivals: then it re-estimates sooner)
        assert len(calls) == 11, calls
    assert 3 <= len(calls) <= n // 2, calls
    before = len(calls)
    time.sleep(Planner.RECONSIDER_S)
    st.engine.range_query(q, tmax - 3_600_000, tmax, 600_000)
    assert len(calls) == before + 1  # a second (here half) later: estimated again
    st.query_log.close()


def test_cost_model_refuses_when_ingest_cost_exceeds_saving():
    from planner import cost_model

    est = cost_model.estimate(algorithm="exact", queries=3, period_s=600, raw_cpu_per_query=0.01, range_ms=300_000,
                              windows_per_query=60, series=10, ingest_samples_per_s=1e6, pane_ms=60_000,
                              history_ms=86_400_000, budget_left_bytes=1 << 30)
    assert not est.pays and "no saving" in est.reason
    est = cost_model.estimate(algorithm="exact", queries=30, period_s=600, raw_cpu_per_query=0.5, range_ms=86_400_000,
                              windows_per_query=60, series=10, ingest_samples_per_s=100, pane_ms=60_000,
                              history_ms=86_400_000, budget_left_bytes=1 << 30)
    assert est.pays


def test_the_default_prior_does_not_adopt_small_patterns_on_a_guess():
    """`make demo`'s first minute, before any plan was measured: its 8-series counter panels (rate over
    [1m], ~3.6 ms raw per query, one refresh per 10 s) were adopted on a 0.5 ms prior for the summary
    path and then measured no faster (a served query cost 1.9-2.5 ms); with the default prior they are
    not adopted, while the TTFT histogram panels (184 series, ~11 ms raw, 0.8 queries/s) still are."""
    from planner import cost_model
    from planner.planner import PlannerConfig

    prior = PlannerConfig.from_raw({}).summary_cost_prior_s
    assert prior == cost_model.DEFAULT_SUMMARY_FIXED_S >= 0.0015
    small = dict(algorithm="exact", queries=30, period_s=297, raw_cpu_per_query=0.003607, range_ms=60_000,
                 windows_per_query=8, series=8, ingest_samples_per_s=8, pane_ms=15_000, history_ms=3 * 3_600_000,
                 budget_left_bytes=1 << 30, plan_cpu_floor_per_s=1e-4)
    assert cost_model.estimate(**small, summary_fixed_s=cost_model.summary_prior_s(8, SMALL_DATA_PRIOR_S)).pays
    est = cost_model.estimate(**small, summary_fixed_s=cost_model.summary_prior_s(8, prior))
    assert not est.pays and "no clear saving" in est.reason, est.reason
    ttft = dict(small, queries=240, period_s=300, raw_cpu_per_query=0.01125, range_ms=3_600_000,
                windows_per_query=184, series=184, ingest_samples_per_s=184)
    est = cost_model.estimate(**ttft, summary_fixed_s=cost_model.summary_prior_s(184, prior))
    assert est.pays and est.summary_cpu_per_query < 0.3 * est.raw_cpu_per_query, est.reason


def test_cost_model_counts_the_summary_paths_fixed_cost_and_the_backfill():
    """A query whose raw cost is about the summary path's fixed cost per evaluation (the newest step
    of a refresh) gains nothing from a plan; a plan whose backfill costs more than it saves before it
    would be retired is not adopted either."""
    from planner import cost_model

    cheap = dict(algorithm="exact", queries=30, period_s=300, raw_cpu_per_query=0.0008, range_ms=300_000,
                 windows_per_query=2, series=63, ingest_samples_per_s=13, pane_ms=15_000, history_ms=7_200_000,
                 budget_left_bytes=1 << 30, plan_cpu_floor_per_s=0.0)
    assert cost_model.estimate(**cheap, summary_fixed_s=0.0).pays
    est = cost_model.estimate(**cheap, summary_fixed_s=0.001)
    assert not est.pays and "no clear saving" in est.reason
    rare = dict(cheap, queries=3, period_s=600, raw_cpu_per_query=0.02, summary_fixed_s=0.0005)
    assert cost_model.estimate(**dict(rare, history_ms=3_600_000), backfill_cost_s=4e-7, amortize_s=3600).pays
    # a day of 20k samples/s: 1.7e9 samples to fold once (the live fold made free to isolate the backfill)
    big = dict(rare, ingest_samples_per_s=20_000, history_ms=86_400_000, fold_cost_s=1e-12)
    assert cost_model.estimate(**big, backfill_cost_s=0.0, amortize_s=3600).pays
    est = cost_model.estimate(**big, backfill_cost_s=4e-7, amortize_s=3600)
    assert not est.pays and "backfill" in est.reason


def test_cost_model_counts_the_panes_kept_until_the_next_trim():
    """A plan keeps its history and the newer panes until its next trim (``SDS.TRIM_MIN_PANES``): one
    whose history alone just fits the storage budget went over it within minutes and was retired (6,400
    node CPU series, 6 h of 15 s panes, against 512 MiB), so the estimate counts those panes too."""
    from planner import cost_model
    from planner.sds import SDS

    base = dict(algorithm="exact", queries=30, period_s=300, raw_cpu_per_query=0.5, range_ms=3_600_000,
                windows_per_query=60, series=6400, ingest_samples_per_s=100, pane_ms=15_000,
                history_ms=6 * 3_600_000, bytes_per_pane=56)
    fits = 6400 * (6 * 240 + 1) * 56
    assert cost_model.estimate(**base, budget_left_bytes=fits).pays
    est = cost_model.estimate(**base, budget_left_bytes=fits, slack_panes=SDS.TRIM_MIN_PANES)
    assert not est.pays and "exceeds the remaining budget" in est.reason
    assert est.storage_bytes == 6400 * (6 * 240 + 1 + SDS.TRIM_MIN_PANES) * 56


def test_cost_model_wants_a_clear_margin_over_raw():
    """A summary path estimated at nearly the raw path's cost is not adopted however often the query
    recurs: both are estimates from a few millisecond-scale measurements, and such plans measured
    slower than raw once served. One at most MAX_SUMMARY_SHARE of raw is."""
    from planner import cost_model

    base = dict(algorithm="exact", queries=300, period_s=30, range_ms=3_600_000, windows_per_query=4,
                series=8, ingest_samples_per_s=1, pane_ms=15_000, history_ms=7_200_000, budget_left_bytes=1 << 30,
                plan_cpu_floor_per_s=0.0, backfill_cost_s=0.0, summary_fixed_s=0.001)
    close = cost_model.estimate(**base, raw_cpu_per_query=0.0013)  # summary ~0.78x of raw
    assert not close.pays and "no clear saving" in close.reason and "0.78x" in close.reason
    clear = cost_model.estimate(**base, raw_cpu_per_query=0.002)  # ~0.5x
    assert clear.pays and clear.summary_cpu_per_query <= cost_model.MAX_SUMMARY_SHARE * clear.raw_cpu_per_query


def test_restart_rebuilds_open_panes_from_raw(tmp_path):
    items = random_series(seed=6)
    src, batch = load(items)
    tmin, tmax = int(batch.timestamps.min()), int(batch.timestamps.max())
    cut = tmin + (tmax - tmin) * 2 // 3
    early = batch.timestamps <= cut
    part = SampleBatch(batch.series, batch.series_index[early], batch.timestamps[early], batch.values[early])
    st = _stack(src, data_dir=tmp_path)
    feed(st.summarizer, part)
    sds = st.planner.adopt(SDSSpec("x_total", "exact", 60_000), reason="test")
    st.planner.maintain()  # flush sealed panes to Parquet + catalog
    flushed_hi = st.persistence.persisted_hi[sds.id]
    # more samples arrive and are summarized, but the process dies before the next flush
    late = ~early
    feed(st.summarizer, SampleBatch(batch.series, batch.series_index[late], batch.timestamps[late], batch.values[late]))
    st.query_log.close()
    st2 = _stack(src, {"cost_based": False}, data_dir=tmp_path)
    sds2 = st2.planner.sds[sds.id]
    assert sds2.backfill_state == "restored"
    lo, hi = sds2.coverage()
    assert hi > flushed_hi, "panes after the last flush were rebuilt from raw storage"
    for q in ["increase(x_total[3h])", "rate(x_total[17m])", "resets(x_total[1h])"]:
        fast = st2.engine.range_query(q, cut - 3_600_000, tmax, 60_000)
        raw = st2.engine.range_query(q, cut - 3_600_000, tmax, 60_000, QueryOpts(exact=True))
        assert fast.stats.paths[0] == f"summary:{sds.id}"
        np.testing.assert_array_equal(fast.present, raw.present)
        np.testing.assert_allclose(fast.values[fast.present], raw.values[raw.present], rtol=1e-9)
    st2.query_log.close()


def test_explain_reports_path_and_cost_check():
    items = random_series(seed=8)
    src, batch = load(items)
    tmax = int(batch.timestamps.max())
    st = _stack(src, {"measure_first": False})
    feed(st.summarizer, batch)
    st.planner.adopt(SDSSpec("x_total", "exact", 60_000), reason="test")
    q = "sum(rate(x_total[30m]))"
    coarse = st.planner.explain(q, tmax - 3_600_000, tmax, 600_000)["subtrees"][0]
    fine = st.planner.explain(q, tmax - 3_600_000, tmax, 15_000)["subtrees"][0]
    assert coarse["path"].startswith("summary:exact-x_total") and coarse["error_bound"] == "exact"
    assert fine["path"] == "raw" and "cost check" in fine["why"]
    # explain agrees with what the engine then does
    assert st.engine.range_query(q, tmax - 3_600_000, tmax, 600_000).stats.paths[0] == coarse["path"]
    assert st.engine.range_query(q, tmax - 3_600_000, tmax, 15_000).stats.paths == ["raw"]


def test_heavy_panels_shadow_runs_do_not_crowd_out_another_plans_probes():
    """A shape of use is answered from its summary until SHAPE_MIN_RUNS shadow runs have measured it.
    While the canary's worker is busy (a dashboard's heavy panels queue their shadow runs one after
    another), a plan's measuring runs are still admitted, one per (SDS, shape): each plan's verdict
    arrives within a few loads, whatever the other panels queue."""
    import threading

    from planner.sds import shape_of

    items = random_series(seed=5)
    src, batch = load(items)
    tmax = int(batch.timestamps.max())
    st = _stack(src, {"canary_fraction": 0.0, "cost_based": False})  # served on this tiny scope
    feed(st.summarizer, batch)
    span = (tmax - 6 * 3_600_000, tmax, 300_000)

    def settle() -> None:
        deadline = time.time() + 30
        while st.canary.in_flight() and time.time() < deadline:
            time.sleep(0.01)

    heavy = ["sum by (job) (rate(x_total[30m]))", "sum by (job) (increase(x_total[1h]))",
             "sum(rate(x_total[2h]))", "max by (job) (rate(x_total[45m]))", "sum by (job) (rate(x_total[90m]))"]
    gq = "max by (job) (max_over_time(g[30m]))"
    x_sds = st.planner.adopt(SDSSpec("x_total", "exact", 300_000), reason="test")
    g_sds = st.planner.adopt(SDSSpec("g", "exact", 300_000), reason="test")
    for q in (heavy[0], gq):
        st.engine.range_query(q, *span)
    settle()
    g_shape = shape_of("max_over_time", 30 * 60_000, 73)
    g_sds.stats.shapes.clear()  # the g panel's shape is unmeasured again
    release = threading.Event()
    st.canary.pool.submit(release.wait, 60)  # the one worker is busy: everything submitted now queues
    try:
        for q in heavy:  # five shapes of use of one plan, each queuing its probe
            r = st.engine.range_query(q, *span)
            assert f"summary:{x_sds.id}" in r.stats.paths, r.stats.paths
        for _ in range(3):  # the same shape again while its first probe waits: one probe queued for it
            r = st.engine.range_query(gq, *span)
            assert f"summary:{g_sds.id}" in r.stats.paths, r.stats.paths
        assert st.canary.in_flight() == len(heavy) + 1
    finally:
        release.set()
    settle()
    assert len(g_sds.stats.shapes[g_shape]) == 1  # measured although five heavier probes queued before it
    for _ in range(3):  # later loads complete the measurement: a verdict for the shape
        st.engine.range_query(gq, *span)
        settle()
    assert g_sds.stats.verdict(g_shape) in ("faster", "slower")


def test_plan_slower_than_raw_in_shadow_runs_is_retired_and_not_readopted():
    """Never slower than raw: the canary shadows every new plan's first served sub-trees on the raw path;
    a plan whose measured p50 is not below raw's is retired with the measurement as its reason, listed
    as retired, and the recurring pattern is not adopted again for ``retire_after``."""
    items = random_series(seed=11)
    src, batch = load(items)
    tmax = int(batch.timestamps.max())
    st = _stack(src, {"canary_fraction": 0.0})
    feed(st.summarizer, batch)
    q = "sum by (job) (rate(x_total[30m]))"
    for _ in range(4):
        st.engine.range_query(q, tmax - 6 * 3_600_000, tmax, 300_000)
    (sds,) = st.planner.sds.values()
    served = []
    for _ in range(8):  # raw while the summary path is measured beside it, then by the verdict
        res = st.engine.range_query(q, tmax - 6 * 3_600_000, tmax, 300_000)
        served.append(any(p.startswith("summary:") for p in res.stats.paths))
        deadline = time.time() + 30
        while st.canary.in_flight() and time.time() < deadline:
            time.sleep(0.01)
    assert not any(served[:sds.stats.SHAPE_MIN_RUNS]), served  # nobody waited for a summary not yet measured
    assert len(sds.stats.shadow) >= sds.stats.SHAPE_MIN_RUNS  # measured against the raw answers given
    m = sds.stats.measured()
    assert m["raw_p50_s"] > 0 and m["served_p50_s"] > 0
    # two shapes of use: this panel's measured slower than raw (a loaded machine, a tiny scope), a
    # 24 h one faster -- the rewrite skips the summary for the slow shape only, and the plan stays
    from planner.sds import shape_of

    sds.stats.shadow.clear()
    sds.stats.shapes.clear()
    slow = shape_of("rate", 30 * 60_000, 73)
    for _ in range(6):
        sds.stats.record(slow, 0.004, 0.004, 0.003, 0.003)
        sds.stats.record(shape_of("rate", 30 * 60_000, 1441), 0.010, 0.010, 0.050, 0.050)
    res = st.engine.range_query(q, tmax - 6 * 3_600_000, tmax, 300_000)
    assert not any(p.startswith("summary:") for p in res.stats.paths)  # measured slower for this shape: raw
    st.planner.maintain()
    assert sds.id in st.planner.sds  # still faster for the other shape
    # every shape measured slower: retired on measurement
    sds.stats.shapes.clear()
    for _ in range(6):
        sds.stats.record(slow, 0.004, 0.004, 0.003, 0.003)
    st.planner.maintain()
    assert sds.id not in st.planner.sds
    rec = st.planner.retired[sds.id]
    assert "no faster from the summary than on the raw path" in rec["reason"] and rec["measured"]["runs"] == 18
    for _ in range(4):
        st.engine.range_query(q, tmax - 6 * 3_600_000, tmax, 300_000)
    assert sds.id not in st.planner.sds  # measured not to pay: not adopted again for retire_after
    assert any("retired on measurement" in c["last_decision"] for c in st.planner.candidates_report())
    # what the summary path cost it stays known: the next plan of that size is estimated at that cost,
    # not at the prior (cost_model.summary_prior_s)
    from planner import cost_model

    n = len(sds.registry.labels)
    assert st.planner._summary_fixed_cpu_s(n) >= 0.003 > cost_model.summary_prior_s(n, st.planner.config.summary_cost_prior_s)


def test_slower_verdict_needs_both_wall_and_cpu():
    """A shadow pair's halves run at different moments: a wall-clock loss with less CPU work is the
    load, not the summary, and does not retire it; more work and no faster does."""
    from planner.sds import SDSStats, shape_of

    sh = shape_of("rate", 300_000, 4)
    st = SDSStats()
    for _ in range(3):
        st.record(sh, 0.020, 0.002, 0.015, 0.008)  # slower wall, a quarter of the CPU
    assert st.verdict(sh) == "faster"
    st = SDSStats()
    for _ in range(3):
        st.record(sh, 0.020, 0.009, 0.015, 0.008)  # slower on both
    assert st.verdict(sh) == "slower"
    assert st.shape_medians()[shape_label_of(sh)] == (0.020, 0.015, 0.009, 0.008)


def test_decisive_runs_decide_before_a_full_measurement():
    """Fewer runs than a full verdict needs decide "faster" when every one of them is at least
    SHAPE_DECISIVE times faster in wall and CPU time; closer, disagreeing or slower runs wait for the
    full count, whose medians then decide (a first run pays for cold caches: not a reason to go raw)."""
    from planner.sds import SDSStats, shape_of

    sh = shape_of("increase", 3_600_000, 1441)
    st = SDSStats()
    assert st.verdict(sh) is None and st.measuring(sh)
    st.record(sh, 0.004, 0.003, 0.080, 0.060)  # 20x faster on both
    assert st.verdict(sh) == "faster" and st.known[sh] == "faster"
    assert not st.measuring(sh) and st.needs_probe(sh)  # served, and still measured up to the full count
    st.record(sh, 0.090, 0.070, 0.080, 0.060)  # the next run disagrees: no early verdict any more
    assert st.verdict(sh) is None
    st.record(sh, 0.005, 0.004, 0.080, 0.060)
    assert st.verdict(sh) == "faster" and not st.needs_probe(sh)  # the medians of three

    st = SDSStats()
    st.record(sh, 0.006, 0.002, 0.010, 0.008)  # faster, but not by the factor in wall time
    assert st.verdict(sh) is None and st.measuring(sh)
    st = SDSStats()
    st.record(sh, 0.030, 0.025, 0.010, 0.008)  # 3x slower on both: measured on
    assert st.verdict(sh) is None and st.measuring(sh)
    st = SDSStats()
    st.record(sh, 0.030, 0.004, 0.010, 0.008)  # slower wall (the load), less CPU: undecided
    assert st.verdict(sh) is None


def test_not_retired_while_a_shape_of_use_is_still_being_measured():
    """A 1 h panel measured slower and a 24 h panel on the same plan with one shadow run so far: the plan
    waits for the second verdict instead of going on the first."""
    from planner.sds import shape_of

    items = random_series(seed=4)
    src, batch = load(items)
    st = _stack(src)
    sds = st.planner.adopt(SDSSpec("x_total", "exact", 60_000), reason="test")
    short, day = shape_of("rate", 300_000, 4), shape_of("rate", 3_600_000, 1441)
    for _ in range(6):
        sds.stats.record(short, 0.004, 0.004, 0.003, 0.003)
    sds.stats.record(day, 0.010, 0.010, 0.050, 0.050)
    assert st.planner.measured_verdict(sds, time.time()) is None
    for _ in range(2):
        sds.stats.record(day, 0.060, 0.060, 0.050, 0.050)
    assert "no faster from the summary" in st.planner.measured_verdict(sds, time.time())
    st.query_log.close()


def shape_label_of(sh):
    from planner.sds import shape_label

    return shape_label(sh)


def test_served_cost_leaves_out_folds_of_earlier_samples():
    """A read that first folds the summarizer's queue (samples that arrived before it) is charged for
    serving only: the fold is the plan's summarization CPU, and a served sub-tree measured with it
    would look slower than raw for work the summarizer does anyway."""
    items = random_series(seed=5)
    src, batch = load(items)
    tmax = int(batch.timestamps.max())
    st = _stack(src, {"canary_fraction": 0, "cost_based": False})
    feed(st.summarizer, batch)
    q = "rate(x_total[30m])"
    # the plan is the test's own: adoption on recurrence weighs measured costs, which a busy machine moves
    sds = st.planner.adopt(SDSSpec("x_total", "exact", 60_000), reason="test")
    real = sds.before_read
    burn_s = 0.05

    def folding_read(t_ms):  # the queue's fold, made long enough to measure
        real(t_ms)
        c0 = time.thread_time()
        while time.thread_time() - c0 < burn_s:
            pass
    sds.before_read = folding_read
    seen = []
    st.hook.rctx.on_served = lambda served, ectx: seen.append(served)
    res = st.engine.range_query(q, tmax - 3_600_000, tmax, 600_000)
    assert any(p.startswith("summary:") for p in res.stats.paths) and seen
    assert res.stats.cpu_seconds >= burn_s  # the query's thread did fold
    assert 0 < seen[0].cpu_s < burn_s and seen[0].wall_s < burn_s  # serving alone was measured


def _same_answer(a, b):
    assert a.labels == b.labels
    np.testing.assert_array_equal(a.present, b.present)
    np.testing.assert_allclose(a.values[a.present], b.values[b.present], rtol=1e-9, atol=0)


def test_exact_plan_keeps_the_fields_of_its_functions_and_widens_for_a_new_one(tmp_path):
    """A plan adopted for rate keeps 7 of the 18 pane fields; max_over_time on the same metric goes raw
    until it recurs, then a plan keeping both is adopted and the narrower one is retired as superseded.
    Answers equal the raw path throughout, and a restart restores the chosen fields."""
    items = random_series(seed=11)
    src, batch = load(items)
    tmax = int(batch.timestamps.max())
    st = _stack(src, {"cost_based": False}, data_dir=tmp_path)
    feed(st.summarizer, batch)
    eng = st.engine
    rate_q, max_q = "sum by (job) (rate(x_total[30m]))", "max_over_time(x_total[30m])"
    args = (tmax - 6 * 3_600_000, tmax, 600_000)
    for _ in range(3):
        eng.range_query(rate_q, *args)
    (narrow,) = st.planner.sds.values()
    assert set(narrow.store.fields) == {"count", "first_t", "first_v", "last_t", "last_v", "corr", "entry_corr"}
    assert narrow.serves("rate") and narrow.serves("increase") and not narrow.serves("max_over_time")
    res = eng.range_query(rate_q, *args)
    assert any(p.startswith("summary:") for p in res.stats.paths)
    _same_answer(res, eng.range_query(rate_q, *args, QueryOpts(exact=True)))
    # the store holds 7 fields per series and pane: 56 of the 144 bytes a plan for every function takes;
    # its running sums for window reads (count, and the counter term's non-zero count: a window with
    # a reset sums its own panes) 8 more over the panes reads asked for, and the plan's size counts them
    cells = narrow.store.ns * narrow.store.nk
    assert narrow.store.pane_nbytes() / cells == 56
    pre = narrow.store.prefix
    assert pre.n > 0 and pre.nbytes() == 8 * pre.rows * (pre.n + 1)
    assert narrow.nbytes() == narrow.store.pane_nbytes() + narrow.store.prefix.nbytes()
    res = eng.range_query(max_q, *args)
    assert res.stats.paths == ["raw"]  # the narrow plan keeps no max: never answered from blanks
    for _ in range(3):
        eng.range_query(max_q, *args)
    wide = next(s for s in st.planner.sds.values() if s is not narrow)
    assert {"vmax", "corr", "entry_corr"} <= set(wide.store.fields) and "s2" not in wide.store.fields
    st.planner.maintain()
    assert narrow.id not in st.planner.sds and "superseded by " + wide.id in st.planner.retired[narrow.id]["reason"]
    for q in (rate_q, max_q, "increase(x_total[1h])"):
        res = eng.range_query(q, *args)
        assert any(p == "summary:" + wide.id for p in res.stats.paths), q
        _same_answer(res, eng.range_query(q, *args, QueryOpts(exact=True)))
    st.query_log.close()  # the maintenance above flushed its panes
    st2 = _stack(src, {"cost_based": False}, data_dir=tmp_path)
    (restored,) = st2.planner.sds.values()
    assert restored.id == wide.id and restored.store.fields == wide.store.fields
    res = st2.engine.range_query(max_q, *args)
    assert any(p.startswith("summary:") for p in res.stats.paths)
    _same_answer(res, st2.engine.range_query(max_q, *args, QueryOpts(exact=True)))
    st2.query_log.close()


def test_many_flushes_merge_pane_files_and_restore_the_same_answers(tmp_path, monkeypatch):
    """Each flush writes the panes sealed since the last one; past MERGE_FILES files they become one.
    An interrupted merge (merged file written, old files not yet removed) restores without counting
    a pane twice."""
    monkeypatch.setattr(SDSPersistence, "MERGE_FILES", 3)
    items = random_series(seed=6)
    src, batch = load(items)
    tmin, tmax = int(batch.timestamps.min()), int(batch.timestamps.max())
    st = _stack(src, data_dir=tmp_path)
    cuts = np.linspace(tmin + (tmax - tmin) // 3, tmax, 7).astype(np.int64)
    first = batch.timestamps <= cuts[0]
    feed(st.summarizer, SampleBatch(batch.series, batch.series_index[first], batch.timestamps[first], batch.values[first]))
    sds = st.planner.adopt(SDSSpec("x_total", "exact", 60_000), reason="test")
    st.planner.maintain()
    for a, b in zip(cuts[:-1], cuts[1:]):
        part = (batch.timestamps > a) & (batch.timestamps <= b)
        feed(st.summarizer, SampleBatch(batch.series, batch.series_index[part], batch.timestamps[part], batch.values[part]))
        st.planner.maintain()
    d = st.persistence.dir(sds.id)
    files = sorted(d.glob("panes-*.parquet"))
    assert 1 <= len(files) <= 3, files
    assert st.persistence.merges >= 1, "seven flushes with new panes: at least one merge"
    # an interrupted merge: a stale smaller file beside the merged one that holds its range
    merged = max(files, key=lambda f: int(f.stem.split("-")[2]) - int(f.stem.split("-")[1]))
    lo, hi = (int(x) for x in merged.stem.split("-")[1:3])
    import pyarrow.parquet as pq
    tab = pq.read_table(merged)
    inner = tab.filter(pa_compute_le(tab, lo + 2))
    pq.write_table(inner, d / f"panes-{lo}-{lo + 2}-0.parquet")  # written before the merge: superseded
    st.query_log.close()
    st2 = _stack(src, {"cost_based": False}, data_dir=tmp_path)
    q_end = int(cuts[-2])
    for q in ["increase(x_total[3h])", "rate(x_total[17m])", "resets(x_total[1h])"]:
        fast = st2.engine.range_query(q, q_end - 3_600_000, q_end, 60_000)
        raw = st2.engine.range_query(q, q_end - 3_600_000, q_end, 60_000, QueryOpts(exact=True))
        assert fast.stats.paths[0] == f"summary:{sds.id}"
        np.testing.assert_array_equal(fast.present, raw.present)
        np.testing.assert_allclose(fast.values[fast.present], raw.values[raw.present], rtol=1e-9)
    st2.query_log.close()


def pa_compute_le(tab, limit):
    import pyarrow.compute as pc
    return pc.less(tab["pane"], limit)


def test_pane_of_a_new_plan_divides_the_windows_bounds_grafana_aligns():
    from planner.planner import KeyStats

    st = _stack(load([])[0])
    p = st.planner
    grafana_1h = KeyStats(min_range_ms=300_000, max_span_ms=3_900_000, align_ms=15_000)
    assert p.pane_for(grafana_1h) == 15_000  # steps of 15 s: every window whole panes
    assert p.pane_for(KeyStats(min_range_ms=3_600_000, max_span_ms=90_000_000, align_ms=60_000)) == 60_000
    # a 25 h span at 15 s would be 6,000 panes: the configured pane (its windows keep raw edges)
    assert p.pane_for(KeyStats(min_range_ms=300_000, max_span_ms=90_000_000, align_ms=15_000)) == 60_000
    assert p.pane_for(KeyStats(min_range_ms=300_000, max_span_ms=4 * 3_600_000, align_ms=5_000)) == 60_000
    # bounds at arbitrary milliseconds (rule evaluations): the configured pane ...
    rule_5m = KeyStats(min_range_ms=300_000, max_span_ms=300_000, align_ms=7)
    assert p.pane_for(rule_5m) == 60_000
    # ... or, for a store with running sums (a window costs the same whatever panes it holds), one the
    # window holds 16 times, so its raw edges shrink: 15 s for [5m]; an hour keeps the configured pane
    assert p.pane_for(rule_5m, window_sums=True) == 15_000
    assert p.pane_for(KeyStats(min_range_ms=3_600_000, max_span_ms=3_600_000, align_ms=7), window_sums=True) == 60_000
    assert p.pane_for(KeyStats(min_range_ms=300_000, max_span_ms=90_000_000, align_ms=7), window_sums=True) == 60_000
    # a short window still gets a pane it holds 4 times, aligned when it can be
    assert p.pane_for(KeyStats(min_range_ms=60_000, max_span_ms=3_660_000, align_ms=10_000)) == 10_000
    assert p.pane_for(KeyStats(min_range_ms=60_000, max_span_ms=3_660_000, align_ms=0)) == 15_000


def test_cost_report_keeps_the_summarization_cpu_of_retired_plans():
    from planner.cost_report import build_report

    items = random_series(seed=6)
    src, batch = load(items)
    st = _stack(src)
    feed(st.summarizer, batch)
    sds = st.planner.adopt(SDSSpec("x_total", "exact", 60_000), reason="test")
    st.summarizer.flush()
    live = sds.stats.ingest_cpu_s + 0.25  # a measurable cost, whatever this machine's speed
    sds.stats.ingest_cpu_s = live
    before = build_report(st.query_log, st.planner)["totals"]
    st.planner.retire(sds.id, "test", measured=True)
    after = build_report(st.query_log, st.planner)["totals"]
    # (plan listings round to microseconds)
    assert after["summary_ingest_cpu_s"] == pytest.approx(before["summary_ingest_cpu_s"], abs=1e-6)
    assert after["summary_ingest_cpu_s"] == pytest.approx(live, abs=1e-6)
    assert after["summary_backfill_cpu_s"] == pytest.approx(before["summary_backfill_cpu_s"], abs=1e-6)
    assert after["summary_bytes"] == 0
    st.query_log.close()


def test_plan_forgets_panes_older_than_its_history_and_restores_only_those_it_kept(tmp_path, monkeypatch):
    """A plan keeps ``history_ms`` of panes behind its newest sample however long ingest runs: older
    panes are dropped at maintenance, coverage starts at the first kept pane, answers still equal raw
    (windows reaching further back read raw samples there), pane files wholly older are deleted, and a
    restart restores the kept range only."""
    monkeypatch.setattr(SDSPersistence, "MERGE_FILES", 3)
    items = random_series(seed=6)
    src, batch = load(items)
    tmin, tmax = int(batch.timestamps.min()), int(batch.timestamps.max())
    P, hist = 60_000, 2 * 3_600_000
    st = _stack(src, {"cost_based": False}, data_dir=tmp_path)
    cuts = np.linspace(tmin + (tmax - tmin) // 4, tmax, 9).astype(np.int64)
    first = batch.timestamps <= cuts[0]
    feed(st.summarizer, SampleBatch(batch.series, batch.series_index[first], batch.timestamps[first], batch.values[first]))
    sds = st.planner.adopt(SDSSpec("x_total", "exact", P), reason="test", history_ms=hist)
    assert sds.history_ms == hist
    st.planner.maintain()
    widest = 0
    for a, b in zip(cuts[:-1], cuts[1:]):
        part = (batch.timestamps > a) & (batch.timestamps <= b)
        feed(st.summarizer, SampleBatch(batch.series, batch.series_index[part], batch.timestamps[part], batch.values[part]))
        st.planner.maintain()
        widest = max(widest, sds.store.nk)
    lo, hi = sds.coverage()
    feed_step = int(cuts[1] - cuts[0])  # trims run at maintenance, after each feed
    assert lo * P >= sds.max_ts - hist - (SDS.TRIM_MIN_PANES + 1) * P - feed_step, "coverage follows the newest sample"
    assert lo * P > tmin + P, "the oldest panes were dropped"
    assert sds.store.k0 >= lo and widest <= (hist + feed_step) // P + SDS.TRIM_MIN_PANES + 2
    for q in ["increase(x_total[1h])", "rate(x_total[17m])", "resets(x_total[30m])"]:
        whole = st.engine.range_query(q, tmin + 3_600_000, tmax, 60_000)
        _same_answer(whole, st.engine.range_query(q, tmin + 3_600_000, tmax, 60_000, QueryOpts(exact=True)))
        recent = st.engine.range_query(q, tmax - 3_600_000, tmax, 60_000)
        assert recent.stats.paths[0] == f"summary:{sds.id}"
    d = st.persistence.dir(sds.id)
    assert all(int(f.stem.split("-")[2]) > lo for f in d.glob("panes-*.parquet")), "older pane files deleted"
    st.query_log.close()
    st2 = _stack(src, {"cost_based": False}, data_dir=tmp_path)
    restored = st2.planner.sds[sds.id]
    assert restored.cov_lo == lo and restored.store.k0 >= lo
    assert restored.history_ms is not None and restored.history_ms >= hist
    q_end = int(cuts[-2])
    fast = st2.engine.range_query("rate(x_total[17m])", q_end - 3_600_000, q_end, 60_000)
    assert fast.stats.paths[0] == f"summary:{sds.id}"
    _same_answer(fast, st2.engine.range_query("rate(x_total[17m])", q_end - 3_600_000, q_end, 60_000, QueryOpts(exact=True)))
    st2.query_log.close()


@pytest.mark.parametrize("alg", ["exact", "group", "kll", "req", "cpc", "fi"])
def test_every_pane_store_forgets_exactly_the_panes_before_the_cut(alg):
    """``drop_before(k)`` (the PaneStore protocol) removes every pane older than k and leaves the
    others as they were, for each algorithm's store."""
    from storage.labels import make_labels
    from tests.test_planner_fixtures import T0

    P = 60_000
    spec = SDSSpec("m", alg, P, grouping=("job",) if alg in ("group", "cpc", "fi") else ())
    sds = SDS(spec)
    labels = [make_labels({"__name__": "m", "job": f"j{i % 3}", "inst": str(i)}) for i in range(12)]
    ids = sds.register(labels)
    rng = np.random.default_rng(3)
    ts = np.arange(0, 300 * P, 20_000, dtype=np.int64) + T0
    sid = np.repeat(ids, len(ts))
    tt = np.tile(ts, len(ids))
    vals = np.cumsum(rng.random(len(tt))) if alg == "exact" else rng.random(len(tt)) * 100
    sds.store.ingest_sorted(sid, tt, vals, live=True)
    k = int((T0 + 120 * P) // P)
    far = int((T0 + 10_000 * P) // P)

    def rows(a, b):
        r = sds.store.export_rows(a, b)
        return {key: np.asarray(v).tolist() for key, v in r.items()}

    kept = rows(k, far)
    assert len(rows(0, k)["pane"]) > 0
    sds.store.drop_before(k)
    assert len(rows(0, k)["pane"]) == 0
    assert rows(k, far) == kept
    sds.store.drop_before(k - 5)  # behind the cut already: nothing changes
    assert rows(k, far) == kept


def test_measured_saving_is_summed_per_shape_of_use():
    """A plan probed in a cheap refresh shape (slower, answered raw after its probes) and serving a wide
    one (faster) many times: the saving is each shape's own times its hits, so the probes' loss does
    not outweigh what the wide shape saves, and a plan whose served shapes all lose still goes."""
    from planner.sds import SDSStats, shape_of

    refresh, wide = shape_of("rate", 60_000, 1), shape_of("rate", 60_000, 241)
    st = SDSStats()
    for _ in range(3):
        st.hit(refresh)
        st.record(refresh, 0.0020, 0.0020, 0.0005, 0.0005)  # 1.5 ms lost per refresh
    for _ in range(3):
        st.record(wide, 0.0010, 0.0010, 0.0030, 0.0030)  # 2 ms saved per wide query
    for _ in range(10):
        st.hit(wide)
    st.ingest_cpu_s = 0.004
    m = st.measured()
    assert m["cpu_saved_s"] == pytest.approx(3 * -0.0015 + 10 * 0.0020 - 0.004)
    # one mean over the six pairs times all 13 hits would have said 13 * 0.00025 - 0.004 < 0.0155
    assert st.verdict(refresh) == "slower" and st.verdict(wide) == "faster"
    lose = SDSStats()
    for _ in range(6):
        lose.hit(refresh)
        lose.record(refresh, 0.0020, 0.0020, 0.0005, 0.0005)
    assert lose.measured()["cpu_saved_s"] == pytest.approx(6 * -0.0015)


def _refreshed_panel():
    """Data for one 1 h / 15 s panel, and its query-log entries at a given CPU and paths."""
    from planner.query_log import LogEntry

    src, batch = load(random_series(seed=5))
    end = int(batch.timestamps.max()) // 15_000 * 15_000  # floored to the step, as Grafana sends it
    q = "sum by (job) (rate(x_total[5m]))"

    def entry(cpu_s: float, paths: list[str], end_ms: int = end) -> LogEntry:
        return LogEntry(expr=q, pattern=normalize(q), kind="range", start_ms=end_ms - 3_600_000, end_ms=end_ms,
                        step_ms=15_000, wall_s=cpu_s, cpu_s=cpu_s, samples=200_000, paths=paths, result_series=3)
    return src, batch, entry


def test_adoption_weighs_refreshes_at_what_the_step_answers_left_them():
    """A panel whose refreshes compute one new step each: the plan would save on those, not on a whole
    evaluation. Cheap refreshes next to one costly first load are not worth a plan; the same arrivals
    as whole evaluations are."""
    from planner.planner import refreshed_steps

    assert refreshed_steps(["raw", "steps:reused:239/240"]) == 1
    assert refreshed_steps(["steps:reused:240/240"]) == 0  # nothing evaluated: no cost to weigh
    assert refreshed_steps(["summary:exact-x", "steps:reused:200/240"]) == 0
    assert refreshed_steps(["raw"]) == 0

    src, batch, entry = _refreshed_panel()

    outcome = {}
    for kind in ("refresh", "whole"):
        st = _stack(src)
        feed(st.summarizer, batch)
        st.planner.observe(entry(0.030, ["raw"]))  # the first load: a whole evaluation
        for i in range(4):
            time.sleep(0.01)
            paths = ["raw", "steps:reused:240/241"] if kind == "refresh" else ["raw"]
            st.planner.observe(entry(0.0004 if kind == "refresh" else 0.030, paths))
        outcome[kind] = (bool(st.planner.sds), next(iter(st.planner.keys.values())).last_decision)
        st.query_log.close()
    assert outcome["whole"][0], outcome
    assert not outcome["refresh"][0] and outcome["refresh"][1].startswith("no clear saving"), outcome


def test_a_grid_whose_raw_edges_cover_its_span_is_not_adopted():
    """A client that sends end=now (a script, the Prometheus UI) asks a new 15 s step grid each time:
    no pane divides it, so the windows' raw edges, a step apart, cover the whole span and the rewrite
    answers every such query raw. Its queries recur as a dashboard's do, but a plan would only fold and
    keep panes; the same queries on Grafana's aligned grid are adopted."""
    src, batch, entry = _refreshed_panel()
    base = int(batch.timestamps.max()) // 15_000 * 15_000
    outcome = {}
    for kind, shift in (("unaligned", 1_234), ("aligned", 0)):
        st = _stack(src)
        feed(st.summarizer, batch)
        for i in range(4):
            time.sleep(0.01)
            st.planner.observe(entry(0.030, ["raw"], end_ms=base - 15_000 * (3 - i) - (shift + 7 * i if shift else 0)))
        ks = st.planner.keys[("x_total", "exact")]
        outcome[kind] = (bool(st.planner.sds), ks.last_decision)
        st.query_log.close()
    assert outcome["aligned"][0], outcome
    assert not outcome["unaligned"][0] and outcome["unaligned"][1].startswith("no clear saving"), outcome


def test_arrivals_within_one_refresh_are_not_a_query_rate():
    """Three panels of one pattern (p50 / p90 / p99 of one histogram) arrive within milliseconds in one
    dashboard refresh: the planner counts them over at least MIN_REFRESH_S, not as hundreds of queries
    per second; arrivals spread wider are counted over their own span."""
    from planner.planner import Planner

    src, batch, entry = _refreshed_panel()
    st = _stack(src)
    feed(st.summarizer, batch)
    for _ in range(3):
        st.planner.observe(entry(0.030, ["raw"]))
    ks = next(iter(st.planner.keys.values()))
    assert st.planner._arrival_span_s(ks) == Planner.MIN_REFRESH_S
    assert f"{2 / Planner.MIN_REFRESH_S:.4f} q/s" in ks.last_decision, ks.last_decision
    ks.arrivals = type(ks.arrivals)([100.0, 110.0, 120.0])  # three refreshes 10 s apart
    assert st.planner._arrival_span_s(ks) == 20.0
    st.query_log.close()


def test_one_dashboard_load_is_not_a_recurrence():
    """A dashboard's first load brings every panel on a metric at once: four panels' first loads (and an
    exact=true twin of each, as from a second datasource) are not the pattern recurring. Adopting on them
    took whole evaluations' cost for a pattern whose refreshes then compute a step or two each. It recurs
    when one of its query texts comes again on the default path, or when its arrivals span
    ``Planner.BURST_S``; a text's first evaluation says nothing of how the pattern recurs."""
    from dataclasses import replace

    src, batch, entry = _refreshed_panel()
    texts = [f"{agg} (rate(x_total[5m]))" for agg in ("sum by (job)", "max by (job)", "sum", "avg by (job)")]

    def panel(q: str, exact: bool = False):
        return replace(entry(0.030, ["raw"]), expr=q, pattern=normalize(q), exact=exact)

    st = _stack(src)
    feed(st.summarizer, batch)
    for q in texts:
        st.planner.observe(panel(q))
        st.planner.observe(panel(q, exact=True))
    ks = st.planner.keys[("x_total", "exact")]
    assert not st.planner.sds and not ks.recurred, ks.last_decision
    assert ks.last_decision.startswith("waiting for it to recur"), ks.last_decision
    assert not ks.kinds  # first loads: neither refreshes nor pans
    st.planner.observe(panel(texts[0]))  # the first panel again (a pan: a whole evaluation)
    assert ks.recurred and list(ks.kinds) == [False]
    assert st.planner.sds, ks.last_decision
    st.query_log.close()

    st = _stack(src)  # arrivals of different texts spread over more than BURST_S do recur
    feed(st.summarizer, batch)
    st.planner.BURST_S = 0.05
    for q in texts[:2]:
        st.planner.observe(panel(q))
    assert not st.planner.keys[("x_total", "exact")].recurred
    time.sleep(0.06)
    st.planner.observe(panel(texts[2]))
    assert st.planner.keys[("x_total", "exact")].recurred
    st.query_log.close()


def test_one_refresh_does_not_set_a_panels_raw_cost():
    """The first refresh after a load (which also computes the steps not sealed then) is one noisy
    sample: a refreshed panel's raw cost is taken from at least MIN_REFRESHES refreshes (their low median),
    so one dear refresh neither adopts a plan nor decides alone (of two, the lower counts)."""
    from planner.planner import Planner

    src, batch, entry = _refreshed_panel()

    st = _stack(src, {"min_count": 2})
    feed(st.summarizer, batch)
    st.planner.observe(entry(0.030, ["raw"]))  # the first load
    st.planner.observe(entry(0.030, ["raw", "steps:reused:230/241"]))  # a dear first refresh
    ks = next(iter(st.planner.keys.values()))
    assert not st.planner.sds, "one refresh decided"
    assert ks.last_decision.startswith(f"waiting for {Planner.MIN_REFRESHES} measured refreshes"), ks.last_decision
    for _ in range(Planner.MIN_REFRESHES):  # the refreshes after it are cheap: of two, the lower counts
        st.planner.observe(entry(0.0004, ["raw", "steps:reused:240/241"]))
        assert not st.planner.sds and ks.last_decision.startswith("no clear saving"), ks.last_decision
    st.query_log.close()


def test_a_refreshed_day_long_panel_backfills_only_what_its_refreshes_read():
    """A 24 h panel refreshed every minute computes its newest step or two (the step answers keep the
    rest): a plan for it backfills a few of its windows, not the day its first load read, and the cost
    of a small plan is not taken from a big one's measurements."""
    from planner.normalize import Candidate
    from planner.planner import KeyStats, _for_series

    items = random_series(seed=12)
    src, batch = load(items)
    now = time.time()

    def pattern(refreshes: bool) -> KeyStats:
        ks = KeyStats(max_range_ms=3_600_000, max_span_ms=25 * 3_600_000, min_range_ms=3_600_000, series=6,
                      sample_rate=1.0)
        ks.arrivals.extend(now - 60 * k for k in range(10, 0, -1))
        ks.raw_cpu.extend([0.08] * 10)  # whole evaluations of the day: 80 ms
        ks.windows.extend([6 * 1441] * 10)
        ks.refresh_cpu.extend([0.012] * 8)  # the newest step: 12 ms
        ks.refresh_windows.extend([6] * 8)
        ks.kinds.extend([False] + [refreshes] * 9)
        ks.funcs.add("increase")
        return ks

    c = Candidate("x_total", (), "exact", "increase", 3_600_000)
    for refreshes, most in ((True, 4 * 3_600_000), (False, 86_400_000)):
        st = _stack(src, {"min_count": 2})
        st.planner._consider(c, pattern(refreshes))
        (sds,) = st.planner.sds.values()
        assert sds.history_ms <= most and (refreshes or sds.history_ms == most), (refreshes, sds.history_ms)
    # per-plan costs measured on a big plan, scaled to a small one (at least the cheapest measured or the prior)
    assert _for_series([(0.011, 1449)], 75, 0.0005) == pytest.approx(0.011 * 75 / 1449)
    assert _for_series([(0.011, 1449)], 1, 0.0005) == 0.0005
    assert _for_series([(0.0003, 1449)], 1, 0.0005) == 0.0003
    assert _for_series([(0.002, 25), (0.011, 1449)], 75, 0.0005) == pytest.approx(0.002)
    assert _for_series([], 75, 0.0005) == 0.0005
    # with nothing measured, the prior grows with the plan's series (raw edges and panes are per series)
    from planner import cost_model

    st = _stack(src)
    small, big = st.planner._summary_fixed_cpu_s(10), st.planner._summary_fixed_cpu_s(6400)
    prior = st.planner.config.summary_cost_prior_s
    assert small == cost_model.summary_prior_s(10, prior) and big == cost_model.summary_prior_s(6400, prior)
    assert big > 10 * small and big >= 0.015
    st.query_log.close()


def test_cpu_savings_are_weighed_from_when_the_plan_first_served():
    """A plan's shapes are measured on the raw path before it serves (a panel refreshed once a minute
    takes three minutes): its savings are weighed against the fold CPU from when it first served."""
    from planner.sds import shape_of

    src, batch = load(random_series(seed=13))
    st = _stack(src, {"canary_fraction": 0.0})
    sds = st.planner.adopt(SDSSpec("x_total", "exact", 60_000), reason="test")
    now = time.time()
    shape = shape_of("increase", 3_600_000, 1)
    for _ in range(st.planner.MIN_SHADOW_RUNS):
        sds.stats.record(shape, 0.002, 0.002, 0.012, 0.012)  # 10 ms CPU saved per hit
    sds.stats.created = now - 700
    sds.stats.ingest_cpu_s = 0.7  # 1 ms of fold CPU per second of its life
    # never served, nothing left to measure, past the grace: its fold CPU buys nothing
    assert "savings are negative" in st.planner.measured_verdict(sds, now)
    # first served 100 s ago: not weighed yet
    for _ in range(5):
        sds.stats.hit(shape)
    sds.stats.serving_since = now - 100
    assert st.planner.measured_verdict(sds, now) is None
    # first served 350 s ago, 40 hits since: 0.4 s saved against the 0.35 s folded since -- it stays,
    # although the 0.7 s folded since its adoption would have retired it
    for _ in range(35):
        sds.stats.hit(shape)
    sds.stats.serving_since = now - 350
    assert st.planner.measured_verdict(sds, now) is None
    sds.stats.ingest_cpu_s = 1.4  # 2 ms/s: 0.7 s since it first served, more than it saved
    why = st.planner.measured_verdict(sds, now)
    assert "since it first served (40 hits; 0.7000 s summarization since)" in why, why


def test_the_plan_catalog_is_written_in_one_statement_with_only_changed_rows(tmp_path):
    """A maintenance pass writes the catalog rows of finished plans that changed, together; an
    unchanged plan is not written again; the rows name what a restart restores."""
    items = random_series(seed=9)
    src, batch = load(items)
    st = _stack(src, data_dir=tmp_path)
    feed(st.summarizer, batch)
    a = st.planner.adopt(SDSSpec("x_total", "exact", 60_000), reason="test a")
    b = st.planner.adopt(SDSSpec("x_total", "exact", 120_000), reason="test b")
    st.planner.maintain()

    def rows() -> dict:
        with st.persistence.db_lock:
            got = st.persistence.con.execute("SELECT id, reason, cov_lo, persisted_hi, series, bytes, hits FROM sds_catalog").fetchall()
        return {r[0]: r[1:] for r in got}

    first = rows()
    assert set(first) == {a.id, b.id}
    assert first[a.id][0] == "test a" and first[a.id][1] == a.cov_lo and first[a.id][3] == len(a.registry.labels)
    assert first[a.id][2] == st.persistence.persisted_hi[a.id] and first[a.id][4] == a.nbytes()
    assert st.persistence.write_catalog([a, b]) == 0, "nothing changed since the pass"
    a.stats.hits += 3
    assert st.persistence.write_catalog([a, b]) == 1
    assert rows()[a.id][5] == first[a.id][5] + 3 and rows()[b.id] == first[b.id]
    st.query_log.close()
    st2 = _stack(src, {"cost_based": False}, data_dir=tmp_path)
    assert set(st2.planner.sds) == {a.id, b.id}
    assert st2.planner.sds[a.id].reason == "test a"
    st2.query_log.close()
