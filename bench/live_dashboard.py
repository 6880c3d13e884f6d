"""Live-dashboard benchmark: the planner must be fast under live ingest.

Three servers on loopback ports chosen here, each with its own temporary data directory:

* ``on``   -- ``turboprom serve`` with the default planner config (``planner:`` only from
  ``--planner-config``, default none = defaults);
* ``off``  -- ``turboprom serve`` with ``planner: {enabled: false}``;
* ``prom`` -- Debian's Prometheus 2.42 with ``--web.enable-remote-write-receiver`` and no scrape jobs
  (``--skip-prometheus`` leaves it out).

A simulated vLLM fleet (bench/vllm_fleet.py: ~5,000 series, 63 engines x 79 series: three vLLM
histograms with vLLM's buckets, token / request counters with engine restarts, running / waiting /
KV-usage gauges) is written to all three by remote write 1.0 (snappy protobuf), the same bytes to each:

1. Preload: ``--history-hours`` (default 25 h) of history, at 60 s for everything older than the last
   70 min and at 5 s for those 70 min, in time order (so Prometheus's head accepts it), then a 5 s
   catch-up up to the wall clock. Nothing is queried during the preload.
2. Timed part (``--duration``): a writer sends one sample per series every 5 s stamped with the wall
   clock (each engine 0-5 s behind, like a scrape; the writes start half an interval out of phase with
   the refresh ticks), and a Grafana-like refresher refreshes the PANELS
   below: the ``1h`` dashboard over [now-1h, now] every 10 s, the ``24h`` one over [now-24h, now] every
   60 s. Start and end are floored to a multiple of the step, the step is Grafana's interval for a
   ~1000 px panel (``round_interval(range / 1000)``, min interval 15 s; >= range / 11000): 15 s for 1 h,
   60 s for 24 h. A write counts as written only on a 2xx answer (429 / 5xx / connection errors are
   retried with back-off within the tick; retries and failures are reported).

What is measured (black box, over HTTP; latency = request sent -> whole body received, successful
answers only, medians):

* per panel: ``on`` default ("served"), ``on`` with ``exact=true``, ``off``, ``prom``; split into cold
  refreshes (the panel's first refresh, a refresh after a gap of more than two refresh intervals, or one
  whose answer shows no step reuse) and warm ones (``infos`` say "N of T steps reused", or
  ``stats.turboprom.paths`` holds "steps:reused:N/T"). An answer is summary-served when one of its
  ``infos`` says "served from summary" (or a path is "summary:<sds>"); the fraction is reported per
  panel, and the warm refreshes a summary answered get a row of their own ("warm, summary": what a
  dashboard left open gets once its plan serves; the warm row also holds the refreshes before the
  plan was adopted and measured). Every query carries ``stats=1`` (basic stats, no per-step stats), on all servers alike, so
  the paths can be read. Ratios are ratios of medians over the refreshes where both were measured.
* exactness at every refresh: the served answer is compared value by value (same series, same
  timestamps, values within 1e-9 relative, NaN = NaN) with the ``exact=true`` answer of the same server,
  or, where no ``exact=true`` query is sent (see below), with the ``off`` server's answer (same writes,
  raw engine). The writer and the checker share a lock, so no write lands between the two answers of a
  compared pair; ``off`` answers in the other phase are compared only when no write started or ended
  in between (a seqlock on the write counter), else counted as skipped. Mismatches of answers that the
  ``infos`` say an approximate sketch served (kll / req / cpc / fi) are counted apart from the others
  (raw or exact summaries), which must never differ.
* server CPU (utime + stime of the process, /proc/PID/stat) and RSS (VmRSS sampled every 2 s, VmHWM at
  the end) of ``on`` vs ``off`` over the timed part; Prometheus's too.

CPU fairness (the choice made here): the timed part alternates blocks of ``--block-s`` (60 s) between
a *check* phase and a *clean* phase.
* check blocks: every refresh sends ``exact=true`` to ``on`` (the exactness pair) *and the same
  ``exact=true`` request to ``off``* (where it is the raw path like every query there), so both servers
  receive an identical request stream and identical writes: the CPU ratio over the whole timed part is
  fair, for a workload where every panel is asked twice, once forced raw.
* clean blocks: no ``exact=true`` anywhere, only the dashboard's own queries (identical on both), and
  the exactness check of each refresh is against ``off`` under the lock. The CPU ratio over clean blocks
  is the pure-dashboard figure. Work spilling over a block boundary (backfill, compaction) lands in the
  next block; the blocks alternate so both phases see every stage of the run.
Queries run one at a time (one refresher thread), so latencies of the servers do not overlap each
other; only writes and the servers' own background work run concurrently (on 2 cores, a server's
background work -- e.g. the planner's backfill -- also slows the other servers' answers). Within a
refresh, the compared requests (served / ``exact=true``, served / ``off``) swap order at every refresh
of a panel: the first request after the refresher's idle gap pays the wake-up of an idle process
(~1 ms here), the one right after it does not, and a fixed order would charge that to one path only.
A panel's first refresh (its cold row) also warms the data it reads for the second request (decoded
block row groups, the head's runs): which path goes first there alternates across the panels (odd
panels start with the reference), so the cold rows are not all charged to one path. A refresh that
starts late (the previous one overran its interval) is counted. At every block boundary the refresh
ticks move by ``--phase-shift-s`` (1.3 s; that interval is 11.3 s, still warm), so over a run the
refreshes meet every phase of the 15 s step grid and of the 5 s writes -- where a refresh falls just
after a step boundary, the next write still carries samples inside that step's window (engines' scrape
offsets span the whole 5 s), which is what stresses a step cache under live ingest.

    .venv/bin/python bench/live_dashboard.py [--quick] [--duration 600] [--series 5000]
        [--history-hours 25] [--planner-config '{"canary_fraction": 0}'] [--skip-prometheus]
        [--out bench/live_dashboard_results.json]

The machine is shared (2 cores, three servers, the writer and this client): medians and same-run
ratios only.
"""
from __future__ import annotations

import argparse
import ctypes
import http.client
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from vllm_fleet import Encoder, Fleet, self_check

