"""The summary path's latency machinery stays exact: the step cache (refreshes reuse sealed steps, the
raw path fills it when the cost check keeps a panel on raw), its invalidation (late samples, lagging
series, coverage changes), and the cost-model edge reads. Every served answer equals raw evaluation
over the same data within 1e-9 relative; reuse is reported in the query's infos."""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest

from planner.rewrite import RewriteHook
from planner.rewrite_rules import RewriteContext
from planner.sds import SDS, SDSSpec
from planner.summarizer import Summarizer
from planner.summary_scan import StepCache, _read_raw, step_cache
from planner.window import coalesce_reads, plan_windows, samples_between
from promql.engine import Engine
from promql.query_opts import QueryOpts
from storage.batch import SampleBatch
from storage.labels import make_labels
from tests.helpers import ServerProcess
from tests.test_planner_exact import _compare
from tests.test_planner_fixtures import feed, load, random_series

QUERIES = [
    "sum_over_time(g[{r}])", "avg_over_time(g[{r}] offset 7m)", "stddev_over_time(g[{r}])", "max_over_time(g[{r}])",
    "count_over_time(g[{r}])", "last_over_time(g[{r}])", "changes(g[{r}])", "delta(g[{r}])",
    "rate(x_total[{r}])", "increase(x_total[{r}])", "resets(x_total[{r}])",
    "sum by (job) (rate(x_total[{r}]))", "histogram_quantile(0.9, sum by (le) (rate(h_bucket[{r}])))",
]
P = 60_000


def _world(seed: int, cost_based: bool = False, seal_delay_ms: int = 0):
    """Data of random_series split in two halves: the first is in storage and summarized (live +
    backfill); ``more()`` appends the second half in chunks, as ingest would."""
    items = random_series(seed=seed)
    _, full = load(items)
    tmin, tmax = int(full.timestamps.min()), int(full.timestamps.max())
    cut = tmin + (tmax - tmin) // 2
    first = full.timestamps <= cut
    src, _ = load([])
    b1 = SampleBatch(full.series, full.series_index[first], full.timestamps[first], full.values[first])
    b2 = SampleBatch(full.series, full.series_index[~first], full.timestamps[~first], full.values[~first])
    src.append(b1)
    summ = Summarizer(src)
    sdss = {}
    live_from = tmin + (cut - tmin) // 2 + 4_321
    for m in ("g", "x_total", "h_bucket"):
        sds = SDS(SDSSpec(m, "exact", P))
        sds.seal_delay_ms = seal_delay_ms
        summ.start_live(sds, live_from_ts=live_from)
        sdss[m] = sds
    feed(summ, SampleBatch(b1.series, b1.series_index[b1.timestamps >= live_from], b1.timestamps[b1.timestamps >= live_from],
                           b1.values[b1.timestamps >= live_from]), chunks=10)
    for sds in sdss.values():
        summ.backfill(sds, 30 * 86_400_000)
    hook = RewriteHook(RewriteContext(lambda m, a, ms, func=None: sdss.get(m) if a == "exact" else None, cost_based=cost_based))

    def more(lo: int, hi: int) -> None:
        sel = (b2.timestamps > lo) & (b2.timestamps <= hi)
        part = SampleBatch(b2.series, b2.series_index[sel], b2.timestamps[sel], b2.values[sel])
        src.append(part)
        feed(summ, part, chunks=3)

    return src, summ, sdss, hook, Engine(src), tmin, cut, tmax, more


def _reused(res) -> int:
    n = 0
    for i in res.annotations.infos:
        if "steps reused from its step cache" in i:
            n += int(i.split(" of ", 1)[0].rsplit("; ", 1)[-1])
    return n


def _served(res) -> bool:
    return any(p.startswith("summary:") for p in res.stats.paths)


