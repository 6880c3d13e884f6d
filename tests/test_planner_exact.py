"""Exact algorithms served from summaries equal the raw engine answer (1e-9 relative), for random
data, ranges, steps and offsets, including windows with partial edge panes and no whole pane."""
from __future__ import annotations

import numpy as np
import pytest

from planner.rewrite import RewriteHook
from planner.rewrite_rules import RewriteContext
from promql.engine import Engine
from promql.query_opts import QueryOpts
from tests.test_planner_fixtures import T0, load, random_series, summarized

EXACT_QUERIES = [
    "sum_over_time(g[{r}])", "count_over_time(g[{r}])", "avg_over_time(g[{r}])", "min_over_time(g[{r}])",
    "max_over_time(g[{r}])", "stddev_over_time(g[{r}])", "stdvar_over_time(g[{r}])", "last_over_time(g[{r}])",
    "present_over_time(g[{r}])", "changes(g[{r}])", "delta(g[{r}])",
    "rate(x_total[{r}])", "increase(x_total[{r}])", "resets(x_total[{r}])", "sum_over_time(x_total{{job=\"j1\"}}[{r}])",
    "sum by (job) (rate(x_total[{r}]))", "avg without (inst) (max_over_time(g[{r}] offset 7m))",
    "histogram_quantile(0.9, sum by (le) (rate(h_bucket[{r}])))",
]


@pytest.fixture(scope="module")
def world():
    items = random_series(seed=7)
    src, batch = load(items)
    tmin, tmax = int(batch.timestamps.min()), int(batch.timestamps.max())
    live_from = tmin + (tmax - tmin) // 2 + 12_345  # half backfilled, half live; not pane aligned
    summ, sdss = summarized(src, batch, [("g", "exact"), ("x_total", "exact"), ("h_bucket", "exact")], live_from)
    by = {s.metric: s for s in sdss}

    def find(metric, alg, matchers, func=None):
        s = by.get(metric)
        return s if s is not None and s.spec.algorithm == alg else None

    hook = RewriteHook(RewriteContext(find, cost_based=False))
    return Engine(src), hook, tmin, tmax, sdss


def _compare(raw, fast, query):
    assert raw.result_type == fast.result_type
    rl = {l: i for i, l in enumerate(raw.labels)}
    assert sorted(rl) == sorted(fast.labels), query
    for j, l in enumerate(fast.labels):
        i = rl[l]
        if raw.result_type == "matrix":
            rp, fp = raw.present[i], fast.present[j]
            assert (rp == fp).all(), (query, l)
            a, b = raw.values[i][rp], fast.values[j][fp]
        else:
            a, b = raw.values[i:i + 1], fast.values[j:j + 1]
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12, equal_nan=True, err_msg=f"{query} {l}")


@pytest.mark.parametrize("qi", range(len(EXACT_QUERIES)))
def test_exact_matches_raw_range_queries(world, qi):
    eng, hook, tmin, tmax, _ = world
    rng = np.random.default_rng(100 + qi)
    served = 0
    for trial in range(6):
        r_ms = int(rng.choice([45_000, 300_000, 1_000_000 + int(rng.integers(0, 999)), 3_600_000, 4 * 3_600_000]))
        step = int(rng.choice([15_000, 60_000, 137_000, 600_000]))
        start = int(rng.integers(tmin - 600_000, tmax - 3_600_000))
        end = min(start + step * int(rng.integers(1, 120)), tmax + 600_000)
        q = EXACT_QUERIES[qi].format(r=f"{r_ms // 1000}s")
        raw = eng.range_query(q, start, end, step)
        fast = eng.range_query(q, start, end, step, QueryOpts(node_hooks=[hook]))
        _compare(raw, fast, q)
        served += any(p.startswith("summary:") for p in fast.stats.paths)
        assert raw.stats.paths == ["raw"]
    assert served >= 3, "summary path should serve most of these windows"


def test_exact_instant_queries_and_infos(world):
    eng, hook, tmin, tmax, sdss = world
    for q in ["rate(x_total[1h])", "stddev_over_time(g[30m])", "sum(increase(x_total[2h]))"]:
        t = tmin + (tmax - tmin) * 3 // 4 + 777
        raw = eng.instant_query(q, t)
        fast = eng.instant_query(q, t, QueryOpts(node_hooks=[hook]))
        _compare(raw, fast, q)
        assert any(p.startswith("summary:exact-") for p in fast.stats.paths)
        assert any("served from summary" in i and "exact" in i for i in fast.annotations.infos)


