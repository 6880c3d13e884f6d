"""SDS persistence: sealed panes as Parquet files per SDS, the catalog as a DuckDB table.

Layout under ``<data_dir>/planner/``::

    planner.duckdb                 query_log + sds_catalog tables
    sds/<id>/series.parquet        local id -> labels (JSON), shift constant
    sds/<id>/groups.parquet        group SDSs: group id -> grouping values (JSON), group shift constant
    sds/<id>/panes-<lo>-<hi>-<seq>.parquet   non-empty panes [lo, hi) written by flush number <seq>:
                                   read in write order, so panes written again (changed by late or
                                   lagging samples after a flush) replace their older rows; merged into
                                   one when more than ``MERGE_FILES`` pile up (a file whose range a
                                   later file holds is superseded, e.g. left over from an interrupted
                                   merge, and is skipped)

A flush writes only what changed: the panes sealed since the last one, the series file when series were
added (or their shift constants chosen), the catalog row when one of its fields moved.

After a restart ``load`` restores every SDS from its files; panes after the last flush (the open panes
at the time of the crash), and the written ones late or lagging samples could have changed since
(storage's out-of-order window plus ``LAG_MS`` before the newest restored sample), are rebuilt from
raw storage by ``recover`` before ingestion resumes.
"""
from __future__ import annotations

import json
import logging
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from planner.sds import SDS, SDSSpec
from storage.stale import is_stale

log = logging.getLogger("turboprom.planner")

# the catalog's columns: (name, Arrow type of a batch of rows, SQL type); the first is the key
_CATALOG_COLUMNS = [("id", pa.string(), "VARCHAR PRIMARY KEY"), ("spec", pa.string(), "VARCHAR"),
                    ("pinned", pa.bool_(), "BOOLEAN"), ("reason", pa.string(), "VARCHAR"),
                    ("cov_lo", pa.int64(), "BIGINT"), ("persisted_hi", pa.int64(), "BIGINT"),
                    ("series", pa.int64(), "BIGINT"), ("bytes", pa.int64(), "BIGINT"), ("hits", pa.int64(), "BIGINT")]
CATALOG = ("CREATE TABLE IF NOT EXISTS sds_catalog ("
           + ", ".join(f"{name} {sql}" for name, _, sql in _CATALOG_COLUMNS) + ")")


