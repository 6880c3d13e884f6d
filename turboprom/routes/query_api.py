"""/api/v1/query, /api/v1/query_range, /api/v1/format_query, /api/v1/parse_query,
/api/v1/query_exemplars.

Evaluation and JSON encoding run on ``ctx.executor``; the event loop only parses parameters.
The engine is ``ctx.components.engine`` (``promql.engine.Engine``). When the planner registers
``ctx.components.planned_engine`` (the same interface, promql/query_opts.py: rewrites onto
summaries and logs queries), queries go there; ``exact=true`` is passed on to it and forces the raw
path; ``approx=true|false`` overrides the operator's ``planner.approximate`` for the request (a
Grafana datasource's custom query parameter can set it, so an exact and a fast datasource can sit
side by side).
"""
from __future__ import annotations

import asyncio
import json
import zlib
import threading
import time
from dataclasses import replace
from typing import Any

from aiohttp import web

from promql.ast_walk import walk
from promql.data_range import data_range
from promql.parser.durations import has_duration_expressions, resolve as resolve_durations
from promql.errors import PromQLError
from promql.eval_selectors import to_matchers
from promql.query_opts import QueryEngine, QueryOpts
from promql.types import QueryResult
from turboprom import api_json
from turboprom.api_ast import translate_ast
from turboprom.api_pretty import pretty
from turboprom.api_errors import APIError
from turboprom.api_common import (GZIP_MIN_BYTES, accepts_gzip, add_get_post, api_handler, encoded_response, gzip_body,
                                  json_response, ok, run_off_loop, set_cors)
from turboprom.api_params import MAX_RANGE_POINTS, MAX_TIME_MS, MIN_TIME_MS, Params, invalid_param
from turboprom.api_params import parse_query as parse_promql
from turboprom.context import ServerContext
from turboprom.self_metrics import CANCELED_BY_CLIENT, observe_query
from turboprom.tenancy import DEFAULT_TENANT, request_tenant


DISCONNECT_POLL_S = 0.1
STREAM_MIN_BYTES = 4 * 1024 * 1024  # answers above this are written piece by piece


def _now_ms() -> int:
    return int(time.time() * 1000)


def _max_depth(ctx: ServerContext) -> int:
    return ctx.config.query_max_depth


def _query_limits(ctx: ServerContext) -> dict[str, int]:
    """Engine limits from the server's flags (``--query.max-depth``, ``--query.max-memory``)."""
    return {"max_depth": _max_depth(ctx),
            "max_memory_bytes": ctx.config.query_max_memory_bytes}


def _parse_query(ctx: ServerContext, q: str, param_named: bool) -> Any:
    """The query's syntax tree. The parser keeps trees per text (promql/query_guard.py), so the
    engine does not parse the text again; the tree is shared and only read here. Parse errors are
    the caller's fault: bad_data, named after the ``query`` parameter for instant queries (Prometheus
    2.42 does not name it for range queries). Too deep expressions are refused by a scan of the text
    before the parser runs."""
    try:
        return parse_promql(q, _max_depth(ctx))
    except ValueError as e:
        raise (invalid_param("query", str(e)) if param_named else APIError("bad_data", str(e))) from None


def _warn_unreadable_blocks(ctx: ServerContext, res: QueryResult, expr: Any, start: int, end: int, step: int,
                            lookback: int | None) -> None:
    """A warning on the answer for each storage block skipped at start-up whose time range overlaps
    what the query reads: its samples are missing from the result."""
    skipped = ctx.components.unreadable_blocks
    if not skipped:
        return
    if has_duration_expressions(expr):  # such trees are never shared: fill in this query's values
        resolve_durations(expr, step, end - start)
    rng = data_range(expr, start, end, lookback if lookback and lookback > 0 else ctx.config.lookback_delta_ms)
    if rng is None:
        return
    for b in skipped:
        if b.overlaps(*rng):
            span = "unknown time range" if b.min_time is None else f"time range [{b.min_time}, {b.max_time}] ms"
            res.annotations.warn(f"results may be incomplete: storage block {b.name} ({span}) could not be read "
                                 f"at start-up and is skipped: {b.reason}")


