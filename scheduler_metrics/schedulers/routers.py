"""Router baselines users know. KV stays where a turn executed (no remote prefix fetch)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from scheduler_metrics.schedulers.base import ClusterView, Decision, PendingWork, RequestView, stable_hash


@dataclass
class _LastPlace:
    where: dict[int, int] = field(default_factory=dict)

    def local(self, exe: int, req: RequestView) -> Decision:
        self.where[req.session] = exe
        return Decision(executor=exe, kv_source=exe, holder=exe)


@dataclass
class RoundRobinScheduler(_LastPlace):
    name: str = "round-robin"
    _next: int = 0

    def choose(self, req: RequestView, cl: ClusterView) -> Decision:
        exe = int(cl.candidates[self._next % len(cl.candidates)])
        self._next += 1
        return self.local(exe, req)


@dataclass
class LeastQueueScheduler(_LastPlace):
    """Least unfinished prefill work (seconds), as seen in the congestion signals."""

    name: str = "least-queue"
    _pending: PendingWork = field(default_factory=PendingWork)

    def choose(self, req: RequestView, cl: ClusterView) -> Decision:
        cand = cl.candidates
        backlog = self._pending.backlog(cl)
        exe = int(cand[int(np.argmin(backlog[cand]))])
        cached = min(req.reuse_tokens, cl.cached_tokens(exe, req.session))
        self._pending.add(exe, float(cl.prefill_time(np.array([float(req.input_tokens - cached)]), cl.running[[exe]])[0]))
        return self.local(exe, req)


@dataclass
class PrefixAffinityScheduler(_LastPlace):
    """Always where the session's prefix lives (first turn: hash of the session)."""

    name: str = "prefix-affinity"

    def choose(self, req: RequestView, cl: ClusterView) -> Decision:
        exe = self.where.get(req.session)
        if exe is None:
            exe = int(cl.candidates[stable_hash(req.session, "affinity") % len(cl.candidates)])
        return self.local(exe, req)


@dataclass
class LLMDScheduler(_LastPlace):
    """llm-d-style weighted scorers: queue (maxQ-q)/(maxQ-minQ), KV 1-usage, prefix match ratio;
    default weights 2/2/3; highest total wins."""

    name: str = "llm-d"
    w_queue: float = 2.0
    w_kv: float = 2.0
    w_prefix: float = 3.0
    _pending: PendingWork = field(default_factory=PendingWork)

    def choose(self, req: RequestView, cl: ClusterView) -> Decision:
        cand = cl.candidates
        q = self._pending.queue(cl)[cand].astype(float)
        span = q.max() - q.min()
        queue_score = (q.max() - q) / span if span > 0 else np.ones(len(cand))
        kv_score = 1.0 - np.clip(cl.kv_usage[cand], 0.0, 1.0)
        prefix = np.array([min(req.reuse_tokens, cl.cached_tokens(int(c), req.session)) for c in cand], dtype=float)
        prefix_score = prefix / max(req.input_tokens, 1)
        score = self.w_queue * queue_score + self.w_kv * kv_score + self.w_prefix * prefix_score
        exe = int(cand[int(np.argmax(score))])
        self._pending.add(exe, 0.0)
        return self.local(exe, req)


@dataclass
class DynamoScheduler(_LastPlace):
    """NVIDIA Dynamo KV-router-style cost: overlap_weight x prefill blocks still to compute there +
    decode blocks active there; lowest cost wins."""

    name: str = "dynamo"
    overlap_weight: float = 1.0
    block_tokens: int = 512
    kv_capacity_blocks: float = 900_000 / 512  # GPU KV blocks per worker (sim constants)
    _pending_blocks: dict = field(default_factory=dict)
    _t: float = float("nan")

    def choose(self, req: RequestView, cl: ClusterView) -> Decision:
        cand = cl.candidates
        if cl.signal_time != self._t:  # fresh signals include what we assigned before
            self._t, self._pending_blocks = cl.signal_time, {}
        cached = np.array([min(req.reuse_tokens, cl.cached_tokens(int(c), req.session)) for c in cand], dtype=float)
        prefill_blocks = np.ceil((req.input_tokens - cached) / self.block_tokens)
        pending = np.array([self._pending_blocks.get(int(c), 0.0) for c in cand])
        # Active blocks on the worker: KV of running sequences plus requests still queued for prefill
        # (backlog seconds x measured rate), plus what this router sent there since the last signals.
        queued = cl.backlog_s[cand] * np.where(cl.service_tps[cand] > 0, cl.service_tps[cand], 0.0) / self.block_tokens
        decode_blocks = cl.kv_usage[cand] * self.kv_capacity_blocks + queued + pending
        cost = self.overlap_weight * prefill_blocks + decode_blocks
        k = int(np.argmin(cost))
        exe = int(cand[k])
        self._pending_blocks[exe] = self._pending_blocks.get(exe, 0.0) + np.ceil((req.input_tokens + req.output_tokens) / self.block_tokens)
        return self.local(exe, req)
