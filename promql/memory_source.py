"""In-memory SampleSource: series held as sorted numpy arrays, for the promqltest runner, tests
and benchmarks.

Writes accumulate per series; the first ``select`` after a write freezes everything into one CSR
layout (all samples of series ``i`` at ``ts[off[i]:off[i+1]]``) plus an inverted label index, so
a read is a few vectorised ``searchsorted`` calls over a composite (series, time) key rather than
a Python loop over series or samples.

Native-histogram samples (``add_histograms``, used by the conformance runner for ``{{...}}``
values) live in a second, histogram-only store whose float values are indices into an object
table, and are read with ``select_histograms`` (the optional HistogramSource extension of
promql/source.py). ``HistogramOverlay`` adds such a store to any float source.
"""
from __future__ import annotations

import threading
from typing import Iterable, Sequence

import numpy as np

from storage.batch import SampleBatch
from storage.labels import Labels
from storage.matchers import Matcher
from storage.series_set import SeriesSet

from promql.types import FloatHistogram, HistogramSet

# Composite key layout: series rank in the high bits, time (shifted to be non-negative) below.
_TIME_BITS = 43
_TIME_SHIFT = 1 << 42  # times in [-2^42, 2^42) ms, i.e. roughly years 1830..2109
_MAX_SERIES_FOR_KEY = 1 << (63 - _TIME_BITS)


