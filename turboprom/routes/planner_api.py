"""Planner introspection: /api/v1/planner/{plans,plans/<id>,explain,candidates,canary,query_log}.

Thin layer over ``ctx.components.planner`` (planner/planner.py); heavy parts run off the loop.
``turboprom plan list|show|explain`` (planner/cli.py) talks to these endpoints.

Tenancy: the planner learns from, and its summaries hold, the default tenant's queries and data only
(other tenants' engines run raw). A caller acting as another tenant (X-Scope-OrgID) therefore sees no
plans, candidates, decisions or canary checks, an ``explain`` that says every sub-tree runs raw, and
only its own tenant's rows of the query log.
"""
from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from turboprom.tenancy import DEFAULT_TENANT, request_tenant
from turboprom.api_errors import APIError
from turboprom.api_common import add_get_post, api_handler, ok, run_off_loop
from turboprom.api_params import Params, invalid_param
from turboprom.api_params import parse_query as parse_promql
from turboprom.context import ServerContext


def _planner(ctx: ServerContext) -> Any:
    p = ctx.components.planner
    if p is None:
        raise APIError("unavailable", "the planner is not enabled on this server")
    return p


def _describe(sds: Any) -> dict[str, Any]:
    """An SDS's description plus its step cache's counters (exact SDS; planner/summary_scan.py)."""
    d = sds.describe()
    cache = getattr(sds.store, "step_cache", None)
    if cache is not None:
        d["step_cache"] = cache.describe()
    return d


NOT_FOR_TENANT = "summaries are built from the default tenant's data and queries only: this tenant's queries run raw"
_EXPLAIN_KEYS = ("function", "metric", "range_ms", "algorithm")  # derived from the caller's own query text


def _own_state(request: web.Request) -> bool:
    """Does the caller act as the default tenant, whose queries and data the planner's state is built from?"""
    return request_tenant(request) == DEFAULT_TENANT


def _tenant_explain(full: dict[str, Any]) -> dict[str, Any]:
    """``explain`` for a tenant other than the default: the sub-trees of its own query, each raw,
    without anything from the planner's state (plan ids, coverage, decisions)."""
    subtrees = [{**{k: t[k] for k in _EXPLAIN_KEYS if k in t}, "path": "raw", "why": NOT_FOR_TENANT}
                for t in full.get("subtrees", [])]
    out = {"query": full.get("query"), "pattern": full.get("pattern"), "subtrees": subtrees}
    if not subtrees and "why" in full:
        out["why"] = full["why"]
    return out


def setup(app: web.Application, ctx: ServerContext) -> None:
    @api_handler
    async def plans(request: web.Request, params: Params) -> web.Response:
        p = _planner(ctx)
        if not _own_state(request):
            return ok({"plans": [], "summarizer": {"cpu_seconds": 0.0, "samples": 0, "max_ts": None}, "decisions": [],
                       "retired": [], "step_answers": None, "budget_bytes": p.config.budget_bytes})

        engine = ctx.components.planned_engine

        def build() -> dict[str, Any]:
            summ = p.summarizer
            summ.drain()  # what was consumed is counted in the listing
            return {
                "plans": [_describe(s) for s in sorted(p.sds.values(), key=lambda s: s.id)],
                "summarizer": {"cpu_seconds": summ.cpu_seconds, "samples": summ.samples, "max_ts": summ.max_ts},
                "decisions": [{"time": t, "action": a, "sds": i, "reason": r} for t, a, i, r in list(p.decisions)],
                "retired": list(p.retired.values()),
                "step_answers": (engine.step_answers.describe()
                                 if engine is not None and engine.step_answers is not None else None),
                "budget_bytes": p.config.budget_bytes,
            }

        return ok(await run_off_loop(ctx, build))

    @api_handler
    async def plan(request: web.Request, params: Params) -> web.Response:
        p = _planner(ctx)
        sds = p.sds.get(request.match_info["id"]) if _own_state(request) else None
        if sds is None:
            raise APIError("not_found", f"no plan with id {request.match_info['id']!r}")
        return ok(await run_off_loop(ctx, lambda: _describe(sds)))

    @api_handler
    async def explain(request: web.Request, params: Params) -> web.Response:
        p = _planner(ctx)
        q = params.get("query")
        if not q:
            raise invalid_param("query", "parameter is required")
        try:
            await run_off_loop(ctx, parse_promql, q, ctx.config.query_max_depth)  # the parser binding holds the GIL
        except ValueError as e:
            raise invalid_param("query", str(e)) from None
        start: int | None = None
        if params.get("time"):
            start = params.time("time", 0)
        elif params.get("start"):
            start = params.time("start", 0)
        end = params.time("end", start) if start is not None else None
        step = params.duration("step") or 0
        if not _own_state(request):
            return ok(_tenant_explain(await run_off_loop(ctx, p.explain, q, None, None, 0)))
        return ok(await run_off_loop(ctx, p.explain, q, start, end, step, params.boolean("approx")))

    @api_handler
    async def candidates(request: web.Request, params: Params) -> web.Response:
        p = _planner(ctx)
        if not _own_state(request):
            return ok([])
        return ok(await run_off_loop(ctx, p.candidates_report))

    @api_handler
    async def canary(request: web.Request, params: Params) -> web.Response:
        c = ctx.components.planner_canary if _own_state(request) else None
        return ok({"checks": list(c.results) if c is not None else []})

    @api_handler
    async def query_log(request: web.Request, params: Params) -> web.Response:
        qlog = ctx.components.query_log
        if qlog is None:
            raise APIError("unavailable", "the query log is not enabled on this server")
        limit = params.limit("limit") or 100
        tenant = request_tenant(request)

        def rows() -> list[dict[str, Any]]:
            cols = ["arrival_ms", "tenant", "origin", "pattern", "expr", "kind", "start_ms", "end_ms", "step_ms",
                    "wall_s", "cpu_s", "samples", "paths", "result_series", "result_points", "exact", "error"]
            # Only the caller's own tenant's queries (another tenant's query text is theirs).
            out = qlog.sql(f"SELECT {', '.join(cols)} FROM query_log WHERE tenant = ? ORDER BY arrival_ms DESC LIMIT ?",
                           [tenant, limit])
            res = [dict(zip(cols, r)) for r in out]
            for r in res:
                r["paths"] = json.loads(r["paths"]) if r["paths"] else []
            return res

        return ok(await run_off_loop(ctx, rows))

    app.router.add_get("/api/v1/planner/plans", plans)
    app.router.add_get("/api/v1/planner/plans/{id}", plan)
    add_get_post(app, "/api/v1/planner/explain", explain)
    app.router.add_get("/api/v1/planner/candidates", candidates)
    app.router.add_get("/api/v1/planner/canary", canary)
    app.router.add_get("/api/v1/planner/query_log", query_log)
