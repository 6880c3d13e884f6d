"""Ingest endpoints: POST /api/v1/write (remote write 1.0 and 2.0), POST /api/v1/import/prometheus,
POST /api/v1/otlp/v1/metrics (OTLP/HTTP metrics, protobuf or JSON; answers as OTLP/HTTP specifies:
200 with an ExportMetricsServiceResponse, partial_success when points were refused; errors carry a
google.rpc.Status in the request's encoding).

Decoding, validation and storage appends run in worker threads; this module only maps HTTP to
ingest/ and ingest errors to Prometheus-style answers:
  408 (body not received within web.read_body_timeout; nothing written),
  400 bad_data (malformed snappy/protobuf/text, invalid labels, samples too far in the future,
      storage rejections such as out-of-order: Prometheus's sender drops such batches instead of
      retrying), 413 (body or decoded body too large), 415 (unknown remote-write protobuf message),
  429 + Retry-After (ingest queue full: the sender backs off and retries), 204 on success.

Server YAML, all optional:
  ingest:
    max_queue: 64                 # received requests in flight (decode + append) before 429/503
    max_reading_bytes: 268435456  # bytes held by bodies still being received before 429/503
    overload_status: 429          # or 503 for Prometheus 2.x senders without retry_on_http_429
    max_body_bytes: 33554432      # compressed body limit (413); capped by the server's own limit
    max_decompressed_bytes: 67108864  # snappy/gzip decoded-size limit (413), checked before decoding
"""
from __future__ import annotations

import asyncio
import errno
import json
import os
import time

import numpy as np
from aiohttp import web

from ingest import metrics
from ingest.errors import IngestError, Overloaded
from ingest.otlp_config import OtlpSettings
from ingest.otlp_translate import OtlpTranslator
from ingest import otlp_wire
from ingest.remote_write import V1, V2, RemoteWriteDecoder
from ingest.snappy_block import decompress
from ingest.text_import import TextImporter, parse_extra_labels
from turboprom.tenancy import label_batch, tenant_of
from turboprom.api_errors import error_response
from turboprom.context import ServerContext
from turboprom.limits import SeriesAdmission
from turboprom.rejections import storage_problem
from turboprom.http_guard import BodyTimeout

V2_HEADERS = ("X-Prometheus-Remote-Write-Samples-Written", "X-Prometheus-Remote-Write-Histograms-Written",
              "X-Prometheus-Remote-Write-Exemplars-Written")


def _remote_write_proto(content_type: str) -> str | None:
    """Negotiated message from Content-Type; None when unsupported."""
    if not content_type:
        return V1
    parts = [p.strip() for p in content_type.split(";")]
    if parts[0].lower() not in ("application/x-protobuf", ""):
        return None
    proto = V1
    for p in parts[1:]:
        k, _, v = p.partition("=")
        if k.strip().lower() == "proto":
            proto = v.strip().strip('"')
    return proto if proto in (V1, V2) else None


def _parse_time_ms(text: str) -> int:
    """Unix seconds (float), unix milliseconds (integer > 1e11) or RFC 3339."""
    try:
        f = float(text)
    except ValueError:
        from datetime import datetime

        try:
            return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
        except ValueError:
            raise IngestError("bad_param", f"invalid timestamp parameter {text!r}") from None
    if abs(f) > 1e11 and float(text).is_integer():
        return int(f)
    return int(round(f * 1000))


