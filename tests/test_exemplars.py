"""Exemplars: remote write 1.0 and OpenMetrics exemplars stored and served by /api/v1/query_exemplars,
side by side with a real Prometheus 2.42 (exemplar storage enabled) receiving the same remote-write
bytes; remote write 2.0 exemplars (symbols) and the store's own rules (order, duplicates, capacity,
tenants)."""
from __future__ import annotations

import time
import urllib.parse
from pathlib import Path

import pytest

from ingest.exemplars import Exemplar, ExemplarStore
from ingest.proto.messages import V2Request, WriteRequest
from storage.matchers import Matcher
from tests.helpers import ServerProcess, http_json
from tests.test_api_helpers import PrometheusPeer
from tests.test_ingest_support import compress

V1_HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
              "X-Prometheus-Remote-Write-Version": "0.1.0"}


def _v1_payload(t0: int) -> bytes:
    w = WriteRequest()
    for pod in ("a", "b"):
        ts = w.timeseries.add()
        for n, v in (("__name__", "vllm:e2e_request_latency_seconds_bucket"), ("le", "0.5"), ("pod", pod)):
            ts.labels.add(name=n, value=v)
        for k in range(5):
            ts.samples.add(value=float(k), timestamp=t0 + k * 15_000)
            if pod == "a" or k % 2:
                e = ts.exemplars.add(value=0.125 + k, timestamp=t0 + k * 15_000 + 7)
                e.labels.add(name="trace_id", value=f"{pod}-{k:04x}")
                e.labels.add(name="span_id", value=f"s{k}")
    return compress(w.SerializeToString())


def _exemplars(url: str, query: str, start: float, end: float, headers: dict | None = None) -> list:
    q = urllib.parse.urlencode({"query": query, "start": start, "end": end})
    st, out, _ = http_json(url + "/api/v1/query_exemplars?" + q, headers=headers or {})
    assert st == 200, out
    return sorted(out["data"], key=lambda s: sorted(s["seriesLabels"].items()))


@pytest.mark.peer
def test_remote_write_exemplars_match_prometheus(tmp_path: Path) -> None:
    t0 = (int(time.time()) - 600) * 1000
    body = _v1_payload(t0)
    prom = PrometheusPeer(tmp_path / "prom", extra_args=["--enable-feature=exemplar-storage",
                                                          "--web.enable-remote-write-receiver"]).start()
    try:
        with ServerProcess(tmp_path / "tp") as srv:
            for url in (prom.url, srv.url):
                st, out, _ = http_json(url + "/api/v1/write", body, V1_HEADERS)
                assert st == 204, (url, out)
            for query, a, b in (("vllm:e2e_request_latency_seconds_bucket", t0 / 1000, t0 / 1000 + 120),
                                ('histogram_quantile(0.9, rate(vllm:e2e_request_latency_seconds_bucket{pod="b"}[5m]))',
                                 t0 / 1000 + 14, t0 / 1000 + 46),
                                ("nothing_here", t0 / 1000, t0 / 1000 + 120)):
                ours, theirs = _exemplars(srv.url, query, a, b), _exemplars(prom.url, query, a, b)
                assert ours == theirs, (query, ours, theirs)
            got = _exemplars(srv.url, "vllm:e2e_request_latency_seconds_bucket", t0 / 1000, t0 / 1000 + 120)
            assert [len(s["exemplars"]) for s in got] == [5, 2]
            assert got[0]["exemplars"][1] == {"labels": {"span_id": "s1", "trace_id": "a-0001"}, "value": "1.125",
                                              "timestamp": (t0 + 15_007) / 1000}
            # Another tenant sees none of them.
            assert _exemplars(srv.url, "vllm:e2e_request_latency_seconds_bucket", t0 / 1000, t0 / 1000 + 120,
                              {"X-Scope-OrgID": "team-a"}) == []
    finally:
        prom.stop()


