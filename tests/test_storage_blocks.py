"""Blocks: Parquet layout, compaction (levels and overlaps), retention by time (from the newest
sample) and size, the DuckDB catalog and `turboprom sql` while the server runs."""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq

from storage.batch import SampleBatch
from storage.catalog import run_sql
from storage.labels import make_labels
from storage.matchers import Matcher
from storage.options import DAY_MS, HOUR_MS, StorageOptions
from storage.tsdb import TSDB
from tests.helpers import REPO, ServerProcess

# Aligned to the last UTC midnight: compaction windows are aligned to absolute multiples of the block
# range, so a wall-clock NOW made these tests pass or fail depending on the time of day.
NOW = int(time.time() * 1000) // DAY_MS * DAY_MS
SERIES = [make_labels({"__name__": "node_cpu_seconds_total", "cpu": str(c), "mode": m}) for c in range(4) for m in ("idle", "user")]


def fill(db: TSDB, start: int, hours: float, step: int = 60_000, chunk: int = 60) -> tuple[np.ndarray, dict]:
    ts = start + np.arange(int(hours * HOUR_MS / step)) * step
    vals = {s: np.cumsum(np.random.default_rng(hash(s) % 2**32).integers(0, 100, len(ts))).astype(float) for s in SERIES}
    for c in range(0, len(ts), chunk):
        r = db.append(SampleBatch.from_series([(s, ts[c:c + chunk], vals[s][c:c + chunk]) for s in SERIES]))
        assert r.rejected_total == 0, r
    return ts, vals


def snapshot(db: TSDB):
    ss = db.select([Matcher("__name__", "=", "node_cpu_seconds_total")], 0, NOW + HOUR_MS)
    return ss.labels, ss.offsets.tolist(), ss.timestamps.tolist(), ss.values.view(np.uint64).tolist()


def no_overlaps(blocks: list[dict]) -> bool:
    bs = sorted(blocks, key=lambda b: b["minTime"])
    return all(a["maxTime"] < b["minTime"] for a, b in zip(bs, bs[1:]))


def test_parquet_layout(tmp_path):
    with TSDB(str(tmp_path), StorageOptions(), background=False) as db:
        fill(db, NOW - 3 * HOUR_MS, 1)
        db.flush_head()
    bdir = sorted((tmp_path / "blocks").iterdir())[0]
    md = pq.ParquetFile(bdir / "data.parquet").metadata
    cols = {md.schema.column(i).name: md.row_group(0).column(i) for i in range(md.num_columns)}
    assert set(cols) == {"series_id", "timestamp", "value"}
    assert "DELTA_BINARY_PACKED" in cols["timestamp"].encodings
    assert "BYTE_STREAM_SPLIT" in cols["value"].encodings
    assert all(c.compression == "ZSTD" for c in cols.values())
    t = pq.read_table(bdir / "data.parquet")
    sid, ts = t.column("series_id").to_numpy(), t.column("timestamp").to_numpy()
    assert (np.diff(sid) >= 0).all() and ((np.diff(ts) > 0) | (np.diff(sid) > 0)).all()
    assert (bdir / "meta.json").exists() and (bdir / "series.parquet").exists()


def test_compaction_levels_preserve_data(tmp_path):
    opts = StorageOptions(block_duration_ms=HOUR_MS)
    with TSDB(str(tmp_path), opts, background=False) as db:
        fill(db, NOW - 30 * HOUR_MS, 29.5)
        db.maintain()
        before = snapshot(db)
        st = db.stats()
        assert no_overlaps(st["blocks"])
        assert any(b["level"] > 1 for b in st["blocks"]), st["blocks"]
        assert len(st["blocks"]) < 28  # 1h blocks were merged into 3h/9h/27h windows
        db.compact()
        assert snapshot(db) == before
    with TSDB(str(tmp_path), opts, background=False) as db:
        assert snapshot(db) == before


def test_overlapping_blocks_from_out_of_order_data_are_merged(tmp_path):
    opts = StorageOptions(block_duration_ms=HOUR_MS, out_of_order_window_ms=DAY_MS)
    a = make_labels({"__name__": "ooo", "job": "a"})
    base = NOW - 10 * HOUR_MS
    with TSDB(str(tmp_path), opts, background=False) as db:
        db.append(SampleBatch.from_series([(a, base + np.arange(0, 120) * 60_000, np.arange(120.0))]))
        db.flush_head()
        # late samples inside the range already persisted, plus a retry of persisted ones
        r = db.append(SampleBatch.from_series([(a, base + np.arange(0, 120) * 60_000 + 30_000, np.arange(120.0) + 0.5)]))
        assert r.accepted == 120
        db.flush_head()
        assert not no_overlaps(db.stats()["blocks"])
        db.compact()
        assert no_overlaps(db.stats()["blocks"])
        ss = db.select([Matcher("job", "=", "a")], 0, NOW)
        assert ss.num_samples == 240 and (np.diff(ss.timestamps) == 30_000).all()
        assert ss.values.tolist() == (np.arange(240) / 2).tolist()


