"""Backfill of one OpenMetrics file: `turboprom import FILE --data-dir D` vs Prometheus's
`promtool tsdb create-blocks-from openmetrics FILE D`, same file, same machine, alternating runs.

Each run is a fresh process on a fresh output dir; wall time and the child's CPU time (user + sys,
from wait4) are recorded; medians are printed with the ratio promtool / turboprom.

usage: .venv/bin/python bench/backfill_import.py [--series 300] [--days 7] [--step 300] [--repeats 3]
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

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def write_file(path: Path, series: int, days: int, step_s: int) -> int:
    end = (int(time.time()) - 4 * 3600) // step_s * step_s
    ts = np.arange(end - days * 86400, end, step_s, dtype=np.int64)
    rng = np.random.default_rng(1)
    with open(path, "w") as f:
        f.write("# HELP requests_total Requests.\n# TYPE requests_total counter\n")
        for i in range(series):
            vals = np.cumsum(rng.integers(0, 100, len(ts)))
            f.writelines(f'requests_total{{instance="host-{i}",job="api",code="{200 + i % 3}"}} {v} {t}\n'
                         for t, v in zip(ts.tolist(), vals.tolist()))
        f.write("# EOF\n")
    return series * len(ts)


def timed(cmd: list[str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{cmd[:3]} failed: {p.stderr.read().decode()[-2000:]}")
    return wall, ru.ru_utime + ru.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--series", type=int, default=300)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--step", type=int, default=300, help="seconds between samples")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    promtool = shutil.which("promtool")
    if not promtool:
        raise SystemExit("promtool not found (apt-get install prometheus)")
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "history.om"
        n = write_file(f, a.series, a.days, a.step)
        print(f"file: {n:,} samples, {a.series} series, {a.days} days at {a.step}s, {f.stat().st_size / 1e6:.0f} MB")
        runs: dict[str, list[tuple[float, float]]] = {"turboprom": [], "promtool": []}
        for r in range(a.repeats):
            for name in ("turboprom", "promtool"):
                out = Path(d) / f"{name}-{r}"
                cmd = ([sys.executable, "-m", "turboprom", "import", str(f), "--data-dir", str(out), "--retention-time", f"{a.days + 10}d"]
                       if name == "turboprom" else [promtool, "tsdb", "create-blocks-from", "openmetrics", "-q", str(f), str(out)])
                runs[name].append(timed(cmd))
                blocks = len([p for p in (out / "blocks" if name == "turboprom" else out).iterdir() if p.is_dir()])
                size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
                print(f"  {name:9s} run {r}: wall {runs[name][-1][0]:6.2f}s  cpu {runs[name][-1][1]:6.2f}s  "
                      f"{blocks} blocks  {size / 1e6:.1f} MB")
                shutil.rmtree(out)
        med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}
        for k, (w, c) in med.items():
            print(f"{k:9s} median wall {w:6.2f}s  cpu {c:6.2f}s  {n / c / 1e6:.2f} M samples per CPU-second")
        print(f"ratio promtool/turboprom: wall {med['promtool'][0] / med['turboprom'][0]:.2f}x  "
              f"cpu {med['promtool'][1] / med['turboprom'][1]:.2f}x")


if __name__ == "__main__":
    main()
