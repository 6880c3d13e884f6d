"""Append semantics of the embedded store: duplicates, conflicts, out-of-order window, future
samples, partial acceptance, stale markers through WAL and Parquet, reads across head and blocks."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from storage.batch import SampleBatch
from storage.labels import make_labels
from storage.matchers import Matcher
from storage.options import HOUR_MS, StorageOptions
from storage.stale import STALE_NAN, is_stale
from storage.tsdb import TSDB

NOW = int(time.time() * 1000)
T0 = (NOW - 6 * HOUR_MS) // HOUR_MS * HOUR_MS


def lbl(name: str = "up", **kw: str):
    return make_labels({"__name__": name, **kw})


def batch(*items):
    return SampleBatch.from_series([(l, np.asarray(ts, np.int64), np.asarray(vs, np.float64)) for l, ts, vs in items])


def open_db(path: Path, **opts) -> TSDB:
    return TSDB(str(path), StorageOptions(**opts), background=False)


def test_duplicate_is_idempotent_and_conflict_rejected(tmp_path):
    with open_db(tmp_path) as db:
        a = lbl(job="a")
        r = db.append(batch((a, [T0, T0 + 1000], [1.0, 2.0])))
        assert (r.accepted, r.duplicates, r.rejected) == (2, 0, {})
        r = db.append(batch((a, [T0, T0 + 1000], [1.0, 2.0])))
        assert (r.accepted, r.duplicates, r.rejected) == (0, 2, {})
        r = db.append(batch((a, [T0 + 1000], [3.0])))
        assert r.accepted == 0 and r.rejected == {"duplicate_timestamp": 1}
        assert "duplicate timestamp" in r.errors[0] and 'job="a"' in r.errors[0]
        # within one batch: the same sample twice is one sample; a conflicting one is rejected
        r = db.append(batch((a, [T0 + 2000, T0 + 2000, T0 + 2000], [5.0, 5.0, 6.0])))
        assert (r.accepted, r.duplicates, r.rejected) == (1, 1, {"duplicate_timestamp": 1})
        ss = db.select([Matcher("job", "=", "a")], T0, T0 + 10_000)
        assert ss.timestamps.tolist() == [T0, T0 + 1000, T0 + 2000]
        assert ss.values.tolist() == [1.0, 2.0, 5.0]


def test_stale_nan_duplicate_is_bit_exact(tmp_path):
    with open_db(tmp_path) as db:
        a = lbl(job="a")
        db.append(batch((a, [T0, T0 + 1], [1.0, STALE_NAN])))
        r = db.append(batch((a, [T0 + 1], [STALE_NAN])))
        assert r.duplicates == 1 and r.rejected_total == 0
        r = db.append(batch((a, [T0 + 1], [float("nan")])))  # an ordinary NaN is a different value
        assert r.rejected == {"duplicate_timestamp": 1}


def test_out_of_order_rejected_by_default_and_partial_acceptance(tmp_path):
    with open_db(tmp_path) as db:
        a, b = lbl(job="a"), lbl(job="b")
        db.append(batch((a, [T0 + 10_000], [1.0])))
        r = db.append(batch((a, [T0 + 5_000, T0 + 20_000], [2.0, 3.0]), (b, [T0], [4.0])))
        assert r.accepted == 2 and r.rejected == {"out_of_order": 1}
        ss = db.select([Matcher("__name__", "=", "up")], 0, NOW)
        assert ss.labels == [a, b]
        assert ss.series(0)[0].tolist() == [T0 + 10_000, T0 + 20_000]


def test_out_of_order_window(tmp_path):
    with open_db(tmp_path, out_of_order_window_ms=600_000) as db:
        a = lbl(job="a")
        db.append(batch((a, [T0 + 1_000_000], [1.0])))
        r = db.append(batch((a, [T0 + 500_000, T0 + 300_000], [2.0, 3.0])))
        # newest head sample is T0+1e6; window 10 min -> T0+400000 is the oldest accepted
        assert r.accepted == 1 and r.rejected == {"too_old": 1}
        r = db.append(batch((a, [T0 + 500_000], [2.0])))  # retried out-of-order sample: idempotent
        assert r.duplicates == 1 and r.accepted == 0
        r = db.append(batch((a, [T0 + 500_000], [9.0])))
        assert r.rejected == {"duplicate_timestamp": 1}
        ss = db.select([Matcher("job", "=", "a")], 0, NOW)
        assert ss.timestamps.tolist() == [T0 + 500_000, T0 + 1_000_000]
        assert ss.values.tolist() == [2.0, 1.0]


def test_future_samples_rejected(tmp_path):
    with open_db(tmp_path) as db:
        a = lbl(job="a")
        r = db.append(batch((a, [NOW, NOW + 3_600_000], [1.0, 2.0])))
        assert r.accepted == 1 and r.rejected == {"too_far_in_future": 1}


def test_rejection_counter_exported(tmp_path):
    from prometheus_client import REGISTRY
    with open_db(tmp_path) as db:
        before = REGISTRY.get_sample_value("turboprom_storage_rejected_samples_total", {"reason": "out_of_order"}) or 0
        a = lbl(job="a")
        db.append(batch((a, [T0 + 10], [1.0])))
        db.append(batch((a, [T0], [1.0])))
        after = REGISTRY.get_sample_value("turboprom_storage_rejected_samples_total", {"reason": "out_of_order"})
        assert after == before + 1


def test_stale_marker_round_trip_wal_and_parquet(tmp_path):
    a = lbl(job="a")
    ts = T0 + np.arange(6) * 15_000
    vals = np.array([1.0, STALE_NAN, 2.0, float("nan"), STALE_NAN, 3.0])
    with open_db(tmp_path) as db:
        db.append(batch((a, ts, vals)))
    with open_db(tmp_path) as db:  # replayed from the WAL
        ss = db.select([Matcher("job", "=", "a")], 0, NOW)
        assert ss.values.view(np.uint64).tolist() == vals.view(np.uint64).tolist()
        db.flush_head()
        assert db.head.num_samples == 0 and len(db.stats()["blocks"]) >= 1
    with open_db(tmp_path) as db:  # read from Parquet
        ss = db.select([Matcher("job", "=", "a")], 0, NOW)
        assert ss.values.view(np.uint64).tolist() == vals.view(np.uint64).tolist()
        assert is_stale(ss.values).sum() == 2


def test_select_merges_head_and_blocks_sorted_by_labels(tmp_path):
    rng = np.random.default_rng(1)
    series = [lbl("m", i=f"{i:02d}", job=("a", "b")[i % 2]) for i in range(20)]
    ts = T0 + np.arange(40) * 15_000
    vals = {s: rng.normal(size=len(ts)) for s in series}
    with open_db(tmp_path) as db:
        # insertion order reversed so ids differ from label order
        db.append(batch(*[(s, ts[:20], vals[s][:20]) for s in reversed(series)]))
        db.flush_head()
        db.append(batch(*[(s, ts[20:], vals[s][20:]) for s in series]))
        assert db.head.num_samples == 20 * 20
        ss = db.select([Matcher("job", "=", "b")], int(ts[10]), int(ts[30]))
        want = [s for s in series if dict(s)["job"] == "b"]
        assert ss.labels == sorted(want)
        for k, s in enumerate(ss.labels):
            t, v = ss.series(k)
            assert t.tolist() == ts[10:31].tolist()
            assert v.tolist() == vals[s][10:31].tolist()


def test_label_apis_restricted_by_time_and_matchers(tmp_path):
    with open_db(tmp_path) as db:
        db.append(batch((lbl("old", env="x"), [T0], [1.0]), (lbl("new", env="y", zone="z1"), [T0 + HOUR_MS], [1.0])))
        assert db.label_names(T0, T0 + 10) == ["__name__", "env"]
        assert db.label_names(0, NOW) == ["__name__", "env", "zone"]
        assert db.label_values("env", T0 + 10, NOW) == ["y"]
        assert db.label_values("__name__", 0, NOW, [[Matcher("env", "=~", "x|q")]]) == ["old"]
        assert db.series([[Matcher("zone", "!=", "")]], 0, NOW) == [lbl("new", env="y", zone="z1")]
        db.flush_head()
        assert db.label_values("env", T0 + 10, NOW) == ["y"]
        assert db.label_values("env", 0, T0 + 10) == ["x"]


def test_delete_series_head_blocks_and_restart(tmp_path):
    a, b = lbl(job="a"), lbl(job="b")
    ts = T0 + np.arange(10) * 60_000
    with open_db(tmp_path) as db:
        db.append(batch((a, ts[:5], np.ones(5)), (b, ts[:5], np.ones(5))))
        db.flush_head()
        db.append(batch((a, ts[5:], np.ones(5)), (b, ts[5:], np.ones(5))))
        n = db.delete_series([[Matcher("job", "=", "a")]], int(ts[3]), int(ts[7]))
        assert n == 1
        got = db.select([Matcher("job", "=", "a")], 0, NOW).timestamps.tolist()
        assert got == [int(ts[i]) for i in (0, 1, 2, 8, 9)]
    with open_db(tmp_path) as db:
        assert db.select([Matcher("job", "=", "a")], 0, NOW).timestamps.tolist() == [int(ts[i]) for i in (0, 1, 2, 8, 9)]
        assert db.select([Matcher("job", "=", "b")], 0, NOW).num_samples == 10


@pytest.mark.parametrize("background", [False, True])
def test_concurrent_appends_and_queries(tmp_path, background):
    """Readers racing appends and (with background) the sealer that sorts head rows into runs."""
    import threading
    with TSDB(str(tmp_path), StorageOptions(wal_fsync="batch"), background=background, maintenance_interval_s=0.02) as db:
        errors: list[BaseException] = []
        stop = threading.Event()

        def writer(w: int) -> None:
            try:
                s = [lbl("c", w=str(w), i=str(i)) for i in range(50)]
                for k in range(100):
                    db.append(batch(*[(x, [T0 + k * 1000], [float(k)]) for x in s]))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        def reader() -> None:
            try:
                while not stop.is_set():
                    ss = db.select([Matcher("__name__", "=", "c")], 0, NOW)
                    for k in range(len(ss)):
                        t, _ = ss.series(k)
                        assert (np.diff(t) > 0).all()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        ws = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
        r = threading.Thread(target=reader)
        r.start()
        for t in ws:
            t.start()
        for t in ws:
            t.join()
        stop.set()
        r.join()
        assert not errors
        ss = db.select([Matcher("__name__", "=", "c")], 0, NOW)
        assert len(ss) == 150 and ss.num_samples == 150 * 100


def test_time_bounded_reads_match_filtering(tmp_path):
    """Head runs, unsealed rows and blocks, read with many [mint, maxt] windows."""
    rng = np.random.default_rng(5)
    series = [lbl("b", i=str(i)) for i in range(7)]
    with open_db(tmp_path, out_of_order_window_ms=HOUR_MS) as db:
        truth: dict[tuple, float] = {}
        for step in range(12):
            ts = T0 + np.sort(rng.choice(3_600_000, size=20, replace=False))
            items = []
            for s in series:
                vs = rng.normal(size=len(ts))
                items.append((s, ts, vs))
            r = db.append(batch(*items))
            for s, t, v in items:  # the model: first value per (series, ts) wins, retries are duplicates
                for tt, vv in zip(t.tolist(), v.tolist()):
                    truth.setdefault((s, tt), vv)
            assert r.accepted + r.rejected.get("duplicate_timestamp", 0) == 20 * 7
            if step % 3 == 0:
                db.head.seal()
            if step == 8:
                db.flush_head()
        for _ in range(40):
            lo = int(T0 + rng.integers(-10_000, 3_700_000))
            hi = lo + int(rng.integers(0, 2_000_000))
            ss = db.select([Matcher("__name__", "=", "b")], lo, hi)
            got = {(ss.labels[k], int(t)): float(v) for k in range(len(ss)) for t, v in zip(*ss.series(k))}
            want = {k: v for k, v in truth.items() if lo <= k[1] <= hi}
            assert got == want


def test_accepted_mask_marks_exactly_the_stored_samples_in_batch_order(tmp_path):
    """accepted_mask is per batch sample, in batch order (not the sorted order storage validates
    in): True only for samples this append stored; rejected samples, duplicates of stored samples and
    repeats within the batch are False."""
    with open_db(tmp_path) as db:
        a, b = lbl(job="a"), lbl(job="b")
        r = db.append(batch((a, [T0, T0 + 1000], [1.0, 2.0]), (b, [T0], [7.0])))
        assert r.accepted_mask.tolist() == [True, True, True]
        series = [a, b]
        # positions:      0: a new        1: b out of order  2: a exact dup   3: b new
        #                 4: a conflict   5: a in-batch repeat of 0 (same value)  6: b future
        #                 7: a in-batch repeat of 0 (other value)  8: b new (before 3 in time)
        idx = [0, 1, 0, 1, 0, 0, 1, 0, 1]
        ts = [T0 + 5000, T0 - 1000, T0 + 1000, T0 + 9000, T0, T0 + 5000, NOW + HOUR_MS, T0 + 5000, T0 + 8000]
        vs = [5.0, 0.5, 2.0, 9.0, 1.5, 5.0, 1.0, 6.0, 8.0]
        r = db.append(SampleBatch(series, np.array(idx), np.array(ts), np.array(vs)))
        assert r.accepted == 3 and r.duplicates == 2
        assert r.rejected == {"out_of_order": 1, "duplicate_timestamp": 2, "too_far_in_future": 1}
        assert r.accepted_mask.dtype == bool
        assert r.accepted_mask.tolist() == [True, False, False, True, False, False, False, False, True]
        # the mask selects exactly what a read returns as new
        ss = db.select([Matcher("job", "=~", "a|b")], T0 + 2000, NOW)
        got = sorted((dict(ss.labels[k])["job"], int(t)) for k in range(len(ss)) for t in ss.series(k)[0])
        m = r.accepted_mask
        want = sorted((dict(series[i])["job"], t) for i, t in zip(np.array(idx)[m].tolist(), np.array(ts)[m].tolist()))
        assert got == want
        # a retry of the whole batch stores nothing
        r = db.append(SampleBatch(series, np.array(idx), np.array(ts), np.array(vs)))
        assert r.accepted == 0 and not r.accepted_mask.any()


def test_accepted_mask_with_out_of_order_window_and_blocks(tmp_path):
    with open_db(tmp_path, out_of_order_window_ms=HOUR_MS) as db:
        a = lbl(job="a")
        db.append(batch((a, [T0, T0 + 60_000], [1.0, 2.0])))
        db.flush_head()  # T0.. now persisted: older samples are too old, equal ones duplicates
        db.append(batch((a, [T0 + 3 * HOUR_MS], [3.0])))
        # 0: in window, 1: duplicate of a block sample, 2: too old (persisted range), 3: new
        r = db.append(batch((a, [T0 + 3 * HOUR_MS - 1000, T0 + 60_000, T0 + 30_000, T0 + 3 * HOUR_MS + 1000],
                             [4.0, 2.0, 9.0, 5.0])))
        assert (r.accepted, r.duplicates, r.rejected) == (2, 1, {"too_old": 1})
        assert r.accepted_mask.tolist() == [True, False, False, True]


def test_stored_samples_do_not_alias_the_callers_batch(tmp_path):
    """The head keeps its own copies: a sink or caller reusing the batch arrays afterwards changes nothing."""
    with open_db(tmp_path) as db:
        a = lbl(job="alias")
        b = batch((a, [T0, T0 + 1000], [1.0, 2.0]))
        assert db.append(b).accepted == 2
        b.values[:] = -1.0
        b.timestamps[:] = 0
        ss = db.select([Matcher("job", "=", "alias")], T0, T0 + 1000)
        assert ss.timestamps.tolist() == [T0, T0 + 1000] and ss.values.tolist() == [1.0, 2.0]
