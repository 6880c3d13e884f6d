"""Source positions of AST nodes, for annotation suffixes like Prometheus's " (1:7)".

Every node of TurboProm's parser carries its ``(start, end)`` range (promql/parser/ast.py);
``locate_all`` indexes the start offsets by node identity for the evaluator's annotations.
"""
from __future__ import annotations

from typing import Any

from promql.ast_walk import walk


def locate_all(expr: Any, text: str) -> dict[int, int]:
    """id(node) -> character offset of the node's first character in ``text``."""
    return {id(n): n.pos[0] for n in walk(expr)}


def line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    last_nl = text.rfind("\n", 0, offset)
    return line, offset - last_nl
