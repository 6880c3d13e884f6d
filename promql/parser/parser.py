"""PromQL parser: tokens -> syntax tree (promql/parser/ast.py), then Prometheus's type checks.

Written by hand from Prometheus 3.x's grammar (``promql/parser/generated_parser.y``) and its
``parse.go``: a precedence-climbing recursive-descent parser over the same productions. It reports
errors as Prometheus does, which is what users see in Grafana: the first error recorded, as
``line:col: parse error: <message>``. Prometheus's yacc parser, on a syntax error, unwinds to the
innermost construct that has an ``error`` production and names it ("unexpected X in grouping opts,
expected label"); here each such construct pushes its context while it is open, and a syntax
error names the innermost one (or none: "unexpected X"). Semantic errors (offset set twice, a
range on a non-selector, ...) are recorded and parsing goes on, as in Prometheus; the type checks
(``checkAST``) run only when parsing recorded no error.
"""
from __future__ import annotations

import datetime as _dt
import math
from typing import Optional

from promql.errors import BadData
from storage.go_format import go_quote
from promql.parser import ast as A
from promql.parser.functions import get_function
from promql.parser.lexer import AGGREGATORS, Token, describe, tokenize
from promql.parser.literals import LiteralError, parse_duration_ms, parse_number, unquote, valid_label_name

# binary operator token -> (precedence, right associative)
_BINARY = {
    "LOR": 1, "LAND": 2, "LUNLESS": 2,
    "EQLC": 3, "GTE": 3, "GTR": 3, "LSS": 3, "LTE": 3, "NEQ": 3, "TRIM_UPPER": 3, "TRIM_LOWER": 3,
    "ADD": 4, "SUB": 4, "MUL": 5, "DIV": 5, "MOD": 5, "ATAN2": 5, "POW": 6,
}
_POW = 6
_COMPARISON = frozenset({"EQLC", "NEQ", "LTE", "LSS", "GTE", "GTR"})
_SET = frozenset({"LAND", "LOR", "LUNLESS"})
_DURATION_BINARY = {"ADD": 4, "SUB": 4, "MUL": 5, "DIV": 5, "MOD": 5, "POW": 6}
_MATCH_OPS = {"EQL": A.MatchOp.Equal, "NEQ": A.MatchOp.NotEqual, "EQL_REGEX": A.MatchOp.Re,
              "NEQ_REGEX": A.MatchOp.NotRe}
_METRIC_IDENTIFIER = frozenset({
    "AVG", "BOTTOMK", "BY", "COUNT", "COUNT_VALUES", "FILL", "FILL_LEFT", "FILL_RIGHT", "GROUP", "IDENTIFIER",
    "LAND", "LOR", "LUNLESS", "MAX", "METRIC_IDENTIFIER", "MIN", "OFFSET", "QUANTILE", "STDDEV", "STDVAR", "SUM",
    "TOPK", "WITHOUT", "START", "END", "LIMITK", "LIMIT_RATIO", "STEP", "RANGE", "ANCHORED", "SMOOTHED", "MAX_OF",
    "MIN_OF"})
_MAYBE_LABEL = frozenset({
    "AVG", "BOOL", "BOTTOMK", "BY", "COUNT", "COUNT_VALUES", "GROUP", "GROUP_LEFT", "GROUP_RIGHT", "FILL",
    "FILL_LEFT", "FILL_RIGHT", "IDENTIFIER", "IGNORING", "LAND", "LOR", "LUNLESS", "MAX", "METRIC_IDENTIFIER", "MIN",
    "OFFSET", "ON", "QUANTILE", "STDDEV", "STDVAR", "SUM", "TOPK", "START", "END", "ATAN2", "LIMITK", "LIMIT_RATIO",
    "STEP", "RANGE", "ANCHORED", "SMOOTHED", "MAX_OF", "MIN_OF"})
_CALLABLE_KEYWORDS = frozenset({"START", "END", "STEP", "RANGE", "MAX_OF", "MIN_OF"})
_PARAM_AGGREGATORS = frozenset({"topk", "bottomk", "count_values", "quantile", "limitk", "limit_ratio"})
_POSTFIX = frozenset({"LEFT_BRACKET", "OFFSET", "AT", "ANCHORED", "SMOOTHED"})
_CLOSING = frozenset({"RIGHT_BRACE", "RIGHT_PAREN", "RIGHT_BRACKET", "DURATION", "NUMBER"})
_MAX_DURATION_S = float(1 << 63) / 1e9
_INT64_MAX_F = float(2**63 - 1)
_INT64_MIN_F = float(-(2**63))

_OFFSET_CTX = ("offset", "number, duration, step(), or range()")
_AT_CTX = ("@", "timestamp")
_RANGE_CTX = ("subquery or range selector", "number, duration, step(), or range()")
_STEP_CTX = ("subquery selector", 'number, duration, step(), range(), or "]"')


class ParseError(BadData):
    """A query Prometheus would refuse to parse. ``str()`` is Prometheus's text for the first
    error; ``errors`` holds every ``(start, end, message)`` recorded."""

    def __init__(self, query: str, errors: list[tuple[int, int, str]]) -> None:
        self.query = query
        self.errors = errors
        start, _, msg = errors[0]
        super().__init__(f"{position(query, start)}: parse error: {msg}")

    @property
    def start(self) -> int:
        return self.errors[0][0]


