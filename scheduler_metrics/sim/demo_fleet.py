"""A live simulated worker fleet for the demo: each simulated instance is a real exporter
(scheduler_metrics.instrumentation.WorkerMetrics on its own loopback port, scraped by TurboProm),
and a Vesta scheduler places the replayed trace's requests using TurboProm's congestion API.

Time runs ``speed`` x faster than the wall clock; the trace is replayed in a loop.

Each instance also publishes its GPU prefix cache's changes as vLLM KV events over ZMQ
(``sim/kv_publisher.py``: vLLM's PUB framing and replay socket); ``kv_event_endpoints`` are the
``congestion.kv_events`` entries that point TurboProm's prefix view at them.

Given the KedgeFlow grant key (``control_key_pem``), the fleet also serves its scheduler's control
endpoint (``schedulers/control.py``: it trusts grants signed by that key only) and runs the
scheduler's rebalancing loop (``schedulers/rebalance.py``), which proposes KV migrations off
congested instances through the server. An approved migration is carried out in the simulation's
own thread, between events: the session's KV moves over the simulated links to its new holder.
"""
from __future__ import annotations

import heapq
import logging
import threading
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np

from scheduler_metrics.instrumentation import SchedulerMetrics, WorkerMetrics
from scheduler_metrics.kedgeflow.grant import GrantVerifier
from scheduler_metrics.loopback_ports import free_ports
from scheduler_metrics.schedulers.base import Decision
from scheduler_metrics.schedulers.control import ControlServer, SchedulerControl
from scheduler_metrics.schedulers.rebalance import KVRebalancer
from scheduler_metrics.schedulers.vesta import VestaScheduler
from scheduler_metrics.sim.cluster import ClusterSim, RequestResult
from scheduler_metrics.sim.kv_publisher import SessionKVPublisher
from scheduler_metrics.sim.live import LiveSignals
from scheduler_metrics.sim.replay import time_scale_for
from scheduler_metrics.sim.signals import instance_name
from scheduler_metrics.sim.trace import Trace
from scheduler_metrics.sim.traces import load_trace

log = logging.getLogger("turboprom.demo")


@dataclass
class _Move:
    session: int
    to: int
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, Any] | None = None