# --- the dashboard ------------------------------------------------------------------------------
# (panel id, dashboard, PromQL) -- vLLM's Grafana dashboard queries, literal ranges
PANELS = [
    ("ttft_p99", "1h", "histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket[5m])))"),
    ("gen_tokens_rate", "1h", "sum by (model_name) (rate(vllm:generation_tokens_total[5m]))"),
    ("kv_usage_avg", "1h", "avg by (model_name) (avg_over_time(vllm:kv_cache_usage_perc[5m]))"),
    ("waiting_max", "1h", "max by (instance) (max_over_time(vllm:num_requests_waiting[1m]))"),
    ("running_sum", "1h", "sum by (model_name) (vllm:num_requests_running)"),
    ("e2e_p50", "1h", "histogram_quantile(0.5, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket[5m])))"),
    ("waiting_q90", "1h", "max by (model_name) (quantile_over_time(0.9, vllm:num_requests_waiting[10m]))"),
    ("itl_p95", "1h", "histogram_quantile(0.95, sum by (le, model_name) (rate(vllm:inter_token_latency_seconds_bucket[5m])))"),
    ("success_1h", "24h", "sum by (model_name) (increase(vllm:request_success_total[1h]))"),
    ("ttft_p99_1h", "24h", "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[1h])))"),
]
# dashboard -> (time range s, refresh interval s)
DASHBOARDS = {"1h": (3600, 10), "24h": (86400, 60)}
PANEL_WIDTH_PX = 1000
MIN_INTERVAL_S = 15  # the datasource's scrape interval / Grafana's min interval
WRITE_INTERVAL_S = 5
COARSE_S, FINE_S, FINE_MIN = 60, 5, 70  # history resolution: 60 s, then 5 s for the last 70 min
REL_TOL = 1e-9
SERVERS = ("on", "off", "prom")
PATHS = ("served", "exact", "off", "off_exact", "prom")

_REUSE_RX = re.compile(r"(\d+) of (\d+) steps reused")
_ALG_RX = re.compile(r"algorithm (\w+)")
APPROX_ALGORITHMS = {"kll", "req", "cpc", "fi"}  # sketches; exact / group panes must equal the raw path


def round_interval(ms: float) -> int:
    """Grafana's rangeutil.roundInterval (ms -> a 'nice' interval in ms)."""
    table = [(15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1500, 1000), (3500, 2000),
             (7500, 5000), (12500, 10000), (17500, 15000), (25000, 20000), (45000, 30000), (90000, 60000),
             (450000, 300000), (900000, 600000), (1200000, 900000), (1800000, 1200000), (3600000, 1800000),
             (7200000, 3600000), (21600000, 10800000), (86400000, 43200000), (604800000, 86400000),
             (1814400000, 604800000), (3628800000, 2592000000)]
    for bound, val in table:
        if ms < bound:
            return val
    return 31536000000


def grafana_step(range_s: int, width_px: int = PANEL_WIDTH_PX, min_interval_s: int = MIN_INTERVAL_S) -> int:
    """The step Grafana's Prometheus datasource sends for a panel of ``width_px`` over ``range_s``."""
    step_s = max(round_interval(range_s * 1000 / width_px) / 1000, min_interval_s)
    step_s = max(step_s, math.ceil(range_s / 11000))  # the datasource's at-most-11000-points rule
    return int(step_s)


def aligned_range(now_s: float, range_s: int, step_s: int) -> tuple[int, int]:
    """Grafana's alignRange (UTC): start and end floored to a multiple of the step."""
    end = int(math.floor(now_s / step_s) * step_s)
    start = int(math.floor((now_s - range_s) / step_s) * step_s)
    return start, end


# --- processes ----------------------------------------------------------------------------------
def _die_with_parent() -> None:  # runs in the child before exec: SIGTERM it if this script dies
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def proc_status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Server:
    def __init__(self, name: str, work: Path, cmd_fn, ready_path: str = "/-/ready"):
        self.name = name
        self.port = free_port()
        self.data = work / f"{name}-data"
        self.work = work
        self.cmd_fn = cmd_fn
        self.ready_path = ready_path
        self.proc: subprocess.Popen | None = None
        self.log_path = work / f"{name}.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, env: dict[str, str] | None = None, timeout: float = 120.0) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd_fn(self), cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, preexec_fn=_die_with_parent)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; log:\n{self.tail_log()}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", self.ready_path)
                r = c.getresponse()
                r.read()
                c.close()
                if r.status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"{self.name} not ready within {timeout}s; log:\n{self.tail_log()}")

    def tail_log(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def cpu_s(self) -> float:
        return proc_cpu_s(self.pid)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if getattr(self, "_log", None):
            self._log.close()


def ensure_prometheus() -> str:
    path = "/usr/bin/prometheus"
    if os.path.exists(path):
        return path
    if os.geteuid() != 0:
        raise SystemExit("prometheus is not installed (apt-get install -y prometheus as root) or pass --skip-prometheus")
    subprocess.run(["apt-get", "install", "-y", "prometheus"], check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if not os.path.exists(path):
        raise SystemExit("apt-get install prometheus did not provide /usr/bin/prometheus")
    return path


# --- HTTP ---------------------------------------------------------------------------------------
class Client:
    """One keep-alive connection to one server (not thread-safe: one per thread)."""

    def __init__(self, port: int):
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float = 60.0) -> tuple[int, bytes, float]:
        """(status, body, seconds); a broken keep-alive connection is retried once on a new one."""
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
            try:
                if self.conn.sock is not None:
                    self.conn.sock.settimeout(timeout)
                else:
                    self.conn.timeout = timeout
                t0 = time.perf_counter()
                self.conn.request(method, path, body=body, headers=headers or {})
                r = self.conn.getresponse()
                data = r.read()
                dt = time.perf_counter() - t0
                if r.getheader("Connection", "").lower() == "close":
                    self.close()
                return r.status, data, dt
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt:
                    raise
            except Exception:
                self.close()
                raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


RW_HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
              "X-Prometheus-Remote-Write-Version": "0.1.0"}


@dataclass
class WriteStats:
    requests: int = 0
    ok: int = 0
    samples_ok: int = 0
    retries: int = 0
    failures: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        return {"requests": self.requests, "ok": self.ok, "samples_written": self.samples_ok, "retries": self.retries,
                "failures": self.failures, "p50_ms": 1000 * statistics.median(lat) if lat else None,
                "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
                "first_errors": self.errors[:5]}


_tls = threading.local()


def _client(port: int) -> Client:
    d = getattr(_tls, "clients", None)
    if d is None:
        d = _tls.clients = {}
    if port not in d:
        d[port] = Client(port)
    return d[port]


def post_write(port: int, body: bytes, n_samples: int, stats: WriteStats, budget_s: float) -> bool:
    """Remote write with retries on 429 / 5xx / connection errors until ``budget_s`` is spent."""
    deadline = time.time() + budget_s
    attempt = 0
    stats.requests += 1
    while True:
        try:
            status, data, dt = _client(port).request("POST", "/api/v1/write", body, RW_HEADERS,
                                                     timeout=max(1.0, deadline - time.time() + 5))
            if 200 <= status < 300:
                stats.ok += 1
                stats.samples_ok += n_samples
                stats.latencies.append(dt)
                return True
            msg = f"HTTP {status}: {data[:200]!r}"
            retry = status == 429 or status >= 500
        except OSError as e:
            msg, retry = f"{type(e).__name__}: {e}", True
        if not retry or time.time() + 0.2 * (attempt + 1) > deadline:
            stats.failures += 1
            if len(stats.errors) < 20:
                stats.errors.append(msg)
            return False
        stats.retries += 1
        time.sleep(0.2 * (attempt + 1))
        attempt += 1


