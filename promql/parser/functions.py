"""PromQL function signatures, as the parser checks calls against them (Prometheus's
``promql/parser/functions.go``): name -> argument types, return type, variadic count, experimental.

``variadic`` as in Prometheus: 0 fixed arity; n > 0 the last declared argument is optional and the
call takes at most ``len(args) - 1 + n`` arguments; -1 no upper bound.
"""
from __future__ import annotations

from promql.parser.ast import Function, ValueType

_T = {"V": ValueType.Vector, "S": ValueType.Scalar, "M": ValueType.Matrix, "s": ValueType.String}

# name: (argument types, return type, variadic, experimental); V vector, S scalar, M matrix, s string
_SIGNATURES: dict[str, tuple[str, str, int, bool]] = {
    "abs": ("V", "V", 0, False),
    "absent": ("V", "V", 0, False),
    "absent_over_time": ("M", "V", 0, False),
    "acos": ("V", "V", 0, False),
    "acosh": ("V", "V", 0, False),
    "asin": ("V", "V", 0, False),
    "asinh": ("V", "V", 0, False),
    "atan": ("V", "V", 0, False),
    "atanh": ("V", "V", 0, False),
    "avg_over_time": ("M", "V", 0, False),
    "ceil": ("V", "V", 0, False),
    "changes": ("M", "V", 0, False),
    "clamp": ("VSS", "V", 0, False),
    "clamp_max": ("VS", "V", 0, False),
    "clamp_min": ("VS", "V", 0, False),
    "cos": ("V", "V", 0, False),
    "cosh": ("V", "V", 0, False),
    "count_over_time": ("M", "V", 0, False),
    "days_in_month": ("V", "V", 1, False),
    "day_of_month": ("V", "V", 1, False),
    "day_of_week": ("V", "V", 1, False),
    "day_of_year": ("V", "V", 1, False),
    "deg": ("V", "V", 0, False),
    "end": ("", "S", 0, True),
    "delta": ("M", "V", 0, False),
    "deriv": ("M", "V", 0, False),
    "exp": ("V", "V", 0, False),
    "first_over_time": ("M", "V", 0, False),
    "floor": ("V", "V", 0, False),
    "histogram_avg": ("V", "V", 0, False),
    "histogram_count": ("V", "V", 0, False),
    "histogram_sum": ("V", "V", 0, False),
    "histogram_stddev": ("V", "V", 0, False),
    "histogram_stdvar": ("V", "V", 0, False),
    "histogram_fraction": ("SSV", "V", 0, False),
    "histogram_quantile": ("SV", "V", 0, False),
    "histogram_quantiles": ("VsSS", "V", 9, True),
    "double_exponential_smoothing": ("MSS", "V", 0, True),
    "hour": ("V", "V", 1, False),
    "idelta": ("M", "V", 0, False),
    "increase": ("M", "V", 0, False),
    "info": ("VV", "V", 1, True),
    "irate": ("M", "V", 0, False),
    "label_replace": ("Vssss", "V", 0, False),
    "label_join": ("Vsss", "V", -1, False),
    "max_of": ("SS", "S", 0, True),
    "last_over_time": ("M", "V", 0, False),
    "min_of": ("SS", "S", 0, True),
    "ln": ("V", "V", 0, False),
    "log10": ("V", "V", 0, False),
    "log2": ("V", "V", 0, False),
    "mad_over_time": ("M", "V", 0, True),
    "max_over_time": ("M", "V", 0, False),
    "min_over_time": ("M", "V", 0, False),
    "ts_of_first_over_time": ("M", "V", 0, True),
    "ts_of_max_over_time": ("M", "V", 0, True),
    "ts_of_min_over_time": ("M", "V", 0, True),
    "ts_of_last_over_time": ("M", "V", 0, True),
    "minute": ("V", "V", 1, False),
    "month": ("V", "V", 1, False),
    "pi": ("", "S", 0, False),
    "predict_linear": ("MS", "V", 0, False),
    "present_over_time": ("M", "V", 0, False),
    "quantile_over_time": ("SM", "V", 0, False),
    "rad": ("V", "V", 0, False),
    "range": ("", "S", 0, True),
    "rate": ("M", "V", 0, False),
    "resets": ("M", "V", 0, False),
    "round": ("VS", "V", 1, False),
    "scalar": ("V", "S", 0, False),
    "sgn": ("V", "V", 0, False),
    "sin": ("V", "V", 0, False),
    "sinh": ("V", "V", 0, False),
    "sort": ("V", "V", 0, False),
    "sort_desc": ("V", "V", 0, False),
    "sort_by_label": ("Vs", "V", -1, True),
    "sort_by_label_desc": ("Vs", "V", -1, True),
    "sqrt": ("V", "V", 0, False),
    "start": ("", "S", 0, True),
    "start_timestamp": ("V", "V", 0, True),
    "step": ("", "S", 0, True),
    "stddev_over_time": ("M", "V", 0, False),
    "stdvar_over_time": ("M", "V", 0, False),
    "sum_over_time": ("M", "V", 0, False),
    "tan": ("V", "V", 0, False),
    "tanh": ("V", "V", 0, False),
    "time": ("", "S", 0, False),
    "timestamp": ("V", "V", 0, False),
    "vector": ("S", "V", 0, False),
    "year": ("V", "V", 1, False),
}


def _function(name: str, spec: tuple[str, str, int, bool]) -> Function:
    args, ret, variadic, experimental = spec
    return Function(name, [_T[c] for c in args], _T[ret], variadic, experimental)


FUNCTIONS: dict[str, Function] = {name: _function(name, spec) for name, spec in _SIGNATURES.items()}


def get_function(name: str) -> Function | None:
    return FUNCTIONS.get(name)


__all__ = ["FUNCTIONS", "get_function"]
