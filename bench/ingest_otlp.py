"""OTLP/HTTP metrics ingest throughput, against remote write of the very same samples.

No OTLP receiver exists among this machine's peers (Debian's Prometheus 2.42 predates it, its
VictoriaMetrics 1.79 too), so the comparison is with the same samples and series sent as remote
write 1.0: to TurboProm (its own remote-write path) and to Prometheus 2.42's remote-write receiver.
The OTLP bodies look like a vLLM fleet's OpenTelemetry export: one resource per engine pod
(service.name, service.instance.id, k8s.* attributes), 3 cumulative counters, 3 gauges and 3
explicit-bucket histograms (14 bounds) with model_name/engine attributes; each engine gives 58
samples (target_info included). The remote-write bodies hold exactly the series and samples
TurboProm's translator makes of the OTLP bodies (built ahead, untimed).

Each target runs on a fresh data dir, one at a time; a warm-up round creates the series (untimed);
then --rounds rounds, timestamps 15 s apart, are sent by --senders concurrent senders. Only 2xx
answers count; 429/5xx are retried (50 ms back-off). Reports acked samples/s (wall) and per server
CPU-second, p50/p99 latency, peak RSS; medians over --repeats runs, and the ratios.

    .venv/bin/python bench/ingest_otlp.py [--engines 3500] [--per-request 35] [--rounds 4] [--repeats 3]
"""
from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ingest.otlp_translate import OtlpTranslator  # noqa: E402
from ingest.proto.messages import WriteRequest  # noqa: E402
from ingest.snappy_block import compress  # noqa: E402
from tests.helpers import load_bench  # noqa: E402

rw = load_bench("ingest_remote_write")  # Peer, proc_cpu_s, proc_peak_rss_mb

COUNTERS = ("vllm.prompt_tokens", "vllm.generation_tokens", "vllm.num_preemptions")
GAUGES = ("vllm.num_requests.running", "vllm.num_requests.waiting", "vllm.kv_cache_usage")
HISTOGRAMS = ("vllm.time_to_first_token", "vllm.inter_token_latency", "vllm.e2e_request_latency")
BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5)
MODELS = ("meta-llama/Llama-3.1-70B-Instruct", "Qwen/Qwen2.5-32B-Instruct", "mistralai/Mixtral-8x7B")


def _attr(target, key: str, value: str) -> None:
    target.add(key=key).value.string_value = value


def otlp_request(engines: range, t_ms: int, r: int) -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    t_ns = t_ms * 1_000_000
    for e in engines:
        rm = req.resource_metrics.add()
        for k, v in (("service.name", "vllm"), ("service.namespace", "llm-serving"), ("service.instance.id", f"vllm-{e:06d}"),
                     ("k8s.pod.name", f"vllm-{e % 97:02x}{e:06d}-{e % 5}"), ("k8s.node.name", f"gpu-node-{e // 8:04d}"),
                     ("cloud.region", ("us-east", "us-west", "eu-central")[e % 3])):
            _attr(rm.resource.attributes, k, v)
        sm = rm.scope_metrics.add()
        sm.scope.name = "vllm"
        model = MODELS[e % 3]
        for i, name in enumerate(COUNTERS):
            m = sm.metrics.add(name=name, unit="{token}" if "tokens" in name else "")
            m.sum.is_monotonic = True
            m.sum.aggregation_temporality = pb.AGGREGATION_TEMPORALITY_CUMULATIVE
            p = m.sum.data_points.add(time_unix_nano=t_ns, start_time_unix_nano=t_ns - r * 15_000_000_000 - 1, as_int=(e + i) * 100 + r * 7)
            _attr(p.attributes, "model_name", model)
            _attr(p.attributes, "engine", "0")
        for i, name in enumerate(GAUGES):
            m = sm.metrics.add(name=name, unit="1" if "usage" in name else "")
            p = m.gauge.data_points.add(time_unix_nano=t_ns, as_double=float((e * 31 + i + r) % 1000) + 0.25)
            _attr(p.attributes, "model_name", model)
            _attr(p.attributes, "engine", "0")
        for i, name in enumerate(HISTOGRAMS):
            m = sm.metrics.add(name=name, unit="s")
            m.histogram.aggregation_temporality = pb.AGGREGATION_TEMPORALITY_CUMULATIVE
            counts = [(e + i + j + r) % 5 + r for j in range(len(BOUNDS) + 1)]
            p = m.histogram.data_points.add(time_unix_nano=t_ns, count=sum(counts), sum=sum(counts) * 0.3, explicit_bounds=BOUNDS,
                                            bucket_counts=counts)
            _attr(p.attributes, "model_name", model)
            _attr(p.attributes, "engine", "0")
    return req


