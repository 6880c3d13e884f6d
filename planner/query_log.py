"""Durable query log: one DuckDB table in the data dir, written in batches by a background thread.

``record(entry)`` only appends to an in-memory queue (cheap, safe from any thread); the writer thread
inserts whatever has queued every ``flush_interval_s`` (or on ``flush()``/``close()``), so neither the
event loop nor the query threads wait on DuckDB.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

log = logging.getLogger("turboprom.planner")

SCHEMA = """
CREATE TABLE IF NOT EXISTS query_log (
    arrival_ms BIGINT,
    tenant VARCHAR,
    origin VARCHAR,          -- api | rule | bench | ...
    pattern VARCHAR,
    expr VARCHAR,
    kind VARCHAR,            -- instant | range
    start_ms BIGINT,
    end_ms BIGINT,
    step_ms BIGINT,
    wall_s DOUBLE,
    cpu_s DOUBLE,
    samples BIGINT,
    paths VARCHAR,           -- JSON list: raw / summary:<sds id> per served sub-tree
    result_series BIGINT,
    result_points BIGINT,
    exact BOOLEAN,
    error VARCHAR
)
"""


@dataclass
class LogEntry:
    expr: str
    pattern: str
    kind: str
    start_ms: int
    end_ms: int
    step_ms: int
    wall_s: float
    cpu_s: float
    samples: int
    paths: list[str] = field(default_factory=list)
    result_series: int = 0
    result_points: int = 0
    exact: bool = False
    approx: bool = False  # approximate algorithms were allowed to answer (config or approx=true); not stored
    tenant: str = "default"
    origin: str = "api"
    error: str = ""
    arrival_ms: int = field(default_factory=lambda: int(time.time() * 1000))


# the LogEntry fields the table stores, in its column order
STORED = ("arrival_ms", "tenant", "origin", "pattern", "expr", "kind", "start_ms", "end_ms", "step_ms", "wall_s", "cpu_s",
          "samples", "paths", "result_series", "result_points", "exact", "error")


class QueryLog:
    def __init__(self, path: str | Path | None, flush_interval_s: float = 1.0):
        self.path = str(path) if path else ":memory:"
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.con = duckdb.connect(self.path)
        self.con.execute(SCHEMA)
        self.db_lock = threading.Lock()
        self._queue: list[LogEntry] = []
        self._qlock = threading.Lock()
        self._stop = threading.Event()
        self._interval = flush_interval_s
        self._thread: threading.Thread | None = None
        self.recent: list[LogEntry] = []  # bounded in-memory tail for the planner
        self.written = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="query-log", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - logging must never take the server down
                log.exception("query log flush failed")

    def record(self, e: LogEntry) -> None:
        with self._qlock:
            self._queue.append(e)
            self.recent.append(e)
            if len(self.recent) > 10_000:
                del self.recent[:5_000]

    def flush(self) -> int:
        with self._qlock:
            batch, self._queue = self._queue, []
        if not batch:
            return 0
        # per query, not per sample; attribute reads (dataclasses.asdict deep-copies every entry, which
        # cost as much CPU as serving a cached query, on a thread that shares the GIL with them)
        cols: dict[str, list[Any]] = {k: [getattr(e, k) for e in batch] for k in STORED}
        cols["paths"] = [json.dumps(p) for p in cols["paths"]]
        tbl = pa.table(cols)  # noqa: F841 - referenced by name in the SQL below
        with self.db_lock:
            self.con.execute(f"INSERT INTO query_log SELECT {', '.join(STORED)} FROM tbl")
        self.written += len(batch)
        return len(batch)

    def sql(self, query: str, params: list[Any] | None = None) -> list[tuple]:
        self.flush()
        with self.db_lock:
            return self.con.execute(query, params or []).fetchall()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.flush()
        finally:
            with self.db_lock:
                self.con.close()

    stop = close
