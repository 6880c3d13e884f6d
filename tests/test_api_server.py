"""The HTTP API of a real TurboProm server, side by side with a real Prometheus 2.42 holding the
same data: same status codes, error types and messages, same result JSON (values compared as the
exact strings Prometheus writes).

Evaluation times are kept off sample timestamps: Prometheus 3 made range-selector windows
left-open (TurboProm follows 3.x), 2.42 includes a sample exactly at the window start.
"""
from __future__ import annotations

import json
import math

import orjson
import pytest

from tests.test_api_helpers import T0_MS, PeerPair, http

pytestmark = pytest.mark.peer

T = (T0_MS + 900_500) / 1000  # mid-window, half a second after a sample
START = (T0_MS + 60_250) / 1000
END = (T0_MS + 1_500_250) / 1000


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with PeerPair(tmp_path_factory.mktemp("api-server")) as p:
        yield p


def both(pair: PeerPair, method: str, path: str, params) -> tuple[tuple[int, bytes], tuple[int, bytes]]:
    a = http(method, pair.prom.url + path, params)
    b = http(method, pair.tp.url + path, params)
    return (a[0], a[2]), (b[0], b[2])


def normalized(body: bytes) -> object:
    doc = orjson.loads(body)
    data = doc.get("data")
    if isinstance(data, dict) and data.get("resultType") in ("vector", "matrix"):
        data["result"] = sorted(data["result"], key=lambda r: json.dumps(r["metric"], sort_keys=True))
    doc.pop("warnings", None)
    doc.pop("infos", None)
    return doc


