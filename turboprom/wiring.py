"""Builds the server's components from config. The only place stages meet.

Each stage adds its own block below the storage block (ingest pipeline, engine, scraper,
congestion tracker, planner, ...), storing it in its field of ``ctx.components``
(turboprom/context.py ``Components``). Keep each block small: construction and connection only;
behaviour lives in the stages.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from storage.tsdb import TSDB
from turboprom.config import ServerConfig
from turboprom.context import ServerContext

if TYPE_CHECKING:
    from planner.rules import RuleManager

log = logging.getLogger("turboprom")


def build_context(config: ServerConfig, storage: Any = None, node_hooks: tuple = (), step_frontier: Any = None) -> ServerContext:
    """``storage``: what the stages read and write (default: the embedded TSDB in the data dir; a
    cluster querier passes its fan-out storage); ``node_hooks``: every query engine's own hooks (a
    cluster querier's aggregation pushdown); ``step_frontier``: the write log reused step answers
    rely on when this process sees no writes (a cluster querier's, planner/stack.py)."""
    local = storage is None
    if local:
        storage = TSDB(config.data_dir, config.storage)
    ctx = ServerContext(config=config, storage=storage)
    if local:
        ctx.components.unreadable_blocks = storage.unreadable_blocks
    # --- stage wiring: add components below this line ---
    # --- ingest pipeline, metadata registry, scraper (self_scrape: true adds a job for this server) ---
    from ingest.metadata_store import MetadataStore
    from ingest.pipeline import IngestPipeline
    from ingest.scrape.groups import scrape_group_window_s
    from ingest.scrape.manager import ScrapeManager
    from ingest.validation import set_name_validation_scheme

    from ingest.exemplars import DEFAULT_MAX_EXEMPLARS, ExemplarStore

    set_name_validation_scheme(str((config.raw.get("global") or {}).get("metric_name_validation_scheme", "utf8")))
    ctx.components.metadata = MetadataStore()
    # Prometheus's config key: storage.exemplars.max_exemplars (0 disables exemplar storage).
    ex_cfg = ((config.raw.get("storage") or {}).get("exemplars") or {})
    ctx.components.exemplars = ExemplarStore(int(ex_cfg.get("max_exemplars", DEFAULT_MAX_EXEMPLARS)))
    ctx.components.ingest = IngestPipeline.from_config(storage, config.raw, executor=ctx.executor, metadata=ctx.components.metadata)
    ctx.components.scraper = ScrapeManager.from_config(config.raw, ctx.components.ingest.append_sync, ctx.executor,
                                                          self_url=config.listen, self_interval_s=config.self_scrape_interval_s,
                                                          group_window_s=scrape_group_window_s(config.raw),
                                                          base_dir=config.config_dir)
    ctx.components.scraper.exemplars = ctx.components.exemplars
    # --- congestion tracker (ingest sink; writes turboprom_congestion_* back through ingest) ---
    from scheduler_metrics.congestion import CongestionConfig, CongestionTracker

    congestion = CongestionTracker(CongestionConfig.from_mapping(config.raw.get("congestion")))
    if local:  # a process that stores what it ingests; a querier's tracker is fed from its ingesters
        congestion.attach(ctx.components.ingest, storage)
    ctx.components.congestion = congestion
    from turboprom.kv_events_wiring import build_fast_signals

    build_fast_signals(ctx, congestion)  # vLLM KV events -> prefix index; fast signal scrape -> tracker
    # --- PromQL engine behind /api/v1/query and /api/v1/query_range ---
    from promql.engine import Engine

    from turboprom.tenancy import DEFAULT_TENANT, TenantView

    default_view = TenantView(storage, DEFAULT_TENANT)  # the default tenant never sees tenant-labelled series
    ctx.components.engine = Engine(default_view, lookback_delta_ms=config.lookback_delta_ms,
                                      max_samples=config.query_max_samples, timeout_s=config.query_timeout_s,
                                      node_hooks=node_hooks)
    # --- planner (query log, SDS summarizer as ingest sink, rewrite onto summaries, rules) ---
    from planner.stack import build as build_planner

    plan = build_planner(default_view, ctx.components.engine, config.data_dir, config.raw.get("planner"),
                         step_frontier=step_frontier, late_window_ms=config.storage.out_of_order_window_ms)
    ctx.components.query_log = plan.query_log
    ctx.components.summarizer = plan.summarizer
    ctx.components.planner = plan.planner
    ctx.components.planner_canary = plan.canary
    if plan.engine is not None:
        ctx.components.planned_engine = plan.engine
    if ctx.components.ingest is not None:
        ctx.components.ingest.add_sink(plan.summarizer)
    # --- alert delivery to Alertmanager (alerting:), then the rules that feed it ---
    from turboprom.alert_notifier import Notifier, external_labels, parse_alerting

    ctx.components.notifier = Notifier(parse_alerting(config.raw.get("alerting"), config.config_dir),
                                          external_labels(config.raw), config.notification_queue_capacity)
    ctx.components.default_view = default_view
    if config.raw.get("rule_files"):
        from planner.rules import load_rule_files_from_config

        ctx.components.rules = rule_manager(ctx, load_rule_files_from_config(config.raw, config.config_file), True,
                                                config.raw)
    # --- multi-tenancy (X-Scope-OrgID): one raw engine per other tenant, logged to the query log ---
    from planner.planned_engine import PlannedEngine
    from turboprom.tenancy import TenantEngines, restrict_sinks

    def tenant_engine(view: TenantView) -> PlannedEngine:
        raw = Engine(view, lookback_delta_ms=config.lookback_delta_ms, max_samples=config.query_max_samples,
                     timeout_s=config.query_timeout_s, node_hooks=node_hooks)
        return PlannedEngine(raw, lambda node, ectx: None, query_log=ctx.components.query_log, planner=None)

    ctx.components.tenant_engines = TenantEngines(storage, tenant_engine)
    from turboprom.limits import Limits

    ctx.components.limits = Limits.from_config(config.raw.get("limits"))
    restrict_sinks(ctx.components.ingest)  # summaries and congestion signals: default tenant only
    # --- KedgeFlow control plane (grants, ledger, gateway, audit) ---
    from turboprom.kedgeflow_wiring import build_kedgeflow

    ctx.components.kedgeflow = build_kedgeflow(ctx)
    return ctx


def rule_manager(ctx: ServerContext, groups: list, restore: bool, raw: dict) -> "RuleManager":
    """The rule manager over the default tenant: results appended through ingest, alerts to the
    notifier, ``for`` state restored from storage when ``restore`` (start-up, not reload)."""
    from planner.rules import RuleManager
    from turboprom.alert_notifier import alerting_options

    append = ctx.components.ingest.append_sync if ctx.components.ingest is not None else ctx.storage.append
    engine = ctx.components.query_engine
    view = ctx.components.default_view
    return RuleManager(groups, engine, append, notify=ctx.components.notifier.send, select=view.select,
                       options=alerting_options(ctx.config, raw), restore=restore)


async def start_background(ctx: ServerContext) -> None:
    """Start background tasks (scraper, rule evaluation, compaction, ...). Called once the app runs."""
    for comp in ctx.components.in_start_order():
        start = getattr(comp, "start", None)
        if start is not None:
            res = start()
            if hasattr(res, "__await__"):
                await res


async def stop_background(ctx: ServerContext) -> None:
    for comp in reversed(ctx.components.in_start_order()):
        stop = getattr(comp, "stop", None)
        if stop is not None:
            try:
                res = stop()
                if hasattr(res, "__await__"):
                    await res
            except Exception:  # noqa: BLE001 - shutdown must go on
                log.exception("error stopping %r", comp)
