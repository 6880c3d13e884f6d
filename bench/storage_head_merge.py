"""The head's sorted runs under scrape-shaped ingest: sort and LSM-merge cost per row, compiled merge
(storage/csrc/merge_native.c) against the numpy merge, same data.

Replays what ``Head.seal`` does once a second (storage/head.py): the rows appended in that second
(``--targets`` scrapes of ``--series`` series each, e.g. 20 node-exporter scrapes of 507 series per
second = 100 targets at 5 s) are sorted into a run, and the newest runs are merged while the older
of the last two is at most twice the newer, for ``--seals`` seconds of head. Prints ns per appended
row for the sort and for the merges, and how often each row was rewritten by a merge.

    .venv/bin/python bench/storage_head_merge.py [--seals 1800] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage import columns  # noqa: E402
from storage.columns import merge_sorted_parts, sort_by_series_time  # noqa: E402


def replay(seals: int, scrapes: int, series: int, targets: int, seed: int) -> tuple[float, float, float]:
    rng = np.random.default_rng(seed)
    runs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    t_sort = t_merge = 0.0
    moved = 0
    t0 = 1_700_000_000_000
    base = np.arange(series, dtype=np.int64)
    for k in range(seals):
        tg = rng.integers(0, targets, scrapes)
        sid = (tg[:, None] * series + base[None, :]).ravel()
        ts = np.int64(t0 + k * 1000) + np.repeat(np.arange(scrapes, dtype=np.int64) * (1000 // scrapes), series)
        val = rng.random(len(sid))
        a = time.perf_counter()
        run = sort_by_series_time(sid, ts, val)
        b = time.perf_counter()
        t_sort += b - a
        runs.append(run)
        while len(runs) >= 2 and len(runs[-2][0]) <= 2 * len(runs[-1][0]):
            y, x = runs.pop(), runs.pop()
            moved += len(x[0]) + len(y[0])
            runs.append(merge_sorted_parts([x, y]))
        t_merge += time.perf_counter() - b
    n = seals * scrapes * series
    return t_sort / n * 1e9, t_merge / n * 1e9, moved / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seals", type=int, default=1800, help="seconds of head (one seal a second)")
    ap.add_argument("--scrapes", type=int, default=20, help="scrapes appended per second")
    ap.add_argument("--series", type=int, default=507, help="series per scrape")
    ap.add_argument("--targets", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    if columns._merge2_native is None:
        raise SystemExit("storage._merge_native is not built: run `make native`")
    print(f"{a.seals} seals of {a.scrapes} x {a.series} rows ({a.seals * a.scrapes * a.series:,} rows), medians of {a.repeats}")
    res: dict[str, list[tuple[float, float, float]]] = {"compiled": [], "numpy": []}
    for r in range(a.repeats):  # interleaved, same data per repeat
        for name, native in (("compiled", True), ("numpy", False)):
            columns.USE_NATIVE_MERGE = native
            res[name].append(replay(a.seals, a.scrapes, a.series, a.targets, seed=r))
    for name, rows in res.items():
        sort = statistics.median(x[0] for x in rows)
        merge = statistics.median(x[1] for x in rows)
        print(f"{name:9s} sort {sort:6.1f} ns/row  merges {merge:6.1f} ns/row  (each row rewritten {rows[0][2]:.1f}x)")
    ratio = statistics.median(x[1] for x in res["numpy"]) / statistics.median(x[1] for x in res["compiled"])
    print(f"merges, numpy / compiled: {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
