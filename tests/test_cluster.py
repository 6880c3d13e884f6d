"""The cluster roles on real peers: 3 NATS JetStream nodes (R=3 stream), etcd, one distributor, two
ingesters (RF=2) and one querier, each its own process on loopback, against a single-node
``turboprom serve`` fed the same remote-write bodies.

In order: answers equal the single node's (PromQL instant and range queries, series/labels API,
a second tenant); an ingester killed by its pid leaves queries answering from the other owner, and
once restarted it catches up from JetStream (proved by killing the other one and asking again);
with two of the three NATS nodes stopped a write is answered 503 with Retry-After, never 2xx.
"""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

import pytest

from tests.helpers import ServerProcess, http_json, load_bench, require_binary
from turboprom.cluster.local_cluster import LocalCluster

pytestmark = pytest.mark.peer

RW_HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
              "X-Prometheus-Remote-Write-Version": "0.1.0"}
# recent timestamps (storage refuses samples older than its head allows, as Prometheus does)
T0 = (int(time.time()) - 3600) // 60 * 60 * 1000
SERIES = 1200
STEP_S = 15


def post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={**RW_HEADERS, **(headers or {})}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        e.read()
        return e.code, dict(e.headers)


def write_all(url: str, bodies: list[bytes], headers: dict | None = None) -> None:
    for b in bodies:
        code, _ = post(url + "/api/v1/write", b, headers)
        assert code == 204, code


def payloads(rounds: int, first_round: int = 0) -> list[bytes]:
    rw = load_bench("ingest_remote_write")
    bodies, _ = rw.build_payloads(SERIES, 300, 4, rounds + first_round, T0)
    per_round = SERIES // 300
    return bodies[first_round * per_round:]


QUERIES = [
    'count({__name__=~"node_.*|vllm.*"})',
    'sum by (__name__) ({__name__=~"node_.*"})',
    'topk(3, {__name__=~"node_cpu_seconds_total"})',
    'avg by (node, mode) (rate(node_cpu_seconds_total[2m]))',
    'max without (instance) ({__name__=~"vllm.*"})',
    'histogram_quantile(0.9, sum by (le) (rate({__name__=~"vllm.*_bucket"}[2m])))',
]


def query(url: str, q: str, end_s: float, headers: dict | None = None) -> dict:
    params = urllib.parse.urlencode({"query": q, "start": T0 / 1000, "end": end_s, "step": STEP_S})
    code, body, _ = http_json(f"{url}/api/v1/query_range?{params}", headers=headers)
    assert code == 200, (q, code, body)
    return body["data"]


def canon(data: dict) -> list:
    return sorted(json.dumps(r, sort_keys=True) for r in data["result"])


def same_answers(single: str, querier: str, end_s: float, headers: dict | None = None) -> None:
    for q in QUERIES:
        a, b = query(single, q, end_s, headers), query(querier, q, end_s, headers)
        assert a["resultType"] == b["resultType"]
        assert a["result"], f"{q}: the single node answers nothing, so the comparison would prove nothing"
        assert canon(a) == canon(b), q


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    require_binary("nats-server")
    require_binary("etcd")
    base = tmp_path_factory.mktemp("cluster")
    single = ServerProcess(base / "single")
    cluster = LocalCluster(base / "c", ingesters=2, partitions=16, publish_timeout="2s")
    try:
        single.start()
        cluster.start()
        yield single, cluster
    finally:
        cluster.stop()
        single.stop()


def test_answers_equal_the_single_node(setup):
    single, cluster = setup
    dist, querier = cluster.url("distributor-0"), cluster.url("querier-0")
    bodies = payloads(rounds=3)
    write_all(single.url, bodies)
    write_all(dist, bodies)
    write_all(single.url, bodies[:2], {"X-Scope-OrgID": "team-a"})
    write_all(dist, bodies[:2], {"X-Scope-OrgID": "team-a"})
    cluster.wait_applied(["ingester-0", "ingester-1"])
    end = T0 / 1000 + 3 * 4 * STEP_S
    same_answers(single.url, querier, end)
    same_answers(single.url, querier, end, {"X-Scope-OrgID": "team-a"})
    rng = {"start": T0 / 1000, "end": end}
    for path, params in (("/api/v1/labels", {"match[]": '{__name__=~"node_.*|vllm.*"}'}), ("/api/v1/label/instance/values", {}),
                         ("/api/v1/series", {"match[]": "node_cpu_seconds_total"})):
        qs = "?" + urllib.parse.urlencode({**params, **rng})
        a, b = http_json(single.url + path + qs)[1], http_json(querier + path + qs)[1]
        assert a["status"] == b["status"] == "success"
        assert a["data"] and sorted(map(json.dumps, a["data"])) == sorted(map(json.dumps, b["data"])), path
    # status and cost pages read the cluster's cardinality (head figures stay on the ingesters)
    a, b = http_json(single.url + "/api/v1/status/tsdb")[1], http_json(querier + "/api/v1/status/tsdb")[1]
    assert a["status"] == b["status"] == "success"
    assert b["data"]["headStats"]["numSeries"] == a["data"]["headStats"]["numSeries"] > 0
    assert b["data"]["seriesCountByMetricName"] == a["data"]["seriesCountByMetricName"]
    st, rep = http_json(querier + "/api/v1/cost_report")[:2]
    assert st == 200 and rep["status"] == "success", rep
    # the querier serves reads only: writes go to a distributor
    assert post(querier + "/api/v1/write", bodies[0])[0] in (404, 405)


def test_ingester_killed_then_caught_up_from_the_log(setup):
    single, cluster = setup
    dist, querier = cluster.url("distributor-0"), cluster.url("querier-0")
    cluster.roles["ingester-0"].kill()  # SIGKILL by pid
    end = T0 / 1000 + 3 * 4 * STEP_S
    same_answers(single.url, querier, end)  # from ingester-1 alone, at once
    more = payloads(rounds=2, first_round=3)  # written while ingester-0 is down
    write_all(single.url, more)
    write_all(dist, more)
    t = time.monotonic()
    cluster.add_role("ingester", "ingester-0")
    cluster.wait_ready("ingester-0")
    cluster.wait_caught_up(["ingester-0"])
    cluster.wait_applied(["ingester-0"])
    caught_up_s = time.monotonic() - t
    st = cluster.ingester_status("ingester-0")
    assert st["targets"] and all(st["applied"][p] >= st["targets"][p] for p in st["targets"])
    cluster.roles["ingester-1"].kill()  # now only the restarted one answers
    end = T0 / 1000 + 5 * 4 * STEP_S
    same_answers(single.url, querier, end)
    print(f"restarted ingester caught up in {caught_up_s:.1f}s")
    cluster.add_role("ingester", "ingester-1")
    cluster.wait_ready("ingester-1")


def test_write_not_acknowledged_without_jetstream_quorum(setup):
    _, cluster = setup
    dist = cluster.url("distributor-0")
    body = payloads(rounds=1, first_round=6)[0]
    cluster.nats[1].kill()
    cluster.nats[2].kill()
    t = time.monotonic()
    code, headers = post(dist + "/api/v1/write", body)
    assert code == 503, code
    assert "Retry-After" in headers
    assert time.monotonic() - t < 15
    code, body_json, _ = http_json(dist + "/api/v1/write", data=body, headers=RW_HEADERS)
    assert code == 503 and body_json["errorType"] == "unavailable" and "ingest log" in body_json["error"], body_json
