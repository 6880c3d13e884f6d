"""/api/v1/format_query: Prometheus's ``Pretty(0)`` layout over the PromQL printer.

Prometheus prints an expression on one line when its ``String()`` fits in 100 characters and
otherwise splits it node by node (aggregations, calls and parentheses open a block, binary
operators put the operator on its own line), indenting two spaces per level. The one-line rendering of every node comes from ``promql.printer.to_promql``
(Prometheus's ``String()``), and the layout rules below follow Prometheus's prettier.
"""
from __future__ import annotations

from typing import Any

from promql.printer import to_promql

MAX_LINE = 100
INDENT = "  "


def pretty(node: Any, level: int = 0) -> str:
    kind = type(node).__name__
    s = to_promql(node)
    ind = INDENT * level
    if kind in ("VectorSelector", "MatrixSelector", "NumberLiteral", "StringLiteral"):
        return ind + s
    if kind == "UnaryExpr":
        # The operator takes the indent; the child's own indent is stripped.
        return ind + "-" + pretty(node.expr, level).strip()
    if kind == "SubqueryExpr":
        if len(s) <= MAX_LINE:
            return s  # (Prometheus returns a short subquery without indent)
        inner = to_promql(node.expr)
        return pretty(node.expr, level) + s[len(inner):]
    if len(s) <= MAX_LINE:
        return ind + s
    if kind == "AggregateExpr":
        param = getattr(node, "param", None)
        tail = (to_promql(param) + ", " if param is not None else "") + to_promql(node.expr) + ")"
        op_str = s[: len(s) - len(tail) - 1]  # "sum by (job) " (without the opening parenthesis)
        out = ind + op_str + "(\n"
        if param is not None:
            out += pretty(param, level + 1) + ",\n"
        return out + pretty(node.expr, level + 1) + "\n" + ind + ")"
    if kind == "BinaryExpr":
        lhs, rhs = to_promql(node.lhs), to_promql(node.rhs)
        middle = s[len(lhs) + 1: len(s) - len(rhs) - 1]  # "/ on (a) group_left (b)"
        return pretty(node.lhs, level + 1) + "\n" + ind + middle + "\n" + pretty(node.rhs, level + 1)
    if kind == "Call":
        args = ",\n".join(pretty(a, level + 1) for a in node.args)
        return ind + node.func.name + "(\n" + args + "\n" + ind + ")"
    if kind == "ParenExpr":
        return ind + "(\n" + pretty(node.expr, level + 1) + "\n" + ind + ")"
    return ind + s
