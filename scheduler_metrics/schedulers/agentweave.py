"""AgentWeave: workflows as flow-dependency graphs, decomposable inputs chunked each round.

A stage whose input is *decomposable* (candidates to rerank, frames to encode) is processed in
chunks whose results are correct subsets of the whole, and finished chunks flow to the next stage
while the rest is still running. A *supplement dependency* carries accumulated state from chunk to
chunk: for rerank, the running top-k. Every finished chunk folds its candidates into that state
(``fold_topk``); the fold is order-independent (a total order on (score, id)), so chunks may run
side by side and finish in any order, the state after the last chunk is the top-k of the complete
input (``chunked_topk``, property-tested), and no separate merge step runs at the end.

The chunk size is chosen every round from the queue state and the offline profile of the stage
(``StageProfile``, measured by running the stage's cost model at several batch sizes, see
``sim/workflow_profile.py``): the *pressure* is the queued GPU work, priced with the profiles, per
GPU-second of a horizon; the policy takes the smallest chunk whose batch reaches a profiled
efficiency (throughput relative to the best batch) of at least that pressure. A lightly loaded
system gets small chunks (short rounds: LLM iterations interleave often, stages overlap); a
backlogged one gets the batch sizes that keep up.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property

import numpy as np


# ----------------------------------------------------------------------------- the real computation
def topk(ids: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k by score, ties broken by smaller id (a total order, so chunking cannot change it)."""
    if len(ids) == 0:
        return ids, scores
    order = np.lexsort((ids, -scores))[:k]
    return ids[order], scores[order]


def fold_topk(state: tuple[np.ndarray, np.ndarray], chunk: tuple[np.ndarray, np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Fold one finished chunk's (ids, scores) into the running top-k."""
    return topk(np.concatenate([state[0], chunk[0]]), np.concatenate([state[1], chunk[1]]), k)


def chunked_topk(ids: np.ndarray, scores: np.ndarray, k: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Rerank in chunks, feeding the running top-k (the supplement) into each next chunk."""
    run_ids, run_scores = ids[:0], scores[:0]
    for s in range(0, len(ids), max(chunk, 1)):
        run_ids, run_scores = fold_topk((run_ids, run_scores), (ids[s:s + chunk], scores[s:s + chunk]), k)
    return run_ids, run_scores


# ----------------------------------------------------------------------------- offline profiles
@dataclass(frozen=True)
class StageProfile:
    """Measured batch times of one stage at several batch sizes (the offline profiling phase)."""

    stage: str
    batch_sizes: np.ndarray  # increasing
    batch_times_s: np.ndarray

    def __post_init__(self) -> None:
        if len(self.batch_sizes) < 2 or np.any(np.diff(self.batch_sizes) <= 0):
            raise ValueError(f"profile of {self.stage}: batch sizes must be >= 2 increasing values")
        if np.any(self.batch_times_s <= 0):
            raise ValueError(f"profile of {self.stage}: batch times must be positive")

    @property
    def fit(self) -> tuple[float, float]:
        """Least-squares (fixed seconds, seconds per item) over the measured points."""
        per_item, fixed = np.polyfit(self.batch_sizes.astype(float), self.batch_times_s, 1)
        return float(fixed), float(per_item)

    @cached_property
    def _points(self) -> tuple[list[float], list[float]]:
        return [float(x) for x in self.batch_sizes], [float(x) for x in self.batch_times_s]

    def time(self, items: float) -> float:
        """Estimated batch time: interpolated between measured sizes (flat below the smallest),
        linear beyond the largest."""
        b, t = self._points
        if items <= 0:
            return 0.0
        if items <= b[0]:
            return t[0]
        i = min(bisect.bisect_left(b, items), len(b) - 1)
        return t[i - 1] + (items - b[i - 1]) * (t[i] - t[i - 1]) / (b[i] - b[i - 1])

    def per_item(self, items: float) -> float:
        return self.time(items) / max(items, 1.0)

    @cached_property
    def best_per_item_s(self) -> float:
        return float(np.min(self.batch_times_s / self.batch_sizes))

    @property
    def max_batch(self) -> int:
        """The largest profiled batch (larger batches are not run)."""
        return int(self.batch_sizes[-1])

    def efficiency(self, items: float) -> float:
        """Throughput of a batch of ``items`` relative to the best profiled batch (0..1]."""
        return min(1.0, self.best_per_item_s / self.per_item(items))

    def knee(self, target: float = 0.9) -> int:
        """Smallest profiled batch size whose efficiency reaches ``target``."""
        eff = self.best_per_item_s / (self.batch_times_s / self.batch_sizes)
        return int(self.batch_sizes[int(np.argmax(eff >= target - 1e-12))])


@dataclass(frozen=True)
class ChunkPolicy:
    """AgentWeave's per-round chunk size for one decomposable stage."""

    candidates: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    horizon_s: float = 2.0  # queued work is priced per GPU-second of this horizon

    def pressure(self, queued_work_s: float, gpus: int) -> float:
        """Queue state as a number in [0, 1]: profiled seconds of queued GPU work per GPU-horizon."""
        return float(min(1.0, max(0.0, queued_work_s) / (max(gpus, 1) * self.horizon_s)))

    def choose(self, profile: StageProfile, ready: np.ndarray, pressure: float, gap_s: float = 0.0,
               stalled: int = 0, idle_gpus: int = 0) -> int:
        """Chunk size (items per request per round) given the ready items of each waiting request.

        A chunk size ``c`` forms a batch of ``min(ready, c)`` items from each request, up to the
        profile's largest batch. Sizes whose batch efficiency is below ``pressure`` cannot keep up with
        the queue and are dropped (the largest candidate stays). Among the rest the policy minimizes a
        one-round estimate in request-seconds: a request's ``ceil(ready / c)`` chunks run on this GPU
        and the ``idle_gpus`` idle ones side by side, each round costing the batch time plus
        ``gap_s`` (the GPU's other work between rounds), and the ``stalled`` parties waiting for this
        GPU (running LLM sequences, requests left out of the batch) each wait one batch time."""
        ready = np.asarray(ready, dtype=float)
        if len(ready) == 0:
            return self.candidates[0]
        best, best_cost = self.candidates[-1], float("inf")
        cap = profile.max_batch
        lanes = 1 + max(idle_gpus, 0)
        for c in self.candidates:
            takes = np.minimum(ready, c)
            cum = np.cumsum(takes)
            served = max(1, int(np.searchsorted(cum, cap, side="right")))
            items = float(min(cum[min(served, len(cum)) - 1], cap))
            if profile.efficiency(items) < pressure and c != self.candidates[-1]:
                continue
            tb = profile.time(items)
            rounds = np.ceil(np.ceil(ready[:served] / c) / lanes)
            cost = float(rounds.sum()) * (tb + gap_s) + tb * (stalled + len(ready) - served)
            if cost < best_cost * (1 - 1e-9):
                best, best_cost = c, cost
        return best
