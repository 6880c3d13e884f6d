"""End to end over real HTTP: remote-write data into a real server, repeat a dashboard query, the
planner adopts an SDS without configuration, backfills, then serves the query from the summary with
the same answer as exact=true; explain/list via API and CLI; recording rules; restart recovery."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest

from ingest.proto.messages import WriteRequest
from ingest.snappy_block import compress
from tests.helpers import REPO, ServerProcess
from tests.test_planner_fixtures import SMALL_DATA_PRIOR_S

STEP_MS = 15_000


def _get(url: str, path: str, **params) -> dict:
    q = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}{path}?{q}", timeout=60) as r:
        return json.loads(r.read())


def _write(url: str, series: list[tuple[dict, np.ndarray, np.ndarray]]) -> None:
    w = WriteRequest()
    for labels, ts, vs in series:
        t = w.timeseries.add()
        for n, v in sorted(labels.items()):
            t.labels.add(name=n, value=v)
        for a, b in zip(ts.tolist(), vs.tolist()):
            t.samples.add(value=b, timestamp=a)
    req = urllib.request.Request(url + "/api/v1/write", data=compress(w.SerializeToString()), method="POST",
                                 headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
                                          "X-Prometheus-Remote-Write-Version": "0.1.0"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 204


def _ingest_history(url: str, end_ms: int, hours: float = 3.0) -> None:
    rng = np.random.default_rng(11)
    n = int(hours * 3_600_000 / STEP_MS)
    ts = end_ms - (n - 1 - np.arange(n)) * STEP_MS
    data = []
    for i in range(4):
        c = np.cumsum(rng.random(n) * 5)
        c[n // 2:] -= c[n // 2] - 1.0  # one counter reset
        data.append(({"__name__": "req_total", "job": f"j{i % 2}", "inst": f"i{i}"}, ts + i * 700, c))
    for chunk in np.array_split(np.arange(n), 6):  # in time order, like a sender would
        _write(url, [(l, t[chunk], v[chunk]) for l, t, v in data])


def _matrix(body: dict) -> dict:
    out = {}
    for s in body["data"]["result"]:
        out[json.dumps(s["metric"], sort_keys=True)] = [(p[0], float(p[1])) for p in s["values"]]
    return out


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        ta, va = zip(*a[k])
        tb, vb = zip(*b[k])
        assert ta == tb
        np.testing.assert_allclose(va, vb, rtol=1e-9)


@pytest.fixture
def planner_server(tmp_path):
    cfg = tmp_path / "turboprom.yml"
    (tmp_path / "rules.yml").write_text(
        "groups:\n- name: dash\n  interval: 1s\n  rules:\n"
        "  - record: job:req:rate10m\n    expr: sum by (job) (rate(req_total[10m]))\n"
        "  - alert: AlwaysOn\n    expr: vector(1)\n")
    # served while measured: on these 4 series the summary path may measure slower than raw, and these
    # tests are about what serving looks like (test_planner_measure_first: the default, measured first)
    # summary_cost_prior: tests/test_planner_fixtures.py's SMALL_DATA_PRIOR_S
    cfg.write_text(f"planner:\n  summary_cost_prior: {SMALL_DATA_PRIOR_S}\n  min_count: 3\n  period: 10m\n  pane: 1m\n  seal_delay: 0s\n  history: 1d\n"
                   "  canary_fraction: 1.0\n  measure_first: false\nrule_files: [rules.yml]\n")
    srv = ServerProcess(tmp_path / "data", ["--config", str(cfg), "--wal-fsync", "never"])
    yield srv, cfg
    srv.stop()


def test_adopts_recurring_query_and_serves_it_exactly(planner_server):
    srv, cfg = planner_server
    srv.start()
    url = srv.url
    end = int(time.time() * 1000) // 1000 * 1000
    _ingest_history(url, end)
    q = "sum by (job) (rate(req_total[1h]))"
    params = dict(query=q, start=(end - 2 * 3_600_000) / 1000, end=(end - 120_000) / 1000, step="600")
    first = _get(url, "/api/v1/query_range", **params, stats="all")
    assert first["status"] == "success"
    for _ in range(3):  # recurring dashboard refreshes
        _get(url, "/api/v1/query_range", **params)
    plans = None
    deadline = time.time() + 60
    while time.time() < deadline:
        plans = _get(url, "/api/v1/planner/plans")["data"]["plans"]
        if plans and all(p["backfill"]["state"] == "done" for p in plans) and plans[0]["coverage"]["panes"] > 0:
            break
        time.sleep(0.3)
    assert plans, "planner did not adopt the recurring query"
    assert plans[0]["metric"] == "req_total" and plans[0]["algorithm"] == "exact"
    assert plans[0]["backfill"]["state"] == "done"
    # steps not answered before (another alignment: nothing to reuse), so the summary answers them
    cold = dict(params, start=params["start"] - 300, end=params["end"] - 300)
    fast = _get(url, "/api/v1/query_range", **cold, stats="all")
    exact = _get(url, "/api/v1/query_range", **cold, exact="true")
    assert any("served from summary" in i for i in fast.get("infos", [])), fast.get("infos")
    _get(url, "/api/v1/query_range", **cold)  # a grid off the step's multiples is kept from its second query
    again = _get(url, "/api/v1/query_range", **cold, stats="all")  # the refresh reuses those steps' answers
    assert any(p.startswith("steps:reused:") for p in again["data"]["stats"]["turboprom"]["paths"]), again["data"].get("stats")
    assert not again.get("infos"), again.get("infos")  # exact reuse: the body is what Prometheus would send
    _same(_matrix(again), _matrix(exact))
    assert not exact.get("infos") or not any("served from summary" in i for i in exact["infos"])
    _same(_matrix(fast), _matrix(exact))
    # explain over HTTP and the CLI
    ex = _get(url, "/api/v1/planner/explain", query=q, start=params["start"], end=params["end"], step="600")["data"]
    assert ex["subtrees"][0]["path"].startswith("summary:exact-req_total")
    out = subprocess.run([sys.executable, "-m", "turboprom", "plan", "list", "--url", url], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and plans[0]["id"] in out.stdout, out.stderr
    out = subprocess.run([sys.executable, "-m", "turboprom", "plan", "explain", "rate(other_total[5m])", "--url", url],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "-> raw" in out.stdout, out.stdout + out.stderr
    # a quantile panel: approximation is off unless the request (or the operator) turns it on, and explain says so
    qq = "quantile_over_time(0.5, req_total[1h])"
    (off,) = _get(url, "/api/v1/planner/explain", query=qq)["data"]["subtrees"]
    (on,) = _get(url, "/api/v1/planner/explain", query=qq, approx="true")["data"]["subtrees"]
    assert off["path"] == "raw" and off["why"].startswith("approximation off") and not on["why"].startswith("approximation off")
    out = subprocess.run([sys.executable, "-m", "turboprom", "plan", "explain", qq, "--approx", "false", "--url", url],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "approximation off" in out.stdout, out.stdout + out.stderr
    with pytest.raises(urllib.error.HTTPError) as bad:
        _get(url, "/api/v1/planner/explain", query=qq, approx="maybe")
    assert bad.value.code == 400
    # the query log holds the refreshes with their paths
    log = _get(url, "/api/v1/planner/query_log", limit="50")["data"]
    assert any(r["pattern"] == "sum by ($g) (rate(req_total{}[$r]))" for r in log)
    assert any(any(p.startswith("summary:") for p in r["paths"]) for r in log)
    # recording rules are listed like Prometheus and their evaluations are logged as origin=rule
    rules = _get(url, "/api/v1/rules")["data"]["groups"]
    assert rules[0]["name"] == "dash" and rules[0]["rules"][0]["type"] == "recording"
    assert rules[0]["rules"][1]["type"] == "alerting"
    # canary ran (fraction 1.0) and saw no error on the exact algorithm
    deadline = time.time() + 20
    checks = []
    while time.time() < deadline and not checks:
        checks = _get(url, "/api/v1/planner/canary")["data"]["checks"]
        time.sleep(0.2)
    assert checks and all(c["max_error"] <= 1e-9 for c in checks if c["algorithm"] == "exact")
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        assert b"turboprom_planner_canary_error" in r.read()

    # live ingest after adoption goes through the summarizer sink: newer windows are served exactly too
    before = _get(url, "/api/v1/planner/plans")["data"]["plans"][0]["ingested_samples"]
    rng = np.random.default_rng(12)
    extra_ts = end + STEP_MS * np.arange(1, 17)
    live = []
    last = _get(url, "/api/v1/query", query="req_total", time=end / 1000 + 1)["data"]["result"]
    for s in last:
        m = s["metric"]
        live.append((m, extra_ts + int(m["inst"][1:]) * 700, float(s["value"][1]) + np.cumsum(rng.random(16) * 5)))
    _write(url, live)
    p2 = dict(params, start=(end - 3_600_000) / 1000, end=(int(extra_ts[-1]) + 2800) / 1000)
    fast_l = _get(url, "/api/v1/query_range", **p2)
    exact_l = _get(url, "/api/v1/query_range", **p2, exact="true")
    assert any("served from summary" in i for i in fast_l.get("infos", []))
    _same(_matrix(fast_l), _matrix(exact_l))
    after = _get(url, "/api/v1/planner/plans")["data"]["plans"][0]
    assert after["ingested_samples"] == before + 4 * 16 and after["late_dropped"] == 0

    # restart: the SDS comes back from Parquet + catalog, open panes are rebuilt from raw data
    srv.stop()
    srv2 = ServerProcess(srv.data_dir, ["--config", str(cfg), "--wal-fsync", "never"], port=srv.port)
    srv2.start()
    try:
        plans2 = _get(url, "/api/v1/planner/plans")["data"]["plans"]
        assert [p["id"] for p in plans2] == [p["id"] for p in plans]
        assert plans2[0]["backfill"]["state"] == "restored"
        fast2 = _get(url, "/api/v1/query_range", **params)
        exact2 = _get(url, "/api/v1/query_range", **params, exact="true")
        assert any("served from summary" in i for i in fast2.get("infos", []))
        _same(_matrix(fast2), _matrix(exact2))
    finally:
        srv2.stop()


def test_deleted_series_never_answered_from_a_summary(tmp_path):
    """Admin delete_series retires the summaries that could hold the deleted series: afterwards the
    default path answers exactly like exact=true (without the deleted data); a pinned plan is rebuilt."""
    cfg = tmp_path / "turboprom.yml"
    cfg.write_text(f"planner:\n  summary_cost_prior: {SMALL_DATA_PRIOR_S}\n  min_count: 2\n  period: 10m\n  pane: 1m\n  seal_delay: 0s\n  history: 1d\n"
                   "  canary_fraction: 0\n  cost_based: false\n"
                   "  pinned:\n  - {metric: req_total, algorithm: exact, pane: 1m, history: 1d}\n")
    end = (int(time.time() * 1000) // 60_000) * 60_000 - 60_000
    q = {"query": "sum by (job) (increase(req_total[30m]))", "start": (end - 7_200_000) / 1000, "end": end / 1000, "step": 60}
    with ServerProcess(tmp_path / "data", ["--config", str(cfg), "--wal-fsync", "never", "--web.enable-admin-api"]) as srv:
        _ingest_history(srv.url, end)
        deadline = time.time() + 60
        while time.time() < deadline:
            plans = _get(srv.url, "/api/v1/planner/plans")["data"]["plans"]
            if plans and plans[0]["backfill"]["state"] == "done":
                break
            time.sleep(0.3)
        served = _get(srv.url, "/api/v1/query_range", **q)
        assert any(p.startswith("summary:") for p in served["data"].get("stats", {}).get("paths", [])) or \
            any("served from summary" in i for i in served.get("infos", [])), served.get("infos")
        req = urllib.request.Request(srv.url + "/api/v1/admin/tsdb/delete_series?" + urllib.parse.urlencode({"match[]": 'req_total{inst="i0"}'}),
                                     method="POST")
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 204
        deadline = time.time() + 60
        while time.time() < deadline:  # the pinned plan is rebuilt from storage without the deleted series
            plans = _get(srv.url, "/api/v1/planner/plans")["data"]["plans"]
            if plans and plans[0]["backfill"]["state"] == "done":
                break
            time.sleep(0.3)
        assert plans and plans[0]["series"] == 3, plans
        after, exact = _get(srv.url, "/api/v1/query_range", **q), _get(srv.url, "/api/v1/query_range", exact="true", **q)
        _same(_matrix(after), _matrix(exact))
        assert _matrix(after) != _matrix(served)  # the deleted series' increase is gone from job j0
