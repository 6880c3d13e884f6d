"""Wide, long dashboard panels over HTTP: TurboProm (``exact=true``) vs Prometheus 2.42, same data.

    .venv/bin/python bench/wide_panels.py [--hosts 64] [--engines 16] [--hours 24] [--reps 5]
        [--only ID,ID] [--baseline DIR] [--out results.json]

Two servers on loopback ports chosen here, each with its own temporary data directory: ``turboprom
serve`` and Debian's Prometheus 2.42 (``--web.enable-remote-write-receiver``, no scrape jobs). The
same remote-write 1.0 bodies go to both, in time order (``--hours`` + 1 h of history, the extra hour
so that a panel's first windows do not meet the series' first samples, where 2.42 and 3.x
extrapolate ``rate`` differently):

* node exporter: ``--hosts`` x 8 CPUs x 8 modes ``node_cpu_seconds_total`` counters (4,096 series by
  default; the busy modes' shares vary per host and over the day), one sample per 15 s;
* the vLLM fleet of bench/vllm_fleet.py, ``--engines`` engines x 79 series (TTFT / E2E / ITL
  histograms, token and request counters with engine restarts, gauges), one sample per 15 s.

Node samples sit 7 s off the 15 s grid, so no sample falls on a window edge of the panels' steps
(Prometheus 2.42 selects ``[t-r, t]``, TurboProm and Prometheus 3 ``(t-r, t]``).

With ``--baseline DIR`` (a checkout of an earlier commit, e.g. ``git worktree add DIR COMMIT``, with
the compiled ingest module built or copied in), a third server runs that checkout's TurboProm on the
same writes: before/after and the ratio to Prometheus come from one run.

TurboProm runs with the planner off (``--planner`` keeps it on): every query here is ``exact=true``,
so the planner's query log, analysis and summary backfill would only add background CPU.

Then, after the servers have cut their heads into blocks (TurboProm's head spans at most 3 h,
Prometheus compacts its own), every panel below is asked ``--reps`` times over each of its ranges,
Grafana-aligned (start and end floored to the step, the step Grafana sends for a 1000 px panel:
15 s for 1 h, 20 s for 6 h, 60 s for 24 h), alternating which server goes first. Reported per query:
median wall latency (request sent -> whole body received) of each, the ratio, and whether the
answers agree (same series, same timestamps, values within 1e-6 relative); server CPU over the query
phase and RSS after loading.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from live_dashboard import (Client, Server, WriteStats, aligned_range, ensure_prometheus, grafana_step,  # noqa: E402
                            parse_matrix, post_write, proc_status_kb)
from vllm_fleet import Encoder, Fleet  # noqa: E402

INTERVAL_S = 15
REL_TOL = 1e-6
MODES = [("idle", 0.0), ("iowait", 0.02), ("irq", 0.005), ("nice", 0.01), ("softirq", 0.01), ("steal", 0.002),
         ("system", 0.06), ("user", 0.2)]  # (mode, mean share of a busy CPU); idle takes the rest
HOST = "node-007:9100"
# (id, PromQL, ranges)
PANELS = [
    ("cpu_by_mode", "sum by (mode) (rate(node_cpu_seconds_total[5m]))", ("1h", "6h", "24h")),
    ("cpu_util_by_host", '100 * (1 - avg by (instance) (rate(node_cpu_seconds_total{mode="idle"}[5m])))', ("1h", "24h")),
    ("one_host_by_mode", f'sum by (mode) (rate(node_cpu_seconds_total{{instance="{HOST}"}}[5m]))', ("1h", "24h")),
    ("ttft_p99", "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[5m])))",
     ("1h", "6h", "24h")),
    ("ttft_p99_by_model", "histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket[5m])))",
     ("24h",)),
    ("gen_tokens_rate", "sum by (model_name) (rate(vllm:generation_tokens_total[5m]))", ("24h",)),
]
RANGES = {"1h": 3600, "6h": 6 * 3600, "24h": 86400}


class NodeFleet:
    """``hosts`` x 8 CPUs x 8 modes of node_cpu_seconds_total, continuing counters."""

    def __init__(self, hosts: int, seed: int = 11):
        rng = np.random.default_rng(seed)
        self.labels = [{"__name__": "node_cpu_seconds_total", "cpu": str(c), "instance": f"node-{h:03d}:9100",
                        "job": "node", "mode": m} for h in range(hosts) for c in range(8) for m, _ in MODES]
        self.hosts = hosts
        self.load = rng.uniform(0.2, 1.6, hosts)  # host's busyness factor
        self.phase = rng.uniform(0, 2 * np.pi, hosts)
        self.rng = rng
        self.state = np.zeros(len(self.labels))

    def step(self, t_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(timestamps (S, n), values (S, n)) at the sample times ``t_ms`` (each call after the last)."""
        n = len(t_ms)
        h = len(self.load)
        t_s = t_ms / 1000.0
        day = 1.0 + 0.5 * np.sin(2 * np.pi * t_s[None, :] / 86400.0 + self.phase[:, None])  # (hosts, n)
        busy = np.clip(self.load[:, None] * day, 0.05, 3.0)
        shares = np.array([s for _, s in MODES])[None, :, None, None] * busy[:, None, None, :]  # (h, mode, 1, n)
        shares = shares * self.rng.uniform(0.6, 1.4, (h, len(MODES), 8, n))  # (h, mode, cpu, n)
        shares[:, 0] = np.clip(1.0 - shares[:, 1:].sum(axis=1), 0.0, 1.0)  # idle
        inc = np.round(shares.transpose(0, 2, 1, 3).reshape(-1, n) * INTERVAL_S, 2)  # (h*cpu*mode, n), label order
        vals = np.round(self.state[:, None] + np.cumsum(inc, axis=1), 2)
        self.state = vals[:, -1].copy()
        return np.broadcast_to(t_ms[None, :], vals.shape), vals