def _pick_engine(ctx: ServerContext, tenant: str = DEFAULT_TENANT) -> QueryEngine:
    """The default tenant's engine (the planner's, which logs every query and honours
    ``QueryOpts.exact`` itself), or the caller's tenant's."""
    if tenant != DEFAULT_TENANT:
        engines = ctx.components.tenant_engines
        if engines is None:
            raise APIError("unavailable", "multi-tenancy is not enabled on this server")
        return engines.get(tenant)
    engine = ctx.components.query_engine
    if engine is None:
        raise APIError("unavailable", "query engine is not available")
    return engine


def _check_limits(ctx: ServerContext, q: str, tenant: str) -> Any:
    """Query length limit (400); returns the limits object (or None) for samples and concurrency."""
    limits = ctx.components.limits
    if limits is not None:
        from turboprom.limits import LimitExceeded

        try:
            limits.check_query(q, tenant)
        except LimitExceeded as e:
            raise APIError("bad_data", str(e), e.status) from None
    return limits


def _query_opts(ctx: ServerContext, limits: Any, tenant: str, params: Params, lookback: int | None) -> QueryOpts:
    """The request's options for the engine (parsed on the event loop; the timeout and the cancel
    event are added when evaluation starts): its flags, the tenant's sample limit, the server's depth
    and memory limits."""
    max_samples = limits.max_samples(tenant) if limits is not None else None
    return QueryOpts(lookback_delta_ms=lookback, max_samples=max_samples or None, tenant=tenant,
                     exact=bool(params.boolean("exact")),
                     approx=params.boolean("approx"),  # None: the operator's planner.approximate for the tenant
                     **_query_limits(ctx))


async def _limited_evaluate(limits: Any, tenant: str, request: web.Request, ctx: ServerContext, params: Params,
                            timeout_s: float, run: Any) -> web.Response:
    """Per-tenant concurrent-query limit around evaluation (429 when exceeded)."""
    if limits is None:
        return await _evaluate(request, ctx, params, timeout_s, run)
    from turboprom.limits import LimitExceeded

    try:
        async with limits.query_slot(tenant):
            return await _evaluate(request, ctx, params, timeout_s, run)
    except LimitExceeded as e:
        from turboprom.api_errors import error_response

        resp = error_response("unavailable", str(e), e.status)
        resp.headers["Retry-After"] = str(e.retry_after_s)
        return resp


def _effective_timeout(ctx: ServerContext, param_s: float | None) -> float:
    """The engine's configured timeout, shortened by a ``timeout`` parameter (a zero or
    negative one has already expired, as a Go context deadline would have)."""
    t = ctx.config.query_timeout_s
    if param_s is not None:
        t = min(t, param_s)
    return t


async def _evaluate(request: web.Request, ctx: ServerContext, params: Params, timeout_s: float, run: Any) -> web.Response:
    """Run ``run(cancel_event, remaining_timeout_s)`` -> QueryResult off the loop and encode it
    there too. The timeout is a deadline from arrival (queue wait included, as in Prometheus)."""
    limit = params.limit("limit")
    stats = params.get("stats")
    want_gzip = accepts_gzip(request)
    cancel = threading.Event()
    submitted = time.perf_counter()
    deadline = submitted + timeout_s

    def job() -> bytes:
        started = time.perf_counter()
        remaining = deadline - started
        if remaining <= 0:
            raise APIError("timeout", "query timed out in query execution")
        try:
            res = run(cancel, remaining)
        except PromQLError as e:
            raise APIError(e.error_type, str(e), e.http_status) from None
        if time.perf_counter() > deadline:
            raise APIError("timeout", "query timed out in expression evaluation")
        total = time.perf_counter() - submitted
        parts = api_json.encode_query_result_parts(
            res, limit=limit, stats=stats, queue_seconds=started - submitted, total_seconds=total
        )
        del res
        size = sum(len(p) for p in parts)
        if len(parts) > 1 and size <= STREAM_MIN_BYTES:  # small: one buffer, an ordinary response
            parts = [b"".join(parts)]
        if want_gzip and size >= GZIP_MIN_BYTES:
            if len(parts) == 1:
                return gzip_body(parts[0]), True
            c = zlib.compressobj(1, zlib.DEFLATED, 31)  # as gzip_body, piece by piece
            parts = [z for z in (c.compress(p) for p in parts) if z] + [c.flush()]
            return parts, True
        return (parts[0] if len(parts) == 1 else parts), False

    fut = asyncio.get_running_loop().run_in_executor(ctx.executor, job)
    # aiohttp does not cancel a handler when its client disconnects (handler_cancellation is off), so
    # a timer watches the connection: a client that went away (Grafana panel closed, curl ^C) stops
    # the engine at its next budget check instead of burning a worker thread until the timeout. A
    # timer, not a polling task: the answer is awaited directly, with no task or wait() of its own.
    watch = _DisconnectWatch(request, cancel)
    try:
        body, gzipped = await fut
    except BaseException:
        cancel.set()  # client went away or the server is stopping: let the engine stop early
        raise
    finally:
        watch.stop()
    if isinstance(body, bytes):
        return encoded_response(body, gzipped)
    return await _stream_parts(request, body, gzipped)


