"""The summarizer: an ingest sink that folds every batch into the panes of the adopted SDSs.

``consume(batch)`` maps the batch's K series to each SDS's local ids once (per-series Python, cached
by label set), then hands the in-scope samples to the SDS's store in bulk (numpy). Samples are split
between the live path and backfill by time: live takes ``t >= live_from_ts``, backfill reads everything
older from raw storage, so no sample is counted twice. Late samples (not newer than their series' last
folded sample, or older than the live start but inside the history the backfill has already folded)
are folded too: into sketch panes directly, or by rebuilding the exact panes they touch from raw
storage (``planner/late_samples.py``). ``backfill`` runs newest chunk first and widens coverage as it goes.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Sequence

import numpy as np

from planner.sds import SDS
from planner.step_answers import WriteFrontier
from storage.batch import SampleBatch
from storage.labels import metric_name
from storage.stale import is_stale

log = logging.getLogger("turboprom.planner")

BACKFILL_CHUNK_PANES = 240


class Summarizer:
    def __init__(self, storage: Any = None, frontier: WriteFrontier | None = None):
        self.storage = storage
        self.frontier = frontier if frontier is not None else WriteFrontier(10_000)  # what step answers rely on
        self.sds: dict[str, SDS] = {}
        self.by_metric: dict[str, list[SDS]] = {}
        self.max_ts: int | None = None
        self.lock = threading.RLock()
        self.cpu_seconds = 0.0
        self.samples = 0
        self._name_cache: dict[tuple, str] = {}

    # --- registry of SDSs ------------------------------------------------------------------
    def add(self, sds: SDS) -> None:
        with self.lock:
            self.sds[sds.id] = sds
            if sds.raw_source is None:
                sds.raw_source = self.storage
            self.by_metric.setdefault(sds.metric, []).append(sds)
            if self.max_ts is not None:
                sds.max_ts = self.max_ts

    def remove(self, sds_id: str) -> SDS | None:
        with self.lock:
            sds = self.sds.pop(sds_id, None)
            if sds is not None:
                self.by_metric[sds.metric] = [s for s in self.by_metric.get(sds.metric, []) if s.id != sds_id]
            return sds

    def note_time(self, ts: int) -> None:
        with self.lock:
            self.max_ts = ts if self.max_ts is None else max(self.max_ts, ts)
            for s in self.sds.values():
                s.max_ts = max(s.max_ts, self.max_ts)

    def _note_seen(self, ts: int) -> None:
        with self.lock:
            self.max_ts = ts if self.max_ts is None else max(self.max_ts, ts)

    # --- ingest sink -----------------------------------------------------------------------
    def consume(self, batch: SampleBatch) -> None:
        if len(batch) == 0:
            return
        t0 = time.thread_time()
        tmax = int(batch.timestamps.max())
        self.frontier.observe(int(batch.timestamps.min()), tmax)
        # Two clocks: the newest time *seen* advances before the SDS list is read, so an SDS adopted
        # after that read starts live past this batch (which is in storage already: its backfill reads
        # it); each SDS's own newest time -- what seals its panes -- advances only after the batch is
        # buffered into it, so a read in between never counts a pane sealed whose samples are on their way.
        self._note_seen(tmax)
        with self.lock:
            targets = [s for lst in self.by_metric.values() for s in lst]
        if targets:
            by_name: dict[str, list[int]] = {}
            for i, lbl in enumerate(batch.series):  # one pass per batch (per series, not per sample)
                by_name.setdefault(metric_name(lbl), []).append(i)
            stale = is_stale(batch.values) if any(s.metric in by_name for s in targets) else None
            folded = []
            for sds in targets:
                pos = by_name.get(sds.metric)
                if pos:
                    f0 = sds.flush_cpu_s
                    n = self._fold(sds, batch, pos, stale)
                    if n:
                        folded.append((sds, n, f0))
            if folded:
                # one clock read per batch (a thread_time call per plan per batch cost more than the
                # mapping): the flushes charged themselves, the rest is shared by samples folded
                rest = time.thread_time() - t0 - sum(x.flush_cpu_s - f0 for x, _, f0 in folded)
                total = sum(n for _, n, _ in folded)
                for x, n, _ in folded:
                    x.stats.ingest_cpu_s += max(rest, 0.0) * n / total
        with self.lock:
            for sds in targets:
                sds.max_ts = max(sds.max_ts, tmax)
        self.cpu_seconds += time.thread_time() - t0
        self.samples += len(batch)

    def _fold(self, sds: SDS, batch: SampleBatch, pos: list[int], stale: np.ndarray) -> int:
        """Map the batch onto the SDS's series and buffer its in-scope samples (returns how many); the
        buffer is folded in bulk (``SDS.flush_pending``) every ``FLUSH_SAMPLES`` samples, at pane
        boundaries and before any read of the panes, so scrape-shaped batches do not pay the fold's
        fixed cost each."""
        floor = sds.fold_floor_ms()
        if floor is None:
            return 0
        index = sds.registry.index
        series = batch.series
        ids_l = [index.get(series[i], -1) for i in pos]  # known series: one dict lookup each
        if -1 in ids_l:
            new = [k for k, x in enumerate(ids_l) if x < 0 and sds.registry.in_scope(series[pos[k]])]
            if new:
                got = sds.register([series[pos[k]] for k in new])
                for k, g in zip(new, got.tolist()):
                    ids_l[k] = g
        m = np.full(len(series), -1, np.int64)
        m[np.asarray(pos, np.int64)] = ids_l
        sid = m[batch.series_index]
        ts = batch.timestamps
        keep = (sid >= 0) & ~stale
        n = int(keep.sum())
        if n:
            sds.offer(sid[keep], ts[keep], batch.values[keep])
        return n

    # --- adoption & backfill -----------------------------------------------------------------
    def start_live(self, sds: SDS, live_from_ts: int | None = None) -> None:
        """Live ingestion for ``sds`` starts at ``live_from_ts`` (default: just after the newest sample seen)."""
        if live_from_ts is None:
            live_from_ts = (self.max_ts + 1) if self.max_ts is not None else int(time.time() * 1000)
        sds.live_from = int(live_from_ts)
        self.add(sds)

    def backfill(self, sds: SDS, history_ms: int, stop: threading.Event | None = None) -> None:
        """Fill panes [live_from - history, live_from) from raw storage, newest chunk first.

        Coverage (``cov_lo``) widens after each chunk, so the SDS serves recent windows early.
        """
        if self.storage is None or sds.live_from is None:
            sds.cov_lo = (sds.live_from // sds.spec.pane_ms + 1) if sds.live_from is not None else None
            sds.end_backfill("done")
            return
        P = sds.spec.pane_ms
        live_pane = sds.live_from // P
        lo_pane = (sds.live_from - history_ms) // P
        sds.backfill_total = live_pane + 1 - lo_pane
        sds.backfill_done = 0
        sds.backfill_state = "running"
        hi = live_pane + 1  # chunk [c_lo, hi); the first chunk ends with the pane holding live_from
        scope = sds.spec.scope_matchers()
        chunk = BACKFILL_CHUNK_PANES
        while hi > lo_pane:
            if stop is not None and stop.is_set():
                sds.end_backfill("stopped")
                return
            c_lo = max(lo_pane, hi - chunk)
            mint = c_lo * P
            maxt = min(hi * P, sds.live_from) - 1
            ss = self.storage.select(scope, mint, maxt)
            # empty stretches (before the data starts) are skipped with growing chunks: O(log) reads
            chunk = BACKFILL_CHUNK_PANES if ss.num_samples else chunk * 4
            self._fold_history(sds, ss, hi)
            sds.backfill_done += hi - c_lo
            sds.widen(c_lo)
            hi = c_lo
        sds.end_backfill("done")

    def _fold_history(self, sds: SDS, ss: Any, next_pane: int) -> None:
        sds.flush_pending()  # live samples must be in their panes before the boundary check below
        t0 = time.thread_time()
        if len(ss) == 0:
            return
        ids = sds.register(ss.labels)
        sid = np.repeat(ids, np.diff(ss.offsets))
        ts, vals = ss.timestamps, ss.values
        keep = ~is_stale(vals)
        sid, ts, vals = sid[keep], ts[keep], vals[keep]
        order = np.lexsort((ts, sid))
        sid, ts, vals = sid[order], ts[order], vals[order]
        store = sds.store
        with store.lock:
            last = np.ones(len(sid), bool)
            last[:-1] = sid[1:] != sid[:-1]
            lsid = sid[last]
            # A series whose boundary pane (next_pane - 1) already holds live samples gets this chunk
            # prepended to that pane (combine accounts for the pair); the others' next pane needs its
            # entry pair fixed from this chunk's last sample.
            live_there = store.has_data(lsid, next_pane - 1) if hasattr(store, "has_data") else None
            store.ingest_sorted(sid, ts, vals, live=False)
            if live_there is not None and len(sid):
                fix = ~live_there
                store.fix_entries(lsid[fix], vals[last][fix], next_pane)
            # Series whose live chain has not started yet continue from their newest backfilled sample
            # (chunks run newest first), so the entry pair of their first live pane is exact.
            if len(sid):
                unset = store.last_t[lsid] == np.iinfo(np.int64).min
                store.last_t[lsid[unset]] = ts[last][unset]
                if hasattr(store, "last_v"):
                    store.last_v[lsid[unset]] = vals[last][unset]
        sds.stats.backfill_cpu_s += time.thread_time() - t0  # one-time: kept apart from the live fold
        sds.stats.backfilled_samples += len(ts)

    def adopt(self, sds: SDS, history_ms: int, background: bool = True) -> threading.Thread | None:
        self.start_live(sds)
        if not background:
            self.backfill(sds, history_ms)
            return None
        th = threading.Thread(target=self._safe_backfill, args=(sds, history_ms), name=f"backfill-{sds.id}", daemon=True)
        th.start()
        return th

    def _safe_backfill(self, sds: SDS, history_ms: int) -> None:
        try:
            self.backfill(sds, history_ms)
        except Exception:  # noqa: BLE001 - keep the server up; the SDS simply never covers
            log.exception("backfill of %s failed", sds.id)
            sds.end_backfill("failed")

    def describe(self) -> dict[str, Any]:
        return {"cpu_seconds": self.cpu_seconds, "samples": self.samples, "max_ts": self.max_ts,
                "sds": sorted(self.sds)}


def names_of(series: Sequence) -> list[str]:
    return [metric_name(l) for l in series]
