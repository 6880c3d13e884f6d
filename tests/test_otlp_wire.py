"""OTLP/HTTP by raw requests against a real server: JSON and protobuf bodies, gzip, partial success
(delta temporality, points without a timestamp, invalid names), stale markers from NoRecordedValue,
summaries, attribute collisions, error statuses with google.rpc.Status bodies, and the UTF-8
translation strategy."""
from __future__ import annotations

import gzip
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (ExportMetricsServiceRequest,
                                                                          ExportMetricsServiceResponse)
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from tests.helpers import ServerProcess, http_json

PATH = "/api/v1/otlp/v1/metrics"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with ServerProcess(tmp_path_factory.mktemp("otlpwire") / "data") as s:
        yield s


def _post(url: str, body: bytes, ctype: str = "application/x-protobuf", headers: dict | None = None) -> tuple[int, bytes, dict]:
    req = urllib.request.Request(url + PATH, data=body, method="POST", headers={"Content-Type": ctype, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def _request(metrics: list[pb.Metric], resource: dict | None = None) -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    for k, v in (resource or {"service.name": "svc"}).items():
        a = rm.resource.attributes.add(key=k)
        a.value.string_value = v
    rm.scope_metrics.add().metrics.extend(metrics)
    return req


def _attrs(target, **kv) -> None:
    for k, v in kv.items():
        a = target.add(key=k.replace("__", "."))
        if isinstance(v, bool):
            a.value.bool_value = v
        elif isinstance(v, int):
            a.value.int_value = v
        elif isinstance(v, float):
            a.value.double_value = v
        else:
            a.value.string_value = v


def _gauge(name: str, points: list[tuple[int, float]], unit: str = "", flags: int = 0, **attrs) -> pb.Metric:
    m = pb.Metric(name=name, unit=unit)
    for t_ms, v in points:
        p = m.gauge.data_points.add(time_unix_nano=t_ms * 1_000_000, as_double=v, flags=flags)
        _attrs(p.attributes, **attrs)
    return m


def _query(url: str, expr: str, t: float) -> list[dict]:
    st, b, _ = http_json(url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": t}))
    assert st == 200, b
    return b["data"]["result"]


def _response(body: bytes) -> ExportMetricsServiceResponse:
    return ExportMetricsServiceResponse.FromString(body)


def test_json_body_with_hex_exemplar_ids(srv) -> None:
    now = int(time.time() * 1000)
    doc = {"resourceMetrics": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json-svc"}},
                                    {"key": "service.instance.id", "value": {"stringValue": "i-1"}}]},
        "scopeMetrics": [{"scope": {"name": "s"}, "metrics": [
            {"name": "json.requests", "unit": "{request}", "sum": {
                "aggregationTemporality": 2, "isMonotonic": True,
                "dataPoints": [{"timeUnixNano": str(now * 1_000_000), "asInt": "42",
                                "attributes": [{"key": "http.route", "value": {"stringValue": "/v1/chat"}}],
                                "exemplars": [{"timeUnixNano": str(now * 1_000_000), "asInt": "1",
                                               "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174"}]}]}},
            {"name": "json.temp", "unit": "Cel", "gauge": {"dataPoints": [{"timeUnixNano": now * 1_000_000, "asDouble": 21.5, "exemplars": [
                {"timeUnixNano": str(now * 1_000_000), "asDouble": 21, "traceId": "00112233445566778899aabbccddeeff"}]}]}},
            {"name": "unknown.field.ignored", "gauge": {"dataPoints": [{"timeUnixNano": now * 1_000_000, "asDouble": 1}]}, "x": 1},
        ]}]}]}
    st, body, hdrs = _post(srv.url, json.dumps(doc).encode(), "application/json")
    assert st == 200 and hdrs["Content-Type"].startswith("application/json") and json.loads(body) == {}, body
    t = now / 1000
    (r,) = _query(srv.url, "json_requests_total", t)
    assert r["metric"] == {"__name__": "json_requests_total", "job": "json-svc", "instance": "i-1", "http_route": "/v1/chat"}
    assert r["value"][1] == "42"
    assert _query(srv.url, "json_temp_celsius", t)[0]["value"][1] == "21.5"
    assert len(_query(srv.url, "unknown_field_ignored", t)) == 1
    st, b, _ = http_json(srv.url + "/api/v1/query_exemplars?" + urllib.parse.urlencode(
        {"query": "json_requests_total", "start": t - 60, "end": t + 60}))
    assert b["data"][0]["exemplars"] == [{"labels": {"trace_id": "5b8efff798038103d269b633813fc60c", "span_id": "eee19b7ec3c1b174"},
                                          "value": "1", "timestamp": math.floor(now) / 1000}]
    st, b, _ = http_json(srv.url + "/api/v1/query_exemplars?" + urllib.parse.urlencode(
        {"query": "json_temp_celsius", "start": t - 60, "end": t + 60}))
    assert st == 200 and b["data"] == []  # gauge exemplars are dropped, as Prometheus does


