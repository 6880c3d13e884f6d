"""Scraping per CPU-second: TurboProm's scraper against Prometheus 2.42's on the same targets.

One local target process (pinned to core 1) serves ``--targets`` loopback ports with one of two
bodies: the real node exporter's ``/metrics`` (captured once from ``prometheus-node-exporter``) or a
vLLM engine's (the 79 series of bench/vllm_fleet.py's layout, HELP/TYPE lines, vLLM's bucket bounds,
values moving every request). Each server in turn (pinned to core 0, a fresh data dir, the same
scrape config: one job, ``--interval``) scrapes them; after a warm-up of two intervals (series
creation), the server's CPU (utime + stime) and its appended-samples counter
(``turboprom_storage_appended_samples_total`` / ``prometheus_tsdb_head_samples_appended_total``) are
read over ``--duration`` seconds (for TurboProm, successful scrapes x samples per scrape: its counter
also counts the congestion tracker's written-back series). Reported per body and server: samples
appended per second, per server CPU-second, and the ratio TurboProm / Prometheus. A third row per body: TurboProm receiving
the same bodies at the same rate by ``POST /api/v1/import/prometheus`` (a pusher process on core 1,
``extra_label`` instance per target), its imported samples per CPU-second against Prometheus's
scraper (the issue's text-import target). Both servers run their defaults (TurboProm's
WAL fsync ``always``; Prometheus does not fsync per append). Runs ~9 minutes with the defaults
(six servers, each ``duration + 2 x interval`` seconds plus start-up).

    .venv/bin/python bench/scrape_peer.py [--targets 100] [--interval 5] [--duration 40] [--bodies node,vllm]
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from ingest_remote_write import proc_cpu_s  # noqa: E402
from ingest_scrape import SERVE_ON_PORTS  # noqa: E402
from ingest_scrape_parse import node_body  # noqa: E402
from tests.helpers import free_port, require_binary, wait_http  # noqa: E402
from tests.test_ingest_support import metric_value  # noqa: E402
from vllm_fleet import LAYOUT  # noqa: E402

# The body a script sends: ``static`` (the file), and for the vLLM template ``vllm(c)``, its "{v}"
# value column filled for request ``c`` (counters and buckets grow, gauges move).
BODIES = r'''
static = open(body_file, "rb").read()
template = static.decode().split("\n")
def vllm(c):
    return "\n".join(l.replace("{v}", repr(float(c * (k % 7 + 1) + k))) for k, l in enumerate(template)).encode()
'''

TARGET_SERVER = r'''
import asyncio, itertools, sys
from aiohttp import web
kind, body_file, ports = sys.argv[1], sys.argv[2], [int(p) for p in sys.argv[3].split(",")]
''' + BODIES + r'''
counter = itertools.count()
async def handle(request):
    c = next(counter)
    return web.Response(body=static if kind == "node" else vllm(c), content_type="text/plain")
''' + SERVE_ON_PORTS


PUSHER = r'''
import http.client, itertools, sys, time, urllib.parse
kind, body_file, port, targets, interval = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
''' + BODIES + r'''
conn = http.client.HTTPConnection("127.0.0.1", port)
paths = ["/api/v1/import/prometheus?" + urllib.parse.urlencode([("extra_label", "job=push"), ("extra_label", f"instance=t{i}")])
         for i in range(targets)]
t0 = time.time()
for c in itertools.count():
    for i in range(targets):
        delay = t0 + c * interval + i * interval / targets - time.time()
        if delay > 0:
            time.sleep(delay)
        conn.request("POST", paths[i], body=static if kind == "node" else vllm(c))
        conn.getresponse().read()
'''


def vllm_template() -> bytes:
    """One vLLM engine's exposition with ``{v}`` where each value goes (filled per request)."""
    lab = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'
    lines, seen = [], set()
    for name, extra in LAYOUT:
        fam = name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") if "latency" in name or \
            "seconds" in name else name
        if fam not in seen:
            seen.add(fam)
            kind = "histogram" if fam != name else ("gauge" if name.split(":")[1].startswith(("num_", "kv_")) else "counter")
            lines += [f"# HELP {fam} {fam.split(':')[1].replace('_', ' ')}.", f"# TYPE {fam} {kind}"]
        labels = ",".join([lab] + [f'{k}="{v}"' for k, v in extra.items()])
        lines.append(f"{name}{{{labels}}} {{v}}")
    return ("\n".join(lines) + "\n").encode()


