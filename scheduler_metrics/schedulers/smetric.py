"""SMetric baseline: stay on the session's holder until it is overloaded, then migrate the session
(its KV and holdership) to the least-loaded instance.

The overload threshold decides what this baseline is: near zero it is join-shortest-queue with KV
migration, very large it is pure session affinity. The replay accepts ``smetric:SECONDS`` and
docs/scheduling.md reports the sweep; the comparison uses SMetric's best threshold per workload and
load (the strongest version of the baseline), never a value picked for Vesta to win."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from scheduler_metrics.schedulers.base import ClusterView, Decision, PendingWork, RequestView, stable_hash


DEFAULT_THRESHOLD_S = 2.0


@dataclass
class SMetricScheduler:
    n_instances: int
    overload_backlog_s: float = DEFAULT_THRESHOLD_S  # holder counts as overloaded past this much queued prefill work (s)
    name: str = ""
    holder: dict[int, int] = field(default_factory=dict)
    _pending: PendingWork = field(default_factory=PendingWork)

    def __post_init__(self) -> None:
        if not self.name:
            self.name = "smetric" if self.overload_backlog_s == DEFAULT_THRESHOLD_S else f"smetric:{self.overload_backlog_s:g}"

    def choose(self, req: RequestView, cl: ClusterView) -> Decision:
        h = self.holder.get(req.session)
        if h is None:
            h = int(cl.candidates[stable_hash(req.session, "smetric") % len(cl.candidates)])
        backlog = self._pending.backlog(cl)
        work = float(cl.prefill_time(np.array([float(req.input_tokens - req.reuse_tokens)]), cl.running[[h]])[0])
        if backlog[h] <= self.overload_backlog_s:
            self.holder[req.session] = h
            self._pending.add(h, work)
            return Decision(executor=h, kv_source=h, holder=h)
        cand = cl.candidates
        exe = int(cand[int(np.argmin(backlog[cand]))])
        self._pending.add(exe, work)
        self.holder[req.session] = exe
        return Decision(executor=exe, kv_source=h, holder=exe, migrate_from=-1)
