"""PromQL syntax tree: the node classes the parser builds and the evaluator, planner and printer read.

Every node carries ``pos``: its ``(start, end)`` character offsets in the query text (start
inclusive, end exclusive), like Prometheus's ``PositionRange``, so annotations and errors can name
``line:col``. Durations are ``datetime.timedelta`` (``None`` when absent), ``@`` times are
integer milliseconds (``AtModifier.ms``), enumerations are ``enum.Enum`` members whose ``str()``
reads ``Type.Member``. A range, offset or subquery step written as a duration expression
(``[5m+1m]``, ``offset -(1h)``, ``[1h:step()]``) keeps that expression (``range_expr``,
``offset_expr``, ``step_expr``); its value is filled in by :func:`promql.parser.durations.resolve`
once the query's step and range are known (at parse time when it depends on neither).
"""
from __future__ import annotations

import datetime as _dt
import enum
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from storage.go_format import go_quote

_LEGACY_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


class ValueType(enum.Enum):
    Vector = "vector"
    Scalar = "scalar"
    Matrix = "matrix"
    String = "string"

    @property
    def documented(self) -> str:
        """Prometheus's ``DocumentedType``: the name used in error messages."""
        return _DOCUMENTED[self]


_DOCUMENTED = {ValueType.Vector: "instant vector", ValueType.Scalar: "scalar", ValueType.Matrix: "range vector",
               ValueType.String: "string"}


class MatchOp(enum.Enum):
    Equal = "="
    NotEqual = "!="
    Re = "=~"
    NotRe = "!~"


class AtModifierType(enum.Enum):
    Start = "start"
    End = "end"
    At = "at"


class AggModifierType(enum.Enum):
    By = "by"
    Without = "without"


class LabelModifierType(enum.Enum):
    Include = "on"
    Exclude = "ignoring"


class VectorMatchCardinality(enum.Enum):
    OneToOne = "one-to-one"
    ManyToOne = "many-to-one"
    OneToMany = "one-to-many"
    ManyToMany = "many-to-many"


class TokenType(str):
    """An operator or aggregation name as written in PromQL (lower case): ``str(op)`` is ``"sum"``,
    ``"+"``, ``"and"``; compares equal to that text."""

    __slots__ = ()


@dataclass
class Function:
    name: str
    arg_types: list[ValueType]
    return_type: ValueType
    variadic: int = 0
    experimental: bool = False


@dataclass
class Matcher:
    op: MatchOp
    name: str
    value: str

    def __str__(self) -> str:
        name = self.name if _LEGACY_LABEL.match(self.name) else go_quote(self.name)
        return f"{name}{self.op.value}{go_quote(self.value)}"


@dataclass
class Matchers:
    """A selector's label matchers, the metric name not included (it is ``VectorSelector.name``).
    ``or_matchers`` is always empty (PromQL has no ``or`` inside braces); kept so a selector reads
    like a set of alternatives."""

    matchers: list[Matcher]
    or_matchers: list[list[Matcher]] = field(default_factory=list)


@dataclass
class AtModifier:
    type: AtModifierType
    ms: Optional[int] = None  # for AtModifierType.At: milliseconds since the epoch (may be negative)

    @property
    def at(self) -> Optional[_dt.datetime]:
        """The ``@`` time as an aware datetime (None for start()/end())."""
        if self.ms is None:
            return None
        return _EPOCH + _dt.timedelta(milliseconds=self.ms)


@dataclass
class AggModifier:
    type: AggModifierType
    labels: list[str]


@dataclass
class LabelModifier:
    type: LabelModifierType
    labels: list[str]


@dataclass
class VectorMatchFillValues:
    lhs: Optional[float] = None
    rhs: Optional[float] = None


@dataclass
class BinModifier:
    card: VectorMatchCardinality
    return_bool: bool = False
    matching: Optional[LabelModifier] = None
    group_labels: Optional[list[str]] = None
    fill_values: VectorMatchFillValues = field(default_factory=VectorMatchFillValues)


class Expr:
    """Base of every expression node."""

    pos: tuple[int, int]


@dataclass(eq=False)
class NumberLiteral(Expr):
    val: float
    pos: tuple[int, int] = (0, 0)
    duration: bool = False  # written as a duration (``5m``): printed as one


@dataclass(eq=False)
class StringLiteral(Expr):
    val: str
    pos: tuple[int, int] = (0, 0)


