"""The summarizer: an ingest sink that folds every batch into the panes of the adopted SDSs.

``consume(batch)`` maps the batch's K series to each SDS's local ids, then hands the in-scope samples
to the SDS's store in bulk (numpy). A batch that has been through storage carries storage's series id
per series (``SampleBatch.series_ids``; ids are never reused), so the metric name and each SDS's local
id are resolved once per storage id and kept in arrays: a known series costs no Python per batch.
Batches without storage ids (tests, tools) are mapped by label set.

Scrape-shaped batches are small (one target's scrape) and each SDS pays a fixed cost per batch it
folds, so ``consume`` only queues a batch (with the SDSs live at that moment and their fold floors) and
``drain`` folds the queued batches together, when enough samples wait, after ``QUEUE_S`` seconds, and
before anything reads panes (``SDS.coverage`` calls it; so does the backfill before each chunk). What a
batch is folded into, and at which floor, is decided when it arrives: an SDS adopted later never folds
it (its backfill reads it from storage), and an order-independent payload keeps the floor it had then.

Samples are split
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
_UNRESOLVED, _OUT_OF_SCOPE = -1, -2  # entries of the storage id -> local id tables
_NO_FLOOR = np.iinfo(np.int64).max  # an SDS not live when a batch arrived folds none of it


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
        # storage series id -> metric name code (-1: not seen yet); codes index ``_name_codes``
        self._sid_name = np.full(0, -1, np.int32)
        self._name_codes: dict[str, int] = {}
        # per SDS: storage series id -> local id (UNRESOLVED: not looked at yet, OUT_OF_SCOPE)
        self._local_maps: dict[str, np.ndarray] = {}
        self._map_lock = threading.Lock()  # the slow path that resolves new storage ids
        self._targets: tuple[SDS, ...] = ()  # the SDSs live now (rebuilt by add / remove)
        # batches waiting to be folded: (batch, targets, their fold floors then, newest time, oldest time)
        self._queue: list[tuple[SampleBatch, tuple[SDS, ...], tuple[int | None, ...], int, int]] = []
        self._queued_n = 0
        self._queued_at = 0.0
        self._queued_min = _NO_FLOOR  # oldest sample time queued or being folded
        self._queue_lock = threading.Lock()
        self._drain_lock = threading.Lock()
        self._draining = False

    # --- registry of SDSs ------------------------------------------------------------------
    def add(self, sds: SDS) -> None:
        with self.lock:
            self.sds[sds.id] = sds
            if sds.raw_source is None:
                sds.raw_source = self.storage
            self.by_metric.setdefault(sds.metric, []).append(sds)
            self._targets = tuple(x for lst in self.by_metric.values() for x in lst)
            sds.before_read = self.drain_older_than
            if self.max_ts is not None:
                sds.max_ts = self.max_ts

    def remove(self, sds_id: str) -> SDS | None:
        with self.lock:
            sds = self.sds.pop(sds_id, None)
            if sds is not None:
                self.by_metric[sds.metric] = [s for s in self.by_metric.get(sds.metric, []) if s.id != sds_id]
            self._targets = tuple(x for lst in self.by_metric.values() for x in lst)
            self._local_maps.pop(sds_id, None)
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
    QUEUE_SAMPLES = 20_000  # fold the queued batches once this many samples wait ...
    QUEUE_BATCHES = 512
    QUEUE_S = 1.0  # ... or the oldest has waited this long (reads never wait: they drain first)

    def consume(self, batch: SampleBatch) -> None:
        if len(batch) == 0:
            return
        t0 = time.thread_time()
        tmax = int(batch.timestamps.max())
        self.frontier.observe(int(batch.timestamps.min()), tmax)
        # Two clocks: the newest time *seen* advances before the SDS list is read, so an SDS adopted
        # after that read starts live past this batch (which is in storage already: its backfill reads
        # it); each SDS's own newest time -- what seals its panes -- advances only after the batch is
        # folded into it (``drain``), so a read never counts a pane sealed whose samples are on their way.
        self._note_seen(tmax)
        targets = self._targets
        due = False
        if targets:
            floors = tuple(x.fold_floor_ms() for x in targets)
            tmin = int(batch.timestamps.min())
            with self._queue_lock:
                if not self._queue:
                    self._queued_at = time.monotonic()
                self._queued_min = min(self._queued_min, tmin)
                self._queue.append((batch, targets, floors, tmax, tmin))
                self._queued_n += len(batch)
                due = (self._queued_n >= self.QUEUE_SAMPLES or len(self._queue) >= self.QUEUE_BATCHES
                       or time.monotonic() - self._queued_at >= self.QUEUE_S)
        self.cpu_seconds += time.thread_time() - t0
        self.samples += len(batch)
        if due:
            self.drain()

    def drain(self) -> None:
        """Fold every queued batch into the SDSs it was meant for, then advance their newest time.
        Returns once no fold is in flight, so a reader that calls it sees every batch consumed before."""
        if not self._queue and not self._draining:
            return
        with self._drain_lock:
            self._draining = True
            try:
                with self._queue_lock:
                    entries, self._queue, self._queued_n = self._queue, [], 0
                if entries:
                    self._fold_entries(entries)
            finally:
                with self._queue_lock:
                    self._queued_min = min((e[4] for e in self._queue), default=_NO_FLOOR)
                self._draining = False

    def drain_older_than(self, t_ms: int) -> None:
        """``drain`` if a queued (or in-flight) sample is older than ``t_ms``: a reader's sealed panes
        end there, and newer samples only change panes it takes as open."""
        if self._queued_min < t_ms:
            self.drain()

    def flush(self) -> None:
        """Fold everything consumed so far into the panes (queued batches, then each SDS's buffer)."""
        self.drain()
        for sds in self._targets:
            sds.flush_pending()

    def _fold_entries(self, entries: list) -> None:
        t0 = time.thread_time()
        folded = []
        i = 0
        while i < len(entries):  # runs of batches that arrived with the same SDS list
            j = i + 1
            while j < len(entries) and entries[j][1] is entries[i][1]:
                j += 1
            run = entries[i:j]
            targets = run[0][1]
            batch = run[0][0] if len(run) == 1 else SampleBatch.concat([e[0] for e in run])
            positions = self._positions_by_metric(batch, {x.metric for x in targets})
            stale = is_stale(batch.values) if positions else None
            lens = np.fromiter((len(e[0]) for e in run), np.int64, len(run))
            for k, sds in enumerate(targets):
                pos = positions.get(sds.metric)
                if pos is None:
                    continue
                floors = [e[2][k] for e in run]
                if all(f == floors[0] for f in floors):
                    arrival: Any = floors[0]
                else:  # the floor moved (a backfill widened) while these waited: each batch keeps its own
                    arrival = np.repeat(np.array([_NO_FLOOR if f is None else f for f in floors], np.int64), lens)
                if arrival is None:
                    continue
                f0 = sds.flush_cpu_s
                n = self._fold(sds, batch, pos, stale, arrival)
                if n:
                    folded.append((sds, n, f0))
            tmax = max(e[3] for e in run)
            with self.lock:
                for sds in targets:
                    sds.max_ts = max(sds.max_ts, tmax)
            i = j
        dt = time.thread_time() - t0
        if folded:
            # one clock read per drain: the flushes charged themselves, the rest is shared by samples folded
            rest = dt - sum(x.flush_cpu_s - f0 for x, _, f0 in folded)
            total = sum(n for _, n, _ in folded)
            for x, n, _ in folded:
                x.stats.ingest_cpu_s += max(rest, 0.0) * n / total
        self.cpu_seconds += dt

    def _positions_by_metric(self, batch: SampleBatch, wanted: set[str]) -> dict[str, np.ndarray]:
        """Positions in ``batch.series`` of each wanted metric's series (only metrics present)."""
        series = batch.series
        if batch.series_ids is None:  # no storage ids: one pass over the label sets
            by_name: dict[str, list[int]] = {}
            for i, lbl in enumerate(series):
                name = metric_name(lbl)
                if name in wanted:
                    by_name.setdefault(name, []).append(i)
            return {k: np.asarray(v, np.int64) for k, v in by_name.items()}
        sids = np.asarray(batch.series_ids, np.int64)
        if len(sids) == 0:
            return {}
        table = self._sid_name
        if int(sids.max()) >= len(table) or bool((table[sids] < 0).any()):
            table = self._resolve_names(sids, series)
        codes = table[sids]
        out = {}
        for name in wanted:
            code = self._name_codes.get(name)
            if code is not None:
                pos = np.flatnonzero(codes == code)
                if len(pos):
                    out[name] = pos
        return out

    def _resolve_names(self, sids: np.ndarray, series: Sequence) -> np.ndarray:
        """Metric name codes for storage ids not seen before (once per series, ever)."""
        with self._map_lock:
            table = self._sid_name
            top = int(sids.max()) + 1
            if top > len(table):
                grown = np.full(max(top, 2 * len(table), 1024), -1, np.int32)
                grown[: len(table)] = table
                table = grown
            for k in np.flatnonzero(table[sids] < 0).tolist():
                table[sids[k]] = self._name_codes.setdefault(metric_name(series[k]), len(self._name_codes))
            self._sid_name = table
            return table

    def _local_ids(self, sds: SDS, batch: SampleBatch, pos: np.ndarray) -> np.ndarray:
        """The SDS's local id of each series at ``pos`` (-1: out of its scope); registers new ones."""
        series = batch.series
        if batch.series_ids is None:
            index = sds.registry.index
            ids_l = [index.get(series[i], -1) for i in pos.tolist()]
            if -1 in ids_l:
                new = [k for k, x in enumerate(ids_l) if x < 0 and sds.registry.in_scope(series[pos[k]])]
                if new:
                    for k, g in zip(new, sds.register([series[pos[k]] for k in new]).tolist()):
                        ids_l[k] = g
            return np.asarray(ids_l, np.int64)
        sids = np.asarray(batch.series_ids, np.int64)[pos]
        table = self._local_maps.get(sds.id)
        if table is None or int(sids.max()) >= len(table) or bool((table[sids] == _UNRESOLVED).any()):
            table = self._resolve_local(sds, sids, [series[i] for i in pos.tolist()])
        loc = table[sids]
        return np.where(loc >= 0, loc, -1)

    def _resolve_local(self, sds: SDS, sids: np.ndarray, labels: list) -> np.ndarray:
        """Resolve storage ids the SDS has not looked at: known label set, new in-scope series
        (registered), or out of scope (remembered, so it is not checked again)."""
        with self._map_lock:
            table = self._local_maps.get(sds.id, np.full(0, _UNRESOLVED, np.int64))
            top = int(sids.max()) + 1
            if top > len(table):
                grown = np.full(max(top, 2 * len(table), 1024), _UNRESOLVED, np.int64)
                grown[: len(table)] = table
                table = grown
            todo = np.flatnonzero(table[sids] == _UNRESOLVED).tolist()
            index, in_scope = sds.registry.index, sds.registry.in_scope
            new = []
            for k in todo:
                got = index.get(labels[k])
                if got is not None:
                    table[sids[k]] = got
                elif in_scope(labels[k]):
                    new.append(k)
                else:
                    table[sids[k]] = _OUT_OF_SCOPE
            if new:
                table[sids[new]] = sds.register([labels[k] for k in new])
            if sds.id in self.sds:  # a removed SDS keeps no table
                self._local_maps[sds.id] = table
            return table

    def _fold(self, sds: SDS, batch: SampleBatch, pos: np.ndarray, stale: np.ndarray, arrival: Any) -> int:
        """Map the batch onto the SDS's series and buffer its in-scope samples (returns how many); the
        buffer is folded in bulk (``SDS.flush_pending``) every ``FLUSH_SAMPLES`` samples, at pane
        boundaries and before any read of the panes, so scrape-shaped batches do not pay the fold's
        fixed cost each. ``arrival``: the SDS's fold floor when the batch arrived (one, or per sample)."""
        if sds.fold_floor_ms() is None:
            return 0
        ids = self._local_ids(sds, batch, pos)
        m = np.full(len(batch.series), -1, np.int64)
        m[pos] = ids
        sid = m[batch.series_index]
        keep = (sid >= 0) & ~stale
        n = int(keep.sum())
        if n:
            af = arrival[keep] if isinstance(arrival, np.ndarray) else arrival
            sds.offer(sid[keep], batch.timestamps[keep], batch.values[keep], arrival_floor=af)
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
        self.drain()  # live samples must be in their panes before the boundary check below
        sds.flush_pending()
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
            # order-dependent panes (exact) keep each pane's entry pair and the live chain's last value
            chained = not sds.algorithm.order_independent
            live_there = store.has_data(lsid, next_pane - 1) if chained else None
            store.ingest_sorted(sid, ts, vals, live=False)
            if live_there is not None and len(sid):
                fix = ~live_there
                store.fix_entries(lsid[fix], vals[last][fix], next_pane)
            # Series whose live chain has not started yet continue from their newest backfilled sample
            # (chunks run newest first), so the entry pair of their first live pane is exact.
            if len(sid):
                unset = store.last_t[lsid] == np.iinfo(np.int64).min
                store.last_t[lsid[unset]] = ts[last][unset]
                if chained:
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
