"""GET /api/v1/cost_report?since=24h&tenant=...&format=json|text|csv|html"""
from __future__ import annotations

import time

from aiohttp import web

from planner.cost_report import build_report
from turboprom.api_common import error_response, ok, run_off_loop
from turboprom.cost_report import FORMATS, render
from turboprom.durations import parse_duration_ms
from turboprom.principal import request_tenant

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
        except ValueError as e:
            return error_response("bad_data", f"invalid parameter: {e}")
        tenant = request_tenant(request) if "X-Scope-OrgID" in request.headers else q.get("tenant") or None
        qlog = ctx.components.get("query_log")
        if qlog is None:
            return error_response("unavailable", "the query log is not enabled on this server", 503)
        rep = await run_off_loop(ctx, build_report, qlog, ctx.components.get("planner"), ctx.components.get("planner_canary"),
                                 ctx.storage, since_ms=since_ms, tenant=tenant, limit=limit)
        if fmt == "json":
            return ok(rep)
        return web.Response(text=render(rep, fmt), content_type=CONTENT_TYPES[fmt])

    app.router.add_get("/api/v1/cost_report", cost_report)
