"""Which stored time range a query may read: Prometheus's ``FindMinMaxTime`` (promql/engine.go).

``data_range(expr, start_ms, end_ms, lookback_ms)`` is the smallest ``[mint, maxt]`` (ms, inclusive)
that holds every sample the evaluation of ``expr`` over ``[start_ms, end_ms]`` can select: each
selector's evaluation times moved by ``@``, ``offset``, the ranges of the subqueries around it, and its
own range (a range selector) or the lookback delta (an instant selector). Call it after the engine has
resolved duration expressions (``[5m+step()]``), as the engine does when it evaluates.
"""
from __future__ import annotations

import datetime as _dt
from typing import Any

from promql import parser as pp
from promql.ast_walk import children


def _ms(d: _dt.timedelta | None) -> int:
    return 0 if d is None else (d.days * 86_400_000_000 + d.seconds * 1_000_000 + d.microseconds) // 1000


def _at(at: Any, query_start: int, query_end: int, start: int, end: int) -> tuple[int, int]:
    if at is None:
        return start, end
    if at.type == pp.AtModifierType.Start:
        return query_start, query_start
    if at.type == pp.AtModifierType.End:
        return query_end, query_end
    return int(at.ms), int(at.ms)


def data_range(expr: Any, start_ms: int, end_ms: int, lookback_ms: int) -> tuple[int, int] | None:
    """``(mint, maxt)`` the query reads, or None when it selects no series (``vector(1)``)."""
    lo: int | None = None
    hi: int | None = None
    stack: list[tuple[Any, int, int]] = [(expr, int(start_ms), int(end_ms))]
    while stack:
        node, s, e = stack.pop()
        if isinstance(node, pp.SubqueryExpr):
            s, e = _at(node.at, start_ms, end_ms, s, e)
            off = _ms(node.offset)
            stack.append((node.expr, s - _ms(node.range) - off, e - off))
            continue
        if isinstance(node, (pp.MatrixSelector, pp.VectorSelector)):
            vs = node.vector_selector if isinstance(node, pp.MatrixSelector) else node
            s, e = _at(vs.at, start_ms, end_ms, s, e)
            back = _ms(node.range) if isinstance(node, pp.MatrixSelector) else lookback_ms
            ahead = lookback_ms if (vs.anchored or vs.smoothed) else 0  # these read around the window
            off = _ms(vs.offset)
            s, e = s - back - off - (lookback_ms if ahead else 0), e - off + ahead
            lo = s if lo is None else min(lo, s)
            hi = e if hi is None else max(hi, e)
            continue
        stack.extend((c, s, e) for c in children(node))
    return None if lo is None else (lo, hi)
