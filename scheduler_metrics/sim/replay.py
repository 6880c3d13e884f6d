"""Trace replay sweeps: schedulers x loads on one trace; CSV and plot output."""
from __future__ import annotations

import math

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
from scheduler_metrics.sim.cluster import ClusterSim, SimResult, prefill_times
from scheduler_metrics.sim.constants import DEFAULT, SimConstants
from scheduler_metrics.sim.signals import OracleSignals, TrackerSignals
from scheduler_metrics.sim.trace import Trace, format_stats
from scheduler_metrics.sim.traces import load_trace

CSV_COLUMNS = ["scheduler", "load", "requests", "mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "throughput_tps", "kv_transfer_bytes",
               "floor_ttft_ms", "queue_share", "decode_tps", "remote_fraction", "recompute_fraction", "prefill_util"]

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


def make_scheduler(spec: str, n: int) -> object:
    """A scheduler by name; ``smetric:SECONDS`` sets SMetric's overload threshold."""
    name, _, arg = spec.partition(":")
    if name == "smetric" and arg:
        try:
            x = float(arg)
        except ValueError:
            x = math.nan
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"scheduler {spec!r}: expected smetric:SECONDS with SECONDS >= 0, e.g. smetric:7")
        return SMetricScheduler(n, overload_backlog_s=x, name=f"smetric:{x:g}")
    if spec not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {spec!r}; known: {', '.join(SCHEDULERS)}, smetric:SECONDS")
    return SCHEDULERS[spec](n)


def scheduler_known(spec: str) -> bool:
    try:
        make_scheduler(spec, 1)
    except ValueError:
        return False
    return True


def natural_utilization(trace: Trace, prefill_instances: int, c: SimConstants = DEFAULT) -> float:
    """Offered prefill utilization of the trace at its original pace: the prefill work of the
    uncached prompt tokens (ideal prefix reuse) over (instances x trace span)."""
    tok = np.maximum(1, trace.input_tokens - trace.reuse_tokens).astype(float)
    work = float(prefill_times(c, tok, np.zeros(len(tok)), False).sum())
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
    constants: SimConstants = DEFAULT


def run_one(spec: ReplaySpec, scheduler: str, load: float, progress: Callable[[int, int], None] | None = None) -> SimResult:
    n_prefill = spec.disaggregated[0] if spec.disaggregated else spec.instances
    sched = make_scheduler(scheduler, n_prefill)
    sig = TrackerSignals() if spec.signals == "tracker" else OracleSignals()
    sim = ClusterSim(spec.trace, sched, sig, instances=spec.instances, disaggregated=spec.disaggregated, load=load,  # type: ignore[arg-type]
                     time_scale=time_scale_for(spec.trace, load, n_prefill, spec.constants), constants=spec.constants,
                     progress=progress)
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
    head = (f"{'scheduler':<16}{'load':>6}{'requests':>10}{'mean TTFT ms':>14}{'p50 ms':>10}{'p99 ms':>11}{'floor ms':>10}"
            f"{'queue %':>9}{'tok/s':>10}{'decode TPS':>12}{'KV moved GB':>13}{'remote %':>10}{'util %':>8}")
    lines = [head, "-" * len(head)]
    for r in results:
        row = r.row()
        lines.append(f"{row['scheduler']:<16}{row['load']:>6g}{row['requests']:>10}{row['mean_ttft_ms']:>14.1f}{row['p50_ttft_ms']:>10.1f}"
                     f"{row['p99_ttft_ms']:>11.1f}{row['floor_ttft_ms']:>10.1f}{100 * row['queue_share']:>9.1f}{row['throughput_tps']:>10.1f}"
                     f"{row['decode_tps']:>12.1f}{row['kv_transfer_bytes'] / 1e9:>13.2f}{100 * row['remote_fraction']:>10.1f}{100 * row['prefill_util']:>8.1f}")
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
                disaggregated: tuple[int, int] | None = None, limit: int | None = None, signals: str = "tracker",
                gpus_per_nic: int | None = None) -> list[SimResult]:
    trace = load_trace(trace_path)
    if limit:
        trace = trace.head(limit)
    c = DEFAULT if gpus_per_nic is None else DEFAULT.with_hw(gpus_per_nic=gpus_per_nic)
    print(format_stats(trace))
    print(f"testbed: Qwen2.5-7B on H20, prefill {c.model.prefill_tokens_per_s:.0f} tok/s, "
          f"{c.hw.gpus_per_node} GPUs/node, one {c.hw.nic_bytes_per_s / 1e9:.1f} GB/s NIC per {c.hw.gpus_per_nic} GPU(s), "
          f"NVLink {c.hw.nvlink_bytes_per_s / 1e9:.0f} GB/s, host->GPU {c.hw.h2d_bytes_per_s / 1e9:.0f} GB/s")
    spec = ReplaySpec(trace, instances=instances, disaggregated=disaggregated, signals=signals, constants=c)
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
