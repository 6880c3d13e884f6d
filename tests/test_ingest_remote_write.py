"""Remote write 1.0/2.0 and text import against the real server: exact values, and every bad-input path."""
from __future__ import annotations

import math
import struct
import urllib.parse

import numpy as np
import pytest

from ingest.proto.messages import WriteRequest
from storage.labels import make_labels
from storage.stale import STALE_NAN, is_stale
from tests.helpers import ServerProcess, http_json
from tests.test_ingest_support import (error_of, metric_value, name_is, now_ms, post, read_stored, remote_write,
                                       v1_payload, v2_payload)


@pytest.fixture
def srv(tmp_path):
    cfg = tmp_path / "config.yml"
    cfg.write_text("ingest:\n  max_body_bytes: 200000\n  max_decompressed_bytes: 1000000\n")
    s = ServerProcess(tmp_path / "data", extra_args=["--config", str(cfg)]).start()
    yield s
    s.stop()


def test_v1_exact_values_and_metadata(srv):
    t = now_ms() - 60_000
    vals = [1.5, -0.0, float("inf"), float("-inf"), float("nan"), STALE_NAN, 1e-300, 0.0]
    payload = v1_payload([({"__name__": "rw_test", "job": "j", "i": str(k)}, [(t + 1000 * j, v) for j, v in enumerate(vals)])
                          for k in range(3)], metadata=[("rw_test", 2, "a gauge", "seconds")])
    code, _, body = remote_write(srv.url, payload)
    assert code == 204, body
    import urllib.request, json
    meta = json.loads(urllib.request.urlopen(srv.url + "/api/v1/metadata?metric=rw_test").read())
    assert meta["data"]["rw_test"][0] == {"type": "gauge", "help": "a gauge", "unit": "seconds"}
    srv.stop()
    got = read_stored(srv.data_dir, name_is("rw_test"))
    assert len(got) == 3
    for k in range(3):
        ts, vs = got[make_labels({"__name__": "rw_test", "job": "j", "i": str(k)})]
        assert ts.tolist() == [t + 1000 * j for j in range(len(vals))]
        expect = np.array(vals, np.float64)
        assert np.array_equal(vs.view(np.uint64), expect.view(np.uint64)), (vs, expect)
        assert is_stale(vs).sum() == 1


def test_v2_symbols_headers_and_metadata(srv):
    t = now_ms() - 30_000
    series = [({"__name__": "rw2_total", "code": str(c)}, [(t, float(c)), (t + 15_000, float(c) + 0.5)]) for c in (200, 404, 500)]
    code, headers, body = remote_write(srv.url, v2_payload(series, {"rw2_total": (1, "requests", "")}), v2=True)
    assert code == 204, body
    assert headers["x-prometheus-remote-write-samples-written"] == "6"
    assert headers["x-prometheus-remote-write-histograms-written"] == "0"
    assert headers["x-prometheus-remote-write-exemplars-written"] == "0"
    import urllib.request, json
    meta = json.loads(urllib.request.urlopen(srv.url + "/api/v1/metadata?metric=rw2_total").read())
    assert meta["data"]["rw2_total"][0]["type"] == "counter"
    srv.stop()
    got = read_stored(srv.data_dir, name_is("rw2_total"))
    assert {dict(k)["code"]: v[1].tolist() for k, v in got.items()} == {"200": [200.0, 200.5], "404": [404.0, 404.5], "500": [500.0, 500.5]}


def test_text_import_values_timestamps_extra_labels(srv):
    t = now_ms() - 120_000
    body = (f"# HELP imp_requests_total Requests.\n# TYPE imp_requests_total counter\n"
            f'imp_requests_total{{path="/a",code="200"}} 10 {t}\n'
            f'imp_requests_total{{path="/b\\"q",code="500"}} +Inf {t}\n'
            f"imp_gauge 3.25\n").encode()
    code, _, resp = post(srv.url, f"/api/v1/import/prometheus?extra_label=env=prod&timestamp={t + 5000}", body)
    assert code == 204, resp
    om = f"# TYPE om_c counter\n# UNIT om_c seconds\nom_c_total 7 {(t + 1000) / 1000:.3f}\n# EOF\n".encode()
    code, _, resp = post(srv.url, "/api/v1/import/prometheus", om, {"Content-Type": "application/openmetrics-text; version=1.0.0"})
    assert code == 204, resp
    import urllib.request, json
    meta = json.loads(urllib.request.urlopen(srv.url + "/api/v1/metadata").read())["data"]
    assert meta["imp_requests_total"][0] == {"type": "counter", "help": "Requests.", "unit": ""}
    assert meta["om_c"][0] == {"type": "counter", "help": "", "unit": "seconds"}
    srv.stop()
    got = read_stored(srv.data_dir, name_is("imp_requests_total"))
    assert got[make_labels({"__name__": "imp_requests_total", "path": "/a", "code": "200", "env": "prod"})][1].tolist() == [10.0]
    ts, vs = got[make_labels({"__name__": "imp_requests_total", "path": '/b"q', "code": "500", "env": "prod"})]
    assert ts.tolist() == [t] and math.isinf(vs[0])
    ts, vs = read_stored(srv.data_dir, name_is("imp_gauge"))[make_labels({"__name__": "imp_gauge", "env": "prod"})]
    assert ts.tolist() == [t + 5000] and vs.tolist() == [3.25]
    ts, vs = read_stored(srv.data_dir, name_is("om_c_total"))[make_labels({"__name__": "om_c_total"})]
    assert ts.tolist() == [t + 1000] and vs.tolist() == [7.0]


