"""REQ / group-pane / CPC panels over HTTP, side by side with Prometheus 2.42 (its docs/benchmarks.md section).

One run: ``--inst`` instances (bench/planner_bench.py's series shape) for the last ``--minutes`` at
``--rate`` samples/s, sent by the same remote-write payloads to our server and to Prometheus. Each panel
is refreshed ``--refreshes`` times (the planner adopts an SDS after the third, by itself); every refresh
runs on our default path, our raw path (exact=true) and Prometheus, back to back. Reported: p50 latency
of the refreshes our summary served, on all three paths, and the observed error (REQ: normalized rank
error of each served value among its raw window; group: max relative error vs exact=true; CPC: relative
error vs exact=true). The config lowers ``group_min_series`` / ``cpc_min_series`` / ``fi_min_series``
(defaults 1,000 / 10,000 / 10,000) so that this size exercises those paths.

    .venv/bin/python bench/sketch_peer_bench.py [--minutes 45] [--rate 2000] [--refreshes 10]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from planner_bench import Prom, matrix, post_write, query, rel_error, series_defs, values_for, write_request  # noqa: E402
from tests.helpers import ServerProcess  # noqa: E402

PANELS = [
    ("REQ", "quantile_over_time(0.99, gpu_util[{r}])"),
    ("group", "sum by (job) (sum_over_time(gpu_util[{r}]))"),
    ("CPC", "count(count by (inst) (count_over_time(gpu_util[{r}])))"),
    ("fi", "topk(3, sum by (inst) (count_over_time(gpu_util[{r}])))"),
]


def rank_errors(url: str, served: dict, window: str, t: float) -> list[float]:
    """Normalized rank error of the served value at time t among the raw window samples (per series)."""
    out = []
    for key, (ts, vs) in served.items():
        sel = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(json.loads(key).items())) + "}"
        body, _ = query(url, "/api/v1/query", {"query": f"gpu_util{sel}[{window}]", "time": t, "exact": "true"})
        res = body["data"]["result"]
        if not res:
            continue
        w = np.sort([float(p[1]) for p in res[0]["values"]])
        j = int(np.argmin(np.abs(ts - t)))
        v = vs[j]
        tol = abs(v) * 2.0 ** -22
        lo, hi = np.searchsorted(w, v - tol, "left") / len(w), np.searchsorted(w, v + tol, "right") / len(w)
        out.append(0.0 if lo <= 0.99 <= hi else float(min(abs(lo - 0.99), abs(hi - 0.99))))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inst", type=int, default=20)
    ap.add_argument("--rate", type=float, default=2000)
    ap.add_argument("--minutes", type=int, default=45)
    ap.add_argument("--window", default="30m")
    ap.add_argument("--refreshes", type=int, default=10)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sketch-peer-"))
    defs = series_defs(a.inst)
    S = len(defs)
    interval = max(1, int(round(S * 1000 / a.rate)))
    now = int(time.time() * 1000) // 60_000 * 60_000
    ts_all = np.arange(now - a.minutes * 60_000, now, interval)
    cfg = work / "turboprom.yml"
    cfg.write_text("planner:\n  canary_fraction: 0\n  seal_delay: 0s\n  group_min_series: 10\n  cpc_min_series: 10\n"
                   "  fi_min_series: 10\n")
    ours = ServerProcess(work / "tp", ["--config", str(cfg), "--wal-fsync", "never"])
    prom = Prom(work)
    ours.start()
    prom.start()
    try:
        rng = np.random.default_rng(0)
        state: dict = {}
        for ch in np.array_split(np.arange(len(ts_all)), max(1, len(ts_all) // max(1, 40_000 // S))):
            body = write_request(defs, ts_all[ch], values_for(defs, ts_all[ch], rng, state))
            post_write(ours.url, body)
            post_write(prom.url, body)
        print(f"data: {S} series, {len(ts_all) * S} samples over {a.minutes} min ({a.rate:g}/s), sent to both")
        end = (now - 60_000) / 1000
        for name, tmpl in PANELS:
            q = tmpl.format(r=a.window)
            lat: dict[str, list[float]] = {"summary": [], "raw": [], "prom": []}
            errs: list[float] = []
            for i in range(a.refreshes):
                t_end = end + 30 * i  # the dashboard's clock advances between refreshes
                params = {"query": q, "start": t_end - 900, "end": t_end, "step": "60"}
                f, lf = query(ours.url, "/api/v1/query_range", params)
                r, lr = query(ours.url, "/api/v1/query_range", dict(params, exact="true"))
                p, lp = query(prom.url, "/api/v1/query_range", params)
                if not any("served from summary" in x for x in f.get("infos", [])):
                    time.sleep(1.0)  # adoption + backfill run in the background
                    continue
                lat["summary"].append(lf)
                lat["raw"].append(lr)
                lat["prom"].append(lp)
                fm, rm = matrix(f), matrix(r)
                if name == "REQ":
                    errs += rank_errors(ours.url, fm, a.window, t_end)
                else:
                    errs.append(rel_error(fm, rm))
            if not lat["summary"]:
                print(f"{name:6} {q}: never served from a summary")
                continue
            med = {k: 1e3 * statistics.median(v) for k, v in lat.items()}
            print(f"{name:6} {q}: served {len(lat['summary'])}/{a.refreshes} refreshes; p50 summary {med['summary']:.1f} ms, "
                  f"raw {med['raw']:.1f} ms, Prometheus {med['prom']:.1f} ms; summary/raw {med['summary'] / med['raw']:.2f}, "
                  f"summary/Prometheus {med['summary'] / med['prom']:.2f}; max observed error {max(errs) if errs else 0:.2e}")
        plans = query(ours.url, "/api/v1/planner/plans", {})[0]["data"]["plans"]
        for p in plans:
            print(f"plan {p['id']}: {p['algorithm']} bytes {p['bytes']} hits {p['hits']} bound: {p['error_bound']}")
    finally:
        ours.stop()
        prom.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
