"""Vesta: stable KV holders per session, per-request executor choice with congestion pricing.

* Holder: hash of the session id among the instances serving its current context-length bucket.
  When a session grows into the next bucket, its longest reusable prefix moves to the new holder.
* Executor: argmin over candidates of
      backlog(c) + compute(c) + fetch(c) + price * added_work(c)
  where compute is the prefill of the tokens not covered by the holder's cache, fetch is the time to
  pull the reusable prefix from the holder (0 on the holder itself, including the wait for the
  holder's link), and added_work is the work (in tokens: recomputed tokens + link time expressed in
  prefill tokens) this choice adds relative to the cheapest candidate. ``price`` is TurboProm's
  cluster congestion price (seconds of delay imposed on later requests per token of added work): small
  with spare capacity (borrow idle GPUs early), steep near saturation (prefer less transfer).
* A remote executor writes the new KV state back to the holder (the simulator charges the link).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from scheduler_metrics.schedulers.base import ClusterView, Decision, PendingWork, RequestView, stable_hash


@dataclass
class VestaScheduler:
    n_instances: int
    bucket_bounds: tuple[int, ...] = (16_384, 65_536)  # context-length bucket edges (tokens)
    bucket_share: tuple[float, ...] | None = None  # fraction of instances per bucket (default equal)
    use_price: bool = True
    name: str = "vesta"
    holder: dict[int, int] = field(default_factory=dict)
    _buckets: list[np.ndarray] = field(default_factory=list)
    _pending: PendingWork = field(default_factory=PendingWork)
    # Operator/KedgeFlow actions: a migrated session stays on its new holder while it stays in that
    # length bucket; drained instances receive no new work and hold no new sessions.
    pinned: dict[int, tuple[int, int]] = field(default_factory=dict)  # session -> (holder, bucket)
    drained: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not self.use_price and self.name == "vesta":
            self.name = "vesta-noprice"
        nb = len(self.bucket_bounds) + 1
        share = self.bucket_share or tuple([1.0 / nb] * nb)
        if len(share) != nb:
            raise ValueError(f"bucket_share needs {nb} entries for {len(self.bucket_bounds)} bounds")
        counts = np.maximum(1, np.floor(np.array(share) / sum(share) * self.n_instances)).astype(int)
        while counts.sum() > self.n_instances:
            counts[np.argmax(counts)] -= 1
        while counts.sum() < self.n_instances:
            counts[np.argmin(counts)] += 1
        # Each bucket gets a contiguous range of instance ids.
        order = np.arange(self.n_instances)
        self._buckets, start = [], 0
        for c in counts:
            self._buckets.append(order[start:start + c])
            start += c

    def bucket_of(self, tokens: int) -> int:
        return int(np.searchsorted(np.array(self.bucket_bounds), tokens, side="right"))

    def holder_for(self, session: int, tokens: int) -> int:
        b = self.bucket_of(tokens)
        pin = self.pinned.get(session)
        if pin is not None and pin[1] == b and pin[0] not in self.drained:
            return pin[0]
        members = [int(m) for m in self._buckets[b] if int(m) not in self.drained] or [int(m) for m in self._buckets[b]]
        return members[stable_hash(session, "vesta") % len(members)]

    def pin_holder(self, session: int, instance: int, tokens: int | None = None) -> None:
        """Make ``instance`` the session's holder (a migration approved through KedgeFlow)."""
        cur = self.holder.get(session)
        b = self.bucket_of(tokens) if tokens is not None else next(
            (i for i, mem in enumerate(self._buckets) if cur is not None and cur in set(mem.tolist())), 0)
        self.pinned[session] = (instance, b)
        self.holder[session] = instance

    def choose(self, req: RequestView, cl: ClusterView) -> Decision:
        h_new = self.holder_for(req.session, req.input_tokens)
        h_old = self.holder.get(req.session, -1)
        migrate_from = h_old if (h_old >= 0 and h_old != h_new) else -1
        self.holder[req.session] = h_new
        src = h_old if h_old >= 0 else h_new
        cached = min(req.reuse_tokens, cl.cached_tokens(src, req.session))
        cand = cl.candidates
        if self.drained:
            keep = np.array([int(c) not in self.drained for c in cand])
            if keep.any():
                cand = cand[keep]
        uncached = np.full(len(cand), float(req.input_tokens - cached))
        compute = cl.prefill_time(uncached, cl.running[cand])
        remote = cand != h_new
        fetch = np.where(remote & (cached > 0), cl.transfer_time(cached) + cl.nic_wait_s[h_new], 0.0)
        # Work in prefill-token units: the link time a remote fetch adds, at the candidate's rate.
        tps = np.where(cl.service_tps[cand] > 0, cl.service_tps[cand], 1.0)
        work = uncached + fetch * tps
        added = work - work.min()
        price = cl.price if (self.use_price and np.isfinite(cl.price)) else 0.0
        penalty = price * added
        backlog = self._pending.backlog(cl)[cand]
        score = backlog + compute + fetch + penalty
        k = int(np.argmin(score))
        exe = int(cand[k])
        self._pending.add(exe, float(compute[k]))
        return Decision(executor=exe, kv_source=h_new, holder=h_new,
                        migrate_from=migrate_from, penalty_s=float(penalty[k]))
