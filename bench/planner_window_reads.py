"""Window reads from an exact plan at the live tip: kept running sums vs sums rebuilt per read vs raw.

In process, no HTTP. A TSDB and an exact SDS (15 s panes, ``rate`` fields) are fed the same
scrape-shaped batches: ``--instances`` engines x 23 TTFT histogram buckets (vLLM's), one sample per
series every 5 s with 0-3 s of jitter, ``--minutes`` of history (130: the hour of windows of a whole
1 h panel reach back two hours), all folded live. Then, for windows of
5 minutes and of an hour ending at the newest 15 s step, for 1, 2, 4 and 241 steps (a rule's instant
query, a refresh's newest steps, a whole 1 h panel):

* ``kept sums``: the pane part of the windows from ``ExactPaneStore.window_stats`` (planner/pane_prefix.py),
* ``rebuilt``: the same from ``pane_arrays`` + ``range_stats`` (sums rebuilt over the windows' panes on
  every read: the path before the kept sums), answers checked equal (1e-12 relative),
* ``scan``: the whole exact scan (``summary_scan.scan_exact``: raw edges, panes, finish), every window
  computed (the plan's step cache emptied before each read),
* ``raw``: the raw engine's ``rate`` over the same windows (``promql.engine.Engine``, selection included).

Medians of ``--repeats`` reads each, the variants interleaved.

    .venv/bin/python bench/planner_window_reads.py [--instances 63] [--minutes 130] [--repeats 200]
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

from planner.pane_ranges import range_stats  # noqa: E402
from planner.sds import SDS, SDSSpec  # noqa: E402
from planner.summarizer import Summarizer  # noqa: E402
from planner.summary_scan import _recent_plans, scan_exact  # noqa: E402
from promql.engine import Engine  # noqa: E402
from storage.batch import SampleBatch  # noqa: E402
from storage.labels import make_labels  # noqa: E402
from storage.matchers import Matcher  # noqa: E402
from storage.options import StorageOptions  # noqa: E402
from storage.tsdb import TSDB  # noqa: E402

BUCKETS = ("0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1.0", "2.5",
           "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0", "+Inf")
PANE_MS = 15_000
STEP_MS = 15_000
FIELDS = frozenset({"count", "first_t", "first_v", "last_t", "last_v", "corr"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--instances", type=int, default=63)
    ap.add_argument("--minutes", type=float, default=130.0)
    ap.add_argument("--repeats", type=int, default=200)
    a = ap.parse_args()
    metric = "vllm:time_to_first_token_seconds_bucket"
    series = [make_labels({"__name__": metric, "instance": f"engine-{i}", "model_name": f"model-{i % 3}", "le": le})
              for i in range(a.instances) for le in BUCKETS]
    n = len(series)
    rng = np.random.default_rng(1)
    db = TSDB(tempfile.mkdtemp(prefix="window-reads-"), StorageOptions(wal_fsync="never", retention_ms=0), background=False)
    sds = SDS(SDSSpec(metric, "exact", PANE_MS, params=(("fields", ",".join(sorted(FIELDS | {"entry_corr"}))),)))
    summ = Summarizer(None)
    now = int(time.time()) * 1000 // 5000 * 5000
    t0 = now - int(a.minutes * 60_000)
    summ.start_live(sds, live_from_ts=t0 - 1)
    sds.cov_lo = t0 // PANE_MS + 1
    ids = np.arange(n)
    vals = np.zeros(n)
    for t in range(t0, now + 1, 5000):
        vals += rng.integers(0, 5, n)
        ts = np.full(n, t, np.int64) - np.repeat(rng.integers(0, 3000, a.instances), len(BUCKETS))
        b = SampleBatch(series, ids, ts, vals.copy())
        db.append(b)
        summ.consume(b)
        db.head.seal()
    summ.flush()
    store = sds.store
    matchers = [Matcher("__name__", "=", metric)]
    sel = sds.registry.match(matchers, None)
    eng = Engine(db)
    cov_lo, cov_hi = sds.coverage()
    end = now // STEP_MS * STEP_MS
    print(f"{n} series ({a.instances} engines x {len(BUCKETS)} buckets), {a.minutes:g} min at 5 s, 15 s panes; "
          f"medians of {a.repeats}\n")
    print("| window | steps | kept sums ms | rebuilt ms | kept / rebuilt | scan ms | raw ms | scan / raw |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for range_ms in (300_000, 3_600_000):
        for steps in (1, 2, 4, 241):
            ends = np.arange(end - (steps - 1) * STEP_MS, end + 1, STEP_MS, dtype=np.int64)
            khi = np.minimum(ends // PANE_MS, cov_hi)
            klo = np.maximum((ends - range_ms) // PANE_MS + 1, cov_lo)
            klo = np.minimum(klo, khi)
            ka, kb = int(klo.min()), int(khi.max())

            def kept() -> object:
                return store.window_stats(sel, klo, khi, FIELDS)

            def rebuilt() -> object:
                return range_stats(store.pane_arrays(sel, ka, kb, FIELDS), klo - ka, khi - ka, FIELDS)

            x, y = kept(), rebuilt()
            for f in ("count", "corr", "first_t", "first_v", "last_t", "last_v"):
                np.testing.assert_allclose(getattr(x, f), getattr(y, f), rtol=1e-12, err_msg=f)

            def scan() -> object:
                _recent_plans.clear()  # each read plans its windows, as a refresh moving on does ...
                store.step_cache = None  # ... and computes them (no answers kept from the last read)
                return scan_exact(sds, db, matchers, "rate", ends, range_ms)

            q = f"rate({metric}[{range_ms // 1000}s])"

            def raw() -> object:
                return eng.range_query(q, int(ends[0]), int(ends[-1]), STEP_MS)

            times: dict[str, list[float]] = {k: [] for k in ("kept", "rebuilt", "scan", "raw")}
            for _ in range(a.repeats):
                for name, fn in (("kept", kept), ("rebuilt", rebuilt), ("scan", scan), ("raw", raw)):
                    t = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t)
            m = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            print(f"| {range_ms // 60_000} min | {steps} | {m['kept']:.3f} | {m['rebuilt']:.3f} | {m['kept'] / m['rebuilt']:.2f} "
                  f"| {m['scan']:.3f} | {m['raw']:.3f} | {m['scan'] / m['raw']:.2f} |")
    db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
