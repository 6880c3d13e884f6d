"""Crash safety: a subprocess appends and acknowledges batches while head cuts, WAL checkpoints and
compactions run in the background; it is killed with SIGKILL at random points over several
cycles. After restart every acknowledged sample is present, exactly once, with its exact value."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from storage.matchers import Matcher
from storage.options import StorageOptions
from tests.helpers import REPO

NSERIES, PER_BATCH = 20, 10
T0 = (int(time.time() * 1000) - 3_600_000) // 1000 * 1000


def batch_for(k: int):
    """Deterministic content of batch k: NSERIES series x PER_BATCH samples, 100 ms apart."""
    from storage.batch import SampleBatch
    from storage.labels import make_labels

    series = [make_labels({"__name__": "crash_test", "s": str(i), "kind": ("a", "b")[i % 2]}) for i in range(NSERIES)]
    idx = np.repeat(np.arange(NSERIES), PER_BATCH)
    ts = T0 + k * 1000 + np.tile(np.arange(PER_BATCH) * 100, NSERIES)
    vals = (k * 1000 + idx * 10 + np.tile(np.arange(PER_BATCH), NSERIES)).astype(np.float64)
    return SampleBatch(series, idx, ts, vals)


def worker(data_dir: str, ack_path: str, t0: int, fsync: str) -> None:
    """Run in a subprocess: resume after the last acknowledged batch, append forever."""
    global T0
    T0 = t0
    from storage.tsdb import TSDB

    opts = StorageOptions(block_duration_ms=20_000, wal_fsync=fsync, wal_segment_bytes=64 * 1024)
    db = TSDB(data_dir, opts, background=True, maintenance_interval_s=0.05)
    acked = read_acks(Path(ack_path))
    k = (max(acked) + 1) if acked else 0
    fd = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    while True:
        # Sometimes re-send the previous batch first: a retried write must be idempotent.
        if k > 0 and k % 7 == 0:
            r = db.append(batch_for(k - 1))
            assert r.rejected_total == 0, r
        r = db.append(batch_for(k))
        assert r.rejected_total == 0, r
        os.write(fd, f"{k}\n".encode())
        k += 1


def read_acks(path: Path) -> list[int]:
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.split("\n")[:-1]  # a torn last line has no newline yet
    return [int(x) for x in lines if x]


def test_sigkill_cycles_lose_no_acknowledged_sample(tmp_path):
    run_cycles(tmp_path, cycles=6, seed=12345)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_many_cycles(tmp_path, seed):
    run_cycles(tmp_path, cycles=25, seed=seed)


def run_cycles(tmp_path: Path, cycles: int, seed: int) -> None:
    data, acks = tmp_path / "data", tmp_path / "acks"
    rng = random.Random(seed)
    for cycle in range(cycles):
        fsync = ("always", "batch", "never")[cycle % 3]
        code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from tests.test_storage_crash import worker; "
                f"worker({str(data)!r}, {str(acks)!r}, {T0}, {fsync!r})")
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stderr=subprocess.PIPE)
        try:
            before = len(read_acks(acks))
            deadline = time.time() + 60
            # wait until this cycle acknowledged something, then a random extra delay
            while len(read_acks(acks)) == before and time.time() < deadline and proc.poll() is None:
                time.sleep(0.02)
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            time.sleep(rng.uniform(0.2, 1.5))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            if proc.stderr:
                proc.stderr.close()
    acked = read_acks(acks)
    assert len(acked) > 20 and acked == list(range(len(acked)))

    from storage.tsdb import TSDB

    with TSDB(str(data), StorageOptions(block_duration_ms=20_000), background=False) as db:
        ss = db.select([Matcher("__name__", "=", "crash_test")], 0, 2**62)
        assert len(ss) == NSERIES
        assert len(db.stats()["blocks"]) >= 1, "the run should have persisted blocks"
        n_batches = len(acked)
        for si, labels in enumerate(ss.labels):
            i = int(dict(labels)["s"])
            t, v = ss.series(si)
            assert (np.diff(t) > 0).all(), "duplicated or unsorted samples"
            # every acknowledged sample present with its exact value
            want_t = (T0 + np.arange(n_batches)[:, None] * 1000 + np.arange(PER_BATCH)[None, :] * 100).ravel()
            want_v = (np.arange(n_batches)[:, None] * 1000 + i * 10 + np.arange(PER_BATCH)[None, :]).ravel().astype(float)
            pos = np.searchsorted(t, want_t)
            assert (pos < len(t)).all() and (t[np.minimum(pos, len(t) - 1)] == want_t).all(), f"series {i} lost acknowledged samples"
            assert (v[pos] == want_v).all()
            # anything beyond the acknowledged batches is a whole, correct later batch (written, not acked)
            extra = t >= T0 + n_batches * 1000
            kk = (t[extra] - T0) // 1000
            jj = (t[extra] - T0) % 1000 // 100
            assert (v[extra] == kk * 1000 + i * 10 + jj).all()