# --- query results ------------------------------------------------------------------------------
def parse_matrix(doc: dict) -> dict[tuple, tuple[list[float], list[float]]]:
    out = {}
    for s in doc["data"]["result"]:
        pts = s.get("values") or ([s["value"]] if "value" in s else [])
        out[tuple(sorted(s["metric"].items()))] = ([float(p[0]) for p in pts], [float(p[1]) for p in pts])
    return out


def compare(a: dict, b: dict) -> tuple[bool, str, float, float | None]:
    """(equal within REL_TOL, description of the first difference, max relative difference, the step
    time of the first difference)."""
    ma, mb = parse_matrix(a), parse_matrix(b)
    if ma.keys() != mb.keys():
        only_a, only_b = ma.keys() - mb.keys(), mb.keys() - ma.keys()
        ex = dict(next(iter(only_a or only_b)))
        return False, f"series sets differ: {len(only_a)} only served, {len(only_b)} only reference (e.g. {ex})", math.inf, None
    worst = 0.0
    first = ""
    t_first = None
    bad_points: list[float] = []
    for k in ma:
        (ta, va), (tb, vb) = ma[k], mb[k]
        if ta != tb:
            return False, f"timestamps differ for {dict(k)}: {len(ta)} vs {len(tb)} points", math.inf, None
        for t, x, y in zip(ta, va, vb):
            if x == y or (math.isnan(x) and math.isnan(y)):
                continue
            rel = abs(x - y) / max(abs(x), abs(y)) if not (math.isinf(x) or math.isinf(y)) else math.inf
            worst = max(worst, rel)
            if rel > REL_TOL:
                bad_points.append(t)
                if not first:
                    first = f"{dict(k)} at {t}: served {x!r} vs reference {y!r} (rel {rel:.3g})"
                    t_first = t
    if bad_points:
        first += f"; {len(bad_points)} points differ, steps {min(bad_points):.0f}..{max(bad_points):.0f}"
    return worst <= REL_TOL, first, worst, t_first


_PATH_REUSE_RX = re.compile(r"steps:reused:(\d+)/(\d+)")


def summary_info(doc: dict) -> tuple[bool, int, int, list[str]]:
    """(summary-served, steps reused, steps, algorithms of the serving SDSs) from the answer's infos
    ("served from summary ...; N of T steps reused from its step cache") and, where the server states
    them, ``stats.turboprom.paths`` ("summary:<sds>", "steps:reused:N/T" of reused step answers)."""
    served = False
    used = total = 0
    algs: set[str] = set()
    for info in doc.get("infos") or []:
        if "served from summary" not in info:
            continue
        served = True
        algs.update(_ALG_RX.findall(info))
        m = _REUSE_RX.search(info)
        if m:
            used += int(m.group(1))
            total += int(m.group(2))
    stats = (doc.get("data") or {}).get("stats") or {}
    for path in (stats.get("turboprom") or {}).get("paths") or []:
        if path.startswith("summary:"):
            served = True
        m = _PATH_REUSE_RX.match(path)
        if m:
            used += int(m.group(1))
            total += int(m.group(2))
    return served, used, total, sorted(algs)