def test_crash_between_compaction_and_cleanup(tmp_path):
    """A compaction's parents left behind (crash before deleting them) are removed at startup."""
    opts = StorageOptions(block_duration_ms=HOUR_MS)
    with TSDB(str(tmp_path), opts, background=False) as db:
        fill(db, NOW - 8 * HOUR_MS, 4)
        db.flush_head()
        before = snapshot(db)
        names = sorted(p.name for p in (tmp_path / "blocks").iterdir())
        saved = {n: {f.name: f.read_bytes() for f in (tmp_path / "blocks" / n).iterdir()} for n in names}
        db.compact()
        assert len(db.stats()["blocks"]) < len(names)
    for n, files in saved.items():  # resurrect the parents as if deletion never happened
        (tmp_path / "blocks" / n).mkdir(exist_ok=True)
        for f, data in files.items():
            (tmp_path / "blocks" / n / f).write_bytes(data)
    with TSDB(str(tmp_path), opts, background=False) as db:
        assert snapshot(db) == before
        assert no_overlaps(db.stats()["blocks"])


def test_retention_by_time_measured_from_newest_sample(tmp_path):
    opts = StorageOptions(block_duration_ms=HOUR_MS, retention_ms=12 * HOUR_MS, out_of_order_window_ms=365 * DAY_MS)
    with TSDB(str(tmp_path), opts, background=False) as db:
        # a backfill of data from a month ago into an empty store is kept: its newest sample is the reference
        fill(db, NOW - 30 * DAY_MS, 6)
        db.flush_head()
        db.maintain()
        assert db.select([Matcher("cpu", "=", "0")], 0, NOW).num_samples > 0
        # now recent data arrives: the month-old blocks fall out of the 12 h retention
        fill(db, NOW - 20 * HOUR_MS, 20)
        db.maintain()
        db.compact()
        st = db.stats()
        newest = max([b["maxTime"] for b in st["blocks"]] + [st["headStats"]["maxTime"]])
        assert all(b["maxTime"] >= newest - 12 * HOUR_MS for b in st["blocks"])
        ss = db.select([Matcher("cpu", "=", "0")], 0, NOW)
        assert ss.timestamps.min() >= NOW - 20 * HOUR_MS  # nothing from the backfill remains
        assert ss.timestamps.min() <= newest - 12 * HOUR_MS  # but the retention window is kept


def test_retention_by_size_drops_oldest_blocks(tmp_path):
    opts = StorageOptions(block_duration_ms=HOUR_MS)
    with TSDB(str(tmp_path), opts, background=False) as db:
        fill(db, NOW - 12 * HOUR_MS, 11)
        db.flush_head()
        blocks = db.stats()["blocks"]
        total = sum(b["bytes"] for b in blocks)
    limit = total // 2
    opts.retention_bytes = limit
    with TSDB(str(tmp_path), opts, background=False) as db:
        db.maintain()
        st = db.stats()
        assert st["blockBytes"] + st["walBytes"] <= limit
        kept_min = min(b["minTime"] for b in st["blocks"])
        assert all(b["maxTime"] < kept_min for b in blocks if b["id"] not in {x["id"] for x in st["blocks"]})


def test_catalog_sql(tmp_path):
    with TSDB(str(tmp_path), StorageOptions(block_duration_ms=HOUR_MS), background=False) as db:
        fill(db, NOW - 6 * HOUR_MS, 3)
        db.flush_head()
        n = db.stats()["blocks"]
    out = run_sql(str(tmp_path), "SELECT count(*) AS n, count(DISTINCT series_id) AS s FROM samples")
    assert out.splitlines()[2].split("|")[0].strip() == str(len(SERIES) * 180)
    out = run_sql(str(tmp_path), "SELECT count(*) FROM blocks")
    assert out.splitlines()[2].strip() == str(len(n))
    out = run_sql(str(tmp_path), "SELECT DISTINCT metric FROM labeled_samples WHERE labels LIKE '%\"mode\":\"idle\"%'")
    assert "node_cpu_seconds_total" in out


