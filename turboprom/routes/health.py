"""/-/healthy, /-/ready and /metrics (our own metrics through prometheus-client)."""
from __future__ import annotations

from aiohttp import web

from turboprom.context import ServerContext
from turboprom.self_metrics import exposition


def setup(app: web.Application, ctx: ServerContext) -> None:
    async def healthy(_: web.Request) -> web.Response:
        return web.Response(text="TurboProm is Healthy.\n")

    async def ready(_: web.Request) -> web.Response:
        if not ctx.ready:
            return web.Response(status=503, text="Service Unavailable")
        return web.Response(text="TurboProm is Ready.\n")

    async def metrics(request: web.Request) -> web.Response:
        return exposition(request, ctx)  # every tenant's totals: operators only (turboprom/self_metrics.py)

    for method in ("GET", "HEAD"):
        app.router.add_route(method, "/-/healthy", healthy)
        app.router.add_route(method, "/-/ready", ready)
    app.router.add_get("/metrics", metrics)
