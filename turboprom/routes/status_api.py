"""/api/v1/status/{buildinfo,runtimeinfo,flags,config,tsdb}, /api/v1/rules, /api/v1/alerts,
/api/v1/targets, /api/v1/alertmanagers and the admin endpoints (/api/v1/admin/tsdb/*).

Admin endpoints answer "admin APIs disabled" (errorType unavailable, HTTP 500 like Prometheus)
unless enabled, like Prometheus's ``--web.enable-admin-api``: ``ctx.config.enable_admin_api`` or
``web: {enable_admin_api: true}`` in the YAML config file.

Hooks other stages may provide (all optional):
* ``ctx.components.rules``: ``api_groups() -> list[dict]`` (Prometheus RuleGroup JSON shape)
  and ``api_alerts() -> list[dict]``.
* ``ctx.components.notifier``: ``alertmanagers_json()`` (turboprom/alert_notifier.py).
* ``ctx.components.scraper``: ``targets_snapshot()`` -> list of target dicts/dataclasses.
* ``ctx.storage.tsdb_status(matchers, limit)``: the ``status/tsdb`` data, in Prometheus's shape (storage/status.py).

Tenancy (turboprom/tenancy.py): ``status/tsdb`` is computed over the caller's tenant's series only;
rules, alerts, targets and scrape pools are the default tenant's (rule files and scrape jobs read and
write its data) and are empty for any other tenant; ``status/config`` names every tenant's limits and
targets and is for operators only (403 for a caller restricted to tenants).
"""
from __future__ import annotations

import dataclasses
import os
import platform
import sys
import threading
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import yaml
from aiohttp import web

import turboprom
from ingest.http_client_config import redact_secrets
from turboprom.api_errors import APIError, error_response
from turboprom.api_common import api_handler, ok, run_off_loop, set_cors
from turboprom.api_params import MAX_TIME_MS, MIN_TIME_MS, Params, invalid_param, parse_metric_selector
from turboprom.context import ServerContext
from turboprom.tenancy import forget_deleted_summaries, require_operator, sees_default_only_state, tenant_storage

# The Prometheus API level we implement; Grafana reads it to pick features.
PROMETHEUS_COMPAT_VERSION = "2.42.0"


def go_time(ts: float | None) -> str:
    """Go's time.Time JSON (RFC 3339 with nanoseconds, trailing zeros trimmed)."""
    if not ts:
        return "0001-01-01T00:00:00Z"
    dt = datetime.fromtimestamp(ts, tz=timezone.utc)
    base = dt.strftime("%Y-%m-%dT%H:%M:%S")
    frac = f"{dt.microsecond:06d}".rstrip("0")
    return base + ("." + frac if frac else "") + "Z"