def test_gzip_summary_collisions_and_stale_markers(srv) -> None:
    now = int(time.time() * 1000) - 60_000
    summ = pb.Metric(name="rpc.duration", unit="ms")
    p = summ.summary.data_points.add(time_unix_nano=now * 1_000_000, count=10, sum=55.5)
    p.quantile_values.add(quantile=0.5, value=4)
    p.quantile_values.add(quantile=0.99, value=9.5)
    coll = _gauge("coll", [(now, 1)])
    _attrs(coll.gauge.data_points[0].attributes, **{"a.b": "x"})
    coll.gauge.data_points[0].attributes.add(key="a_b").value.string_value = "y"
    coll.gauge.data_points[0].attributes.add(key="2xx").value.int_value = 7
    coll.gauge.data_points[0].attributes.add(key="ok").value.bool_value = True
    gone = _gauge("gone", [(now, 5)], gpu="0")
    stale = _gauge("gone", [(now + 30_000, 0)], flags=pb.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK, gpu="0")
    body = gzip.compress(_request([summ, coll, gone, stale]).SerializeToString())
    st, out, hdrs = _post(srv.url, body, headers={"Content-Encoding": "gzip"})
    assert st == 200 and hdrs["Content-Type"] == "application/x-protobuf", out
    assert not _response(out).HasField("partial_success")
    t = now / 1000 + 1
    got = {r["metric"].get("quantile", r["metric"]["__name__"]): r["value"][1]
           for r in _query(srv.url, '{__name__=~"rpc_duration_milliseconds.*"}', t)}
    assert got == {"0.5": "4", "0.99": "9.5", "rpc_duration_milliseconds_sum": "55.5", "rpc_duration_milliseconds_count": "10"}
    (r,) = _query(srv.url, "coll", t)
    assert r["metric"] == {"__name__": "coll", "job": "svc", "a_b": "x;y", "key_2xx": "7", "ok": "true"}
    assert [x["value"][1] for x in _query(srv.url, "gone", t)] == ["5"]
    assert _query(srv.url, "gone", t + 31) == []  # NoRecordedValue -> stale marker ends the series


def test_partial_success_names_what_was_refused(srv) -> None:
    now = int(time.time() * 1000)
    delta = pb.Metric(name="delta.requests")
    delta.sum.aggregation_temporality = pb.AGGREGATION_TEMPORALITY_DELTA
    delta.sum.is_monotonic = True
    delta.sum.data_points.add(time_unix_nano=now * 1_000_000, as_int=3)
    delta.sum.data_points.add(time_unix_nano=now * 1_000_000 + 1, as_int=4)
    no_ts = _gauge("no.ts", [(0, 1)])
    fine = _gauge("fine.gauge", [(now, 2)])
    st, out, _ = _post(srv.url, _request([delta, no_ts, fine]).SerializeToString())
    assert st == 200
    ps = _response(out).partial_success
    assert ps.rejected_data_points == 3
    assert "'delta.requests': delta temporality is not supported" in ps.error_message
    assert "without a timestamp" in ps.error_message
    assert [r["value"][1] for r in _query(srv.url, "fine_gauge", now / 1000)] == ["2"]
    assert _query(srv.url, "delta_requests_total", now / 1000) == []
    # the same over JSON: int64 counts as strings, camelCase names
    doc = {"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "d", "sum": {
        "aggregationTemporality": 1, "isMonotonic": True, "dataPoints": [{"timeUnixNano": str(now * 1_000_000), "asInt": "1"}]}}]}]}]}
    st, out, _ = _post(srv.url, json.dumps(doc).encode(), "application/json")
    assert st == 200 and json.loads(out)["partialSuccess"]["rejectedDataPoints"] == "1"
    # an out-of-order sample is refused by storage: counted as a refused point, the rest written
    old = _gauge("fine.gauge", [(now - 3_600_000, 1)])
    st, out, _ = _post(srv.url, _request([old, _gauge("fine.other", [(now, 1)])]).SerializeToString())
    ps = _response(out).partial_success
    assert st == 200 and ps.rejected_data_points == 1 and "rejected by storage" in ps.error_message, ps