# --- the run ------------------------------------------------------------------------------------
class WriteGate:
    """The writer/checker lock (FIFO, so a waiting writer is not starved by back-to-back checks) plus
    a seqlock counter: odd while a write is in flight."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._next = 0
        self._serving = 0
        self.seq = 0

    def acquire(self) -> None:
        with self._cv:
            me = self._next
            self._next += 1
            while self._serving != me:
                self._cv.wait()

    def release(self) -> None:
        with self._cv:
            self._serving += 1
            self._cv.notify_all()

    def __enter__(self) -> WriteGate:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="live-dashboard-"))
        self.fleet = Fleet.for_series(args.series, seed=args.seed)
        self.enc = Encoder(self.fleet.labels)
        self.S = self.fleet.num_series
        self.servers: dict[str, Server] = {}
        self.gate = WriteGate()
        self.stop_ev = threading.Event()
        self.pool = ThreadPoolExecutor(3, thread_name_prefix="post")  # one POST per server at a time
        self.pipe = ThreadPoolExecutor(1, thread_name_prefix="preload")  # the preload's request in flight
        self.preload_stats = {n: WriteStats() for n in SERVERS}
        self.live_stats = {n: WriteStats() for n in SERVERS}
        self.write_ticks = 0
        self.write_late_ticks = 0
        self.write_lock_wait: list[float] = []
        self.write_failed_on_tp = 0  # ticks where on or off did not take the write (answers may diverge)
        self.records: list[dict] = []
        self.errors: dict[str, list[str]] = {p: [] for p in PATHS}
        self.error_counts: dict[str, int] = {p: 0 for p in PATHS}
        self.mismatches: list[dict] = []
        self.rss: dict[str, list[int]] = {n: [] for n in SERVERS}
        self.rss_t: list[tuple[float, str, int]] = []  # (time, server, VmRSS bytes)
        self.cpu_marks: list[tuple[float, str, dict[str, float]]] = []
        self.late_refreshes = 0
        self.last_refresh: dict[str, float] = {}
        self.refresh_count: dict[str, int] = {}

    # servers -------------------------------------------------------------------------------
    def start_servers(self) -> None:
        a = self.args
        env = {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
        probe = subprocess.run([sys.executable, "-c", "import turboprom; print(turboprom.__file__)"], cwd=REPO, env=env,
                               capture_output=True, text=True, check=True).stdout.strip()
        if not Path(probe).resolve().is_relative_to(REPO.resolve()):
            raise SystemExit(f"turboprom imports from {probe}, not from this checkout {REPO}")
        print(f"[bench] turboprom code: {probe}", flush=True)
        planner_cfg = {}
        if a.planner_config:
            text = Path(a.planner_config).read_text() if os.path.exists(a.planner_config) else a.planner_config
            planner_cfg = yaml.safe_load(text) or {}
            if not isinstance(planner_cfg, dict):
                raise SystemExit("--planner-config must be a JSON/YAML mapping (the planner: section)")
        cfg_on = self.work / "on.yml"
        cfg_on.write_text(yaml.safe_dump({"planner": planner_cfg}) if planner_cfg else "{}\n")
        cfg_off = self.work / "off.yml"
        cfg_off.write_text(yaml.safe_dump({"planner": {"enabled": False}}))

        def tp_cmd(cfg: Path):
            return lambda s: [sys.executable, "-m", "turboprom", "serve", "--data-dir", str(s.data), "--listen",
                              f"127.0.0.1:{s.port}", "--config", str(cfg), "--wal-fsync", a.wal_fsync]

        self.servers["on"] = Server("on", self.work, tp_cmd(cfg_on))
        self.servers["off"] = Server("off", self.work, tp_cmd(cfg_off))
        if not a.skip_prometheus:
            prom_bin = ensure_prometheus()
            pcfg = self.work / "prometheus.yml"
            pcfg.write_text("global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n")  # no scrape jobs
            self.servers["prom"] = Server("prom", self.work, lambda s: [
                prom_bin, f"--config.file={pcfg}", f"--storage.tsdb.path={s.data}",
                f"--web.listen-address=127.0.0.1:{s.port}", "--web.enable-remote-write-receiver",
                "--storage.tsdb.retention.time=30d"])
        if a.port_on:
            self.servers["on"].port = a.port_on
        if a.port_off:
            self.servers["off"].port = a.port_off
        if a.port_prom and "prom" in self.servers:
            self.servers["prom"].port = a.port_prom
        for s in self.servers.values():
            s.start(env=env)
            print(f"[bench] {s.name} ready on 127.0.0.1:{s.port} (pid {s.pid})", flush=True)

    def stop_servers(self) -> None:
        for s in self.servers.values():
            try:
                s.stop()
            except Exception as e:  # noqa: BLE001 - stop the others anyway
                print(f"[bench] stopping {s.name}: {e}", flush=True)

    # writes --------------------------------------------------------------------------------
    def post_all(self, body: bytes, n_samples: int, stats: dict[str, WriteStats], budget_s: float) -> dict[str, bool]:
        futs = {n: self.pool.submit(post_write, s.port, body, n_samples, stats[n], budget_s) for n, s in self.servers.items()}
        return {n: f.result() for n, f in futs.items()}

    def preload(self) -> dict[str, Any]:
        a = self.args
        now_ms = int(time.time() * 1000)
        hist_start = now_ms - int(a.history_hours * 3_600_000)
        fine_start = max(hist_start, now_ms - FINE_MIN * 60_000)
        coarse = np.arange(hist_start, fine_start, COARSE_S * 1000, dtype=np.int64)
        fine = np.arange(fine_start, now_ms + 1, FINE_S * 1000, dtype=np.int64)
        per_req = max(1, a.samples_per_request // self.S)
        chunks = [c for grid in (coarse, fine) if len(grid) for c in np.array_split(grid, math.ceil(len(grid) / per_req))]
        ts, vals = self.fleet.step(chunks[0])
        self_check(self.fleet, self.enc, ts, vals)  # the hand-built payload decodes to the same arrays
        print(f"[bench] preload: {self.S} series, {len(coarse)} points at {COARSE_S}s + {len(fine)} at {FINE_S}s "
              f"= {self.S * (len(coarse) + len(fine)):,} samples per server, {len(chunks)} requests", flush=True)
        t0 = time.time()
        pending = None
        sent = 0
        deadline = t0 + a.max_preload_s
        for i, ch in enumerate(chunks):
            if i:
                ts, vals = self.fleet.step(ch)
            body = self.enc.body(ts, vals)
            if pending is not None:
                self._check_preload(pending.result())
            pending = self.pipe.submit(self.post_all, body, vals.size, self.preload_stats, 120.0)
            sent += vals.size
            if time.time() > deadline:
                raise TimeoutError(f"preload exceeded --max-preload-s {a.max_preload_s}")
            if i % 50 == 0:
                print(f"[bench]   preload {i + 1}/{len(chunks)} requests, {time.time() - t0:.0f}s", flush=True)
        self._check_preload(pending.result())
        # catch up to the wall clock at 5 s
        last = int(chunks[-1][-1])
        n_catch = 0
        while True:
            now = int(time.time() * 1000)
            grid = np.arange(last + FINE_S * 1000, now + 1, FINE_S * 1000, dtype=np.int64)
            if len(grid) == 0:
                break
            for ch in np.array_split(grid, math.ceil(len(grid) / per_req)):
                ts, vals = self.fleet.step(ch)
                self._check_preload(self.post_all(self.enc.body(ts, vals), vals.size, self.preload_stats, 60.0))
                sent += vals.size
                n_catch += len(ch)
            last = int(grid[-1])
            if now - last < FINE_S * 1000:
                break
        wall = time.time() - t0
        out = {"samples_per_server": sent, "catch_up_points": n_catch, "wall_s": wall,
               "servers": {n: st.as_dict() for n, st in self.preload_stats.items()}}
        print(f"[bench] preload done: {sent:,} samples per server in {wall:.0f}s (+{n_catch} catch-up points)", flush=True)
        return out

    def _check_preload(self, ok: dict[str, bool]) -> None:
        bad = [n for n, v in ok.items() if not v]
        if bad:
            raise RuntimeError(f"preload write failed on {bad}: {[self.preload_stats[n].errors[-1:] for n in bad]}")

    def writer(self, t_first: float) -> None:
        next_t = t_first
        while not self.stop_ev.is_set():
            wait = next_t - time.time()
            if wait > 0 and self.stop_ev.wait(wait):
                break
            if time.time() - next_t > WRITE_INTERVAL_S:  # missed whole ticks (the lock was held too long)
                missed = int((time.time() - next_t) // WRITE_INTERVAL_S)
                self.write_late_ticks += missed
                next_t += missed * WRITE_INTERVAL_S
            t_want = time.perf_counter()
            with self.gate:
                self.write_lock_wait.append(time.perf_counter() - t_want)
                self.gate.seq += 1  # odd: a write is in flight
                try:
                    ts, vals = self.fleet.step(np.array([int(time.time() * 1000)], np.int64))
                    ok = self.post_all(self.enc.body(ts, vals), vals.size, self.live_stats, WRITE_INTERVAL_S - 1.0)
                    self.write_ticks += 1
                    if not (ok.get("on") and ok.get("off")):
                        self.write_failed_on_tp += 1
                finally:
                    self.gate.seq += 1
            next_t += WRITE_INTERVAL_S

    def monitor(self) -> None:
        while not self.stop_ev.wait(2.0):
            now = time.time()
            for n, s in self.servers.items():
                kb = proc_status_kb(s.pid, "VmRSS")
                if kb:
                    self.rss[n].append(kb * 1024)
                    self.rss_t.append((now, n, kb * 1024))

    # queries -------------------------------------------------------------------------------
    def query(self, client: Client, path_name: str, params: dict, deadline: float) -> tuple[dict | None, float | None]:
        qs = urllib.parse.urlencode(params)
        try:
            status, body, dt = client.request("GET", f"/api/v1/query_range?{qs}", timeout=max(5.0, deadline - time.time()))
            doc = json.loads(body) if body else {}
            if status == 200 and doc.get("status") == "success":
                return doc, dt
            msg = f"HTTP {status}: {body[:300]!r}"
        except Exception as e:  # noqa: BLE001 - counted, reported
            msg = f"{type(e).__name__}: {e}"
        self.error_counts[path_name] += 1
        if len(self.errors[path_name]) < 10:
            self.errors[path_name].append(f"{params.get('query')}: {msg}")
        return None, None

    def refresh(self, clients: dict[str, Client], pid: str, dash: str, q: str, now_s: float, phase: str,
                deadline: float) -> None:
        range_s, refresh_s = DASHBOARDS[dash]
        step = grafana_step(range_s)
        start, end = aligned_range(now_s, range_s, step)
        # stats=1 (basic stats, not per-step) on every server alike: TurboProm states its paths there
        params = {"query": q, "start": start, "end": end, "step": step, "stats": "1"}
        exact = dict(params, exact="true")
        prev = self.last_refresh.get(pid)
        self.last_refresh[pid] = now_s
        rec: dict[str, Any] = {"panel": pid, "t": now_s, "phase": phase, "start": start, "end": end, "step": step,
                               "gap": prev is None or now_s - prev > 2 * refresh_s, "lat": {}}
        docs: dict[str, dict | None] = {}

        def run(name: str, server: str, p: dict) -> None:
            doc, dt = self.query(clients[server], name, p, deadline)
            docs[name] = doc
            if dt is not None:
                rec["lat"][name] = dt

        # which of a compared pair goes first alternates per refresh of the panel: the first request
        # after the refresher's idle gap pays the wake-ups of both processes, the second one does not
        first_ref = [p for p, _, _ in PANELS].index(pid) % 2  # odd panels: the reference first on refresh 0
        flip = (self.refresh_count.get(pid, 0) + first_ref) % 2 == 1
        self.refresh_count[pid] = self.refresh_count.get(pid, 0) + 1
        rec["served_first"] = not flip
        if phase == "check":
            with self.gate:
                seq0 = self.gate.seq  # even and constant while the gate is held
                for name, p in ((("exact", exact), ("served", params)) if flip else (("served", params), ("exact", exact))):
                    run(name, "on", p)
            for name, p in ((("off_exact", exact), ("off", params)) if flip else (("off", params), ("off_exact", exact))):
                run(name, "off", p)  # off_exact mirrors the exact=true load (see the docstring)
            off_valid = seq0 == self.gate.seq
        else:
            with self.gate:
                for name, server in ((("off", "off"), ("served", "on")) if flip else (("served", "on"), ("off", "off"))):
                    run(name, server, params)
            off_valid = True
        if "prom" in clients:
            run("prom", "prom", params)
        served_doc = docs.get("served")
        served, used, total, algs = summary_info(served_doc) if served_doc else (False, 0, 0, [])
        rec.update(served=served, steps_reused=used, steps=total, algorithms=algs)
        approx = bool(APPROX_ALGORITHMS & set(algs))
        rec["cold"] = bool(rec["gap"] or used == 0)
        for ref, valid in (("exact", True), ("off", off_valid)):
            if served_doc is None or docs.get(ref) is None:
                rec[f"cmp_{ref}"] = None
                continue
            if not valid:
                rec[f"cmp_{ref}"] = "skipped"
                continue
            ok, why, worst, t_bad = compare(served_doc, docs[ref])
            rec[f"cmp_{ref}"] = "ok" if ok else ("mismatch_sketch" if approx else "mismatch")
            rec[f"maxrel_{ref}"] = worst
            if not ok:
                self.mismatches.append({"panel": pid, "vs": ref, "phase": phase, "time": now_s, "served": served,
                                        "algorithms": algs, "sketch": approx, "start": start, "end": end, "step": step,
                                        # where the first bad step sits: 0 = the newest step of this refresh
                                        "step_from_end_s": None if t_bad is None else t_bad - end,
                                        "refresh_after_end_s": round(now_s - end, 3), "detail": why})
                if sum(m["sketch"] == approx for m in self.mismatches) <= 3:  # the first few of each kind
                    print(f"[bench] MISMATCH {pid} vs {ref} (served by {algs or 'raw'}): {why}", flush=True)
        self.records.append(rec)

    def refresher(self, t_start: float, duration: float) -> None:
        """Each dashboard on its own refresh schedule; a refresh due while another one runs starts late
        (counted); whole missed intervals are skipped, like a browser tab that was busy."""
        clients = {n: Client(s.port) for n, s in self.servers.items()}
        deadline = t_start + duration
        next_due = {d: t_start for d in DASHBOARDS}
        block = -1
        try:
            while not self.stop_ev.is_set():
                now = time.time()
                if now >= deadline:
                    break
                due = [d for d in DASHBOARDS if next_due[d] <= now]
                if not due:
                    if self.stop_ev.wait(max(0.0, min(min(next_due.values()), deadline) - now)):
                        break
                    continue
                b = int((now - t_start) // self.args.block_s)
                phase = "check" if b % 2 == 0 else "clean"
                if b != block:
                    self.mark_cpu(phase)
                    if block >= 0 and self.args.phase_shift_s:  # move the refresh phase (see the docstring)
                        for d in next_due:
                            next_due[d] += self.args.phase_shift_s
                    block = b
                    continue
                for d in due:
                    refresh_s = DASHBOARDS[d][1]
                    if now - next_due[d] > 1.0:
                        self.late_refreshes += 1
                    while next_due[d] <= now:
                        next_due[d] += refresh_s
                for d in due:
                    now_s = time.time()  # Grafana computes [now - range, now] when the dashboard refreshes
                    for pid, dash, q in PANELS:
                        if dash != d or time.time() >= deadline:
                            continue
                        self.refresh(clients, pid, dash, q, now_s, phase, deadline + 30)
        finally:
            for c in clients.values():
                c.close()

    def mark_cpu(self, phase: str) -> None:
        self.cpu_marks.append((time.time(), phase, {n: s.cpu_s() for n, s in self.servers.items()}))

    def planner_api(self, what: str) -> Any:
        """``data`` of the planner-on server's ``/api/v1/planner/<what>`` (plans; candidates with their
        last adoption decision), or None."""
        try:
            status, body, _ = Client(self.servers["on"].port).request("GET", f"/api/v1/planner/{what}", timeout=60)
            return json.loads(body)["data"] if status == 200 else None
        except Exception as e:  # noqa: BLE001
            print(f"[bench] {what}: {e}", flush=True)
            return None

    def run(self) -> dict[str, Any]:
        a = self.args
        res: dict[str, Any] = {"config": vars(a), "series": self.S, "instances": self.fleet.n_instances,
                               "panels": [{"id": p, "dashboard": d, "query": q, "range_s": DASHBOARDS[d][0],
                                           "refresh_s": DASHBOARDS[d][1], "step_s": grafana_step(DASHBOARDS[d][0])}
                                          for p, d, q in PANELS]}
        try:
            self.start_servers()
            res["ports"] = {n: s.port for n, s in self.servers.items()}
            res["preload"] = self.preload()
            plans0 = self.planner_api("plans")
            t_start = time.time()
            # writes every 5 s, half an interval out of phase with the refreshes (which start on 10 s ticks)
            threads = [threading.Thread(target=self.writer, args=(t_start + WRITE_INTERVAL_S / 2,), name="writer", daemon=True),
                       threading.Thread(target=self.monitor, name="monitor", daemon=True)]
            self.mark_cpu("start")
            for t in threads:
                t.start()
            print(f"[bench] timed part: {a.duration:.0f}s, blocks of {a.block_s:.0f}s alternating check/clean", flush=True)
            rt = threading.Thread(target=self.refresher, args=(t_start, a.duration), name="refresher", daemon=True)
            rt.start()
            last_print = t_start
            while rt.is_alive():
                rt.join(5.0)
                if time.time() - last_print >= 60:
                    last_print = time.time()
                    n_served = sum(r["served"] for r in self.records)
                    print(f"[bench]   t+{time.time() - t_start:.0f}s: {len(self.records)} refreshes ({n_served} summary-served), "
                          f"{self.write_ticks} writes, {len(self.mismatches)} mismatches", flush=True)
                if time.time() > t_start + a.duration + 120:
                    print("[bench] refresher did not stop in time; abandoning it", flush=True)
                    break
            self.mark_cpu("end")
            self.stop_ev.set()
            for t in threads:
                t.join(15.0)
            res["timed_s"] = time.time() - t_start
            plans1 = self.planner_api("plans")
            res["plans"] = plans1
            res["candidates"] = self.planner_api("candidates")
            if plans0 and plans1:
                res["summarizer_cpu_s"] = plans1["summarizer"]["cpu_seconds"] - plans0["summarizer"]["cpu_seconds"]
            res["hwm_bytes"] = {n: proc_status_kb(s.pid, "VmHWM") * 1024 for n, s in self.servers.items()}
        finally:
            self.stop_ev.set()
            self.stop_servers()
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pipe.shutdown(wait=False, cancel_futures=True)
            if not a.keep:
                shutil.rmtree(self.work, ignore_errors=True)
            else:
                print(f"[bench] kept {self.work}", flush=True)
        res.update(self.summarize())
        return res

    # results -------------------------------------------------------------------------------
    def summarize(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        panels = {}
        for pid, dash, q in PANELS:
            recs = [r for r in self.records if r["panel"] == pid]
            d: dict[str, Any] = {"refreshes": len(recs), "served_fraction": _frac([r["served"] for r in recs]),
                                 "reuse_fraction": _frac([r["steps_reused"] > 0 for r in recs]),
                                 "algorithms": sorted({a for r in recs for a in r["algorithms"]}),
                                 "mismatch_exact": sum(r.get("cmp_exact") == "mismatch" for r in recs),
                                 "mismatch_off": sum(r.get("cmp_off") == "mismatch" for r in recs),
                                 "sketch_mismatch_exact": sum(r.get("cmp_exact") == "mismatch_sketch" for r in recs),
                                 "sketch_mismatch_off": sum(r.get("cmp_off") == "mismatch_sketch" for r in recs),
                                 "checked_exact": sum(str(r.get("cmp_exact")).startswith(("ok", "mismatch")) for r in recs),
                                 "checked_off": sum(str(r.get("cmp_off")).startswith(("ok", "mismatch")) for r in recs),
                                 "skipped_off": sum(r.get("cmp_off") == "skipped" for r in recs),
                                 "max_rel_exact": max((r.get("maxrel_exact", 0.0) for r in recs), default=0.0),
                                 "max_rel_off": max((r.get("maxrel_off", 0.0) for r in recs), default=0.0)}
            # "warm, summary": the warm refreshes a summary answered (a plan is adopted and measured
            # only after a few refreshes, so the warm row of a short run mixes in the refreshes
            # before it, answered from step answers and raw; this row is what a dashboard left open
            # gets once the plan serves)
            for cls, sel in (("all", recs), ("cold", [r for r in recs if r["cold"]]), ("warm", [r for r in recs if not r["cold"]]),
                             ("warm, summary", [r for r in recs if not r["cold"] and r["served"]])):
                d[cls] = {"n": len(sel), **{f"{p}_p50_ms": _p50(sel, p) for p in PATHS}}
                for other in ("exact", "off", "prom"):
                    d[cls][f"served/{other}"] = _ratio(sel, "served", other)
            panels[pid] = d
        out["panel_results"] = panels
        # CPU by phase: the interval from one mark to the next belongs to the phase of the first mark;
        # "start" -> the first block mark is part of the total only, "end" closes the timed part
        cpu = {ph: {n: 0.0 for n in self.servers} for ph in ("check", "clean", "total")}
        secs = {"check": 0.0, "clean": 0.0, "total": 0.0}
        end_i = next((i for i, m in enumerate(self.cpu_marks) if m[1] == "end"), len(self.cpu_marks) - 1)
        marks = self.cpu_marks[:end_i + 1]
        for (t0, ph, c0), (t1, _, c1) in zip(marks, marks[1:]):
            for key in ("total", ph):
                if key in cpu:
                    secs[key] += t1 - t0
                    for n in self.servers:
                        cpu[key][n] += c1[n] - c0[n]
        # the same per block (time profile: adoption, backfill and retirement show up where they happen)
        blocks = []
        for (t0, ph, c0), (t1, _, c1) in zip(marks, marks[1:]):
            if ph not in ("check", "clean"):
                continue
            rss_max = {n: max((b for t, m, b in self.rss_t if m == n and t0 <= t < t1), default=None) for n in self.servers}
            blocks.append({"from_s": round(t0 - marks[0][0], 1), "to_s": round(t1 - marks[0][0], 1), "phase": ph,
                           "cpu_s": {n: round(c1[n] - c0[n], 2) for n in self.servers}, "rss_max_bytes": rss_max})
        out["cpu_blocks"] = blocks
        out["cpu_s"] = cpu
        out["cpu_wall_s"] = secs
        out["cpu_ratio_on_off"] = {ph: (cpu[ph]["on"] / cpu[ph]["off"]) if cpu[ph].get("off") else None for ph in cpu}
        out["rss"] = {n: {"median_bytes": statistics.median(v) if v else None, "max_bytes": max(v) if v else None}
                      for n, v in self.rss.items() if n in self.servers}
        if self.rss["on"] and self.rss["off"]:
            out["rss_ratio_on_off"] = {"median": statistics.median(self.rss["on"]) / statistics.median(self.rss["off"]),
                                       "max": max(self.rss["on"]) / max(self.rss["off"])}
        out["writes"] = {"ticks": self.write_ticks, "late_ticks": self.write_late_ticks,
                         "ticks_not_taken_by_on_or_off": self.write_failed_on_tp,
                         "lock_wait_p50_ms": 1000 * statistics.median(self.write_lock_wait) if self.write_lock_wait else None,
                         "lock_wait_max_ms": 1000 * max(self.write_lock_wait) if self.write_lock_wait else None,
                         "servers": {n: st.as_dict() for n, st in self.live_stats.items() if n in self.servers}}
        out["query_errors"] = {"counts": self.error_counts, "first": {k: v for k, v in self.errors.items() if v}}
        out["mismatches"] = {"count_vs_exact": sum(1 for m in self.mismatches if m["vs"] == "exact" and not m["sketch"]),
                             "count_vs_off": sum(1 for m in self.mismatches if m["vs"] == "off" and not m["sketch"]),
                             "sketch_served_vs_exact": sum(1 for m in self.mismatches if m["vs"] == "exact" and m["sketch"]),
                             "sketch_served_vs_off": sum(1 for m in self.mismatches if m["vs"] == "off" and m["sketch"]),
                             "first": [m for m in self.mismatches if not m["sketch"]][:200]
                             + [m for m in self.mismatches if m["sketch"]][:50]}
        out["late_refreshes"] = self.late_refreshes
        out["records"] = self.records
        return out


def _frac(xs: list[bool]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _p50(recs: list[dict], path: str) -> float | None:
    v = [r["lat"][path] for r in recs if path in r["lat"]]
    return 1000 * statistics.median(v) if v else None


def _ratio(recs: list[dict], a: str, b: str) -> float | None:
    both = [r for r in recs if a in r["lat"] and b in r["lat"]]
    if not both:
        return None
    return statistics.median(r["lat"][a] for r in both) / statistics.median(r["lat"][b] for r in both)


# --- report -------------------------------------------------------------------------------------
def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}"


def render(res: dict[str, Any]) -> str:
    L = []
    c = res["config"]
    L.append(f"live dashboard: {res['series']} series ({res['instances']} vLLM engines), history {c['history_hours']}h, "
             f"timed {res.get('timed_s', 0):.0f}s, writes every {WRITE_INTERVAL_S}s; planner config "
             f"{c['planner_config'] or 'defaults'}")
    L.append("")
    L.append("| panel | range/step | class | n | summary % | reuse % | served ms | exact ms | off ms | prom ms "
             "| served/exact | served/off | served/prom |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in res["panels"]:
        d = res["panel_results"][p["id"]]
        for cls in ("cold", "warm", "warm, summary"):
            x = d.get(cls)
            if x is None or (cls == "warm, summary" and not x["n"]):
                continue
            L.append(f"| {p['id']} | {p['dashboard']}/{p['step_s']}s | {cls} | {x['n']} | "
                     f"{_pct(d['served_fraction'])} | {_pct(d['reuse_fraction'])} | "
                     f"{_f(x['served_p50_ms'])} | {_f(x['exact_p50_ms'])} | {_f(x['off_p50_ms'])} | {_f(x['prom_p50_ms'])} | "
                     f"{_f(x['served/exact'], '{:.2f}')} | {_f(x['served/off'], '{:.2f}')} | {_f(x['served/prom'], '{:.2f}')} |")
    L.append("")
    L.append("| panel | served by | checked vs exact | mismatches (sketch) | max rel | checked vs off | mismatches (sketch) "
             "| skipped | max rel |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for p in res["panels"]:
        d = res["panel_results"][p["id"]]
        L.append(f"| {p['id']} | {','.join(d['algorithms']) or 'raw'} | {d['checked_exact']} | {d['mismatch_exact']} "
                 f"({d['sketch_mismatch_exact']}) | {d['max_rel_exact']:.2g} | {d['checked_off']} | {d['mismatch_off']} "
                 f"({d['sketch_mismatch_off']}) | {d['skipped_off']} | {d['max_rel_off']:.2g} |")
    L.append("")
    cpu, secs, ratio = res["cpu_s"], res["cpu_wall_s"], res["cpu_ratio_on_off"]
    L.append("| server CPU s | " + " | ".join(f"{ph} ({secs[ph]:.0f}s wall)" for ph in ("total", "check", "clean")) + " |")
    L.append("|---|---|---|---|")
    for n in cpu["total"]:
        L.append(f"| {n} | " + " | ".join(f"{cpu[ph][n]:.1f}" for ph in ("total", "check", "clean")) + " |")
    L.append("| on/off | " + " | ".join(_f(ratio[ph], "{:.2f}") for ph in ("total", "check", "clean")) + " |")
    if res.get("cpu_blocks"):
        L.append("")
        L.append("| block | phase | " + " | ".join(f"{n} CPU s" for n in cpu["total"]) + " | on/off | "
                 + " | ".join(f"{n} max RSS MB" for n in cpu["total"]) + " |")
        L.append("|---|---|" + "---|" * (2 * len(cpu["total"]) + 1))
        for b in res["cpu_blocks"]:
            c = b["cpu_s"]
            rr = b["rss_max_bytes"]
            L.append(f"| {b['from_s']:.0f}-{b['to_s']:.0f}s | {b['phase']} | " + " | ".join(f"{c[n]:.1f}" for n in c)
                     + f" | {_f(c['on'] / c['off'] if c.get('off') else None, '{:.2f}')} | "
                     + " | ".join(_f(rr[n] and rr[n] / 2**20, "{:.0f}") for n in rr) + " |")
    L.append("")
    L.append("| RSS MB | median | max | VmHWM |")
    L.append("|---|---|---|---|")
    for n, r in res["rss"].items():
        L.append(f"| {n} | {_f(r['median_bytes'] and r['median_bytes'] / 2**20, '{:.0f}')} | "
                 f"{_f(r['max_bytes'] and r['max_bytes'] / 2**20, '{:.0f}')} | {res.get('hwm_bytes', {}).get(n, 0) / 2**20:.0f} |")
    if "rss_ratio_on_off" in res:
        rr = res["rss_ratio_on_off"]
        L.append(f"| on/off | {rr['median']:.2f} | {rr['max']:.2f} | "
                 f"{_f(res['hwm_bytes']['on'] / res['hwm_bytes']['off'] if res.get('hwm_bytes', {}).get('off') else None, '{:.2f}')} |")
    L.append("")
    w = res["writes"]
    L.append(f"writes: {w['ticks']} ticks ({w['late_ticks']} late ticks skipped, {w['ticks_not_taken_by_on_or_off']} not taken by on/off), "
             f"lock wait p50 {_f(w['lock_wait_p50_ms'])} ms max {_f(w['lock_wait_max_ms'])} ms")
    for n, st in w["servers"].items():
        L.append(f"  {n}: {st['ok']}/{st['requests']} ok, {st['samples_written']:,} samples, {st['retries']} retries, "
                 f"{st['failures']} failures, p50 {_f(st['p50_ms'])} ms p99 {_f(st['p99_ms'])} ms {st['first_errors'][:2]}")
    pre = res.get("preload", {})
    if pre:
        L.append(f"preload: {pre['samples_per_server']:,} samples per server in {pre['wall_s']:.0f}s; " + ", ".join(
            f"{n} {st['ok']}/{st['requests']} ok {st['retries']} retries {st['failures']} failures" for n, st in pre["servers"].items()))
    if "summarizer_cpu_s" in res:
        L.append(f"planner-on summarizer CPU during the timed part: {res['summarizer_cpu_s']:.1f}s")
    L.append(f"late refreshes: {res['late_refreshes']}; query errors: {res['query_errors']['counts']}")
    for k, v in res["query_errors"]["first"].items():
        L.append(f"  {k}: {v[:3]}")
    m = res["mismatches"]
    L.append(f"mismatches (1e-9 relative): {m['count_vs_exact']} vs exact=true and {m['count_vs_off']} vs planner-off on answers "
             f"served raw or by exact summaries; {m['sketch_served_vs_exact']} / {m['sketch_served_vs_off']} on answers served "
             f"by an approximate sketch ({'/'.join(sorted(APPROX_ALGORITHMS))})")
    for sketch in (False, True):
        for x in [x for x in m["first"] if x["sketch"] == sketch][:4]:
            L.append(f"  {x['panel']} vs {x['vs']} ({x['phase']}, served by {x['algorithms'] or 'raw'}, refresh "
                     f"{x.get('refresh_after_end_s')}s after its end, first bad step at end{x.get('step_from_end_s'):+.0f}s): "
                     f"{x['detail']}" if x.get("step_from_end_s") is not None else
                     f"  {x['panel']} vs {x['vs']} ({x['phase']}, served by {x['algorithms'] or 'raw'}): {x['detail']}")
    bad = [x for x in m["first"] if not x["sketch"] and x.get("step_from_end_s") is not None]
    if bad:
        newest = sum(1 for x in bad if x["step_from_end_s"] == 0)
        L.append(f"  of {len(bad)} listed non-sketch mismatches, {newest} first differ at the refresh's newest step, "
                 f"{len(bad) - newest} at an older (step-cache reusable) step")
    plans = res.get("plans")
    if plans:
        L.append("")
        L.append("| plan | algorithm | series | coverage h | backfill | hits | steps reused/computed | bytes | ingest CPU s |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for p in plans["plans"]:
            cov = p.get("coverage", {})
            hrs = (cov.get("to_ms", 0) - cov.get("from_ms", 0)) / 3.6e6
            sc = p.get("step_cache") or {}
            bf = p.get("backfill", {})
            L.append(f"| {p['id']} | {p['algorithm']} | {p['series']} | {hrs:.1f} | {bf.get('state')} {bf.get('done_panes')}/{bf.get('total_panes')} | "
                     f"{p['hits']} | {sc.get('steps_reused', '-')}/{sc.get('steps_computed', '-')} | {p['bytes']:,} | {p['ingest_cpu_seconds']:.1f} |")
        dec = plans.get("decisions", [])
        counts: dict[tuple[str, str], int] = {}
        for dcs in dec:
            counts[(dcs["sds"], dcs["action"])] = counts.get((dcs["sds"], dcs["action"]), 0) + 1
        L.append(f"decisions ({len(dec)} listed by the server, oldest first may be cut): "
                 + "; ".join(f"{sds} {act} x{n}" for (sds, act), n in sorted(counts.items())))
        for dcs in dec[-6:]:
            L.append(f"  decision {dcs['action']} {dcs['sds']}: {dcs['reason']}")
    for c in res.get("candidates") or []:
        L.append(f"  candidate {c['metric']} ({c['algorithm']}, {c['recent_queries']} recent queries): {c['last_decision']}")
    return "\n".join(L)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of the timed part")
    ap.add_argument("--series", type=int, default=5000, help="approximate series (79 per vLLM engine)")
    ap.add_argument("--history-hours", type=float, default=25.0)
    ap.add_argument("--block-s", type=float, default=60.0, help="length of the alternating check / clean blocks")
    ap.add_argument("--phase-shift-s", type=float, default=1.3, help="refresh phase shift at each block boundary")
    ap.add_argument("--planner-config", default="", help="JSON/YAML mapping (or a file) for the planner-on server's planner: section")
    ap.add_argument("--skip-prometheus", action="store_true")
    ap.add_argument("--port-on", type=int, default=0)
    ap.add_argument("--port-off", type=int, default=0)
    ap.add_argument("--port-prom", type=int, default=0)
    ap.add_argument("--wal-fsync", default="never", choices=["always", "batch", "never"],
                    help="both TurboProm servers (never = like Prometheus, which does not fsync per write)")
    ap.add_argument("--samples-per-request", type=int, default=100_000, help="preload request size")
    ap.add_argument("--max-preload-s", type=float, default=1800.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1,000 series, 2h history, 120 s")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (data dirs, logs)")
    ap.add_argument("--out", default=None, help="JSON result file")
    args = ap.parse_args()
    if args.quick:
        args.series, args.history_hours, args.duration = 1000, 2.0, 120.0
    # the run stops by itself: preload budget + timed part + shutdown margin
    def _alarm(signum, frame):
        raise TimeoutError("live_dashboard exceeded its time budget")

    signal.signal(signal.SIGALRM, _alarm)
    def _term(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, _term)
    signal.alarm(int(args.max_preload_s + args.duration + 300))
    bench = Bench(args)
    res = bench.run()
    signal.alarm(0)
    table = render(res)
    print(table, flush=True)
    if args.out:
        res["table"] = table
        Path(args.out).write_text(json.dumps(res, indent=1, default=float))
        print(f"[bench] wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
