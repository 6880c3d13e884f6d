"""Hostile PromQL against a real server: deep or long expressions, memory bombs, int64 overflows.

Each bomb must get its Prometheus-style refusal (400 bad_data for the caller's mistakes, 422
execution "query processing would load too many samples into memory in query execution" for queries
too big to hold), the server must survive with a bounded RSS (read from /proc/<pid>/status), and
`/-/healthy` and `/api/v1/congestion` must keep answering within 100 ms p99 while the bomb runs.
Queries just inside the limits (a tree 256 levels deep, a long operator chain, a long matcher list)
must still be answered, by every endpoint that parses or walks a tree.
"""
from __future__ import annotations

import json
import random
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable

import pytest

from ingest.proto.messages import WriteRequest
from ingest.snappy_block import compress
from tests.helpers import ServerProcess, free_port, http_json, require_binary, wait_http
from tests.hostile_monitor import ResponsivenessMonitor

TOO_MANY = "query processing would load too many samples into memory in query execution"
SERIES = 5000
MINUTES = 66
GIB = 1024**3


def _rss_bytes(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def _post(url: str, params: dict[str, str], timeout: float = 120) -> tuple[int, dict]:
    data = urllib.parse.urlencode(params).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, (json.loads(raw) if raw else {})


def _under_monitor(srv: ServerProcess, send: Callable[[], tuple[int, dict]], min_seconds: float = 2.5) -> list[tuple[int, dict]]:
    """Send the bomb (again and again for at least ``min_seconds``) while the monitor polls; the light
    endpoints must stay within 100 ms p99 and the server must still be alive afterwards. (~100 polls
    per path: one stray pause of an otherwise idle server is not a p99.)"""
    out = []
    with ResponsivenessMonitor(srv.url, interval=0.02, timeout=5.0) as mon:
        t0 = time.monotonic()
        while True:
            out.append(send())
            if time.monotonic() - t0 >= min_seconds:
                break
    assert srv.proc is not None and srv.proc.poll() is None, "the server died"
    mon.assert_responsive(p99_limit_s=0.1, min_polls=5)
    return out


def _samples(now: int, minutes: int) -> dict[str, list[tuple[int, float]]]:
    """bomb{i=...}: one sample a minute, distinct values (count_values' worst case)."""
    rnd = random.Random(7)
    out: dict[str, list[tuple[int, float]]] = {str(i): [] for i in range(SERIES)}
    for k in range(minutes - 1, -1, -1):
        for i in range(SERIES):
            out[str(i)].append(((now - 60 * k) * 1000, round(i * 1000 + k + rnd.random(), 6)))
    return out


def _load(srv: ServerProcess, minutes: int = MINUTES) -> None:
    now = int(time.time())
    lines = [f'bomb{{i="{i}"}} {v!r} {t}' for i, pts in _samples(now, minutes).items() for t, v in pts]
    st, _, _ = http_json(srv.url + "/api/v1/import/prometheus", ("\n".join(lines) + "\n").encode(),
                         {"Content-Type": "text/plain"}, timeout=300)
    assert st in (200, 204)
    srv.loaded_at, srv.loaded_minutes = now, minutes  # type: ignore[attr-defined]


def _settle(srv: ServerProcess, timeout: float = 60.0) -> None:
    """Wait until the work the load started (WAL, head, summarizer) is done: a quiet second of polls."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with ResponsivenessMonitor(srv.url, interval=0.02) as mon:
            time.sleep(1.0)
        if mon.worst_p99() < 0.03:
            return
    raise AssertionError(f"server never settled after the load: {mon.report()}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with ServerProcess(tmp_path_factory.mktemp("hostile-queries") / "data") as srv:
        _load(srv)
        _settle(srv)
        yield srv


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory):
    """--query.max-samples=8000 over 5000 series: one instant selection fits, two at once do not."""
    with ServerProcess(tmp_path_factory.mktemp("hostile-samples") / "data", ["--query.max-samples=8000"]) as srv:
        _load(srv, minutes=12)
        _settle(srv)
        yield srv


def _nested_subqueries(n: int) -> str:
    q = "bomb"
    for _ in range(n):
        q = f"max_over_time(({q})[5m:1m])"
    return q


DEEP = {
    "parens-500": "(" * 500 + "bomb" + ")" * 500,
    "parens-4000": "(" * 4000 + "bomb" + ")" * 4000,
    "plus-3000": "1+" * 3000 + "1",
    "abs-2000": "abs(" * 2000 + "bomb" + ")" * 2000,
    "subqueries-300": _nested_subqueries(300),
    "or-chain-1500": " or ".join(["bomb"] * 1500),
    "unary-3000": "-" * 3000 + "bomb",
    "brackets-and-braces": "sum(" * 300 + "bomb" + ")" * 300,
}


@pytest.mark.parametrize("name", sorted(DEEP))
def test_deep_expressions_are_refused_before_parsing(server: ServerProcess, name: str) -> None:
    q = DEEP[name]
    base = _rss_bytes(server.proc.pid)
    now = time.time()
    endpoints = [("/api/v1/query", {"query": q}),
                 ("/api/v1/query_range", {"query": q, "start": str(now - 600), "end": str(now), "step": "60"}),
                 ("/api/v1/format_query", {"query": q}),
                 ("/api/v1/parse_query", {"query": q})]
    i = iter(range(10**9))

    def send() -> tuple[int, dict]:
        path, params = endpoints[next(i) % len(endpoints)]
        return _post(server.url + path, params)

    for st, body in _under_monitor(server, send):
        assert st == 400, body
        assert body["status"] == "error" and body["errorType"] == "bad_data", body
        assert "too deeply nested" in body["error"] and "--query.max-depth" in body["error"], body
    assert _rss_bytes(server.proc.pid) < base + 200 * 1024**2


def test_queries_just_inside_the_depth_limit_are_answered_everywhere(server: ServerProcess) -> None:
    """A tree 256 levels deep passes the scan; the parser binding, positions, evaluator, printer,
    parse_query's JSON and the planner walk it without reaching Python's recursion limit."""
    shapes = {
        "parens": "(" * 256 + "bomb" + ")" * 256,
        "plus-chain": " + ".join(["bomb"] * 255),
        "scalar-chain": "1+" * 254 + "1",
        "abs": "abs(" * 255 + "bomb" + ")" * 255,
        "pow-chain": " ^ ".join(["bomb"] * 255),
        "unary": "-" * 255 + "bomb",
        "subqueries": _nested_subqueries(85),
        "or-chain": " or ".join(f'bomb{{i="{k}"}}' for k in range(255)),
        "aggregation-chain": " + ".join(['sum by (i) (rate(bomb{i!="x"}[5m]))'] * 250),
        "matcher-list": "bomb{" + ",".join(f'l{k}!="v{k}"' for k in range(1200)) + "}",
    }
    now = time.time()
    for name, q in shapes.items():
        assert len(q) <= 16384, name
        for path, params in [("/api/v1/query", {"query": q}),
                             ("/api/v1/query_range", {"query": q, "start": str(now - 300), "end": str(now), "step": "60"}),
                             ("/api/v1/format_query", {"query": q}),
                             ("/api/v1/parse_query", {"query": q})]:
            st, body = _post(server.url + path, params)
            assert st == 200, (name, path, body)
            assert body["status"] == "success", (name, path, body)


def test_longer_than_the_length_limit_is_refused(server: ServerProcess) -> None:
    q = "bomb{" + ",".join(f'l{k}!="v{k}"' for k in range(3000)) + "}"
    st, body = _post(server.url + "/api/v1/format_query", {"query": q})
    assert st == 400 and body["errorType"] == "bad_data" and "limits.max_query_length" in body["error"], body
    # a series selector of 2.7 MB (the parser binding would hold the GIL ~150 ms on it)
    sel = "bomb{" + ",".join(f'l{k}!="v{k}"' for k in range(200_000)) + "}"
    st, body = _post(server.url + "/api/v1/series", {"match[]": sel})
    assert st == 400 and body["errorType"] == "bad_data" and "more than the limit of" in body["error"], body


def test_memory_bombs_get_422_and_the_server_stays_small(server: ServerProcess) -> None:
    now = int(time.time())
    base = _rss_bytes(server.proc.pid)
    bombs = [
        # 5000 series x 3601 steps of distinct values: up to one output series per sample
        ("/api/v1/query_range", {"query": 'count_values("v", bomb)', "start": str(now - 3600), "end": str(now), "step": "1"}),
        ("/api/v1/query_range", {"query": 'count_values without (i) ("v", bomb)', "start": str(now - 3600), "end": str(now),
                                 "step": "1"}),
        # a subquery of 6e15 inner steps
        ("/api/v1/query", {"query": "max_over_time(bomb[200y:1ms])"}),
        ("/api/v1/query", {"query": "count_over_time(rate(bomb[5m])[10y:1s])"}),
    ]
    for path, params in bombs:
        def send() -> tuple[int, dict]:
            return _post(server.url + path, params)

        for st, body in _under_monitor(server, send, min_seconds=4.0):
            assert st == 422, (params["query"], body)
            assert body == {"status": "error", "errorType": "execution", "error": TOO_MANY}, body
        # what a refusal allocated is given back (not left to the cyclic GC, nor kept by malloc)
        rss = _rss_bytes(server.proc.pid, "VmRSS")
        assert rss < 2 * GIB and rss < base + 512 * 1024**2, (params["query"], rss >> 20, base >> 20)
    assert _rss_bytes(server.proc.pid, "VmHWM") < 3 * GIB
    # and the server still answers real queries
    st, body = _post(server.url + "/api/v1/query", {"query": "count(bomb)"})
    assert st == 200 and body["data"]["result"][0]["value"][1] == str(SERIES)


MAX_SAMPLES_FIT = ["bomb", "(bomb)", "-bomb", "max_over_time(bomb[90s])", "rate(bomb[5m])", "rate((bomb[5m]))",
                   "time()", "vector(1)"]
MAX_SAMPLES_BOMBS = ["sum(bomb)", "bomb * 2", "bomb > 1e12", "abs(bomb)", 'count_values("v", bomb)',
                     'label_replace(bomb, "j", "$1", "i", "(.*)")', "max_over_time(bomb[10m:1m])", "bomb + on(i) bomb",
                     "bomb or bomb", "bomb[90s]", "topk(3, bomb)", "sort(bomb)"]


def test_max_samples_counts_operands_and_results_like_prometheus(small_server: ServerProcess) -> None:
    """5000 samples fit under --query.max-samples=8000, and so do a unary minus (in place) and a
    range-vector function (fed one series at a time). An operator, aggregation or function over
    instant vectors holds its operands, their samples gathered at a step and its result: over the
    limit, as in Prometheus's engine (checked against a real Prometheus below)."""
    url = small_server.url + "/api/v1/query"
    for q in MAX_SAMPLES_FIT:
        st, body = _post(url, {"query": q})
        assert st == 200, (q, body)
    sent: list[str] = []

    def send() -> tuple[int, dict]:
        sent.append(MAX_SAMPLES_BOMBS[len(sent) % len(MAX_SAMPLES_BOMBS)])
        return _post(url, {"query": sent[-1]})

    for q, (st, body) in zip(sent, _under_monitor(small_server, send)):
        assert st == 422, (q, body)
        assert body == {"status": "error", "errorType": "execution", "error": TOO_MANY}, (q, body)
    assert set(sent) == set(MAX_SAMPLES_BOMBS)


def test_max_samples_agrees_with_prometheus(small_server: ServerProcess, tmp_path: Path) -> None:
    """The same samples in a real Prometheus 2.42 with the same --query.max-samples: every query of
    both lists gets the same status from both."""
    prom = require_binary("prometheus")
    port = free_port()
    (tmp_path / "prometheus.yml").write_text("global:\n  scrape_interval: 1h\n")
    proc = subprocess.Popen([prom, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver",
                             "--query.max-samples=8000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", proc=proc)
        w = WriteRequest()
        for labels, points in _samples(small_server.loaded_at, small_server.loaded_minutes).items():
            ts = w.timeseries.add()
            ts.labels.add(name="__name__", value="bomb")
            ts.labels.add(name="i", value=labels)
            for t, v in points:
                ts.samples.add(value=v, timestamp=t)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/write", data=compress(w.SerializeToString()),
                                     headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
                                              "X-Prometheus-Remote-Write-Version": "0.1.0"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status in (200, 204)
        at = str(small_server.loaded_at)
        for q in MAX_SAMPLES_FIT + MAX_SAMPLES_BOMBS:
            ours, _ = _post(small_server.url + "/api/v1/query", {"query": q, "time": at})
            theirs, body = _post(f"http://127.0.0.1:{port}/api/v1/query", {"query": q, "time": at})
            assert ours == theirs, (q, ours, theirs, body)
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("query, fragment", [
    ("bomb offset 1000000000y", "1:13: parse error: duration out of range"),
    ("rate(bomb[1000000000y])", "1:11: parse error: duration out of range"),
    ("absent_over_time(bomb[100000000y])", "1:23: parse error: duration out of range"),
    ("bomb offset -1000000000y", "duration out of range"),
    ("max_over_time(bomb[5m:1000000000y])", "duration out of range"),
    ("bomb[293y]", "duration out of range"),
    ("bomb @ 1e20", "timestamp out of bounds for @ modifier"),
    ("bomb @ 1e19", "timestamp out of bounds for @ modifier"),  # beyond int64 (Prometheus accepts less)
    ("bomb @ -1e300", "timestamp out of bounds for @ modifier"),
])
def test_out_of_range_durations_and_times_are_400(server: ServerProcess, query: str, fragment: str) -> None:
    for path in ("/api/v1/query", "/api/v1/format_query"):
        st, body = _post(server.url + path, {"query": query})
        assert st == 400, (path, body)
        assert body["errorType"] == "bad_data" and fragment in body["error"], (path, body)


def test_out_of_range_parameters_are_400(server: ServerProcess) -> None:
    cases = [
        ("/api/v1/query", {"query": "bomb", "lookback_delta": "1000000000y"}, "lookback delta"),
        ("/api/v1/query", {"query": "bomb", "timeout": "1000000000y"}, "timeout"),
        ("/api/v1/query_range", {"query": "bomb", "start": "0", "end": "1", "step": "1000000000y"}, "step"),
        ("/api/v1/query_range", {"query": "bomb", "start": "0", "end": "1e30", "step": "1e30"}, "step"),
    ]
    for path, params, name in cases:
        st, body = _post(server.url + path, params)
        assert st == 400 and body["errorType"] == "bad_data" and name in body["error"], (params, body)


def test_delete_on_the_series_endpoint_is_405(server: ServerProcess) -> None:
    req = urllib.request.Request(server.url + "/api/v1/series?match[]=bomb", method="DELETE")
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=10)
    assert ei.value.code == 405
    assert set(ei.value.headers["Allow"].replace(" ", "").split(",")) >= {"GET", "POST"}
    body = json.loads(ei.value.read())
    assert body["errorType"] == "bad_data" and "/api/v1/admin/tsdb/delete_series" in body["error"]
    st, out, _ = http_json(server.url + "/api/v1/query?query=count(bomb)")  # nothing was deleted
    assert st == 200 and out["data"]["result"][0]["value"][1] == str(SERIES)


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_big_legitimate_answer_does_not_stall_the_server(server: ServerProcess, gzipped: bool) -> None:
    """6 million samples in one answer (5000 series x 1201 steps), within every limit: encoded in
    blocks and written piece by piece, so the light endpoints stay responsive meanwhile."""
    import gzip as gz

    now = server.loaded_at  # type: ignore[attr-defined]
    params = urllib.parse.urlencode({"query": "bomb", "start": now - 1200, "end": now, "step": 1}).encode()
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if gzipped:
        headers["Accept-Encoding"] = "gzip"

    def send() -> tuple[int, bytes]:
        req = urllib.request.Request(server.url + "/api/v1/query_range", data=params, headers=headers)
        with urllib.request.urlopen(req, timeout=120) as r:
            raw = r.read()
            assert (r.headers.get("Content-Encoding") == "gzip") == gzipped
            assert int(r.headers["Content-Length"]) == len(raw)
        return r.status, raw  # decoded after the monitor stops: json.loads of 200 MB holds this process's GIL

    (st, raw), *_ = _under_monitor(server, send, min_seconds=0.0)  # type: ignore[misc]
    body = json.loads(gz.decompress(raw) if gzipped else raw)
    assert st == 200 and body["status"] == "success"
    result = body["data"]["result"]
    assert len(result) == SERIES and {len(s["values"]) for s in result} == {1201}
    assert result[0]["metric"] == {"__name__": "bomb", "i": "0"}
