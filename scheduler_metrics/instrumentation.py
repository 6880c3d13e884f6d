"""Exporting the scheduling schema from a worker, router or workflow scheduler (prometheus-client).

A serving worker does::

    m = WorkerMetrics(model_name="qwen2.5-7b", cluster="c1")
    m.serve(9400)                          # /metrics for a scraper, or
    m.push("http://turboprom:9090")        # POST /api/v1/import/prometheus (text exposition)
    m.set_queue(waiting=3, running=8)
    m.add_prompt_tokens(4096, cached=3072)

Each exporter owns a private ``CollectorRegistry`` so several simulated workers can live in one
process (tests, the trace-replay simulator). Family names, types, labels and buckets come from
``scheduler_metrics.schema.FAMILIES``; nothing is named twice.

Identity labels: ``cluster`` and ``model_name`` are always attached; ``instance`` only when given
(a pushing worker names itself; a scraped worker gets ``instance`` from the scraper, and exporting
it too would collide with the scrape's own label).
"""
from __future__ import annotations

import urllib.request
from typing import Any, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server
from prometheus_client import disable_created_metrics

from scheduler_metrics.schema import FAMILY_BY_NAME, MetricFamily

IMPORT_PATH = "/api/v1/import/prometheus"


class _Exporter:
    """Registers a subset of schema families with constant identity labels on a private registry."""

    FAMILY_NAMES: tuple[str, ...] = ()

    def __init__(self, identity: dict[str, str], registry: CollectorRegistry | None = None) -> None:
        # *_created samples double the series count for no scheduling value.
        disable_created_metrics()
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.identity = {k: v for k, v in identity.items() if v}
        self._metrics: dict[str, Any] = {}
        for name in self.FAMILY_NAMES:
            self._metrics[name] = self._make(FAMILY_BY_NAME[name])
        self._server: Any = None
        self._thread: Any = None

    def _make(self, fam: MetricFamily) -> Any:
        labelnames = [*self.identity.keys(), *fam.labels]
        kw: dict[str, Any] = {"registry": self.registry, "labelnames": labelnames}
        if fam.type == "counter":
            return Counter(fam.name, fam.help, **kw)
        if fam.type == "gauge":
            return Gauge(fam.name, fam.help, **kw)
        if fam.type == "histogram":
            return Histogram(fam.name, fam.help, buckets=fam.buckets, **kw)
        raise ValueError(f"unsupported metric type {fam.type!r} for {fam.name}")

    def _child(self, name: str, **extra: str) -> Any:
        return self._metrics[name].labels(**self.identity, **extra)

    # --- delivery --------------------------------------------------------------------------------
    def exposition(self) -> bytes:
        """The Prometheus text exposition of every family this exporter owns."""
        return generate_latest(self.registry)

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve /metrics on ``addr:port`` in a daemon thread (port 0 picks a free port); returns the port."""
        self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        return int(self._server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def push(self, base_url: str, timeout: float = 5.0, extra_labels: dict[str, str] | None = None) -> int:
        """POST the exposition to ``base_url + /api/v1/import/prometheus`` (TurboProm or VictoriaMetrics).

        ``extra_labels`` are appended as ``extra_label=name=value`` query args (VictoriaMetrics style).
        Returns the HTTP status; raises ``urllib.error.HTTPError`` on a 4xx/5xx answer.
        """
        url = base_url.rstrip("/") + IMPORT_PATH
        if extra_labels:
            from urllib.parse import urlencode

            url += "?" + urlencode([("extra_label", f"{k}={v}") for k, v in extra_labels.items()])
        req = urllib.request.Request(url, data=self.exposition(), method="POST",
                                     headers={"Content-Type": "text/plain; version=0.0.4"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return int(r.status)


class WorkerMetrics(_Exporter):
    """A GPU serving worker: vLLM's own names plus what Vesta needs and vLLM lacks."""

    FAMILY_NAMES = (
        "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
        "vllm:num_preemptions", "vllm:request_success", "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds", "vllm:request_prompt_tokens",
        "turboprom_worker_prefill_backlog_tokens", "turboprom_worker_prefill_computed_tokens",
        "turboprom_worker_prefill_throughput_tokens_per_second", "turboprom_worker_prefill_capacity_tokens_per_second",
        "turboprom_worker_kv_held_tokens", "turboprom_worker_kv_held_sessions",
        "turboprom_worker_kv_transfer_bytes", "turboprom_worker_kv_writeback_bytes",
    )

    def __init__(self, model_name: str, cluster: str = "default", instance: str | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        super().__init__({"cluster": cluster, "model_name": model_name, "instance": instance or ""}, registry)
        # Touch the label-less children so every gauge/counter is exported (as 0) from the start.
        for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                     "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prefix_cache_queries",
                     "vllm:prefix_cache_hits", "vllm:num_preemptions", "turboprom_worker_prefill_backlog_tokens",
                     "turboprom_worker_prefill_computed_tokens"):
            self._child(name)

    # --- levels ------------------------------------------------------------------------------
    def set_queue(self, waiting: int, running: int) -> None:
        self._child("vllm:num_requests_waiting").set(waiting)
        self._child("vllm:num_requests_running").set(running)

    def set_kv_usage(self, fraction: float) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"kv usage must be a fraction in [0, 1], got {fraction}")
        self._child("vllm:kv_cache_usage_perc").set(fraction)

    def set_prefill_backlog(self, tokens: float) -> None:
        """Unfinished prefill tokens: queued prompts plus the unprefilled rest of running ones, cache hits excluded."""
        self._child("turboprom_worker_prefill_backlog_tokens").set(max(0.0, tokens))

    def set_prefill_throughput(self, tokens_per_second: float) -> None:
        self._child("turboprom_worker_prefill_throughput_tokens_per_second").set(tokens_per_second)

    def set_prefill_capacity(self, tokens_per_second: float) -> None:
        """Offline-calibrated peak prefill rate (from the worker's latency profile)."""
        self._child("turboprom_worker_prefill_capacity_tokens_per_second").set(tokens_per_second)

    def set_kv_held(self, length_bucket: str, tokens: float, sessions: int) -> None:
        self._child("turboprom_worker_kv_held_tokens", length_bucket=length_bucket).set(tokens)
        self._child("turboprom_worker_kv_held_sessions", length_bucket=length_bucket).set(sessions)

    # --- counters ----------------------------------------------------------------------------
    def add_prompt_tokens(self, tokens: int, cached: int = 0) -> None:
        """A prefill of ``tokens`` prompt tokens of which ``cached`` came from the prefix cache."""
        if tokens < 0 or not 0 <= cached <= tokens:
            raise ValueError(f"need 0 <= cached <= tokens, got tokens={tokens} cached={cached}")
        self._child("vllm:prompt_tokens").inc(tokens)
        self._child("vllm:prefix_cache_queries").inc(tokens)
        self._child("vllm:prefix_cache_hits").inc(cached)
        self._child("turboprom_worker_prefill_computed_tokens").inc(tokens - cached)

    def add_generation_tokens(self, tokens: int) -> None:
        self._child("vllm:generation_tokens").inc(tokens)

    def preempted(self, n: int = 1) -> None:
        self._child("vllm:num_preemptions").inc(n)

    def request_finished(self, finished_reason: str = "stop", *, prompt_tokens: int | None = None,
                         ttft_s: float | None = None, e2e_s: float | None = None, queue_s: float | None = None,
                         prefill_s: float | None = None, inter_token_s: Iterable[float] = ()) -> None:
        self._child("vllm:request_success", finished_reason=finished_reason).inc()
        if prompt_tokens is not None:
            self._child("vllm:request_prompt_tokens").observe(prompt_tokens)
        if ttft_s is not None:
            self._child("vllm:time_to_first_token_seconds").observe(ttft_s)
        if e2e_s is not None:
            self._child("vllm:e2e_request_latency_seconds").observe(e2e_s)
        if queue_s is not None:
            self._child("vllm:request_queue_time_seconds").observe(queue_s)
        if prefill_s is not None:
            self._child("vllm:request_prefill_time_seconds").observe(prefill_s)
        for itl in inter_token_s:
            self._child("vllm:inter_token_latency_seconds").observe(itl)

    def add_kv_transfer(self, nbytes: int, direction: str, reason: str = "prefix_fetch") -> None:
        if direction not in ("in", "out"):
            raise ValueError(f"direction must be 'in' or 'out', got {direction!r}")
        if reason not in KV_TRANSFER_REASONS:
            raise ValueError(f"reason must be one of {', '.join(KV_TRANSFER_REASONS)}, got {reason!r}")
        self._child("turboprom_worker_kv_transfer_bytes", direction=direction, reason=reason).inc(nbytes)

    def add_kv_writeback(self, nbytes: int, direction: str) -> None:
        if direction not in ("in", "out"):
            raise ValueError(f"direction must be 'in' or 'out', got {direction!r}")
        self._child("turboprom_worker_kv_writeback_bytes", direction=direction).inc(nbytes)


