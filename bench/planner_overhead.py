"""What the planner costs queries no summary serves: the planned engine (query log, pattern learning,
the rewrite hook) against the plain engine on the same store, same query, alternating.

In-process, one TSDB (no HTTP): 63 vLLM-like counters (4 models) and 63 gauges, 2 h at 5 s. The
planner has a plan for the gauges only (``--with-plan``, default on), so the counter queries below
are served raw by both engines: the difference is the planner's overhead on them. Each query at 1
step (a refresh's newest step, an alert rule) and at 241 steps (a 1 h panel at 15 s); medians of
``--reps`` (300). Runs ~1 minute.

By default the planner here adopts nothing by itself and keeps no step answers (``min_count`` 1e9,
``step_cache_bytes`` 0), so every planned run is a raw evaluation plus the planner's bookkeeping.
``--defaults`` runs the planner with its defaults instead (pattern learning and adoption, step
answers on) and asks each query at a grid shifted by one more millisecond per repetition, as one-off
queries are (an ad-hoc query in the explorer, a panel's first load): no step answer is reused, the
step-answer admission and the query log see every one. The planned runs a summary answered (the
planner may adopt a plan for the counters too) are counted and left out of the medians.

    .venv/bin/python bench/planner_overhead.py [--reps 300] [--no-plan] [--defaults]
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
    ap.add_argument("--defaults", action="store_true",
                    help="the planner's defaults (adoption, step answers) and one-off grids (see above)")
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
    cfg: dict = {"background_backfill": False, "canary_fraction": 0.0}
    if not a.defaults:
        cfg.update({"min_count": 10**9, "step_cache_bytes": 0})
    st = build(db, plain, None, cfg)
    if not a.no_plan:
        for b in batches:
            st.summarizer.consume(b)
        st.planner.adopt(SDSSpec("kv_usage", "exact", 60_000), reason="bench")
    end = (now - 30_000) // step * step
    print(f"{'query':52s} {'steps':>5s} {'plain ms':>9s} {'planned ms':>11s} {'overhead':>16s}"
          + (" summary-served" if a.defaults else ""))
    for q in QUERIES:
        for steps in (1, 241):
            t_plain, t_planned = [], []
            served = 0
            for r in range(a.reps + 10):
                e = end - (r if a.defaults else 0)  # --defaults: a grid no earlier run used
                t0 = time.perf_counter()
                if r % 2:
                    plain.range_query(q, e - (steps - 1) * step, e, step)
                t1 = time.perf_counter()
                res = st.engine.range_query(q, e - (steps - 1) * step, e, step)
                t2 = time.perf_counter()
                if not r % 2:
                    plain.range_query(q, e - (steps - 1) * step, e, step)
                t3 = time.perf_counter()
                if r < 10:
                    continue
                if any(p.startswith("summary:") for p in res.stats.paths):
                    served += 1
                    continue
                t_planned.append(t2 - t1)
                t_plain.append(t1 - t0 if r % 2 else t3 - t2)
            if not t_planned:
                print(f"{q[:52]:52s} {steps:5d} every planned run was summary-served ({served})", flush=True)
                continue
            p0, p1 = 1e3 * statistics.median(t_plain), 1e3 * statistics.median(t_planned)
            print(f"{q[:52]:52s} {steps:5d} {p0:9.3f} {p1:11.3f} {p1 - p0:+8.3f} ms {100 * (p1 / p0 - 1):+5.1f}%"
                  + (f" {served}/{a.reps}" if a.defaults else ""), flush=True)
    if a.defaults:  # plans the planner adopted by itself meanwhile (their queries pay the rewrite hook)
        print("plans at the end:", ", ".join(sorted(st.planner.sds)) or "none")
    st.planner.stop()
    st.query_log.close()
    db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
