"""Slow-client limits of the HTTP server: header read timeout, body read deadline, idle timeout.

aiohttp has no read timeouts of its own (a connection that trickles its headers, or a body at
1 byte/s, is served for as long as the client likes). These are the equivalents of Go's
``http.Server`` ``ReadHeaderTimeout``, ``ReadTimeout`` (for the body) and ``IdleTimeout``:

- **header timeout**: a new connection, and a kept-alive one from the first byte of its next
  request, must deliver the complete request line and headers within ``read_header_timeout``; else
  the server answers ``408 Request Timeout`` and closes the connection.
- **body deadline**: a request body must be complete within ``read_body_timeout`` of its headers.
  A read that misses it raises ``BodyTimeout`` in the handler; the request is answered with 408
  (``errorType: bad_data``) and the connection is closed.
- **idle timeout**: a kept-alive connection with no request for ``idle_timeout`` is closed.

Server YAML, all optional (Prometheus duration strings or seconds)::

    web:
      read_header_timeout: 15s
      read_body_timeout: 60s
      idle_timeout: 120s
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from turboprom.api_errors import error_response
from turboprom.durations import parse_duration_ms

log = logging.getLogger("turboprom.http")

DEFAULT_READ_HEADER_TIMEOUT_S = 15.0
DEFAULT_READ_BODY_TIMEOUT_S = 60.0
DEFAULT_IDLE_TIMEOUT_S = 120.0

_408 = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


class BodyTimeout(asyncio.TimeoutError):
    """The request body was not received within the body read deadline."""


@dataclass(frozen=True)
class Timeouts:
    read_header_s: float = DEFAULT_READ_HEADER_TIMEOUT_S
    read_body_s: float = DEFAULT_READ_BODY_TIMEOUT_S
    idle_s: float = DEFAULT_IDLE_TIMEOUT_S

    @classmethod
    def from_config(cls, raw: dict[str, Any] | None) -> "Timeouts":
        web_cfg = (raw or {}).get("web") if isinstance(raw, dict) else None
        web_cfg = web_cfg if isinstance(web_cfg, dict) else {}

        def seconds(key: str, default: float) -> float:
            v = web_cfg.get(key)
            if v is None:
                return default
            try:
                s = float(v)  # plain seconds
            except (TypeError, ValueError):
                s = parse_duration_ms(str(v)) / 1000.0  # a Prometheus duration such as 15s or 1m
            if not (0 < s < 1e9):
                raise ValueError(f"web.{key} must be a positive duration, not {v!r}")
            return s

        return cls(seconds("read_header_timeout", DEFAULT_READ_HEADER_TIMEOUT_S),
                   seconds("read_body_timeout", DEFAULT_READ_BODY_TIMEOUT_S),
                   seconds("idle_timeout", DEFAULT_IDLE_TIMEOUT_S))


class GuardedRequestHandler(RequestHandler):
    """aiohttp's connection handler plus the header read timeout (the idle timeout is aiohttp's
    keep-alive timeout, set by ``GuardedAppRunner``)."""

    header_timeout_s: float = DEFAULT_READ_HEADER_TIMEOUT_S

    def __init__(self, *args: Any, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self._header_handle: asyncio.TimerHandle | None = None
        self._saw_bytes = False

    def _awaiting_request(self) -> bool:
        return not self._request_in_progress and not self._messages

    def _arm_header_timer(self) -> None:
        if self._header_handle is None:
            self._header_handle = self._loop.call_later(self.header_timeout_s, self._header_timeout)

    def cancel_header_timer(self) -> None:
        if self._header_handle is not None:
            self._header_handle.cancel()
            self._header_handle = None

    def _header_timeout(self) -> None:
        self._header_handle = None
        if self._force_close or self.transport is None or not self._awaiting_request():
            return
        if self._saw_bytes:  # a partial request: say why before closing (as a proxy would)
            try:
                self.transport.write(_408)
            except Exception:  # noqa: BLE001 - the connection is being dropped anyway
                pass
        log.debug("closing connection from %s: request headers not received within %.1fs",
                  self.transport.get_extra_info("peername"), self.header_timeout_s)
        self.force_close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_header_timer()  # a new connection must send its first request in time

    def connection_lost(self, exc: BaseException | None) -> None:
        self.cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        idle = self._awaiting_request()
        if data and idle:
            self._saw_bytes = True
            self._arm_header_timer()  # the first byte of the next request starts its header clock
        super().data_received(data)
        if self._messages:
            self.cancel_header_timer()
            self._saw_bytes = False


class _GuardedServer(Server):
    header_timeout_s: float = DEFAULT_READ_HEADER_TIMEOUT_S

    def __call__(self) -> RequestHandler:
        return GuardedRequestHandler(self, loop=self._loop, header_timeout_s=self.header_timeout_s, **self._kwargs)


class GuardedAppRunner(web.AppRunner):
    """``web.AppRunner`` whose connections have the header and idle timeouts of ``timeouts``."""

    def __init__(self, app: web.Application, timeouts: Timeouts, **kwargs: Any) -> None:
        kwargs.setdefault("keepalive_timeout", timeouts.idle_s)
        # After an early answer (e.g. 408, 413) an unread body is drained at most this long.
        kwargs.setdefault("lingering_time", min(10.0, timeouts.read_body_s))
        # Request bodies reach the handlers as sent: the ingest routes decode Content-Encoding (gzip,
        # snappy) themselves, with their decoded-size limits checked before inflating.
        kwargs.setdefault("auto_decompress", False)
        super().__init__(app, **kwargs)
        self.timeouts = timeouts

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = _GuardedServer
        server.header_timeout_s = self.timeouts.read_header_s  # type: ignore[attr-defined]
        return server


def body_deadline_middleware(timeouts: Timeouts) -> Callable:
    """Bounds how long a request's body may take to arrive. Applies to every route: a handler
    whose body read misses the deadline gets ``BodyTimeout`` from the read, and the client 408."""

    @web.middleware
    async def mw(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        proto = request.protocol
        if isinstance(proto, GuardedRequestHandler):
            proto.cancel_header_timer()
        payload = request.content
        if payload.is_eof():
            return await handler(request)
        fired = False

        def expire() -> None:
            nonlocal fired
            if not payload.is_eof():
                fired = True
                payload.set_exception(BodyTimeout(f"request body not received within {timeouts.read_body_s:g}s"))

        timer = asyncio.get_running_loop().call_later(timeouts.read_body_s, expire)
        try:
            resp = await handler(request)
        except BodyTimeout:
            resp = body_timeout_response(timeouts.read_body_s)
        finally:
            timer.cancel()
        if fired and resp.status >= 400 and not resp.prepared:
            # The handler failed because its body never arrived (whatever it made of that).
            return body_timeout_response(timeouts.read_body_s)
        return resp

    return mw


def body_timeout_response(seconds: float) -> web.Response:
    resp = error_response("bad_data", f"request body not received within {seconds:g}s (web.read_body_timeout): send the "
                          "body faster or in smaller requests", 408, {"Connection": "close"})
    resp.force_close()
    return resp
