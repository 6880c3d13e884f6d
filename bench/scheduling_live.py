"""Live mode next to in-process replay: every bundled scheduler replays the same small agent trace
twice, once reading TurboProm's congestion tracker in process and once against a real
``turboprom serve`` on a loopback port (simulated workers push the metric schema to
/api/v1/import/prometheus; the scheduler polls GET /api/v1/congestion over HTTP).

    .venv/bin/python bench/scheduling_live.py --out bench/out/scheduling_live

Writes ``live.csv`` and ``live.md``. The server is started and stopped by this script (by its pid).
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
from pathlib import Path

import numpy as np

from scheduler_metrics.sim.live import run_live
from scheduler_metrics.sim.replay import ReplaySpec, run_one
from scheduler_metrics.sim.traces import load_trace

TRACE = "agent:sessions=30"
SCHEDULERS = ["vesta", "vesta-noprice", "smetric:0.5", "smetric:2", "llm-d", "dynamo", "least-queue", "prefix-affinity", "round-robin"]
REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/out/scheduling_live")
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--load", type=float, default=2.0)
    ap.add_argument("--speed", type=float, default=10.0, help="simulated seconds per wall second")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    data = Path(tempfile.mkdtemp(prefix="turboprom-live-"))
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
        trace = load_trace(TRACE)
        for s in SCHEDULERS:
            inproc = run_one(ReplaySpec(trace, instances=a.instances), s, a.load)
            live, sig = run_live(TRACE, url, a.instances, s, a.load, speed=a.speed)
            lat = np.array(sig.poll_latency_s) * 1000
            rows.append({"scheduler": s, "in_process_mean_ttft_ms": round(inproc.mean_ttft_ms, 1), "live_mean_ttft_ms": round(live.mean_ttft_ms, 1),
                         "in_process_p99_ms": round(inproc.pct_ttft_ms(99), 1), "live_p99_ms": round(live.pct_ttft_ms(99), 1),
                         "floor_ms": round(live.floor_ms, 1), "pushes": sig.pushes, "polls": sig.polls,
                         "poll_p50_ms": round(float(np.median(lat)), 2), "poll_p99_ms": round(float(np.percentile(lat, 99)), 2)})
            print(rows[-1], flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    with open(out / "live.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    md = ["| scheduler | in-process mean TTFT ms | live mean TTFT ms | in-process p99 | live p99 | floor ms | pushes / polls | poll p50 / p99 ms |",
          "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        md.append(f"| {r['scheduler']} | {r['in_process_mean_ttft_ms']} | {r['live_mean_ttft_ms']} | {r['in_process_p99_ms']} | {r['live_p99_ms']} | "
                  f"{r['floor_ms']} | {r['pushes']} / {r['polls']} | {r['poll_p50_ms']} / {r['poll_p99_ms']} |")
    (out / "live.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
