"""SDS persistence: sealed panes as Parquet files per SDS, the catalog as a DuckDB table.

Layout under ``<data_dir>/planner/``::

    planner.duckdb                 query_log + sds_catalog tables
    sds/<id>/series.parquet        local id -> labels (JSON), shift constant
    sds/<id>/groups.parquet        group SDSs: group id -> grouping values (JSON), group shift constant
    sds/<id>/panes-<lo>-<hi>.parquet   non-empty panes [lo, hi): one file per flush, merged into one
                                   when more than ``MERGE_FILES`` pile up (a file whose range another
                                   file holds is left over from an interrupted merge and is skipped)

A flush writes only what changed: the panes sealed since the last one, the series file when series were
added (or their shift constants chosen), the catalog row when one of its fields moved.

After a restart ``load`` restores every SDS from its files; panes after the last flush (the open panes
at the time of the crash) are rebuilt from raw storage by ``recover`` before ingestion resumes.
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

CATALOG = """
CREATE TABLE IF NOT EXISTS sds_catalog (
    id VARCHAR PRIMARY KEY,
    spec VARCHAR,
    pinned BOOLEAN,
    reason VARCHAR,
    cov_lo BIGINT,
    persisted_hi BIGINT,
    series BIGINT,
    bytes BIGINT,
    hits BIGINT
)
"""


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
        """Write panes sealed since the last flush; returns panes written."""
        lo, hi = sds.coverage()
        if sds.cov_lo is None or hi <= lo:
            return 0
        start = self.persisted_hi.get(sds.id, lo)
        d = self.dir(sds.id)
        d.mkdir(parents=True, exist_ok=True)
        n = 0
        if hi > start:
            rows = sds.store.export_rows(start, hi)
            if len(rows["pane"]):
                pq.write_table(pa.table(rows), d / f"panes-{start}-{hi}.parquet")
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
        self._catalog(sds)
        return n

    def _merge_pane_files(self, d: Path, keep_from: int) -> None:
        """One file for many: written beside them first (a crash leaves either the old files or the
        merged one holding their ranges, and ``_pane_files`` skips what another file holds). Panes
        older than ``keep_from`` (trimmed from the plan) are left out."""
        files = self._pane_files(d)
        if len(files) <= self.MERGE_FILES:
            return
        lo, hi = max(files[0][0], keep_from), files[-1][1]
        tmp = d / f".panes-{lo}-{hi}.parquet.tmp"
        # permissive: a column one flush wrote as int and another as float (all-empty panes) still merges
        tab = pa.concat_tables([pq.read_table(f) for _, _, f in files], promote_options="permissive")
        pq.write_table(tab.filter(pc.greater_equal(tab["pane"], keep_from)), tmp)
        tmp.replace(d / f"panes-{lo}-{hi}.parquet")
        for a, b, f in files:
            if (a, b) != (lo, hi):
                f.unlink(missing_ok=True)
        self.merges += 1

    @staticmethod
    def _pane_files(d: Path) -> list[tuple[int, int, Path]]:
        """Pane files by range, without those whose range another file holds."""
        got = []
        for f in d.glob("panes-*.parquet"):
            try:
                _, a, b = f.stem.split("-")
                got.append((int(a), int(b), f))
            except ValueError:
                continue
        got.sort(key=lambda x: (x[0], -x[1]))
        out: list[tuple[int, int, Path]] = []
        for a, b, f in got:
            if out and b <= out[-1][1]:
                continue  # inside the previous (wider or equal) range
            out.append((a, b, f))
        return out

    def _catalog(self, sds: SDS) -> None:
        row = [sds.id, json.dumps(sds.spec.to_json()), sds.pinned, sds.reason, sds.cov_lo,
               self.persisted_hi.get(sds.id), len(sds.registry.labels), sds.nbytes(), sds.stats.hits]
        if self._written_row.get(sds.id) == row:
            return
        with self.db_lock:
            self.con.execute("INSERT OR REPLACE INTO sds_catalog VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
        self._written_row[sds.id] = row

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

    def recover(self, sds: SDS, storage: Any) -> int | None:
        """Rebuild the panes after the last flush from raw storage (open panes at the crash).

        Returns the newest sample time seen (or None). Runs before ingestion starts, so no race.
        """
        P = sds.spec.pane_ms
        hi = self.persisted_hi.get(sds.id)
        if hi is None or sds.cov_lo is None:
            return None
        store = sds.store
        store.restore_chain()  # chain state = each series' last sample in the persisted panes
        ss = storage.select(sds.spec.scope_matchers(), hi * P, np.iinfo(np.int64).max // 2)
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
