"""Live mode: simulated workers export the metric schema to a running TurboProm (text exposition
pushed to /api/v1/import/prometheus every signal period) and the scheduler polls the real
congestion API (GET /api/v1/congestion) over HTTP for every decision window.

Workflows (``run_flow_live``): the workflow scheduler's queue state makes the same round trip
(pushed as ``turboprom_flow_queue_depth``, read back with PromQL) before AgentWeave sizes chunks.

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
from scheduler_metrics.sim.workflow_sim import FlowResult, FlowSignals, WorkflowSim, simulate


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


class LiveFlowSignals(FlowSignals):
    """Workflow live mode: every signal period the simulated scheduler pushes its per-module queue
    depths as ``turboprom_flow_queue_depth{workflow, module}`` (and the chunk size and round count it
    ran) to a running TurboProm, then reads the depths back with an instant PromQL query; AgentWeave's
    chunk size is computed from what the server answered. Simulated time is paced at ``speed`` times
    wall time."""

    def __init__(self, base_url: str, workflow: str, policy: str, speed: float = 10.0, timeout_s: float = 5.0):
        self.base = base_url.rstrip("/")
        self.workflow, self.policy, self.speed, self.timeout = workflow, policy, speed, timeout_s
        self.cluster = f"flow-live-{workflow}-{policy}"
        self.t0_wall: float | None = None
        self.depths: dict[str, float] = {}
        self.pushes = 0
        self.queries = 0
        self.query_latency_s: list[float] = []
        self.mismatches = 0  # answers that differ from what was pushed in the same period

    def _exposition(self, depths: dict[str, float], sim: WorkflowSim) -> bytes:
        base = f'cluster="{self.cluster}",instance="sim",workflow="{self.workflow}"'
        lines = [f'turboprom_flow_queue_depth{{{base},module="{m}"}} {float(v)!r}' for m, v in sorted(depths.items())]
        lines.append(f'turboprom_flow_rounds_total{{{base}}} {float(sim.rounds)!r}')
        if sim.chunks:
            lines.append(f'turboprom_flow_chunk_size{{{base},module="all"}} {float(sim.chunks[-1])!r}')
        return ("\n".join(lines) + "\n").encode()

    def observe(self, now: float, sim: WorkflowSim) -> None:
        if self.t0_wall is None:
            self.t0_wall = time.time() - now / self.speed
        wait = self.t0_wall + now / self.speed - time.time()
        if wait > 0:
            time.sleep(wait)
        pushed = sim.queue_depths()
        req = urllib.request.Request(self.base + "/api/v1/import/prometheus", data=self._exposition(pushed, sim), method="POST",
                                     headers={"Content-Type": "text/plain; version=0.0.4"})
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            r.read()
        self.pushes += 1
        t = time.perf_counter()
        q = urllib.parse.urlencode({"query": f'turboprom_flow_queue_depth{{cluster="{self.cluster}"}}'})
        with urllib.request.urlopen(f"{self.base}/api/v1/query?{q}", timeout=self.timeout) as r:
            body = json.loads(r.read())
        self.query_latency_s.append(time.perf_counter() - t)
        self.queries += 1
        if body.get("status") != "success":
            raise RuntimeError(f"flow queue-depth query failed: {body}")
        self.depths = {s["metric"]["module"]: float(s["value"][1]) for s in body["data"]["result"]}
        if any(abs(self.depths.get(m, -1.0) - v) > 1e-9 for m, v in pushed.items()):
            self.mismatches += 1


def run_flow_live(base_url: str, workflow: str, policy: str, rate: float, n: int, seed: int, *, speed: float = 10.0,
                  **kw) -> tuple[FlowResult, LiveFlowSignals]:
    sig = LiveFlowSignals(base_url, workflow, policy, speed=speed)
    return simulate(workflow, policy, rate, n, seed, signals=sig, **kw), sig
