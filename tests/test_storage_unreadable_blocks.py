"""An unreadable block skipped at start-up is never silent: a real server started on a data
directory with a corrupted block reports it in /api/v1/status/tsdb and as
turboprom_storage_unreadable_blocks, and warns on every query whose range overlaps it, while the
other blocks are served. Also: status/tsdb has exactly Prometheus's documented fields."""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

from storage.batch import SampleBatch
from storage.tsdb import TSDB
from tests.helpers import ServerProcess

HOUR = 3_600_000
NOW = (int(time.time() * 1000) // HOUR) * HOUR
OLD = NOW - 10 * HOUR  # block A: [OLD, OLD + 30m]
NEW = NOW - 5 * HOUR  # block B: [NEW, NEW + 30m]

# Prometheus 2.42's TSDBStatus and HeadStats (web/api/v1/api.go; docs/querying/api.md, "TSDB Stats").
PROMETHEUS_TSDB_STATUS = {"headStats", "seriesCountByMetricName", "labelValueCountByLabelName",
                          "memoryInBytesByLabelName", "seriesCountByLabelValuePair"}
PROMETHEUS_HEAD_STATS = {"numSeries", "numLabelPairs", "chunkCount", "minTime", "maxTime"}


def _get(url: str, path: str, **params: str) -> dict:
    with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=30) as r:
        return json.loads(r.read())


def _metric(url: str, name: str) -> float | None:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def _write_two_blocks(data: Path) -> tuple[Path, Path]:
    db = TSDB(str(data), background=False)
    try:
        made = []
        for start, job in ((OLD, "old"), (NEW, "new")):
            ts = start + np.arange(0, 30 * 60_000, 60_000, dtype=np.int64)
            db.append(SampleBatch.from_series([((("__name__", "ub_metric"), ("job", job)), ts, np.ones(len(ts)))]))
            db.flush_head()
            made.append(max((p for p in db.blocks_dir.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime_ns))
        return made[0], made[1]
    finally:
        db.close()


def test_unreadable_block_is_reported_and_warned_about(tmp_path: Path) -> None:
    data = tmp_path / "data"
    old_block, new_block = _write_two_blocks(data)
    assert old_block != new_block
    (old_block / "series.parquet").write_bytes(b"PAR1 this is not a parquet file")  # corrupted on disk
    with ServerProcess(data) as srv:
        assert _metric(srv.url, "turboprom_storage_unreadable_blocks") == 1.0
        st = _get(srv.url, "/api/v1/status/tsdb")["data"]
        [bad] = st["unreadableBlocks"]
        assert bad["name"] == old_block.name and (bad["minTime"], bad["maxTime"]) == (OLD, OLD + 29 * 60_000)
        assert "'series.parquet'" in bad["reason"] and "corrupted" in bad["reason"] and str(data) not in bad["reason"]

        # A query over the skipped block's range: the surviving block still answers, with a warning.
        over_old = _get(srv.url, "/api/v1/query_range", query="ub_metric", start=str((OLD - HOUR) / 1000),
                        end=str((NEW + HOUR) / 1000), step="300")
        assert over_old["status"] == "success"
        assert {s["metric"]["job"] for s in over_old["data"]["result"]} == {"new"}
        [w] = over_old["warnings"]
        assert old_block.name in w and "could not be read" in w
        # An instant query reaching back into it through a range selector warns too.
        inst = _get(srv.url, "/api/v1/query", query="count_over_time(ub_metric[6h])", time=str((NEW + 20 * 60_000) / 1000))
        assert inst["data"]["result"] and old_block.name in inst["warnings"][0]
        # Queries that read none of its range carry no warning.
        clean = _get(srv.url, "/api/v1/query", query="ub_metric", time=str((NEW + 20 * 60_000) / 1000))
        assert [s["metric"]["job"] for s in clean["data"]["result"]] == ["new"] and "warnings" not in clean
        assert "warnings" not in _get(srv.url, "/api/v1/query", query="vector(1)")

    # A block whose meta.json is unreadable has no known range: every data query is warned.
    bad_meta = data / "blocks" / "01BADMETA0000000000000000"
    bad_meta.mkdir()
    (bad_meta / "meta.json").write_text("{not json")
    with ServerProcess(data) as srv:
        assert _metric(srv.url, "turboprom_storage_unreadable_blocks") == 2.0
        names = {b["name"]: b for b in _get(srv.url, "/api/v1/status/tsdb")["data"]["unreadableBlocks"]}
        assert names.keys() == {old_block.name, bad_meta.name} and names[bad_meta.name]["minTime"] is None
        clean = _get(srv.url, "/api/v1/query", query="ub_metric", time=str((NEW + 20 * 60_000) / 1000))
        assert len(clean["warnings"]) == 1 and bad_meta.name in clean["warnings"][0]
    assert old_block.exists() and bad_meta.exists()  # left on disk for inspection


def test_status_tsdb_has_prometheus_fields_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _write_two_blocks(data)
    with ServerProcess(data) as srv:
        st = _get(srv.url, "/api/v1/status/tsdb")
        assert st["status"] == "success"
        assert set(st["data"]) == PROMETHEUS_TSDB_STATUS
        assert set(st["data"]["headStats"]) == PROMETHEUS_HEAD_STATS
        assert st["data"]["headStats"]["numSeries"] == 2
        assert st["data"]["seriesCountByMetricName"] == [{"name": "ub_metric", "value": 2}]
        assert {d["name"]: d["value"] for d in st["data"]["labelValueCountByLabelName"]} == {"__name__": 1, "job": 2}
        assert _metric(srv.url, "turboprom_storage_unreadable_blocks") == 0.0


def _check_data(*args: str) -> tuple[int, str]:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "turboprom", "check", "data", *args], capture_output=True, text=True,
                       timeout=60, cwd=Path(__file__).resolve().parent.parent)
    return r.returncode, r.stdout + r.stderr