def run_server(kind: str, work: Path, cfg: Path, interval: int, duration: float, per_scrape: int, *,
               body_kind: str = "", body_file: Path | None = None, targets: int = 0) -> dict[str, float]:
    """One server's samples, CPU and wall time over ``duration`` after the warm-up. ``kind``: turboprom
    or prometheus scraping the targets, or ``import``: TurboProm receiving the same bodies by
    ``POST /api/v1/import/prometheus`` from a pusher process (core 1), one per target and interval."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data = work / f"{kind}-data"
    if kind in ("turboprom", "import"):
        cmd = [sys.executable, "-m", "turboprom", "serve", "--data-dir", str(data), "--listen", f"127.0.0.1:{port}",
               "--config", str(cfg if kind == "turboprom" else cfg.with_suffix(".import.yml"))]
        appended = "turboprom_storage_appended_samples_total"
    else:
        cmd = [require_binary("prometheus"), f"--config.file={cfg}", f"--storage.tsdb.path={data}",
               f"--web.listen-address=127.0.0.1:{port}"]
        appended = "prometheus_tsdb_head_samples_appended_total"

    def scraped() -> float:
        """Samples appended by scrapes: Prometheus's head counter; for TurboProm, successful scrapes x
        (samples per body + 5 report series), since its appended counter also counts the congestion
        tracker's written-back series (on by default, a cost it pays but not scraping work)."""
        if kind == "turboprom":
            return metric_value(url, "turboprom_scrapes_total", outcome="ok") * (per_scrape + 5)
        if kind == "import":
            return metric_value(url, "turboprom_ingest_samples_total", protocol="import_prometheus")
        return metric_value(url, appended)

    log = open(work / f"{kind}.log", "wb")
    proc = subprocess.Popen(["taskset", "-c", "0", *cmd], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    pusher = None
    try:
        wait_http(url + "/-/ready", 60, proc)
        if kind == "import":  # the same bodies at the same rate, pushed instead of scraped
            pusher = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", PUSHER, body_kind, str(body_file),
                                       str(port), str(targets), str(interval)])
        time.sleep(2 * interval)  # warm-up: every target scraped at least once, its series created
        c0, s0, t0 = proc_cpu_s(proc.pid), scraped(), time.time()
        time.sleep(duration)
        c1, s1, t1 = proc_cpu_s(proc.pid), scraped(), time.time()
        return {"samples": s1 - s0, "cpu": c1 - c0, "wall": t1 - t0}
    finally:
        if pusher is not None:
            pusher.terminate()
            pusher.wait(10)
        proc.terminate()
        proc.wait(60)
        log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", type=int, default=100)
    ap.add_argument("--interval", type=int, default=5)
    ap.add_argument("--duration", type=float, default=40)
    ap.add_argument("--bodies", default="node,vllm")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="scrape-peer-"))
    print("| body | samples per scrape | server | samples/s | server CPU | samples per CPU-s | TurboProm / Prometheus per CPU-s |")
    print("|---|---:|---|---:|---:|---:|---:|")
    try:
        for body in a.bodies.split(","):
            raw = node_body() if body == "node" else vllm_template()
            body_file = work / f"{body}.txt"
            body_file.write_bytes(raw)
            per_scrape = sum(1 for line in raw.decode().splitlines() if line and not line.startswith("#"))
            ports: list[int] = []
            while len(ports) < a.targets:
                p = free_port()
                if p not in ports:
                    ports.append(p)
            tproc = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", TARGET_SERVER, body, str(body_file),
                                      ",".join(map(str, ports))], stdout=subprocess.PIPE, text=True)
            try:
                assert tproc.stdout is not None and tproc.stdout.readline().strip() == "ready"
                cfg = work / f"{body}.yml"
                cfg.write_text(f"global:\n  scrape_interval: {a.interval}s\nscrape_configs:\n  - job_name: {body}\n"
                               f"    scrape_interval: {a.interval}s\n    scrape_timeout: {min(a.interval, 10)}s\n"
                               f"    static_configs:\n      - targets: [{', '.join(f'127.0.0.1:{p}' for p in ports)}]\n")
                cfg.with_suffix(".import.yml").write_text(f"global:\n  scrape_interval: {a.interval}s\n")
                (work / body).mkdir(parents=True, exist_ok=True)
                res = {k: run_server(k, work / body, cfg, a.interval, a.duration, per_scrape, body_kind=body,
                                     body_file=body_file, targets=a.targets) for k in ("turboprom", "prometheus", "import")}
            finally:
                tproc.terminate()
                tproc.wait(10)
            eff = {k: r["samples"] / max(r["cpu"], 1e-9) for k, r in res.items()}
            for k, r in res.items():
                ratio = f"{eff[k] / eff['prometheus']:.2f}" if k != "prometheus" else ""
                print(f"| {body} | {per_scrape} | {'turboprom text import' if k == 'import' else k} | {r['samples'] / r['wall']:,.0f} | {r['cpu'] / r['wall'] * 100:.0f}% of a core "
                      f"| {eff[k]:,.0f} | {ratio} |", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
