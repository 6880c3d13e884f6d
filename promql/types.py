"""Columnar values flowing through the evaluator.

Every expression is evaluated once for all T evaluation steps (an instant query has T = 1):

* ``Scalar``       -- values (T,)
* ``StringValue``  -- a string
* ``VectorSteps``  -- an instant vector at every step: S series x T steps, plus a presence mask
                      (absent is not NaN in PromQL)
* ``RangeWindows`` -- a range vector at every step (matrix selector or subquery): the samples of
                      S series in CSR form, and per (series, step) the [lo, hi) slice of samples
                      inside that step's window.

Function implementations (``promql/functions``) and the evaluator (``promql/evaluator.py``) only
exchange these types.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import numpy as np

from storage.labels import Labels


@dataclass
class Scalar:
    values: np.ndarray  # float64 (T,)


@dataclass
class StringValue:
    value: str


@dataclass
class VectorSteps:
    labels: list[Labels]  # S label sets (may repeat until checked; __name__ kept until dropped)
    values: np.ndarray  # float64 (S, T)
    present: np.ndarray  # bool (S, T)
    # Delayed __name__ removal (Prometheus 3): series whose name is to be dropped at the end.
    drop_name: np.ndarray | None = None  # bool (S,) or None = none marked
    # Sample timestamps (int64 ms, S x T) when this came straight from a vector selector;
    # None means "the step time" (what timestamp() returns for computed values).
    sample_ts: np.ndarray | None = None

    @property
    def num_series(self) -> int:
        return len(self.labels)

    @property
    def num_steps(self) -> int:
        return self.values.shape[1]

    @classmethod
    def empty(cls, num_steps: int) -> "VectorSteps":
        return cls([], np.empty((0, num_steps)), np.zeros((0, num_steps), dtype=bool))

    def drop_name_mask(self) -> np.ndarray:
        if self.drop_name is None:
            return np.zeros(len(self.labels), dtype=bool)
        return self.drop_name


@dataclass
class RangeWindows:
    labels: list[Labels]  # S
    offsets: np.ndarray  # int64 (S+1,) CSR offsets into ts/vals
    ts: np.ndarray  # int64 (N,) sample timestamps, per series ascending (stale markers removed)
    vals: np.ndarray  # float64 (N,)
    lo: np.ndarray  # int64 (S, T) first sample index (into ts/vals) inside the window
    hi: np.ndarray  # int64 (S, T) one past the last sample index inside the window
    window_end: np.ndarray  # int64 (T,) right edge (inclusive) of each step's window, after offset/@
    range_ms: int  # window length: window is (window_end - range_ms, window_end]
    drop_name: np.ndarray | None = None  # bool (S,)

    @property
    def num_series(self) -> int:
        return len(self.labels)

    @property
    def num_steps(self) -> int:
        return self.lo.shape[1]

    def counts(self) -> np.ndarray:
        return self.hi - self.lo


Value = Union[Scalar, StringValue, VectorSteps, RangeWindows]


@dataclass
class Annotations:
    """Warnings and infos, rendered as Prometheus's API does ("PromQL info: ... (line:col)")."""

    warnings: list[str] = field(default_factory=list)
    infos: list[str] = field(default_factory=list)

    def warn(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)

    def info(self, msg: str) -> None:
        if msg not in self.infos:
            self.infos.append(msg)


@dataclass
class QueryStats:
    samples_scanned: int = 0
    series_touched: int = 0
    peak_samples: int = 0
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    # Which path served each sub-tree (raw / summary:<sds id>), for the query log and `stats`.
    paths: list[str] = field(default_factory=list)
    # (added by the engine, engineer A) Prometheus's totalQueryableSamples: samples loaded summed
    # over the evaluation steps (a sample counts once per step whose window holds it), and the
    # same per top-level step as (step_times int64 (T,), counts int64 (T,)).
    total_queryable_samples: int = 0
    samples_per_step: tuple[np.ndarray, np.ndarray] | None = None


@dataclass
class QueryResult:
    """Final result of a query, ready for the HTTP layer.

    result_type: "vector" | "matrix" | "scalar" | "string".
    For "vector" (instant query): labels (S) and values (S,) -- every series present, in result
    order (sort() etc. respected). ``timestamp`` is the evaluation time (ms).
    For "matrix": labels (S) sorted, ``timestamps`` (T,) and values (S, T) with ``present`` mask.
    For "matrix" from an *instant* query (a range selector or subquery at top level), the raw points
    are ragged: ``csr = (offsets (S+1,), ts (N,), vals (N,))`` and values/present are None.
    For "scalar": ``scalar`` float and ``timestamp``; for "string": ``string`` and ``timestamp``.
    For a range query the result type is always "matrix" (a scalar becomes one series with no labels).
    """

    result_type: str
    labels: list[Labels] = field(default_factory=list)
    values: np.ndarray | None = None
    present: np.ndarray | None = None
    timestamps: np.ndarray | None = None
    csr: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    timestamp: int = 0
    scalar: float = 0.0
    string: str = ""
    annotations: Annotations = field(default_factory=Annotations)
    stats: QueryStats = field(default_factory=QueryStats)
