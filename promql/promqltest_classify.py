"""Classify conformance evals as plain (stable PromQL over floats), exp (experimental construct)
or nh (needs native histograms), per ../shared/promqltest/INVENTORY.md.

nh wins over exp: an experimental eval over native-histogram data is skipped as nh.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from promql import parser as pp

from storage.labels import Labels
from storage.matchers import Matcher

from promql.ast_walk import walk
from promql.functions import load_all
from promql.promqltest_script import EvalCmd, Hist, LoadCmd

PLAIN, EXP, NH = "plain", "exp", "nh"


def _experimental(name: str) -> bool:
    """Prometheus gates the function behind promql-experimental-functions (its function table)."""
    spec = load_all().get(name)
    return spec is not None and spec.experimental


EXPERIMENTAL_AGGREGATORS = frozenset({"limitk", "limit_ratio"})
TYPE_UNIT_LABELS = ("__type__", "__unit__")

_TOKEN = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_MATCH_OPS = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}


def selector_matchers(vs: Any) -> list[Matcher]:
    ms = []
    for m in vs.matchers.matchers:
        try:
            ms.append(Matcher(m.name, _MATCH_OPS[str(m.op).rsplit(".", 1)[-1]], m.value))
        except ValueError:  # a regex Python's re cannot compile: treat as "matches anything"
            pass
    if vs.name:
        ms.append(Matcher("__name__", "=", vs.name))
    return ms


@dataclass
class LoadedState:
    """What the classifier knows about currently loaded data (reset by ``clear``)."""

    hist_series: set[Labels] = field(default_factory=set)
    has_start_timestamps: bool = False
    has_type_unit: bool = False

    def clear(self) -> None:
        self.hist_series.clear()
        self.has_start_timestamps = False
        self.has_type_unit = False

    def add_load(self, cmd: LoadCmd) -> None:
        if cmd.has_start_timestamps:
            self.has_start_timestamps = True
        for lbl, vals in cmd.series.items():
            if any(n in TYPE_UNIT_LABELS for n, _ in lbl):
                self.has_type_unit = True
            if any(isinstance(v, Hist) for v in vals):
                self.hist_series.add(lbl)
        if cmd.with_nhcb:
            for lbl, vals in cmd.series.items():
                name = dict(lbl).get("__name__", "")
                for suffix in ("_bucket", "_count", "_sum"):
                    if name.endswith(suffix) and any(v is not None and not isinstance(v, Hist) for v in vals):
                        base = tuple(sorted(
                            [("__name__", name[: -len(suffix)])] + [(n, v) for n, v in lbl if n not in ("__name__", "le")]))
                        self.hist_series.add(base)
                        break


@dataclass
class Classification:
    kind: str  # plain | exp | nh
    reason: str = ""
    parse_error: str | None = None  # set when the parser rejects the query
    ast: Any = None


def classify(cmd: EvalCmd, state: LoadedState) -> Classification:
    try:
        ast = pp.parse(cmd.expr)
        perr = None
    except Exception as e:  # noqa: BLE001 - the parser raises ValueError/others
        ast, perr = None, str(e)

    # -- native histograms ----------------------------------------------------------------
    if cmd.uses_histogram_expectation():
        return Classification(NH, "expected result contains native histograms", perr, ast)
    # An eval is nh when its query text names a metric that has native-histogram samples in the
    # loaded data (directly or via load_with_nhcb). This is the rule INVENTORY.md's counts follow
    # (a selector-matching rule would also catch e.g. `max({job="x"})` over mixed data, which the
    # inventory counts as plain: the float part of such evals is still checked).
    if state.hist_series:
        tokens = set(_TOKEN.findall(cmd.expr))
        for lbl in sorted(state.hist_series):
            if dict(lbl).get("__name__", "") in tokens:
                return Classification(NH, f"uses native-histogram series {_fmt(lbl)}", perr, ast)

    # -- experimental ---------------------------------------------------------------------
    if perr is not None:
        return Classification(EXP, f"parser rejects (experimental syntax): {perr}", perr, None)
    if state.has_start_timestamps:
        return Classification(EXP, "data uses start timestamps (@st)", None, ast)
    if state.has_type_unit or any(t in cmd.expr for t in TYPE_UNIT_LABELS):
        return Classification(EXP, "__type__/__unit__ labels", None, ast)
    if _duration_as_number(cmd.expr):
        return Classification(EXP, "duration literal used as a number (duration expressions)", None, ast)
    if _SIGNED_OFFSET_ARITH.search(cmd.expr):
        # `x offset -2 * 2`: with duration expressions enabled the operator's binding is decided by
        # the experimental grammar (heuristic; matches INVENTORY.md's two cases)
        return Classification(EXP, "signed numeric offset followed by an operator (duration expressions)", None, ast)
    for n in walk(ast):
        if _extended_syntax(n):
            return Classification(EXP, f"experimental syntax: {_extended_syntax(n)}", None, ast)
        if isinstance(n, pp.Call) and _experimental(n.func.name):
            return Classification(EXP, f"experimental function {n.func.name}()", None, ast)
        if isinstance(n, pp.AggregateExpr) and str(n.op) in EXPERIMENTAL_AGGREGATORS:
            return Classification(EXP, f"experimental aggregator {n.op}", None, ast)
        if isinstance(n, pp.BinaryExpr) and n.modifier is not None:
            fv = getattr(n.modifier, "fill_values", None)
            if fv is not None and (fv.lhs is not None or fv.rhs is not None):
                return Classification(EXP, "binary-operator fill modifier", None, ast)
    return Classification(PLAIN, "", None, ast)


def _extended_syntax(n: Any) -> str:
    """The Prometheus 3.x experimental syntax a node uses ("" if none): duration expressions,
    anchored/smoothed selectors, the histogram trim operators."""
    vs = n.vector_selector if isinstance(n, pp.MatrixSelector) else n
    if isinstance(vs, pp.VectorSelector):
        if vs.anchored or vs.smoothed:
            return "anchored/smoothed range selector"
        if vs.offset_expr is not None:
            return "duration expression"
    if isinstance(n, pp.MatrixSelector) and n.range_expr is not None:
        return "duration expression"
    if isinstance(n, pp.SubqueryExpr) and (n.range_expr or n.step_expr or n.offset_expr) is not None:
        return "duration expression"
    if isinstance(n, pp.BinaryExpr) and str(n.op) in ("</", ">/"):
        return "histogram trim operator"
    return ""


_STRING = re.compile(r"""\"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`""")
_DURATION_TOKEN = re.compile(r"(?<![\w.])\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*(?![\w.])")
_SIGNED_OFFSET_ARITH = re.compile(r"offset\s+-\s*\d[\d.]*\s*[-+*/%^]")


def _duration_as_number(expr: str) -> bool:
    """A duration literal (``1h``) outside ``[...]`` and not after ``offset``: ExperimentalDurationExpr."""
    text = _STRING.sub('""', expr)
    for m in _DURATION_TOKEN.finditer(text):
        before = text[: m.start()]
        if before.count("[") > before.count("]"):
            continue
        if re.search(r"offset\s*-?\s*$", before):
            continue
        return True
    return False


def _fmt(lbl: Labels) -> str:
    from storage.labels import format_labels

    return format_labels(lbl)
