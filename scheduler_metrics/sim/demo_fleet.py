"""A live simulated worker fleet for the demo: each simulated instance is a real exporter
(scheduler_metrics.instrumentation.WorkerMetrics on its own loopback port, scraped by TurboProm),
and a Vesta scheduler places the replayed trace's requests using TurboProm's congestion API.

Time runs ``speed`` x faster than the wall clock; the trace is replayed in a loop.
"""
from __future__ import annotations

import logging
import socket
import threading

import numpy as np

from scheduler_metrics.instrumentation import SchedulerMetrics, WorkerMetrics
from scheduler_metrics.schedulers.base import Decision
from scheduler_metrics.schedulers.vesta import VestaScheduler
from scheduler_metrics.sim.cluster import ClusterSim, RequestResult
from scheduler_metrics.sim.live import LiveSignals
from scheduler_metrics.sim.replay import time_scale_for
from scheduler_metrics.sim.signals import instance_name
from scheduler_metrics.sim.traces import Trace, load_trace

log = logging.getLogger("turboprom.demo")


class FleetSignals(LiveSignals):
    """Workers export through their own prometheus-client registries (scraped, not pushed)."""

    def __init__(self, base_url: str, workers: list[WorkerMetrics], speed: float, cluster: str):
        super().__init__(base_url, speed=speed, cluster=cluster)
        self.workers = workers
        self._last = np.zeros((len(workers), 5))

    def export(self, cl: ClusterSim) -> None:
        cap = cl.c.hw.gpu_kv_capacity_tokens
        for i, (w, s) in enumerate(zip(self.workers, cl.inst)):
            w.set_queue(s.waiting, s.running)
            w.set_kv_usage(min(1.0, max(0.0, s.gpu_kv_tokens / cap)))
            w.set_prefill_backlog(s.backlog_tokens)
            w.set_prefill_capacity(cl.c.model.prefill_tokens_per_s)
            cur = np.array([s.prompt_tokens, s.prefill_computed, s.generation_tokens, s.kv_transfer_bytes, s.kv_writeback_bytes])
            d = np.maximum(cur - self._last[i], 0.0)
            prompt, computed = int(d[0]), int(min(d[1], d[0]))
            if prompt:
                w.add_prompt_tokens(prompt, cached=prompt - computed)
            if d[2]:
                w.add_generation_tokens(int(d[2]))
            if d[3]:
                w.add_kv_transfer(int(d[3]), "in")
            if d[4]:
                w.add_kv_writeback(int(d[4]), "out")
            self._last[i] = cur
            # The simulated engine admits past its KV capacity where vLLM would preempt: count it as vLLM does.
            if s.gpu_kv_tokens > cap:
                w.preempted()


class DemoFleet:
    def __init__(self, base_url: str, trace_path: str, *, instances: int = 8, load: float = 0.7, speed: float = 1.0,
                 cluster: str = "demo", first_port: int = 0, limit: int | None = 4000):
        self.base_url, self.instances, self.load, self.speed, self.cluster = base_url, instances, load, speed, cluster
        trace = load_trace(trace_path)
        self.trace: Trace = trace.head(limit) if limit else trace
        self.workers = [WorkerMetrics("qwen2.5-7b", cluster=cluster, instance=instance_name(i)) for i in range(instances)]
        self.sched_metrics = SchedulerMetrics("vesta", cluster=cluster, instance="vesta-0")
        # ports are chosen now (the scrape config names them) and served from ``start``: until then a
        # scrape finds nothing, so history written before the fleet starts stays in time order
        self.ports = [first_port + i if first_port else _free_port() for i in range(instances)]
        self.sched_port = _free_port()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.completed = 0
        self._sim: ClusterSim | None = None

    @property
    def targets(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]

    def _on_result(self, r: RequestResult, d: Decision) -> None:
        """vLLM's per-request histograms from the simulated timeline (called right after dispatch, so the
        executor's newest prefill job, the one ending at its ``prefill_free_at``, is this request's)."""
        w = self.workers[r.executor]
        e = self._sim.inst[r.executor] if self._sim is not None else None
        start, end = next(((j[0], j[1]) for j in (e.prefill_jobs if e else ()) if j[1] == e.prefill_free_at),
                          (r.issued_s, r.issued_s + r.ttft_s))
        out_tokens = max(1, int(self.trace.output_tokens[r.idx]))
        decode_s = max(0.0, r.done_s - r.issued_s - r.ttft_s)
        itl = decode_s / out_tokens / self.speed
        w.request_finished("length" if out_tokens >= _MAX_TOKENS else "stop", prompt_tokens=int(self.trace.input_tokens[r.idx]),
                           ttft_s=r.ttft_s / self.speed, e2e_s=(r.done_s - r.issued_s) / self.speed,
                           queue_s=max(0.0, start - r.issued_s) / self.speed, prefill_s=max(0.0, end - start) / self.speed,
                           inter_token_s=[itl] * min(out_tokens - 1, _ITL_SAMPLES))
        holder = d.holder if d.holder >= 0 else r.executor
        self.sched_metrics.assigned(instance_name(holder), instance_name(r.executor), d.penalty_s)
        self.completed += 1
        if self._stop.is_set():
            raise _Stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            sig = FleetSignals(self.base_url, self.workers, self.speed, self.cluster)
            sim = self._sim = ClusterSim(self.trace, VestaScheduler(self.instances), sig, instances=self.instances, load=self.load,
                             time_scale=time_scale_for(self.trace, self.load, self.instances), on_result=self._on_result)
            try:
                sim.run()
            except _Stop:
                return
            except Exception as e:  # noqa: BLE001 - the demo keeps going (e.g. server restarting)
                # one line, not a trace: at shutdown the server goes before the fleet and this is expected
                log.warning("demo fleet replay stopped (%s: %s); restarting it in 2 s", type(e).__name__, e)
                if self._stop.wait(2.0):
                    return

    def start(self) -> None:
        for w, port in zip(self.workers, self.ports):
            w.serve(port)
        self.sched_metrics.serve(self.sched_port)
        self._thread = threading.Thread(target=self._run, name="demo-fleet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        for w in self.workers:
            w.close()
        self.sched_metrics.close()


# A request that produced this many tokens stopped on its length limit (finished_reason="length").
_MAX_TOKENS = 1024
# Inter-token gaps observed per request: the decode of one simulated request is uniform, so a few
# observations carry the distribution without one histogram update per generated token.
_ITL_SAMPLES = 8


class _Stop(Exception):
    pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
