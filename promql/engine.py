"""Query engine front door: parse, evaluate (instant / range), shape the result.

``Engine(source)`` is what the HTTP API and the conformance runner call::

    eng = Engine(source, lookback_delta_ms=300_000, max_samples=50_000_000, timeout_s=120.0)
    res = eng.instant_query("sum by (job) (rate(x[5m]))", time_ms)
    res = eng.range_query("...", start_ms, end_ms, step_ms)

Both return ``promql.types.QueryResult`` (range queries always "matrix"; an instant query whose
expression is a range selector or subquery returns a ragged matrix in ``QueryResult.csr``).
Per-query options (``promql.query_opts.QueryOpts``: lookback, timeout, max samples, max depth,
memory budget, a ``threading.Event`` to cancel, and ``node_hooks``) override the engine defaults;
the engine's own ``node_hooks`` (a cluster querier's aggregation pushdown) run after the query's.

Limits (docs/reliability.md, "Query limits"): ``max_depth`` refuses expressions deeper than that
before the parser binding runs (BadData, 400; promql/query_guard.py); ``max_samples`` counts the
samples held at once, operands and result of every node included, like Prometheus's
``--query.max-samples``; ``max_memory_bytes`` checks the estimated size of dense intermediate
results before they are allocated. Both answer ``TooManySamples`` (422, Prometheus's text). ``node_hooks`` let the planner answer sub-trees
from summaries; see promql/evaluator.py for the fields of the eval context they receive.

Semantics follow Prometheus 3.x with delayed ``__name__`` removal; see docs/compatibility.md.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
from promql import parser as pp

from promql import query_guard
from promql.errors import BadData, ExecutionError, PromQLError, TooManySamples
from promql.eval_context import BYTES_PER_CELL, EvalContext, NodeHook, QueryBudget
from promql.eval_histogram import histogram_points, refuse_result, stats_selectors
from promql.histogram_planes import has_hist, strip
from promql.eval_labels import SAME_LABELSET, apply_name_drop, drop_metric_name, merge_same_labels
from promql.eval_positions import locate_all
from promql.evaluator import Evaluator
from promql.parser.durations import resolve as resolve_durations
from promql.query_guard import DEFAULT_MAX_DEPTH
from promql.query_opts import NO_OPTS, QueryOpts
from promql.source import SampleSource
from promql.functions.extended import matrix_points
from promql.types import Annotations, QueryResult, QueryStats, RangeWindows, Scalar, StringValue, VectorSteps

_DOC_TYPES = {"Vector": "instant vector", "Matrix": "range vector", "Scalar": "scalar", "String": "string"}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
DEFAULT_MAX_MEMORY_BYTES = 2 * 1024**3  # per query (--query.max-memory)
JSON_BYTES_PER_SAMPLE = 40


TRIM_AFTER_BYTES = 256 * 1024**2


def _release_freed_memory() -> None:
    """Hand memory freed by a big query back to the OS (glibc keeps freed heap pages otherwise, so a
    refused or finished heavy query would leave the process's RSS high)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None
_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
MMAP_THRESHOLD_BYTES = 4 * 1024**2


def _fixed_mmap_threshold() -> None:
    """Large arrays get their own mappings, returned to the OS as soon as they are freed. glibc's
    default threshold grows with every large free (up to 32 MiB), after which the blocks a big
    query computes in land on the heap and stay in the process's RSS."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        pass


_fixed_mmap_threshold()


def _result_points(res: QueryResult) -> int:
    if res.present is not None:
        return int(res.present.sum())
    if res.csr is not None:
        return int(len(res.csr[1]))
    return len(res.labels) if res.labels else 1


def parse(query: str, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Parse a PromQL expression (promql/parser/); errors are BadData with Prometheus's text
    (``line:col: parse error: ...``).

    The text is scanned first (promql/query_guard.py): expressions deeper than ``max_depth`` are
    refused before they are parsed."""
    return query_guard.parse(query, max_depth)


def expr_type(node: Any) -> str:
    """Static PromQL type: "Vector" | "Matrix" | "Scalar" | "String"."""
    if isinstance(node, pp.NumberLiteral):
        return "Scalar"
    if isinstance(node, pp.StringLiteral):
        return "String"
    if isinstance(node, (pp.VectorSelector, pp.AggregateExpr)):
        return "Vector"
    if isinstance(node, (pp.MatrixSelector, pp.SubqueryExpr)):
        return "Matrix"
    if isinstance(node, pp.Call):
        return str(node.func.return_type).rsplit(".", 1)[-1]
    if isinstance(node, (pp.ParenExpr, pp.UnaryExpr)):
        return expr_type(node.expr)
    if isinstance(node, pp.BinaryExpr):
        if expr_type(node.lhs) == "Scalar" and expr_type(node.rhs) == "Scalar":
            return "Scalar"
        return "Vector"
    return "Vector"


class Engine:
    def __init__(
        self,
        source: SampleSource,
        *,
        lookback_delta_ms: int = 300_000,
        max_samples: int = 50_000_000,
        timeout_s: float = 120.0,
        default_subquery_step_ms: int = 60_000,
        histogram_results: bool = False,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
        node_hooks: Sequence[NodeHook] = (),
    ) -> None:
        self.source = source
        # hooks of every query, after the query's own (a cluster querier's pushdown)
        self.node_hooks = tuple(node_hooks)
        # Return native-histogram samples in QueryResult.histograms instead of refusing them
        # (only the conformance runner sets this; storage is float-only).
        self.histogram_results = bool(histogram_results)
        self.lookback_delta_ms = int(lookback_delta_ms)
        self.max_samples = int(max_samples)
        self.timeout_s = float(timeout_s)
        self.default_subquery_step_ms = int(default_subquery_step_ms)
        self.max_depth = int(max_depth)  # deepest expression tree accepted (0: no limit)
        self.max_memory_bytes = int(max_memory_bytes)  # per-query memory estimate budget (0: no limit)
        query_guard.ensure_recursion_headroom(self.max_depth)

    def parse(self, query: str, max_depth: int | None = None) -> Any:
        return parse(query, self.max_depth if max_depth is None else int(max_depth))

    # -- public API -----------------------------------------------------------------------
    def instant_query(self, query: str, time_ms: int, opts: QueryOpts = NO_OPTS) -> QueryResult:
        expr = self.parse(query, opts.max_depth)
        steps = np.array([int(time_ms)], dtype=np.int64)
        return self._run(query, expr, steps, int(time_ms), int(time_ms), 0, False, opts)

    def range_query(self, query: str, start_ms: int, end_ms: int, step_ms: int,
                    opts: QueryOpts = NO_OPTS) -> QueryResult:
        if step_ms <= 0:
            raise BadData("zero or negative query resolution step widths are not accepted. Try a positive integer")
        if end_ms < start_ms:
            raise BadData("end timestamp must not be before start time")
        for name, v in (("start", start_ms), ("end", end_ms), ("step", step_ms)):
            if not (_INT64_MIN <= int(v) <= _INT64_MAX):
                raise BadData(f"{name} {v} is out of range: times and steps are int64 milliseconds")
        expr = self.parse(query, opts.max_depth)
        et = expr_type(expr)
        if et not in ("Vector", "Scalar"):
            raise BadData(f'invalid expression type "{_DOC_TYPES[et]}" for range query, must be Scalar or instant Vector')
        n = (int(end_ms) - int(start_ms)) // int(step_ms) + 1
        mem = self.max_memory_bytes if opts.max_memory_bytes is None else int(opts.max_memory_bytes)
        if mem > 0 and n * BYTES_PER_CELL > mem:  # the step times alone, before anything is evaluated
            raise TooManySamples()
        steps = int(start_ms) + np.arange(n, dtype=np.int64) * int(step_ms)
        return self._run(query, expr, steps, int(start_ms), int(end_ms), int(step_ms), True, opts)

    # -- internals ------------------------------------------------------------------------
    def _run(self, query: str, expr: Any, steps: np.ndarray, start: int, end: int, step: int, is_range: bool,
             opts: QueryOpts) -> QueryResult:
        wall0 = time.perf_counter()
        cpu0 = time.thread_time()
        lookback_delta_ms, timeout_s, max_samples = opts.lookback_delta_ms, opts.timeout_s, opts.max_samples
        cancel, node_hooks, max_memory_bytes = opts.cancel, opts.node_hooks, opts.max_memory_bytes
        resolve_durations(expr, step, end - start)  # [5m+step()], offset -(1h): values for this query
        tmo = self.timeout_s if timeout_s is None else float(timeout_s)
        lookback = self.lookback_delta_ms if not lookback_delta_ms or lookback_delta_ms <= 0 else int(lookback_delta_ms)
        stats = QueryStats()
        ann = Annotations()
        budget = QueryBudget(
            max_samples=self.max_samples if max_samples is None else int(max_samples),
            deadline=time.monotonic() + tmo,
            timeout_s=tmo,
            cancel=cancel,
            max_bytes=self.max_memory_bytes if max_memory_bytes is None else int(max_memory_bytes),
        )
        ctx = EvalContext(
            step_times=steps,
            query_start_ms=start,
            query_end_ms=end,
            query_step_ms=step,
            lookback_delta_ms=lookback,
            source=self.source,
            annotations=ann,
            stats=stats,
            budget=budget,
            default_subquery_step_ms=self.default_subquery_step_ms,
            hooks=(*node_hooks, *self.node_hooks),
            query=query,
        )
        if opts.exact:  # hooks that pass the query on (a cluster querier's pushdown) keep it raw there too
            ctx.extra["exact"] = True
        try:
            positions = locate_all(expr, query)
        except Exception:  # positions are best effort
            positions = {}
        if getattr(self.source, "select_histograms", None) is not None and getattr(self.source, "has_histograms", True):
            ctx.extra["histogram_stats_selectors"] = stats_selectors(expr)
        ev = Evaluator(positions)
        try:
            with np.errstate(all="ignore"):
                val = ev.eval(expr, ctx)
                budget.check()
                res = self._shape(val, steps, is_range)
                # the answer is encoded as JSON next (~40 bytes a sample): that memory counts too
                budget.reserve(_result_points(res) * JSON_BYTES_PER_SAMPLE)
        except PromQLError as e:
            # A refused query must not keep its intermediate arrays alive: the evaluator's frames in
            # the traceback hold them, and the traceback ends up in reference cycles (futures of the
            # HTTP layer) that only the cyclic GC would free, hundreds of MB per refusal.
            ev.drop_operands()
            e.with_traceback(None)
            if budget.peak_bytes > TRIM_AFTER_BYTES:
                _release_freed_memory()
            raise
        if budget.peak_bytes > TRIM_AFTER_BYTES:
            del val
            _release_freed_memory()
        res.annotations = ann
        stats.wall_seconds = time.perf_counter() - wall0
        stats.cpu_seconds = time.thread_time() - cpu0
        if not stats.paths:
            stats.paths.append("raw")
        res.stats = stats
        return res

    def _shape(self, val: Any, steps: np.ndarray, is_range: bool) -> QueryResult:
        t0 = int(steps[0])
        if not self.histogram_results:
            refuse_result(val)  # results are float-only: a native histogram in them is an error
        elif has_hist(val):
            res = self._shape(strip(val), steps, is_range)
            res.histograms = histogram_points(val, steps)
            return res
        if isinstance(val, StringValue):
            if is_range:
                raise BadData('invalid expression type "string" for range query, must be Scalar or instant Vector')
            return QueryResult("string", string=val.value, timestamp=t0)
        if isinstance(val, Scalar):
            if is_range:
                return QueryResult("matrix", labels=[()], values=val.values[None, :].copy(),
                                   present=np.ones((1, len(steps)), bool), timestamps=steps)
            return QueryResult("scalar", scalar=float(val.values[0]), timestamp=t0)
        if isinstance(val, RangeWindows):
            if is_range:
                raise BadData('invalid expression type "range vector" for range query, must be Scalar or instant Vector')
            return self._shape_windows(val, t0)
        if isinstance(val, VectorSteps):
            vec = apply_name_drop(val)
            if is_range:
                keep = vec.present.any(axis=1)
                idx = [i for i in np.flatnonzero(keep).tolist()]
                idx.sort(key=lambda i: vec.labels[i])
                ia = np.array(idx, dtype=np.int64)
                pres = vec.present[ia] if len(ia) else np.zeros((0, len(steps)), bool)
                return QueryResult(
                    "matrix",
                    labels=[vec.labels[i] for i in idx],
                    # absent cells read 0 (never leaked gather leftovers)
                    values=np.where(pres, vec.values[ia], 0.0) if len(ia) else np.zeros((0, len(steps))),
                    present=pres,
                    timestamps=steps,
                )
            rows = np.flatnonzero(vec.present[:, 0]) if vec.num_series else np.empty(0, np.int64)
            return QueryResult(
                "vector",
                labels=[vec.labels[i] for i in rows.tolist()],
                values=vec.values[rows, 0].copy() if len(rows) else np.zeros(0),
                timestamp=t0,
            )
        raise PromQLError(f"unexpected result value {type(val).__name__}")

    def _shape_windows(self, w: RangeWindows, t0: int) -> QueryResult:
        if w.extended:
            w = matrix_points(w)
        lo, hi = w.lo[:, 0], w.hi[:, 0]
        n = hi - lo
        labels = list(w.labels)
        if w.drop_name is not None:
            labels = [drop_metric_name(l) if d else l for l, d in zip(labels, w.drop_name.tolist())]
        by_label: dict = {}
        for i in np.flatnonzero(n > 0).tolist():
            by_label.setdefault(labels[i], []).append(i)
        out_labels = sorted(by_label)
        ts_parts, val_parts, counts = [], [], []
        for lbl in out_labels:  # per series
            rows = by_label[lbl]
            ts = np.concatenate([w.ts[lo[i]:hi[i]] for i in rows])
            vals = np.concatenate([w.vals[lo[i]:hi[i]] for i in rows])
            if len(rows) > 1:  # same labels once names are dropped: merge, like Prometheus
                order = np.argsort(ts, kind="stable")
                ts, vals = ts[order], vals[order]
                if (np.diff(ts) == 0).any():
                    raise ExecutionError(SAME_LABELSET)
            ts_parts.append(ts)
            val_parts.append(vals)
            counts.append(len(ts))
        off = np.zeros(len(out_labels) + 1, np.int64)
        np.cumsum(np.asarray(counts, np.int64), out=off[1:])
        ts_all = np.concatenate(ts_parts) if ts_parts else np.empty(0, np.int64)
        vals_all = np.concatenate(val_parts) if val_parts else np.empty(0)
        return QueryResult("matrix", labels=out_labels, csr=(off, ts_all, vals_all), timestamp=t0)


__all__ = ["Engine", "parse", "expr_type", "merge_same_labels"]
