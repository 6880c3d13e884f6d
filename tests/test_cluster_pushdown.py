"""Aggregation pushdown through a real cluster (3 NATS JetStream nodes, etcd, one distributor,
three ingesters with RF=2 so a query covers its partitions from more than one ingester, and two
queriers: one pushing down, one with ``--cluster.pushdown false``) against a single node fed the
same remote-write bodies.

Pushed-down answers equal the single node's; the querier's query stats name the pushdown, the
ingesters count the partial states they answered; what is not pushable is evaluated raw; with an
ingester SIGKILLed the partitions it answered are asked of their other owner and the answers stay
equal.
"""
from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
import urllib.request

import pytest

from tests.helpers import ServerProcess, http_json, load_bench, require_binary
from turboprom.cluster.local_cluster import LocalCluster

pytestmark = pytest.mark.peer

RW_HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
              "X-Prometheus-Remote-Write-Version": "0.1.0"}
T0 = (int(time.time()) - 3600) // 60 * 60 * 1000
SERIES = 1200
ROUNDS = 8
STEP_S = 15
INGESTERS = ["ingester-0", "ingester-1", "ingester-2"]

PUSHED = {
    'sum by (model_name) (rate(vllm:prompt_tokens_total[2m]))': "sum",
    'histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket[2m])))': "sum",
    'avg by (node) (rate(node_cpu_seconds_total{mode!="idle"}[2m]))': "avg",
    'topk(5, vllm:num_requests_waiting)': "topk",
    'bottomk by (node) (2, vllm:kv_cache_usage_perc * 100)': "bottomk",
    'sum(vllm:kv_cache_usage_perc) by (cluster)': "sum",
    'count without (instance) (vllm:num_requests_running > 3)': "count",
    'max by (cluster) (max_over_time(vllm:kv_cache_usage_perc[1m]))': "max",
    'min(vllm:kv_cache_usage_perc)': "min",
    'group by (model_name) (vllm:num_requests_waiting)': "group",
    'sum by (__name__) ({__name__=~"node_.*"})': "sum",
}
SUMMARIZED = ["vllm:time_to_first_token_seconds_bucket", "vllm:prompt_tokens_total"]
RAW = ['stddev by (node) (node_cpu_seconds_total)', 'sum by (model_name) (vllm:num_requests_running + vllm:num_requests_waiting)']
# every rate of the fleet's counters is equal: ties at the k-th place of small groups, which a
# single evaluation breaks by replaying Prometheus's heap over all series; the ingesters' parts are
# small enough to send every series (partial_aggregate.COMPLETE_CELLS), so the querier replays it too
TIED = 'bottomk by (node) (2, rate(node_cpu_seconds_total[2m]) * 100)'


def post(url: str, body: bytes, headers: dict | None = None) -> int:
    code, _, _ = http_json(url, data=body, headers={**RW_HEADERS, **(headers or {})})
    return code


def query(url: str, q: str, headers: dict | None = None, instant: bool = False, exact: bool = True) -> dict:
    """The answer with its stats; exact=true: the single node's planner answers from raw samples too
    (and the ingesters' summaries do not answer)."""
    end = T0 / 1000 + (ROUNDS - 1) * STEP_S
    if instant:
        params = {"query": q, "time": end, "stats": "all", "exact": str(exact).lower()}
        path = "/api/v1/query"
    else:
        params = {"query": q, "start": T0 / 1000 + 60, "end": end, "step": STEP_S, "stats": "all", "exact": str(exact).lower()}
        path = "/api/v1/query_range"
    code, body, _ = http_json(f"{url}{path}?{urllib.parse.urlencode(params)}", headers=headers)
    assert code == 200 and body["status"] == "success", (q, code, body)
    return body


def points(data: dict) -> dict:
    out = {}
    for r in data["result"]:
        key = json.dumps(r["metric"], sort_keys=True)
        out[key] = [(t, float(v)) for t, v in (r["values"] if "values" in r else [r["value"]])]
    return out


def assert_same(a: dict, b: dict, q: str, annotations: bool = True) -> None:
    assert a["data"]["resultType"] == b["data"]["resultType"], q
    pa, pb = points(a["data"]), points(b["data"])
    assert pa, f"{q}: the single node answers nothing, so the comparison would prove nothing"
    assert sorted(pa) == sorted(pb), q
    for k in pa:
        assert [t for t, _ in pa[k]] == [t for t, _ in pb[k]], (q, k)
        for (_, x), (_, y) in zip(pa[k], pb[k]):
            assert (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12), (q, k, x, y)
    if annotations:
        assert sorted(a.get("warnings", [])) == sorted(b.get("warnings", [])), q
        assert sorted(a.get("infos", [])) == sorted(b.get("infos", [])), q


