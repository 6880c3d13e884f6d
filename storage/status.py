"""Prometheus's ``TSDBStatus`` (the data of ``/api/v1/status/tsdb``), computed from label sets.

Field names and shapes are Prometheus 2.42's (web/api/v1 ``TSDBStatus``, ``HeadStats``, ``TSDBStat``):
``headStats`` {numSeries, numLabelPairs, chunkCount, minTime, maxTime} and four top-``limit`` lists of
``{"name", "value"}`` sorted by value descending, then name. The reserved tenant label is storage's,
never reported. Per-series Python: a status endpoint, not a hot path.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

from storage.labels import METRIC_NAME, TENANT_LABEL, Labels

STATUS_LISTS = ("seriesCountByMetricName", "labelValueCountByLabelName", "memoryInBytesByLabelName",
                "seriesCountByLabelValuePair")
HEAD_STATS_FIELDS = ("numSeries", "numLabelPairs", "chunkCount", "minTime", "maxTime")


def _top(counts: dict[str, int], limit: int) -> list[dict[str, Any]]:
    return [{"name": k, "value": int(v)} for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]]


def tsdb_status(series: Iterable[Labels], limit: int, *, min_time: int = 0, max_time: int = 0) -> dict[str, Any]:
    """The TSDBStatus of ``series`` (head time bounds given by the caller, 0 when empty)."""
    n = 0
    by_metric: Counter[str] = Counter()
    pairs: Counter[str] = Counter()
    values: dict[str, set[str]] = {}
    for lbl in series:
        n += 1
        for name, value in lbl:
            if name == TENANT_LABEL:
                continue
            if name == METRIC_NAME:
                by_metric[value] += 1
            pairs[f"{name}={value}"] += 1
            values.setdefault(name, set()).add(value)
    return {
        "headStats": {"numSeries": n, "numLabelPairs": len(pairs), "chunkCount": 0,
                      "minTime": int(min_time), "maxTime": int(max_time)},
        "seriesCountByMetricName": _top(by_metric, limit),
        "labelValueCountByLabelName": _top({k: len(v) for k, v in values.items()}, limit),
        "memoryInBytesByLabelName": _top({k: sum(len(x) for x in v) for k, v in values.items()}, limit),
        "seriesCountByLabelValuePair": _top(pairs, limit),
    }
