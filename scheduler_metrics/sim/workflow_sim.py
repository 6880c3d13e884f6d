"""Round-based simulator of agent workflows on an aggregated deployment (every module on every GPU).

Policies: ``agentweave`` (flow decomposition with per-round chunk sizes from ChunkPolicy),
``whole`` (whole-request batching: a request's stage is one unit, FIFO), and ``autellix``
(least-attained-service priority over whole stages, as Autellix prioritizes programs by attained
service). Same arrivals, same request sizes, same offline profiles for all three.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from scheduler_metrics.schedulers.agentweave import WORKFLOWS, ChunkPolicy, FlowRequest, Workflow, batch_time, take_batch

POLICIES = ("agentweave", "whole", "autellix")


@dataclass
class FlowResult:
    policy: str
    workflow: str
    rate: float
    requests: int
    latency_s: np.ndarray
    makespan_s: float
    rounds: int
    mean_chunk: float

    @property
    def throughput_rps(self) -> float:
        return self.requests / self.makespan_s if self.makespan_s > 0 else 0.0

    def row(self) -> dict:
        return {"policy": self.policy, "workflow": self.workflow, "rate_rps": self.rate, "requests": self.requests,
                "throughput_rps": round(self.throughput_rps, 3), "mean_latency_s": round(float(self.latency_s.mean()), 3),
                "p90_latency_s": round(float(np.percentile(self.latency_s, 90)), 3), "rounds": self.rounds,
                "mean_chunk": round(self.mean_chunk, 1)}


def make_requests(n: int, rate: float, seed: int = 0, median_docs: int = 120, sigma: float = 1.0,
                  max_docs: int = 4000) -> tuple[np.ndarray, np.ndarray]:
    """Poisson arrivals at ``rate``/s; heavy-tailed (lognormal) input sizes, like retrieved sets."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    docs = np.clip(rng.lognormal(np.log(median_docs), sigma, n).astype(int), 5, max_docs)
    return arrivals, docs


def simulate(wf: Workflow, policy: str, arrivals: np.ndarray, docs: np.ndarray, *, workers: int = 8,
             max_batch_items: int = 256, chunk_policy: ChunkPolicy | None = None, rate: float = 0.0) -> FlowResult:
    """Event-driven: whenever a worker is free it takes a batch chosen by the policy."""
    if policy not in POLICIES:
        raise ValueError(f"unknown workflow policy {policy!r}; known: {', '.join(POLICIES)}")
    cp = chunk_policy or ChunkPolicy()
    reqs = [FlowRequest(i, float(a), int(d), remaining=wf.stage_items(int(d))) for i, (a, d) in enumerate(zip(arrivals, docs))]
    events: list[tuple[float, int, int, list]] = []  # (finish time, seq, worker, batch)
    free = list(range(workers))
    t, nxt, done, seq, rounds = 0.0, 0, 0, 0, 0
    active: list[FlowRequest] = []
    chunks: list[int] = []
    while done < len(reqs):
        while nxt < len(reqs) and reqs[nxt].arrival_s <= t:
            active.append(reqs[nxt])
            nxt += 1
        started = False
        while free:
            ready = [r for r in active if r.remaining[r.stage] > 0]
            if policy == "autellix":
                ready.sort(key=lambda r: (r.attained_s, r.arrival_s))
            if not ready:
                break
            chunk = None
            if policy == "agentweave":
                chunk = cp.choose(ready, wf, max_batch_items)
                chunks.append(min(chunk, 4096))
            batch = take_batch(ready, wf, max_batch_items, chunk)
            if not batch:
                break
            w = free.pop()
            dt = batch_time(batch, wf, cp, chunk)
            seq += 1
            rounds += 1
            heapq.heappush(events, (t + dt, seq, w, [(r, n, dt / len(batch)) for r, n in batch]))
            started = True
        if events and (not started or True):
            next_arrival = reqs[nxt].arrival_s if nxt < len(reqs) else float("inf")
            if events[0][0] <= next_arrival or not free:
                t, _, w, batch = heapq.heappop(events)
                free.append(w)
                for r, n, share in batch:
                    r.in_flight -= n
                    r.attained_s += share
                    if r.remaining[r.stage] <= 0 and r.in_flight == 0:
                        r.stage += 1
                        if r.stage == len(wf.modules):
                            r.done_s = t
                            done += 1
                active = [r for r in active if r.done_s < 0]
                continue
            t = next_arrival
        elif nxt < len(reqs):
            t = reqs[nxt].arrival_s
    lat = np.array([r.done_s - r.arrival_s for r in reqs])
    span = max(r.done_s for r in reqs) - float(arrivals[0])
    return FlowResult(policy, wf.name, rate, len(reqs), lat, span, rounds, float(np.mean(chunks)) if chunks else 0.0)


def sweep(workflow: str, rates: list[float], n: int = 400, workers: int = 8, seed: int = 1) -> list[FlowResult]:
    wf = WORKFLOWS[workflow]
    median = 120 if workflow == "rag" else 40
    out = []
    for rate in rates:
        arrivals, docs = make_requests(n, rate, seed, median_docs=median)
        for p in POLICIES:
            out.append(simulate(wf, p, arrivals, docs, workers=workers, rate=rate))
    return out
