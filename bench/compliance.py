"""Side-by-side PromQL compliance: TurboProm vs Prometheus 2.42 (Debian package).

Runs the PromQL compliance tester's query set (``../shared/compliance/promql-test-queries.yml``:
118 templates expanded over the tester's variant tables) as range queries against both servers
holding identical data, and compares results the way the tester does: same series (label sets),
same timestamps, values equal within a relative 1e-5 (NaN == NaN); ``should_fail`` cases must
fail on the target. Warnings/infos are ignored.

Data: generated history of the PromLabs demo service's metric families (three instances
``demo.promlabs.com:10000..10002``, job ``demo``, 5 s scrape interval, 95 minutes), written into
Prometheus with ``promtool tsdb create-blocks-from openmetrics`` and into TurboProm through
``POST /api/v1/import/prometheus``. Backfilled data has no staleness markers (on both sides).
Samples sit on whole seconds; the query window (10 minutes, step 10 s, like the tester) starts
and ends on fractional seconds, as the tester's wall-clock times do.

    .venv/bin/python bench/compliance.py [--json report.json] [--show-failures N] [--parallel 4] [--passes N] [--eager-planner]

``--passes N`` runs the query set N times against the same servers: the patterns recur, the planner
adopts plans during the first pass, and those answer the later ones (each pass's counts and the
plans held at the end are printed).

``--live SECONDS`` instead runs the tester's own setup in miniature: three Python exporters
(prometheus-client) expose the demo families, a real Prometheus scrapes them every second and
remote-writes everything (staleness markers included) to TurboProm; after SECONDS the queries run
over the last minutes of that window on both. ``demo_intermittent_metric`` disappears every other
20 s there, so staleness is exercised.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers import SHARED, ServerProcess  # noqa: E402
from tests.test_api_helpers import PrometheusPeer, http, import_text  # noqa: E402

QUERIES_FILE = SHARED / "compliance" / "promql-test-queries.yml"
# Extra parameters sent to TurboProm only (``--exact`` adds exact=true: never answer from a summary).
TARGET_EXTRA: dict[str, str] = {}

# The tester's variant tables (testcases/expand.go, see ../shared/compliance/NOTES.md).
VARIANTS: dict[str, list[str]] = {
    "range": ["1s", "15s", "1m", "5m", "15m", "1h"],
    "offset": ["1m", "5m", "10m"],
    "simpleAggrOp": ["sum", "avg", "max", "min", "count", "stddev", "stdvar"],
    "simpleTimeAggrOp": ["sum", "avg", "max", "min", "count", "stddev", "stdvar", "absent", "last"],
    "topBottomOp": ["topk", "bottomk"],
    "quantile": ["-0.5", "0.1", "0.5", "0.75", "0.95", "0.90", "0.99", "1", "1.5"],
    "arithBinOp": ["+", "-", "*", "/", "%", "^"],
    "compBinOp": ["==", "!=", "<", ">", "<=", ">="],
    "binOp": ["+", "-", "*", "/", "%", "^", "==", "!=", "<", ">", "<=", ">="],
    "simpleMathFunc": ["abs", "ceil", "floor", "exp", "sqrt", "ln", "log2", "log10", "round"],
    "extrapolatedRateFunc": ["delta", "rate", "increase"],
    "clampFunc": ["clamp_min", "clamp_max"],
    "instantRateFunc": ["idelta", "irate"],
    "dateFunc": ["day_of_month", "day_of_week", "days_in_month", "hour", "minute", "month", "year"],
}

T0_S = 1_700_000_000  # data start (whole seconds)
SCRAPE_S = 5
DATA_MINUTES = 95
INSTANCES = ["demo.promlabs.com:10000", "demo.promlabs.com:10001", "demo.promlabs.com:10002"]
BUCKETS = [0.0001 * 1.5**k for k in range(25)]


# ---------------------------------------------------------------------------------------------
# data


def generate_text() -> str:
    """Prometheus text exposition with millisecond timestamps, identical input for both sides."""
    rng = np.random.default_rng(42)
    n = DATA_MINUTES * 60 // SCRAPE_S + 1
    lines: list[str] = []

    def emit(name: str, labels: dict[str, str], ts_ms: np.ndarray, vals: np.ndarray) -> None:
        lbl = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        head = f"{name}{{{lbl}}} "
        lines.extend(head + repr(float(v)) + " " + str(int(t)) for t, v in zip(ts_ms.tolist(), vals.tolist()))

    for i, inst in enumerate(INSTANCES):
        base = {"instance": inst, "job": "demo"}
        ts_s = T0_S + (i + 1) + np.arange(n) * SCRAPE_S  # per-instance scrape offset of i+1 s
        ts = ts_s * 1000
        minutes = (ts_s // 60)
        for typ, level in (("used", 2.0e9), ("cached", 1.0e9), ("buffers", 3.0e8), ("free", 4.0e9)):
            walk = np.cumsum(rng.normal(0, level * 0.002, n))
            emit("demo_memory_usage_bytes", {**base, "type": typ}, ts, np.round(level + walk + i * 1e7))
        emit("demo_num_cpus", base, ts, np.full(n, float(4 * (i + 1))))
        for mode, rate in (("user", 0.6), ("system", 0.25), ("idle", 2.9)):
            c = np.cumsum(rng.uniform(0.5, 1.5, n) * rate * SCRAPE_S)
            if mode == "user" and i == 1:
                c[n // 2:] -= c[n // 2]  # a counter reset (process restart)
            emit("demo_cpu_usage_seconds_total", {**base, "mode": mode}, ts, np.round(c, 3))
        disk = 1.2e11 + np.cumsum(rng.integers(0, 2_000_000, n)).astype(float)
        emit("demo_disk_usage_bytes", base, ts, disk)
        emit("demo_disk_total_bytes", base, ts, np.full(n, 2.5e11))
        # batch job: runs every 4 minutes; success every other run
        runs = (ts_s - T0_S) // 240
        last_run = T0_S + runs * 240 + 7.0
        last_success = T0_S + (runs - (runs % 2)) * 240 + 7.0
        emit("demo_batch_last_run_timestamp_seconds", base, ts, last_run.astype(float))
        emit("demo_batch_last_success_timestamp_seconds", base, ts, last_success.astype(float))
        emit("demo_batch_last_run_duration_seconds", base, ts, 30 + (runs % 5) * 2.5)
        emit("demo_batch_last_run_processed_bytes", base, ts, (runs % 7 + 1) * 1.5e6)
        emit("demo_api_http_requests_in_progress", base, ts, rng.integers(0, 6, n).astype(float))
        emit("demo_is_holiday", base, ts, np.zeros(n))
        emit("demo_items_shipped_total", base, ts, np.cumsum(rng.integers(0, 4, n)).astype(float))
        even = (minutes % 2) == 0
        emit("demo_intermittent_metric", base, ts[even], np.full(int(even.sum()), 1.0))
        for method in ("GET", "POST"):
            for path in ("/api/foo", "/api/bar"):
                for status in ("200", "500"):
                    scale = (5.0 if status == "200" else 0.5) * (1.0 if method == "GET" else 0.4)
                    reqs = rng.poisson(scale * SCRAPE_S, n)
                    count = np.cumsum(reqs).astype(float)
                    # latency distribution per request group: lognormal-ish bucket fractions
                    mu = np.log(0.02 if path == "/api/foo" else 0.05)
                    cdf = np.array([0.5 * (1 + math.erf((np.log(b) - mu) / (1.2 * math.sqrt(2)))) for b in BUCKETS])
                    lab = {**base, "method": method, "path": path, "status": status}
                    for b, frac in zip(BUCKETS, cdf):
                        emit("demo_api_request_duration_seconds_bucket", {**lab, "le": repr(b)}, ts, np.floor(count * frac))
                    emit("demo_api_request_duration_seconds_bucket", {**lab, "le": "+Inf"}, ts, count)
                    emit("demo_api_request_duration_seconds_sum", lab, ts, np.round(count * math.exp(mu + 0.72), 6))
                    emit("demo_api_request_duration_seconds_count", lab, ts, count)
    return "\n".join(lines) + "\n"


def to_openmetrics(text: str) -> str:
    out = []
    for line in text.splitlines():
        head, value, ts = line.rsplit(" ", 2)
        out.append(f"{head} {value} {int(ts) // 1000}")  # whole seconds: exact in both
    out.append("# EOF")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# queries


@dataclass
class Case:
    query: str
    should_fail: bool = False


def expand_cases(path: Path = QUERIES_FILE) -> list[Case]:
    doc = yaml.safe_load(path.read_text())
    out: list[Case] = []
    for tc in doc["test_cases"]:
        q = tc["query"]
        args = tc.get("variant_args") or []
        if not args:
            out.append(Case(q, bool(tc.get("should_fail"))))
            continue
        for combo in itertools.product(*(VARIANTS[a] for a in args)):
            text = q
            for a, v in zip(args, combo):
                text = text.replace("{{." + a + "}}", v)
            if "{{" in text:
                raise ValueError(f"unexpanded template in {q!r}")
            out.append(Case(text, bool(tc.get("should_fail"))))
    return out


# ---------------------------------------------------------------------------------------------
# comparison


@dataclass
class Outcome:
    query: str
    status: str  # passed | failed | unexpected_success | unexpected_failure | reference_error
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _matrix(body: bytes) -> tuple[str | None, list[tuple[tuple, list[tuple[int, float]]]] | None, str]:
    doc = json.loads(body)
    if doc.get("status") != "success":
        return doc.get("errorType"), None, doc.get("error", "")
    data = doc["data"]
    if data["resultType"] != "matrix":
        return "wrong_type", None, data["resultType"]
    series = []
    for s in data["result"]:
        pts = [(round(float(t) * 1000), float(v)) for t, v in s["values"]]
        series.append((tuple(sorted(s["metric"].items())), pts))
    series.sort(key=lambda x: x[0])
    return None, series, ""


def _values_equal(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if a == b:
        return True
    # cmpopts.EquateApprox(fraction=1e-5, margin=0): |a-b| <= 1e-5 * min(|a|, |b|)
    return abs(a - b) <= 1e-5 * min(abs(a), abs(b))


def compare(case: Case, ref: tuple[int, bytes], tgt: tuple[int, bytes]) -> Outcome:
    out = _compare(case, ref, tgt)
    if out.status != "passed":
        try:
            infos = json.loads(tgt[1]).get("infos")
        except ValueError:
            infos = None
        if infos:  # e.g. served from a summary
            out.detail += f" (TurboProm infos: {infos})"
    return out


def _compare(case: Case, ref: tuple[int, bytes], tgt: tuple[int, bytes]) -> Outcome:
    r_err, r_series, r_msg = _matrix(ref[1])
    t_err, t_series, t_msg = _matrix(tgt[1])
    if case.should_fail:
        if t_err is None:
            return Outcome(case.query, "unexpected_success", "should fail but succeeded")
        return Outcome(case.query, "passed", f"failed as expected: {t_msg}")
    if r_err is not None:
        return Outcome(case.query, "reference_error", f"Prometheus failed: {r_err}: {r_msg}")
    if t_err is not None:
        return Outcome(case.query, "unexpected_failure", f"{t_err}: {t_msg}")
    assert r_series is not None and t_series is not None
    r_keys = [k for k, _ in r_series]
    t_keys = [k for k, _ in t_series]
    if r_keys != t_keys:
        missing = sorted(set(r_keys) - set(t_keys))[:2]
        extra = sorted(set(t_keys) - set(r_keys))[:2]
        return Outcome(case.query, "failed", f"series differ: {len(r_keys)} vs {len(t_keys)}; missing {missing}; extra {extra}")
    for (k, rp), (_, tp) in zip(r_series, t_series):
        if [t for t, _ in rp] != [t for t, _ in tp]:
            return Outcome(case.query, "failed", f"timestamps differ for {dict(k)}: {len(rp)} vs {len(tp)} points")
        for (t, a), (_, b) in zip(rp, tp):
            if not _values_equal(a, b):
                return Outcome(case.query, "failed", f"value differs for {dict(k)} at {t}: Prometheus {a!r}, TurboProm {b!r}")
    return Outcome(case.query, "passed")


# ---------------------------------------------------------------------------------------------
# run


def planner_plans(url: str) -> list[str]:
    """The ids of the plans the server's planner holds now."""
    code, _, body = http("GET", url + "/api/v1/planner/plans", {}, timeout=30)
    if code != 200:
        return []
    return [p["id"] for p in json.loads(body)["data"]["plans"]]


