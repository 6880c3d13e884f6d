"""AgentWeave against whole-request execution, Ayo and Autellix, for docs/scheduling.md, in one command:

    .venv/bin/python bench/workflow_bench.py --out bench/out/workflow --jobs 2 [--live]

For every application (RAG, KB-RAG, DeepSearch, multimodal) and policy, seeds 1-5, 8 H20s:

* steady-state throughput under a latency target: the largest Poisson arrival rate whose p90
  end-to-end latency (requests after the first 20%) stays within the target; the target is
  ``--slo-factor`` (3) x the application's unloaded p90 (the best policy's p90 at 0.1 req/s);
* sensitivity sweeps: the target factor (5x), and the deployment (2 of the 8 GPUs dedicated to
  the auxiliary models instead of every GPU running everything);
* with ``--live``: one workflow sweep per policy (RAG, two rates) with the queue state going through
  a real ``turboprom serve`` (started and stopped here, by pid), next to the same runs in process.

Ratios are per seed (same arrivals and request shapes for every policy), with 95% t intervals over
the seeds. Writes ``slo.csv``, ``unloaded.csv``, ``live.csv`` and ``summary.md``.
"""
from __future__ import annotations

import argparse
import csv
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from scheduler_metrics.sim.constants import DEFAULT, WORKFLOW
from scheduler_metrics.sim.stats import ci95
from scheduler_metrics.sim.workflow_sim import POLICIES, max_rate_under_slo, simulate
from scheduler_metrics.sim.workflows import WORKFLOWS

REPO = Path(__file__).resolve().parent.parent
SEEDS = (1, 2, 3, 4, 5)
APPS = tuple(WORKFLOWS)
N = 300  # requests per run
GPUS = 8
UNLOADED_RATE = 0.1
VARIANTS = {  # name: (slo factor, aux GPUs)
    "default": (3.0, 0),
    "2 dedicated aux GPUs": (3.0, 2),
    "target 5x": (5.0, 0),
}
LIVE_RATES = (1.0, 3.0)
LIVE_N = 120


def _unloaded(args: tuple) -> dict:
    app, policy, aux = args
    r = simulate(app, policy, UNLOADED_RATE, 60, 1, gpus=GPUS, aux_gpus=aux)
    return {"workflow": app, "policy": policy, "aux_gpus": aux, "p90_s": round(r.p90_s, 3),
            "mean_s": round(float(r.window().mean()), 3)}


