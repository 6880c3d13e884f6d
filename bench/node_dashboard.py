"""Node-exporter dashboard under live ingest: the planner on another data shape than the vLLM fleet.

``bench/live_dashboard.py`` measures the planner on vLLM-fleet series; this one runs a node-exporter
fleet and a dashboard in the style of "Node Exporter Full" (CPU busy and modes, memory, network,
load, filesystem, process counts), with panels the vLLM bench does not have (``irate``, ``deriv``,
``delta``, ``changes``, ``stddev_over_time``, ``topk``, ``count``, binary operators between selectors,
6 h panels with 30 s steps) and a share of panned loads.

Two servers on loopback ports, each with its own temporary data directory: ``on`` (``turboprom serve``,
default planner) and ``off`` (``planner: {enabled: false}``), fed the same remote-write bytes:

1. Preload: ``--history-hours`` of history at the scrape interval (15 s), in time order.
2. Timed part, two halves of ``--duration`` / 2:
   * check: every refresh asks ``on`` twice, default and ``exact=true`` (in random order), and each
     default answer is compared with its ``exact=true`` twin (same series and timestamps, values within
     1e-9 relative, NaN = NaN);
   * clean: every refresh asks ``on`` (default) and ``off`` the same query (in random order) and their
     answers are compared the same way; server CPU (utime + stime from /proc) of both is measured over
     this half only, so ``on`` does the same queries as ``off``.
   A writer sends one sample per series every 15 s stamped with the wall clock; it and the refresher
   share a lock, so no write lands between the two answers of a compared pair. Each panel refreshes
   every 10 s (1 h panels) or 30 s (6 h panels) over [now - range, now], start and end floored to the
   step and the step chosen as Grafana does for a ~1000 px panel with a 15 s min interval (15 s for
   1 h, 20 s for 6 h: ``bench/live_dashboard.py``'s ``grafana_step`` / ``aligned_range``); 10% of the
   loads are panned back by a random number of steps.

Printed per panel: loads, mismatches, loads with a summary-served answer, median latency of ``on``
(default) and of ``exact=true`` (check half) or ``off`` (clean half), and their ratio; then the CPU of
both servers over the clean half, and the planner's plans and retirements. Only successful answers
count; a failed query is reported and the run fails.

    .venv/bin/python bench/node_dashboard.py [--hosts 100] [--history-hours 7] [--duration 600]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.cluster_summaries import post  # noqa: E402
from bench.live_dashboard import aligned_range, compare, grafana_step, proc_cpu_s, summary_info  # noqa: E402
from bench.vllm_fleet import Encoder  # noqa: E402
from tests.helpers import ServerProcess  # noqa: E402

SCRAPE_MS = 15_000
CPU_MODES = ("idle", "user", "system", "iowait", "irq", "softirq", "steal", "nice")
MODE_SHARE = {"idle": 0.6, "user": 0.25, "system": 0.08}
NET_DEVICES = ("eth0", "eth1", "lo", "docker0")
MOUNTS = ("/", "/var", "/home")

# (name, range s, refresh s, query)
PANELS = [
    ("cpu_busy", 3600, 10, '100 * (1 - avg by (instance) (rate(node_cpu_seconds_total{mode="idle"}[1m])))'),
    ("cpu_modes", 3600, 10, 'sum by (instance, mode) (irate(node_cpu_seconds_total{mode!="idle"}[1m]))'),
    ("mem_pct", 3600, 10, "node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes * 100"),
    ("net_rx", 3600, 10, 'rate(node_network_receive_bytes_total{device!="lo"}[5m]) * 8'),
    ("load_max", 3600, 10, "max_over_time(node_load1[5m])"),
    ("net_top", 3600, 10, "topk(5, sum by (instance) (rate(node_network_transmit_bytes_total[5m])))"),
    ("cpu_count", 3600, 10, 'count by (instance) (node_cpu_seconds_total{mode="idle"})'),
    ("q95_load", 3600, 10, "quantile_over_time(0.95, node_load1[10m])"),
    ("delta_mem", 3600, 10, "avg(delta(node_memory_MemAvailable_bytes[10m]))"),
    ("last_load", 3600, 10, "last_over_time(node_load15[2m])"),
    ("fs_deriv", 21600, 30, 'deriv(node_filesystem_avail_bytes{mountpoint="/"}[30m])'),
    ("load_avg", 21600, 30, "avg by (instance) (avg_over_time(node_load5[30m]))"),
    ("load_std", 21600, 30, "stddev_over_time(node_load1[1h])"),
    ("errs_inc", 21600, 30, "sum by (instance) (increase(node_network_receive_errs_total[1h]))"),
    ("cpu_by_mode", 21600, 30, "sum by (mode) (rate(node_cpu_seconds_total[5m]))"),
    ("procs_min", 21600, 30, "min by (instance) (min_over_time(node_procs_running[10m]))"),
    ("procs_changes", 21600, 30, "sum(changes(node_procs_running[15m]))"),
    ("cpu_share", 21600, 30,
     'sum(rate(node_cpu_seconds_total{mode!="idle"}[5m])) / count(node_cpu_seconds_total{mode="idle"})'),
    ("load_count", 21600, 30, "sum by (instance) (count_over_time(node_load1[10m]))"),
    ("procs_sum", 21600, 30, "sum by (instance) (sum_over_time(node_procs_running[20m]))"),
]


class NodeFleet:
    """``hosts`` node exporters: 8 CPUs x 8 modes, 4 network devices x 3 counters, 3 filesystems, memory,
    load and process gauges (85 series per host), with counter resets (reboots) and noisy rates."""

    def __init__(self, hosts: int, seed: int = 5):
        self.rng = np.random.default_rng(seed)
        self.labels: list[dict[str, str]] = []
        kinds: list[tuple[str, str]] = []
        for h in range(hosts):
            base = {"job": "node", "instance": f"node{h:03d}:9100"}
            for c in range(8):
                for m in CPU_MODES:
                    self.labels.append({"__name__": "node_cpu_seconds_total", **base, "cpu": str(c), "mode": m})
                    kinds.append(("cpu", m))
            for d in NET_DEVICES:
                for name in ("node_network_receive_bytes_total", "node_network_transmit_bytes_total",
                             "node_network_receive_errs_total"):
                    self.labels.append({"__name__": name, **base, "device": d})
                    kinds.append(("net", name))
            for mp in MOUNTS:
                self.labels.append({"__name__": "node_filesystem_avail_bytes", **base, "mountpoint": mp,
                                    "device": "sda", "fstype": "ext4"})
                kinds.append(("fs", mp))
            for name in ("node_memory_MemAvailable_bytes", "node_memory_MemTotal_bytes", "node_load1",
                         "node_load5", "node_load15", "node_procs_running"):
                self.labels.append({"__name__": name, **base})
                kinds.append(("gauge", name))
        n = len(self.labels)
        rate = np.zeros(n)
        for i, (k, what) in enumerate(kinds):
            if k == "cpu":
                rate[i] = MODE_SHARE.get(what, 0.01)
            elif k == "net":
                rate[i] = 0.01 if what.endswith("errs_total") else self.rng.uniform(1e4, 1e7)
        self.rate = rate

        def idx(pred) -> np.ndarray:
            return np.array([i for i, kw in enumerate(kinds) if pred(kw)], dtype=np.int64)

        self.fs = idx(lambda kw: kw[0] == "fs")
        self.mem_total = idx(lambda kw: kw[1] == "node_memory_MemTotal_bytes")
        self.mem_avail = idx(lambda kw: kw[1] == "node_memory_MemAvailable_bytes")
        self.load = idx(lambda kw: kw[1].startswith("node_load"))
        self.procs = idx(lambda kw: kw[1] == "node_procs_running")
        self.counter = np.zeros(n)
        self.fs_left = self.rng.uniform(1e10, 5e11, n)

    @property
    def num_series(self) -> int:
        return len(self.labels)

    def values(self) -> np.ndarray:
        """The next scrape's values of every series (counters continue, 1e-4 reset per scrape)."""
        rng = self.rng
        n = self.num_series
        self.counter = self.counter + self.rate * (SCRAPE_MS / 1000) * rng.gamma(2.0, 0.5, n)
        self.counter = np.where(rng.random(n) < 1e-4, 0.0, self.counter)
        out = self.counter.copy()
        self.fs_left[self.fs] -= rng.uniform(0, 2e6, len(self.fs))
        out[self.fs] = self.fs_left[self.fs]
        out[self.mem_total] = 64e9
        out[self.mem_avail] = rng.uniform(8e9, 40e9, len(self.mem_avail))
        out[self.load] = np.round(rng.gamma(2.0, 1.0, len(self.load)), 2)
        out[self.procs] = rng.poisson(3, len(self.procs)).astype(float)
        return out

    def body(self, enc: Encoder, times_ms: np.ndarray) -> bytes:
        """A remote-write body with one sample per series at each of ``times_ms``."""
        ts = np.repeat(np.asarray(times_ms, np.int64)[None, :], self.num_series, axis=0)
        vals = np.stack([self.values() for _ in times_ms], axis=1)
        return enc.body(ts, vals)


