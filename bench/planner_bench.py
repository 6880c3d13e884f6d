"""Planner / SDS benchmark: the TurboProm methodology, side by side with Prometheus 2.42.

One run:
1. Data: ``--inst`` instances x (req_total counter, gpu_util gauge, lat_bucket histogram with 8 buckets),
   a long history (``--history-days`` at ``--history-interval``) plus ``--minutes`` of recent data at
   ``--rate`` samples/s in total (accelerated simulated time). The same remote-write payloads go to
   our server and to Prometheus 2.42 (history reaches Prometheus as blocks built by ``promtool tsdb
   create-blocks-from openmetrics``, since its remote-write receiver refuses samples that old).
2. ``--workloads`` random workloads, each 4 panels drawn from a pattern pool (quantile by, sum/count by,
   quantile_over_time, sum/count/avg_over_time, rate/increase, histogram_quantile of rate, nested
   aggregations) with a dashboard range, a Grafana-like step, a window from 5m to 24h and a refresh
   interval. Each panel is refreshed ``--refreshes`` times (evaluation time advancing by the refresh
   interval); every refresh is run on our summary path (default), our raw path (exact=true) and
   Prometheus, back to back. The planner adopts SDSs by itself after 3 recurrences (no configuration).
3. Per workload: p50/p99 latency, p99 CPU per query (server process CPU from /proc, 10 ms ticks),
   total CPU (summary path includes the summarizer's ingest-side and backfill CPU), summary storage,
   observed error (relative vs exact=true; KLL rank error against the raw window samples).

    .venv/bin/python bench/planner_bench.py [--quick] [--out bench/planner_results.json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ingest.proto.messages import WriteRequest  # noqa: E402
from ingest.snappy_block import compress  # noqa: E402
from tests.helpers import ServerProcess, free_port, require_binary, wait_http  # noqa: E402

LE = ["0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "+Inf"]
POOL = [
    ("quantile by", "quantile by (job) ({q}, rate(req_total[{r}]))"),
    ("sum by", "sum by (job) (rate(req_total[{r}]))"),
    ("count by", "count by (job) (count_over_time(gpu_util[{r}]) > 0)"),
    ("quantile_over_time", "quantile_over_time({q}, gpu_util[{r}])"),
    ("sum_over_time", "sum by (job) (sum_over_time(gpu_util[{r}]))"),
    ("count_over_time", "count_over_time(gpu_util[{r}])"),
    ("avg_over_time", "avg_over_time(gpu_util[{r}])"),
    ("rate", "rate(req_total[{r}])"),
    ("increase", "sum(increase(req_total[{r}]))"),
    ("histogram_quantile", "histogram_quantile({q}, sum by (le) (rate(lat_bucket[{r}])))"),
    ("nested", "max by (job) (avg_over_time(gpu_util[{r}]))"),
    ("nested", "avg(sum by (job) (rate(req_total[{r}])))"),
    ("stddev_over_time", "stddev_over_time(gpu_util[{r}])"),
    ("max_over_time", "max(max_over_time(gpu_util[{r}]))"),
]
WINDOWS = ["5m", "15m", "1h", "6h", "24h"]
WINDOW_MS = {"5m": 300_000, "15m": 900_000, "1h": 3_600_000, "6h": 21_600_000, "24h": 86_400_000}
REFRESH_S = [10, 30, 60]


# --- data -------------------------------------------------------------------------------------
def series_defs(inst: int) -> list[dict[str, str]]:
    out = []
    for i in range(inst):
        job = f"llm-{i % 4}"
        out.append({"__name__": "req_total", "job": job, "inst": f"gpu-{i}"})
        out.append({"__name__": "gpu_util", "job": job, "inst": f"gpu-{i}"})
        for le in LE:
            out.append({"__name__": "lat_bucket", "job": job, "inst": f"gpu-{i}", "le": le})
    return out


def values_for(defs: list[dict], ts: np.ndarray, rng: np.random.Generator, state: dict) -> np.ndarray:
    """(S, n) values continuing each series' state (counters keep counting across calls)."""
    n = len(ts)
    out = np.empty((len(defs), n))
    i = 0
    while i < len(defs):
        d = defs[i]
        if d["__name__"] == "req_total":
            base = state.get(i, 0.0)
            inc = rng.poisson(3.0, n).astype(float)
            out[i] = base + np.cumsum(inc)
            state[i] = out[i, -1]
            i += 1
        elif d["__name__"] == "gpu_util":
            out[i] = np.clip(0.6 + 0.25 * np.sin(ts / 3.6e6 + i) + rng.normal(0, 0.05, n), 0, 1)
            i += 1
        else:  # a histogram: 8 cumulative buckets fed by the same observations
            obs = rng.exponential(0.4, (n, 3))
            for k, le in enumerate(LE):
                bound = np.inf if le == "+Inf" else float(le)
                base = state.get(i + k, 0.0)
                out[i + k] = base + np.cumsum((obs <= bound).sum(axis=1))
                state[i + k] = out[i + k, -1]
            i += len(LE)
    return out


