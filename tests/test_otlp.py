"""OTLP metrics ingest with the real OpenTelemetry Python SDK and its OTLP/HTTP protobuf exporter, sending a
vLLM-like metric set to a real server on loopback; what lands is read back through /api/v1/series,
/api/v1/query, /api/v1/metadata and /api/v1/query_exemplars and compared with what the SDK sent
(an in-memory reader on the same meter provider sees the same data points the exporter sends)."""
from __future__ import annotations

import math
import time
import urllib.parse

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from tests.helpers import ServerProcess, http_json

RESOURCE = {"service.name": "vllm", "service.namespace": "llm", "service.instance.id": "w-0", "k8s.pod.name": "p0",
            "gpu.model": "H100"}
JOB = {"job": "llm/vllm", "instance": "w-0", "k8s_pod_name": "p0"}  # k8s.pod.name is promoted by the config


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d = tmp_path_factory.mktemp("otlp")
    cfg = d / "turboprom.yml"
    cfg.write_text("otlp:\n  promote_resource_attributes: [k8s.pod.name]\n")
    with ServerProcess(d / "data", ["--config", str(cfg)]) as s:
        yield s


def _provider(url: str, tenant: str | None = None, resource: dict | None = None):
    headers = {"X-Scope-OrgID": tenant} if tenant else None
    exporter = OTLPMetricExporter(endpoint=url + "/api/v1/otlp/v1/metrics", headers=headers, timeout=20)
    sent = InMemoryMetricReader()
    mp = MeterProvider(resource=Resource(resource) if resource else Resource.create(RESOURCE),  # create() adds telemetry.sdk.*
                       metric_readers=[PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000), sent],
                       views=[View(instrument_name="vllm.time_to_first_token", aggregation=ExponentialBucketHistogramAggregation(max_size=20))])
    return mp, sent


def _query(url: str, expr: str, tenant: str | None = None) -> list[dict]:
    st, b, _ = http_json(url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": time.time()}),
                         headers={"X-Scope-OrgID": tenant} if tenant else {})
    assert st == 200, b
    return b["data"]["result"]


def _value(url: str, expr: str, tenant: str | None = None) -> dict[tuple, float]:
    return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in _query(url, expr, tenant)}


def _one(url: str, expr: str) -> tuple[dict, float]:
    res = _query(url, expr)
    assert len(res) == 1, (expr, res)
    return res[0]["metric"], float(res[0]["value"][1])


