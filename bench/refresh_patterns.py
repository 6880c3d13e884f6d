"""Refresh patterns other than Grafana's aligned one, under live ingest: the planner against planner off.

``bench/live_dashboard.py`` and ``bench/node_dashboard.py`` refresh panels as Grafana does: start and
end floored to the step, so every refresh lands on the same step grid. Other clients do not:

* ``grafana``: the reference, [now - 1 h, now] floored to the 15 s step, every 10 s;
* ``unaligned``: [now - 1 h, now] at the millisecond (a script, the Prometheus UI's graph, ``promtool
  query range``): a new step grid at every refresh, so no step answer is ever met again;
* ``incremental``: Grafana's incremental querying (the Prometheus datasource option): after a first
  full load, each refresh asks only [previous end - 10 m, now], floored to the step;
* ``instant``: ``/api/v1/query`` at the current millisecond every 15 s, as a rule evaluation or an
  alerting check does;
* ``rules``: the same, on rule-shaped queries with longer windows instead of the panels (``RULES``:
  SLO-style ratios and quantiles over [30m] and [1h], as recording and alerting rules evaluate them).

Two servers on loopback ports, each with its own temporary data directory: ``on`` (``turboprom
serve``, default planner) and ``off`` (``planner: {enabled: false}``), fed the same remote-write
bytes (``--history-hours`` of vLLM-fleet history, then one sample per series every 5 s, engines 0-5 s
behind, as in ``bench/live_dashboard.py``). The patterns run one after another, each for
``--block-s`` seconds (a pattern listed twice runs two blocks: the second shows the planner after
it has adopted, measured and retired what the first block taught it), over the 1 h panels of ``bench/live_dashboard.py``. Every refresh asks both
servers the same query in random order, under a lock the writer also takes (no write lands between
the two answers), and compares the answers (same series and timestamps, values within 1e-9 relative,
NaN = NaN). Per pattern: answers compared, mismatches, answers a summary served (``stats.turboprom.paths``),
median latency on / off and their ratio, and the server CPU (utime + stime from /proc) of both over
the block. Only successful answers count; a failed query or a mismatch fails the run.

    .venv/bin/python bench/refresh_patterns.py [--series 5000] [--history-hours 1.5] [--block-s 120]
        [--patterns grafana,unaligned,incremental,instant,rules]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.cluster_summaries import post, preload  # noqa: E402
from bench.live_dashboard import PANELS, aligned_range, compare, grafana_step, proc_cpu_s, summary_info  # noqa: E402
from bench.node_dashboard import on_off_servers, print_plans  # noqa: E402
from bench.vllm_fleet import Encoder, Fleet  # noqa: E402

WRITE_S = 5
RANGE_S = 3600
OVERLAP_S = 600  # Grafana's default incremental query overlap window
PATTERNS = ("grafana", "unaligned", "incremental", "instant", "rules")
REFRESH_S = {"grafana": 10, "unaligned": 10, "incremental": 10, "instant": 15, "rules": 15}
# rule-shaped queries over longer windows (recording rules and SLO alerts on the vLLM fleet)
RULES = [
    ("success_1h", "sum by (model_name) (increase(vllm:request_success_total[1h]))"),
    ("ttft_p99_1h", "histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket[1h])))"),
    ("e2e_p95_30m", "histogram_quantile(0.95, sum by (le, model_name) (rate(vllm:e2e_request_latency_seconds_bucket[30m])))"),
    ("gen_tokens_1h", "sum by (model_name) (rate(vllm:generation_tokens_total[1h]))"),
    ("kv_avg_1h", "avg by (model_name) (avg_over_time(vllm:kv_cache_usage_perc[1h]))"),
    ("waiting_max_30m", "max by (model_name) (max_over_time(vllm:num_requests_waiting[30m]))"),
]


@dataclass
class PatternStats:
    answers: int = 0
    mismatches: int = 0
    summary: int = 0
    first_mismatch: str = ""
    on_s: list = field(default_factory=list)
    off_s: list = field(default_factory=list)
    cpu_on: float = 0.0
    cpu_off: float = 0.0


def ask(url: str, path: str, params: dict) -> tuple[float, dict]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=120) as r:
        doc = json.loads(r.read())
    return time.perf_counter() - t0, doc


def request_of(pattern: str, q: str, now: float, last_end: dict[str, int], pid: str) -> tuple[str, dict]:
    step = grafana_step(RANGE_S)
    if pattern in ("instant", "rules"):
        return "/api/v1/query", {"query": q, "time": f"{now:.3f}"}
    if pattern == "unaligned":
        return "/api/v1/query_range", {"query": q, "start": f"{now - RANGE_S:.3f}", "end": f"{now:.3f}", "step": step}
    start, end = aligned_range(now, RANGE_S, step)
    if pattern == "incremental":
        prev = last_end.get(pid)
        if prev is not None:
            start = max(start, (prev - OVERLAP_S) // step * step)
        last_end[pid] = end
    return "/api/v1/query_range", {"query": q, "start": start, "end": end, "step": step}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=int, default=5000, help="vLLM-fleet series (79 per engine)")
    ap.add_argument("--history-hours", type=float, default=1.5)
    ap.add_argument("--block-s", type=float, default=120.0, help="seconds per pattern")
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    patterns = [p for p in args.patterns.split(",") if p]
    unknown = set(patterns) - set(PATTERNS)
    if unknown:
        ap.error(f"unknown pattern(s) {sorted(unknown)}; choose from {', '.join(PATTERNS)}")
    panels = [(pid, q) for pid, dash, q in PANELS if dash == "1h"]

    fleet = Fleet.for_series(args.series, args.seed)
    enc = Encoder(fleet.labels)
    on, off = on_off_servers("refresh-patterns-")
    lock = threading.Lock()
    stop = threading.Event()
    failures: list[str] = []
    try:
        t0 = time.time()
        preload(fleet, enc, [on.url + "/api/v1/write", off.url + "/api/v1/write"], args.history_hours, WRITE_S, 100_000)
        print(f"[bench] preload: {fleet.num_series:,} series, {args.history_hours:g} h in {time.time() - t0:.0f}s", flush=True)

        def writer() -> None:
            last = int(time.time() * 1000) // 1000 * 1000
            while not stop.is_set():
                due = int(time.time() * 1000) // (WRITE_S * 1000) * (WRITE_S * 1000)
                if due > last:
                    ts, vals = fleet.step(np.array([due], np.int64))
                    body = enc.body(ts, vals)
                    try:
                        with lock:
                            post(on.url + "/api/v1/write", body)
                            post(off.url + "/api/v1/write", body)
                    except OSError as e:
                        failures.append(f"write: {e}")
                    last = due
                stop.wait(0.5)

        threading.Thread(target=writer, daemon=True, name="writer").start()
        rnd = random.Random(args.seed)
        stats = [PatternStats() for _ in patterns]  # one per block: a pattern may be listed twice
        for pattern, st in zip(patterns, stats):
            last_end: dict[str, int] = {}
            c0 = (proc_cpu_s(on.proc.pid), proc_cpu_s(off.proc.pid))
            t_block = time.time()
            due = t_block
            while time.time() - t_block < args.block_s:
                if time.time() < due:
                    time.sleep(0.1)
                    continue
                due += REFRESH_S[pattern]
                for pid, q in (RULES if pattern == "rules" else panels):
                    now = time.time()
                    path, params = request_of(pattern, q, now, last_end, pid)
                    params["stats"] = "1"
                    try:
                        with lock:
                            if rnd.random() < 0.5:
                                on_s, a = ask(on.url, path, params)
                                off_s, b = ask(off.url, path, params)
                            else:
                                off_s, b = ask(off.url, path, params)
                                on_s, a = ask(on.url, path, params)
                    except OSError as e:
                        failures.append(f"{pattern} {pid}: {e}")
                        continue
                    st.answers += 1
                    st.on_s.append(on_s)
                    st.off_s.append(off_s)
                    st.summary += summary_info(a)[0]
                    equal, why, _, _ = compare(a, b)
                    if not equal:
                        st.mismatches += 1
                        st.first_mismatch = st.first_mismatch or f"{pid}: {why[:300]}"
            c1 = (proc_cpu_s(on.proc.pid), proc_cpu_s(off.proc.pid))
            st.cpu_on, st.cpu_off = c1[0] - c0[0], c1[1] - c0[1]
            print(f"[bench] {pattern}: {st.answers} answers, {st.mismatches} mismatches", flush=True)
        stop.set()

        print(f"\n{fleet.num_series:,} series, {args.history_hours:g} h history, {args.block_s:g} s per pattern, "
              f"{len(panels)} panels, {len(RULES)} rules\n")
        print("| pattern | answers | mismatches | summary-served | on ms | off ms | on/off | CPU on s | CPU off s | CPU on/off |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for p, st in zip(patterns, stats):
            m_on = statistics.median(st.on_s) * 1e3 if st.on_s else float("nan")
            m_off = statistics.median(st.off_s) * 1e3 if st.off_s else float("nan")
            print(f"| {p} | {st.answers} | {st.mismatches} | {st.summary} | {m_on:.1f} | {m_off:.1f} | {m_on / m_off:.2f} "
                  f"| {st.cpu_on:.1f} | {st.cpu_off:.1f} | {st.cpu_on / max(st.cpu_off, 1e-9):.2f} |")
        for p, st in zip(patterns, stats):
            if st.first_mismatch:
                print(f"first mismatch in {p}: {st.first_mismatch}")
        plans = print_plans(on.url, step_caches=True)
        print(f"step answers: {plans.get('step_answers')}")
        total = sum(st.mismatches for st in stats)
        print(f"\nmismatches: {total}; failed requests: {len(failures)} {failures[:3]}")
        return 1 if total or failures else 0
    finally:
        stop.set()
        on.stop()
        off.stop()


if __name__ == "__main__":
    sys.exit(main())
