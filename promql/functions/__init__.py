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

import enum
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from promql.types import Annotations, Value


@dataclass
class FunctionContext:
    step_times: np.ndarray  # int64 (T,) evaluation timestamps (ms) of this (sub)evaluation
    annotations: Annotations
    node: Any  # the promql.parser.Call node (args' AST: e.g. absent() reads the selector's matchers)
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


class Histograms(enum.Enum):
    """What the evaluator does when a function's arguments carry native-histogram samples
    (promql/eval_histogram.py ``call_with_histograms`` switches on it)."""

    FLOATS_ONLY = "floats_only"  # histogram samples are ignored; over a range vector: refused
    READS = "reads"  # the implementation reads the histogram plane / windows itself
    UNSUPPORTED = "unsupported"  # refused with an error
    PROPERTY = "property"  # one float per histogram sample: ``FunctionSpec.histogram_property``
    NATIVE = "native"  # classic buckets by the implementation, native histograms beside it
    QUANTILES = "quantiles"  # histogram_quantiles: several native quantiles at once
    PRESENCE = "presence"  # a histogram sample counts as a present sample (absent, timestamp)
    ABSENT_RANGE = "absent_range"  # absent_over_time: histogram samples count as samples
    LABELS = "labels"  # label-only functions: every sample, float or histogram, is carried through
    FLOATS_MIXED_INFO = "floats_mixed_info"  # floats only, an info for windows mixing both kinds
    EXTRAPOLATED = "extrapolated"  # rate/increase/delta: a histogram per histogram-only window
    INSTANT_PAIR = "instant_pair"  # irate/idelta: from the last two samples
    CHANGES = "changes"  # changes between samples of either kind
    RESETS = "resets"  # counter resets between samples of either kind


@dataclass(frozen=True)
class FunctionSpec:
    """Everything the evaluator knows about one PromQL function, in one place.

    * ``sorts`` -- the function orders its result; over a range query Prometheus warns that the
      ordering is ineffective.
    * ``cross_series`` -- the function combines all series of its range-vector argument, so the
      evaluator may not split that argument into blocks of series.
    * ``histograms`` -- what histogram samples in the arguments do (``Histograms``).
    * ``keeps_name`` -- False: the evaluator marks every output series' metric name for removal, as
      Prometheus does for functions computing a new value. True: names stay as the implementation
      marks them (functions passing samples through, and those whose output has no name of its
      own: ``vector``, ``absent``, date functions without an argument).
    * ``experimental`` -- Prometheus gates the function behind ``--enable-feature=promql-experimental-functions``.
    """

    name: str
    impl: FunctionImpl
    sorts: bool = False
    cross_series: bool = False
    histograms: Histograms = Histograms.FLOATS_ONLY
    keeps_name: bool = False
    experimental: bool = False
    histogram_property: Callable[[Any], float] | None = None

    def __call__(self, ctx: FunctionContext, args: list[Value]) -> Value:
        return self.impl(ctx, args)


FUNCTIONS: dict[str, FunctionSpec] = {}
_loaded = False


def register(*names: str, sorts: bool = False, cross_series: bool = False,
             histograms: Histograms = Histograms.FLOATS_ONLY, keeps_name: bool = False,
             experimental: bool = False, histogram_property: Callable[[Any], float] | None = None,
             ) -> Callable[[FunctionImpl], FunctionImpl]:
    """Register ``impl`` under each of ``names`` with one ``FunctionSpec`` per name."""
    def deco(fn: FunctionImpl) -> FunctionImpl:
        for n in names:
            if n in FUNCTIONS:
                raise ValueError(f"PromQL function {n!r} registered twice")
            FUNCTIONS[n] = FunctionSpec(n, fn, sorts, cross_series, histograms, keeps_name, experimental,
                                        histogram_property)
        return fn

    return deco


def load_all() -> dict[str, FunctionSpec]:
    """Import every module of this package so their ``register`` entries fill FUNCTIONS."""
    global _loaded
    if not _loaded:
        import importlib
        import pkgutil

        for mod in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{mod.name}")
        _loaded = True
    return FUNCTIONS
