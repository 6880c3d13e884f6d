"""The PromQL range functions a summary can serve: one table entry each (``SERVED``).

An entry holds what the rewrite, the scans and the planner need to know of a function:

* ``family``: ``"exact"`` (moments + counter panes, ``planner/algorithms/exact.py``) or ``"quantile"``
  (quantile sketches: REQ for a literal tail phi >= ``req_min_phi``, KLL otherwise);
* ``needs``: the raw-edge statistics it reads (``planner/raw_segments.py`` computes only those);
* ``keeps_name``: the result keeps ``__name__`` (``last_over_time`` / ``first_over_time``);
* ``window_heavy``: raw evaluation costs O(samples in the window) per step (the others are O(samples)
  per query with prefix sums / first-last), which the per-sub-tree cost check uses;
* ``finish(st, shift, plan)``: (values, present) from the merged segment statistics of each window
  (present: a sample in the window; two for rate/increase/delta);
* ``precise(st, shift)``: whether ``finish`` is within the exactness bound on those statistics (moment sums
  that left the float range or cancel too much: the raw path answers the sub-tree instead).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from planner.algorithms import exact as ex

_ORDER = frozenset({"count", "first_t", "first_v", "last_t", "last_v"})
_MOMENTS = frozenset({"count", "nnan", "npinf", "nninf", "s1", "vmin", "vmax"})  # min/max: constant windows
REQ_MIN_PHI = 0.9  # quantile_over_time with a literal phi >= this is a REQ candidate (planner.req_min_phi)


@dataclass(frozen=True)
class ServedFunction:
    name: str
    family: str
    needs: frozenset[str] = frozenset()
    keeps_name: bool = False
    window_heavy: bool = False
    finish: Callable[[ex.SegStats, np.ndarray, Any], tuple[np.ndarray, np.ndarray]] | None = None  # (values, present)
    # whether ``finish`` is within the exactness bound on these merged stats (False: the raw path answers)
    precise: Callable[[ex.SegStats, np.ndarray], bool] | None = None  # (merged stats, per-series shift)


def _rate_like(is_counter: bool, is_rate: bool) -> Callable[[ex.SegStats, np.ndarray, Any], tuple[np.ndarray, np.ndarray]]:
    def finish(st: ex.SegStats, shift: np.ndarray, plan: Any) -> tuple[np.ndarray, np.ndarray]:
        range_s = float((plan.end - plan.start)[0]) / 1000.0 if len(plan.end) else 1.0
        return ex.extrapolated_rate(st, plan.start[None, :].astype(np.float64), plan.end[None, :].astype(np.float64),
                                    range_s, is_counter=is_counter, is_rate=is_rate)
    return finish


def _n(st: ex.SegStats) -> np.ndarray:
    return st.count.astype(np.float64)


def _per_sample(value: Callable[[ex.SegStats, np.ndarray], np.ndarray]) -> Callable[[ex.SegStats, np.ndarray, Any], tuple]:
    """A function present wherever the window holds a sample."""
    return lambda st, shift, plan: (value(st, shift), st.count > 0)


SERVED: dict[str, ServedFunction] = {f.name: f for f in (
    ServedFunction("count_over_time", "exact", frozenset({"count"}), finish=_per_sample(lambda st, c: _n(st))),
    ServedFunction("present_over_time", "exact", frozenset({"count"}), finish=_per_sample(lambda st, c: np.ones_like(_n(st)))),
    ServedFunction("sum_over_time", "exact", _MOMENTS, window_heavy=True, finish=_per_sample(lambda st, c: ex.sum_values(st, c)),
                   precise=ex.sum_precise),
    ServedFunction("avg_over_time", "exact", _MOMENTS, window_heavy=True,
                   finish=_per_sample(lambda st, c: ex.sum_values(st, c) / _n(st)), precise=ex.sum_precise),
    ServedFunction("stdvar_over_time", "exact", _MOMENTS | {"s2"}, window_heavy=True, finish=_per_sample(lambda st, c: ex.variance(st)),
                   precise=ex.variance_precise),
    ServedFunction("stddev_over_time", "exact", _MOMENTS | {"s2"}, window_heavy=True,
                   finish=_per_sample(lambda st, c: np.sqrt(ex.variance(st))), precise=ex.variance_precise),
    ServedFunction("min_over_time", "exact", frozenset({"count", "vmin"}), window_heavy=True, finish=_per_sample(lambda st, c: st.vmin)),
    ServedFunction("max_over_time", "exact", frozenset({"count", "vmax"}), window_heavy=True, finish=_per_sample(lambda st, c: st.vmax)),
    ServedFunction("last_over_time", "exact", _ORDER, keeps_name=True, finish=_per_sample(lambda st, c: st.last_v)),
    ServedFunction("first_over_time", "exact", _ORDER, keeps_name=True, finish=_per_sample(lambda st, c: st.first_v)),
    ServedFunction("delta", "exact", _ORDER, finish=_rate_like(False, False)),
    ServedFunction("rate", "exact", _ORDER | {"corr"}, finish=_rate_like(True, True)),
    ServedFunction("increase", "exact", _ORDER | {"corr"}, finish=_rate_like(True, False)),
    ServedFunction("resets", "exact", _ORDER | {"resets"}, finish=_per_sample(lambda st, c: st.resets.astype(np.float64))),
    ServedFunction("changes", "exact", _ORDER | {"changes"}, finish=_per_sample(lambda st, c: st.changes.astype(np.float64))),
    ServedFunction("quantile_over_time", "quantile", window_heavy=True),
)}

ALL_NEEDS = frozenset().union(*(f.needs for f in SERVED.values()))


def algorithm_for(func: str, phi: float | None = None, req_min_phi: float = REQ_MIN_PHI) -> str | None:
    """The per-series algorithm serving ``func`` (for quantile_over_time: REQ for a literal tail phi,
    else KLL), or None when no summary serves it."""
    f = SERVED.get(func)
    if f is None:
        return None
    if f.family == "exact":
        return "exact"
    if phi is not None and req_min_phi <= phi <= 1.0:
        return "req"
    return "kll"
