"""Alert delivery against the real peers: one rule file loaded into a real Prometheus 2.42 and into
TurboProm, the same samples remote-written to both, each sending to one real Alertmanager 0.25
(``global.external_labels: {source: prom|turbo}`` tells them apart) whose webhook receiver is an HTTP
server in this test. What Alertmanager delivers from each (labels, templated annotations, startsAt,
endsAt, firing then resolved, keep_firing_for) must be the same, and so must ``/api/v1/alerts``,
``/api/v1/rules``, ``/api/v1/alertmanagers`` and the ``ALERTS`` / ``ALERTS_FOR_STATE`` series.
"""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ServerProcess, free_port, http_json, require_binary, wait_http
from tests.test_federation import _start_prometheus, _stop, remote_write

RULES = """
groups:
  - name: fleet
    interval: 1s
    rules:
      - alert: QueueHigh
        expr: queue_depth > 3
        for: 2s
        labels:
          severity: '{{ if gt $value 4.0 }}page{{ else }}ticket{{ end }}'
          team: serving
        annotations:
          summary: '{{ $labels.instance }} queue is {{ $value | humanize }}'
          description: >-
            from {{ $externalLabels.source }}: {{ printf "%.1f" $value }} waiting of
            {{ with query "sum(queue_depth)" }}{{ . | first | value }}{{ end }}
      - alert: AnyQueued
        expr: sum by (job) (queue_depth) > 0
        annotations:
          total: '{{ humanizeDuration $value }} ({{ $value | humanizePercentage }})'
      - alert: QueueKept
        expr: queue_depth{instance="a:1"} > 3
        keep_firing_for: 2s
        labels: {severity: info}
      - record: job:queue_depth:sum
        expr: sum by (job) (queue_depth)
"""
# Phase 1: a:1 = 5 (page), b:2 = 3.5 (ticket), c:3 = 1 (below the threshold), until both servers
# show the four alerts firing; phase 2: a:1 = 1 (QueueHigh resolves, QueueKept 2 s later).
FIRING = 4
ZERO_TIME = "0001-01-01T00:00:00Z"


class Webhook:
    """Alertmanager's webhook receiver: every notification body, in arrival order."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hook.bodies.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, source: str) -> dict[tuple, list[dict[str, Any]]]:
        """Each alert (labels without ``source``) -> what was delivered for it, in order."""
        out: dict[tuple, list[dict[str, Any]]] = {}
        for b in list(self.bodies):
            for a in b["alerts"]:
                if a["labels"].get("source") == source:
                    key = tuple(sorted((k, v) for k, v in a["labels"].items() if k != "source"))
                    out.setdefault(key, []).append(a)
        return out


def start_alertmanager(tmp: Path, webhook_url: str) -> tuple[subprocess.Popen, str]:
    binary = require_binary("prometheus-alertmanager")
    port = free_port()
    cfg = tmp / "alertmanager.yml"
    cfg.write_text(f"""
route:
  receiver: hook
  group_by: [alertname, source]
  group_wait: 500ms
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs: [{{url: '{webhook_url}', send_resolved: true}}]
""")
    log = open(tmp / "alertmanager.log", "ab")
    proc = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.path={tmp / 'am-data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                             "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/-/ready", timeout=30, proc=proc)
    except Exception:
        _stop(proc)
        raise
    return proc, base


def _config(source: str, am_port: int) -> str:
    return f"""
global: {{evaluation_interval: 1s, external_labels: {{source: {source}}}}}
rule_files: [rules.yml]
alerting:
  alertmanagers:
    - static_configs: [{{targets: ['127.0.0.1:{am_port}']}}]
      timeout: 5s