class Migrations:
    """Approved migrations handed from the control endpoint's thread to the simulation's thread.

    ``submit`` waits until the simulation carried the move out, or withdraws it: a move is either
    applied (result returned) or never applied (None), never both."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[_Move] = []

    def submit(self, session: int, to: int, timeout_s: float = 5.0) -> dict[str, Any] | None:
        mv = _Move(session, to)
        with self._lock:
            self._queue.append(mv)
        if mv.done.wait(timeout_s):
            return mv.result
        with self._lock:
            if mv.result is None:
                self._queue.remove(mv)
            return mv.result

    def apply(self, sim: ClusterSim, vesta: VestaScheduler) -> None:
        """In the simulation's thread: move each queued session's KV to its new holder and pin it there."""
        with self._lock:
            for mv in self._queue:
                src = vesta.holder.get(mv.session, -1)
                tokens = sim.migrate_kv(mv.session, src, mv.to) if src >= 0 else 0
                vesta.pin_holder(mv.session, mv.to)
                mv.result = {"from": src, "moved_kv_tokens": int(tokens),
                             "moved_kv_bytes": int(tokens * sim.c.model.kv_bytes_per_token), "sim_time_s": round(sim.now, 3)}
                mv.done.set()
            self._queue.clear()


class FleetSignals(LiveSignals):
    """Workers export through their own prometheus-client registries (scraped, not pushed)."""

    def __init__(self, base_url: str, workers: list[WorkerMetrics], speed: float, cluster: str,
                 migrations: Migrations | None = None, vesta: VestaScheduler | None = None,
                 kv_publishers: list[SessionKVPublisher] | None = None):
        super().__init__(base_url, speed=speed, cluster=cluster)
        self.workers = workers
        self.kv_publishers = kv_publishers or []
        self.migrations, self.vesta = migrations, vesta
        self._last = np.zeros((len(workers), 6))
        self.held: list[list[tuple[int, int]]] = [[] for _ in workers]  # per instance: largest held session KVs

    def observe(self, now: float, cl: ClusterSim) -> None:
        if self.migrations is not None and self.vesta is not None:
            self.migrations.apply(cl, self.vesta)
        super().observe(now, cl)

    def export(self, cl: ClusterSim) -> None:
        # what each instance holds (host-DRAM KV of the sessions it is holder of), read by the rebalancer
        self.held = [heapq.nlargest(_HELD_LISTED, s.cache.items(), key=itemgetter(1)) for s in cl.inst]
        cap = cl.c.hw.gpu_kv_capacity_tokens
        for i, (w, s) in enumerate(zip(self.workers, cl.inst)):
            w.set_queue(s.waiting, s.running)
            w.set_kv_usage(min(1.0, max(0.0, s.gpu_kv_tokens / cap)))
            w.set_prefill_backlog(s.backlog_tokens)
            w.set_prefill_capacity(cl.c.model.prefill_tokens_per_s)
            cur = np.array([s.prompt_tokens, s.prefill_computed, s.generation_tokens, s.kv_transfer_bytes - s.kv_migrated_bytes,
                            s.kv_writeback_bytes, s.kv_migrated_bytes])
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
            if d[5]:
                w.add_kv_transfer(int(d[5]), "in", "approved_migration")
            self._last[i] = cur
            # The simulated engine admits past its KV capacity where vLLM would preempt: count it as vLLM does.
            if s.gpu_kv_tokens > cap:
                w.preempted()
        # the GPU prefix caches' changes as vLLM KV events (BlockStored / BlockRemoved)
        for pub, s in zip(self.kv_publishers, cl.inst):
            pub.sync(s.gpu)


class DemoFleet:
    def __init__(self, base_url: str, trace_path: str, *, instances: int = 8, load: float = 0.7, speed: float = 1.0,
                 cluster: str = "demo", first_port: int = 0, limit: int | None = 4000, control_key_pem: bytes | None = None,
                 rebalance_period_s: float = 5.0, rebalance_cooldown_s: float = 30.0):
        self.base_url, self.instances, self.load, self.speed, self.cluster = base_url, instances, load, speed, cluster
        trace = load_trace(trace_path)
        self.trace: Trace = trace.head(limit) if limit else trace
        self.model = "qwen2.5-7b"
        self.workers = [WorkerMetrics(self.model, cluster=cluster, instance=instance_name(i)) for i in range(instances)]
        self.sched_metrics = SchedulerMetrics("vesta", cluster=cluster, instance="vesta-0")
        # ports are chosen now (the scrape config names them) and served from ``start``: until then a
        # scrape finds nothing, so history written before the fleet starts stays in time order
        picked = free_ports(instances + 2)  # distinct: held open together while the kernel picks them
        self.ports = [first_port + i for i in range(instances)] if first_port else picked[:instances]
        self.sched_port = picked[instances]
        # each engine's KV event publisher (vLLM's PUB + replay ROUTER), bound now on ports the kernel
        # picks: nothing is published before ``start``, and the server's subscribers connecting
        # meanwhile cannot take a port chosen but not yet bound
        self.kv_publishers: list[SessionKVPublisher] = []
        try:
            for _ in range(instances):
                self.kv_publishers.append(SessionKVPublisher())
        except BaseException:
            self._close_publishers()
            raise
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.completed = 0
        self._sim: ClusterSim | None = None
        self._signals: FleetSignals | None = None
        # KedgeFlow: the scheduler's control endpoint and its rebalancing loop (only with a grant key)
        self.migrations = Migrations()
        self.control: SchedulerControl | None = None
        self.control_server: ControlServer | None = None
        self.rebalancer: KVRebalancer | None = None
        if control_key_pem is not None:
            self.control = SchedulerControl(VestaScheduler(instances), GrantVerifier.from_pem(control_key_pem),
                                            mover=self.migrations.submit)
            self.control_server = ControlServer(self.control, picked[instances + 1])
            self.rebalancer = KVRebalancer(base_url, [instance_name(i) for i in range(instances)], self.held_sessions,
                                           lambda session: self.control.holder(session)[1],  # type: ignore[union-attr]
                                           cluster=cluster, model=self.model, period_s=rebalance_period_s,
                                           cooldown_s=rebalance_cooldown_s, on_outcome=self.sched_metrics.control_action)

    @property
    def targets(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]

    @property
    def kv_event_endpoints(self) -> list[dict[str, str]]:
        """The ``congestion.kv_events`` entries of this fleet's publishers."""
        return [{"endpoint": pub.endpoint, "replay_endpoint": pub.replay_endpoint,
                 "instance": instance_name(i), "cluster": self.cluster, "model_name": self.model, "topic": "kv-events"}
                for i, pub in enumerate(self.kv_publishers)]

    @property
    def control_url(self) -> str | None:
        return self.control_server.url if self.control_server is not None else None

    def held_sessions(self, instance: int) -> list[tuple[int, int]]:
        """The largest session KVs ``instance`` holds, as of the last signal period."""
        sig = self._signals
        return list(sig.held[instance]) if sig is not None and instance < len(sig.held) else []

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
        try:
            self._replay()
        finally:  # this thread publishes the KV events: their sockets close here once it is done
            self._close_publishers()

    def _close_publishers(self) -> None:
        pubs, self.kv_publishers = self.kv_publishers, []
        for pub in pubs:
            pub.close()

    def _replay(self) -> None:
        while not self._stop.is_set():
            vesta = VestaScheduler(self.instances)
            if self.control is not None:
                self.control.attach(vesta)
            sig = self._signals = FleetSignals(self.base_url, self.workers, self.speed, self.cluster, self.migrations, vesta,
                                               self.kv_publishers)
            sim = self._sim = ClusterSim(self.trace, vesta, sig, instances=self.instances, load=self.load,
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
        try:
            for w, port in zip(self.workers, self.ports):
                w.serve(port)
            self.sched_metrics.serve(self.sched_port)
            if self.control_server is not None:
                self.control_server.start()
        except BaseException:  # e.g. a port taken meanwhile: release what is open, publishers included
            self.stop()
            raise
        self._thread = threading.Thread(target=self._run, name="demo-fleet", daemon=True)
        self._thread.start()
        if self.rebalancer is not None:
            self.rebalancer.start()

    def stop(self) -> None:
        self._stop.set()
        if self.rebalancer is not None:
            self.rebalancer.stop()
        if self.control_server is not None:
            self.control_server.close()
        for w in self.workers:
            w.close()
        self.sched_metrics.close()
        # the replay thread publishes the KV events and closes their sockets as it ends (a thread
        # still inside a slow step closes them when that step returns; a zmq context must never be
        # left to the garbage collector, whose term() would wait for sockets in use)
        if self._thread is None:
            self._close_publishers()
        else:
            self._thread.join(10.0)


# Session KVs per instance the rebalancer may choose from (the largest held there).
_HELD_LISTED = 8
# A request that produced this many tokens stopped on its length limit (finished_reason="length").
_MAX_TOKENS = 1024
# Inter-token gaps observed per request: the decode of one simulated request is uniform, so a few
# observations carry the distribution without one histogram update per generated token.
_ITL_SAMPLES = 8


class _Stop(Exception):
    pass
