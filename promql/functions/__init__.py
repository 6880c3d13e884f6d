"""PromQL function table: one entry per function name, each a small function found by its name.

An implementation receives a ``FunctionContext`` and the already evaluated arguments (in the
order of the call) and returns a ``Value`` (see ``promql/types.py``). It never loops over samples
or steps in Python: it works on whole (S, T) matrices / CSR windows with numpy.

Conventions shared with the evaluator:
* A function that removes the metric name in Prometheus keeps ``__name__`` in ``labels`` and sets
  ``drop_name[s] = True`` (Prometheus 3 delayed name removal); the evaluator strips marked names
  where Prometheus does (end of evaluation, before label matching in aggregations/binary ops).
* Steps where a series has no output are ``present == False`` (value ignored).
* Annotations (warnings/infos) go to ``ctx.annotations`` worded exactly as Prometheus words them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from promql.types import Annotations, Value


@dataclass
class FunctionContext:
    step_times: np.ndarray  # int64 (T,) evaluation timestamps (ms) of this (sub)evaluation
    annotations: Annotations
    node: Any  # the promql_parser.Call node (args' AST: e.g. absent() reads the selector's matchers)
    lookback_delta_ms: int = 300_000
    # Query-level bounds, for start()/end()/step()/range() style helpers.
    query_start_ms: int = 0
    query_end_ms: int = 0
    query_step_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    # Source positions (1-based line, 1-based column) of the call itself and of each argument's
    # first character, so annotations can end in " (line:col)" like Prometheus's API renders them
    # (e.g. rate()'s "metric might not be a counter" names args[0]'s position, sort()'s range-query
    # warning the call's). None when the evaluator does not know them: the suffix is then omitted.
    position: tuple[int, int] | None = None
    arg_positions: list[tuple[int, int]] | None = None

    def pos(self, arg: int | None = None) -> str:
        """The " (line:col)" suffix for argument ``arg`` (or for the call when None); "" if unknown."""
        if arg is None:
            p = self.position
        else:
            p = self.arg_positions[arg] if self.arg_positions and arg < len(self.arg_positions) else None
        return f" ({p[0]}:{p[1]})" if p and p[0] > 0 and p[1] > 0 else ""


FunctionImpl = Callable[[FunctionContext, list[Value]], Value]

FUNCTIONS: dict[str, FunctionImpl] = {}


def register(*names: str) -> Callable[[FunctionImpl], FunctionImpl]:
    def deco(fn: FunctionImpl) -> FunctionImpl:
        for n in names:
            FUNCTIONS[n] = fn
        return fn

    return deco


def load_all() -> dict[str, FunctionImpl]:
    """Import every module of this package so their @register entries fill FUNCTIONS."""
    import importlib
    import pkgutil

    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")
    return FUNCTIONS