def test_turboprom_sql_while_server_runs(tmp_path):
    data = tmp_path / "data"
    with TSDB(str(data), StorageOptions(block_duration_ms=2 * HOUR_MS), background=False) as db:
        fill(db, NOW - 6 * HOUR_MS, 3)
        db.flush_head()
    with ServerProcess(data) as srv:
        r = subprocess.run([sys.executable, "-m", "turboprom", "sql", "--data-dir", str(data),
                            "SELECT metric, sum(num_samples) AS n FROM series GROUP BY metric"],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "node_cpu_seconds_total" in r.stdout and str(len(SERIES) * 180) in r.stdout
        assert srv.proc.poll() is None


def test_queries_during_compaction_and_retention(tmp_path):
    import threading
    opts = StorageOptions(block_duration_ms=HOUR_MS)
    with TSDB(str(tmp_path), opts, background=False) as db:
        fill(db, NOW - 20 * HOUR_MS, 19)
        db.flush_head()
        before = snapshot(db)
        errors: list[BaseException] = []
        stop = threading.Event()
        mismatches = []

        def reader() -> None:
            try:
                while not stop.is_set():
                    if snapshot(db) != before:
                        mismatches.append(1)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            db.compact()
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not errors and not mismatches
        assert any(b["level"] > 1 for b in db.stats()["blocks"])


def test_turboprom_sql_errors_are_messages(tmp_path):
    r = subprocess.run([sys.executable, "-m", "turboprom", "sql", "--data-dir", str(tmp_path), "SELECT nope FROM samples"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "nope" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "turboprom", "sql", "--data-dir", str(tmp_path), "SELECT count(*) AS n FROM samples"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.splitlines()[2].strip() == "0"


def test_reads_spanning_many_row_groups(tmp_path):
    from storage.block import ROW_GROUP
    rng = np.random.default_rng(11)
    series = [make_labels({"__name__": "rg", "i": f"{i:03d}"}) for i in range(100)]
    n = 3 * ROW_GROUP // 100 + 500  # > 3 row groups in one block
    ts = NOW - 2 * HOUR_MS + np.arange(n) * 10
    vals = {s: rng.normal(size=n) for s in series}
    with TSDB(str(tmp_path), StorageOptions(), background=False) as db:
        db.append(SampleBatch.from_series([(s, ts, vals[s]) for s in reversed(series)]))
        db.flush_head()
        [b] = db.stats()["blocks"]
        assert b["numSamples"] == 100 * n
        for _ in range(10):
            pick = sorted(rng.choice(100, size=int(rng.integers(1, 30)), replace=False).tolist())
            regex = "|".join(f"{i:03d}" for i in pick)
            lo = int(ts[int(rng.integers(0, n))])
            hi = lo + int(rng.integers(0, n * 10))
            ss = db.select([Matcher("i", "=~", regex)], lo, hi)
            m = (ts >= lo) & (ts <= hi)
            assert ss.labels == [series[i] for i in pick]
            for k, i in enumerate(pick):
                t, v = ss.series(k)
                assert t.tolist() == ts[m].tolist() and v.tolist() == vals[series[i]][m].tolist()


def test_held_cuts_keep_lagging_appends_acceptable(tmp_path):
    """A writer whose sources advance unevenly (a cluster ingester's partitions) holds head cuts back
    to the oldest time it may still append: samples that far back are not refused as too old, and the
    cut happens once the hold moves on."""
    hold: list[int | None] = [NOW - 9 * HOUR_MS]
    with TSDB(str(tmp_path), StorageOptions(), background=False) as db:
        db.hold_cuts(lambda: hold[0])
        ahead = make_labels({"__name__": "ahead", "p": "0"})
        behind = make_labels({"__name__": "behind", "p": "1"})
        ts = NOW - 10 * HOUR_MS + np.arange(10 * 60) * 60_000  # 10 h at 1 min: three block ranges due
        assert db.append(SampleBatch.from_series([(ahead, ts, np.arange(len(ts), dtype=float))])).rejected_total == 0
        assert db.append(SampleBatch.from_series([(behind, ts[:30], np.ones(30))])).rejected_total == 0
        db.maintain()
        assert db.stats()["blocks"] == [], "no range past the hold is cut"
        # the lagging source goes on from where it was: nothing it appends is too old
        r = db.append(SampleBatch.from_series([(behind, ts[30:300], np.ones(270))]))
        assert r.rejected_total == 0, r
        hold[0] = None
        db.maintain()
        assert db.stats()["blocks"], "cut once the hold lifts"
        r = db.append(SampleBatch.from_series([(behind, ts[300:310], np.ones(10))]))
        assert r.rejected_total == 10, "older than the cut ranges: too old, as without a hold"
        ss = db.select([Matcher("__name__", "=", "behind")], 0, NOW + HOUR_MS)
        assert len(ss.timestamps) == 300
