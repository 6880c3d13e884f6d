"""The PromQL evaluator: one switch on node type, every node evaluated once for all T steps.

``Evaluator.eval(node, ctx)`` returns a ``promql.types`` value (Scalar (T,), StringValue,
VectorSteps (S, T), RangeWindows). ``ctx`` is an ``EvalContext`` (promql/eval_context.py);
its documented fields are what ``node_hooks`` see:

* ``ctx.step_times`` -- int64 (T,) evaluation timestamps (ms) of this (sub)evaluation
* ``ctx.query_start_ms`` / ``query_end_ms`` / ``query_step_ms`` -- the top-level query's bounds
* ``ctx.lookback_delta_ms`` -- lookback for instant-vector selection
* ``ctx.source`` -- the SampleSource raw samples come from
* ``ctx.annotations`` / ``ctx.stats`` -- per-query warnings/infos and QueryStats
* ``ctx.subquery_depth`` -- 0 at the top level

A hook is called as ``hook(node, ctx)`` before a Call, AggregateExpr, VectorSelector,
MatrixSelector or SubqueryExpr is evaluated; a non-None return value (a Value shaped for
``ctx.step_times``) replaces evaluating that sub-tree.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from promql import parser as pp

from promql.errors import BadData, ExecutionError
from promql.eval_aggregate import aggregate
from promql.eval_binary import (
    COMPARE,
    SET_OPS,
    Matching,
    scalar_scalar,
    set_op,
    unary_minus,
    vector_scalar,
    vector_vector,
)
from promql.eval_context import EvalContext, QueryBudget
from promql.eval_histogram import TRIM_OPS, call_with_histograms
from promql.histogram_planes import empty_plane, has_hist, plane_to_set, strip
from promql.eval_labels import merge_same_labels, raw_string_literal_bytes
from storage.go_format import go_quote_bytes
from promql.eval_positions import line_col
from promql.eval_selectors import (
    duration_ms,
    effective_times,
    eval_matrix_selector,
    eval_vector_selector,
    windows_from_series,
)
from promql.functions import FUNCTIONS, FunctionContext, FunctionSpec, load_all
from promql.functions.extended import check_function as check_extended
from promql.types import HistWindows, RangeWindows, Scalar, StringValue, Value, VectorSteps
from storage.series_set import SeriesSet

_HOOKED = (pp.Call, pp.AggregateExpr, pp.VectorSelector, pp.MatrixSelector, pp.SubqueryExpr)
_CHUNK_CELLS = 1 << 18  # series x steps per block handed to a range-vector function


def slice_windows(w: RangeWindows, a: int, b: int) -> RangeWindows:
    """Series a..b of a RangeWindows, re-based onto its own CSR slice (views, no copies)."""
    base = int(w.offsets[a])
    end = int(w.offsets[b])
    hw = None
    if w.hist is not None:
        hb, he = int(w.hist.offsets[a]), int(w.hist.offsets[b])
        hw = HistWindows(w.hist.offsets[a:b + 1] - hb, w.hist.ts[hb:he], w.hist.objs[hb:he],
                         w.hist.lo[a:b] - hb, w.hist.hi[a:b] - hb,
                         None if w.hist.plain is None else w.hist.plain[hb:he])
    return RangeWindows(
        w.labels[a:b],
        w.offsets[a:b + 1] - base,
        w.ts[base:end],
        w.vals[base:end],
        w.lo[a:b] - base,
        w.hi[a:b] - base,
        w.window_end,
        w.range_ms,
        None if w.drop_name is None else w.drop_name[a:b],
        hw,
        w.extended,
    )


def concat_vectors(parts: list[VectorSteps], t: int) -> VectorSteps:
    parts = [p for p in parts if p.num_series]
    if not parts:
        return VectorSteps.empty(t)
    if len(parts) == 1:
        return parts[0]
    labels = [l for p in parts for l in p.labels]
    drop = None
    if any(p.drop_name is not None for p in parts):
        drop = np.concatenate([p.drop_name_mask() for p in parts])
    sts = None
    if all(p.sample_ts is not None for p in parts):
        sts = np.concatenate([p.sample_ts for p in parts], axis=0)
    plane = None
    if any(p.hist is not None for p in parts):
        plane = np.concatenate([p.hist if p.hist is not None else empty_plane(p.values.shape) for p in parts], axis=0)
    return VectorSteps(labels, np.concatenate([p.values for p in parts], axis=0),
                       np.concatenate([p.present for p in parts], axis=0), drop, sts, plane)


def value_bytes(v: Value) -> int:
    """Bytes the arrays of a result hold (views count their own extent)."""
    if isinstance(v, VectorSteps):
        n = v.values.nbytes + v.present.nbytes
        if v.sample_ts is not None:
            n += v.sample_ts.nbytes
        if v.hist is not None:
            n += v.hist.nbytes
        return int(n)
    if isinstance(v, RangeWindows):
        n = v.ts.nbytes + v.vals.nbytes + v.lo.nbytes + v.hi.nbytes + v.offsets.nbytes
        if v.hist is not None:
            n += v.hist.ts.nbytes + v.hist.objs.nbytes + v.hist.lo.nbytes + v.hist.hi.nbytes
        return int(n)
    if isinstance(v, Scalar):
        return int(v.values.nbytes)
    return 0


def _unparen(node: Any) -> Any:
    while isinstance(node, pp.ParenExpr):
        node = node.expr
    return node


def _per_step(v: Value, t: int) -> np.ndarray:
    """Samples of ``v`` at each of the ``t`` steps (a scalar has one)."""
    if isinstance(v, VectorSteps):
        if v.num_series == 0:
            return np.zeros(t, np.int64)
        p = v.any_present() if v.hist is not None else v.present
        return p.sum(axis=0, dtype=np.int64)
    if isinstance(v, Scalar):
        return np.ones(t, np.int64)
    return np.zeros(t, np.int64)


def _stepwise_peak(operands: list[Value], out: Value, t: int) -> int:
    """What Prometheus's rangeEval holds beyond its operands at its fullest step: the operands'
    samples gathered at the step plus the results of all steps so far."""
    if t == 0:
        return 0
    gathered = np.zeros(t, np.int64)
    for v in operands:
        gathered += _per_step(v, t)
    return int((gathered + np.cumsum(_per_step(out, t))).max())


def series_peak(w: RangeWindows) -> int:
    """The most samples one series' windows span (all steps): what a series-by-series engine holds."""
    if w.lo.size == 0:
        return 0
    return int((w.hi.max(axis=1) - w.lo.min(axis=1)).max())