def test_window_without_whole_pane_falls_back_to_raw(world):
    eng, hook, tmin, tmax, _ = world
    fast = eng.instant_query("rate(x_total[50s])", tmin + 3_600_000 + 5_000, QueryOpts(node_hooks=[hook]))
    assert fast.stats.paths == ["raw"]


@pytest.mark.parametrize("q", ["rate(x_total[1h] anchored)", "increase(x_total[1h] smoothed)",
                               "sum by (job) (delta(g[1h] anchored))", "resets(x_total[2h] anchored)"])
def test_anchored_and_smoothed_windows_run_raw(world, q):
    """Their boundary values come from samples outside the window: a pane summary cannot give them."""
    eng, hook, tmin, tmax, _ = world
    t = tmin + (tmax - tmin) * 3 // 4 + 777
    raw = eng.range_query(q, t - 3_600_000, t, 60_000)
    fast = eng.range_query(q, t - 3_600_000, t, 60_000, QueryOpts(node_hooks=[hook]))
    assert fast.stats.paths == ["raw"]
    _compare(raw, fast, q)
    plain = q.replace(" anchored", "").replace(" smoothed", "")
    assert any(p.startswith("summary:") for p in eng.range_query(plain, t - 3_600_000, t, 60_000,
                                                                  QueryOpts(node_hooks=[hook])).stats.paths)


def test_metric_without_plan_runs_raw(world):
    eng, hook, tmin, tmax, _ = world
    src_q = "quantile_over_time(0.5, g[1h])"  # no KLL SDS in this world
    fast = eng.instant_query(src_q, tmin + 7_200_000, QueryOpts(node_hooks=[hook]))
    assert fast.stats.paths == ["raw"]


def test_constant_and_single_sample_windows_have_zero_stddev():
    """Sum-of-squares rounding must not turn Prometheus's exact 0 into a tiny positive stddev."""
    from storage.labels import make_labels

    ts = T0 + np.arange(2000) * 300_000  # one sample per 5m
    vals = np.where(np.arange(2000) % 500 < 250, 0.6123456789, np.random.default_rng(1).random(2000))
    src, batch = load([(make_labels({"__name__": "g", "i": "0"}), ts, vals)])
    _, (sds,) = summarized(src, batch, [("g", "exact")], live_from=int(ts[1000]))
    hook = RewriteHook(RewriteContext(lambda m, a, ms, func=None: sds, cost_based=False))
    eng = Engine(src)
    for q in ["stddev_over_time(g[6m])", "stdvar_over_time(g[6m])", "stddev_over_time(g[6h])"]:
        # evaluation 90 s after a sample: a 6m window holds exactly that sample, inside a whole pane
        start, end = int(ts[100]) + 90_000, int(ts[1900]) + 90_000
        raw = eng.range_query(q, start, end, 3_600_000)
        fast = eng.range_query(q, start, end, 3_600_000, QueryOpts(node_hooks=[hook]))
        assert fast.stats.paths[0].startswith("summary:")
        _compare(raw, fast, q)
        zeros = raw.values[raw.present] == 0
        assert zeros.any() and (fast.values[fast.present][zeros] == 0).all()


