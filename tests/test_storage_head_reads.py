"""Short time-bounded reads from the head (the planner's raw edge ranges): pending rows are sealed
by a read that finds too many of them, runs and pending pieces outside the range are skipped, and
all of it stays exact while appends, the maintenance sealer, out-of-order rows, deletions and block
cuts race the readers."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import storage.head as head_mod
from storage.batch import SampleBatch
from storage.head import Head
from storage.labels import make_labels
from storage.matchers import Matcher
from storage.options import HOUR_MS, StorageOptions
from storage.tsdb import TSDB

NOW = int(time.time() * 1000)
T0 = (NOW - 3 * HOUR_MS) // 1000 * 1000
SERIES = [make_labels({"__name__": f"hr_m{i % 4}", "i": str(i)}) for i in range(40)]


def scrape(sec: int, rng: np.random.Generator) -> SampleBatch:
    """One sample per series at T0 + sec seconds."""
    return SampleBatch(SERIES, np.arange(len(SERIES)), np.full(len(SERIES), T0 + sec * 1000), rng.normal(size=len(SERIES)))


def as_dict(ss) -> dict:
    return {(ss.labels[k], int(t)): float(v) for k in range(len(ss)) for t, v in zip(*ss.series(k))}


def test_read_seals_many_pending_rows_and_skips_ranges(tmp_path, monkeypatch):
    monkeypatch.setattr(head_mod, "SEAL_ON_READ_ROWS", 1000)
    rng = np.random.default_rng(1)
    with TSDB(str(tmp_path), StorageOptions(wal_fsync="never"), background=False) as db:
        truth = {}
        for sec in range(60):
            b = scrape(sec, rng)
            db.append(b)
            truth.update({(SERIES[i], T0 + sec * 1000): float(b.values[i]) for i in range(len(SERIES))})
        assert db.head._pending_n == 60 * 40  # nothing sealed yet (no maintenance thread)
        ss = db.select([Matcher("__name__", "=", "hr_m1")], T0 + 50_000, T0 + 59_000)
        assert as_dict(ss) == {k: v for k, v in truth.items() if k[0][0][1] == "hr_m1" and k[1] >= T0 + 50_000}
        # the read sorted the pending rows into a keyed run (no LSM merge on the read path)
        assert db.head._pending_n == 0 and not db.head._pending
        [run] = db.head._runs
        assert run.key is not None and (np.diff(run.key) > 0).all()
        assert (run.tmin, run.tmax) == (T0, T0 + 59_000)
        # few pending rows: scanned, not sealed; pieces outside the range are skipped
        db.append(scrape(60, rng))
        assert db.head._pending_n == 40
        ss = db.select([Matcher("__name__", "=", "hr_m1")], T0, T0 + 10_000)
        assert ss.num_samples == 10 * 11 and db.head._pending_n == 40
        ss = db.select([Matcher("i", "=", "5")], T0 + 59_000, T0 + 60_000)
        assert ss.timestamps.tolist() == [T0 + 59_000, T0 + 60_000]


def test_run_bounds_match_a_filter():
    rng = np.random.default_rng(2)
    sid = np.repeat(np.arange(0, 50, 2, dtype=np.int64), 30)
    ts = np.tile(np.arange(30, dtype=np.int64) * 1000, 25) + 5_000
    run = head_mod.Run(sid, ts, rng.normal(size=len(sid)))
    for _ in range(200):
        want = np.unique(rng.integers(0, 52, size=int(rng.integers(1, 20))))
        lo = int(rng.integers(0, 40_000))
        hi = lo + int(rng.integers(-2000, 40_000))
        b_lo, b_hi = run.bounds(want, lo, hi)
        got = sorted(j for a, z in zip(b_lo.tolist(), b_hi.tolist()) for j in range(a, z))
        ref = np.flatnonzero(np.isin(sid, want) & (ts >= lo) & (ts <= hi)).tolist()
        assert got == ref
    assert run.overlaps(34_000, 40_000) and not run.overlaps(35_000, 40_000) and not run.overlaps(0, 4_999)


def test_head_without_key_falls_back_to_filtering():
    """Time spans too wide for the composite key still read correctly."""
    h = Head()
    sid = np.array([0, 0, 1, 1], dtype=np.int64)
    ts = np.array([-(2**61), 10, -5, 2**61], dtype=np.int64)
    h.ensure(2)
    h.commit(sid, ts, np.arange(4.0), as_run=True)
    assert h._runs[0].key is None
    s, t, v = h.gather(np.array([0, 1], dtype=np.int64), -10, 10)
    assert (s.tolist(), t.tolist(), v.tolist()) == ([0, 1], [10, -5], [1.0, 2.0])


@pytest.mark.parametrize("seal_rows", [1 << 16, 200])
def test_bounded_reads_exact_under_concurrent_ingest_seals_and_deletes(tmp_path, monkeypatch, seal_rows):
    """Readers (sealing on read when seal_rows is small) race a writer with out-of-order rows, the
    background sealer and block cuts: every read returns all samples of its range acknowledged
    before it started, and only samples that were acknowledged or being appended when it ended;
    then a deletion and a final cut, and the whole range reads back exactly."""
    monkeypatch.setattr(head_mod, "SEAL_ON_READ_ROWS", seal_rows)
    rng = np.random.default_rng(3)
    opts = StorageOptions(wal_fsync="never", out_of_order_window_ms=HOUR_MS, block_duration_ms=HOUR_MS // 4)
    with TSDB(str(tmp_path), opts, background=True, maintenance_interval_s=0.05) as db:
        acked: dict = {}
        in_flight: dict = {}  # the batch being appended
        lock = threading.Lock()
        errors: list[BaseException] = []
        done = threading.Event()
        n_sec = 400

        def writer() -> None:
            try:
                for sec in range(n_sec):
                    t = sec * 10 if sec % 7 else max(0, sec * 10 - 35)  # every 7th second: 35 s out of order
                    b = scrape(t, rng)
                    batch_keys = {(SERIES[i], int(b.timestamps[i])): float(b.values[i]) for i in range(len(SERIES))}
                    with lock:  # readable from the moment storage commits it, before append returns
                        in_flight.update(batch_keys)
                    r = db.append(b)
                    m = r.accepted_mask
                    with lock:
                        for i in np.flatnonzero(m).tolist():
                            acked[(SERIES[i], int(b.timestamps[i]))] = float(b.values[i])
                        in_flight.clear()
            except BaseException as e:  # noqa: BLE001 - surfaced below
                errors.append(e)
            finally:
                done.set()

        def reader(seed: int) -> None:
            r = np.random.default_rng(seed)
            try:
                while not done.is_set():
                    lo = T0 + int(r.integers(0, n_sec * 10_000))
                    hi = lo + int(r.integers(0, 120_000))
                    metric = f"hr_m{int(r.integers(0, 4))}"
                    with lock:
                        before = {k for k in acked if k[0][0][1] == metric and lo <= k[1] <= hi}
                    got = as_dict(db.select([Matcher("__name__", "=", metric)], lo, hi))
                    with lock:
                        after = {k: v for k, v in in_flight.items() if k[0][0][1] == metric and lo <= k[1] <= hi}
                        after.update({k: v for k, v in acked.items() if k[0][0][1] == metric and lo <= k[1] <= hi})
                    assert before <= set(got), sorted(before - set(got))[:3]
                    assert set(got) <= set(after) and all(after[k] == v for k, v in got.items())
            except BaseException as e:  # noqa: BLE001 - surfaced below
                errors.append(e)

        readers = [threading.Thread(target=reader, args=(s,)) for s in range(2)]
        w = threading.Thread(target=writer)
        for t in readers + [w]:
            t.start()
        w.join()
        for t in readers:
            t.join()
        assert not errors, errors[:3]
        # a deletion and a block cut after the race, then the whole range read back
        db.delete_series([[Matcher("i", "=", "3")]], T0, T0 + 1_000_000)
        acked = {k: v for k, v in acked.items() if not (dict(k[0])["i"] == "3" and k[1] <= T0 + 1_000_000)}
        db.maintain()
        got = as_dict(db.select([Matcher("__name__", "=~", "hr_m.")], T0, T0 + n_sec * 10_000))
        assert got == acked


def test_gather_across_runs_in_order_and_interleaved():
    """Runs that follow each other in time per series are merged by a scatter; runs that interleave
    for some series (out-of-order data) by the generic merge: both give (sid, ts) order."""
    h = Head()
    h.ensure(3)

    def run(pairs):
        sid = np.array([p[0] for p in pairs], dtype=np.int64)
        ts = np.array([p[1] for p in pairs], dtype=np.int64)
        h.commit(sid, ts, ts * 10.0 + sid, as_run=True)

    run([(0, 0), (0, 10), (1, 0), (1, 10), (2, 4)])
    run([(0, 20), (0, 30), (2, 40)])
    run([(1, 20), (1, 30)])  # later than run 1 for every shared series: scatter path
    want = {0: [0, 10, 20, 30], 1: [0, 10, 20, 30], 2: [4, 40]}
    for lo, hi in ((0, 40), (5, 25), (-5, 100), (11, 19), (4, 4)):
        s, t, v = h.gather(np.array([0, 1, 2], dtype=np.int64), lo, hi)
        exp = [(k, x) for k in (0, 1, 2) for x in want[k] if lo <= x <= hi]
        assert list(zip(s.tolist(), t.tolist())) == exp
        assert v.tolist() == [x * 10.0 + k for k, x in exp]
    run([(0, 15), (1, 25)])  # interleaves with earlier runs
    s, t, _ = h.gather(np.array([0, 1], dtype=np.int64), 0, 100)
    assert list(zip(s.tolist(), t.tolist())) == [(0, 0), (0, 10), (0, 15), (0, 20), (0, 30),
                                                  (1, 0), (1, 10), (1, 20), (1, 25), (1, 30)]
    s, t, _ = h.gather(np.array([1], dtype=np.int64))  # unbounded
    assert t.tolist() == [0, 10, 20, 25, 30]


def test_pending_batches_are_read_by_binary_search_exactly_like_a_scan():
    """A batch's pending rows come sorted by (sid, ts): reads find the wanted series in them by binary
    search. Over pending pieces (single batches, and more than 64 batches joined into one unsorted
    piece), every read equals the same read after sealing everything into a run."""
    rng = np.random.default_rng(12)
    h = Head()
    S = 300
    h.ensure(S)
    for k in range(70):  # > 64 pending batches: the oldest ones are joined into one piece
        n = int(rng.integers(1, S))
        sid = np.sort(rng.choice(S, n, replace=False)).astype(np.int64)
        h.commit(sid, np.full(n, 1_000 * (k + 1), np.int64), rng.normal(size=n))
    _, pieces = h.snapshot()
    assert any(p.by_series for p in pieces) and not all(p.by_series for p in pieces)
    wanted = [np.arange(10, 20, dtype=np.int64), np.arange(S, dtype=np.int64), np.array([S - 1], dtype=np.int64),
              np.sort(rng.choice(S, 40, replace=False)).astype(np.int64)]
    ranges = [(0, 10**9), (5_000, 9_000), (33_000, 33_000), (71_000, 90_000)]
    before = {(w.tobytes(), lo, hi): h.gather(w, lo, hi) for w in wanted for lo, hi in ranges}
    segs_before = {(w.tobytes(), lo, hi): len(h.segments(w, lo, hi)) for w in wanted for lo, hi in ranges}
    h.seal()
    assert not h.snapshot()[1]
    for (wb, lo, hi), got in before.items():
        exp = h.gather(np.frombuffer(wb, dtype=np.int64), lo, hi)
        assert all(np.array_equal(a, b) for a, b in zip(got, exp)), (lo, hi)
    assert any(segs_before.values())
