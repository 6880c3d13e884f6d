"""Served-query latency over HTTP, split into server time and the rest (the bench's data shape).

Starts the real server, ingests like ``bench/planner_bench.py`` (remote write), lets the planner adopt
the panels' SDS by itself (3 recurrences) and waits for the backfill, then per panel of
``bench/planner_profile.py``: median wall time of a refresh over HTTP on the summary path and on
``exact=true``, the server-side evaluation time (``stats.timings``), and the server CPU per query.
``--cprofile DIR`` runs the server under cProfile (one .prof file, written at shutdown).

    .venv/bin/python bench/planner_http_profile.py [--minutes 20] [--reps 5]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.planner_bench import post_write, proc_cpu, series_defs, values_for, write_request  # noqa: E402
from bench.planner_profile import PANELS  # noqa: E402
from tests.helpers import ServerProcess  # noqa: E402


def get(url: str, path: str, params: dict) -> tuple[bytes, float]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=600) as r:
        body = r.read()
    return body, time.perf_counter() - t0


def _profiled_start(srv: ServerProcess, out: str) -> None:
    import os
    import subprocess

    from tests.helpers import wait_http

    srv.data_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(REPO / "bench" / "planner_server_profiled.py"), "serve", "--data-dir", str(srv.data_dir),
           "--listen", f"127.0.0.1:{srv.port}", *srv.extra_args]
    srv._log = open(srv.log_path, "ab")
    srv.proc = subprocess.Popen(cmd, cwd=REPO, stdout=srv._log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PLANNER_PROFILE_OUT": out})
    wait_http(srv.url + "/-/ready", timeout=60, proc=srv.proc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inst", type=int, default=20)
    ap.add_argument("--rate", type=float, default=8000)
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--history-days", type=float, default=7)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", default="")
    ap.add_argument("--cprofile", default="", help="write a cProfile of the server's queries (summary path) here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="planner-http-"))
    cfg = work / "tp.yml"
    cfg.write_text("planner:\n  canary_fraction: 0\n")
    srv = ServerProcess(work / "data", ["--config", str(cfg), "--wal-fsync", "never"])
    if args.cprofile:
        _profiled_start(srv, args.cprofile)
    else:
        srv.start()
    try:
        rng = np.random.default_rng(1)
        defs = series_defs(args.inst)
        S = len(defs)
        interval_ms = max(1, int(round(S * 1000 / args.rate)))
        now = int(time.time() * 1000) // 60_000 * 60_000
        recent_end = now - 60_000
        recent_start = recent_end - int(args.minutes * 60_000)
        hist_ts = np.arange(recent_start - int(args.history_days * 86_400_000), recent_start, 300_000)
        state: dict = {}
        hv = values_for(defs, hist_ts, rng, state)
        for ch in np.array_split(np.arange(len(hist_ts)), max(1, len(hist_ts) // 200)):
            post_write(srv.url, write_request(defs, hist_ts[ch], hv[:, ch]))
        rec_ts = np.arange(recent_start, recent_end, interval_ms)
        for ch in np.array_split(np.arange(len(rec_ts)), max(1, len(rec_ts) // max(1, 40_000 // S))):
            post_write(srv.url, write_request(defs, rec_ts[ch], values_for(defs, rec_ts[ch], rng, state)))
        panels = [p for p in PANELS if not args.only or args.only in p[0]]
        # baselines: HTTP + engine with no data (vector(1)) and an uncovered selector (planner overhead only)
        panels += [("baseline vector(1) 24h", "vector(1)", 24 * 3_600_000),
                   ("baseline sum(gpu_util) 1h", "sum by (job) (gpu_util)", 3_600_000)]
        shapes = []
        for name, q, span in panels:
            step = max(15, span // 1000 // 120 // 15 * 15)
            end = (recent_end // 1000) // step * step
            shapes.append((name, q, span // 1000, step, end))
            for k in range(3):  # recurrences: the planner adopts
                get(srv.url, "/api/v1/query_range", {"query": q, "start": end - span // 1000 - k * step,
                                                      "end": end - k * step, "step": step})
        for _ in range(600):
            plans = json.loads(get(srv.url, "/api/v1/planner/plans", {})[0])["data"]["plans"]
            if plans and all(p["backfill"]["state"] == "done" for p in plans):
                break
            time.sleep(1)
        print("plans:", [p["id"] for p in plans], flush=True)
        pid = srv.proc.pid
        print(f"{'panel':30s} {'sum ms':>7s} {'eval':>6s} {'cpu':>6s} | {'raw ms':>7s} {'eval':>6s} {'cpu':>6s}  path")
        for name, q, span_s, step, end in shapes:
            row = {"s": [], "se": [], "sc": [], "r": [], "re": [], "rc": []}
            path = ""
            for r in range(args.reps):
                e = end + (r + 1) * step
                params = {"query": q, "start": e - span_s, "end": e, "step": step, "stats": "all"}
                for key, extra in (("s", {}), ("r", {"exact": "true"})):
                    c0 = proc_cpu(pid)
                    body, dt = get(srv.url, "/api/v1/query_range", {**params, **extra})
                    c1 = proc_cpu(pid)
                    st = json.loads(body)["data"].get("stats", {})
                    row[key].append(dt)
                    row[key + "e"].append(st.get("timings", {}).get("evalTotalTime", float("nan")))
                    row[key + "c"].append(c1 - c0)
                    if key == "s":
                        path = ",".join(st.get("turboprom", {}).get("paths", []))
            m = {k: float(np.median(v)) * 1000 for k, v in row.items()}
            print(f"{name:30s} {m['s']:7.1f} {m['se']:6.1f} {m['sc']:6.0f} | {m['r']:7.1f} {m['re']:6.1f} {m['rc']:6.0f}  {path}",
                  flush=True)
    finally:
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
