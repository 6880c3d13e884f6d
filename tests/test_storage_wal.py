"""WAL: torn and corrupt tails are truncated with a warning (never a crash), checkpoints after
head cuts, restart from blocks + WAL, fsync modes."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import pytest

from storage.batch import SampleBatch
from storage.labels import make_labels
from storage.matchers import Matcher
from storage.options import HOUR_MS, StorageOptions
from storage.tsdb import TSDB
from storage.wal import list_wal

NOW = int(time.time() * 1000)
T0 = (NOW - 5 * HOUR_MS) // HOUR_MS * HOUR_MS
A = make_labels({"__name__": "w", "job": "a"})


def one(k: int) -> SampleBatch:
    return SampleBatch.from_series([(A, np.array([T0 + k * 1000]), np.array([float(k)]))])


def last_data_segment(wal_dir: Path) -> Path:
    segs, _ = list_wal(wal_dir)
    for s in reversed(segs):
        p = wal_dir / f"{s:08d}"
        if p.stat().st_size > 0:
            return p
    raise AssertionError("no WAL segment with data")


def write_n(path: Path, n: int, start: int = 0, **opts) -> None:
    with TSDB(str(path), StorageOptions(**opts), background=False) as db:
        for k in range(start, start + n):
            assert db.append(one(k)).accepted == 1


def read_ts(path: Path) -> list[int]:
    with TSDB(str(path), StorageOptions(), background=False) as db:
        return db.select([Matcher("job", "=", "a")], 0, NOW).timestamps.tolist()


@pytest.mark.parametrize("damage", ["truncate", "garble", "garbage"])
def test_corrupt_tail_is_truncated_with_warning(tmp_path, caplog, damage):
    write_n(tmp_path, 10)
    seg = last_data_segment(tmp_path / "wal")
    data = bytearray(seg.read_bytes())
    if damage == "truncate":
        data = data[:-5]  # torn last record
    elif damage == "garble":
        data[-3] ^= 0xFF  # checksum mismatch in the last record
    else:
        data += b"\x00\x01garbage-after-a-crash"
    seg.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="turboprom.storage.wal"):
        got = read_ts(tmp_path)
    want = [T0 + k * 1000 for k in range(10 if damage == "garbage" else 9)]
    assert got == want
    assert any("truncating" in r.getMessage() for r in caplog.records)
    # the log was repaired: next start is clean and appends continue
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="turboprom.storage.wal"):
        with TSDB(str(tmp_path), StorageOptions(), background=False) as db:
            assert db.append(one(50)).accepted == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert read_ts(tmp_path) == want + [T0 + 50_000]


def test_corruption_in_earlier_segment_drops_later_segments(tmp_path, caplog):
    write_n(tmp_path, 5)
    write_n(tmp_path, 5, start=5)  # second process: a second segment
    segs, _ = list_wal(tmp_path / "wal")
    first = tmp_path / "wal" / f"{segs[0]:08d}"
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="turboprom.storage.wal"):
        got = read_ts(tmp_path)
    assert got == sorted(set(got)) and len(got) < 5  # a clean prefix, no crash
    assert any("later segment" in r.getMessage() for r in caplog.records)


def test_restart_with_blocks_and_wal_and_checkpoint(tmp_path):
    opts = dict(block_duration_ms=HOUR_MS)
    series = [make_labels({"__name__": "r", "i": str(i)}) for i in range(30)]
    ts = T0 + np.arange(4 * 240) * 15_000  # 4 hours at 15 s
    rng = np.random.default_rng(3)
    vals = {s: rng.normal(size=len(ts)) for s in series}
    with TSDB(str(tmp_path), StorageOptions(**opts), background=False) as db:
        for c in range(0, len(ts), 40):
            db.append(SampleBatch.from_series([(s, ts[c:c + 40], vals[s][c:c + 40]) for s in series]))
        db.maintain()  # cuts the head ranges that are due, checkpoints and truncates the WAL
        st = db.stats()
        assert len(st["blocks"]) >= 2 and st["headStats"]["numSamples"] < 30 * len(ts)
        segs, cps = list_wal(tmp_path / "wal")
        assert cps, "a checkpoint should replace the truncated segments"
    with TSDB(str(tmp_path), StorageOptions(**opts), background=False) as db:
        ss = db.select([Matcher("__name__", "=", "r")], 0, NOW)
        assert len(ss) == 30 and ss.num_samples == 30 * len(ts)
        for k, s in enumerate(ss.labels):
            t, v = ss.series(k)
            assert t.tolist() == ts.tolist() and v.tolist() == vals[s].tolist()
        # appends continue in order after the restart; older-than-blocks samples are refused
        new = make_labels({"__name__": "r", "i": "new"})
        r = db.append(SampleBatch.from_series([(series[0], [int(ts[-1]) + 15_000], [1.0]), (series[1], [int(T0) + 7], [5.0]),
                                               (new, [int(T0)], [5.0]), (series[2], [int(T0)], [5.0]),
                                               (series[3], [int(T0)], [float(vals[series[3]][0])])]))
        # a retried persisted sample is an idempotent duplicate; a different value there a conflict
        assert r.accepted == 1 and r.duplicates == 1
        assert r.rejected == {"out_of_order": 1, "too_old": 1, "duplicate_timestamp": 1}


@pytest.mark.parametrize("mode", ["always", "batch", "never"])
def test_fsync_modes_durable_across_clean_restart(tmp_path, mode):
    write_n(tmp_path, 20, wal_fsync=mode)
    assert read_ts(tmp_path) == [T0 + k * 1000 for k in range(20)]


def test_wal_records_are_columnar(tmp_path):
    """One batch of 10k samples is one samples record (plus one series record), not 10k records."""
    series = [make_labels({"__name__": "c", "i": str(i)}) for i in range(1000)]
    with TSDB(str(tmp_path), StorageOptions(), background=False) as db:
        b = SampleBatch.from_series([(s, T0 + np.arange(10) * 1000, np.arange(10.0)) for s in series])
        db.append(b)
    seg = last_data_segment(tmp_path / "wal")
    from storage.wal import HEADER
    data = seg.read_bytes()
    pos, types = 0, []
    while pos < len(data):
        length, _, rtype = HEADER.unpack_from(data, pos)
        types.append(rtype)
        pos += HEADER.size + length
    assert types == [1, 2]


def test_damaged_block_and_leftover_temp_files_do_not_stop_startup(tmp_path, caplog):
    opts = dict(block_duration_ms=HOUR_MS)
    with TSDB(str(tmp_path), StorageOptions(**opts), background=False) as db:
        db.append(SampleBatch.from_series([(A, T0 + np.arange(10) * 1000, np.arange(10.0))]))
        db.flush_head()
        db.append(SampleBatch.from_series([(A, [NOW - 1000], [99.0])]))
    [bdir] = list((tmp_path / "blocks").iterdir())
    (bdir / "data.parquet").write_bytes(b"not parquet")
    (bdir / "series.parquet").write_bytes(b"not parquet either")
    (tmp_path / "wal" / "checkpoint.00000009.tmp").write_bytes(b"partial")
    (tmp_path / "blocks" / "b000-unfinished.tmp").mkdir()
    with caplog.at_level(logging.ERROR, logger="turboprom.storage"):
        with TSDB(str(tmp_path), StorageOptions(**opts), background=False) as db:
            assert db.select([Matcher("job", "=", "a")], 0, NOW).values.tolist() == [99.0]
    assert any("unreadable block" in r.getMessage() for r in caplog.records)
    assert bdir.exists()  # kept for inspection
    assert not (tmp_path / "wal" / "checkpoint.00000009.tmp").exists()
    assert not (tmp_path / "blocks" / "b000-unfinished.tmp").exists()


def test_samples_record_layout_is_stable():
    """A samples record is header (length, crc32 over type + payload, type) + count + the sid, ts and
    value columns little-endian; the single-buffer encoder writes exactly that, and it decodes back."""
    import struct
    import zlib

    from storage import wal
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 5000):
        sid, ts, val = rng.integers(0, 100, n), rng.integers(0, 10**12, n), rng.normal(size=n)
        payload = b"".join((struct.pack("<I", n), sid.astype("<i8").tobytes(), ts.astype("<i8").tobytes(),
                            val.astype("<f8").tobytes()))
        want = struct.pack("<IIB", len(payload), zlib.crc32(payload, zlib.crc32(bytes((wal.T_SAMPLES,)))), wal.T_SAMPLES) + payload
        got = bytes(wal.encode_samples(sid, ts, val))
        assert got == want
        s, t, v = wal.decode_samples(got[wal.HEADER.size:])
        assert s.tolist() == sid.tolist() and t.tolist() == ts.tolist() and v.view(np.uint64).tolist() == val.view(np.uint64).tolist()
