"""Congestion API under load: poll latency and signal freshness on a real TurboProm server.

Phases (each --phase-s seconds, same server, same run):
  idle       200 polls/s of GET /api/v1/congestion, nothing else
  ingest     + remote write at --rate samples/s (2000-series requests: 200 simulated vLLM workers x 8
             congestion-relevant series + 400 unrelated node series, 1 sample each)
  ingest+query  + a loop of heavy range queries (all 2000 series, rate() over 30 s windows, 0.1 s step)

Measured in each phase, each load in its own process (the machine has 2 shared cores):
  poll latency     client-side, keep-alive HTTP/1.1, GET /api/v1/congestion (unfiltered, ~200 instances)
                   and GET /api/v1/congestion?instance=... (one instance)
  peer path        the same signal the PromQL way, GET /api/v1/query?query=vllm:num_requests_waiting,
                   on the same server, 20/s: what a scheduler would poll without the tracker
  freshness        a probe worker POSTs a new queue length (text import) 10x/s; time from just before the
                   POST to the SSE event (GET /api/v1/congestion/stream?instance=probe) that shows it
  ingest rate      samples acknowledged per second (2xx), 429s retried after 50 ms

    .venv/bin/python bench/congestion_bench.py [--phase-s 15] [--rate 100000] [--wal-fsync always]
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

N_WORKERS = 200
N_OTHER = 400
SERIES_PER_REQ = N_WORKERS * 8 + N_OTHER  # 2000


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def summary_ms(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "p50_ms": round(pct(xs, 50) * 1000, 3), "p99_ms": round(pct(xs, 99) * 1000, 3),
            "max_ms": round(max(xs) * 1000, 3) if xs else None}


# ----------------------------------------------------------------------------- load processes
def label_sets() -> list[list[tuple[str, str]]]:
    names = ["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
             "turboprom_worker_prefill_backlog_tokens", "turboprom_worker_prefill_capacity_tokens_per_second",
             "turboprom_worker_prefill_computed_tokens_total", "vllm:prompt_tokens_total", "vllm:request_success_total"]
    out = []
    for w in range(N_WORKERS):
        for n in names:
            out.append(sorted({"__name__": n, "cluster": f"c{w % 4}", "model_name": f"m{w % 2}",
                               "instance": f"gpu-{w:03d}", "job": "vllm"}.items()))
    for i in range(N_OTHER):
        out.append(sorted({"__name__": f"node_other_{i % 20}_total", "instance": f"node-{i // 20}", "job": "node"}.items()))
    return out


def sender(url: str, rate: int, start_at: float, duration: float, q: mp.Queue) -> None:
    from ingest.proto.messages import WriteRequest
    from ingest.snappy_block import compress

    import aiohttp

    per_s = rate / SERIES_PER_REQ
    n_req = int(per_s * duration)
    step_ms = 1000.0 / per_s
    lsets = label_sets()
    w = WriteRequest()
    for ls in lsets:
        ts = w.timeseries.add()
        for n, v in ls:
            ts.labels.add(name=n, value=v)
        ts.samples.add(value=0.0, timestamp=0)
    bodies: list[bytes] = []
    t0_ms = int(start_at * 1000)
    for k in range(n_req):
        tsm = t0_ms + int(k * step_ms)
        for i, series in enumerate(w.timeseries):
            s = series.samples[0]
            s.timestamp = tsm
            kind = i % 8 if i < N_WORKERS * 8 else 9
            s.value = (float((k + i) % 13) if kind in (0, 1, 3) else 0.5 if kind == 2 else 4000.0 if kind == 4
                       else float(k * (i % 50 + 10)))
        bodies.append(compress(w.SerializeToString()))
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
               "X-Prometheus-Remote-Write-Version": "0.1.0"}

    async def run() -> dict[str, Any]:
        ok = 0
        retries = 0
        lat: list[float] = []
        await asyncio.sleep(max(0.0, start_at - time.time()))
        t_begin = time.time()

        async def one(session: aiohttp.ClientSession, k: int) -> None:
            nonlocal ok, retries
            t = time.perf_counter()
            for _ in range(100):
                async with session.post(url + "/api/v1/write", data=bodies[k], headers=headers) as r:
                    await r.read()
                    if r.status < 300:
                        ok += SERIES_PER_REQ
                        break
                    retries += 1
                    await asyncio.sleep(0.05)
            lat.append(time.perf_counter() - t)

        sem = asyncio.Semaphore(4)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as session:
            tasks = []
            for k in range(n_req):
                due = start_at + k / per_s
                await asyncio.sleep(max(0.0, due - time.time()))
                await sem.acquire()
                task = asyncio.create_task(one(session, k))
                task.add_done_callback(lambda _: sem.release())
                tasks.append(task)
            await asyncio.gather(*tasks)
        elapsed = time.time() - t_begin
        return {"samples_ok": ok, "elapsed_s": elapsed, "samples_per_s": ok / elapsed, "retries": retries,
                "request": summary_ms(lat)}

    q.put(("ingest", asyncio.run(run())))


def poller(host: str, port: int, path: str, per_s: float, start_at: float, duration: float, name: str, q: mp.Queue) -> None:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    lat: list[float] = []
    errors = 0
    time.sleep(max(0.0, start_at - time.time()))
    k = 0
    end = start_at + duration
    while True:
        due = start_at + k / per_s
        if due >= end:
            break
        delay = due - time.time()
        if delay > 0:
            time.sleep(delay)
        t = time.perf_counter()
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read()
        lat.append(time.perf_counter() - t)
        if r.status != 200 or not body:
            errors += 1
        k += 1
    q.put((name, {**summary_ms(lat), "errors": errors, "achieved_per_s": round(len(lat) / duration, 1)}))


def heavy_queries(host: str, port: int, start_at: float, duration: float, q: mp.Queue) -> None:
    conn = http.client.HTTPConnection(host, port, timeout=120)
    time.sleep(max(0.0, start_at - time.time()))
    lat: list[float] = []
    statuses: dict[int, int] = {}
    while time.time() < start_at + duration:
        now = time.time()
        params = urllib.parse.urlencode({"query": 'sum by (job) (rate({job=~"vllm|node"}[30s]))',
                                         "start": f"{now - 60:.3f}", "end": f"{now:.3f}", "step": "0.1"})
        t = time.perf_counter()
        conn.request("GET", "/api/v1/query_range?" + params)
        r = conn.getresponse()
        r.read()
        lat.append(time.perf_counter() - t)
        statuses[r.status] = statuses.get(r.status, 0) + 1
    q.put(("heavy_query", {**summary_ms(lat), "statuses": statuses}))


def freshness_probe(url: str, start_at: float, duration: float, q: mp.Queue) -> None:
    import aiohttp

    async def run() -> dict[str, Any]:
        sent: dict[int, float] = {}
        seen: dict[int, float] = {}
        await asyncio.sleep(max(0.0, start_at - time.time()))
        async with aiohttp.ClientSession() as s:
            async def listen() -> None:
                async with s.get(url + "/api/v1/congestion/stream", params={"instance": "probe"},
                                 timeout=aiohttp.ClientTimeout(total=duration + 30)) as r:
                    async for raw in r.content:
                        if raw.startswith(b"data: "):
                            now = time.perf_counter()
                            for d in json.loads(raw[6:])["instances"]:
                                v = d.get("queue_length")
                                if v is not None and int(v) in sent and int(v) not in seen:
                                    seen[int(v)] = now

            listener = asyncio.create_task(listen())
            await asyncio.sleep(0.5)
            seq = 1000
            end = time.time() + duration - 1.0
            while time.time() < end:
                seq += 1
                body = f'vllm:num_requests_waiting{{cluster="probe",model_name="p",instance="probe"}} {seq}\n'
                sent[seq] = time.perf_counter()
                async with s.post(url + "/api/v1/import/prometheus", data=body.encode()) as r:
                    await r.read()
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)
            listener.cancel()
        lat = [seen[k] - sent[k] for k in sent if k in seen]
        return {**summary_ms(lat), "sent": len(sent), "seen": len(seen)}

    q.put(("freshness", asyncio.run(run())))


# ----------------------------------------------------------------------------- orchestration
def run_phase(name: str, server_url: str, args: argparse.Namespace, ingest: bool, heavy: bool) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    u = urllib.parse.urlparse(server_url)
    start_at = time.time() + (8.0 if ingest else 2.0)  # payload build time for the sender
    d = args.phase_s
    procs = [
        ctx.Process(target=poller, args=(u.hostname, u.port, "/api/v1/congestion", 200.0, start_at, d, "poll_all", q)),
        ctx.Process(target=poller, args=(u.hostname, u.port, "/api/v1/congestion?instance=gpu-007", 20.0, start_at, d,
                                         "poll_one", q)),
        ctx.Process(target=poller, args=(u.hostname, u.port, "/api/v1/query?query=vllm%3Anum_requests_waiting", 20.0,
                                         start_at, d, "peer_promql_poll", q)),
        ctx.Process(target=freshness_probe, args=(server_url, start_at, d, q)),
    ]
    if ingest:
        procs.append(ctx.Process(target=sender, args=(server_url, args.rate, start_at, d, q)))
    if heavy:
        procs.append(ctx.Process(target=heavy_queries, args=(u.hostname, u.port, start_at, d, q)))
    for p in procs:
        p.start()
    out: dict[str, Any] = {}
    for _ in procs:
        k, v = q.get(timeout=d + 300)
        out[k] = v
    for p in procs:
        p.join(30)
    print(f"[{name}] " + json.dumps(out), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase-s", type=float, default=15.0)
    ap.add_argument("--rate", type=int, default=100_000)
    ap.add_argument("--wal-fsync", default="always", choices=["always", "batch", "never"])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", default=None, help="write all results here")
    args = ap.parse_args()

    from tests.helpers import ServerProcess

    results: dict[str, list[dict[str, Any]]] = {"idle": [], "ingest": [], "ingest+query": []}
    with tempfile.TemporaryDirectory(prefix="congestion-bench-") as tmp:
        cfg = Path(tmp) / "turboprom.yml"
        cfg.write_text("congestion:\n  resolution: 1s\n")
        with ServerProcess(Path(tmp) / "data", ["--config", str(cfg), "--wal-fsync", args.wal_fsync]) as server:
            for _ in range(args.repeats):
                results["idle"].append(run_phase("idle", server.url, args, ingest=False, heavy=False))
                results["ingest"].append(run_phase("ingest", server.url, args, ingest=True, heavy=False))
                results["ingest+query"].append(run_phase("ingest+query", server.url, args, ingest=True, heavy=True))
            with urllib.request.urlopen(server.url + "/api/v1/congestion") as r:
                n_inst = len(json.loads(r.read())["data"]["instances"])
    print(f"\ninstances tracked at the end: {n_inst}")
    print("\n| phase | poll all p50/p99 ms | poll one p50/p99 ms | PromQL poll p50/p99 ms | freshness p50/p99 ms | ingest samples/s | heavy query p50 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for phase, runs in results.items():
        def med(key: str, field: str) -> float:
            vals = [r[key][field] for r in runs if key in r and r[key].get(field) is not None]
            return round(statistics.median(vals), 2) if vals else float("nan")
        print(f"| {phase} | {med('poll_all','p50_ms')} / {med('poll_all','p99_ms')} | {med('poll_one','p50_ms')} / "
              f"{med('poll_one','p99_ms')} | {med('peer_promql_poll','p50_ms')} / {med('peer_promql_poll','p99_ms')} | "
              f"{med('freshness','p50_ms')} / {med('freshness','p99_ms')} | {med('ingest','samples_per_s')} | "
              f"{med('heavy_query','p50_ms')} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    import urllib.request  # noqa: F401 - used in main

    main()
