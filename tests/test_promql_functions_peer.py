"""The function table against a real Prometheus (Debian's 2.42) holding identical data.

The same deterministic series (counters with resets, gauges crossing zero, a classic histogram)
are backfilled into Prometheus with ``promtool tsdb create-blocks-from openmetrics`` and loaded into
our engine; every function family is then run as a range query on both and the results must agree
(same series, same steps, values within 1e-6 relative).

Samples sit 7 s off the step grid so Prometheus 2.42's closed windows [t-r, t] and our 3.x
left-open windows (t-r, t] select the same samples; the compared range starts an hour after the
first sample, where 2.42 and 3.x extrapolate rate() identically.
"""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.test_api_helpers import prometheus_and_engine

STEP_S = 15
HOURS = 3
QUERY_STEP_S = 60

QUERIES = [
    "rate(req_total[5m])",
    "increase(req_total[10m])",
    "irate(req_total[5m])",
    "resets(req_total[30m])",
    "delta(temp[10m])",
    "idelta(temp[5m])",
    "deriv(temp[10m])",
    "predict_linear(temp[15m], 600)",
    "changes(temp[10m])",
    "avg_over_time(temp[10m])",
    "sum_over_time(temp[10m])",
    "min_over_time(temp[10m])",
    "max_over_time(temp[10m])",
    "count_over_time(temp[10m])",
    "stddev_over_time(temp[10m])",
    "stdvar_over_time(temp[10m])",
    "quantile_over_time(0.3, temp[10m])",
    "last_over_time(temp[10m])",
    "present_over_time(temp[10m])",
    "absent_over_time(temp[10m])",
    "absent_over_time(nonexistent{job=\"x\"}[10m])",
    "histogram_quantile(0.9, rate(lat_bucket[5m]))",
    "histogram_quantile(0.5, sum by (le) (rate(lat_bucket[5m])))",
    "abs(temp)",
    "ceil(temp)",
    "floor(temp)",
    "round(temp, 0.5)",
    "sgn(temp)",
    "exp(temp / 10)",
    "ln(abs(temp) + 1)",
    "log2(abs(temp) + 1)",
    "log10(abs(temp) + 1)",
    "sqrt(abs(temp))",
    "clamp(temp, -2, 3)",
    "clamp_min(temp, 0)",
    "clamp_max(temp, 0)",
    "sin(temp)",
    "cos(temp)",
    "tan(temp)",
    "atan(temp)",
    "sinh(temp / 10)",
    "tanh(temp)",
    "asinh(temp)",
    "deg(temp)",
    "rad(temp)",
    "timestamp(temp)",
    "hour(timestamp(temp))",
    "minute(timestamp(temp))",
    "day_of_week(timestamp(temp))",
    "days_in_month(timestamp(temp))",
    "year()",
    "label_replace(temp, \"zone\", \"z-$1\", \"instance\", \"host-(.*)\")",
    "label_join(temp, \"both\", \"/\", \"instance\", \"job\")",
    "scalar(sum(temp))",
    "vector(time())",
    "absent(nonexistent{job=\"x\"})",
    "sort_desc(temp)",
]


def _series(end_s: int) -> list[tuple[dict, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    n = HOURS * 3600 // STEP_S
    ts = end_s - 7 - STEP_S * np.arange(n - 1, -1, -1, dtype=np.int64)
    out = []
    for inst in ("host-a", "host-b"):
        inc = rng.poisson(5, n).astype(float)
        v = 1000 + np.cumsum(inc)
        cut = n // 2 + (7 if inst == "host-b" else 0)
        v[cut:] = np.cumsum(inc[cut:])  # a counter reset
        out.append(({"__name__": "req_total", "job": "api", "instance": inst}, ts, v))
        walk = np.round(np.cumsum(rng.normal(0, 0.7, n)), 3)
        out.append(({"__name__": "temp", "job": "node", "instance": inst}, ts, walk))
        obs = rng.poisson(10, n).astype(float)
        cum = np.cumsum(obs)
        for le, share in (("0.1", 0.2), ("0.5", 0.55), ("1", 0.8), ("+Inf", 1.0)):
            out.append(({"__name__": "lat_bucket", "job": "api", "instance": inst, "le": le}, ts, np.floor(cum * share)))
    return out


@pytest.fixture(scope="module")
def peers():
    end_s = (int(time.time()) // 7200) * 7200 - 7200
    with prometheus_and_engine(_series(end_s), "functions-peer-", None) as (url, eng):
        yield url, eng, end_s


def _prom_range(url: str, q: str, start: int, end: int, step: int) -> dict:
    params = urllib.parse.urlencode({"query": q, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{params}", timeout=60) as r:
        doc = json.loads(r.read())
    assert doc["status"] == "success", doc
    return {tuple(sorted(s["metric"].items())): s["values"] for s in doc["data"]["result"]}


@pytest.mark.peer
@pytest.mark.timeout(300)
def test_functions_agree_with_prometheus(peers):
    url, eng, end_s = peers
    start, end = end_s - 2 * 3600 + 600, end_s  # skip the first hour (and the window warm-up)
    mismatches = []
    empty = []
    for q in QUERIES:
        theirs = _prom_range(url, q, start, end, QUERY_STEP_S)
        if not theirs:
            empty.append(q)
        res = eng.range_query(q, start * 1000, end * 1000, QUERY_STEP_S * 1000)
        ours = {}
        for i, lb in enumerate(res.labels):
            m = res.present[i]
            ours[tuple(lb)] = (res.timestamps[m] // 1000, res.values[i][m])
        if set(ours) != set(theirs):
            mismatches.append(f"{q}: series differ: ours {sorted(ours)[:3]} prom {sorted(theirs)[:3]}")
            continue
        for key, pts in theirs.items():
            pt = np.array([int(float(t)) for t, _ in pts])
            pv = np.array([float(v) for _, v in pts])
            ot, ov = ours[key]
            if len(pt) != len(ot) or (pt != ot).any():
                mismatches.append(f"{q} {dict(key)}: steps differ ({len(ot)} vs {len(pt)})")
                continue
            both_nan = np.isnan(pv) & np.isnan(ov)
            denom = np.abs(pv) + np.abs(ov)
            with np.errstate(invalid="ignore"):
                rel = np.where(both_nan | (pv == ov), 0.0, np.abs(pv - ov) / np.where(denom == 0, 1, denom))
            if rel.max() >= 1e-6:
                k = int(rel.argmax())
                mismatches.append(f"{q} {dict(key)} @ {pt[k]}: ours {ov[k]!r} prom {pv[k]!r}")
    assert not mismatches, "\n".join(mismatches)
    # Only the absent*() of an existing/unknown series may legitimately be empty.
    assert empty == ["absent_over_time(temp[10m])"], empty
