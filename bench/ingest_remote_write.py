"""End-to-end remote-write ingest throughput: TurboProm vs Prometheus 2.42 vs VictoriaMetrics.

Same payloads, same run, same machine: snappy-compressed prometheus.WriteRequest bodies built
ahead of time (not timed), sent by 4 concurrent senders (aiohttp, one client process) over
loopback. Shapes: 2000 series x 1 sample per request (what a scraping Prometheus sends) and
500 series x 20 samples; 100k active series (every round writes each series once per sample slot,
timestamps advancing 15 s per round, so nothing is out of order).

Reports per target: samples/s (wall), samples per server CPU-second, p50/p99 request latency,
peak RSS (VmHWM of the server process), non-2xx answers. Medians over --repeats runs.

    .venv/bin/python bench/ingest_remote_write.py [--series 100000] [--rounds 4] [--repeats 3]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ingest.proto.messages import WriteRequest  # noqa: E402
from ingest.snappy_block import compress  # noqa: E402
from tests.helpers import ServerProcess, free_port, wait_http  # noqa: E402


def build_payloads(n_series: int, per_req_series: int, samples_per_series: int, rounds: int, t0: int) -> list[bytes]:
    """rounds x (n_series / per_req_series) bodies, in send order."""
    label_sets = []
    for i in range(n_series):
        label_sets.append(sorted({"__name__": f"bench_metric_{i % 100}", "instance": f"worker-{i // 1000}:9100",
                                  "job": "gpu_worker", "model": f"m{i % 7}", "shard": str(i % 13)}.items()))
    out = []
    for r in range(rounds):
        base = t0 + r * samples_per_series * 15_000
        for start in range(0, n_series, per_req_series):
            w = WriteRequest()
            for i in range(start, min(start + per_req_series, n_series)):
                ts = w.timeseries.add()
                for n, v in label_sets[i]:
                    ts.labels.add(name=n, value=v)
                for j in range(samples_per_series):
                    ts.samples.add(value=float((i * 31 + j + r) % 1000) + 0.25, timestamp=base + j * 15_000)
            out.append(compress(w.SerializeToString()))
    return out


async def send_all(url: str, payloads: list[bytes], senders: int) -> tuple[float, list[float], int]:
    lat: list[float] = []
    errors = 0
    it = iter(range(len(payloads)))
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
               "X-Prometheus-Remote-Write-Version": "0.1.0"}

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        for i in it:
            t = time.perf_counter()
            for attempt in range(50):  # 429/5xx: back off and retry like Prometheus's sender
                async with session.post(url, data=payloads[i], headers=headers) as r:
                    await r.read()
                    if r.status < 300:
                        break
                    if r.status == 429 or r.status >= 500:
                        await asyncio.sleep(0.05)
                        continue
                    errors += 1
                    break
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=senders)) as session:
        await asyncio.gather(*(worker(session) for _ in range(senders)))
    return time.perf_counter() - t0, lat, errors


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def proc_peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Peer:
    def __init__(self, name: str, tmp: Path):
        self.name = name
        self.tmp = tmp
        self.proc: subprocess.Popen | None = None
        self.server: ServerProcess | None = None
        self.url = ""

    def start(self) -> None:
        port = free_port()
        if self.name == "turboprom":
            self.server = ServerProcess(self.tmp / "tp-data", port=port).start()
            self.proc = self.server.proc
        elif self.name == "prometheus":
            cfg = self.tmp / "prom.yml"
            cfg.write_text("global: {scrape_interval: 1h}\n")
            self.proc = subprocess.Popen(["/usr/bin/prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={self.tmp / 'prom-data'}",
                                          f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_http(f"http://127.0.0.1:{port}/-/ready", 60, self.proc)
        else:
            self.proc = subprocess.Popen(["/usr/bin/victoria-metrics", f"-httpListenAddr=127.0.0.1:{port}",
                                          f"-storageDataPath={self.tmp / 'vm-data'}", "-retentionPeriod=100y"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_http(f"http://127.0.0.1:{port}/health", 60, self.proc)
        self.url = f"http://127.0.0.1:{port}/api/v1/write"

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        elif self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run_one(name: str, payloads: list[bytes], warm: list[bytes], samples: int, senders: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-rw-{name}-"))
    peer = Peer(name, tmp)
    try:
        peer.start()
        asyncio.run(send_all(peer.url, warm, senders))  # creates the 100k series (not timed)
        cpu0 = proc_cpu_s(peer.proc.pid)
        wall, lat, errors = asyncio.run(send_all(peer.url, payloads, senders))
        cpu = proc_cpu_s(peer.proc.pid) - cpu0
        lat.sort()
        return {"samples_s": samples / wall, "samples_cpu_s": samples / max(cpu, 1e-9), "p50_ms": lat[len(lat) // 2] * 1000,
                "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, "rss_mb": proc_peak_rss_mb(peer.proc.pid),
                "errors": errors}
    finally:
        peer.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--series", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--targets", default="turboprom,prometheus,victoria-metrics")
    ap.add_argument("--shapes", default="2000x1,500x20")
    a = ap.parse_args()
    t0 = int(time.time() * 1000) - 3_600_000 * 3
    for shape in a.shapes.split(","):
        per_req, per_series = map(int, shape.split("x"))
        rounds = a.rounds if per_series == 1 else max(1, a.rounds // 4)
        t_build = time.time()
        allp = build_payloads(a.series, per_req, per_series, rounds + 1, t0)
        n_warm = a.series // per_req
        warm, payloads = allp[:n_warm], allp[n_warm:]
        samples = len(payloads) * per_req * per_series
        print(f"# shape {shape}: {len(payloads)} requests, {samples} samples, {a.series} active series, "
              f"{a.senders} senders (payloads built in {time.time() - t_build:.1f}s)", flush=True)
        results: dict[str, list[dict]] = {}
        for rep in range(a.repeats):
            for name in a.targets.split(","):
                r = run_one(name, payloads, warm, samples, a.senders)
                results.setdefault(name, []).append(r)
                print(f"  run {rep + 1} {name:17s} {r['samples_s']:>10,.0f} samples/s  {r['samples_cpu_s']:>10,.0f} /cpu-s  "
                      f"p99 {r['p99_ms']:7.1f} ms  peak RSS {r['rss_mb']:6.0f} MB  errors {r['errors']}", flush=True)
        med = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for n, rs in results.items()}
        print(f"| shape {shape} | samples/s | samples per server CPU-s | p50 ms | p99 ms | peak RSS MB | non-2xx |")
        print("|---|---|---|---|---|---|---|")
        for n, m in med.items():
            print(f"| {n} | {m['samples_s']:,.0f} | {m['samples_cpu_s']:,.0f} | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} | {m['rss_mb']:.0f} | {m['errors']:.0f} |")
        if "turboprom" in med:
            for n, m in med.items():
                if n != "turboprom":
                    print(f"ratio turboprom/{n}: wall {med['turboprom']['samples_s'] / m['samples_s']:.2f}, "
                          f"per CPU-s {med['turboprom']['samples_cpu_s'] / m['samples_cpu_s']:.2f}")
        print(flush=True)


if __name__ == "__main__":
    main()