def test_sdk_metric_set_lands_as_prometheus_series(srv) -> None:
    mp, sent = _provider(srv.url)
    meter = mp.get_meter("vllm.engine", "0.6.0")
    tracer = TracerProvider().get_tracer("test")
    ok = meter.create_counter("vllm.request.success", unit="{request}", description="finished requests")
    ok.add(3, {"model.name": "llama", "finished_reason": "stop"})
    ok.add(4, {"model.name": "llama", "finished_reason": "stop"})
    with tracer.start_as_current_span("request") as span:
        ok.add(1, {"model.name": "llama", "finished_reason": "length"})  # sampled span: an exemplar
        trace_id = format(span.get_span_context().trace_id, "032x")
    meter.create_counter("vllm.prompt_tokens.total", unit="{token}").add(128, {"model.name": "llama"})
    meter.create_counter("net.io", unit="By").add(2048)
    running = meter.create_up_down_counter("vllm.num_requests.running")
    running.add(5)
    running.add(-2)
    meter.create_gauge("vllm.gpu_cache_usage", unit="1").set(0.25, {"gpu": "0"})
    meter.create_observable_gauge("gpu.memory.used", unit="By",
                                  callbacks=[lambda _o: [Observation(7.5e9, {"gpu": "0"})]])
    lat = meter.create_histogram("vllm.e2e_request_latency", unit="s", explicit_bucket_boundaries_advisory=[0.1, 0.5, 1, 5])
    for v in (0.05, 0.3, 0.3, 7):
        lat.record(v, {"model.name": "llama"})
    ttft = meter.create_histogram("vllm.time_to_first_token", unit="ms")
    for v in (1, 2, 3, 100):
        ttft.record(v)
    assert mp.force_flush(20_000)
    data = sent.get_metrics_data()
    mp.shutdown()
    u = srv.url
    base = dict(JOB)

    # counters: _total, unit annotations in braces dropped, attribute names escaped, k8s.pod.name promoted
    m, v = _one(u, 'vllm_request_success_total{finished_reason="stop"}')
    assert m == {"__name__": "vllm_request_success_total", "model_name": "llama", "finished_reason": "stop", **base} and v == 7
    assert _one(u, 'vllm_request_success_total{finished_reason="length"}')[1] == 1
    assert _one(u, "vllm_prompt_tokens_total")[0] == {"__name__": "vllm_prompt_tokens_total", "model_name": "llama", **base}
    assert _one(u, "net_io_bytes_total")[1] == 2048
    # gauges: the up-down counter is a gauge without _total; unit "1" gauges get _ratio
    assert _one(u, "vllm_num_requests_running") == ({"__name__": "vllm_num_requests_running", **base}, 3.0)
    assert _one(u, "vllm_gpu_cache_usage_ratio") == ({"__name__": "vllm_gpu_cache_usage_ratio", "gpu": "0", **base}, 0.25)
    assert _one(u, "gpu_memory_used_bytes")[1] == 7.5e9
    # explicit-bucket histogram: cumulative buckets, +Inf = count, sum; histogram_quantile works on it
    buckets = {r["metric"]["le"]: float(r["value"][1]) for r in _query(u, "vllm_e2e_request_latency_seconds_bucket")}
    assert buckets == {"0.1": 1, "0.5": 3, "1": 3, "5": 3, "+Inf": 4}
    assert _one(u, "vllm_e2e_request_latency_seconds_count")[1] == 4
    assert math.isclose(_one(u, "vllm_e2e_request_latency_seconds_sum")[1], 7.65)
    assert math.isclose(_one(u, "histogram_quantile(0.5, vllm_e2e_request_latency_seconds_bucket)")[1], 0.3)
    # exponential histogram -> classic buckets at the SDK's exponential bounds
    (pt,) = [p for rm in data.resource_metrics for sm in rm.scope_metrics for mm in sm.metrics
             if mm.name == "vllm.time_to_first_token" for p in mm.data.data_points]
    expect, cum = {}, 0
    neg = list(pt.negative.bucket_counts)
    for j in range(len(neg) - 1, -1, -1):  # negative buckets, most negative first; upper bound -base^index
        cum += neg[j]
        expect[-(2.0 ** ((pt.negative.offset + j) * 2.0 ** -pt.scale))] = cum
    cum += pt.zero_count
    expect[0.0] = cum  # the Python SDK has no zero threshold: its exporter sends 0
    for j, c in enumerate(pt.positive.bucket_counts):
        cum += c
        expect[2.0 ** ((pt.positive.offset + j + 1) * 2.0 ** -pt.scale)] = cum
    got = {float(r["metric"]["le"]): float(r["value"][1]) for r in _query(u, "vllm_time_to_first_token_milliseconds_bucket")}
    assert got.pop(math.inf) == 4 and len(got) == len(expect)
    for (gb, gv), (eb, ev) in zip(sorted(got.items()), sorted(expect.items())):
        assert math.isclose(gb, eb, rel_tol=1e-12) and gv == ev, (gb, eb, gv, ev)
    assert _one(u, "vllm_time_to_first_token_milliseconds_count")[1] == 4
    assert _one(u, "vllm_time_to_first_token_milliseconds_sum")[1] == 106
    # target_info: the non-identifying resource attributes, job and instance
    m, v = _one(u, "target_info")
    assert v == 1 and m == {"__name__": "target_info", "job": "llm/vllm", "instance": "w-0", "k8s_pod_name": "p0",
                            "gpu_model": "H100", "telemetry_sdk_language": "python", "telemetry_sdk_name": "opentelemetry",
                            "telemetry_sdk_version": m["telemetry_sdk_version"]}
    # metadata: type, help, unit
    st, b, _ = http_json(u + "/api/v1/metadata?metric=vllm_request_success_total")
    assert b["data"]["vllm_request_success_total"][0]["type"] == "counter"
    assert b["data"]["vllm_request_success_total"][0]["help"] == "finished requests"
    st, b, _ = http_json(u + "/api/v1/metadata?metric=vllm_e2e_request_latency_seconds")
    assert b["data"]["vllm_e2e_request_latency_seconds"][0] | {"help": ""} == {"type": "histogram", "help": "", "unit": "seconds"}
    # the exemplar of the sampled span, on the counter series
    now = time.time()
    st, b, _ = http_json(u + "/api/v1/query_exemplars?" + urllib.parse.urlencode(
        {"query": "vllm_request_success_total", "start": now - 600, "end": now + 60}))
    assert st == 200, b
    (series,) = b["data"]
    assert series["seriesLabels"]["finished_reason"] == "length"
    assert [e["labels"]["trace_id"] for e in series["exemplars"]] == [trace_id]
    # every data point the SDK exported, against what landed: value (or count, sum and +Inf) per point
    prom = {"vllm.request.success": "vllm_request_success_total", "vllm.prompt_tokens.total": "vllm_prompt_tokens_total",
            "net.io": "net_io_bytes_total", "vllm.num_requests.running": "vllm_num_requests_running",
            "vllm.gpu_cache_usage": "vllm_gpu_cache_usage_ratio", "gpu.memory.used": "gpu_memory_used_bytes",
            "vllm.e2e_request_latency": "vllm_e2e_request_latency_seconds",
            "vllm.time_to_first_token": "vllm_time_to_first_token_milliseconds"}
    checked = 0
    for mm in (mm for rm in data.resource_metrics for sm in rm.scope_metrics for mm in sm.metrics):
        for p in mm.data.data_points:
            sel = ",".join(f'{k.replace(".", "_")}="{v}"' for k, v in sorted(p.attributes.items()))
            if isinstance(p, NumberDataPoint):
                assert _one(u, f"{prom[mm.name]}{{{sel}}}")[1] == p.value, mm.name
            else:
                assert _one(u, f"{prom[mm.name]}_count{{{sel}}}")[1] == p.count
                assert math.isclose(_one(u, f"{prom[mm.name]}_sum{{{sel}}}")[1], p.sum)
                assert _one(u, f'{prom[mm.name]}_bucket{{{sel + "," if sel else ""}le="+Inf"}}')[1] == p.count
            checked += 1
    assert checked == 9
    # every series name the SDK's metrics map to, and nothing else
    st, b, _ = http_json(u + "/api/v1/label/__name__/values")
    assert set(b["data"]) == {
        "vllm_request_success_total", "vllm_prompt_tokens_total", "net_io_bytes_total", "vllm_num_requests_running",
        "vllm_gpu_cache_usage_ratio", "gpu_memory_used_bytes", "target_info",
        *(f"vllm_e2e_request_latency_seconds_{s}" for s in ("bucket", "sum", "count")),
        *(f"vllm_time_to_first_token_milliseconds_{s}" for s in ("bucket", "sum", "count"))}


def test_tenants_are_isolated(srv) -> None:
    mp, _ = _provider(srv.url, tenant="team-a", resource={"service.name": "router"})
    mp.get_meter("m").create_counter("router.requests").add(9)
    assert mp.force_flush(20_000)
    mp.shutdown()
    assert _value(srv.url, "router_requests_total", "team-a") == {(("__name__", "router_requests_total"), ("job", "router")): 9.0}
    assert _query(srv.url, "router_requests_total") == []
    assert _query(srv.url, "vllm_num_requests_running", "team-b") == []
    st, b, _ = http_json(srv.url + "/api/v1/series?match[]=" + urllib.parse.quote('{__name__=~".+"}'), headers={"X-Scope-OrgID": "team-a"})
    assert [s["__name__"] for s in b["data"]] == ["router_requests_total"]  # no target_info: only identifying attributes