def test_bad_requests_get_clear_errors(srv) -> None:
    st, out, hdrs = _post(srv.url, b"\xff\xff\xff not protobuf")
    assert st == 400 and hdrs["Content-Type"] == "application/x-protobuf"
    s = status_pb2.Status.FromString(out)
    assert s.code == 3 and "cannot decode opentelemetry ExportMetricsServiceRequest" in s.message
    st, out, _ = _post(srv.url, b"{not json", "application/json")
    b = json.loads(out)
    assert st == 400 and b["code"] == 3 and b["status"] == "error" and b["errorType"] == "bad_data"
    assert b["error"].startswith("OTLP JSON: not valid JSON")
    st, out, _ = _post(srv.url, json.dumps({"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "x", "gauge": {
        "dataPoints": [{"asDouble": "many"}]}}]}]}]}).encode(), "application/json")
    assert st == 400 and "OTLP JSON" in json.loads(out)["error"], out
    st, out, _ = _post(srv.url, b"x", "text/plain")
    assert st == 415 and "expected application/x-protobuf or application/json" in json.loads(out)["error"]
    st, out, _ = _post(srv.url, b"x", headers={"Content-Encoding": "br"})
    assert st == 415 and "unsupported Content-Encoding 'br'" in status_pb2.Status.FromString(out).message
    st, out, _ = _post(srv.url, b"not gzip at all", headers={"Content-Encoding": "gzip"})
    assert st == 400 and "gzip" in status_pb2.Status.FromString(out).message
    future = _gauge("future", [(int(time.time() * 1000) + 3_600_000, 1)])
    st, out, _ = _post(srv.url, _request([future]).SerializeToString())
    assert st == 400 and "too far in the future" in status_pb2.Status.FromString(out).message
    st, out, _ = _post(srv.url, _request([_gauge("x", [(1, 1)])]).SerializeToString(), headers={"X-Scope-OrgID": "bad tenant/x"})
    assert st == 400 and "invalid tenant ID" in status_pb2.Status.FromString(out).message


def test_utf8_translation_strategy(tmp_path: Path) -> None:
    cfg = tmp_path / "turboprom.yml"
    cfg.write_text("otlp:\n  translation_strategy: NoUTF8EscapingWithSuffixes\n  promote_scope_metadata: true\n"
                   "  promote_all_resource_attributes: true\n  ignore_resource_attributes: [cloud.region]\n"
                   "  keep_identifying_resource_attributes: true\n")
    with ServerProcess(tmp_path / "data", ["--config", str(cfg)]) as s:
        now = int(time.time() * 1000)
        req = _request([_gauge("gpu.util", [(now, 0.5)], unit="1", **{"k8s__pod": "p-0"})],
                       {"service.name": "svc", "host.name": "h1", "cloud.region": "eu"})
        sc = req.resource_metrics[0].scope_metrics[0].scope
        sc.name, sc.version = "vllm.metrics", "0.6"
        st, out, _ = _post(s.url, req.SerializeToString())
        assert st == 200 and not _response(out).HasField("partial_success"), out
        (r,) = _query(s.url, '{"gpu.util_ratio"}', now / 1000)
        assert r["metric"] == {"__name__": "gpu.util_ratio", "job": "svc", "k8s.pod": "p-0", "otel_scope_name": "vllm.metrics",
                               "otel_scope_version": "0.6", "service.name": "svc", "host.name": "h1"}  # all promoted but the ignored
        (r,) = _query(s.url, "target_info", now / 1000)
        assert r["metric"] == {"__name__": "target_info", "job": "svc", "service.name": "svc", "host.name": "h1", "cloud.region": "eu"}


def test_auth_roles_and_tenant_restriction(tmp_path: Path) -> None:
    """The write role is needed, and a user restricted to a tenant writes only there (as remote write)."""
    import base64

    import bcrypt

    pw = {"writer_b": "wb-pw", "reader": "r-pw"}
    users = "".join(f"  {u}: {bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=4)).decode()}\n" for u, p in pw.items())
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n{users}roles:\n  writer_b: [write, read]\n  reader: [read]\ntenants:\n  writer_b: [team-b]\n")

    def auth(user: str, tenant: str | None = None) -> dict[str, str]:
        h = {"Authorization": "Basic " + base64.b64encode(f"{user}:{pw[user]}".encode()).decode()}
        return h | ({"X-Scope-OrgID": tenant} if tenant else {})

    with ServerProcess(tmp_path / "data", ["--web.config.file", str(web)]) as s:
        now = int(time.time() * 1000)
        body = _request([_gauge("authed", [(now, 3)])]).SerializeToString()
        assert _post(s.url, body)[0] == 401
        assert _post(s.url, body, headers=auth("reader"))[0] == 403
        assert _post(s.url, body, headers=auth("writer_b", "team-a"))[0] == 403
        st, out, _ = _post(s.url, body, headers=auth("writer_b", "team-b"))
        assert st == 200, out
        q = urllib.parse.urlencode({"query": "authed", "time": now / 1000})
        st, b, _ = http_json(s.url + "/api/v1/query?" + q, headers=auth("writer_b", "team-b"))
        assert [r["value"][1] for r in b["data"]["result"]] == ["3"]
