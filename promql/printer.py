"""PromQL printer: ``to_promql(expr)`` renders a ``promql_parser`` AST the way Prometheus's
``expr.String()`` does (promql/parser/printer.go), so that print(parse(q)) re-parses to the same
tree and prints identically.

Hand-written because ``str()`` of ``promql_parser`` nodes is not faithful (it prints ``foo{}`` for a
bare name, ``inf`` for ``+Inf``, unescaped strings, and subqueries without the ``:``), and no other
Python library prints PromQL.

``inject_at_ms``: attach ``@ <t>`` to every vector selector, matrix selector and subquery that has
no ``@`` yet, but not inside a subquery (the conformance runner's step-invariance re-run, FORMAT.md
4.4.1; after the outer subquery receives its ``@`` its children are left alone, as upstream does).
"""
from __future__ import annotations

import datetime as _dt
import math
import re
import threading
from decimal import Decimal
from typing import Any

import promql_parser as pp

from promql.ast_walk import walk
from promql.go_strings import decode_go_literal

_LEGACY_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LEGACY_METRIC = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*$")

_MATCH_OPS = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}

_AGG_WITH_PARAM = {"topk", "bottomk", "quantile", "count_values", "limitk", "limit_ratio"}

_UNITS = (
    ("y", 365 * 86_400_000, True),
    ("w", 7 * 86_400_000, True),
    ("d", 86_400_000, False),
    ("h", 3_600_000, False),
    ("m", 60_000, False),
    ("s", 1000, False),
    ("ms", 1, False),
)


def format_duration_ms(ms: int) -> str:
    """Prometheus ``model.Duration.String()``: e.g. 5400000 -> ``1h30m``; 0 -> ``0s``;
    years and weeks only when they divide exactly."""
    if ms == 0:
        return "0s"
    out = []
    for unit, mult, exact in _UNITS:
        if exact and ms % mult != 0:
            continue
        v = ms // mult
        if v > 0:
            out.append(f"{v}{unit}")
            ms -= v * mult
    return "".join(out)


def timedelta_ms(td: _dt.timedelta | None) -> int:
    if td is None:
        return 0
    return (td.days * 86_400_000_000 + td.seconds * 1_000_000 + td.microseconds) // 1000


def format_float(v: float) -> str:
    """Go ``strconv.FormatFloat(v, 'f', -1, 64)``: shortest round-trip digits, no exponent."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    r = repr(float(v))
    if "e" in r or "E" in r:
        r = format(Decimal(r), "f")
    if r.endswith(".0"):
        r = r[:-2]
    if r == "-0":
        return "-0"
    return r


def go_quote(s: str) -> str:
    """Go ``strconv.Quote``: double-quoted, Go escapes, printable Unicode kept."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\a":
            out.append("\\a")
        elif ch == "\b":
            out.append("\\b")
        elif ch == "\f":
            out.append("\\f")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\v":
            out.append("\\v")
        elif 0xDC80 <= o <= 0xDCFF:  # an invalid UTF-8 byte carried as a surrogate escape
            out.append(f"\\x{o - 0xDC00:02x}")
        elif ch == " " or ch.isprintable():
            out.append(ch)
        elif o < 0x80:
            out.append(f"\\x{o:02x}")
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    out.append('"')
    return "".join(out)


def _label_name(name: str) -> str:
    return name if _LEGACY_LABEL.match(name) else go_quote(name)


def _match_op(op: Any) -> str:
    return _MATCH_OPS[str(op).rsplit(".", 1)[-1]]


def _matcher(m: Any) -> str:
    return f"{_label_name(m.name)}{_match_op(m.op)}{go_quote(m.value)}"


def _at_ms(at: Any) -> int:
    d = at.at
    return round(d.timestamp() * 1000) if isinstance(d, _dt.datetime) else int(d)


def _at_str(at: Any) -> str:
    if at is None:
        return ""
    kind = str(at.type).rsplit(".", 1)[-1]
    if kind == "Start":
        return " @ start()"
    if kind == "End":
        return " @ end()"
    return f" @ {_at_ms(at) / 1000.0:.3f}"


def _offset_str(offset: _dt.timedelta | None) -> str:
    ms = timedelta_ms(offset)
    if ms > 0:
        return " offset " + format_duration_ms(ms)
    if ms < 0:
        return " offset -" + format_duration_ms(-ms)
    return ""


def _injected_at(node: Any, inject_at_ms: int | None) -> str:
    if node.at is not None:
        return _at_str(node.at)
    if inject_at_ms is not None:
        return f" @ {inject_at_ms / 1000.0:.3f}"
    return ""


def _selector_core(vs: Any) -> str:
    name = vs.name or ""
    parts = [_matcher(m) for m in vs.matchers.matchers]
    if vs.matchers.or_matchers:  # promql_parser extension (not in Prometheus): keep it printable
        groups = [",".join(sorted(_matcher(m) for m in g)) for g in vs.matchers.or_matchers]
        return f"{name}{{{' or '.join(groups)}}}"
    if name and not _LEGACY_METRIC.match(name):
        parts.append(f"__name__={go_quote(name)}")
        name = ""
    out = name
    if parts:
        out += "{" + ",".join(sorted(parts)) + "}"
    return out


def _labels_list(labels: Any) -> str:
    return ", ".join(_label_name(l) for l in (labels or []))


