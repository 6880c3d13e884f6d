"""Trace replay sweeps: schedulers x loads on one trace; CSV and plot output."""
from __future__ import annotations

import csv
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from scheduler_metrics.schedulers.routers import (DynamoScheduler, LeastQueueScheduler, LLMDScheduler,
                                                  PrefixAffinityScheduler, RoundRobinScheduler)
from scheduler_metrics.schedulers.smetric import SMetricScheduler
from scheduler_metrics.schedulers.vesta import VestaScheduler
from scheduler_metrics.sim.cluster import ClusterSim, SimResult
from scheduler_metrics.sim.constants import DEFAULT, SimConstants
from scheduler_metrics.sim.signals import OracleSignals, TrackerSignals
from scheduler_metrics.sim.traces import Trace, load_trace

CSV_COLUMNS = ["scheduler", "load", "requests", "mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "throughput_tps", "kv_transfer_bytes"]

SCHEDULERS: dict[str, Callable[[int], object]] = {
    "vesta": lambda n: VestaScheduler(n),
    "vesta-noprice": lambda n: VestaScheduler(n, use_price=False),
    "smetric": lambda n: SMetricScheduler(n),
    "round-robin": lambda n: RoundRobinScheduler(),
    "least-queue": lambda n: LeastQueueScheduler(),
    "prefix-affinity": lambda n: PrefixAffinityScheduler(),
    "llm-d": lambda n: LLMDScheduler(),
    "dynamo": lambda n: DynamoScheduler(),
}


def natural_utilization(trace: Trace, prefill_instances: int, c: SimConstants = DEFAULT) -> float:
    """Offered prefill utilization of the trace at its original pace: the prefill work of the
    uncached prompt tokens (ideal prefix reuse) over (instances x trace span)."""
    m = c.model
    tok = (trace.input_tokens - trace.reuse_tokens).astype(float)
    work = np.where(tok > 0, m.prefill_fixed_s + tok / m.prefill_tokens_per_s + m.prefill_quad_s_per_token2 * tok**2, 0.0).sum()
    span = max(trace.duration_s, 1.0)
    return float(work / (prefill_instances * span))


def time_scale_for(trace: Trace, load: float, prefill_instances: int, c: SimConstants = DEFAULT) -> float:
    """Multiplier on arrival times so that the offered prefill utilization equals ``load``."""
    if load <= 0:
        return 1.0
    return natural_utilization(trace, prefill_instances, c) / load


@dataclass
class ReplaySpec:
    trace: Trace
    instances: int = 32
    disaggregated: tuple[int, int] | None = None
    signals: str = "tracker"  # tracker | oracle


def run_one(spec: ReplaySpec, scheduler: str, load: float, progress: Callable[[int, int], None] | None = None) -> SimResult:
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; known: {', '.join(SCHEDULERS)}")
    n_prefill = spec.disaggregated[0] if spec.disaggregated else spec.instances
    sched = SCHEDULERS[scheduler](n_prefill)
    sig = TrackerSignals() if spec.signals == "tracker" else OracleSignals()
    sim = ClusterSim(spec.trace, sched, sig, instances=spec.instances, disaggregated=spec.disaggregated, load=load,
                     time_scale=time_scale_for(spec.trace, load, n_prefill), progress=progress)
    return sim.run()


def progress_bar(label: str) -> Callable[[int, int], None]:
    start = time.time()

    def show(done: int, total: int) -> None:
        width = 30
        filled = int(width * done / max(total, 1))
        sys.stderr.write(f"\r{label:<28} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {time.time() - start:5.1f}s")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


def sweep(spec: ReplaySpec, schedulers: list[str], loads: list[float], show_progress: bool = True) -> list[SimResult]:
    out = []
    for load in loads:
        for s in schedulers:
            bar = progress_bar(f"{s} @ load {load:g}") if show_progress else None
            out.append(run_one(spec, s, load, bar))
    return out


def format_table(results: list[SimResult]) -> str:
    head = f"{'scheduler':<16}{'load':>6}{'requests':>10}{'mean TTFT ms':>14}{'p50 ms':>10}{'p99 ms':>11}{'tok/s':>10}{'KV moved GB':>13}"
    lines = [head, "-" * len(head)]
    for r in results:
        row = r.row()
        lines.append(f"{row['scheduler']:<16}{row['load']:>6g}{row['requests']:>10}{row['mean_ttft_ms']:>14.1f}{row['p50_ttft_ms']:>10.1f}"
                     f"{row['p99_ttft_ms']:>11.1f}{row['throughput_tps']:>10.1f}{row['kv_transfer_bytes'] / 1e9:>13.2f}")
    return "\n".join(lines)


def write_csv(results: list[SimResult], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in results:
            w.writerow(r.row())


def plot(results: list[SimResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    by: dict[str, list[SimResult]] = {}
    for r in results:
        by.setdefault(r.scheduler, []).append(r)
    for name, rs in by.items():
        rs = sorted(rs, key=lambda r: r.load)
        loads = [r.load for r in rs]
        axes[0].plot(loads, [r.mean_ttft_ms for r in rs], marker="o", label=name)
        axes[1].plot(loads, [r.pct_ttft_ms(99) for r in rs], marker="o", label=name)
    for ax, what in zip(axes, ("mean TTFT (ms)", "p99 TTFT (ms)")):
        ax.set_xlabel("offered load (prefill utilization)")
        ax.set_ylabel(what)
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main_replay(trace_path: str, instances: int, schedulers: list[str], loads: list[float], out: str | None,
                disaggregated: tuple[int, int] | None = None, limit: int | None = None, signals: str = "tracker") -> list[SimResult]:
    trace = load_trace(trace_path)
    if limit:
        trace = trace.head(limit)
    spec = ReplaySpec(trace, instances=instances, disaggregated=disaggregated, signals=signals)
    results = sweep(spec, schedulers, loads)
    print(format_table(results))
    if out:
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        write_csv(results, d / "results.csv")
        shape = f"{disaggregated[0]}P{disaggregated[1]}D" if disaggregated else f"{instances} colocated"
        plot(results, d / "ttft_vs_load.png", f"{trace.name}: {len(trace)} requests, {shape} instances")
        print(f"wrote {d / 'results.csv'} and {d / 'ttft_vs_load.png'}")
    return results
