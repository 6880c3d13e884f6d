"""DuckDB catalog: block and series metadata, and SQL over the Parquet blocks and the head for operators.

The server never keeps a DuckDB file open (DuckDB locks an open database file against other
processes). After every block change it builds ``catalog.duckdb.tmp`` with a short-lived connection
and renames it over ``catalog.duckdb``; ``run_sql`` (``turboprom sql "..."``) attaches that file
read-only in an in-memory session, so it works while the server runs. The head (samples not yet in
a block) is read from the WAL, read-only (storage/head_replay.py), and appears as the block ``head``.
Views in that session (times are TIMESTAMP, UTC; the ``*_ms`` columns hold the same as int64 ms):

  blocks   id, min_time, max_time, num_samples, num_series, level, bytes, path, min_time_ms, max_time_ms
           (the head is a row with id 'head', level 0)
  series   block_id, series_id, metric, labels (JSON text), min_time, max_time, num_samples, min_time_ms, max_time_ms
  samples  block_id, series_id, timestamp, value (float64), timestamp_ms - every block's data.parquet and the head
  labeled_samples  samples joined with series (metric, labels)
"""
from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Sequence

import duckdb
import numpy as np
import orjson
import pyarrow as pa

from storage.block import labels_json
from storage.columns import INT64_MAX, INT64_MIN, group_bounds
from storage.head import Head
from storage.head_replay import replay_head
from storage.index import SeriesIndex
from storage.labels import metric_name

CATALOG_FILE = "catalog.duckdb"


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _block_rows(data_dir: Path) -> list[dict]:
    rows = []
    bdir = data_dir / "blocks"
    if not bdir.exists():
        return rows
    for p in sorted(bdir.iterdir()):
        if p.name.endswith(".tmp") or not (p / "meta.json").exists():
            continue
        try:
            m = orjson.loads((p / "meta.json").read_bytes())
        except (OSError, ValueError):
            continue
        rows.append({"id": m["id"], "min_time": m["minTime"], "max_time": m["maxTime"], "num_samples": m["numSamples"],
                     "num_series": m["numSeries"], "level": m.get("level", 1), "bytes": m.get("bytes", 0), "path": str(p)})
    return rows


def _create_tables(con: duckdb.DuckDBPyConnection, rows: list[dict], prefix: str = "") -> None:
    con.execute(f"CREATE TABLE {prefix}blocks (id VARCHAR, min_time BIGINT, max_time BIGINT, num_samples BIGINT, "
                "num_series BIGINT, level INTEGER, bytes BIGINT, path VARCHAR)")
    if rows:
        con.executemany(f"INSERT INTO {prefix}blocks VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [(r["id"], r["min_time"], r["max_time"], r["num_samples"], r["num_series"], r["level"], r["bytes"], r["path"])
                         for r in rows])
    files = [os.path.join(r["path"], "series.parquet") for r in rows if os.path.exists(os.path.join(r["path"], "series.parquet"))]
    if files:
        flist = "[" + ", ".join(_sql_str(f) for f in files) + "]"
        con.execute(f"CREATE TABLE {prefix}series AS SELECT regexp_extract(filename, '([^/]+)/series\\.parquet$', 1) AS block_id, "
                    "series_id, metric, labels, min_time, max_time, row_end - row_start AS num_samples "
                    f"FROM read_parquet({flist}, filename=true)")
    else:
        con.execute(f"CREATE TABLE {prefix}series (block_id VARCHAR, series_id BIGINT, metric VARCHAR, labels VARCHAR, "
                    "min_time BIGINT, max_time BIGINT, num_samples BIGINT)")


def write_catalog(data_dir: str | Path, blocks: Sequence[object] = (), labels: Sequence[object] = ()) -> None:
    """Rebuild catalog.duckdb from the block directories (atomic rename)."""
    data_dir = Path(data_dir)
    tmp = data_dir / (CATALOG_FILE + ".tmp")
    for p in (tmp, Path(str(tmp) + ".wal")):
        p.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp))
    try:
        _create_tables(con, _block_rows(data_dir))
        con.execute("CHECKPOINT")
    finally:
        con.close()
    os.replace(tmp, data_dir / CATALOG_FILE)


