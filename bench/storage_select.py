"""Read path: select() latency from the head, from blocks, and across both.

usage: .venv/bin/python bench/storage_select.py [--series 10000] [--hours 6] [--repeats 5]

10000 series at 15 s over 6 h (14.4M samples); selections of 10% of the series over the whole
range, 1% over 1 h, and one series-group (10 series). Prints the median latency and samples/s.
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
from storage.options import HOUR_MS, StorageOptions  # noqa: E402
from storage.tsdb import TSDB  # noqa: E402


def timeit(db: TSDB, matchers, mint: int, maxt: int, repeats: int) -> tuple[float, int]:
    db.select(matchers, mint, maxt)  # warm (row-group cache, sealing)
    times = []
    n = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = db.select(matchers, mint, maxt).num_samples
        times.append(time.perf_counter() - t0)
    return statistics.median(times), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--series", type=int, default=10_000)
    ap.add_argument("--hours", type=float, default=6)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    series = [make_labels({"__name__": f"m{i % 10}", "instance": f"host-{i // 10}", "job": "bench"}) for i in range(a.series)]
    now = int(time.time() * 1000)
    n = int(a.hours * HOUR_MS / 15_000)
    t0 = now - n * 15_000
    per = 60
    idx = np.repeat(np.arange(a.series), per)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        db = TSDB(d, StorageOptions(wal_fsync="never", retention_ms=0), background=False)
        for k in range(0, n, per):
            ts = t0 + (k + np.tile(np.arange(per), a.series)) * 15_000
            db.append(SampleBatch(series, idx, ts, rng.normal(size=len(ts))))
        db.head.seal()
        cases = [("10% of series, whole range", [Matcher("__name__", "=", "m3")], t0, now),
                 ("1% of series (regex), last 1h", [Matcher("instance", "=~", "host-1[0-9]{1,2}")], now - HOUR_MS, now),
                 ("10 series, whole range", [Matcher("instance", "=", "host-5")], t0, now)]
        for where in ("head only", "blocks + head"):
            if where == "blocks + head":
                db.maintain()  # cuts the head ranges that are due into Parquet blocks
                st = db.stats()
                where += f" ({len(st['blocks'])} blocks, {st['headStats']['numSamples']} samples in head)"
            for name, ms, lo, hi in cases:
                dt, k = timeit(db, ms, lo, hi, a.repeats)
                print(f"{where:45s} {name:32s} {k:>9d} samples  median {dt * 1000:8.1f} ms  ({k / dt / 1e6:.1f} M samples/s)")
        db.close()


if __name__ == "__main__":
    main()