class _DisconnectWatch:
    """Every ``DISCONNECT_POLL_S`` while a query runs: if the client's connection is closing, set the
    query's cancel event (once) and count it."""

    __slots__ = ("request", "cancel", "handle")

    def __init__(self, request: web.Request, cancel: threading.Event):
        self.request, self.cancel = request, cancel
        self.handle: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(DISCONNECT_POLL_S, self._check)

    def _check(self) -> None:
        transport = self.request.transport
        if transport is None or transport.is_closing():
            self.handle = None
            self.cancel.set()
            CANCELED_BY_CLIENT.inc()
            return
        self.handle = asyncio.get_running_loop().call_later(DISCONNECT_POLL_S, self._check)

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


async def _stream_parts(request: web.Request, parts: list[bytes], gzipped: bool) -> web.StreamResponse:
    """A big answer written piece by piece: never joined into one buffer (each join or copy of a
    multi-hundred-megabyte body holds the GIL and stalls every other request)."""
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    resp.content_length = sum(len(p) for p in parts)
    if gzipped:
        resp.headers["Content-Encoding"] = "gzip"
        resp.headers["Vary"] = "Accept-Encoding"
    set_cors(request, resp)
    await resp.prepare(request)
    for p in parts:
        await resp.write(p)
    await resp.write_eof()
    return resp


