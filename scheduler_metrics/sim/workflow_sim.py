"""Discrete-event simulator of agent workflows (``sim/workflows.py``) on an aggregated deployment.

Every GPU hosts the LLM engine (``LLMEngine``: continuous batching) and the auxiliary models; a
GPU runs one step at a time, alternating LLM iterations with auxiliary-model batches while both
have work (ASSUMPTION: no spatial sharing between the engine and the encoders). CPU/network stages
run on a pool of ``cpu_slots_per_gpu x gpus`` workers. LLM calls go to the engine with the fewest
tokens left to process.

Policies (``POLICIES``), all fed the same arrivals, request shapes, stage models and profiles:

* ``whole``: request-level execution as a plain framework runs it: stages one after another in
  topological order, each stage of a request one unit (batched with other requests' units), FIFO.
* ``ayo``: the graph parallelized and pipelined: branches concurrent, decomposable stages split
  into fixed pieces (the profiled knee) that flow downstream as they finish, independent pieces with
  a merge primitive for a decomposed top-k, FIFO.
* ``autellix``: program-level least attained service over whole calls/stages (parallel branches,
  barriers), PLAS priority in every queue and preemption in the LLM engine.
* ``agentweave``: the graph pipelined, chunk size per round from the queue state and the profiles
  (``ChunkPolicy``), supplement dependencies (each finished chunk folds into a running top-k) instead
  of a merge step, FIFO.

The queue state AgentWeave reads comes from a ``FlowSignals`` source refreshed every signal period:
in process (a snapshot of the simulator's queues) or live (sim/live.py: pushed to a running
TurboProm as ``turboprom_flow_queue_depth`` and read back with a PromQL query).
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import numpy as np

from scheduler_metrics.schedulers.agentweave import ChunkPolicy
from scheduler_metrics.schedulers.workflow_baselines import PlasPriority, ayo_chunk
from scheduler_metrics.sim.constants import DEFAULT, WORKFLOW, CpuStageModel, SimConstants, WorkflowConstants
from scheduler_metrics.sim.llm_engine import LLMEngine, Seq
from scheduler_metrics.sim.workflow_profile import WorkflowProfiles, profile
from scheduler_metrics.sim.workflows import WORKFLOWS, RequestShape, Stage, Workflow, sample_shapes


@dataclass(frozen=True)
class PolicySpec:
    name: str
    pipelined: bool  # stream edges carry finished chunks downstream
    parallel: bool  # independent branches run concurrently
    chunking: str  # "none" | "fixed" | "adaptive"
    supplement: bool  # running top-k between chunks (else decomposed top-k stages end with a merge)
    order: str  # "fifo" | "plas"


POLICIES: dict[str, PolicySpec] = {
    "whole": PolicySpec("whole", False, False, "none", False, "fifo"),
    "ayo": PolicySpec("ayo", True, True, "fixed", False, "fifo"),
    "autellix": PolicySpec("autellix", False, True, "none", False, "plas"),
    "agentweave": PolicySpec("agentweave", True, True, "adaptive", True, "fifo"),
}


@dataclass(eq=False)
class Unit:
    """One stage of one request."""

    req: "FlowRequest"
    idx: int
    stage: Stage
    n: int
    barriers: tuple[int, ...] = ()
    streams: tuple[tuple[int, float], ...] = ()  # (upstream unit index, share of this stage's items)
    avail: int = 0
    started: int = 0
    done: int = 0
    in_flight: int = 0
    complete: bool = False
    merging: bool = False
    folds: int = 0
    seq: Seq | None = None
    first_start_s: float = -1.0
    end_s: float = -1.0

    def progress(self) -> float:
        """Fraction of this stage's output downstream stages may consume."""
        if self.complete:
            return 1.0
        if self.stage.supplement or self.merging:
            return 0.0  # a top-k is final only at the end
        if self.seq is not None:
            return self.seq.decoded / max(self.seq.output, 1)
        return self.done / max(self.n, 1)


