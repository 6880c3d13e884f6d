"""Helpers for the HTTP API tests: a real Prometheus 2.42 peer, HTTP calls, data loading.

(Named test_api_*.py so it sits with the API tests; it defines no tests itself.)
"""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from tests.helpers import free_port, require_binary, wait_http


class PrometheusPeer:
    """A real ``prometheus`` on a loopback port with its own data dir (optionally backfilled)."""

    def __init__(self, workdir: Path, openmetrics: str | None = None, extra_args: list[str] | None = None,
                 config_yaml: str | None = None):
        self.workdir = Path(workdir)
        self.config_yaml = config_yaml
        self.port = free_port()
        self.openmetrics = openmetrics
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "PrometheusPeer":
        binary = require_binary("prometheus")
        data = self.workdir / "prom-data"
        data.mkdir(parents=True, exist_ok=True)
        if self.openmetrics is not None:
            promtool = require_binary("promtool")
            src = self.workdir / "backfill.om"
            src.write_text(self.openmetrics)
            subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(src), str(data)],
                           check=True, capture_output=True, timeout=300)
        cfg = self.workdir / "prometheus.yml"
        cfg.write_text(self.config_yaml or "global:\n  scrape_interval: 15s\n")
        self._log = open(self.workdir / "prometheus.log", "ab")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={cfg}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=100y",
             *self.extra_args],
            stdout=self._log, stderr=subprocess.STDOUT,
        )
        wait_http(self.url + "/-/ready", timeout=60, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self) -> "PrometheusPeer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def http(method: str, url: str, params: dict[str, Any] | list[tuple[str, str]] | None = None,
         body: bytes | None = None, headers: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
    """One HTTP call; params go in the query string for GET and in a form body for POST."""
    qs = urllib.parse.urlencode(params or {}, doseq=True)
    hdrs = dict(headers or {})
    if method == "POST" and body is None:
        body = qs.encode()
        hdrs.setdefault("Content-Type", "application/x-www-form-urlencoded")
    elif qs:
        url = url + ("&" if "?" in url else "?") + qs
    req = urllib.request.Request(url, data=body, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def get_json(url: str, params: Any = None, method: str = "GET") -> tuple[int, Any]:
    status, _, body = http(method, url, params)
    return status, json.loads(body)


def import_text(base_url: str, text: str) -> None:
    """Load Prometheus text-format samples (with timestamps) through our import endpoint."""
    status, _, body = http("POST", base_url + "/api/v1/import/prometheus", body=text.encode(),
                           headers={"Content-Type": "text/plain"})
    assert status == 204, (status, body[:500])


def openmetrics_from_text(text: str) -> str:
    """Prometheus text with ms timestamps -> OpenMetrics (seconds) for promtool backfill."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue  # untyped samples are enough for a backfill (OpenMetrics counter naming differs)
        head, value, ts = line.rsplit(" ", 2)
        out.append(f"{head} {value} {int(ts) / 1000:.3f}")
    out.append("# EOF")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# A small deterministic data set loaded identically into Prometheus (promtool backfill) and
# TurboProm (/api/v1/import/prometheus).

T0_MS = 1_700_000_000_000  # data window [T0, T0 + 30 min], one sample per 15 s
STEP_MS = 15_000
N_POINTS = 121


def api_test_text() -> str:
    """Counters, gauges and a sparse metric, with label values that need JSON escaping."""
    lines = [
        "# HELP http_requests_total Requests served.",
        "# TYPE http_requests_total counter",
        "# HELP temperature_celsius Current temperature.",
        "# TYPE temperature_celsius gauge",
    ]
    for k in range(N_POINTS):
        t = T0_MS + k * STEP_MS
        for job, inst, rate in (("api", "a:80", 3), ("api", "b:80", 5), ("web", "c:80", 1)):
            for code in ("200", "500"):
                v = k * rate * (10 if code == "200" else 1)
                lines.append(f'http_requests_total{{job="{job}",instance="{inst}",code="{code}"}} {v} {t}')
        lines.append(f'temperature_celsius{{room="<lab & co>",site="zürich"}} {20 + (k % 7) * 0.1:.1f} {t}')
        lines.append(f'temperature_celsius{{room="office",site="bern"}} {18.25 + (k % 5) / 3} {t}')
        if k % 8 < 4:  # present half of the time: gaps longer than nothing, shorter than lookback
            lines.append(f'sparse_gauge{{kind="x"}} {k / 7} {t}')
    return "\n".join(lines) + "\n"


class PeerPair:
    """TurboProm and Prometheus 2.42 holding the same api_test_text() data."""

    def __init__(self, tmp: Path):
        from tests.helpers import ServerProcess

        text = api_test_text()
        self.prom = PrometheusPeer(tmp / "prom", openmetrics=openmetrics_from_text(text))
        self.tp = ServerProcess(tmp / "tp" / "data")
        self.text = text

    def __enter__(self) -> "PeerPair":
        self.prom.start()
        try:
            self.tp.start()
            import_text(self.tp.url, self.text)
        except BaseException:
            self.prom.stop()
            self.tp.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.tp.stop()
        self.prom.stop()


# ---------------------------------------------------------------------------------------------
# Generated series (label dict, timestamps in s, values) held identically by a backfilled
# Prometheus and our engine over an in-memory source: the differential function tests.

def _om_label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _om_value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def series_openmetrics(series: list) -> str:
    lines = []
    for lb, ts, vals in series:
        inner = ",".join(f'{k}="{_om_label_value(v)}"' for k, v in lb.items() if k != "__name__")
        head = f'{lb["__name__"]}{{{inner}}}'
        lines.extend(f"{head} {_om_value(v)} {t}" for t, v in zip(ts.tolist(), vals.tolist()))
    return "\n".join(lines) + "\n# EOF\n"


@contextmanager
def prometheus_and_engine(series: list, prefix: str, extra_args: list[str] | None = None) -> Iterator[tuple[str, Any]]:
    """(URL of a Prometheus backfilled with ``series``, our Engine over the same series in memory)."""
    from promql.engine import Engine
    from promql.memory_source import MemorySource
    from storage.labels import make_labels

    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    prom = PrometheusPeer(tmp, openmetrics=series_openmetrics(series), extra_args=extra_args)
    try:
        prom.start()
        src = MemorySource()
        for lb, ts, vals in series:
            src.add_series(make_labels(lb), ts * 1000, vals)
        yield prom.url, Engine(src)
    finally:
        prom.stop()
        shutil.rmtree(tmp, ignore_errors=True)
