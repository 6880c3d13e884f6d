"""Markdown table for docs/benchmarks.md from a planner_bench.py JSON result."""
from __future__ import annotations

import json
import sys

import numpy as np


def fmt(v: float | None, unit: str = "", nd: int = 0) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "–"
    return f"{v:.{nd}f}{unit}"


def main(path: str) -> None:
    r = json.load(open(path))
    print("| wl | panels (window; dashboard span) | served | summary p50 / p99 ms | raw p50 / p99 ms | Prom p50 / p99 ms "
          "| served-only p50: summary / raw / Prom ms | served-only p99 CPU/query s: summary / raw / Prom | p99 CPU/query s (all refreshes): summary / raw / Prom | CPU s: summary / raw / Prom | max rel. err (exact) | KLL rank err (n, max, ≤bound) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    tot = {"summary": 0.0, "raw": 0.0, "prometheus": 0.0}
    p50r = []
    cpur = []
    for w in r["workloads"]:
        panels = "; ".join(f"{p['kind']} [{p['window']}] {p['span_ms'] // 3_600_000}h" for p in w["panels"])
        s, raw, pr, so, k = w["summary"], w["raw"], w["prometheus"], w["served_only"], w["kll_rank_errors"]
        for key in tot:
            tot[key] += w[key]["cpu_s"]
        if so["n"]:
            p50r.append((so["summary_p50_ms"] / so["raw_p50_ms"], so["summary_p50_ms"] / so["prom_p50_ms"]))
            cpur.append(so["summary_p99_cpu_s"] / max(so["raw_p99_cpu_s"], 0.01))
        kll = "–" if not k["n"] else f"{k['n']}, {k['max']:.4f}, {100 * k['within_bound_share']:.0f}%"
        err = w["max_rel_error_exact"]
        print(f"| {w['workload']} | {panels} | {100 * w['served_share']:.0f}% | {fmt(s['p50_ms'])} / {fmt(s['p99_ms'])} "
              f"| {fmt(raw['p50_ms'])} / {fmt(raw['p99_ms'])} | {fmt(pr['p50_ms'])} / {fmt(pr['p99_ms'])} "
              f"| {fmt(so['summary_p50_ms'])} / {fmt(so['raw_p50_ms'])} / {fmt(so['prom_p50_ms'])} "
              f"| {fmt(so['summary_p99_cpu_s'], nd=2)} / {fmt(so['raw_p99_cpu_s'], nd=2)} / {fmt(so.get('prom_p99_cpu_s'), nd=2)} "
              f"| {fmt(s['p99_cpu_s'], nd=2)} / {fmt(raw['p99_cpu_s'], nd=2)} / {fmt(pr['p99_cpu_s'], nd=2)} "
              f"| {fmt(s['cpu_s'], nd=1)} / {fmt(raw['cpu_s'], nd=1)} / {fmt(pr['cpu_s'], nd=1)} "
              f"| {'–' if err is None else f'{err:.1e}'} | {kll} |")
    print()
    sds_cpu = r.get("sds_cpu_s", 0.0) + r.get("summarizer_cpu_s", 0.0)
    print(f"Totals: summary path {tot['summary']:.1f} CPU-s + {sds_cpu:.1f} CPU-s summarization (live folds + backfill) "
          f"= {tot['summary'] + sds_cpu:.1f} CPU-s vs raw-only {tot['raw']:.1f} CPU-s vs Prometheus {tot['prometheus']:.1f} CPU-s; "
          f"summary storage {r.get('summary_bytes', 0) / 2**20:.1f} MiB in {len(r.get('plans', []))} SDS; "
          f"ingest: {r['ingest']['recent_samples']} recent + {r['ingest']['history_samples']} history samples.")
    if p50r:
        a = np.array(p50r)
        print(f"Served-only p50 ratios (median over workloads): summary/raw {np.median(a[:, 0]):.2f}, "
              f"summary/Prometheus {np.median(a[:, 1]):.2f}; per workload summary/raw "
              f"{', '.join(f'{x:.2f}' for x in a[:, 0])}; summary/Prometheus {', '.join(f'{x:.2f}' for x in a[:, 1])}.")
        cold = [w["served_only"] for w in r["workloads"] if w["served_only"].get("cold_n")]
        if cold:
            reused = sum(w["served_only"].get("steps_reused", 0) for w in r["workloads"])
            steps = sum(w["served_only"].get("steps_total", 0) for w in r["workloads"])
            n_served = sum(w["served_only"]["n"] for w in r["workloads"])
            print(f"Step cache: {reused} of {steps} served steps reused ({100 * reused / max(steps, 1):.0f}%); "
                  f"{sum(c['cold_n'] for c in cold)} of {n_served} served refreshes reused nothing (cold). "
                  f"Cold served p50 per workload, summary / raw / Prometheus ms: "
                  + "; ".join(f"{fmt(c['cold_summary_p50_ms'])} / {fmt(c['cold_raw_p50_ms'])} / {fmt(c['cold_prom_p50_ms'])}"
                              for c in cold)
                  + f"; median ratios summary/raw {np.median([c['cold_summary_p50_ms'] / c['cold_raw_p50_ms'] for c in cold]):.2f}, "
                  f"summary/Prometheus {np.median([c['cold_summary_p50_ms'] / c['cold_prom_p50_ms'] for c in cold]):.2f}.")
        c = np.array(cpur)
        print(f"Served-only p99 CPU per query, summary/raw per workload (CPU ticks are 10 ms; raw floored at 10 ms): "
              f"{', '.join(f'{x:.2f}' for x in c)}; <= 0.5x in {int((c <= 0.5).sum())} of {len(c)}.")


if __name__ == "__main__":
    main(sys.argv[1])
