"""In-process remote-write decode cost per request: compiled walk vs the pure-Python walk, and
whether decoding scales over threads (the compiled walk and cramjam's snappy run without the GIL).

Same payloads as bench/ingest_remote_write.py (fleet label sets, 2000 series x 1 sample and 500 x 20),
series already known (warm: the steady state of a scraping sender). Per request: snappy decode
alone, then snappy + decode_v1 (walk, reference lookups, batch), median over all requests of
--repeats passes; then the same requests decoded by 1 and by 2 threads, requests/s.

    .venv/bin/python bench/ingest_decode.py [--series 20000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from ingest.remote_write import RemoteWriteDecoder  # noqa: E402
from ingest.series_refs import native_available  # noqa: E402
from ingest.snappy_block import decompress  # noqa: E402
from ingest_remote_write import build_payloads  # noqa: E402

LIMIT = 64 << 20


def per_request_ms(fn, payloads: list[bytes], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        for p in payloads:
            t = time.perf_counter()
            fn(p)
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def threaded_rps(fn, payloads: list[bytes], threads: int, repeats: int) -> float:
    work = payloads * repeats
    parts = [work[i::threads] for i in range(threads)]

    def run(part):
        for p in part:
            fn(p)

    ts = [threading.Thread(target=run, args=(part,)) for part in parts]
    t = time.perf_counter()
    for x in ts:
        x.start()
    for x in ts:
        x.join()
    return len(work) / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--series", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    kinds = [("compiled", True), ("python", False)] if native_available() else [("python", False)]
    print("| shape | walk | snappy ms/request | snappy + decode ms/request | requests/s, 1 thread | requests/s, 2 threads | samples/s, 2 threads |")
    print("|---|---|---|---|---|---|---|")
    for shape in ("2000x1", "500x20"):
        per_req, per_series = map(int, shape.split("x"))
        payloads, counts = build_payloads(a.series, per_req, per_series, 1, 1_700_000_000_000)
        snappy_ms = per_request_ms(lambda p: decompress(p, LIMIT), payloads, a.repeats)
        for name, native in kinds:
            dec = RemoteWriteDecoder(future_tolerance_ms=0, native=native)
            fn = lambda p, dec=dec: dec.decode_v1(decompress(p, LIMIT))  # noqa: E731
            for p in payloads:  # warm: every series known
                fn(p)
            ms = per_request_ms(fn, payloads, a.repeats)
            r1 = threaded_rps(fn, payloads, 1, a.repeats)
            r2 = threaded_rps(fn, payloads, 2, a.repeats)
            print(f"| {shape} | {name} | {snappy_ms:.3f} | {ms:.3f} | {r1:,.0f} | {r2:,.0f} | {r2 * counts[0]:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
