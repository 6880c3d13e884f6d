"""PromQL printer: ``to_promql(expr)`` renders a syntax tree (promql/parser/ast.py) the way
Prometheus's ``expr.String()`` does (promql/parser/printer.go), so that print(parse(q)) re-parses to
the same tree and prints identically.

Hand-written: the printer belongs to TurboProm's own parser, and no other Python library prints
PromQL.

``inject_at_ms``: attach ``@ <t>`` to every vector selector, matrix selector and subquery that has
no ``@`` yet, but not inside a subquery (the conformance runner's step-invariance re-run, FORMAT.md
4.4.1; after the outer subquery receives its ``@`` its children are left alone, as upstream does).
"""
from __future__ import annotations

import datetime as _dt
import math
import re
from typing import Any

from promql import parser as pp
from storage.go_format import format_float_f, go_quote

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


def label_name(name: str) -> str:
    """A label name as PromQL writes it: bare when legacy-valid, quoted otherwise."""
    return name if _LEGACY_LABEL.match(name) else go_quote(name)


_label_name = label_name


def _matcher(m: Any) -> str:
    return f"{label_name(m.name)}{m.op.value}{go_quote(m.value)}"


def _at_str(at: Any) -> str:
    if at is None:
        return ""
    if at.type == pp.AtModifierType.Start:
        return " @ start()"
    if at.type == pp.AtModifierType.End:
        return " @ end()"
    return f" @ {at.ms / 1000.0:.3f}"


def _offset_str(offset: _dt.timedelta | None, expr: Any = None) -> str:
    if expr is not None:
        return " offset " + _duration(expr)
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
    if name and not _LEGACY_METRIC.match(name):
        parts.append(f"__name__={go_quote(name)}")
        name = ""
    out = name
    if parts:
        out += "{" + ",".join(sorted(parts)) + "}"
    return out


def _extended(vs: Any) -> str:
    if vs.anchored:
        return " anchored"
    if vs.smoothed:
        return " smoothed"
    return ""


def _labels_list(labels: Any) -> str:
    return ", ".join(label_name(l) for l in (labels or []))


def _number(n: Any) -> str:
    if n.duration:
        ms = int(round(n.val * 1000))
        return "-" + format_duration_ms(-ms) if ms < 0 else format_duration_ms(ms)
    return format_float_f(n.val)


def _duration(d: Any) -> str:
    """A range, step or offset written as a duration expression (Prometheus's DurationExpr.String)."""
    if isinstance(d, pp.NumberLiteral):
        return _number(d)
    op = d.op
    if op in ("step", "range"):
        out = op + "()"
    elif op in ("min_of", "max_of"):
        out = f"{op}({_duration(d.lhs)}, {_duration(d.rhs)})"
    elif d.lhs is None:
        out = ("-" if op == "-" else "") + _duration(d.rhs)
    else:
        out = f"{_duration(d.lhs)} {op} {_duration(d.rhs)}"
    return f"({out})" if d.wrapped else out


def _range_str(value: _dt.timedelta | None, expr: Any) -> str:
    return _duration(expr) if expr is not None else format_duration_ms(timedelta_ms(value))


def to_promql(expr: Any, inject_at_ms: int | None = None) -> str:
    """Render an expression like Prometheus's ``String()`` (string literals keep their bytes:
    invalid UTF-8 prints as ``\\xNN``)."""
    return _p(expr, inject_at_ms)


def format_query(query: str) -> str:
    """Parse and re-print (what ``/api/v1/format_query`` returns, minus prettifying)."""
    return to_promql(pp.parse(query))


def _p(e: Any, at: int | None) -> str:
    if isinstance(e, pp.VectorSelector):
        return _selector_core(e) + _injected_at(e, at) + _extended(e) + _offset_str(e.offset, e.offset_expr)
    if isinstance(e, pp.MatrixSelector):
        vs = e.vector_selector
        return (f"{_selector_core(vs)}[{_range_str(e.range, e.range_expr)}]{_extended(vs)}{_injected_at(vs, at)}"
                f"{_offset_str(vs.offset, vs.offset_expr)}")
    if isinstance(e, pp.SubqueryExpr):
        at_s = _injected_at(e, at)
        if e.step is not None and timedelta_ms(e.step) != 0:
            step = format_duration_ms(timedelta_ms(e.step))
        elif e.step_expr is not None:
            step = _duration(e.step_expr)
        else:
            step = ""
        # children of a subquery never get an injected @ (the subquery carries it)
        return f"{_p(e.expr, None)}[{_range_str(e.range, e.range_expr)}:{step}]{at_s}{_offset_str(e.offset, e.offset_expr)}"
    if isinstance(e, pp.NumberLiteral):
        return _number(e)
    if isinstance(e, pp.StringLiteral):
        return go_quote(e.val)
    if isinstance(e, pp.ParenExpr):
        return "(" + _p(e.expr, at) + ")"
    if isinstance(e, pp.UnaryExpr):
        return str(e.op) + _p(e.expr, at)
    if isinstance(e, pp.Call):
        return e.func.name + "(" + ", ".join(_p(a, at) for a in e.args) + ")"
    if isinstance(e, pp.AggregateExpr):
        op = str(e.op)
        s = op
        mod = e.modifier
        if mod is not None:
            if mod.type == pp.AggModifierType.Without:
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
    card = m.card
    grouped = card in (pp.VectorMatchCardinality.ManyToOne, pp.VectorMatchCardinality.OneToMany)
    matching = m.matching
    labels = list(matching.labels) if matching is not None else []
    on = matching is not None and matching.type == pp.LabelModifierType.Include
    if labels or on or grouped:
        out += (" on (" if on else " ignoring (") + _labels_list(labels) + ")"
    if grouped:
        out += (" group_left (" if card == pp.VectorMatchCardinality.ManyToOne else " group_right (") + _labels_list(m.group_labels) + ")"
    lhs, rhs = m.fill_values.lhs, m.fill_values.rhs
    if lhs is not None or rhs is not None:
        if lhs is not None and rhs is not None and lhs == rhs:
            out += f" fill ({_go_v(lhs)})"
        else:
            if lhs is not None:
                out += f" fill_left ({_go_v(lhs)})"
            if rhs is not None:
                out += f" fill_right ({_go_v(rhs)})"
    return out


def _go_v(v: float) -> str:
    """Go's ``%v`` of a float64 (strconv 'g' with the shortest precision, exponent from 1e21)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    r = repr(float(v))
    if r.endswith(".0"):
        r = r[:-2]
    if "e" in r:
        mant, ex = r.split("e")
        exp = int(ex)
        if -4 <= exp < 21:
            return format_float_f(v)
        return f"{mant}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if abs(v) >= 1e21:
        return f"{v:e}"
    return r
