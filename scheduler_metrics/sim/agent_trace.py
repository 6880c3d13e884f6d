"""Synthetic agent traces: ReAct-style sessions whose every turn re-sends the whole context.

A session starts with a system prompt + tool schemas + task; each turn the model emits a short
action (a tool call), the tool runs for a while, and its output is appended; the next turn's prompt
is the previous prompt + the previous output + the tool output, so everything but the tool output
is a reusable prefix. Sessions arrive as a Poisson process; turn counts are heavy-tailed.

Where the defaults come from (published characterisations; the exact values are ours, stated here
and printed with every run by ``Trace.stats``):

* turns per session: lognormal, median 8, sigma 0.9 (mean ~12, a tail past 60 turns): coding-agent
  session logs report a median of 8 turns with runs of 60+ turns (xor.tech execution metrics over
  973 sessions; SWE-agent trajectories on SWE-bench show the same long tail).
* reuse: "most input tokens are reused across turns" (Agentic AI Workload Characteristics,
  arXiv 2605.26297, ReAct agents on five benchmarks); here ~94% of a continuation's prompt.
* initial context: lognormal, median 3,000 tokens (system prompt + tool schemas + task statement).
* model output per turn: lognormal, median 120 tokens (a tool call with a short thought);
  tool output per turn: lognormal, median 500 tokens, sigma 1.0, capped at 8k (file reads, command
  and test logs); context growth per turn is their sum.
* think/tool time between turns: lognormal, median 1.5 s, sigma 1.0 (shell commands, searches and
  test runs take from tens of ms to a minute).
* context capped at 131,072 tokens (Qwen2.5-7B with YaRN): a session ends when it would exceed it.

Generated with numpy's seeded generator: same parameters, same trace.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

from scheduler_metrics.sim.trace import Trace


@dataclass(frozen=True)
class AgentTraceParams:
    sessions: int = 600
    seed: int = 1
    session_rate_per_s: float = 1.0  # session arrivals (rescaled by the replay's --load anyway)
    turns_median: float = 8.0
    turns_sigma: float = 0.9
    turns_max: int = 100
    initial_median: float = 3000.0
    initial_sigma: float = 0.5
    output_median: float = 120.0
    output_sigma: float = 0.8
    tool_median: float = 500.0
    tool_sigma: float = 1.0
    tool_max: int = 8192
    think_median_s: float = 1.5
    think_sigma: float = 1.0
    context_max: int = 131_072

    def spec(self) -> str:
        base = AgentTraceParams()
        diff = [f"{k}={v:g}" for k, v in asdict(self).items() if v != getattr(base, k)]
        return "agent" + (":" + ",".join(diff) if diff else "")


def parse_spec(spec: str) -> AgentTraceParams:
    """``agent`` or ``agent:sessions=600,seed=2,turns_median=12``."""
    head, _, rest = spec.partition(":")
    if head != "agent":
        raise ValueError(f"agent trace spec {spec!r}: expected 'agent' or 'agent:key=value,...'")
    types = {f.name: f.type for f in fields(AgentTraceParams)}
    kw: dict[str, float | int] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        k, eq, v = part.partition("=")
        if not eq or k not in types:
            raise ValueError(f"agent trace spec {spec!r}: unknown parameter {k!r} (known: {', '.join(types)})")
        try:
            kw[k] = int(v) if types[k] in ("int", int) else float(v)
        except ValueError:
            raise ValueError(f"agent trace spec {spec!r}: {k}={v!r} is not a number") from None
    return AgentTraceParams(**kw)  # type: ignore[arg-type]


def _lognormal(rng: np.random.Generator, median: float, sigma: float, n: int) -> np.ndarray:
    return rng.lognormal(np.log(median), sigma, n)


def generate(p: AgentTraceParams = AgentTraceParams()) -> Trace:
    rng = np.random.default_rng(p.seed)
    starts = np.cumsum(rng.exponential(1.0 / p.session_rate_per_s, p.sessions))
    starts -= starts[0]
    turns = np.clip(np.round(_lognormal(rng, p.turns_median, p.turns_sigma, p.sessions)), 1, p.turns_max).astype(np.int64)
    initial = np.maximum(64, _lognormal(rng, p.initial_median, p.initial_sigma, p.sessions)).astype(np.int64)
    total = int(turns.sum())
    out = np.clip(_lognormal(rng, p.output_median, p.output_sigma, total), 8, 4096).astype(np.int64)
    tool = np.clip(_lognormal(rng, p.tool_median, p.tool_sigma, total), 8, p.tool_max).astype(np.int64)
    think = np.clip(_lognormal(rng, p.think_median_s, p.think_sigma, total), 0.02, 120.0)
    sess = np.repeat(np.arange(p.sessions, dtype=np.int64), turns)
    first = np.zeros(total, dtype=bool)
    first[np.concatenate([[0], np.cumsum(turns)[:-1]])] = True
    # prompt of turn k = initial + sum over earlier turns of (output + tool output) + this turn's tool
    # output (turn 0: none); reuse = the previous prompt + its output.
    growth = np.where(first, 0, tool)
    step = growth + np.concatenate([[0], out[:-1]]) * ~first
    csum = np.cumsum(step)
    base = csum[first][np.cumsum(first) - 1]  # cumsum at each session's first turn
    inp = initial[sess] + (csum - base)
    reuse = np.where(first, 0, inp - growth)
    keep = inp <= p.context_max
    # a session ends at its first turn past the context limit
    cut = np.maximum.accumulate(np.where(~keep, np.arange(total), -1))
    sess_first_idx = np.flatnonzero(first)[sess]
    keep &= cut < sess_first_idx
    idx = np.flatnonzero(keep)
    arrival = starts[sess[idx]]
    order = np.argsort(arrival, kind="stable")  # sessions are already in start order; stable keeps turns in order
    idx = idx[order]
    n = len(idx)
    parent = np.where(first[idx], -1, np.arange(n) - 1)
    return Trace(p.spec(), starts[sess[idx]], inp[idx], out[idx], sess[idx], reuse[idx], parent,
                 np.where(first[idx], 0.0, think[idx]))
