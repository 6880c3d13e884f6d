"""Scheduling results for docs/scheduling.md, in one command:

    .venv/bin/python bench/scheduling_replay.py --out bench/out/scheduling --jobs 2

* agent trace (generated, ``scheduler_metrics/sim/agent_trace.py``), 16 colocated H20 instances,
  three loads, seeds 1-3: Vesta (priced / unpriced), SMetric at several overload thresholds (the
  sweep, and its best per load as the baseline), router baselines (seed 1);
* the Mooncake conversation trace and the Azure code trace (16 instances) at one load;
* cost-model sensitivity (NIC per GPU instead of per node, 2x faster prefill, 10x slower NIC);
* the same agent sessions packed onto 8 instances (one node), where prefill queueing matters more;
* the pricing ablation on 6 prefill + 2 decode instances;

Writes one CSV per experiment and ``summary.md`` (the tables of docs/scheduling.md). The workflow
(AgentWeave) results come from ``bench/workflow_bench.py``.
"""
from __future__ import annotations

import argparse
import csv
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

from scheduler_metrics.sim.agent_trace import AgentTraceParams, generate
from scheduler_metrics.sim.constants import DEFAULT, SimConstants
from scheduler_metrics.sim.replay import ReplaySpec, run_one
from scheduler_metrics.sim.stats import ci95
from scheduler_metrics.sim.trace import format_stats
from scheduler_metrics.sim.traces import load_trace

SHARED = Path(__file__).resolve().parent.parent.parent / "shared"
SEEDS = (1, 2, 3)
LOADS = (1.0, 2.0, 4.0)  # nominal: session arrivals compressed so offered prefill work = load x capacity
THRESHOLDS = (0.0, 0.1, 0.25, 0.5, 2.0, 8.0)
INSTANCES = 16  # two 8-GPU nodes
COST_LOAD = 2.0
COST_SMETRICS = ("smetric:0.5", "smetric:2")
PD_LOADS = (2.0, 4.0)
DENSE_INSTANCES = 8  # the same 400 sessions on one node: more sessions per GPU, prefill-bound
DENSE_LOADS = (4.0,)
SMETRICS = [f"smetric:{t:g}" for t in THRESHOLDS]
ROUTERS = ["llm-d", "dynamo", "least-queue", "prefix-affinity", "round-robin"]
SESSIONS = 400

CONSTANT_VARIANTS: dict[str, SimConstants] = {
    "default (NIC per node)": DEFAULT,
    "NIC per GPU": DEFAULT.with_hw(gpus_per_nic=1),
    "2x faster prefill": replace(DEFAULT, model=replace(DEFAULT.model, prefill_tokens_per_s=2 * DEFAULT.model.prefill_tokens_per_s,
                                                        prefill_quad_s_per_token2=DEFAULT.model.prefill_quad_s_per_token2 / 2)),
    "10x slower NIC": DEFAULT.with_hw(nic_bytes_per_s=DEFAULT.hw.nic_bytes_per_s / 10),
}


def _trace(name: str, seed: int):
    if name == "agent":
        return generate(AgentTraceParams(sessions=SESSIONS, seed=seed))
    files = {"mooncake": "mooncake_conversation_trace.jsonl", "azure-code": "AzureLLMInferenceTrace_code.csv"}
    return load_trace(SHARED / "traces" / files[name])


def _job(args: tuple) -> dict:
    exp, trace_name, seed, sched, load, variant, dis = args
    c = CONSTANT_VARIANTS[variant]
    n = DENSE_INSTANCES if exp == "dense" else INSTANCES
    spec = ReplaySpec(_trace(trace_name, seed), instances=n if dis is None else sum(dis), disaggregated=dis, constants=c)
    t0 = time.time()
    r = run_one(spec, sched, load)
    row = {"experiment": exp, "trace": trace_name, "seed": seed, "variant": variant, **r.row(), "wall_s": round(time.time() - t0, 1)}
    print(f"{exp:<11} {trace_name:<10} seed {seed} {variant:<24} {sched:<14} load {load:<4g} mean {row['mean_ttft_ms']:9.1f} ms "
          f"({row['wall_s']:.0f}s)", flush=True)
    return row