def value_size(v: Value) -> int:
    if isinstance(v, VectorSteps):
        return int(v.any_present().sum()) if v.hist is not None else int(v.present.sum())
    if isinstance(v, RangeWindows):
        # a step-wise engine holds one step's windows at a time
        if v.lo.size == 0:
            return 0
        return int((v.hi - v.lo).sum(axis=0).max())
    if isinstance(v, Scalar):
        return int(v.values.shape[0])
    return 0


class Evaluator:
    def __init__(self, positions: dict[int, int] | None = None) -> None:
        load_all()
        self.positions = positions or {}
        # id(node) -> operand values of a node evaluated step by step in Prometheus's engine (for
        # its sample accounting in ``eval``)
        self._operands: dict[int, list[Value]] = {}

    def drop_operands(self) -> None:
        """Forget operands kept for sample accounting (after an error interrupted a node)."""
        self._operands.clear()

    # -- positions ------------------------------------------------------------------------
    def pos(self, node: Any, ctx: EvalContext) -> tuple[int, int] | None:
        off = self.positions.get(id(node))
        if off is None:
            return None
        return line_col(ctx.query, off)

    def pos_suffix(self, node: Any, ctx: EvalContext) -> str:
        p = self.pos(node, ctx)
        return f" ({p[0]}:{p[1]})" if p else ""

    # -- dispatch -------------------------------------------------------------------------
    def eval(self, node: Any, ctx: EvalContext, streamed: bool = False) -> Value:
        """Evaluate ``node`` and account the samples it holds like Prometheus's engine
        (``--query.max-samples``):

        * selectors hold their points; a parenthesis, a unary minus and a subquery hold no more than
          their operand's result;
        * a function over a range vector (``streamed``: the argument of a Call) is fed one series at a
          time, so the windows count with their largest series only, beside the output;
        * every other operator, aggregation and function keeps its operands while, step by step, it
          gathers their samples at the step and adds its result: the peak is operands + gathered
          samples of a step + results so far (``_stepwise_peak``).
        """
        if isinstance(node, pp.ParenExpr):
            return self.eval(node.expr, ctx, streamed)
        ctx.budget.check()
        if ctx.hooks and isinstance(node, _HOOKED):
            for hook in ctx.hooks:
                res = hook(node, ctx)
                if res is not None:
                    return res
        b = ctx.budget
        before, before_bytes = b.current_samples, b.current_bytes
        val = self._eval(node, ctx)
        size = series_peak(val) if streamed and isinstance(val, RangeWindows) else value_size(val)
        nbytes = value_bytes(val)
        operands = self._operands.pop(id(node), None)
        if isinstance(node, (pp.UnaryExpr, pp.SubqueryExpr)):  # their operand's samples, not more
            b.current_samples, b.current_bytes = before, before_bytes
        if operands is not None:
            b.charge(_stepwise_peak(operands, val, ctx.num_steps), ctx.stats)
        else:
            b.charge(size, ctx.stats)
        b.hold(nbytes)
        b.current_samples, b.current_bytes = before + size, before_bytes + nbytes
        return val

    def _eval(self, node: Any, ctx: EvalContext) -> Value:
        t = ctx.num_steps
        if isinstance(node, pp.NumberLiteral):
            return Scalar(np.full(t, float(node.val)))
        if isinstance(node, pp.StringLiteral):
            return StringValue(node.val)
        if isinstance(node, pp.UnaryExpr):
            v = self.eval(node.expr, ctx)
            if str(node.op) == "+":
                return v
            if isinstance(v, Scalar):
                return Scalar(-v.values)
            if isinstance(v, VectorSteps):
                return unary_minus(v)  # histograms are negated bucket-wise
            raise BadData("unary expression only allowed on expressions of type scalar or instant vector")
        if isinstance(node, pp.VectorSelector):
            return eval_vector_selector(ctx, node, self.pos_suffix(node, ctx) if node.smoothed else "")
        if isinstance(node, pp.MatrixSelector):
            return eval_matrix_selector(ctx, node)
        if isinstance(node, pp.SubqueryExpr):
            return self.eval_subquery(node, ctx)
        if isinstance(node, pp.Call):
            return self.eval_call(node, ctx)
        if isinstance(node, pp.AggregateExpr):
            return self.eval_aggregate(node, ctx)
        if isinstance(node, pp.BinaryExpr):
            return self.eval_binary(node, ctx)
        raise ExecutionError(f"unhandled expression of type {type(node).__name__}")

    # -- subqueries -----------------------------------------------------------------------
    def eval_subquery(self, node: Any, ctx: EvalContext) -> RangeWindows:
        rng = duration_ms(node.range)
        step = duration_ms(node.step) if node.step is not None else 0
        if step <= 0:
            step = ctx.default_subquery_step_ms
        e = effective_times(node, ctx)
        inner_times = subquery_steps(e, rng, step, ctx.budget)
        if len(inner_times) == 0:
            inner = VectorSteps.empty(0)
        else:
            inner = self.eval(node.expr, ctx.child(inner_times))
        if isinstance(inner, Scalar):
            raise BadData("subquery is only allowed on instant vector, got scalar")
        if not isinstance(inner, VectorSteps):
            raise BadData("subquery is only allowed on instant vector")
        p = inner.present
        counts = p.sum(axis=1).astype(np.int64)
        off = np.zeros(inner.num_series + 1, np.int64)
        np.cumsum(counts, out=off[1:])
        rows, cols = np.nonzero(p)
        ts = inner_times[cols] if len(inner_times) else np.empty(0, np.int64)
        ss = SeriesSet(list(inner.labels), off, ts.astype(np.int64), inner.values[rows, cols])
        hs = plane_to_set(list(inner.labels), inner.hist, inner_times)
        return windows_from_series(ctx, ss, e, rng, inner.drop_name, count_samples=False, hs=hs)

    # -- function calls -------------------------------------------------------------------
    def eval_call(self, node: Any, ctx: EvalContext) -> Value:
        name = node.func.name
        spec = FUNCTIONS.get(name)
        if spec is None:
            raise ExecutionError(f"function {name!r} is not implemented")
        for a in node.args:
            m = _unparen(a)
            if isinstance(m, pp.MatrixSelector) and (m.vector_selector.anchored or m.vector_selector.smoothed):
                check_extended(("anchored" if m.vector_selector.anchored else "smoothed"), name)
        args: list[Value] = []
        for a in node.args:
            if isinstance(a, pp.VectorSelector) and a.bypass_empty_matcher_check:
                args.append(VectorSteps.empty(ctx.num_steps))  # info()'s label selector: read by info() itself
                continue
            args.append(self.eval(a, ctx, streamed=_unparen(a).__class__ is pp.MatrixSelector))
        if not any(isinstance(a, RangeWindows) for a in args):  # step by step over instant vectors
            self._operands[id(node)] = [a for a in args if isinstance(a, (VectorSteps, Scalar))]
        if spec.sorts and ctx.num_steps > 1:
            ctx.annotations.warn(
                "PromQL warning: sort is ineffective for range queries since results are always ordered by labels"
                + self.pos_suffix(node, ctx)
            )
        fctx = FunctionContext(
            step_times=ctx.step_times,
            annotations=ctx.annotations,
            node=node,
            lookback_delta_ms=ctx.lookback_delta_ms,
            query_start_ms=ctx.query_start_ms,
            query_end_ms=ctx.query_end_ms,
            query_step_ms=ctx.query_step_ms,
            extra={"eval_ctx": ctx},
        )
        fctx.position = self.pos(node, ctx)
        fctx.arg_positions = [self.pos(a, ctx) for a in node.args]  # type: ignore[misc]  # None: unknown
        if any(has_hist(a) for a in args):
            res = call_with_histograms(spec, lambda a: self._call_chunked(spec, fctx, a), args, fctx)
        else:
            res = self._call_chunked(spec, fctx, [strip(a) for a in args])
        if isinstance(res, VectorSteps):
            if not spec.keeps_name and res.num_series:
                res = dataclasses.replace(res, drop_name=np.ones(res.num_series, dtype=bool))
            res = merge_same_labels(res)
        return res

    def _call_chunked(self, spec: FunctionSpec, fctx: FunctionContext, args: list[Value]) -> Value:
        """Range-vector functions work series by series: feed them blocks of series so their
        (series x steps) temporaries stay cache-sized and memory stays bounded."""
        impl = spec.impl
        wi = [i for i, a in enumerate(args) if isinstance(a, RangeWindows)]
        if len(wi) != 1 or spec.cross_series:
            return impl(fctx, args)
        w = args[wi[0]]
        s, t = w.num_series, w.num_steps
        rows = max(16, _CHUNK_CELLS // max(t, 1))
        if s <= rows:
            return impl(fctx, args)
        parts: list[VectorSteps] = []
        budget = fctx.extra["eval_ctx"].budget
        for a in range(0, s, rows):
            budget.check()  # timeout / cancel between series blocks too
            b = min(s, a + rows)
            sub = list(args)
            sub[wi[0]] = slice_windows(w, a, b)
            r = impl(fctx, sub)
            if not isinstance(r, VectorSteps):
                return impl(fctx, args)  # not a per-series function after all
            parts.append(r)
        return concat_vectors(parts, t)

    # -- aggregations ---------------------------------------------------------------------
    def eval_aggregate(self, node: Any, ctx: EvalContext) -> VectorSteps:
        op = str(node.op).lower()
        param = None
        if node.param is not None:
            param = self.eval(node.param, ctx)
        vec = self.eval(node.expr, ctx)
        if not isinstance(vec, VectorSteps):
            raise BadData(f"expected type instant vector in aggregation expression, got {type(vec).__name__}")
        self._operands[id(node)] = [vec] + ([param] if isinstance(param, Scalar) else [])
        names: list[str] = []
        without = False
        if node.modifier is not None:
            without = str(node.modifier.type).rsplit(".", 1)[-1] == "Without"
            names = sorted(node.modifier.labels)
        pos = self.pos_suffix(node.param, ctx) if node.param is not None else ""
        if op == "count_values" and isinstance(param, StringValue):
            self._check_label_name(node.param, param.value, ctx)
        return aggregate(op, vec, names, without, param, ctx.annotations, pos,
                         expr_pos=self.pos_suffix(node.expr, ctx), agg_pos=self.pos_suffix(node, ctx),
                         budget=ctx.budget)

    def _check_label_name(self, lit: Any, value: str, ctx: EvalContext) -> None:
        """count_values' label must be a valid (UTF-8, non-empty) label name, judged on the
        literal's raw bytes: the parser binding decodes ``\\xc5`` to a code point."""
        raw = None
        off = self.positions.get(id(lit))
        if off is not None:
            raw = raw_string_literal_bytes(ctx.query, off)
        data = raw if raw is not None else value.encode("utf-8", "surrogatepass")
        try:
            data.decode("utf-8")
            ok = len(data) > 0
        except UnicodeDecodeError:
            ok = False
        if not ok:
            raise ExecutionError(f"invalid label name {go_quote_bytes(data)}")

    # -- binary operators -----------------------------------------------------------------
    def eval_binary(self, node: Any, ctx: EvalContext) -> Value:
        op = str(node.op).strip().lower()
        lhs = self.eval(node.lhs, ctx)
        rhs = self.eval(node.rhs, ctx)
        self._operands[id(node)] = [lhs, rhs]
        m = Matching(node.modifier, op)
        hctx = None
        if (isinstance(lhs, VectorSteps) and lhs.hist is not None) or (isinstance(rhs, VectorSteps) and rhs.hist is not None):
            hctx = (self.pos_suffix(node, ctx), ctx.annotations)  # histogram samples involved
        elif op in TRIM_OPS:
            hctx = (self.pos_suffix(node, ctx), ctx.annotations)  # the info for float operands
        if isinstance(lhs, Scalar) and isinstance(rhs, Scalar):
            return scalar_scalar(op, lhs, rhs)
        if isinstance(lhs, VectorSteps) and isinstance(rhs, Scalar):
            return vector_scalar(op, lhs, rhs, False, m.return_bool, hctx)
        if isinstance(lhs, Scalar) and isinstance(rhs, VectorSteps):
            return vector_scalar(op, rhs, lhs, True, m.return_bool, hctx)
        if isinstance(lhs, VectorSteps) and isinstance(rhs, VectorSteps):
            if op in SET_OPS:
                return set_op(op, lhs, rhs, m)
            return vector_vector(op, lhs, rhs, m, hctx)
        raise BadData(f"binary expression must contain only scalar and instant vector types (operator {op})")


def subquery_steps(e: np.ndarray, rng: int, step: int, budget: QueryBudget | None = None) -> np.ndarray:
    """The inner evaluation times of a subquery: absolute multiples of ``step`` inside any of
    the windows (e - rng, e]. With ``budget``, a step count whose evaluation (one row of every
    inner step, at least) would exceed the query's memory budget is refused before allocating."""
    if len(e) == 0:
        return np.empty(0, np.int64)
    ue = np.unique(e)
    first = (ue - rng) // step + 1  # first multiple strictly after e - rng
    last = ue // step  # last multiple <= e
    if len(ue) == 1 or (np.diff(ue).max() <= rng):
        lo, hi = int(first.min()), int(last.max())
        if hi < lo:
            return np.empty(0, np.int64)
        if budget is not None:
            budget.reserve_cells(1, hi - lo + 1)
        return np.arange(lo, hi + 1, dtype=np.int64) * step
    if budget is not None:
        budget.reserve_cells(1, sum(max(0, b - a + 1) for a, b in zip(first.tolist(), last.tolist())))
    parts = [np.arange(int(a), int(b) + 1, dtype=np.int64) for a, b in zip(first.tolist(), last.tolist()) if b >= a]
    if not parts:
        return np.empty(0, np.int64)
    return np.unique(np.concatenate(parts)) * step


__all__ = ["Evaluator", "subquery_steps", "COMPARE"]
