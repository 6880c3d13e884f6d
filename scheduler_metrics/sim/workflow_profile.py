"""The offline profiling phase: run the simulator's own stage models at several batch sizes and
record what they cost, so the chunk-size choice (and Ayo's static split) read measured profiles,
never constants typed in by hand.

GPU stages are profiled through ``GpuStageModel.batch_time`` (the cost the simulator charges); the
LLM engine through ``LLMEngine`` itself: one iteration of a prefill of the token budget, and decode
iterations at several batch sizes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler_metrics.schedulers.agentweave import StageProfile
from scheduler_metrics.sim.constants import DEFAULT, WORKFLOW, SimConstants, WorkflowConstants
from scheduler_metrics.sim.llm_engine import LLMEngine, Seq
from scheduler_metrics.sim.workflows import Workflow

BATCH_SIZES = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512])


@dataclass(frozen=True)
class WorkflowProfiles:
    stages: dict[str, StageProfile]  # by GPU stage model name
    llm_prefill_s_per_token: float
    llm_decode: StageProfile  # decode iteration time by running sequences

    def queued_work_s(self, depths: dict[str, float]) -> float:
        """Seconds of GPU work in a queue-depth snapshot (items per GPU model, prefill tokens for "llm")."""
        t = depths.get("llm", 0.0) * self.llm_prefill_s_per_token
        for model, items in depths.items():
            if model in self.stages:
                t += items * self.stages[model].best_per_item_s
        return t


def profile(wf: Workflow, c: SimConstants = DEFAULT, wc: WorkflowConstants = WORKFLOW) -> WorkflowProfiles:
    stages = {}
    for s in wf.stages:
        if s.kind == "gpu" and s.model not in stages:
            model = getattr(wc, s.model)
            times = np.array([model.batch_time(int(b)) for b in BATCH_SIZES])
            stages[s.model] = StageProfile(s.model, BATCH_SIZES.copy(), times)
    budget = c.model.chunk_budget_tokens
    e = LLMEngine(c, kv_tokens=wc.llm_kv_tokens)
    e.submit(Seq(budget, 1))
    dt, _, _ = e.step(0.0)
    prefill = dt / budget
    sizes = BATCH_SIZES[BATCH_SIZES <= c.model.max_batch]
    dec = []
    for b in sizes:
        e = LLMEngine(c, kv_tokens=wc.llm_kv_tokens)
        for _ in range(int(b)):
            e.submit(Seq(1, 3))
        e.step(0.0)  # the prefills (1 token each) and first tokens
        dt, _, _ = e.step(0.0)
        dec.append(dt)
    return WorkflowProfiles(stages, prefill, StageProfile("llm-decode", sizes.copy(), np.array(dec)))