def on_off_servers(prefix: str) -> tuple[ServerProcess, ServerProcess]:
    """Two started servers in a new temporary directory: ``on`` (default planner) and ``off``
    (``planner: {enabled: false}``), WAL without fsync (both alike)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    (work / "off.yml").write_text("planner:\n  enabled: false\n")
    on = ServerProcess(work / "on", ["--wal-fsync", "never"])
    off = ServerProcess(work / "off", ["--wal-fsync", "never", "--config", str(work / "off.yml")])
    on.start()
    off.start()
    return on, off


def print_plans(url: str, step_caches: bool = False) -> dict:
    """Print the server's live and retired plans; returns ``/api/v1/planner/plans``'s data."""
    with urllib.request.urlopen(url + "/api/v1/planner/plans", timeout=30) as r:
        plans = json.loads(r.read())["data"]
    for p in plans["plans"]:
        extra = f", step cache {p.get('step_cache')}" if step_caches else ""
        print(f"plan {p['id']}: {p.get('series')} series, {p.get('hits')} hits, {p.get('bytes', 0) / 1e6:.1f} MB{extra}")
    for p in plans.get("retired", []):
        print(f"retired {p.get('id')}: {p.get('reason', '')[:240]}")
    return plans


def query(url: str, q: str, start: float, end: float, step: int, exact: bool) -> tuple[float, dict]:
    params = {"query": q, "start": start, "end": end, "step": step, "stats": "1"}
    if exact:
        params["exact"] = "true"
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{urllib.parse.urlencode(params)}", timeout=120) as r:
        doc = json.loads(r.read())
    return time.perf_counter() - t0, doc


@dataclass
class PanelStats:
    loads: int = 0
    mismatches: int = 0
    summary: int = 0
    first_mismatch: str = ""
    on_s: dict = field(default_factory=lambda: {"check": [], "clean": []})
    ref_s: dict = field(default_factory=lambda: {"check": [], "clean": []})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=100, help="node exporters (85 series each)")
    ap.add_argument("--history-hours", type=float, default=7.0)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of the timed part (two halves)")
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()

    fleet = NodeFleet(args.hosts, args.seed)
    enc = Encoder(fleet.labels)
    on, off = on_off_servers("node-dashboard-")
    lock = threading.Lock()
    stop = threading.Event()
    failures: list[str] = []
    try:
        now_ms = int(time.time() * 1000) // SCRAPE_MS * SCRAPE_MS
        grid = np.arange(now_ms - int(args.history_hours * 3_600_000), now_ms + 1, SCRAPE_MS, dtype=np.int64)
        t0 = time.time()
        for chunk in np.array_split(grid, max(1, len(grid) * fleet.num_series // 200_000)):
            body = fleet.body(enc, chunk)
            post(on.url + "/api/v1/write", body)
            post(off.url + "/api/v1/write", body)
        print(f"[bench] preload: {fleet.num_series:,} series x {len(grid):,} points in {time.time() - t0:.0f}s", flush=True)

        def writer() -> None:
            last = int(grid[-1])
            while not stop.is_set():
                due = int(time.time() * 1000) // SCRAPE_MS * SCRAPE_MS
                if due > last:
                    body = fleet.body(enc, np.arange(last + SCRAPE_MS, due + 1, SCRAPE_MS, dtype=np.int64))
                    try:
                        with lock:
                            post(on.url + "/api/v1/write", body)
                            post(off.url + "/api/v1/write", body)
                    except OSError as e:  # counted; the samples' time is retried by the next tick
                        failures.append(f"write: {e}")
                        stop.wait(1.0)
                        continue
                    last = due
                stop.wait(1.0)

        threading.Thread(target=writer, daemon=True, name="writer").start()
        stats = {name: PanelStats() for name, *_ in PANELS}
        rnd = random.Random(args.seed)
        half = args.duration / 2
        cpu = {}
        start_t = time.time()
        due = {name: start_t for name, *_ in PANELS}
        phase = "check"
        while time.time() - start_t < args.duration:
            if phase == "check" and time.time() - start_t >= half:
                phase = "clean"
                cpu["start"] = (proc_cpu_s(on.proc.pid), proc_cpu_s(off.proc.pid))
            for name, range_s, refresh_s, q in PANELS:
                if time.time() < due[name]:
                    continue
                due[name] += refresh_s
                step = grafana_step(range_s)
                now = time.time()
                if rnd.random() < 0.1:
                    now -= rnd.randrange(1, 20) * step  # a panned load
                start, end = aligned_range(now, range_s, step)
                ref_url, ref_exact = (on.url, True) if phase == "check" else (off.url, False)
                try:
                    with lock:
                        if rnd.random() < 0.5:
                            on_s, a = query(on.url, q, start, end, step, False)
                            ref_s, b = query(ref_url, q, start, end, step, ref_exact)
                        else:
                            ref_s, b = query(ref_url, q, start, end, step, ref_exact)
                            on_s, a = query(on.url, q, start, end, step, False)
                except OSError as e:
                    failures.append(f"{name}: {e}")
                    continue
                st = stats[name]
                st.loads += 1
                st.on_s[phase].append(on_s)
                st.ref_s[phase].append(ref_s)
                st.summary += summary_info(a)[0]
                equal, why, _, _ = compare(a, b)
                if not equal:
                    st.mismatches += 1
                    st.first_mismatch = st.first_mismatch or f"t+{time.time() - start_t:.0f}s: {why[:300]}"
            time.sleep(0.2)
        cpu["end"] = (proc_cpu_s(on.proc.pid), proc_cpu_s(off.proc.pid))
        stop.set()

        print(f"\n{fleet.num_series:,} series ({args.hosts} hosts), {args.history_hours:g} h history, "
              f"{args.duration:g} s timed ({half:g} s check, {half:g} s clean)\n")
        print("| panel | range/step | loads | mismatches | summary-served | on ms (check) | exact=true ms | on/exact "
              "| on ms (clean) | off ms | on/off |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, range_s, _, _ in PANELS:
            st = stats[name]
            med = {k: {p: statistics.median(v[p]) * 1e3 if v[p] else float("nan") for p in ("check", "clean")}
                   for k, v in (("on", st.on_s), ("ref", st.ref_s))}
            print(f"| {name} | {range_s // 3600}h/{grafana_step(range_s)}s | {st.loads} | {st.mismatches} | {st.summary} "
                  f"| {med['on']['check']:.1f} | {med['ref']['check']:.1f} | {med['on']['check'] / med['ref']['check']:.2f} "
                  f"| {med['on']['clean']:.1f} | {med['ref']['clean']:.1f} | {med['on']['clean'] / med['ref']['clean']:.2f} |")
        for name, st in stats.items():
            if st.first_mismatch:
                print(f"first mismatch of {name}: {st.first_mismatch}")
        c_on = cpu["end"][0] - cpu["start"][0]
        c_off = cpu["end"][1] - cpu["start"][1]
        print(f"\nserver CPU over the clean half: on {c_on:.1f} s, off {c_off:.1f} s, on/off {c_on / max(c_off, 1e-9):.2f}")
        print_plans(on.url)
        total = sum(st.mismatches for st in stats.values())
        print(f"\nmismatches: {total}; failed queries: {len(failures)} {failures[:3]}")
        return 1 if total or failures else 0
    finally:
        stop.set()
        on.stop()
        off.stop()


if __name__ == "__main__":
    sys.exit(main())
