"""The metric families instrumented GPU workers, routers and workflow schedulers export.

One table (``FAMILIES``) names every family: exposition name, type, labels, unit, meaning, who
reads it, and which congestion *signal* (if any) the tracker derives from it. vLLM's own names are
used where vLLM has the metric; SGLang / TGI / Dynamo equivalents are accepted through
``ALIASES`` (same signal, with a unit scale where needed). What Vesta and AgentWeave need and vLLM
lacks lives under the ``turboprom_`` namespace (``turboprom_worker_*`` on serving workers,
``turboprom_scheduler_*`` on routers, ``turboprom_flow_*`` on workflow schedulers).

docs/metrics.md is the human-readable form of this table; tests check that both agree.

Names here are *sample* names as they appear on the wire (counters carry ``_total``; a
histogram family ``x`` produces ``x_bucket``/``x_sum``/``x_count``).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Signal(str, Enum):
    """Per-instance quantities the congestion tracker keeps. Gauges hold levels, counters feed rates."""

    QUEUE_LENGTH = "queue_length"  # requests waiting (gauge)
    RUNNING = "running"  # requests in the running batch (gauge)
    KV_USAGE = "kv_usage"  # fraction of KV cache in use, 0..1 (gauge)
    BACKLOG_TOKENS = "backlog_tokens"  # unfinished prefill tokens (gauge)
    CAPACITY_TPS = "capacity_tps"  # offline-calibrated peak prefill tokens/s (gauge)
    PREFILL_TPS_GAUGE = "prefill_tps_gauge"  # engine-reported prefill throughput (gauge)
    PREFILL_COMPUTED = "prefill_computed"  # prefill tokens actually computed (counter)
    PROMPT_TOKENS = "prompt_tokens"  # prompt tokens admitted, cached ones included (counter)
    PREFIX_HITS = "prefix_hits"  # prompt tokens served from the prefix cache (counter)
    REQUESTS_DONE = "requests_done"  # finished requests (counter)
    GENERATION_TOKENS = "generation_tokens"  # decode tokens produced (counter)
    KV_HELD_TOKENS = "kv_held_tokens"  # KV tokens held for sessions (gauge, summed over buckets)
    LORA_INFO = "lora_info"  # vLLM's LoRA adapter info gauge: the labels carry the adapters, the value the update time


# How a signal combines several series of one instance (e.g. vLLM's per-engine series, per-bucket
# gauges, request_success_total{finished_reason}).
SIGNAL_COMBINE: dict[Signal, str] = {
    Signal.QUEUE_LENGTH: "sum",
    Signal.RUNNING: "sum",
    Signal.KV_USAGE: "mean",
    Signal.BACKLOG_TOKENS: "sum",
    Signal.CAPACITY_TPS: "sum",
    Signal.PREFILL_TPS_GAUGE: "sum",
    Signal.KV_HELD_TOKENS: "sum",
}
COUNTER_SIGNALS = frozenset(
    {Signal.PREFILL_COMPUTED, Signal.PROMPT_TOKENS, Signal.PREFIX_HITS, Signal.REQUESTS_DONE, Signal.GENERATION_TOKENS}
)


@dataclass(frozen=True)
class MetricFamily:
    name: str  # family name as registered (counters without _total, as prometheus-client wants)
    type: str  # counter | gauge | histogram
    help: str
    unit: str  # "requests", "tokens", "ratio", "bytes", "seconds", "tokens/s", "items", ...
    labels: tuple[str, ...] = ()  # labels beyond the identity labels (IDENTITY_LABELS)
    users: tuple[str, ...] = ()  # who reads it: vesta, smetric, agentweave, grafana, llm-d, ...
    signal: Signal | None = None  # tracker signal fed by this family
    origin: str = "turboprom"  # vllm | turboprom
    buckets: tuple[float, ...] = ()  # histograms only

    @property
    def sample_name(self) -> str:
        """The name the tracker sees: ``_total`` for counters, the plain name for gauges."""
        return self.name + "_total" if self.type == "counter" else self.name


# Identity labels every worker family carries. ``instance`` is also what a scrape adds.
IDENTITY_LABELS: tuple[str, ...] = ("cluster", "model_name", "instance")
# Label names read as the model (vLLM/SGLang use model_name; others often use model).
MODEL_LABELS: tuple[str, ...] = ("model_name", "model")

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
TOKEN_BUCKETS = (16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0)
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

_V = ("vesta",)
_VS = ("vesta", "smetric")
_AW = ("agentweave",)

FAMILIES: tuple[MetricFamily, ...] = (
    # --- vLLM (v1) names -----------------------------------------------------------------------
    MetricFamily("vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", "requests",
                 users=("vesta", "smetric", "llm-d", "grafana"), signal=Signal.QUEUE_LENGTH, origin="vllm"),
    MetricFamily("vllm:num_requests_running", "gauge", "Requests in the running batch.", "requests",
                 users=("vesta", "smetric", "grafana"), signal=Signal.RUNNING, origin="vllm"),
    MetricFamily("vllm:kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks in use (0..1).", "ratio",
                 users=("vesta", "smetric", "llm-d", "grafana"), signal=Signal.KV_USAGE, origin="vllm"),
    MetricFamily("vllm:prompt_tokens", "counter", "Prompt (prefill) tokens processed, cached ones included.", "tokens",
                 users=("vesta", "grafana"), signal=Signal.PROMPT_TOKENS, origin="vllm"),
    MetricFamily("vllm:generation_tokens", "counter", "Generation (decode) tokens produced.", "tokens",
                 users=("grafana",), signal=Signal.GENERATION_TOKENS, origin="vllm"),
    MetricFamily("vllm:prefix_cache_queries", "counter", "Prompt tokens looked up in the prefix cache.", "tokens",
                 users=("vesta", "grafana"), origin="vllm"),
    MetricFamily("vllm:prefix_cache_hits", "counter", "Prompt tokens found in the prefix cache.", "tokens",
                 users=("vesta", "grafana"), signal=Signal.PREFIX_HITS, origin="vllm"),
    MetricFamily("vllm:num_preemptions", "counter", "Requests preempted by the engine.", "requests",
                 users=("grafana",), origin="vllm"),
    MetricFamily("vllm:lora_requests_info", "gauge",
                 "Running and waiting LoRA adapters (comma-separated label values) and max_lora; the value is the "
                 "time of the update, the series with the newest value is current.", "seconds",
                 labels=("running_lora_adapters", "waiting_lora_adapters", "max_lora"), users=("llm-d", "grafana"),
                 signal=Signal.LORA_INFO, origin="vllm"),
    MetricFamily("vllm:request_success", "counter", "Finished requests, by finished_reason.", "requests",
                 labels=("finished_reason",), users=("vesta", "grafana"), signal=Signal.REQUESTS_DONE, origin="vllm"),
    MetricFamily("vllm:time_to_first_token_seconds", "histogram", "Time to first token.", "seconds",
                 users=("vesta", "grafana"), origin="vllm", buckets=TTFT_BUCKETS),
    MetricFamily("vllm:inter_token_latency_seconds", "histogram", "Time between consecutive output tokens.", "seconds",
                 users=("grafana",), origin="vllm", buckets=LATENCY_BUCKETS),
    MetricFamily("vllm:e2e_request_latency_seconds", "histogram", "End-to-end request latency.", "seconds",
                 users=("grafana",), origin="vllm", buckets=LATENCY_BUCKETS),
    MetricFamily("vllm:request_queue_time_seconds", "histogram", "Time a request spent waiting.", "seconds",
                 users=("vesta", "grafana"), origin="vllm", buckets=LATENCY_BUCKETS),
    MetricFamily("vllm:request_prefill_time_seconds", "histogram", "Time a request spent in prefill.", "seconds",
                 users=("vesta", "grafana"), origin="vllm", buckets=LATENCY_BUCKETS),
    MetricFamily("vllm:request_prompt_tokens", "histogram", "Prompt length per request.", "tokens",
                 users=("vesta", "grafana"), origin="vllm", buckets=TOKEN_BUCKETS),
    # --- Vesta: what vLLM lacks (per serving worker) ------------------------------------------
    MetricFamily("turboprom_worker_prefill_backlog_tokens", "gauge",
                 "Unfinished prefill work: prompt tokens queued or partially prefilled, cache hits excluded.", "tokens",
                 users=_VS, signal=Signal.BACKLOG_TOKENS),
    MetricFamily("turboprom_worker_prefill_computed_tokens", "counter",
                 "Prefill tokens actually computed (prefix-cache hits and fetched KV excluded).", "tokens",
                 users=_V, signal=Signal.PREFILL_COMPUTED),
    MetricFamily("turboprom_worker_prefill_throughput_tokens_per_second", "gauge",
                 "Engine-measured prefill throughput over its last scheduling window.", "tokens/s",
                 users=_V, signal=Signal.PREFILL_TPS_GAUGE),
    MetricFamily("turboprom_worker_prefill_capacity_tokens_per_second", "gauge",
                 "Offline-calibrated peak prefill throughput of this worker (latency-model profile).", "tokens/s",
                 users=_V, signal=Signal.CAPACITY_TPS),
    MetricFamily("turboprom_worker_kv_held_tokens", "gauge",
                 "KV-cache tokens this worker holds as session holder, by context-length bucket.", "tokens",
                 labels=("length_bucket",), users=_V, signal=Signal.KV_HELD_TOKENS),
    MetricFamily("turboprom_worker_kv_held_sessions", "gauge",
                 "Sessions this worker holds KV for, by context-length bucket.", "sessions",
                 labels=("length_bucket",), users=_V),
    MetricFamily("turboprom_worker_kv_transfer_bytes", "counter",
                 "KV bytes moved between workers: direction=in|out, reason=prefix_fetch|bucket_migration|approved_migration.",
                 "bytes",
                 labels=("direction", "reason"), users=_V),
    MetricFamily("turboprom_worker_kv_writeback_bytes", "counter",
                 "New KV state written back to the session holder: direction=out on the executor, in on the holder.",
                 "bytes", labels=("direction",), users=_V),
    # --- Vesta / SMetric: router-side ------------------------------------------------------------
    MetricFamily("turboprom_scheduler_assignments", "counter",
                 "Requests routed, by the session's KV holder and the chosen executor.", "requests",
                 labels=("scheduler", "holder", "executor"), users=("vesta", "smetric", "grafana")),
    MetricFamily("turboprom_scheduler_congestion_penalty_seconds", "histogram",
                 "Congestion penalty added to the chosen executor's score.", "seconds",
                 labels=("scheduler",), users=("vesta", "grafana"), buckets=OVERHEAD_BUCKETS),
    MetricFamily("turboprom_scheduler_control_actions", "counter",
                 "Actions the scheduler asked KedgeFlow for, by verb and outcome: denied (by policy), committed, refused, "
                 "rejected_by_target, uncertain, failed, error (the request itself failed).", "actions",
                 labels=("scheduler", "verb", "outcome"), users=("vesta", "grafana")),
    # --- AgentWeave: workflow scheduler ---------------------------------------------------------
    MetricFamily("turboprom_flow_queue_depth", "gauge", "Items waiting at a workflow module.", "items",
                 labels=("workflow", "module"), users=_AW),
    MetricFamily("turboprom_flow_chunk_size", "gauge", "Chunk size chosen for a decomposable module this round.",
                 "items", labels=("workflow", "module"), users=_AW),
    MetricFamily("turboprom_flow_partial_progress_ratio", "gauge",
                 "Fraction of in-flight decomposable input already processed (0..1).", "ratio",
                 labels=("workflow", "module"), users=_AW),
    MetricFamily("turboprom_flow_chunks_completed", "counter", "Chunks completed at a module.", "chunks",
                 labels=("workflow", "module"), users=_AW),
    MetricFamily("turboprom_flow_rounds", "counter", "Scheduling rounds run.", "rounds",
                 labels=("workflow",), users=_AW),
    MetricFamily("turboprom_flow_round_overhead_seconds", "histogram",
                 "Scheduling and supplement-state overhead per round.", "seconds",
                 labels=("workflow",), users=_AW, buckets=OVERHEAD_BUCKETS),
)

FAMILY_BY_NAME: dict[str, MetricFamily] = {f.name: f for f in FAMILIES}


@dataclass(frozen=True)
class Alias:
    """Another serving stack's sample name feeding one of our signals, with a unit scale."""

    sample_name: str
    signal: Signal
    stack: str
    scale: float = 1.0
    note: str = ""


