"""JSON encoding speed of large query results (turboprom/api_json.py).

Part 1 (always): encode an S x T matrix (default 1000 series x 1000 steps = 1M points, mixed
integer and fractional values, 10% absent) with our vectorized encoder, and with the obvious
per-point Python encoding (orjson over lists of [ts, repr-ish string]) as a baseline.

Part 1b (``--panels``): dashboard-panel shapes (5 x 241, 63 x 241, 6 x 1441, 500 x 241) through
``encode_query_result_parts`` (what the API calls), with the compiled assembly
(turboprom/csrc/json_native.c) and with the pure-Python one, interleaved in alternating rounds so
both meet the same machine load; prints medians and their ratio.

Part 2 (``--peer``): the same shape end to end over HTTP: a real Prometheus 2.42 (data backfilled
with promtool) and TurboProm (same data via /api/v1/import/prometheus) answering
``query_range`` of the raw series. Reports medians and the TurboProm/Prometheus ratio.

    .venv/bin/python bench/api_json_bench.py [--series 1000] [--steps 1000] [--repeat 5] [--panels] [--peer]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from promql.types import QueryResult  # noqa: E402
from storage.labels import make_labels  # noqa: E402
from turboprom import api_json  # noqa: E402


def make_result(series: int, steps: int, seed: int = 1) -> QueryResult:
    rng = np.random.default_rng(seed)
    values = rng.normal(1000, 300, size=(series, steps))
    values[: series // 2] = np.round(values[: series // 2])  # half integer-valued (counters)
    present = rng.random((series, steps)) > 0.1
    ts = 1_700_000_000_000 + np.arange(steps, dtype=np.int64) * 15_000
    labels = [make_labels({"__name__": "bench_metric", "instance": f"host-{i}:9100", "job": "node"}) for i in range(series)]
    return QueryResult("matrix", labels=labels, values=values, present=present, timestamps=ts)


def naive_encode(res: QueryResult) -> bytes:
    out = []
    ts = res.timestamps.tolist()
    for s, lbl in enumerate(res.labels):
        row = res.values[s].tolist()
        pres = res.present[s].tolist()
        pts = [[t / 1000, repr(v)] for t, v, p in zip(ts, row, pres) if p]
        out.append({"metric": dict(lbl), "values": pts})
    return orjson.dumps({"status": "success", "data": {"resultType": "matrix", "result": out}})


def timed(fn, repeat: int) -> tuple[float, int]:
    times = []
    size = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        body = fn()
        times.append(time.perf_counter() - t0)
        size = len(body)
    return statistics.median(times), size


PANEL_SHAPES = ((5, 241, "a sum by (model_name) panel, 1 h / 15 s"), (63, 241, "a per-instance panel"),
                (6, 1441, "a 24 h / 60 s panel"), (500, 241, "a wide panel"))


def panels_run(rounds: int = 30, per_round: int = 5) -> None:
    """Compiled vs pure-Python matrix assembly on panel shapes, alternating rounds, medians."""
    native = api_json._json_native
    if native is None:
        raise SystemExit("turboprom._json_native is not built (make native)")
    rng = np.random.default_rng(1)
    print("| matrix | compiled | Python assembly | ratio |\n| --- | --- | --- | --- |")
    try:
        for S, T, what in PANEL_SHAPES:
            labels = [make_labels({"instance": f"10.0.0.{i}:8000", "model_name": f"meta-llama/Llama-3.1-8B-{i % 5}"})
                      for i in range(S)]
            res = QueryResult("matrix", labels=labels, values=rng.random((S, T)) * 100, present=np.ones((S, T), bool),
                              timestamps=1_764_000_000_000 + np.arange(T, dtype=np.int64) * 15_000)
            times: dict[str, list[float]] = {"compiled": [], "python": []}
            for _ in range(rounds):
                for name in times:
                    api_json._json_native = native if name == "compiled" else None
                    t0 = time.perf_counter()
                    for _ in range(per_round):
                        api_json.encode_query_result_parts(res, stats="1")
                    times[name].append((time.perf_counter() - t0) / per_round)
            a, b = statistics.median(times["compiled"]), statistics.median(times["python"])
            print(f"| {S} x {T} ({what}) | {a * 1000:.2f} ms | {b * 1000:.2f} ms | {a / b:.2f} |")
    finally:
        api_json._json_native = native


def peer_run(series: int, steps: int, repeat: int) -> None:
    from tests.helpers import ServerProcess
    from tests.test_api_helpers import PrometheusPeer, http, import_text, openmetrics_from_text

    step_s = 15
    t0 = 1_700_000_000_000
    lines = ["# TYPE bench_metric gauge"]
    rng = np.random.default_rng(2)
    vals = np.round(rng.normal(1000, 300, size=(series, steps)), 3)
    names = [f'bench_metric{{instance="host-{s}:9100",job="node"}}' for s in range(series)]
    for k in range(steps):  # time-major: storage refuses samples far behind its head
        t = t0 + k * step_s * 1000
        lines.extend(f"{names[s]} {v!r} {t}" for s, v in enumerate(vals[:, k].tolist()))
    text = "\n".join(lines) + "\n"
    start, end = t0 / 1000, (t0 + (steps - 1) * step_s * 1000) / 1000
    params = {"query": "bench_metric", "start": str(start), "end": str(end), "step": str(step_s)}
    with tempfile.TemporaryDirectory() as tmp:
        with PrometheusPeer(Path(tmp) / "prom", openmetrics=openmetrics_from_text(text)) as prom, \
                ServerProcess(Path(tmp) / "tp" / "data") as tp:
            chunk = 200_000
            all_lines = text.splitlines()
            for i in range(0, len(all_lines), chunk):
                import_text(tp.url, "\n".join(all_lines[i:i + chunk]) + "\n")
            results = {}
            for name, url in (("prometheus", prom.url), ("turboprom", tp.url)):
                http("POST", url + "/api/v1/query_range", params, timeout=600)  # warm-up
                times = []
                for _ in range(repeat):
                    t = time.perf_counter()
                    status, _, body = http("POST", url + "/api/v1/query_range", params, timeout=600)
                    times.append(time.perf_counter() - t)
                    assert status == 200, body[:300]
                results[name] = (statistics.median(times), len(body))
                print(f"{name:10s} query_range {series}x{steps}: median {results[name][0]*1000:.0f} ms, body {results[name][1]/1e6:.1f} MB")
            print(f"ratio turboprom/prometheus: {results['turboprom'][0] / results['prometheus'][0]:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--series", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--peer", action="store_true")
    ap.add_argument("--panels", action="store_true", help="panel shapes, compiled vs Python assembly")
    a = ap.parse_args()
    if a.panels:
        panels_run()
        return
    res = make_result(a.series, a.steps)
    points = int(res.present.sum())
    t_ours, size = timed(lambda: api_json.encode_query_result(res), a.repeat)
    t_naive, nsize = timed(lambda: naive_encode(res), a.repeat)
    print(f"points {points}, body {size/1e6:.1f} MB")
    print(f"api_json.encode_query_result: median {t_ours*1000:.0f} ms  ({points/t_ours/1e6:.2f} M points/s)")
    print(f"naive per-point orjson      : median {t_naive*1000:.0f} ms  ({points/t_naive/1e6:.2f} M points/s, not byte-compatible)")
    print(f"speed-up vs naive: {t_naive/t_ours:.2f}x")
    if a.peer:
        peer_run(a.series, a.steps, a.repeat)


if __name__ == "__main__":
    main()
