"""End-to-end remote-write ingest throughput: TurboProm vs Prometheus 2.42 vs VictoriaMetrics.

Same payloads, same run, same machine: snappy-compressed prometheus.WriteRequest bodies built
ahead of time (not timed), sent by 4 concurrent senders (aiohttp, one client process) over
loopback. Shapes: 2000 series x 1 sample per request (what a scraping Prometheus sends) and
500 series x 20 samples; 100k active series (every round writes each series once per sample slot,
timestamps advancing 15 s per round, so nothing is out of order; the newest sample ~30 s old when
a run starts, as a forwarding Prometheus sends them).

Label sets (``--labels``): ``fleet`` (default) -- half vLLM-engine series (9-11 labels: model_name,
engine, pod, namespace, node, cluster, ...; histogram buckets with ``le``), half node-exporter series
(8-10 labels: cpu/mode, device, ...), as a GPU serving fleet's Prometheus forwards them; ``simple`` --
the 5-label synthetic set of earlier runs.

Only acknowledged (2xx) samples count. A 429/5xx answer is retried (50 ms back-off, like Prometheus's
sender) up to 50 times; retries are counted and reported, and a request still refused after its last
retry, or refused with another 4xx, counts as failed and its samples are not counted.

Reports per target: acknowledged samples/s (wall), acknowledged samples per server CPU-second,
p50/p99 request latency (first attempt to final answer), peak RSS (VmHWM of the server process),
RSS per active series (VmRSS 2 s after the untimed warm-up that creates the series, minus VmRSS of
the empty server, over the series count: one sample per series in the head), retries and failed
requests. Medians over --repeats runs.

    .venv/bin/python bench/ingest_remote_write.py [--series 100000] [--rounds 4] [--repeats 3] [--labels fleet]
        [--compare DIR --targets turboprom,turboprom-base,prometheus,victoria-metrics]  # before/after in one run
        [--profile DIR]   # py-spy collapsed stacks of the TurboProm server's timed part (bench/profile_summary.py reads them)
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
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


VLLM_NAMES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
              "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total")
VLLM_HISTOGRAMS = ("vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                   "vllm:e2e_request_latency_seconds_bucket")
LE = ("0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1", "2.5", "5", "+Inf")
NODE = (("node_cpu_seconds_total", ("cpu", "mode")), ("node_network_receive_bytes_total", ("device",)),
        ("node_disk_read_bytes_total", ("device",)), ("node_memory_MemAvailable_bytes", ()),
        ("node_filesystem_avail_bytes", ("device", "mountpoint", "fstype")))
MEMORY = ("MemAvailable", "MemFree", "Cached", "Buffers", "Active", "Inactive", "Dirty", "Writeback", "Mapped",
          "Shmem", "Slab", "SwapCached", "PageTables")
MODES = ("idle", "user", "system", "iowait", "irq", "softirq", "steal", "nice")


def fleet_labels(i: int) -> dict[str, str]:
    """Series i of a GPU serving fleet: even i a vLLM engine series, odd i a node-exporter series."""
    node = i // 400
    common = {"cluster": f"prod-{('us-east', 'us-west', 'eu-central')[node % 3]}", "node": f"gpu-node-{node:04d}",
              "namespace": "llm-serving"}
    k = i // 2
    if i % 2 == 0:
        per_engine = len(VLLM_NAMES) + len(VLLM_HISTOGRAMS) * len(LE)
        engine, j = divmod(k, per_engine)
        d = {**common, "job": "vllm", "instance": f"10.{engine // 250 % 250}.{engine % 250}.7:8000",
             "pod": f"vllm-{engine % 97:02x}{engine:06d}-{engine % 5}", "engine": "0",
             "model_name": ("meta-llama/Llama-3.1-70B-Instruct", "Qwen/Qwen2.5-32B-Instruct", "mistralai/Mixtral-8x7B")[engine % 3]}
        if j < len(VLLM_NAMES):
            d["__name__"] = VLLM_NAMES[j]
        else:
            h, b = divmod(j - len(VLLM_NAMES), len(LE))
            d["__name__"], d["le"] = VLLM_HISTOGRAMS[h], LE[b]
        return d
    host, j = divmod(k, 64)
    d = {**common, "job": "node-exporter", "instance": f"10.1.{host // 250 % 250}.{host % 250}:9100",
         "pod": f"node-exporter-{host:05d}", "container": "node-exporter"}
    name, extra = NODE[j % len(NODE)]
    d["__name__"] = name if extra else f"node_memory_{MEMORY[j // len(NODE)]}_bytes"
    for lab in extra:
        d[lab] = {"cpu": str(j // len(NODE)), "mode": MODES[j % len(MODES)], "device": f"nvme{j}n1",
                  "mountpoint": f"/mnt/disk{j}", "fstype": "xfs"}[lab]
    return d


def simple_labels(i: int) -> dict[str, str]:
    return {"__name__": f"bench_metric_{i % 100}", "instance": f"worker-{i // 1000}:9100",
            "job": "gpu_worker", "model": f"m{i % 7}", "shard": str(i % 13)}


def build_payloads(n_series: int, per_req_series: int, samples_per_series: int, rounds: int, t0: int,
                   labels: str = "fleet") -> tuple[list[bytes], list[int]]:
    """rounds x (n_series / per_req_series) bodies in send order, and the samples in each."""
    make = fleet_labels if labels == "fleet" else simple_labels
    label_sets = [sorted(make(i).items()) for i in range(n_series)]
    out = []
    counts = []
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
            counts.append((min(start + per_req_series, n_series) - start) * samples_per_series)
    return out, counts


MAX_ATTEMPTS = 50


RW_HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
              "X-Prometheus-Remote-Write-Version": "0.1.0"}


async def send_all(url: str, payloads: list[bytes], counts: list[int], senders: int,
                   headers: dict[str, str] = RW_HEADERS) -> dict:
    """Send every payload; only 2xx answers count their samples as ingested."""
    lat: list[float] = []
    res = {"acked_samples": 0, "retries": 0, "failed": 0}
    it = iter(range(len(payloads)))

    async def worker(session: aiohttp.ClientSession) -> None:
        for i in it:
            t = time.perf_counter()
            for attempt in range(MAX_ATTEMPTS):  # 429/5xx: back off and retry like Prometheus's sender
                async with session.post(url, data=payloads[i], headers=headers) as r:
                    body = await r.read()
                    status = r.status
                if 200 <= status < 300:
                    res["acked_samples"] += counts[i]
                    break
                if (status == 429 or status >= 500) and attempt + 1 < MAX_ATTEMPTS:
                    res["retries"] += 1
                    await asyncio.sleep(0.05)
                    continue
                res["failed"] += 1  # refused for good: its samples are not counted
                res.setdefault("first_failure", f"HTTP {status}: {body[:200]!r}")
                break
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=senders)) as session:
        await asyncio.gather(*(worker(session) for _ in range(senders)))
    res["wall_s"] = time.perf_counter() - t0
    res["lat"] = lat
    return res


def result_row(r: dict, cpu_s: float, pid: int, sent_samples: int) -> dict:
    """One target's figures from ``send_all``'s result and the server's CPU over the timed part."""
    lat = sorted(r["lat"])
    acked = r["acked_samples"]
    return {"samples_s": acked / r["wall_s"], "samples_cpu_s": acked / max(cpu_s, 1e-9), "p50_ms": lat[len(lat) // 2] * 1000,
            "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, "rss_mb": proc_peak_rss_mb(pid),
            "acked_share": acked / max(sent_samples, 1), "retries": r["retries"], "failed": r["failed"],
            "first_failure": r.get("first_failure", "")}


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mb(pid: int) -> float:
    """Resident set now (VmRSS), MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def proc_peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Peer:
    compare_dir: Path | None = None  # --compare: the checkout "turboprom-base" serves from

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
        elif self.name == "turboprom-base":  # the same server from another checkout (before/after in one run)
            if self.compare_dir is None:
                raise SystemExit("target turboprom-base needs --compare DIR")
            (self.tmp / "base-data").mkdir()
            self.proc = subprocess.Popen([sys.executable, "-m", "turboprom", "serve", "--data-dir", str(self.tmp / "base-data"),
                                          "--listen", f"127.0.0.1:{port}"], cwd=self.compare_dir,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_http(f"http://127.0.0.1:{port}/-/ready", 60, self.proc)
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


def start_profile(pid: int, out: Path) -> subprocess.Popen:
    """py-spy (in the .venv) sampling the server's threads, idle ones left out, as raw collapsed stacks."""
    spy = Path(sys.executable).with_name("py-spy")
    return subprocess.Popen([str(spy), "record", "--pid", str(pid), "--format", "raw", "--rate", "100", "--threads",
                             "--nonblocking", "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profile(spy: subprocess.Popen) -> None:
    spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    try:
        spy.wait(60)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait()


def run_one(name: str, payloads: list[bytes], counts: list[int], warm: list[bytes], warm_counts: list[int],
            senders: int, n_series: int, profile: Path | None = None) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-rw-{name}-"))
    peer = Peer(name, tmp)
    try:
        peer.start()
        rss0 = proc_rss_mb(peer.proc.pid)
        w = asyncio.run(send_all(peer.url, warm, warm_counts, senders))  # creates the series (not timed)
        if w["failed"]:
            raise RuntimeError(f"{name}: {w['failed']} warm-up requests refused")
        time.sleep(2.0)  # let the series settle (Go/Python allocators, a head seal) before reading RSS
        rss_series = (proc_rss_mb(peer.proc.pid) - rss0) * 1024 * 1024 / max(n_series, 1)
        spy = start_profile(peer.proc.pid, profile) if profile is not None and name.startswith("turboprom") else None
        cpu0 = proc_cpu_s(peer.proc.pid)
        r = asyncio.run(send_all(peer.url, payloads, counts, senders))
        cpu = proc_cpu_s(peer.proc.pid) - cpu0
        if spy is not None:
            stop_profile(spy)
        return {**result_row(r, cpu, peer.proc.pid, sum(counts)), "rss_per_series_b": rss_series}
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
    ap.add_argument("--labels", default="fleet", choices=["fleet", "simple"])
    ap.add_argument("--compare", type=Path, default=None,
                    help="a checkout of another TurboProm version (git worktree or archive): target turboprom-base serves from it")
    ap.add_argument("--profile", type=Path, default=None,
                    help="directory: a py-spy profile (collapsed stacks) of the TurboProm server's timed part per shape and run")
    a = ap.parse_args()
    Peer.compare_dir = a.compare
    if a.profile is not None:
        a.profile.mkdir(parents=True, exist_ok=True)
    for shape in a.shapes.split(","):
        per_req, per_series = map(int, shape.split("x"))
        rounds = a.rounds if per_series == 1 else max(1, a.rounds // 4)

        def payloads_now() -> tuple[list[bytes], list[int], list[bytes], list[int]]:
            """Bodies whose newest sample is ~30 s old when the run starts, as a forwarding Prometheus
            sends them (built again for every run, untimed: data hours old would make the congestion
            tracker forget and re-learn every instance on every rebuild, which a live fleet never does)."""
            span_ms = (rounds + 1) * per_series * 15_000
            allp, allc = build_payloads(a.series, per_req, per_series, rounds + 1,
                                        int(time.time() * 1000) - span_ms - 30_000, a.labels)
            n_warm = -(-a.series // per_req)
            return allp[n_warm:], allc[n_warm:], allp[:n_warm], allc[:n_warm]

        t_build = time.time()
        payloads, counts, _, _ = payloads_now()
        samples = sum(counts)
        print(f"# shape {shape} ({a.labels} labels): {len(payloads)} requests, {samples} samples, {a.series} active series, "
              f"{a.senders} senders (payloads built in {time.time() - t_build:.1f}s before each run)", flush=True)
        results: dict[str, list[dict]] = {}
        for rep in range(a.repeats):
            for name in a.targets.split(","):
                prof = a.profile / f"{name}-{shape}-run{rep + 1}.txt" if a.profile is not None else None
                payloads, counts, warm, warm_counts = payloads_now()
                r = run_one(name, payloads, counts, warm, warm_counts, a.senders, a.series, prof)
                results.setdefault(name, []).append(r)
                print(f"  run {rep + 1} {name:17s} {r['samples_s']:>10,.0f} samples/s  {r['samples_cpu_s']:>10,.0f} /cpu-s  "
                      f"p99 {r['p99_ms']:7.1f} ms  peak RSS {r['rss_mb']:6.0f} MB  RSS/series {r['rss_per_series_b']:5.0f} B  acked {r['acked_share']:.1%}  "
                      f"retries {r['retries']}  failed {r['failed']}", flush=True)
                if r["first_failure"]:
                    print(f"    first refused request: {r['first_failure']}", flush=True)
        med = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0] if k != "first_failure"} for n, rs in results.items()}
        print(f"| shape {shape} | acked samples/s | acked samples per server CPU-s | p50 ms | p99 ms | peak RSS MB "
              "| RSS per series B | acked | retries | failed |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for n, m in med.items():
            print(f"| {n} | {m['samples_s']:,.0f} | {m['samples_cpu_s']:,.0f} | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} | {m['rss_mb']:.0f} "
                  f"| {m['rss_per_series_b']:,.0f} "
                  f"| {m['acked_share']:.1%} | {m['retries']:.0f} | {m['failed']:.0f} |")
        if "turboprom" in med:
            for n, m in med.items():
                if n != "turboprom":
                    print(f"ratio turboprom/{n}: wall {med['turboprom']['samples_s'] / m['samples_s']:.2f}, "
                          f"per CPU-s {med['turboprom']['samples_cpu_s'] / m['samples_cpu_s']:.2f}")
        print(flush=True)


if __name__ == "__main__":
    main()
