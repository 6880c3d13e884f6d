"""/api/v1/parse_query: the syntax tree (promql/parser/) -> the JSON tree Prometheus's
``translateAST`` returns.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from turboprom.api_json import format_value

_MATCH_TYPES = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}
_VALUE_TYPES = {"ValueType.Matrix": "matrix", "ValueType.Vector": "vector", "ValueType.Scalar": "scalar", "ValueType.String": "string"}
_CARD = {
    "VectorMatchCardinality.OneToOne": "one-to-one",
    "VectorMatchCardinality.ManyToOne": "many-to-one",
    "VectorMatchCardinality.OneToMany": "one-to-many",
    "VectorMatchCardinality.ManyToMany": "many-to-many",
}


def _ms(td: Any) -> int:
    return 0 if td is None else int(round(td.total_seconds() * 1000))


def _matchers(vs: Any) -> list[dict[str, str]]:
    out = []
    ms = vs.matchers
    for m in list(ms.matchers) + [m for g in ms.or_matchers for m in g]:
        out.append({"name": m.name, "value": m.value, "type": _MATCH_TYPES.get(str(m.op), str(m.op))})
    if vs.name and not any(m["name"] == "__name__" for m in out):
        out.append({"name": "__name__", "value": vs.name, "type": "="})
    return out


def _at(node: Any) -> tuple[int | None, str | None]:
    at = getattr(node, "at", None)
    if at is None:
        return None, None
    kind = str(at.type).rsplit(".", 1)[-1]
    if kind == "Start":
        return None, "start"
    if kind == "End":
        return None, "end"
    return at.ms, None


def _vector_selector(vs: Any) -> dict[str, Any]:
    ts, se = _at(vs)
    return {
        "type": "vectorSelector",
        "name": vs.name or "",
        "offset": _ms(vs.offset),
        "matchers": _matchers(vs),
        "timestamp": ts,
        "startOrEnd": se,
    }


def translate_ast(node: Any) -> Any:
    if node is None:
        return None
    kind = type(node).__name__
    if kind == "AggregateExpr":
        mod = node.modifier
        without = mod is not None and str(mod.type).endswith("Without")
        return {
            "type": "aggregation",
            "op": str(node.op),
            "expr": translate_ast(node.expr),
            "param": translate_ast(node.param),
            "grouping": list(mod.labels) if mod is not None else [],
            "without": without,
        }
    if kind == "BinaryExpr":
        mod = node.modifier
        matching = None
        if mod is not None:
            lm = mod.matching
            matching = {
                "card": _CARD.get(str(mod.card), str(mod.card)),
                "labels": list(lm.labels) if lm is not None else [],
                "on": lm is not None and str(lm.type).endswith("Include"),
                "include": list(mod.group_labels or []),
            }
        return {
            "type": "binaryExpr",
            "op": str(node.op),
            "lhs": translate_ast(node.lhs),
            "rhs": translate_ast(node.rhs),
            "matching": matching,
            "bool": bool(mod.return_bool) if mod is not None else False,
        }
    if kind == "Call":
        f = node.func
        return {
            "type": "call",
            "func": {
                "name": f.name,
                "argTypes": [_VALUE_TYPES.get(str(t), str(t)) for t in f.arg_types],
                "variadic": int(f.variadic),
                "returnType": _VALUE_TYPES.get(str(f.return_type), str(f.return_type)),
            },
            "args": [translate_ast(a) for a in node.args],
        }
    if kind == "MatrixSelector":
        vs = node.vector_selector
        out = _vector_selector(vs)
        return {
            "type": "matrixSelector",
            "name": out["name"],
            "range": _ms(node.range),
            "offset": out["offset"],
            "matchers": out["matchers"],
            "timestamp": out["timestamp"],
            "startOrEnd": out["startOrEnd"],
        }
    if kind == "SubqueryExpr":
        ts, se = _at(node)
        return {
            "type": "subquery",
            "expr": translate_ast(node.expr),
            "range": _ms(node.range),
            "offset": _ms(node.offset),
            "step": _ms(node.step),
            "timestamp": ts,
            "startOrEnd": se,
        }
    if kind == "NumberLiteral":
        v = float(node.val)
        text = format_value(v) if math.isnan(v) or math.isinf(v) else np.format_float_positional(v, unique=True, trim="-")
        return {"type": "numberLiteral", "val": text}
    if kind == "ParenExpr":
        return {"type": "parenExpr", "expr": translate_ast(node.expr)}
    if kind == "StringLiteral":
        return {"type": "stringLiteral", "val": node.val}
    if kind == "UnaryExpr":
        return {"type": "unaryExpr", "op": "-", "expr": translate_ast(node.expr)}
    if kind == "VectorSelector":
        return _vector_selector(node)
    raise ValueError(f"unsupported node type {kind}")
