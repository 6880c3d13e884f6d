"""What the planner costs queries no summary serves: the planned engine (query log, pattern learning,
the rewrite hook) against the plain engine on the same store, same query, alternating.

In-process, one TSDB (no HTTP): 63 vLLM-like counters (4 models) and 63 gauges, 2 h at 5 s. The
planner has a plan for the gauges only (``--with-plan``, default on), so the counter queries below
are served raw by both engines: the difference is the planner's overhead on them. Each query at 1
step (a refresh's newest step, an alert rule) and at 241 steps (a 1 h panel at 15 s); medians of
``--reps`` (300). Runs ~1 minute.

    .venv/bin/python bench/planner_overhead.py [--reps 300] [--no-plan]
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

from planner.sds import SDSSpec  # noqa: E402
from planner.stack import build  # noqa: E402
from promql.engine import Engine  # noqa: E402
from storage.batch import SampleBatch  # noqa: E402
from storage.labels import make_labels  # noqa: E402
from storage.tsdb import TSDB  # noqa: E402

QUERIES = ["vector(1)",
           "sum by (model_name) (rate(req_total[5m]))",
           "topk(3, sum by (instance) (rate(req_total[5m])))",
           "histogram_quantile(0.9, sum by (le) (rate(req_total[5m])))",
           "max_over_time(req_total[10m])"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--no-plan", action="store_true", help="no plan at all (else one on the gauge metric)")
    a = ap.parse_args()
    S, step = 63, 15_000
    now = int(time.time() * 1000) // 5000 * 5000
    counters = [make_labels({"__name__": "req_total", "model_name": f"m{i % 4}", "instance": f"i{i}"}) for i in range(S)]
    gauges = [make_labels({"__name__": "kv_usage", "model_name": f"m{i % 4}", "instance": f"i{i}"}) for i in range(S)]
    db = TSDB(tempfile.mkdtemp(prefix="planner-overhead-"), background=False)
    rng = np.random.default_rng(1)
    c = np.zeros(S)
    batches = []
    for t in range(now - 2 * 3_600_000, now + 1, 5000):
        c = c + rng.random(S)
        b = SampleBatch(counters + gauges, np.arange(2 * S), np.full(2 * S, t, np.int64),
                        np.concatenate([c, rng.random(S)]))
        db.append(b)
        batches.append(b)
    db.head.seal()
    plain = Engine(db)
    st = build(db, plain, None, {"background_backfill": False, "canary_fraction": 0.0, "min_count": 10**9,
                                 "step_cache_bytes": 0})
    if not a.no_plan:
        for b in batches:
            st.summarizer.consume(b)
        st.planner.adopt(SDSSpec("kv_usage", "exact", 60_000), reason="bench")
    end = (now - 30_000) // step * step
    print(f"{'query':52s} {'steps':>5s} {'plain ms':>9s} {'planned ms':>11s} {'overhead':>16s}")
    for q in QUERIES:
        for steps in (1, 241):
            t_plain, t_planned = [], []
            for r in range(a.reps + 10):
                pair = ((plain, t_plain), (st.engine, t_planned))
                for eng, out in (pair if r % 2 else pair[::-1]):
                    t0 = time.perf_counter()
                    eng.range_query(q, end - (steps - 1) * step, end, step)
                    if r >= 10:
                        out.append(time.perf_counter() - t0)
            p0, p1 = 1e3 * statistics.median(t_plain), 1e3 * statistics.median(t_planned)
            print(f"{q[:52]:52s} {steps:5d} {p0:9.3f} {p1:11.3f} {p1 - p0:+8.3f} ms {100 * (p1 / p0 - 1):+5.1f}%", flush=True)
    st.planner.stop()
    st.query_log.close()
    db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
