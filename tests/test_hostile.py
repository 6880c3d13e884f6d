"""Hostile tenants against the real server with web-config auth: cross-tenant visibility on every
route, side channels (status/tsdb head figures, self-metrics) and the regex timing oracle.

One server runs with admin, reader, writer and scheduler roles, two tenants besides the default one,
basic auth and bearer tokens. Distinct data goes into the default tenant, team-a and team-b (secret
label values, instance names, exemplars, rules and alerts, scrape targets, planner activity,
congestion samples); then every registered GET route (enumerated from the app's router, so a new
route cannot be forgotten) is swept as users allowed only team-b, and no response may contain another
tenant's metric names, label values, instance names, tenant names or timestamps.
"""
from __future__ import annotations

import base64
import gzip
import json
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ingest.proto.messages import WriteRequest
from ingest.snappy_block import compress
from scheduler_metrics.instrumentation import WorkerMetrics
from storage.batch import SampleBatch
from storage.index import SeriesIndex
from storage.labels import make_labels
from storage.matchers import Matcher
from storage.options import StorageOptions
from storage.tsdb import TSDB
from tests.helpers import ServerProcess
from tests.hostile_monitor import ResponsivenessMonitor

TENANT_B = "team-b"
B_TOKEN = "bearer-token-of-the-team-b-dashboard"
PW = {"admin": "admin-pw", "writer": "writer-pw", "reader": "reader-pw", "reader_b": "reader-b-pw",
      "sched_b": "sched-b-pw", "admin_b": "admin-b-pw", "writer_b": "writer-b-pw"}
# team-a's value that makes a backtracking regex explode: if anything evaluates tenant team-b's
# regex against it, team-b's request takes seconds (and the GIL with it).
EXPLOSIVE = "T" * 25 + "!"


def _hash(pw: str) -> str:
    return bcrypt.hashpw(pw.encode(), bcrypt.gensalt(rounds=4)).decode()


@dataclass
class Who:
    name: str
    auth: str  # the Authorization header value
    tenant: str | None = None

    def headers(self) -> dict[str, str]:
        h = {"Authorization": self.auth}
        if self.tenant is not None:
            h["X-Scope-OrgID"] = self.tenant
        return h


def _basic(user: str, tenant: str | None = None) -> Who:
    return Who(user, "Basic " + base64.b64encode(f"{user}:{PW[user]}".encode()).decode(), tenant)


ADMIN = _basic("admin")
WRITER = _basic("writer")
READER = _basic("reader")  # unscoped reader: an operator's dashboard
B_USERS = [_basic("reader_b", TENANT_B), Who("grafana_b", "Bearer " + B_TOKEN, TENANT_B),
           _basic("sched_b", TENANT_B), _basic("admin_b", TENANT_B)]
READER_B = B_USERS[0]


def call(url: str, who: Who | None = None, *, data: bytes | None = None, headers: dict | None = None,
         method: str | None = None, timeout: float = 60) -> tuple[int, bytes, dict]:
    h = dict(who.headers()) if who is not None else {}
    h.update(headers or {})
    req = urllib.request.Request(url, data=data, headers=h, method=method or ("POST" if data is not None else "GET"))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body, st, hdrs = r.read(), r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        body, st, hdrs = e.read(), e.code, dict(e.headers)
    if hdrs.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return st, body, hdrs


def get_json(url: str, who: Who, **params: Any) -> tuple[int, Any]:
    st, body, _ = call(url + ("?" + urllib.parse.urlencode(params, doseq=True) if params else ""), who)
    return st, (json.loads(body) if body else {})


def wait_for(fn, what: str, timeout: float = 60.0) -> Any:
    deadline = time.time() + timeout
    while True:
        got = fn()
        if got:
            return got
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


