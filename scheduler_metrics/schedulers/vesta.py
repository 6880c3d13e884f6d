"""Vesta: stable KV holders per session, per-request executor choice with congestion pricing.

* Holder: hash of the session id among the instances serving its current context-length bucket.
  When a session grows into the next bucket, its longest reusable prefix moves to the new holder.
* Executor: argmin over candidates of backlog + load + min(fetch + compute, recompute) + prices
  (``VestaScheduler.score``): per candidate, the prefix it already has (holder copy, or a temporary
  GPU copy left by an earlier turn it ran) is reused, the rest is fetched from the holder or
  recomputed, whichever is cheaper there; fetch time includes waiting for the links at both ends.
  Prefill tokens are priced with TurboProm's cluster congestion price (seconds of delay imposed on
  later requests per added token), link seconds with the path's own link price: small with spare
  capacity (borrow idle GPUs early), steep near saturation (prefer less work and transfer).
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
        if self.n_instances < 1:
            raise ValueError(f"vesta needs at least one instance, got {self.n_instances}")
        self._buckets = bucket_members(self.n_instances, np.array(share, dtype=float))

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
        # where the reusable prefix is read from: the holder (after a bucket move, the old holder,
        # whose prefix the simulator first copies to the new one)
        src = h_old if h_old >= 0 else h_new
        cand = cl.candidates
        if self.drained:
            keep = np.array([int(c) not in self.drained for c in cand])
            if keep.any():
                cand = cand[keep]
        sc = self.score(req, cl, cand, src)
        k = int(np.argmin(sc.total))
        exe = int(cand[k])
        self._pending.add(exe, float(sc.compute[k]))
        return Decision(executor=exe, kv_source=h_new, holder=h_new, migrate_from=migrate_from,
                        penalty_s=float(sc.penalty[k]), fetch=bool(sc.fetch[k]))

    def score(self, req: RequestView, cl: ClusterView, cand: np.ndarray, src: int) -> "Score":
        """Per candidate executor ``c``::

            total(c) = backlog(c) + load(c) + min(fetch(c) + prefill(rest) + link_price(c) x fetch(c),
                                                  prefill(all but local))  + compute_price x prefilled(c)

        ``local``: what ``c`` already has on its GPU (as holder, or a temporary copy from an earlier
        turn it ran) or in host DRAM (``load`` = the PCIe copy); the rest of the reusable prefix is
        fetched from ``src`` (``fetch`` includes waiting for the links at both ends, the executor's
        own included) or recomputed, whichever is cheaper on ``c``. Link seconds are priced with the
        path's own congestion price (seconds of others' transfer delay per link second), prefill
        tokens with TurboProm's cluster price (seconds of others' delay per token); prices count
        relative to the cheapest candidate."""
        reuse, sess, n = req.reuse_tokens, req.session, len(cand)
        avail = float(min(reuse, cl.cached_tokens(src, sess)))
        if cl.gpu_cached is not None and cl.host_cached is not None:
            gpu = np.array([min(reuse, cl.gpu_cached(int(c), sess)) for c in cand], dtype=float)
            host = np.array([min(reuse, cl.host_cached(int(c), sess)) for c in cand], dtype=float)
        else:  # a view without tiers: only the source has the prefix, on its GPU
            gpu, host = np.where(cand == src, avail, 0.0), np.zeros(n)
        local = np.maximum(gpu, host)
        load = cl.h2d_time(np.maximum(host - gpu, 0.0)) if cl.h2d_time is not None else np.zeros(n)
        extra = np.maximum(avail - local, 0.0)
        if cl.fetch_time is not None:
            link_s = cl.fetch_time(src, cand, extra)
        else:
            link_s = np.where(extra > 0, np.array([cl.transfer_time(float(x)) for x in extra]) + cl.nic_wait_s[src], 0.0)
        priced = self.use_price
        lprice = cl.link_price(src, cand) if (priced and cl.link_price is not None) else np.zeros(n)
        cprice = cl.price if (priced and np.isfinite(cl.price)) else 0.0
        running = cl.running[cand]
        tok_f = np.maximum(1.0, req.input_tokens - local - extra)
        tok_r = np.maximum(1.0, req.input_tokens - local)
        comp_f = cl.prefill_time(tok_f, running)
        comp_r = cl.prefill_time(tok_r, running)
        time_f, pen_f = load + link_s + comp_f, lprice * link_s + cprice * tok_f
        time_r, pen_r = load + comp_r, cprice * tok_r
        fetch = (time_f + pen_f) <= (time_r + pen_r)
        time = np.where(fetch, time_f, time_r)
        penalty = np.where(fetch, pen_f, pen_r)
        penalty = penalty - penalty.min()
        total = self._pending.backlog(cl)[cand] + time + penalty
        return Score(total, penalty, fetch & (extra > 0), np.where(fetch, comp_f, comp_r))


@dataclass
class Score:
    total: np.ndarray
    penalty: np.ndarray
    fetch: np.ndarray  # True: fetch the missing prefix; False: recompute it (or nothing to fetch)
    compute: np.ndarray  # prefill seconds on each candidate


def bucket_members(n: int, share: np.ndarray) -> list[np.ndarray]:
    """Instance ids per context-length bucket: contiguous ranges sized by ``share``, at least one
    instance each. With fewer instances than buckets, neighbouring buckets share an instance
    (bucket ``b`` of ``nb`` gets instance ``b * n // nb``), so every bucket has a holder."""
    nb = len(share)
    if n < nb:
        return [np.array([b * n // nb]) for b in range(nb)]
    counts = np.maximum(1, np.floor(share / share.sum() * n)).astype(int)
    while counts.sum() > n:
        counts[np.argmax(counts)] -= 1
    while counts.sum() < n:
        counts[np.argmin(counts)] += 1
    edges = np.concatenate([[0], np.cumsum(counts)])
    return [np.arange(edges[b], edges[b + 1]) for b in range(nb)]