@dataclass(eq=False)
class FlowRequest:
    idx: int
    arrival_s: float
    shape: RequestShape
    units: list[Unit] = field(default_factory=list)
    attained_s: float = 0.0
    last_service_s: float = 0.0
    done_s: float = -1.0


class FlowSignals:
    """Queue state as schedulers see it: refreshed every signal period (``observe``)."""

    def observe(self, now: float, sim: "WorkflowSim") -> None:
        self.depths = sim.queue_depths()

    def depth_snapshot(self) -> dict[str, float]:
        return getattr(self, "depths", {})


@dataclass
class FlowResult:
    policy: str
    workflow: str
    rate: float
    seed: int
    requests: int
    arrival_s: np.ndarray
    latency_s: np.ndarray
    gpu_busy: float
    rounds: int
    llm_iterations: int
    mean_chunk: float
    preemptions: int
    merges: int
    overlap_s: float  # summed time a stage ran while an upstream stream-stage of the same request still ran

    def window(self, warmup: float = 0.2) -> np.ndarray:
        """Latencies of requests arriving after the first ``warmup`` share (steady state)."""
        return self.latency_s[int(len(self.latency_s) * warmup):]

    @property
    def p90_s(self) -> float:
        return float(np.percentile(self.window(), 90))

    @property
    def throughput_rps(self) -> float:
        end = self.arrival_s + self.latency_s
        span = float(end.max() - self.arrival_s[0])
        return self.requests / span if span > 0 else 0.0

    def row(self) -> dict:
        w = self.window()
        return {"policy": self.policy, "workflow": self.workflow, "rate_rps": self.rate, "seed": self.seed,
                "requests": self.requests, "throughput_rps": round(self.throughput_rps, 3),
                "mean_latency_s": round(float(w.mean()), 3), "p50_latency_s": round(float(np.percentile(w, 50)), 3),
                "p90_latency_s": round(self.p90_s, 3), "gpu_busy": round(self.gpu_busy, 3), "rounds": self.rounds,
                "llm_iterations": self.llm_iterations, "mean_chunk": round(self.mean_chunk, 1),
                "preemptions": self.preemptions, "merges": self.merges, "overlap_s": round(self.overlap_s, 1)}