def test_check_data_finds_and_quarantines_damaged_blocks(tmp_path: Path) -> None:
    data = tmp_path / "data"
    old_block, new_block = _write_two_blocks(data)
    code, out = _check_data(str(data))
    assert code == 0 and "2 blocks checked: 2 sound (60 samples), 0 damaged" in out, out

    # Damage that start-up cannot see (it reads data.parquet lazily): a truncated data file.
    raw = (new_block / "data.parquet").read_bytes()
    (new_block / "data.parquet").write_bytes(raw[: len(raw) // 2])
    (old_block / "series.parquet").write_bytes(b"garbage")
    code, out = _check_data(str(data))
    assert code == 1, out
    assert f"block {old_block.name} cannot be opened" in out and f"block {new_block.name} data cannot be read" in out
    assert "0 sound (0 samples), 2 damaged" in out and old_block.exists()

    with ServerProcess(data) as srv:  # never under a running server
        code, out = _check_data(str(data), "--repair")
        assert code == 1 and "in use by another TurboProm process" in out and old_block.exists()

    code, out = _check_data(str(data), "--repair")
    assert code == 0 and out.count("    moved to ") == 2, out
    assert not old_block.exists() and (data / "quarantine" / old_block.name / "meta.json").exists()
    with ServerProcess(data) as srv:
        assert _metric(srv.url, "turboprom_storage_unreadable_blocks") == 0.0
    code, out = _check_data(str(data))
    assert code == 0 and "0 blocks checked" in out


def _compacted_with_parents_left(data: Path) -> tuple[list[str], Path]:
    """Two blocks merged into one, with the two still on disk: the state a crash leaves between
    writing a compaction's block and removing the blocks it replaces."""
    import shutil

    a, b = _write_two_blocks(data)
    keep = data.parent / "parents"
    keep.mkdir()
    for p in (a, b):
        shutil.copytree(p, keep / p.name)
    db = TSDB(str(data), background=False)
    try:
        db._merge_blocks(list(db._blocks))
    finally:
        db.close()
    (child,) = [p for p in db.blocks_dir.iterdir() if p.is_dir()]
    for p in (a, b):
        shutil.copytree(keep / p.name, p)
    return [a.name, b.name], child


def _job_values(data: Path) -> list[str]:
    db = TSDB(str(data), background=False)
    try:
        return sorted(dict(s)["job"] for s in db.series([[]], OLD - HOUR, NOW))
    finally:
        db.close()


def test_a_finished_compaction_replaces_its_parents_at_start_up(tmp_path: Path) -> None:
    data = tmp_path / "data"
    parents, child = _compacted_with_parents_left(data)
    assert _job_values(data) == ["new", "old"]
    left = sorted(p.name for p in (data / "blocks").iterdir() if p.is_dir()) if (data / "blocks").exists() else []
    assert child.name in left and not set(parents) & set(left)


def test_the_parents_of_an_unreadable_compaction_stay_and_serve(tmp_path: Path) -> None:
    data = tmp_path / "data"
    parents, child = _compacted_with_parents_left(data)
    (child / "series.parquet").write_bytes(b"not parquet")
    assert _job_values(data) == ["new", "old"]  # from the parents
    left = {p.name for p in child.parent.iterdir() if p.is_dir()}
    assert set(parents) | {child.name} <= left  # nothing deleted; the damaged block left for inspection
