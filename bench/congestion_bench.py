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

The fast signal paths, measured in the same phases against a live engine fleet (--engines HTTP
exporters in one process, prometheus-client like vLLM's /metrics with a vLLM-sized body; each
engine sets vllm:num_requests_waiting to the wall-clock ms of the change, 10 times a second):
  fast-scrape freshness   engine change -> visible in GET /api/v1/congestion?cluster=fleet (polled
                          100/s on the main port and on the poll process), the server fast-scraping the
                          fleet every --fast-interval and storing it every 15 s
  events freshness        a vLLM-format ZMQ PUB sends BlockStored 10x/s; time until
                          POST /api/v1/congestion/prefix shows the block (polled every 1 ms), on the
                          main port and on the poll process (which subscribes to the events itself)
  direct picker (peer)    what llm-d's endpoint picker does: GET every engine's /metrics every 50 ms;
                          engine change -> seen by the picker; run in the "direct picker" phases
  engine load             requests/s each engine serves, by client (TurboProm's fast scrape and
                          normal scrape vs one direct picker), and bytes per request
  poll, own process       the same 200 polls/s against congestion.poll_listen (the snapshot served by a
                          child process fed each new snapshot over ZMQ), beside the in-server poll

    .venv/bin/python bench/congestion_bench.py [--phase-s 15] [--rate 100000] [--wal-fsync always]
                                               [--engines 32] [--fast-interval 0.05] [--no-poll-process]
    .venv/bin/python bench/congestion_bench.py --consume-micro   # tracker cost per batch, in-process
    .venv/bin/python bench/congestion_bench.py --poll-cpu        # server-side CPU per poll, idle server
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