class WorkflowSim:
    def __init__(self, wf: Workflow, policy: str, arrivals: np.ndarray, shapes: list[RequestShape], *, gpus: int = 8,
                 c: SimConstants = DEFAULT, wc: WorkflowConstants = WORKFLOW, profiles: WorkflowProfiles | None = None,
                 chunk_policy: ChunkPolicy | None = None, plas: PlasPriority | None = None,
                 signals: FlowSignals | None = None, rate: float = 0.0, seed: int = 0, aux_gpus: int = 0):
        if policy not in POLICIES:
            raise ValueError(f"unknown workflow policy {policy!r}; known: {', '.join(POLICIES)}")
        if len(arrivals) != len(shapes) or len(arrivals) == 0:
            raise ValueError("need one request shape per arrival, and at least one request")
        self.wf, self.p, self.c, self.wc = wf, POLICIES[policy], c, wc
        if not 0 <= aux_gpus < gpus:
            raise ValueError(f"aux_gpus must be in [0, gpus), got {aux_gpus} of {gpus}")
        self.gpus, self.rate, self.seed = gpus, rate, seed
        # GPUs [0, aux_gpus) run only the auxiliary models, the rest only the LLM engine; 0: every
        # GPU runs both (aggregated).
        self.aux_gpus = aux_gpus
        self.llm_gpus = list(range(aux_gpus, gpus))
        self.prof = profiles or profile(wf, c, wc)
        self.cp = chunk_policy or ChunkPolicy()
        self.plas = plas or PlasPriority()
        self.signals = signals or FlowSignals()
        self.rng = np.random.default_rng([seed, 104729])
        self.engines = [LLMEngine(c, kv_tokens=wc.llm_kv_tokens, preempt_for_priority=self.p.order == "plas") for _ in range(gpus)]
        self.gpu_idle = [True] * gpus
        self.gpu_last_llm = [False] * gpus
        self.gpu_busy_s = 0.0
        self.cpu_free = wc.cpu_slots_per_gpu * gpus
        self.cpu_queue: list[tuple[tuple, Unit, CpuStageModel | None]] = []
        self.events: list[tuple[float, int, str, object]] = []
        self.tick = itertools.count()
        self.now = 0.0
        self.rounds = 0
        self.chunks: list[int] = []
        self.merges = 0
        self.overlap_s = 0.0
        self.reqs = [self._make_request(i, float(a), s) for i, (a, s) in enumerate(zip(arrivals, shapes))]
        self.active: list[FlowRequest] = []
        self.gpu_ready: dict[Unit, None] = {}  # GPU-stage units with items not yet started (insertion-ordered)
        self.done = 0
        self.trace: list[tuple[float, str, int, str, int]] = []  # (time, event, request, stage, items), when enabled
        self.record = False

    # ------------------------------------------------------------------------- graph bookkeeping
    def _make_request(self, i: int, arrival: float, shape: RequestShape) -> FlowRequest:
        r = FlowRequest(i, arrival, shape, last_service_s=arrival)
        index = {s.name: k for k, s in enumerate(self.wf.stages)}
        for k, s in enumerate(self.wf.stages):
            barriers = {index[d] for d in s.after}
            streams: tuple[tuple[int, float], ...] = ()
            if self.p.pipelined:
                tot = sum(shape.items[d] for d in s.stream)
                streams = tuple((index[d], shape.items[d] / tot) for d in s.stream)
            else:
                barriers |= {index[d] for d in s.stream}
            if not self.p.parallel:
                barriers |= set(range(k))
            r.units.append(Unit(r, k, s, shape.items[s.name], tuple(sorted(barriers)), streams))
        return r

    def _refresh(self, r: FlowRequest) -> None:
        """Propagate availability through the request's graph (topological order)."""
        for u in r.units:
            if u.complete:
                continue
            if any(not r.units[b].complete for b in u.barriers):
                continue
            if u.streams:
                if all(r.units[k].complete for k, _ in u.streams):
                    avail = u.n
                else:
                    avail = min(u.n, sum(int(r.units[k].progress() * u.n * w + 1e-9) for k, w in u.streams))
            else:
                avail = u.n
            if avail > u.avail:
                u.avail = avail
                self._on_avail(u)
            self._check_complete(u)

    def _on_avail(self, u: Unit) -> None:
        kind = u.stage.kind
        if kind == "llm":
            if u.seq is None and u.avail >= u.n:
                prompt, out = u.req.shape.llm[u.stage.name]
                u.seq = Seq(prompt, out, owner=u, order=self._order(u))
                u.started = u.n
                u.first_start_s = self.now
                g = min(self.llm_gpus, key=lambda i: self.engines[i].load_tokens())
                self.engines[g].submit(u.seq)
                self._wake(g)
                self._mark(u, "submit", 1)
        elif kind == "cpu":
            if self.p.chunking == "none" and u.avail < u.n:
                return
            model: CpuStageModel = getattr(self.wc, u.stage.model)
            while u.started < u.avail:
                u.started += 1
                u.in_flight += 1
                if u.first_start_s < 0:
                    u.first_start_s = self.now
                heapq.heappush(self.cpu_queue, (self._order(u) + (next(self.tick),), u, model))
            self._drain_cpu()
        else:
            self.gpu_ready[u] = None
            self._wake_all()

    def _check_complete(self, u: Unit) -> None:
        if u.complete or u.done < u.n or u.in_flight:
            return
        if u.stage.supplement and not self.p.supplement and self.p.chunking != "none" and not u.merging and u.n > 1:
            # independent pieces: their top-k lists merge in an aggregate primitive (Ayo)
            u.merging = True
            self.merges += 1
            heapq.heappush(self.cpu_queue, (self._order(u) + (next(self.tick),), u, None))
            self._drain_cpu()
            return
        if u.merging:
            return  # the merge primitive is running
        u.complete = True
        u.end_s = self.now
        self._mark(u, "complete", u.n)
        r = u.req
        if all(r.units[i].complete for i in self.wf.sinks()):
            r.done_s = self.now
            self.done += 1

    def _mark(self, u: Unit, what: str, items: int) -> None:
        if self.record:
            self.trace.append((self.now, what, u.req.idx, u.stage.name, items))

    # ------------------------------------------------------------------------- policies
    def _order(self, u: Unit) -> tuple:
        r = u.req
        if self.p.order == "plas":
            return self.plas.key(r.attained_s, self.now - r.last_service_s, r.arrival_s)
        return (0, r.arrival_s)

    def _serve(self, r: FlowRequest, seconds: float, at: float) -> None:
        r.attained_s += seconds
        r.last_service_s = at

    def queue_depths(self) -> dict[str, float]:
        """Items waiting per GPU stage model, and prefill tokens waiting at the LLM engines ("llm")."""
        d: dict[str, float] = {m: 0.0 for m in self.prof.stages}
        for u in self.gpu_ready:
            d[u.stage.model] += u.avail - u.started
        d["llm"] = float(sum(s.prefill_target - s.prefilled for e in self.engines for s in (*e.waiting, *e.running)))
        return d

    def _module_batch(self, g: int) -> tuple[float, list[tuple[Unit, int]]] | None:
        cands = []
        for u in self.gpu_ready:
            if self.p.chunking == "none" and (u.started or u.avail < u.n):
                continue
            cands.append(u)
        if not cands:
            return None
        cands.sort(key=self._order)
        model_name = cands[0].stage.model
        cands = [u for u in cands if u.stage.model == model_name]
        prof = self.prof.stages[model_name]
        if self.p.chunking == "none":
            chunk = 1 << 30
        elif self.p.chunking == "fixed":
            chunk = ayo_chunk(prof)
        else:
            ready = np.array([u.avail - u.started for u in cands])
            pressure = self.cp.pressure(self.prof.queued_work_s(self.signals.depth_snapshot()), self.gpus)
            e = self.engines[g]
            gap = 0.0
            if e.has_work():  # the engine iteration that runs between two rounds on this GPU
                pending = sum(s.prefill_target - s.prefilled for s in (*e.waiting, *e.running))
                gap = self.prof.llm_decode.time(len(e.running)) + min(pending, e.token_budget) * self.prof.llm_prefill_s_per_token
            idle = sum(self.gpu_idle[i] for i in range(self.aux_gpus or self.gpus) if i != g)
            chunk = self.cp.choose(prof, ready, pressure, gap_s=gap, stalled=len(e.running), idle_gpus=idle)
        batch: list[tuple[Unit, int]] = []
        items = 0
        for u in cands:
            take = min(u.avail - u.started, chunk)
            if batch and items + take > prof.max_batch:
                continue
            batch.append((u, take))
            items += take
            if items >= prof.max_batch:
                break
        t = float(getattr(self.wc, model_name).batch_time(items)) + self.wc.dispatch_s
        if self.p.supplement:
            t += self.wc.supplement_handoff_s * sum(1 for u, _ in batch if u.stage.supplement)
        for u, n in batch:
            u.started += n
            u.in_flight += n
            if u.started >= u.avail:
                del self.gpu_ready[u]
            if u.first_start_s < 0:
                u.first_start_s = self.now
            self._mark(u, "start", n)
        if self.p.chunking != "none":
            self.chunks.append(int(np.mean([n for _, n in batch])))
        return t, batch

    # ------------------------------------------------------------------------- resources
    def _wake(self, g: int) -> None:
        if self.gpu_idle[g]:
            self.gpu_idle[g] = False
            heapq.heappush(self.events, (self.now, next(self.tick), "gpu-free", (g, None)))

    def _wake_all(self) -> None:
        for g in range(self.gpus):
            self._wake(g)

    def _gpu_step(self, g: int) -> None:
        e = self.engines[g]
        if self.aux_gpus and g >= self.aux_gpus:  # a dedicated LLM GPU
            use_llm, mb = e.has_work(), None
        else:
            use_llm = e.has_work() and not self.gpu_last_llm[g]
            mb = None if use_llm else self._module_batch(g)
            if mb is None and e.has_work():
                use_llm = True
        if use_llm:
            if self.p.order == "plas":
                for s in (*e.waiting, *e.running):
                    s.order = self._order(s.owner)
            dt, work, _ = e.step(self.now)
            dt += self.wc.dispatch_s
            toks = sum(n for _, n in work) or 1
            for s, n in work:
                self._serve(s.owner.req, dt * n / toks, self.now + dt)
            self.gpu_last_llm[g] = True
            payload: object = ("llm", work)
        elif mb is not None:
            dt, batch = mb
            items = sum(n for _, n in batch)
            for u, n in batch:
                self._serve(u.req, dt * n / items, self.now + dt)
            self.gpu_last_llm[g] = False
            self.rounds += 1
            payload = ("batch", batch)
        else:
            self.gpu_idle[g] = True
            return
        self.gpu_busy_s += dt
        heapq.heappush(self.events, (self.now + dt, next(self.tick), "gpu-free", (g, payload)))

    def _gpu_done(self, payload) -> None:
        kind, work = payload
        touched = set()
        if kind == "llm":
            for s, _ in work:
                u = s.owner
                if s.decoded >= s.output and not u.complete:
                    u.done = u.n
                touched.add(u.req)
        else:
            for u, n in work:
                u.done += n
                u.in_flight -= n
                if self.p.supplement and u.stage.supplement:
                    u.folds += 1  # the chunk's top-k folded into the running state (cost in the batch time)
                self._mark(u, "finish", n)
                touched.add(u.req)
        for r in touched:
            self._refresh(r)

    def _drain_cpu(self) -> None:
        while self.cpu_free > 0 and self.cpu_queue:
            _, u, model = heapq.heappop(self.cpu_queue)
            self.cpu_free -= 1
            m = model or self.wc.topk_merge
            dt = m.median_s * (float(self.rng.lognormal(0.0, m.sigma)) if m.sigma > 0 else 1.0)
            heapq.heappush(self.events, (self.now + dt, next(self.tick), "cpu-done", (u, model is None)))

    def _cpu_done(self, u: Unit, merge: bool) -> None:
        self.cpu_free += 1
        if merge:
            self._finish_merge(u)
        else:
            u.done += 1
            u.in_flight -= 1
            self._refresh(u.req)
        self._drain_cpu()

    def _finish_merge(self, u: Unit) -> None:
        u.merging = False
        u.complete = True
        u.end_s = self.now
        self._mark(u, "complete", u.n)
        r = u.req
        if all(r.units[i].complete for i in self.wf.sinks()):
            r.done_s = self.now
            self.done += 1
        self._refresh(r)

    # ------------------------------------------------------------------------- main loop
    def run(self) -> FlowResult:
        for r in self.reqs:
            heapq.heappush(self.events, (r.arrival_s, next(self.tick), "arrival", r))
        period = self.c.signal_period_s
        heapq.heappush(self.events, (0.0, next(self.tick), "signal", None))
        n = len(self.reqs)
        seen_done = 0
        while self.done < n:
            self.now, _, kind, data = heapq.heappop(self.events)
            if kind == "arrival":
                r = data  # type: ignore[assignment]
                self.active.append(r)  # type: ignore[arg-type]
                self._refresh(r)  # type: ignore[arg-type]
            elif kind == "gpu-free":
                g, payload = data  # type: ignore[misc]
                if payload is not None:
                    self._gpu_done(payload)
                self._gpu_step(g)
            elif kind == "cpu-done":
                u, merge = data  # type: ignore[misc]
                self._cpu_done(u, merge)
            elif kind == "signal":
                self.signals.observe(self.now, self)
                heapq.heappush(self.events, (self.now + period, next(self.tick), "signal", None))
            if self.done != seen_done:
                seen_done = self.done
                self.active = [r for r in self.active if r.done_s < 0]
        for r in self.reqs:
            for u in r.units:
                if u.stage.stream and self.p.pipelined:
                    for k, _ in u.streams:
                        up = r.units[k]
                        self.overlap_s += max(0.0, min(up.end_s, u.end_s) - max(u.first_start_s, up.first_start_s))
        arr = np.array([r.arrival_s for r in self.reqs])
        lat = np.array([r.done_s - r.arrival_s for r in self.reqs])
        span = float((arr + lat).max())
        return FlowResult(self.p.name, self.wf.name, self.rate, self.seed, n, arr, lat,
                          self.gpu_busy_s / (self.gpus * span) if span > 0 else 0.0, self.rounds,
                          sum(e.iterations for e in self.engines), float(np.mean(self.chunks)) if self.chunks else 0.0,
                          sum(s.preemptions for r in self.reqs for u in r.units if u.seq is not None for s in (u.seq,)),
                          self.merges, self.overlap_s)


