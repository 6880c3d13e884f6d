"""PromQL kernels on dashboard shapes, this checkout against an earlier one, in separate processes.

Shapes (vLLM-fleet sized: 63 engines, 5 s samples):
- ``increase`` over ``[1h]`` of 63 counters that restart once in the hour, at 1 step (a refresh's
  newest step, an alert rule) and at 241 steps (an hour-long panel at 15 s);
- ``sum by (model_name)`` / ``avg by (model_name)`` of 63 gauge series in 5 groups, at 1 and 241
  steps, and of 189 series in one large and three small groups at 2 steps (a 24 h panel's newest
  steps);
- ``sum by (le, model_name)`` of 1,449 histogram-bucket series with a vLLM engine's labels at 2 steps
  (a TTFT panel's refresh: the per-series work is the grouping keys).

Each shape is timed in a child process that imports ``promql`` from ``--repo`` (default: this
checkout) and, with ``--baseline DIR`` (a worktree of an earlier commit, e.g. ``git worktree add
--detach /tmp/wt-old <rev>``), from that checkout too; the two children alternate ``--rounds``
times, medians of their per-round medians are printed with the ratio.

    .venv/bin/python bench/promql_kernels_ab.py [--baseline /tmp/wt-old] [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
import numpy as np
from promql.functions import FunctionContext, load_all
from promql.types import Annotations, RangeWindows, VectorSteps
from promql.eval_aggregate import aggregate
from storage.labels import make_labels

F = load_all()
rng = np.random.default_rng(3)

def windows(series, steps, rng_ms):
    offs = np.concatenate(([0], np.cumsum([len(t) for t, _ in series]))).astype(np.int64)
    ts = np.concatenate([t for t, _ in series]); vals = np.concatenate([v for _, v in series])
    S, T = len(series), len(steps)
    lo = np.zeros((S, T), np.int64); hi = np.zeros((S, T), np.int64)
    for s, (t, _) in enumerate(series):
        lo[s] = offs[s] + np.searchsorted(t, steps - rng_ms, side="right")
        hi[s] = offs[s] + np.searchsorted(t, steps, side="right")
    labels = [make_labels({"__name__": "vllm:request_success_total", "i": str(s)}) for s in range(S)]
    return RangeWindows(labels, offs, ts.astype(np.int64), vals.astype(np.float64), lo, hi, np.asarray(steps, np.int64), rng_ms)

series = []
n = 2 * 720
for s in range(63):
    t = np.arange(n, dtype=np.int64) * 5000
    v = np.cumsum(rng.integers(0, 5, n)).astype(float)
    cut = int(rng.integers(n // 2 + 50, n - 50)); v[cut:] -= v[cut] - 1  # one engine restart in the last hour
    series.append((t, v))
end = (n - 1) * 5000

def vec(S, T, groups):
    labels = [make_labels({"__name__": "vllm:num_requests_running", "instance": f"10.0.0.{i}:8000",
                           "model_name": f"model-{groups(i)}"}) for i in range(S)]
    return VectorSteps(labels, np.round(rng.random((S, T)) * 20) + rng.random((S, T)), np.ones((S, T), bool))

cases = {}
for T in (1, 241):
    rw = windows(series, np.arange(end - (T - 1) * 15000, end + 1, 15000, dtype=np.int64), 3_600_000)
    cases[f"increase[1h] 63 series x {T} steps"] = (lambda rw=rw: F["increase"](FunctionContext(rw.window_end, Annotations(), None), [rw]))
    v = vec(63, T, lambda i: i % 5)
    for op in ("sum", "avg"):
        cases[f"{op} by (model_name) 63 series / 5 groups x {T} steps"] = (lambda v=v, op=op: aggregate(op, v, ["model_name"], False, None, Annotations()))
v = vec(189, 2, lambda i: 0 if i < 123 else 1 + i % 3)
cases["sum by (model_name) 189 series / 123+22+22+22 x 2 steps"] = (lambda v=v: aggregate("sum", v, ["model_name"], False, None, Annotations()))
# a TTFT histogram's buckets with a vLLM engine's labels: 63 engines x 23 buckets, by (le, model_name)
blabels = [make_labels({"__name__": "vllm:time_to_first_token_seconds_bucket", "instance": f"10.0.0.{i}:8000",
                        "model_name": f"model-{i % 7}", "engine": "0", "job": "vllm", "pod": f"vllm-{i}",
                        "namespace": "serving", "le": str(b)}) for i in range(63) for b in range(23)]
v = VectorSteps(blabels, rng.random((len(blabels), 2)), np.ones((len(blabels), 2), bool))
cases["sum by (le, model_name) 1,449 bucket series / 161 groups x 2 steps"] = (lambda v=v: aggregate("sum", v, ["le", "model_name"], False, None, Annotations()))

out = {}
for name, fn in cases.items():
    fn()
    reps = []
    for _ in range(15):
        t0 = time.perf_counter(); fn(); reps.append(time.perf_counter() - t0)
    out[name] = sorted(reps)[len(reps) // 2]
print(json.dumps(out))
"""


def run_child(repo: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(repo)}
    r = subprocess.run([sys.executable, "-c", CHILD], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"child for {repo} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", default=str(REPO))
    ap.add_argument("--baseline", default="", help="checkout of an earlier commit to compare with")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"this": [], "baseline": []}
    for _ in range(a.rounds):
        runs["this"].append(run_child(Path(a.repo)))
        if a.baseline:
            runs["baseline"].append(run_child(Path(a.baseline)))
    names = list(runs["this"][0])
    print("| shape | this checkout ms | baseline ms | ratio |\n| --- | --- | --- | --- |")
    for n in names:
        cur = statistics.median(r[n] for r in runs["this"]) * 1000
        if runs["baseline"]:
            base = statistics.median(r[n] for r in runs["baseline"] if n in r) * 1000
            print(f"| {n} | {cur:.3f} | {base:.3f} | {cur / base:.2f} |")
        else:
            print(f"| {n} | {cur:.3f} | - | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