def run(parallel: int = 4, keep_servers: bool = False, passes: int = 1,
        planner: dict[str, Any] | None = None) -> dict[str, Any]:
    """``passes``: the whole query set this many times against the same servers (the planner sees
    the patterns recur and adopts plans, which then answer the later passes); the report is the
    last pass's, with every pass's counts. ``planner``: settings of TurboProm's ``planner:`` section
    (default: none, the server's defaults)."""
    cases = expand_cases()
    text = generate_text()
    n_samples = text.count("\n")
    end = T0_S + (DATA_MINUTES - 3) * 60 + 0.123  # the tester uses now - 12 min with fractions
    start = end - 600
    params = {"start": repr(start), "end": repr(end), "step": "10"}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        prom = PrometheusPeer(Path(tmp) / "prom", openmetrics=to_openmetrics(text))
        tp_args: list[str] = []
        if planner:
            cfg = Path(tmp) / "tp.yml"
            cfg.write_text(yaml.safe_dump({"planner": planner}))
            tp_args = ["--config", str(cfg)]
        tp = ServerProcess(Path(tmp) / "tp" / "data", tp_args)
        with prom, tp:
            # time-major, as a live scrape would deliver it (storage refuses samples far behind its head)
            lines = sorted(text.splitlines(), key=lambda ln: int(ln.rsplit(" ", 1)[1]))
            chunk = 100_000
            for i in range(0, len(lines), chunk):
                import_text(tp.url, "\n".join(lines[i:i + chunk]) + "\n")
            load_s = time.perf_counter() - t0

            def one(case: Case) -> Outcome:
                p = {**params, "query": case.query}
                ref = http("POST", prom.url + "/api/v1/query_range", p, timeout=120)
                tgt = http("POST", tp.url + "/api/v1/query_range", {**p, **TARGET_EXTRA}, timeout=120)
                return compare(case, (ref[0], ref[2]), (tgt[0], tgt[2]))

            t1 = time.perf_counter()
            per_pass = []
            for _ in range(max(1, passes)):
                with ThreadPoolExecutor(parallel) as pool:
                    outcomes = list(pool.map(one, cases))
                per_pass.append({s: sum(1 for o in outcomes if o.status == s) for s in {o.status for o in outcomes}})
            run_s = time.perf_counter() - t1
            plans = planner_plans(tp.url)
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    return {
        "passes": per_pass,
        "plans": plans,
        "cases": len(cases),
        "templates": len(yaml.safe_load(QUERIES_FILE.read_text())["test_cases"]),
        "samples": n_samples,
        "window": {"start": start, "end": end, "step": 10},
        "counts": counts,
        "passed": counts.get("passed", 0),
        "load_seconds": round(load_s, 1),
        "run_seconds": round(run_s, 1),
        "outcomes": [o.__dict__ for o in outcomes],
    }


