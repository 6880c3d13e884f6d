"""Sketch / group-pane / late-sample costs of the planner's newer algorithms (its docs/benchmarks.md section).

In process (no HTTP), same series shape as bench/planner_bench.py (``--inst`` instances x req_total,
gpu_util, 8-bucket lat_bucket; ``--minutes`` at ``--rate`` samples/s), ``--repeats`` runs, medians:

1. fold: live summarization CPU per sample of one SDS on gpu_util for each algorithm (exact, kll, req,
   group by job), batches of ``--chunk`` timestamps per series;
2. late: exact SDS on req_total with ``--late-pct`` % of the samples arriving late (after newer ones;
   affected panes rebuilt from raw) vs the same data in order;
3. query: quantile_over_time(0.99, gpu_util[1h]) over the last 6h at a 5m step from REQ, KLL and raw,
   with the observed rank error of the sketch answers; sum by (job) (sum_over_time(gpu_util[1h])) from
   group panes, per-series exact panes and raw; count(count by (job) (count_over_time(...))) from CPC,
   per-series exact panes and raw. Cold (first) and warm (refresh) timings.

    .venv/bin/python bench/sketch_bench.py [--minutes 20] [--rate 8000] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from planner_bench import series_defs, values_for  # noqa: E402
from planner.rewrite import RewriteHook  # noqa: E402
from planner.rewrite_rules import RewriteContext  # noqa: E402
from planner.sds import SDS, SDSSpec  # noqa: E402
from planner.summarizer import Summarizer  # noqa: E402
from promql.engine import Engine  # noqa: E402
from promql.query_opts import QueryOpts  # noqa: E402
from promql.memory_source import MemorySource  # noqa: E402
from storage.batch import SampleBatch  # noqa: E402
from storage.labels import make_labels  # noqa: E402


def make_batches(inst: int, rate: float, minutes: float, chunk: int, t0: int) -> list[SampleBatch]:
    defs = series_defs(inst)
    labels = [make_labels(d) for d in defs]
    S = len(defs)
    interval = max(1, int(round(S * 1000 / rate)))
    ts_all = np.arange(t0, t0 + int(minutes * 60_000), interval)
    rng = np.random.default_rng(0)
    state: dict = {}
    out = []
    for ch in np.array_split(np.arange(len(ts_all)), max(1, len(ts_all) // chunk)):
        ts = ts_all[ch]
        vals = values_for(defs, ts, rng, state)
        out.append(SampleBatch(labels, np.repeat(np.arange(S), len(ts)), np.tile(ts, S), vals.reshape(-1)))
    return out


def fold_cost(batches: list[SampleBatch], spec: SDSSpec | None, t0: int, storage=None) -> tuple[float, SDS | None]:
    summ = Summarizer(storage)
    sds = None
    if spec is not None:
        sds = SDS(spec)
        summ.start_live(sds, live_from_ts=t0)
    c0 = time.thread_time()
    for b in batches:
        summ.consume(b)
    if sds is not None:
        summ.flush()
    return time.thread_time() - c0, sds


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inst", type=int, default=20)
    ap.add_argument("--rate", type=float, default=8000)
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--chunk", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sections", default="fold,late,query", help="comma list of fold, late, query")
    ap.add_argument("--late-pct", type=float, default=1.0)
    ap.add_argument("--late-minutes", type=float, default=5.0)
    ap.add_argument("--late-delay", type=int, default=90, help="late samples arrive this many batches later")
    a = ap.parse_args()
    t0 = 1_800_000_000_000
    batches = make_batches(a.inst, a.rate, a.minutes, a.chunk, t0)
    total = sum(len(b) for b in batches)
    n_gpu = sum(int((np.asarray([dict(l)["__name__"] == "gpu_util" for l in b.series])[b.series_index]).sum())
                for b in batches)
    print(f"data: {total} samples ({n_gpu} gpu_util) in {len(batches)} batches of {a.chunk} timestamps/series")

    # 1. fold cost per algorithm
    specs = {"none (sink only)": None, "exact": SDSSpec("gpu_util", "exact"), "kll k=200": SDSSpec("gpu_util", "kll"),
             "req k=20": SDSSpec("gpu_util", "req"), "group by job": SDSSpec("gpu_util", "group", grouping=("job",)),
             "cpc (series)": SDSSpec("gpu_util", "cpc", grouping=("__series__",)),
             "fi by inst": SDSSpec("gpu_util", "fi", grouping=("inst",))}
    base = None
    secs = set(a.sections.split(","))
    for name, spec in (specs.items() if "fold" in secs else ()):
        runs = [fold_cost(batches, spec, t0)[0] for _ in range(a.repeats)]
        med = statistics.median(runs)
        if spec is None:
            base = med
            print(f"fold  {name:18} median {med:.3f} CPU-s")
        else:
            print(f"fold  {name:18} median {med:.3f} CPU-s, {1e9 * (med - base) / n_gpu:.0f} ns per summarized sample "
                  f"(over the sink-only pass)")

    # 2. late samples: exact req_total with late-pct % held back and delivered ``--late-delay`` batches later (90 x 1 s batches: past the pane), over the
    # first ``--late-minutes``; storage (a MemorySource) gets each batch before the summarizer, as the
    # ingest pipeline does (sinks only see accepted samples). Timed: the summarizer's consume only.
    lb = batches[: max(1, int(len(batches) * min(a.late_minutes, a.minutes) / a.minutes))]
    allb = SampleBatch(lb[0].series, np.concatenate([b.series_index for b in lb]),
                       np.concatenate([b.timestamps for b in lb]), np.concatenate([b.values for b in lb]))
    rng = np.random.default_rng(1)
    held = rng.random(len(allb)) < a.late_pct / 100
    order = np.argsort(allb.timestamps, kind="stable")
    parts_on = np.array_split(order[~held[order]], len(lb))
    parts_late = np.array_split(order[held[order]], len(lb))
    seq_in = np.array_split(order, len(lb))
    mixed = []
    dly = a.late_delay
    for i, c in enumerate(parts_on):
        mixed.append(c)
        if i >= dly:
            mixed.append(parts_late[i - dly])
    mixed += parts_late[max(len(parts_late) - dly, 0):]

    def run_late(seq: list) -> tuple[float, SDS]:
        store = MemorySource()
        summ = Summarizer(store)
        sds = SDS(SDSSpec("req_total", "exact"))
        summ.start_live(sds, live_from_ts=t0)
        cpu = 0.0
        for c in seq:
            b = SampleBatch(allb.series, allb.series_index[c], allb.timestamps[c], allb.values[c])
            store.append(b)
            _ = store.num_samples  # the test store's own merge, outside the timing
            c0 = time.thread_time()
            summ.consume(b)
            cpu += time.thread_time() - c0
        c0 = time.thread_time()
        summ.flush()
        return cpu + time.thread_time() - c0, sds

    r_in = [run_late(seq_in)[0] for _ in range(a.repeats)] if "late" in secs else []
    r_late = []
    for _ in range(a.repeats if "late" in secs else 0):
        cpu, sds = run_late(mixed)
        r_late.append(cpu)
    if r_late:
        n_req = sds.stats.ingested_samples + sds.stats.late_folded
        print(f"late  exact req_total ({len(lb)} batches, {n_req} samples): in order {statistics.median(r_in):.3f} CPU-s; "
              f"with {a.late_pct:g}% late ({int(held.sum())} samples of all metrics; late_folded={sds.stats.late_folded}, "
              f"raw samples re-read={sds.stats.late_rebuilt_samples}, dropped={sds.stats.late_dropped}) "
              f"{statistics.median(r_late):.3f} CPU-s")
    if "query" not in secs:
        return 0
    src = MemorySource()
    for b in batches:
        src.append(b)
    in_order_b = batches

    # 3. query paths (history = the generated minutes; 6h would need more data: use the whole span)
    summ = Summarizer(src)
    sdss = {}
    live_from = t0 + int(a.minutes * 60_000) // 3
    for alg, kw in (("req", {}), ("kll", {}), ("exact", {}), ("group", {"grouping": ("job",)}),
                    ("cpc", {"grouping": ("job",)})):
        s = SDS(SDSSpec("gpu_util", alg, **kw))
        s.seal_delay_ms = 0
        summ.start_live(s, live_from_ts=live_from)
        sdss[alg] = s
    for b in in_order_b:
        summ.consume(b)
    for s in sdss.values():
        summ.backfill(s, 86_400_000)
    for alg, sd in sdss.items():
        print(f"store {alg:6} {sd.nbytes() / 1e6:8.2f} MB for {sd.describe()['coverage']['panes']} panes, "
              f"{len(sd.registry.labels)} series")
    end = t0 + int(a.minutes * 60_000) - 1
    rng_ms = min(3_600_000, int(a.minutes * 60_000) // 2)
    start = t0 + rng_ms
    step = 120_000  # a dashboard step of 2 panes (finer steps re-read nearly all raw samples at the edges)

    def hook_for(alg):
        return RewriteHook(RewriteContext(lambda m, al, ms, func=None: sdss.get(al) if al == alg else None, cost_based=False,
                                          find_group=(lambda m, ms, by, al: sdss.get(al) if al == alg else None)
                                          if alg in ("group", "cpc") else None))

    eng = Engine(src)
    r = f"{rng_ms // 1000}s"
    for q, algs in ((f"quantile_over_time(0.99, gpu_util[{r}])", ("req", "kll", None)),
                    (f"sum by (job) (sum_over_time(gpu_util[{r}]))", ("group", "exact", None)),
                    (f"count(count by (job) (count_over_time(gpu_util[{r}])))", ("cpc", "exact", None))):
        for alg in algs[::-1]:
            hooks = [hook_for(alg)] if alg else []
            times = []
            for _ in range(a.repeats + 1):
                w0 = time.perf_counter()
                res = eng.range_query(q, start, end, step, QueryOpts(node_hooks=hooks))
                times.append(time.perf_counter() - w0)
            path = res.stats.paths[0]
            extra = ""
            if alg is not None and "quantile" in q:
                extra = f", max rank error {rank_err(src, q, res, start, end, step, rng_ms):.2e} (bound {sdss[alg].rank_bound(0.99):.2e})"
            print(f"query {q[:44]:44} {str(alg or 'raw'):6} path {path[:24]:24} cold {1e3 * times[0]:7.1f} ms, "
                  f"warm median {1e3 * statistics.median(times[1:]):7.1f} ms{extra}")
    return 0


def rank_err(src: MemorySource, q: str, res, start: int, end: int, step: int, rng_ms: int) -> float:
    from storage.matchers import Matcher

    worst = 0.0
    ends = np.arange(start, end + 1, step)
    for lbl, vals, pres in zip(res.labels, res.values, res.present):
        ss = src.select([Matcher("__name__", "=", "gpu_util"), Matcher("inst", "=", dict(lbl)["inst"])], start - rng_ms, end)
        for j, t in enumerate(ends):
            if not pres[j]:
                continue
            w = np.sort(ss.values[(ss.timestamps > t - rng_ms) & (ss.timestamps <= t)])
            v = vals[j]
            tol = abs(v) * 2.0 ** -22
            lo, hi = np.searchsorted(w, v - tol, "left") / len(w), np.searchsorted(w, v + tol, "right") / len(w)
            worst = max(worst, 0.0 if lo <= 0.99 <= hi else min(abs(lo - 0.99), abs(hi - 0.99)))
    return worst


if __name__ == "__main__":
    sys.exit(main())
