"""POST /api/v1/read: Prometheus remote read (snappy-compressed protobuf ``ReadRequest``).

Answers ``ReadResponse`` (SAMPLES: ``application/x-protobuf``, snappy) or, when the request lists
STREAMED_XOR_CHUNKS first among the types it accepts, streamed ``ChunkedReadResponse`` frames
(turboprom/remote_read.py). Each query selects ``start_timestamp_ms <= t <= end_timestamp_ms`` of
the series matching all its matchers (``=``, ``!=``, ``=~``, ``!~``, regexes through
storage/regex.py); hints are ignored. Stale markers and NaN payloads are returned bit-exactly.

Limits: the samples of one request may not pass the query max-samples setting (the tenant's
``limits.max_samples_per_query``, else ``--query.max-samples``): 400 ``exceeded sample limit (N)``
as Prometheus's ``--storage.remote.read-sample-limit`` (counted over the whole request, for both
response types, before anything is sent). A decoded request over the body limit is 413; the
tenant's ``max_concurrent_queries`` applies (429). Reads go through the caller's tenant view and
need the ``read`` role, exactly as ``/api/v1/series``. Decoding, selection and encoding run off the
event loop.
"""
from __future__ import annotations

from typing import Any

from aiohttp import web

from ingest.errors import IngestError
from ingest.snappy_block import compress, decompress
from storage.series_set import SeriesSet
from turboprom import remote_read as rr
from turboprom.api_errors import APIError, error_response
from turboprom.api_common import api_handler, run_off_loop, set_cors
from turboprom.api_params import Params
from turboprom.context import ServerContext
from turboprom.tenancy import tenant_storage


def _sample_limit(ctx: ServerContext, tenant: str) -> int:
    limits = ctx.components.limits
    v = limits.max_samples(tenant) if limits is not None else None
    return int(v or ctx.config.query_max_samples)


def _select_all(view: Any, queries: list[rr.ReadQuery], limit: int) -> list:
    out, total = [], 0
    for q in queries:
        ms = rr.visible_matchers(q.matchers)
        ss = SeriesSet.empty() if ms is None else view.select(ms, q.start_ms, q.end_ms)
        total += ss.num_samples
        if limit and total > limit:
            raise APIError("bad_data", f"exceeded sample limit ({limit})", 400)
        out.append(ss)
    return out


def setup(app: web.Application, ctx: ServerContext) -> None:

    @api_handler
    async def read(request: web.Request, params: Params) -> web.StreamResponse:
        view = tenant_storage(ctx, request)  # the caller's tenant only, as /api/v1/series
        body = await request.read()
        if not body:
            raise APIError("bad_data", "empty remote read request body (want a snappy-compressed prometheus.ReadRequest)")
        limit = _sample_limit(ctx, view.tenant)

        def decode() -> tuple[list[rr.ReadQuery], int]:
            raw = decompress(body, ctx.config.max_body_bytes)
            return rr.parse_request(raw)

        try:
            queries, rtype = await run_off_loop(ctx, decode)
        except IngestError as e:
            raise APIError("bad_data", e.message, e.status) from None
        except rr.ReadRequestError as e:
            raise APIError("bad_data", str(e)) from None

        async def serve() -> web.StreamResponse:
            if rtype == rr.SAMPLES:
                def job() -> bytes:
                    sets = _select_all(view, queries, limit)
                    return compress(rr.read_response_bytes([rr.query_result_bytes(ss) for ss in sets]))

                data = await run_off_loop(ctx, job)
                return web.Response(body=data, headers={"Content-Type": rr.SAMPLES_CONTENT_TYPE, "Content-Encoding": "snappy"})
            # Streamed: every query is selected (and the limit checked) before the first byte goes out,
            # so a refusal is still a proper error response.
            sets = await run_off_loop(ctx, _select_all, view, queries, limit)
            resp = web.StreamResponse(headers={"Content-Type": rr.STREAMED_CONTENT_TYPE})
            set_cors(request, resp)
            await resp.prepare(request)
            for i, ss in enumerate(sets):
                frames = await run_off_loop(ctx, lambda ss=ss, i=i: list(rr.chunked_frames(ss, i)))
                for f in frames:
                    await resp.write(f)
            await resp.write_eof()
            return resp

        limits = ctx.components.limits
        if limits is None:
            return await serve()
        from turboprom.limits import LimitExceeded

        try:
            async with limits.query_slot(view.tenant):
                return await serve()
        except LimitExceeded as e:
            resp = error_response("unavailable", str(e), e.status)
            resp.headers["Retry-After"] = str(e.retry_after_s)
            return resp

    app.router.add_post("/api/v1/read", read)
