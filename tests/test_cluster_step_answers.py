"""Reused step answers on a cluster querier (turboprom/cluster/cluster_frontier.py), through a real
cluster (3 NATS JetStream nodes, etcd, one distributor, two ingesters, one querier): a refresh
reuses the steps it answered before, and every answer equals the querier's own ``exact=true``
answer while samples keep arriving, after a write reaching back below the sealed frontier (a new
series with 15-minute-old samples) and after an ingester restart. Run twice: with the ingesters
answering from raw samples, and with their shares of the pushed-down aggregations answered from
exact summaries (pinned plans, served whenever they cover)."""
from __future__ import annotations

import json
import math
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers import http_json, require_binary
from tests.test_cluster_conformance import write_request
from turboprom.cluster.local_cluster import LocalCluster

pytestmark = pytest.mark.peer

RW_HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
              "X-Prometheus-Remote-Write-Version": "0.1.0"}
INSTANCES = 12
STEP_S = 15
QUERIES = ["sum(tp_load)", "max by (instance) (max_over_time(tp_load[1m]))",
           "sum by (zone) (rate(tp_requests_total[2m]))"]


def _series(instance: str, samples: list[tuple[int, float]], counter: list[tuple[int, float]]) -> dict:
    zone = "a" if instance.endswith(("0", "2", "4", "6", "8")) else "b"
    return {(("__name__", "tp_load"), ("instance", instance), ("zone", zone)): samples,
            (("__name__", "tp_requests_total"), ("instance", instance), ("zone", zone)): counter}


def _body(instances: list[str], t_from_ms: int, t_to_ms: int, every_ms: int = 5000) -> bytes:
    series: dict = {}
    for k, inst in enumerate(instances):
        ts = range(t_from_ms, t_to_ms + 1, every_ms)
        series.update(_series(inst, [(t, float((t // every_ms + 7 * k) % 23)) for t in ts],
                              [(t, float(t // 1000 * (k + 1))) for t in ts]))
    return write_request(series)


def _write(url: str, body: bytes) -> None:
    code, resp, _ = http_json(url + "/api/v1/write", data=body, headers=RW_HEADERS)
    assert code == 204, (code, resp)


def _range(url: str, q: str, exact: bool) -> dict:
    now = time.time()
    end = math.floor(now / STEP_S) * STEP_S  # Grafana's alignment
    params = {"query": q, "start": end - 1200, "end": end, "step": STEP_S, "stats": "all"}
    if exact:
        params["exact"] = "true"
    code, body, _ = http_json(f"{url}/api/v1/query_range?{urllib.parse.urlencode(params)}")
    assert code == 200 and body["status"] == "success", (q, code, body)
    return body


def _points(body: dict) -> dict:
    return {json.dumps(r["metric"], sort_keys=True): [(t, float(v)) for t, v in r["values"]] for r in body["data"]["result"]}


def _reused(body: dict) -> bool:
    return any(p.startswith("steps:reused:") for p in body["data"]["stats"]["turboprom"]["paths"])


def _check(url: str, q: str) -> tuple[bool, dict]:
    """A refresh and the querier's ``exact=true`` answer of the same range, compared; (whether the
    refresh reused steps, its points). Retried when the two straddle a step boundary."""
    for _ in range(5):
        served = _range(url, q, exact=False)
        exact = _range(url, q, exact=True)
        a, b = _points(served), _points(exact)
        if [v[-1][0] for v in a.values()][:1] != [v[-1][0] for v in b.values()][:1]:
            continue  # the end step moved between the two requests
        assert sorted(a) == sorted(b), (q, sorted(a), sorted(b))
        for k in a:
            # the newest steps may see a live write the other request did not: compare what both had sealed
            sealed = [p for p in a[k] if p[0] <= a[k][-1][0] - 60]
            other = [p for p in b[k] if p[0] <= a[k][-1][0] - 60]
            assert sealed == other, (q, k, [(x, y) for x, y in zip(sealed, other) if x != y][:5])
        return _reused(served), a
    raise AssertionError(f"{q}: no two answers with the same end step")


@pytest.mark.parametrize("summaries", [False, True], ids=["raw", "summaries"])
def test_querier_reuses_steps_and_stays_exact(tmp_path, summaries):
    require_binary("nats-server")
    require_binary("etcd")
    args: list[str] = []
    if summaries:
        cfg = tmp_path / "ingester.yml"
        cfg.write_text(json.dumps({"planner": {"cost_based": False, "pane": "15s", "pinned": [
            {"metric": "tp_load", "algorithm": "exact"}, {"metric": "tp_requests_total", "algorithm": "exact"}]}}))
        args = ["--config", str(cfg)]
    cluster = LocalCluster(tmp_path / "c", ingesters=2, partitions=4, publish_timeout="5s", ingester_args=args)
    instances = [f"w{i}" for i in range(INSTANCES)]
    stop = threading.Event()
    errors: list[BaseException] = []
    try:
        cluster.start()
        dist, querier = cluster.url("distributor-0"), cluster.url("querier-0")
        now_ms = int(time.time()) // 5 * 5 * 1000
        _write(dist, _body(instances, now_ms - 1800_000, now_ms))

        def live() -> None:  # one sample per series every second, as scrapes arrive
            t = now_ms
            while not stop.wait(1.0):
                t2 = int(time.time() * 1000)
                try:
                    _write(dist, _body(instances, t + 1000, t2, every_ms=1000))
                except BaseException as e:  # noqa: BLE001 - reported by the test
                    errors.append(e)
                    return
                t = t2

        writer = threading.Thread(target=live, daemon=True)
        writer.start()
        cluster.wait_applied(["ingester-0", "ingester-1"], timeout=60)
        time.sleep(2)
        for q in QUERIES:
            _check(querier, q)  # first load: nothing to reuse
        reused = [_check(querier, q)[0] for q in QUERIES for _ in range(2)]
        assert any(reused), "no refresh through the querier reused a step answer"
        if summaries:
            served = _range(querier, QUERIES[2], exact=False)
            assert any(p.startswith("summary:exact-") for p in served["data"]["stats"]["turboprom"]["paths"]), \
                served["data"]["stats"]
        # a dashboard's panels refreshed at once share the querier's write-log requests
        with ThreadPoolExecutor(8) as pool:
            assert any(r for r, _ in pool.map(lambda q: _check(querier, q), QUERIES * 3))

        # a new series whose samples reach 15 minutes back, far below every ingester's sealed frontier:
        # the steps kept since then must be dropped, or the sums would miss it
        before = _check(querier, QUERIES[0])[1]
        late_from = now_ms - 900_000
        _write(dist, _body(["late"], late_from, now_ms - 600_000))
        cluster.wait_applied(["ingester-0", "ingester-1"], timeout=60)
        reused_after, after = _check(querier, QUERIES[0])
        (key,) = after
        changed = [t for (t, v), (_, w) in zip(after[key], before[key]) if v != w and t * 1000 >= late_from]
        assert changed, "the late series did not change the sum"
        for q in QUERIES[1:]:
            _check(querier, q)

        # an ingester restart: its write log starts again, so nothing kept before may be trusted
        cluster.roles["ingester-0"].kill()
        cluster.add_role("ingester", "ingester-0", cluster.ingester_args)
        cluster.wait_ready("ingester-0")
        cluster.wait_caught_up(["ingester-0", "ingester-1"], timeout=90)
        for q in QUERIES:
            for _ in range(2):
                _check(querier, q)
        assert not errors, errors
    finally:
        stop.set()
        cluster.stop()
