"""Where do the milliseconds of a summary-served query go? In-process profile of the bench's panels.

Builds a TSDB like ``bench/planner_bench.py`` (``--inst`` x 10 series, ``--history-days`` at 5 min, then
``--minutes`` at ``--rate`` samples/s), pins the bench's 4 SDS (backfilled in the foreground), then for
every panel shape runs: the plain engine (raw), ``PlannedEngine`` (summary path) cold and on a refresh
``--refresh-s`` later, reporting medians; ``--profile`` prints a cProfile of the served path per panel.

    .venv/bin/python bench/planner_profile.py [--minutes 20] [--profile] [--only histogram_quantile]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.planner_bench import series_defs, values_for  # noqa: E402
from planner.stack import build  # noqa: E402
from promql.engine import Engine  # noqa: E402
from promql.query_opts import QueryOpts  # noqa: E402
from storage.batch import SampleBatch  # noqa: E402
from storage.labels import make_labels  # noqa: E402
from storage.options import StorageOptions  # noqa: E402
from storage.tsdb import TSDB  # noqa: E402
from turboprom.api_json import encode_query_result  # noqa: E402

PANELS = [
    ("histogram_quantile 24h/1h", "histogram_quantile(0.9, sum by (le) (rate(lat_bucket[24h])))", 3_600_000),
    ("histogram_quantile 5m/6h", "histogram_quantile(0.9, sum by (le) (rate(lat_bucket[5m])))", 6 * 3_600_000),
    ("histogram_quantile 1h/1h", "histogram_quantile(0.99, sum by (le) (rate(lat_bucket[1h])))", 3_600_000),
    ("avg_over_time 1h/1h", "avg_over_time(gpu_util[1h])", 3_600_000),
    ("max_over_time 5m/1h", "max(max_over_time(gpu_util[5m]))", 3_600_000),
    ("count_over_time 5m/24h", "count_over_time(gpu_util[5m])", 24 * 3_600_000),
    ("sum_over_time 15m/6h", "sum by (job) (sum_over_time(gpu_util[15m]))", 6 * 3_600_000),
    ("stddev_over_time 24h/24h", "stddev_over_time(gpu_util[24h])", 24 * 3_600_000),
    ("avg_over_time 6h/24h", "avg_over_time(gpu_util[6h])", 24 * 3_600_000),
    ("nested 1h/24h", "max by (job) (avg_over_time(gpu_util[1h]))", 24 * 3_600_000),
    ("nested rate 15m/6h", "avg(sum by (job) (rate(req_total[15m])))", 6 * 3_600_000),
    ("rate 5m/1h", "rate(req_total[5m])", 3_600_000),
    ("quantile by 1h/6h", "quantile by (job) (0.9, rate(req_total[1h]))", 6 * 3_600_000),
    ("quantile_over_time 24h/24h", "quantile_over_time(0.9, gpu_util[24h])", 24 * 3_600_000),
    ("quantile_over_time 5m/1h", "quantile_over_time(0.5, gpu_util[5m])", 3_600_000),
]


def fill(db: TSDB, inst: int, minutes: float, rate: float, history_days: float, seed: int = 1) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    defs = series_defs(inst)
    labels = [make_labels(d) for d in defs]
    S = len(defs)
    interval_ms = max(1, int(round(S * 1000 / rate)))
    now = int(time.time() * 1000) // 60_000 * 60_000
    recent_end = now - 60_000
    recent_start = recent_end - int(minutes * 60_000)
    hist_ts = np.arange(recent_start - int(history_days * 86_400_000), recent_start, 300_000)
    state: dict = {}

    def push(ts: np.ndarray, vals: np.ndarray) -> None:
        n = len(ts)
        b = SampleBatch(labels, np.repeat(np.arange(S, dtype=np.int64), n), np.tile(ts, S), vals.reshape(-1))
        db.append(b)

    hv = values_for(defs, hist_ts, rng, state)
    for ch in np.array_split(np.arange(len(hist_ts)), max(1, len(hist_ts) // 200)):
        push(hist_ts[ch], hv[:, ch])
    rec_ts = np.arange(recent_start, recent_end, interval_ms)
    for ch in np.array_split(np.arange(len(rec_ts)), max(1, len(rec_ts) // max(1, 40_000 // S))):
        push(rec_ts[ch], values_for(defs, rec_ts[ch], rng, state))
    return recent_start, recent_end


def med(xs: list[float]) -> float:
    return float(np.median(xs)) * 1000 if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inst", type=int, default=20)
    ap.add_argument("--rate", type=float, default=8000)
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--history-days", type=float, default=7)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--refresh-s", type=int, default=30)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--overhead-reps", type=int, default=30)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="planner-profile-"))
    try:
        db = TSDB(str(work / "data"), StorageOptions(wal_fsync="never"), background=False)
        t0 = time.time()
        _, recent_end = fill(db, args.inst, args.minutes, args.rate, args.history_days)
        db.maintain()  # what the server's maintenance loop does: block cuts, compaction, head runs sealed
        db.head.seal()
        print(f"filled in {time.time() - t0:.1f}s", flush=True)
        eng = Engine(db)
        pinned = [{"metric": m, "algorithm": a, "history": "2d"} for m, a in
                  (("gpu_util", "exact"), ("req_total", "exact"), ("lat_bucket", "exact"), ("gpu_util", "kll"))]
        st = build(db, eng, None, {"canary_fraction": 0, "background_backfill": False, "pinned": pinned})
        st.summarizer.note_time(recent_end)
        print(f"backfilled in {time.time() - t0:.1f}s", flush=True)
        pe = st.engine
        print(f"{'panel':30s} {'raw ms':>8s} {'cold ms':>8s} {'refresh ms':>10s} {'same ms':>8s}  paths")
        for name, q, span in PANELS:
            if args.only and args.only not in name:
                continue
            step = max(15, span // 1000 // 120 // 15 * 15) * 1000
            end = recent_end // step * step
            start = end - span
            raw_t, cold_t, ref_t, same_t = [], [], [], []
            for r in range(args.reps):
                t = time.perf_counter()
                eng.range_query(q, start, end, step)
                raw_t.append(time.perf_counter() - t)
            for r in range(args.reps):
                # a fresh dashboard position each rep (cold for any cache), then its refresh and a repeat
                e0 = end - (args.reps - r) * 7 * step
                t = time.perf_counter()
                pe.range_query(q, e0 - span, e0, step)
                cold_t.append(time.perf_counter() - t)
                e1 = e0 + args.refresh_s * 1000 // step * step + step
                t = time.perf_counter()
                res = pe.range_query(q, e1 - span, e1, step)
                ref_t.append(time.perf_counter() - t)
                t = time.perf_counter()
                pe.range_query(q, e1 - span, e1, step)
                same_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            body = encode_query_result(res, stats="all")
            enc = time.perf_counter() - t
            print(f"{name:30s} {med(raw_t):8.1f} {med(cold_t):8.1f} {med(ref_t):10.1f} {med(same_t):8.1f} "
                  f"{enc * 1000:6.1f} ms JSON ({len(body) // 1024} KiB)  {','.join(res.stats.paths)}", flush=True)
            if args.profile:
                pr = cProfile.Profile()
                pr.enable()
                for r in range(3):
                    e2 = end + (r + 1) * step
                    pe.range_query(q, e2 - span, e2, step)
                pr.disable()
                s = io.StringIO()
                pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(28)
                print(s.getvalue())
        # planner overhead on queries no SDS serves: planned vs plain engine, same query, interleaved
        for q in ("sum by (job) (gpu_util)", "vector(1)", "sum(rate(req_total[5m]))"):
            end = recent_end // 30_000 * 30_000
            plain, planned = [], []
            for r in range(args.overhead_reps):
                t = time.perf_counter()
                eng.range_query(q, end - 3_600_000, end, 30_000)
                plain.append(time.perf_counter() - t)
                t = time.perf_counter()
                res = pe.range_query(q, end - 3_600_000, end, 30_000, QueryOpts(exact=q.startswith("sum(rate")))
                planned.append(time.perf_counter() - t)
            print(f"overhead {q:32s} plain {med(plain):7.2f} ms  planned {med(planned):7.2f} ms  "
                  f"(+{med(planned) - med(plain):.2f} ms) {','.join(res.stats.paths)}", flush=True)
        st.query_log.close()
        db.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
