"""/-/healthy, /-/ready, /-/reload and /metrics (our own metrics through prometheus-client).

``POST``/``PUT /-/reload`` re-reads the config and rule files (turboprom/reload.py) when the server
runs with ``--web.enable-lifecycle`` (or ``web.enable_lifecycle: true``); otherwise 403, with
Prometheus's texts. Unknown ``/api/v1/...`` paths answer 404 like Prometheus (not 405 because a
catch-all OPTIONS route exists for CORS).
"""
from __future__ import annotations

from typing import Awaitable, Callable

from aiohttp import web
from aiohttp.web_urldispatcher import MatchInfoError

from turboprom.config import ConfigError
from turboprom.context import ServerContext
from turboprom.self_metrics import exposition


def lifecycle_enabled(ctx: ServerContext) -> bool:
    web_cfg = ctx.config.raw.get("web") if isinstance(ctx.config.raw, dict) else None
    return bool(getattr(ctx.config, "enable_lifecycle", False)
                or (isinstance(web_cfg, dict) and web_cfg.get("enable_lifecycle") is True))


@web.middleware
async def api_not_found(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """An /api/v1 path no route serves: 404 ``404 page not found`` as Prometheus (Go's http.NotFound)."""
    mi = request.match_info
    if isinstance(mi, MatchInfoError) and mi.http_exception.status == 405 and request.path.startswith("/api/v1/") \
            and set(getattr(mi.http_exception, "allowed_methods", ())) <= {"OPTIONS"}:
        return web.Response(status=404, text="404 page not found\n", headers={"X-Content-Type-Options": "nosniff"})
    return await handler(request)


def setup(app: web.Application, ctx: ServerContext) -> None:
    async def healthy(_: web.Request) -> web.Response:
        return web.Response(text="TurboProm is Healthy.\n")

    async def ready(_: web.Request) -> web.Response:
        if not ctx.ready:
            return web.Response(status=503, text="Service Unavailable")
        return web.Response(text="TurboProm is Ready.\n")

    async def metrics(request: web.Request) -> web.Response:
        return exposition(request, ctx)  # every tenant's totals: operators only (turboprom/self_metrics.py)

    async def reload(_: web.Request) -> web.Response:
        if not lifecycle_enabled(ctx):
            return web.Response(status=403, text="Lifecycle API is not enabled.")
        from turboprom.reload import reload_config

        try:
            await reload_config(ctx)
        except ConfigError as e:
            return web.Response(status=500, text=f"failed to reload config: {e}\n")
        return web.Response(status=200)

    async def reload_get(_: web.Request) -> web.Response:
        return web.Response(status=405, text="Only POST or PUT requests allowed\n")

    for method in ("GET", "HEAD"):
        app.router.add_route(method, "/-/healthy", healthy)
        app.router.add_route(method, "/-/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/-/reload", reload)
    app.router.add_put("/-/reload", reload)
    app.router.add_get("/-/reload", reload_get)
    app.middlewares.append(api_not_found)
