"""Exemplar storage: the trace references that remote write 1.0/2.0 and OpenMetrics attach to samples,
served by ``/api/v1/query_exemplars``.

Semantics follow Prometheus's in-memory exemplar storage (``--enable-feature=exemplar-storage``):
one circular buffer of ``max_exemplars`` entries shared by all series (the oldest is evicted first);
per series, exemplars are kept in timestamp order, so an exemplar older than the series' newest one is
refused as out of order and an identical one (same timestamp, value and labels) is a no-op; an
exemplar's label set may hold at most 128 UTF-8 characters (names plus values). Exemplars are kept
per tenant and are not persisted (as in Prometheus, where they live in memory and the WAL replay
restores them; here a restart starts empty — documented in docs/compatibility.md).

Why hand-written: no library stores exemplars; the structure is a deque per series plus one global
eviction order, O(1) per exemplar, and exemplars are sparse (a few per scrape or request).
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

from storage.labels import Labels
from storage.matchers import Matcher

MAX_LABELS_RUNES = 128  # Prometheus's exemplar.ExemplarMaxLabelSetLength
DEFAULT_MAX_EXEMPLARS = 100_000


@dataclass(frozen=True)
class Exemplar:
    series: Labels  # the sample's series, as the client sent it (before tenant labelling)
    labels: Labels  # the exemplar's own labels, e.g. (("trace_id", "abc"),)
    value: float
    ts: int  # ms


@dataclass
class AddResult:
    added: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    invalid: int = 0


class ExemplarStore:
    def __init__(self, max_exemplars: int = DEFAULT_MAX_EXEMPLARS):
        self.max_exemplars = max(0, int(max_exemplars))
        self._lock = threading.Lock()
        self._series: dict[tuple[str, Labels], deque[Exemplar]] = {}
        self._order: deque[tuple[str, Labels]] = deque()  # global insertion order, for eviction

    def add(self, tenant: str, exemplars: Iterable[Exemplar]) -> AddResult:
        res = AddResult()
        if self.max_exemplars == 0:
            return res
        with self._lock:
            for e in exemplars:
                if sum(len(n) + len(v) for n, v in e.labels) > MAX_LABELS_RUNES:
                    res.invalid += 1
                    continue
                key = (tenant, e.series)
                q = self._series.get(key)
                if q:
                    last = q[-1]
                    if e.ts < last.ts:
                        res.out_of_order += 1
                        continue
                    if e.ts == last.ts:
                        if last.labels == e.labels and (last.value == e.value or (last.value != last.value and e.value != e.value)):
                            res.duplicates += 1
                        else:
                            res.out_of_order += 1  # Prometheus: same timestamp, different exemplar
                        continue
                if q is None:
                    q = self._series[key] = deque()
                q.append(e)
                self._order.append(key)
                res.added += 1
                while len(self._order) > self.max_exemplars:
                    old = self._order.popleft()
                    oq = self._series[old]
                    oq.popleft()  # per series in insertion order, so the global oldest is its first
                    if not oq:
                        del self._series[old]
        return res

    def query(self, tenant: str, matcher_sets: Sequence[Sequence[Matcher]], start_ms: int, end_ms: int
              ) -> list[tuple[Labels, list[Exemplar]]]:
        """Series of ``tenant`` matching any of the matcher sets, with their exemplars in [start, end]."""
        with self._lock:
            items = [(k[1], list(q)) for k, q in self._series.items() if k[0] == tenant]
        out: list[tuple[Labels, list[Exemplar]]] = []
        for series, exs in items:
            d = dict(series)
            if not any(all(m.matches(d.get(m.name, "")) for m in ms) for ms in matcher_sets):
                continue
            hit = [e for e in exs if start_ms <= e.ts <= end_ms]
            if hit:
                out.append((series, hit))
        out.sort(key=lambda p: p[0])
        return out

    def __len__(self) -> int:
        return len(self._order)
