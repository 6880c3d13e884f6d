"""The engine's data source interface: raw storage today, summaries later (planner swaps sub-trees)."""
from __future__ import annotations

from typing import Protocol, Sequence

from storage.matchers import Matcher
from storage.series_set import SeriesSet


class SampleSource(Protocol):
    def select(self, matchers: Sequence[Matcher], mint: int, maxt: int) -> SeriesSet:
        """Samples with mint <= t <= maxt (int64 ms, inclusive), series sorted by labels."""
        ...


class HistogramSource(Protocol):
    """Optional extension a source that also holds native
    histogram samples (the in-memory source the conformance runner loads ``{{...}}`` into).
    The evaluator calls it only when the source has the method; the real storage is float-only
    and does not."""

    def select_histograms(self, matchers: Sequence[Matcher], mint: int, maxt: int):  # -> promql.types.HistogramSet | None
        """Histogram samples with mint <= t <= maxt, series sorted by labels; None when none."""
        ...