def load(servers: dict[str, Server], node: NodeFleet, fleet: Fleet, hours: float, per_req: int) -> dict:
    enc_n, enc_f = Encoder(node.labels), Encoder(fleet.labels)
    now = int(time.time()) // INTERVAL_S * INTERVAL_S * 1000
    grid = np.arange(now - int((hours + 1) * 3_600_000), now + 1, INTERVAL_S * 1000, dtype=np.int64)
    S = len(node.labels) + len(fleet.labels)
    chunk = max(1, per_req // S)
    stats = {n: WriteStats() for n in servers}
    pool = ThreadPoolExecutor(len(servers))
    t0 = time.time()
    n_req = math.ceil(len(grid) / chunk)
    print(f"[bench] load: {S} series ({len(node.labels)} node, {len(fleet.labels)} vLLM) x {len(grid)} samples "
          f"= {S * len(grid):,} per server, {2 * n_req} requests each", flush=True)
    pending = []
    for i in range(0, len(grid), chunk):
        g = grid[i:i + chunk]
        tn, vn = node.step(g + 7000 - INTERVAL_S * 1000)  # 7 s off the grid
        tf, vf = fleet.step(g)
        bodies = [(enc_n.body(tn, vn), vn.size), (enc_f.body(tf, vf), vf.size)]
        for f in pending:
            if not f.result():
                raise SystemExit(f"a write failed: { {n: s.errors[:2] for n, s in stats.items()} }")
        pending = [pool.submit(post_write, s.port, b, k, stats[n], 300.0) for b, k in bodies for n, s in servers.items()]
        if (i // chunk) % 40 == 0:
            print(f"[bench]   {i // chunk + 1}/{n_req} time slices, {time.time() - t0:.0f} s", flush=True)
    for f in pending:
        if not f.result():
            raise SystemExit(f"a write failed: { {n: s.errors[:2] for n, s in stats.items()} }")
    wall = time.time() - t0
    pool.shutdown()
    return {"series": S, "samples_per_server": S * len(grid), "load_s": round(wall, 1), "end_ms": int(grid[-1]),
            "writes": {n: s.as_dict() for n, s in stats.items()}}


def settle(servers: dict[str, Server], max_s: float) -> None:
    """Wait until TurboProm's head spans at most 3 h (its cuts are done) and Prometheus's head too."""
    deadline = time.time() + max_s
    c = {n: Client(s.port) for n, s in servers.items()}
    while time.time() < deadline:
        spans = {}
        for n, cl in c.items():
            st, body, _ = cl.request("GET", "/api/v1/status/tsdb")
            h = json.loads(body)["data"]["headStats"] if st == 200 else {}
            spans[n] = (h.get("maxTime", 0) - h.get("minTime", 0)) / 3_600_000
        if all(v <= 3.5 for v in spans.values()):
            print(f"[bench] heads settled: {', '.join(f'{n} {v:.1f} h' for n, v in spans.items())}", flush=True)
            time.sleep(5)  # the last compactions
            return
        time.sleep(2)
    print(f"[bench] heads not settled within {max_s:.0f} s: {spans}", flush=True)


def agree(a: dict, b: dict) -> tuple[bool, str]:
    ma, mb = parse_matrix(a), parse_matrix(b)
    if ma.keys() != mb.keys():
        return False, f"series differ: {len(ma)} vs {len(mb)}"
    for k in ma:
        (ta, va), (tb, vb) = ma[k], mb[k]
        if ta != tb:
            return False, f"timestamps differ for {dict(k)}: {len(ta)} vs {len(tb)} points"
        x, y = np.array(va), np.array(vb)
        both_nan = np.isnan(x) & np.isnan(y)
        rel = np.abs(x - y) / np.maximum(np.maximum(np.abs(x), np.abs(y)), 1e-300)
        bad = ~both_nan & (x != y) & ~(rel <= REL_TOL)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            return False, f"{dict(k)} at {ta[i]}: {x[i]!r} vs {y[i]!r}"
    return True, ""


def query(cl: Client, q: str, start: int, end: int, step: int, exact: bool) -> tuple[float, dict]:
    params = {"query": q, "start": start, "end": end, "step": step}
    if exact:
        params["exact"] = "true"
    st, body, dt = cl.request("POST", "/api/v1/query_range", urllib.parse.urlencode(params).encode(),
                              {"Content-Type": "application/x-www-form-urlencoded"}, timeout=300)
    doc = json.loads(body)
    if st != 200 or doc.get("status") != "success":
        raise SystemExit(f"query failed ({st}): {q}: {body[:300]!r}")
    return dt, doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=64, help="node-exporter hosts (64 series each)")
    ap.add_argument("--engines", type=int, default=16, help="vLLM engines (79 series each)")
    ap.add_argument("--hours", type=float, default=24.0, help="history the panels read (1 h more is loaded)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated panel ids")
    ap.add_argument("--samples-per-request", type=int, default=150_000)
    ap.add_argument("--settle-s", type=float, default=180.0)
    ap.add_argument("--planner", action="store_true", help="keep the planner on (default off: queries are exact=true)")
    ap.add_argument("--baseline", default="", help="checkout of an earlier commit: its TurboProm runs beside")
    ap.add_argument("--out", default=None, help="JSON result file")
    a = ap.parse_args()
    panels = [p for p in PANELS if not a.only or p[0] in a.only.split(",")]
    env = {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
    prom_bin = ensure_prometheus()
    with tempfile.TemporaryDirectory(prefix="wide-panels-") as d:
        work = Path(d)
        pcfg = work / "prometheus.yml"
        pcfg.write_text("global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n")
        tcfg = work / "turboprom.yml"  # every query here is exact=true: planner work would only add noise
        tcfg.write_text("planner:\n  enabled: true\n" if a.planner else "planner:\n  enabled: false\n")
        servers = {
            "turboprom": Server("turboprom", work, lambda s: [sys.executable, "-m", "turboprom", "serve", "--data-dir",
                                                               str(s.data), "--listen", f"127.0.0.1:{s.port}",
                                                               "--wal-fsync", "never", "--config", str(tcfg)]),
        }
        if a.baseline:
            base = str(Path(a.baseline).resolve())
            boot = f"import sys, runpy; sys.path.insert(0, {base!r}); runpy.run_module('turboprom', run_name='__main__')"
            servers["baseline"] = Server("baseline", work, lambda s: [sys.executable, "-c", boot, "serve", "--data-dir",
                                                                      str(s.data), "--listen", f"127.0.0.1:{s.port}",
                                                                      "--wal-fsync", "never", "--config", str(tcfg)])
        servers |= {
            "prometheus": Server("prometheus", work, lambda s: [
                prom_bin, f"--config.file={pcfg}", f"--storage.tsdb.path={s.data}", f"--web.listen-address=127.0.0.1:{s.port}",
                "--web.enable-remote-write-receiver", "--storage.tsdb.retention.time=30d"]),
        }
        try:
            for s in servers.values():
                s.start(env=env)
                print(f"[bench] {s.name} ready on 127.0.0.1:{s.port} (pid {s.pid})", flush=True)
            res = load(servers, NodeFleet(a.hosts), Fleet(a.engines), a.hours, a.samples_per_request)
            print(f"[bench] loaded in {res['load_s']} s", flush=True)
            settle(servers, a.settle_s)
            res["rss_mb_after_load"] = {n: round(proc_status_kb(s.pid, "VmRSS") / 1024) for n, s in servers.items()}
            clients = {n: Client(s.port) for n, s in servers.items()}
            cpu0 = {n: s.cpu_s() for n, s in servers.items()}
            now_s = res["end_ms"] / 1000.0
            rows = []
            k = 0
            for pid, q, ranges in panels:
                for rname in ranges:
                    if RANGES[rname] > a.hours * 3600:
                        continue  # longer than the history loaded
                    step = grafana_step(RANGES[rname])
                    start, end = aligned_range(now_s, RANGES[rname], step)
                    times: dict[str, list[float]] = {n: [] for n in servers}
                    ok, why = True, ""
                    for r in range(a.reps):
                        order = list(servers) if k % 2 == 0 else list(servers)[::-1]
                        k += 1
                        docs = {}
                        for n in order:
                            dt, docs[n] = query(clients[n], q, start, end, step, exact=(n != "prometheus"))
                            times[n].append(dt)
                        if r == 0:
                            ok, why = agree(docs["turboprom"], docs["prometheus"])
                            if "baseline" in docs:
                                same, why_b = agree(docs["turboprom"], docs["baseline"])
                                if not same:
                                    ok, why = False, f"baseline differs: {why_b}; {why}"
                            nser = len(docs["turboprom"]["data"]["result"])
                    med = {n: statistics.median(v) for n, v in times.items()}
                    row = {"panel": pid, "query": q, "range": rname, "step_s": step, "series_out": nser,
                           **{f"{n}_s": v for n, v in med.items()},
                           "ratio": med["turboprom"] / med["prometheus"], "agree": ok, "difference": why,
                           "all_s": times}
                    base_txt = ""
                    if "baseline" in med:
                        row["baseline_ratio"] = med["baseline"] / med["prometheus"]
                        base_txt = f"baseline {med['baseline'] * 1e3:8.1f} ms ({row['baseline_ratio']:5.2f})  "
                    rows.append(row)
                    print(f"{pid:18s} {rname:>4s} step {step:>2d}s  {base_txt}turboprom {med['turboprom'] * 1e3:8.1f} ms "
                          f"({row['ratio']:5.2f})  prometheus {med['prometheus'] * 1e3:8.1f} ms  "
                          f"{'ok' if ok else 'DIFFER: ' + why}", flush=True)
            res["query_cpu_s"] = {n: round(s.cpu_s() - cpu0[n], 1) for n, s in servers.items()}
            res["rows"] = rows
            ratios = [r["ratio"] for r in rows]
            res["median_ratio"] = statistics.median(ratios)
            if a.baseline:
                res["baseline_median_ratio"] = statistics.median(r["baseline_ratio"] for r in rows)
                print(f"[bench] baseline: median ratio to prometheus {res['baseline_median_ratio']:.2f}", flush=True)
            print(f"[bench] median ratio turboprom/prometheus {res['median_ratio']:.2f} (min {min(ratios):.2f}, max "
                  f"{max(ratios):.2f}); server CPU over the queries {res['query_cpu_s']}; RSS after load "
                  f"{res['rss_mb_after_load']} MB", flush=True)
            if a.out:
                Path(a.out).write_text(json.dumps(res, indent=1))
        finally:
            for s in servers.values():
                s.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
