"""TSDB: the embedded time-series store behind ``storage.interface.Storage``.

Write path: append(batch) -> ids for the batch's label sets -> vectorized validation (head.prepare)
-> WAL record (series + samples, columnar) -> head. Background maintenance cuts the head into
Parquet blocks, compacts blocks, applies retention and truncates the WAL behind a checkpoint.

Read path: matchers -> ids (inverted index) -> row ranges of those ids in the head's sorted runs and
in the decoded row groups of the blocks overlapping the time range -> laid out straight into CSR,
series ordered by labels (storage/select_csr.py); where some series' rows interleave between
sources (out-of-order data, a head cut in progress), one (sid, ts) sort + dedupe instead.

Threading: one write lock serialises appends, head cuts and deletions; readers never take it (they
snapshot immutable arrays under short locks), so queries run in worker threads while ingest appends.
"""
from __future__ import annotations

import logging
import shutil
import threading
import time
from itertools import compress
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import orjson

from storage import metrics as M
from storage.backfill import BackfillError, BackfillResult, drop_repeats, first_where, in_intervals, sorted_rows, split_ranges
from storage.batch import SampleBatch
from storage.block import Block, BlockGone, UnreadableBlock, parse_labels_json, write_block
from storage.catalog import write_catalog
from storage.columns import INT64_MAX, INT64_MIN, dedupe_sorted, find_keys, group_bounds, merge_sorted_parts, ranges_index, sort_by_series_time, unique
from storage.head import Head
from storage.index import SeriesIndex
from storage.interface import AppendResult
from storage.labels import Labels, format_labels
from storage.status import tsdb_status
from storage.matchers import Matcher
from storage.options import StorageOptions
from storage.select_csr import build_csr
from storage.series_set import SeriesSet
from storage.head_replay import replay_head
from storage.wal import WAL

log = logging.getLogger("turboprom.storage")
_LABEL_ORDER_MAX_IDS = 1 << 20  # ids held by the label-order cache (about 16 MB)


