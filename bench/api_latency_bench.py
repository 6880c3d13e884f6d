"""Latency of dashboard-sized API calls, TurboProm vs Prometheus 2.42 on the same data.

Both servers hold the API test data set (tests/test_api_helpers.api_test_text: 9 series, 30 min
at 15 s). Each call is repeated and the median wall time per call (HTTP on loopback included)
is reported with the TurboProm/Prometheus ratio. Small answers: this measures per-request
overhead (parameter parsing, executor hop, evaluation setup, encoding), not throughput.

    .venv/bin/python bench/api_latency_bench.py [--repeat 30]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.test_api_helpers import T0_MS, PeerPair, http  # noqa: E402

T = str((T0_MS + 900_500) / 1000)
START = str((T0_MS + 60_250) / 1000)
END = str((T0_MS + 1_500_250) / 1000)

CALLS = [
    ("GET", "/api/v1/query", {"query": "1+1", "time": "4"}),
    ("GET", "/api/v1/query", {"query": "sum by (job) (rate(http_requests_total[5m]))", "time": T, "exact": "true"}),
    ("POST", "/api/v1/query_range", {"query": "sum by (job) (rate(http_requests_total[5m]))", "start": START, "end": END, "step": "15", "exact": "true"}),
    ("POST", "/api/v1/query_range", {"query": "temperature_celsius", "start": START, "end": END, "step": "15"}),
    ("GET", "/api/v1/labels", {}),
    ("GET", "/api/v1/label/__name__/values", {}),
    ("GET", "/api/v1/series", {"match[]": '{__name__!=""}'}),
    ("GET", "/api/v1/status/buildinfo", {}),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=30)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, PeerPair(Path(tmp)) as pair:
        print(f"{'call':70s} {'prometheus':>11s} {'turboprom':>10s} {'ratio':>6s}")
        for method, path, params in CALLS:
            med = {}
            for name, url in (("prometheus", pair.prom.url), ("turboprom", pair.tp.url)):
                p = {k: v for k, v in params.items() if not (name == "prometheus" and k == "exact")}
                for _ in range(3):
                    http(method, url + path, p)  # warm-up
                times = []
                for _ in range(a.repeat):
                    t0 = time.perf_counter()
                    status, _, _ = http(method, url + path, p)
                    times.append(time.perf_counter() - t0)
                    assert status == 200, (name, path)
                med[name] = statistics.median(times)
            label = f"{method} {path} {params.get('query', params.get('match[]', ''))}"[:70]
            print(f"{label:70s} {med['prometheus'] * 1000:9.2f}ms {med['turboprom'] * 1000:8.2f}ms {med['turboprom'] / med['prometheus']:6.2f}")


if __name__ == "__main__":
    main()
