"""PromQL engine benchmark: our engine vs Prometheus 2.42 on identical data (issue 4).

    .venv/bin/python bench/promql_bench.py [--series 10000] [--days 7] [--interval 300] [--reps 5]
                                           [--write-doc] [--profile QUERY_ID]

1. Generates a dashboard-shaped dataset (counters, a classic histogram, gauges; 10k series by
   default) as numpy arrays.
2. Loads the same arrays into our engine (``promql.memory_source.MemorySource`` + ``Engine``,
   in-process) and into a real Prometheus: OpenMetrics text, one file per 2h block window,
   backfilled with ``promtool tsdb create-blocks-from openmetrics``; then ``/usr/bin/prometheus``
   is started on a loopback port over those blocks (and given time to compact).
3. Runs each dashboard query as a range query over 1h / 24h / 7d at Grafana-like steps
   (15s / 1m / 10m), ``--reps`` times each, and reports per-query medians: our in-process time,
   Prometheus's own engine time (``stats=all`` execTotalTime) and its HTTP wall time, the ratio
   ours / Prometheus-engine, our peak traced allocation (tracemalloc) and Prometheus's
   ``peakSamples``. Results of both are compared (series sets and values, 1e-6 relative).
4. ``--profile ID`` prints a cProfile of our engine on one query.

The machine is shared and noisy: the table reports medians and ratios measured in the same run.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import os
import pstats
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from promql.engine import Engine  # noqa: E402
from promql.memory_source import MemorySource  # noqa: E402
from storage.labels import Labels  # noqa: E402

BLOCK_MS = 2 * 3600 * 1000
LE_BOUNDS = ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"]

QUERIES = [
    ("rate_sum_by", "sum by (method) (rate(http_requests_total[20m]))"),
    ("rate_by_instance", 'sum by (instance) (rate(http_requests_total{status="500"}[20m]))'),
    ("rate_raw", "rate(http_requests_total[20m])"),
    ("hist_quantile", "histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket[20m])))"),
    ("hist_quantile_by", "histogram_quantile(0.9, sum by (le, method) (rate(http_request_duration_seconds_bucket[20m])))"),
    ("topk_avg", "topk(5, avg by (instance) (gpu_utilization))"),
    ("avg_over_time", "avg_over_time(gpu_utilization[1h])"),
    ("quantile_over_time", "quantile_over_time(0.95, gpu_utilization[1h])"),
    ("deriv", "deriv(gpu_utilization[1h])"),
    ("predict_linear", "predict_linear(gpu_utilization[1h], 3600)"),
]
RANGES = [("1h", 3600, 15), ("24h", 86400, 60), ("7d", 7 * 86400, 600)]


# ---------------------------------------------------------------------------------------------
# data


@dataclass
class Family:
    name: str
    labels: list[Labels]
    values: np.ndarray  # (S, N) float64


@dataclass
class Dataset:
    ts_s: np.ndarray  # (N,) int64 seconds
    families: list[Family] = field(default_factory=list)

    @property
    def num_series(self) -> int:
        return sum(len(f.labels) for f in self.families)

    @property
    def num_samples(self) -> int:
        return self.num_series * len(self.ts_s)


def _lbl(**kv: str) -> Labels:
    return tuple(sorted(kv.items()))


def generate(n_series: int, days: float, interval_s: int, end_s: int, seed: int = 42) -> Dataset:
    """~20% request counters, ~60% histogram buckets, ~20% gauges; all share one timestamp grid."""
    rng = np.random.default_rng(seed)
    n = int(days * 86400 // interval_s)
    # Samples sit 7s before the step grid: Prometheus 2.42 windows are closed [t-r, t], 3.x (and we)
    # use (t-r, t]; keeping samples off window edges makes both semantics select the same points.
    ts = end_s - 7 - interval_s * np.arange(n - 1, -1, -1, dtype=np.int64)
    ds = Dataset(ts)
    n_inst = max(1, n_series // 40)  # 40 series per instance: 8 counters, 24 buckets, 8 gauges
    methods, statuses = ["GET", "POST", "PUT", "DELETE"], ["200", "500"]

    # counters: http_requests_total{instance, method, status} with rare resets
    lbls = [_lbl(__name__="http_requests_total", job="api", instance=f"i-{i:04d}", method=m, status=s)
            for i in range(n_inst) for m in methods for s in statuses]
    inc = rng.poisson(lam=rng.uniform(1, 50, size=(len(lbls), 1)) * interval_s / 60, size=(len(lbls), n)).astype(np.float64)
    vals = np.cumsum(inc, axis=1)
    resets = rng.random((len(lbls), n)) < 0.0005
    if resets.any():  # a restart: the counter starts again from the increments after it
        seg = np.cumsum(resets, axis=1)
        base = np.zeros_like(vals)
        for s in np.flatnonzero(resets.any(axis=1)):  # per series, only those with resets
            idx = np.flatnonzero(resets[s])
            starts = vals[s, idx] - inc[s, idx]
            base[s] = np.concatenate(([0.0], starts))[seg[s]]
        vals = vals - base
    ds.families.append(Family("http_requests_total", lbls, vals))

    # classic histogram: http_request_duration_seconds_bucket{instance, method(2), le(12)}
    hl, hv = [], []
    for i in range(n_inst):
        for m in methods[:2]:
            obs = rng.poisson(lam=20 * interval_s / 60, size=n).astype(np.float64)
            shares = rng.dirichlet(np.linspace(1, 4, len(LE_BOUNDS)))
            per_bucket = np.cumsum(np.outer(shares, obs), axis=0)  # cumulative over le
            cum = np.floor(np.cumsum(per_bucket, axis=1))
            for b, le in enumerate(LE_BOUNDS):
                hl.append(_lbl(__name__="http_request_duration_seconds_bucket", job="api", instance=f"i-{i:04d}", method=m, le=le))
                hv.append(cum[b])
    ds.families.append(Family("http_request_duration_seconds_bucket", hl, np.array(hv)))

    # gauges: gpu_utilization{instance, gpu(8)} random walk in [0, 100]
    gl = [_lbl(__name__="gpu_utilization", job="workers", instance=f"i-{i:04d}", gpu=str(g)) for i in range(n_inst) for g in range(8)]
    walk = np.cumsum(rng.normal(0, 3, size=(len(gl), n)), axis=1) + rng.uniform(20, 80, size=(len(gl), 1))
    ds.families.append(Family("gpu_utilization", gl, np.round(np.clip(walk, 0, 100), 3)))
    return ds


def load_memory_source(ds: Dataset) -> MemorySource:
    src = MemorySource()
    ts_ms = ds.ts_s * 1000
    for fam in ds.families:
        for lbl, row in zip(fam.labels, fam.values):  # per series
            src.add_series(lbl, ts_ms, row)
    src.select([], 0, 0)  # freeze now, not inside the first timed query
    return src


def load_turboprom_dir(ds: Dataset, path: Path) -> None:
    """Write the dataset into a TurboProm data directory through the real TSDB (storage/tsdb.py)."""
    from storage.batch import SampleBatch
    from storage.options import DAY_MS, StorageOptions
    from storage.tsdb import TSDB

    db = TSDB(str(path), StorageOptions(wal_fsync="never", retention_ms=60 * DAY_MS), background=False)
    ts_ms = ds.ts_s * 1000
    try:
        for fam in ds.families:
            for a in range(0, len(fam.labels), 500):
                items = [(lbl, ts_ms, row) for lbl, row in zip(fam.labels[a:a + 500], fam.values[a:a + 500])]
                res = db.append(SampleBatch.from_series(items))
                if res.rejected_total:
                    raise RuntimeError(f"TSDB rejected samples: {res.rejected} {res.errors[:3]}")
    finally:
        db.close()


class _HTTPPeer:
    """A server process answering the Prometheus HTTP API on a loopback port (ours or Prometheus)."""

    name = "server"
    query_params: dict[str, str] = {}

    def __init__(self, data_dir: Path, port: int):
        self.data_dir, self.port = data_dir, port
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query_range(self, q: str, start_s: float, end_s: float, step_s: float) -> tuple[float, dict]:
        params = urllib.parse.urlencode({"query": q, "start": start_s, "end": end_s, "step": step_s, **self.query_params})
        t0 = time.perf_counter()
        with urllib.request.urlopen(f"{self.url}/api/v1/query_range?{params}", timeout=900) as r:
            body = r.read()
        wall = time.perf_counter() - t0
        doc = json.loads(body)
        if doc.get("status") != "success":
            raise RuntimeError(f"{self.name} error for {q}: {doc}")
        return wall, doc["data"]

    def hwm_bytes(self) -> int:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class TurboPromServer(_HTTPPeer):
    """A real `turboprom serve` over the loaded data dir (its HTTP API, TSDB, engine and planner)."""

    name = "turboprom"

    def start(self, timeout: float = 900.0) -> None:
        self.log = open(self.data_dir.parent / "turboprom.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "turboprom", "serve", "--data-dir", str(self.data_dir), "--listen", f"127.0.0.1:{self.port}",
             "--retention-time", "60d", "--wal-fsync", "never"], cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("turboprom exited; see " + str(self.data_dir.parent / "turboprom.log"))
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:  # noqa: BLE001 - not ready yet
                pass
            time.sleep(0.5)
        raise TimeoutError("turboprom did not become ready")


def compare_json(a: dict, b: dict, from_ms: int) -> str:
    """Compare two Prometheus-API matrix results (TurboProm's vs Prometheus's) at steps >= from_ms."""
    def pts(d: dict) -> dict:
        out = {}
        for s in d["result"]:
            vals = [(int(round(float(t) * 1000)), float(v)) for t, v in s["values"] if float(t) * 1000 >= from_ms]
            out[tuple(sorted(s["metric"].items()))] = vals
        return out
    pa, pb = pts(a), pts(b)
    if set(pa) != set(pb):
        return f"series differ: {len(pa)} vs {len(pb)}"
    worst = 0.0
    for k in pa:
        if [t for t, _ in pa[k]] != [t for t, _ in pb[k]]:
            return f"timestamps differ for {dict(k)}"
        for (_, x), (_, y) in zip(pa[k], pb[k]):
            if x != y and not (math.isnan(x) and math.isnan(y)):
                worst = max(worst, abs(x - y) / (abs(x) + abs(y)))
    return "ok" if worst < 1e-6 else f"max rel diff {worst:.2g}"


# ---------------------------------------------------------------------------------------------
# Prometheus


def _om_escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def write_openmetrics_blocks(ds: Dataset, outdir: Path) -> list[Path]:
    """One OpenMetrics file per 2h block window (promtool re-reads its whole input once per 2h
    window, so splitting keeps the backfill linear in the data size)."""
    outdir.mkdir(parents=True, exist_ok=True)
    ts_ms = ds.ts_s * 1000
    win = ts_ms // BLOCK_MS
    files = []
    prefixes = [[f"{fam.name}{{{','.join(f'{k}={chr(34)}{_om_escape(v)}{chr(34)}' for k, v in lbl if k != '__name__')}}} "
                 for lbl in fam.labels] for fam in ds.families]
    for w in np.unique(win):
        idx = np.flatnonzero(win == w)
        tstr = [f" {t}\n" for t in ds.ts_s[idx].tolist()]
        path = outdir / f"block-{int(w)}.om"
        with open(path, "w") as f:
            for fam, pref in zip(ds.families, prefixes):
                f.write(f"# TYPE {fam.name} unknown\n")
                block = fam.values[:, idx].tolist()
                for p, row in zip(pref, block):
                    f.write("".join(p + repr(v) + t for v, t in zip(row, tstr)))
            f.write("# EOF\n")
        files.append(path)
    return files


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus(_HTTPPeer):
    name = "prometheus"
    query_params = {"stats": "all"}

    def start(self) -> None:
        cfg = self.data_dir.parent / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1h\n")
        self.log = open(self.data_dir.parent / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            ["/usr/bin/prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={self.data_dir}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=60d",
             "--query.max-samples=500000000", "--query.timeout=10m"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("prometheus exited; see " + str(self.data_dir.parent / "prometheus.log"))
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:  # noqa: BLE001 - not ready yet
                pass
            time.sleep(0.5)
        raise TimeoutError("prometheus did not become ready")

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
        return float("nan")

    def wait_compaction_settled(self, quiet_s: float = 20.0, limit_s: float = 600.0) -> None:
        """Let the startup compaction of the backfilled 2h blocks finish before timing anything."""
        t0 = time.time()
        last = (self.metric("prometheus_tsdb_compactions_total"), self.metric("prometheus_tsdb_blocks_loaded"))
        stable_since = time.time()
        while time.time() - t0 < limit_s:
            time.sleep(5)
            cur = (self.metric("prometheus_tsdb_compactions_total"), self.metric("prometheus_tsdb_blocks_loaded"))
            if cur != last:
                last, stable_since = cur, time.time()
            elif time.time() - stable_since >= quiet_s:
                return


# ---------------------------------------------------------------------------------------------
# comparison


def compare_results(ours, prom_data: dict, from_ms: int) -> str:
    """Compare our matrix with Prometheus's at steps >= from_ms; returns 'ok' or a description.

    Steps whose window reaches before the first sample are excluded: there Prometheus 2.42 and
    3.x (us) extrapolate rate()/increase() differently (3.x caps the extrapolation to the left
    at half a sample interval before applying the zero-point limit)."""
    pm = {tuple(sorted(s["metric"].items())): s["values"] for s in prom_data["result"]}
    om = {}
    tsteps = np.asarray(ours.timestamps, np.int64)
    for i, lbl in enumerate(ours.labels):
        m = ours.present[i]
        om[tuple(lbl)] = (tsteps[m], ours.values[i][m])
    if set(pm) != set(om):
        return f"series differ: ours {len(om)} prom {len(pm)}"
    worst = 0.0
    for k, vals in pm.items():
        pt = np.array([int(round(float(t) * 1000)) for t, _ in vals], np.int64)
        pv = np.array([float(v) for _, v in vals])
        ot, ov = om[k]
        keep_p, keep_o = pt >= from_ms, ot >= from_ms
        pt, pv, ot, ov = pt[keep_p], pv[keep_p], ot[keep_o], ov[keep_o]
        if len(pt) != len(ot) or (pt != ot).any():
            return f"timestamps differ for {dict(k)}"
        both_nan = np.isnan(pv) & np.isnan(ov)
        denom = np.abs(pv) + np.abs(ov)
        rel = np.where(both_nan | (pv == ov), 0.0, np.abs(pv - ov) / np.where(denom == 0, 1, denom))
        worst = max(worst, float(rel.max()) if len(rel) else 0.0)
    return "ok" if worst < 1e-6 else f"max rel diff {worst:.2g}"


# ---------------------------------------------------------------------------------------------
# main


@dataclass
class Row:
    qid: str
    query: str
    rng: str
    step_s: int
    ours_s: float = 0.0
    prom_exec_s: float = 0.0
    prom_wall_s: float = 0.0
    ours_peak_bytes: int = 0
    ours_peak_samples: int = 0
    prom_peak_samples: int = 0
    series: int = 0
    check: str = ""
    tp_wall_s: float = 0.0
    tp_check: str = ""

    @property
    def ratio(self) -> float:
        return self.ours_s / self.prom_exec_s if self.prom_exec_s else float("nan")


def fmt_s(s: float) -> str:
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def render(rows: list[Row], meta: dict) -> str:
    out = [
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']} (shared with other jobs: noisy; medians of {meta['reps']} runs, ratios from the same run)  ",
        f"Data: {meta['series']} series x {meta['points']} points ({meta['samples']/1e6:.1f}M samples, {meta['interval']}s interval over {meta['days']}d); "
        f"Prometheus 2.42 backfilled with promtool from the same values (OpenMetrics), ours loaded in-process into MemorySource.  ",
        f"Load: OpenMetrics write {meta['om_s']:.0f}s, promtool {meta['promtool_s']:.0f}s; ours {meta['load_ours_s']:.1f}s. "
        f"Peak RSS: ours (whole bench process, incl. the dataset) {meta['ours_rss']/2**20:.0f} MiB; Prometheus VmHWM {meta['prom_hwm']/2**20:.0f} MiB.",
        "",
        "| query | range / step | series | ours (in-process) | Prometheus engine (execTotalTime) | Prometheus HTTP wall | ours / Prom engine | ours peak alloc | ours peak samples | Prom peakSamples | results |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        out.append(f"| `{r.query}` | {r.rng} / {r.step_s}s | {r.series} | {fmt_s(r.ours_s)} | {fmt_s(r.prom_exec_s)} | {fmt_s(r.prom_wall_s)} | "
                   f"{r.ratio:.2f} | {r.ours_peak_bytes/2**20:.0f} MiB | {r.ours_peak_samples} | {r.prom_peak_samples} | {r.check} |")
    if any(r.tp_wall_s or r.tp_check for r in rows):
        out += ["", "End to end over HTTP (a real `turboprom serve` over its own TSDB holding the same data; wall time of "
                "`/api/v1/query_range` incl. JSON, both servers queried alternately):", "",
                "| query | range / step | TurboProm HTTP | Prometheus HTTP | TurboProm / Prometheus | results |", "|---|---|---:|---:|---:|---|"]
        for r in rows:
            if r.tp_wall_s or r.tp_check:
                out.append(f"| `{r.query}` | {r.rng} / {r.step_s}s | {fmt_s(r.tp_wall_s)} | {fmt_s(r.prom_wall_s)} | "
                           f"{r.tp_wall_s / r.prom_wall_s:.2f} | {r.tp_check} |")
        hr = [r.tp_wall_s / r.prom_wall_s for r in rows if r.tp_wall_s and r.prom_wall_s and not math.isnan(r.tp_wall_s)] or [float("nan")]
        out.append("")
        out.append(f"Median ratio TurboProm HTTP / Prometheus HTTP: **{statistics.median(hr):.2f}** (min {min(hr):.2f}, max {max(hr):.2f}); "
                   f"TurboProm server VmHWM {meta.get('tp_hwm', 0)/2**20:.0f} MiB.")
    ratios = [r.ratio for r in rows if r.prom_exec_s]
    out.append("")
    out.append(f"Median ratio ours / Prometheus engine over all {len(ratios)} queries: **{statistics.median(ratios):.2f}** "
               f"(min {min(ratios):.2f}, max {max(ratios):.2f}).")
    return "\n".join(out)


def write_doc(section_body: str, profile_notes: str) -> None:
    doc = REPO / "docs" / "benchmarks.md"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    head = "## PromQL engine"
    body = f"{head}\n\n{section_body}\n"
    if profile_notes:
        body += f"\n{profile_notes}\n"
    if head in text:
        a = text.index(head)
        b = text.find("\n## ", a + len(head))
        text = text[:a] + body + (text[b + 1:] if b >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + body
    doc.write_text(text)


def profile(eng: Engine, q: str, start_s: int, end_s: int, step_s: int, top: int = 25) -> str:
    pr = cProfile.Profile()
    pr.enable()
    eng.range_query(q, start_s * 1000, end_s * 1000, step_s * 1000)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def profile_only(args: argparse.Namespace) -> int:
    end_s = (int(time.time()) // 7200) * 7200 - 7200
    ds = generate(args.series, args.days, args.interval, end_s)
    eng = Engine(load_memory_source(ds), lookback_delta_ms=300_000, max_samples=500_000_000, timeout_s=600.0)
    qmap = dict(QUERIES)
    ranges = [r for r in RANGES if r[0] in args.ranges.split(",")]
    for qid in args.profile.split(","):
        for rname, span, step in ranges:
            eng.range_query(qmap[qid], (end_s - span) * 1000, end_s * 1000, step * 1000)  # warm-up
            t0 = time.perf_counter()
            eng.range_query(qmap[qid], (end_s - span) * 1000, end_s * 1000, step * 1000)
            print(f"== {qid} {rname}: {fmt_s(time.perf_counter() - t0)}")
            print(profile(eng, qmap[qid], end_s - span, end_s, step))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=10_000)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--interval", type=int, default=300, help="sample interval in seconds")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated query ids to run")
    ap.add_argument("--ranges", default="1h,24h,7d")
    ap.add_argument("--write-doc", action="store_true", help="write the table into docs/benchmarks.md (## PromQL engine)")
    ap.add_argument("--profile", default="", help="query id to profile (our engine) at the largest range")
    ap.add_argument("--http", action="store_true", help="also load a real TurboProm server (its TSDB) and time its HTTP API")
    ap.add_argument("--profile-only", action="store_true", help="skip Prometheus: load ours and profile --profile")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = ap.parse_args()
    if args.profile_only:
        return profile_only(args)

    end_s = (int(time.time()) // 7200) * 7200 - 7200
    tmp = Path(tempfile.mkdtemp(prefix="promql-bench-"))
    prom: Prometheus | None = None
    try:
        t0 = time.perf_counter()
        ds = generate(args.series, args.days, args.interval, end_s)
        print(f"generated {ds.num_series} series x {len(ds.ts_s)} points in {time.perf_counter() - t0:.1f}s", flush=True)

        t0 = time.perf_counter()
        files = write_openmetrics_blocks(ds, tmp / "om")
        om_s = time.perf_counter() - t0
        print(f"wrote {len(files)} OpenMetrics files in {om_s:.1f}s", flush=True)
        t0 = time.perf_counter()
        for f in files:
            subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(f), str(tmp / "prom-data")],
                           check=True, stdout=subprocess.DEVNULL)
            f.unlink()
        promtool_s = time.perf_counter() - t0
        print(f"promtool backfill in {promtool_s:.1f}s", flush=True)

        t0 = time.perf_counter()
        src = load_memory_source(ds)
        load_ours_s = time.perf_counter() - t0
        eng = Engine(src, lookback_delta_ms=300_000, max_samples=500_000_000, timeout_s=600.0)

        tp: TurboPromServer | None = None
        if args.http:
            t0 = time.perf_counter()
            load_turboprom_dir(ds, tmp / "tp-data")
            tp = TurboPromServer(tmp / "tp-data", free_port())
            tp.start()
            print(f"turboprom loaded and ready in {time.perf_counter() - t0:.1f}s", flush=True)

        prom = Prometheus(tmp / "prom-data", free_port())
        prom.start()
        prom.wait_compaction_settled()
        print("prometheus ready", flush=True)

        only = set(filter(None, args.only.split(",")))
        ranges = [r for r in RANGES if r[0] in args.ranges.split(",")]
        rows: list[Row] = []
        for qid, q in QUERIES:
            if only and qid not in only:
                continue
            for rname, span, step in ranges:
                start, end = end_s - span, end_s
                row = Row(qid, q, rname, step)
                ours_t, prom_exec, prom_wall = [], [], []
                eng.range_query(q, start * 1000, end * 1000, step * 1000)  # warm-up (parser/regex caches)
                prom.query_range(q, start, end, step)
                res = None
                pdata = None
                for _ in range(args.reps):
                    t1 = time.perf_counter()
                    res = eng.range_query(q, start * 1000, end * 1000, step * 1000)
                    ours_t.append(time.perf_counter() - t1)
                    wall, pdata = prom.query_range(q, start, end, step)
                    prom_wall.append(wall)
                    prom_exec.append(float(pdata["stats"]["timings"]["execTotalTime"]))
                row.ours_s = statistics.median(ours_t)
                row.prom_exec_s = statistics.median(prom_exec)
                row.prom_wall_s = statistics.median(prom_wall)
                row.series = len(res.labels)
                row.ours_peak_samples = res.stats.peak_samples
                row.prom_peak_samples = int(pdata["stats"].get("samples", {}).get("peakSamples", 0))
                row.check = compare_results(res, pdata, int(ds.ts_s[0]) * 1000 + 3_600_000)
                if tp is not None:
                    try:
                        tp.query_range(q, start, end, step)  # warm-up
                        tw = []
                        for _ in range(args.reps):
                            wall, tdata = tp.query_range(q, start, end, step)
                            tw.append(wall)
                            prom.query_range(q, start, end, step)  # alternate, so load noise hits both
                        row.tp_wall_s = statistics.median(tw)
                        row.tp_check = compare_json(tdata, pdata, int(ds.ts_s[0]) * 1000 + 3_600_000)
                    except urllib.error.HTTPError as e:  # reported in the table, not fatal
                        row.tp_check = f"HTTP {e.code}: {e.read()[:200]!r}"
                        row.tp_wall_s = float("nan")
                tracemalloc.start()
                eng.range_query(q, start * 1000, end * 1000, step * 1000)
                row.ours_peak_bytes = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                rows.append(row)
                print(f"{qid:20s} {rname:4s} ours {fmt_s(row.ours_s):>10s}  prom {fmt_s(row.prom_exec_s):>10s} "
                      f"(http {fmt_s(row.prom_wall_s):>10s})  ratio {row.ratio:5.2f}  {row.check}", flush=True)

        profile_notes = ""
        if args.profile:
            qmap = dict(QUERIES)
            rname, span, step = ranges[-1]
            for qid in args.profile.split(","):
                print(profile(eng, qmap[qid], end_s - span, end_s, step))

        meta = {
            "command": "python bench/promql_bench.py " + " ".join(sys.argv[1:]),
            "machine": f"{os.cpu_count()} vCPU, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM, Python {sys.version.split()[0]}",
            "reps": args.reps, "series": ds.num_series, "points": len(ds.ts_s), "samples": ds.num_samples,
            "interval": args.interval, "days": args.days, "om_s": om_s, "promtool_s": promtool_s,
            "load_ours_s": load_ours_s, "ours_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "prom_hwm": prom.hwm_bytes(), "tp_hwm": tp.hwm_bytes() if tp is not None else 0,
        }
        table = render(rows, meta)
        print(table)
        if args.write_doc:
            write_doc(table, profile_notes)
        return 0
    finally:
        if prom is not None:
            prom.stop()
        if "tp" in locals() and tp is not None:
            tp.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
