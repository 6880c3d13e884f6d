"""The built-in web page: expression browser with table and graph, planner and congestion views."""
from __future__ import annotations

from pathlib import Path

from aiohttp import web

from turboprom.context import ServerContext

WEB = Path(__file__).resolve().parent.parent / "web"


def setup(app: web.Application, ctx: ServerContext) -> None:
    async def page(_: web.Request) -> web.FileResponse:
        return web.FileResponse(WEB / "index.html", headers={"Cache-Control": "no-cache"})

    app.router.add_get("/graph", page)
    app.router.add_static("/static", WEB, show_index=False)