# ------------------------------------------------------------------------------------------ data
@dataclass
class Secrets:
    t_default: int
    t_a: int
    t_b_min: int
    t_b: int

    def forbidden(self) -> list[str]:
        """Strings only the default tenant and team-a may see."""
        words = [
            # default tenant: metric and rule names, label values, instances, traces, congestion, scrape job
            "dflt_secret", "DFLTSECRET", "dflt-inst-q7", "dflt-trace-5150", "dflt-gpu-worker", "dflt-cluster-east",
            "dflt-model-llama", "DfltSecretAlert", "dflt-owner-label", "dflt-secret-group", "dflt-scrape-host",
            "dflt-secret-job",
            # team-a: its name, metric, label values, instances, traces, workers
            "team-a", "teama_secret", "TEAMASECRET", "teama-inst-z3", "teama-trace-8086", "teama-gpu-worker",
            EXPLOSIVE[:12],
        ]
        for t in (self.t_default, self.t_a):
            words += [str(t), f"{t / 1000:.3f}"]
        return words


def _exposition(tenant_word: str, t: int) -> bytes:
    lines = {
        "dflt": [f'dflt_secret_metric_total{{token="DFLTSECRET-xyzzy",instance="dflt-inst-q7.example",job="svc"}} {v} {t - k * 30_000}'
                 for k, v in ((2, 1), (1, 3), (0, 7))],
        "teama": [f'teama_secret_metric{{token="TEAMASECRET-plugh",instance="teama-inst-z3.example",job="svc"}} {v} {t - k * 30_000}'
                  for k, v in ((1, 2), (0, 4))] + [f'teama_explosive{{token="{EXPLOSIVE}"}} 1 {t}'],
        "teamb": [f'teamb_metric{{token="TEAMB-own",instance="teamb-inst.example",job="svc"}} 1 {t - 30_000}',
                  f'teamb_metric{{token="TEAMB-own",instance="teamb-inst.example",job="svc"}} 2 {t}'],
    }[tenant_word]
    return ("\n".join(lines) + "\n").encode()


def _exemplar_write(metric: str, labels: dict[str, str], trace: str, t: int) -> bytes:
    w = WriteRequest()
    ts = w.timeseries.add()
    for n, v in sorted({"__name__": metric, **labels}.items()):
        ts.labels.add(name=n, value=v)
    ts.samples.add(value=1.0, timestamp=t)
    e = ts.exemplars.add(value=0.5, timestamp=t)
    e.labels.add(name="trace_id", value=trace)
    return compress(w.SerializeToString())


def _write(url: str, tenant: str | None, body: bytes) -> None:
    st, b, _ = call(url + "/api/v1/import/prometheus", WRITER, data=body,
                    headers={"X-Scope-OrgID": tenant} if tenant else {})
    assert st in (200, 204), (tenant, st, b[:300])


def _remote_write(url: str, tenant: str | None, payload: bytes) -> None:
    h = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Prometheus-Remote-Write-Version": "0.1.0"}
    if tenant:
        h["X-Scope-OrgID"] = tenant
    st, b, _ = call(url + "/api/v1/write", WRITER, data=payload, headers=h)
    assert st in (200, 204), (tenant, st, b[:300])