class SDSPersistence:
    def __init__(self, root: Path, con: Any, db_lock: threading.Lock):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.con = con
        self.db_lock = db_lock
        with db_lock:
            con.execute(CATALOG)
        self.persisted_hi: dict[str, int] = {}
        self._written_series: dict[str, tuple[int, int]] = {}  # (series, shifts chosen) last written
        self._written_groups: dict[str, tuple[int, int]] = {}
        self._written_row: dict[str, list] = {}  # catalog row last written
        self.merges = 0

    MERGE_FILES = 16

    def dir(self, sds_id: str) -> Path:
        return self.root / "sds" / sds_id

    def flush(self, sds: SDS) -> int:
        """Write panes sealed since the last flush, and again those written before it that changed
        since (late samples, a series lagging behind the others, rebuilds: the store's lowest pane
        written since the last flush); returns panes written. The new file covers the older ones'
        overlap and is read after them (``_pane_files``), so its panes win."""
        lo, hi = sds.coverage()
        if sds.cov_lo is None or hi <= lo:
            return 0
        written = sds.store.take_written_lo()
        start = self.persisted_hi.get(sds.id, lo)
        if written is not None and written < start:
            start = max(written, lo)
        d = self.dir(sds.id)
        d.mkdir(parents=True, exist_ok=True)
        n = 0
        if hi > start:
            rows = sds.store.export_rows(start, hi)
            if len(rows["pane"]):
                pq.write_table(pa.table(rows), d / f"panes-{start}-{hi}-{self._next_seq(d)}.parquet")
                n = len(rows["pane"])
            self.persisted_hi[sds.id] = hi
            self._merge_pane_files(d, sds.cov_lo)
        for _, f_hi, f in self._pane_files(d):
            if f_hi <= sds.cov_lo:  # wholly older than the history the plan keeps (``SDS.trim``)
                f.unlink(missing_ok=True)
        labels = list(sds.registry.labels)
        shift = sds.store.series_shift()
        sh = np.full(len(labels), np.nan)
        sh[: min(len(labels), len(shift))] = shift[: len(labels)]
        mark = (len(labels), int(np.count_nonzero(~np.isnan(sh))))
        if self._written_series.get(sds.id) != mark:
            pq.write_table(pa.table({"labels": [json.dumps(l) for l in labels], "shift": sh}), d / "series.parquet")
            self._written_series[sds.id] = mark
        meta = sds.store.export_meta()
        if meta is not None:
            gmark = (len(meta["key"]), int(np.count_nonzero(~np.isnan(np.asarray(meta["shift"], np.float64)))))
            if self._written_groups.get(sds.id) != gmark:
                pq.write_table(pa.table({"key": [json.dumps(k) for k in meta["key"]], "shift": meta["shift"]}),
                               d / "groups.parquet")
                self._written_groups[sds.id] = gmark
        return n

    def _merge_pane_files(self, d: Path, keep_from: int) -> None:
        """One file for many: written beside them first (a crash leaves either the old files or the
        merged one holding their ranges, and ``_pane_files`` skips what another file holds). Panes
        older than ``keep_from`` (trimmed from the plan) are left out."""
        files = self._pane_files(d)
        if len(files) <= self.MERGE_FILES:
            return
        lo, hi = max(min(a for a, _, _ in files), keep_from), max(b for _, b, _ in files)
        seq = max(_seq_of(f) for _, _, f in files)  # files written after this merge still read after it
        merged = d / f"panes-{lo}-{hi}-{seq}.parquet"
        tmp = d / f".{merged.name}.tmp"
        # permissive: a column one flush wrote as int and another as float (all-empty panes) still merges
        tab = pa.concat_tables([pq.read_table(f) for _, _, f in files], promote_options="permissive")
        tab = _last_rows(tab.filter(pc.greater_equal(tab["pane"], keep_from)))  # rows in read order: last wins
        pq.write_table(tab, tmp)
        tmp.replace(merged)
        for _, _, f in files:
            if f != merged:
                f.unlink(missing_ok=True)
        self.merges += 1

    @staticmethod
    def _next_seq(d: Path) -> int:
        return 1 + max((_seq_of(f) for f in d.glob("panes-*.parquet")), default=0)

    @staticmethod
    def _pane_files(d: Path) -> list[tuple[int, int, Path]]:
        """Pane files in the order to read them (the order they were written: a later file's rows
        replace an earlier one's), without those whose whole range a later file holds."""
        got = []
        for f in d.glob("panes-*.parquet"):
            parts = f.stem.split("-")
            try:
                a, b = int(parts[1]), int(parts[2])
            except (IndexError, ValueError):
                continue
            got.append((_seq_of(f), a, b, f))
        got.sort(key=lambda x: (x[0], x[1], -x[2]))
        out: list[tuple[int, int, Path]] = []
        for i, (_, a, b, f) in enumerate(got):
            if any(a2 <= a and b <= b2 for _, a2, b2, _ in got[i + 1:]):
                continue  # superseded: a file written later holds all of its range
            out.append((a, b, f))
        return out

    def write_catalog(self, sdss: list[SDS]) -> int:
        """The catalog rows of ``sdss`` that changed since they were last written, in one statement
        (returns how many): DuckDB spends ~5 ms of CPU on each ``INSERT OR REPLACE``, so a row per plan
        per maintenance pass cost ~0.7% of a core with 20 plans; one statement for all costs about
        what two rows did."""
        rows = []
        for sds in sdss:
            if sds.cov_lo is None:  # nothing of it is on disk yet (``flush`` wrote no panes)
                continue
            row = [sds.id, json.dumps(sds.spec.to_json()), sds.pinned, sds.reason, sds.cov_lo,
                   self.persisted_hi.get(sds.id), len(sds.registry.labels), sds.nbytes(), sds.stats.hits]
            if self._written_row.get(sds.id) != row:
                rows.append(row)
        if not rows:
            return 0
        changed = pa.table({name: pa.array([r[i] for r in rows], type=typ) for i, (name, typ, _) in enumerate(_CATALOG_COLUMNS)})
        with self.db_lock:
            self.con.register("_catalog_rows", changed)
            try:
                self.con.execute("INSERT OR REPLACE INTO sds_catalog SELECT * FROM _catalog_rows")
            finally:
                self.con.unregister("_catalog_rows")
        for r in rows:
            self._written_row[r[0]] = r
        return len(rows)

    def drop(self, sds_id: str) -> None:
        with self.db_lock:
            self.con.execute("DELETE FROM sds_catalog WHERE id = ?", [sds_id])
        shutil.rmtree(self.dir(sds_id), ignore_errors=True)
        self.persisted_hi.pop(sds_id, None)
        for written in (self._written_series, self._written_groups, self._written_row):
            written.pop(sds_id, None)

    def load(self) -> list[SDS]:
        with self.db_lock:
            rows = self.con.execute("SELECT id, spec, pinned, reason, cov_lo, persisted_hi FROM sds_catalog").fetchall()
        out = []
        for sds_id, spec_json, pinned, reason, cov_lo, persisted_hi in rows:
            try:
                sds = SDS(SDSSpec.from_json(json.loads(spec_json)), pinned=bool(pinned), reason=reason or "")
                d = self.dir(sds_id)
                if (d / "groups.parquet").exists():
                    g = pq.read_table(d / "groups.parquet").to_pydict()  # group numbering before series
                    sds.store.import_meta({"key": [json.loads(k) for k in g["key"]], "shift": g["shift"]})
                if (d / "series.parquet").exists():
                    t = pq.read_table(d / "series.parquet").to_pydict()
                    labels = [tuple(tuple(p) for p in json.loads(s)) for s in t["labels"]]
                    sds.register(labels)
                    sds.store.set_series_shift(np.asarray(t["shift"], dtype=np.float64))
                for _, _, f in self._pane_files(d):
                    tab = pq.read_table(f).to_pydict()
                    sds.store.import_rows(tab)
                sds.cov_lo = cov_lo
                if cov_lo is not None:
                    sds.store.drop_before(cov_lo)  # rows a trim had dropped, still in older merged files
                if persisted_hi is not None:
                    self.persisted_hi[sds.id] = int(persisted_hi)
                    if cov_lo is not None:  # the history it kept when it was written
                        sds.history_ms = (int(persisted_hi) - cov_lo) * sds.spec.pane_ms
                sds.backfill_state = "restored"
                out.append(sds)
            except Exception:  # noqa: BLE001 - a damaged SDS is dropped, queries fall back to raw
                log.exception("could not restore SDS %s; dropping it", sds_id)
        return out

    # samples of a series lagging behind the others (a long scrape interval, a slow sender) land this far
    # behind the newest sample at most, in panes already written
    LAG_MS = 10 * 60_000

    def recover(self, sds: SDS, storage: Any, late_window_ms: int = 0) -> int | None:
        """Rebuild from raw storage the panes after the last flush (open panes at the crash) and the
        written ones that samples could still have reached after it: those within ``late_window_ms``
        (storage's out-of-order window) plus ``LAG_MS`` of the newest restored sample. A flush
        writes such changed panes again, but a crash before the next flush would lose them.

        Returns the newest sample time seen (or None). Runs before ingestion starts, so no race.
        """
        P = sds.spec.pane_ms
        hi = self.persisted_hi.get(sds.id)
        if hi is None or sds.cov_lo is None:
            return None
        store = sds.store
        reach = -(-(int(late_window_ms) + self.LAG_MS) // P)  # panes, rounded up
        totals = store.pane_totals()  # (first pane, samples per restored pane); None: not kept
        top = hi  # one past the newest restored pane holding a sample
        if totals is not None:
            filled = np.flatnonzero(np.asarray(totals[1]) > 0)
            top = min(hi, int(totals[0]) + int(filled[-1]) + 1) if len(filled) else hi
        redo = max(top - reach, sds.cov_lo)
        if redo < hi:
            store.clear_from(redo)
        store.restore_chain()  # chain state = each series' last sample in the panes kept
        ss = storage.select(sds.spec.scope_matchers(), redo * P, np.iinfo(np.int64).max // 2)
        newest = None
        if len(ss):
            ids = sds.register(ss.labels)
            sid = np.repeat(ids, np.diff(ss.offsets))
            keep = ~is_stale(ss.values)
            sid, ts, vals = sid[keep], ss.timestamps[keep], ss.values[keep]
            order = np.lexsort((ts, sid))
            sid, ts, vals = sid[order], ts[order], vals[order]
            ok = ts > store.last_t[sid]
            store.ingest_sorted(sid[ok], ts[ok], vals[ok], live=True)
            if len(ts):
                newest = int(ts.max())
        sds.max_ts = max(sds.max_ts, hi * P + sds.seal_delay_ms)  # restored panes stay covered
        sds.live_from = hi * P  # per-series last_t keeps the recovered samples from being counted twice
        return newest


def _seq_of(f: Path) -> int:
    """The flush number in a pane file's name (0: written before names carried one)."""
    parts = f.stem.split("-")
    try:
        return int(parts[3]) if len(parts) > 3 else 0
    except ValueError:
        return 0


def _last_rows(tab: pa.Table) -> pa.Table:
    """One row per pane (per series or group where the store keeps them): the last, as reading the
    files in order would leave it (a later file re-wrote panes that changed after an earlier one)."""
    keys = [c for c in ("series", "group") if c in tab.column_names] + ["pane"]
    if tab.num_rows == 0:
        return tab
    cols = [np.asarray(tab[c].to_numpy(zero_copy_only=False), np.int64) for c in keys]
    order = np.lexsort(cols[::-1])  # stable: equal keys keep file order
    sorted_keys = [c[order] for c in cols]
    last = np.ones(len(order), bool)
    same = np.ones(len(order) - 1, bool)
    for c in sorted_keys:
        same &= c[1:] == c[:-1]
    last[:-1] = ~same
    return tab.take(pa.array(np.sort(order[last])))