class MemorySource:
    """A SampleSource (promql/source.py) over in-memory arrays.

    ``add_series`` / ``append`` add samples (a later write of the same series and timestamp wins);
    ``select`` returns matching series sorted by labels, samples with mint <= t <= maxt. Stale
    markers are returned as stored (bit-exact); the evaluator decides what they mean. Writes and
    reads may come from different threads (a test's writer beside its queries): one lock orders them,
    so a read never sees the time column of one freeze and the value column of another.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._pending: dict[Labels, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._frozen_labels: list[Labels] = []  # sorted by labels
        self._off = np.zeros(1, np.int64)
        self._ts = np.empty(0, np.int64)
        self._vals = np.empty(0, np.float64)
        self._keys: np.ndarray | None = None
        self._index: dict[str, dict[str, np.ndarray]] = {}
        self._dirty = False
        self._hstore: MemorySource | None = None  # histogram samples: values index self._hobjs
        self._hobjs: list[FloatHistogram] = []
        self._hobj_array: np.ndarray | None = None

    # -- writes ---------------------------------------------------------------------------
    def add_series(self, labels: Labels, timestamps: np.ndarray | Sequence[int], values: np.ndarray | Sequence[float]) -> None:
        ts = np.asarray(timestamps, dtype=np.int64)
        vs = np.asarray(values, dtype=np.float64)
        if ts.shape != vs.shape:
            raise ValueError("timestamps and values must have the same length")
        with self._lock:
            self._pending.setdefault(labels, []).append((ts, vs))
            self._dirty = True

    def add_histograms(self, labels: Labels, timestamps: np.ndarray | Sequence[int], hists: Sequence[FloatHistogram]) -> None:
        """Add native-histogram samples of one series (a later write of the same timestamp wins)."""
        ts = np.asarray(timestamps, dtype=np.int64)
        if ts.shape != (len(hists),):
            raise ValueError("timestamps and histograms must have the same length")
        with self._lock:
            if self._hstore is None:
                self._hstore = MemorySource()
            base = len(self._hobjs)
            self._hobjs.extend(hists)
            self._hobj_array = None
            self._hstore.add_series(labels, ts, np.arange(base, base + len(hists), dtype=np.float64))

    @property
    def has_histograms(self) -> bool:
        return self._hstore is not None

    def select_histograms(self, matchers: Sequence[Matcher], mint: int, maxt: int) -> HistogramSet | None:
        """Histogram samples with mint <= t <= maxt (series sorted by labels); None when none."""
        with self._lock:
            if self._hstore is None:
                return None
            ss = self._hstore.select(matchers, mint, maxt)
            if ss.num_samples == 0:
                return None
            if self._hobj_array is None:
                arr = np.empty(len(self._hobjs), dtype=object)
                arr[:] = self._hobjs
                self._hobj_array = arr
            return HistogramSet(ss.labels, ss.offsets, ss.timestamps, self._hobj_array[ss.values.astype(np.int64)])

    def append(self, batch: SampleBatch) -> int:
        """Add a SampleBatch (the ingest path's format); returns the number of samples taken."""
        if len(batch) == 0:
            return 0
        order = np.argsort(batch.series_index, kind="stable")
        sidx = batch.series_index[order]
        cuts = np.flatnonzero(np.diff(sidx)) + 1
        starts = np.concatenate(([0], cuts))
        ends = np.concatenate((cuts, [len(sidx)]))
        with self._lock:  # a read sees the whole batch or none of it
            for a, b in zip(starts.tolist(), ends.tolist()):  # per series, not per sample
                sel = order[a:b]
                self.add_series(batch.series[int(sidx[a])], batch.timestamps[sel], batch.values[sel])
        return len(batch)

    def clear(self) -> None:
        self.__init__()

    def close(self) -> None:  # Storage-protocol nicety
        pass

    # -- reads ----------------------------------------------------------------------------
    @property
    def labels(self) -> list[Labels]:
        with self._lock:
            self._freeze()
            return list(self._frozen_labels)

    @property
    def num_samples(self) -> int:
        with self._lock:
            self._freeze()
            return int(self._off[-1])

    def series(self, matcher_sets: Sequence[Sequence[Matcher]], mint: int, maxt: int) -> list[Labels]:
        """Series with samples in [mint, maxt] matching any of the matcher sets (the Storage protocol's
        ``series``), sorted by labels."""
        found: set[Labels] = set()
        for ms in matcher_sets:
            ss = self.select(ms, mint, maxt)
            found.update(lbl for lbl, n in zip(ss.labels, np.diff(ss.offsets).tolist()) if n)
        return sorted(found)

    def select(self, matchers: Sequence[Matcher], mint: int, maxt: int) -> SeriesSet:
        with self._lock:
            return self._select(matchers, mint, maxt)

    def _select(self, matchers: Sequence[Matcher], mint: int, maxt: int) -> SeriesSet:
        self._freeze()
        n = len(self._frozen_labels)
        if n == 0 or maxt < mint:
            return SeriesSet.empty()
        mask = np.ones(n, dtype=bool)
        for m in matchers:
            mask &= self._match(m, n)
            if not mask.any():
                return SeriesSet.empty()
        ids = np.flatnonzero(mask)
        if self._keys is not None:
            lo = np.searchsorted(self._keys, (ids << _TIME_BITS) + (max(mint, -_TIME_SHIFT) + _TIME_SHIFT), "left")
            hi = np.searchsorted(self._keys, (ids << _TIME_BITS) + (min(maxt, _TIME_SHIFT - 1) + _TIME_SHIFT), "right")
        else:  # too many series for the composite key: per-series search
            lo = np.array([self._off[i] + np.searchsorted(self._ts[self._off[i]:self._off[i + 1]], mint, "left") for i in ids], np.int64)
            hi = np.array([self._off[i] + np.searchsorted(self._ts[self._off[i]:self._off[i + 1]], maxt, "right") for i in ids], np.int64)
        lens = hi - lo
        keep = lens > 0
        ids, lo, lens = ids[keep], lo[keep], lens[keep]
        offsets = np.zeros(len(ids) + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        total = int(offsets[-1])
        # gather index: lo[s] + (0..lens[s]-1) for every selected series, without a Python loop
        gather = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1] - lo, lens)
        return SeriesSet([self._frozen_labels[i] for i in ids.tolist()], offsets, self._ts[gather], self._vals[gather])

    # -- internals ------------------------------------------------------------------------
    def _match(self, m: Matcher, n: int) -> np.ndarray:
        postings = self._index.get(m.name, {})
        mask = np.zeros(n, dtype=bool)
        for value, ids in postings.items():  # per distinct label value
            if m.matches(value):
                mask[ids] = True
        if m.matches_empty:
            has = np.zeros(n, dtype=bool)
            for ids in postings.values():
                has[ids] = True
            mask |= ~has
        return mask

    def _freeze(self) -> None:
        if not self._dirty:
            return
        merged: dict[Labels, tuple[np.ndarray, np.ndarray]] = {}
        for i, lbl in enumerate(self._frozen_labels):
            a, b = int(self._off[i]), int(self._off[i + 1])
            merged[lbl] = (self._ts[a:b], self._vals[a:b])
        for lbl, parts in self._pending.items():
            chunks = ([merged[lbl]] if lbl in merged else []) + parts
            ts = np.concatenate([c[0] for c in chunks])
            vs = np.concatenate([c[1] for c in chunks])
            # stable sort by time, then keep the last write per timestamp
            order = np.argsort(ts, kind="stable")
            ts, vs = ts[order], vs[order]
            last = np.ones(len(ts), dtype=bool)
            last[:-1] = ts[1:] != ts[:-1]
            merged[lbl] = (ts[last], vs[last])
        self._pending = {}
        labels = sorted(merged)
        self._frozen_labels = labels
        lens = np.array([len(merged[l][0]) for l in labels], np.int64)
        self._off = np.zeros(len(labels) + 1, np.int64)
        np.cumsum(lens, out=self._off[1:])
        self._ts = np.concatenate([merged[l][0] for l in labels]) if labels else np.empty(0, np.int64)
        self._vals = np.concatenate([merged[l][1] for l in labels]) if labels else np.empty(0, np.float64)
        if len(labels) < _MAX_SERIES_FOR_KEY and (len(self._ts) == 0 or (self._ts.min() >= -_TIME_SHIFT and self._ts.max() < _TIME_SHIFT)):
            sid = np.repeat(np.arange(len(labels), dtype=np.int64), lens)
            self._keys = (sid << _TIME_BITS) + (self._ts + _TIME_SHIFT)
        else:
            self._keys = None
        index: dict[str, dict[str, list[int]]] = {}
        for i, lbl in enumerate(labels):
            for name, value in lbl:
                index.setdefault(name, {}).setdefault(value, []).append(i)
        self._index = {k: {v: np.asarray(ids, np.int64) for v, ids in d.items()} for k, d in index.items()}
        self._dirty = False


class HistogramOverlay:
    """A float source plus a histogram store: ``select`` reads ``floats``, ``select_histograms``
    reads ``histograms``; every other attribute is the float source's."""

    def __init__(self, floats: object, histograms: MemorySource) -> None:
        self.floats = floats
        self.histograms = histograms

    def select(self, matchers: Sequence[Matcher], mint: int, maxt: int) -> SeriesSet:
        return self.floats.select(matchers, mint, maxt)  # type: ignore[attr-defined]

    @property
    def has_histograms(self) -> bool:
        return self.histograms.has_histograms

    def select_histograms(self, matchers: Sequence[Matcher], mint: int, maxt: int) -> HistogramSet | None:
        return self.histograms.select_histograms(matchers, mint, maxt)

    def __getattr__(self, name: str) -> object:
        return getattr(self.floats, name)


def from_series(items: Iterable[tuple[Labels, Sequence[int], Sequence[float]]]) -> MemorySource:
    src = MemorySource()
    for lbl, ts, vs in items:
        src.add_series(lbl, ts, vs)
    return src
