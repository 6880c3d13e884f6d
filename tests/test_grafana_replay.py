"""The request sequence Grafana's Prometheus datasource sends (health check, version probe,
autocomplete, metrics browser, panels, exemplar probe, rules), replayed against TurboProm.

Every response is read the way Grafana reads it (pkg/promlib/converter/prom.go for query
responses: envelope, resultType, metric label maps, [<number ts>, "<Go ParseFloat string>"]
points; the frontend's ``response.data.data`` arrays for the resource endpoints). The same replay
runs against a real Prometheus 2.42 holding the same data, and the decoded frames must agree.
"""
from __future__ import annotations

import math
import re
import time

import orjson
import pytest

from tests.test_api_helpers import T0_MS, PeerPair, http

pytestmark = pytest.mark.peer

_GO_FLOAT = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|(?i:inf|infinity|nan))\Z")


class GrafanaParseError(AssertionError):
    pass


def go_parse_float(s: object) -> float:
    if not isinstance(s, str) or not _GO_FLOAT.match(s):
        raise GrafanaParseError(f"sample value must be a string parseable by ParseFloat, got {s!r}")
    return float(s)


def read_point(p: object) -> tuple[float, float]:
    if not (isinstance(p, list) and len(p) == 2 and isinstance(p[0], (int, float)) and not isinstance(p[0], bool)):
        raise GrafanaParseError(f"point must be [<number>, <string>], got {p!r}")
    return float(p[0]), go_parse_float(p[1])


def read_labels(m: object) -> dict[str, str]:
    if not isinstance(m, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()):
        raise GrafanaParseError(f"metric must be an object of string labels, got {m!r}")
    return m


def grafana_read_query_response(status: int, body: bytes) -> dict:
    """Decode like Grafana's converter; returns {"type", "frames": [(labels, [(t, v), ...])]}."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise GrafanaParseError(f"invalid JSON (HTTP {status}): {e}") from None
    if doc.get("status") == "error":
        raise GrafanaParseError(f"{doc.get('errorType')}: {doc.get('error')}")
    if doc.get("status") != "success":
        raise GrafanaParseError(f"unexpected status {doc.get('status')!r}")
    for key in ("warnings", "infos"):
        if key in doc and not (isinstance(doc[key], list) and all(isinstance(w, str) for w in doc[key])):
            raise GrafanaParseError(f"{key} must be an array of strings")
    data = doc.get("data")
    if not isinstance(data, dict) or "resultType" not in data:
        raise GrafanaParseError("no resultType found")
    rt, result = data["resultType"], data.get("result")
    frames = []
    if rt == "matrix":
        for s in result:
            if "values" not in s and "histograms" not in s:
                raise GrafanaParseError("matrix series without values")
            frames.append((read_labels(s["metric"]), [read_point(p) for p in s.get("values", [])]))
    elif rt == "vector":
        for s in result:
            frames.append((read_labels(s["metric"]), [read_point(s["value"])]))
    elif rt == "scalar":
        frames.append(({}, [read_point(result)]))
    elif rt == "string":
        if not (isinstance(result, list) and len(result) == 2 and isinstance(result[1], str)):
            raise GrafanaParseError("string result must be [<number>, <string>]")
        frames.append(({}, [(float(result[0]), result[1])]))
    else:
        raise GrafanaParseError(f"unknown resultType {rt!r}")
    return {"type": rt, "frames": sorted(frames, key=lambda f: sorted(f[0].items()))}


def grafana_read_resource(status: int, body: bytes, kind: str) -> object:
    doc = orjson.loads(body)
    if status != 200 or doc.get("status") != "success":
        raise GrafanaParseError(f"resource call failed: HTTP {status} {doc}")
    data = doc["data"]
    if kind == "strings":
        assert isinstance(data, list) and all(isinstance(x, str) for x in data), data
    elif kind == "series":
        assert isinstance(data, list) and all(isinstance(read_labels(x), dict) for x in data), data
    elif kind == "metadata":
        assert isinstance(data, dict)
        for name, entries in data.items():
            assert isinstance(entries, list) and all({"type", "help", "unit"} <= e.keys() for e in entries), (name, entries)
    elif kind == "rules":
        assert isinstance(data["groups"], list)
        for g in data["groups"]:
            for r in g["rules"]:
                if r.get("type") == "recording":
                    assert isinstance(r["name"], str) and isinstance(r["query"], str)
    elif kind == "exemplars":
        assert isinstance(data, list)
        for series in data:
            read_labels(series["seriesLabels"])
            for ex in series["exemplars"]:
                read_labels(ex["labels"])
                go_parse_float(ex["value"])
    elif kind == "buildinfo":
        assert re.match(r"\d+\.\d+\.\d+", data["version"]), data
        assert not data.get("features"), "non-empty features would make Grafana treat us as Mimir"
    return data


def resource(base: str, path: str, params, method: str = "POST"):
    """Grafana's resource path: POST form first, retried as GET on 400/405."""
    status, _, body = http(method, base + path, params)
    if method == "POST" and status in (400, 405):
        status, _, body = http("GET", base + path, params)
    return status, body


def floor_to_step(t: float, step: float) -> float:
    return math.floor(t / step) * step