def to_promql(expr: Any, inject_at_ms: int | None = None, source: str | None = None) -> str:
    """Render a promql_parser expression like Prometheus's ``String()``.

    ``source`` (the query text ``expr`` was parsed from) lets string literals keep bytes that are
    not valid UTF-8: promql-parser decodes ``"\\xff"`` to U+00FF, Go keeps the byte 0xff and prints
    it back as ``\\xff``."""
    raw = _raw_string_literals(source) if source else None
    if raw is not None and len(raw) != sum(1 for n in walk(expr) if isinstance(n, pp.StringLiteral)):
        raw = None
    _RAW.stack.append(iter(raw) if raw is not None else None)
    try:
        return _p(expr, inject_at_ms)
    finally:
        _RAW.stack.pop()


class _RawState(threading.local):
    def __init__(self) -> None:
        self.stack: list = []


_RAW = _RawState()


def _raw_string_literals(text: str) -> list[str] | None:
    """String literals outside label matchers, in text order, decoded to bytes the way Go does and
    returned as str with invalid UTF-8 bytes surrogate-escaped. None if the text cannot be scanned."""
    out: list[str] = []
    depth = 0
    i, n = 0, len(text)
    try:
        while i < n:
            ch = text[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "#":  # comment to end of line
                j = text.find("\n", i)
                i = n if j < 0 else j
                continue
            elif ch in "\"'`":
                lit = decode_go_literal(text, i)
                if lit is None:
                    return None
                if depth == 0:
                    out.append(lit[0].decode("utf-8", "surrogateescape"))
                i = lit[1]
                continue
            i += 1
    except (IndexError, ValueError):
        return None
    return out


def format_query(query: str) -> str:
    """Parse and re-print (what ``/api/v1/format_query`` returns, minus prettifying)."""
    return to_promql(pp.parse(query))


def _p(e: Any, at: int | None) -> str:
    if isinstance(e, pp.VectorSelector):
        return _selector_core(e) + _injected_at(e, at) + _offset_str(e.offset)
    if isinstance(e, pp.MatrixSelector):
        vs = e.vector_selector
        return f"{_selector_core(vs)}[{format_duration_ms(timedelta_ms(e.range))}]{_injected_at(vs, at)}{_offset_str(vs.offset)}"
    if isinstance(e, pp.SubqueryExpr):
        at_s = _injected_at(e, at)
        step = format_duration_ms(timedelta_ms(e.step)) if e.step is not None and timedelta_ms(e.step) != 0 else ""
        # children of a subquery never get an injected @ (the subquery carries it)
        return f"{_p(e.expr, None)}[{format_duration_ms(timedelta_ms(e.range))}:{step}]{at_s}{_offset_str(e.offset)}"
    if isinstance(e, pp.NumberLiteral):
        return format_float(e.val)
    if isinstance(e, pp.StringLiteral):
        it = _RAW.stack[-1] if _RAW.stack else None
        val = next(it, e.val) if it is not None else e.val
        return go_quote(val)
    if isinstance(e, pp.ParenExpr):
        return "(" + _p(e.expr, at) + ")"
    if isinstance(e, pp.UnaryExpr):
        return "-" + _p(e.expr, at)
    if isinstance(e, pp.Call):
        return e.func.name + "(" + ", ".join(_p(a, at) for a in e.args) + ")"
    if isinstance(e, pp.AggregateExpr):
        op = str(e.op)
        s = op
        mod = e.modifier
        if mod is not None:
            kind = str(mod.type).rsplit(".", 1)[-1]
            if kind == "Without":
                s += " without (" + _labels_list(mod.labels) + ") "
            elif mod.labels:
                s += " by (" + _labels_list(mod.labels) + ") "
        s += "("
        if op in _AGG_WITH_PARAM and e.param is not None:
            s += _p(e.param, at) + ", "
        return s + _p(e.expr, at) + ")"
    if isinstance(e, pp.BinaryExpr):
        return _p(e.lhs, at) + " " + str(e.op) + _binary_modifier(e) + " " + _p(e.rhs, at)
    raise TypeError(f"cannot print PromQL node {type(e).__name__}")


def _binary_modifier(e: Any) -> str:
    m = e.modifier
    if m is None:
        return ""
    out = " bool" if m.return_bool else ""
    card = str(m.card).rsplit(".", 1)[-1]
    grouped = card in ("ManyToOne", "OneToMany")
    matching = m.matching
    labels = list(matching.labels) if matching is not None else []
    on = matching is not None and str(matching.type).rsplit(".", 1)[-1] == "Include"
    if labels or on or grouped:
        out += (" on (" if on else " ignoring (") + _labels_list(labels) + ")"
    if grouped:
        out += (" group_left (" if card == "ManyToOne" else " group_right (") + _labels_list(m.group_labels) + ")"
    fv = getattr(m, "fill_values", None)
    if fv is not None:
        lhs, rhs = getattr(fv, "lhs", None), getattr(fv, "rhs", None)
        if lhs is not None or rhs is not None:
            if lhs is not None and rhs is not None and (lhs == rhs or (math.isnan(lhs) and math.isnan(rhs))):
                out += f" fill ({format_float(lhs)})"
            else:
                if lhs is not None:
                    out += f" fill_left ({format_float(lhs)})"
                if rhs is not None:
                    out += f" fill_right ({format_float(rhs)})"
    return out
