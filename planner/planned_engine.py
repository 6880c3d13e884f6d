"""``PlannedEngine``: the engine interface (promql/query_opts.py), with the rewrite hook attached,
every query logged and fed to the planner. ``QueryOpts.exact`` runs the raw path (still logged,
marked exact). ``QueryOpts.approx`` (None: the tenant's ``planner.approximate``) says whether
approximate algorithms may answer; by default answers equal the raw path."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable

from planner.normalize import normalize
from planner.query_log import LogEntry, QueryLog
from planner.rewrite import RewriteHook, with_policy
from planner.rewrite_rules import candidates
from planner.step_answers import StepAnswers, cacheable
from promql.query_guard import parse as guarded_parse
from promql.query_opts import NO_OPTS, QueryOpts
from promql.types import QueryResult


def _result_size(res: QueryResult) -> tuple[int, int]:
    series = len(res.labels)
    if res.present is not None:
        return series, int(res.present.sum())
    if res.csr is not None:
        return series, int(len(res.csr[1]))
    return series, 1 if res.result_type in ("scalar", "string") else series


class _Patterns:
    """query text -> (pattern, candidates, steps reusable), kept for the recurring texts of dashboards
    and rules (each would otherwise be parsed twice more per query)."""

    def __init__(self, capacity: int = 4096):
        self.capacity = capacity
        self.d: dict[str, tuple[str, list | None, bool]] = {}

    def get(self, query: str, planner: Any) -> tuple[str, list | None, bool]:
        hit = self.d.get(query)
        if hit is None:
            try:
                node = guarded_parse(query)  # depth and length checked before the parser binding
                cands = candidates(node, planner.config.req_min_phi) if planner is not None else candidates(node)
                reusable = cacheable(node)
            except Exception:  # noqa: BLE001 - unparsable or refused: nothing to learn
                node, cands, reusable = None, None, False
            hit = (normalize(query, node) if node is not None else query.strip(), cands, reusable)
            if len(self.d) >= self.capacity:
                self.d.clear()
            self.d[query] = hit
        return hit


class PlannedEngine:
    def __init__(self, engine: Any, hook: RewriteHook, query_log: QueryLog | None = None, planner: Any = None,
                 origin: str = "api", step_answers: StepAnswers | None = None, foreground: Any = None):
        self.engine = engine
        self.foreground = foreground  # enter() / leave() around each query (planner.canary.Foreground)
        self.step_answers = step_answers
        self.hook = hook
        self.query_log = query_log
        self.planner = planner
        self.origin = origin
        self._patterns = _Patterns()

    def instant_query(self, query: str, time_ms: int, opts: QueryOpts = NO_OPTS) -> QueryResult:
        return self._run("instant", query, int(time_ms), int(time_ms), 0, opts,
                         lambda o: self.engine.instant_query(query, time_ms, o))

    def range_query(self, query: str, start_ms: int, end_ms: int, step_ms: int,
                    opts: QueryOpts = NO_OPTS) -> QueryResult:
        def call(o: QueryOpts) -> QueryResult:
            if (self.step_answers is None or opts.exact or end_ms - start_ms < step_ms
                    or not self._patterns.get(query, self.planner)[2]):
                return self.engine.range_query(query, start_ms, end_ms, step_ms, o)
            key = (opts.tenant, query, opts.lookback_delta_ms, self.approximate_for(opts.tenant, opts.approx))
            return self.step_answers.range_query(
                key, int(start_ms), int(end_ms), int(step_ms),
                lambda s, e: self.engine.range_query(query, s, e, step_ms, o))

        return self._run("range", query, int(start_ms), int(end_ms), int(step_ms), opts, call)

    def hooks_for(self, node: Any) -> tuple[list, tuple]:
        """For a sub-tree evaluated outside this engine (a cluster ingester's share of a pushed-down
        aggregation): its candidates (for ``learn``) and the node hooks that let exact plans answer
        it (none when no plan exists for any of them)."""
        if self.planner is None:
            return [], ()
        cands = candidates(node, self.planner.config.req_min_phi)
        return cands, ((with_policy(self.hook, False),) if cands and self.planner.has_plans_for(cands) else ())

    def learn(self, entry: LogEntry, cands: list | None) -> None:
        """Log one evaluation and let the planner learn from it (``cands``: its candidate sub-trees)."""
        if self.query_log is not None:
            self.query_log.record(entry)
        if self.planner is not None and not entry.error and cands is not None:
            self.planner.observe(entry, list(cands))

    def _may_serve(self, query: str) -> bool:
        """Whether a plan exists for some candidate sub-tree of ``query`` (the rules that could answer
        a node are exactly those that name it a candidate). Without a planner to ask: always."""
        if self.planner is None:
            return True
        cands = self._patterns.get(query, self.planner)[1]
        return bool(cands) and self.planner.has_plans_for(cands)

    def approximate_for(self, tenant: str, approx: bool | None) -> bool:
        if approx is not None:
            return bool(approx)
        cfg = self.planner.config if self.planner is not None else None
        return cfg.approximate_for(tenant) if cfg is not None else False

    def _run(self, kind: str, query: str, start: int, end: int, step: int, opts: QueryOpts,
             call: Callable[[QueryOpts], QueryResult]) -> QueryResult:
        """Evaluate through ``call`` (given the options for the raw engine: the rewrite hook added
        unless ``exact`` or no plan exists for any of the query's candidate sub-trees: a query no
        summary can serve pays no rule checks per node) and log the query."""
        exact, tenant, origin = opts.exact, opts.tenant, opts.origin
        arrival = int(time.time() * 1000)
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        approximate = (not exact) and self.approximate_for(tenant, opts.approx)
        hooks = () if exact or not self._may_serve(query) else (with_policy(self.hook, approximate),)
        err = ""
        res = None
        if self.foreground is not None:
            self.foreground.enter()
        try:
            res = call(replace(opts, node_hooks=(*opts.node_hooks, *hooks)) if hooks else opts)
            return res
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
            raise
        finally:
            if self.foreground is not None:
                self.foreground.leave()
            wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
            if self.query_log is not None or self.planner is not None:
                series, points = _result_size(res) if res is not None else (0, 0)
                pattern, cands, _ = self._patterns.get(query, self.planner)
                entry = LogEntry(
                    expr=query, pattern=pattern, kind=kind, start_ms=start, end_ms=end, step_ms=step,
                    wall_s=wall, cpu_s=cpu, samples=res.stats.samples_scanned if res is not None else 0,
                    paths=list(res.stats.paths) if res is not None else [], result_series=series,
                    result_points=points, exact=exact, approx=approximate, tenant=tenant, origin=origin or self.origin, error=err,
                    arrival_ms=arrival,
                )
                self.learn(entry, cands)
