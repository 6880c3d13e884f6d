"""Discrete-event cluster of LLM serving instances (colocated prefill/decode, or disaggregated P/D).

Per instance: a FIFO prefill server (its completion times are known at enqueue, since prefill time
depends only on the job and the decode batch at enqueue), a continuous decode batch, a host KV cache
of sessions (LRU, capacity in tokens) and one network link shared by prefix fetches, write-backs,
migrations and P->D transfers. Requests of a session are serialized: a turn is issued at
max(its trace arrival, the previous turn's completion). Per-request Python is inherent to a
discrete-event simulation (this is a tool, not a serving hot path); per-instance work is numpy.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from scheduler_metrics.schedulers.base import ClusterView, Decision, RequestView, Scheduler
from scheduler_metrics.sim.constants import DEFAULT, SimConstants
from scheduler_metrics.sim.traces import Trace


@dataclass
class InstanceState:
    role: str  # "colocated" | "prefill" | "decode"
    prefill_free_at: float = 0.0
    nic_free_at: float = 0.0
    prefill_jobs: list = field(default_factory=list)  # heap of (start, end, uncached tokens, prompt tokens)
    decodes: list = field(default_factory=list)  # heap of (end, output tokens, context tokens)
    cache: OrderedDict = field(default_factory=OrderedDict)  # session -> KV tokens (LRU order)
    cache_tokens: int = 0
    # counters as of the last advance()
    prefill_computed: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    requests_done: float = 0.0
    kv_transfer_bytes: float = 0.0
    kv_writeback_bytes: float = 0.0
    backlog_tokens: float = 0.0  # prefill tokens enqueued and not yet computed
    gpu_kv_tokens: float = 0.0  # KV of the running decode batch (what vLLM's kv_cache_usage_perc measures)
    waiting: int = 0  # prefill jobs not yet started
    running: int = 0  # decodes in progress
    assigned: int = 0


@dataclass
class RequestResult:
    idx: int
    issued_s: float
    ttft_s: float
    done_s: float
    executor: int
    remote: bool
    transfer_bytes: float


@dataclass
class SimResult:
    scheduler: str
    load: float
    requests: int
    ttft_s: np.ndarray
    issued_s: np.ndarray
    done_s: np.ndarray
    output_tokens: int
    kv_transfer_bytes: float
    remote_fraction: float
    assignments: np.ndarray

    @property
    def mean_ttft_ms(self) -> float:
        return float(self.ttft_s.mean() * 1000) if len(self.ttft_s) else float("nan")

    def pct_ttft_ms(self, q: float) -> float:
        return float(np.percentile(self.ttft_s, q) * 1000) if len(self.ttft_s) else float("nan")

    @property
    def throughput_tps(self) -> float:
        span = float(self.done_s.max() - self.issued_s.min()) if len(self.done_s) else 0.0
        return self.output_tokens / span if span > 0 else 0.0

    def row(self) -> dict:
        return {"scheduler": self.scheduler, "load": self.load, "requests": self.requests,
                "mean_ttft_ms": round(self.mean_ttft_ms, 2), "p50_ttft_ms": round(self.pct_ttft_ms(50), 2),
                "p99_ttft_ms": round(self.pct_ttft_ms(99), 2), "throughput_tps": round(self.throughput_tps, 2),
                "kv_transfer_bytes": int(self.kv_transfer_bytes)}


class SignalSource:
    """Where the scheduler's view of backlog/price comes from (exact state, the in-process
    congestion tracker, or the live HTTP API). ``observe`` is called at every signal period."""

    def observe(self, now: float, cluster: "ClusterSim") -> None: ...

    def view_arrays(self, now: float, cluster: "ClusterSim") -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
        """(backlog_s, queue_len, price, service_tps) per instance."""
        raise NotImplementedError


class ClusterSim:
    def __init__(self, trace: Trace, scheduler: Scheduler, signals: SignalSource, *, instances: int = 32,
                 disaggregated: tuple[int, int] | None = None, load: float = 0.0, time_scale: float = 1.0,
                 constants: SimConstants = DEFAULT, progress: Callable[[int, int], None] | None = None,
                 on_result: Callable[["RequestResult", Decision], None] | None = None):
        self.trace, self.scheduler, self.signals, self.c = trace, scheduler, signals, constants
        self.on_result = on_result
        self._last_decision: Decision | None = None
        self.load, self.time_scale, self.progress = load, time_scale, progress
        if disaggregated:
            p, d = disaggregated
            self.inst = [InstanceState("prefill") for _ in range(p)] + [InstanceState("decode") for _ in range(d)]
        else:
            self.inst = [InstanceState("colocated") for _ in range(instances)]
        self.n = len(self.inst)
        self.colocated = disaggregated is None
        self.prefill_idx = np.array([i for i, s in enumerate(self.inst) if s.role != "decode"], dtype=np.int64)
        self.decode_idx = np.array([i for i, s in enumerate(self.inst) if s.role != "prefill"], dtype=np.int64)
        self.now = 0.0
        self.signal_time = 0.0

    # ---------------------------------------------------------------- state over time
    def advance(self, now: float) -> None:
        self.now = now
        for s in self.inst:
            jobs = s.prefill_jobs
            while jobs and jobs[0][1] <= now:
                _, _, unc, prompt = heapq.heappop(jobs)
                s.prefill_computed += unc
                s.prompt_tokens += prompt
                s.backlog_tokens -= unc
            s.waiting = sum(1 for j in jobs if j[0] > now)
            dec = s.decodes
            while dec and dec[0][0] <= now:
                _, out, ctx_tokens = heapq.heappop(dec)
                s.generation_tokens += out
                s.requests_done += 1
                s.gpu_kv_tokens -= ctx_tokens
            s.running = len(dec)

    def cached_tokens(self, i: int, session: int) -> int:
        return int(self.inst[i].cache.get(session, 0))

    def _cache_put(self, i: int, session: int, tokens: int) -> None:
        s = self.inst[i]
        old = s.cache.pop(session, 0)
        s.cache_tokens += tokens - old
        s.cache[session] = tokens
        cap = self.c.hw.host_kv_capacity_tokens
        while s.cache_tokens > cap and len(s.cache) > 1:
            _, t = s.cache.popitem(last=False)
            s.cache_tokens -= t

    def _cache_drop(self, i: int, session: int) -> None:
        s = self.inst[i]
        s.cache_tokens -= s.cache.pop(session, 0)

    def _transfer(self, src: int, dst: int, tokens: float, not_before: float) -> float:
        """Move KV over both instances' links; returns when the data is available at ``dst``.

        Links serve transfers in the order they are issued (at dispatch time, from ``self.now``):
        KV produced later (write-back, P->D) streams layer by layer while it is computed, so it
        occupies the link from now on and is complete no earlier than ``not_before``. Reserving the
        link at a future time instead would block every transfer issued in between."""
        if tokens <= 0 or src == dst:
            return not_before
        a, b = self.inst[src], self.inst[dst]
        start = max(self.now, a.nic_free_at, b.nic_free_at)
        end = start + self.c.transfer_time(tokens)
        a.nic_free_at = b.nic_free_at = end
        return max(end, not_before)

    def kv_usage(self) -> np.ndarray:
        """GPU KV-cache usage (0..1) from the running sequences, as vLLM reports it."""
        return np.minimum(np.array([s.gpu_kv_tokens for s in self.inst], dtype=float) / self.c.hw.gpu_kv_capacity_tokens, 1.0)

    def view(self, now: float) -> ClusterView:
        backlog_s, queue_len, price, tps = self.signals.view_arrays(now, self)
        c = self.c
        return ClusterView(
            n=self.n, backlog_s=backlog_s, queue_len=queue_len,
            running=np.array([s.running for s in self.inst], dtype=float), kv_usage=self.kv_usage(), price=price,
            service_tps=tps, candidates=self.prefill_idx, cached_tokens=self.cached_tokens,
            prefill_time=lambda tok, run: _vec_prefill(c, tok, run, self.colocated),
            transfer_time=c.transfer_time,
            nic_wait_s=np.maximum(0.0, np.array([s.nic_free_at for s in self.inst]) - now),
            signal_time=self.signal_time)

    # ---------------------------------------------------------------- the run
    def run(self) -> SimResult:
        tr, c = self.trace, self.c
        arrival = tr.arrival_s * self.time_scale
        nxt = np.full(len(tr), -1, dtype=np.int64)  # next turn of the same session
        last_of: dict[int, int] = {}
        for i, sess in enumerate(tr.session.tolist()):
            j = last_of.get(sess)
            if j is not None:
                nxt[j] = i
            last_of[sess] = i
        first = np.ones(len(tr), dtype=bool)
        first[nxt[nxt >= 0]] = False
        heap = [(float(arrival[i]), i) for i in np.flatnonzero(first)]
        heapq.heapify(heap)
        results: list[RequestResult] = []
        period = c.signal_period_s
        next_obs = 0.0
        total = len(tr)
        while heap:
            t, i = heapq.heappop(heap)
            while next_obs <= t:
                self.advance(next_obs)
                self.signals.observe(next_obs, self)
                self.signal_time = next_obs
                next_obs += period
            self.advance(t)
            res = self._dispatch(i, t)
            results.append(res)
            if self.on_result is not None and self._last_decision is not None:
                self.on_result(res, self._last_decision)
            if nxt[i] >= 0:
                j = int(nxt[i])
                heapq.heappush(heap, (max(float(arrival[j]), res.done_s), j))
            if self.progress and len(results) % 500 == 0:
                self.progress(len(results), total)
        if self.progress:
            self.progress(total, total)
        ttft = np.array([r.ttft_s for r in results])
        assigned = np.array([s.assigned for s in self.inst])
        return SimResult(self.scheduler.name, self.load, len(results), ttft, np.array([r.issued_s for r in results]),
                         np.array([r.done_s for r in results]), int(tr.output_tokens.sum()),
                         float(sum(s.kv_transfer_bytes + s.kv_writeback_bytes for s in self.inst)),
                         float(np.mean([r.remote for r in results])) if results else 0.0, assigned)

    def _dispatch(self, i: int, now: float) -> RequestResult:
        tr, c = self.trace, self.c
        req = RequestView(i, int(tr.session[i]), int(tr.input_tokens[i]), int(tr.output_tokens[i]), int(tr.reuse_tokens[i]))
        d: Decision = self.scheduler.choose(req, self.view(now))
        self._last_decision = d
        exe = d.executor
        holder = d.holder if d.holder >= 0 else exe
        bpt = c.model.kv_bytes_per_token
        moved = 0.0
        ready = now
        src = d.kv_source
        drop_after: list[int] = []
        if d.migrate_from >= 0:
            pref = min(req.reuse_tokens, self.cached_tokens(d.migrate_from, req.session))
            if exe == d.migrate_from:
                # The executor is the old holder: the prefix is already local; the new holder gets
                # the whole context by write-back after the turn, and the old copy is released.
                src = exe
                drop_after.append(exe)
            else:
                # Holder change: move the longest reusable prefix to the new holder first.
                if pref > 0:
                    ready = self._transfer(d.migrate_from, holder, pref, now)
                    self._cache_put(holder, req.session, pref)
                    moved += pref * bpt
                self._cache_drop(d.migrate_from, req.session)
                src = holder
        cached = min(req.reuse_tokens, self.cached_tokens(src, req.session)) if src >= 0 else 0
        remote = src >= 0 and src != exe and cached > 0
        if remote:
            ready = self._transfer(src, exe, cached, ready)
            moved += cached * bpt
        e = self.inst[exe]
        # A full prefix hit still computes the last prompt token to produce the first logits (as vLLM does).
        uncached = max(1, req.input_tokens - cached)
        start = max(e.prefill_free_at, ready, now)
        end = start + c.prefill_time(uncached, e.running, self.colocated)
        e.prefill_free_at = end
        heapq.heappush(e.prefill_jobs, (start, end, float(uncached), float(req.input_tokens)))
        e.backlog_tokens += uncached
        e.assigned += 1
        ttft = end - now
        # Decode: on the executor (colocated) or on the least-busy decode instance (P/D, after moving KV).
        if self.colocated:
            dec_inst, dec_start = exe, end
        else:
            dec_inst = int(self.decode_idx[int(np.argmin([len(self.inst[k].decodes) for k in self.decode_idx]))])
            dec_start = self._transfer(exe, dec_inst, req.input_tokens, end)
            moved += req.input_tokens * bpt
            ttft = dec_start - now  # first token leaves the decode instance
        di = self.inst[dec_inst]
        done = dec_start + c.decode_time(req.output_tokens, len(di.decodes) + 1)
        context = req.input_tokens + req.output_tokens
        heapq.heappush(di.decodes, (done, float(req.output_tokens), float(context)))
        di.gpu_kv_tokens += context
        # KV after the turn: the holder keeps the whole context; what it lacks is written back from
        # where the KV was produced (the decode instance holds the output tokens' KV in P/D).
        if holder != exe or holder != dec_inst:
            missing = max(0, context - self.cached_tokens(holder, req.session))
            if missing > 0:
                prompt_part = min(missing, uncached) if holder != exe else 0
                out_part = missing - prompt_part
                if prompt_part > 0:
                    self._transfer(exe, holder, prompt_part, done)
                    e.kv_writeback_bytes += prompt_part * bpt
                if out_part > 0 and dec_inst != holder:
                    self._transfer(dec_inst, holder, out_part, done)
                    di.kv_writeback_bytes += out_part * bpt
        self._cache_put(holder, req.session, context)
        for i in drop_after:
            if i != holder:
                self._cache_drop(i, req.session)
        e.kv_transfer_bytes += moved
        return RequestResult(i, now, ttft, done, exe, remote, moved)


def _vec_prefill(c: SimConstants, tokens: np.ndarray, running: np.ndarray, colocated: bool) -> np.ndarray:
    m = c.model
    tokens = np.asarray(tokens, dtype=float)
    t = np.where(tokens > 0, m.prefill_fixed_s + tokens / m.prefill_tokens_per_s + m.prefill_quad_s_per_token2 * tokens**2, 0.0)
    if colocated:
        t = t * (1.0 + m.decode_interference * np.minimum(running, m.max_batch) / m.max_batch)
    return t
