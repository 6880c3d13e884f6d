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

Native histograms (``FloatHistogram``) travel in a separate, optional *histogram plane*:
``VectorSteps.hist`` is an object (S, T) array holding a FloatHistogram where a series' sample at
that step is a histogram (``present`` is False there: the float plane never sees histograms), and
``RangeWindows.hist`` holds the histogram samples of the windows in their own CSR
(``HistWindows``). Both are None on the float-only path (always, for the real storage), so float
code stays columnar and untouched; code that does not know histograms simply drops them, which is
what Prometheus does for float-only functions. See promql/eval_histogram.py.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace
from typing import Union

import numpy as np

from storage.labels import Labels


class HistogramError(ValueError):
    """Two histograms cannot be combined (exponential vs custom buckets, other custom bounds)."""


@dataclass(frozen=True)
class FloatHistogram:
    """A native-histogram sample (Prometheus's FloatHistogram), kept minimal.

    Buckets are sparse ``(index, count)`` pairs sorted by index (absolute counts, not deltas).
    Exponential schemas -4..8: bucket ``i`` covers ``(2^((i-1)/2^schema), 2^(i/2^schema)]``.
    Schema -53 = custom buckets: ``custom_values`` are the upper bounds, bucket ``i`` is
    ``(custom_values[i-1], custom_values[i]]`` (index 0 starts at -Inf, index len is +Inf).
    Hand-written: no Python library models Prometheus's native histograms.
    """

    schema: int = 0
    count: float = 0.0
    sum: float = 0.0
    zero_threshold: float = 0.0
    zero_count: float = 0.0
    positive: tuple[tuple[int, float], ...] = ()
    negative: tuple[tuple[int, float], ...] = ()
    custom_values: tuple[float, ...] = ()
    counter_reset_hint: str = "unknown"  # unknown | reset | not_reset | gauge

    @property
    def uses_custom_buckets(self) -> bool:
        return self.schema == -53

    # -- arithmetic (bucket-wise; schemas reconciled by merging to the coarser one) ----------
    def scale(self, f: float) -> "FloatHistogram":
        """Every count and the sum times ``f`` (a negative factor makes it a gauge)."""
        return replace(
            self, count=self.count * f, sum=self.sum * f, zero_count=self.zero_count * f,
            positive=tuple((i, c * f) for i, c in self.positive),
            negative=tuple((i, c * f) for i, c in self.negative),
            counter_reset_hint="gauge" if f < 0 else self.counter_reset_hint,
        )

    def divide(self, f: float) -> "FloatHistogram":
        """Like ``scale(1/f)``; dividing by zero removes the buckets (as Prometheus)."""

        def div(a: float) -> float:
            if f == 0:
                return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a)
            return a / f

        if f == 0:
            return replace(self, count=div(self.count), sum=div(self.sum), zero_count=div(self.zero_count),
                           positive=(), negative=())
        return replace(
            self, count=div(self.count), sum=div(self.sum), zero_count=div(self.zero_count),
            positive=tuple((i, div(c)) for i, c in self.positive),
            negative=tuple((i, div(c)) for i, c in self.negative),
            counter_reset_hint="gauge" if f < 0 else self.counter_reset_hint,
        )

    def merged_hint(self, other: "FloatHistogram") -> tuple[str, bool]:
        """The counter-reset hint of a sum or difference, and whether the two hints collide
        (reset vs not_reset), following Prometheus's rules."""
        a, b = self.counter_reset_hint, other.counter_reset_hint
        if a == b or a == "gauge":
            return a, False
        if b == "gauge":
            return "gauge", False
        if a == "unknown" or b == "unknown":
            return "unknown", False
        return "unknown", True

    def add(self, other: "FloatHistogram", sign: float = 1.0) -> "FloatHistogram":
        """``self + sign * other``; raises HistogramError for exponential with custom buckets.
        Custom buckets with different bounds are reconciled (see ``combine``)."""
        return self.combine(other, sign)[0]

    def combine(self, other: "FloatHistogram", sign: float = 1.0) -> tuple["FloatHistogram", bool]:
        """``self + sign * other`` and whether custom bucket bounds had to be reconciled: two
        custom-bucket histograms with different bounds are both re-binned onto the bounds they
        share (each bucket into the first shared bound at or above its upper bound, +Inf
        otherwise), as Prometheus does, which callers report with an info annotation. Raises
        HistogramError for exponential with custom buckets."""
        if self.uses_custom_buckets != other.uses_custom_buckets:
            raise HistogramError("cannot combine exponential and custom-bucket histograms")
        reconciled = self.uses_custom_buckets and self.custom_values != other.custom_values
        if reconciled:
            bounds = intersect_bounds(self.custom_values, other.custom_values)
            a_pos, b_pos = self.custom_buckets_on(bounds), other.custom_buckets_on(bounds)
            for i, c in b_pos.items():
                a_pos[i] = a_pos.get(i, 0.0) + sign * c
            return FloatHistogram(
                schema=self.schema, count=self.count + sign * other.count, sum=self.sum + sign * other.sum,
                positive=tuple(sorted((i, c) for i, c in a_pos.items() if c != 0)), custom_values=bounds,
                counter_reset_hint=self.merged_hint(other)[0]), True
        return self._add_same_layout(other, sign), False

    def custom_buckets_on(self, bounds: tuple[float, ...]) -> dict[int, float]:
        """The custom buckets re-binned onto ``bounds`` (a subset of this histogram's bounds):
        bucket ``(a, b]`` goes into the first of ``bounds`` at or above ``b``, else into +Inf."""
        cv = self.custom_values
        out: dict[int, float] = {}
        for i, c in self.positive:
            j = bisect.bisect_left(bounds, cv[i]) if i < len(cv) else len(bounds)
            out[j] = out.get(j, 0.0) + c
        return out

    def _add_same_layout(self, other: "FloatHistogram", sign: float) -> "FloatHistogram":
        schema = min(self.schema, other.schema)
        a_pos, a_neg = self._buckets_at(schema)
        b_pos, b_neg = other._buckets_at(schema)
        for i, c in b_pos.items():
            a_pos[i] = a_pos.get(i, 0.0) + sign * c
        for i, c in b_neg.items():
            a_neg[i] = a_neg.get(i, 0.0) + sign * c
        return FloatHistogram(
            schema=schema,
            count=self.count + sign * other.count,
            sum=self.sum + sign * other.sum,
            zero_threshold=max(self.zero_threshold, other.zero_threshold),
            zero_count=self.zero_count + sign * other.zero_count,
            positive=tuple(sorted(a_pos.items())),
            negative=tuple(sorted(a_neg.items())),
            custom_values=self.custom_values,
            counter_reset_hint=self.merged_hint(other)[0],
        )

    def _buckets_at(self, schema: int) -> tuple[dict[int, float], dict[int, float]]:
        """Bucket counts re-binned to a coarser (or the same) exponential schema."""
        d = self.schema - schema if not self.uses_custom_buckets else 0
        pos: dict[int, float] = {}
        neg: dict[int, float] = {}
        for src, dst in ((self.positive, pos), (self.negative, neg)):
            for i, c in src:
                j = ((i - 1) >> d) + 1 if d > 0 else i
                dst[j] = dst.get(j, 0.0) + c
        return pos, neg

    def compact(self) -> "FloatHistogram":
        """Empty buckets removed (Prometheus compares and prints compacted histograms)."""
        return replace(self, positive=tuple(p for p in self.positive if p[1] != 0),
                       negative=tuple(p for p in self.negative if p[1] != 0))

    def equals(self, other: "FloatHistogram") -> bool:
        """Prometheus's FloatHistogram.Equals on compacted histograms (NaN sums equal NaN)."""
        a, b = self.compact(), other.compact()

        def same(x: float, y: float) -> bool:
            return x == y or (math.isnan(x) and math.isnan(y))

        return (a.schema == b.schema and same(a.count, b.count) and same(a.sum, b.sum)
                and a.zero_threshold == b.zero_threshold and same(a.zero_count, b.zero_count)
                and a.positive == b.positive and a.negative == b.negative
                and a.custom_values == b.custom_values)


