"""AgentWeave: workflows as flow-dependency graphs, decomposable inputs chunked per round.

A workflow is a chain of modules; a module whose input is *decomposable* (documents to embed, passages
to rerank, pages to read) can be processed in chunks whose results are correct subsets of the whole.
A *supplement dependency* carries accumulated state between chunks: for rerank, the running top-k,
so the final top-k equals the top-k over the complete input (``chunked_topk`` below, checked in tests).

Each round the policy picks one chunk size for the decomposable modules from the queue state and the
offline profiles (time = fixed + per_item x items per invocation): for every candidate size it
estimates the round's time (overhead included) and credits completed requests plus partial progress,
and keeps the size with the best credit per second. Smaller chunks admit waiting requests sooner but
cost more rounds and more state-passing overhead; they never shrink a long request's total work.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


# ----------------------------------------------------------------------------- the real computation
def topk(ids: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k by score, ties broken by smaller id (a total order, so chunking cannot change it)."""
    if len(ids) == 0:
        return ids, scores
    order = np.lexsort((ids, -scores))[:k]
    return ids[order], scores[order]


def chunked_topk(ids: np.ndarray, scores: np.ndarray, k: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Rerank in chunks, feeding the running top-k (the supplement) into each next chunk."""
    run_ids, run_scores = ids[:0], scores[:0]
    for s in range(0, len(ids), max(chunk, 1)):
        cand_ids = np.concatenate([run_ids, ids[s:s + chunk]])
        cand_scores = np.concatenate([run_scores, scores[s:s + chunk]])
        run_ids, run_scores = topk(cand_ids, cand_scores, k)
    return run_ids, run_scores


# ----------------------------------------------------------------------------- workflows and profiles
@dataclass(frozen=True)
class Module:
    name: str
    fixed_s: float  # per invocation (batch) cost: kernel launch, model call, index probe
    per_item_s: float  # marginal cost per item in a batch
    decomposable: bool = False
    supplement: bool = False  # carries state between chunks (adds per-chunk overhead)
    max_batch: int = 1 << 30  # items per invocation (LLM calls: concurrent sequences)


@dataclass(frozen=True)
class Workflow:
    name: str
    modules: tuple[Module, ...]
    items_key: tuple[int, ...]  # which request size feeds each module: 0 = docs, 1 = one unit

    def stage_items(self, docs: int) -> list[int]:
        return [docs if k == 0 else 1 for k in self.items_key]


# Offline profiles (seconds) of a small RAG stack on one GPU: a BGE-class embedder batches documents
# at ~0.15 ms each after a 4 ms call cost; vector search is ~6 ms per query; a cross-encoder reranker
# costs ~0.6 ms per passage after 6 ms. Generation of ~120 tokens with a 7B model is memory-bound:
# ~0.9 s for the batch plus ~12 ms per extra concurrent sequence, up to 32 sequences per call (not
# decomposable: one intent). Deep search: a planning call, web-page reads (decomposable, supplement =
# running evidence top-k, ~4 ms per page), and an answer call.
RAG = Workflow("rag", (
    Module("embed", 0.004, 0.00015, decomposable=True),
    Module("retrieve", 0.006, 0.0005),
    Module("rerank", 0.006, 0.0006, decomposable=True, supplement=True),
    Module("generate", 0.9, 0.012, max_batch=32),
), (0, 1, 0, 1))

DEEP_SEARCH = Workflow("deep-search", (
    Module("plan", 0.6, 0.01, max_batch=32),
    Module("read", 0.01, 0.004, decomposable=True, supplement=True),
    Module("answer", 1.1, 0.015, max_batch=32),
), (1, 0, 1))

WORKFLOWS = {w.name: w for w in (RAG, DEEP_SEARCH)}


@dataclass
class FlowRequest:
    idx: int
    arrival_s: float
    docs: int
    stage: int = 0
    remaining: list[int] = field(default_factory=list)  # items not yet started, per stage
    in_flight: int = 0  # items of the current stage running on some worker
    attained_s: float = 0.0
    done_s: float = -1.0


@dataclass
class ChunkPolicy:
    """AgentWeave's chunk-size choice, made each time a worker takes a batch (a scheduling round).

    For each candidate size, the batch the worker would take is estimated with the offline profile
    (time = fixed + per_item x items, plus per-chunk state overhead for supplement chains); its credit
    counts requests the batch completes plus ``partial_credit`` x the fraction of a request's stage it
    covers. Queue state enters as a waiting cost: every ready request the batch leaves out waits for
    it. The size with the best credit per second net of that cost wins; ties go to the larger chunk.
    """

    candidates: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1 << 30)
    round_overhead_s: float = 0.002  # scheduling + dispatch per batch
    chunk_state_overhead_s: float = 0.0008  # per supplement hand-off (state serialization/transfer)
    partial_credit: float = 0.5
    wait_cost: float = 0.05  # credit lost per second a ready request left out of the batch waits

    def choose(self, ready: list[FlowRequest], wf: Workflow, max_batch_items: int) -> int:
        best, best_val = self.candidates[-1], -1.0
        for c in sorted(self.candidates, reverse=True):
            batch = take_batch(ready, wf, max_batch_items, c, dry_run=True)
            if not batch:
                continue
            t = batch_time(batch, wf, self, c)
            credit = 0.0
            for r, n in batch:
                total = max(r.remaining[r.stage] + r.in_flight, 1)
                if n >= r.remaining[r.stage] and r.in_flight == 0 and r.stage == len(wf.modules) - 1:
                    credit += 1.0
                else:
                    credit += self.partial_credit * n / total / len(wf.modules)
            served = {id(r) for r, _ in batch}
            excluded = sum(1 for r in ready if id(r) not in served)
            val = credit / t - self.wait_cost * excluded
            if val > best_val * (1 + 1e-9):
                best, best_val = c, val
        return best


def take_batch(ready: list[FlowRequest], wf: Workflow, max_batch_items: int, chunk: int | None,
               dry_run: bool = False) -> list[tuple[FlowRequest, int]]:
    """A batch for one worker: work of the module of the first ready request, from ready requests
    in priority order, up to ``max_batch_items`` items (a whole unit always fits alone).

    Without decomposition (``chunk`` None) a request's stage is one unit. With it, a decomposable
    stage is taken ``chunk`` items at a time; a supplement chain keeps at most one chunk in flight."""
    if not ready:
        return []
    stage = ready[0].stage
    m = wf.modules[stage]
    out: list[tuple[FlowRequest, int]] = []
    used = 0
    max_batch_items = min(max_batch_items, m.max_batch)
    for r in ready:
        if r.stage != stage or r.remaining[stage] <= 0:
            continue
        if chunk is None or not m.decomposable:
            if r.in_flight:
                continue
            take = r.remaining[stage]
        else:
            if m.supplement and r.in_flight:
                continue
            take = min(r.remaining[stage], chunk)
        if out and used + take > max_batch_items:
            continue
        out.append((r, take))
        used += take
        if used >= max_batch_items:
            break
    if not dry_run:
        for r, n in out:
            r.remaining[stage] -= n
            r.in_flight += n
    return out


def batch_time(batch: list[tuple[FlowRequest, int]], wf: Workflow, policy: "ChunkPolicy", chunk: int | None) -> float:
    m = wf.modules[batch[0][0].stage]
    items = sum(n for _, n in batch)
    t = policy.round_overhead_s + m.fixed_s + m.per_item_s * items
    if chunk is not None and m.supplement:
        t += policy.chunk_state_overhead_s * len(batch)
    return t
