"""Model-based test: random sequences of appends (duplicates, conflicts, out-of-order, stale
markers), head flushes, compactions and restarts, checked against a per-sample reference model of
the documented append semantics. Every append's counts must match the model exactly, and every
read must return exactly the accepted samples (values bit-exact)."""
from __future__ import annotations

import tempfile
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from storage.batch import SampleBatch
from storage.labels import make_labels
from storage.matchers import Matcher
from storage.options import StorageOptions
from storage.stale import STALE_NAN
from storage.tsdb import TSDB

MIN = -(2**63)
BASE = (int(time.time() * 1000) - 3_600_000) // 1000 * 1000
SERIES = [make_labels({"__name__": "model", "s": str(i)}) for i in range(3)]
VALUES = [1.0, 2.0, STALE_NAN, float("nan")]


def bits(v: float) -> int:
    return int(np.array([v]).view(np.uint64)[0])


class Model:
    def __init__(self, window: int) -> None:
        self.window = window
        self.stored: dict[tuple[int, int], int] = {}  # (series, ts) -> value bits
        self.head: set[tuple[int, int]] = set()
        self.last: dict[int, tuple[int, int]] = {}  # series -> (ts, bits) newest accepted this process
        self.head_maxt = MIN
        self.mvt = MIN  # min valid time: end of what blocks hold
        self.accepted_positions: list[int] = []  # batch positions stored by the last append

    def append(self, samples: list[tuple[int, int, float]]) -> tuple[int, int, dict[str, int]]:
        """Counts (accepted, duplicates, rejected by reason); ``self.accepted_positions`` is set to
        the batch positions this append stored."""
        acc, dup, rej = 0, 0, {}

        def reject(reason: str) -> None:
            rej[reason] = rej.get(reason, 0) + 1

        ooo_min = self.head_maxt - self.window if self.head_maxt != MIN else MIN
        # the batch is a set: ordered by (series, ts), first copy of a key wins
        ordered = sorted(enumerate(samples), key=lambda x: (x[1][0], x[1][1], x[0]))
        first: dict[tuple[int, int], int] = {}
        accepted = []
        for pos, (s, t, v) in ordered:
            b = bits(v)
            if (s, t) in first:
                if first[(s, t)] == b:
                    dup += 1
                else:
                    reject("duplicate_timestamp")
                continue
            first[(s, t)] = b
            prev_t, prev_b = self.last.get(s, (MIN, 0))
            if t > prev_t and t >= self.mvt:
                accepted.append((s, t, b, pos))
            elif t == prev_t:
                if b == prev_b:
                    dup += 1
                else:
                    reject("duplicate_timestamp")
            elif (s, t) in self.stored:  # anywhere: head or blocks
                if self.stored[(s, t)] == b:
                    dup += 1
                else:
                    reject("duplicate_timestamp")
            elif self.window > 0 and t >= ooo_min:
                accepted.append((s, t, b, pos))
            elif t < prev_t and self.window == 0:
                reject("out_of_order")
            else:
                reject("too_old")
        self.accepted_positions = sorted(pos for *_, pos in accepted)
        for s, t, b, _ in accepted:
            acc += 1
            self.stored[(s, t)] = b
            self.head.add((s, t))
            if t > self.last.get(s, (MIN, 0))[0]:
                self.last[s] = (t, b)
            self.head_maxt = max(self.head_maxt, t)
        return acc, dup, rej

    def flush(self) -> None:
        if self.head:
            self.mvt = max(self.mvt, self.head_maxt + 1)
            self.head.clear()

    def restart(self) -> None:
        self.last = {}
        for s, t in sorted(self.head):
            self.last[s] = (t, self.stored[(s, t)])
        self.head_maxt = max((t for _, t in self.head), default=MIN)
        in_blocks = [t for k in self.stored if k not in self.head for t in (k[1],)]
        self.mvt = max(in_blocks) + 1 if in_blocks else MIN


sample = st.tuples(st.integers(0, 2), st.integers(0, 40), st.sampled_from(VALUES))
op = st.one_of(st.tuples(st.just("append"), st.lists(sample, min_size=1, max_size=8)),
               st.tuples(st.just("flush"), st.none()), st.tuples(st.just("compact"), st.none()),
               st.tuples(st.just("restart"), st.none()))


def check_reads(db: TSDB, model: Model) -> None:
    ss = db.select([Matcher("__name__", "=", "model")], 0, 2**62)
    got = {}
    for k, lbl in enumerate(ss.labels):
        s = int(dict(lbl)["s"])
        t, v = ss.series(k)
        assert (np.diff(t) > 0).all()
        for tt, bb in zip(t.tolist(), v.view(np.uint64).tolist()):
            got[(s, (tt - BASE) // 1000)] = bb
    assert got == model.stored


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([0, 10_000]), st.lists(op, min_size=1, max_size=12))
def test_store_matches_reference_model(window, ops):
    run_model(window, ops)


@pytest.mark.slow
@settings(max_examples=600, deadline=None)
@given(st.sampled_from([0, 10_000]), st.lists(op, min_size=1, max_size=25))
def test_store_matches_reference_model_long(window, ops):
    run_model(window, ops)


def run_model(window: int, ops: list) -> None:
    with tempfile.TemporaryDirectory() as d:
        opts = StorageOptions(out_of_order_window_ms=window)
        db = TSDB(d, opts, background=False)
        model = Model(window // 1000)
        try:
            for name, arg in ops:
                if name == "append":
                    items = [(SERIES[s], BASE + t * 1000, v) for s, t, v in arg]
                    batch = SampleBatch(list(SERIES), np.array([s for s, _, _ in arg]), np.array([x[1] for x in items]),
                                        np.array([v for _, _, v in arg]))
                    r = db.append(batch)
                    # the model works in seconds; the window too
                    want = model.append(arg)
                    assert (r.accepted, r.duplicates, r.rejected) == want, (arg, r)
                    # the per-sample answer the ingest sinks split batches by
                    assert r.accepted_mask is not None and r.accepted_mask.dtype == bool and len(r.accepted_mask) == len(arg)
                    assert np.flatnonzero(r.accepted_mask).tolist() == model.accepted_positions, (arg, r)
                elif name == "flush":
                    db.flush_head()
                    model.flush()
                elif name == "compact":
                    db.compact()
                else:
                    db.close()
                    db = TSDB(d, opts, background=False)
                    model.restart()
                check_reads(db, model)
        finally:
            db.close()