def replay(base: str) -> dict:
    """One datasource session; returns the decoded answers for cross-checking."""
    out: dict = {}
    # 1. "Save & test": instant 1+1 at time=4 (backend POSTs by default), then buildinfo.
    for method in ("POST", "GET"):
        status, _, body = http(method, base + "/api/v1/query", {"query": "1+1", "time": "4"})
        out[f"health_{method}"] = grafana_read_query_response(status, body)
    status, _, body = http("GET", base + "/api/v1/status/buildinfo")
    out["buildinfo"] = grafana_read_resource(status, body, "buildinfo")["version"]
    # 2. Datasource init: rules (recording-rule expansion), metadata, exemplar probe in ms (!).
    status, _, body = http("GET", base + "/api/v1/rules")
    grafana_read_resource(status, body, "rules")
    status, _, body = http("GET", base + "/api/v1/metadata")
    out["metadata"] = grafana_read_resource(status, body, "metadata")
    now_ms = int(time.time() * 1000)
    status, _, body = http("GET", base + "/api/v1/query_exemplars",
                           {"query": "test", "start": str(now_ms - 30 * 60_000), "end": str(now_ms)})
    out["exemplars"] = grafana_read_resource(status, body, "exemplars")
    # 3. Metrics browser / autocomplete (start/end integer seconds snapped to a cache window).
    start_s, end_s = T0_MS // 1000, T0_MS // 1000 + 1800
    rng = {"start": str(start_s), "end": str(end_s)}
    status, body = resource(base, "/api/v1/labels", rng)
    out["labels"] = grafana_read_resource(status, body, "strings")
    status, body = resource(base, "/api/v1/labels", {**rng, "match[]": "http_requests_total", "limit": "40000"})
    out["labels_match"] = grafana_read_resource(status, body, "strings")
    status, _, body = http("GET", base + "/api/v1/label/__name__/values", rng)
    out["metric_names"] = grafana_read_resource(status, body, "strings")
    status, _, body = http("GET", base + "/api/v1/label/job/values", {**rng, "match[]": 'http_requests_total{code="500"}'})
    out["job_values"] = grafana_read_resource(status, body, "strings")
    status, body = resource(base, "/api/v1/series", {**rng, "match[]": '{__name__!=""}', "limit": "40000"})
    out["series"] = sorted(map(lambda d: sorted(d.items()), grafana_read_resource(status, body, "series")))
    # 4. A dashboard: range panels as form POSTs with start/end floored to the step.
    step = 30.0
    p_start = floor_to_step(T0_MS / 1000 + 123.456, step)
    p_end = floor_to_step(T0_MS / 1000 + 1700.789, step)
    for q in ('sum by (job) (rate(http_requests_total[$__rate_interval]))'.replace("$__rate_interval", "2m"),
              "temperature_celsius", "sparse_gauge", "1", "vector(NaN)", "-Inf"):
        status, _, body = http("POST", base + "/api/v1/query_range",
                               {"query": q, "start": repr(p_start), "end": repr(p_end), "step": repr(step)})
        out[f"range {q}"] = grafana_read_query_response(status, body)
    # 5. Explore "both": instant at the (unaligned) range end.
    status, _, body = http("POST", base + "/api/v1/query", {"query": "topk(3, http_requests_total)", "time": repr(T0_MS / 1000 + 1700.789)})
    out["instant topk"] = grafana_read_query_response(status, body)
    status, _, body = http("POST", base + "/api/v1/query", {"query": '"text"', "time": "4.5"})
    out["instant string"] = grafana_read_query_response(status, body)
    # 6. An error is shown as "<errorType>: <error>".
    status, _, body = http("POST", base + "/api/v1/query_range", {"query": "rate(", "start": "1", "end": "2", "step": "1"})
    with pytest.raises(GrafanaParseError, match=r"^bad_data: "):
        grafana_read_query_response(status, body)
    assert status == 400
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with PeerPair(tmp_path_factory.mktemp("grafana")) as p:
        yield p


def _close(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9)
    return a == b


def test_grafana_replay_matches_prometheus(pair):
    ref = replay(pair.prom.url)
    ours = replay(pair.tp.url)
    assert ours["health_POST"]["frames"] == [({}, [(4.0, 2.0)])]
    for key in ref:
        if key in ("buildinfo", "metadata"):
            continue  # versions differ; Prometheus has no metadata for backfilled data
        assert _close(ours[key], ref[key]), key
    assert ours["metadata"]["http_requests_total"][0]["type"] == "counter"


def test_grafana_u_escaped_label_names(pair):
    # Grafana escapes non-legacy label names in the label-values path (U__ prefix, "_" -> "__",
    # other characters -> _<hex>_); the server unescapes before looking the name up.
    from turboprom.api_params import unescape_label_name

    assert unescape_label_name("U__sensor_2e_id") == "sensor.id"
    assert unescape_label_name("U__a__b") == "a_b"
    assert unescape_label_name("U___1f600___x") == "\U0001f600_x"
    assert unescape_label_name("U__bad_zz_") == "U__bad_zz_"  # invalid escape: name kept as is
    assert unescape_label_name("plain_name") == "plain_name"
    for escaped, plain in (("U__room", "room"), ("U__site", "site")):
        status, _, body = http("GET", pair.tp.url + f"/api/v1/label/{escaped}/values")
        status2, _, body2 = http("GET", pair.tp.url + f"/api/v1/label/{plain}/values")
        values = grafana_read_resource(status, body, "strings")
        assert values and values == grafana_read_resource(status2, body2, "strings")
    # A UTF-8 name nobody has written: a well-formed empty answer, not an error.
    status, _, body = http("GET", pair.tp.url + "/api/v1/label/U__sensor_2e_id/values")
    assert grafana_read_resource(status, body, "strings") == []