def write_request(defs: list[dict], ts: np.ndarray, vals: np.ndarray) -> bytes:
    w = WriteRequest()
    tl = ts.tolist()
    for d, v in zip(defs, vals):
        t = w.timeseries.add()
        for n_, v_ in sorted(d.items()):
            t.labels.add(name=n_, value=v_)
        for a, b in zip(tl, v.tolist()):
            t.samples.add(value=b, timestamp=a)
    return compress(w.SerializeToString())


def post_write(url: str, body: bytes) -> None:
    req = urllib.request.Request(url + "/api/v1/write", data=body, method="POST",
                                 headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
                                          "X-Prometheus-Remote-Write-Version": "0.1.0"})
    for attempt in range(20):
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                if r.status in (200, 204):
                    return
        except urllib.error.HTTPError as e:
            if e.code == 429 or e.code >= 500:
                time.sleep(0.2 * (attempt + 1))
                continue
            raise RuntimeError(f"write to {url} failed: {e.code} {e.read()[:300]!r}") from None
    raise RuntimeError(f"write to {url} kept failing")


def openmetrics_history(path: Path, defs: list[dict], ts: np.ndarray, vals: np.ndarray) -> None:
    with open(path, "w") as f:
        for fam, typ in (("req_total", "counter"), ("gpu_util", "gauge"), ("lat_bucket", "gauge")):
            # families as plain gauges/counters (promtool wants counter names with _total samples)
            name = fam[:-6] if typ == "counter" else fam
            f.write(f"# TYPE {name} {typ}\n")
            secs = (ts / 1000.0).tolist()
            for d, v in zip(defs, vals):
                if d["__name__"] != fam:
                    continue
                lbl = ",".join(f'{k}="{x}"' for k, x in sorted(d.items()) if k != "__name__")
                prefix = f"{fam}{{{lbl}}} "
                f.write("".join(f"{prefix}{b!r} {a:.3f}\n" for a, b in zip(secs, v.tolist())))
        f.write("# EOF\n")


# --- processes --------------------------------------------------------------------------------
def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


