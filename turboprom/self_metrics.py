"""Server-level self-metrics: every HTTP request timed by route, as Prometheus does for its handlers.

``/metrics`` exposes the process's own counters (samples appended, series created, queries, ingest
requests, ...) summed over every tenant, as Prometheus and Mimir do. Like Mimir, which serves them to
the operator's monitoring and never to tenants, it answers only callers who may act as any tenant
(no auth configured, or a user without a ``tenants:`` entry in the web config); a caller restricted to
some tenants gets 403 (errorType forbidden), since the totals would reveal the other tenants' volume.
Tenants see their own volume through their own queries and /api/v1/status/tsdb.
"""
from __future__ import annotations

import time
from typing import Any, Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Histogram, generate_latest

from turboprom.api_errors import error_response

HTTP_REQUESTS = Counter("turboprom_http_requests", "HTTP requests served, by route and status code.", ["handler", "code"])
HTTP_DURATION = Histogram(
    "turboprom_http_request_duration_seconds", "HTTP request latency by route (query, ingest, congestion polls, ...).",
    ["handler"], buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
HTTP_RESPONSE_BYTES = Counter("turboprom_http_response_bytes", "Bytes of HTTP response bodies by route (streamed "
                              "answers included).", ["handler"])


class _RouteMetrics:
    """The metric children of one route, looked up once (``labels()`` takes a lock and builds a key
    on every call: three of them per request cost as much as routing it)."""

    __slots__ = ("duration", "size", "codes", "name")

    def __init__(self, name: str):
        self.name = name
        self.duration = HTTP_DURATION.labels(name)
        self.size = HTTP_RESPONSE_BYTES.labels(name)
        self.codes: dict[int, Any] = {}

    def count(self, code: int) -> None:
        c = self.codes.get(code)
        if c is None:
            c = self.codes[code] = HTTP_REQUESTS.labels(self.name, str(code))
        c.inc()


_ROUTES: dict[str, _RouteMetrics] = {}


@web.middleware
async def http_metrics(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    route = request.match_info.route
    name = route.resource.canonical if route.resource is not None else "unmatched"
    m = _ROUTES.get(name)
    if m is None:
        m = _ROUTES[name] = _RouteMetrics(name)
    start = time.perf_counter()
    code = 500
    try:
        resp = await handler(request)
        code = resp.status
        n = resp.body_length if resp.prepared else None  # streamed answers: what was written
        if n is None and isinstance(getattr(resp, "body", None), (bytes, bytearray)):
            n = len(resp.body)  # type: ignore[attr-defined]
        if n:
            m.size.inc(n)
        return resp
    except web.HTTPException as e:
        code = e.status
        raise
    finally:
        m.duration.observe(time.perf_counter() - start)
        m.count(code)


QUERIES = Counter("turboprom_queries", "PromQL queries evaluated, by serving path (summary: at least one sub-tree answered "
                  "from a summary; raw: none) and kind.", ["path", "kind"])
QUERY_CPU = Histogram("turboprom_query_cpu_seconds", "CPU time per PromQL query by serving path.", ["path"],
                      buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120))
CANCELED_BY_CLIENT = Counter("turboprom_queries_canceled_by_client", "PromQL queries stopped early because the client "
                             "disconnected before the answer was ready.")
QUERY_SAMPLES = Counter("turboprom_query_samples_scanned", "Raw samples read by PromQL queries, by serving path.", ["path"])


_QUERY_CHILDREN: dict[tuple[str, str], tuple[Any, Any, Any]] = {}


def observe_query(result, kind: str):
    """Count a finished query by path; the summary hit ratio is
    rate(turboprom_queries_total{path="summary"}[5m]) / rate(turboprom_queries_total[5m])."""
    st = getattr(result, "stats", None)
    if st is None:
        return result
    path = "summary" if any(str(p).startswith("summary:") for p in (st.paths or [])) else "raw"
    children = _QUERY_CHILDREN.get((path, kind))
    if children is None:  # looked up once per (path, kind), as the HTTP middleware does per route
        children = _QUERY_CHILDREN[(path, kind)] = (QUERIES.labels(path, kind), QUERY_CPU.labels(path),
                                                    QUERY_SAMPLES.labels(path))
    queries, cpu, samples = children
    queries.inc()
    cpu.observe(max(0.0, float(st.cpu_seconds or 0.0)))
    samples.inc(max(0, int(st.samples_scanned or 0)))
    return result


def exposition(request: web.Request, ctx) -> web.Response:
    """The ``/metrics`` answer: every tenant's totals, for operators only (see the module docstring)."""
    from turboprom.tenancy import OPERATOR_ONLY, is_operator

    if not is_operator(request, ctx):
        return error_response("forbidden", f"/metrics: {OPERATOR_ONLY}", 403)
    return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})
