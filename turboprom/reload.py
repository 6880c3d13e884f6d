"""Configuration reload: ``POST /-/reload`` (with ``--web.enable-lifecycle``) and SIGHUP, as Prometheus.

The config file and every rule file are read and checked first; a file with any problem is refused
whole (the running config stays, the error is logged, ``/-/reload`` answers 500 with it). A valid
config is then applied to:

- ``scrape_configs`` (and ``global`` scrape defaults, ``self_scrape``): jobs added, removed, changed;
- ``rule_files`` (and ``global.evaluation_interval``): groups replaced; unchanged rules keep their state;
- ``alerting`` and ``global.external_labels``: Alertmanagers and alert relabeling replaced (queued alerts stay);
- ``limits``: the new values apply from the next request; what the old limits counted (active series,
  running queries, rate buckets) carries over, and remote write re-checks every series once;
- ``planner`` settings read at each use (``PLANNER_RELOADABLE``): ``approximate`` and the per-tenant
  ``tenants.*.approximate``, ``min_count``, ``retire_after``, ``budget``, ``history``, ``max_history``,
  ``background_backfill``, ``summary_cost_prior``; ``pinned``: new pins adopted, removed pins become ordinary plans
  (retired when unused);
- the document ``/api/v1/status/config`` shows.

Everything else needs a restart: the listen address, data dir and storage flags, web/auth settings,
ingest, congestion, kedgeflow and the planner settings that shape built structures (``enabled``,
``pane``, ``period``, ``seal_delay``, ``canary_fraction``, ``cost_based``, ``step_cache_bytes``, ...);
the server logs which changed without effect. ``prometheus_config_last_reload_successful`` and
``prometheus_config_last_reload_success_timestamp_seconds`` in ``/metrics`` report the outcome.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from prometheus_client import Gauge

from turboprom.config import ConfigError, load_config_file
from turboprom.context import ServerContext

log = logging.getLogger("turboprom")

RELOAD_OK = Gauge("prometheus_config_last_reload_successful", "Whether the last configuration reload attempt was successful.")
RELOAD_TS = Gauge("prometheus_config_last_reload_success_timestamp_seconds",
                  "Timestamp of the last successful configuration reload.")

# Sections a reload applies; any other change is logged as needing a restart.
APPLIED = ("global", "scrape_configs", "self_scrape", "rule_files", "alerting", "limits")
# planner: YAML keys a reload applies -> PlannerConfig fields (each read where it is used, not built into
# a structure at start-up); "pinned" is applied by _apply_pins.
PLANNER_RELOADABLE = {"approximate": "approximate", "tenants": "tenant_approximate", "min_count": "min_count",
                      "retire_after": "retire_after_ms", "budget": "budget_bytes", "history": "history_ms",
                      "max_history": "max_history_ms", "background_backfill": "background_backfill",
                      "summary_cost_prior": "summary_cost_prior_s"}


def mark_loaded(ctx: ServerContext) -> None:
    """The config the server started with counts as the first successful load (as in Prometheus).
    ``ctx.config_reload``: (last attempt succeeded, time of the last successful load), for
    /api/v1/status/runtimeinfo."""
    now = time.time()
    RELOAD_OK.set(1)
    RELOAD_TS.set(now)
    ctx.config_reload = (True, now)


def _mark_failed(ctx: ServerContext) -> None:
    RELOAD_OK.set(0)
    ctx.config_reload = (False, (ctx.config_reload or (True, ctx.started_at))[1])


def _lock(ctx: ServerContext) -> asyncio.Lock:
    lock = ctx.reload_lock
    if lock is None:
        lock = ctx.reload_lock = asyncio.Lock()
    return lock


async def reload_config(ctx: ServerContext) -> None:
    """Re-read and apply the config file; raises ConfigError (the old config stays) when it is invalid."""
    async with _lock(ctx):
        path = ctx.config.config_file
        try:
            if path:
                raw = await asyncio.get_running_loop().run_in_executor(ctx.executor, load_config_file, path)
                await _apply(ctx, raw)
        except Exception as e:  # noqa: BLE001 - any failure keeps the old config and is reported
            _mark_failed(ctx)
            msg = str(e) if isinstance(e, ConfigError) else f"{type(e).__name__}: {e}"
            log.error("error reloading configuration from %s (the previous configuration stays in effect): %s", path, msg)
            raise ConfigError(msg) from None
        mark_loaded(ctx)
        log.info("completed loading of configuration file %s", path)


async def _apply(ctx: ServerContext, raw: dict[str, Any]) -> None:
    from ingest.scrape.manager import configs_from_raw

    old = ctx.config.raw or {}
    cfg = ctx.config
    loop = asyncio.get_running_loop()
    rules_new = None
    if raw.get("rule_files") or ctx.components.rules is not None:
        from planner.rules import load_rule_files_from_config

        rules_new = await loop.run_in_executor(ctx.executor, load_rule_files_from_config, raw, cfg.config_file)
    from turboprom.alert_notifier import alerting_options, external_labels, parse_alerting

    notifier = ctx.components.notifier
    if notifier is not None:
        notifier.apply(parse_alerting(raw.get("alerting"), cfg.config_dir), external_labels(raw))
    scraper = ctx.components.scraper
    if scraper is not None:
        await scraper.apply(configs_from_raw(raw, self_url=cfg.listen, self_interval_s=cfg.self_scrape_interval_s,
                                             base_dir=cfg.config_dir))
    if rules_new is not None:
        mgr = ctx.components.rules
        if mgr is None:
            from turboprom.wiring import rule_manager

            mgr = ctx.components.rules = rule_manager(ctx, rules_new, False, raw)
            mgr.start()
        else:
            await loop.run_in_executor(ctx.executor, mgr.replace_groups, rules_new, alerting_options(cfg, raw))
    _apply_limits(ctx, raw)
    _apply_planner_settings(ctx, raw)
    _apply_pins(ctx, raw)
    for section in sorted(set(old) | set(raw)):
        if section not in APPLIED and section != "planner" and old.get(section) != raw.get(section):
            log.warning("config reload: section %r changed; it takes effect at the next restart", section)
    fixed = set(PLANNER_RELOADABLE) | {"pinned"}
    changed = sorted(k for k in set(old.get("planner") or {}) | set(raw.get("planner") or {})
                     if k not in fixed and (old.get("planner") or {}).get(k) != (raw.get("planner") or {}).get(k))
    if changed:
        log.warning("config reload: planner setting(s) %s changed; they take effect at the next restart", ", ".join(changed))
    cfg.raw = raw


def _apply_limits(ctx: ServerContext, raw: dict[str, Any]) -> None:
    from turboprom.limits import Limits

    old = ctx.components.limits
    if old is None or (ctx.config.raw or {}).get("limits") == raw.get("limits"):
        return
    new = Limits.from_config(raw.get("limits"))
    new.carry_state(old)
    ctx.components.limits = new  # readers take it per request; remote write re-admits series under it
    log.info("config reload: limits applied")


def _apply_planner_settings(ctx: ServerContext, raw: dict[str, Any]) -> None:
    planner = ctx.components.planner
    if planner is None:
        return
    from planner.planner import PlannerConfig

    new = PlannerConfig.from_raw(raw.get("planner"))
    moved = [f for f in PLANNER_RELOADABLE.values() if getattr(planner.config, f) != getattr(new, f)]
    for f in moved:
        setattr(planner.config, f, getattr(new, f))
    if moved:
        log.info("config reload: planner %s applied", ", ".join(moved))


def _apply_pins(ctx: ServerContext, raw: dict[str, Any]) -> None:
    planner = ctx.components.planner
    if planner is None:
        return
    from planner.planner import PlannerConfig, _dur
    from planner.sds import SDSSpec

    pinned = PlannerConfig.from_raw(raw.get("planner")).pinned
    if pinned == planner.config.pinned:
        return
    planner.config.pinned = pinned
    wanted = set()
    for p in pinned:
        d = dict(p)
        d.setdefault("pane_ms", _dur(d.pop("pane", None), planner.config.pane_ms))  # as Planner.pin_from_config
        try:
            wanted.add(SDSSpec.from_json(d).id)
        except Exception:  # noqa: BLE001 - pin_from_config reports it
            pass
    for sds in list(planner.sds.values()):
        if sds.pinned and sds.spec.id not in wanted:
            sds.pinned = False  # an ordinary plan from now on: retired when unused
    planner.pin_from_config()
