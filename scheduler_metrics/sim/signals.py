"""Signal sources for the simulator: what the schedulers see of backlog and congestion.

* ``TrackerSignals`` (default, fast mode): every signal period the simulated workers' metrics (the
  documented schema) are fed as a SampleBatch into TurboProm's own ``CongestionTracker``, in process,
  and schedulers read its snapshot, exactly the numbers ``GET /api/v1/congestion`` would serve.
* ``OracleSignals``: exact simulator state (an upper bound on what any telemetry could give).
* Live mode (``sim/live.py``) pushes the metrics to a running server and polls its HTTP API.
"""
from __future__ import annotations

import numpy as np

from scheduler_metrics.congestion import CongestionConfig, CongestionTracker
from scheduler_metrics.sim.cluster import ClusterSim, SignalSource
from storage.batch import SampleBatch
from storage.labels import make_labels

SIM_EPOCH_S = 1_700_000_000.0  # simulated time 0, as a Unix time for sample timestamps

# (sample name, attribute of InstanceState or callable) in the documented schema.
_EXPORTS = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "turboprom_worker_prefill_backlog_tokens",
    "turboprom_worker_prefill_computed_tokens_total",
    "turboprom_worker_prefill_capacity_tokens_per_second",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
)


def instance_name(i: int) -> str:
    return f"w{i}"


def worker_values(cl: ClusterSim) -> np.ndarray:
    """(n_instances, len(_EXPORTS)) values of the exported families at the current time."""
    cap = cl.c.hw.gpu_kv_capacity_tokens
    tps = cl.c.model.prefill_tokens_per_s
    return np.array([[s.waiting, s.running, min(1.0, s.gpu_kv_tokens / cap), max(s.backlog_tokens, 0.0), s.prefill_computed,
                      tps if s.role != "decode" else 0.0, s.prompt_tokens, s.generation_tokens, s.requests_done]
                     for s in cl.inst], dtype=np.float64)


class OracleSignals(SignalSource):
    def __init__(self, price_fn=None):
        self._backlog = None
        self.price_fn = price_fn

    def observe(self, now: float, cl: ClusterSim) -> None:
        self._backlog = np.array([max(0.0, s.prefill_free_at - now) for s in cl.inst])
        self._queue = np.array([s.waiting for s in cl.inst], dtype=float)

    def view_arrays(self, now: float, cl: ClusterSim):
        if self._backlog is None:
            self.observe(now, cl)
        tps = np.full(cl.n, cl.c.model.prefill_tokens_per_s)
        price = self.price_fn(cl, now) if self.price_fn else 0.0
        return self._backlog, self._queue, price, tps


class TrackerSignals(SignalSource):
    def __init__(self, cluster_name: str = "sim", model: str = "qwen2.5-7b", config: CongestionConfig | None = None):
        self.now = 0.0
        cfg = config or CongestionConfig(stale_after_s=30.0, drop_after_s=600.0, resolution_s=0.0, rate_window_s=5.0)
        self.tracker = CongestionTracker(cfg, clock=lambda: SIM_EPOCH_S + self.now)
        self.cluster_name, self.model = cluster_name, model
        self._labels: list | None = None
        self._index: dict[str, int] = {}
        self._arrays = None

    def observe(self, now: float, cl: ClusterSim) -> None:
        self.now = now
        if self._labels is None:
            self._labels = [make_labels({"__name__": name, "cluster": self.cluster_name, "model_name": self.model,
                                         "instance": instance_name(i), **({"finished_reason": "stop"} if name == "vllm:request_success_total" else {})})
                            for i in range(cl.n) for name in _EXPORTS]
            self._index = {instance_name(i): i for i in range(cl.n)}
        vals = worker_values(cl).reshape(-1)
        k = len(vals)
        ts = np.full(k, int((SIM_EPOCH_S + now) * 1000), dtype=np.int64)
        self.tracker.consume(SampleBatch(self._labels, np.arange(k), ts, vals))
        snap = self.tracker.refresh(SIM_EPOCH_S + now)
        self._arrays = snapshot_arrays(snap.instances, snap.clusters, self._index, cl.n)

    def view_arrays(self, now: float, cl: ClusterSim):
        if self._arrays is None:
            self.observe(now, cl)
        return self._arrays


def snapshot_arrays(instances: list[dict], clusters: list[dict], index: dict[str, int], n: int, time_factor: float = 1.0):
    """Per-instance backlog seconds, queue length, cluster price and service rate from a congestion
    API snapshot (``time_factor`` converts wall seconds to simulated seconds in live mode)."""
    backlog = np.zeros(n)
    queue = np.zeros(n)
    tps = np.zeros(n)
    for d in instances:
        i = index.get(d["instance"])
        if i is None:
            continue
        backlog[i] = (d.get("backlog_seconds") or 0.0) * time_factor
        queue[i] = d.get("queue_length") or 0.0
        tps[i] = (d.get("service_rate_tokens_per_second") or 0.0) / time_factor
    prices = [c.get("congestion_price_seconds_per_token") for c in clusters]
    prices = [p for p in prices if p is not None and np.isfinite(p)]
    price = max(prices) * time_factor if prices else 0.0
    return backlog, queue, price, tps
