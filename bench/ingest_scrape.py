"""Scraper capacity: 200 targets x 1,000 series at a 15 s interval, server pinned to one core.

Targets are served by one local aiohttp process (pinned to the other core) listening on 200
loopback ports; each answer has 1,000 series whose values change every request. The TurboProm
server (taskset -c 0) scrapes them for --duration seconds. Reported: scrapes done vs expected,
missed scrape slots (turboprom_scrapes_missed_total), scrape errors, server CPU use, and the
latency of /-/healthy probed every 100 ms during the run (event-loop responsiveness).

    .venv/bin/python bench/ingest_scrape.py [--targets 200] [--series 1000] [--interval 15] [--duration 75]
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from ingest_remote_write import proc_cpu_s as cpu_s  # noqa: E402
from tests.helpers import free_port, wait_http  # noqa: E402

# The tail of a target-server script: serve ``handle`` as /metrics on every port of ``ports`` (one
# process, one aiohttp runner), print "ready", run until killed. bench/scrape_peer.py uses it too.
SERVE_ON_PORTS = r'''
async def main():
    app = web.Application(); app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None); await runner.setup()
    for p in ports:
        await web.TCPSite(runner, "127.0.0.1", p).start()
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
'''

TARGET_SERVER = r'''
import asyncio, sys, itertools
from aiohttp import web
ports = [int(p) for p in sys.argv[2].split(",")]
n = int(sys.argv[1])
counter = itertools.count()
lines = [f'gpu_worker_metric_{i % 40}{{gpu="{i % 8}",model="llama",engine="{i // 8}"}} ' for i in range(n)]
head = "".join(f"# HELP gpu_worker_metric_{f} help\n# TYPE gpu_worker_metric_{f} gauge\n" for f in range(40))
async def handle(request):
    c = next(counter)
    body = head + "".join(f"{l}{(c + i) % 997}\n" for i, l in enumerate(lines))
    return web.Response(text=body, content_type="text/plain")
''' + SERVE_ON_PORTS


def metric(url: str, name: str) -> float:
    total = 0.0
    for line in urllib.request.urlopen(url + "/metrics", timeout=30).read().decode().splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", type=int, default=200)
    ap.add_argument("--series", type=int, default=1000)
    ap.add_argument("--interval", type=int, default=15)
    ap.add_argument("--duration", type=int, default=75)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-scrape-"))
    ports: list[int] = []
    while len(ports) < a.targets:  # free_port can hand the same port out twice
        p = free_port()
        if p not in ports:
            ports.append(p)
    tproc = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", TARGET_SERVER, str(a.series), ",".join(map(str, ports))],
                             stdout=subprocess.PIPE, text=True)
    server = None
    try:
        assert tproc.stdout is not None and tproc.stdout.readline().strip() == "ready"
        cfg = tmp / "config.yml"
        cfg.write_text(f"scrape_configs:\n  - job_name: gpu\n    scrape_interval: {a.interval}s\n    scrape_timeout: {min(a.interval, 10)}s\n"
                       f"    static_configs:\n      - targets: [{', '.join(f'127.0.0.1:{p}' for p in ports)}]\n")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = open(tmp / "server.log", "wb")
        server = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-m", "turboprom", "serve", "--data-dir", str(tmp / "data"),
                                   "--listen", f"127.0.0.1:{port}", "--config", str(cfg)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        wait_http(url + "/-/ready", 60, server)
        c0, t0 = cpu_s(server.pid), time.time()
        probes = []
        while time.time() - t0 < a.duration:
            t = time.perf_counter()
            urllib.request.urlopen(url + "/-/healthy", timeout=30).read()
            probes.append(time.perf_counter() - t)
            time.sleep(0.1)
        wall = time.time() - t0
        cpu = cpu_s(server.pid) - c0
        ok = metric(url, 'turboprom_scrapes_total{job="gpu",outcome="ok"}')
        err = metric(url, 'turboprom_scrapes_total{job="gpu",outcome="error"}')
        missed = metric(url, "turboprom_scrapes_missed_total")
        probes.sort()
        expected = a.targets * wall / a.interval
        print("| targets x series | interval | run s | scrapes ok | expected (+-1 per target) | errors | missed slots | "
              "server CPU (one core) | /-/healthy p50 / p99 / max ms |")
        print("|---|---|---|---|---|---|---|---|---|")
        print(f"| {a.targets} x {a.series} | {a.interval}s | {wall:.0f} | {ok:.0f} | {expected:.0f} | {err:.0f} | {missed:.0f} | "
              f"{cpu / wall * 100:.0f}% | {probes[len(probes) // 2] * 1000:.1f} / {probes[int(len(probes) * 0.99)] * 1000:.1f} / "
              f"{probes[-1] * 1000:.1f} |")
    finally:
        if server is not None:
            server.terminate()
            server.wait(60)
        tproc.terminate()
        tproc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
