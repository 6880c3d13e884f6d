"""One target's scrape processing in process (parse + series labels + staleness -> batch), with the
compiled text walk (ingest/text_native.py) and with parse_text alone, on the real node exporter's
/metrics and a vLLM-engine-shaped body (tests/test_ingest_text_native.vllm_body). Series known
(warm: every scrape after the first), medians.

    .venv/bin/python bench/ingest_scrape_parse.py [--repeats 200]
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

from ingest.scrape.process import SeriesState, process_scrape  # noqa: E402
from storage.labels import make_labels  # noqa: E402
from tests.helpers import free_port, wait_http  # noqa: E402
from tests.test_ingest_text_native import vllm_body  # noqa: E402


def node_body() -> bytes:
    port = free_port()
    proc = subprocess.Popen(["/usr/bin/prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics", 30, proc)
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read()
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=200)
    a = ap.parse_args()
    target = make_labels({"job": "bench", "instance": "10.0.0.1:9100"})
    print("| body | samples | walk ms/scrape | parse_text ms/scrape | walk samples per CPU-s | speed-up |")
    print("|---|---|---|---|---|---|")
    for name, body in (("node exporter /metrics", node_body()), ("vLLM engine (1 model)", vllm_body(1, 5))):
        res = {}
        for label, state in (("walk", SeriesState()), ("plain", SeriesState(text=None))):
            n = process_scrape(body, "text/plain", 1000, target, state, honor_labels=False, honor_timestamps=True, mrc=[]).scraped
            times = []
            for i in range(a.repeats):
                t = time.process_time()
                process_scrape(body, "text/plain", 2000 + i, target, state, honor_labels=False, honor_timestamps=True, mrc=[])
                times.append(time.process_time() - t)
            res[label] = statistics.median(times)
        print(f"| {name} | {n} | {res['walk'] * 1000:.3f} | {res['plain'] * 1000:.3f} | {n / max(res['walk'], 1e-9):,.0f} "
              f"| {res['plain'] / max(res['walk'], 1e-9):.1f}x |")


if __name__ == "__main__":
    main()