class TSDB:
    def __init__(self, path: str, options: StorageOptions | None = None, *, background: bool = True,
                 maintenance_interval_s: float = 5.0) -> None:
        self.path = Path(path)
        self.options = options or StorageOptions()
        self.path.mkdir(parents=True, exist_ok=True)
        self.index = SeriesIndex()
        self.head = Head()
        self._wlock = threading.RLock()  # appends, cuts, deletions, block list changes
        self._blocks_lock = threading.Lock()
        self._blocks: list[Block] = []
        # Blocks skipped at start-up (unreadable): exposed in status/tsdb, a metric and query warnings.
        self.unreadable_blocks: list[UnreadableBlock] = []
        self._closed = False
        self.min_valid_time = INT64_MIN
        self._cut_hold: Callable[[], int | None] | None = None  # see hold_cuts
        self._maint_lock = threading.Lock()  # one maintenance pass at a time
        self._json_ids: dict[str, int] = {}
        self._label_orders: dict[bytes, tuple[np.ndarray | None, list[Labels]]] = {}  # see _label_order
        self._label_order_ids = 0
        self._load_blocks()
        if self._blocks:
            self._catalog_changed()
        self.wal = WAL(self.path / "wal", segment_bytes=self.options.wal_segment_bytes, fsync=self.options.wal_fsync)
        self._replay()
        self.wal.open_for_append()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._maintenance_interval_s = maintenance_interval_s
        self._update_gauges()
        if background:
            self._thread = threading.Thread(target=self._maintenance_loop, name="tsdb-maintenance", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------------------------------
    # write path
    # ------------------------------------------------------------------------------------------

    def append(self, batch: SampleBatch) -> AppendResult:
        if self._closed:
            raise RuntimeError("storage is closed")
        res = AppendResult()
        if len(batch) == 0:
            return res
        opts = self.options
        with self._wlock:
            if self._closed:
                raise RuntimeError("storage is closed")
            ids, created = self.index.ids_for(batch.series, batch.series_refs)
            self.head.ensure(len(self.index))
            sid = ids[batch.series_index]
            now = int(time.time() * 1000)
            retention_min = self._retention_min(batch.timestamps, now)
            prep = self.head.prepare(sid, batch.timestamps, batch.values, now_ms=now,
                                     future_tolerance_ms=opts.future_tolerance_ms, ooo_window_ms=opts.out_of_order_window_ms,
                                     min_valid_time=self.min_valid_time, lookup_persisted=self._lookup_persisted,
                                     retention_min=retention_min)
            if created:
                M.SERIES_CREATED.inc(len(created))
            seq = 0
            if len(prep.sid):
                seq = self.wal.log_samples(prep.sid, prep.ts, prep.val, self.index.labels)
                self.head.commit(prep.sid, prep.ts, prep.val)
        if seq:
            self.wal.sync(seq)  # group commit: concurrent appenders share one fsync
        res.accepted = len(prep.sid)
        res.accepted_mask = prep.accepted_mask(len(batch))
        res.series_ids = ids
        res.duplicates = prep.duplicates
        res.rejected = prep.rejected
        if prep.rejected:
            res.bounds = {"retention_min": int(retention_min), "retention_ms": opts.retention_ms,
                          "min_valid_time": int(self.min_valid_time), "ooo_window_ms": opts.out_of_order_window_ms,
                          "ooo_min": int(self.head.maxt - opts.out_of_order_window_ms) if self.head.maxt != INT64_MIN else INT64_MIN}
        for reason, pos, _ in prep.examples:
            lbl = batch.series[int(batch.series_index[pos])]
            res.errors.append(f"{reason.replace('_', ' ')}: {format_labels(lbl)} @ {int(batch.timestamps[pos])}")
        if res.accepted:
            M.APPENDED.inc(res.accepted)
            M.HEAD_SAMPLES.set(self.head.num_samples)
        if res.duplicates:
            M.DUPLICATES.inc(res.duplicates)
        for reason, c in prep.rejected.items():
            M.REJECTED.labels(reason).inc(c)
        return res

    def _retention_min(self, ts: np.ndarray, now_ms: int) -> int:
        """Oldest timestamp retention keeps once ``ts`` is stored (INT64_MIN: no time retention).
        Retention is measured back from the newest sample in the store, this batch included (its
        samples not too far in the future): older samples would be deleted at the next pass."""
        if self.options.retention_ms <= 0 or len(ts) == 0:
            return INT64_MIN
        newest = max(self.head.maxt, self._blocks_maxt)
        bmax = int(ts.max())
        if bmax > now_ms + self.options.future_tolerance_ms:
            ok = ts[ts <= now_ms + self.options.future_tolerance_ms]
            bmax = int(ok.max()) if len(ok) else INT64_MIN
        newest = max(newest, bmax)
        return INT64_MIN if newest == INT64_MIN else newest - self.options.retention_ms

    @property
    def _blocks_maxt(self) -> int:
        blocks = self._blocks_snapshot()
        return max((b.maxt for b in blocks), default=INT64_MIN)

    def history_block_range(self) -> tuple[int, int]:
        """(range ms, level) of the blocks an import writes: the largest compaction level, so the
        compactor has nothing left to merge in a finished import."""
        ranges = self._compaction_ranges()
        return (ranges[-1], len(ranges) + 1) if ranges else (self.options.block_duration_ms, 1)

    def import_history(self, batch: SampleBatch, progress=None) -> BackfillResult:
        """Write historical samples straight into blocks (storage/backfill.py). All or nothing:
        raises BackfillError before writing anything when a sample is refused. ``progress(blocks
        written, blocks to write)`` is called as blocks are written."""
        if self._closed:
            raise RuntimeError("storage is closed")
        res = BackfillResult()
        if len(batch) == 0:
            return res
        opts = self.options
        with self._maint_lock:  # no head cut, compaction or retention pass in between
            with self._wlock:
                ids, created = self.index.ids_for(batch.series)
                self.head.ensure(len(self.index))
                head_min = int(self.head.mint) if self.head.num_samples else INT64_MAX
                newest = max(int(self.head.maxt), self._blocks_maxt)
            if created:
                M.SERIES_CREATED.inc(len(created))
            s, t, v, pos = sorted_rows(ids[batch.series_index], batch.timestamps, batch.values)
            now = int(time.time() * 1000)
            bounds = {"retention_ms": opts.retention_ms, "head_min": head_min,
                      "future_max": now + opts.future_tolerance_ms, "future_tolerance_ms": opts.future_tolerance_ms}
            if opts.future_tolerance_ms > 0:
                fut = t > now + opts.future_tolerance_ms
                if fut.any():
                    raise BackfillError("too_far_in_future", "more than the future tolerance ahead of the wall clock",
                                        first_where(fut, pos), int(fut.sum()), bounds)
            s, t, v, pos, res.duplicates = drop_repeats(s, t, v, pos)
            if opts.retention_ms > 0:
                cutoff = max(newest, int(t.max())) - opts.retention_ms
                bounds["retention_min"] = cutoff
                old = t < cutoff
                if old.any():
                    raise BackfillError("beyond_retention", "older than the retention window", first_where(old, pos),
                                        int(old.sum()), bounds)
            live = t >= head_min
            if live.any():
                raise BackfillError("in_head_range", "at or after the oldest sample in the head", first_where(live, pos),
                                    int(live.sum()), bounds)
            # Samples inside existing blocks' ranges: exact repeats are dropped, other values refused.
            inb = in_intervals(t, [(b.mint, b.maxt) for b in self._blocks_snapshot()])
            if inb.any():
                cand = np.flatnonzero(inb)
                found, bits = self._lookup_persisted(s[cand], t[cand])
                hit = found >= 0
                if hit.any():
                    same = bits[found[hit]] == v[cand[hit]].view(np.uint64)
                    if not same.all():
                        bad = np.zeros(len(t), dtype=bool)
                        bad[cand[hit][~same]] = True
                        raise BackfillError("duplicate_timestamp", "a different value than the sample already stored at "
                                            "that series and timestamp", first_where(bad, pos), int(bad.sum()), bounds)
                    keep = np.ones(len(t), dtype=bool)
                    keep[cand[hit]] = False
                    res.duplicates += int(hit.sum())
                    s, t, v, pos = s[keep], t[keep], v[keep], pos[keep]
            res.written = np.zeros(len(batch), dtype=bool)
            res.written[pos] = True
            range_ms, level = self.history_block_range()
            res.block_range_ms = range_ms
            res.samples, res.series = int(len(t)), int(len(np.unique(s)))
            todo = int(len(np.unique(t // np.int64(range_ms)))) if len(t) else 0
            new: list[Block] = []
            try:
                for _, bs, bt, bv in split_ranges(s, t, v, range_ms):
                    new.append(Block(write_block(self.blocks_dir, self.index.labels, bs, bt, bv, level=level), self._global_ids))
                    M.BLOCKS_WRITTEN.inc()
                    if progress is not None:
                        progress(len(new), todo)
            except BaseException:
                for b in new:  # a failed import leaves no block behind
                    b.remove()
                raise
            with self._wlock:
                with self._blocks_lock:
                    self._blocks = sorted(self._blocks + new, key=lambda x: (x.mint, x.maxt))
                if new:
                    # appends older than the imported range are checked against the blocks (repeats, conflicts)
                    self.min_valid_time = max(self.min_valid_time, max(b.maxt for b in new) + 1)
            for b in new:
                log.info("imported block %s [%d, %d]: %d samples, %d series", b.id, b.mint, b.maxt, b.num_samples, b.num_series)
            res.blocks = [{"id": b.id, "minTime": b.mint, "maxTime": b.maxt, "numSamples": b.num_samples,
                           "numSeries": b.num_series} for b in new]
            self._catalog_changed()
            self._update_gauges()
        return res

    # ------------------------------------------------------------------------------------------
    # read path
    # ------------------------------------------------------------------------------------------

    def _blocks_snapshot(self) -> list[Block]:
        with self._blocks_lock:
            return list(self._blocks)

    def select(self, matchers: Sequence[Matcher], mint: int, maxt: int) -> SeriesSet:
        n = len(self.index)
        sids = self.index.match_ids(matchers, n)
        if len(sids) == 0 or mint > maxt:
            return SeriesSet.empty()
        for attempt in range(5):
            try:
                return self._select_ids(sids, mint, maxt)
            except BlockGone:  # a compaction replaced a block under us: read the new block list
                if attempt == 4:
                    raise
        raise AssertionError("unreachable")

    def _select_ids(self, sids: np.ndarray, mint: int, maxt: int) -> SeriesSet:
        # The head first, then the blocks: a head cut adds its block before it truncates the head,
        # so rows being persisted are seen in one or both (merged without repeats), never in neither.
        segs = self.head.segments(sids, mint, maxt)
        token = object()  # this read's row-group cache token (storage/block.py _RowGroupCache)
        for b in self._blocks_snapshot():
            if b.maxt >= mint and b.mint <= maxt:
                segs.extend(b.segments(sids, mint, maxt, token))
        if not segs:
            return SeriesSet.empty()
        segs.sort(key=lambda sg: sg.tmin)  # stable: a block's row groups keep their order
        order, lbls = self._label_order(sids)
        csr = build_csr(segs, len(sids), order)
        if csr is None:  # some series' rows interleave between sources: sort + dedupe
            return self._select_ids_merged(sids, mint, maxt)
        lbls = list(compress(lbls, csr.present.tolist())) if csr.present is not None else list(lbls)  # the cache's stays
        return SeriesSet(lbls, csr.offsets, csr.ts, csr.val)

    def _label_order(self, sids: np.ndarray) -> tuple[np.ndarray | None, list[Labels]]:
        """Positions of ``sids`` in label order (None: already) and their labels in that order.
        Cached per id set: dashboards and the planner select the same series again and again, and
        an id's labels never change (ids are never reused). Bounded by the ids it holds."""
        ck = sids.tobytes()
        hit = self._label_orders.get(ck)
        if hit is not None:
            return hit
        labels_all = self.index.labels
        lbls = [labels_all[i] for i in sids.tolist()]
        perm = sorted(range(len(lbls)), key=lbls.__getitem__)
        if perm == list(range(len(lbls))):
            hit = (None, lbls)
        else:
            hit = (np.asarray(perm, dtype=np.int64), [lbls[i] for i in perm])
        if len(sids) <= _LABEL_ORDER_MAX_IDS:
            if self._label_order_ids + len(sids) > _LABEL_ORDER_MAX_IDS:
                self._label_orders.clear()
                self._label_order_ids = 0
            self._label_orders[ck] = hit
            self._label_order_ids += len(sids)
        return hit

    def _select_ids_merged(self, sids: np.ndarray, mint: int, maxt: int) -> SeriesSet:
        """The generic read: rows of head and blocks as (sid, ts) parts, one sort + dedupe where
        they interleave, then series ordered by labels."""
        parts = []
        s, t, v = self.head.gather(sids, mint, maxt)
        if len(s):
            parts.append((s, t, v))
        for b in self._blocks_snapshot():
            if b.maxt >= mint and b.mint <= maxt:
                s, t, v = b.gather(sids, mint, maxt)
                if len(s):
                    parts.append((s, t, v))
        if not parts:
            return SeriesSet.empty()
        return self._to_series_set(*merge_sorted_parts(parts))

    def _lookup_persisted(self, sid: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Samples (sid, ts), sorted by sid then ts, looked up in the blocks: index into the returned
        value bits, or -1. Only for samples older than the persisted range (rare: backfill, retries)."""
        u = unique(sid, is_sorted=True)
        lo, hi = int(ts.min()), int(ts.max())
        for attempt in range(5):
            try:
                parts = [b.gather(u, lo, hi) for b in self._blocks_snapshot() if b.maxt >= lo and b.mint <= hi]
                break
            except BlockGone:  # a compaction replaced a block: look again in the new block list
                if attempt == 4:
                    raise
        bs, bt, bv = merge_sorted_parts(parts)
        return find_keys(sid, ts, bs, bt), bv.view(np.uint64)

    def _to_series_set(self, s: np.ndarray, t: np.ndarray, v: np.ndarray) -> SeriesSet:
        u, starts, ends = group_bounds(s)
        p, lbls = self._label_order(u)
        if p is not None:
            idx = ranges_index(starts[p], ends[p])
            t, v = t[idx], v[idx]
            lens = (ends - starts)[p]
        else:
            lens = ends - starts
        lbls = list(lbls)  # the cache's list stays as it is
        offsets = np.zeros(len(u) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        return SeriesSet(lbls, offsets, np.ascontiguousarray(t), np.ascontiguousarray(v))

    def _in_range_mask(self, n: int, mint: int, maxt: int) -> np.ndarray:
        mask = self.head.series_in_range(n, mint, maxt)
        for b in self._blocks_snapshot():
            if b.maxt >= mint and b.mint <= maxt:
                mask |= b.series_mask(n, mint, maxt)
        return mask

    def _selected(self, matcher_sets: Sequence[Sequence[Matcher]], mint: int, maxt: int) -> np.ndarray:
        n = len(self.index)
        mask = self.index.match_any_mask([ms for ms in matcher_sets], n) if matcher_sets else np.ones(n, dtype=bool)
        if mask.any():
            mask &= self._in_range_mask(n, mint, maxt)
        return mask

    def series(self, matcher_sets: Sequence[Sequence[Matcher]], mint: int, maxt: int) -> list[Labels]:
        mask = self._selected(matcher_sets, mint, maxt)
        labels_all = self.index.labels
        return sorted(labels_all[i] for i in np.flatnonzero(mask).tolist())

    def label_names(self, mint: int, maxt: int, matcher_sets: Sequence[Sequence[Matcher]] = ()) -> list[str]:
        # A tenant-restricted read enumerates only that tenant's names (storage/index.py partitions).
        return self.index.names_in(self._selected(matcher_sets, mint, maxt), self.index.partition_of(matcher_sets))

    def label_values(self, name: str, mint: int, maxt: int, matcher_sets: Sequence[Sequence[Matcher]] = ()) -> list[str]:
        return self.index.values_in(name, self._selected(matcher_sets, mint, maxt), self.index.partition_of(matcher_sets))

    # ------------------------------------------------------------------------------------------
    # deletion
    # ------------------------------------------------------------------------------------------

    def delete_series(self, matcher_sets: Sequence[Sequence[Matcher]], mint: int, maxt: int) -> int:
        """Delete samples in [mint, maxt] of matching series from head and blocks; returns series affected."""
        with self._maint_lock, self._wlock:
            n = len(self.index)
            mask = self.index.match_any_mask(matcher_sets, n) if matcher_sets else np.zeros(n, dtype=bool)
            mask &= self._in_range_mask(n, mint, maxt)
            sids = np.flatnonzero(mask).astype(np.int64)
            if not len(sids):
                return 0
            labels = [self.index.labels[i] for i in sids.tolist()]
            seq = self.wal.log_tombstone(labels, mint, maxt)
            self.wal.sync(seq)
            sel = np.zeros(n, dtype=bool)
            sel[sids] = True
            self.head.drop_rows(lambda r: sel[r.sid] & (r.ts >= mint) & (r.ts <= maxt))
            for b in self._blocks_snapshot():
                if b.maxt >= mint and b.mint <= maxt and b.series_mask(n, mint, maxt).any():
                    self._rewrite_block_without(b, sel, mint, maxt)
            self._catalog_changed()
            self._update_gauges()
            return len(sids)

    # ------------------------------------------------------------------------------------------
    # startup: blocks, then WAL replay
    # ------------------------------------------------------------------------------------------

    @property
    def blocks_dir(self) -> Path:
        return self.path / "blocks"

    def _global_ids(self, label_json: list[str]) -> np.ndarray:
        """Global ids for a block's series (label-JSON strings). Blocks share most series, so the
        JSON text is cached: a string lookup instead of a parse per series and block."""
        cache = self._json_ids
        out = np.empty(len(label_json), dtype=np.int64)
        for i, text in enumerate(label_json):
            gid = cache.get(text)
            if gid is None:
                gid = cache[text] = self.index.get_or_create(parse_labels_json(text))[0]
            out[i] = gid
        if len(cache) > 4_000_000:
            cache.clear()
        return out

    def _load_blocks(self) -> None:
        bdir = self.blocks_dir
        bdir.mkdir(parents=True, exist_ok=True)
        metas = {}
        unreadable = []
        for p in sorted(bdir.iterdir()):
            if p.name.endswith(".tmp"):
                shutil.rmtree(p, ignore_errors=True)  # unfinished write or compaction
                continue
            if not p.is_dir():
                log.warning("ignoring %s in the blocks directory: not a block", p.name)
                continue
            try:
                meta = orjson.loads((p / "meta.json").read_bytes())
                if not isinstance(meta, dict):
                    raise ValueError("not a JSON object")
                metas[p.name] = meta
            except (OSError, ValueError) as e:
                log.error("skipping block %s: unreadable meta.json (left on disk for inspection): %s", p.name, e)
                unreadable.append(UnreadableBlock(p.name, f"meta.json: {e}"))
        opened: dict[str, Block] = {}
        for name in sorted(metas):
            try:
                opened[name] = Block(bdir / name, self._global_ids)
            except Exception as e:  # noqa: BLE001 - a damaged block must not stop the server; keep it for inspection
                log.error("skipping unreadable block %s (left on disk for inspection): %s", name, e)
                lo, hi = metas[name].get("minTime"), metas[name].get("maxTime")
                reason = str(e).replace(f"{bdir / name}/", "")  # file names within the block, not the data dir's path
                unreadable.append(UnreadableBlock(name, reason, int(lo) if isinstance(lo, int) else None,
                                                  int(hi) if isinstance(hi, int) else None))
        # a finished compaction's parents go, but only once the block that replaces them opens: the
        # parents of a damaged one stay and keep serving its data
        replaced = {par for name in opened for par in metas[name].get("parents", [])}
        blocks = []
        for name, block in opened.items():
            if name in replaced:
                log.info("removing block %s: replaced by a finished compaction", name)
                shutil.rmtree(bdir / name, ignore_errors=True)
                continue
            blocks.append(block)
        for name in sorted(set(metas) - set(opened)):
            kept = [par for par in metas[name].get("parents", []) if par in opened and par not in replaced]
            if kept:
                log.warning("keeping blocks %s: the compaction that replaces them (%s) is unreadable", ", ".join(kept), name)
        blocks.sort(key=lambda b: (b.mint, b.maxt))
        self._blocks = blocks
        self.unreadable_blocks = unreadable
        M.UNREADABLE_BLOCKS.set(len(unreadable))
        if blocks:
            self.min_valid_time = max(b.maxt for b in blocks) + 1

    def _replay(self) -> None:
        t0 = time.perf_counter()
        stats = replay_head(self.path / "wal", self.index, self.head)
        dt = time.perf_counter() - t0
        M.WAL_REPLAY_SECONDS.set(dt)
        if self.head.num_samples or stats["segments"]:
            log.info("WAL replay: %d samples, %d series in head, %d segment(s)%s in %.2fs", self.head.num_samples,
                     self.head.series_count(), stats["segments"], " + checkpoint" if stats["checkpoint"] is not None else "", dt)

    # ------------------------------------------------------------------------------------------
    # maintenance: head -> blocks, WAL checkpoint, compaction, retention
    # ------------------------------------------------------------------------------------------

    def _maintenance_loop(self) -> None:
        # Every second: sort freshly appended head rows into runs (off the ingest path, so reads
        # stay cheap). Every maintenance interval: cuts, compaction, retention.
        tick = min(1.0, self._maintenance_interval_s)
        waited = 0.0
        while not self._stop.wait(tick):
            waited += tick
            try:
                with self._maint_lock:
                    if self._closed:
                        return
                    self.head.seal()
                if waited >= self._maintenance_interval_s:
                    waited = 0.0
                    self.maintain()
            except Exception:  # noqa: BLE001 - keep the loop alive; counted and logged
                M.COMPACTION_FAILURES.inc()
                log.exception("storage maintenance failed")

    def maintain(self) -> None:
        """One pass: cut head ranges that are due, compact, apply retention."""
        with self._maint_lock:
            if self._closed:
                return
            changed = False
            for _ in range(64):
                if not self._cut_due():
                    break
                changed |= self._cut_oldest_range(force=False)
            changed |= self._compact()
            changed |= self._apply_retention()
            if changed:
                self._catalog_changed()
            self._update_gauges()

    def flush_head(self) -> None:
        """Persist everything in the head as blocks now (tests, benchmarks, operators)."""
        with self._maint_lock:
            for _ in range(100_000):
                if self.head.num_samples == 0:
                    break
                self._cut_oldest_range(force=True)
            self._catalog_changed()
            self._update_gauges()

    def compact(self) -> bool:
        with self._maint_lock:
            changed = False
            while self._compact():
                changed = True
            changed |= self._apply_retention()
            if changed:
                self._catalog_changed()
            self._update_gauges()
            return changed

    def hold_cuts(self, hold: Callable[[], int | None]) -> None:
        """Cut no head range reaching past ``hold()`` (ms; None: no limit) in maintenance. Cutting a
        range makes appends older than its end "too old"; a writer whose sources advance unevenly (a
        cluster ingester consuming many partitions, some hours behind the others while they catch up)
        names the oldest time it may still append, so lagging data is not refused. ``flush_head`` is
        not held."""
        self._cut_hold = hold

    def _cut_due(self) -> bool:
        h = self.head
        return h.num_samples > 0 and h.maxt - h.mint > self.options.block_duration_ms * 3 // 2

    def _cut_oldest_range(self, force: bool) -> bool:
        bd = self.options.block_duration_ms
        hold = self._cut_hold() if self._cut_hold is not None and not force else None
        with self._wlock:
            if self.head.num_samples == 0:
                return False
            a = (self.head.mint // bd) * bd
            b = a + bd
            if force:
                b = min(b, self.head.maxt + 1)
            if hold is not None and b > hold:
                return False  # a writer may still append before b (hold_cuts)
            s, t, v = self.head.rows_in_range(INT64_MIN, b - 1)
            self.min_valid_time = max(self.min_valid_time, b)
        if len(s) == 0:
            return False
        bpath = write_block(self.blocks_dir, self.index.labels, s, t, v, level=1)
        block = Block(bpath, self._global_ids)
        M.BLOCKS_WRITTEN.inc()
        with self._wlock:
            # Rows that arrived (out-of-order) after the snapshot stay in the head.
            s2, t2, v2 = self.head.rows_in_range(INT64_MIN, b - 1)
            extra = find_keys(s2, t2, s, t) < 0 if len(s2) != len(s) else None
            with self._blocks_lock:
                self._blocks = sorted(self._blocks + [block], key=lambda x: (x.mint, x.maxt))
            self.head.truncate_before(b)
            if extra is not None and extra.any():
                self.head.commit(s2[extra], t2[extra], v2[extra])
            upto = self.wal.cut_segment()
            snap = self.head.snapshot()  # immutable arrays: the checkpoint is built outside the lock
            keep = np.flatnonzero(self.head.series_max != INT64_MIN).astype(np.int64)
            self.wal.forget_series(keep)
            series = [(i, self.index.labels[i]) for i in keep.tolist()]
        hs, ht, hv = self.head.rows_of(snap)
        self.wal.write_checkpoint(upto, series, hs, ht, hv)
        log.info("persisted head block %s [%d, %d]: %d samples, %d series", block.id, block.mint, block.maxt,
                 block.num_samples, block.num_series)
        return True

    def _newest_time(self) -> int:
        newest = self.head.maxt
        for b in self._blocks_snapshot():
            newest = max(newest, b.maxt)
        return newest

    def _compaction_ranges(self) -> list[int]:
        bd = self.options.block_duration_ms
        out, r = [], bd * 3
        limit = self.options.retention_ms // 10 if self.options.retention_ms > 0 else 31 * 86_400_000
        while r <= max(limit, bd * 3) and len(out) < 4:
            out.append(r)
            r *= 3
        return out

    def _compact(self) -> bool:
        blocks = self._blocks_snapshot()
        if len(blocks) < 2:
            return False
        # 1) overlapping blocks (out-of-order data, interrupted cuts) are merged first
        blocks.sort(key=lambda b: (b.mint, b.maxt))
        group = [blocks[0]]
        hi = blocks[0].maxt
        for b in blocks[1:]:
            if b.mint <= hi:
                group.append(b)
                hi = max(hi, b.maxt)
                continue
            if len(group) > 1:
                break
            group, hi = [b], b.maxt
        if len(group) > 1:
            self._merge_blocks(group)
            return True
        # 2) complete aligned windows of the next level
        newest = self._newest_time()
        bd = self.options.block_duration_ms
        for r in self._compaction_ranges():
            windows: dict[int, list[Block]] = {}
            for b in blocks:
                w = b.mint // r
                if b.maxt // r == w:
                    windows.setdefault(w, []).append(b)
            for w, members in sorted(windows.items()):
                if len(members) >= 2 and (w + 1) * r <= newest - bd:
                    self._merge_blocks(members)
                    return True
        return False

    def _merge_blocks(self, group: list[Block]) -> None:
        parts = []
        for b in group:
            ls, t, v = b.read_all()
            parts.append((b.local_to_global[ls], t, v))
        s, t, v = sort_by_series_time(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                                      np.concatenate([p[2] for p in parts]))
        s, t, v = dedupe_sorted(s, t, v)
        ids = [b.id for b in group]
        if len(s):
            bpath = write_block(self.blocks_dir, self.index.labels, s, t, v, level=max(b.level for b in group) + 1, parents=ids)
            new = [Block(bpath, self._global_ids)]
        else:
            new = []
        self._replace_blocks(group, new)
        M.COMPACTIONS.inc()
        log.info("compacted %d blocks into %s", len(group), new[0].id if new else "nothing")

    def _replace_blocks(self, old: list[Block], new: list[Block]) -> None:
        gone = {b.id for b in old}
        with self._blocks_lock:
            self._blocks = sorted([b for b in self._blocks if b.id not in gone] + new, key=lambda x: (x.mint, x.maxt))
        for b in old:
            b.remove()

    def _apply_retention(self) -> bool:
        blocks = self._blocks_snapshot()
        if not blocks:
            return False
        drop: dict[str, str] = {}
        if self.options.retention_ms > 0:
            cutoff = self._newest_time() - self.options.retention_ms
            for b in blocks:
                if b.maxt < cutoff:
                    drop[b.id] = "time"
        if self.options.retention_bytes > 0:
            total = sum(b.size_bytes for b in blocks if b.id not in drop) + self.wal.size_bytes()
            for b in sorted(blocks, key=lambda x: (x.maxt, x.mint)):
                if total <= self.options.retention_bytes:
                    break
                if b.id not in drop:
                    drop[b.id] = "size"
                    total -= b.size_bytes
        if not drop:
            return False
        old = [b for b in blocks if b.id in drop]
        for b in old:
            M.RETENTION_DELETED.labels(drop[b.id]).inc()
            log.info("retention (%s): deleting block %s [%d, %d]", drop[b.id], b.id, b.mint, b.maxt)
        self._replace_blocks(old, [])
        return True

    def _rewrite_block_without(self, b: Block, sel: np.ndarray, mint: int, maxt: int) -> None:
        ls, t, v = b.read_all()
        g = b.local_to_global[ls]
        keep = ~(sel[g] & (t >= mint) & (t <= maxt))
        new = []
        if keep.any():
            bpath = write_block(self.blocks_dir, self.index.labels, g[keep], t[keep], v[keep], level=b.level, parents=[b.id])
            new = [Block(bpath, self._global_ids)]
        self._replace_blocks([b], new)

    def _catalog_changed(self) -> None:
        try:
            write_catalog(self.path, self._blocks_snapshot(), self.index.labels)
        except Exception:  # noqa: BLE001 - the catalog is derived data; never fail ingest for it
            log.exception("updating the DuckDB catalog failed")

    # ------------------------------------------------------------------------------------------
    # status
    # ------------------------------------------------------------------------------------------

    def stats(self, limit: int = 10) -> dict:
        """Store-wide figures: the head's series in Prometheus's TSDBStatus shape (storage/status.py)
        plus the head's samples, blocks, bytes and the persisted range's end."""
        n = len(self.index)
        head_ids = np.flatnonzero(self.head.series_in_range(n, INT64_MIN, INT64_MAX))
        labels_all = self.index.labels
        h = self.head
        out = tsdb_status((labels_all[i] for i in head_ids.tolist()), limit,
                          min_time=int(h.mint) if h.num_samples else 0, max_time=int(h.maxt) if h.num_samples else 0)
        out["headStats"]["numSamples"] = int(h.num_samples)
        blocks = self._blocks_snapshot()
        out.update({
            "numSeriesTotal": n,
            "blocks": [{"id": b.id, "minTime": b.mint, "maxTime": b.maxt, "numSamples": b.num_samples,
                        "numSeries": b.num_series, "level": b.level, "bytes": b.size_bytes} for b in blocks],
            "blockBytes": sum(b.size_bytes for b in blocks),
            "walBytes": self.wal.size_bytes(),
            "minValidTime": int(self.min_valid_time),
        })
        return out

    def tsdb_status(self, matchers: Sequence[Matcher], limit: int = 10) -> dict:
        """Prometheus's /api/v1/status/tsdb data over the series matching ``matchers`` (e.g. one
        tenant's): cardinality of all their stored series, time range of their head samples."""
        series = self.series([list(matchers)], INT64_MIN // 2, INT64_MAX // 2)
        own = self.head_stats_of(matchers)
        out = tsdb_status(series, limit, min_time=own["minTime"], max_time=own["maxTime"])
        if self.unreadable_blocks:  # not a Prometheus field: only present when blocks were skipped
            out["unreadableBlocks"] = [b.to_json() for b in self.unreadable_blocks]
        return out

    def unreadable_blocks_overlapping(self, mint: int, maxt: int) -> list[UnreadableBlock]:
        return [b for b in self.unreadable_blocks if b.overlaps(mint, maxt)]

    def head_stats_of(self, matchers: Sequence[Matcher]) -> dict:
        """Head figures (Prometheus's headStats) of the series matching ``matchers`` only, e.g. one
        tenant's: series, samples and time range of those series alone, never the store-wide ones.
        ``blockBytes`` is those series' share of each block's bytes (by series count)."""
        n = len(self.index)
        ids = self.index.match_ids(matchers, n)
        h = self.head
        with h.lock:
            smin, smax = h.series_min, h.series_max
        ids_h = ids[ids < len(smin)]
        lo, hi = smin[ids_h], smax[ids_h]
        live = lo <= hi
        in_head = ids_h[live]
        num_samples = 0
        if len(in_head):
            _, t, _ = h.gather(in_head)
            num_samples = int(len(t))
        block_bytes = 0.0
        for b in self._blocks_snapshot():
            if b.num_series:
                share = int(b.series_mask(n, INT64_MIN, INT64_MAX)[ids].sum()) if len(ids) else 0
                block_bytes += b.size_bytes * share / b.num_series
        return {"numSeries": int(len(in_head)), "numSamples": num_samples, "chunkCount": 0,
                "minTime": int(lo[live].min()) if len(in_head) else 0, "maxTime": int(hi[live].max()) if len(in_head) else 0,
                "blockBytes": int(round(block_bytes))}

    # ------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        with self._wlock:
            self._closed = True
            self.wal.close()

    def __enter__(self) -> "TSDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _update_gauges(self) -> None:
        M.HEAD_SAMPLES.set(self.head.num_samples)
        M.HEAD_SERIES.set(self.head.series_count())
        blocks = self._blocks_snapshot()
        M.BLOCKS.set(len(blocks))
        M.BLOCK_BYTES.set(sum(b.size_bytes for b in blocks))
