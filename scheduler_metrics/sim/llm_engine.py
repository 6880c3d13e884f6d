"""An iteration-level (continuous batching) LLM engine model, vLLM-style with chunked prefill.

Each iteration carries one decode token for every running sequence that has finished its prefill,
then prefill tokens (chunks of running prefills first, then newly admitted sequences) up to the
token budget (``max_num_batched_tokens``); sequences join and leave between iterations, bounded by
``max_num_seqs`` and the KV budget. When the KV budget is exhausted the engine preempts (by
recompute) the sequence the ``order`` key ranks last; with ``preempt_for_priority`` it also preempts
for a waiting sequence of strictly better key (Autellix's PLAS at iteration boundaries).

Iteration time (constants.ModelConstants, Qwen2.5-7B on an H20): the weights are read once
(``decode_step_base_s``), plus the running decodes' KV reads, plus the prefill tokens at the
profiled prefill rate, plus causal attention of each prefill chunk against its prefix.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from scheduler_metrics.sim.constants import DEFAULT, SimConstants


@dataclass
class Seq:
    prompt: int
    output: int
    owner: Any = None  # the simulator's handle (the request's stage)
    order: tuple = ()  # admission/preemption key: smaller first
    prefill_target: int = 0  # tokens to prefill before decoding: the prompt (+ tokens decoded before a preemption)
    prefilled: int = 0
    decoded: int = 0
    context: int = 0  # KV tokens held
    admitted_at: float = -1.0
    first_token_at: float = -1.0
    preemptions: int = 0

    def __post_init__(self) -> None:
        self.prefill_target = self.prefill_target or self.prompt

    @property
    def prefilling(self) -> bool:
        return self.prefilled < self.prefill_target


@dataclass
class LLMEngine:
    c: SimConstants = DEFAULT
    kv_tokens: int = 1_210_000
    token_budget: int = 0  # 0: ModelConstants.chunk_budget_tokens
    max_seqs: int = 0  # 0: ModelConstants.max_batch
    preempt_for_priority: bool = False
    waiting: list[Seq] = field(default_factory=list)
    running: list[Seq] = field(default_factory=list)
    iterations: int = 0
    busy_s: float = 0.0

    def __post_init__(self) -> None:
        self.token_budget = self.token_budget or self.c.model.chunk_budget_tokens
        self.max_seqs = self.max_seqs or self.c.model.max_batch

    def submit(self, seq: Seq) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def load_tokens(self) -> int:
        """Tokens still to be processed (prefill left + decode left), for placement."""
        return sum(s.prefill_target - s.prefilled + s.output - s.decoded for s in self.running + self.waiting)

    def _kv_used(self) -> int:
        return sum(s.context for s in self.running)

    def _preempt(self, victim: Seq) -> None:
        self.running.remove(victim)
        victim.prefilled, victim.context = 0, 0  # recompute: the KV is dropped
        victim.prefill_target = victim.prompt + victim.decoded
        victim.preemptions += 1
        self.waiting.append(victim)

    def _admit(self, now: float, budget_left: int) -> None:
        self.waiting.sort(key=lambda s: s.order)
        while self.waiting and budget_left > 0:
            cand = self.waiting[0]
            need = cand.prompt + cand.decoded + min(cand.output - cand.decoded, 16)
            full = len(self.running) >= self.max_seqs or self._kv_used() + need > self.kv_tokens
            if full and self.preempt_for_priority and self.running:
                worst = max(self.running, key=lambda s: s.order)
                if worst.order > cand.order:
                    self._preempt(worst)
                    self.waiting.sort(key=lambda s: s.order)
                    continue
            if full:
                break
            self.waiting.pop(0)
            cand.admitted_at = now if cand.admitted_at < 0 else cand.admitted_at
            self.running.append(cand)
            budget_left -= min(budget_left, cand.prefill_target - cand.prefilled)

    def step(self, now: float) -> tuple[float, list[tuple[Seq, int]], list[Seq]]:
        """Run one iteration starting at ``now``: (seconds, [(seq, tokens processed)], finished seqs)."""
        m = self.c.model
        # KV pressure: the running batch grows by one token per decode; preempt the last-ranked
        while self.running and self._kv_used() + len(self.running) > self.kv_tokens:
            self._preempt(max(self.running, key=lambda s: s.order))
        decoders = [s for s in self.running if not s.prefilling]
        budget = self.token_budget - len(decoders)
        need = sum(s.prefill_target - s.prefilled for s in self.running if s.prefilling)
        if need < budget:
            self._admit(now, budget - need)
        work: list[tuple[Seq, int]] = [(s, 1) for s in decoders]
        t = m.decode_step_base_s + m.decode_kv_read_s_per_token * sum(s.context for s in decoders)
        for s in self.running:
            if not s.prefilling or budget <= 0:
                continue
            chunk = min(budget, s.prefill_target - s.prefilled)
            budget -= chunk
            t += chunk / m.prefill_tokens_per_s + 2 * m.prefill_quad_s_per_token2 * chunk * (s.prefilled + chunk / 2)
            work.append((s, chunk))
        finished: list[Seq] = []
        end = now + t
        for s, n in work:
            s.context += n
            if not s.prefilling:  # a decode token
                s.decoded += 1
            else:
                s.prefilled += n
                if not s.prefilling and s.decoded == 0:
                    s.decoded = 1  # the last prefill chunk samples the first token
                    s.first_token_at = end
            if s.decoded >= s.output:
                finished.append(s)
        for s in finished:
            self.running.remove(s)
        self.iterations += 1
        self.busy_s += t
        return t, work, finished


def serve_alone(prompt: int, output: int, c: SimConstants = DEFAULT) -> float:
    """Seconds one sequence takes on an otherwise idle engine (a lower bound used in reports)."""
    e = LLMEngine(c)
    e.submit(Seq(prompt, output))
    t = 0.0
    while e.has_work():
        dt, _, _ = e.step(t)
        t += dt
    return t


OrderFn = Callable[[Seq], tuple]
