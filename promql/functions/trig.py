"""Trigonometric functions, deg/rad and pi(). Element-wise; drop the metric name."""
from __future__ import annotations

import math as _math

import numpy as np

from promql.functions import FunctionContext, register
from promql.functions.common import map_vector, vector_arg
from promql.types import Scalar, Value


def _simple(fn):
    def impl(ctx: FunctionContext, args: list[Value]) -> Value:
        return map_vector(vector_arg(args[0]), fn)

    return impl


for _name, _fn in {
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "tanh": np.tanh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    # Same operation order as Prometheus: v*pi/180 and v*180/pi.
    "rad": lambda v: v * _math.pi / 180,
    "deg": lambda v: v * 180 / _math.pi,
}.items():
    register(_name)(_simple(_fn))


@register("pi")
def pi(ctx: FunctionContext, args: list[Value]) -> Value:
    return Scalar(np.full(len(ctx.step_times), _math.pi))
