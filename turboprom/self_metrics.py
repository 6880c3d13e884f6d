"""Server-level self-metrics: every HTTP request timed by route, as Prometheus does for its handlers."""
from __future__ import annotations

import time
from typing import Awaitable, Callable

from aiohttp import web
from prometheus_client import Counter, Histogram

HTTP_REQUESTS = Counter("turboprom_http_requests", "HTTP requests served, by route and status code.", ["handler", "code"])
HTTP_DURATION = Histogram(
    "turboprom_http_request_duration_seconds", "HTTP request latency by route (query, ingest, congestion polls, ...).",
    ["handler"], buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)


@web.middleware
async def http_metrics(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    route = request.match_info.route
    name = route.resource.canonical if route.resource is not None else "unmatched"
    start = time.perf_counter()
    code = 500
    try:
        resp = await handler(request)
        code = resp.status
        return resp
    except web.HTTPException as e:
        code = e.status
        raise
    finally:
        HTTP_DURATION.labels(name).observe(time.perf_counter() - start)
        HTTP_REQUESTS.labels(name, str(code)).inc()


QUERIES = Counter("turboprom_queries", "PromQL queries evaluated, by serving path (summary: at least one sub-tree answered "
                  "from a summary; raw: none) and kind.", ["path", "kind"])
QUERY_CPU = Histogram("turboprom_query_cpu_seconds", "CPU time per PromQL query by serving path.", ["path"],
                      buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120))
CANCELED_BY_CLIENT = Counter("turboprom_queries_canceled_by_client", "PromQL queries stopped early because the client "
                             "disconnected before the answer was ready.")
QUERY_SAMPLES = Counter("turboprom_query_samples_scanned", "Raw samples read by PromQL queries, by serving path.", ["path"])


def observe_query(result, kind: str):
    """Count a finished query by path; the summary hit ratio is
    rate(turboprom_queries_total{path="summary"}[5m]) / rate(turboprom_queries_total[5m])."""
    st = getattr(result, "stats", None)
    if st is None:
        return result
    path = "summary" if any(str(p).startswith("summary:") for p in (st.paths or [])) else "raw"
    QUERIES.labels(path, kind).inc()
    QUERY_CPU.labels(path).observe(max(0.0, float(st.cpu_seconds or 0.0)))
    QUERY_SAMPLES.labels(path).inc(max(0, int(st.samples_scanned or 0)))
    return result