ALIASES: tuple[Alias, ...] = (
    Alias("vllm:gpu_cache_usage_perc", Signal.KV_USAGE, "vllm-v0", note="older vLLM name"),
    Alias("sglang:num_queue_reqs", Signal.QUEUE_LENGTH, "sglang"),
    Alias("sglang:num_running_reqs", Signal.RUNNING, "sglang"),
    Alias("sglang:token_usage", Signal.KV_USAGE, "sglang", note="token-pool usage, 0..1"),
    Alias("sglang:prompt_tokens_total", Signal.PROMPT_TOKENS, "sglang"),
    Alias("sglang:generation_tokens_total", Signal.GENERATION_TOKENS, "sglang"),
    Alias("sglang:cached_tokens_total", Signal.PREFIX_HITS, "sglang"),
    Alias("sglang:num_requests_total", Signal.REQUESTS_DONE, "sglang"),
    Alias("tgi_queue_size", Signal.QUEUE_LENGTH, "tgi"),
    Alias("tgi_batch_current_size", Signal.RUNNING, "tgi"),
    Alias("dynamo_frontend_queued_requests", Signal.QUEUE_LENGTH, "dynamo"),
    Alias("dynamo_frontend_worker_active_prefill_tokens", Signal.BACKLOG_TOKENS, "dynamo"),
)