def close(a: object, b: object, rel: float = 1e-9) -> bool:
    """Structural equality; sample value strings may differ in the last digits (summation order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, str) and isinstance(b, str) and a != b:
        try:
            fa, fb = float(a), float(b)
        except ValueError:
            return False
        return math.isclose(fa, fb, rel_tol=rel, abs_tol=1e-12)
    return a == b


INSTANT_QUERIES = [
    "http_requests_total",
    'http_requests_total{code="500"}',
    'http_requests_total{job=~"a.*|w.*", code!="200"}',
    "rate(http_requests_total[5m])",
    "sum by (job) (rate(http_requests_total[5m]))",
    "sum without (instance) (http_requests_total)",
    "temperature_celsius",
    "temperature_celsius[1m]",
    "temperature_celsius offset 5m",
    "max_over_time(temperature_celsius[10m])",
    "sparse_gauge",
    "http_requests_total / ignoring(code) group_left sum without(code) (http_requests_total)",
    "topk(2, http_requests_total)",
    "count_values(\"v\", temperature_celsius)",
    "vector(1) + 0.1",
    "time()",
    "-Inf",
    '"a string"',
    "histogram_quantile(0.9, rate(http_requests_total[5m]))",
    "nonexistent_metric",
    "absent(nonexistent_metric)",
]


@pytest.mark.parametrize("q", INSTANT_QUERIES)
def test_instant_query_matches_prometheus(pair, q):
    (sa, ba), (sb, bb) = both(pair, "GET", "/api/v1/query", {"query": q, "time": str(T)})
    assert sa == 200, ba
    assert sb == 200, bb
    assert close(normalized(bb), normalized(ba)), (ba, bb)


RANGE_QUERIES = [
    "http_requests_total",
    "rate(http_requests_total[2m])",
    "sum(rate(http_requests_total[5m]))",
    "temperature_celsius",
    "sparse_gauge",
    "1",
    "time() - 1700000000",
]


@pytest.mark.parametrize("q", RANGE_QUERIES)
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_range_query_matches_prometheus_bytes(pair, q, method):
    params = {"query": q, "start": str(START), "end": str(END), "step": "30"}
    (sa, ba), (sb, bb) = both(pair, method, "/api/v1/query_range", params)
    assert (sa, sb) == (200, 200), (ba, bb)
    # Range results are sorted by labels on both sides: the bytes match, up to the last digits
    # of values that depend on summation order.
    # (A query served from a summary says so in "infos"; the values must still agree.)
    assert bb == ba or close(normalized(bb), normalized(ba)), (ba, bb)


def test_rfc3339_and_duration_params(pair):
    params = {"query": "sum(http_requests_total)", "start": "2023-11-14T22:14:20.250Z",
              "end": "2023-11-14T22:24:20.250Z", "step": "1m"}
    (sa, ba), (sb, bb) = both(pair, "GET", "/api/v1/query_range", params)
    assert (sa, sb) == (200, 200)
    assert bb == ba


PARAM_ERRORS = [
    ("/api/v1/query_range", {"query": "1", "start": "abc", "end": "10", "step": "1"}),
    ("/api/v1/query_range", {"query": "1", "start": "10", "end": "x", "step": "1"}),
    ("/api/v1/query_range", {"query": "1", "start": "10", "end": "5", "step": "1"}),
    ("/api/v1/query_range", {"query": "1", "start": "0", "end": "10", "step": "0"}),
    ("/api/v1/query_range", {"query": "1", "start": "0", "end": "10", "step": "-5"}),
    ("/api/v1/query_range", {"query": "1", "start": "0", "end": "10", "step": "zz"}),
    ("/api/v1/query_range", {"query": "1", "start": "0", "end": "10"}),
    ("/api/v1/query_range", {"query": "1", "start": "0", "end": "100000", "step": "1"}),
    ("/api/v1/query_range", {"query": "1", "start": "0", "end": "10", "step": "1", "timeout": "soon"}),
    ("/api/v1/query", {"query": "1", "time": "yesterday"}),
    ("/api/v1/query", {"query": "1", "timeout": "x"}),
    ("/api/v1/series", {}),
    ("/api/v1/series", {"match[]": "up", "start": "x"}),
    ("/api/v1/labels", {"match[]": '{a=~".*"}'}),
    ("/api/v1/labels", {"end": "never"}),
]


@pytest.mark.parametrize("path,params", PARAM_ERRORS)
def test_parameter_errors_match_prometheus(pair, path, params):
    (sa, ba), (sb, bb) = both(pair, "GET", path, params)
    ea, eb = orjson.loads(ba), orjson.loads(bb)
    assert sb == sa
    assert (eb["status"], eb["errorType"]) == (ea["status"], ea["errorType"])
    assert eb["error"] == ea["error"]


PARSE_ERRORS = ["foo{", "sum(", "rate(foo)", "", "1 +", "foo bar", "unknown_fn(x)"]


@pytest.mark.parametrize("q", PARSE_ERRORS)
@pytest.mark.parametrize("path", ["/api/v1/query", "/api/v1/query_range"])
def test_parse_errors_are_bad_data_like_prometheus(pair, q, path):
    params = {"query": q, "time": str(T), "start": str(START), "end": str(END), "step": "60"}
    (sa, ba), (sb, bb) = both(pair, "GET", path, params)
    ea, eb = orjson.loads(ba), orjson.loads(bb)
    assert (sb, eb["errorType"]) == (sa, ea["errorType"]) == (400, "bad_data")
    # Same prefix up to the parser's own wording ("invalid parameter "query": <pos>: parse error: ...").
    prefix = 'invalid parameter "query": ' if path == "/api/v1/query" else ""
    assert eb["error"].startswith(prefix) and "parse error" in eb["error"]


def test_execution_error_is_422(pair):
    # many-to-many matching is an execution error in both.
    q = "http_requests_total + on(job) http_requests_total"
    (sa, ba), (sb, bb) = both(pair, "GET", "/api/v1/query", {"query": q, "time": str(T)})
    assert sa == sb == 422
    assert orjson.loads(bb)["errorType"] == orjson.loads(ba)["errorType"] == "execution"


METADATA_CALLS = [
    ("/api/v1/series", [("match[]", "http_requests_total"), ("match[]", "temperature_celsius")]),
    ("/api/v1/series", {"match[]": '{__name__=~"temp.*|sparse.*"}', "start": str(START), "end": str(END)}),
    ("/api/v1/series", {"match[]": "sparse_gauge", "start": "1", "end": "2"}),
    ("/api/v1/labels", {}),
    ("/api/v1/labels", {"match[]": "temperature_celsius"}),
    ("/api/v1/labels", [("match[]", "sparse_gauge"), ("match[]", 'http_requests_total{code="500"}')]),
    ("/api/v1/label/__name__/values", {}),
    ("/api/v1/label/job/values", {"match[]": "http_requests_total"}),
    ("/api/v1/label/room/values", {}),
    ("/api/v1/label/site/values", {"start": str(START), "end": str(END)}),
    ("/api/v1/label/nonexistent/values", {}),
]


@pytest.mark.parametrize("method,path,params", [
    (m, p, q) for p, q in METADATA_CALLS for m in (("GET",) if "/label/" in p else ("GET", "POST"))  # label values: GET only
])
def test_metadata_endpoints_match_prometheus(pair, method, path, params):
    (sa, ba), (sb, bb) = both(pair, method, path, params)
    assert (sa, sb) == (200, 200), (ba, bb)
    assert normalized(bb) == normalized(ba)


def test_limit_truncates_with_warning(pair):
    for path, params in [("/api/v1/series", {"match[]": "http_requests_total", "limit": "2"}),
                         ("/api/v1/labels", {"limit": "2"}),
                         ("/api/v1/label/__name__/values", {"limit": "1"}),
                         ("/api/v1/query", {"query": "http_requests_total", "time": str(T), "limit": "3"})]:
        status, _, body = http("GET", pair.tp.url + path, params)
        doc = orjson.loads(body)
        assert status == 200
        result = doc["data"]["result"] if path == "/api/v1/query" else doc["data"]
        assert len(result) == int(params["limit"])
        assert doc["warnings"] == ["results truncated due to limit"]
    status, _, body = http("GET", pair.tp.url + "/api/v1/labels", {"limit": "-1"})
    assert status == 400 and orjson.loads(body)["error"] == 'invalid parameter "limit": limit must be non-negative'


def test_stats_object(pair):
    for stats in ("true", "all"):
        status, _, body = http("GET", pair.tp.url + "/api/v1/query_range",
                               {"query": "rate(http_requests_total[5m])", "start": str(START), "end": str(END), "step": "60",
                                "stats": stats, "exact": "true"})
        assert status == 200
        st = orjson.loads(body)["data"]["stats"]
        assert set(st["timings"]) >= {"evalTotalTime", "resultSortTime", "queryPreparationTime", "innerEvalTime", "execQueueTime", "execTotalTime"}
        assert all(isinstance(v, (int, float)) and v >= 0 for v in st["timings"].values())
        assert st["samples"]["totalQueryableSamples"] > 0
        assert st["samples"]["peakSamples"] > 0
        assert st["turboprom"]["paths"] and all(p.startswith("raw") for p in st["turboprom"]["paths"]), st
    status, _, body = http("GET", pair.tp.url + "/api/v1/query", {"query": "1", "time": "10"})
    assert "stats" not in orjson.loads(body)["data"]


def test_lookback_delta_param(pair):
    # sparse_gauge has 1-minute gaps: a 10s lookback leaves steps empty, the default does not.
    params = {"query": "sparse_gauge", "start": str(START), "end": str(END), "step": "15"}
    _, _, full = http("GET", pair.tp.url + "/api/v1/query_range", params)
    _, _, short = http("GET", pair.tp.url + "/api/v1/query_range", {**params, "lookback_delta": "10s"})
    n_full = len(orjson.loads(full)["data"]["result"][0]["values"])
    n_short = len(orjson.loads(short)["data"]["result"][0]["values"])
    assert n_short < n_full
    status, _, body = http("GET", pair.tp.url + "/api/v1/query", {"query": "1", "lookback_delta": "x"})
    assert status == 400 and "lookback delta" in orjson.loads(body)["error"]


def test_exact_param_is_accepted(pair):
    params = {"query": "sum(rate(http_requests_total[5m]))", "time": str(T)}
    _, _, a = http("GET", pair.tp.url + "/api/v1/query", params)
    _, _, b = http("GET", pair.tp.url + "/api/v1/query", {**params, "exact": "true"})
    assert normalized(a) == normalized(b)


def test_timeout_param_times_out(pair):
    # A tiny timeout on a heavy-ish subquery: errorType timeout with 503.
    params = {"query": "max_over_time(rate(http_requests_total[5m])[30m:1s])", "time": str(T), "timeout": "0.000001"}
    status, _, body = http("GET", pair.tp.url + "/api/v1/query", params)
    doc = orjson.loads(body)
    assert (status, doc["errorType"]) == (503, "timeout"), doc


def test_format_and_parse_query(pair):
    q = 'sum by(job) (rate(http_requests_total{code="500"}[5m]))'
    status, _, body = http("GET", pair.tp.url + "/api/v1/format_query", {"query": q})
    assert status == 200
    formatted = orjson.loads(body)["data"]
    (sa, ba), _ = both(pair, "GET", "/api/v1/format_query", {"query": q})
    assert formatted == orjson.loads(ba)["data"]
    status, _, body = http("POST", pair.tp.url + "/api/v1/parse_query", {"query": q})
    tree = orjson.loads(body)["data"]
    assert tree["type"] == "aggregation" and tree["op"] == "sum" and tree["grouping"] == ["job"]
    call = tree["expr"]
    assert call["type"] == "call" and call["func"]["name"] == "rate"
    sel = call["args"][0]
    assert sel["type"] == "matrixSelector" and sel["range"] == 300_000
    assert {"name": "code", "value": "500", "type": "="} in sel["matchers"]
    status, _, body = http("GET", pair.tp.url + "/api/v1/format_query", {"query": "sum("})
    assert status == 400 and orjson.loads(body)["errorType"] == "bad_data"


def test_status_endpoints(pair):
    for path in ("/api/v1/status/buildinfo", "/api/v1/status/runtimeinfo", "/api/v1/status/flags",
                 "/api/v1/status/config", "/api/v1/status/tsdb", "/api/v1/rules", "/api/v1/alerts",
                 "/api/v1/targets", "/api/v1/metadata", "/api/v1/query_exemplars?query=up"):
        (sa, ba), (sb, bb) = both(pair, "GET", path, {})
        assert (sa, sb) == (200, 200), (path, bb)
        a, b = orjson.loads(ba), orjson.loads(bb)
        assert b["status"] == "success"
        if path.endswith("/flags"):
            assert all(isinstance(v, str) for v in b["data"].values())
            assert {"query.lookback-delta", "storage.tsdb.path", "web.enable-admin-api"} <= b["data"].keys() & a["data"].keys()
        elif isinstance(a["data"], dict):
            # Every field Prometheus returns is present with the same JSON type.
            for k, v in a["data"].items():
                if k in ("GOMEMLIMIT",):
                    continue
                assert k in b["data"], (path, k)
                assert type(b["data"][k]) is type(v) or (isinstance(v, (int, float)) and isinstance(b["data"][k], (int, float))), (path, k)
        else:
            assert type(a["data"]) is type(b["data"])
    tsdb = orjson.loads(http("GET", pair.tp.url + "/api/v1/status/tsdb", {})[2])["data"]
    assert tsdb["headStats"]["numSeries"] == 9
    top = {d["name"]: d["value"] for d in tsdb["seriesCountByMetricName"]}
    assert top == {"http_requests_total": 6, "temperature_celsius": 2, "sparse_gauge": 1}
    meta = orjson.loads(http("GET", pair.tp.url + "/api/v1/metadata", {})[2])["data"]
    assert meta["http_requests_total"] == [{"type": "counter", "help": "Requests served.", "unit": ""}]
    assert orjson.loads(http("GET", pair.tp.url + "/api/v1/metadata", {"metric": "temperature_celsius"})[2])["data"] == {
        "temperature_celsius": [{"type": "gauge", "help": "Current temperature.", "unit": ""}]}


def test_admin_delete_series_is_gated(pair):
    status, _, body = http("POST", pair.tp.url + "/api/v1/admin/tsdb/delete_series", {"match[]": "sparse_gauge"})
    (sa, ba), _ = both(pair, "POST", "/api/v1/admin/tsdb/delete_series", {"match[]": "sparse_gauge"})
    assert status == sa
    assert orjson.loads(body) == orjson.loads(ba)  # {"status":"error","errorType":"unavailable","error":"admin APIs disabled"}
    # still there
    status, _, body = http("GET", pair.tp.url + "/api/v1/series", {"match[]": "sparse_gauge"})
    assert len(orjson.loads(body)["data"]) == 1


def test_content_type_and_cors_like_prometheus(pair):
    for path in ("/api/v1/query?query=1", "/api/v1/labels", "/api/v1/query?query=sum("):
        a = http("GET", pair.prom.url + path, headers={"Origin": "http://grafana.example"})
        b = http("GET", pair.tp.url + path, headers={"Origin": "http://grafana.example"})
        assert b[1]["Content-Type"] == a[1]["Content-Type"] == "application/json"
        for h in ("Access-Control-Allow-Origin", "Access-Control-Allow-Methods", "Access-Control-Allow-Headers", "Access-Control-Expose-Headers"):
            assert b[1].get(h) == a[1].get(h), h
    a = http("OPTIONS", pair.prom.url + "/api/v1/query_range", headers={"Origin": "http://x"})
    b = http("OPTIONS", pair.tp.url + "/api/v1/query_range", headers={"Origin": "http://x"})
    assert a[0] == b[0] == 204
    assert b[1].get("Access-Control-Allow-Methods") == a[1].get("Access-Control-Allow-Methods")


def test_query_exemplars_like_prometheus(pair):
    for params in ({"query": "http_requests_total", "start": "1700000000", "end": "1700000600"},
                   {"query": "rate(http_requests_total[5m]) / on() group_left sum(up)"},
                   {"query": "test", "start": "1712345678000", "end": "1712347478000"},  # Grafana's probe, ms
                   {"query": "1 + 1"}):  # no selector: 204 No Content
        (sa, ba), (sb, bb) = both(pair, "GET", "/api/v1/query_exemplars", params)
        assert sa == sb, params
        assert bb == ba, params
    (sa, ba), (sb, bb) = both(pair, "GET", "/api/v1/query_exemplars", {"query": "up", "start": "10", "end": "5"})
    assert sa == sb == 400
    assert orjson.loads(bb) == orjson.loads(ba)


TIME_SPELLINGS = ["1700000900", "1700000900.5", "1700000900.123456", "1.7000009e9", "2023-11-14T22:28:20Z",
                  "2023-11-14T22:28:20.5Z", "2023-11-14T23:28:20.123+01:00", "2023-11-14T22:28:20.999999999Z",
                  "+1700000900", "0", "-1.5", "2023-11-14 22:28:20", "2023-11-14", "1700000900s", "NaN", "Inf", " 1"]


@pytest.mark.parametrize("t", TIME_SPELLINGS)
def test_time_parameter_spellings_like_prometheus(pair, t):
    (sa, ba), (sb, bb) = both(pair, "GET", "/api/v1/query", {"query": "time()", "time": t})
    assert sb == sa, (ba, bb)
    if sa == 200:
        assert bb == ba
    else:
        assert orjson.loads(bb)["error"] == orjson.loads(ba)["error"]


@pytest.mark.parametrize("step", ["15", "15s", "1m", "0.5", "1m30s", "1e1", "1h", "5ms", "15S", "1.5m", "1d"])
def test_step_spellings_like_prometheus(pair, step):
    params = {"query": "vector(1)", "start": str(START), "end": str(START + 600), "step": step}
    (sa, ba), (sb, bb) = both(pair, "GET", "/api/v1/query_range", params)
    assert sb == sa, (ba, bb)
    if sa == 200:
        assert bb == ba
    else:
        assert orjson.loads(bb)["error"] == orjson.loads(ba)["error"]


def test_api_self_metrics(pair):
    from tests.test_ingest_support import metric_value

    def count(code: str, handler: str) -> float:
        return metric_value(pair.tp.url, "turboprom_http_requests_total", code=code, handler=handler)

    before = {k: count(*k) for k in (("200", "/api/v1/query"), ("400", "/api/v1/query"), ("200", "/api/v1/label/{name}/values"))}
    size0 = metric_value(pair.tp.url, "turboprom_http_response_bytes_total", handler="/api/v1/query")
    _, _, ok_body = http("GET", pair.tp.url + "/api/v1/query", {"query": "1", "time": "1"})
    _, _, bad_body = http("GET", pair.tp.url + "/api/v1/query", {"query": "sum("})
    http("GET", pair.tp.url + "/api/v1/label/job/values")
    after = {k: count(*k) for k in before}
    assert {k: after[k] - before[k] for k in before} == {k: 1.0 for k in before}
    # every response body is counted once, by the one HTTP middleware (no second per-API copy)
    assert metric_value(pair.tp.url, "turboprom_http_response_bytes_total", handler="/api/v1/query") - size0 == \
        len(ok_body) + len(bad_body)
    _, _, body = http("GET", pair.tp.url + "/metrics")
    text = body.decode()
    assert 'turboprom_http_request_duration_seconds_count{handler="/api/v1/query"}' in text
    assert "turboprom_api_requests_total" not in text


def test_gzip_when_accepted(pair):
    import gzip

    params = {"query": "http_requests_total", "start": str(START), "end": str(END), "step": "5"}
    status, headers, plain = http("GET", pair.tp.url + "/api/v1/query_range", params)
    assert status == 200 and "Content-Encoding" not in headers and len(plain) > 16 * 1024
    status, headers, packed = http("GET", pair.tp.url + "/api/v1/query_range", params, headers={"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert len(packed) < len(plain) and gzip.decompress(packed) == plain


FORMAT_QUERIES = [
    'sum by(job) (rate(http_requests_total{code="500"}[5m]))',
    "foo",
    "-foo",
    'sum by (job, instance) (rate(http_requests_total{job="api", code=~"5..", instance!~"b.*"}[5m])) / on (job, instance) group_left () sum by (job, instance) (rate(http_requests_total[5m]))',
    'histogram_quantile(0.99, sum by (le, job) (rate(demo_api_request_duration_seconds_bucket{job="demo", path=~"/api/.*"}[5m]))) > bool 0.25',
    'topk(5, max_over_time((time() - max by (instance) (demo_batch_last_success_timestamp_seconds{job="demo", instance=~".+"}))[30m:1m] offset 5m))',
    'label_replace(sum without (instance) (rate(http_requests_total{job="api", code="200", instance=~"a.*|b.*|c.*"}[10m] offset 1h)), "dst", "$1", "job", "(.*)")',
    '-(sum(rate(http_requests_total{job="api", code="200", instance=~"a.*|b.*|c.*|d.*|e.*|f.*"}[10m])) + sum(rate(http_requests_total{job="web"}[10m])))',
]


@pytest.mark.parametrize("q", FORMAT_QUERIES)
def test_format_query_matches_prometheus(pair, q):
    (sa, ba), (sb, bb) = both(pair, "GET", "/api/v1/format_query", {"query": q})
    assert sa == sb == 200, (ba, bb)
    assert orjson.loads(bb)["data"] == orjson.loads(ba)["data"], (orjson.loads(ba)["data"], orjson.loads(bb)["data"])