# how many times a read of a running server's data dir starts over when a file it listed is replaced
_READ_ATTEMPTS = 5


def _head_tables(data_dir: Path) -> tuple[pa.Table, pa.Table]:
    """(series, samples) of the head, replayed read-only from the WAL. A segment the server removes
    during the read (a head cut) makes the read start over."""
    for attempt in range(_READ_ATTEMPTS):
        index, head = SeriesIndex(), Head()
        try:
            replay_head(data_dir / "wal", index, head, repair=False)
            break
        except FileNotFoundError:
            if attempt + 1 == _READ_ATTEMPTS:
                raise
    s, t, v = head.rows_in_range(INT64_MIN, INT64_MAX)
    u, starts, ends = group_bounds(s)
    lbls = [index.labels[i] for i in u.tolist()]  # per series
    series = pa.table({
        "block_id": pa.array(["head"] * len(u), pa.string()), "series_id": pa.array(u, pa.int64()),
        "metric": pa.array([metric_name(lb) for lb in lbls], pa.string()),
        "labels": pa.array([labels_json(lb) for lb in lbls], pa.string()),
        "min_time": pa.array(t[starts] if len(u) else [], pa.int64()), "max_time": pa.array(t[ends - 1] if len(u) else [], pa.int64()),
        "num_samples": pa.array(ends - starts, pa.int64()),
    })
    samples = pa.table({"block_id": pa.array(["head"] * len(s), pa.string()), "series_id": pa.array(s, pa.int64()),
                        "timestamp": pa.array(t, pa.int64()), "value": pa.array(v, pa.float64())})
    return series, samples


def open_session(data_dir: str | Path, head: bool = True) -> duckdb.DuckDBPyConnection:
    data_dir = Path(data_dir)
    con = duckdb.connect(":memory:")
    cat = data_dir / CATALOG_FILE
    if cat.exists():
        con.execute(f"ATTACH {_sql_str(str(cat))} AS cat (READ_ONLY)")
        con.execute("CREATE TEMP VIEW raw_blocks AS SELECT * FROM cat.blocks")
        con.execute("CREATE TEMP VIEW raw_series AS SELECT * FROM cat.series")
        paths = [r[0] for r in con.execute("SELECT path FROM cat.blocks").fetchall()]
    else:  # no catalog yet (no block written): build the tables in memory from the block dirs
        rows = _block_rows(data_dir)
        _create_tables(con, rows, prefix="raw_")
        paths = [r["path"] for r in rows]
    files = [os.path.join(p, "data.parquet") for p in paths if os.path.exists(os.path.join(p, "data.parquet"))]
    if files:
        flist = "[" + ", ".join(_sql_str(f) for f in files) + "]"
        con.execute("CREATE TEMP VIEW raw_samples AS SELECT regexp_extract(filename, '([^/]+)/data\\.parquet$', 1) AS block_id, "
                    f"series_id, timestamp, value FROM read_parquet({flist}, filename=true)")
    else:
        con.execute("CREATE TEMP VIEW raw_samples AS SELECT NULL::VARCHAR AS block_id, NULL::BIGINT AS series_id, "
                    "NULL::BIGINT AS timestamp, NULL::DOUBLE AS value WHERE false")
    head_series, head_samples = _head_tables(data_dir) if head else _head_tables_empty()
    con.register("head_series", head_series)
    con.register("head_samples", head_samples)
    head_row = ("SELECT 'head' AS id, min(min_time) AS min_time, max(max_time) AS max_time, sum(num_samples)::BIGINT AS num_samples, "
                "count(*)::BIGINT AS num_series, 0 AS level, 0::BIGINT AS bytes, NULL::VARCHAR AS path FROM head_series "
                "HAVING count(*) > 0")
    con.execute("CREATE TEMP VIEW blocks AS SELECT id, epoch_ms(min_time) AS min_time, epoch_ms(max_time) AS max_time, "
                "num_samples, num_series, level, bytes, path, min_time AS min_time_ms, max_time AS max_time_ms FROM "
                f"(SELECT id, min_time, max_time, num_samples, num_series, level, bytes, path FROM raw_blocks UNION ALL {head_row})")
    con.execute("CREATE TEMP VIEW series AS SELECT block_id, series_id, metric, labels, epoch_ms(min_time) AS min_time, "
                "epoch_ms(max_time) AS max_time, num_samples, min_time AS min_time_ms, max_time AS max_time_ms FROM "
                "(SELECT block_id, series_id, metric, labels, min_time, max_time, num_samples FROM raw_series "
                "UNION ALL SELECT * FROM head_series)")
    con.execute("CREATE TEMP VIEW samples AS SELECT block_id, series_id, epoch_ms(timestamp) AS timestamp, value, "
                "timestamp AS timestamp_ms FROM (SELECT * FROM raw_samples UNION ALL SELECT * FROM head_samples)")
    con.execute("CREATE TEMP VIEW labeled_samples AS SELECT s.block_id, s.series_id, r.metric, r.labels, s.timestamp, s.value, "
                "s.timestamp_ms FROM samples s JOIN series r ON s.block_id = r.block_id AND s.series_id = r.series_id")
    return con