@dataclass(frozen=True)
class SignalSource:
    signal: Signal
    scale: float
    stack: str  # vllm | sglang | tgi | dynamo | turboprom


def _build_signal_index() -> dict[str, SignalSource]:
    out: dict[str, SignalSource] = {}
    for f in FAMILIES:
        if f.signal is not None:
            out[f.sample_name] = SignalSource(f.signal, 1.0, f.origin)
    for a in ALIASES:
        out[a.sample_name] = SignalSource(a.signal, a.scale, a.stack)
    # prometheus-client's OpenMetrics output escapes ':' to '_' unless the scraper asks for
    # escaping=allow-utf-8 (Prometheus 2.x does not), so vllm:x may arrive as vllm_x.
    for name, src in list(out.items()):
        if ":" in name:
            out.setdefault(name.replace(":", "_"), src)
    return out


# sample name -> signal; the tracker's only lookup table.
SIGNAL_BY_SAMPLE_NAME: dict[str, SignalSource] = _build_signal_index()


@dataclass(frozen=True)
class CongestionFamily:
    name: str
    unit: str
    help: str
    scope: str = "instance"  # instance | cluster


# Series the tracker writes back (labels cluster, model, instance; cluster-scope ones omit instance).
CONGESTION_FAMILIES: tuple[CongestionFamily, ...] = (
    CongestionFamily("turboprom_congestion_queue_length", "requests", "Requests waiting."),
    CongestionFamily("turboprom_congestion_running", "requests", "Requests running."),
    CongestionFamily("turboprom_congestion_backlog_tokens", "tokens", "Unfinished prefill tokens."),
    CongestionFamily("turboprom_congestion_backlog_seconds", "seconds", "Backlog divided by service rate."),
    CongestionFamily("turboprom_congestion_kv_usage_ratio", "ratio", "KV-cache usage 0..1."),
    CongestionFamily("turboprom_congestion_service_rate_tokens_per_second", "tokens/s", "Estimated prefill service rate mu."),
    CongestionFamily("turboprom_congestion_arrival_rate_tokens_per_second", "tokens/s", "Estimated prefill work arrival rate lambda."),
    CongestionFamily("turboprom_congestion_utilization_ratio", "ratio", "lambda / mu (unclipped)."),
    CongestionFamily("turboprom_congestion_queueing_delay_seconds", "seconds", "Kingman M/G/1 mean wait estimate."),
    CongestionFamily("turboprom_congestion_price_seconds_per_token", "seconds/token",
                     "Marginal delay one more prefill token imposes on later requests."),
    CongestionFamily("turboprom_congestion_age_seconds", "seconds", "Age of the newest sample."),
    CongestionFamily("turboprom_congestion_stale", "bool", "1 when the instance stopped reporting."),
    CongestionFamily("turboprom_congestion_cluster_instances", "instances", "Fresh instances.", "cluster"),
    CongestionFamily("turboprom_congestion_cluster_queue_length", "requests", "Requests waiting, summed.", "cluster"),
    CongestionFamily("turboprom_congestion_cluster_backlog_tokens", "tokens", "Unfinished prefill tokens, summed.", "cluster"),
    CongestionFamily("turboprom_congestion_cluster_utilization_ratio", "ratio", "Pooled lambda / pooled mu.", "cluster"),
    CongestionFamily("turboprom_congestion_cluster_price_seconds_per_token", "seconds/token",
                     "Pooled-queue congestion price.", "cluster"),
)


def families_by_user(user: str) -> list[MetricFamily]:
    return [f for f in FAMILIES if user in f.users]


__all__ = [
    "ALIASES", "Alias", "CONGESTION_FAMILIES", "COUNTER_SIGNALS", "FAMILIES", "FAMILY_BY_NAME", "IDENTITY_LABELS",
    "MODEL_LABELS", "MetricFamily", "SIGNAL_BY_SAMPLE_NAME", "SIGNAL_COMBINE", "Signal", "SignalSource",
    "families_by_user",
]
