"""The engine's data source interface: raw storage today, summaries later (planner swaps sub-trees)."""
from __future__ import annotations

from typing import Protocol, Sequence

from storage.matchers import Matcher
from storage.series_set import SeriesSet


class SampleSource(Protocol):
    def select(self, matchers: Sequence[Matcher], mint: int, maxt: int) -> SeriesSet:
        """Samples with mint <= t <= maxt (int64 ms, inclusive), series sorted by labels."""
        ...