"""


def _t(text: str) -> float:
    if text.startswith("0001-"):
        return 0.0
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _feed(urls: list[str], stop: threading.Event, phase2: threading.Event) -> None:
    """Identical samples to both servers every 0.5 s: phase 1 then a:1 drops below the threshold."""
    while not stop.is_set():
        now = time.time()
        a = 1.0 if phase2.is_set() else 5.0
        ts = [int(now * 1000)]
        series = [({"__name__": "queue_depth", "job": "w", "instance": "a:1"}, ts, [a]),
                  ({"__name__": "queue_depth", "job": "w", "instance": "b:2"}, ts, [3.5]),
                  ({"__name__": "queue_depth", "job": "w", "instance": "c:3"}, ts, [1.0])]
        for u in urls:
            remote_write(u, series)
        stop.wait(0.5)


def _query(base: str, q: str) -> list[dict[str, Any]]:
    code, body, _ = http_json(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": q}))
    assert code == 200, body
    return body["data"]["result"]


def _norm(text: str) -> str:
    return text.replace("from prom:", "from SRC:").replace("from turbo:", "from SRC:")


def _done(hook: Webhook, source: str) -> bool:
    got = hook.alerts(source)
    resolved = {dict(k)["alertname"] for k, v in got.items() if v[-1]["status"] == "resolved"}
    return {"QueueHigh", "QueueKept"} <= resolved and len(got) == 4


@pytest.mark.peer
def test_alertmanager_receives_the_same_alerts_from_prometheus_and_turboprom(tmp_path):
    hook = Webhook()
    am, am_base = start_alertmanager(tmp_path, hook.url)
    am_port = int(am_base.rsplit(":", 1)[1])
    pdir, tdir = tmp_path / "prom", tmp_path / "turbo"
    for d, src in ((pdir, "prom"), (tdir, "turbo")):
        d.mkdir()
        (d / "rules.yml").write_text(RULES)
        (d / "config.yml").write_text(_config(src, am_port))
    prom = turbo = None
    stop = threading.Event()
    try:
        prom, prom_base = _start_prometheus(pdir, _config("prom", am_port), ["--web.enable-remote-write-receiver"])
        turbo = ServerProcess(tdir / "data", ["--config", str(tdir / "config.yml")]).start()
        # Prometheus discovers its Alertmanagers asynchronously and drops what fires before: feed
        # only once both list theirs (alerts without 'for' fire at the first evaluation).
        deadline = time.time() + 20
        while time.time() < deadline and not all(
                http_json(b + "/api/v1/alertmanagers")[1]["data"]["activeAlertmanagers"] for b in (prom_base, turbo.url)):
            time.sleep(0.1)
        time.sleep(0.5)
        t0 = time.time()
        phase2 = threading.Event()
        feeder = threading.Thread(target=_feed, args=([prom_base, turbo.url], stop, phase2), daemon=True)
        feeder.start()

        def firing(base: str) -> int:
            return sum(a["state"] == "firing" for a in http_json(base + "/api/v1/alerts")[1]["data"]["alerts"])

        deadline = time.time() + 20
        while time.time() < deadline and not (firing(prom_base) == firing(turbo.url) == FIRING):
            time.sleep(0.25)
        time.sleep(1.0)  # one more evaluation each: ALERTS written for every firing alert
        # Phase 1 settled: both firing QueueHigh (a:1 page, b:2 ticket), AnyQueued and QueueKept.
        _compare_apis(prom_base, turbo.url, firing_only=True)
        phase2.set()
        t1 = time.time()
        deadline = time.time() + 20
        while time.time() < deadline and not (_done(hook, "prom") and _done(hook, "turbo")):
            time.sleep(0.25)
        p_alerts, t_alerts = hook.alerts("prom"), hook.alerts("turbo")
        assert _done(hook, "prom"), f"Prometheus's alerts did not all arrive: {p_alerts}"
        assert _done(hook, "turbo"), (f"TurboProm's alerts did not all arrive: {t_alerts}; log:\n"
                                      f"{turbo.log_path.read_text()[-3000:]}")
        assert sorted(p_alerts) == sorted(t_alerts)
        for key in p_alerts:
            p, t = p_alerts[key], t_alerts[key]
            name = dict(key)["alertname"]
            assert [a["status"] for a in p][-1] == [a["status"] for a in t][-1], key
            assert "firing" in {a["status"] for a in t}, key
            assert _norm(json.dumps(p[-1]["annotations"], sort_keys=True)) == \
                _norm(json.dumps(t[-1]["annotations"], sort_keys=True)), key
            # startsAt is the first evaluation the alert fired at: the two servers evaluate at
            # different phases of the same 1 s interval.
            ps, ts_ = _t(p[-1]["startsAt"]), _t(t[-1]["startsAt"])
            assert abs(ps - ts_) <= 2.0, (key, p[-1]["startsAt"], t[-1]["startsAt"])
            if name == "QueueHigh":
                assert ts_ - t0 >= 2.0  # pending for 'for: 2s' first
            if p[-1]["status"] == "firing":
                assert p[-1]["endsAt"] == t[-1]["endsAt"] == ZERO_TIME
            else:
                held_p, held_t = _t(p[-1]["endsAt"]) - ps, _t(t[-1]["endsAt"]) - ts_
                assert abs(held_p - held_t) <= 2.0, (key, held_p, held_t)
                if name == "QueueKept":  # resolved no sooner than keep_firing_for after the condition ended
                    assert _t(t[-1]["endsAt"]) >= t1 + 2.0 - 0.1
            pu, tu = urllib.parse.urlsplit(p[-1]["generatorURL"]), urllib.parse.urlsplit(t[-1]["generatorURL"])
            assert (pu.path, urllib.parse.parse_qs(pu.query)) == (tu.path, urllib.parse.parse_qs(tu.query)), key
        _compare_apis(prom_base, turbo.url, firing_only=False)
    finally:
        stop.set()
        if turbo is not None:
            turbo.stop()
        if prom is not None:
            _stop(prom)
        _stop(am)
        hook.server.shutdown()


def _compare_apis(prom: str, turbo: str, firing_only: bool) -> None:
    # /api/v1/alertmanagers: the same single Alertmanager URL.
    assert http_json(prom + "/api/v1/alertmanagers")[1] == http_json(turbo + "/api/v1/alertmanagers")[1]
    # /api/v1/alerts
    def alerts(base: str) -> list[dict[str, Any]]:
        items = http_json(base + "/api/v1/alerts")[1]["data"]["alerts"]
        return sorted(items, key=lambda a: sorted(a["labels"].items()))

    pa, ta = alerts(prom), alerts(turbo)
    assert [sorted(a) for a in pa] == [sorted(a) for a in ta]
    for p, t in zip(pa, ta):
        assert (p["labels"], p["state"], p["value"]) == (t["labels"], t["state"], t["value"])
        assert _norm(json.dumps(p["annotations"])) == _norm(json.dumps(t["annotations"]))
        assert abs(_t(p["activeAt"]) - _t(t["activeAt"])) <= 2.0
    # /api/v1/rules: same fields, same values but for timings.
    pg, tg = (http_json(b + "/api/v1/rules")[1]["data"]["groups"] for b in (prom, turbo))
    assert len(pg) == len(tg) == 1
    assert sorted(pg[0]) == sorted(tg[0])
    assert (pg[0]["name"], pg[0]["interval"], pg[0]["limit"]) == (tg[0]["name"], tg[0]["interval"], tg[0]["limit"])
    assert Path(pg[0]["file"]).name == Path(tg[0]["file"]).name
    for pr, tr in zip(pg[0]["rules"], tg[0]["rules"]):
        assert sorted(pr) == sorted(tr), (pr, tr)
        for k in pr:
            if k in ("evaluationTime", "lastEvaluation"):
                continue
            if k == "alerts":
                assert sorted((sorted(a["labels"].items()), a["state"], a["value"]) for a in pr[k]) == \
                    sorted((sorted(a["labels"].items()), a["state"], a["value"]) for a in tr[k]), pr["name"]
                continue
            assert pr[k] == tr[k], (pr["name"], k, pr[k], tr[k])
    # ALERTS / ALERTS_FOR_STATE series: same label sets; activeAt within the phase difference.
    for q in ("ALERTS", "ALERTS_FOR_STATE"):
        pv = sorted((sorted(r["metric"].items()), float(r["value"][1])) for r in _query(prom, q))
        tv = sorted((sorted(r["metric"].items()), float(r["value"][1])) for r in _query(turbo, q))
        assert [m for m, _ in pv] == [m for m, _ in tv], q
        if q == "ALERTS_FOR_STATE":
            assert all(abs(a - b) <= 2.0 for (_, a), (_, b) in zip(pv, tv))
    if firing_only:
        assert {a["state"] for a in ta} == {"firing"}
