"""An ingester's side of a pushed-down aggregation: evaluate what the aggregation aggregates over
the asked partitions' series of one tenant, at the querier's steps, and reduce it to the
aggregation's partial state (promql/partial_aggregate.py).

The request names the aggregation by its position in the query text, and the ingester parses the
same text: annotations (``PromQL info: metric might not be a counter ... (1:10)``) name the same
positions as a single evaluation would. Each of the request's partitions is held whole here, so
the partial state is exactly the partitions' share of the aggregation.

Summaries: the aggregated expression goes through this node's planner as a query of its own would
(``PlannedEngine.hooks_for`` / ``learn``): the planner learns the recurring pushed sub-trees (e.g.
``rate(x_bucket[5m])`` of a dashboard's ``histogram_quantile``), adopts exact per-series plans for
them, fills them from what this node ingests, and answers later requests from them, restricted to
the asked partitions (``PartitionScope``, a ``SeriesScope``: the summaries' series are filtered by the
same partition hash the reads use). So the querier merges partial states that were computed from
mergeable summaries on each owner. Only the default tenant's series are summarized (as on a single
node), only exact algorithms answer here, and ``exact=true`` on the querier reaches the ingesters.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from promql import parser as pp

from planner.normalize import normalize
from planner.query_log import LogEntry
from promql.ast_walk import walk
from promql.engine import parse
from promql.errors import BadData, PromQLError
from promql.eval_context import EvalContext, QueryBudget
from promql.eval_positions import locate_all
from promql.histogram_planes import has_hist
from promql.evaluator import Evaluator
from promql.partial_aggregate import partial
from promql.types import Annotations, QueryStats, Scalar, VectorSteps
from storage.labels import Labels
from storage.matchers import Matcher
from storage.series_set import SeriesSet
from turboprom.cluster import columns_codec, partitions
from turboprom.cluster.pushdown_decision import decide
from turboprom.tenancy import DEFAULT_TENANT, TenantView, validate_tenant


def only_partitions(ss: SeriesSet, wanted: set[int], total: int) -> SeriesSet:
    if not len(ss):
        return ss
    part = partitions.partitions_of(columns_codec.label_keys(ss.labels), total)
    keep = np.isin(part, np.fromiter(wanted, np.int64, len(wanted)))
    if keep.all():
        return ss
    counts = np.diff(ss.offsets)
    sample_keep = np.repeat(keep, counts)
    offsets = np.zeros(int(keep.sum()) + 1, np.int64)
    np.cumsum(counts[keep], out=offsets[1:])
    return SeriesSet([lbl for lbl, k in zip(ss.labels, keep) if k], offsets,
                     ss.timestamps[: ss.num_samples][sample_keep], ss.values[: ss.num_samples][sample_keep])


class PartitionIndex:
    """Partitions of the series in append-only label lists (the summaries' series registries), each
    series hashed once."""

    def __init__(self, total: int):
        self.total = total
        self._lists: dict[int, tuple[list, np.ndarray]] = {}
        self._lock = threading.Lock()

    def partitions(self, labels: Sequence[Labels]) -> np.ndarray:
        n = len(labels)
        with self._lock:
            hit = self._lists.get(id(labels))
            known = hit[1] if hit is not None and hit[0] is labels else np.zeros(0, np.int64)
        if len(known) >= n:
            return known
        more = partitions.partitions_of(columns_codec.label_keys(labels[len(known):n]), self.total)
        arr = np.concatenate([known, more])
        with self._lock:
            if len(self._lists) >= 4096:  # plans come and go: forget every list now and then
                self._lists.clear()
            self._lists[id(labels)] = (labels, arr)  # the list itself is kept: its id is not reused meanwhile
        return arr


class PartitionScope:
    """The series of some partitions (promql.eval_context.SeriesScope), for the planner's summaries."""

    def __init__(self, wanted: set[int], index: PartitionIndex):
        self.wanted = np.fromiter(sorted(wanted), np.int64, len(wanted))
        self.key = ("partitions", index.total, tuple(self.wanted.tolist()))
        self.index = index

    def keep(self, labels: Sequence[Labels], ids: np.ndarray) -> np.ndarray:
        return np.isin(self.index.partitions(labels)[ids], self.wanted)


class PartitionSource:
    """Storage reads restricted to the series of some partitions (``None``: all held ones)."""

    def __init__(self, storage: Any, wanted: set[int] | None, total: int):
        self.storage = storage
        self.wanted = wanted
        self.total = total

    def select(self, matchers: Sequence[Matcher], mint: int, maxt: int) -> SeriesSet:
        ss = self.storage.select(matchers, mint, maxt)
        return ss if self.wanted is None else only_partitions(ss, self.wanted, self.total)


@dataclass
class PartialRequest:
    query: str
    agg_pos: tuple[int, int]
    tenant: str
    partitions: list[int]
    steps: np.ndarray
    query_start_ms: int
    query_end_ms: int
    query_step_ms: int
    lookback_delta_ms: int
    subquery_depth: int
    max_samples: int
    max_bytes: int
    timeout_s: float
    exact: bool = False  # the query asked for exact=true: raw samples only, no summaries

    @classmethod
    def from_json(cls, q: dict) -> "PartialRequest":
        try:
            return cls(str(q["query"]), (int(q["agg_pos"][0]), int(q["agg_pos"][1])), validate_tenant(str(q["tenant"])),
                       [int(p) for p in q["partitions"]], np.asarray(q["steps"], np.int64), int(q["query_start_ms"]),
                       int(q["query_end_ms"]), int(q["query_step_ms"]), int(q["lookback_delta_ms"]), int(q["subquery_depth"]),
                       int(q["max_samples"]), int(q["max_bytes"]), float(q["timeout_s"]), bool(q.get("exact", False)))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise BadData(f"aggregate: {e}") from None


def find_aggregation(expr: Any, pos: tuple[int, int]) -> Any:
    for n in walk(expr):
        if isinstance(n, pp.AggregateExpr) and tuple(n.pos) == pos:
            return n
    raise BadData(f"aggregate: no aggregation at {pos[0]}-{pos[1]} of the query")


def _names(node: Any) -> tuple[list[str], bool]:
    if node.modifier is None:
        return [], False
    return sorted(node.modifier.labels), str(node.modifier.type).rsplit(".", 1)[-1] == "Without"


def evaluate_partial(storage: Any, req: PartialRequest, held: set[int], total: int, planned: Any = None,
                     index: PartitionIndex | None = None) -> bytes:
    """The partial state of the request's aggregation over its partitions (Arrow IPC,
    columns_codec.encode_partial). PromQL errors propagate (the querier then evaluates raw).
    ``planned``: this node's PlannedEngine (its planner learns the pushed sub-tree and its exact plans
    may answer it); ``index``: the partitions of the summaries' series (needed with ``planned``)."""
    arrival, wall0, cpu0 = int(time.time() * 1000), time.perf_counter(), time.thread_time()
    expr = parse(req.query)
    node = find_aggregation(expr, req.agg_pos)
    d = decide(node)
    if not d.pushed:
        raise BadData(f"aggregate: not pushable here: {d.reason}")
    wanted = set(req.partitions)
    scoped = not held <= wanted
    source = TenantView(PartitionSource(storage, wanted if scoped else None, total), req.tenant)
    learns = planned is not None and index is not None and req.tenant == DEFAULT_TENANT
    cands, hooks = planned.hooks_for(node.expr) if learns else ([], ())
    ann, stats = Annotations(), QueryStats()
    budget = QueryBudget(max_samples=req.max_samples, deadline=time.monotonic() + req.timeout_s, timeout_s=req.timeout_s,
                         max_bytes=req.max_bytes)
    ctx = EvalContext(step_times=req.steps, query_start_ms=req.query_start_ms, query_end_ms=req.query_end_ms,
                      query_step_ms=req.query_step_ms, lookback_delta_ms=req.lookback_delta_ms, source=source,
                      annotations=ann, stats=stats, budget=budget, query=req.query, subquery_depth=req.subquery_depth,
                      hooks=() if req.exact else hooks,
                      series_scope=PartitionScope(wanted, index) if scoped and index is not None else None)
    if req.exact:
        ctx.extra["exact"] = True
    try:
        positions = locate_all(expr, req.query)
    except Exception:  # positions are best effort, as in the engine
        positions = {}
    ev = Evaluator(positions)
    op = str(node.op).lower()
    with np.errstate(all="ignore"):
        param = ev.eval(node.param, ctx) if node.param is not None else None
        vec = ev.eval(node.expr, ctx)
        if not isinstance(vec, VectorSteps):
            raise BadData(f"expected type instant vector in aggregation expression, got {type(vec).__name__}")
        if learns:
            _learn(planned, cands, req, node, vec, stats, arrival, time.perf_counter() - wall0,
                   time.thread_time() - cpu0)
        if has_hist(vec):
            raise PromQLError("aggregate: native histogram samples are not pushed down")
        names, without = _names(node)
        state = partial(op, vec, names, without, param if isinstance(param, Scalar) else None)
    per_step = stats.samples_per_step[1].tolist() if stats.samples_per_step is not None else None
    header = {"warnings": ann.warnings, "infos": ann.infos,
              "stats": {"samples_scanned": stats.samples_scanned, "series_touched": stats.series_touched,
                        "cpu_seconds": time.thread_time() - cpu0,
                        "paths": [p for p in stats.paths if p.startswith("summary:")],
                        "peak_samples": stats.peak_samples, "total_queryable_samples": stats.total_queryable_samples,
                        "samples_per_step": per_step},
              "series": vec.num_series}
    return columns_codec.encode_partial(state, header)


def _learn(planned: Any, cands: list, req: PartialRequest, node: Any, vec: VectorSteps, stats: QueryStats,
           arrival_ms: int, wall_s: float, cpu_s: float) -> None:
    """Log the pushed sub-tree's evaluation as this node's own query of it, for its planner."""
    text = req.query[node.expr.pos[0]:node.expr.pos[1]]
    steps = req.steps
    start, end = (int(steps[0]), int(steps[-1])) if len(steps) else (req.query_start_ms, req.query_end_ms)
    step = int(steps[1] - steps[0]) if len(steps) > 1 else 0
    entry = LogEntry(expr=text, pattern=normalize(text, node.expr), kind="range" if step else "instant",
                     start_ms=start, end_ms=end, step_ms=step, wall_s=wall_s, cpu_s=cpu_s,
                     samples=stats.samples_scanned, paths=list(stats.paths), result_series=vec.num_series,
                     result_points=int(vec.present.sum()) if vec.present is not None else vec.num_series,
                     exact=req.exact, approx=False, tenant=req.tenant, origin="pushdown", arrival_ms=arrival_ms)
    planned.learn(entry, cands)


__all__ = ["PartialRequest", "PartitionIndex", "PartitionScope", "PartitionSource", "evaluate_partial",
           "find_aggregation"]
