"""Byte-compatibility of our JSON encoder with a real Prometheus 2.42.

Prometheus evaluates number/string literals without any data, so its exact bytes for scalars,
strings and (range-query) matrices of many awkward floats and timestamps can be compared with
what ``turboprom.api_json`` writes for the same values.
"""
from __future__ import annotations

import math
import random

import numpy as np
import orjson
import pytest

from promql.types import QueryResult
from storage.labels import make_labels
from turboprom import api_json
from tests.test_api_helpers import PrometheusPeer, http

pytestmark = pytest.mark.peer


def _awkward_floats(n: int, seed: int = 7) -> list[float]:
    rnd = random.Random(seed)
    vals = [0.0, -0.0, 1.0, -1.0, 0.1, 1 / 3, 2.0**53, 2.0**53 + 2, 2.0**60, 1e15, 1e16, 1.2345e17,
            9.999e20, 1e21, 1.5e21, 1e-4, 9.99e-5, 1.5e-5, 1e-6, 9.99e-7, 1e-7, 5e-324, 1.7976931348623157e308,
            123456789.123, 0.000123, 1e-300, float("nan"), float("inf"), float("-inf")]
    while len(vals) < n:
        mant = rnd.uniform(-10, 10)
        exp = rnd.randint(-25, 25)
        vals.append(mant * 10.0**exp)
        vals.append(float(rnd.randint(-(10**12), 10**12)))
    return vals[:n]


def _literal(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Inf" if v > 0 else "-Inf"
    return repr(v)


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    with PrometheusPeer(tmp_path_factory.mktemp("prom-json")) as p:
        yield p


def test_scalar_values_and_timestamps_match_prometheus_bytes(prom):
    times = ["1435781451.78", "4", "1712345678.123", "0.5", "1000000000.001"]
    for i, v in enumerate(_awkward_floats(120)):
        t = times[i % len(times)]
        status, _, body = http("GET", prom.url + "/api/v1/query", {"query": _literal(v), "time": t})
        assert status == 200, body
        t_ms = int(round(float(t) * 1000))
        ours = api_json.encode_query_result(QueryResult("scalar", scalar=v, timestamp=t_ms))
        got = orjson.loads(body)["data"]["result"][1]
        if math.copysign(1, v) < 0 and v == 0:
            # Prometheus' parser folds "-0.0" into 0 for some literals; compare the value only.
            assert got in ("0", "-0")
            continue
        assert ours == body, (v, ours, body)


def test_range_matrix_values_match_prometheus_bytes(prom):
    # Matrix points use a different formatter than scalars (exponent form at the extremes).
    for v in _awkward_floats(60, seed=11):
        status, _, body = http("GET", prom.url + "/api/v1/query_range", {"query": _literal(v), "start": "10", "end": "12", "step": "1"})
        assert status == 200, body
        if math.copysign(1, v) < 0 and v == 0:
            continue
        ts = np.array([10000, 11000, 12000], dtype=np.int64)
        res = QueryResult("matrix", labels=[()], values=np.full((1, 3), v), present=np.ones((1, 3), bool), timestamps=ts)
        assert api_json.encode_query_result(res) == body, (v, body)


def test_range_matrix_timestamps_match_prometheus_bytes(prom):
    # Negative, fractional and whole-second step timestamps.
    for start, end, step in [("-1.5", "1", "0.5"), ("1435781451.781", "1435781461.781", "0.333"), ("100", "200", "7")]:
        status, _, body = http("POST", prom.url + "/api/v1/query_range", {"query": "0.1", "start": start, "end": end, "step": step})
        assert status == 200, body
        s_ms, e_ms = int(round(float(start) * 1000)), int(round(float(end) * 1000))
        step_ms = int(round(float(step) * 1000))
        ts = np.arange(s_ms, e_ms + 1, step_ms, dtype=np.int64)
        res = QueryResult("matrix", labels=[()], values=np.full((1, len(ts)), 0.1), present=np.ones((1, len(ts)), bool), timestamps=ts)
        assert api_json.encode_query_result(res) == body


def test_string_result_escaping_matches_prometheus_bytes(prom):
    for s in ["plain", "a<b>&c", "quote\"back\\slash", "tab\tnew\nline", "unicode é ✓", "line\u2028sep"]:
        q = orjson.dumps(s).decode()  # a valid PromQL double-quoted string for these inputs
        status, _, body = http("GET", prom.url + "/api/v1/query", {"query": q, "time": "1.5"})
        assert status == 200, body
        ours = api_json.encode_query_result(QueryResult("string", string=s, timestamp=1500))
        assert ours == body, (s, ours, body)


def test_vector_and_matrix_encoding_roundtrip():
    # Our own encoder: every value parses back bit-identically (except NaN payloads) and the
    # presence mask is honoured (absent points are omitted, empty series dropped).
    vals = np.array(_awkward_floats(60), dtype=np.float64)
    labels = [make_labels({"__name__": "m", "i": str(i), "html": "<&>"}) for i in range(3)]
    values = np.vstack([vals[:20], vals[20:40], vals[40:60]])
    present = np.ones_like(values, dtype=bool)
    present[1, ::3] = False
    present[2, :] = False
    ts = np.arange(20, dtype=np.int64) * 1500 - 3000
    res = QueryResult("matrix", labels=labels, values=values, present=present, timestamps=ts)
    doc = orjson.loads(api_json.encode_query_result(res))
    result = doc["data"]["result"]
    assert [r["metric"]["i"] for r in result] == ["0", "1"]
    assert result[0]["metric"]["html"] == "<&>"
    for row, r in zip((0, 1), result):
        exp_ts = ts[present[row]]
        assert [round(p[0] * 1000) for p in r["values"]] == exp_ts.tolist()
        got = np.array([float(p[1]) for p in r["values"]])
        exp = values[row][present[row]]
        assert np.array_equal(np.isnan(got), np.isnan(exp))
        ok = ~np.isnan(exp)
        assert np.array_equal(got[ok], exp[ok])


def test_single_values_are_written_as_the_bulk_formatter_writes_them():
    """``format_value`` (stats, scalars, one-off numbers) takes a repr fast path in the range where
    Python's shortest repr is positional; everywhere it must equal the bulk ``format_values``."""
    rng = np.random.default_rng(0)
    vals = np.concatenate([rng.random(20_000) * 10.0 ** rng.integers(-8, 22, 20_000), np.round(rng.random(2_000) * 1e6),
                           -rng.random(2_000) * 100, np.array(_awkward_floats(200)), [1e-4, 9.999e-5, 2.0**53 - 1, 2.0**53]])
    bulk = api_json.format_values(vals)
    assert [api_json.format_value(v) for v in vals.tolist()] == bulk


def test_error_holding_a_byte_that_is_not_utf8_matches_prometheus_bytes(prom, tmp_path):
    """``label_replace(.., "\\xff", ..)`` (the conformance corpus' invalid destination label) is refused
    by both; the message holds the byte 0xff, which Go's encoding/json writes as ``\\ufffd``. It was an
    HTTP 500 here (orjson refuses such text)."""
    from tests.helpers import ServerProcess

    q = 'label_replace(vector(1), "\\xff", "", "", "")'
    with ServerProcess(tmp_path / "tp") as tp:
        ours = http("GET", tp.url + "/api/v1/query", {"query": q, "time": "10"})
    theirs = http("GET", prom.url + "/api/v1/query", {"query": q, "time": "10"})
    assert ours[0] == theirs[0] == 422, (ours, theirs)
    assert b"\\ufffd" in theirs[2]
    assert ours[2] == theirs[2]
