"""``PlannedEngine``: the engine's interface, with the rewrite hook attached, every query logged and
fed to the planner. ``exact=True`` runs the raw path (still logged, marked exact)."""
from __future__ import annotations

import time
from typing import Any

from planner.normalize import candidates, normalize
from planner.query_log import LogEntry, QueryLog
from planner.rewrite import RewriteHook
from promql.types import QueryResult


def _result_size(res: QueryResult) -> tuple[int, int]:
    series = len(res.labels)
    if res.present is not None:
        return series, int(res.present.sum())
    if res.csr is not None:
        return series, int(len(res.csr[1]))
    return series, 1 if res.result_type in ("scalar", "string") else series


class _Patterns:
    """query text -> (pattern, candidates), kept for the recurring texts of dashboards and rules (each
    would otherwise be parsed twice more per query)."""

    def __init__(self, capacity: int = 4096):
        self.capacity = capacity
        self.d: dict[str, tuple[str, list | None]] = {}

    def get(self, query: str, planner: Any) -> tuple[str, list | None]:
        hit = self.d.get(query)
        if hit is None:
            try:
                cfg = getattr(planner, "config", None)
                cands = candidates(query, cfg.req_min_phi) if cfg is not None and hasattr(cfg, "req_min_phi") \
                    else candidates(query)
            except Exception:  # noqa: BLE001 - unparsable: nothing to learn
                cands = None
            hit = (normalize(query), cands)
            if len(self.d) >= self.capacity:
                self.d.clear()
            self.d[query] = hit
        return hit


class PlannedEngine:
    def __init__(self, engine: Any, hook: RewriteHook, query_log: QueryLog | None = None, planner: Any = None,
                 origin: str = "api"):
        self.engine = engine
        self.hook = hook
        self.query_log = query_log
        self.planner = planner
        self.origin = origin
        self._patterns = _Patterns()

    def __getattr__(self, name: str) -> Any:  # parse(), source, ... pass through
        return getattr(self.engine, name)

    def instant_query(self, query: str, time_ms: int, *, exact: bool = False, origin: str | None = None,
                      tenant: str = "default", **kw: Any) -> QueryResult:
        return self._run("instant", query, int(time_ms), int(time_ms), 0, exact, origin, tenant,
                         lambda hooks: self.engine.instant_query(query, time_ms, node_hooks=hooks, **kw))

    def range_query(self, query: str, start_ms: int, end_ms: int, step_ms: int, *, exact: bool = False,
                    origin: str | None = None, tenant: str = "default", **kw: Any) -> QueryResult:
        return self._run("range", query, int(start_ms), int(end_ms), int(step_ms), exact, origin, tenant,
                         lambda hooks: self.engine.range_query(query, start_ms, end_ms, step_ms, node_hooks=hooks, **kw))

    def _run(self, kind: str, query: str, start: int, end: int, step: int, exact: bool, origin: str | None,
             tenant: str, call: Any) -> QueryResult:
        arrival = int(time.time() * 1000)
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        hooks = () if exact else (self.hook,)
        err = ""
        res = None
        try:
            res = call(hooks)
            return res
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
            raise
        finally:
            wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
            if self.query_log is not None or self.planner is not None:
                series, points = _result_size(res) if res is not None else (0, 0)
                pattern, cands = self._patterns.get(query, self.planner)
                entry = LogEntry(
                    expr=query, pattern=pattern, kind=kind, start_ms=start, end_ms=end, step_ms=step,
                    wall_s=wall, cpu_s=cpu, samples=res.stats.samples_scanned if res is not None else 0,
                    paths=list(res.stats.paths) if res is not None else [], result_series=series,
                    result_points=points, exact=exact, tenant=tenant, origin=origin or self.origin, error=err,
                    arrival_ms=arrival,
                )
                if self.query_log is not None:
                    self.query_log.record(entry)
                if self.planner is not None and not err and cands is not None:
                    self.planner.observe(entry, list(cands))
