"""The workflow baselines, as their papers define them.

* **Ayo** (Tan et al., "Towards End-to-End Optimization of LLM-based Applications with Ayo",
  ASPLOS 2025): the application becomes a graph of fine-grained primitives; independent branches run
  in parallel and decomposable primitives are split into fixed-size pieces that are pipelined into
  the next primitive. The split is static (chosen offline, here the profiled knee: the smallest batch
  reaching 90% of the best throughput), pieces are independent (a decomposed top-k ends in an
  aggregate primitive that merges the pieces' lists), and requests are served first-come first-served.
* **Autellix** (Luo et al., "Autellix: An Efficient Serving Engine for LLM Agents as General
  Programs", 2025): program-level attained service (PLAS). A program's priority is the service its
  completed calls have received; calls are queued in discretized priority levels (a multi-level
  queue, quantum doubling per level, FIFO within a level), lower attained service first, with
  preemption at iteration boundaries and an anti-starvation promotion. Calls are not decomposed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from scheduler_metrics.schedulers.agentweave import StageProfile


def ayo_chunk(profile: StageProfile, efficiency: float = 0.9) -> int:
    """Ayo's static piece size for a decomposable primitive."""
    return profile.knee(efficiency)


@dataclass(frozen=True)
class PlasPriority:
    """Autellix's program-level attained-service levels."""

    quantum_s: float = 0.5  # service that moves a program out of level 0; doubles per level
    levels: int = 8
    starvation_s: float = 10.0  # a program waiting this long since its last service returns to level 0

    def level(self, attained_s: float, waited_s: float = 0.0) -> int:
        if waited_s >= self.starvation_s or attained_s < self.quantum_s:
            return 0
        return min(self.levels - 1, 1 + int(math.floor(math.log2(attained_s / self.quantum_s))))

    def key(self, attained_s: float, waited_s: float, arrival_s: float) -> tuple[int, float]:
        """Sort key: level, then arrival (FIFO within a level)."""
        return (self.level(attained_s, waited_s), arrival_s)
