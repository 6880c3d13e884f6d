"""Where scrape-shaped append time goes: per-phase cost of TSDB.append (one thread).

usage: .venv/bin/python bench/storage_append_phases.py [--fsync never|batch|always] [--shape scrape|wide]

Same batches as bench/storage_append.py (scrape: 10000 series x 1 sample per batch); each phase
(label -> id lookup, validation, WAL encode + write, WAL sync, head insert) is timed around the
call, per batch, and printed as ms per batch and share of the total.
"""
from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.storage_append import batches  # noqa: E402
from storage.options import StorageOptions  # noqa: E402
from storage.tsdb import TSDB  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsync", default="never")
    ap.add_argument("--shape", default="scrape")
    ap.add_argument("--samples", type=int, default=2_000_000)
    a = ap.parse_args()
    acc: dict[str, float] = collections.defaultdict(float)

    def timed(obj, name: str, label: str) -> None:
        f = getattr(obj, name)

        def w(*args, **kw):
            t = time.perf_counter()
            try:
                return f(*args, **kw)
            finally:
                acc[label] += time.perf_counter() - t
        setattr(obj, name, w)

    bs = batches(a.shape, a.samples, int(time.time() * 1000) - 4 * 86_400_000)
    with tempfile.TemporaryDirectory() as d:
        db = TSDB(d, StorageOptions(wal_fsync=a.fsync, block_duration_ms=10**12, retention_ms=0), background=False)
        db.append(bs[0])  # series created: later batches are the steady state
        timed(db.index, "ids_for", "label -> id lookup")
        timed(db.head, "prepare", "validation")
        timed(db.wal, "log_samples", "WAL encode + write")
        timed(db.wal, "sync", "WAL sync")
        timed(db.head, "commit", "head insert")
        start = time.perf_counter()
        for b in bs[1:]:
            db.append(b)
        total = time.perf_counter() - start
        db.close()
    n = len(bs) - 1
    print(f"{a.shape} fsync={a.fsync}: {total * 1e3 / n:.2f} ms per batch, {sum(len(b) for b in bs[1:]) / total / 1e6:.2f} M samples/s")
    for k, v in acc.items():
        print(f"  {k:22s} {v * 1e3 / n:6.2f} ms/batch  {v / total * 100:5.1f}%")


if __name__ == "__main__":
    main()
