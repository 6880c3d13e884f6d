"""WAL replay time: write N samples through TSDB.append (WAL fsync=never for setup speed), close,
then time reopening the store (replay of the WAL into the head). Target: 10M samples < 10 s.

usage: .venv/bin/python bench/storage_replay.py [--samples 10000000] [--series 10000] [--per-batch 10] [--repeats 3]
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
from storage.matchers import Matcher  # noqa: E402
from storage.options import StorageOptions  # noqa: E402
from storage.tsdb import TSDB  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=10_000_000)
    ap.add_argument("--series", type=int, default=10_000)
    ap.add_argument("--per-batch", type=int, default=10, help="samples per series per append (1 = scrape-shaped records)")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    opts = StorageOptions(wal_fsync="never", block_duration_ms=10**13, retention_ms=0)
    series = [make_labels({"__name__": f"m{i % 100}", "instance": f"host-{i // 100}", "job": "bench"}) for i in range(a.series)]
    per = a.per_batch
    idx = np.repeat(np.arange(a.series), per)
    rng = np.random.default_rng(0)
    t0 = int(time.time() * 1000) - 30 * 86_400_000
    with tempfile.TemporaryDirectory() as d:
        db = TSDB(d, opts, background=False)
        written = 0
        k = 0
        w0 = time.perf_counter()
        while written < a.samples:
            ts = t0 + (k * per + np.tile(np.arange(per), a.series)) * 1000
            r = db.append(SampleBatch(series, idx, ts, rng.normal(size=len(idx))))
            written += r.accepted
            k += 1
        wdt = time.perf_counter() - w0
        db.close()
        wal_bytes = sum(p.stat().st_size for p in (Path(d) / "wal").iterdir())
        print(f"wrote {written} samples in {k} appends ({wdt:.1f}s, {written / wdt / 1e6:.2f} M/s); WAL {wal_bytes / 1e6:.0f} MB")
        times = []
        for _ in range(a.repeats):
            s0 = time.perf_counter()
            db = TSDB(d, opts, background=False)
            dt = time.perf_counter() - s0
            n = db.head.num_samples
            q0 = time.perf_counter()
            ss = db.select([Matcher("__name__", "=", "m7")], 0, 2**62)
            qdt = time.perf_counter() - q0
            db.close()
            assert n == written, (n, written)
            times.append(dt)
            print(f"replay: {dt:.2f}s for {n} samples ({n / dt / 1e6:.2f} M samples/s); first select of {ss.num_samples} samples {qdt:.2f}s")
        print(f"median replay {statistics.median(times):.2f}s ({written} samples, {a.series} series, {per} samples/series/record)")


if __name__ == "__main__":
    main()
