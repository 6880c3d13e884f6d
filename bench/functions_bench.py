"""PromQL function families: our engine vs Prometheus 2.42 on identical data, one query per family.

    .venv/bin/python bench/functions_bench.py [--series 2000] [--days 1] [--interval 60] [--reps 3]
                                              [--ranges 1h,24h] [--only ID,...] [--write-doc]

Reuses the dataset generator, the promtool backfill and the Prometheus runner of
``bench/promql_bench.py`` (the engine benchmark, which covers the dashboard query mix);
this script covers the function table itself: the rate family, the *_over_time family (including
the ones computed by sort or by compensated sums), histogram_quantile/fraction, and element-wise
functions, each as a range query at a Grafana-like step. It reports medians of our in-process time
and Prometheus's engine time (``stats=all`` execTotalTime), the ratio, and checks both results
agree (1e-6 relative, ignoring the first hour where 2.42 and 3.x extrapolate differently).

The machine is shared and noisy: medians and same-run ratios matter, absolutes do not.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from promql_bench import (  # noqa: E402
    Prometheus,
    compare_results,
    free_port,
    generate,
    load_memory_source,
    write_openmetrics_blocks,
)

from promql.engine import Engine  # noqa: E402

QUERIES = [
    ("rate", "rate(http_requests_total[5m])"),
    ("increase", "increase(http_requests_total[15m])"),
    ("irate", "irate(http_requests_total[5m])"),
    ("delta", "delta(gpu_utilization[10m])"),
    ("idelta", "idelta(gpu_utilization[10m])"),
    ("deriv", "deriv(gpu_utilization[10m])"),
    ("predict_linear", "predict_linear(gpu_utilization[30m], 3600)"),
    ("resets", "resets(http_requests_total[1h])"),
    ("changes", "changes(gpu_utilization[15m])"),
    ("avg_over_time", "avg_over_time(gpu_utilization[10m])"),
    ("sum_over_time", "sum_over_time(gpu_utilization[10m])"),
    ("max_over_time", "max_over_time(gpu_utilization[10m])"),
    ("stddev_over_time", "stddev_over_time(gpu_utilization[10m])"),
    ("quantile_over_time", "quantile_over_time(0.9, gpu_utilization[10m])"),
    ("last_over_time", "last_over_time(gpu_utilization[10m])"),
    ("hist_quantile", "histogram_quantile(0.9, rate(http_request_duration_seconds_bucket[5m]))"),
    ("clamp_round", "round(clamp(gpu_utilization, 10, 90), 5)"),
    ("label_replace", 'label_replace(gpu_utilization, "host", "$1", "instance", "i-(.*)")'),
]
RANGES = [("1h", 3600, 15), ("24h", 86400, 60)]
DOC_HEADING = "## PromQL functions"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=2000)
    ap.add_argument("--days", type=float, default=1.0)
    ap.add_argument("--interval", type=int, default=60)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ranges", default="1h,24h")
    ap.add_argument("--only", default="")
    ap.add_argument("--write-doc", action="store_true")
    args = ap.parse_args()

    end_s = (int(time.time()) // 7200) * 7200 - 7200
    tmp = Path(tempfile.mkdtemp(prefix="functions-bench-"))
    prom: Prometheus | None = None
    rows: list[tuple[str, str, int, float, float, str]] = []
    try:
        ds = generate(args.series, args.days, args.interval, end_s)
        for f in write_openmetrics_blocks(ds, tmp / "om"):
            subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(f), str(tmp / "prom-data")],
                           check=True, stdout=subprocess.DEVNULL)
            f.unlink()
        src = load_memory_source(ds)
        eng = Engine(src, lookback_delta_ms=300_000, max_samples=500_000_000, timeout_s=600.0)
        prom = Prometheus(tmp / "prom-data", free_port())
        prom.start()
        prom.wait_compaction_settled(quiet_s=10.0)
        only = set(filter(None, args.only.split(",")))
        ranges = [r for r in RANGES if r[0] in args.ranges.split(",")]
        first_ms = int(ds.ts_s[0]) * 1000 + 3_600_000
        for qid, q in QUERIES:
            if only and qid not in only:
                continue
            for rname, span, step in ranges:
                start, end = end_s - span, end_s
                eng.range_query(q, start * 1000, end * 1000, step * 1000)
                prom.query_range(q, start, end, step)
                ours, theirs = [], []
                res = pdata = None
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    res = eng.range_query(q, start * 1000, end * 1000, step * 1000)
                    ours.append(time.perf_counter() - t0)
                    _, pdata = prom.query_range(q, start, end, step)
                    theirs.append(float(pdata["stats"]["timings"]["execTotalTime"]))
                check = compare_results(res, pdata, first_ms)
                o, p = statistics.median(ours), statistics.median(theirs)
                rows.append((qid, rname, step, o, p, check))
                print(f"{qid:20s} {rname:4s} ours {o * 1000:9.1f} ms  prom {p * 1000:9.1f} ms  ratio {o / p:6.2f}  {check}", flush=True)
    finally:
        if prom is not None:
            prom.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    ratios = [o / p for _, _, _, o, p, _ in rows if p > 0]
    table = [
        DOC_HEADING,
        "",
        f"Command: `python bench/functions_bench.py {' '.join(sys.argv[1:])}`  ",
        f"Machine: {os.cpu_count()} vCPU, Python {sys.version.split()[0]}; shared with other jobs "
        f"(noisy): medians of {args.reps} runs, ratios from the same run.  ",
        f"Data: {ds.num_series} series x {len(ds.ts_s)} points ({args.interval}s interval, {args.days}d), "
        "in-process MemorySource vs Prometheus 2.42 over promtool-backfilled blocks.",
        "",
        "| function | range | step | ours | Prometheus (engine) | ratio | results agree |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for qid, rname, step, o, p, check in rows:
        table.append(f"| {qid} | {rname} | {step}s | {o * 1000:.1f} ms | {p * 1000:.1f} ms | {o / p:.2f} | {check} |")
    if ratios:
        table.append("")
        table.append(f"Median ratio ours/Prometheus over all rows: {statistics.median(ratios):.2f}.")
    text = "\n".join(table) + "\n"
    print(text)
    if args.write_doc:
        doc = REPO / "docs" / "benchmarks.md"
        body = doc.read_text()
        if DOC_HEADING in body:
            head, _, rest = body.partition(DOC_HEADING)
            nxt = rest.find("\n## ")
            body = head + text + (rest[nxt + 1 :] if nxt >= 0 else "")
        else:
            body = body.rstrip("\n") + "\n\n" + text
        doc.write_text(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