BAD_V1 = [  # invalid under the default (Prometheus 3, UTF-8) name validation
    ("empty label name", {"__name__": "ok", "": "x"}, "invalid label name"),
    ("missing name", {"job": "x"}, "without a metric name"),
]
BAD_V1_LEGACY = [  # additionally invalid under global.metric_name_validation_scheme: legacy
    ("invalid metric name", {"__name__": "1bad"}, "invalid metric name"),
    ("invalid label name", {"__name__": "ok", "bad-label": "x"}, "invalid label name"),
]


def test_v1_invalid_labels_rejected_whole(srv):
    _rejected_whole(srv, BAD_V1)


def test_v1_legacy_name_validation_rejects_whole(tmp_path):
    cfg = tmp_path / "config.yml"
    cfg.write_text("global:\n  metric_name_validation_scheme: legacy\n")
    with ServerProcess(tmp_path / "data", extra_args=["--config", str(cfg)]) as srv:
        _rejected_whole(srv, BAD_V1 + BAD_V1_LEGACY)


def test_v1_utf8_names_accepted_and_queryable(srv):
    t = now_ms() - 1000
    payload = v1_payload([({"__name__": "gpu.util", "k8s.pod": "p-0", "bad-label": "x"}, [(t, 0.5)]),
                          ({"__name__": "1bad"}, [(t, 2.0)])])
    code, _, body = remote_write(srv.url, payload)
    assert code == 204, body
    st, out, _ = http_json(srv.url + "/api/v1/query?" + urllib.parse.urlencode({"query": '{"gpu.util", "k8s.pod"="p-0"}', "time": t / 1000}))
    assert st == 200 and out["data"]["result"] == [
        {"metric": {"__name__": "gpu.util", "k8s.pod": "p-0", "bad-label": "x"}, "value": [t / 1000, "0.5"]}]
    st, out, _ = http_json(srv.url + "/api/v1/query?" + urllib.parse.urlencode({"query": '{"1bad"}', "time": t / 1000}))
    assert [r["value"][1] for r in out["data"]["result"]] == ["2"]


