"""Over real HTTP (remote write into a real server with an out-of-order window): the planner adopts a
REQ SDS for a recurring tail-quantile panel and a group SDS for a recurring ``sum by (job)
(sum_over_time(...))`` panel without configuration and reports the bound; late samples
accepted by storage are folded so exact answers stay equal to exact=true; both survive a restart."""
from __future__ import annotations

import time

import numpy as np
import pytest

from tests.helpers import ServerProcess
from tests.test_planner_fixtures import SMALL_DATA_PRIOR_S
from tests.test_planner_http import _get, _matrix, _same, _write

STEP_MS = 15_000


@pytest.fixture
def ooo_server(tmp_path):
    cfg = tmp_path / "turboprom.yml"
    # group_min_series: this test's 3 series stand in for a high-cardinality scope (default 1000)
    # summary_cost_prior: tests/test_planner_fixtures.py's SMALL_DATA_PRIOR_S
    cfg.write_text(f"planner:\n  summary_cost_prior: {SMALL_DATA_PRIOR_S}\n  approximate: true\n  seal_delay: 0s\n  canary_fraction: 1.0\n  group_min_series: 3\n"
                   "  step_cache_bytes: 0\n"  # refreshes reach the summaries this test is about,
                   "  measure_first: false\n")  # served while measured (test_planner_measure_first: the default)
    srv = ServerProcess(tmp_path / "data", ["--config", str(cfg), "--wal-fsync", "never", "--out-of-order-window", "3h"])
    yield srv, cfg
    srv.stop()