def make_arrivals(n: int, rate: float, seed: int) -> np.ndarray:
    """Poisson arrivals at ``rate`` requests/s (seeded)."""
    if rate <= 0:
        raise ValueError(f"arrival rate must be positive, got {rate}")
    rng = np.random.default_rng([seed, 15485863])
    return np.cumsum(rng.exponential(1.0 / rate, n))


def simulate(workflow: str, policy: str, rate: float, n: int = 300, seed: int = 1, *, gpus: int = 8,
             c: SimConstants = DEFAULT, wc: WorkflowConstants = WORKFLOW, profiles: WorkflowProfiles | None = None,
             signals: FlowSignals | None = None, chunk_policy: ChunkPolicy | None = None, aux_gpus: int = 0) -> FlowResult:
    wf = WORKFLOWS[workflow] if workflow in WORKFLOWS else None
    if wf is None:
        raise ValueError(f"unknown workflow {workflow!r}; known: {', '.join(WORKFLOWS)}")
    sim = WorkflowSim(wf, policy, make_arrivals(n, rate, seed), sample_shapes(workflow, n, seed, wc), gpus=gpus, c=c, wc=wc,
                      profiles=profiles, signals=signals, chunk_policy=chunk_policy, rate=rate, seed=seed, aux_gpus=aux_gpus)
    return sim.run()


