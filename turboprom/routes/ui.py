"""The built-in web page: one static single-page app (turboprom/web/, no build step) served at
Prometheus's UI paths and TurboProm's own views. Every page reads the public HTTP API; the only
extra endpoint is the PromQL function list for autocomplete, taken from the engine's function table.
"""
from __future__ import annotations

from pathlib import Path

from aiohttp import web

import turboprom
from promql.functions import load_all
from turboprom.context import ServerContext

WEB = Path(__file__).resolve().parent.parent / "web"

# Prometheus's UI paths, then TurboProm's own views; each is a view of the same page.
PAGES = ("/graph", "/alerts", "/rules", "/targets", "/service-discovery", "/tsdb-status", "/flags", "/config", "/status",
         "/planner", "/query-log", "/cost", "/cardinality", "/congestion", "/audit")


def setup(app: web.Application, ctx: ServerContext) -> None:
    html = (WEB / "index.html").read_text().replace("{{VERSION}}", turboprom.__version__)
    functions = sorted(load_all())

    async def page(_: web.Request) -> web.Response:
        return web.Response(text=html, content_type="text/html", headers={"Cache-Control": "no-cache"})

    async def promql_functions(_: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": functions})

    for path in PAGES:
        app.router.add_get(path, page)
    app.router.add_get("/ui/promql-functions", promql_functions)
    app.router.add_static("/static", WEB, show_index=False)
