"""The four agent applications as flow-dependency graphs, and their request-size generators.

A stage names its upstream stages two ways: ``stream`` (items finished upstream flow in as they
finish: a retrieved shard's candidates, a fetched page's passages, a sub-query the planning call has
already decoded) and ``after`` (a barrier: the whole upstream stage must finish first, e.g. the answer
call needs the final top-k). Policies that do not pipeline treat every edge as a barrier.

Request sizes are lognormal (heavy-tailed, like retrieved sets and web sessions); each application
states its medians below. Stage costs live in ``constants.WorkflowConstants``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler_metrics.sim.constants import WORKFLOW, WorkflowConstants


@dataclass(frozen=True)
class Stage:
    name: str
    kind: str  # "gpu" (an auxiliary model batched on a GPU), "cpu" (index/tool/decode), "llm" (an LLM call)
    model: str  # attribute of WorkflowConstants (gpu, cpu) or "llm"
    stream: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    decomposable: bool = False
    supplement: bool = False  # a running top-k carried from chunk to chunk (else chunks merge at the end)


@dataclass(frozen=True)
class Workflow:
    name: str
    stages: tuple[Stage, ...]  # in a topological order

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for s in self.stages:
            for d in (*s.stream, *s.after):
                if d not in seen:
                    raise ValueError(f"workflow {self.name}: stage {s.name} depends on {d!r}, which is not an earlier stage")
            if s.kind not in ("gpu", "cpu", "llm"):
                raise ValueError(f"workflow {self.name}: stage {s.name} has unknown kind {s.kind!r}")
            seen.add(s.name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def sinks(self) -> list[int]:
        used = {d for s in self.stages for d in (*s.stream, *s.after)}
        return [i for i, s in enumerate(self.stages) if s.name not in used]


@dataclass
class RequestShape:
    """Items per stage and, for LLM stages, (prompt tokens, output tokens)."""

    items: dict[str, int]
    llm: dict[str, tuple[int, int]]


def _ln(rng: np.random.Generator, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(np.clip(round(rng.lognormal(np.log(median), sigma)), lo, hi))


# RAG over a sharded vector index: embed the query, probe 4 shards (their candidates flow to the
# reranker shard by shard), rerank (running top-8 as supplement), answer with the top-8 passages.
RAG = Workflow("rag", (
    Stage("embed", "gpu", "embed_query"),
    Stage("retrieve", "cpu", "ann_probe", after=("embed",), decomposable=True),
    Stage("rerank", "gpu", "rerank", stream=("retrieve",), decomposable=True, supplement=True),
    Stage("generate", "llm", "llm", after=("rerank",)),
))

# KB-RAG: an LLM query rewrite, then hybrid retrieval fanned out (dense: embed + 4 ANN shards;
# sparse: 2 BM25 shards), fanned in at the reranker (512-token sections), answer with the top-10.
KB_RAG = Workflow("kb-rag", (
    Stage("rewrite", "llm", "llm"),
    Stage("embed", "gpu", "embed_query", after=("rewrite",)),
    Stage("dense", "cpu", "ann_probe", after=("embed",), decomposable=True),
    Stage("sparse", "cpu", "bm25", after=("rewrite",), decomposable=True),
    Stage("rerank", "gpu", "rerank_long", stream=("dense", "sparse"), decomposable=True, supplement=True),
    Stage("generate", "llm", "llm", after=("rerank",)),
))

# DeepSearch: a planning call emits sub-queries (each flows to web search as soon as it is decoded),
# every result page is fetched, its passages reranked against the question (running top-12), answer.
DEEP_SEARCH = Workflow("deep-search", (
    Stage("plan", "llm", "llm"),
    Stage("search", "cpu", "web_search", stream=("plan",), decomposable=True),
    Stage("fetch", "cpu", "page_fetch", stream=("search",), decomposable=True),
    Stage("rerank", "gpu", "rerank", stream=("fetch",), decomposable=True, supplement=True),
    Stage("answer", "llm", "llm", after=("rerank",)),
))

# Multimodal (video QA): frames decoded on CPU flow into the vision encoder, which keeps the running
# top-16 keyframes by relevance (supplement); the audio track's 30 s segments go through ASR in a
# parallel branch; the answer call sees 16 x 256 visual tokens plus the transcript.
MULTIMODAL = Workflow("multimodal", (
    Stage("decode", "cpu", "frame_decode", decomposable=True),
    Stage("vision", "gpu", "vision", stream=("decode",), decomposable=True, supplement=True),
    Stage("asr", "gpu", "asr", decomposable=True),
    Stage("answer", "llm", "llm", after=("vision", "asr")),
))

WORKFLOWS: dict[str, Workflow] = {w.name: w for w in (RAG, KB_RAG, DEEP_SEARCH, MULTIMODAL)}


def sample_shapes(workflow: str, n: int, seed: int, wc: WorkflowConstants = WORKFLOW) -> list[RequestShape]:
    """``n`` request shapes for ``workflow`` (seeded)."""
    rng = np.random.default_rng([seed, 7919])
    out: list[RequestShape] = []
    for _ in range(n):
        if workflow == "rag":
            cand = _ln(rng, 64, 0.8, 8, 1024)  # candidates retrieved over 4 shards
            k = min(8, cand)
            out.append(RequestShape({"embed": 1, "retrieve": 4, "rerank": cand, "generate": 1},
                                    {"generate": (300 + 256 * k, _ln(rng, 200, 0.6, 16, 1024))}))
        elif workflow == "kb-rag":
            cand = _ln(rng, 48, 0.8, 8, 768)
            k = min(10, cand)
            out.append(RequestShape({"rewrite": 1, "embed": 1, "dense": 4, "sparse": 2, "rerank": cand, "generate": 1},
                                    {"rewrite": (400, _ln(rng, 48, 0.4, 8, 256)), "generate": (400 + 512 * k, _ln(rng, 250, 0.6, 16, 1024))}))
        elif workflow == "deep-search":
            q = _ln(rng, 4, 0.5, 1, 16)  # sub-queries
            pages = q * 5
            out.append(RequestShape({"plan": 1, "search": q, "fetch": pages, "rerank": pages * 4, "answer": 1},
                                    {"plan": (600, 40 * q), "answer": (600 + 12 * 256, _ln(rng, 500, 0.5, 64, 2048))}))
        elif workflow == "multimodal":
            frames = _ln(rng, 32, 0.8, 4, 600)  # sampled at 1 frame/s
            segs = max(1, -(-frames // 30))
            k = min(16, frames)
            prompt = 200 + k * wc.visual_tokens_per_frame + segs * wc.transcript_tokens_per_segment
            out.append(RequestShape({"decode": frames, "vision": frames, "asr": segs, "answer": 1},
                                    {"answer": (prompt, _ln(rng, 150, 0.6, 16, 1024))}))
        else:
            raise ValueError(f"unknown workflow {workflow!r}; known: {', '.join(WORKFLOWS)}")
    return out
