"""GET /federate: text exposition of the latest sample of every matching series.

A real Prometheus 2.42 federates from a real TurboProm (``metrics_path: /federate``, ``match[]``
params, ``honor_labels: true``); after its scrapes, its instant queries answer exactly what
TurboProm's own do (label sets, values, sample timestamps), and the families' TYPEs reach its
metadata. Format details, errors and tenancy are checked directly.
"""
from __future__ import annotations

import base64
import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import bcrypt
import numpy as np
import pytest

from ingest.proto.messages import WriteRequest
from ingest.snappy_block import compress
from storage.stale import STALE_NAN_BITS
from tests.helpers import ServerProcess, free_port, require_binary, wait_http

STALE = float(np.array([STALE_NAN_BITS], np.uint64).view(np.float64)[0])


def remote_write(url: str, series: list[tuple[dict, list[int], list[float]]], metadata: dict[str, str] | None = None,
                 headers: dict | None = None) -> None:
    """POST one remote-write 1.0 request (test helper: a loop per sample is fine here)."""
    w = WriteRequest()
    for labels, ts, vs in series:
        s = w.timeseries.add()
        for n, v in sorted(labels.items()):
            s.labels.add(name=n, value=v)
        for t, v in zip(ts, vs):
            s.samples.add(timestamp=int(t), value=float(v))
    types = {"counter": 1, "gauge": 2, "histogram": 3, "summary": 5}
    for fam, typ in (metadata or {}).items():
        w.metadata.add(metric_family_name=fam, type=types[typ], help=f"{fam} help")
    h = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
         "X-Prometheus-Remote-Write-Version": "0.1.0", **(headers or {})}
    req = urllib.request.Request(url + "/api/v1/write", data=compress(w.SerializeToString()), headers=h, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status in (200, 204)


def fleet_data(now_ms: int) -> tuple[list[tuple[dict, list[int], list[float]]], dict[str, str]]:
    """Counters with resets, gauges (special values, odd label values), a classic histogram, a
    series ending in a stale marker, one too old for the lookback, one without instance."""
    step = 15_000
    ts = [now_ms - 40 * step + k * step for k in range(40)]  # last one 15 s ago
    out: list[tuple[dict, list[int], list[float]]] = []
    for inst in ("a:1", "b:2"):
        vals, acc = [], 0.0
        for k in range(40):
            acc = 3.0 if k == 17 else acc + 7 + (k % 3)  # a counter reset at k=17
            vals.append(acc)
        out.append(({"__name__": "fed_requests_total", "job": "api", "instance": inst, "code": "200"}, ts, vals))
    specials = [("pi", 3.141592653589793), ("tiny", 1e-300), ("huge", 1.7976931348623157e308), ("neg0", -0.0),
                ("inf", float("inf")), ("minf", float("-inf")), ("nan", float("nan")), ("big", 1e21), ("int", 42.0)]
    for kind, v in specials:
        out.append(({"__name__": "fed_gauge", "job": "api", "instance": "a:1", "kind": kind}, ts, [v * 0.5 for _ in ts[:-1]] + [v]))
    out.append(({"__name__": "fed_gauge", "job": "api", "instance": "a:1", "kind": 'q"uo\\te\nnl ünï'}, ts, [float(k) for k in range(40)]))
    out.append(({"__name__": "fed_noinst", "job": "api"}, ts, [2.5] * 40))
    for le, frac in (("0.1", 0.2), ("0.5", 0.7), ("1", 0.9), ("+Inf", 1.0)):
        out.append(({"__name__": "fed_latency_seconds_bucket", "job": "api", "instance": "a:1", "le": le}, ts,
                    [float(int(frac * 10 * k)) for k in range(40)]))
    out.append(({"__name__": "fed_latency_seconds_count", "job": "api", "instance": "a:1"}, ts, [float(10 * k) for k in range(40)]))
    out.append(({"__name__": "fed_latency_seconds_sum", "job": "api", "instance": "a:1"}, ts, [2.5 * k for k in range(40)]))
    out.append(({"__name__": "fed_gone", "job": "api", "instance": "a:1"}, ts[:-1], [1.0] * 38 + [STALE]))
    out.append(({"__name__": "fed_old", "job": "api", "instance": "a:1"}, [now_ms - 400_000, now_ms - 360_000], [1.0, 2.0]))
    meta = {"fed_requests_total": "counter", "fed_gauge": "gauge", "fed_latency_seconds": "histogram"}
    return out, meta


def _get(url: str, headers: dict | None = None) -> tuple[int, bytes, dict]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def _query(base: str, q: str, t: float, headers: dict | None = None) -> list[dict]:
    st, body, _ = _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": q, "time": f"{t:.3f}"}), headers)
    doc = json.loads(body)
    assert st == 200 and doc["status"] == "success", (base, q, body[:300])
    return doc["data"]["result"]


def _canon(result: list[dict]) -> list[tuple]:
    return sorted((tuple(sorted(r["metric"].items())), r["value"][1]) for r in result)


@pytest.fixture()
def server(tmp_path):
    srv = ServerProcess(tmp_path / "data", ["--wal-fsync", "never"]).start()
    try:
        yield srv
    finally:
        srv.stop()


def test_federate_format_and_errors(server):
    now = int(time.time() * 1000)
    data, meta = fleet_data(now)
    remote_write(server.url, data, meta)
    st, body, hdrs = _get(server.url + "/federate?" + urllib.parse.urlencode({"match[]": '{__name__=~"fed_.+"}'}))
    assert st == 200 and hdrs["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = body.decode()
    lines = text.splitlines()
    # TYPE lines from metadata; the histogram's series stay together under its family's one TYPE line
    assert lines.count("# TYPE fed_latency_seconds histogram") == 1
    i = lines.index("# TYPE fed_latency_seconds histogram")
    assert [ln.split("{")[0] for ln in lines[i + 1:i + 7]] == ["fed_latency_seconds_bucket"] * 4 + \
        ["fed_latency_seconds_count", "fed_latency_seconds_sum"]
    assert "# TYPE fed_requests_total counter" in lines and "# TYPE fed_gauge gauge" in lines
    assert "# TYPE fed_noinst untyped" in lines
    # latest samples, ms timestamps, instance="" for a series without one, escaped label values
    last_t = now - 15_000
    assert f'fed_noinst{{job="api",instance=""}} 2.5 {last_t}' in lines
    assert f'fed_gauge{{instance="a:1",job="api",kind="q\\"uo\\\\te\\nnl ünï"}} 39 {last_t}' in lines
    assert f'fed_gauge{{instance="a:1",job="api",kind="nan"}} NaN {last_t}' in lines
    assert f'fed_gauge{{instance="a:1",job="api",kind="minf"}} -Inf {last_t}' in lines
    # stale and too-old series are left out; metric names in order, each family once
    assert "fed_gone" not in text and "fed_old" not in text
    names = [ln.split("{")[0].split(" ")[0] for ln in lines if not ln.startswith("#")]
    assert names == sorted(names)
    # two match[] sets overlapping: each series once
    st, body2, _ = _get(server.url + "/federate?" + urllib.parse.urlencode(
        {"match[]": ['{__name__=~"fed_.+"}', '{job="api"}']}, doseq=True))
    assert st == 200 and body2 == body
    for params, want in (({}, "no match[] parameter provided"), ({"match[]": "{job=~\"(\"}"}, "error parsing regexp"),
                         ({"match[]": '{job=~".*"}'}, "at least one non-empty matcher")):
        st, b, _ = _get(server.url + "/federate?" + urllib.parse.urlencode(params))
        doc = json.loads(b)
        assert st == 400 and doc["status"] == "error" and doc["errorType"] == "bad_data" and want in doc["error"], (params, b)


def _start_prometheus(tmp_path: Path, config: str, extra: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    binary = require_binary("prometheus")
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(config)
    log = open(tmp_path / "prometheus.log", "ab")
    proc = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                             f"--web.listen-address=127.0.0.1:{port}", *(extra or [])], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/-/ready", timeout=30, proc=proc)
    except Exception:
        proc.kill()
        proc.wait(10)
        raise
    return proc, base


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.peer
def test_prometheus_federating_from_turboprom_answers_the_same(server, tmp_path):
    now = int(time.time() * 1000)
    data, meta = fleet_data(now)
    remote_write(server.url, data, meta)
    host = server.url.split("//")[1]
    prom, base = _start_prometheus(tmp_path, f"""
global: {{scrape_interval: 1s, scrape_timeout: 1s}}
scrape_configs:
  - job_name: federate
    honor_labels: true
    metrics_path: /federate
    params:
      'match[]': ['{{__name__=~"fed_.+"}}', '{{job="api"}}']
    static_configs: [{{targets: ['{host}']}}]
""")
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            up = _query(base, 'up{job="federate"}', time.time())
            if up and up[0]["value"][1] == "1" and _query(base, "count(fed_gauge)", time.time()):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"Prometheus did not scrape /federate: {up}; log:\n{(tmp_path / 'prometheus.log').read_text()[-3000:]}")
        time.sleep(2.5)  # a few more scrapes: same samples again (duplicates, no new series)
        t = time.time()
        names = ("fed_requests_total", "fed_gauge", 'fed_gauge{kind=~"n.*|.*f"}', "fed_latency_seconds_bucket",
                 "fed_latency_seconds_sum", "fed_noinst", "fed_gone", "fed_old")
        for q in ('{__name__=~"fed_.+"}', *names, *(f"timestamp({n})" for n in names)):
            ours, theirs = _canon(_query(server.url, q, t)), _canon(_query(base, q, t))
            assert theirs == ours, (q, theirs, ours)
        assert _canon(_query(server.url, '{__name__=~"fed_.+"}', t))  # the comparison saw data
        assert not _query(base, "fed_gone", t) and not _query(base, "fed_old", t)
        # the TYPE lines reached Prometheus's metadata
        md = json.loads(_get(base + "/api/v1/metadata")[1])["data"]
        assert md["fed_latency_seconds"][0]["type"] == "histogram"
        assert md["fed_requests_total"][0]["type"] == "counter" and md["fed_gauge"][0]["type"] == "gauge"
    finally:
        _stop(prom)


# ------------------------------------------------------------------------------------ tenancy
PW = {"reader_b": "reader-b-pw", "writer": "writer-pw", "reader": "reader-pw"}


def _basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{PW[user]}".encode()).decode()


def auth_server(tmp_path: Path) -> ServerProcess:
    web = tmp_path / "web.yml"
    hashes = "".join(f"  {u}: {bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=4)).decode()}\n" for u, p in PW.items())
    web.write_text(f"basic_auth_users:\n{hashes}roles:\n  reader_b: [read]\n  writer: [write]\n  reader: [read]\n"
                   "tenants:\n  reader_b: [team-b]\n")
    return ServerProcess(tmp_path / "data", ["--web.config.file", str(web), "--wal-fsync", "never"]).start()


def write_tenants(url: str, now: int) -> None:
    for tenant, word in ((None, "dflt"), ("team-a", "teama"), ("team-b", "teamb")):
        h = {"Authorization": _basic("writer"), **({"X-Scope-OrgID": tenant} if tenant else {})}
        remote_write(url, [({"__name__": f"{word}_metric", "job": "svc", "instance": f"{word}-inst", "secret": f"{word}-secret"},
                            [now - 30_000, now - 15_000], [1.0, 2.0])], {f"{word}_metric": "gauge"}, headers=h)


def test_federate_tenant_sees_only_its_own_series(tmp_path):
    from turboprom.auth import required_role

    assert required_role("GET", "/federate") == "read" and required_role("POST", "/api/v1/read") == "read"
    srv = auth_server(tmp_path)
    try:
        write_tenants(srv.url, int(time.time() * 1000))
        q = "/federate?" + urllib.parse.urlencode({"match[]": '{__name__=~".+"}'})
        st, body, _ = _get(srv.url + q, {"Authorization": _basic("reader_b"), "X-Scope-OrgID": "team-b"})
        text = body.decode()
        assert st == 200 and "teamb_metric" in text and "# TYPE teamb_metric gauge" in text, text
        assert "dflt" not in text and "teama" not in text and "__tenant__" not in text and "team-b" not in text, text
        for headers, code in (({"Authorization": _basic("reader_b")}, 403),  # no header: the default tenant
                              ({"Authorization": _basic("reader_b"), "X-Scope-OrgID": "team-a"}, 403),
                              ({"Authorization": _basic("writer")}, 403),  # write role only
                              ({}, 401)):
            st, b, _ = _get(srv.url + q, headers)
            assert st == code and b"dflt" not in b and b"teama" not in b, (headers, st, b[:200])
        st, body, _ = _get(srv.url + q, {"Authorization": _basic("reader"), "X-Scope-OrgID": "team-a"})
        assert st == 200 and "teama_metric" in body.decode() and "teamb" not in body.decode()
    finally:
        srv.stop()
