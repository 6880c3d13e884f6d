"""Per-(sub)evaluation context handed to every node evaluation and to ``node_hooks``.

An ``EvalContext`` describes *where* a node is evaluated: the step timestamps of this
(sub)evaluation, the query-level bounds (for ``@ start()`` / ``@ end()``), the lookback delta,
the data source, and the shared per-query state (annotations, stats, sample budget, deadline and
cancel flag). A subquery evaluates its inner expression with a child context whose
``step_times`` are the subquery's own aligned steps; everything else is shared.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Hashable, Protocol, Sequence

import numpy as np

from promql.errors import QueryCanceled, QueryTimeout, TooManySamples
from promql.source import SampleSource
from promql.types import Annotations, QueryStats

# hook(node, eval_ctx) -> Value | None
NodeHook = Callable[[Any, "EvalContext"], Any]


class SeriesScope(Protocol):
    """Which stored series an evaluation may see beyond its selectors' matchers (a cluster ingester
    evaluating some of its partitions: turboprom/cluster/partition_eval.py). ``source`` already reads
    only these; anything that finds series another way (the planner's summaries) applies ``keep``.
    ``key`` identifies the scope in caches of answers per selection."""

    key: Hashable

    def keep(self, labels: Sequence[Any], ids: np.ndarray) -> np.ndarray:
        """Bool mask over ``ids`` (positions in ``labels``, an append-only list of label sets)."""
        ...


# Estimated bytes one dense (series x steps) cell of an intermediate result costs: float64 value,
# presence flag, per-sample timestamp where kept, and the temporaries numpy makes while computing it.
BYTES_PER_CELL = 32


@dataclass
class QueryBudget:
    """Shared, mutable per-query limits and counters.

    * ``max_samples``: Prometheus's ``--query.max-samples``: samples held at once (selected points,
      points of intermediate vectors/matrices and of the result). Over it: ``TooManySamples`` (422).
    * ``max_bytes``: estimated memory the query may hold at once (0: no limit). The engine's dense
      series x steps layout can need far more memory than its sample count (an output series present at
      one step still takes a row of every step), so allocations are checked against this estimate
      *before* they are made (``reserve``). Over it: the same ``TooManySamples`` answer.
    """

    max_samples: int
    deadline: float  # time.monotonic() value after which the query times out
    timeout_s: float
    cancel: threading.Event | None = None
    current_samples: int = 0  # samples currently held (selector outputs, windows)
    max_bytes: int = 0
    current_bytes: int = 0  # estimated bytes currently held by intermediate results
    peak_bytes: int = 0

    def check(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise QueryCanceled("query was canceled in expression evaluation")
        if time.monotonic() > self.deadline:
            raise QueryTimeout("query timed out in expression evaluation")

    def charge(self, n: int, stats: QueryStats) -> None:
        """Account ``n`` more samples held in memory; raise when over the limit."""
        self.current_samples += int(n)
        if self.current_samples > stats.peak_samples:
            stats.peak_samples = self.current_samples
        if self.current_samples > self.max_samples:
            raise TooManySamples()

    def release(self, n: int) -> None:
        self.current_samples = max(0, self.current_samples - int(n))

    def reserve(self, nbytes: int) -> None:
        """Refuse an allocation of about ``nbytes`` that would take the query over its memory budget.
        Call before allocating; the bytes are not kept (``hold`` accounts results that are kept)."""
        if self.max_bytes > 0 and self.current_bytes + int(nbytes) > self.max_bytes:
            raise TooManySamples()

    def reserve_cells(self, series: int, steps: int, bytes_per_cell: int = BYTES_PER_CELL) -> None:
        """``reserve`` for a dense series x steps result (Python ints: no int64 overflow)."""
        self.reserve(int(series) * int(steps) * int(bytes_per_cell))

    def hold(self, nbytes: int) -> None:
        self.current_bytes += int(nbytes)
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes
        if self.max_bytes > 0 and self.current_bytes > self.max_bytes:
            raise TooManySamples()


@dataclass
class EvalContext:
    """Fields a node hook may read:

    * ``step_times``      int64 (T,) evaluation timestamps (ms) of this (sub)evaluation
    * ``query_start_ms`` / ``query_end_ms`` / ``query_step_ms``: the top-level query's bounds
      (instant query: start == end == time, step 0)
    * ``lookback_delta_ms``: lookback for instant-vector selection
    * ``source``          the SampleSource raw data is read from
    * ``annotations``     warnings/infos of the query (append with .warn / .info)
    * ``stats``           QueryStats (hooks append to ``stats.paths`` what served a sub-tree)
    * ``query``           the query text (for annotation positions)
    * ``subquery_depth``  0 at top level, +1 inside each subquery
    * ``series_scope``    None, or the SeriesScope the stored series are restricted to beyond the
      matchers (``source`` applies it to reads; summaries must apply it too)
    * ``extra["exact"]``  set when the query asked for ``exact=true`` (raw path only)
    """

    step_times: np.ndarray
    query_start_ms: int
    query_end_ms: int
    query_step_ms: int
    lookback_delta_ms: int
    source: SampleSource
    annotations: Annotations
    stats: QueryStats
    budget: QueryBudget
    default_subquery_step_ms: int = 60_000
    hooks: Sequence[NodeHook] = ()
    query: str = ""
    subquery_depth: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    series_scope: SeriesScope | None = None

    @property
    def num_steps(self) -> int:
        return int(self.step_times.shape[0])

    def child(self, step_times: np.ndarray) -> "EvalContext":
        return replace(self, step_times=step_times, subquery_depth=self.subquery_depth + 1)
