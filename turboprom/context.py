"""The wired-together server: one object the route modules receive.

``Components`` names every part wiring (turboprom/wiring.py, the cluster roles, the server's auth)
builds, typed; a part a configuration leaves out is None. Routes read it and never build parts
themselves. Its field order is the start order (stop runs in reverse): the cluster's state first,
then ingest and its sinks, the engines, the planner, rules and the control plane.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from turboprom.config import ServerConfig

if TYPE_CHECKING:
    from ingest.exemplars import ExemplarStore
    from ingest.metadata_store import MetadataStore
    from ingest.pipeline import IngestPipeline
    from ingest.scrape.manager import ScrapeManager
    from planner.planned_engine import PlannedEngine
    from planner.rules import RuleManager
    from promql.engine import Engine
    from scheduler_metrics.congestion import CongestionTracker
    from storage.block import UnreadableBlock
    from turboprom.alert_notifier import Notifier
    from turboprom.auth import Authenticator
    from turboprom.limits import Limits
    from turboprom.tenancy import TenantEngines, TenantView


@dataclass
class Components:
    # cluster roles (turboprom/cluster/roles.py)
    cluster_view: Any = None  # querier: membership and partition owners, before any query
    fanout_storage: Any = None  # querier: storage reading partitions from the ingesters
    log_publisher: Any = None  # distributor: the ingest log (NATS JetStream) it writes to
    # the embedded TSDB's blocks skipped at start-up (cluster roles keep no blocks of their own here);
    # queries whose range overlaps one get a warning
    unreadable_blocks: list[UnreadableBlock] = field(default_factory=list)
    # ingest and its sinks
    metadata: MetadataStore | None = None
    exemplars: ExemplarStore | None = None
    ingest: IngestPipeline | None = None
    scraper: ScrapeManager | None = None
    congestion: CongestionTracker | None = None
    congestion_feed: Any = None  # querier: turboprom.cluster.congestion_feed.CongestionFeed (signals from the ingesters)
    congestion_poll_server: Any = None  # turboprom.congestion_poll_server.CongestionPollServer
    prefix_index: Any = None  # scheduler_metrics.congestion.prefix_index.PrefixIndex
    kv_events: Any = None  # ingest.kv_events.KVEventSubscriber
    fast_scrape: Any = None  # ingest.scrape.fast.FastScrape
    # queries
    engine: Engine | None = None  # the raw engine over the default tenant's view
    query_log: Any = None  # planner.query_log.QueryLog
    summarizer: Any = None  # planner.summarizer.Summarizer
    planner: Any = None  # planner.planner.Planner
    planner_canary: Any = None  # planner.canary.Canary
    planned_engine: PlannedEngine | None = None  # the default tenant's engine when the planner runs
    notifier: Notifier | None = None
    default_view: TenantView | None = None
    rules: RuleManager | None = None
    tenant_engines: TenantEngines | None = None
    limits: Limits | None = None
    kedgeflow: Any = None  # turboprom.kedgeflow_wiring's service
    # cluster ingester
    partition_ingester: Any = None  # turboprom.cluster.ingester.PartitionIngester
    membership: Any = None  # turboprom.cluster.membership.Membership
    auth: Authenticator | None = None

    @property
    def query_engine(self) -> Any:
        """The default tenant's engine: the planner's (logs every query, honours ``exact``) or the raw one."""
        return self.planned_engine if self.planned_engine is not None else self.engine

    def in_start_order(self) -> list[Any]:
        """The parts that are present, in start order."""
        return [v for v in (getattr(self, f.name) for f in fields(self)) if v is not None]


@dataclass
class ServerContext:
    config: ServerConfig
    storage: Any  # storage.tsdb.TSDB (or a cluster role's storage)
    started_at: float = field(default_factory=time.time)
    # Heavy work (queries, block writes) runs here, never on the event loop.
    executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(max_workers=4, thread_name_prefix="turboprom-work"))
    components: Components = field(default_factory=Components)
    ready: bool = False
    # (last reload attempt succeeded, time of the last successful load), for /api/v1/status/runtimeinfo
    config_reload: tuple[bool, float] | None = None
    reload_lock: asyncio.Lock | None = None