class Prom:
    def __init__(self, work: Path):
        self.bin = require_binary("prometheus")
        self.promtool = require_binary("promtool")
        self.work = work
        self.data = work / "prom-data"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def create_history(self, om: Path) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        subprocess.run([self.promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(self.data)],
                       check=True, capture_output=True, timeout=3600)

    def start(self) -> None:
        cfg = self.work / "prom.yml"
        cfg.write_text("global:\n  scrape_interval: 1h\n")
        self.log = open(self.work / "prom.log", "wb")
        self.proc = subprocess.Popen([self.bin, f"--config.file={cfg}", f"--storage.tsdb.path={self.data}",
                                      f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-remote-write-receiver",
                                      "--storage.tsdb.retention.time=30d", "--query.max-samples=500000000"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        wait_http(self.url + "/-/ready", timeout=120, proc=self.proc)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def query(url: str, path: str, params: dict, timeout: float = 600) -> tuple[dict, float]:
    """(parsed body, latency): latency = request sent -> whole response body received (the client's
    JSON parsing is not the server's latency and is left out, for all three paths alike)."""
    qs = urllib.parse.urlencode(params)
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"{url}{path}?{qs}", timeout=timeout) as r:
        body = r.read()
    dt = time.perf_counter() - t0
    return json.loads(body), dt


def matrix(res: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for s in res["data"]["result"]:
        key = json.dumps(s["metric"], sort_keys=True)
        pts = s.get("values") or ([s["value"]] if "value" in s else [])
        out[key] = (np.array([p[0] for p in pts], float), np.array([float(p[1]) for p in pts]))
    return out


def rel_error(a: dict, b: dict) -> float:
    """Max relative difference of the summary answer a vs the exact answer b (inf on shape mismatch)."""
    if a.keys() != b.keys():
        return float("inf")
    worst = 0.0
    for k in a:
        (ta, va), (tb, vb) = a[k], b[k]
        if len(ta) != len(tb) or (ta != tb).any():
            return float("inf")
        same = (va == vb) | (np.isnan(va) & np.isnan(vb))
        with np.errstate(all="ignore"):
            rel = np.abs(va - vb) / np.maximum(np.abs(vb), 1e-300)
        rel = np.where(same, 0.0, rel)
        worst = max(worst, float(np.nanmax(rel)) if len(rel) else 0.0)
    return worst


def kll_rank_errors(url: str, served: dict, window: str, phi: float, times: list[float], limit: int = 6) -> list[float]:
    """Rank error of served quantile_over_time values among the raw window samples (sampled steps)."""
    errs = []
    for t in times[:: max(1, len(times) // limit)][:limit]:
        raw, _ = query(url, "/api/v1/query", {"query": f"gpu_util[{window}]", "time": t, "exact": "true"})
        for s in raw["data"]["result"]:
            key = json.dumps({k: v for k, v in s["metric"].items() if k != "__name__"}, sort_keys=True)
            if key not in served:
                continue
            ts, vs = served[key]
            hit = np.nonzero(ts == t)[0]  # same float seconds as the served step
            if not len(hit):
                continue
            v = vs[hit[0]]
            w = np.sort(np.array([float(p[1]) for p in s["values"]]))
            n = len(w)
            r_lo, r_hi = np.searchsorted(w, v, "left") / n, np.searchsorted(w, v, "right") / n
            errs.append(0.0 if r_lo <= phi <= r_hi else float(min(abs(r_lo - phi), abs(r_hi - phi))))
    return errs


# --- workloads --------------------------------------------------------------------------------
def make_workloads(n: int, seed: int) -> list[list[dict]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        panels = []
        for idx in rng.choice(len(POOL), 4, replace=False):
            kind, tmpl = POOL[int(idx)]
            window = str(rng.choice(WINDOWS))
            span_ms = int(rng.choice([3_600_000, 6 * 3_600_000, 24 * 3_600_000]))
            step_s = max(15, span_ms // 1000 // 120 // 15 * 15)
            q = float(rng.choice([0.5, 0.9, 0.99]))
            panels.append({"kind": kind, "query": tmpl.format(r=window, q=q), "window": window, "phi": q,
                           "span_ms": span_ms, "step_s": step_s, "refresh_s": int(rng.choice(REFRESH_S))})
        out.append(panels)
    return out


def reused_steps(body: dict) -> tuple[int, int]:
    """(steps reused from the step cache, steps) over the summary-served sub-trees of one answer."""
    used = total = 0
    for info in body.get("infos", []) or []:
        if "served from summary" not in info:
            continue
        m = re.search(r"; (\d+) of (\d+) steps reused", info)
        if m:
            used += int(m.group(1))
            total += int(m.group(2))
        else:
            total += 1  # served without reuse (step count not stated): counts as cold
    return used, total


def pct(a: list[float], p: float) -> float:
    return float(np.percentile(a, p)) if a else float("nan")


def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="planner-bench-"))
    rng = np.random.default_rng(args.seed)
    defs = series_defs(args.inst)
    S = len(defs)
    interval_ms = max(1, int(round(S * 1000 / args.rate)))
    now = int(time.time() * 1000) // 60_000 * 60_000
    recent_end = now - 60_000
    recent_start = recent_end - args.minutes * 60_000
    hist_ts = np.arange(recent_start - int(args.history_days * 86_400_000), recent_start, args.history_interval * 1000)
    state: dict = {}
    hist_vals = values_for(defs, hist_ts, rng, state)
    print(f"[bench] {S} series; history {len(hist_ts)} points/series; recent {args.minutes} min at "
          f"{interval_ms} ms/series = {S * 1000 / interval_ms:.0f} samples/s", flush=True)
    prom = Prom(work)
    om = work / "history.om"
    openmetrics_history(om, defs, hist_ts, hist_vals)
    t0 = time.time()
    prom.create_history(om)
    om.unlink()
    print(f"[bench] promtool blocks in {time.time() - t0:.1f}s", flush=True)
    cfg = work / "turboprom.yml"
    cfg.write_text("planner:\n  canary_fraction: 0\n")
    ours = ServerProcess(work / "tp-data", ["--config", str(cfg), "--wal-fsync", "never"])
    ours.start()
    prom.start()
    pid = ours.proc.pid
    result: dict = {"config": vars(args), "series": S, "interval_ms": interval_ms}
    try:
        # history to ours by remote write (in time order per series), then the recent stream to both
        t0 = time.time()
        cpu0 = proc_cpu(pid)
        for ch in np.array_split(np.arange(len(hist_ts)), max(1, len(hist_ts) // 200)):
            post_write(ours.url, write_request(defs, hist_ts[ch], hist_vals[:, ch]))
        rec_ts = np.arange(recent_start, recent_end, interval_ms)
        n_chunks = max(1, len(rec_ts) // max(1, 40_000 // S))
        sent = 0
        for ch in np.array_split(np.arange(len(rec_ts)), n_chunks):
            vals = values_for(defs, rec_ts[ch], rng, state)
            body = write_request(defs, rec_ts[ch], vals)
            post_write(ours.url, body)
            post_write(prom.url, body)
            sent += vals.size
        ingest_cpu = proc_cpu(pid) - cpu0
        print(f"[bench] ingested {sent} recent + {hist_vals.size} history samples in {time.time() - t0:.1f}s "
              f"(our server CPU {ingest_cpu:.1f}s)", flush=True)
        result["ingest"] = {"recent_samples": sent, "history_samples": int(hist_vals.size), "our_server_cpu_s": ingest_cpu}
        summ_cpu0 = query(ours.url, "/api/v1/planner/plans", {})[0]["data"]["summarizer"]["cpu_seconds"]
        workloads = make_workloads(args.workloads, args.seed)
        result["workloads"] = []
        for wi, panels in enumerate(workloads):
            w = run_workload(wi, panels, ours, prom, pid, recent_start, recent_end, args)
            result["workloads"].append(w)
            print(json.dumps({k: w[k] for k in ("workload", "summary", "raw", "prometheus", "served_share", "served_only",
                                                "max_rel_error_exact", "kll_rank_errors")}), flush=True)
        plans = query(ours.url, "/api/v1/planner/plans", {})[0]["data"]
        result["plans"] = plans["plans"]
        result["summarizer_cpu_s"] = plans["summarizer"]["cpu_seconds"] - summ_cpu0
        result["sds_cpu_s"] = sum(p["ingest_cpu_seconds"] for p in plans["plans"])
        result["summary_bytes"] = sum(p["bytes"] for p in plans["plans"])
    finally:
        ours.stop()
        prom.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return result


def run_workload(wi: int, panels: list[dict], ours: ServerProcess, prom: Prom, pid: int, recent_start: int,
                 recent_end: int, args: argparse.Namespace) -> dict:
    lat = {"summary": [], "raw": [], "prometheus": []}
    cpu = {"summary": [], "raw": [], "prometheus": []}
    served_pairs: list[tuple[float, ...]] = []  # (summary lat, raw lat, prom lat, summary cpu, raw cpu, prom cpu)
    errors: list[float] = []
    rank_errs: list[float] = []
    served = 0
    total = 0
    for p in panels:
        times = [recent_end - (args.refreshes - 1 - k) * p["refresh_s"] * 1000 for k in range(args.refreshes)]
        for k, t_end in enumerate(times):
            step = p["step_s"]
            end = (t_end // (step * 1000)) * step  # Grafana aligns to the step
            start = end - p["span_ms"] // 1000
            params = {"query": p["query"], "start": start, "end": end, "step": step}
            c0 = proc_cpu(pid)
            fast, l_fast = query(ours.url, "/api/v1/query_range", {**params, "stats": "all"})
            c1 = proc_cpu(pid)
            raw, l_raw = query(ours.url, "/api/v1/query_range", {**params, "exact": "true"})
            c2 = proc_cpu(pid)
            pc0 = proc_cpu(prom.proc.pid)
            _, l_prom = query(prom.url, "/api/v1/query_range", params)
            pc1 = proc_cpu(prom.proc.pid)
            paths = fast.get("data", {}).get("stats", {}).get("turboprom", {}).get("paths", [])
            is_served = any(x.startswith("summary:") for x in paths)
            total += 1
            lat["raw"].append(l_raw)
            cpu["raw"].append(c2 - c1)
            lat["prometheus"].append(l_prom)
            cpu["prometheus"].append(pc1 - pc0)
            lat["summary"].append(l_fast)
            cpu["summary"].append(c1 - c0)
            if is_served:
                served += 1
                served_pairs.append((l_fast, l_raw, l_prom, c1 - c0, c2 - c1, pc1 - pc0, *reused_steps(fast)))
                fm, rm = matrix(fast), matrix(raw)
                if "quantile_over_time" in p["query"] and any("kll" in x for x in paths):
                    times_s = sorted({float(t) for v in fm.values() for t in v[0]})
                    strip = {json.dumps({kk: vv for kk, vv in json.loads(key).items() if kk != "__name__"}, sort_keys=True): v
                             for key, v in fm.items()}
                    rank_errs += kll_rank_errors(ours.url, strip, p["window"], p["phi"], times_s)
                else:
                    errors.append(rel_error(fm, rm))
    summ = {"p50_ms": pct(lat["summary"], 50) * 1000, "p99_ms": pct(lat["summary"], 99) * 1000,
            "p99_cpu_s": pct(cpu["summary"], 99), "cpu_s": float(sum(cpu["summary"]))}
    out = {
        "workload": wi,
        "panels": panels,
        "summary": summ,
        "raw": {"p50_ms": pct(lat["raw"], 50) * 1000, "p99_ms": pct(lat["raw"], 99) * 1000,
                "p99_cpu_s": pct(cpu["raw"], 99), "cpu_s": float(sum(cpu["raw"]))},
        "prometheus": {"p50_ms": pct(lat["prometheus"], 50) * 1000, "p99_ms": pct(lat["prometheus"], 99) * 1000,
                       "p99_cpu_s": pct(cpu["prometheus"], 99), "cpu_s": float(sum(cpu["prometheus"]))},
        "served_share": served / max(total, 1),
        "served_only": {
            "n": len(served_pairs),
            "summary_p50_ms": pct([x[0] for x in served_pairs], 50) * 1000,
            "raw_p50_ms": pct([x[1] for x in served_pairs], 50) * 1000,
            "prom_p50_ms": pct([x[2] for x in served_pairs], 50) * 1000,
            "summary_p99_cpu_s": pct([x[3] for x in served_pairs], 99),
            "raw_p99_cpu_s": pct([x[4] for x in served_pairs], 99),
            "prom_p99_cpu_s": pct([x[5] for x in served_pairs], 99),
            "summary_p99_ms": pct([x[0] for x in served_pairs], 99) * 1000,
            "summary_cpu_s": float(sum(x[3] for x in served_pairs)),
            # step-cache reuse (from the answers' infos): steps reused / steps of served sub-trees, and
            # the served refreshes that reused nothing (cold: every step from panes + raw edges)
            "steps_reused": int(sum(x[6] for x in served_pairs)),
            "steps_total": int(sum(x[7] for x in served_pairs)),
            "cold_n": sum(1 for x in served_pairs if x[6] == 0),
            "cold_summary_p50_ms": pct([x[0] for x in served_pairs if x[6] == 0], 50) * 1000,
            "cold_raw_p50_ms": pct([x[1] for x in served_pairs if x[6] == 0], 50) * 1000,
            "cold_prom_p50_ms": pct([x[2] for x in served_pairs if x[6] == 0], 50) * 1000,
            "raw_cpu_s": float(sum(x[4] for x in served_pairs)),
        },
        "max_rel_error_exact": max(errors) if errors else None,
        "kll_rank_errors": {"n": len(rank_errs), "max": max(rank_errs) if rank_errs else None,
                            "within_bound_share": (sum(e <= 0.0133 for e in rank_errs) / len(rank_errs)) if rank_errs else None},
    }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inst", type=int, default=20, help="instances (10 series each)")
    ap.add_argument("--rate", type=float, default=8000, help="recent ingest rate, samples/s in total")
    ap.add_argument("--minutes", type=float, default=20, help="simulated minutes of recent data")
    ap.add_argument("--history-days", type=float, default=7)
    ap.add_argument("--history-interval", type=int, default=300, help="seconds between history points")
    ap.add_argument("--workloads", type=int, default=10)
    ap.add_argument("--refreshes", type=int, default=6, help="refreshes per panel (adoption happens after 3)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="small smoke run (2 workloads, 2 simulated minutes)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.quick:
        args.workloads, args.minutes, args.history_days, args.inst = 2, 2, 1, 8
    res = run(args)
    text = json.dumps(res, indent=1, default=float)
    if args.out:
        Path(args.out).write_text(text)
    print(text[-3000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
