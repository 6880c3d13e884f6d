"""A request trace as the simulator replays it: arrivals, token counts, sessions and reuse.

Loaders (scheduler_metrics/sim/traces.py) and the agent-trace generator (agent_trace.py) produce it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Trace:
    name: str
    arrival_s: np.ndarray  # float64, seconds from trace start, ascending
    input_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    session: np.ndarray  # int64 session id per request
    reuse_tokens: np.ndarray  # int64: prefix tokens shared with the session's earlier requests
    parent: np.ndarray  # int64 index of the request it continues, -1 if none
    # float64 seconds a continuation waits after the previous turn completes (tool run, think time);
    # None: none (a turn is issued at max(its arrival, the previous turn's completion))
    gap_s: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    def head(self, n: int) -> "Trace":
        keep = slice(0, n)
        parent = np.where(self.parent[keep] < n, self.parent[keep], -1)
        return Trace(self.name, self.arrival_s[keep], self.input_tokens[keep], self.output_tokens[keep],
                     self.session[keep], np.where(parent >= 0, self.reuse_tokens[keep], 0), parent,
                     None if self.gap_s is None else self.gap_s[keep])

    def stats(self) -> dict[str, float]:
        """Workload statistics printed with every replay (what decides how much reuse can buy)."""
        _, turns = np.unique(self.session, return_counts=True)
        cont = self.parent >= 0
        inp = self.input_tokens.astype(float)
        return {"requests": float(len(self)), "sessions": float(len(turns)), "turns_per_session_mean": float(turns.mean()),
                "turns_per_session_p50": float(np.median(turns)), "turns_per_session_p99": float(np.percentile(turns, 99)),
                "reuse_share": float(self.reuse_tokens.sum() / max(inp.sum(), 1.0)),
                "reuse_share_continuations": float(self.reuse_tokens[cont].sum() / max(inp[cont].sum(), 1.0)) if cont.any() else 0.0,
                "input_tokens_mean": float(inp.mean()), "input_tokens_p99": float(np.percentile(inp, 99)),
                "output_tokens_mean": float(self.output_tokens.mean()),
                "gap_s_mean": float(self.gap_s[cont].mean()) if self.gap_s is not None and cont.any() else 0.0}


def format_stats(t: Trace) -> str:
    s = t.stats()
    return (f"trace {t.name}: {int(s['requests'])} requests, {int(s['sessions'])} sessions, turns/session mean "
            f"{s['turns_per_session_mean']:.1f} (p50 {s['turns_per_session_p50']:.0f}, p99 {s['turns_per_session_p99']:.0f}), "
            f"reusable prompt tokens {s['reuse_share']:.1%} ({s['reuse_share_continuations']:.1%} of continuations), "
            f"input mean {s['input_tokens_mean']:.0f} (p99 {s['input_tokens_p99']:.0f}), output mean {s['output_tokens_mean']:.0f}, "
            f"inter-turn gap mean {s['gap_s_mean']:.2f} s")
