"""Ingest-side cost of summarization: live folding of scrape-shaped batches into SDS panes.

Feeds ``--minutes`` of data at ``--rate`` samples/s (same series shape as planner_bench.py) through a
``Summarizer`` holding the given SDSs, in batches of one timestamp per series (scrape-shaped) or
``--chunk`` timestamps per batch, and reports CPU seconds and ns per sample.

    .venv/bin/python bench/planner_fold_bench.py [--minutes 20] [--rate 8000] [--chunk 40]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from planner_bench import series_defs, values_for  # noqa: E402
from planner.sds import SDS, SDSSpec  # noqa: E402
from planner.summarizer import Summarizer  # noqa: E402
from storage.batch import SampleBatch  # noqa: E402
from storage.labels import make_labels  # noqa: E402

SPECS = [("gpu_util", "exact"), ("req_total", "exact"), ("lat_bucket", "exact"), ("gpu_util", "kll")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inst", type=int, default=20)
    ap.add_argument("--rate", type=float, default=8000)
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--chunk", type=int, default=40, help="timestamps per series per batch (1 = scrape-shaped)")
    a = ap.parse_args()
    defs = series_defs(a.inst)
    labels = [make_labels(d) for d in defs]
    S = len(defs)
    interval = max(1, int(round(S * 1000 / a.rate)))
    t0 = 1_800_000_000_000
    ts_all = np.arange(t0, t0 + int(a.minutes * 60_000), interval)
    rng = np.random.default_rng(0)
    state: dict = {}
    batches = []
    sids = np.arange(S, dtype=np.int64)
    for ch in np.array_split(np.arange(len(ts_all)), max(1, len(ts_all) // a.chunk)):
        ts = ts_all[ch]
        vals = values_for(defs, ts, rng, state)
        n = len(ts)
        # storage's series ids, as the ingest pipeline sets them on the batch it hands to sinks
        batches.append(SampleBatch(labels, np.repeat(np.arange(S), n), np.tile(ts, S), vals.reshape(-1),
                                   series_ids=sids))
    total = sum(len(b) for b in batches)
    results = {}
    for name, specs in (("none (sink only)", []), ("4 SDS (3 exact + 1 kll)", SPECS),
                        ("exact only", [s for s in SPECS if s[1] == "exact"]), ("kll only", [s for s in SPECS if s[1] == "kll"])):
        summ = Summarizer(None)
        for m, alg in specs:
            sds = SDS(SDSSpec(m, alg, 60_000))
            summ.start_live(sds, live_from_ts=t0)
        c0, w0 = time.thread_time(), time.perf_counter()
        for b in batches:
            summ.consume(b)
        cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
        results[name] = cpu
        print(f"{name:28} {total} samples in {len(batches)} batches: {cpu:.2f} CPU-s ({1e9 * cpu / total:.0f} ns/sample), "
              f"wall {wall:.2f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