def setup(app: web.Application, ctx: ServerContext) -> None:
    opts = ctx.config.storage
    ingest_cfg = ctx.config.raw.get("ingest", {}) if isinstance(ctx.config.raw.get("ingest"), dict) else {}
    max_body = min(int(ingest_cfg.get("max_body_bytes", ctx.config.max_body_bytes)), ctx.config.max_body_bytes)
    max_decoded = int(ingest_cfg.get("max_decompressed_bytes", 64 * 1024 * 1024))
    # 429 by default. Prometheus 2.x senders retry a 429 only with queue_config.retry_on_http_429: true
    # (otherwise they drop the batch) but always retry a 5xx: `overload_status: 503` suits them.
    overload_status = int(ingest_cfg.get("overload_status", 429))
    if overload_status not in (429, 503):
        raise ValueError(f"ingest.overload_status must be 429 or 503, not {overload_status}")
    pipeline = ctx.components.ingest
    if pipeline is None:  # a context without an ingest pipeline serves no write routes
        return
    decoder = RemoteWriteDecoder(future_tolerance_ms=opts.future_tolerance_ms)
    importer = TextImporter(future_tolerance_ms=opts.future_tolerance_ms)

    async def read_body(request: web.Request) -> bytes:
        """The whole body, before any ingest slot is taken: a slow upload holds no slot (the server's
        body deadline, web.read_body_timeout, cuts it off with 408). Bytes held by bodies still being
        received count against ingest.max_reading_bytes instead."""
        if request.content_length is not None and request.content_length > max_body:
            raise IngestError("too_large", f"request body of {request.content_length} bytes exceeds the limit of {max_body} bytes", status=413)
        if pipeline.overloaded():  # shed before spending bandwidth on a body that would wait for a slot
            raise Overloaded(f"ingest queue full ({pipeline.max_queue} batches in flight); retry later")
        buf = bytearray()
        held = 0
        try:
            while True:
                chunk = await request.content.readany()
                if not chunk:
                    break
                if len(buf) + len(chunk) > max_body:
                    raise IngestError("too_large", f"request body exceeds the limit of {max_body} bytes", status=413)
                pipeline.take_read_bytes(len(chunk))
                held += len(chunk)
                buf += chunk
            return bytes(buf)
        except BodyTimeout as e:
            raise IngestError("body_timeout", f"{e} (web.read_body_timeout): nothing from this request was written", status=408) from None
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            raise IngestError("client_disconnected", f"request body incomplete: {e}") from None
        finally:
            pipeline.give_read_bytes(held)

    def answer_error(protocol: str, e: IngestError) -> web.Response:
        status = overload_status if isinstance(e, Overloaded) else e.status
        metrics.REQUESTS.labels(protocol=protocol, code=str(status)).inc()
        metrics.reject(protocol, e.reason, e.samples)
        metrics.REJECTED_REQUESTS.labels(reason=e.reason, protocol=protocol).inc()
        if isinstance(e, Overloaded):
            return error_response("unavailable", e.message, overload_status, {"Retry-After": str(e.retry_after_s)})
        if e.status == 429:  # a tenant limit: retry later
            return error_response("unavailable", e.message, 429, {"Retry-After": "1"})
        return error_response("bad_data", e.message, e.status)

    def limited(batch, tenant: str):
        """Input and per-tenant limits (turboprom.limits) before anything is written."""
        lim = ctx.components.limits
        return lim.check_batch(batch, tenant) if lim is not None else batch

    def add_exemplars(protocol: str, tenant: str, exemplars: list) -> int:
        """Exemplars go to the in-memory exemplar store (ingest/exemplars.py) after their samples;
        refused ones (out of order, label set too long) are counted, not errors, as in Prometheus."""
        store = ctx.components.exemplars
        if not exemplars:
            return 0
        if store is None:
            metrics.EXEMPLARS_DROPPED.labels(protocol=protocol).inc(len(exemplars))
            return 0
        res = store.add(tenant, exemplars)
        if res.out_of_order or res.invalid:
            metrics.EXEMPLARS_DROPPED.labels(protocol=protocol).inc(res.out_of_order + res.invalid)
        return res.added + res.duplicates

    async def store_exemplars(protocol: str, tenant: str, exemplars: list) -> int:
        if not exemplars:
            return 0
        return await asyncio.get_running_loop().run_in_executor(ctx.executor, add_exemplars, protocol, tenant, exemplars)

    admissions: dict[str, SeriesAdmission] = {}

    def admission_for(tenant: str) -> SeriesAdmission:
        """One admission per tenant and Limits object (a reload's new Limits re-checks every series)."""
        lim = ctx.components.limits
        adm = admissions.get(tenant)
        if adm is None or adm.limits is not lim:
            adm = admissions[tenant] = SeriesAdmission(tenant, lim)
        return adm

    def answer_storage_error(protocol: str, e: OSError) -> web.Response:
        """Disk full (or another I/O failure) while writing the WAL: nothing of the request was
        acknowledged or applied; 503 + Retry-After so senders back off and retry."""
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS):
            raise e
        metrics.REQUESTS.labels(protocol=protocol, code="503").inc()
        metrics.REJECTED_REQUESTS.labels(reason="storage_unavailable", protocol=protocol).inc()
        return error_response("unavailable", f"storage unavailable: {e.strerror or os.strerror(e.errno)}; nothing from this "
                              "request was written, retry later", 503, {"Retry-After": "5"})

    async def write(request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        proto = _remote_write_proto(request.headers.get("Content-Type", ""))
        protocol = "remote_write_v2" if proto == V2 else "remote_write"
        if proto is None:
            metrics.REQUESTS.labels(protocol="remote_write", code="415").inc()
            return error_response("bad_data", f"unsupported remote write Content-Type {request.headers.get('Content-Type')!r}: "
                                              f"expected application/x-protobuf with proto={V1} or proto={V2}", 415)
        try:
            tenant = tenant_of(request.headers)
        except ValueError as e:
            return error_response("bad_data", str(e))
        enc = request.headers.get("Content-Encoding", "snappy").strip().lower()
        if enc not in ("snappy", ""):
            metrics.REQUESTS.labels(protocol=protocol, code="415").inc()
            return error_response("bad_data", f"unsupported Content-Encoding {enc!r}: remote write bodies must be snappy "
                                              "block-compressed", 415)
        try:
            body = await read_body(request)
            with pipeline.slot():

                def ingest():
                    """One worker-thread hop from the received body to the durable WAL: decode (the
                    compiled walk runs without the GIL), admission (tenant label and input limits once
                    per new series, rate and series limits per request), append, exemplars."""
                    raw = decompress(body, max_decoded)
                    adm = admission_for(tenant)
                    decoded = decoder.decode_v2(raw, tenant, adm) if proto == V2 else decoder.decode_v1(raw, tenant, adm)
                    result = pipeline.append_sync(decoded.batch)
                    return decoded, result, add_exemplars(protocol, tenant, decoded.exemplar_list)

                decoded, result, ex_written = await asyncio.get_running_loop().run_in_executor(ctx.executor, ingest)
        except IngestError as e:
            return answer_error(protocol, e)
        except OSError as e:
            return answer_storage_error(protocol, e)
        finally:
            metrics.REQUEST_SECONDS.labels(protocol=protocol).observe(time.perf_counter() - t0)
        metrics.SAMPLES.labels(protocol=protocol).inc(result.accepted)
        for reason, n in result.rejected.items():
            metrics.reject(protocol, reason, n)
        metrics.reject(protocol, "native_histogram_unsupported", decoded.histograms)
        headers = {}
        if proto == V2:
            headers = dict(zip(V2_HEADERS, (str(result.accepted + result.duplicates), "0", str(ex_written))))
        problems = []
        if result.rejected_total:
            problems.append(storage_problem(result, len(decoded.batch)))
        if decoded.histograms:
            problems.append(f"{decoded.histograms} native histogram samples refused: native histograms are not supported")
        if problems:
            metrics.REQUESTS.labels(protocol=protocol, code="400").inc()
            msg = f"partial write: {result.accepted} samples written; " + "; ".join(problems)
            return error_response("bad_data", msg, 400, headers)
        metrics.REQUESTS.labels(protocol=protocol, code="204").inc()
        return web.Response(status=204, headers=headers)

    async def import_prometheus(request: web.Request) -> web.Response:
        protocol = "import_prometheus"
        t0 = time.perf_counter()
        try:
            tenant = tenant_of(request.headers)
        except ValueError as e:
            return error_response("bad_data", str(e))
        try:
            extra = parse_extra_labels(request.query.getall("extra_label", []))
            ts_param = request.query.get("timestamp")
            default_ts = _parse_time_ms(ts_param) if ts_param else None
            ctype = request.headers.get("Content-Type", "").lower()
            openmetrics = True if "openmetrics" in ctype else None
            body = await read_body(request)
            with pipeline.slot():
                enc = request.headers.get("Content-Encoding", "").strip().lower()
                loop = asyncio.get_running_loop()

                def decode():
                    data = body
                    if enc == "gzip":
                        data = _gunzip(data, max_decoded)
                    elif enc == "snappy":
                        data = bytes(decompress(data, max_decoded))
                    elif enc not in ("", "identity"):
                        raise IngestError("bad_encoding", f"unsupported Content-Encoding {enc!r}", status=415)
                    # one hand-off from the request to the durable append: decode, admission (tenant
                    # label and input limits once per new series, rate and series limits per request), WAL
                    batch, exemplars = importer.decode(data, default_ts_ms=default_ts, extra_labels=extra,
                                                       openmetrics=openmetrics, tenant=tenant,
                                                       admission=admission_for(tenant))
                    return pipeline.append_sync(batch), exemplars, len(batch)

                result, exemplars, n_samples = await loop.run_in_executor(ctx.executor, decode)
                await store_exemplars(protocol, tenant, exemplars)
        except IngestError as e:
            return answer_error(protocol, e)
        except OSError as e:
            return answer_storage_error(protocol, e)
        finally:
            metrics.REQUEST_SECONDS.labels(protocol=protocol).observe(time.perf_counter() - t0)
        metrics.SAMPLES.labels(protocol=protocol).inc(result.accepted)
        for reason, n in result.rejected.items():
            metrics.reject(protocol, reason, n)
        if result.rejected_total:
            metrics.REQUESTS.labels(protocol=protocol, code="400").inc()
            return error_response("bad_data", f"partial import: {result.accepted} samples written; "
                                              f"{storage_problem(result, n_samples)}", 400)
        metrics.REQUESTS.labels(protocol=protocol, code="204").inc()
        return web.Response(status=204)

    otlp = OtlpTranslator(OtlpSettings.from_config(ctx.config.raw.get("otlp")), future_tolerance_ms=opts.future_tolerance_ms,
                          lookback_delta_ms=ctx.config.lookback_delta_ms)

    async def otlp_metrics(request: web.Request) -> web.Response:
        """OTLP/HTTP: 200 + ExportMetricsServiceResponse (partial_success names refused points); 400/413/415
        + google.rpc.Status; 429/503 + Retry-After (retryable, per the OTLP/HTTP specification)."""
        protocol = "otlp"
        t0 = time.perf_counter()
        kind = otlp_wire.content_kind(request.headers.get("Content-Type", ""))

        def fail(status: int, message: str, headers: dict | None = None) -> web.Response:
            k = kind or otlp_wire.JSON
            return web.Response(status=status, body=otlp_wire.status_body(k, status, message), content_type=k, headers=headers)

        if kind is None:
            metrics.REQUESTS.labels(protocol=protocol, code="415").inc()
            return fail(415, f"unsupported OTLP Content-Type {request.headers.get('Content-Type')!r}: "
                             f"expected {otlp_wire.PROTOBUF} or {otlp_wire.JSON}")
        try:
            tenant = tenant_of(request.headers)
        except ValueError as e:
            return fail(400, str(e))
        enc = request.headers.get("Content-Encoding", "").strip().lower()
        try:
            if enc not in ("", "identity", "gzip"):
                raise IngestError("bad_encoding", f"unsupported Content-Encoding {enc!r}: OTLP bodies may be gzip or uncompressed", status=415)
            body = await read_body(request)
            with pipeline.slot():
                loop = asyncio.get_running_loop()

                def decode():
                    data = _gunzip(body, max_decoded) if enc == "gzip" else body
                    if len(data) > max_decoded:
                        raise IngestError("too_large", f"decoded body exceeds the limit of {max_decoded} bytes", status=413)
                    return otlp.translate(otlp_wire.decode_request(data, kind), tenant)

                tr = await loop.run_in_executor(ctx.executor, decode)
                batch = await loop.run_in_executor(ctx.executor, lambda: limited(label_batch(tr.batch, tenant), tenant))
                result = await pipeline.submit(batch, reserved=True)
                await store_exemplars(protocol, tenant, tr.exemplars)
        except IngestError as e:
            resp = answer_error(protocol, e)
            return fail(resp.status, e.message, {k: v for k, v in resp.headers.items() if k == "Retry-After"})
        except OSError as e:
            resp = answer_storage_error(protocol, e)
            return fail(resp.status, json.loads(resp.body)["error"], {"Retry-After": resp.headers.get("Retry-After", "5")})
        finally:
            metrics.REQUEST_SECONDS.labels(protocol=protocol).observe(time.perf_counter() - t0)
        metrics.SAMPLES.labels(protocol=protocol).inc(result.accepted)
        for reason, n in result.rejected.items():
            metrics.reject(protocol, reason, n)
        problems = list(tr.problems)
        rejected = tr.rejected_points
        if result.rejected_total:
            problems.append(storage_problem(result, len(batch)))
            if result.accepted_mask is not None:
                lost = tr.sample_point[~result.accepted_mask]
                rejected += len(np.unique(lost[lost >= 0]))
        if rejected:
            metrics.reject(protocol, "otlp_points_refused", rejected)
        message = (f"{rejected} of {tr.points} data points refused; " if rejected else "") + "; ".join(problems)
        metrics.REQUESTS.labels(protocol=protocol, code="200").inc()
        return web.Response(status=200, body=otlp_wire.response_body(kind, rejected, message), content_type=kind)

    app.router.add_post("/api/v1/otlp/v1/metrics", otlp_metrics)
    app.router.add_post("/api/v1/write", write)
    app.router.add_post("/api/v1/import/prometheus", import_prometheus)


def _gunzip(data: bytes, max_bytes: int) -> bytes:
    import zlib

    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, max_bytes + 1)
    except zlib.error as e:
        raise IngestError("bad_gzip", f"gzip: corrupt input: {e}") from None
    if len(out) > max_bytes:
        raise IngestError("too_large", f"gzip: decoded body exceeds the limit of {max_bytes} bytes", status=413)
    return out