def _routes() -> list[tuple[str, str]]:
    """(method, canonical path) of every route the app registers, from its router."""
    from turboprom.config import ServerConfig
    from turboprom.server import create_app
    from turboprom.wiring import build_context

    with tempfile.TemporaryDirectory() as d:
        ctx = build_context(ServerConfig(data_dir=d))
        try:
            app = create_app(ctx)
            return sorted({(r.method, r.resource.canonical) for r in app.router.routes() if r.resource is not None})
        finally:
            ctx.storage.close()
            ctx.executor.shutdown(wait=False)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp: Path = tmp_path_factory.mktemp("hostile")
    web = tmp / "web.yml"
    web.write_text(f"""
basic_auth_users:
{''.join(f'  {u}: {_hash(p)}' + chr(10) for u, p in PW.items())}
bearer_tokens:
  - user: grafana_b
    hash: {_hash(B_TOKEN)}
roles:
  admin: [admin]
  writer: [write]
  reader: [read]
  reader_b: [read]
  grafana_b: [read]
  sched_b: [scheduler, read]
  admin_b: [admin]
  writer_b: [write]
tenants:
  reader_b: [{TENANT_B}]
  grafana_b: [{TENANT_B}]
  sched_b: [{TENANT_B}]
  admin_b: [{TENANT_B}]
  writer_b: [{TENANT_B}]
""")
    (tmp / "rules.yml").write_text(
        "groups:\n- name: dflt-secret-group\n  interval: 1s\n  rules:\n"
        "  - record: dflt_secret_rule:sum\n    expr: sum by (token) (dflt_secret_metric_total)\n"
        "  - alert: DfltSecretAlert\n    expr: dflt_secret_metric_total > 0\n    labels:\n      owner: dflt-owner-label\n")
    cfg = tmp / "turboprom.yml"
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [rules.yml]\n"
        "scrape_configs:\n- job_name: dflt-secret-job\n  scrape_interval: 1s\n  scrape_timeout: 500ms\n  static_configs:\n"
        "  - targets: ['dflt-scrape-host.invalid:9']\n"
        "planner:\n  min_count: 2\n  period: 10m\n  pane: 1m\n  seal_delay: 0s\n  history: 1d\n"
        "  tenants: {team-a: {approximate: true}}\n"
        "congestion:\n  stale_after: 120s\n  drop_after: 300s\n"
        "limits:\n  tenants:\n    team-a: {max_active_series: 200000}\n")
    srv = ServerProcess(tmp / "data", ["--config", str(cfg), "--web.config.file", str(web), "--web.enable-admin-api",
                                       "--wal-fsync", "never"])
    srv.start()
    try:
        url = srv.url
        base = int(time.time()) * 1000 - 5000
        sec = Secrets(t_default=base + 417, t_a=base - 1000 + 683, t_b_min=base - 2000 + 251 - 30_000, t_b=base - 2000 + 251)
        _write(url, None, _exposition("dflt", sec.t_default))
        _write(url, "team-a", _exposition("teama", sec.t_a))
        _write(url, TENANT_B, _exposition("teamb", sec.t_b))
        _remote_write(url, None, _exemplar_write("dflt_secret_latency_bucket", {"instance": "dflt-inst-q7.example", "le": "1"},
                                                 "dflt-trace-5150", sec.t_default - 1))
        _remote_write(url, "team-a", _exemplar_write("teama_secret_latency_bucket", {"instance": "teama-inst-z3.example", "le": "1"},
                                                     "teama-trace-8086", sec.t_a - 1))
        _remote_write(url, TENANT_B, _exemplar_write("teamb_latency_bucket", {"instance": "teamb-inst.example", "le": "1"},
                                                     "teamb-trace-own", sec.t_b - 1))
        # congestion samples: workers of the default tenant and team-a (only the default tenant's reach the
        # tracker); team-b keeps only the samples above, so its head figures are known exactly
        for tenant, inst in ((None, "dflt-gpu-worker-77"), ("team-a", "teama-gpu-worker-3")):
            w = WorkerMetrics(model_name="dflt-model-llama" if tenant is None else "m", cluster="dflt-cluster-east" if tenant is None else "c",
                              instance=inst)
            w.set_prefill_capacity(1000.0)
            w.set_queue(waiting=3, running=2)
            w.add_prompt_tokens(500)
            _write(url, tenant, w.exposition())
        # planner activity and query-log rows of the default tenant and team-a
        end = time.time()
        for tenant, q in ((None, 'sum(rate(dflt_secret_metric_total{token="DFLTSECRET-xyzzy"}[5m]))'),
                          ("team-a", 'sum(rate(teama_secret_metric{token="TEAMASECRET-plugh"}[5m]))')):
            for _ in range(4):
                st, body, _ = call(url + "/api/v1/query_range?" + urllib.parse.urlencode(
                    {"query": q, "start": end - 600, "end": end, "step": "15"}),
                    _basic("admin", tenant))
                assert st == 200, body[:300]
        yield url, sec
    finally:
        srv.stop()


