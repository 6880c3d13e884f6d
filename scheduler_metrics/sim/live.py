"""Live mode: simulated workers export the metric schema to a running TurboProm (text exposition
pushed to /api/v1/import/prometheus every signal period) and the scheduler polls the real
congestion API (GET /api/v1/congestion) over HTTP for every decision window.

Simulated time runs ``speed`` times faster than wall time. The server measures rates per wall
second, so its backlog seconds and price are converted back to simulated seconds (x speed).
"""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

import numpy as np

from scheduler_metrics.sim.cluster import ClusterSim, SignalSource, SimResult
from scheduler_metrics.sim.replay import format_table, make_scheduler, progress_bar, time_scale_for, write_csv
from scheduler_metrics.sim.signals import _EXPORTS, instance_name, snapshot_arrays, worker_values
from scheduler_metrics.sim.traces import load_trace


class LiveSignals(SignalSource):
    def __init__(self, base_url: str, speed: float = 20.0, cluster: str = "sim-live", model: str = "qwen2.5-7b", timeout_s: float = 5.0):
        self.base = base_url.rstrip("/")
        self.speed, self.cluster, self.model, self.timeout = speed, cluster, model, timeout_s
        self.t0_wall: float | None = None
        self._arrays = None
        self.polls = 0
        self.pushes = 0
        self.poll_latency_s: list[float] = []

    def _exposition(self, cl: ClusterSim) -> bytes:
        vals = worker_values(cl)
        lines = []
        for i in range(cl.n):
            base = f'cluster="{self.cluster}",model_name="{self.model}",instance="{instance_name(i)}"'
            for j, name in enumerate(_EXPORTS):
                extra = ',finished_reason="stop"' if name == "vllm:request_success_total" else ""
                lines.append(f"{name}{{{base}{extra}}} {float(vals[i, j])!r}")
        return ("\n".join(lines) + "\n").encode()

    def observe(self, now: float, cl: ClusterSim) -> None:
        if self.t0_wall is None:
            self.t0_wall = time.time() - now / self.speed
        wait = self.t0_wall + now / self.speed - time.time()
        if wait > 0:
            time.sleep(wait)
        self.export(cl)
        self.pushes += 1
        t = time.perf_counter()
        q = urllib.parse.urlencode({"cluster": self.cluster})
        with urllib.request.urlopen(f"{self.base}/api/v1/congestion?{q}", timeout=self.timeout) as r:
            body = json.loads(r.read())
        self.poll_latency_s.append(time.perf_counter() - t)
        self.polls += 1
        data = body.get("data", body)
        index = {instance_name(i): i for i in range(cl.n)}
        self._arrays = snapshot_arrays(data.get("instances", []), data.get("clusters", []), index, cl.n, time_factor=self.speed)

    def export(self, cl: ClusterSim) -> None:
        """Make the workers' current metrics visible to the server (here: push text exposition)."""
        req = urllib.request.Request(self.base + "/api/v1/import/prometheus", data=self._exposition(cl), method="POST",
                                     headers={"Content-Type": "text/plain; version=0.0.4"})
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            r.read()

    def view_arrays(self, now: float, cl: ClusterSim):
        if self._arrays is None:
            self._arrays = (np.zeros(cl.n), np.zeros(cl.n), 0.0, np.zeros(cl.n))
        return self._arrays


def run_live(trace_path: str, base_url: str, instances: int, scheduler: str, load: float, *, limit: int | None = None,
             speed: float = 20.0) -> tuple[SimResult, LiveSignals]:
    trace = load_trace(trace_path)
    if limit:
        trace = trace.head(limit)
    sig = LiveSignals(base_url, speed=speed, cluster=f"sim-live-{scheduler}")
    sched = make_scheduler(scheduler, instances)
    sim = ClusterSim(trace, sched, sig, instances=instances, load=load,  # type: ignore[arg-type]
                     time_scale=time_scale_for(trace, load, instances), progress=progress_bar(f"live {scheduler} @ {load:g}"))
    return sim.run(), sig


def main_live(trace_path: str, base_url: str, instances: int, schedulers: list[str], loads: list[float], out: str | None,
              limit: int | None = None, speed: float = 20.0) -> list[SimResult]:
    results = []
    for load in loads:
        for s in schedulers:
            res, sig = run_live(trace_path, base_url, instances, s, load, limit=limit, speed=speed)
            lat = np.array(sig.poll_latency_s) * 1000
            print(f"{s} @ {load:g}: {sig.pushes} metric pushes, {sig.polls} congestion polls, poll p50 {np.median(lat):.2f} ms, p99 {np.percentile(lat, 99):.2f} ms")
            results.append(res)
    print(format_table(results))
    if out:
        from pathlib import Path

        Path(out).mkdir(parents=True, exist_ok=True)
        write_csv(results, Path(out) / "results.csv")
    return results