def _duration_text(ms: int) -> str:
    """Prometheus model.Duration String(): largest units, e.g. 15d, 1h30m, 0s."""
    if ms == 0:
        return "0s"
    out = []
    for unit, size in (("y", 31_536_000_000), ("w", 604_800_000), ("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        if unit in ("y", "w") and ms % size:
            continue  # years and weeks only when exact (90d, not 12w6d)
        if ms >= size:
            out.append(f"{ms // size}{unit}")
            ms %= size
    return "".join(out)


def admin_enabled(ctx: ServerContext) -> bool:
    if getattr(ctx.config, "enable_admin_api", False):
        return True
    web_cfg = ctx.config.raw.get("web") if isinstance(ctx.config.raw, dict) else None
    return bool(isinstance(web_cfg, dict) and web_cfg.get("enable_admin_api"))


def _as_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    return obj


def _flags(ctx: ServerContext) -> dict[str, str]:
    c = ctx.config
    flags = {
        "config.file": c.config_file or "",
        "query.lookback-delta": _duration_text(c.lookback_delta_ms),
        "query.max-depth": str(c.query_max_depth),
        "query.max-memory": str(c.query_max_memory_bytes),
        "query.max-samples": str(c.query_max_samples),
        "query.timeout": _duration_text(int(c.query_timeout_s * 1000)),
        "storage.tsdb.path": c.data_dir,
        "storage.tsdb.retention.time": _duration_text(c.storage.retention_ms),
        "storage.tsdb.retention.size": str(c.storage.retention_bytes),
        "storage.tsdb.out-of-order-window": _duration_text(c.storage.out_of_order_window_ms),
        "storage.tsdb.wal-fsync": c.storage.wal_fsync,
        "web.enable-admin-api": "true" if admin_enabled(ctx) else "false",
        "web.enable-lifecycle": "true" if getattr(c, "enable_lifecycle", False) else "false",
        "web.listen-address": c.listen,
        "web.max-request-body-bytes": str(c.max_body_bytes),
    }
    return dict(sorted(flags.items()))


def _target_entry(t: Any) -> dict[str, Any]:
    d = _as_dict(t)
    if not isinstance(d, Mapping):
        d = {k: getattr(t, k) for k in dir(t) if not k.startswith("_") and not callable(getattr(t, k))}
    last = d.get("lastScrape", d.get("last_scrape"))
    if isinstance(last, (int, float)):
        last = go_time(last)
    labels = d.get("labels", {})
    if isinstance(labels, tuple):
        labels = dict(labels)
    disc = d.get("discoveredLabels", d.get("discovered_labels", labels))
    if isinstance(disc, tuple):
        disc = dict(disc)
    return {
        "discoveredLabels": disc,
        "labels": labels,
        "scrapePool": d.get("scrapePool", d.get("scrape_pool", d.get("job", ""))),
        "scrapeUrl": d.get("scrapeUrl", d.get("scrape_url", d.get("url", ""))),
        "globalUrl": d.get("globalUrl", d.get("global_url", d.get("scrapeUrl", d.get("scrape_url", d.get("url", ""))))),
        "lastError": d.get("lastError", d.get("last_error", "")) or "",
        "lastScrape": last or "0001-01-01T00:00:00Z",
        "lastScrapeDuration": float(d.get("lastScrapeDuration", d.get("last_scrape_duration", 0.0)) or 0.0),
        "health": d.get("health", "unknown"),
        "scrapeInterval": d.get("scrapeInterval", d.get("scrape_interval", "")),
        "scrapeTimeout": d.get("scrapeTimeout", d.get("scrape_timeout", "")),
    }


def setup(app: web.Application, ctx: ServerContext) -> None:
    @api_handler
    async def buildinfo(request: web.Request, params: Params) -> web.Response:
        return ok({
            "version": PROMETHEUS_COMPAT_VERSION,
            "revision": f"turboprom-{turboprom.__version__}",
            "branch": "turboprom",
            "buildUser": "turboprom",
            "buildDate": "",
            "goVersion": f"python{platform.python_version()}",
        })

    @api_handler
    async def runtimeinfo(request: web.Request, params: Params) -> web.Response:
        return ok({
            "startTime": go_time(ctx.started_at),
            "CWD": os.getcwd(),
            # (last reload succeeded, time of the last successful load): turboprom/reload.py
            "reloadConfigSuccess": (ctx.config_reload or (True, ctx.started_at))[0],
            "lastConfigTime": go_time((ctx.config_reload or (True, ctx.started_at))[1]),
            "corruptionCount": 0,
            "goroutineCount": threading.active_count(),
            "GOMAXPROCS": os.cpu_count() or 1,
            "GOMEMLIMIT": sys.maxsize,
            "GOGC": "",
            "GODEBUG": "",
            "storageRetention": _duration_text(ctx.config.storage.retention_ms),
        })

    @api_handler
    async def flags(request: web.Request, params: Params) -> web.Response:
        return ok(_flags(ctx))

    @api_handler
    async def config(request: web.Request, params: Params) -> web.Response:
        # The configuration names every tenant's limits and overrides, scrape targets and rule files:
        # only a caller who may act as any tenant reads it (403 otherwise).
        require_operator(request, ctx)
        raw = ctx.config.raw or {"global": {"scrape_interval": "1m", "scrape_timeout": "10s", "evaluation_interval": "1m"}}
        return ok({"yaml": yaml.safe_dump(redact_secrets(raw), sort_keys=False)})  # passwords, tokens: <secret>

    @api_handler
    async def tsdb(request: web.Request, params: Params) -> web.Response:
        limit = params.limit("limit") or 10
        return ok(await run_off_loop(ctx, tenant_storage(ctx, request).tsdb_status, limit))  # caller's tenant only

    @api_handler
    async def walreplay(request: web.Request, params: Params) -> web.Response:
        return ok({"min": 0, "max": 0, "current": 0})

    @api_handler
    async def rules(request: web.Request, params: Params) -> web.Response:
        typ = params.get("type").lower()
        if typ not in ("", "alert", "record"):
            raise invalid_param("type", f'not supported value "{typ}"')
        mgr = ctx.components.rules
        groups: list[dict[str, Any]] = []
        # Rule files are evaluated on the default tenant's data: another tenant has no rules.
        if mgr is not None and hasattr(mgr, "api_groups") and sees_default_only_state(request):
            groups = [dict(g) for g in await run_off_loop(ctx, mgr.api_groups)]
        want = {"alert": "alerting", "record": "recording"}.get(typ)
        if want:
            for g in groups:
                g["rules"] = [r for r in g.get("rules", []) if r.get("type") == want]
        return ok({"groups": groups})

    @api_handler
    async def alerts(request: web.Request, params: Params) -> web.Response:
        mgr = ctx.components.rules
        items: list[Any] = []
        if mgr is not None and hasattr(mgr, "api_alerts") and sees_default_only_state(request):
            items = list(await run_off_loop(ctx, mgr.api_alerts))
        return ok({"alerts": items})

    @api_handler
    async def targets(request: web.Request, params: Params) -> web.Response:
        state = params.get("state").lower()
        pool = params.get("scrapePool")
        # Scrape jobs write into the default tenant: another tenant has no targets.
        scraper = ctx.components.scraper if sees_default_only_state(request) else None
        active: list[dict[str, Any]] = []
        dropped: list[dict[str, Any]] = []
        if scraper is not None and hasattr(scraper, "targets_snapshot"):
            snap = await run_off_loop(ctx, scraper.targets_snapshot)
            if isinstance(snap, Mapping) and "activeTargets" in snap:
                snap = snap["activeTargets"]
            active = [_target_entry(t) for t in snap]
        if scraper is not None and hasattr(scraper, "dropped_targets_snapshot"):
            for d in await run_off_loop(ctx, scraper.dropped_targets_snapshot):
                d = _as_dict(d)
                dropped.append({"discoveredLabels": dict(d.get("discoveredLabels", d.get("discovered_labels", {})))})
        if pool:
            active = [t for t in active if t["scrapePool"] == pool]
            dropped = [t for t in dropped if t["discoveredLabels"].get("job") == pool]
        active.sort(key=lambda t: (t["scrapePool"], t["scrapeUrl"]))
        show_active = state in ("", "any", "active")
        show_dropped = state in ("", "any", "dropped")
        return ok({
            "activeTargets": active if show_active else [],
            "droppedTargets": dropped if show_dropped else [],
        })

    @api_handler
    async def scrape_pools(request: web.Request, params: Params) -> web.Response:
        scraper = ctx.components.scraper if sees_default_only_state(request) else None
        pools: list[str] = []
        if scraper is not None and hasattr(scraper, "scrape_pools"):
            pools = sorted(scraper.scrape_pools())
        return ok({"scrapePools": pools})

    @api_handler
    async def targets_metadata(request: web.Request, params: Params) -> web.Response:
        # Per-target metadata is not kept (ingest keeps one metadata registry per metric name).
        if params.get("limit") and not params.get("limit").lstrip("-").isdigit():
            raise APIError("bad_data", "limit must be a number")
        return ok([])

    @api_handler
    async def snapshot(request: web.Request, params: Params) -> web.StreamResponse:
        if not admin_enabled(ctx):
            return error_response("unavailable", "admin APIs disabled", 500)
        raise APIError("internal", "create snapshot: not supported by this storage (copy the data directory instead)")

    @api_handler
    async def alertmanagers(request: web.Request, params: Params) -> web.Response:
        # The Alertmanagers of alerting.alertmanagers (turboprom/alert_notifier.py); alerts come from
        # the default tenant's rules, so another tenant sees none.
        notifier = ctx.components.notifier
        if notifier is None or not sees_default_only_state(request):
            return ok({"activeAlertmanagers": [], "droppedAlertmanagers": []})
        return ok(notifier.alertmanagers_json())

    @api_handler
    async def delete_series(request: web.Request, params: Params) -> web.StreamResponse:
        if not admin_enabled(ctx):
            return error_response("unavailable", "admin APIs disabled", 500)
        matches = params.getall("match[]")
        if not matches:
            raise APIError("bad_data", "no match[] parameter provided")
        start = params.time("start", MIN_TIME_MS)
        end = params.time("end", MAX_TIME_MS)
        sets = []
        for m in matches:
            try:
                sets.extend(parse_metric_selector(m))
            except ValueError as e:
                raise invalid_param("match[]", str(e)) from None
        # Only the caller's tenant's series: the same selectors cannot reach another tenant's data.
        view = tenant_storage(ctx, request)
        await run_off_loop(ctx, view.delete_series, sets, start, end)
        await run_off_loop(ctx, forget_deleted_summaries, ctx, view.tenant, sets)  # Parquet drops: off the loop
        return web.Response(status=204)

    @api_handler
    async def clean_tombstones(request: web.Request, params: Params) -> web.StreamResponse:
        if not admin_enabled(ctx):
            return error_response("unavailable", "admin APIs disabled", 500)
        fn = getattr(ctx.storage, "clean_tombstones", None)
        if callable(fn):
            await run_off_loop(ctx, fn)
        return web.Response(status=204)

    async def root(request: web.Request) -> web.Response:
        # Like Prometheus: "/" redirects to the built-in page (clients probing "/" follow it to a 200).
        raise web.HTTPFound("/graph")

    async def options(request: web.Request) -> web.Response:
        resp = web.Response(status=204)
        set_cors(request, resp)
        return resp

    app.router.add_get("/", root)
    app.router.add_route("OPTIONS", "/api/v1/{path:.*}", options)
    app.router.add_get("/api/v1/status/buildinfo", buildinfo)
    app.router.add_get("/api/v1/status/runtimeinfo", runtimeinfo)
    app.router.add_get("/api/v1/status/flags", flags)
    app.router.add_get("/api/v1/status/config", config)
    app.router.add_get("/api/v1/status/tsdb", tsdb)
    app.router.add_get("/api/v1/status/walreplay", walreplay)
    app.router.add_get("/api/v1/rules", rules)
    app.router.add_get("/api/v1/alerts", alerts)
    app.router.add_get("/api/v1/targets", targets)
    app.router.add_get("/api/v1/scrape_pools", scrape_pools)
    app.router.add_get("/api/v1/targets/metadata", targets_metadata)
    app.router.add_get("/api/v1/alertmanagers", alertmanagers)
    for method in ("POST", "PUT"):
        app.router.add_route(method, "/api/v1/admin/tsdb/delete_series", delete_series)
        app.router.add_route(method, "/api/v1/admin/tsdb/clean_tombstones", clean_tombstones)
        app.router.add_route(method, "/api/v1/admin/tsdb/snapshot", snapshot)
