"""The columnar batch every ingest path produces and every sink consumes."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from storage.labels import DEFAULT_TENANT, Labels


@dataclass
class MetricMetadata:
    metric_family: str
    type: str = "unknown"  # counter, gauge, histogram, summary, untyped/unknown, ...
    help: str = ""
    unit: str = ""


@dataclass(frozen=True)
class SeriesRefColumn:
    """References of a batch's series in a reference space of the ingest path (one per series,
    parallel to ``SampleBatch.series``). ``space`` is that space's identity: storage remembers
    reference -> series id per space (weakly), so a known series is found without its labels."""

    space: object
    refs: np.ndarray  # int64, shape (K,)


@dataclass
class SampleBatch:
    """N samples over K distinct series.

    ``series`` lists the K canonical label sets; ``series_index[i]`` says which of them sample i
    belongs to. ``timestamps`` are int64 ms, ``values`` float64 (stale NaN kept bit-exact).
    """

    series: list[Labels]
    series_index: np.ndarray  # int32/int64, shape (N,)
    timestamps: np.ndarray  # int64, shape (N,)
    values: np.ndarray  # float64, shape (N,)
    metadata: list[MetricMetadata] = field(default_factory=list)
    tenant: str = DEFAULT_TENANT
    # Storage's series id of each entry of ``series`` (int64, shape (K,)), set by the ingest pipeline
    # on the batch it hands to sinks, so a sink resolves each series once per id instead of hashing
    # label sets per batch. None when the batch has not been through storage.
    series_ids: np.ndarray | None = None
    series_refs: SeriesRefColumn | None = None  # set by ingest paths that know their series by reference

    def __post_init__(self) -> None:
        self.series_index = np.asarray(self.series_index, dtype=np.int64)
        self.timestamps = np.asarray(self.timestamps, dtype=np.int64)
        self.values = np.asarray(self.values, dtype=np.float64)
        n = len(self.timestamps)
        if len(self.series_index) != n or len(self.values) != n:
            raise ValueError("SampleBatch columns must have equal length")

    def __len__(self) -> int:
        return len(self.timestamps)

    @classmethod
    def concat(cls, batches: list["SampleBatch"]) -> "SampleBatch":
        """One batch holding several of one tenant: series lists joined (a series may appear more than
        once), metadata joined, storage ids kept when every part has them (references are per request
        space and are dropped: storage then resolves the joined batch by labels)."""
        if len(batches) == 1:
            return batches[0]
        offsets = np.cumsum([0] + [len(b.series) for b in batches[:-1]]).astype(np.int64)
        lens = np.fromiter((len(b) for b in batches), np.int64, len(batches))
        ids = None
        if all(b.series_ids is not None for b in batches):
            ids = np.concatenate([np.asarray(b.series_ids, np.int64) for b in batches])
        return cls([s for b in batches for s in b.series],
                   np.concatenate([b.series_index for b in batches]) + np.repeat(offsets, lens),
                   np.concatenate([b.timestamps for b in batches]), np.concatenate([b.values for b in batches]),
                   metadata=[m for b in batches for m in b.metadata], tenant=batches[0].tenant, series_ids=ids)

    @classmethod
    def empty(cls) -> "SampleBatch":
        return cls([], np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))

    @classmethod
    def from_series(cls, items: list[tuple[Labels, np.ndarray, np.ndarray]], tenant: str = DEFAULT_TENANT) -> "SampleBatch":
        """Build from (labels, timestamps, values) per series (tests, simulators, rule outputs)."""
        if not items:
            return cls.empty()
        series = [lbl for lbl, _, _ in items]
        lens = np.array([len(ts) for _, ts, _ in items], dtype=np.int64)
        idx = np.repeat(np.arange(len(items), dtype=np.int64), lens)
        ts = np.concatenate([np.asarray(t, dtype=np.int64) for _, t, _ in items])
        vs = np.concatenate([np.asarray(v, dtype=np.float64) for _, _, v in items])
        return cls(series, idx, ts, vs, tenant=tenant)
