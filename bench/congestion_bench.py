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
import urllib.request
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
def wait_start(start: Any) -> float:
    """Block until the orchestrator publishes the phase start time (after the sender built its payloads)."""
    while start.value <= 0:
        time.sleep(0.02)
    return float(start.value)


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


def sender(url: str, rate: int, start: Any, duration: float, q: mp.Queue) -> None:
    """N_SENDERS concurrent senders, each owning a disjoint quarter of the series and sending its
    requests in order (so no sample is ever out of order); paced to ``rate``; if the server is
    slower, each sender runs closed-loop and the achieved rate is what gets reported."""
    from ingest.proto.messages import WriteRequest
    from ingest.snappy_block import compress

    import aiohttp

    n_senders = 4
    lsets = label_sets()
    per_sender = len(lsets) // n_senders
    req_per_s = rate / per_sender  # all senders together
    n_req = int(req_per_s * duration / n_senders)  # per sender
    step_ms = 1000.0 * n_senders / req_per_s
    bodies: list[list[bytes]] = []
    # Timestamps start 30 s ahead of the build (storage accepts up to 10 min in the future) so the
    # payloads can be built before the phase starts; per-series order is all that matters.
    t0_ms = int((time.time() + 30.0) * 1000)
    for snd in range(n_senders):
        w = WriteRequest()
        mine = range(snd * per_sender, (snd + 1) * per_sender)
        for i in mine:
            ts = w.timeseries.add()
            for n, v in lsets[i]:
                ts.labels.add(name=n, value=v)
            ts.samples.add(value=0.0, timestamp=0)
        out = []
        for k in range(n_req):
            tsm = t0_ms + int(k * step_ms)
            for i, series in zip(mine, w.timeseries):
                smp = series.samples[0]
                smp.timestamp = tsm
                kind = i % 8 if i < N_WORKERS * 8 else 9
                smp.value = (float((k + i) % 13) if kind in (0, 1, 3) else 0.5 if kind == 2 else 4000.0 if kind == 4
                             else float(k * (i % 50 + 10)))
            out.append(compress(w.SerializeToString()))
        bodies.append(out)
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
               "X-Prometheus-Remote-Write-Version": "0.1.0"}

    q.put(("ready", None))
    start_at = wait_start(start)

    async def run() -> dict[str, Any]:
        ok = 0
        retries = 0
        rejected: dict[int, int] = {}
        lat: list[float] = []
        await asyncio.sleep(max(0.0, start_at - time.time()))
        t_begin = time.time()

        async def one_sender(session: aiohttp.ClientSession, snd: int) -> None:
            nonlocal ok, retries
            for k in range(n_req):
                if time.time() >= start_at + duration:
                    break  # slower than the target: the phase ends on time, the achieved rate says so
                due = start_at + k * step_ms / 1000.0
                await asyncio.sleep(max(0.0, due - time.time()))
                t = time.perf_counter()
                for _ in range(100):
                    async with session.post(url + "/api/v1/write", data=bodies[snd][k], headers=headers) as r:
                        await r.read()
                        if r.status < 300:
                            ok += per_sender
                            break
                        if r.status in (429, 503):  # overload: back off and retry, as Prometheus does
                            retries += 1
                            await asyncio.sleep(0.05)
                            continue
                        rejected[r.status] = rejected.get(r.status, 0) + 1
                        break
                lat.append(time.perf_counter() - t)

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=n_senders)) as session:
            await asyncio.gather(*(one_sender(session, snd) for snd in range(n_senders)))
        elapsed = time.time() - t_begin
        return {"samples_ok": ok, "elapsed_s": round(elapsed, 2), "samples_per_s": round(ok / elapsed),
                "retries_429": retries, "rejected": rejected, "request": summary_ms(lat)}

    q.put(("ingest", asyncio.run(run())))


def poller(host: str, port: int, path: str, per_s: float, start: Any, duration: float, name: str, q: mp.Queue) -> None:
    start_at = wait_start(start)
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


def heavy_queries(host: str, port: int, start: Any, duration: float, q: mp.Queue) -> None:
    start_at = wait_start(start)
    conn = http.client.HTTPConnection(host, port, timeout=120)
    time.sleep(max(0.0, start_at - time.time()))
    lat: list[float] = []
    statuses: dict[int, int] = {}
    first_error: str | None = None
    while time.time() < start_at + duration:
        now = time.time()
        params = urllib.parse.urlencode({"query": 'sum by (job) (rate({job=~"vllm|node"}[30s]))',
                                         # the load's timestamps run up to ~40 s ahead of the wall clock
                                         "start": f"{now - 30:.3f}", "end": f"{now + 45:.3f}", "step": "0.1"})
        t = time.perf_counter()
        conn.request("GET", "/api/v1/query_range?" + params)
        r = conn.getresponse()
        body = r.read()
        lat.append(time.perf_counter() - t)
        statuses[r.status] = statuses.get(r.status, 0) + 1
        if r.status != 200 and first_error is None:
            first_error = body[:300].decode(errors="replace")
    q.put(("heavy_query", {**summary_ms(lat), "statuses": statuses, "first_error": first_error}))