# ---------------------------------------------------------------------------------------------
# live mode: exporters -> Prometheus scrape -> remote write -> TurboProm


class DemoCollector:
    """The demo service's families with values that move with wall-clock time."""

    def __init__(self, idx: int):
        self.idx = idx
        self.rng = np.random.default_rng(100 + idx)
        # Counters start high, as on a long-running service (the demo instances run for months):
        # with a counter starting near zero, 2.42 and 3.x extrapolate rate() differently.
        self.cpu = {"user": 5.0e5 + idx, "system": 2.0e5 + idx, "idle": 2.5e6 + idx}
        self.items = 1.0e4 * (idx + 1)
        self.hist: dict[tuple[str, ...], np.ndarray] = {}
        self.started = time.time()

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        now = time.time()
        i = self.idx
        mem = GaugeMetricFamily("demo_memory_usage_bytes", "Memory usage.", labels=["type"])
        for typ, level in (("used", 2.0e9), ("cached", 1.0e9), ("buffers", 3.0e8), ("free", 4.0e9)):
            mem.add_metric([typ], round(level * (1 + 0.01 * math.sin(now / 30 + i)) + self.rng.integers(0, 1000)))
        yield mem
        yield GaugeMetricFamily("demo_num_cpus", "CPUs.", value=4.0 * (i + 1))
        cpu = CounterMetricFamily("demo_cpu_usage_seconds", "CPU seconds.", labels=["mode"])
        for mode, rate in (("user", 0.6), ("system", 0.25), ("idle", 2.9)):
            self.cpu[mode] += rate * self.rng.uniform(0.5, 1.5)
            cpu.add_metric([mode], round(self.cpu[mode], 3))
        yield cpu
        yield GaugeMetricFamily("demo_disk_usage_bytes", "Disk usage.", value=1.2e11 + (now - self.started) * 1e5)
        yield GaugeMetricFamily("demo_disk_total_bytes", "Disk size.", value=2.5e11)
        run = int(now // 40) * 40 + 7.0
        yield GaugeMetricFamily("demo_batch_last_run_timestamp_seconds", "Last run.", value=run)
        yield GaugeMetricFamily("demo_batch_last_success_timestamp_seconds", "Last success.", value=run - (int(now // 40) % 2) * 40)
        yield GaugeMetricFamily("demo_batch_last_run_duration_seconds", "Duration.", value=30 + (int(now // 40) % 5) * 2.5)
        yield GaugeMetricFamily("demo_batch_last_run_processed_bytes", "Bytes.", value=(int(now // 40) % 7 + 1) * 1.5e6)
        yield GaugeMetricFamily("demo_api_http_requests_in_progress", "In progress.", value=float(self.rng.integers(0, 6)))
        yield GaugeMetricFamily("demo_is_holiday", "Holiday.", value=0.0)
        self.items += float(self.rng.integers(0, 4))
        yield CounterMetricFamily("demo_items_shipped", "Items.", value=self.items)
        if int(now // 20) % 2 == 0:  # disappears every other 20 s: Prometheus writes stale markers
            yield GaugeMetricFamily("demo_intermittent_metric", "Intermittent.", value=1.0)
        h = HistogramMetricFamily("demo_api_request_duration_seconds", "Latency.", labels=["method", "path", "status"])
        for method in ("GET", "POST"):
            for path in ("/api/foo", "/api/bar"):
                for status in ("200", "500"):
                    key = (method, path, status)
                    mu = 0.02 if path == "/api/foo" else 0.05
                    if key not in self.hist:
                        warm = self.rng.lognormal(math.log(mu), 1.2, 20_000)
                        self.hist[key] = np.histogram(warm, bins=[0.0, *BUCKETS, np.inf])[0].astype(float)
                        self.hist[key + ("sum",)] = np.array([warm.sum()])
                    counts = self.hist[key]
                    obs = self.rng.lognormal(math.log(mu), 1.2, int(self.rng.poisson(5 if status == "200" else 1)))
                    counts += np.histogram(obs, bins=[0.0, *BUCKETS, np.inf])[0]
                    cum = np.cumsum(counts)
                    buckets = [(repr(b), float(c)) for b, c in zip(BUCKETS, cum[:-1])] + [("+Inf", float(cum[-1]))]
                    self.hist[key + ("sum",)] = self.hist.get(key + ("sum",), np.zeros(1)) + obs.sum()
                    h.add_metric([method, path, status], buckets, float(self.hist[key + ("sum",)][0]))
        yield h


def run_live(seconds: float, parallel: int = 4) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry, start_http_server

    from tests.helpers import free_port

    cases = expand_cases()
    exporters = []
    with tempfile.TemporaryDirectory() as tmp:
        tp = ServerProcess(Path(tmp) / "tp" / "data")
        tp.start()
        try:
            statics = ""
            for i, inst in enumerate(INSTANCES):
                reg = CollectorRegistry()
                reg.register(DemoCollector(i))
                port = free_port()
                exporters.append(start_http_server(port, addr="127.0.0.1", registry=reg))
                statics += f"  - targets: ['127.0.0.1:{port}']\n    labels:\n      instance: '{inst}'\n"
            cfg = ("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                   "scrape_configs:\n- job_name: demo\n  static_configs:\n" + statics +
                   f"remote_write:\n- url: {tp.url}/api/v1/write\n  queue_config:\n    batch_send_deadline: 1s\n")
            with PrometheusPeer(Path(tmp) / "prom", config_yaml=cfg) as prom:
                t_begin = time.time()
                time.sleep(max(0.0, seconds))
                end = time.time() - 5.377  # fractional, a little before now
                start = max(end - 600, t_begin + 20.5)
                # Stop the targets: Prometheus marks their series stale on the next failed scrape
                # and remote-writes the markers; then both hold the same, final data (negative
                # offsets read past `end`).
                for httpd, _ in exporters:
                    httpd.shutdown()
                    httpd.server_close()
                exporters.clear()
                time.sleep(10)
                step = 10 if end - start >= 120 else 5
                params = {"start": repr(start), "end": repr(end), "step": str(step)}

                def one(case: Case) -> Outcome:
                    p = {**params, "query": case.query}
                    ref = http("POST", prom.url + "/api/v1/query_range", p, timeout=120)
                    tgt = http("POST", tp.url + "/api/v1/query_range", {**p, **TARGET_EXTRA}, timeout=120)
                    return compare(case, (ref[0], ref[2]), (tgt[0], tgt[2]))

                t1 = time.perf_counter()
                with ThreadPoolExecutor(parallel) as pool:
                    outcomes = list(pool.map(one, cases))
                run_s = time.perf_counter() - t1
        finally:
            for httpd, _ in exporters:
                httpd.shutdown()
                httpd.server_close()
            tp.stop()
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    return {
        "mode": "live",
        "cases": len(cases),
        "templates": len(yaml.safe_load(QUERIES_FILE.read_text())["test_cases"]),
        "samples": None,
        "window": {"start": start, "end": end, "step": step},
        "counts": counts,
        "passed": counts.get("passed", 0),
        "load_seconds": round(seconds, 1),
        "run_seconds": round(run_s, 1),
        "outcomes": [o.__dict__ for o in outcomes],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write the full report here")
    ap.add_argument("--show-failures", type=int, default=100)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--live", type=float, default=0, help="seconds of live scraping + remote write instead of backfill")
    ap.add_argument("--exact", action="store_true", help="send exact=true to TurboProm (raw path only, no summaries)")
    ap.add_argument("--passes", type=int, default=1, help="query passes over the same servers (backfill mode): "
                    "the planner adopts plans for the recurring patterns, which answer the later passes")
    ap.add_argument("--eager-planner", action="store_true",
                    help="TurboProm's planner with summary_cost_prior 0: it adopts plans for this small data set's "
                         "patterns, whose raw queries cost about the default prior (1-3 ms), so the passes test them")
    a = ap.parse_args()
    if a.exact:
        TARGET_EXTRA["exact"] = "true"
    report = run_live(a.live, a.parallel) if a.live else run(a.parallel, passes=a.passes,
                                                             planner={"summary_cost_prior": 0} if a.eager_planner else None)
    print(f"templates {report['templates']}, expanded queries {report['cases']}, samples {report['samples']}, window {report['window']}")
    print(f"load {report['load_seconds']} s, queries {report['run_seconds']} s")
    print("counts:", json.dumps(report["counts"], sort_keys=True))
    print(f"passed {report['passed']}/{report['cases']}")
    if "passes" in report:
        print("per pass:", json.dumps(report["passes"], sort_keys=True), f"plans at the end: {len(report['plans'])}",
              ", ".join(report["plans"]))
    bad = [o for o in report["outcomes"] if o["status"] != "passed"]
    for o in bad[: a.show_failures]:
        print(f"- [{o['status']}] {o['query']}\n    {o['detail'][:300]}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
