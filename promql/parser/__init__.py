"""TurboProm's PromQL parser: lexer, parser, syntax tree and errors, written from Prometheus 3.x's
grammar (``promql/parser/generated_parser.y``, ``lex.go``, ``parse.go``) and its parser tests.

Hand-written because no Python library parses Prometheus 3.x PromQL with token positions: the
``promql-parser`` binding (0.12, the newest) rejects duration expressions, ``anchored``/``smoothed``
and ``info()`` selectors, has no positions, words errors differently and panics on ``@`` times
before 1970. Here errors carry Prometheus's exact text and ``line:col``, every node its position.

    from promql.parser import parse, ParseError
    expr = parse('sum by (job) (rate(http_requests_total[5m]))')
"""
from __future__ import annotations

from promql.parser.ast import *  # noqa: F401,F403  (the node classes are the package's API)
from promql.parser.ast import __all__ as _ast_all
from promql.parser.parser import ParseError, parse, parse_metric_selector, position

__all__ = ["parse", "parse_metric_selector", "ParseError", "position", *_ast_all]
