"""A querier's congestion tracker, fed from the ingesters: ``GET /api/v1/congestion``, its stream and
KedgeFlow's congestion policy answer through a querier as on a single node.

On a single node the tracker is an ingest sink. A querier sees no writes, and no one ingester holds a
whole instance's signal families (series are spread over partitions by their labels). So every
``period_s`` the querier selects the families the tracker reads (``schema.SIGNAL_BY_SAMPLE_NAME``)
from the ingesters, one owner per partition like any read, from a little before the newest sample it
has seen (``overlap_s``: samples that reach an ingester late still arrive) to now, and hands them to
its tracker as one batch. The tracker keeps only samples newer than what each series already has, so
the overlap is never counted twice. Default tenant only, as on a single node. The querier's tracker
does not write its signals back (it stores nothing); the ingesters' trackers see their own series.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any, Callable

import numpy as np

from scheduler_metrics.schema import SIGNAL_BY_SAMPLE_NAME
from storage.batch import SampleBatch
from storage.matchers import Matcher
from storage.series_set import SeriesSet

log = logging.getLogger("turboprom.cluster")


class CongestionFeed:
    def __init__(self, select: Callable[[list[Matcher], int, int], SeriesSet], tracker: Any, *, period_s: float = 1.0,
                 overlap_s: float = 5.0, first_window_s: float = 120.0):
        self.select, self.tracker = select, tracker
        self.period_s, self.overlap_ms, self.first_window_ms = period_s, int(overlap_s * 1000), int(first_window_s * 1000)
        self.matchers = [Matcher("__name__", "=~", "|".join(re.escape(n) for n in sorted(SIGNAL_BY_SAMPLE_NAME)))]
        self.newest: int | None = None  # the newest sample time fed so far
        self.samples_fed = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def pull_once(self, now_ms: int | None = None) -> int:
        """Select what arrived since the last pull (with the overlap) and feed it; returns samples fed."""
        now = int(time.time() * 1000) if now_ms is None else int(now_ms)
        mint = now - self.first_window_ms if self.newest is None else self.newest - self.overlap_ms
        ss = self.select(self.matchers, mint, now)
        if not ss.num_samples:
            return 0
        index = np.repeat(np.arange(len(ss.labels), dtype=np.int64), np.diff(ss.offsets))
        self.tracker.consume(SampleBatch(list(ss.labels), index, ss.timestamps, ss.values))
        self.newest = max(self.newest or 0, int(ss.timestamps.max()))
        self.samples_fed += ss.num_samples
        return ss.num_samples

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self.period_s):
            try:
                self.pull_once()
                failing = False
            except Exception as e:  # noqa: BLE001 - ingesters down or catching up: the next pull tries again
                if not failing:
                    log.warning("congestion feed: no signals from the ingesters (%s); retrying every %gs", e, self.period_s)
                failing = True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="congestion-feed", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