# why KV moved: a prefix fetched by a remote executor, a holder change on a length-bucket move, or a
# migration approved through KedgeFlow
KV_TRANSFER_REASONS = ("prefix_fetch", "bucket_migration", "approved_migration")
CONTROL_OUTCOMES = ("denied", "committed", "refused", "rejected_by_target", "uncertain", "failed", "error")


class SchedulerMetrics(_Exporter):
    """A request router (Vesta, SMetric, baselines): where each request went and what it cost."""

    FAMILY_NAMES = ("turboprom_scheduler_assignments", "turboprom_scheduler_congestion_penalty_seconds",
                    "turboprom_scheduler_control_actions")

    def __init__(self, scheduler: str, cluster: str = "default", instance: str | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        super().__init__({"cluster": cluster, "instance": instance or ""}, registry)
        self.scheduler = scheduler

    def assigned(self, holder: str, executor: str, penalty_s: float | None = None) -> None:
        self._child("turboprom_scheduler_assignments", scheduler=self.scheduler, holder=holder, executor=executor).inc()
        if penalty_s is not None:
            self._child("turboprom_scheduler_congestion_penalty_seconds", scheduler=self.scheduler).observe(penalty_s)

    def control_action(self, verb: str, outcome: str) -> None:
        """One action asked for through KedgeFlow and how it ended."""
        if outcome not in CONTROL_OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(CONTROL_OUTCOMES)}, got {outcome!r}")
        self._child("turboprom_scheduler_control_actions", scheduler=self.scheduler, verb=verb, outcome=outcome).inc()


