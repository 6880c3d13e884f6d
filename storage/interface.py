"""What the rest of the system may ask of storage. ``storage.tsdb.TSDB`` implements it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from storage.batch import SampleBatch
from storage.labels import Labels
from storage.matchers import Matcher
from storage.series_set import SeriesSet


@dataclass
class AppendResult:
    """Outcome of one append. ``accepted`` samples are durable (WAL written) when returned."""

    accepted: int = 0
    duplicates: int = 0  # same series+timestamp+value: idempotent, counted but not an error
    rejected: dict[str, int] = field(default_factory=dict)  # reason -> count
    errors: list[str] = field(default_factory=list)  # first few human-readable reasons
    # bool per batch sample, in batch order: True = stored by this append; False = rejected, or a
    # duplicate (already stored, or repeated earlier in the same batch). None = not computed.
    accepted_mask: np.ndarray | None = None
    # Storage series id of each entry of ``batch.series`` (int64), None = not computed.
    series_ids: np.ndarray | None = None
    # When samples were rejected: the time bounds (int64 ms) that applied, for messages that say which
    # window refused them: "retention_min" (older is beyond retention), "min_valid_time" (the end of the
    # persisted range), "ooo_min" (the out-of-order window's start), "ooo_window_ms", "retention_ms".
    bounds: dict[str, int] = field(default_factory=dict)

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


class Storage(Protocol):
    def append(self, batch: SampleBatch) -> AppendResult: ...

    def select(self, matchers: Sequence[Matcher], mint: int, maxt: int) -> SeriesSet:
        """Samples with mint <= t <= maxt (ms, inclusive) of series matching all matchers."""
        ...

    def series(self, matcher_sets: Sequence[Sequence[Matcher]], mint: int, maxt: int) -> list[Labels]:
        """Label sets of series (matching any of the sets) with samples in [mint, maxt]."""
        ...

    def label_names(self, mint: int, maxt: int, matcher_sets: Sequence[Sequence[Matcher]] = ()) -> list[str]: ...

    def label_values(self, name: str, mint: int, maxt: int, matcher_sets: Sequence[Sequence[Matcher]] = ()) -> list[str]: ...

    def delete_series(self, matcher_sets: Sequence[Sequence[Matcher]], mint: int, maxt: int) -> int: ...

    def tsdb_status(self, matchers: Sequence[Matcher], limit: int = 10) -> dict:
        """Prometheus's /api/v1/status/tsdb data over the matching series (storage/status.py)."""
        ...

    def head_stats_of(self, matchers: Sequence[Matcher]) -> dict:
        """Head samples, time range and share of block bytes of the matching series."""
        ...

    def close(self) -> None: ...
