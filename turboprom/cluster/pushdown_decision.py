"""Which aggregations a querier pushes down to the ingesters, and why not the others.

Series are partitioned by tenant + labels, so every series lives whole in one partition and an
aggregation whose partial states merge (sum, count, min, max, avg, group, topk, bottomk) can be
computed per partition and merged, *if* the expression it aggregates is evaluated series by series:
a selector, one of the per-series range functions over a range selector, or such an expression
with arithmetic or a comparison against a constant scalar. Whatever else (stddev, quantile,
count_values, limitk; a join between two vectors; ``absent``; a subquery; a parameter that is not
a number) keeps the raw path: the querier pulls the selected samples and evaluates itself.

``decide(node)`` is the one decision: ``Decision(True, "")`` or ``Decision(False, reason)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from promql import parser as pp

MERGEABLE = frozenset({"sum", "count", "min", "max", "avg", "group", "topk", "bottomk"})
WITH_PARAM = frozenset({"topk", "bottomk"})
# per-series functions of one range selector (plus quantile_over_time's number)
RANGE_FUNCTIONS = frozenset({
    "rate", "increase", "irate", "delta", "idelta", "changes", "resets", "deriv",
    "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
    "last_over_time", "present_over_time", "stddev_over_time", "stdvar_over_time", "quantile_over_time",
})
SCALAR_OPS = frozenset({"+", "-", "*", "/", "%", "^", "==", "!=", ">", "<", ">=", "<="})


@dataclass(frozen=True)
class Decision:
    pushed: bool
    reason: str = ""


def _unparen(node: Any) -> Any:
    while isinstance(node, pp.ParenExpr):
        node = node.expr
    return node


def is_constant_scalar(node: Any) -> bool:
    """A number literal, or arithmetic of them (``-1``, ``(2 * 60)``): the same at every step and
    on every node, needing no data."""
    node = _unparen(node)
    if isinstance(node, pp.NumberLiteral):
        return True
    if isinstance(node, pp.UnaryExpr):
        return is_constant_scalar(node.expr)
    if isinstance(node, pp.BinaryExpr):
        return is_constant_scalar(node.lhs) and is_constant_scalar(node.rhs)
    return False


def _selector_reason(vs: Any) -> str:
    if not isinstance(vs, pp.VectorSelector):
        return f"{type(vs).__name__} is not a selector"
    if vs.anchored or vs.smoothed:
        return "anchored/smoothed selectors are evaluated on the querier"
    if vs.offset_expr is not None:
        return "offset given as a duration expression"
    if vs.bypass_empty_matcher_check:
        return "info() label selector"
    return ""


def inner_reason(node: Any) -> str:
    """'' when ``node`` (what an aggregation aggregates) is evaluated series by series, so its value
    over a partition's series is the whole value restricted to them; else why not."""
    node = _unparen(node)
    if isinstance(node, pp.VectorSelector):
        return _selector_reason(node)
    if isinstance(node, pp.Call):
        name = node.func.name
        if name not in RANGE_FUNCTIONS:
            return f"function {name} is not a per-series range function"
        args = [_unparen(a) for a in node.args]
        *params, last = args
        if not isinstance(last, pp.MatrixSelector):
            return f"{name} of something other than a range selector"
        if last.range_expr is not None:
            return "range given as a duration expression"
        if any(not is_constant_scalar(p) for p in params):
            return f"{name} with a parameter that is not a number"
        return _selector_reason(last.vector_selector)
    if isinstance(node, pp.UnaryExpr):
        return inner_reason(node.expr)
    if isinstance(node, pp.BinaryExpr):
        op = str(node.op).strip().lower()
        if op not in SCALAR_OPS:
            return f"binary operator {op} is not arithmetic or a comparison"
        lc, rc = is_constant_scalar(node.lhs), is_constant_scalar(node.rhs)
        if lc == rc:
            return "binary expression between two vectors" if not lc else "scalar expression"
        return inner_reason(node.rhs if lc else node.lhs)
    return f"{type(node).__name__} is not evaluated series by series"


def decide(node: Any) -> Decision:
    """Whether the aggregation ``node`` is computed as per-partition partial states on the
    ingesters and merged on the querier (see the module docstring)."""
    if not isinstance(node, pp.AggregateExpr):
        return Decision(False, "not an aggregation")
    op = str(node.op).lower()
    if op not in MERGEABLE:
        return Decision(False, f"{op} has no mergeable partial state")
    if op in WITH_PARAM and (node.param is None or not is_constant_scalar(node.param)):
        return Decision(False, f"{op} parameter is not a number")
    if node.expr is None:
        return Decision(False, "aggregation without an expression")
    why = inner_reason(node.expr)
    return Decision(not why, why)


__all__ = ["Decision", "decide", "inner_reason", "is_constant_scalar", "MERGEABLE"]
