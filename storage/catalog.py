"""DuckDB catalog: block and series metadata, and SQL over the Parquet blocks for operators.

The server never keeps a DuckDB file open (DuckDB locks an open database file against other
processes). After every block change it builds ``catalog.duckdb.tmp`` with a short-lived connection
and renames it over ``catalog.duckdb``; ``run_sql`` (``turboprom sql "..."``) attaches that file
read-only in an in-memory session, so it works while the server runs. Views in that session:

  blocks   id, min_time, max_time, num_samples, num_series, level, bytes, path
  series   block_id, series_id, metric, labels (JSON text), min_time, max_time, num_samples
  samples  block_id, series_id, timestamp (int64 ms), value (float64) - every block's data.parquet
  labeled_samples  samples joined with series (metric, labels)

Head (not yet persisted) samples live in memory and the WAL; they are not visible to SQL.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import duckdb
import orjson

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


def open_session(data_dir: str | Path) -> duckdb.DuckDBPyConnection:
    data_dir = Path(data_dir)
    con = duckdb.connect(":memory:")
    cat = data_dir / CATALOG_FILE
    if cat.exists():
        con.execute(f"ATTACH {_sql_str(str(cat))} AS cat (READ_ONLY)")
        con.execute("CREATE TEMP VIEW blocks AS SELECT * FROM cat.blocks")
        con.execute("CREATE TEMP VIEW series AS SELECT * FROM cat.series")
        paths = [r[0] for r in con.execute("SELECT path FROM cat.blocks").fetchall()]
    else:  # no catalog yet (no block written): build the tables in memory from the block dirs
        rows = _block_rows(data_dir)
        _create_tables(con, rows)
        paths = [r["path"] for r in rows]
    files = [os.path.join(p, "data.parquet") for p in paths if os.path.exists(os.path.join(p, "data.parquet"))]
    if files:
        flist = "[" + ", ".join(_sql_str(f) for f in files) + "]"
        con.execute("CREATE TEMP VIEW samples AS SELECT regexp_extract(filename, '([^/]+)/data\\.parquet$', 1) AS block_id, "
                    f"series_id, timestamp, value FROM read_parquet({flist}, filename=true)")
    else:
        con.execute("CREATE TEMP VIEW samples AS SELECT NULL::VARCHAR AS block_id, NULL::BIGINT AS series_id, "
                    "NULL::BIGINT AS timestamp, NULL::DOUBLE AS value WHERE false")
    con.execute("CREATE TEMP VIEW labeled_samples AS SELECT s.block_id, s.series_id, r.metric, r.labels, s.timestamp, s.value "
                "FROM samples s JOIN series r ON s.block_id = r.block_id AND s.series_id = r.series_id")
    return con


def run_sql(data_dir: str, query: str) -> str:
    """Run one SQL statement against the catalog and blocks; the result as a text table."""
    if not Path(data_dir).is_dir():
        raise SystemExit(f"turboprom sql: data directory {data_dir!r} does not exist")
    con = open_session(data_dir)
    try:
        try:
            rel = con.sql(query)
            if rel is None:
                return "OK"
            return _format(rel)
        except duckdb.Error as e:
            # An operator command: a clear message and exit status 1, not a traceback.
            raise SystemExit(f"turboprom sql: {e}") from e
    finally:
        con.close()


def _format(rel: duckdb.DuckDBPyRelation) -> str:
    cols = rel.columns
    rows = rel.fetchall()
    cells = [[("NULL" if v is None else str(v)) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    line = " | ".join(c.ljust(w) for c, w in zip(cols, widths))
    sep = "-+-".join("-" * w for w in widths)
    body = [" | ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join([line, sep, *body, f"({len(rows)} row{'s' if len(rows) != 1 else ''})"])
