"""Discrete-event cluster of LLM serving instances (colocated prefill/decode, or disaggregated P/D).

Per instance (one GPU): a FIFO prefill server, a continuous decode batch, a GPU prefix cache (LRU:
sessions between turns and temporary copies of fetched prefixes), and a host-DRAM KV store for the
sessions it holds (LRU). GPUs are grouped into nodes; KV crosses nodes over the node's NIC (shared
by ``gpus_per_nic`` GPUs) and moves inside a node over NVLink; each link keeps a reservation
timeline (``links.py``), so a transfer takes the earliest gap at or after the time its data exists.
KV in host DRAM is loaded into the GPU over PCIe before it is used.

Colocated instances run chunked prefill: running decodes stall while a prefill runs on their GPU
(``SimConstants.decode_stall_fraction``), so a decode's end moves when later prefills land on its
GPU. Completion times are therefore settled lazily: a completion event whose request was delayed
since is pushed again at its new time, and a session's next turn is issued only from the settled
completion (after the turn's think/tool time, if the trace has one).

Per-request Python is inherent to a discrete-event simulation (this is a tool, not a serving hot
path); per-candidate scoring in the schedulers is numpy.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from scheduler_metrics.schedulers.base import ClusterView, Decision, RequestView, Scheduler
from scheduler_metrics.sim.constants import DEFAULT, SimConstants
from scheduler_metrics.sim.links import LinkTimeline, reserve
from scheduler_metrics.sim.trace import Trace

LINK_PRICE_WINDOW_S = 2.0  # reservations in [now, now + window) give a link's committed utilization
LINK_RHO_MAX = 0.95


@dataclass
class InstanceState:
    role: str  # "colocated" | "prefill" | "decode"
    node: int = 0
    prefill_free_at: float = 0.0
    prefill_jobs: list = field(default_factory=list)  # heap of (start, end, uncached tokens, prompt tokens)
    decodes: list = field(default_factory=list)  # heap of (end as first scheduled, request idx)
    gpu: OrderedDict = field(default_factory=OrderedDict)  # session -> KV tokens in the GPU prefix cache (LRU)
    gpu_tokens: int = 0
    cache: OrderedDict = field(default_factory=OrderedDict)  # session -> KV tokens in host DRAM (LRU)
    cache_tokens: int = 0
    nvlink: LinkTimeline = field(default_factory=LinkTimeline)
    # counters as of the last advance()
    prefill_computed: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    requests_done: float = 0.0
    kv_transfer_bytes: float = 0.0
    kv_writeback_bytes: float = 0.0
    kv_migrated_bytes: float = 0.0  # of kv_transfer_bytes: received by approved migrations (``migrate_kv``)
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
    ready_s: float = 0.0  # when the request's KV inputs were on the executor
    prefill_start_s: float = 0.0
    prefill_end_s: float = 0.0
    cached_tokens: int = 0  # prompt tokens whose KV was reused (local, loaded or fetched)
    computed_tokens: int = 0  # prompt tokens prefilled
    recomputed: bool = False  # a remote executor recomputed a prefix it could have fetched
    output_tokens: int = 0
    decode_start_s: float = 0.0


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
    floor_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # zero-queue TTFT per request
    decode_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # decode duration per request
    out_tok: np.ndarray = field(default_factory=lambda: np.zeros(0))
    recompute_fraction: float = 0.0
    prefill_util: float = float("nan")  # prefill busy time / (prefill instances x makespan)
    details: list = field(default_factory=list)  # RequestResult per request, in completion order

    @property
    def mean_ttft_ms(self) -> float:
        return float(self.ttft_s.mean() * 1000) if len(self.ttft_s) else float("nan")

    def pct_ttft_ms(self, q: float) -> float:
        return float(np.percentile(self.ttft_s, q) * 1000) if len(self.ttft_s) else float("nan")

    @property
    def floor_ms(self) -> float:
        return float(self.floor_s.mean() * 1000) if len(self.floor_s) else float("nan")

    @property
    def queue_share(self) -> float:
        """Share of mean TTFT above the zero-queue floor (queueing, transfers, interference)."""
        m = self.mean_ttft_ms
        return (m - self.floor_ms) / m if m > 0 else float("nan")

    @property
    def throughput_tps(self) -> float:
        span = float(self.done_s.max() - self.issued_s.min()) if len(self.done_s) else 0.0
        return self.output_tokens / span if span > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        """Mean per-request decode speed (output tokens / decode seconds), the paper's TPS."""
        ok = self.decode_s > 0
        return float(np.mean(self.out_tok[ok] / self.decode_s[ok])) if ok.any() else float("nan")

    def row(self) -> dict:
        return {"scheduler": self.scheduler, "load": self.load, "requests": self.requests,
                "mean_ttft_ms": round(self.mean_ttft_ms, 2), "p50_ttft_ms": round(self.pct_ttft_ms(50), 2),
                "p99_ttft_ms": round(self.pct_ttft_ms(99), 2), "throughput_tps": round(self.throughput_tps, 2),
                "kv_transfer_bytes": int(self.kv_transfer_bytes), "floor_ttft_ms": round(self.floor_ms, 2),
                "queue_share": round(self.queue_share, 4), "decode_tps": round(self.decode_tps, 2),
                "remote_fraction": round(self.remote_fraction, 4), "recompute_fraction": round(self.recompute_fraction, 4),
                "prefill_util": round(self.prefill_util, 4)}


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
            roles = ["prefill"] * p + ["decode"] * d
        else:
            roles = ["colocated"] * instances
        hw = constants.hw
        self.inst = [InstanceState(r, node=i // hw.gpus_per_node) for i, r in enumerate(roles)]
        self.n = len(self.inst)
        self.node = np.array([s.node for s in self.inst], dtype=np.int64)
        # one NIC per ``gpus_per_nic`` GPUs of a node
        nic_of = [(s.node, (i % hw.gpus_per_node) // max(hw.gpus_per_nic, 1)) for i, s in enumerate(self.inst)]
        nics: dict[tuple[int, int], LinkTimeline] = {}
        self.nic = [nics.setdefault(k, LinkTimeline()) for k in nic_of]
        self.colocated = disaggregated is None
        self.prefill_idx = np.array([i for i, s in enumerate(self.inst) if s.role != "decode"], dtype=np.int64)
        self.decode_idx = np.array([i for i, s in enumerate(self.inst) if s.role != "prefill"], dtype=np.int64)
        self.now = 0.0
        self.signal_time = 0.0
        n_req = len(trace)
        self._done = np.zeros(n_req)  # current (possibly still moving) completion time per request
        self._dec_start = np.zeros(n_req)
        self._ctx = np.zeros(n_req)
        self._kv_ready: dict[tuple[int, int], float] = {}  # (holder, session) -> when its written-back KV is complete

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
                t, idx = heapq.heappop(dec)
                if self._done[idx] > t:  # delayed by prefills that landed on this GPU since
                    heapq.heappush(dec, (float(self._done[idx]), idx))
                    continue
                s.generation_tokens += float(self.trace.output_tokens[idx])
                s.requests_done += 1
                s.gpu_kv_tokens -= self._ctx[idx]
            s.running = len(dec)

    def cached_tokens(self, i: int, session: int) -> int:
        s = self.inst[i]
        return int(max(s.cache.get(session, 0), s.gpu.get(session, 0)))

    def gpu_cached(self, i: int, session: int) -> int:
        return int(self.inst[i].gpu.get(session, 0))

    def host_cached(self, i: int, session: int) -> int:
        return int(self.inst[i].cache.get(session, 0))

    def _put(self, tier: OrderedDict, s: InstanceState, attr: str, cap: int, session: int, tokens: int) -> None:
        old = tier.pop(session, 0)
        total = getattr(s, attr) + tokens - old
        tier[session] = tokens
        while total > cap and len(tier) > 1:
            _, t = tier.popitem(last=False)
            total -= t
        setattr(s, attr, total)

    def _cache_put(self, i: int, session: int, tokens: int) -> None:
        s = self.inst[i]
        self._put(s.cache, s, "cache_tokens", self.c.hw.host_kv_capacity_tokens, session, tokens)

    def _gpu_put(self, i: int, session: int, tokens: int) -> None:
        s = self.inst[i]
        self._put(s.gpu, s, "gpu_tokens", self.c.hw.gpu_cache_tokens, session, tokens)

    def _cache_drop(self, i: int, session: int) -> None:
        s = self.inst[i]
        s.cache_tokens -= s.cache.pop(session, 0)

    def _links(self, src: int, dst: int) -> tuple[list[LinkTimeline], bool]:
        if self.inst[src].node == self.inst[dst].node:
            return [self.inst[src].nvlink, self.inst[dst].nvlink], True
        a, b = self.nic[src], self.nic[dst]
        return ([a] if a is b else [a, b]), False

    def _transfer(self, src: int, dst: int, tokens: float, not_before: float, done_by: float | None = None) -> float:
        """Move KV from ``src`` to ``dst`` over the links between them; returns when it is at ``dst``.

        The transfer takes the earliest common gap on its links at or after ``not_before``. With
        ``done_by`` (KV streamed layer by layer while it is produced), it may start up to its own
        duration before ``done_by`` but completes no earlier than ``done_by``."""
        if tokens <= 0 or src == dst:
            return max(not_before, done_by or 0.0)
        links, same = self._links(src, dst)
        dur = self.c.network_time(tokens, same)
        start_at = not_before if done_by is None else max(not_before, done_by - dur)
        for link in links:
            link.prune(self.now)
        start = reserve(links, max(start_at, self.now), dur)
        end = start + dur
        return max(end, done_by or 0.0)

    def migrate_kv(self, session: int, src: int, dst: int) -> int:
        """Move the session's held KV (``src``'s host-DRAM copy) to ``dst`` now, over the links between
        them: what an approved KV migration does. Returns the tokens moved. Call it from the thread
        that runs the simulation, between events."""
        tokens = self.host_cached(src, session)
        if tokens <= 0 or src == dst:
            return 0
        ready = self._transfer(src, dst, tokens, max(self.now, self._kv_ready.get((src, session), self.now)))
        self._cache_put(dst, session, tokens)
        self._kv_ready[(dst, session)] = ready
        self._cache_drop(src, session)
        nbytes = tokens * self.c.model.kv_bytes_per_token
        self.inst[dst].kv_transfer_bytes += nbytes
        self.inst[dst].kv_migrated_bytes += nbytes
        return tokens

    def kv_usage(self) -> np.ndarray:
        """GPU KV-cache usage (0..1) from the running sequences, as vLLM reports it."""
        return np.minimum(np.array([s.gpu_kv_tokens for s in self.inst], dtype=float) / self.c.hw.gpu_kv_capacity_tokens, 1.0)

    def _fetch_time(self, src: int, dsts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        now, out = self.now, np.zeros(len(dsts))
        for k, (d, tok) in enumerate(zip(dsts.tolist(), np.asarray(tokens, dtype=float).tolist())):
            if d == src or tok <= 0:
                continue
            links, same = self._links(src, d)
            wait = max(link.free_at(now) for link in links) - now
            out[k] = wait + self.c.network_time(tok, same)
        return out

    def _link_price(self, src: int, dsts: np.ndarray) -> np.ndarray:
        """M/M/1 externality of one more second of link time: rho / (1 - rho)^2 seconds of delay
        imposed on later transfers, with rho the committed utilization of the busiest link on the
        path over the next ``LINK_PRICE_WINDOW_S``."""
        now, w = self.now, LINK_PRICE_WINDOW_S
        out = np.zeros(len(dsts))
        for k, d in enumerate(dsts.tolist()):
            if d == src:
                continue
            links, _ = self._links(src, d)
            rho = min(LINK_RHO_MAX, max(link.reserved_between(now, now + w) for link in links) / w)
            out[k] = rho / (1.0 - rho) ** 2
        return out

    def view(self, now: float) -> ClusterView:
        backlog_s, queue_len, price, tps = self.signals.view_arrays(now, self)
        c = self.c
        nic_wait = np.array([max(0.0, self.nic[i].free_at(now) - now) for i in range(self.n)])
        return ClusterView(
            n=self.n, backlog_s=backlog_s, queue_len=queue_len,
            running=np.array([s.running for s in self.inst], dtype=float), kv_usage=self.kv_usage(), price=price,
            service_tps=tps, candidates=self.prefill_idx, cached_tokens=self.cached_tokens,
            prefill_time=lambda tok, run: prefill_times(c, tok, run, self.colocated),
            transfer_time=c.transfer_time, nic_wait_s=nic_wait, signal_time=self.signal_time,
            gpu_cached=self.gpu_cached, host_cached=self.host_cached,
            h2d_time=c.h2d_time,
            fetch_time=self._fetch_time, link_price=self._link_price)

    def zero_queue_ttft(self) -> np.ndarray:
        """Per request: TTFT on an idle cluster with the whole reusable prefix already on the GPU."""
        tok = np.maximum(1, self.trace.input_tokens - self.trace.reuse_tokens).astype(float)
        return prefill_times(self.c, tok, np.zeros(len(tok)), self.colocated)

    # ---------------------------------------------------------------- the run
    def run(self) -> SimResult:
        tr, c = self.trace, self.c
        arrival = tr.arrival_s * self.time_scale
        gap = tr.gap_s if tr.gap_s is not None else np.zeros(len(tr))
        nxt = np.full(len(tr), -1, dtype=np.int64)  # next turn of the same session
        last_of: dict[int, int] = {}
        for i, sess in enumerate(tr.session.tolist()):
            j = last_of.get(sess)
            if j is not None:
                nxt[j] = i
            last_of[sess] = i
        first = np.ones(len(tr), dtype=bool)
        first[nxt[nxt >= 0]] = False
        # events: (time, kind, request): kind 0 = issue a turn, 1 = a turn's completion (settles lazily)
        heap = [(float(arrival[i]), 0, int(i)) for i in np.flatnonzero(first)]
        heapq.heapify(heap)
        results: list[RequestResult] = []
        pending: dict[int, tuple[RequestResult, Decision]] = {}
        period = c.signal_period_s
        next_obs = 0.0
        total = len(tr)
        while heap:
            t, kind, i = heapq.heappop(heap)
            while next_obs <= t:
                self.advance(next_obs)
                self.signals.observe(next_obs, self)
                self.signal_time = next_obs
                next_obs += period
            self.advance(t)
            if kind == 0:
                res = self._dispatch(i, t)
                pending[i] = (res, self._last_decision)  # type: ignore[assignment]
                heapq.heappush(heap, (res.done_s, 1, i))
                continue
            if self._done[i] > t:
                heapq.heappush(heap, (float(self._done[i]), 1, i))
                continue
            res, d = pending.pop(i)
            res.done_s = float(self._done[i])
            results.append(res)
            if self.on_result is not None:
                self.on_result(res, d)
            if nxt[i] >= 0:
                j = int(nxt[i])
                heapq.heappush(heap, (max(float(arrival[j]), res.done_s + float(gap[j])), 0, j))
            if self.progress and len(results) % 500 == 0:
                self.progress(len(results), total)
        if self.progress:
            self.progress(total, total)
        floor = self.zero_queue_ttft()
        order = np.array([r.idx for r in results], dtype=np.int64)
        assigned = np.array([s.assigned for s in self.inst])
        remote = [r.remote for r in results]
        busy = sum(r.prefill_end_s - r.prefill_start_s for r in results)
        span = max((r.done_s for r in results), default=0.0) - min((r.issued_s for r in results), default=0.0)
        return SimResult(self.scheduler.name, self.load, len(results), np.array([r.ttft_s for r in results]),
                         np.array([r.issued_s for r in results]), np.array([r.done_s for r in results]),
                         int(tr.output_tokens.sum()),
                         float(sum(s.kv_transfer_bytes + s.kv_writeback_bytes for s in self.inst)),
                         float(np.mean(remote)) if results else 0.0, assigned,
                         floor_s=floor[order] if len(order) else floor[:0],
                         decode_s=np.array([r.done_s - r.decode_start_s for r in results]),
                         out_tok=np.array([r.output_tokens for r in results], dtype=float),
                         recompute_fraction=float(np.mean([r.recomputed for r in results])) if results else 0.0,
                         prefill_util=busy / (len(self.prefill_idx) * span) if span > 0 else float("nan"),
                         details=results)

    def _dispatch(self, i: int, now: float) -> RequestResult:
        tr, c = self.trace, self.c
        req = RequestView(i, int(tr.session[i]), int(tr.input_tokens[i]), int(tr.output_tokens[i]), int(tr.reuse_tokens[i]))
        d: Decision = self.scheduler.choose(req, self.view(now))
        self._last_decision = d
        exe = d.executor
        holder = d.holder if d.holder >= 0 else exe
        sess = req.session
        bpt = c.model.kv_bytes_per_token
        moved = 0.0
        ready = now
        src = d.kv_source
        drop_after: list[int] = []
        if d.migrate_from >= 0:
            pref = min(req.reuse_tokens, self.cached_tokens(d.migrate_from, sess))
            if exe == d.migrate_from:
                # The executor is the old holder: the prefix is already local; the new holder gets
                # the whole context by write-back after the turn, and the old copy is released.
                src = exe
                drop_after.append(exe)
            else:
                # Holder change: move the longest reusable prefix to the new holder first.
                if pref > 0:
                    ready = self._transfer(d.migrate_from, holder, pref, max(now, self._kv_ready.get((d.migrate_from, sess), now)))
                    self._cache_put(holder, sess, pref)
                    self._kv_ready[(holder, sess)] = ready
                    moved += pref * bpt
                self._cache_drop(d.migrate_from, sess)
                src = holder
        e = self.inst[exe]
        local_gpu = min(req.reuse_tokens, self.gpu_cached(exe, sess))
        local_host = min(req.reuse_tokens, self.host_cached(exe, sess))
        cached = max(local_gpu, local_host)
        if local_host > local_gpu:  # load from host DRAM into the GPU
            ready = max(ready, self._kv_ready.get((exe, sess), now)) + c.h2d_time(local_host - local_gpu)
        remote = False
        recomputed = False
        if src >= 0 and src != exe:
            avail = min(req.reuse_tokens, self.cached_tokens(src, sess))
            extra = avail - cached
            if extra > 0 and d.fetch:
                ready = max(ready, self._transfer(src, exe, extra, max(now, self._kv_ready.get((src, sess), now))))
                moved += extra * bpt
                cached = avail
                remote = True
            elif extra > 0:
                recomputed = True
        # A full prefix hit still computes the last prompt token to produce the first logits (as vLLM does).
        uncached = max(1, req.input_tokens - cached)
        start = max(e.prefill_free_at, ready, now)
        end = start + c.prefill_time(uncached, e.running, self.colocated)
        e.prefill_free_at = end
        heapq.heappush(e.prefill_jobs, (start, end, float(uncached), float(req.input_tokens)))
        e.backlog_tokens += uncached
        e.assigned += 1
        ttft = end - now
        context = req.input_tokens + req.output_tokens
        if self.colocated:
            self._stall_running(exe, start, end)
            dec_inst, dec_start = exe, end
        else:
            dec_inst = int(self.decode_idx[int(np.argmin([len(self.inst[k].decodes) for k in self.decode_idx]))])
            dec_start = self._transfer(exe, dec_inst, req.input_tokens, start, done_by=end)
            moved += req.input_tokens * bpt
            ttft = dec_start - now  # first token leaves the decode instance
        di = self.inst[dec_inst]
        done = dec_start + c.decode_time(req.output_tokens, len(di.decodes) + 1, di.gpu_kv_tokens + req.input_tokens)
        self._done[i], self._dec_start[i], self._ctx[i] = done, dec_start, context
        heapq.heappush(di.decodes, (done, i))
        di.gpu_kv_tokens += context
        # KV after the turn: the executor's GPU keeps the context (a temporary copy when it is not the
        # holder); the holder keeps it in host DRAM. What the holder lacks is written back from where
        # the KV was produced (the decode instance holds the output tokens' KV in P/D).
        self._gpu_put(dec_inst, sess, context)
        if dec_inst != exe:
            self._gpu_put(exe, sess, req.input_tokens)
        if holder != exe or holder != dec_inst:
            missing = max(0, context - self.cached_tokens(holder, sess))
            if missing > 0:
                prompt_part = min(missing, uncached) if holder != exe else 0
                out_part = missing - prompt_part
                wb_ready = now
                if prompt_part > 0:
                    wb_ready = max(wb_ready, self._transfer(exe, holder, prompt_part, start, done_by=end))
                    e.kv_writeback_bytes += prompt_part * bpt
                if out_part > 0 and dec_inst != holder:
                    wb_ready = max(wb_ready, self._transfer(dec_inst, holder, out_part, done))
                    di.kv_writeback_bytes += out_part * bpt
                self._kv_ready[(holder, sess)] = max(wb_ready, done)
        self._cache_put(holder, sess, context)
        for k in drop_after:
            if k != holder:
                self._cache_drop(k, sess)
        e.kv_transfer_bytes += moved
        return RequestResult(i, now, ttft, done, exe, remote, moved, ready_s=ready, prefill_start_s=start, prefill_end_s=end,
                             cached_tokens=int(req.input_tokens - uncached), computed_tokens=int(uncached),
                             recomputed=recomputed, output_tokens=req.output_tokens, decode_start_s=dec_start)

    def _stall_running(self, k: int, start: float, end: float) -> None:
        """A prefill on GPU ``k`` during [start, end) stalls the decodes running there (chunked prefill)."""
        s = self.inst[k]
        if not s.decodes:
            return
        frac = self.c.decode_stall_fraction(len(s.decodes), s.gpu_kv_tokens)
        rate = 1.0 - frac  # decode progress per second while the prefill runs
        for _, idx in s.decodes:
            lo = max(start, self._dec_start[idx])
            left = self._done[idx] - lo
            if left > 0 and end > lo:
                self._done[idx] = lo + left / rate if left <= rate * (end - lo) else self._done[idx] + frac * (end - lo)


def prefill_times(c: SimConstants, tokens: np.ndarray, running: np.ndarray, colocated: bool) -> np.ndarray:
    """``SimConstants.prefill_time`` over arrays of token counts and running-decode counts."""
    m = c.model
    tokens = np.asarray(tokens, dtype=float)
    t = np.where(tokens > 0, m.prefill_fixed_s + tokens / m.prefill_tokens_per_s + m.prefill_quad_s_per_token2 * tokens**2, 0.0)
    if colocated:
        running = np.asarray(running, dtype=float)
        step = np.where(running > 0, m.decode_step_base_s, 0.0)
        t = t * (1.0 + step / c.chunk_time())
    return t