@pytest.mark.parametrize("qi", range(len(QUERIES)))
def test_refreshes_reuse_sealed_steps_and_equal_raw_as_data_arrives(qi):
    src, summ, sdss, hook, eng, tmin, cut, tmax, more = _world(seed=40 + qi)
    rng = np.random.default_rng(500 + qi)
    r_ms = int(rng.choice([300_000, 1_000_000 + int(rng.integers(0, 999)), 3_600_000, 3 * 3_600_000]))
    step = int(rng.choice([15_000, 60_000, 137_000]))
    span = step * int(rng.integers(20, 90))
    q = QUERIES[qi].format(r=f"{r_ms // 1000}s")
    now = cut
    reused = 0
    for k in range(6):  # a dashboard: end follows the newest data, aligned to the step
        end = now // step * step
        raw = eng.range_query(q, end - span, end, step)
        fast = eng.range_query(q, end - span, end, step, QueryOpts(node_hooks=[hook]))
        _compare(raw, fast, q)
        assert _served(fast), q
        reused += _reused(fast)
        if k % 2 == 1:  # new data arrives between some refreshes
            nxt = now + int(rng.integers(1, 4)) * step
            more(now, nxt)
            now = nxt
        else:
            now += step // 2
    assert reused > 0, "refreshes should reuse sealed steps"


def test_random_ranges_steps_offsets_with_repeats_equal_raw():
    src, summ, sdss, hook, eng, tmin, cut, tmax, more = _world(seed=61)
    rng = np.random.default_rng(62)
    reused = 0
    for trial in range(40):
        q = str(rng.choice(QUERIES)).format(r=f"{int(rng.choice([45, 300, 1234, 3600, 7200]))}s")
        if rng.random() < 0.3:
            q = q.replace("[", "[", 1).replace("])", f"] offset {int(rng.integers(1, 30))}m)", 1) if "offset" not in q else q
        step = int(rng.choice([10_000, 30_000, 60_000, 90_000, 600_000]))
        end = int(rng.integers(tmin + 3_600_000, cut)) // step * step
        span = step * int(rng.integers(1, 60))
        for _ in range(2):  # the same panel twice: the second is (mostly) from the cache
            raw = eng.range_query(q, end - span, end, step)
            fast = eng.range_query(q, end - span, end, step, QueryOpts(node_hooks=[hook]))
            _compare(raw, fast, q)
            reused += _reused(fast)
            end += step * int(rng.integers(0, 3))
    assert reused > 0


