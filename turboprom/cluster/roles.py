"""``turboprom serve --role distributor|ingester|querier``: each role's context and routes, run by
the single node's own server (turboprom/server.py: auth, TLS, timeouts, signals, graceful stop)."""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

from turboprom.cluster.settings import ClusterSettings
from turboprom.config import ServerConfig
from turboprom.context import ServerContext


def node_id_of(settings: ClusterSettings, config: ServerConfig) -> str:
    return settings.node_id or "ingester-" + re.sub(r"[^A-Za-z0-9_-]", "-", advertise_url(settings, config).split("://", 1)[-1])


def advertise_url(settings: ClusterSettings, config: ServerConfig) -> str:
    return (settings.advertise_url or f"http://{config.listen}").rstrip("/")


DISTRIBUTOR_WORKERS = 32


def build_distributor(config: ServerConfig) -> ServerContext:
    """The write API over the ingest log: the single node's ingest pipeline, limits and tenancy, with
    the log publisher as its storage."""
    from ingest.metadata_store import MetadataStore
    from ingest.pipeline import IngestPipeline
    from turboprom.cluster.log_publisher import LogPublisher
    from turboprom.limits import Limits

    publisher = LogPublisher(config.cluster)
    # A write holds its worker thread until JetStream has acknowledged its group, and a group holds
    # only the writes waiting meanwhile: the pool bounds the group size, and with it the samples per
    # log message (each message costs ~0.75 ms of CPU across distributor, JetStream and ingesters,
    # docs/cluster.md "Sizing"). The threads mostly wait; decoding releases the GIL.
    ctx = ServerContext(config=config, storage=publisher,
                        executor=ThreadPoolExecutor(max_workers=DISTRIBUTOR_WORKERS, thread_name_prefix="turboprom-work"))
    ctx.components.log_publisher = publisher
    ctx.components.metadata = MetadataStore()
    ctx.components.ingest = IngestPipeline.from_config(publisher, config.raw, executor=ctx.executor, metadata=ctx.components.metadata)
    ctx.components.limits = Limits.from_config(config.raw.get("limits"))
    return ctx


def build_ingester(config: ServerConfig) -> ServerContext:
    """The single node's whole context (TSDB, ingest sinks, engine) fed from owned partitions."""
    from turboprom.cluster.ingester import PartitionIngester
    from turboprom.cluster.membership import Membership
    from turboprom.wiring import build_context

    s = config.cluster
    ctx = build_context(config)
    membership = Membership(s, node_id_of(s, config), advertise_url(s, config))
    ctx.components.partition_ingester = PartitionIngester(s, membership, ctx.components.ingest, ctx.executor,
                                                          config.data_dir, ctx.storage)
    ctx.components.membership = membership
    return ctx


def build_querier(config: ServerConfig) -> ServerContext:
    """The single node's whole query side over storage that reads partitions from the ingesters."""
    from planner.planner import PlannerConfig
    from turboprom.cluster.cluster_frontier import ClusterFrontier
    from turboprom.cluster.congestion_feed import CongestionFeed
    from turboprom.cluster.fanout_metadata import FanoutMetadata
    from turboprom.cluster.fanout_storage import FanoutStorage
    from turboprom.cluster.membership import ClusterView
    from turboprom.cluster.pushdown_hook import PushdownHook
    from turboprom.wiring import build_context

    # summaries are filled at ingest, which a querier never sees: no plans may serve answers here (step
    # answers stay on, below)
    planner = config.raw.get("planner") if isinstance(config.raw.get("planner"), dict) else {}
    config.raw = {**config.raw, "planner": {**planner, "enabled": False}}
    view = ClusterView(config.cluster)
    fanout = FanoutStorage(view, timeout_s=config.query_timeout_s + 5, client=config.cluster.internal_client)
    # mergeable aggregations are computed on the ingesters from their partitions (pushdown_hook.py);
    # refreshes reuse the steps they answered before, kept exact by the ingesters' write logs
    frontier = ClusterFrontier(fanout, PlannerConfig.from_raw(planner).seal_delay_ms)
    ctx = build_context(config, storage=fanout, node_hooks=(PushdownHook(fanout, config.cluster.pushdown),),
                        step_frontier=frontier)
    # started before everything else in the context (their fields come first): queries need the
    # cluster state first
    ctx.components.cluster_view = view
    ctx.components.fanout_storage = fanout
    ctx.components.metadata = FanoutMetadata(fanout)  # kept by the ingesters, which see the writes
    # the congestion API and KedgeFlow's policy: the tracker fed from the ingesters (build_context
    # attaches it to no ingest and gives it nothing to write its signals back to)
    ctx.components.congestion_feed = CongestionFeed(ctx.components.default_view.select, ctx.components.congestion)
    return ctx


async def serve_role(config: ServerConfig) -> None:
    from turboprom.server import serve

    role = config.cluster.role
    if role == "distributor":
        await serve(config, build=build_distributor, route_filter=lambda m: m in ("health", "ingest_api"))
    elif role == "ingester":
        from turboprom.cluster import read_api

        await serve(config, build=build_ingester, route_filter=lambda m: m != "ingest_api", extra_routes=[read_api.setup])
    elif role == "querier":
        await serve(config, build=build_querier, route_filter=lambda m: m != "ingest_api")
    else:
        await serve(config)
