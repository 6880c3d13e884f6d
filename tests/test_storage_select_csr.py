"""The read path's CSR builder (storage/select_csr.py) and the select built on it: identical to the
generic merge (sort + dedupe of (sid, ts) parts) on heads with many runs and unsealed pieces, on
blocks whose row groups split series and whose range cuts series, across out-of-order data and
rows seen in both the head and a block; and build_csr itself against a per-series reference."""
from __future__ import annotations

import time

import numpy as np
import pytest

import storage.block as block_mod
from storage.batch import SampleBatch
from storage.labels import make_labels
from storage.matchers import Matcher
from storage.options import HOUR_MS, StorageOptions
from storage.select_csr import Segment, build_csr, expand
from storage.tsdb import TSDB

NOW = int(time.time() * 1000) // 1000 * 1000


def test_expand_matches_aranges():
    rng = np.random.default_rng(0)
    for _ in range(100):
        k = int(rng.integers(0, 20))
        starts = rng.integers(0, 1000, k)
        lens = rng.integers(0, 5, k)
        want = [j for a, n in zip(starts.tolist(), lens.tolist()) for j in range(a, a + n)]
        assert expand(starts, lens, int(lens.sum())).tolist() == want


def _reference(segs: list[Segment], k: int, order: np.ndarray | None):
    order = np.arange(k) if order is None else order
    out = []
    for i in order.tolist():
        t = np.concatenate([sg.ts[sg.lo[i]:sg.hi[i]] for sg in segs])
        v = np.concatenate([sg.val[sg.lo[i]:sg.hi[i]] for sg in segs])
        out.append((i, t, v))
    return out


@pytest.mark.parametrize("big", [False, True])
def test_build_csr_against_reference(monkeypatch, big):
    import storage.select_csr as sc
    if big:  # the large-result paths: per-segment expansion, order checked on first/last rows
        monkeypatch.setattr(sc, "_CHECK_OUTPUT_ROWS", 0)
        monkeypatch.setattr(sc, "_ONE_EXPANSION_ROWS", 0)
    rng = np.random.default_rng(1)
    for trial in range(300):
        k = int(rng.integers(1, 12))
        m = int(rng.integers(1, 5))
        clock = np.zeros(k, dtype=np.int64)
        segs = []
        for j in range(m):
            lens = rng.integers(0, 4, k) * (rng.random(k) < 0.7)
            # a source holding these series' rows in some order of series, with other rows around them
            pos_order = rng.permutation(k)
            ts_parts, lo, hi, p = [], np.zeros(k, np.int64), np.zeros(k, np.int64), 0
            for i in pos_order.tolist():
                pad = int(rng.integers(0, 3))
                ts_parts.append(rng.integers(-50, 50, pad))
                p += pad
                n = int(lens[i])
                gaps = rng.integers(1, 4, n)
                ts_parts.append(clock[i] + np.cumsum(gaps))
                clock[i] += int(gaps.sum())
                lo[i], hi[i] = p, p + n
                p += n
            ts = np.concatenate(ts_parts).astype(np.int64) if ts_parts else np.zeros(0, np.int64)
            segs.append(Segment(j, ts, rng.normal(size=len(ts)), lo, hi))
        order = rng.permutation(k) if trial % 2 else None
        got = build_csr(segs, k, order)
        ref = _reference(segs, k, order)
        assert got is not None
        present = [r for r in ref if len(r[1])]
        want_present = np.array([len(r[1]) > 0 for r in ref])
        assert (got.present is None and want_present.all()) or (got.present.tolist() == want_present.tolist())
        assert got.offsets.tolist() == np.concatenate([[0], np.cumsum([len(r[1]) for r in present])]).tolist()
        assert got.ts.tolist() == [x for r in present for x in r[1].tolist()]
        assert got.val.view(np.uint64).tolist() == [x for r in present for x in r[2].view(np.uint64).tolist()]
        if m > 1 and len(got.ts) > 1:
            # a series whose rows interleave between two segments: no CSR, the caller merges
            i = int(np.argmax([sum(int(sg.hi[q] - sg.lo[q]) > 0 for sg in segs) for q in range(k)]))
            js = [j for j, sg in enumerate(segs) if sg.hi[i] > sg.lo[i]]
            if len(js) >= 2:
                a, b = segs[js[0]], segs[js[-1]]
                b.ts[b.lo[i]] = a.ts[a.hi[i] - 1]  # a repeated timestamp
                assert build_csr(segs, k, order) is None


SERIES = [make_labels({"__name__": f"sc_m{i % 3}", "host": f"h{(i * 7) % 11}", "i": str(i)}) for i in range(60)]