def build(engines: int, per_request: int, rounds: int, t0: int) -> tuple[list[bytes], list[bytes], list[int]]:
    """(OTLP bodies, remote-write bodies of the same samples, samples per body), in send order."""
    tr = OtlpTranslator(future_tolerance_ms=0)
    otlp, rws, counts = [], [], []
    for r in range(rounds):
        for start in range(0, engines, per_request):
            req = otlp_request(range(start, min(start + per_request, engines)), t0 + r * 15_000, r)
            otlp.append(req.SerializeToString())
            b = tr.translate(req).batch
            w = WriteRequest()
            series = [w.timeseries.add() for _ in b.series]
            for ts, lbl in zip(series, b.series):
                for n, v in lbl:
                    ts.labels.add(name=n, value=v)
            for s, t, v in zip(b.series_index.tolist(), b.timestamps.tolist(), b.values.tolist()):
                series[s].samples.add(value=v, timestamp=t)
            rws.append(compress(w.SerializeToString()))
            counts.append(len(b))
    return otlp, rws, counts


OTLP_HEADERS = {"Content-Type": "application/x-protobuf"}


def run_one(target: str, bodies: list[bytes], counts: list[int], n_warm: int, senders: int) -> dict:
    server, protocol = target.rsplit("-", 1)
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-otlp-{target}-"))
    peer = rw.Peer(server, tmp)
    try:
        peer.start()
        url = peer.url.replace("/api/v1/write", "/api/v1/otlp/v1/metrics") if protocol == "otlp" else peer.url
        headers = OTLP_HEADERS if protocol == "otlp" else rw.RW_HEADERS
        w = asyncio.run(rw.send_all(url, bodies[:n_warm], counts[:n_warm], senders, headers))
        if w["failed"]:
            raise RuntimeError(f"{target}: warm-up refused: {w['first_failure']}")
        cpu0 = rw.proc_cpu_s(peer.proc.pid)
        r = asyncio.run(rw.send_all(url, bodies[n_warm:], counts[n_warm:], senders, headers))
        cpu = rw.proc_cpu_s(peer.proc.pid) - cpu0
        return rw.result_row(r, cpu, peer.proc.pid, sum(counts[n_warm:]))
    finally:
        peer.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", type=int, default=3500)
    ap.add_argument("--per-request", type=int, default=35)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--targets", default="turboprom-otlp,turboprom-rw,prometheus-rw")
    a = ap.parse_args()
    t0 = int(time.time() * 1000) - 3_600_000
    tb = time.time()
    otlp, rws, counts = build(a.engines, a.per_request, a.rounds + 1, t0)
    n_warm = -(-a.engines // a.per_request)
    print(f"# {a.engines} engines, {a.per_request} per request ({counts[0]} samples), {len(counts) - n_warm} timed requests, "
          f"{sum(counts[n_warm:])} samples, {a.senders} senders; OTLP body {len(otlp[0])} B, remote-write body {len(rws[0])} B "
          f"(built in {time.time() - tb:.0f}s)", flush=True)
    results: dict[str, list[dict]] = {}
    for rep in range(a.repeats):
        for target in a.targets.split(","):
            r = run_one(target, otlp if target.endswith("-otlp") else rws, counts, n_warm, a.senders)
            results.setdefault(target, []).append(r)
            print(f"  run {rep + 1} {target:15s} {r['samples_s']:>10,.0f} samples/s {r['samples_cpu_s']:>10,.0f} /cpu-s "
                  f"p99 {r['p99_ms']:7.1f} ms RSS {r['rss_mb']:5.0f} MB acked {r['acked_share']:.1%} retries {r['retries']} "
                  f"failed {r['failed']} {r['first_failure']}", flush=True)
    med = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0] if k != "first_failure"} for n, rs in results.items()}
    print("| target | acked samples/s | per server CPU-s | p50 ms | p99 ms | peak RSS MB | acked | retries | failed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, m in med.items():
        print(f"| {n} | {m['samples_s']:,.0f} | {m['samples_cpu_s']:,.0f} | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} | {m['rss_mb']:.0f} "
              f"| {m['acked_share']:.1%} | {m['retries']:.0f} | {m['failed']:.0f} |")
    if "turboprom-otlp" in med:
        for n, m in med.items():
            if n != "turboprom-otlp":
                print(f"ratio turboprom-otlp/{n}: wall {med['turboprom-otlp']['samples_s'] / m['samples_s']:.2f}, "
                      f"per CPU-s {med['turboprom-otlp']['samples_cpu_s'] / m['samples_cpu_s']:.2f}")


if __name__ == "__main__":
    main()
