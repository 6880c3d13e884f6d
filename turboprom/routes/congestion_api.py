"""GET /api/v1/congestion (JSON poll) and GET /api/v1/congestion/stream (server-sent events).

Both read the tracker's ready-made snapshot (ctx.components["congestion"]); nothing here touches
storage, so polls stay fast while ingestion and heavy queries run. Documented in docs/openapi.yaml.

Tenancy: the tracker consumes the default tenant's samples only (turboprom/tenancy.py restrict_sinks),
so a caller acting as another tenant (X-Scope-OrgID) gets an empty view of the same shape (no
instances, no clusters, version 0), and its stream never wakes on the default tenant's updates (their
timing would tell that tenant's ingest activity).
"""
from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import orjson
from aiohttp import web

from turboprom.api_params import ParamError
from turboprom.context import ServerContext
from turboprom.tenancy import DEFAULT_TENANT, request_tenant

FILTERS = ("cluster", "model_name", "instance")
# ``model`` was the filter's name before entries were labelled ``model_name`` (vLLM's label); still accepted.
FILTER_ALIASES = {"model": "model_name"}
_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}
HEARTBEAT_S = 15.0


def _error(status: int, error_type: str, message: str) -> web.Response:
    return web.Response(status=status, content_type="application/json",
                        body=orjson.dumps({"status": "error", "errorType": error_type, "error": message}))


class BadParam(ValueError):
    pass


def _bool(request: web.Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return default
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise BadParam(f"invalid parameter {name!r}: expected true or false, got {raw!r}")


def _number(request: web.Request, name: str, lo: float, hi: float) -> float | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        v = float(raw)
    except ValueError:
        raise BadParam(f"invalid parameter {name!r}: cannot parse {raw!r} to a number") from None
    if not math.isfinite(v) or not lo <= v <= hi:
        raise BadParam(f"invalid parameter {name!r}: must be between {lo:g} and {hi:g}, got {raw!r}")
    return v


def _filters(request: web.Request) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in FILTERS:
        vals = request.query.getall(name, [])
        if any(v == "" for v in vals):
            raise BadParam(f"invalid parameter {name!r}: empty value")
        out[name] = vals
    for alias, name in FILTER_ALIASES.items():
        vals = request.query.getall(alias, [])
        if any(v == "" for v in vals):
            raise BadParam(f"invalid parameter {alias!r}: empty value")
        out[name] = out[name] + vals
    out["include_stale"] = _bool(request, "include_stale", True)
    try:
        out["tenant"] = request_tenant(request)
    except ParamError as e:
        raise BadParam(str(e)) from None
    return out


def _tenant_snapshot(snap: Any) -> Any:
    """What a tenant other than the default sees: the same shape with nothing in it."""
    from scheduler_metrics.congestion.tracker import CongestionSnapshot

    return CongestionSnapshot(0, time.time(), [], [], snap.model)


def setup(app: web.Application, ctx: ServerContext) -> None:
    tracker0 = ctx.components.get("congestion")
    if tracker0 is not None:  # wiring may have built ingest after the tracker: connect again (idempotent)
        tracker0.attach(ctx.components.get("ingest"), ctx.storage)

    def tracker_or_error() -> Any:
        return ctx.components.get("congestion")

    async def congestion(request: web.Request) -> web.StreamResponse:
        tracker = tracker_or_error()
        if tracker is None:
            return _error(503, "unavailable", "congestion tracker is not configured on this server")
        try:
            f = _filters(request)
        except BadParam as e:
            return _error(400, "bad_data", str(e))
        snap = tracker.snapshot()
        if f["tenant"] != DEFAULT_TENANT:
            snap = _tenant_snapshot(snap)
        body = snap.body_for(f["cluster"], f["model_name"], f["instance"], f["include_stale"])
        return web.Response(body=body, content_type="application/json")

    async def stream(request: web.Request) -> web.StreamResponse:
        tracker = tracker_or_error()
        if tracker is None:
            return _error(503, "unavailable", "congestion tracker is not configured on this server")
        try:
            f = _filters(request)
            interval = _number(request, "interval", 0.0, 3600.0) or 0.0
            limit_f = _number(request, "limit", 1, 1_000_000)
        except BadParam as e:
            return _error(400, "bad_data", str(e))
        if limit_f is not None and limit_f != int(limit_f):
            return _error(400, "bad_data", f"invalid parameter 'limit': must be an integer, got {limit_f:g}")
        limit = int(limit_f) if limit_f is not None else None
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def on_snapshot(_: Any) -> None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # loop closed during shutdown
                pass

        own = f["tenant"] == DEFAULT_TENANT
        unsubscribe = tracker.subscribe(on_snapshot) if own else (lambda: None)
        sent = 0
        last_version = -1
        try:
            await resp.write(b"retry: 1000\n\n")
            while True:
                wake.clear()
                snap = tracker.snapshot() if own else _tenant_snapshot(tracker.snapshot())
                if snap.version != last_version:
                    last_version = snap.version
                    data = snap.filtered(f["cluster"], f["model_name"], f["instance"], f["include_stale"])
                    await resp.write(b"event: congestion\nid: %d\ndata: %s\n\n" % (snap.version, orjson.dumps(data)))
                    sent += 1
                    if limit is not None and sent >= limit:
                        break
                    if interval > 0:
                        await asyncio.sleep(interval)
                        continue
                try:
                    await asyncio.wait_for(wake.wait(), timeout=HEARTBEAT_S)
                except asyncio.TimeoutError:
                    await resp.write(b": keepalive\n\n")
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            unsubscribe()
        try:
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        return resp

    app.router.add_get("/api/v1/congestion", congestion)
    app.router.add_get("/api/v1/congestion/stream", stream)
