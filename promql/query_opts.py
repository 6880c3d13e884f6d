"""``QueryOpts``: the per-query options every query engine takes, and the engine interface.

The raw engine (promql/engine.py), the planner's engine (rewrites onto summaries, logs queries)
and each tenant's engine answer ``instant_query(query, time_ms, opts)`` and
``range_query(query, start_ms, end_ms, step_ms, opts)``, so a caller (the HTTP API, the rule
manager, the conformance runner) builds one ``QueryOpts`` and never asks an engine which options
it understands. Options an engine has no use for are ignored by it: the raw engine keeps no query
log (``origin``, ``tenant``) and always evaluates raw samples (``exact``, ``approx``).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol, Sequence

from promql.eval_context import NodeHook
from promql.types import QueryResult


@dataclass(frozen=True)
class QueryOpts:
    # Limits (None: the engine's default): lookback for instant selection, wall-clock timeout,
    # samples held at once (--query.max-samples), expression depth, memory estimate budget.
    lookback_delta_ms: int | None = None
    timeout_s: float | None = None
    max_samples: int | None = None
    max_depth: int | None = None
    max_memory_bytes: int | None = None
    cancel: threading.Event | None = None  # set: the evaluation stops at its next budget check
    node_hooks: Sequence[NodeHook] = ()  # answer sub-trees from elsewhere (the planner's summaries)
    origin: str | None = None  # who asks (api, rule, ...), recorded by engines that log queries
    tenant: str = "default"  # whose query it is (X-Scope-OrgID), for engines that log or plan per tenant
    exact: bool = False  # force evaluation over raw samples (no summary rewrite)
    approx: bool | None = None  # may approximate summaries answer (None: the operator's setting)


NO_OPTS = QueryOpts()


class QueryEngine(Protocol):
    def instant_query(self, query: str, time_ms: int, opts: QueryOpts = NO_OPTS) -> QueryResult: ...

    def range_query(self, query: str, start_ms: int, end_ms: int, step_ms: int,
                    opts: QueryOpts = NO_OPTS) -> QueryResult: ...
