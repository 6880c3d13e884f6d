"""KLL-served quantile_over_time: observed rank error within the stated bound (>= 99% of windows),
and the canary reports it."""
from __future__ import annotations

import numpy as np

from planner.canary import Canary
from planner.kll_store import rank_error
from planner.rewrite import RewriteHook
from planner.rewrite_rules import RewriteContext
from promql.engine import Engine
from promql.query_opts import QueryOpts
from storage.labels import make_labels
from tests.test_planner_fixtures import T0, load, summarized


def test_kll_rank_error_within_bound():
    rng = np.random.default_rng(3)
    items = []
    for i in range(4):
        n = 20_000
        ts = T0 + np.cumsum(rng.integers(500, 1500, n))
        vals = rng.lognormal(0, 1, n) * (i + 1)
        items.append((make_labels({"__name__": "lat", "inst": str(i)}), ts, vals))
    src, batch = load(items)
    tmin, tmax = int(batch.timestamps.min()), int(batch.timestamps.max())
    summ, (sds,) = summarized(src, batch, [("lat", "kll")], live_from=tmin + (tmax - tmin) // 3)
    canary = Canary(fraction=0.0)
    served = []
    hook = RewriteHook(RewriteContext(lambda m, a, ms, func=None: sds if (m, a) == ("lat", "kll") else None,
                                      lambda s, ctx: served.append((s, ctx)), cost_based=False, approximate=True))
    eng = Engine(src)
    bound = rank_error(sds.store.k)
    errors = []
    for phi, rng_s, step in [(0.5, 3600, 60), (0.9, 1800, 97), (0.99, 7200, 300), (0.1, 600, 15)]:
        q = f"quantile_over_time({phi}, lat[{rng_s}s])"
        start, end = tmin + 2 * 3_600_000, tmin + 4 * 3_600_000
        res = eng.range_query(q, start, end, step * 1000, QueryOpts(node_hooks=[hook]))
        assert any(p.startswith("summary:kll-") for p in res.stats.paths)
        assert any("rank error" in i for i in res.annotations.infos)
        s, ctx = served[-1]
        rec = canary.check_now(s, ctx)
        assert rec["checked"] > 0 and rec["rank_checked"] > 0
        errors.append((rec["rank_within_bound"], rec["rank_checked"], rec["within_bound"], rec["checked"]))
        assert rec["rank_bound"] == bound
        assert any("value bound:" in i for i in res.annotations.infos), res.annotations.infos
    within = sum(e[0] for e in errors)
    total = sum(e[1] for e in errors)
    assert within / total >= 0.99, (within, total, bound)
    # the value the reader sees: Prometheus's answer inside the stated interval
    assert sum(e[2] for e in errors) >= 0.99 * sum(e[3] for e in errors), errors
    # the served windows are a real mix of summary panes and raw edges
    assert sds.stats.raw_edge_samples > 0 and sds.stats.windows_served > 0


def test_kll_small_windows_are_exact_quantiles():
    """Below k samples a KLL sketch keeps every item: the answer is an actual window sample whose
    rank brackets phi."""
    rng = np.random.default_rng(5)
    ts = T0 + np.arange(3000) * 10_000
    items = [(make_labels({"__name__": "lat", "inst": "a"}), ts, rng.normal(0, 1, 3000))]
    src, batch = load(items)
    summ, (sds,) = summarized(src, batch, [("lat", "kll")], live_from=T0 + 5_000_000)
    hook = RewriteHook(RewriteContext(lambda m, a, ms, func=None: sds, cost_based=False, approximate=True))
    res = Engine(src).instant_query("quantile_over_time(0.75, lat[10m])", T0 + 20_000_000 + 1234, QueryOpts(node_hooks=[hook]))
    assert res.stats.paths[0].startswith("summary:")
    w = items[0][2][(ts > T0 + 20_000_000 + 1234 - 600_000) & (ts <= T0 + 20_000_000 + 1234)]
    v = res.values[0]
    assert v in w
    r_lo, r_hi = (w < v).mean(), (w <= v).mean()
    assert r_lo - 1 / len(w) <= 0.75 <= r_hi + 1 / len(w)