def _identical(a, b) -> None:
    assert a.labels == b.labels
    assert a.offsets.tolist() == b.offsets.tolist()
    assert a.timestamps.tolist() == b.timestamps.tolist()
    assert a.values.view(np.uint64).tolist() == b.values.view(np.uint64).tolist()


def _check_reads(db: TSDB, rng: np.random.Generator, t0: int, t1: int, reads: int = 60) -> None:
    selectors = [[Matcher("__name__", "=", "sc_m1")], [Matcher("host", "=~", "h[1-4]")], [Matcher("i", "=", "7")],
                 [Matcher("__name__", "!=", "")]]
    for r in range(reads):
        ms = selectors[r % len(selectors)]
        lo = int(rng.integers(t0 - 60_000, t1))
        hi = lo + int(rng.integers(0, t1 - t0 + 120_000))
        sids = db.index.match_ids(ms)
        _identical(db.select(ms, lo, hi), db._select_ids_merged(sids, lo, hi))


@pytest.mark.parametrize("large_paths", [False, True])
def test_select_equals_generic_merge_head_blocks_row_groups_and_ooo(tmp_path, monkeypatch, large_paths):
    import storage.select_csr as sc
    monkeypatch.setattr(block_mod, "ROW_GROUP", 97)  # series split over row groups
    if large_paths:  # strided copies, per-segment expansion, order checked on first/last rows
        monkeypatch.setattr(sc, "_CHECK_OUTPUT_ROWS", 0)
        monkeypatch.setattr(sc, "_ONE_EXPANSION_ROWS", 0)
    rng = np.random.default_rng(2)
    opts = StorageOptions(wal_fsync="never", retention_ms=0, block_duration_ms=HOUR_MS // 6,
                          out_of_order_window_ms=HOUR_MS)
    t0 = NOW - 3 * HOUR_MS
    with TSDB(str(tmp_path), opts, background=False) as db:
        idx = np.arange(len(SERIES))
        for step in range(0, 3 * 3600, 30):
            keep = rng.random(len(SERIES)) < 0.9  # series come and go
            ts = np.full(len(SERIES), t0 + step * 1000, dtype=np.int64) - rng.integers(0, 5000, len(SERIES))
            db.append(SampleBatch(SERIES, idx[keep], ts[keep], rng.normal(size=int(keep.sum()))))
            if step % 300 == 0:
                db.head.seal()
            if step % 1800 == 0:
                db.maintain()
        # out-of-order rows inside the head range and into the persisted one (dropped or kept per rules)
        late = NOW - int(1.2 * HOUR_MS)
        db.append(SampleBatch(SERIES, idx, late + rng.integers(0, 600_000, len(SERIES)), rng.normal(size=len(SERIES))))
        _check_reads(db, rng, t0, NOW)
        db.head.seal()
        db.maintain()
        assert len(db._blocks_snapshot()) >= 2
        _check_reads(db, rng, t0, NOW)
        # unsealed pieces on top of everything
        for step in range(5):
            ts = np.full(len(SERIES), NOW + step * 1000, dtype=np.int64)
            db.append(SampleBatch(SERIES, idx, ts, rng.normal(size=len(SERIES))))
        assert db.head._pending
        _check_reads(db, rng, t0, NOW + 5000)
        db.flush_head()
        db.compact()
        _check_reads(db, rng, t0, NOW + 5000)


def test_rows_in_head_and_block_at_once_read_once(tmp_path):
    """A block holding rows the head still holds (a cut between writing its block and truncating
    the head): each sample is read once, as by the generic merge."""
    opts = StorageOptions(wal_fsync="never", retention_ms=0)
    with TSDB(str(tmp_path), opts, background=False) as db:
        idx = np.arange(len(SERIES))
        for step in range(120):
            db.append(SampleBatch(SERIES, idx, np.full(len(SERIES), NOW - 600_000 + step * 5000), np.arange(len(SERIES)) + step))
        db.head.seal()
        s, t, v = db.head.rows_in_range(-(2**63), 2**63 - 1)
        path = block_mod.write_block(db.blocks_dir, db.index.labels, s, t, v)
        with db._blocks_lock:
            db._blocks.append(block_mod.Block(path, db._global_ids))
        ms = [Matcher("__name__", "=", "sc_m2")]
        ss = db.select(ms, NOW - 600_000, NOW)
        assert len(ss) == 20 and ss.num_samples == 20 * 120
        _identical(ss, db._select_ids_merged(db.index.match_ids(ms), NOW - 600_000, NOW))


