"""Append throughput of storage.tsdb.TSDB from columnar SampleBatches (one thread = one core).

usage: .venv/bin/python bench/storage_append.py [--samples N] [--repeats R] [--fsync always|batch|never]

Shapes: 'wide'  = 1000 series x 100 samples per batch (remote-write backfill / rule output shaped)
        'scrape'= 10000 series x 1 sample per batch (one scrape of a big target)
Prints samples/s per shape (median over repeats) including WAL write (+ fsync per the policy).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage.batch import SampleBatch  # noqa: E402
from storage.labels import make_labels  # noqa: E402
from storage.options import StorageOptions  # noqa: E402
from storage.tsdb import TSDB  # noqa: E402


def batches(shape: str, total: int, t0: int):
    if shape == "wide":
        nser, per = 1000, 100
    else:
        nser, per = 10000, 1
    series = [make_labels({"__name__": f"metric_{i % 50}", "instance": f"host-{i // 50}:9100", "job": "node"}) for i in range(nser)]
    idx = np.repeat(np.arange(nser, dtype=np.int64), per)
    rng = np.random.default_rng(0)
    out = []
    nb = max(1, total // (nser * per))
    for b in range(nb):
        ts = t0 + (b * per + np.tile(np.arange(per), nser)) * 15_000
        vals = rng.normal(size=nser * per)
        out.append(SampleBatch(series, idx, ts, vals))
    return out


def run(shape: str, total: int, fsync: str) -> float:
    t0 = int(time.time() * 1000) - 400 * 86_400_000 // 100
    bs = batches(shape, total, t0)
    with tempfile.TemporaryDirectory() as d:
        db = TSDB(d, StorageOptions(wal_fsync=fsync, block_duration_ms=10**12, retention_ms=0), background=False)
        n = 0
        start = time.perf_counter()
        for b in bs:
            r = db.append(b)
            n += r.accepted
        dt = time.perf_counter() - start
        db.close()
    assert n == sum(len(b) for b in bs), n
    return n / dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=2_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fsync", default="always")
    a = ap.parse_args()
    for shape in ("wide", "scrape"):
        rates = [run(shape, a.samples, a.fsync) for _ in range(a.repeats)]
        print(f"{shape:7s} fsync={a.fsync}: median {statistics.median(rates) / 1e6:.2f} M samples/s "
              f"(min {min(rates) / 1e6:.2f}, max {max(rates) / 1e6:.2f}, n={a.repeats}, {a.samples} samples/run)")


if __name__ == "__main__":
    main()