@dataclass(eq=False)
class DurationExpr(Expr):
    """Arithmetic over durations in seconds: ``op`` is ``+ - * / % ^``, ``step``, ``range``,
    ``min_of``, ``max_of``; a unary ``-``/``+`` has ``lhs`` None."""

    op: str
    lhs: Optional[Expr] = None
    rhs: Optional[Expr] = None
    wrapped: bool = False  # written in parentheses
    start: int = 0
    end: int = 0

    @property
    def pos(self) -> tuple[int, int]:  # type: ignore[override]
        if self.lhs is None and self.rhs is None:
            return (self.start, self.end)
        if self.rhs is None:
            return (self.start, self.lhs.pos[1])  # type: ignore[union-attr]
        if self.lhs is None:
            return (self.start, self.rhs.pos[1])
        lp, rp = self.lhs.pos, self.rhs.pos
        return (min(lp[0], rp[0]), max(lp[1], rp[1]))


@dataclass(eq=False)
class VectorSelector(Expr):
    name: Optional[str]
    matchers: Matchers
    offset: Optional[_dt.timedelta] = None
    at: Optional[AtModifier] = None
    pos: tuple[int, int] = (0, 0)
    offset_expr: Optional[DurationExpr] = None
    anchored: bool = False
    smoothed: bool = False
    bypass_empty_matcher_check: bool = False  # info()'s label-selector argument


@dataclass(eq=False)
class MatrixSelector(Expr):
    vector_selector: VectorSelector
    range: Optional[_dt.timedelta]
    end: int = 0
    range_expr: Optional[DurationExpr] = None

    @property
    def pos(self) -> tuple[int, int]:  # type: ignore[override]
        return (self.vector_selector.pos[0], self.end)


@dataclass(eq=False)
class SubqueryExpr(Expr):
    expr: Expr
    range: Optional[_dt.timedelta]
    step: Optional[_dt.timedelta] = None
    offset: Optional[_dt.timedelta] = None
    at: Optional[AtModifier] = None
    end: int = 0
    range_expr: Optional[DurationExpr] = None
    step_expr: Optional[DurationExpr] = None
    offset_expr: Optional[DurationExpr] = None

    @property
    def pos(self) -> tuple[int, int]:  # type: ignore[override]
        return (self.expr.pos[0], self.end)


@dataclass(eq=False)
class ParenExpr(Expr):
    expr: Expr
    pos: tuple[int, int] = (0, 0)


@dataclass(eq=False)
class UnaryExpr(Expr):
    expr: Expr
    op: TokenType = TokenType("-")
    start: int = 0

    @property
    def pos(self) -> tuple[int, int]:  # type: ignore[override]
        return (self.start, self.expr.pos[1])


@dataclass(eq=False)
class Call(Expr):
    func: Function
    args: list[Expr]
    pos: tuple[int, int] = (0, 0)


@dataclass(eq=False)
class AggregateExpr(Expr):
    op: TokenType
    expr: Optional[Expr]
    param: Optional[Expr] = None
    modifier: Optional[AggModifier] = None
    pos: tuple[int, int] = (0, 0)


@dataclass(eq=False)
class BinaryExpr(Expr):
    op: TokenType
    lhs: Expr
    rhs: Expr
    modifier: Optional[BinModifier] = None
    pos: tuple[int, int] = (0, 0)  # from the start of lhs to the end of rhs (set by the parser)


def value_type(node: Any) -> ValueType:
    """Static PromQL type of an expression (Prometheus's ``Expr.Type()``)."""
    while isinstance(node, (ParenExpr, UnaryExpr)):
        node = node.expr
    if isinstance(node, (NumberLiteral, DurationExpr)):
        return ValueType.Scalar
    if isinstance(node, StringLiteral):
        return ValueType.String
    if isinstance(node, (VectorSelector, AggregateExpr)):
        return ValueType.Vector
    if isinstance(node, (MatrixSelector, SubqueryExpr)):
        return ValueType.Matrix
    if isinstance(node, Call):
        return node.func.return_type
    if isinstance(node, BinaryExpr):
        if value_type(node.lhs) == ValueType.Scalar and value_type(node.rhs) == ValueType.Scalar:
            return ValueType.Scalar
        return ValueType.Vector
    raise TypeError(f"not a PromQL expression: {type(node).__name__}")


__all__ = [
    "ValueType", "MatchOp", "AtModifierType", "AggModifierType", "LabelModifierType", "VectorMatchCardinality",
    "TokenType", "Function", "Matcher", "Matchers", "AtModifier", "AggModifier", "LabelModifier",
    "VectorMatchFillValues", "BinModifier", "Expr", "NumberLiteral", "StringLiteral", "DurationExpr",
    "VectorSelector", "MatrixSelector", "SubqueryExpr", "ParenExpr", "UnaryExpr", "Call", "AggregateExpr",
    "BinaryExpr", "value_type",
]
