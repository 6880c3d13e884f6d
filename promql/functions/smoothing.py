"""double_exponential_smoothing (Prometheus 3's name for holt_winters), via the per-position
window kernel (the recurrence is sequential)."""
from __future__ import annotations

import numpy as np

from promql.errors import ExecutionError
from promql.functions import FunctionContext, Histograms, register
from promql.functions.common import iterate_window_positions, scalar_arg, scatter_back, window_vector, windows_arg
from promql.types import Value


def _go_f(x: float) -> str:
    """Go's %f: six decimals, infinities as +Inf/-Inf."""
    x = float(x)
    if np.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return f"{x:f}"


@register("holt_winters", histograms=Histograms.FLOATS_MIXED_INFO)
@register("double_exponential_smoothing", histograms=Histograms.FLOATS_MIXED_INFO, experimental=True)
def double_exponential_smoothing(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = windows_arg(args[0])
    T = rw.num_steps
    sf_t = scalar_arg(args[1], T)
    tf_t = scalar_arg(args[2], T)
    n = rw.hi - rw.lo
    active_steps = (n > 0).any(axis=0)
    # Prometheus refuses sf <= 0 || sf >= 1 (likewise tf): a NaN factor passes that test and
    # yields NaN results, it is not an error.
    with np.errstate(invalid="ignore"):
        bad_sf = active_steps & ((sf_t <= 0) | (sf_t >= 1))
        bad_tf = active_steps & ((tf_t <= 0) | (tf_t >= 1))
    if bad_sf.any():
        raise ExecutionError(f"invalid smoothing factor. Expected: 0 < sf < 1, got: {_go_f(sf_t[bad_sf][0])}")
    if bad_tf.any():
        raise ExecutionError(f"invalid trend factor. Expected: 0 < tf < 1, got: {_go_f(tf_t[bad_tf][0])}")
    order, it = iterate_window_positions(rw.lo, n)
    W = order.size
    step_of = order % T if T else order
    sf = sf_t[step_of] if W else np.zeros(0)
    tf = tf_t[step_of] if W else np.zeros(0)
    s0 = np.zeros(W)
    s1 = np.zeros(W)
    b = np.zeros(W)
    vals = np.asarray(rw.vals, dtype=np.float64)
    with np.errstate(all="ignore"):
        for k, m, idx in it:
            f = vals[idx]
            if k == 0:
                s1[:m] = f
                continue
            if k == 1:
                b[:m] = f - s1[:m]
            else:
                b[:m] = tf[:m] * (s1[:m] - s0[:m]) + (1 - tf[:m]) * b[:m]
            x = sf[:m] * f
            y = (1 - sf[:m]) * (s1[:m] + b[:m])
            s0[:m] = s1[:m]
            s1[:m] = x + y
    out = scatter_back(order, s1, n.shape)
    return window_vector(rw, out, n >= 2)
