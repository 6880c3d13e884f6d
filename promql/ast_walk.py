"""Sub-expressions of a PromQL AST node and a pre-order walk over a tree.

The one place that knows which fields of the parser's node types hold sub-expressions, so code that
looks for selectors, literals or function calls anywhere in a query (the printer, the query guard,
info(), the conformance classifier, the planner, the API) does not enumerate children itself.
Duration expressions (ranges, steps, offsets) are not sub-expressions here. The walk is iterative: deeply nested queries do not hit Python's recursion limit.
"""
from __future__ import annotations

from typing import Any, Iterator

from promql import parser as pp


def children(node: Any) -> list[Any]:
    """Direct sub-expressions of ``node`` in source order (an aggregation's parameter first)."""
    if isinstance(node, pp.MatrixSelector):
        return [node.vector_selector]
    if isinstance(node, (pp.SubqueryExpr, pp.ParenExpr, pp.UnaryExpr)):
        return [node.expr]
    if isinstance(node, pp.Call):
        return list(node.args)
    if isinstance(node, pp.AggregateExpr):
        return ([node.param] if node.param is not None else []) + ([node.expr] if node.expr is not None else [])
    if isinstance(node, pp.BinaryExpr):
        return [node.lhs, node.rhs]
    return []


def walk(node: Any) -> Iterator[Any]:
    """Every node of the tree under ``node`` (itself included), pre-order, left to right."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(children(n)))