def freshness_probe(url: str, start: Any, duration: float, q: mp.Queue) -> None:
    start_at = wait_start(start)
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
                                if v is None:
                                    continue
                                # a newer value supersedes older ones: they count as visible now
                                for k in [k for k in sent if k <= int(v) and k not in seen]:
                                    seen[k] = now

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
def server_hist(url: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts of one of the tracker's own histograms from the server's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        if fam.name == name:
            return {float(smp.labels["le"]): smp.value for smp in fam.samples if smp.name.endswith("_bucket")}
    return {}


def hist_quantiles(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """p50/p99 upper bounds (bucket edges, ms) of the observations made between two scrapes."""
    d = {le: after.get(le, 0) - before.get(le, 0) for le in after}
    total = d.get(float("inf"), 0)
    out: dict[str, Any] = {"n": int(total)}
    for qn, qv in (("p50_le_ms", 0.5), ("p99_le_ms", 0.99)):
        edge = next((le for le in sorted(d) if total and d[le] >= qv * total), float("nan"))
        out[qn] = edge * 1000 if edge != float("inf") else "inf"
    return out


def run_phase(name: str, server_url: str, args: argparse.Namespace, ingest: bool, heavy: bool,
              peer: bool = False) -> dict[str, Any]:
    """One phase; ``peer`` replaces the congestion pollers by the PromQL poller (same 200/s target)."""
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    u = urllib.parse.urlparse(server_url)
    start_at = ctx.Value("d", 0.0)  # published once the sender has built its payloads
    d = args.phase_s
    if peer:
        procs = [ctx.Process(target=poller, args=(u.hostname, u.port, "/api/v1/query?query=vllm%3Anum_requests_waiting",
                                                  200.0, start_at, d, "peer_promql_poll", q))]
    else:
        procs = [
            ctx.Process(target=poller, args=(u.hostname, u.port, "/api/v1/congestion", 200.0, start_at, d, "poll_all", q)),
            ctx.Process(target=poller, args=(u.hostname, u.port, "/api/v1/congestion?instance=gpu-007", 20.0, start_at,
                                             d, "poll_one", q)),
            ctx.Process(target=freshness_probe, args=(server_url, start_at, d, q)),
        ]
    if ingest:
        procs.append(ctx.Process(target=sender, args=(server_url, args.rate, start_at, d, q)))
    if heavy:
        procs.append(ctx.Process(target=heavy_queries, args=(u.hostname, u.port, start_at, d, q)))
    hists = ("turboprom_congestion_publish_delay_seconds", "turboprom_congestion_consume_seconds",
             "turboprom_congestion_snapshot_build_seconds")
    before = {h: server_hist(server_url, h) for h in hists}
    for p in procs:
        p.start()
    out: dict[str, Any] = {}
    if ingest:
        k, v = q.get(timeout=600)
        assert k == "ready", k
    time.sleep(1.0)  # let every process reach wait_start
    start_at.value = time.time() + 0.5
    for _ in procs:
        k, v = q.get(timeout=d + 600)
        out[k] = v
    for p in procs:
        p.join(30)
    for h in hists:
        out[h.removeprefix("turboprom_congestion_")] = hist_quantiles(before[h], server_hist(server_url, h))
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

    results: dict[str, list[dict[str, Any]]] = {"idle": [], "ingest": [], "ingest+query": [], "peer idle": [],
                                                "peer ingest": []}
    with tempfile.TemporaryDirectory(prefix="congestion-bench-") as tmp:
        cfg = Path(tmp) / "turboprom.yml"
        cfg.write_text("congestion:\n  resolution: 1s\n")
        with ServerProcess(Path(tmp) / "data", ["--config", str(cfg), "--wal-fsync", args.wal_fsync]) as server:
            for _ in range(args.repeats):
                results["idle"].append(run_phase("idle", server.url, args, ingest=False, heavy=False))
                results["ingest"].append(run_phase("ingest", server.url, args, ingest=True, heavy=False))
                results["ingest+query"].append(run_phase("ingest+query", server.url, args, ingest=True, heavy=True))
                results["peer idle"].append(run_phase("peer idle", server.url, args, ingest=False, heavy=False, peer=True))
                results["peer ingest"].append(run_phase("peer ingest", server.url, args, ingest=True, heavy=False,
                                                        peer=True))
            with urllib.request.urlopen(server.url + "/api/v1/congestion") as r:
                n_inst = len(json.loads(r.read())["data"]["instances"])
    print(f"\ninstances tracked at the end: {n_inst}")
    print("\n| phase | poll p50 / p99 ms (achieved polls/s) | one-instance poll p50 / p99 ms | freshness p50 / p99 ms | "
          "ingest samples/s (target) | heavy range query p50 ms | tracker publish delay p50 / p99 (bucket le, ms) | "
          "consume per batch p50 / p99 (le, ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for phase, runs in results.items():
        def med(key: str, field: str) -> float:
            vals = [r[key][field] for r in runs if key in r and r[key].get(field) is not None]
            return round(statistics.median(vals), 2) if vals else float("nan")
        pk = "peer_promql_poll" if phase.startswith("peer") else "poll_all"
        print(f"| {phase} | {med(pk, 'p50_ms')} / {med(pk, 'p99_ms')} ({med(pk, 'achieved_per_s')}) | "
              f"{med('poll_one', 'p50_ms')} / {med('poll_one', 'p99_ms')} | {med('freshness', 'p50_ms')} / "
              f"{med('freshness', 'p99_ms')} | {med('ingest', 'samples_per_s')} ({args.rate}) | {med('heavy_query', 'p50_ms')} | "
              f"{runs[0]['publish_delay_seconds']['p50_le_ms']} / {runs[0]['publish_delay_seconds']['p99_le_ms']} | "
              f"{runs[0]['consume_seconds']['p50_le_ms']} / {runs[0]['consume_seconds']['p99_le_ms']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
