"""Scheduling results for docs/scheduling.md: Vesta vs SMetric vs router baselines on the Mooncake
conversation trace (32 colocated instances, several loads), the pricing ablation near saturation, the
disaggregated 24P8D variant, and AgentWeave vs its baselines on RAG and deep-search workloads.

    .venv/bin/python bench/scheduling_replay.py --out bench/out/scheduling
"""
from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

from scheduler_metrics.sim.replay import ReplaySpec, format_table, plot, sweep, write_csv
from scheduler_metrics.sim.traces import load_trace
from scheduler_metrics.sim.workflow_sim import sweep as flow_sweep

SHARED = Path(__file__).resolve().parent.parent.parent / "shared"
ALL = ["vesta", "vesta-noprice", "smetric", "round-robin", "least-queue", "prefix-affinity", "llm-d", "dynamo"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/out/scheduling")
    ap.add_argument("--loads", default="0.5,0.7,0.9")
    ap.add_argument("--limit", type=int, default=None)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    loads = [float(x) for x in a.loads.split(",")]
    trace = load_trace(SHARED / "traces" / "mooncake_conversation_trace.jsonl")
    if a.limit:
        trace = trace.head(a.limit)
    t0 = time.time()
    res = sweep(ReplaySpec(trace, instances=32), ALL, loads, show_progress=False)
    write_csv(res, out / "colocated.csv")
    plot(res, out / "colocated_ttft_vs_load.png", f"Mooncake conversation ({len(trace)} req), 32 colocated instances")
    print("## colocated, 32 instances\n" + format_table(res), flush=True)
    abl = sweep(ReplaySpec(trace, instances=32), ["vesta", "vesta-noprice"], [0.95, 1.0], show_progress=False)
    write_csv(abl, out / "ablation.csv")
    print("## pricing ablation near saturation\n" + format_table(abl), flush=True)
    dis = sweep(ReplaySpec(trace, instances=32, disaggregated=(24, 8)), ["vesta", "vesta-noprice", "smetric", "least-queue"], loads, show_progress=False)
    write_csv(dis, out / "disaggregated.csv")
    plot(dis, out / "disaggregated_ttft_vs_load.png", f"Mooncake conversation, 24P8D")
    print("## disaggregated 24P8D\n" + format_table(dis), flush=True)
    rows = []
    for wf, rates in (("rag", [4, 8, 12, 16, 24]), ("deep-search", [4, 8, 12, 16, 24])):
        for r in flow_sweep(wf, rates, n=600):
            rows.append(r.row())
    with open(out / "agentweave.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print("## agentweave")
    for r in rows:
        print(r)
    print(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