def position(query: str, offset: int) -> str:
    """Prometheus's ``StartPosInput``: ``line:col`` of a character offset (columns count UTF-8 bytes,
    as Go does)."""
    if query == "":
        return "unknown position"
    if offset < 0 or offset > len(query):
        return "invalid position"
    line = query.count("\n", 0, offset) + 1
    nl = query.rfind("\n", 0, offset)
    col = len(query[nl + 1:offset].encode("utf-8", "surrogateescape")) + 1
    return f"{line}:{col}"


class _Abort(Exception):
    """A syntax error ends the parse (its message, if any, is already recorded)."""


def _doc(t: A.ValueType) -> str:
    return t.documented


def go_round(x: float) -> int:
    """Go's ``math.Round``: half away from zero."""
    r = math.floor(abs(x) + 0.5)
    return int(r if x >= 0 else -r)


def _td_from_seconds(v: float) -> _dt.timedelta:
    ns = go_round(v * 1e9)
    return _dt.timedelta(microseconds=ns // 1000) if ns % 1000 == 0 else _dt.timedelta(microseconds=ns / 1000)


def _set_end(node: A.Expr, end: int) -> None:
    if isinstance(node, A.VectorSelector):
        node.pos = (node.pos[0], end)
    elif isinstance(node, (A.MatrixSelector, A.SubqueryExpr)):
        node.end = end


class Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokens = tokenize(text)
        self.i = 0
        self.errors: list[tuple[int, int, str]] = []
        self.ctx: list[tuple[str, str]] = []
        self.last_closing = 0
        # a lexer error is the last token, and counts when the parser reaches it (errors recorded
        # before come first)
        self.error_at = len(tokens) - 1 if tokens[-1].typ == "ERROR" else -1
        self.tok: Token = tokens[0]
        self.typ: str = self.tok.typ  # the current token's type
        if self.error_at == 0:
            self._reached()

    # -- tokens ----------------------------------------------------------------------------

    def _reached(self) -> None:
        tok = self.tok
        self.errors.append((tok.pos, len(self.text), tok.val))

    def advance(self) -> Token:
        t = self.tok
        typ = self.typ
        if typ in _CLOSING:
            self.last_closing = t.pos + len(t.val)
        if typ != "EOF" and typ != "ERROR":
            i = self.i = self.i + 1
            self.tok = tok = self.tokens[i]
            self.typ = tok.typ
            if i == self.error_at:
                self._reached()
        return t

    def error(self, start: int, end: int, msg: str) -> None:
        self.errors.append((start, end, msg))

    def unexpected(self, context: str = "", expected: str = "") -> _Abort:
        """Record Prometheus's "unexpected <token> in <context>, expected <what>" (not for a token the
        lexer already refused) and return the exception that ends the parse."""
        t = self.tok
        if t.typ != "ERROR":
            msg = "unexpected " + describe(t)
            if context:
                msg += " in " + context
            if expected:
                msg += ", expected " + expected
            self.error(t.pos, t.pos + len(t.val), msg)
        return _Abort()

    def syntax_error(self) -> _Abort:
        """A syntax error where the grammar has no error production: named by the innermost open
        construct that has one."""
        if self.ctx:
            return self.unexpected(*self.ctx[-1])
        return self.unexpected()

    def expect(self, typ: str) -> Token:
        if self.typ != typ:
            raise self.syntax_error()
        return self.advance()

    # -- entry -----------------------------------------------------------------------------

    def parse(self) -> A.Expr:
        expr: Optional[A.Expr] = None
        try:
            if self.typ == "EOF":
                self.error(0, 0, "no expression found in input")
            elif self.typ != "ERROR":
                expr = self.parse_expr(0)
                if self.typ != "EOF":
                    raise self.syntax_error()
        except _Abort:
            pass
        if not self.errors and expr is not None:
            self.check(expr)
        if self.errors or expr is None:
            if not self.errors:
                self.errors.append((0, 0, "no expression found in input"))
            raise ParseError(self.text, self.errors)
        return expr

    # -- expressions -----------------------------------------------------------------------

    def parse_expr(self, min_prec: int) -> A.Expr:
        typ = self.typ
        if typ == "ADD" or typ == "SUB":
            lhs = self.parse_unary()
        else:
            lhs = self.parse_primary()
            if self.typ in _POSTFIX:
                lhs = self.parse_postfix(lhs)
        while True:
            typ = self.typ
            prec = _BINARY.get(typ)
            if prec is None or prec < min_prec:
                return lhs
            op = self.advance()
            modifier = self.parse_bin_modifier()
            rhs = self.parse_expr(prec if typ == "POW" else prec + 1)
            lhs = self.new_binary(lhs, op, modifier, rhs)

    def parse_unary(self) -> A.Expr:
        """A leading ``+``/``-`` (the current token): binds tighter than everything but ``^``."""
        op = self.advance()
        e = self.parse_expr(_POW)
        if isinstance(e, A.NumberLiteral):
            if op.typ == "SUB":
                e.val = -e.val
            e.pos = (op.pos, e.pos[1])
            return e
        return A.UnaryExpr(e, A.TokenType(op.val), op.pos)

    def parse_primary(self) -> A.Expr:
        t = self.tok
        typ = t.typ
        if typ in ("NUMBER", "DURATION"):
            return self.number_duration_literal()
        if typ == "STRING":
            self.advance()
            return A.StringLiteral(self.unquote(t), (t.pos, t.pos + len(t.val)))
        if typ == "LEFT_PAREN":
            self.advance()
            e = self.parse_expr(0)
            r = self.expect("RIGHT_PAREN")
            return A.ParenExpr(e, (t.pos, r.pos + 1))
        if typ == "LEFT_BRACE":
            return self.vector_selector(None)
        nxt = self.peek_typ()
        if typ in AGGREGATORS and nxt in ("LEFT_PAREN", "BY", "WITHOUT"):
            return self.aggregate()
        if (typ == "IDENTIFIER" or typ in _CALLABLE_KEYWORDS) and nxt == "LEFT_PAREN":
            return self.call()
        if typ in _METRIC_IDENTIFIER:
            return self.vector_selector(t)
        raise self.syntax_error()

    def peek_typ(self) -> str:
        """The type of the token after the current one (without consuming either)."""
        j = self.i + 1
        return self.tokens[j].typ if j < len(self.tokens) else "EOF"

    def number_duration_literal(self) -> A.NumberLiteral:
        t = self.advance()
        end = t.pos + len(t.val)
        if t.typ == "NUMBER":
            try:
                v = parse_number(t.val)
            except LiteralError as e:
                self.error(t.pos, end, f"error parsing number: {e}")
                v = 0.0
            return A.NumberLiteral(v, (t.pos, end))
        try:
            ms = parse_duration_ms(t.val)
        except LiteralError as e:
            self.error(t.pos, end, str(e))
            ms = 0
        return A.NumberLiteral(ms / 1000.0, (t.pos, end), duration=True)

    def unquote(self, t: Token) -> str:
        try:
            return unquote(t.val)
        except (LiteralError, ValueError, IndexError) as e:
            self.error(t.pos, t.pos + len(t.val), f"error unquoting string {go_quote(t.val)}: {e}")
            return ""

    # -- function calls and aggregations ---------------------------------------------------

    def call_body(self) -> tuple[list[A.Expr], int]:
        self.expect("LEFT_PAREN")
        args: list[A.Expr] = []
        if self.typ == "RIGHT_PAREN":
            r = self.advance()
            return args, r.pos + 1
        while True:
            args.append(self.parse_expr(0))
            if self.typ == "COMMA":
                c = self.advance()
                if self.typ == "RIGHT_PAREN":
                    self.error(c.pos, c.pos + 1, "trailing commas not allowed in function call args")
                    break
                continue
            break
        r = self.expect("RIGHT_PAREN")
        return args, r.pos + 1

    def call(self) -> A.Call:
        name = self.advance()
        fn = get_function(name.val)
        if fn is None:
            self.error(name.pos, name.pos + len(name.val), f"unknown function with name {go_quote(name.val)}")
            fn = A.Function(name.val, [], A.ValueType.Vector)
        args, end = self.call_body()
        return A.Call(fn, args, (name.pos, end))

    def aggregate(self) -> A.AggregateExpr:
        op = self.advance()
        self.ctx.append(("aggregation", ""))
        modifier = None
        if self.typ in ("BY", "WITHOUT"):
            modifier = self.agg_modifier()
            args, end = self.call_body()
        else:
            args, end = self.call_body()
            if self.typ in ("BY", "WITHOUT"):
                modifier = self.agg_modifier()
                end = self.last_closing
        self.ctx.pop()
        name = op.val.lower()
        node = A.AggregateExpr(A.TokenType(name), None, None, modifier, (op.pos, end))
        if not args:
            self.error(op.pos, end, "no arguments for aggregate expression provided")
            return node
        want = 2 if name in _PARAM_AGGREGATORS else 1
        if want == 2:
            node.param = args[0]
        if len(args) != want:
            self.error(op.pos, end, f"wrong number of arguments for aggregate expression provided, expected {want}, "
                                    f"got {len(args)}")
            return node
        node.expr = args[want - 1]
        return node

    def agg_modifier(self) -> A.AggModifier:
        kw = self.advance()
        labels = self.grouping_labels()
        return A.AggModifier(A.AggModifierType.Without if kw.typ == "WITHOUT" else A.AggModifierType.By, labels)

    def grouping_labels(self) -> list[str]:
        if self.typ != "LEFT_PAREN":
            raise self.unexpected("grouping opts", '"("')
        self.advance()
        labels: list[str] = []
        if self.typ == "RIGHT_PAREN":
            self.advance()
            return labels
        while True:
            t = self.tok
            if t.typ in _MAYBE_LABEL:
                name = t.val
            elif t.typ == "STRING":
                name = self.unquote(t)
                if not valid_label_name(name):
                    self.error(t.pos, t.pos + len(t.val), f"invalid label name for grouping: {go_quote(name)}")
            else:
                raise self.unexpected("grouping opts", "label")
            self.advance()
            labels.append(name)
            if self.typ == "COMMA":
                self.advance()
                if self.typ == "RIGHT_PAREN":
                    break
                continue
            if self.typ == "RIGHT_PAREN":
                break
            raise self.unexpected("grouping opts", '"," or ")"')
        self.advance()
        return labels

    # -- binary operators ------------------------------------------------------------------

    def parse_bin_modifier(self) -> A.BinModifier:
        m = A.BinModifier(A.VectorMatchCardinality.OneToOne)
        if self.typ == "BOOL":
            self.advance()
            m.return_bool = True
        if self.typ in ("ON", "IGNORING"):
            kw = self.advance()
            labels = self.grouping_labels()
            m.matching = A.LabelModifier(A.LabelModifierType.Include if kw.typ == "ON" else A.LabelModifierType.Exclude,
                                         labels)
            if self.typ in ("GROUP_LEFT", "GROUP_RIGHT"):
                g = self.advance()
                m.card = A.VectorMatchCardinality.ManyToOne if g.typ == "GROUP_LEFT" else A.VectorMatchCardinality.OneToMany
                m.group_labels = self.grouping_labels() if self.typ == "LEFT_PAREN" else []
        typ = self.typ
        if typ == "FILL":
            self.advance()
            v = self.fill_value()
            m.fill_values = A.VectorMatchFillValues(v, v)
        elif typ in ("FILL_LEFT", "FILL_RIGHT"):
            self.advance()
            v = self.fill_value()
            if typ == "FILL_LEFT":
                m.fill_values.lhs = v
            else:
                m.fill_values.rhs = v
            other = "FILL_RIGHT" if typ == "FILL_LEFT" else "FILL_LEFT"
            if self.typ == other:
                self.advance()
                v2 = self.fill_value()
                if other == "FILL_LEFT":
                    m.fill_values.lhs = v2
                else:
                    m.fill_values.rhs = v2
        return m

    def fill_value(self) -> float:
        self.expect("LEFT_PAREN")
        sign = 1.0
        if self.typ in ("ADD", "SUB"):
            if self.advance().typ == "SUB":
                sign = -1.0
        if self.typ not in ("NUMBER", "DURATION"):
            raise self.syntax_error()
        v = self.number_duration_literal().val * sign
        self.expect("RIGHT_PAREN")
        return v

    def new_binary(self, lhs: A.Expr, op: Token, m: A.BinModifier, rhs: A.Expr) -> A.BinaryExpr:
        return A.BinaryExpr(A.TokenType(op.val.lower()), lhs, rhs, m, (lhs.pos[0], rhs.pos[1]))

    # -- selectors -------------------------------------------------------------------------

    def vector_selector(self, name_tok: Optional[Token]) -> A.VectorSelector:
        if name_tok is not None:
            self.advance()
            start, end = name_tok.pos, name_tok.pos + len(name_tok.val)
            if self.typ == "LEFT_BRACE":
                matchers, end = self.label_matchers()
            else:
                matchers = []
            return A.VectorSelector(name_tok.val, A.Matchers(matchers), pos=(start, end))
        start = self.tok.pos
        matchers, end = self.label_matchers()
        return A.VectorSelector(None, A.Matchers(matchers), pos=(start, end))

    def label_matchers(self) -> tuple[list[A.Matcher], int]:
        self.advance()  # {
        out: list[A.Matcher] = []
        if self.typ == "RIGHT_BRACE":
            return out, self.advance().pos + 1
        while True:
            t = self.tok
            if t.typ == "IDENTIFIER":
                self.advance()
                if self.typ not in _MATCH_OPS:
                    raise self.unexpected("label matching", "label matching operator")
                out.append(self.matcher(t, t.val))
            elif t.typ == "STRING":
                name = self.unquote(t)
                self.advance()
                if self.typ in _MATCH_OPS:
                    out.append(self.matcher(t, name))
                else:
                    out.append(A.Matcher(A.MatchOp.Equal, "__name__", name))
            else:
                raise self.unexpected("label matching", 'identifier or "}"')
            if self.typ == "COMMA":
                self.advance()
                if self.typ == "RIGHT_BRACE":
                    break
                continue
            if self.typ == "RIGHT_BRACE":
                break
            raise self.unexpected("label matching", '"," or "}"')
        return out, self.advance().pos + 1

    def matcher(self, label: Token, name: str) -> A.Matcher:
        op = _MATCH_OPS[self.advance().typ]
        if self.typ != "STRING":
            raise self.unexpected("label matching", "string")
        v = self.advance()
        value = self.unquote(v)
        if op in (A.MatchOp.Re, A.MatchOp.NotRe):
            from storage.regex import RegexError, compile_regex

            try:
                compile_regex(value)
            except RegexError as e:
                self.error(label.pos, v.pos + len(v.val), str(e))
        return A.Matcher(op, name, value)

    # -- postfix modifiers: [range], [range:step], offset, @, anchored, smoothed ------------

    def parse_postfix(self, e: A.Expr) -> A.Expr:
        while True:
            typ = self.typ
            if typ == "LEFT_BRACKET":
                e = self.range_or_subquery(e)
            elif typ == "OFFSET":
                self.offset(e)
            elif typ == "AT":
                self.at(e)
            elif typ in ("ANCHORED", "SMOOTHED"):
                self.advance()
                self.extended(e, typ.lower())
            else:
                return e

    def range_or_subquery(self, e: A.Expr) -> A.Expr:
        lb = self.advance()
        self.ctx.append(_RANGE_CTX)
        rng = self.positive_duration()
        self.ctx.pop()
        if self.typ == "RIGHT_BRACKET":
            rb = self.advance()
            msg = None
            if not isinstance(e, A.VectorSelector):
                msg = "ranges only allowed for vector selectors"
            elif e.offset is not None or e.offset_expr is not None:
                msg = "no offset modifiers allowed before range"
            elif e.at is not None:
                msg = "no @ modifiers allowed before range"
            if msg:
                self.error(lb.pos, rb.pos + 1, msg)
            value, expr = self.duration_value(rng)
            vs = e if isinstance(e, A.VectorSelector) else A.VectorSelector(None, A.Matchers([]), pos=e.pos)
            return A.MatrixSelector(vs, value, end=self.last_closing, range_expr=expr)
        if self.typ != "COLON":
            raise self.unexpected("subquery or range", '":" or "]"')
        self.advance()
        rvalue, rexpr = self.duration_value(rng)
        svalue = sexpr = None
        if self.typ != "RIGHT_BRACKET":
            self.ctx.append(_STEP_CTX)
            step = self.positive_duration()
            self.ctx.pop()
            if self.typ != "RIGHT_BRACKET":
                raise self.unexpected("subquery selector", '"]"')
            svalue, sexpr = self.duration_value(step)
        rb = self.advance()
        return A.SubqueryExpr(e, rvalue, svalue, end=rb.pos + 1, range_expr=rexpr, step_expr=sexpr)

    @staticmethod
    def duration_value(d: A.Expr) -> tuple[Optional[_dt.timedelta], Optional[A.DurationExpr]]:
        if isinstance(d, A.NumberLiteral):
            return _td_from_seconds(d.val), None
        assert isinstance(d, A.DurationExpr)
        return None, d

    def positive_duration(self) -> A.Expr:
        d = self.duration_expr(0)
        if isinstance(d, A.NumberLiteral) and d.val <= 0:
            self.error(d.pos[0], d.pos[1], "duration must be greater than 0")
            return A.NumberLiteral(0.0)
        return d

    def duration_expr(self, min_prec: int) -> A.Expr:
        lhs = self.duration_primary()
        while True:
            typ = self.typ
            prec = _DURATION_BINARY.get(typ)
            if prec is None or prec < min_prec:
                return lhs
            op = self.advance()
            rhs = self.duration_expr(prec if typ == "POW" else prec + 1)
            if typ in ("DIV", "MOD") and isinstance(rhs, A.NumberLiteral) and rhs.val == 0:
                self.error(op.pos, op.pos + 1, "division by zero" if typ == "DIV" else "modulo by zero")
                lhs = A.NumberLiteral(0.0)
                continue
            lhs = A.DurationExpr(op.val, lhs, rhs)

    def duration_literal(self) -> A.NumberLiteral:
        nl = self.number_duration_literal()
        if nl.val > _MAX_DURATION_S or nl.val < -_MAX_DURATION_S:
            self.error(nl.pos[0], nl.pos[1], "duration out of range")
            return A.NumberLiteral(0.0)
        return nl

    def duration_primary(self) -> A.Expr:
        t = self.tok
        typ = t.typ
        if typ in ("NUMBER", "DURATION"):
            return self.duration_literal()
        if typ in ("ADD", "SUB"):
            op = self.advance()
            return self.unary_duration(op, self.duration_expr(_POW), wrapped=False)
        if typ in ("STEP", "RANGE"):
            return self.step_or_range()
        if typ in ("MAX_OF", "MIN_OF"):
            return self.min_max_of()
        if typ == "LEFT_PAREN":
            self.advance()
            d = self.duration_expr(0)
            r = self.expect("RIGHT_PAREN")
            return self.wrap_paren(d, t.pos, r.pos + 1)
        raise self.syntax_error()

    def step_or_range(self) -> A.DurationExpr:
        t = self.advance()
        self.expect("LEFT_PAREN")
        r = self.expect("RIGHT_PAREN")
        return A.DurationExpr(t.val.lower(), start=t.pos, end=r.pos + 1)

    def min_max_of(self) -> A.DurationExpr:
        t = self.advance()
        self.expect("LEFT_PAREN")
        a = self.duration_expr(0)
        self.expect("COMMA")
        b = self.duration_expr(0)
        r = self.expect("RIGHT_PAREN")
        return A.DurationExpr(t.val.lower(), a, b, start=t.pos, end=r.pos + 1)

    @staticmethod
    def wrap_paren(d: A.Expr, start: int, end: int) -> A.DurationExpr:
        if isinstance(d, A.DurationExpr):
            d.wrapped = True
            return d
        return A.DurationExpr("+", None, d, wrapped=True, start=start, end=end)

    def unary_duration(self, op: Token, e: A.Expr, wrapped: bool) -> A.Expr:
        if wrapped:
            e = self.wrap_paren(e, e.pos[0], e.pos[1])
        if isinstance(e, A.DurationExpr):
            if op.typ == "SUB":
                return A.DurationExpr("-", None, e, start=op.pos)
            return e
        assert isinstance(e, A.NumberLiteral)
        if op.typ == "SUB":
            e.val = -e.val
        if e.val > _MAX_DURATION_S or e.val < -_MAX_DURATION_S:
            self.error(op.pos, op.pos + 1, "duration out of range")
            return A.NumberLiteral(0.0)
        e.pos = (op.pos, e.pos[1])
        return e

    def offset_duration(self) -> A.Expr:
        """Prometheus's ``offset_duration_expr``: a literal (signed or not), ``step()``/``range()``,
        ``min_of``/``max_of`` or a signed parenthesis ends the offset; a parenthesised duration
        expression takes the duration operators after it."""
        t = self.tok
        typ = t.typ
        if typ in ("NUMBER", "DURATION"):
            return self.duration_literal()
        if typ in ("STEP", "RANGE"):
            return self.step_or_range()
        if typ in ("MAX_OF", "MIN_OF"):
            return self.min_max_of()
        if typ in ("ADD", "SUB"):
            op = self.advance()
            nt = self.typ
            if nt in ("NUMBER", "DURATION"):
                nl = self.number_duration_literal()
                if op.typ == "SUB":
                    nl.val = -nl.val
                if nl.val > _MAX_DURATION_S or nl.val < -_MAX_DURATION_S:
                    self.error(op.pos, op.pos + 1, "duration out of range")
                    return A.NumberLiteral(0.0)
                nl.pos = (op.pos, nl.pos[1])
                return nl
            if nt in ("STEP", "RANGE", "MAX_OF", "MIN_OF"):
                inner = self.step_or_range() if nt in ("STEP", "RANGE") else self.min_max_of()
                return A.DurationExpr(op.val, None, inner, start=op.pos)
            if nt == "LEFT_PAREN":
                lp = self.advance()
                d = self.duration_expr(0)
                r = self.expect("RIGHT_PAREN")
                if isinstance(d, A.NumberLiteral):
                    d.pos = (lp.pos, r.pos + 1)
                return self.unary_duration(op, d, wrapped=True)
            raise self.syntax_error()
        if typ == "LEFT_PAREN":
            return self.duration_expr(0)
        raise self.syntax_error()

    def offset(self, e: A.Expr) -> None:
        self.advance()
        self.ctx.append(_OFFSET_CTX)
        d = self.offset_duration()
        self.ctx.pop()
        target = e.vector_selector if isinstance(e, A.MatrixSelector) else e
        if not isinstance(target, (A.VectorSelector, A.SubqueryExpr)):
            self.error(e.pos[0], e.pos[1], "offset modifier must be preceded by an instant vector selector or range "
                                           "vector selector or a subquery")
            return
        if (target.offset is not None and target.offset != _dt.timedelta(0)) or target.offset_expr is not None:
            self.error(e.pos[0], e.pos[1], "offset may not be set multiple times")
        elif isinstance(d, A.NumberLiteral):
            target.offset = _td_from_seconds(d.val)
        else:
            assert isinstance(d, A.DurationExpr)
            target.offset_expr = d
        _set_end(e, self.last_closing)

    def at(self, e: A.Expr) -> None:
        self.advance()
        self.ctx.append(_AT_CTX)
        typ = self.typ
        ts: Optional[float] = None
        kind = None
        if typ in ("START", "END"):
            kind = A.AtModifierType.Start if typ == "START" else A.AtModifierType.End
            self.advance()
            self.expect("LEFT_PAREN")
            self.expect("RIGHT_PAREN")
        else:
            sign = 1.0
            if typ in ("ADD", "SUB"):
                sign = -1.0 if self.advance().typ == "SUB" else 1.0
            if self.typ not in ("NUMBER", "DURATION"):
                raise self.syntax_error()
            ts = self.number_duration_literal().val * sign
        self.ctx.pop()
        if ts is not None and (math.isinf(ts) or math.isnan(ts) or ts >= _INT64_MAX_F or ts <= _INT64_MIN_F):
            self.error(e.pos[0], e.pos[1], f"timestamp out of bounds for @ modifier: {_go_f(ts)}")
        target = e.vector_selector if isinstance(e, A.MatrixSelector) else e
        if not isinstance(target, (A.VectorSelector, A.SubqueryExpr)):
            self.error(e.pos[0], e.pos[1], "@ modifier must be preceded by an instant vector selector or range vector "
                                           "selector or a subquery")
            return
        if target.at is not None:
            self.error(e.pos[0], e.pos[1], "@ <timestamp> may not be set multiple times")
            return
        if kind is not None:
            target.at = A.AtModifier(kind)
        else:
            assert ts is not None
            ms = go_round(ts * 1000) if math.isfinite(ts) else 0
            target.at = A.AtModifier(A.AtModifierType.At, ms)
        _set_end(e, self.last_closing)

    def extended(self, e: A.Expr, which: str) -> None:
        if isinstance(e, A.SubqueryExpr):
            self.error(e.pos[0], e.pos[1], f"{which} modifier is not supported for subqueries")
            return
        vs = e.vector_selector if isinstance(e, A.MatrixSelector) else e
        if not isinstance(vs, A.VectorSelector):
            if not isinstance(e, A.MatrixSelector):
                self.error(e.pos[0], e.pos[1], f"{which} modifier not implemented")
            return
        setattr(vs, which, True)
        if vs.anchored and vs.smoothed:
            self.error(e.pos[0], e.pos[1], "anchored and smoothed modifiers cannot be used together")

    # -- type checks (Prometheus's checkAST) -----------------------------------------------

    def expect_type(self, node: A.Expr, want: A.ValueType, context: str) -> None:
        t = self.check(node)
        if t != want:
            self.error(node.pos[0], node.pos[1], f"expected type {_doc(want)} in {context}, got {_doc(t)}")

    def check(self, node: A.Expr) -> A.ValueType:
        """Type-check ``node`` and return its type (computed bottom-up: linear in the tree size)."""
        return _CHECKS[type(node)](self, node)

    def check_paren(self, node: A.ParenExpr) -> A.ValueType:
        return self.check(node.expr)

    def check_unary(self, node: A.UnaryExpr) -> A.ValueType:
        typ = self.check(node.expr)
        if typ is not _SCALAR and typ is not _VECTOR:
            self.error(node.pos[0], node.pos[1], "unary expression only allowed on expressions of type scalar or "
                                                 f"instant vector, got {go_quote(_doc(typ))}")
        return typ

    def check_aggregate(self, node: A.AggregateExpr) -> A.ValueType:
        assert node.expr is not None
        self.expect_type(node.expr, _VECTOR, "aggregation expression")
        op = str(node.op)
        if op in ("topk", "bottomk", "quantile", "limitk", "limit_ratio"):
            assert node.param is not None
            self.expect_type(node.param, _SCALAR, "aggregation parameter")
        if op == "count_values":
            assert node.param is not None
            self.expect_type(node.param, A.ValueType.String, "aggregation parameter")
        return _VECTOR

    def check_subquery(self, node: A.SubqueryExpr) -> A.ValueType:
        t = self.check(node.expr)
        if t != _VECTOR:
            self.error(node.pos[0], node.pos[1], f"subquery is only allowed on instant vector, got {t.value} instead")
        return A.ValueType.Matrix

    def check_matrix(self, node: A.MatrixSelector) -> A.ValueType:
        self.check_selector(node.vector_selector)
        return A.ValueType.Matrix

    def check_vector(self, node: A.VectorSelector) -> A.ValueType:
        self.check_selector(node)
        return _VECTOR

    def check_selector(self, n: A.VectorSelector) -> None:
        if n.name:
            for m in n.matchers.matchers:
                if m.name == "__name__":
                    self.error(n.pos[0], n.pos[1], f"metric name must not be set twice: {go_quote(n.name)} or "
                                                   f"{go_quote(m.value)}")
            return
        if n.bypass_empty_matcher_check:
            return
        if not any(not _matches_empty(m) for m in n.matchers.matchers):
            self.error(n.pos[0], n.pos[1], "vector selector must contain at least one non-empty matcher")

    def check_binary(self, n: A.BinaryExpr) -> A.ValueType:
        lt = self.check(n.lhs)
        rt = self.check(n.rhs)
        m = n.modifier
        assert m is not None
        op = str(n.op)
        typ = _OP_TYPES[op]
        start = n.lhs.pos[1]
        while start < len(self.text) and self.text[start] in " \t\n\r":
            start += 1
        op_range = (start, start + len(op))
        if m.return_bool and typ not in _COMPARISON:
            self.error(*op_range, "bool modifier can only be used on comparison operators")
        if typ in _COMPARISON and not m.return_bool and rt == A.ValueType.Scalar and lt == A.ValueType.Scalar:
            self.error(*op_range, "comparisons between scalars must use BOOL modifier")
        if typ in _SET and m.card == A.VectorMatchCardinality.OneToOne:
            m.card = A.VectorMatchCardinality.ManyToMany
        matching = m.matching.labels if m.matching is not None else []
        on = m.matching is not None and m.matching.type == A.LabelModifierType.Include
        for l1 in matching:
            for l2 in m.group_labels or []:
                if l1 == l2 and on:
                    self.error(*op_range, f"label {go_quote(l1)} must not occur in ON and GROUP clause at once")
        vec, sca = A.ValueType.Vector, A.ValueType.Scalar
        if lt not in (sca, vec):
            self.error(n.lhs.pos[0], n.lhs.pos[1], "binary expression must contain only scalar and instant vector types")
        if rt not in (sca, vec):
            self.error(n.rhs.pos[0], n.rhs.pos[1], "binary expression must contain only scalar and instant vector types")
        filled = m.fill_values.lhs is not None or m.fill_values.rhs is not None
        if lt != vec or rt != vec:
            if matching:
                self.error(*n.pos, "vector matching only allowed between instant vectors")
            if filled:
                self.error(*n.pos, "filling in missing series only allowed between instant vectors")
            n.modifier = A.BinModifier(A.VectorMatchCardinality.OneToOne, True) if m.return_bool else None
        elif typ in _SET:
            if m.card in (A.VectorMatchCardinality.OneToMany, A.VectorMatchCardinality.ManyToOne):
                self.error(*n.pos, f"no grouping allowed for {go_quote(op)} operation")
            if m.card != A.VectorMatchCardinality.ManyToMany:
                self.error(*n.pos, "set operations must always be many-to-many")
            if filled:
                self.error(*n.pos, "filling in missing series not allowed for set operators")
        elif (m.card == A.VectorMatchCardinality.OneToOne and m.matching is None and not m.return_bool
              and not filled):
            n.modifier = None
        if (lt == sca or rt == sca) and typ in _SET:
            self.error(*n.pos, f"set operator {go_quote(op)} not allowed in binary scalar expression")
        return sca if lt == sca and rt == sca else vec

    def check_call(self, n: A.Call) -> A.ValueType:
        f = n.func
        nargs = len(f.arg_types)
        if f.variadic == 0:
            if nargs != len(n.args):
                self.error(*n.pos, f"expected {nargs} argument(s) in call to {go_quote(f.name)}, got {len(n.args)}")
        else:
            na = nargs - 1
            if na > len(n.args):
                self.error(*n.pos, f"expected at least {na} argument(s) in call to {go_quote(f.name)}, got {len(n.args)}")
            elif f.variadic > 0 and na + f.variadic < len(n.args):
                self.error(*n.pos, f"expected at most {na + f.variadic} argument(s) in call to {go_quote(f.name)}, "
                                   f"got {len(n.args)}")
        if f.name == "info" and len(n.args) > 1:
            a1 = n.args[1]
            t1 = A.value_type(a1)
            if t1 != A.ValueType.Vector:
                self.error(*n.pos, f"expected type {_doc(A.ValueType.Vector)} in call to function {go_quote(f.name)}, "
                                   f"got {_doc(t1)}")
            if isinstance(a1, A.VectorSelector) and a1.name:
                self.error(*a1.pos, "expected label selectors only, got vector selector instead")
            elif isinstance(a1, A.VectorSelector):
                a1.bypass_empty_matcher_check = True
            else:
                self.error(*a1.pos, "expected label selectors only")
        for i, arg in enumerate(n.args):
            if i >= nargs:
                if f.variadic == 0:
                    break
                i = nargs - 1
            t = self.check(arg)
            if t != f.arg_types[i]:
                self.error(*arg.pos, f"expected type {_doc(f.arg_types[i])} in call to function {go_quote(f.name)}, "
                                     f"got {_doc(t)}")
        return f.return_type


_SCALAR, _VECTOR = A.ValueType.Scalar, A.ValueType.Vector
_CHECKS = {
    A.BinaryExpr: Parser.check_binary, A.ParenExpr: Parser.check_paren, A.UnaryExpr: Parser.check_unary,
    A.AggregateExpr: Parser.check_aggregate, A.Call: Parser.check_call, A.SubqueryExpr: Parser.check_subquery,
    A.MatrixSelector: Parser.check_matrix, A.VectorSelector: Parser.check_vector,
    A.NumberLiteral: lambda p, n: _SCALAR, A.DurationExpr: lambda p, n: _SCALAR,
    A.StringLiteral: lambda p, n: A.ValueType.String,
}

_OP_TYPES = {"or": "LOR", "and": "LAND", "unless": "LUNLESS", "==": "EQLC", ">=": "GTE", ">": "GTR", "<": "LSS",
             "<=": "LTE", "!=": "NEQ", "</": "TRIM_UPPER", ">/": "TRIM_LOWER", "+": "ADD", "-": "SUB", "*": "MUL",
             "/": "DIV", "%": "MOD", "atan2": "ATAN2", "^": "POW"}


def _go_f(v: float) -> str:
    """Go's ``%f``."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return f"{v:f}"


def _matches_empty(m: A.Matcher) -> bool:
    if m.op == A.MatchOp.Equal:
        return m.value == ""
    if m.op == A.MatchOp.NotEqual:
        return m.value != ""
    from storage.regex import RegexError, compile_regex

    try:
        hit = compile_regex(m.value).fullmatch("")
    except RegexError:
        return False
    return hit if m.op == A.MatchOp.Re else not hit


def parse(query: str) -> A.Expr:
    """Parse a PromQL expression (every Prometheus 3.x feature enabled: experimental functions,
    duration expressions, anchored/smoothed, fill modifiers). Raises :class:`ParseError`."""
    return Parser(query).parse()




def parse_metric_selector(text: str) -> A.VectorSelector:
    """Prometheus's ``ParseMetricSelector``: a series selector alone (``foo{a="b"}``, no modifiers),
    without the expression type checks. Raises :class:`ParseError`."""
    p = Parser(text)
    vs: Optional[A.VectorSelector] = None
    try:
        typ = p.tok.typ
        if typ == "LEFT_BRACE":
            vs = p.vector_selector(None)
        elif typ in _METRIC_IDENTIFIER:
            vs = p.vector_selector(p.tok)
        else:
            raise p.unexpected()
        if p.tok.typ != "EOF":
            raise p.unexpected()
    except _Abort:
        pass
    if p.errors or vs is None:
        if not p.errors:
            p.errors.append((0, 0, "no expression found in input"))
        raise ParseError(text, p.errors)
    return vs


__all__ = ["ParseError", "Parser", "parse", "parse_metric_selector", "position"]