def metric(url: str, name: str, **labels: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{re.escape(name)}\{{{re.escape(want)}\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def answered(cluster: LocalCluster, names: list[str]) -> float:
    return sum(metric(cluster.url(n), "turboprom_cluster_pushdown_requests_total", outcome="answered") for n in names)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    require_binary("nats-server")
    require_binary("etcd")
    base = tmp_path_factory.mktemp("pushdown")
    single = ServerProcess(base / "single")
    # the ingesters keep exact summaries of two metrics (pinned, served whenever they cover: the data
    # here is two minutes long, too little for the cost model to choose them)
    cfg = base / "ingester.yml"
    cfg.write_text(json.dumps({"planner": {"cost_based": False, "pinned": [
        {"metric": m, "algorithm": "exact", "pane": "15s"} for m in SUMMARIZED]}}))
    cluster = LocalCluster(base / "c", ingesters=len(INGESTERS), partitions=16, ingester_args=["--config", str(cfg)])
    try:
        single.start()
        cluster.start()
        cluster.add_role("querier", "querier-raw", ["--cluster.pushdown", "false"])
        cluster.wait_ready("querier-raw")
        rw = load_bench("ingest_remote_write")
        bodies, _ = rw.build_payloads(SERIES, 300, 1, ROUNDS, T0)
        for b in bodies:
            assert post(single.url + "/api/v1/write", b) == 204
            assert post(cluster.url("distributor-0") + "/api/v1/write", b) == 204
        for b in bodies[:8]:
            assert post(single.url + "/api/v1/write", b, {"X-Scope-OrgID": "team-a"}) == 204
            assert post(cluster.url("distributor-0") + "/api/v1/write", b, {"X-Scope-OrgID": "team-a"}) == 204
        cluster.wait_applied(INGESTERS, timeout=120)
        cluster.wait_caught_up(INGESTERS, timeout=120)
        yield single, cluster
    finally:
        cluster.stop()
        single.stop()


def test_pushed_down_answers_equal_the_single_node(setup):
    single, cluster = setup
    querier, raw = cluster.url("querier-0"), cluster.url("querier-raw")
    before = answered(cluster, INGESTERS)
    for q, op in PUSHED.items():
        for instant in (False, True):
            a = query(single.url, q, instant=instant)
            b = query(querier, q, instant=instant)
            assert_same(a, b, q)
            assert f"pushdown:{op}" in b["data"]["stats"]["turboprom"]["paths"], (q, b["data"]["stats"])
            # the same samples were read, on the ingesters instead of through the querier
            assert b["data"]["stats"]["samples"]["totalQueryableSamples"] == a["data"]["stats"]["samples"]["totalQueryableSamples"], q
            c = query(raw, q, instant=instant)
            assert_same(a, c, q)
            assert not any(p.startswith("pushdown") for p in c["data"]["stats"]["turboprom"]["paths"]), q
    # every pushed query asked at least one ingester (3 ingesters, RF=2: often two)
    assert answered(cluster, INGESTERS) - before >= 2 * len(PUSHED)
    assert metric(querier, "turboprom_cluster_pushdown_decisions_total", decision="pushed") >= 2 * len(PUSHED)


def test_pushed_down_shares_answered_from_the_ingesters_summaries(setup):
    """Without exact=true each owner answers its partitions' share from its exact summaries (three
    ingesters with RF=2: most are asked for some of the partitions they hold); the merged answer
    equals the single node's raw one. exact=true reaches the ingesters: no summary answers."""
    single, cluster = setup
    querier = cluster.url("querier-0")
    for q in ['histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket[1m])))',
              'sum by (model_name) (rate(vllm:prompt_tokens_total[1m]))', 'max(increase(vllm:prompt_tokens_total[90s]))']:
        for instant in (False, True):
            a = query(single.url, q, instant=instant)
            b = query(querier, q, instant=instant, exact=False)
            assert_same(a, b, q, annotations=False)
            served = [i for i in b.get("infos", []) if "served from summary exact-" in i]
            assert served, (q, b.get("infos"))
            # named in the querier's paths too: its step answers keep summary-served steps a seal delay later
            assert any(p.startswith("summary:exact-") for p in b["data"]["stats"]["turboprom"]["paths"]), b["data"]["stats"]
            c = query(querier, q, instant=instant)
            assert_same(a, c, q)
            assert not any("served from summary" in i for i in c.get("infos", [])), q


def test_not_pushable_is_evaluated_raw_and_other_tenants_are_pushed_too(setup):
    single, cluster = setup
    querier = cluster.url("querier-0")
    raw_before = metric(querier, "turboprom_cluster_pushdown_decisions_total", decision="raw")
    for q in RAW:
        a, b = query(single.url, q), query(querier, q)
        assert_same(a, b, q)
        assert not any(p.startswith("pushdown") for p in b["data"]["stats"]["turboprom"]["paths"]), q
    assert metric(querier, "turboprom_cluster_pushdown_decisions_total", decision="raw") >= raw_before + len(RAW)
    fallback_before = metric(querier, "turboprom_cluster_pushdown_decisions_total", decision="fallback")
    for instant in (False, True):
        a, b = query(single.url, TIED, instant=instant), query(querier, TIED, instant=instant)
        assert_same(a, b, TIED)
        assert "pushdown:bottomk" in b["data"]["stats"]["turboprom"]["paths"]
    assert metric(querier, "turboprom_cluster_pushdown_decisions_total", decision="fallback") == fallback_before
    team = {"X-Scope-OrgID": "team-a"}
    for q, op in list(PUSHED.items())[:4]:
        a, b = query(single.url, q, team), query(querier, q, team)
        assert_same(a, b, q)
        assert f"pushdown:{op}" in b["data"]["stats"]["turboprom"]["paths"], q


def test_pushed_down_answers_with_an_ingester_killed(setup):
    single, cluster = setup
    querier = cluster.url("querier-0")
    victim = "ingester-1"
    alive = [n for n in INGESTERS if n != victim]
    cluster.roles[victim].kill()  # SIGKILL by pid, no lease revoked: the querier finds out by failing
    try:
        before = answered(cluster, alive)
        for q, op in PUSHED.items():
            a, b = query(single.url, q), query(querier, q)
            assert_same(a, b, q)
            assert f"pushdown:{op}" in b["data"]["stats"]["turboprom"]["paths"], q
        assert answered(cluster, alive) - before >= len(PUSHED)
    finally:
        cluster.add_role("ingester", victim, cluster.ingester_args)
        cluster.wait_ready(victim)