def _admin_sees_the_default_tenant(url: str) -> None:
    """The routes swept below do carry the default tenant's secrets for its own callers (else the
    sweep would prove nothing)."""
    wait_for(lambda: b"DfltSecretAlert" in call(url + "/api/v1/alerts", ADMIN)[1], "the default tenant's alert")
    wait_for(lambda: b"dflt-gpu-worker-77" in call(url + "/api/v1/congestion", ADMIN)[1], "the default tenant's congestion view")
    wait_for(lambda: b"dflt-scrape-host" in call(url + "/api/v1/targets", ADMIN)[1], "the default tenant's scrape target")
    wait_for(lambda: b"dflt_secret" in call(url + "/api/v1/planner/candidates", ADMIN)[1], "the default tenant's candidates")
    assert b"dflt_secret_rule:sum" in call(url + "/api/v1/rules", ADMIN)[1]
    assert b"dflt-gpu-worker-77" in call(url + "/api/v1/congestion/stream?limit=1", ADMIN, timeout=20)[1]
    assert b"team-a" in call(url + "/api/v1/status/config", ADMIN)[1]
    assert b"dflt-trace-5150" in call(url + "/api/v1/query_exemplars?" + urllib.parse.urlencode(
        {"query": "dflt_secret_latency_bucket"}), ADMIN)[1]
    wait_for(lambda: b"teama_secret" in call(url + "/api/v1/planner/query_log", _basic("admin", "team-a"))[1],
             "team-a's query log")


FILLERS = {  # values for path parameters: every parametrized route must be listed here
    "/api/v1/label/{name}/values": ["__name__", "token", "instance", "job", "trace_id", "cluster", "model_name",
                                    "__tenant__", "alertname", "owner"],
    "/api/v1/planner/plans/{id}": [],  # filled with the default tenant's plan ids
    "/api/v1/congestion/model_server/{instance}/metrics": ["dflt-gpu-worker-77", "nope"],
    "/static": ["/index.html", "/js/autocomplete.js", "/style.css"],
}
NOT_SWEPT = {"/api/v1/{path}"}  # OPTIONS only (CORS preflight, no data)


def _variants(now: float) -> list[dict[str, Any]]:
    """Query parameters tried on every route (each route reads the ones it knows: match[] for
    series/labels/values, query for queries, explain and exemplars, state, since, format, ...). None
    names another tenant's secrets: team-b's own query log and cost report show team-b's own queries."""
    sels = ['{__name__=~".+"}', '{token=~".+"}', '{__tenant__=~".+"}', '{instance=~".+"}', '{__name__=~".+_bucket"}',
            '{__name__=~"d.+|t.+"}', '{trace_id=~".+"}']
    exprs = sels + ['count by (token, instance) ({token=~".+"})', 'sum by (__name__) (rate({__name__=~".+"}[5m]))']
    out: list[dict[str, Any]] = [{}, {"format": "text", "since": "24h"}, {"format": "csv", "since": "24h"}]
    for i, q in enumerate(exprs):
        out.append({"query": q, "match[]": [sels[i % len(sels)], '{__name__=~".+"}'], "start": now - 3600, "end": now,
                    "step": "15", "time": now, "since": "24h", "state": "any", "limit": "1000"})
    return out


def _sweep_urls(url: str, plan_ids: list[str], now: float) -> list[str]:
    urls = []
    for method, path in _routes():
        if method != "GET" or path in NOT_SWEPT:
            continue
        if "{" in path or path in FILLERS:
            assert path in FILLERS, f"route {path} has path parameters: add values for it to FILLERS"
            fills = plan_ids + ["nope"] if path == "/api/v1/planner/plans/{id}" else FILLERS[path]
            paths = []
            for f in fills:
                if path == "/static":
                    paths.append(path + f)
                else:
                    key = path[path.index("{"):path.index("}") + 1]
                    paths.append(path.replace(key, urllib.parse.quote(f, safe="")))
        else:
            paths = [path]
        for p in paths:
            for params in _variants(now):
                if p == "/api/v1/congestion/stream":
                    params = {**params, "limit": "1"}
                urls.append(url + p + ("?" + urllib.parse.urlencode(params, doseq=True) if params else ""))
    return urls


