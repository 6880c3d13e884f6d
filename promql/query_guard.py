"""Refuse expressions too deep to parse and walk safely, with a linear scan of the query text.

The parser (promql/parser/) and everything after it (printer, evaluator, planner normalisation)
recurse once or more per tree level, and a parse holds the GIL. So a query is scanned before it is
parsed, and refused (``BadData``, HTTP 400) when the depth of the tree it would build could exceed
``max_depth``.

The estimate is an upper bound of the AST depth computed per bracket group: a group's depth is one
(the group itself: a call, an aggregation, a parenthesis, a matcher or range list) plus the number of
operators in it at its own level (each binary or unary operator, and each ``[...]`` range or subquery
suffix, adds at most one tree level) plus the deepest group nested in it. Strings and comments are
skipped; operators inside ``{...}`` are label matchers and not counted.

``ensure_recursion_headroom`` raises Python's recursion limit so any walk of a tree that passed the
limit fits (a few frames per tree level); the C stack is not at risk at these depths because
Python-to-Python calls do not recurse in C (CPython 3.11+).

Parsed trees are kept per query text (``parse``): dashboards and rules send the same texts again and
again, and a parse costs about as much as evaluating a small panel. The evaluator only reads a tree,
except that durations written as expressions (``[5m+step()]``) are filled in per query
(promql/parser/durations.py): trees holding those are parsed anew every time.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from promql.errors import BadData
from promql import parser as pp
from promql.parser.durations import has_duration_expressions

DEFAULT_MAX_DEPTH = 256
# Python frames one AST level may take in the deepest walk (evaluator: eval -> _eval -> eval_binary
# -> eval, plus a planner hook), with room to spare, and frames below the walk (server, threads).
FRAMES_PER_LEVEL = 8
BASE_FRAMES = 1000
MAX_WALK_DEPTH = 8192  # never raise the limit further than this many levels need

_OPERATOR_CHARS = frozenset("+-*/%^<>=!")
_TWO_CHAR_OPS = frozenset(("==", "!=", "<=", ">=", "=~", "!~"))
_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = frozenset(")]}")
_WORD_OPS = frozenset(("and", "or", "unless", "atan2"))


@dataclass(frozen=True)
class Shape:
    depth: int  # upper bound of the AST depth
    nesting: int  # deepest bracket nesting ( [ {


def scan(query: str, stop_above: int = 0) -> Shape:
    """Linear scan: estimated tree depth and bracket nesting of ``query`` (strings, comments skipped).

    With ``stop_above`` the scan ends as soon as the depth is known to exceed it (the returned depth
    is then a lower bound)."""
    # stack entries: [closing char, operators at this level, deepest child group]
    stack: list[list] = [["", 0, 0]]
    nesting = 0
    i, n = 0, len(query)
    while i < n:
        c = query[i]
        if c in "\"'`":
            j = i + 1
            while j < n and query[j] != c:
                j += 2 if (query[j] == "\\" and c != "`") else 1
            i = j + 1
            continue
        if c == "#":
            j = query.find("\n", i)
            i = n if j < 0 else j + 1
            continue
        top = stack[-1]
        in_braces = top[0] == "}"
        if c in _OPEN:
            if c == "[":
                top[1] += 1  # a range or subquery suffix wraps the expression before it
            stack.append([_OPEN[c], 0, 0])
            nesting = max(nesting, len(stack) - 1)
            if stop_above and nesting > stop_above:
                return Shape(depth=nesting, nesting=nesting)
        elif c in _CLOSE:
            if len(stack) > 1:  # an unbalanced close is the parser's to report
                g = stack.pop()
                d = 1 + g[1] + g[2]
                if d > stack[-1][2]:
                    stack[-1][2] = d
        elif c in _OPERATOR_CHARS:
            if not in_braces:
                top[1] += 1
                if stop_above and top[1] + len(stack) - 1 > stop_above:
                    return Shape(depth=top[1] + len(stack) - 1, nesting=nesting)
            if query[i:i + 2] in _TWO_CHAR_OPS:
                i += 1
        elif c.isdigit():  # a number or duration: no operator inside (1e-3, 0x1f, 1h30m)
            j = i + 1
            while j < n and (query[j].isalnum() or query[j] in "_."):
                j += 1
            i = j
            continue
        elif c.isalpha() or c == "_":
            j = i + 1
            while j < n and (query[j].isalnum() or query[j] in "_:."):
                j += 1
            if not in_braces and query[i:j].lower() in _WORD_OPS:
                top[1] += 1
            i = j
            continue
        i += 1
    depth = 0
    while stack:  # groups left open: the parser reports them; count them all the same
        g = stack.pop()
        d = g[1] + g[2] + (1 if stack else 0)
        if stack:
            stack[-1][2] = max(stack[-1][2], d)
        else:
            depth = d
    return Shape(depth=depth, nesting=nesting)


def check(query: str, max_depth: int = DEFAULT_MAX_DEPTH) -> Shape:
    """Raise BadData when ``query`` could build a tree deeper than ``max_depth`` (0: no limit)."""
    shape = scan(query, stop_above=max_depth if max_depth and max_depth > 0 else 0)
    if max_depth and max_depth > 0 and shape.depth > max_depth:
        if shape.nesting > max_depth:
            what = f"brackets nested more than {max_depth} deep"
        else:
            what = (f"its expression tree would be more than {max_depth} levels deep (each binary or unary "
                    f"operator, bracket and range or subquery suffix adds a level)")
        raise BadData(f"query is too deeply nested: {what}, the limit set by --query.max-depth; "
                      f"split it into smaller queries or recording rules")
    ensure_recursion_headroom(shape.depth)
    return shape


# Texts kept: at most this many characters in all (a tree takes some tens of bytes per character,
# so a flood of distinct long queries cannot grow the table past a few tens of MB), each at most
# PARSED_MAX_TEXT long (dashboard and rule expressions are far shorter); emptied when full.
PARSED_BUDGET_CHARS = 512 * 1024
PARSED_MAX_TEXT = 4096
_parsed: dict[tuple[str, int], Any] = {}
_parsed_chars = 0


def parse(query: str, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """``check`` then parse (promql/parser/). Raises BadData (a parse error is its subclass
    ``promql.parser.ParseError``, with Prometheus's text).

    The tree is shared by every caller of the same text and must not be modified (see above);
    refused and unparsable texts are not kept, so they fail the same way every time."""
    key = (query, int(max_depth))
    hit = _parsed.get(key)
    if hit is not None:
        return hit

    check(query, max_depth)
    expr = pp.parse(query)
    if len(query) <= PARSED_MAX_TEXT and not has_duration_expressions(expr):
        global _parsed_chars
        if _parsed_chars + len(query) > PARSED_BUDGET_CHARS:
            _parsed.clear()
            _parsed_chars = 0
        _parsed[key] = expr
        _parsed_chars += len(query)
    return expr


def ensure_recursion_headroom(depth: int) -> None:
    """Raise the interpreter's recursion limit (never lower it) so a tree ``depth`` levels deep can be
    walked recursively."""
    need = BASE_FRAMES + FRAMES_PER_LEVEL * min(max(0, int(depth)), MAX_WALK_DEPTH)
    if sys.getrecursionlimit() < need:
        sys.setrecursionlimit(need)


__all__ = ["DEFAULT_MAX_DEPTH", "Shape", "scan", "check", "parse", "ensure_recursion_headroom"]