def free_ports_outside_ephemeral(n: int) -> list[int]:
    """``n`` distinct free loopback ports below the kernel's ephemeral range.

    The server's SUB sockets connect to every configured KV-event endpoint from startup and retry
    every 100 ms while nothing listens there (between the phases that bind it). A retry's source
    port comes from the ephemeral range; if the endpoint's port lies in that range too, a retry
    eventually picks it as its own source port and connects to itself (TCP simultaneous open), and
    the next probe's bind fails with "Address already in use". Ports below the range never collide."""
    import random
    import socket

    try:
        lo = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        lo = 32768
    lo = max(lo, 2048)
    out: list[int] = []
    for p in random.Random().sample(range(1024, lo), min(lo - 1024, 20 * n + 200)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                continue
        out.append(p)
        if len(out) == n:
            return out
    raise RuntimeError(f"fewer than {n} free ports below {lo}")


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


# ----------------------------------------------------------------------------- engine fleet
def fleet_registry(engine: int) -> Any:
    """A vLLM-shaped registry: the tracker's gauges and counters plus latency histograms (body size)."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    reg = CollectorRegistry()
    lb = ["model_name", "engine"]
    Gauge("vllm:num_requests_waiting", "waiting", lb, registry=reg).labels("m", "0").set(time.time() * 1000)
    Gauge("vllm:num_requests_running", "running", lb, registry=reg).labels("m", "0").set(4)
    Gauge("vllm:kv_cache_usage_perc", "kv", lb, registry=reg).labels("m", "0").set(0.4)
    Counter("vllm:prompt_tokens", "prompt", lb, registry=reg).labels("m", "0").inc(1000)
    Counter("vllm:generation_tokens", "gen", lb, registry=reg).labels("m", "0").inc(1000)
    Counter("vllm:request_success", "done", lb + ["finished_reason"], registry=reg).labels("m", "0", "stop").inc(3)
    for name in ("vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds",
                 "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                 "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds"):
        h = Histogram(name, name, lb, registry=reg, buckets=[0.001 * 2 ** k for k in range(20)])
        for v in (0.01, 0.1, 1.0):
            h.labels("m", "0").observe(v)
    return reg


def fleet(n: int, q: mp.Queue, ctl: Any) -> None:
    """``n`` engines on loopback ports; counts requests and bytes per engine and client (User-Agent).
    Answers "counts" on the control pipe; stops on "stop"."""

    from aiohttp import web
    from prometheus_client import generate_latest

    regs = [fleet_registry(i) for i in range(n)]
    counts: dict[str, list[float]] = {}  # client -> [requests, bytes]
    version = [0] * n
    rendered: dict[tuple, bytes] = {}

    async def run() -> None:
        runners = []
        ports = []
        for i, reg in enumerate(regs):
            async def handle(request: web.Request, reg: Any = reg, i: int = i) -> web.Response:
                # Rendered once per value change and name set (prometheus-client renders on every
                # request; caching keeps this one process from being the bench's bottleneck).
                names = tuple(request.query.getall("name[]", []))
                key = (i, names, version[i])
                body = rendered.get(key)
                if body is None:
                    body = rendered[key] = generate_latest(reg.restricted_registry(names) if names else reg)
                ua = request.headers.get("User-Agent", "?").split("/")[0]
                c = counts.setdefault(ua, [0, 0])
                c[0] += 1
                c[1] += len(body)
                return web.Response(body=body, content_type="text/plain")
            app = web.Application()
            app.router.add_get("/metrics", handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
            runners.append(runner)

        async def tick(i: int) -> None:
            g = regs[i]._names_to_collectors["vllm:num_requests_waiting"]
            await asyncio.sleep(0.1 * i / n)
            while True:
                g.labels("m", "0").set(float(int(time.time() * 1000)))
                version[i] += 1
                for key in [k for k in rendered if k[0] == i]:
                    del rendered[key]
                await asyncio.sleep(0.1)

        tasks = [asyncio.create_task(tick(i)) for i in range(n)]
        q.put(("fleet_ports", ports))
        loop = asyncio.get_running_loop()
        while True:
            msg = await loop.run_in_executor(None, ctl.recv)
            if msg == "counts":
                ctl.send({k: list(v) for k, v in counts.items()})
            else:
                break
        for t in tasks:
            t.cancel()
        for r in runners:
            await r.cleanup()

    asyncio.run(run())


def first_seen(values: dict[str, float], seen_at: float, out: list[float], last: dict[str, float]) -> None:
    """Freshness of ms-stamped values: each value's first sighting minus its stamp."""
    for key, v in values.items():
        if v is not None and v > last.get(key, 0.0):
            last[key] = v
            out.append(seen_at - v / 1000.0)


def fleet_observer(host: str, port: int, name: str, start: Any, duration: float, q: mp.Queue) -> None:
    """Polls the fleet's entries 100/s on ``port``; engine change -> visible in the API."""
    start_at = wait_start(start)
    conn = http.client.HTTPConnection(host, port, timeout=10)
    fresh: list[float] = []
    last: dict[str, float] = {}
    time.sleep(max(0.0, start_at - time.time()))
    while time.time() < start_at + duration:
        conn.request("GET", "/api/v1/congestion?cluster=fleet")
        r = conn.getresponse()
        body = json.loads(r.read())
        now = time.time()
        first_seen({d["instance"]: d["queue_length"] for d in body["data"]["instances"]}, now, fresh, last)
        time.sleep(0.01)
    q.put((f"fast_scrape_freshness{name}", {**summary_ms(fresh[len(last):]), "instances": len(last)}))


def direct_picker(ports: list[int], start: Any, duration: float, q: mp.Queue) -> None:
    """An endpoint picker scraping every engine's /metrics every 50 ms (llm-d's default)."""
    import re

    import aiohttp

    pat = re.compile(rb'^vllm:num_requests_waiting\{[^}]*\} ([0-9.e+]+)$', re.M)
    start_at = wait_start(start)

    async def run() -> dict[str, Any]:
        fresh: list[float] = []
        last: dict[str, float] = {}
        await asyncio.sleep(max(0.0, start_at - time.time()))
        async with aiohttp.ClientSession(headers={"User-Agent": "direct-picker/1"}) as s:
            async def one(p: int) -> None:
                async with s.get(f"http://127.0.0.1:{p}/metrics") as r:
                    body = await r.read()
                m = pat.search(body)
                if m:
                    first_seen({str(p): float(m.group(1))}, time.time(), fresh, last)

            nxt = time.time()
            rounds = 0
            while time.time() < start_at + duration:
                await asyncio.gather(*(one(p) for p in ports))
                rounds += 1
                nxt += 0.05
                await asyncio.sleep(max(0.0, nxt - time.time()))
        return {**summary_ms(fresh[len(last):]), "rounds_per_s": round(rounds / duration, 1)}

    q.put(("direct_picker_freshness", asyncio.run(run())))


def kv_instance(kv_port: int) -> str:
    """The instance name the server is configured with for the publisher on ``kv_port``."""
    return f"kv-{kv_port}"


def events_probe(host: str, port: int, name: str, kv_port: int, start: Any, duration: float, q: mp.Queue) -> None:
    """vLLM-format KV events (ZMQ PUB on ``kv_port``, [topic, seq, msgpack batch]) -> visible in
    the prefix view on ``port`` (polled every 1 ms). Each probe has its own port and instance (one
    per phase and API port), so a phase never sees an earlier phase's blocks or publisher."""
    import msgpack
    import zmq

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    conn = http.client.HTTPConnection(host, port, timeout=10)
    path = "/api/v1/congestion/prefix?" + urllib.parse.urlencode({"instance": kv_instance(kv_port)})
    seq = 0

    def send(tokens: list[int]) -> None:
        nonlocal seq
        pub.send_multipart([b"kv", seq.to_bytes(8, "big"),
                            msgpack.packb([time.time(), [["BlockStored", [seq + 1], None, tokens, 4, None, "GPU"]]])])
        seq += 1

    def held(tokens: list[int]) -> bool:
        conn.request("POST", path, body=json.dumps({"token_ids": tokens}), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        rows = json.loads(r.read())["data"]["instances"]
        return any(d["matched_blocks"] > 0 for d in rows)

    lat: list[float] = []
    lost = 0
    warm = False
    error: str | None = None
    try:
        pub.bind(f"tcp://127.0.0.1:{kv_port}")
        for k in range(200):  # the subscriber joins late (ZMQ slow joiner): warm up until one is seen
            send([7, 7, 7, k])
            time.sleep(0.02)
            if held([7, 7, 7, k]):
                warm = True
                break
        start_at = wait_start(start)
        time.sleep(max(0.0, start_at - time.time()))
        k = 0
        while time.time() < start_at + duration - 1.0:
            k += 1
            tokens = [1_000_000 + k, 3, 3, 3]
            t = time.perf_counter()
            send(tokens)
            while not held(tokens):
                if time.perf_counter() - t > 1.0:
                    lost += 1
                    break
                time.sleep(0.001)
            else:
                lat.append(time.perf_counter() - t)
            time.sleep(0.1)
    except Exception as e:  # reported, so the phase ends on time instead of waiting for this probe
        error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
        pub.close(0)
        ctx.term()
    q.put((f"events_freshness{name}", {**summary_ms(lat), "lost": lost, "subscriber_joined": warm, "error": error}))


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
              peer: bool = False, picker: bool = False, fleet_ctl: Any = None, fleet_ports: list[int] = (),
              kv_ports: tuple[int, int] | None = None) -> dict[str, Any]:
    """One phase; ``peer`` replaces the congestion pollers by the PromQL poller (same 200/s target);
    ``picker`` runs a direct 50 ms picker against the engine fleet beside the rest; ``kv_ports``: this
    phase's own KV-event publisher ports (main port's probe, poll process's probe)."""
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
        if args.poll_port:
            procs.append(ctx.Process(target=poller, args=(u.hostname, args.poll_port, "/api/v1/congestion", 200.0,
                                                          start_at, d, "poll_all_process", q)))
        # the fast paths read on the main port and, with poll_listen, on the poll process ("_process"),
        # each by its own probe (and for events its own publisher), so neither waits on the other
        kvs = kv_ports or (0, 0)
        api_ports = [("", u.port, kvs[0])] + ([("_process", args.poll_port, kvs[1])] if args.poll_port else [])
        for name, port, kvp in api_ports:
            if fleet_ports:
                procs.append(ctx.Process(target=fleet_observer, args=(u.hostname, port, name, start_at, d, q)))
            if kvp:
                procs.append(ctx.Process(target=events_probe, args=(u.hostname, port, name, kvp, start_at, d, q)))
    if picker:
        procs.append(ctx.Process(target=direct_picker, args=(list(fleet_ports), start_at, d, q)))
    if ingest:
        procs.append(ctx.Process(target=sender, args=(server_url, args.rate, start_at, d, q)))
    if heavy:
        procs.append(ctx.Process(target=heavy_queries, args=(u.hostname, u.port, start_at, d, q)))
    hists = ("turboprom_congestion_publish_delay_seconds", "turboprom_congestion_consume_seconds",
             "turboprom_congestion_snapshot_build_seconds")
    before = {h: server_hist(server_url, h) for h in hists}
    if fleet_ctl is not None:
        fleet_ctl.send("counts")
        fleet_before = fleet_ctl.recv()
        fleet_t0 = time.time()
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
    if fleet_ctl is not None:
        fleet_ctl.send("counts")
        after = fleet_ctl.recv()
        n_eng = max(args.engines, 1)
        span = time.time() - fleet_t0
        # The server's scrapes run all along (span: setup and payload building included); the direct
        # picker only in the phase's own d seconds, so its rate is over those.
        out["engine_load"] = {
            client: {"requests_per_s_per_engine": round((c[0] - fleet_before.get(client, [0, 0])[0])
                                                        / (d if client == "direct-picker" else span) / n_eng, 2),
                     "bytes_per_request": round((c[1] - fleet_before.get(client, [0, 0])[1])
                                                / max(c[0] - fleet_before.get(client, [0, 0])[0], 1))}
            for client, c in after.items()}
    for h in hists:
        out[h.removeprefix("turboprom_congestion_")] = hist_quantiles(before[h], server_hist(server_url, h))
    print(f"[{name}] " + json.dumps(out), flush=True)
    return out


def consume_micro(batches: int = 300, repeats: int = 5) -> None:
    """The tracker's per-batch cost in-process, 2000-series scrape-shaped batches (1600 congestion
    series + 400 others, 7-8 labels each): label-set lookup per batch vs storage series ids."""
    import numpy as np

    from scheduler_metrics.congestion import CongestionConfig, CongestionTracker
    from storage.batch import SampleBatch
    from storage.labels import make_labels

    ls = [make_labels(dict(lb)) for lb in label_sets()]
    sids = np.arange(len(ls), dtype=np.int64)
    out: dict[str, list[float]] = {"label sets": [], "series ids": []}
    for _ in range(repeats):
        for name, ids in (("label sets", None), ("series ids", sids)):
            tr = CongestionTracker(CongestionConfig(resolution_s=0))
            t0 = time.time() * 1000
            lat = []
            for k in range(batches):
                b = SampleBatch(ls, np.arange(len(ls)), np.full(len(ls), int(t0 + k * 100)),
                                np.full(len(ls), float(k)), series_ids=ids)
                t = time.perf_counter()
                tr.consume(b)
                lat.append(time.perf_counter() - t)
            out[name].append(statistics.median(lat[10:]) * 1000)
    for name, xs in out.items():
        print(f"consume per 2000-series batch, {name}: median {statistics.median(xs):.3f} ms "
              f"(runs: {', '.join(f'{x:.3f}' for x in xs)})")
    print(f"ratio label sets / series ids: {statistics.median(out['label sets']) / statistics.median(out['series ids']):.2f}x")


def poll_cpu(polls: int = 3000) -> None:
    """Server-side CPU per unfiltered poll (200 instances), on the main port and on the poll process,
    from /proc CPU times around ``polls`` sequential keep-alive polls on an otherwise idle server:
    what a poll costs, as opposed to how long it waits for a core under load."""
    import os
    import subprocess

    from tests.helpers import ServerProcess, free_port

    def cpu_s(pid: int) -> float:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    with tempfile.TemporaryDirectory(prefix="congestion-poll-cpu-") as tmp:
        poll_port = free_port()
        cfg = Path(tmp) / "turboprom.yml"
        cfg.write_text(f"congestion:\n  poll_listen: '127.0.0.1:{poll_port}'\n")
        with ServerProcess(Path(tmp) / "data", ["--config", str(cfg)]) as srv:
            body = "".join(f'vllm:num_requests_waiting{{cluster="c",model_name="m",instance="i{i:03d}"}} {i}\n'
                           for i in range(200))
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
            c.request("POST", "/api/v1/import/prometheus", body=body)
            c.getresponse().read()
            time.sleep(1.5)
            kids = [int(p) for p in subprocess.run(["pgrep", "-P", str(srv.proc.pid)], capture_output=True,
                                                   text=True).stdout.split()]
            for port, name, pids in ((srv.port, "main port", [srv.proc.pid]), (poll_port, "poll process", kids)):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("GET", "/api/v1/congestion")
                size = len(conn.getresponse().read())
                c0 = sum(cpu_s(p) for p in pids)
                lat = []
                for _ in range(polls):
                    t = time.perf_counter()
                    conn.request("GET", "/api/v1/congestion")
                    conn.getresponse().read()
                    lat.append(time.perf_counter() - t)
                used = sum(cpu_s(p) for p in pids) - c0
                print(f"{name}: body {size} B, server CPU {used / polls * 1000:.3f} ms per poll, "
                      f"client p50 {pct(lat, 50) * 1000:.3f} / p99 {pct(lat, 99) * 1000:.3f} ms ({polls} polls)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase-s", type=float, default=15.0)
    ap.add_argument("--rate", type=int, default=100_000)
    ap.add_argument("--wal-fsync", default="always", choices=["always", "batch", "never"])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--engines", type=int, default=32, help="live engine exporters (0 = no fleet)")
    ap.add_argument("--fast-interval", type=float, default=0.05, help="server's fast scrape interval, s")
    ap.add_argument("--no-poll-process", action="store_true",
                    help="do not also poll the poll endpoint's own process (congestion.poll_listen)")
    ap.add_argument("--phases", default="", help="comma-separated subset of the phases, in this order (default all)")
    ap.add_argument("--json", default=None, help="write all results here")
    ap.add_argument("--consume-micro", action="store_true", help="only the in-process tracker consume comparison")
    ap.add_argument("--poll-cpu", action="store_true", help="only the server-side CPU per poll, idle server")
    args = ap.parse_args()
    if args.consume_micro:
        consume_micro()
        return
    if args.poll_cpu:
        poll_cpu()
        return

    from tests.helpers import ServerProcess, free_port

    ctx = mp.get_context("spawn")
    fleet_ctl = None
    ports: list[int] = []
    fleet_proc = None
    if args.engines:
        fq: mp.Queue = ctx.Queue()
        fleet_ctl, child = ctx.Pipe()
        fleet_proc = ctx.Process(target=fleet, args=(args.engines, fq, child))
        fleet_proc.start()
        k, ports = fq.get(timeout=120)
    args.poll_port = 0 if args.no_poll_process else free_port()
    phases = {"idle": dict(ingest=False, heavy=False), "ingest": dict(ingest=True, heavy=False),
              "ingest+query": dict(ingest=True, heavy=True), "peer idle": dict(ingest=False, heavy=False, peer=True),
              "peer ingest": dict(ingest=True, heavy=False, peer=True)}
    if args.engines:
        phases["direct picker, ingest"] = dict(ingest=True, heavy=False, peer=True, picker=True)
    if args.phases:
        wanted = [p.strip() for p in args.phases.split(",")]
        unknown = [p for p in wanted if p not in phases]
        if unknown:
            ap.error(f"unknown phase(s) {unknown}; known: {list(phases)}")
        phases = {p: phases[p] for p in wanted}
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in phases}
    # Every phase with the fast paths gets its own pair of KV-event publisher ports (the main port's
    # probe, the poll process's probe), all configured at startup; none is ever bound twice.
    fast_runs = [(r, name) for r in range(args.repeats) for name, kw in phases.items() if not kw.get("peer")]
    kv_list = free_ports_outside_ephemeral(2 * len(fast_runs)) if args.engines and fast_runs else []
    kv_of = {run: (kv_list[2 * i], kv_list[2 * i + 1]) for i, run in enumerate(fast_runs)} if kv_list else {}
    try:
        with tempfile.TemporaryDirectory(prefix="congestion-bench-") as tmp:
            cfg = Path(tmp) / "turboprom.yml"
            text = "congestion:\n  resolution: 1s\n"
            if args.poll_port:
                text += f"  poll_listen: '127.0.0.1:{args.poll_port}'\n"
            if args.engines:
                targets = ", ".join(f'"127.0.0.1:{p}"' for p in ports)
                text = (f"scrape_configs:\n  - job_name: fleet\n    scrape_interval: 15s\n    static_configs:\n"
                        f"      - targets: [{targets}]\n        labels: {{cluster: fleet}}\n"
                        f"{text}  fast_scrape_interval: {args.fast_interval}\n  fast_scrape_jobs: [fleet]\n"
                        f"  kv_events:\n" + "".join(
                            f"    - {{endpoint: 'tcp://127.0.0.1:{p}', instance: {kv_instance(p)}, cluster: kv, "
                            f"model_name: m, topic: kv}}\n" for p in kv_list))
            cfg.write_text(text)
            with ServerProcess(Path(tmp) / "data", ["--config", str(cfg), "--wal-fsync", args.wal_fsync]) as server:
                for rep in range(args.repeats):
                    for name, kw in phases.items():
                        fast = args.engines and not kw.get("peer")
                        results[name].append(run_phase(name, server.url, args, **kw, fleet_ctl=fleet_ctl,
                                                       fleet_ports=ports if (fast or kw.get("picker")) else [],
                                                       kv_ports=kv_of.get((rep, name)) if fast else None))
                with urllib.request.urlopen(server.url + "/api/v1/congestion") as r:
                    n_inst = len(json.loads(r.read())["data"]["instances"])
    finally:
        if fleet_ctl is not None:
            fleet_ctl.send("stop")
            fleet_proc.join(30)
    print(f"\ninstances tracked at the end: {n_inst}")

    def med(runs: list[dict[str, Any]], key: str, field: str) -> float:
        vals = [r[key][field] for r in runs if key in r and r[key].get(field) is not None]
        return round(statistics.median(vals), 2) if vals else float("nan")

    print("\n| phase | poll p50 / p99 ms (achieved polls/s) | same poll, own process, p50 / p99 ms | one-instance poll p50 / p99 ms | freshness p50 / p99 ms | "
          "ingest samples/s (target) | heavy range query p50 ms | tracker publish delay p50 / p99 (bucket le, ms) | "
          "consume per batch p50 / p99 (le, ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for phase, runs in results.items():
        pk = "peer_promql_poll" if phase.startswith(("peer", "direct")) else "poll_all"
        print(f"| {phase} | {med(runs, pk, 'p50_ms')} / {med(runs, pk, 'p99_ms')} ({med(runs, pk, 'achieved_per_s')}) | "
              f"{med(runs, 'poll_all_process', 'p50_ms')} / {med(runs, 'poll_all_process', 'p99_ms')} | "
              f"{med(runs, 'poll_one', 'p50_ms')} / {med(runs, 'poll_one', 'p99_ms')} | {med(runs, 'freshness', 'p50_ms')} / "
              f"{med(runs, 'freshness', 'p99_ms')} | {med(runs, 'ingest', 'samples_per_s')} ({args.rate}) | "
              f"{med(runs, 'heavy_query', 'p50_ms')} | "
              f"{runs[0]['publish_delay_seconds']['p50_le_ms']} / {runs[0]['publish_delay_seconds']['p99_le_ms']} | "
              f"{runs[0]['consume_seconds']['p50_le_ms']} / {runs[0]['consume_seconds']['p99_le_ms']} |")
    if args.engines:
        print(f"\nFast paths ({args.engines} engines, fast scrape every {args.fast_interval * 1000:g} ms):")
        print("\n| phase | via fast scrape p50 / p99 / max ms: main port / poll process | via KV events p50 / p99 ms: "
              "main port / poll process | direct 50 ms picker p50 / p99 ms | "
              "engine requests/s per engine: fast scrape / normal scrape / one direct picker | bytes per request: "
              "fast scrape / direct picker |")
        print("| --- | --- | --- | --- | --- | --- |")
        for phase, runs in results.items():
            def load(client: str, field: str) -> Any:
                vals = [r["engine_load"].get(client, {}).get(field) for r in runs if "engine_load" in r]
                vals = [v for v in vals if v is not None]
                return round(statistics.median(vals), 2) if vals else "-"

            def trio(key: str) -> str:
                return " / ".join(str(med(runs, key, f)) for f in ("p50_ms", "p99_ms", "max_ms"))

            def duo(key: str) -> str:
                return " / ".join(str(med(runs, key, f)) for f in ("p50_ms", "p99_ms"))
            print(f"| {phase} | {trio('fast_scrape_freshness')}; {trio('fast_scrape_freshness_process')} | "
                  f"{duo('events_freshness')}; {duo('events_freshness_process')} | {duo('direct_picker_freshness')} | "
                  f"{load('TurboProm-fast-scrape', 'requests_per_s_per_engine')}"
                  f" / {load('TurboProm-scraper', 'requests_per_s_per_engine')} / {load('direct-picker', 'requests_per_s_per_engine')}"
                  f" | {load('TurboProm-fast-scrape', 'bytes_per_request')} / {load('direct-picker', 'bytes_per_request')} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