def test_tenant_b_sees_no_other_tenants_data_on_any_route(env) -> None:
    url, sec = env
    _admin_sees_the_default_tenant(url)
    plans = get_json(url + "/api/v1/planner/plans", ADMIN)[1]["data"]["plans"]
    now = time.time()
    urls = _sweep_urls(url, [p["id"] for p in plans], now)
    forbidden = sec.forbidden()
    leaks = []
    for who in B_USERS:
        for u in urls:
            st, body, _ = call(u, who, timeout=30)
            text = body.decode("utf-8", "replace")
            # What the caller sent itself may come back (format_query, parse_query, a 404 naming the
            # id asked for): only words absent from the request count; other variants cover those.
            asked = urllib.parse.unquote_plus(u)
            found = [w for w in forbidden if w in text and w not in asked]
            if found:
                leaks.append(f"{who.name} GET {u[len(url):]} -> {st}: {found[:4]} in {text[:160]!r}")
    assert not leaks, f"{len(leaks)} leaks, e.g.:\n" + "\n".join(leaks[:25])
    # ... while team-b does see its own data there (the sweep reached real answers).
    st, b = get_json(url + "/api/v1/series", READER_B, **{"match[]": '{token=~".+"}'})
    assert st == 200 and {s["__name__"] for s in b["data"]} >= {"teamb_metric"}
    st, b = get_json(url + "/api/v1/query_exemplars", READER_B, query="teamb_latency_bucket")
    assert st == 200 and "teamb-trace-own" in json.dumps(b)


def test_default_only_views_are_empty_for_another_tenant(env) -> None:
    url, _ = env
    _admin_sees_the_default_tenant(url)
    for who in B_USERS[:2]:
        assert get_json(url + "/api/v1/rules", who)[1]["data"] == {"groups": []}
        assert get_json(url + "/api/v1/alerts", who)[1]["data"] == {"alerts": []}
        assert get_json(url + "/api/v1/planner/candidates", who)[1]["data"] == []
        assert get_json(url + "/api/v1/planner/plans", who)[1]["data"]["plans"] == []
        c = get_json(url + "/api/v1/congestion", who)[1]["data"]
        assert c["instances"] == [] and c["clusters"] == [] and c["version"] == 0
        t = get_json(url + "/api/v1/targets", who)[1]["data"]
        assert t["activeTargets"] == [] and t["droppedTargets"] == []
        st, b = get_json(url + "/api/v1/planner/explain", who, query='sum(rate(dflt_secret_metric_total[5m]))')
        assert st == 200 and all(s["path"] == "raw" for s in b["data"]["subtrees"])
        log = get_json(url + "/api/v1/planner/query_log", who)[1]["data"]
        assert all(r["tenant"] == TENANT_B for r in log)
    # The stream shows the same empty view and is not woken by the default tenant's updates.
    st, body, _ = call(url + "/api/v1/congestion/stream?limit=1", READER_B, timeout=20)
    assert st == 200 and b'"instances":[]' in body and b"id: 0" in body


def test_status_tsdb_head_stats_are_the_callers_own(env) -> None:
    """headStats (series, label pairs, min/max time) of team-b's series alone: another tenant's newest
    timestamp is not a side channel."""
    url, sec = env
    st, b = get_json(url + "/api/v1/status/tsdb", READER_B)
    assert st == 200, b
    head = b["data"]["headStats"]
    assert head["maxTime"] == sec.t_b and head["minTime"] == sec.t_b_min, (head, sec)
    names = {x["name"] for x in b["data"]["seriesCountByMetricName"]}
    assert head["numSeries"] == sum(x["value"] for x in b["data"]["seriesCountByMetricName"]), b["data"]
    assert "teamb_metric" in names and not any(n.startswith(("dflt", "teama")) for n in names)
    # the cost report's storage figures (the same view) are team-b's too
    st, b = get_json(url + "/api/v1/cost_report", READER_B, since="1h")
    assert st == 200 and b["data"]["storage"]["headStats"]["maxTime"] == sec.t_b


