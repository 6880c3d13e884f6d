"""Source positions of AST nodes, for annotation suffixes like Prometheus's " (1:7)".

The ``promql-parser`` binding does not expose token positions, so they are recovered from the
query text: a pre-order walk searches each node's leading token (function or aggregation name,
metric name or ``{``, ``(``) at or after its parent's start and after its previous sibling.
Nodes whose leading token cannot be searched (number literals) inherit the nearest located
position. Hand-written because no library offers positions for this parser.
"""
from __future__ import annotations

import re
from typing import Any

import promql_parser as pp


def locate_all(expr: Any, text: str) -> dict[int, int]:
    """id(node) -> character offset of the node's first character in ``text``."""
    out: dict[int, int] = {}
    _locate(expr, text, 0, out)
    return out


def line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    last_nl = text.rfind("\n", 0, offset)
    return line, offset - last_nl


def _find(text: str, pattern: str, start: int, flags: int = 0) -> int | None:
    m = re.compile(pattern, flags).search(text, start)
    return m.start() if m else None


def _locate(node: Any, text: str, start: int, out: dict[int, int]) -> int:
    pos = start
    if isinstance(node, pp.ParenExpr):
        p = _find(text, r"\(", start)
        pos = p if p is not None else start
        out[id(node)] = pos
        _locate(node.expr, text, pos + 1, out)
        return pos
    if isinstance(node, pp.Call):
        p = _find(text, re.escape(node.func.name) + r"\s*\(", start)
        pos = p if p is not None else start
        out[id(node)] = pos
        cur = pos + len(node.func.name)
        for a in node.args:
            ap = _locate(a, text, cur, out)
            cur = ap + 1
        return pos
    if isinstance(node, pp.AggregateExpr):
        p = _find(text, re.escape(str(node.op)) + r"\b", start, re.IGNORECASE)
        pos = p if p is not None else start
        out[id(node)] = pos
        cur = pos + len(str(node.op))
        if node.param is not None:
            pp_ = _locate(node.param, text, cur, out)
            cur = pp_ + 1
        _locate(node.expr, text, cur, out)
        return pos
    if isinstance(node, pp.BinaryExpr):
        pos = _locate(node.lhs, text, start, out)
        out[id(node)] = pos
        _locate(node.rhs, text, pos + 1, out)
        return pos
    if isinstance(node, pp.UnaryExpr):
        p = _find(text, r"-", start)
        pos = p if p is not None else start
        out[id(node)] = pos
        _locate(node.expr, text, pos + 1, out)
        return pos
    if isinstance(node, pp.SubqueryExpr):
        pos = _locate(node.expr, text, start, out)
        out[id(node)] = pos
        return pos
    if isinstance(node, pp.MatrixSelector):
        pos = _locate(node.vector_selector, text, start, out)
        out[id(node)] = pos
        return pos
    if isinstance(node, pp.VectorSelector):
        if node.name:
            p = _find(text, re.escape(node.name) + r"(?![A-Za-z0-9_:])", start)
        else:
            p = _find(text, r"\{", start)
        pos = p if p is not None else start
        out[id(node)] = pos
        return pos
    if isinstance(node, pp.StringLiteral):
        p = _find(text, r"[\"'`]", start)
        pos = p if p is not None else start
        out[id(node)] = pos
        return pos
    if isinstance(node, pp.NumberLiteral):
        p = _find(text, r"[-+]?(\d|\.\d|[Ii]nf|[Nn]a[Nn]|0x)", start)
        pos = p if p is not None else start
        out[id(node)] = pos
        return pos
    out[id(node)] = start
    return start