def setup(app: web.Application, ctx: ServerContext) -> None:
    @api_handler
    async def query(request: web.Request, params: Params) -> web.Response:
        params.limit("limit")
        t = params.time("time", _now_ms())
        timeout = params.duration_seconds("timeout")
        lookback = _lookback(params)
        q = params.get("query")
        tenant = request_tenant(request)
        limits = _check_limits(ctx, q, tenant)  # length limit before parsing
        expr = _parse_query(ctx, q, True)
        opts = _query_opts(ctx, limits, tenant, params, lookback)
        engine = _pick_engine(ctx, tenant)
        timeout_s = _effective_timeout(ctx, timeout)

        def run(cancel: threading.Event, remaining: float) -> QueryResult:
            res = engine.instant_query(q, t, replace(opts, timeout_s=remaining, cancel=cancel))
            _warn_unreadable_blocks(ctx, res, expr, t, t, 0, lookback)
            return observe_query(res, "instant")

        return await _limited_evaluate(limits, tenant, request, ctx, params, timeout_s, run)

    @api_handler
    async def query_range(request: web.Request, params: Params) -> web.Response:
        params.limit("limit")
        start = params.required_time("start")
        end = params.required_time("end")
        if end < start:
            raise invalid_param("end", "end timestamp must not be before start time")
        step = params.duration("step")
        if step is None:
            step = _required_duration_error()
        if step <= 0:
            raise invalid_param("step", "zero or negative query resolution step widths are not accepted. Try a positive integer")
        if (end - start) // step > MAX_RANGE_POINTS:
            raise APIError(
                "bad_data",
                "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution (?step=XX)",
            )
        timeout = params.duration_seconds("timeout")
        lookback = _lookback(params)
        q = params.get("query")
        tenant = request_tenant(request)
        limits = _check_limits(ctx, q, tenant)  # length limit before parsing
        expr = _parse_query(ctx, q, False)
        opts = _query_opts(ctx, limits, tenant, params, lookback)
        engine = _pick_engine(ctx, tenant)
        timeout_s = _effective_timeout(ctx, timeout)

        def run(cancel: threading.Event, remaining: float) -> QueryResult:
            res = engine.range_query(q, start, end, step, replace(opts, timeout_s=remaining, cancel=cancel))
            _warn_unreadable_blocks(ctx, res, expr, start, end, step, lookback)
            return observe_query(res, "range")

        return await _limited_evaluate(limits, tenant, request, ctx, params, timeout_s, run)

    @api_handler
    async def format_query(request: web.Request, params: Params) -> web.Response:
        q = params.get("query")
        _check_limits(ctx, q, request_tenant(request))
        try:
            expr = parse_promql(q, _max_depth(ctx))
        except ValueError as e:
            raise invalid_param("query", str(e)) from None
        # the printer walks the whole tree: off the event loop (a deep tree takes a while)
        return ok(await run_off_loop(ctx, pretty, expr))

    @api_handler
    async def parse_query(request: web.Request, params: Params) -> web.Response:
        q = params.get("query")
        _check_limits(ctx, q, request_tenant(request))
        try:
            expr = parse_promql(q, _max_depth(ctx))
        except ValueError as e:
            raise invalid_param("query", str(e)) from None
        return json_response(await run_off_loop(ctx, _ast_json, expr))

    @api_handler
    async def query_exemplars(request: web.Request, params: Params) -> web.Response:
        start = params.time("start", MIN_TIME_MS)
        end = params.time("end", MAX_TIME_MS)
        if end < start:
            raise APIError("bad_data", "end timestamp must not be before start timestamp")
        q = params.get("query")
        _check_limits(ctx, q, request_tenant(request))
        try:
            expr = parse_promql(q, _max_depth(ctx))
        except ValueError as e:
            raise APIError("bad_data", str(e)) from None
        if not _has_selector(expr):
            return web.Response(status=204)  # Prometheus: nothing to select, no content
        try:
            matcher_sets = [ms for vs in _vector_selectors(expr) for ms in to_matchers(vs)]
        except PromQLError as e:
            raise APIError("bad_data", str(e)) from None
        store = ctx.components.exemplars
        if store is None:
            return ok([])
        tenant = request_tenant(request)
        found = await run_off_loop(ctx, lambda: store.query(tenant, matcher_sets, start, end))
        return ok([{"seriesLabels": dict(series),
                    "exemplars": [{"labels": dict(e.labels), "value": api_json.format_value(e.value),
                                   "timestamp": e.ts / 1000} for e in exs]} for series, exs in found])

    add_get_post(app, "/api/v1/query", query)
    add_get_post(app, "/api/v1/query_range", query_range)
    add_get_post(app, "/api/v1/format_query", format_query)
    add_get_post(app, "/api/v1/parse_query", parse_query)
    add_get_post(app, "/api/v1/query_exemplars", query_exemplars)


def _ast_json(expr: Any) -> bytes:
    """The /api/v1/parse_query body. orjson refuses nesting deeper than 254 levels; such trees (up to
    --query.max-depth) are encoded by the standard library instead."""
    data = translate_ast(expr)
    try:
        return api_json.success(data)
    except TypeError:  # orjson.JSONEncodeError: "Recursion limit reached"
        return api_json.envelope_raw(json.dumps(data, ensure_ascii=False, separators=(",", ":")))


def _vector_selectors(root: Any) -> list[Any]:
    """Vector selectors of a tree, left to right."""
    return [n for n in walk(root) if type(n).__name__ == "VectorSelector"]


def _has_selector(node: Any) -> bool:
    return bool(_vector_selectors(node))


def _lookback(params: Params) -> int | None:
    val = params.get("lookback_delta")
    if val == "":
        return None
    try:
        return params.duration("lookback_delta")
    except Exception as e:  # noqa: BLE001
        # Prometheus: "error parsing lookback delta duration: ..."
        msg = str(e).split(": ", 1)[-1]
        raise APIError("bad_data", f"error parsing lookback delta duration: {msg}") from None


def _required_duration_error() -> int:
    raise invalid_param("step", 'cannot parse "" to a valid duration')
