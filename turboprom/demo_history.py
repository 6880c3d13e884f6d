"""The demo's past: hours of fleet history written before the live fleet starts.

A fresh demo holds minutes of data; over minutes every dashboard query is cheap, so neither the step
answers nor any summary can show what they save on a real fleet's hour-long and day-long panels. The
demo therefore starts with a few hours of history for the very series the live scrape continues: the
fleet's own exporters (``WorkerMetrics`` / ``SchedulerMetrics`` with the live workers' identities) are
driven by a synthetic load (a daily curve per instance, Poisson arrivals, latencies that grow with
load) and read back from their registries at every step, then remote-written (1.0, snappy) in time
order in chunks, as a Prometheus would forward them. The live exporters start from zero afterwards,
which the queries see as the counter reset of a restart.
"""
from __future__ import annotations

import math
import time
import urllib.request
from typing import Any

import numpy as np

from ingest.proto.messages import WriteRequest
from ingest.snappy_block import compress
from scheduler_metrics.instrumentation import SchedulerMetrics, WorkerMetrics

DAY_S = 86_400.0


class _Recorder:
    """Samples of one exporter's registry, collected per step: series key -> (timestamps, values)."""

    def __init__(self, exporter: Any, job: str):
        self.exporter, self.job = exporter, job
        self.points: dict[tuple, tuple[list[int], list[float]]] = {}
        self._keys: dict[tuple, tuple] = {}

    def record(self, ts_ms: int) -> None:
        for fam in self.exporter.registry.collect():
            for s in fam.samples:
                raw = (s.name, *s.labels.items())
                key = self._keys.get(raw)
                if key is None:
                    key = self._keys[raw] = tuple(sorted((("__name__", s.name), ("job", self.job), *s.labels.items())))
                got = self.points.get(key)
                if got is None:
                    got = self.points[key] = ([], [])
                got[0].append(ts_ms)
                got[1].append(float(s.value))

    def drain_into(self, w: WriteRequest) -> int:
        n = 0
        for key, (ts, vs) in self.points.items():
            t = w.timeseries.add()
            for name, value in key:
                t.labels.add(name=name, value=value)
            for a, b in zip(ts, vs):
                t.samples.add(value=b, timestamp=a)
            n += len(ts)
        self.points.clear()
        return n


def _post(base_url: str, w: WriteRequest, timeout: float = 60.0) -> None:
    req = urllib.request.Request(base_url.rstrip("/") + "/api/v1/write", data=compress(w.SerializeToString()), method="POST",
                                 headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
                                          "X-Prometheus-Remote-Write-Version": "0.1.0"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        if r.status // 100 != 2:
            raise RuntimeError(f"history write answered HTTP {r.status}")


def _drive(w: WorkerMetrics, rng: np.random.Generator, load: float, step_s: float, sched: SchedulerMetrics | None,
           name: str, peers: list[str]) -> None:
    """One step of one worker at ``load`` (0..1): finished requests, then the levels at the step's end."""
    for _ in range(int(rng.poisson(0.6 * load * step_s))):
        prompt = max(16, int(rng.lognormal(math.log(1500), 0.6)))
        cached = int(prompt * rng.beta(4, 6))
        gen = max(1, int(rng.lognormal(math.log(180), 0.5)))
        queue = float(rng.exponential(0.05 + 0.6 * load ** 4))
        prefill = (prompt - cached) / 9000.0 * float(rng.lognormal(0.0, 0.2))
        itl = [0.018 * (1 + 1.5 * load) * float(x) for x in rng.lognormal(0.0, 0.15, 5)]
        ttft = queue + prefill + itl[0]
        w.add_prompt_tokens(prompt, cached=cached)
        w.add_generation_tokens(gen)
        w.request_finished("length" if rng.random() < 0.1 else "stop", prompt_tokens=prompt, ttft_s=ttft,
                           e2e_s=ttft + gen * float(np.mean(itl)), queue_s=queue, prefill_s=prefill, inter_token_s=itl)
        if sched is not None:
            holder = name if rng.random() < 0.8 else peers[int(rng.integers(len(peers)))]
            sched.assigned(holder, name, float(rng.exponential(0.02)))
            if holder != name:
                w.add_kv_transfer(int(cached * 160_000), "in")
    if rng.random() < 0.02 * load:
        w.preempted()
    waiting = int(rng.poisson(4 * load ** 3))
    w.set_queue(waiting, int(rng.poisson(1 + 10 * load)))
    w.set_kv_usage(float(np.clip(0.15 + 0.7 * load + rng.normal(0, 0.03), 0.0, 1.0)))
    w.set_prefill_backlog(waiting * 1500.0)
    w.set_prefill_capacity(12_000.0)


def write_history(base_url: str, workers: list[WorkerMetrics], *, scheduler: SchedulerMetrics | None = None,
                  hours: float = 3.0, step_s: float = 15.0, end_ms: int | None = None, seed: int = 7,
                  worker_job: str = "vllm-workers", scheduler_job: str = "scheduler", chunk_steps: int = 120) -> int:
    """Write ``hours`` of history ending at ``end_ms`` (default now) for exporters with the identities of
    ``workers`` (and ``scheduler``); returns the samples written."""
    end = int(end_ms if end_ms is not None else time.time() * 1000)
    step_ms = int(step_s * 1000)
    n_steps = int(hours * 3600 / step_s)
    if n_steps <= 0 or not workers:
        return 0
    shadows = [WorkerMetrics(w.identity.get("model_name", ""), cluster=w.identity.get("cluster", "default"),
                             instance=w.identity.get("instance")) for w in workers]
    sched = (SchedulerMetrics(scheduler.scheduler, cluster=scheduler.identity.get("cluster", "default"),
                              instance=scheduler.identity.get("instance")) if scheduler is not None else None)
    names = [w.identity.get("instance", str(i)) for i, w in enumerate(shadows)]
    recorders = [_Recorder(w, worker_job) for w in shadows] + ([_Recorder(sched, scheduler_job)] if sched is not None else [])
    rng = np.random.default_rng(seed)
    phase = rng.random(len(shadows))
    start = end - n_steps * step_ms
    written = 0
    for k in range(n_steps):
        t_ms = start + (k + 1) * step_ms
        day = t_ms / 1000.0 / DAY_S
        for i, w in enumerate(shadows):
            load = float(np.clip(0.5 + 0.3 * math.sin(2 * math.pi * (day + phase[i] * 0.1)) + rng.normal(0, 0.05), 0.05, 1.0))
            _drive(w, rng, load, step_s, sched, names[i], names)
        for r in recorders:
            r.record(t_ms)
        if (k + 1) % chunk_steps == 0 or k == n_steps - 1:
            wr = WriteRequest()
            for r in recorders:
                written += r.drain_into(wr)
            _post(base_url, wr)
    return written
