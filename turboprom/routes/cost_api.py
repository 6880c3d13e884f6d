"""GET /api/v1/cost_report?since=24h&tenant=...&format=json|text|csv|html"""
from __future__ import annotations

import time

from aiohttp import web

from planner.cost_report import build_report
from turboprom.api_errors import error_response
from turboprom.api_common import ok, run_off_loop
from turboprom.cost_report import FORMATS, render
from turboprom.durations import parse_duration_ms
from storage.labels import DEFAULT_TENANT
from turboprom.tenancy import TenantView, tenant_of

CONTENT_TYPES = {"text": "text/plain", "csv": "text/csv", "html": "text/html"}


def setup(app: web.Application, ctx) -> None:
    async def cost_report(request: web.Request) -> web.StreamResponse:
        q = request.query
        fmt = q.get("format", "json")
        if fmt not in FORMATS:
            return error_response("bad_data", f"invalid parameter \"format\": must be one of {', '.join(FORMATS)}")
        try:
            since_ms = int(time.time() * 1000) - parse_duration_ms(q.get("since", "24h"))
            limit = int(q.get("limit", "200"))
            if limit <= 0:
                raise ValueError(f"limit must be a positive integer, got {limit}")
        except ValueError as e:
            return error_response("bad_data", f"invalid parameter: {e}")
        # Always the caller's own tenant (X-Scope-OrgID, else the default tenant): never another's.
        try:
            tenant = tenant_of(request.headers)
        except ValueError as e:
            return error_response("bad_data", str(e))
        qlog = ctx.components.query_log
        if qlog is None:
            return error_response("unavailable", "the query log is not enabled on this server", 503)
        own = tenant == DEFAULT_TENANT  # summaries are built from the default tenant's data only
        rep = await run_off_loop(ctx, build_report, qlog, ctx.components.planner if own else None,
                                 ctx.components.planner_canary if own else None,
                                 TenantView(ctx.storage, tenant), since_ms=since_ms, tenant=tenant, limit=limit)
        if fmt == "json":
            return ok(rep)
        return web.Response(text=render(rep, fmt), content_type=CONTENT_TYPES[fmt])

    app.router.add_get("/api/v1/cost_report", cost_report)
