"""absent() and absent_over_time(): one series (labels from the selector's equality matchers)
at the steps where the argument has nothing."""
from __future__ import annotations

from typing import Any

import numpy as np

from promql.functions import FunctionContext, Histograms, register
from promql.types import RangeWindows, Value, VectorSteps
from storage.labels import METRIC_NAME, Labels, make_labels


def absent_labels(arg: Any) -> Labels:
    """Labels Prometheus gives absent()'s output: each label matched exactly once with "=";
    a label constrained any other way (or twice) is left out."""
    vs = getattr(arg, "vector_selector", None) or arg
    matchers = getattr(getattr(vs, "matchers", None), "matchers", None)
    if matchers is None or type(vs).__name__ != "VectorSelector":
        return ()
    out: dict[str, str] = {}
    has: set[str] = set()
    for m in matchers:
        if m.name == METRIC_NAME:
            continue
        if str(m.op).endswith("Equal") and not str(m.op).endswith("NotEqual") and m.name not in has:
            out[m.name] = m.value
            has.add(m.name)
        else:
            out.pop(m.name, None)
    return make_labels(out)


def _absent_at(ctx: FunctionContext, missing: np.ndarray, drop_name: bool) -> VectorSteps:
    node_args = getattr(ctx.node, "args", None) or []
    labels = absent_labels(node_args[0]) if node_args else ()
    if not missing.any():
        return VectorSteps.empty(len(missing))
    return VectorSteps([labels], np.ones((1, len(missing))), missing[None, :].copy(), np.array([drop_name]))


@register("absent", histograms=Histograms.PRESENCE, keeps_name=True)
def absent(ctx: FunctionContext, args: list[Value]) -> Value:
    vec = args[0]
    assert isinstance(vec, VectorSteps)
    missing = ~vec.present.any(axis=0) if vec.num_series else np.ones(vec.num_steps, dtype=bool)
    return _absent_at(ctx, missing, False)


@register("absent_over_time", histograms=Histograms.ABSENT_RANGE, cross_series=True)
def absent_over_time(ctx: FunctionContext, args: list[Value]) -> Value:
    rw = args[0]
    assert isinstance(rw, RangeWindows)
    n = rw.hi - rw.lo
    missing = ~(n > 0).any(axis=0) if rw.num_series else np.ones(rw.num_steps, dtype=bool)
    return _absent_at(ctx, missing, True)