@pytest.fixture(scope="module")
def aligned_world():
    """Scrape-like data with jittered timestamps, plus series whose samples fall exactly on pane and step
    boundaries (a text import with round timestamps), summarized with 15 s panes."""
    rng = np.random.default_rng(31)
    from storage.labels import make_labels

    items = []
    n = 1200
    for i in range(6):
        base = T0 - T0 % 15_000 + 15_000  # on pane and step boundaries
        jitter = 0 if i >= 4 else int(rng.integers(1, 14_999))
        ts = base + jitter + 15_000 * np.arange(n, dtype=np.int64)
        if i == 5:
            ts = ts[rng.random(n) < 0.7]  # gaps: some boundary instants hold a sample, some not
        g = rng.normal(50, 10, len(ts))
        c = np.cumsum(rng.integers(0, 5, len(ts))).astype(float)
        c[len(ts) // 2:] -= c[len(ts) // 2]  # a reset
        items.append((make_labels({"__name__": "g", "inst": str(i)}), ts, g))
        items.append((make_labels({"__name__": "x_total", "inst": str(i)}), ts, c))
    src, batch = load(items)
    tmin, tmax = int(batch.timestamps.min()), int(batch.timestamps.max())
    live_from = tmin + (tmax - tmin) // 2 + 12_345
    summ, sdss = summarized(src, batch, [("g", "exact"), ("x_total", "exact")], live_from, pane_ms=15_000)
    by = {s.metric: s for s in sdss}
    hook = RewriteHook(RewriteContext(lambda metric, alg, m, func=None: by.get(metric) if alg == "exact" else None, cost_based=False))
    return Engine(src), hook, tmin, tmax, src


@pytest.mark.parametrize("q", ["sum_over_time(g[{r}])", "min_over_time(g[{r}])", "avg_over_time(g[{r}])",
                               "last_over_time(g[{r}])", "count_over_time(g[{r}])", "changes(g[{r}])",
                               "rate(x_total[{r}])", "increase(x_total[{r}])", "resets(x_total[{r}])",
                               'sum(rate(x_total{{inst!~"[45]"}}[{r}]))',
                               # a series with a sample on some boundaries: those steps raw, the others not
                               'max_over_time(g{{inst=~"0|5"}}[{r}])', 'increase(x_total{{inst=~"1|5"}}[{r}])'])
def test_grafana_aligned_windows_need_no_raw_edges_and_equal_raw(aligned_world, q):
    eng, hook, tmin, tmax, _ = aligned_world
    for r_ms in (60_000, 300_000, 3_600_000):
        qq = q.format(r=f"{r_ms // 1000}s")
        end = (tmax - 600_000) // 15_000 * 15_000
        start = end - 3_600_000
        raw = eng.range_query(qq, start, end, 15_000)
        fast = eng.range_query(qq, start, end, 15_000, QueryOpts(node_hooks=[hook]))
        _compare(raw, fast, qq)
        assert any(p.startswith("summary:") for p in fast.stats.paths), qq
        if "inst!~" in qq:  # only jittered series selected: every window is whole panes, nothing read raw
            assert fast.stats.samples_scanned == 0, (qq, fast.stats.samples_scanned)
        else:  # boundary samples of the round-timestamp series keep those edges raw
            assert fast.stats.samples_scanned > 0, qq


def test_backfill_interleaved_with_live_panes_regrows_logarithmically():
    """A backfill (chunks of older panes, newest first) while live ingest adds a pane at the right
    after each chunk: the matrix is reallocated O(log) times, not once or twice per chunk, every pane
    keeps what was folded into it, and the spare room stays within half the used width."""
    from planner.exact_store import ExactPaneStore

    P, rows, chunk, chunks = 15_000, 50, 240, 30
    st = ExactPaneStore(P, fields=("corr",))
    st.ensure_series(rows)
    sid = np.arange(rows, dtype=np.int64)
    live = 10_000
    buffers, expect = set(), {}

    def fold_live(k):
        st.ingest_sorted(sid, np.full(rows, k * P + 1, np.int64), np.full(rows, float(k)), live=True)
        expect[k] = float(k)

    fold_live(live)
    for c in range(chunks):
        k = np.arange(10_000 - (c + 1) * chunk, 10_000 - c * chunk)
        st.ingest_sorted(np.repeat(sid, chunk), np.tile(k * P + 2, rows), np.tile(k.astype(float), rows), live=False)
        expect.update({int(x): float(x) for x in k})
        live += 1
        fold_live(live)
        buffers.add(id(st._phys["count"]))
    assert len(buffers) <= 12, len(buffers)  # 30 chunks, 7,230 panes: ~9 regrowths
    assert st.k0 == 10_000 - chunks * chunk and st.nk == chunks * chunk + chunks + 1
    assert st._phys["count"].shape[1] <= 1.5 * st.nk + 64
    ks = np.array(sorted(expect))
    got = st.cols["last_v"][:, ks - st.k0]
    assert (st.cols["count"][:, ks - st.k0] == 1).all()
    np.testing.assert_array_equal(got, np.broadcast_to(ks.astype(float), got.shape))
