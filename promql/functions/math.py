"""Element-wise math functions: abs, ceil, floor, exp, ln, log2, log10, sqrt, sgn, round, clamp*,
and the experimental scalar min_of/max_of. Each drops the metric name (delayed removal)."""
from __future__ import annotations

import numpy as np

from promql.functions import FunctionContext, register
from promql.functions.common import drop_empty_series, map_vector, scalar_arg, vector_arg
from promql.types import Scalar, Value, VectorSteps


def _simple(fn):
    def impl(ctx: FunctionContext, args: list[Value]) -> Value:
        return map_vector(vector_arg(args[0]), fn)

    return impl


def _sgn(v: np.ndarray) -> np.ndarray:
    return np.where(v < 0, -1.0, np.where(v > 0, 1.0, v))


for _name, _fn in {
    "abs": np.abs,
    "ceil": np.ceil,
    "floor": np.floor,
    "exp": np.exp,
    "ln": np.log,
    "log2": np.log2,
    "log10": np.log10,
    "sqrt": np.sqrt,
    "sgn": _sgn,
}.items():
    register(_name)(_simple(_fn))


@register("round")
def round_(ctx: FunctionContext, args: list[Value]) -> Value:
    vec = vector_arg(args[0])
    to_nearest = scalar_arg(args[1], vec.num_steps) if len(args) > 1 else np.ones(vec.num_steps)
    with np.errstate(all="ignore"):
        # Prometheus multiplies by the inverse (fewer accuracy issues) and rounds ties up.
        inv = 1.0 / to_nearest
    return map_vector(vec, lambda v: np.floor(v * inv[None, :] + 0.5) / inv[None, :])


def _clamp(vec: VectorSteps, lo: np.ndarray, hi: np.ndarray) -> VectorSteps:
    with np.errstate(invalid="ignore"):
        out = map_vector(vec, lambda v: _go_max(lo[None, :], _go_min(hi[None, :], v)))
        empty_step = hi < lo  # Prometheus returns nothing at steps where max < min
    if empty_step.any():
        out.present = out.present & ~empty_step[None, :]
        out = drop_empty_series(out)
    return out


@register("clamp")
def clamp(ctx: FunctionContext, args: list[Value]) -> Value:
    vec = vector_arg(args[0])
    T = vec.num_steps
    return _clamp(vec, scalar_arg(args[1], T), scalar_arg(args[2], T))


@register("clamp_min")
def clamp_min(ctx: FunctionContext, args: list[Value]) -> Value:
    vec = vector_arg(args[0])
    T = vec.num_steps
    return _clamp(vec, scalar_arg(args[1], T), np.full(T, np.inf))


@register("clamp_max")
def clamp_max(ctx: FunctionContext, args: list[Value]) -> Value:
    vec = vector_arg(args[0])
    T = vec.num_steps
    return _clamp(vec, np.full(T, -np.inf), scalar_arg(args[1], T))


def _go_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # Go's math.Max: +Inf wins over NaN, otherwise NaN propagates.
    with np.errstate(invalid="ignore"):
        r = np.maximum(a, b)
    return np.where(np.isposinf(a) | np.isposinf(b), np.inf, r)


def _go_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        r = np.minimum(a, b)
    return np.where(np.isneginf(a) | np.isneginf(b), -np.inf, r)


@register("max_of", experimental=True)
def max_of(ctx: FunctionContext, args: list[Value]) -> Value:
    T = len(ctx.step_times)
    return Scalar(_go_max(scalar_arg(args[0], T), scalar_arg(args[1], T)))


@register("min_of", experimental=True)
def min_of(ctx: FunctionContext, args: list[Value]) -> Value:
    T = len(ctx.step_times)
    return Scalar(_go_min(scalar_arg(args[0], T), scalar_arg(args[1], T)))