def test_row_group_cache_keeps_its_first_part_for_a_read_larger_than_it():
    entry = (np.zeros(100, np.int64), np.zeros(100, np.float64))
    size = entry[0].nbytes + entry[1].nbytes
    c = block_mod._RowGroupCache(max_bytes=10 * size)

    def scan(token) -> int:
        hits = 0
        for g in range(15):
            if c.get(("b", g), token) is not None:
                hits += 1
            else:
                c.put(("b", g), entry, token)
        return hits

    assert scan(object()) == 0
    assert sorted(k[1] for k in c._d) == list(range(10))  # the read kept what it used first
    assert scan(object()) == 10 and scan(object()) == 10  # and every repeat hits there
    # another read's row groups still evict the least recently used entries
    c.put(("other", 0), entry, object())
    assert ("other", 0) in c._d and ("b", 0) not in c._d and len(c._d) == 10
    # without a token: plain LRU
    for g in range(3):
        c.put(("plain", g), entry)
    assert [k for k in c._d][-3:] == [("plain", 0), ("plain", 1), ("plain", 2)] and c._bytes == 10 * size


def test_build_csr_regular_scrapes_split_over_row_groups(monkeypatch):
    """Series scraped at one interval, stored block by block in row groups that split series: the
    strided-copy path (no index arrays) gives the reference answer, with and without an output order."""
    import storage.select_csr as sc
    monkeypatch.setattr(sc, "_CHECK_OUTPUT_ROWS", 0)
    monkeypatch.setattr(sc, "_ONE_EXPANSION_ROWS", 0)
    expansions = []
    real_expand = sc.expand
    monkeypatch.setattr(sc, "expand", lambda *a: expansions.append(1) or real_expand(*a))
    rng = np.random.default_rng(4)
    k, per_block, blocks, rg = 23, 40, 3, 57
    segs = []
    for blk in range(blocks):
        ts = np.tile(np.arange(per_block, dtype=np.int64) + blk * per_block, k)  # series after series
        val = rng.normal(size=len(ts))
        starts = np.arange(k, dtype=np.int64) * per_block
        for g0 in range(0, len(ts), rg):  # one segment per row group, as Block.segments gives them
            n_g = min(rg, len(ts) - g0)
            lo = np.clip(starts - g0, 0, n_g)
            hi = np.clip(starts + per_block - g0, 0, n_g)
            segs.append(Segment(blk, ts[g0:g0 + n_g], val[g0:g0 + n_g], lo, hi))
    check_regular(segs, k, expansions)
    # every third series of the block selected (one mode of node_cpu_seconds_total): strided rows
    segs = []
    for blk in range(blocks):
        ts = np.tile(np.arange(per_block, dtype=np.int64) + blk * per_block, 3 * k)
        val = rng.normal(size=len(ts))
        starts = np.arange(k, dtype=np.int64) * 3 * per_block + per_block
        for g0 in range(0, len(ts), rg):
            n_g = min(rg, len(ts) - g0)
            segs.append(Segment(blk, ts[g0:g0 + n_g], val[g0:g0 + n_g], np.clip(starts - g0, 0, n_g),
                                np.clip(starts + per_block - g0, 0, n_g)))
    check_regular(segs, k, expansions)


def check_regular(segs: list[Segment], k: int, expansions: list) -> None:
    for order in (None, np.arange(k)[::-1].copy()):
        expansions.clear()
        got = build_csr(segs, k, order)
        ref = _reference(segs, k, order)
        assert got is not None and got.present is None
        assert got.ts.tolist() == [x for r in ref for x in r[1].tolist()]
        assert got.val.view(np.uint64).tolist() == [x for r in ref for x in r[2].view(np.uint64).tolist()]
        if order is None:
            assert not expansions  # every row group copied without index arrays


def test_matcher_resolution_is_remembered_until_a_series_is_created(tmp_path):
    from storage.index import SeriesIndex
    idx = SeriesIndex()
    for i in range(10):
        idx.get_or_create(make_labels({"__name__": "mm", "i": str(i), "__tenant__": "t1" if i % 2 else ""}))
    ms = [Matcher("__name__", "=", "mm"), Matcher("i", "=~", "[0-4]")]
    a = idx.match_ids(ms)
    assert a.tolist() == [0, 1, 2, 3, 4] and idx.match_ids(list(ms)) is a  # remembered
    assert idx.match_ids(ms + [Matcher("__tenant__", "=", "t1")]).tolist() == [1, 3]
    assert idx.match_ids(ms, 3).tolist() == [0, 1, 2]  # a reader's smaller id prefix has its own entry
    idx.get_or_create(make_labels({"__name__": "mm", "i": "4x"}))
    idx.get_or_create(make_labels({"__name__": "mm", "i": "2", "zone": "b"}))
    b = idx.match_ids(ms)
    assert b.tolist() == [0, 1, 2, 3, 4, 11] and a.tolist() == [0, 1, 2, 3, 4]
