"""vector(scalar) and scalar(vector)."""
from __future__ import annotations

import numpy as np

from promql.functions import FunctionContext, register
from promql.functions.common import scalar_arg, vector_arg
from promql.types import Scalar, Value, VectorSteps


@register("vector", keeps_name=True)
def vector(ctx: FunctionContext, args: list[Value]) -> Value:
    vals = scalar_arg(args[0], len(ctx.step_times))
    T = len(vals)
    return VectorSteps([()], vals.reshape(1, T).copy(), np.ones((1, T), dtype=bool), np.zeros(1, dtype=bool))


@register("scalar")
def scalar(ctx: FunctionContext, args: list[Value]) -> Value:
    vec = vector_arg(args[0])
    T = vec.num_steps
    if vec.num_series == 0:
        return Scalar(np.full(T, np.nan))
    cnt = vec.present.sum(axis=0)
    first = np.argmax(vec.present, axis=0)
    vals = vec.values[first, np.arange(T)]
    return Scalar(np.where(cnt == 1, vals, np.nan))
