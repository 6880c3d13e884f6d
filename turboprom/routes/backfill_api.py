"""POST /api/v1/admin/tsdb/import: history into blocks through a running server (``turboprom import --url``).

Admin API (``--web.enable-admin-api``), embedded single node only (``--role all``: a cluster ingester's
blocks must come from its log). Query parameters: ``format`` (openmetrics | prometheus | csv, as
``turboprom import --format``; default from Content-Type) and ``filename`` (how messages name the
file). The body is streamed to ``<data-dir>/import/`` (not held in memory, not bounded by the write
paths' body limits), then read and written by turboprom/history_import.py in a worker thread; the
written samples also go to the ingest sinks, so summaries fold them as they fold late samples.
Answers: 200 with ``{samples, series, duplicates, blocks, blockRangeMs}``, or 400 bad_data with the
one-line refusal (file:line, series, time, the window that applies); nothing is written then.
"""
from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

from aiohttp import web

from turboprom.api_common import api_handler, ok
from turboprom.api_errors import APIError, error_response
from turboprom.api_params import Params
from turboprom.context import ServerContext
from turboprom.history_import import CONTENT_TYPES, FORMATS, ImportRefused, import_file, result_json
from turboprom.routes.status_api import admin_enabled
from turboprom.tenancy import tenant_of

UPLOAD_DIR = "import"


def _format(params: Params, content_type: str) -> str:
    fmt = params.get("format")
    if fmt:
        if fmt not in FORMATS:
            raise APIError("bad_data", f"invalid format {fmt!r}: expected one of {', '.join(FORMATS)}")
        return fmt
    ct = content_type.split(";")[0].strip().lower()
    for name, known in CONTENT_TYPES.items():
        if ct == known:
            return name
    raise APIError("bad_data", f"cannot tell the import format from Content-Type {content_type!r}: pass format=openmetrics|prometheus|csv")


def setup(app: web.Application, ctx: ServerContext) -> None:
    from storage.tsdb import TSDB

    @api_handler
    async def import_history(request: web.Request, params: Params) -> web.StreamResponse:
        if not admin_enabled(ctx):
            return error_response("unavailable", "admin APIs disabled", 500)
        if ctx.config.cluster.role != "all" or not isinstance(ctx.storage, TSDB):
            raise APIError("bad_data", "history import needs the embedded store (--role all); in a cluster, write history "
                                       "through the distributors' write paths")
        try:
            tenant = tenant_of(request.headers)
        except ValueError as e:
            raise APIError("bad_data", str(e)) from None
        fmt = _format(params, request.headers.get("Content-Type", ""))
        name = os.path.basename(params.get("filename") or "upload")[:200] or "upload"
        loop = asyncio.get_running_loop()
        updir = Path(ctx.config.data_dir) / UPLOAD_DIR
        updir.mkdir(exist_ok=True)
        tmp = updir / f"{uuid.uuid4().hex}.part"
        try:
            with open(tmp, "wb") as f:
                while True:
                    chunk = await request.content.read(4 << 20)
                    if not chunk:
                        break
                    await loop.run_in_executor(ctx.executor, f.write, chunk)
            pipeline = ctx.components.ingest
            deliver = pipeline.deliver if pipeline is not None else None
            try:
                _, res = await loop.run_in_executor(
                    ctx.executor, lambda: import_file(ctx.storage, tmp, fmt, name=name, tenant=tenant, deliver=deliver))
            except ImportRefused as e:
                raise APIError("bad_data", str(e)) from None
        finally:
            tmp.unlink(missing_ok=True)
        return ok(result_json(res))

    for method in ("POST", "PUT"):
        app.router.add_route(method, "/api/v1/admin/tsdb/import", import_history)