def intersect_bounds(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
    """The custom bucket bounds two histograms share (both lists ascending)."""
    common = set(a) & set(b)
    return tuple(x for x in a if x in common)


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
    # Histogram plane: object (S, T), a FloatHistogram where the sample is a native histogram
    # (``present`` is False there), None elsewhere. None = no histogram anywhere.
    hist: np.ndarray | None = None

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

    def hist_mask(self) -> np.ndarray | None:
        """bool (S, T): where the sample is a histogram; None when there is none."""
        if self.hist is None:
            return None
        return np.not_equal(self.hist, None)

    def any_present(self) -> np.ndarray:
        """bool (S, T): a float or a histogram sample."""
        hm = self.hist_mask()
        return self.present if hm is None else (self.present | hm)


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
    # Histogram samples of the same series and windows (None: no histogram sample anywhere).
    hist: "HistWindows | None" = None
    # "anchored" / "smoothed" (Prometheus 3.x extended range selectors): [lo, hi) then also holds
    # the samples up to the lookback delta before the window (and after it, smoothed)
    extended: str | None = None

    @property
    def num_series(self) -> int:
        return len(self.labels)

    @property
    def num_steps(self) -> int:
        return self.lo.shape[1]

    def counts(self) -> np.ndarray:
        return self.hi - self.lo


@dataclass
class HistWindows:
    """The native-histogram samples of a RangeWindows' series, CSR like the floats:
    series ``s`` holds ``ts[offsets[s]:offsets[s+1]]`` / ``objs[...]`` (FloatHistogram objects),
    and ``[lo, hi)`` is each (series, step) window's slice."""

    offsets: np.ndarray  # int64 (S+1,)
    ts: np.ndarray  # int64 (N,)
    objs: np.ndarray  # object (N,)
    lo: np.ndarray  # int64 (S, T)
    hi: np.ndarray  # int64 (S, T)
    # Set when ``objs`` carry HistogramStatsIterator hints (see HistogramSet.plain).
    plain: np.ndarray | None = None  # object (N,)

    def counts(self) -> np.ndarray:
        return self.hi - self.lo


@dataclass
class HistogramSet:
    """Native-histogram samples read from a source: S series (sorted by labels) in CSR form."""

    labels: list[Labels]
    offsets: np.ndarray  # int64 (S+1,)
    timestamps: np.ndarray  # int64 (N,)
    hists: np.ndarray  # object (N,) FloatHistogram
    # When only histogram_count/sum/avg read the selection, ``hists`` carry the counter-reset
    # hints Prometheus's HistogramStatsIterator computes (each against the series' previous
    # histogram) and ``plain`` the samples as stored: a sample whose previous one the iterator
    # did not read (outside the window) keeps its stored hint. See promql/eval_histogram.py.
    plain: np.ndarray | None = None  # object (N,)

    @property
    def num_samples(self) -> int:
        return int(self.offsets[-1]) if len(self.offsets) else 0


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
    # CPU other processes spent on this query's behalf (a cluster querier's ingesters, for the parts
    # pushed down to them): what a measured choice between two ways to answer must count too
    remote_cpu_seconds: float = 0.0
    # Which path served each sub-tree (raw / summary:<sds id>), for the query log and `stats`.
    paths: list[str] = field(default_factory=list)
    # Prometheus's totalQueryableSamples: samples loaded summed
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
    # Native-histogram points, only from an Engine built with histogram_results=True (the
    # conformance runner): (labels, [(timestamp ms, FloatHistogram), ...]) per series holding any.
    # Otherwise a histogram in the result is an error (the HTTP API's result types are float-only).
    histograms: list[tuple[Labels, list[tuple[int, FloatHistogram]]]] | None = None
