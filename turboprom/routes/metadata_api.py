"""/api/v1/series, /api/v1/labels, /api/v1/label/<name>/values, /api/v1/metadata.

Storage lookups run on ``ctx.executor``. ``limit`` truncates like Prometheus 3 (with the warning
"results truncated due to limit"); Grafana's ``U__`` escaped label names are unescaped.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from storage.labels import Labels
from turboprom import api_json
from turboprom.tenancy import tenant_storage
from turboprom.api_errors import APIError
from turboprom.api_common import (GZIP_MIN_BYTES, accepts_gzip, add_get_post, api_handler, encoded_response, gzip_body,
                                  ok, run_off_loop)
from turboprom.api_params import MAX_TIME_MS, MIN_TIME_MS, Params, invalid_param, parse_matchers_param, unescape_label_name
from turboprom.context import ServerContext

TRUNCATED = "results truncated due to limit"


def _series_json(series: list[Labels]) -> str:
    return "[" + ",".join(api_json.labels_json(s) for s in series) + "]"


def metadata_snapshot(store: Any) -> dict[str, list[dict[str, str]]]:
    """Normalize the ingest metadata store (``ctx.components.metadata``) to
    ``{metric: [{"type", "help", "unit"}, ...]}``. Accepts a mapping or an object exposing
    ``snapshot()``/``all()``; entries may be ``MetricMetadata`` objects or dicts."""
    if store is None:
        return {}
    raw: Any = store
    for name in ("snapshot", "all", "as_dict"):
        fn = getattr(store, name, None)
        if callable(fn):
            raw = fn()
            break
    if not isinstance(raw, Mapping):
        # an iterable of MetricMetadata
        grouped: dict[str, list[Any]] = {}
        for md in raw or ():
            grouped.setdefault(getattr(md, "metric_family", ""), []).append(md)
        raw = grouped
    out: dict[str, list[dict[str, str]]] = {}
    for metric, entries in raw.items():
        if not isinstance(entries, (list, tuple, set)):
            entries = [entries]
        items: list[dict[str, str]] = []
        for e in entries:
            if isinstance(e, Mapping):
                d = {"type": str(e.get("type", "unknown")), "help": str(e.get("help", "")), "unit": str(e.get("unit", ""))}
            else:
                d = {"type": str(getattr(e, "type", "unknown")), "help": str(getattr(e, "help", "")), "unit": str(getattr(e, "unit", ""))}
            if d not in items:
                items.append(d)
        out[str(metric)] = items
    return out


def _family_visible(family: str, names: set[str]) -> bool:
    """A metric family is visible if one of its sample names is (x, x_total, x_bucket, x_count, ...)."""
    return any(family + sfx in names for sfx in ("", "_total", "_bucket", "_count", "_sum", "_created", "_info"))


def setup(app: web.Application, ctx: ServerContext) -> None:

    @api_handler
    async def series(request: web.Request, params: Params) -> web.Response:
        storage = tenant_storage(ctx, request)  # every read scoped to the caller's tenant
        matches = params.getall("match[]")
        if not matches:
            raise APIError("bad_data", "no match[] parameter provided")
        limit = params.limit("limit")
        start = params.time("start", MIN_TIME_MS)
        end = params.time("end", MAX_TIME_MS)
        try:
            sets = await run_off_loop(ctx, parse_matchers_param, matches)  # regexes compile off the loop
        except ValueError as e:
            raise invalid_param("match[]", str(e)) from None

        want_gzip = accepts_gzip(request)

        def job() -> tuple[bytes, bool]:
            found = list(storage.series(sets, start, end))
            warnings = []
            if limit and len(found) > limit:
                found = found[:limit]
                warnings.append(TRUNCATED)
            body = api_json.envelope_raw(_series_json(found), warnings, escaped=True)
            if want_gzip and len(body) >= GZIP_MIN_BYTES:
                return gzip_body(body), True
            return body, False

        return encoded_response(*await run_off_loop(ctx, job))

    @api_handler
    async def labels(request: web.Request, params: Params) -> web.Response:
        storage = tenant_storage(ctx, request)  # every read scoped to the caller's tenant
        limit = params.limit("limit")
        start = params.time("start", MIN_TIME_MS)
        end = params.time("end", MAX_TIME_MS)
        try:
            sets = await run_off_loop(ctx, parse_matchers_param, params.getall("match[]"))
        except ValueError as e:
            raise APIError("bad_data", str(e)) from None
        names = sorted(set(await run_off_loop(ctx, storage.label_names, start, end, sets)))
        warnings = []
        if limit and len(names) > limit:
            names = names[:limit]
            warnings.append(TRUNCATED)
        return ok(names, warnings)

    @api_handler
    async def label_values(request: web.Request, params: Params) -> web.Response:
        storage = tenant_storage(ctx, request)  # every read scoped to the caller's tenant
        name = unescape_label_name(request.match_info["name"])
        if name == "":
            raise APIError("bad_data", 'invalid label name: ""')
        limit = params.limit("limit")
        start = params.time("start", MIN_TIME_MS)
        end = params.time("end", MAX_TIME_MS)
        try:
            sets = await run_off_loop(ctx, parse_matchers_param, params.getall("match[]"))
        except ValueError as e:
            raise APIError("bad_data", str(e)) from None
        values = sorted(set(await run_off_loop(ctx, storage.label_values, name, start, end, sets)))
        warnings = []
        if limit and len(values) > limit:
            values = values[:limit]
            warnings.append(TRUNCATED)
        return ok(values, warnings)

    @api_handler
    async def metadata(request: web.Request, params: Params) -> web.Response:
        limit = _int_or_error(params, "limit")
        per_metric = _int_or_error(params, "limit_per_metric")
        metric = params.get("metric")
        store = ctx.components.metadata
        view = tenant_storage(ctx, request)
        tenant = view.tenant

        def build() -> dict[str, list[dict[str, str]]]:
            # Metadata is kept per tenant and metric family; a tenant sees only families it has series of.
            # Runs off the event loop: the store can hold hundreds of thousands of families.
            visible = set(view.label_values("__name__", MIN_TIME_MS, MAX_TIME_MS, []))
            if store is not None and hasattr(store, "get") and not isinstance(store, Mapping):
                got = store.get(metric or None, None, per_metric if per_metric > 0 else None, tenant=tenant)
                got = {k: v for k, v in got.items() if _family_visible(k, visible)}
                return dict(list(got.items())[:limit]) if limit >= 0 else got
            snap = {k: v for k, v in metadata_snapshot(store).items() if _family_visible(k, visible)}
            out: dict[str, list[dict[str, str]]] = {}
            for name in sorted(snap):
                if metric and name != metric:
                    continue
                if limit >= 0 and len(out) >= limit:
                    break
                entries = snap[name]
                out[name] = entries[:per_metric] if per_metric > 0 else entries
            return out

        return ok(await run_off_loop(ctx, build))

    add_get_post(app, "/api/v1/series", series)

    async def series_delete(request: web.Request) -> web.Response:
        # Prometheus has no DELETE on /api/v1/series: deleting series is the admin API's POST/PUT.
        from turboprom.api_errors import error_response

        resp = error_response("bad_data", "method DELETE is not allowed on /api/v1/series (allowed: GET, POST); delete series "
                              "with POST or PUT /api/v1/admin/tsdb/delete_series (needs --web.enable-admin-api)", 405)
        resp.headers["Allow"] = "GET, HEAD, POST"
        return resp

    # Registered on the same resource as GET/POST, so it answers before any later DELETE route.
    app.router.add_delete("/api/v1/series", series_delete)
    add_get_post(app, "/api/v1/labels", labels)
    app.router.add_get("/api/v1/label/{name}/values", label_values)
    app.router.add_get("/api/v1/metadata", metadata)


def _int_or_error(params: Params, name: str) -> int:
    s = params.get(name)
    if s == "":
        return -1
    try:
        return int(s)
    except ValueError:
        raise APIError("bad_data", f"{name} must be a number") from None