def test_remote_read_as_tenant_b_carries_only_team_b(env) -> None:
    """POST /api/v1/read (not in the GET sweep): both response types, selectors reaching for every
    tenant's series, decoded; labels and timestamps are team-b's only."""
    from ingest.proto.messages import ChunkedReadResponse, ReadRequest, ReadResponse
    from ingest.snappy_block import decompress

    url, sec = env
    req = ReadRequest()
    for name, rx in (("__name__", ".+"), ("token", ".+"), ("__tenant__", ".+"), ("instance", ".+"), ("trace_id", ".*")):
        q = req.queries.add(start_timestamp_ms=0, end_timestamp_ms=sec.t_default + 60_000)
        q.matchers.add(type=2, name=name, value=rx)
    forbidden = [w for w in sec.forbidden() if not w[0].isdigit()]
    for who in B_USERS:
        for types in ([], [1]):
            req.ClearField("accepted_response_types")
            req.accepted_response_types.extend(types)
            st, body, _ = call(url + "/api/v1/read", who, data=compress(req.SerializeToString()),
                               headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"})
            assert st == 200, (who.name, st, body[:200])
            if types:
                series, p = [], 0
                while p < len(body):  # uvarint length, 4 CRC bytes, message
                    n = sh = 0
                    while True:
                        b = body[p]
                        p += 1
                        n |= (b & 0x7F) << sh
                        sh += 7
                        if b < 0x80:
                            break
                    m = ChunkedReadResponse.FromString(body[p + 4:p + 4 + n])
                    p += 4 + n
                    series += [(cs.labels, [c.max_time_ms for c in cs.chunks]) for cs in m.chunked_series]
            else:
                resp = ReadResponse.FromString(bytes(decompress(body, 1 << 26)))
                series = [(ts.labels, [x.timestamp for x in ts.samples]) for r in resp.results for ts in r.timeseries]
            names = {lb.value for lbls, _ in series for lb in lbls if lb.name == "__name__"}
            assert names and all(n.startswith("teamb") for n in names), (who.name, names)
            text = " ".join(f"{lb.name}={lb.value}" for lbls, _ in series for lb in lbls)
            assert not [w for w in forbidden if w in text] and "__tenant__" not in text, (who.name, text[:300])
            assert not {sec.t_default, sec.t_a} & {t for _, tss in series for t in tss}


def test_self_metrics_and_config_only_for_callers_of_every_tenant(env) -> None:
    """/metrics counts every tenant's samples and series, /api/v1/status/config names every tenant's
    limits and targets: callers restricted to tenants get 403, operators (not restricted) read them."""
    url, _ = env
    for who in B_USERS:
        # the audit log check reports entry counts over every tenant's KedgeFlow activity
        for path in ("/metrics", "/api/v1/status/config", "/api/v1/audit/verify"):
            st, body, _ = call(url + path, who)
            assert st == 403 and json.loads(body)["errorType"] == "forbidden", (who.name, path, st, body[:200])
    for who in (ADMIN, READER):
        st, body, _ = call(url + "/metrics", who)
        assert st == 200 and b"turboprom_storage_appended_samples_total" in body
        assert call(url + "/api/v1/status/config", who)[0] == 200
    st, body, _ = call(url + "/api/v1/audit/verify", ADMIN)
    assert st == 200 and json.loads(body)["data"]["ok"] is True, body[:300]
    # buildinfo stays open to every reader (Grafana reads it to pick features)
    assert call(url + "/api/v1/status/buildinfo", READER_B)[0] == 200


def test_tenant_b_regex_never_runs_on_another_tenants_values(env) -> None:
    """The timing oracle: team-b's value matchers are evaluated only against team-b's own label values.
    team-a holds a value on which `(T+)+$` backtracks for seconds; team-b's selections with that regex
    must stay instant, and health and congestion polls responsive while they run."""
    url, _ = env
    sel = '{token=~"(T+)+$"}'
    with ResponsivenessMonitor(url, auth=(READER_B.name, PW[READER_B.name]), headers={"X-Scope-OrgID": TENANT_B}) as mon:
        t0 = time.perf_counter()
        for path, params in (("/api/v1/series", {"match[]": sel}), ("/api/v1/labels", {"match[]": sel}),
                             ("/api/v1/label/token/values", {"match[]": sel}),
                             ("/api/v1/query", {"query": f"count({sel})"})):
            st, b = get_json(url + path, READER_B, **params)
            assert st == 200, b
        elapsed = time.perf_counter() - t0
        time.sleep(0.3)  # a few polls after the requests, too
    assert elapsed < 1.5, f"team-b's regex selections took {elapsed:.2f} s: they ran on another tenant's values"
    mon.assert_responsive(0.1, min_polls=3)


# ------------------------------------------------------------------------------------------ in process
class _Recording(Matcher):
    """A matcher that records every label value it is asked about."""

    seen: list[str] = []

    def matches(self, value: str) -> bool:
        _Recording.seen.append(value)
        return Matcher.matches(self, value)

    def matches_values(self, values):
        _Recording.seen.extend(values)
        return Matcher.matches_values(self, values)


def test_value_matchers_only_see_the_callers_tenants_values(tmp_path: Path) -> None:
    from turboprom.tenancy import TenantView, label_batch

    now = int(time.time() * 1000)
    with TSDB(str(tmp_path / "db"), StorageOptions(), background=False) as db:
        for tenant, vals in (("default", ["dflt-x1", "dflt-x2"]), ("team-a", ["secret-a1", "secret-a2", "secret-a3"]),
                             ("team-b", ["own-b1", "own-b2"])):
            b = SampleBatch.from_series([(make_labels({"__name__": "m", "token": v}), np.array([now]), np.array([1.0]))
                                         for v in vals])
            db.append(label_batch(b, tenant))
        for tenant, own in (("team-b", "own-b"), ("default", "dflt-x"), ("team-a", "secret-a")):
            view = TenantView(db, tenant)
            _Recording.seen = []
            for op, pat in (("=~", "se.*"), ("!~", "own.*"), ("!=", "x"), ("=~", ".*")):
                m = _Recording("token", op, pat)
                view.series([[m]], 0, now + 1)
                view.label_values("token", 0, now + 1, [[m]])
                view.label_names(0, now + 1, [[m]])
                view.select([m], 0, now + 1)
                view.delete_series([[_Recording("token", "=", "never-there")]], 0, 0)
            strangers = {v for v in _Recording.seen if v and not v.startswith(own)}
            assert not strangers, f"{tenant}'s matchers were evaluated on other tenants' values {sorted(strangers)}"
            assert {lbl[1] for s in view.series([[Matcher("token", "=~", ".+")]], 0, now + 1) for lbl in s
                    if lbl[0] == "token"} == {v for v in _Recording.seen if v}
            assert all(v.startswith(own) for v in view.label_values("token", 0, now + 1))


TENANTS = ["", "team-a", "team-b"]
VALUES = ["a", "b", "ab", "x1", "A"]
label_sets = st.lists(
    st.tuples(st.sampled_from(TENANTS), st.dictionaries(st.sampled_from(["__name__", "job", "env"]), st.sampled_from(VALUES),
                                                         min_size=1, max_size=3)),
    min_size=1, max_size=30)
matchers = st.lists(st.builds(Matcher, st.sampled_from(["__name__", "job", "env", "missing", "__tenant__"]),
                              st.sampled_from(["=", "!=", "=~", "!~"]), st.sampled_from(["a", "b", "", "a.*", ".+", "team-a"])),
                    min_size=0, max_size=3)


@settings(max_examples=150, deadline=None)
@given(label_sets, st.sampled_from(TENANTS + ["team-c"]), matchers, st.integers(0, 30))
def test_tenant_partitions_match_brute_force(series, tenant, ms, prefix):
    """Matching inside a tenant's partition gives exactly what matching every series would, also over a
    prefix of ids (a reader that saw only the first n series) and with more matchers on the tenant label."""
    idx = SeriesIndex()
    made = []
    for t, d in series:
        lbl = make_labels({**d, **({"__tenant__": t} if t else {})})
        if lbl not in made:
            made.append(lbl)
            idx.get_or_create(lbl)
    full = [Matcher("__tenant__", "=", tenant), *ms]
    n = min(prefix, len(made))
    want = [i for i, s in enumerate(made[:n]) if all(m.matches(dict(s).get(m.name, "")) for m in full)]
    assert idx.match_ids(full, n).tolist() == want
    assert np.flatnonzero(idx.match_mask(full, n)).tolist() == want
    store_wide = [i for i, s in enumerate(made[:n]) if all(m.matches(dict(s).get(m.name, "")) for m in ms)]
    assert idx.match_ids(ms, n).tolist() == store_wide  # no tenant named: the union of every partition
    assert idx.values_in("job", idx.match_any_mask([ms], n)) == sorted({dict(made[i]).get("job") for i in store_wide} - {None})
    sel = idx.match_any_mask([full], n)
    assert idx.values_in("job", sel, idx.partition_of([full])) == idx.values_in("job", sel)
    assert idx.names_in(sel, idx.partition_of([full])) == idx.names_in(sel)
