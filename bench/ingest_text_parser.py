"""Text exposition parsing: ours (ingest/text_format.py, Arrow/RE2 column-wise) vs
prometheus_client.parser.text_string_to_metric_families (per-sample Python objects).

    .venv/bin/python bench/ingest_text_parser.py [--series 1000] [--repeats 7]

Input: a scrape-shaped body (N series over 50 families, HELP/TYPE lines, labels), plus the
node exporter's real /metrics when prometheus-node-exporter is installed.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from ingest.text_format import parse_series_key, parse_text  # noqa: E402
from tests.helpers import free_port, wait_http  # noqa: E402


def synthetic(n: int) -> str:
    out = []
    per = max(1, n // 50)
    for f in range(50):
        out.append(f"# HELP vllm_metric_{f} Some help text.\n# TYPE vllm_metric_{f} gauge\n")
        for i in range(per):
            out.append(f'vllm_metric_{f}{{model_name="llama-3-70b",engine="{i % 4}",pod="worker-{i}",le="{i * 0.5}"}} {i * 1.25}\n')
    return "".join(out)


def median_time(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def node_exporter_body() -> str | None:
    port = free_port()
    try:
        p = subprocess.Popen(["/usr/bin/prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{port}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except FileNotFoundError:
        return None
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics", 30, p)
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    finally:
        p.terminate()
        p.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--series", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    bodies = {f"synthetic {a.series} series": synthetic(a.series), f"synthetic {a.series * 10} series": synthetic(a.series * 10)}
    ne = node_exporter_body()
    if ne:
        bodies["node exporter /metrics"] = ne
    print("| body | samples | ours ms (warm series cache) | ours ms (cold: + label parsing) | prometheus_client.parser ms | speed-up warm / cold |")
    print("|---|---|---|---|---|---|")
    for name, body in bodies.items():
        raw = body.encode()
        n = len(parse_text(raw))
        ours = median_time(lambda: parse_text(raw), a.repeats)
        cold = median_time(lambda: [parse_series_key(k) for k in parse_text(raw).keys], a.repeats)
        ref = median_time(lambda: [s for fam in text_string_to_metric_families(body) for s in fam.samples], a.repeats)
        print(f"| {name} | {n} | {ours * 1000:.2f} | {cold * 1000:.2f} | {ref * 1000:.2f} | {ref / ours:.1f}x / {ref / cold:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