def jobs() -> list[tuple]:
    out = []
    for load in LOADS:
        for seed in SEEDS:
            for s in ["vesta", "vesta-noprice", *SMETRICS]:
                out.append(("main", "agent", seed, s, load, "default (NIC per node)", None))
        for s in ROUTERS:
            out.append(("main", "agent", 1, s, load, "default (NIC per node)", None))
    for s in ["vesta", *SMETRICS, "llm-d"]:
        out.append(("mooncake", "mooncake", 0, s, 0.7, "default (NIC per node)", None))
    for s in ["vesta", "smetric:0.5", "smetric:2", "least-queue"]:
        out.append(("azure", "azure-code", 0, s, 0.7, "default (NIC per node)", None))
    for variant in list(CONSTANT_VARIANTS)[1:]:
        for seed in SEEDS:
            for s in ["vesta", *COST_SMETRICS]:
                out.append(("costmodel", "agent", seed, s, COST_LOAD, variant, None))
    for load in DENSE_LOADS:
        for seed in SEEDS:
            for s in ["vesta", *SMETRICS]:
                out.append(("dense", "agent", seed, s, load, "default (NIC per node)", None))
    for load in PD_LOADS:
        for seed in SEEDS:
            for s in ["vesta", "vesta-noprice", "smetric:0.5"]:
                out.append(("6p2d", "agent", seed, s, load, "default (NIC per node)", (6, 2)))
    return out