def _head_tables_empty() -> tuple[pa.Table, pa.Table]:
    e = np.empty(0, np.int64)
    series = pa.table({"block_id": pa.array([], pa.string()), "series_id": pa.array(e), "metric": pa.array([], pa.string()),
                       "labels": pa.array([], pa.string()), "min_time": pa.array(e), "max_time": pa.array(e),
                       "num_samples": pa.array(e)})
    samples = pa.table({"block_id": pa.array([], pa.string()), "series_id": pa.array(e), "timestamp": pa.array(e),
                        "value": pa.array(np.empty(0), pa.float64())})
    return series, samples


def run_sql(data_dir: str, query: str) -> str:
    """Run one SQL statement against the catalog and blocks; the result as a text table. On the data
    directory of a running server, a block can be replaced (compaction, retention) between the listing
    of the blocks' files and their reading: the statement then runs again on a fresh listing."""
    if not Path(data_dir).is_dir():
        raise SystemExit(f"turboprom sql: data directory {data_dir!r} does not exist")
    for attempt in range(_READ_ATTEMPTS):
        con = open_session(data_dir)
        try:
            rel = con.sql(query)
            return "OK" if rel is None else _format(rel)
        except duckdb.IOException as e:
            if attempt + 1 < _READ_ATTEMPTS and _block_vanished(e):
                continue
            raise SystemExit(f"turboprom sql: {e}") from e
        except duckdb.Error as e:
            # An operator command: a clear message and exit status 1, not a traceback.
            raise SystemExit(f"turboprom sql: {e}") from e
        finally:
            con.close()
    raise AssertionError("unreachable")


def _block_vanished(e: duckdb.Error) -> bool:
    """A block file listed for the statement was gone when read (a live server replaced the block)."""
    text = str(e)
    return "No files found that match the pattern" in text or "No such file or directory" in text


def _format(rel: duckdb.DuckDBPyRelation) -> str:
    cols = rel.columns
    rows = rel.fetchall()
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    line = " | ".join(c.ljust(w) for c, w in zip(cols, widths))
    sep = "-+-".join("-" * w for w in widths)
    body = [" | ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join([line, sep, *body, f"({len(rows)} row{'s' if len(rows) != 1 else ''})"])


def _cell(v: object) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, datetime.datetime):  # TIMESTAMP columns: UTC, RFC 3339 with milliseconds
        return v.strftime("%Y-%m-%dT%H:%M:%S.") + f"{v.microsecond // 1000:03d}Z"
    return str(v)