def _rejected_whole(srv, cases):
    t = now_ms()
    for what, labels, needle in cases:
        payload = v1_payload([({"__name__": "good_one", "case": what}, [(t, 1.0)]), (labels, [(t, 2.0)])])
        code, _, body = remote_write(srv.url, payload)
        assert code == 400, (what, body)
        assert needle in error_of(body), what
    assert metric_value(srv.url, "turboprom_ingest_rejected_requests_total", protocol="remote_write") >= len(cases)
    srv.stop()
    assert read_stored(srv.data_dir, name_is("good_one")) == {}  # nothing half-applied


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One server for the tests that only look at HTTP answers and counters."""
    tmp = tmp_path_factory.mktemp("answers")
    cfg = tmp / "config.yml"
    cfg.write_text("ingest:\n  max_body_bytes: 200000\n  max_decompressed_bytes: 1000000\n")
    s = ServerProcess(tmp / "data", extra_args=["--config", str(cfg)]).start()
    yield s
    s.stop()


def test_duplicate_and_empty_labels(shared):
    srv = shared
    t = now_ms()
    w = WriteRequest()
    ts = w.timeseries.add()
    ts.labels.add(name="__name__", value="dup")
    ts.labels.add(name="a", value="1")
    ts.labels.add(name="a", value="2")
    ts.samples.add(value=1, timestamp=t)
    code, _, body = remote_write(srv.url, w.SerializeToString())
    assert code == 400 and "duplicate label name 'a'" in error_of(body)
    w = WriteRequest()
    w.timeseries.add().samples.add(value=1, timestamp=t)
    code, _, body = remote_write(srv.url, w.SerializeToString())
    assert code == 400 and "empty label set" in error_of(body)
    code, _, body = post(srv.url, "/api/v1/import/prometheus", b'x{a="1",a="2"} 1\n')
    assert code == 400 and "duplicate label name 'a'" in error_of(body)


def test_malformed_bodies(shared):
    srv = shared
    code, _, body = post(srv.url, "/api/v1/write", b"\x05garbage", {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"})
    assert code == 400 and "snappy" in error_of(body)
    code, _, body = remote_write(srv.url, b"\x0a\xff\xff\xff\x0f\x01")
    assert code == 400 and "protobuf" in error_of(body)
    code, _, body = remote_write(srv.url, b"\x0a\x03\x0a\x01", v2=True)
    assert code == 400 and "protobuf" in error_of(body)
    code, _, body = post(srv.url, "/api/v1/write", b"", {"Content-Type": "application/x-protobuf;proto=foo.Bar"})
    assert code == 415 and "foo.Bar" in error_of(body)
    code, _, body = post(srv.url, "/api/v1/import/prometheus", b"ok 1\nbroken{ 2\n")
    assert code == 400 and "line 2" in error_of(body)
    code, _, body = post(srv.url, "/api/v1/import/prometheus", b"ok 1\nok2 abc\n")
    assert code == 400 and "line 2" in error_of(body) and "abc" in error_of(body)
    code, _, body = post(srv.url, "/api/v1/import/prometheus", b"\xff\xfe 1\n")
    assert code == 400 and "UTF-8" in error_of(body)
    code, _, body = post(srv.url, "/api/v1/import/prometheus?extra_label=noequals", b"ok 1\n")
    assert code == 400 and "extra_label" in error_of(body)
    assert metric_value(srv.url, "turboprom_ingest_rejected_requests_total", reason="bad_snappy") >= 1
    assert metric_value(srv.url, "turboprom_ingest_rejected_requests_total", reason="bad_text") >= 1


def test_too_large_and_snappy_bomb(shared):
    srv = shared
    code, _, body = post(srv.url, "/api/v1/write", b"\x00" * 300_000, {"Content-Type": "application/x-protobuf"})
    assert code == 413 and "exceeds the limit" in error_of(body)
    bomb = b"\xff\xff\xff\xff\x0f" + b"\x00" * 10  # header claims 4 GiB
    code, _, body = post(srv.url, "/api/v1/write", bomb, {"Content-Type": "application/x-protobuf"})
    assert code == 413 and "decoded length 4294967295" in error_of(body)
    code, _, body = post(srv.url, "/api/v1/import/prometheus", b"x 1\n" * 60_000)
    assert code == 413


def test_future_samples_rejected_nan_inf_accepted(srv):
    t = now_ms()
    code, _, body = remote_write(srv.url, v1_payload([({"__name__": "fut"}, [(t, 1.0), (t + 3_600_000, 2.0)])]))
    assert code == 400 and "too far in the future" in error_of(body)
    code, _, body = remote_write(srv.url, v1_payload([({"__name__": "naninf"}, [(t, float("nan")), (t + 1, float("inf"))])]))
    assert code == 204, body
    srv.stop()
    assert read_stored(srv.data_dir, name_is("fut")) == {}
    (_, vs), = read_stored(srv.data_dir, name_is("naninf")).values()
    assert math.isnan(vs[0]) and math.isinf(vs[1])


def test_out_of_order_reported_as_partial_400(srv):
    t = now_ms() - 10_000
    assert remote_write(srv.url, v1_payload([({"__name__": "ooo"}, [(t, 1.0)])]))[0] == 204
    code, _, body = remote_write(srv.url, v1_payload([({"__name__": "ooo"}, [(t - 5000, 9.0)]), ({"__name__": "ooo_new"}, [(t, 3.0)])]))
    assert code == 400
    msg = error_of(body)
    assert "1 samples written" in msg and "rejected by storage" in msg and "out of order" in msg
    srv.stop()
    (_, vs), = read_stored(srv.data_dir, name_is("ooo")).values()
    assert vs.tolist() == [1.0]  # earlier data intact


def test_native_histograms_refused_clearly(shared):
    srv = shared
    t = now_ms()
    w = WriteRequest()
    ts = w.timeseries.add()
    ts.labels.add(name="__name__", value="nh")
    ts.histograms.append(b"\x08\x01")
    ts2 = w.timeseries.add()
    ts2.labels.add(name="__name__", value="nh_float")
    ts2.samples.add(value=4.0, timestamp=t)
    code, _, body = remote_write(srv.url, w.SerializeToString())
    assert code == 400 and "native histograms are not supported" in error_of(body)
    assert metric_value(srv.url, "turboprom_ingest_rejected_samples_total", reason="native_histogram_unsupported") == 1


def test_queue_full_answers_429_with_retry_after(tmp_path):
    cfg = tmp_path / "config.yml"
    cfg.write_text("ingest:\n  max_queue: 0\n")
    with ServerProcess(tmp_path / "data", extra_args=["--config", str(cfg)]) as s:
        code, headers, body = remote_write(s.url, v1_payload([({"__name__": "q"}, [(now_ms(), 1.0)])]))
        assert code == 429 and headers.get("retry-after") == "1" and "queue full" in error_of(body)