def summarize(rows: list[dict]) -> str:
    md: list[str] = []
    for name in ("agent", "mooncake", "azure-code"):
        seed = 1 if name == "agent" else 0
        t = generate(AgentTraceParams(sessions=SESSIONS, seed=seed)) if name == "agent" else _trace(name, 0)
        md.append(f"- {format_stats(t)}")
    md.append("")

    def pick(**kw):
        return [r for r in rows if all(r[k] == v for k, v in kw.items())]

    def mean_of(rs, key="mean_ttft_ms"):
        return float(np.mean([r[key] for r in rs])) if rs else float("nan")

    md.append(f"### Agent trace, {INSTANCES} colocated instances (mean over seeds 1-3; routers: seed 1)\n")
    md.append("| scheduler | load | mean TTFT ms | p50 ms | p99 ms | floor ms | queue share | prefill util | decode TPS | tok/s | KV moved GB | remote |")
    md.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for load in LOADS:
        for s in ["vesta", "vesta-noprice", *SMETRICS, *ROUTERS]:
            rs = pick(experiment="main", scheduler=s, load=load)
            if not rs:
                continue
            md.append(f"| {s} | {load:g} | {mean_of(rs):.1f} | {mean_of(rs, 'p50_ttft_ms'):.1f} | {mean_of(rs, 'p99_ttft_ms'):.1f} | "
                      f"{mean_of(rs, 'floor_ttft_ms'):.1f} | {mean_of(rs, 'queue_share'):.1%} | {mean_of(rs, 'prefill_util'):.1%} | "
                      f"{mean_of(rs, 'decode_tps'):.1f} | {mean_of(rs, 'throughput_tps'):.0f} | {mean_of(rs, 'kv_transfer_bytes') / 1e9:.0f} | "
                      f"{mean_of(rs, 'remote_fraction'):.1%} |")
    md.append("\n### Vesta vs the best SMetric threshold per load and seed (agent trace)\n")
    md.append("| instances | load | best SMetric threshold (per seed) | Vesta mean TTFT vs best SMetric, 95% CI | vs SMetric 0 s | vs 0.25 s | vs 2 s "
              "| p99 vs best SMetric | decode TPS vs best SMetric | Vesta queue share | prefill util |")
    md.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for exp, load in [("main", x) for x in LOADS] + [("dense", x) for x in DENSE_LOADS]:
        gaps, fixed, p99, tps, best, qs, ut = [], {t: [] for t in ("0", "0.25", "2")}, [], [], [], [], []
        for seed in SEEDS:
            v = pick(experiment=exp, scheduler="vesta", load=load, seed=seed)
            sm = [r for r in pick(experiment=exp, load=load, seed=seed) if r["scheduler"].startswith("smetric")]
            if not v or not sm:
                continue
            b = min(sm, key=lambda r: r["mean_ttft_ms"])
            best.append(b["scheduler"].split(":")[1] + " s")
            gaps.append(v[0]["mean_ttft_ms"] / b["mean_ttft_ms"] - 1)
            p99.append(v[0]["p99_ttft_ms"] / b["p99_ttft_ms"] - 1)
            tps.append(v[0]["decode_tps"] / b["decode_tps"] - 1)
            qs.append(v[0]["queue_share"])
            ut.append(v[0]["prefill_util"])
            for t, acc in fixed.items():
                f = [r for r in sm if r["scheduler"] == f"smetric:{t}"]
                if f:
                    acc.append(v[0]["mean_ttft_ms"] / f[0]["mean_ttft_ms"] - 1)
        if gaps:
            cells = [f"{m:+.1%} ± {h:.1%}" for m, h in (ci95(np.array(x)) for x in (gaps, *fixed.values(), p99, tps))]
            n = DENSE_INSTANCES if exp == "dense" else INSTANCES
            md.append(f"| {n} | {load:g} | {', '.join(best)} | " + " | ".join(cells) + f" | {np.mean(qs):.1%} | {np.mean(ut):.1%} |")
    for exp, title in (("mooncake", f"Mooncake conversation trace, {INSTANCES} colocated, load 0.7"), ("azure", f"Azure code trace (no sessions), {INSTANCES} colocated, load 0.7")):
        md.append(f"\n### {title}\n")
        md.append("| scheduler | mean TTFT ms | p50 ms | p99 ms | floor ms | queue share | decode TPS | KV moved GB | remote |")
        md.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in pick(experiment=exp):
            md.append(f"| {r['scheduler']} | {r['mean_ttft_ms']:.1f} | {r['p50_ttft_ms']:.1f} | {r['p99_ttft_ms']:.1f} | {r['floor_ttft_ms']:.1f} | "
                      f"{r['queue_share']:.1%} | {r['decode_tps']:.1f} | {r['kv_transfer_bytes'] / 1e9:.0f} | {r['remote_fraction']:.1%} |")
    md.append(f"\n### Cost-model sensitivity (agent trace, load {COST_LOAD:g}, seeds 1-3)\n")
    md.append(f"| cost model | Vesta mean TTFT ms | {COST_SMETRICS[0]} | {COST_SMETRICS[1]} | Vesta vs better SMetric, 95% CI | Vesta KV moved GB |")
    md.append("| --- | --- | --- | --- | --- | --- |")
    for variant in CONSTANT_VARIANTS:
        exp = "main" if variant.startswith("default") else "costmodel"
        load = COST_LOAD
        v = {r["seed"]: r for r in pick(experiment=exp, variant=variant, scheduler="vesta", load=load)}
        s2 = {r["seed"]: r for r in pick(experiment=exp, variant=variant, scheduler=COST_SMETRICS[0], load=load)}
        s8 = {r["seed"]: r for r in pick(experiment=exp, variant=variant, scheduler=COST_SMETRICS[1], load=load)}
        seeds = sorted(set(v) & set(s2) & set(s8))
        if not seeds:
            continue
        g = np.array([v[k]["mean_ttft_ms"] / min(s2[k]["mean_ttft_ms"], s8[k]["mean_ttft_ms"]) - 1 for k in seeds])
        m, h = ci95(g)
        md.append(f"| {variant} | {np.mean([v[k]['mean_ttft_ms'] for k in seeds]):.1f} | {np.mean([s2[k]['mean_ttft_ms'] for k in seeds]):.1f} | "
                  f"{np.mean([s8[k]['mean_ttft_ms'] for k in seeds]):.1f} | {m:+.1%} ± {h:.1%} | "
                  f"{np.mean([v[k]['kv_transfer_bytes'] for k in seeds]) / 1e9:.0f} |")
    md.append("\n### Pricing ablation, 6 prefill + 2 decode instances (agent trace, seeds 1-3)\n")
    md.append("| load | vesta mean TTFT ms | vesta-noprice | smetric 0.5 s | priced vs unpriced, 95% CI | KV moved GB priced / unpriced |")
    md.append("| --- | --- | --- | --- | --- | --- |")
    for load in PD_LOADS:
        v = {r["seed"]: r for r in pick(experiment="6p2d", scheduler="vesta", load=load)}
        u = {r["seed"]: r for r in pick(experiment="6p2d", scheduler="vesta-noprice", load=load)}
        s = {r["seed"]: r for r in pick(experiment="6p2d", scheduler="smetric:0.5", load=load)}
        seeds = sorted(set(v) & set(u) & set(s))
        if not seeds:
            continue
        m, h = ci95(np.array([v[k]["mean_ttft_ms"] / u[k]["mean_ttft_ms"] - 1 for k in seeds]))
        md.append(f"| {load:g} | {np.mean([v[k]['mean_ttft_ms'] for k in seeds]):.1f} | {np.mean([u[k]['mean_ttft_ms'] for k in seeds]):.1f} | "
                  f"{np.mean([s[k]['mean_ttft_ms'] for k in seeds]):.1f} | {m:+.1%} ± {h:.1%} | "
                  f"{np.mean([v[k]['kv_transfer_bytes'] for k in seeds]) / 1e9:.0f} / {np.mean([u[k]['kv_transfer_bytes'] for k in seeds]) / 1e9:.0f} |")
    return "\n".join(md) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/out/scheduling")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--summary-only", action="store_true", help="rebuild summary.md from the CSVs already in --out")
    ap.add_argument("--only", default=None, help="run only this experiment (main, dense, mooncake, azure, costmodel, 6p2d) and "
                    "replace its rows in --out/replay.csv")
    ap.add_argument("--schedulers", default=None, help="with --only: run (and replace) only these schedulers, comma list")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if a.only:
        only = set(a.schedulers.split(",")) if a.schedulers else None
        todo = [j for j in jobs() if j[0] == a.only and (only is None or j[3] in only)]
        with ProcessPoolExecutor(a.jobs) as ex:
            new = list(ex.map(_job, todo))
        replaced = {(j[0], j[3]) for j in todo}
        kept = ([r for r in _read(out / "replay.csv") if (r["experiment"], r["scheduler"]) not in replaced]
                if (out / "replay.csv").exists() else [])
        _write(out / "replay.csv", kept + new)
    elif not a.summary_only:
        with ProcessPoolExecutor(a.jobs) as ex:
            rows = list(ex.map(_job, jobs()))
        _write(out / "replay.csv", rows)
    rows = _read(out / "replay.csv")
    (out / "summary.md").write_text(summarize(rows))
    print((out / "summary.md").read_text())
    print(f"total {time.time() - t0:.0f}s")


def _write(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _read(path: Path) -> list[dict]:
    def conv(v: str):
        for t in (int, float):
            try:
                return t(v)
            except ValueError:
                pass
        return None if v == "" else v

    with open(path, newline="") as f:
        return [{k: (conv(v) if k not in ("scheduler", "trace", "variant", "experiment", "policy", "workflow") else v)
                 for k, v in r.items()} for r in csv.DictReader(f)]


if __name__ == "__main__":
    main()