def test_late_sample_in_a_sealed_pane_invalidates_the_cache():
    src, summ, sdss, hook, eng, tmin, cut, tmax, more = _world(seed=71)
    q, step = "sum_over_time(g[30m])", 60_000
    end = cut // step * step - 10 * step
    first = eng.range_query(q, end - 3_600_000, end, step, QueryOpts(node_hooks=[hook]))
    again = eng.range_query(q, end - 3_600_000, end, step, QueryOpts(node_hooks=[hook]))
    assert _reused(again) == 61 and _served(again)
    cache = step_cache(sdss["g"].store)
    inv = cache.invalidations
    # a late sample between two existing samples of series g{inst="1"}, inside the cached windows
    lbl = next(l for l in sdss["g"].registry.labels if dict(l)["inst"] == "1")
    ss = src.select([m for m in sdss["g"].spec.scope_matchers()] + [], end - 1_800_000, end - 1_700_000)
    i = ss.labels.index(lbl)
    t0, t1 = ss.timestamps[ss.offsets[i]], ss.timestamps[ss.offsets[i] + 1]
    late = SampleBatch([lbl], np.zeros(1, np.int64), np.array([(t0 + t1) // 2], np.int64), np.array([5e6]))
    src.append(late)
    summ.consume(late)
    after = eng.range_query(q, end - 3_600_000, end, step, QueryOpts(node_hooks=[hook]))
    raw = eng.range_query(q, end - 3_600_000, end, step)
    _compare(raw, after, q)
    assert _reused(after) == 0 and cache.invalidations == inv + 1
    # and the raw answer really changed, so a stale reuse would have been caught
    assert not np.allclose(np.sort(first.values.ravel()), np.sort(raw.values.ravel()))


def test_lagging_new_series_in_sealed_panes_invalidates_the_cache():
    src, summ, sdss, hook, eng, tmin, cut, tmax, more = _world(seed=72)
    q, step = "count_over_time(g[20m])", 60_000
    end = cut // step * step - 5 * step
    eng.range_query(q, end - 3_600_000, end, step, QueryOpts(node_hooks=[hook]))
    # a series first seen now, with samples inside already-sealed panes (newer than the live start)
    lbl = make_labels({"__name__": "g", "job": "j9", "inst": "late"})
    ts = np.arange(end - 2_400_000, end - 600_000, 20_000, dtype=np.int64)
    b = SampleBatch([lbl], np.zeros(len(ts), np.int64), ts, np.ones(len(ts)))
    src.append(b)
    summ.consume(b)
    raw = eng.range_query(q, end - 3_600_000, end, step)
    fast = eng.range_query(q, end - 3_600_000, end, step, QueryOpts(node_hooks=[hook]))
    _compare(raw, fast, q)
    assert any(dict(l).get("inst") == "late" for l in fast.labels) and _reused(fast) == 0


def test_coverage_growth_keeps_entries_shrink_drops_them():
    src, summ, sdss, hook, eng, tmin, cut, tmax, more = _world(seed=73)
    q, step = "avg_over_time(g[10m])", 60_000
    end = cut // step * step - 5 * step
    eng.range_query(q, end - 1_800_000, end, step, QueryOpts(node_hooks=[hook]))
    sds = sdss["g"]
    sds.cov_lo -= 30  # coverage grows into the past (a backfill chunk): cached windows stay valid
    res = eng.range_query(q, end - 1_800_000, end, step, QueryOpts(node_hooks=[hook]))
    assert _reused(res) == 31
    sds.cov_lo += 60  # coverage shrank: nothing cached is trusted
    res = eng.range_query(q, end - 1_800_000, end, step, QueryOpts(node_hooks=[hook]))
    assert _reused(res) == 0
    _compare(eng.range_query(q, end - 1_800_000, end, step), res, q)


def test_backfill_into_cached_panes_invalidates():
    src, summ, sdss, hook, eng, tmin, cut, tmax, more = _world(seed=76)
    q, step = "sum_over_time(g[10m])", 60_000
    end = cut // step * step - 5 * step
    eng.range_query(q, end - 1_800_000, end, step, QueryOpts(node_hooks=[hook]))
    store = sdss["g"].store
    e0 = store.epoch
    # a write (e.g. restored rows) into a pane the cached steps relied on
    lbl = sdss["g"].registry.labels[0]
    ss = src.select([*sdss["g"].spec.scope_matchers()], end - 900_000, end - 800_000)
    sid = np.zeros(1, np.int64)
    store.ingest_sorted(sid, np.array([int(ss.timestamps[0]) + 1]), np.array([1.0]), live=False)
    assert store.epoch == e0 + 1 and lbl is not None
    res = eng.range_query(q, end - 1_800_000, end, step, QueryOpts(node_hooks=[hook]))
    assert _reused(res) == 0


def test_unsealed_steps_are_never_cached():
    src, summ, sdss, hook, eng, tmin, cut, tmax, more = _world(seed=74, seal_delay_ms=600_000)
    q, step = "sum_over_time(g[5m])", 30_000
    end = cut // step * step + 5 * step  # the last ~15 minutes are not sealed (seal delay 10 min)
    a = eng.range_query(q, end - 1_800_000, end, step, QueryOpts(node_hooks=[hook]))
    b = eng.range_query(q, end - 1_800_000, end, step, QueryOpts(node_hooks=[hook]))
    lo, hi = sdss["g"].coverage()
    sealed_steps = int(((end - 1_800_000 + np.arange(61) * step) < hi * P).sum())
    assert 0 < _reused(b) == sealed_steps < 61
    more(cut, cut + 3_600_000)  # new data lands in the formerly open panes: still equal to raw
    c = eng.range_query(q, end - 1_800_000, end, step, QueryOpts(node_hooks=[hook]))
    _compare(eng.range_query(q, end - 1_800_000, end, step), c, q)
    assert a.values.shape == b.values.shape


def test_raw_path_fills_the_cache_when_the_cost_check_keeps_a_panel_raw():
    src, summ, sdss, hook, eng, tmin, cut, tmax, more = _world(seed=75, cost_based=True)
    q, step = "rate(x_total[5m])", 30_000  # step < pane: the edges cover the whole span -> raw
    end = cut // step * step - 4 * step
    first = eng.range_query(q, end - 3_600_000, end, step, QueryOpts(node_hooks=[hook]))
    assert first.stats.paths == ["raw"]
    _compare(eng.range_query(q, end - 3_600_000, end, step), first, q)
    end2 = end + 2 * step  # the refresh: two new steps, the rest from the cache
    second = eng.range_query(q, end2 - 3_600_000, end2, step, QueryOpts(node_hooks=[hook]))
    assert _served(second) and _reused(second) == 119
    _compare(eng.range_query(q, end2 - 3_600_000, end2, step), second, q)
    # the raw answer evaluated by the hook carries the engine's own annotations (with positions)
    q2 = "sum(rate(g[5m]))"
    a = eng.range_query(q2, end - 3_600_000, end, step, QueryOpts(node_hooks=[hook]))
    b = eng.range_query(q2, end - 3_600_000, end, step)
    assert a.stats.paths == ["raw"] and a.annotations.infos == b.annotations.infos and a.annotations.infos
    assert a.annotations.warnings == b.annotations.warnings
    _compare(b, a, q2)


def test_edge_reads_skip_dense_stretches_between_edges():
    # 3 series: sparse (5 min) history, then a dense (100 ms) last hour
    lbls = [make_labels({"__name__": "g", "inst": str(i)}) for i in range(3)]
    t_sparse = np.arange(0, 20 * 3_600_000, 300_000, dtype=np.int64) + 1_700_000_000_000
    t_dense = np.arange(t_sparse[-1] + 100, t_sparse[-1] + 3_600_000, 100, dtype=np.int64)
    ts = np.concatenate([t_sparse, t_dense])
    rng = np.random.default_rng(3)
    items = [(l, ts, rng.normal(10, 1, len(ts))) for l in lbls]
    src, batch = load(items)
    summ = Summarizer(src)
    sds = SDS(SDSSpec("g", "exact", P))
    summ.start_live(sds, live_from_ts=int(ts[-1]) + 1)
    summ.backfill(sds, 30 * 86_400_000)
    summ.note_time(int(ts[-1]) + 10 * P)
    ends = np.arange(int(ts[-1]) - 6 * 3_600_000, int(ts[-1]), 1_800_000, dtype=np.int64) + 17_000  # 12 steps
    lo, hi = sds.coverage()
    plan = plan_windows(ends, 2 * 3_600_000, P, lo, hi)
    reads = coalesce_reads(plan.raw_intervals(), P, sds.store.pane_totals())
    mid = int(t_dense[0]) + 900_000  # between the edges of two steps inside the dense hour
    assert not any(a <= mid <= b for a, b in reads), reads  # the dense hour is not read through between its edges
    sel, raw = _read_raw(sds, src, [m for m in sds.spec.scope_matchers()], plan)
    sel2, raw2 = _read_raw(sds, src, [m for m in sds.spec.scope_matchers()], plan, max_reads=2)
    assert len(raw.ts) < len(raw2.ts) / 3
    eng = Engine(src)
    hook = RewriteHook(RewriteContext(lambda m, a, ms, func=None: sds if a == "exact" else None, cost_based=False))
    q = "avg_over_time(g[2h])"
    _compare(eng.range_query(q, int(ends[0]), int(ends[-1]), 1_800_000),
             eng.range_query(q, int(ends[0]), int(ends[-1]), 1_800_000, QueryOpts(node_hooks=[hook])), q)
    # the estimate itself: per-pane totals prorated
    est = samples_between(np.array([t_dense[0]]), np.array([t_dense[0] + 600_000]), P, *sds.store.pane_totals())
    assert 0.8 * 18_000 <= est[0] <= 1.2 * 18_000


# --- over real HTTP ------------------------------------------------------------------------------
def _get(url: str, path: str, **params) -> dict:
    with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=60) as r:
        return json.loads(r.read())


def test_http_refresh_reuses_steps_reports_it_and_equals_exact(tmp_path):
    from tests.test_planner_http import _ingest_history, _matrix

    cfg = tmp_path / "tp.yml"
    # whole-query step answers off: this test is about the summary's own step cache (served while measured)
    cfg.write_text("planner:\n  min_count: 2\n  canary_fraction: 0\n  seal_delay: 0s\n  step_cache_bytes: 0\n"
                   "  measure_first: false\n")
    srv = ServerProcess(tmp_path / "data", ["--config", str(cfg), "--wal-fsync", "never"])
    srv.start()
    try:
        now = int(time.time() * 1000) // 60_000 * 60_000
        _ingest_history(srv.url, now - 60_000, hours=3.0)
        q = "sum by (job) (increase(req_total[20m]))"
        step = 60
        end = (now - 120_000) // 1000 // step * step
        for k in range(3):  # recurrences: adoption
            _get(srv.url, "/api/v1/query_range", query=q, start=end - 7200 - k * step, end=end - k * step, step=step)
        deadline = time.time() + 60
        while time.time() < deadline:
            plans = _get(srv.url, "/api/v1/planner/plans")["data"]["plans"]
            if plans and all(p["backfill"]["state"] == "done" for p in plans):
                break
            time.sleep(0.3)
        seen = []
        for k in range(3):
            e = end - 600 + k * step
            fast = _get(srv.url, "/api/v1/query_range", query=q, start=e - 7200, end=e, step=step, stats="all")
            exact = _get(srv.url, "/api/v1/query_range", query=q, start=e - 7200, end=e, step=step, exact="true")
            fm, em = _matrix(fast), _matrix(exact)
            assert fm.keys() == em.keys()
            for key in fm:
                a, b = np.array(fm[key]), np.array(em[key])
                assert (a[:, 0] == b[:, 0]).all()
                np.testing.assert_allclose(a[:, 1], b[:, 1], rtol=1e-9)
            seen.append(" ".join(fast.get("infos", [])))
        assert "served from summary" in seen[-1] and "steps reused from its step cache" in seen[-1], seen
        plans = _get(srv.url, "/api/v1/planner/plans")["data"]["plans"]
        sc = [p["step_cache"] for p in plans if p.get("step_cache")]
        assert sc and sum(c["steps_reused"] for c in sc) > 0
    finally:
        srv.stop()


def test_step_cache_is_bounded_lru():
    c = StepCache(max_keys=3, max_bytes=10_000)
    sel = np.arange(10, dtype=np.int64)
    for k in range(5):
        c.put(("f", k, ()), None, np.arange(20, dtype=np.int64), np.zeros((10, 20)), np.ones((10, 20), bool), sel, 0, 0, 10)
    assert len(c.d) <= 3 and c.nbytes <= 10_000 and ("f", 4, ()) in c.d
    big = np.arange(4000, dtype=np.int64)
    c.put(("f", 9, ()), None, big, np.zeros((10, 4000)), np.ones((10, 4000), bool), sel, 0, 0, 10)
    assert list(c.d) == [("f", 9, ())]  # the newest entry stays even when alone over the budget
    assert c.get(("f", 9, ()), 1, 0, 10) is None and c.nbytes == 0 and c.invalidations == 1  # epoch moved


def test_step_cache_keeps_what_recent_uses_ask_for_and_unaligned_grids_from_their_second_use():
    c = StepCache()
    sel = np.arange(4, dtype=np.int64)

    def add(key, ends, first):
        e = c.d.get(key)
        if c.admits(key, e):
            c.put(key, e, ends, np.ones((4, len(ends))), np.ones((4, len(ends)), bool), sel, 0, 0, 4, first_end=first)

    # a 1 h panel at 15 s refreshed for hours: only the steps its refreshes still ask for are kept
    aligned = ("rate", (), 300_000, None, ())
    step, t = 15_000, 10_000 * 15_000
    add(aligned, np.arange(t - 3_600_000, t + 1, step, dtype=np.int64), t - 3_600_000)
    for k in range(1, 400):
        now = t + k * step
        add(aligned, np.array([now], np.int64), now - 3_600_000)
    assert c.d[aligned].ends[0] >= t + 399 * step - 3_600_000 - 600 * step  # not the first refresh's steps
    assert len(c.d[aligned].ends) < 4096
    assert c.d[aligned].ends[-1] == t + 399 * step
    # a client sending end=now: a new grid each time, kept only when the same grid comes again
    odd = ("rate", (), 300_000, None, (15_000, 1234))
    ends = np.arange(t + 1234, t + 1234 + 10 * step, step, dtype=np.int64)
    add(odd, ends, int(ends[0]))
    assert odd not in c.d and c.describe()["unkept"] == 1
    add(odd, ends, int(ends[0]))
    assert odd in c.d