def test_openmetrics_and_remote_write_v2_exemplars(tmp_path: Path) -> None:
    now = int(time.time())
    om = (f'# TYPE req counter\nreq_total{{path="/a"}} 3 {now - 30} # {{trace_id="om-1"}} 0.25 {now - 31}.5\n'
          f'req_total{{path="/b"}} 4 {now - 30} # {{trace_id="om-2"}} 1.5\n# EOF\n').encode()
    v2 = V2Request()
    v2.symbols.extend(["", "__name__", "gpu_util", "gpu", "0", "trace_id", "v2-abc"])
    ts = v2.timeseries.add()
    ts.labels_refs.extend([1, 2, 3, 4])
    ts.samples.add(value=0.5, timestamp=(now - 20) * 1000)
    ex = ts.exemplars.add(value=0.5, timestamp=(now - 20) * 1000)
    ex.labels_refs.extend([5, 6])
    with ServerProcess(tmp_path / "tp") as srv:
        st, out, _ = http_json(srv.url + "/api/v1/import/prometheus", om,
                               {"Content-Type": "application/openmetrics-text; version=1.0.0"})
        assert st == 204, out
        st, _, hdrs = http_json(srv.url + "/api/v1/write", compress(v2.SerializeToString()),
                                {"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request",
                                 "Content-Encoding": "snappy", "X-Prometheus-Remote-Write-Version": "2.0.0"})
        assert st == 204 and hdrs.get("X-Prometheus-Remote-Write-Exemplars-Written") == "1"
        got = _exemplars(srv.url, "req_total", now - 60, now)
        assert [(s["seriesLabels"]["path"], s["exemplars"]) for s in got] == [
            ("/a", [{"labels": {"trace_id": "om-1"}, "value": "0.25", "timestamp": now - 30.5}]),
            ("/b", [{"labels": {"trace_id": "om-2"}, "value": "1.5", "timestamp": float(now - 30)}]),  # the sample's time
        ]
        got = _exemplars(srv.url, 'gpu_util{gpu="0"}', now - 60, now)
        assert got == [{"seriesLabels": {"__name__": "gpu_util", "gpu": "0"},
                        "exemplars": [{"labels": {"trace_id": "v2-abc"}, "value": "0.5", "timestamp": float(now - 20)}]}]


def test_store_order_duplicates_capacity_and_tenants() -> None:
    s1, s2 = (("__name__", "x"), ("i", "1")), (("__name__", "x"), ("i", "2"))
    store = ExemplarStore(max_exemplars=3)
    r = store.add("default", [Exemplar(s1, (("t", "a"),), 1.0, 1000), Exemplar(s1, (("t", "a"),), 1.0, 1000),  # duplicate
                              Exemplar(s1, (("t", "b"),), 2.0, 500),  # out of order
                              Exemplar(s1, (("t", "c"),), 3.0, 2000), Exemplar(s2, (("t", "d"),), 4.0, 1500),
                              Exemplar(s2, (("t", "e" * 130),), 5.0, 1600)])  # label set over 128 characters
    assert (r.added, r.duplicates, r.out_of_order, r.invalid) == (3, 1, 1, 1)
    store.add("default", [Exemplar(s2, (("t", "f"),), 6.0, 3000)])  # evicts the oldest (s1 @ 1000)
    everything = [[Matcher("__name__", "=", "x")]]
    got = {lbl: [e.ts for e in exs] for lbl, exs in store.query("default", everything, 0, 10_000)}
    assert got == {s1: [2000], s2: [1500, 3000]} and len(store) == 3
    assert store.query("team-a", everything, 0, 10_000) == []
    assert [e.ts for _, exs in store.query("default", [[Matcher("i", "=", "2")]], 1600, 10_000) for e in exs] == [3000]
    assert ExemplarStore(max_exemplars=0).add("default", [Exemplar(s1, (), 1.0, 1)]).added == 0
