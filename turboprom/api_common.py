"""Shared plumbing of the Prometheus API route modules: responses, errors, off-loop execution."""
from __future__ import annotations

import asyncio
import functools
import logging
import zlib
from typing import Any, Awaitable, Callable

from aiohttp import web

from turboprom import api_json
from turboprom.api_errors import JSON, APIError, error_response
from turboprom.api_params import Params
from turboprom.context import ServerContext

log = logging.getLogger("turboprom.api")

def json_response(body: bytes, status: int = 200) -> web.Response:
    # Exactly "application/json" like Prometheus (aiohttp's content_type= would add a charset).
    return web.Response(body=body, status=status, headers={"Content-Type": JSON})


GZIP_MIN_BYTES = 16 * 1024


def accepts_gzip(request: web.Request) -> bool:
    return "gzip" in request.headers.get("Accept-Encoding", "").lower()


def gzip_body(body: bytes) -> bytes:
    """gzip at level 1: large matrices compress ~10x and level 1 keeps the CPU cost low.
    (Prometheus compresses API responses too; call this off the event loop for big bodies.)"""
    c = zlib.compressobj(1, zlib.DEFLATED, 31)
    return c.compress(body) + c.flush()


def encoded_response(body: bytes, gzipped: bool) -> web.Response:
    resp = json_response(body)
    if gzipped:
        resp.headers["Content-Encoding"] = "gzip"
        resp.headers["Vary"] = "Accept-Encoding"
    return resp


# Prometheus's CORS answer for its default --web.cors.origin='.*' (only when Origin is sent).
CORS_HEADERS = {
    "Access-Control-Allow-Headers": "Accept, Authorization, Content-Type, Origin",
    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
    "Access-Control-Expose-Headers": "Date",
    "Vary": "Origin",
    "Access-Control-Allow-Origin": "*",
}


def set_cors(request: web.Request, response: web.StreamResponse) -> None:
    if request.headers.get("Origin"):
        response.headers.update(CORS_HEADERS)


def ok(data: Any, warnings: list[str] | None = None) -> web.Response:
    return json_response(api_json.success(data, warnings or ()))


Handler = Callable[[web.Request, Params], Awaitable[web.StreamResponse]]


def api_handler(fn: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Parse form params, map our error types onto Prometheus error responses."""

    @functools.wraps(fn)
    async def wrapper(request: web.Request) -> web.StreamResponse:
        try:
            params = await Params.from_request(request)
            resp = await fn(request, params)
        except APIError as e:  # ParamError included
            resp = error_response(e.error_type, e.message, e.status)
        except web.HTTPException:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - our fault: answer 500 like Prometheus's "internal"
            log.exception("internal error serving %s", request.path)
            resp = error_response("internal", f"{type(e).__name__}: {e}")
        set_cors(request, resp)
        return resp

    return wrapper


async def run_off_loop(ctx: ServerContext, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(ctx.executor, functools.partial(fn, *args, **kwargs))


def add_get_post(app: web.Application, path: str, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> None:
    app.router.add_get(path, handler)
    app.router.add_post(path, handler)