def _slo(args: tuple) -> dict:
    app, policy, seed, variant, target = args
    _, aux = VARIANTS[variant]
    t0 = time.time()
    rate, run = max_rate_under_slo(app, policy, target, seed, n=N, gpus=GPUS, aux_gpus=aux, start=2.0, refine=5)
    row = {"workflow": app, "policy": policy, "seed": seed, "variant": variant, "target_p90_s": round(target, 3),
           "max_rate_rps": round(rate, 4)}
    row.update({k: v for k, v in (run.row() if run else {}).items() if k not in row and k not in ("workflow", "policy", "seed")})
    print(f"{variant:<22} {app:<12} {policy:<11} seed {seed} target {target:6.2f}s -> {rate:6.3f} req/s ({time.time() - t0:.0f}s)",
          flush=True)
    return row


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_live(out: Path, speed: float) -> list[dict]:
    from scheduler_metrics.sim.live import run_flow_live

    port = _free_port()
    data = Path(tempfile.mkdtemp(prefix="turboprom-flow-live-"))
    log = open(out / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "turboprom", "serve", "--data-dir", str(data), "--listen", f"127.0.0.1:{port}"],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(url + "/-/ready", timeout=2).read()
                break
            except OSError:
                time.sleep(0.5)
        for policy in POLICIES:
            for rate in LIVE_RATES:
                inproc = simulate("rag", policy, rate, LIVE_N, 1, gpus=GPUS)
                live, sig = run_flow_live(url, "rag", policy, rate, LIVE_N, 1, speed=speed, gpus=GPUS)
                lat = np.array(sig.query_latency_s) * 1000
                rows.append({"workflow": "rag", "policy": policy, "rate_rps": rate,
                             "in_process_mean_s": round(float(inproc.window().mean()), 3), "live_mean_s": round(float(live.window().mean()), 3),
                             "in_process_p90_s": round(inproc.p90_s, 3), "live_p90_s": round(live.p90_s, 3),
                             "in_process_chunk": round(inproc.mean_chunk, 1), "live_chunk": round(live.mean_chunk, 1),
                             "pushes": sig.pushes, "queries": sig.queries, "mismatches": sig.mismatches,
                             "query_p50_ms": round(float(np.median(lat)), 2), "query_p99_ms": round(float(np.percentile(lat, 99)), 2)})
                print(rows[-1], flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    return rows


def summarize(unloaded: list[dict], slo: list[dict], live: list[dict]) -> str:
    wc, m = WORKFLOW, DEFAULT.model
    md = [f"Testbed: {GPUS} H20s, Qwen2.5-7B (prefill {m.prefill_tokens_per_s:.0f} tok/s, token budget {m.chunk_budget_tokens}, "
          f"max {m.max_batch} sequences), rerank {wc.rerank.batch_time(1) * 1e3:.1f} ms for 1 pair / "
          f"{wc.rerank.batch_time(64) * 1e3:.0f} ms for 64, vision {wc.vision.batch_time(1) * 1e3:.1f} ms per frame, "
          f"ASR {wc.asr.batch_time(1) * 1e3:.0f} ms for 1 segment / {wc.asr.batch_time(32) * 1e3:.0f} ms for 32; {N} requests per run, seeds {SEEDS[0]}-{SEEDS[-1]}.", ""]
    md.append("### Unloaded p90 end-to-end latency (0.1 req/s), seconds\n")
    md.append("| workflow | deployment | " + " | ".join(POLICIES) + " |")
    md.append("| --- | --- | " + " | ".join("---" for _ in POLICIES) + " |")
    for app in APPS:
        for aux in sorted({r["aux_gpus"] for r in unloaded}):
            by = {r["policy"]: r for r in unloaded if r["workflow"] == app and r["aux_gpus"] == aux}
            dep = "aggregated" if aux == 0 else f"{aux} aux GPUs"
            md.append(f"| {app} | {dep} | " + " | ".join(f"{by[p]['p90_s']:.2f}" for p in POLICIES) + " |")
    for variant in VARIANTS:
        rows = [r for r in slo if r["variant"] == variant]
        if not rows:
            continue
        md.append(f"\n### Max req/s with p90 <= target ({variant})\n")
        md.append("| workflow | target p90 s | " + " | ".join(f"{p} req/s" for p in POLICIES) +
                  " | AgentWeave / whole | AgentWeave / Ayo | AgentWeave / Autellix | seeds |")
        md.append("| --- | --- | " + " | ".join("---" for _ in POLICIES) + " | --- | --- | --- | --- |")
        for app in APPS:
            by = {(r["policy"], r["seed"]): r["max_rate_rps"] for r in rows if r["workflow"] == app}
            seeds = sorted(s for s in {s for _, s in by} if all((p, s) in by for p in POLICIES))  # complete seeds only
            if not seeds:
                continue
            target = next(r["target_p90_s"] for r in rows if r["workflow"] == app)
            cells = [f"{np.mean([by[(p, s)] for s in seeds]):.2f}" for p in POLICIES]
            ratios = []
            for base in ("whole", "ayo", "autellix"):
                x = [by[("agentweave", s)] / by[(base, s)] for s in seeds if by[(base, s)] > 0]
                mean, half = ci95(x)
                ratios.append(f"{mean:.2f}x ± {half:.2f}" if x else "n/a")
            md.append(f"| {app} | {target:.2f} | " + " | ".join(cells) + " | " + " | ".join(ratios) + f" | {len(seeds)} |")
    if live:
        md.append("\n### Live mode next to in-process (RAG, seed 1, queue state through a real server)\n")
        md.append("| policy | rate | in-process mean s | live mean s | in-process p90 | live p90 | mean chunk in-process / live | pushes / queries | mismatches | query p50 / p99 ms |")
        md.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in live:
            md.append(f"| {r['policy']} | {r['rate_rps']:g} | {r['in_process_mean_s']} | {r['live_mean_s']} | {r['in_process_p90_s']} | "
                      f"{r['live_p90_s']} | {r['in_process_chunk']} / {r['live_chunk']} | {r['pushes']} / {r['queries']} | {r['mismatches']} | "
                      f"{r['query_p50_ms']} / {r['query_p99_ms']} |")
    return "\n".join(md) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/out/workflow")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--live", action="store_true", help="also run the live-mode sweep against a real server")
    ap.add_argument("--speed", type=float, default=10.0, help="live mode: simulated seconds per wall second")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma list of " + ", ".join(VARIANTS))
    ap.add_argument("--seeds", type=int, default=len(SEEDS))
    ap.add_argument("--summary-only", action="store_true")
    ap.add_argument("--live-only", action="store_true", help="run only the live-mode sweep (replaces live.csv)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if a.live_only:
        _write(out / "live.csv", run_live(out, a.speed))
    elif not a.summary_only:
        variants = [v for v in a.variants.split(",") if v]
        unknown = set(variants) - set(VARIANTS)
        if unknown:
            raise SystemExit(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
        auxes = sorted({VARIANTS[v][1] for v in variants})
        with ProcessPoolExecutor(a.jobs) as ex:
            unloaded = list(ex.map(_unloaded, [(app, p, aux) for app in APPS for p in POLICIES for aux in auxes]))
            _write(out / "unloaded.csv", unloaded)
            jobs = []
            for v in variants:
                factor, aux = VARIANTS[v]
                for app in APPS:
                    base = min(r["p90_s"] for r in unloaded if r["workflow"] == app and r["aux_gpus"] == aux)
                    for seed in SEEDS[:a.seeds]:
                        for p in POLICIES:
                            jobs.append((app, p, seed, v, factor * base))
            slo = []
            for row in ex.map(_slo, jobs):  # written as they come, so an interrupted run keeps its rows
                slo.append(row)
                _write(out / "slo.csv", slo)
        if a.live:
            _write(out / "live.csv", run_live(out, a.speed))
    live = _read(out / "live.csv") if (out / "live.csv").exists() else []
    if not (out / "slo.csv").exists():
        print(f"{out / 'slo.csv'} not there yet: no summary ({time.time() - t0:.0f}s)")
        return
    (out / "summary.md").write_text(summarize(_read(out / "unloaded.csv"), _read(out / "slo.csv"), live))
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
        return v

    with open(path, newline="") as f:
        return [{k: conv(v) for k, v in r.items()} for r in csv.DictReader(f)]


if __name__ == "__main__":
    main()
