"""Query -> pattern, so dashboard refreshes, rule evaluations and scheduler polls count as the same work.

The pattern keeps the expression's shape, functions, operators, metric names and label matchers, and
abstracts what one SDS serves anyway: evaluation time/range/step (never part of the text), range
selector durations (``[$r]``), offsets (``offset $o``), ``@`` times, the quantile of
``quantile_over_time`` / ``quantile`` / ``histogram_quantile`` (``$q``) and aggregation grouping
(``by ($g)``). ``Candidate`` is an SDS key (metric + matchers + algorithm) a query could use; the
rewrite rules (``planner/rewrite_rules.py``) say which sub-trees are candidates (``candidates()``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


from planner.algorithm_registry import ALGORITHMS
from planner.served_functions import algorithm_for
from promql.eval_selectors import duration_ms, to_matchers
from promql.query_guard import parse as guarded_parse

_QUANTILE_PARAM_FUNCS = {"quantile_over_time", "histogram_quantile"}
# (aggregation, range function) pairs a cross-series ``group`` SDS serves exactly (planner/group_store.py)
GROUP_PAIRS = {("sum", "sum_over_time"), ("sum", "count_over_time"), ("max", "max_over_time"), ("min", "min_over_time")}


def _kind(node: Any) -> str:
    return type(node).__name__


def _sel(vs: Any) -> str:
    parts = []
    for ms in to_matchers(vs):
        inner = ",".join(sorted(str(m) for m in ms if m.name != "__name__"))
        name = next((m.value for m in ms if m.name == "__name__" and m.op == "="), "")
        parts.append(f"{name}{{{inner}}}")
    s = " or ".join(parts)
    if vs.offset is not None and duration_ms(vs.offset) != 0:
        s += " offset $o"
    if vs.at is not None:
        s += " @ $t"
    if vs.anchored or vs.smoothed:
        s += " anchored" if vs.anchored else " smoothed"
    return s


def pattern(node: Any) -> str:
    k = _kind(node)
    if k == "VectorSelector":
        return _sel(node)
    if k == "MatrixSelector":
        return _sel(node.vector_selector) + "[$r]"
    if k == "SubqueryExpr":
        return f"({pattern(node.expr)})[$r:$s]" + (" offset $o" if node.offset is not None else "")
    if k == "Call":
        name = node.func.name
        args = [pattern(a) for a in node.args]
        if name in _QUANTILE_PARAM_FUNCS and args:
            args[0] = "$q"
        return f"{name}({', '.join(args)})"
    if k == "AggregateExpr":
        op = str(node.op)
        mod = ""
        if node.modifier is not None:
            mod = " without ($g)" if "Without" in str(node.modifier.type) else " by ($g)"
        param = ""
        if node.param is not None:
            param = "$q, " if op in ("quantile", "topk", "bottomk", "limitk", "limit_ratio") else pattern(node.param) + ", "
        return f"{op}{mod} ({param}{pattern(node.expr)})"
    if k == "BinaryExpr":
        mod = f" {node.modifier}" if node.modifier is not None and str(node.modifier).strip() else ""
        return f"({pattern(node.lhs)} {node.op}{mod} {pattern(node.rhs)})"
    if k == "UnaryExpr":
        return f"-({pattern(node.expr)})"
    if k == "ParenExpr":
        return pattern(node.expr)
    if k == "NumberLiteral":
        return repr(float(node.val))
    if k == "StringLiteral":
        return repr(node.val)
    return k


def normalize(query: str, node: Any = None) -> str:
    """Pattern of a query text (the text itself when it does not parse, or is refused as too deep or
    long by ``promql.query_guard`` before the parser binding runs)."""
    try:
        return pattern(node if node is not None else guarded_parse(query))
    except Exception:  # noqa: BLE001 - unparsable queries are logged as they are
        return query.strip()


@dataclass(frozen=True)
class Candidate:
    """A sub-tree an SDS could serve: func(metric{matchers}[range])."""

    metric: str
    matchers: tuple[tuple[str, str, str], ...]  # non-name matchers of the selector
    algorithm: str
    func: str
    range_ms: int
    grouping: tuple[str, ...] = ()  # group candidates: the aggregation's by (...) labels

    @property
    def key(self) -> tuple[str, str]:
        """SDS sharing key: one SDS per (metric, algorithm) serves every matcher subset, range, step,
        quantile and grouping above it; a group SDS is specific to its scope and grouping."""
        if ALGORITHMS[self.algorithm].scope == "fixed":
            return (self.metric, f"{self.algorithm}|{self.matchers}|{self.grouping}")
        return (self.metric, self.algorithm)


def servable_call(node: Any) -> tuple[str, Any, Any] | None:
    """(func, matrix selector node, quantile param node or None) if ``node`` is a call an SDS can serve."""
    if _kind(node) != "Call":
        return None
    func = node.func.name
    if algorithm_for(func) is None:
        return None
    args = list(node.args)
    param = None
    if func == "quantile_over_time":
        if len(args) != 2:
            return None
        param, ms = args
    else:
        if len(args) != 1:
            return None
        ms = args[0]
    if _kind(ms) != "MatrixSelector":
        return None
    vs = ms.vector_selector
    if vs.at is not None or not vs.name or vs.matchers.or_matchers:
        return None
    if vs.anchored or vs.smoothed:  # boundary values from outside the window: no pane holds them
        return None
    return func, ms, param


def literal_number(node: Any) -> float | None:
    """The value of a number literal (in parentheses, negated or not), or None for anything else."""
    k = _kind(node)
    if k == "NumberLiteral":
        return float(node.val)
    if k == "ParenExpr":
        return literal_number(node.expr)
    if k == "UnaryExpr":
        v = literal_number(node.expr)
        return None if v is None else -v
    return None


def group_shape(node: Any) -> tuple[str, tuple[str, ...], str, Any] | None:
    """(op, by labels, func, matrix selector) when ``node`` is ``op [by (L)] (func(sel[r]))`` with an
    (op, func) pair in ``GROUP_PAIRS``; None otherwise (``without``, a parameter, other shapes)."""
    if _kind(node) != "AggregateExpr" or node.param is not None:
        return None
    op = str(node.op)
    mod = node.modifier
    if mod is not None and "Without" in str(mod.type):
        return None
    by = tuple(mod.labels) if mod is not None else ()
    inner = node.expr
    while _kind(inner) == "ParenExpr":
        inner = inner.expr
    hit = servable_call(inner)
    if hit is None or (op, hit[0]) not in GROUP_PAIRS:
        return None
    return op, by, hit[0], hit[1]


# range functions present exactly when the series has a sample in the window (distinct-count patterns)
DISTINCT_FUNCS = {"count_over_time", "present_over_time", "last_over_time"}
SERIES_ITEM = "__series__"


def distinct_shape(node: Any) -> tuple[tuple[str, ...], str, Any] | None:
    """(item labels, func, matrix selector) for ``count(count by (L) (f(sel[r])))`` (distinct L tuples
    among the series active in the window; item labels = sorted L) or ``count(f(sel[r]))`` (active
    series; item labels = ``(SERIES_ITEM,)``), f in ``DISTINCT_FUNCS``; None otherwise."""
    if _kind(node) != "AggregateExpr" or str(node.op) != "count" or node.param is not None or node.modifier is not None:
        return None
    inner = node.expr
    while _kind(inner) == "ParenExpr":
        inner = inner.expr
    items: tuple[str, ...] = (SERIES_ITEM,)
    if _kind(inner) == "AggregateExpr":
        mod = inner.modifier
        if (str(inner.op) != "count" or inner.param is not None or mod is None or "Without" in str(mod.type)
                or not mod.labels):
            return None
        items = tuple(sorted(set(mod.labels)))
        inner = inner.expr
        while _kind(inner) == "ParenExpr":
            inner = inner.expr
    hit = servable_call(inner)
    if hit is None or hit[0] not in DISTINCT_FUNCS:
        return None
    return items, hit[0], hit[1]


def topk_shape(node: Any) -> tuple[int, tuple[str, ...], str, Any] | None:
    """(k, L, func, matrix selector) for ``topk(k, sum by (L) (count_over_time(sel[r])))`` with a literal
    k >= 1 and non-empty L; None otherwise."""
    if _kind(node) != "AggregateExpr" or str(node.op) != "topk" or node.modifier is not None or node.param is None:
        return None
    k = literal_number(node.param)
    if k is None or k < 1 or k != int(k):
        return None
    inner = node.expr
    while _kind(inner) == "ParenExpr":
        inner = inner.expr
    shape = group_shape(inner)
    if shape is None or shape[0] != "sum" or shape[2] != "count_over_time" or not shape[1]:
        return None
    return int(k), tuple(sorted(set(shape[1]))), shape[2], shape[3]
