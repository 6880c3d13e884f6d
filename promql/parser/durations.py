"""Values of duration expressions (``[5m+1m]``, ``offset -(1h)``, ``[1h:step()]``), computed once a
query's step and range are known, as Prometheus's ``durationVisitor`` does when it prepares a query.

``resolve(expr, step_ms, range_ms)`` fills ``range``/``offset``/``step`` of every node that carries a
duration expression, in place (a parsed tree belongs to one query). Errors are the caller's
(``BadData``) and read like Prometheus's (``<start>:<end>: duration must be greater than 0``).
"""
from __future__ import annotations

import datetime as _dt
import math
from typing import Any

from promql.ast_walk import walk
from promql.errors import BadData
from promql.parser import ast as A

_MAX_S = float(1 << 63) / 1e9


def has_duration_expressions(expr: Any) -> bool:
    for n in walk(expr):
        if isinstance(n, A.VectorSelector) and n.offset_expr is not None:
            return True
        if isinstance(n, A.MatrixSelector) and n.range_expr is not None:
            return True
        if isinstance(n, A.SubqueryExpr) and (n.range_expr or n.step_expr or n.offset_expr) is not None:
            return True
    return False


def resolve(expr: Any, step_ms: int, range_ms: int) -> None:
    """Fill in the durations written as expressions (``step()`` is ``step_ms``, ``range()`` the
    query's end minus start, ``range_ms``; both 0 for an instant query)."""
    for n in walk(expr):
        if isinstance(n, A.VectorSelector) and n.offset_expr is not None:
            n.offset = _duration(n.offset_expr, step_ms, range_ms, negative_ok=True)
        elif isinstance(n, A.MatrixSelector) and n.range_expr is not None:
            n.range = _duration(n.range_expr, step_ms, range_ms, negative_ok=False)
        elif isinstance(n, A.SubqueryExpr):
            if n.offset_expr is not None:
                n.offset = _duration(n.offset_expr, step_ms, range_ms, negative_ok=True)
            if n.step_expr is not None:
                n.step = _duration(n.step_expr, step_ms, range_ms, negative_ok=False)
            if n.range_expr is not None:
                n.range = _duration(n.range_expr, step_ms, range_ms, negative_ok=False)


def _duration(e: Any, step_ms: int, range_ms: int, negative_ok: bool) -> _dt.timedelta:
    v = evaluate(e, step_ms, range_ms)
    start, end = e.pos
    if math.isnan(v) or math.isinf(v):
        raise BadData(f"{start}:{end}: duration is NaN or infinite")
    if v <= 0 and not negative_ok:
        raise BadData(f"{start}:{end}: duration must be greater than 0")
    if v > _MAX_S or v < -_MAX_S:
        raise BadData(f"{start}:{end}: duration is out of range")
    return _dt.timedelta(milliseconds=int(v * 1000))  # Prometheus: time.Duration(d*1000) * time.Millisecond


def evaluate(e: Any, step_ms: int, range_ms: int) -> float:
    """A duration expression's value in seconds."""
    if isinstance(e, A.NumberLiteral):
        return e.val
    lhs = evaluate(e.lhs, step_ms, range_ms) if e.lhs is not None else 0.0
    rhs = evaluate(e.rhs, step_ms, range_ms) if e.rhs is not None else 0.0
    op = e.op
    if op == "step":
        return step_ms / 1000.0
    if op == "range":
        return range_ms / 1000.0
    if op == "min_of":
        return min(lhs, rhs)
    if op == "max_of":
        return max(lhs, rhs)
    if op == "+":
        return rhs if e.lhs is None else lhs + rhs
    if op == "-":
        return -rhs if e.lhs is None else lhs - rhs
    if op == "*":
        return lhs * rhs
    if op == "/":
        if rhs == 0:
            raise BadData(f"{e.pos[0]}:{e.pos[1]}: division by zero")
        return lhs / rhs
    if op == "%":
        if rhs == 0:
            raise BadData(f"{e.pos[0]}:{e.pos[1]}: modulo by zero")
        return math.fmod(lhs, rhs)
    if op == "^":
        try:
            return math.pow(lhs, rhs)
        except (OverflowError, ValueError):
            return math.inf if lhs > 0 else math.nan
    raise BadData(f"unexpected duration expression operator {op!r}")


__all__ = ["resolve", "evaluate", "has_duration_expressions"]
