"""Read path: select() latency from the head, from blocks, and across both.

usage: .venv/bin/python bench/storage_select.py [--case all|bulk|edge|index] [--series 10000] [--hours 6] [--repeats 5]
                                                [--edge-minutes 20] [--edge-reads 400]

bulk: 10000 series at 15 s over 6 h (14.4M samples); selections of 10% of the series over the whole
range, 1% over 1 h, and one series-group (10 series). Prints the median latency and samples/s.

edge: the planner's raw "edge" reads. The head holds 20 minutes at 8k samples/s (8000 series
scraped every second, arriving as 8 scrape-sized batches of 1000 samples per second); reads of
200 series (one metric) over [t-2m, t] and [t-10m, t-8m]. Three states:
  - live: reads interleaved with ingest; the head is sealed every simulated second as the
    server's maintenance thread does (so reads see fresh runs and a little unsealed data);
  - stalled: maintenance has not sealed for 10 s (80k unsealed rows), then repeated reads;
  - unsealed: nothing sealed at all (the whole 20 minutes pending; background=False stores).
Prints median / p90 / max latency per read kind.

index: matchers -> series ids on an index of 200k series (1000 metrics x 200 instances), equality
matchers through SeriesIndex.match_ids vs a boolean mask over every id.
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


EDGE_SERIES, EDGE_BATCH, EDGE_METRICS = 8000, 1000, 40  # 8k samples/s; 200 series per metric


def edge_batches(start_s: int, seconds: int, series: list, rng: np.random.Generator):
    """Scrape-shaped batches: every second, 8 targets x 1000 series x 1 sample."""
    for sec in range(start_s, start_s + seconds):
        for k in range(0, EDGE_SERIES, EDGE_BATCH):
            ts = np.full(EDGE_BATCH, sec * 1000, dtype=np.int64)
            yield sec, SampleBatch(series[k:k + EDGE_BATCH], np.arange(EDGE_BATCH), ts, rng.normal(size=EDGE_BATCH))


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


def edge_case(minutes: int, reads: int) -> None:
    series = [make_labels({"__name__": f"edge_m{i % EDGE_METRICS}", "instance": f"host-{i // EDGE_METRICS}", "job": "bench"})
              for i in range(EDGE_SERIES)]
    ms = [Matcher("__name__", "=", "edge_m7")]
    rng = np.random.default_rng(1)
    now_s = int(time.time()) - 60
    start_s = now_s - minutes * 60
    kinds = (("[t-2m, t]", 120_000, 0), ("[t-10m, t-8m]", 600_000, 480_000))

    def read(db: TSDB, t_ms: int, out: dict) -> None:
        for name, back_lo, back_hi in kinds:
            t0 = time.perf_counter()
            ss = db.select(ms, t_ms - back_lo, t_ms - back_hi)
            out.setdefault(name, []).append(time.perf_counter() - t0)
            assert len(ss) in (0, 200)  # one metric: 200 series (none when the range precedes the data)

    def report(state: str, out: dict, extra: str = "") -> None:
        for name, xs in out.items():
            print(f"edge {state:9s} {name:14s} median {statistics.median(xs) * 1000:7.2f} ms  p90 {pct(xs, 0.9) * 1000:7.2f} ms"
                  f"  max {max(xs) * 1000:7.2f} ms  (n={len(xs)}){extra}")

    for state in ("live", "stalled", "unsealed"):
        with tempfile.TemporaryDirectory() as d:
            db = TSDB(d, StorageOptions(wal_fsync="never", retention_ms=0), background=False)
            t_load = time.perf_counter()
            last = None
            for sec, b in edge_batches(start_s, minutes * 60, series, rng):
                db.append(b)
                if state != "unsealed" and sec != last:
                    db.head.seal()  # the maintenance thread seals once a second
                    last = sec
            load_s = time.perf_counter() - t_load
            out: dict = {}
            sec = start_s + minutes * 60
            if state == "live":
                # each simulated second: 8 batches appended, a seal, then reads; `reads` reads in all
                gen = edge_batches(sec, reads, series, rng)
                for i in range(reads):
                    for _ in range(EDGE_SERIES // EDGE_BATCH):
                        s_, b = next(gen)
                        db.append(b)
                    db.head.seal()
                    read(db, (s_ + 1) * 1000, out)
            else:
                if state == "stalled":
                    for s_, b in edge_batches(sec, 10, series, rng):
                        db.append(b)
                    sec += 10
                for i in range(min(reads, 50)):
                    read(db, sec * 1000, out)
            report(state, out, f"  [head {db.head.num_samples / 1e6:.1f}M samples, load {load_s:.0f}s]")
            db.close()


def index_case(n_series: int, repeats: int) -> None:
    """Matchers -> ids on an index of n_series: equality matchers (postings probe) vs the mask path."""
    from storage.index import SeriesIndex
    idx = SeriesIndex()
    for i in range(n_series):
        idx.get_or_create(make_labels({"__name__": f"m{i % 1000}", "instance": f"h{i // 1000}", "job": "j"}))
    cases = [[Matcher("__name__", "=", "m7")], [Matcher("__name__", "=", "m7"), Matcher("job", "=", "j")],
             [Matcher("__name__", "=", "m7"), Matcher("instance", "=", "h3")]]
    for ms in cases:
        for name, f in (("mask over all ids", lambda m: np.flatnonzero(idx.match_mask(m))), ("match_ids", idx.match_ids)):
            f(ms)
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                r = f(ms)
                times.append(time.perf_counter() - t0)
            desc = ", ".join(f"{m.name}={m.value}" for m in ms)
            print(f"index {n_series} series  {desc:28s} {name:18s} median {statistics.median(times) * 1e6:8.1f} us  ({len(r)} ids)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=("all", "bulk", "edge", "index"), default="all")
    ap.add_argument("--series", type=int, default=10_000)
    ap.add_argument("--hours", type=float, default=6)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--edge-minutes", type=int, default=20)
    ap.add_argument("--edge-reads", type=int, default=200)
    a = ap.parse_args()
    if a.case in ("all", "index"):
        index_case(200_000, 200)
    if a.case == "index":
        return
    if a.case in ("all", "edge"):
        edge_case(a.edge_minutes, a.edge_reads)
    if a.case == "edge":
        return
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