def max_rate_under_slo(workflow: str, policy: str, target_p90_s: float, seed: int, *, n: int = 300, gpus: int = 8,
                       start: float = 1.0, lo: float = 0.05, hi: float = 64.0, refine: int = 6,
                       **kw) -> tuple[float, FlowResult | None]:
    """Largest Poisson arrival rate whose steady-state p90 end-to-end latency stays within
    ``target_p90_s``: double or halve from ``start`` until the target is bracketed (within
    [lo, hi]), then ``refine`` bisections in log space (resolution 2^(1/2^refine)). Returns
    (rate, the run at that rate); (0, None) when even ``lo`` misses the target."""
    def ok(rate: float) -> tuple[bool, FlowResult]:
        r = simulate(workflow, policy, rate, n, seed, gpus=gpus, **kw)
        return r.p90_s <= target_p90_s, r

    rate = start
    passed, run = ok(rate)
    if passed:
        good, good_run, bad = rate, run, None
        while bad is None and good * 2 <= hi:
            passed, run = ok(good * 2)
            if passed:
                good, good_run = good * 2, run
            else:
                bad = good * 2
        if bad is None:
            return good, good_run
    else:
        bad, good, good_run = rate, None, None
        while good is None and bad / 2 >= lo:
            passed, run = ok(bad / 2)
            if passed:
                good, good_run = bad / 2, run
            else:
                bad = bad / 2
        if good is None:
            return 0.0, None
    for _ in range(refine):
        mid = float(np.sqrt(good * bad))
        passed, run = ok(mid)
        if passed:
            good, good_run = mid, run
        else:
            bad = mid
    return good, good_run