class FlowMetrics(_Exporter):
    """An AgentWeave-style workflow scheduler: per-module queues, chunking, progress, round overhead."""

    FAMILY_NAMES = ("turboprom_flow_queue_depth", "turboprom_flow_chunk_size", "turboprom_flow_partial_progress_ratio",
                    "turboprom_flow_chunks_completed", "turboprom_flow_rounds", "turboprom_flow_round_overhead_seconds")

    def __init__(self, cluster: str = "default", instance: str | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        super().__init__({"cluster": cluster, "instance": instance or ""}, registry)

    def set_queue_depth(self, workflow: str, module: str, items: int) -> None:
        self._child("turboprom_flow_queue_depth", workflow=workflow, module=module).set(items)

    def set_chunk_size(self, workflow: str, module: str, items: int) -> None:
        self._child("turboprom_flow_chunk_size", workflow=workflow, module=module).set(items)

    def set_partial_progress(self, workflow: str, module: str, fraction: float) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"partial progress must be a fraction in [0, 1], got {fraction}")
        self._child("turboprom_flow_partial_progress_ratio", workflow=workflow, module=module).set(fraction)

    def chunk_completed(self, workflow: str, module: str, n: int = 1) -> None:
        self._child("turboprom_flow_chunks_completed", workflow=workflow, module=module).inc(n)

    def round_done(self, workflow: str, overhead_s: float) -> None:
        self._child("turboprom_flow_rounds", workflow=workflow).inc()
        self._child("turboprom_flow_round_overhead_seconds", workflow=workflow).observe(overhead_s)