def _history(url: str, end_ms: int, hours: float = 3.0) -> dict:
    rng = np.random.default_rng(31)
    n = int(hours * 3_600_000 / STEP_MS)
    ts = end_ms - (n - 1 - np.arange(n)) * STEP_MS
    data = []
    # latencies every 0.6 s (a tail-quantile panel over 1 h windows of 6,000 samples: where a sketch
    # clearly pays; with fewer samples per window the cost model may rightly keep the raw path)
    m = 25 * n
    lat_ts = end_ms - (m - 1 - np.arange(m)) * (STEP_MS // 25)
    for i in range(3):
        data.append(({"__name__": "lat_seconds", "inst": f"i{i}"}, lat_ts + i * 150, 0.2 + rng.lognormal(0, 1, m)))
        data.append(({"__name__": "req_total", "job": f"j{i % 2}", "inst": f"i{i}"}, ts + i * 700,
                     np.cumsum(rng.random(n) * 5)))
    parts = [np.array_split(np.arange(len(t)), 6) for _, t, _ in data]
    for c in range(6):
        _write(url, [(l, t[p[c]], v[p[c]]) for (l, t, v), p in zip(data, parts)])
    return {json_key(l): (t, v) for l, t, v in data}


def json_key(labels: dict) -> str:
    return ",".join(f"{k}={labels[k]}" for k in sorted(labels))


def _wait_plans(url: str, algorithms: set[str]) -> list[dict]:
    deadline = time.time() + 60
    plans: list[dict] = []
    while time.time() < deadline:
        plans = _get(url, "/api/v1/planner/plans")["data"]["plans"]
        if {p["algorithm"] for p in plans} >= algorithms and all(
                p["backfill"]["state"] == "done" and p["coverage"]["panes"] > 0 for p in plans):
            return plans
        time.sleep(0.3)
    cands = _get(url, "/api/v1/planner/candidates")["data"]
    raise AssertionError(f"plans not adopted/backfilled: {plans}; candidates: {cands}")


def test_req_adoption_and_late_samples_over_http(ooo_server):
    srv, cfg = ooo_server
    srv.start()
    url = srv.url
    end = int(time.time() * 1000) // 1000 * 1000
    data = _history(url, end)
    tail = dict(query="quantile_over_time(0.99, lat_seconds[1h])", start=(end - 2 * 3_600_000) / 1000,
                end=(end - 60_000) / 1000, step="300")
    rate = dict(query="sum by (job) (rate(req_total[1h]))", start=(end - 2 * 3_600_000) / 1000,
                end=(end - 60_000) / 1000, step="600")
    group = dict(query="sum by (job) (sum_over_time(req_total[1h]))", start=(end - 2 * 3_600_000) / 1000,
                 end=(end - 60_000) / 1000, step="600")
    resets = dict(rate, query="resets(req_total[2h])", step="900")
    for _ in range(4):  # recurring panels, nothing configured for them
        assert _get(url, "/api/v1/query_range", **tail)["status"] == "success"
        assert _get(url, "/api/v1/query_range", **rate)["status"] == "success"
        assert _get(url, "/api/v1/query_range", **group)["status"] == "success"
        assert _get(url, "/api/v1/query_range", **resets)["status"] == "success"  # its plan keeps reset counts too
    plans = _wait_plans(url, {"req", "exact", "group"})
    grp = next(p for p in plans if p["algorithm"] == "group")
    assert grp["metric"] == "req_total" and grp["grouping"] == ["job"]
    req = next(p for p in plans if p["algorithm"] == "req")
    assert req["metric"] == "lat_seconds" and "REQ" in req["error_bound"]
    fast = _get(url, "/api/v1/query_range", **tail, stats="all")
    assert any("algorithm req" in i and "rank error <=" in i for i in fast.get("infos", [])), fast.get("infos")
    exact = _get(url, "/api/v1/query_range", **tail, exact="true")
    assert not any("served from summary" in i for i in exact.get("infos", []))
    # the canary (fraction 1.0) re-evaluated the REQ answers on raw data: within the stated bound
    deadline = time.time() + 30
    checks: list = []
    while time.time() < deadline and not checks:
        checks = [c for c in _get(url, "/api/v1/planner/canary")["data"]["checks"] if c["algorithm"] == "req"]
        time.sleep(0.2)
    assert checks and sum(c["within_bound"] for c in checks) >= 0.99 * sum(c["checked"] for c in checks)

    # late samples: between existing ones, inside the summarized panes (one forces a counter reset)
    rng = np.random.default_rng(5)
    late = []
    for key, (ts, vals) in data.items():
        if not key.startswith("__name__=req_total"):
            continue
        idx = np.sort(rng.choice(np.arange(len(ts) // 3, len(ts) - 8), 12, replace=False))
        lv = (vals[idx] + vals[idx + 1]) / 2
        lv[3] = 0.5  # a drop: reset correction and resets() change
        labels = dict(p.split("=", 1) for p in key.split(","))
        late.append((labels, ts[idx] + 5_000, lv))
    _write(url, late)
    for q, step in [("sum by (job) (rate(req_total[1h]))", "600"), ("resets(req_total[2h])", "900"),
                    ("increase(req_total[30m])", "300"), ("sum by (job) (sum_over_time(req_total[1h]))", "600"),
                    ("sum(sum_over_time(req_total[2h]))", "900")]:
        p = dict(query=q, start=(end - 2 * 3_600_000) / 1000, end=(end - 60_000) / 1000, step=step)
        f = _get(url, "/api/v1/query_range", **p)
        e = _get(url, "/api/v1/query_range", **p, exact="true")
        assert any("served from summary" in i for i in f.get("infos", [])), (q, f.get("infos"), _get(url, "/api/v1/planner/candidates")["data"])
        _same(_matrix(f), _matrix(e))
    plans = _get(url, "/api/v1/planner/plans")["data"]["plans"]
    ex = next(p for p in plans if p["algorithm"] == "exact")
    assert ex["late_folded"] == 36 and ex["late_dropped"] == 0
    grp = next(p for p in plans if p["algorithm"] == "group")
    assert grp["late_dropped"] == 0

    srv.stop()
    srv2 = ServerProcess(srv.data_dir, ["--config", str(cfg), "--wal-fsync", "never", "--out-of-order-window", "3h"],
                         port=srv.port)
    srv2.start()
    try:
        plans2 = _get(url, "/api/v1/planner/plans")["data"]["plans"]
        assert {p["algorithm"] for p in plans2} == {"req", "exact", "group"}
        assert all(p["backfill"]["state"] == "restored" for p in plans2)
        again = _get(url, "/api/v1/query_range", **tail)
        assert any("algorithm req" in i for i in again.get("infos", []))
        _same(_matrix(again), _matrix(fast))
        for p in (rate, group):
            f = _get(url, "/api/v1/query_range", **p)
            assert any("served from summary" in i for i in f.get("infos", [])), p
            _same(_matrix(f), _matrix(_get(url, "/api/v1/query_range", **p, exact="true")))
    finally:
        srv2.stop()
