"""Connects vLLM KV event publishers (``congestion.kv_events``) to the prefix index, the fast
signal scrape (``congestion.fast_scrape_jobs``) to the congestion tracker, and the tracker to the
poll endpoint's own process (``congestion.poll_listen``).

``ingest.kv_events`` decodes; ``scheduler_metrics.congestion.prefix_index`` keeps the view;
``kv_events_adapter`` applies the one to the other (neither stage imports the other).
"""
from __future__ import annotations

from typing import Any

from ingest.kv_events import KVEventEndpoint, KVEventSubscriber
from scheduler_metrics.congestion.prefix_index import PrefixIndex
from turboprom.congestion_poll_server import CongestionPollServer
from turboprom.context import ServerContext
from turboprom.kv_events_adapter import apply_batch


def build_fast_signals(ctx: ServerContext, tracker: Any) -> None:
    """``congestion_poll_server`` when ``poll_listen`` is set; ``prefix_index`` + ``kv_events`` when
    publishers are configured; ``fast_scrape`` when jobs are named. All start and stop with the
    server's other components."""
    cfg = tracker.config
    if cfg.poll_listen:
        from turboprom.auth import WebConfig, check_listen_guard

        sc = ctx.config
        web_cfg = WebConfig.load(sc.web_config_file) if sc.web_config_file else None
        # The poll port is held to the main port's rule: beyond loopback only with auth (or --insecure).
        check_listen_guard(cfg.poll_listen.rpartition(":")[0] or "127.0.0.1", web_cfg, sc.insecure)
        web = sc.raw.get("web")
        ctx.components.congestion_poll_server = CongestionPollServer(
            tracker, cfg.poll_listen, web_config_file=sc.web_config_file, auth_limits=sc.raw.get("auth"),
            web_timeouts=web if isinstance(web, dict) else None)
    if cfg.kv_events:
        index = PrefixIndex(cfg.kv_max_blocks_per_instance)
        endpoints = [KVEventEndpoint(**e) for e in cfg.kv_events]
        ctx.components.prefix_index = index
        ctx.components.kv_events = KVEventSubscriber(endpoints, lambda ep, b, missed: apply_batch(index, ep, b, missed))
    if cfg.fast_scrape_jobs and ctx.components.scraper is not None:
        from ingest.scrape.fast import FastScrape
        from scheduler_metrics.schema import SIGNAL_BY_SAMPLE_NAME

        ctx.components.fast_scrape = FastScrape(ctx.components.scraper, cfg.fast_scrape_jobs,
                                                   cfg.fast_scrape_interval_s, SIGNAL_BY_SAMPLE_NAME, tracker.consume_now)
