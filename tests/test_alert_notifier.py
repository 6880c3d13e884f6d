"""The ``alerting:`` section and the notifier against a real Alertmanager 0.25 (basic auth from its
own ``--web.config.file``, ``--web.route-prefix``): path_prefix, basic_auth with a password file,
``relabel_configs`` dropping a target (listed as dropped in /api/v1/alertmanagers),
``alert_relabel_configs`` dropping and rewriting alerts, external labels added, a wrong password
counted as a notification error, ``/-/reload`` applying a changed section; the ``for`` state restored
from ALERTS_FOR_STATE after a restart; strict config checking of the section."""
from __future__ import annotations

import base64
import datetime as dt
import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from tests.helpers import ServerProcess, free_port, http_json, require_binary
from turboprom.config import ConfigError, load_config_file
from tests.test_federation import _stop, remote_write

RULES = """
groups:
  - name: always
    interval: 1s
    rules:
      - alert: Always
        expr: vector(1)
        labels: {severity: page}
        annotations: {summary: 'value {{ $value }} in {{ $externalLabels.region }}'}
      - alert: Dropped
        expr: vector(1)
        labels: {severity: drop-me}
"""


def start_alertmanager(tmp: Path, password: str) -> tuple[subprocess.Popen, int]:
    binary = require_binary("prometheus-alertmanager")
    port = free_port()
    (tmp / "am.yml").write_text("route: {receiver: none}\nreceivers: [{name: none}]\n")
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    (tmp / "am-web.yml").write_text(f"basic_auth_users:\n  prom: {hashed}\n")
    log = open(tmp / "alertmanager.log", "ab")
    proc = subprocess.Popen([binary, f"--config.file={tmp / 'am.yml'}", f"--storage.path={tmp / 'am-data'}",
                             f"--web.listen-address=127.0.0.1:{port}", f"--web.config.file={tmp / 'am-web.yml'}",
                             "--web.route-prefix=/am", "--cluster.listen-address=", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while True:  # /-/ready needs the credentials too
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/am/-/ready", headers=_auth(password))
            with urllib.request.urlopen(req, timeout=2) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                _stop(proc)
                raise RuntimeError((tmp / "alertmanager.log").read_text()[-2000:])
            time.sleep(0.1)


def _auth(password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"prom:{password}".encode()).decode()}


def am_alerts(port: int, password: str) -> list[dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/am/api/v2/alerts", headers=_auth(password))
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def _config(am_port: int, via: str) -> str:
    return f"""
global: {{evaluation_interval: 1s, external_labels: {{region: eu}}}}
rule_files: [rules.yml]
alerting:
  alert_relabel_configs:
    - {{source_labels: [severity], regex: drop-me, action: drop}}
    - {{target_label: via, replacement: {via}}}
  alertmanagers:
    - static_configs: [{{targets: ['127.0.0.1:{am_port}', '127.0.0.1:9']}}]
      path_prefix: /am
      timeout: 3s
      basic_auth: {{username: prom, password_file: pw.txt}}
      relabel_configs:
        - {{source_labels: [__address__], regex: '127\\.0\\.0\\.1:9', action: drop}}
    - static_configs: [{{targets: ['127.0.0.1:{am_port}']}}]
      path_prefix: /am/
      basic_auth: {{username: prom, password: wrong}}
"""


def _wait(pred, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.25)
    pytest.fail(f"timed out waiting for {what}")


@pytest.mark.peer
def test_alertmanager_config_auth_relabel_and_reload(tmp_path):
    am, am_port = start_alertmanager(tmp_path, "s3cret")
    (tmp_path / "pw.txt").write_text("s3cret\n")
    (tmp_path / "rules.yml").write_text(RULES)
    cfg = tmp_path / "turboprom.yml"
    cfg.write_text(_config(am_port, "turboprom"))
    server = ServerProcess(tmp_path / "data", ["--config", str(cfg), "--web.enable-lifecycle",
                                               "--rules.alert.resend-delay=1s"])
    try:
        server.start()
        _, body, _ = http_json(server.url + "/api/v1/alertmanagers")
        assert body["data"] == {
            "activeAlertmanagers": [{"url": f"http://127.0.0.1:{am_port}/am/api/v2/alerts"},
                                    {"url": f"http://127.0.0.1:{am_port}/am/api/v2/alerts"}],
            "droppedAlertmanagers": [{"url": "http://127.0.0.1:9/am/api/v2/alerts"}]}

        def received(via: str):
            return [a for a in am_alerts(am_port, "s3cret") if a["labels"].get("via") == via]

        got = _wait(lambda: received("turboprom"), 15, "the alert in Alertmanager")
        assert [a["labels"] for a in got] == [{"alertname": "Always", "severity": "page", "region": "eu",
                                               "via": "turboprom"}]
        assert got[0]["annotations"] == {"summary": "value 1 in eu"}
        assert got[0]["status"]["state"] == "active"
        assert got[0]["generatorURL"] == f"{server.url}/graph?g0.expr=vector%281%29&g0.tab=1"
        # The set with the wrong password: Alertmanager answers 401, counted per Alertmanager (each set
        # sends on its own, so that send may land after the other set's alert was received)
        def errors() -> list[str]:
            metrics = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
            return [ln for ln in metrics.splitlines() if ln.startswith("prometheus_notifications_errors_total{")
                    and float(ln.rsplit(" ", 1)[1]) >= 1]
        _wait(errors, 15, "the refused send counted")
        # Reload: the new alert_relabel_configs apply to the next (re)send.
        cfg.write_text(_config(am_port, "reloaded"))
        code, _, _ = http_json(server.url + "/-/reload", data=b"")
        assert code == 200
        _wait(lambda: received("reloaded"), 15, "the alert relabeled by the reloaded config")
        cfg.write_text(_config(am_port, "x").replace("api_version: v2", "") +
                       "      api_version: v1\n")
        with pytest.raises(urllib.error.HTTPError) as refused:  # plain text, as Prometheus answers
            urllib.request.urlopen(urllib.request.Request(server.url + "/-/reload", data=b"", method="POST"), timeout=30)
        assert refused.value.code == 500 and '"v1" is not supported' in refused.value.read().decode()
        assert http_json(server.url + "/api/v1/alertmanagers")[1]["data"]["activeAlertmanagers"]  # old config stays
    finally:
        server.stop()
        _stop(am)


def _alerts(url: str) -> list[dict]:
    return http_json(url + "/api/v1/alerts")[1]["data"]["alerts"]


def _ts(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_for_state_restored_after_restart(tmp_path):
    """Prometheus's RestoreForState: after a restart the pending alert keeps the time it had spent
    pending (activeAt shifted by the downtime), instead of starting its 'for' again."""
    (tmp_path / "rules.yml").write_text("""
groups:
  - name: slow
    interval: 1s
    rules:
      - alert: SlowBurn
        expr: burn > 0
        for: 1m
""")
    cfg = tmp_path / "turboprom.yml"
    cfg.write_text("global: {evaluation_interval: 1s}\nrule_files: [rules.yml]\n")
    args = ["--config", str(cfg), "--rules.alert.for-grace-period=2s", "--wal-fsync", "never"]
    port = free_port()
    server = ServerProcess(tmp_path / "data", args, port=port).start()
    try:
        remote_write(server.url, [({"__name__": "burn", "job": "x"}, [int(time.time() * 1000)], [1.0])])
        first = _wait(lambda: _alerts(server.url), 10, "the pending alert")
        active0 = _ts(first[0]["activeAt"])
        # ALERTS_FOR_STATE is written from the third evaluation on (after the restore step).
        _wait(lambda: http_json(server.url + "/api/v1/query?query=ALERTS_FOR_STATE")[1]["data"]["result"], 10,
              "ALERTS_FOR_STATE")
        time.sleep(max(0.0, active0 + 3.5 - time.time()))
    finally:
        server.stop()
    down = time.time()
    server = ServerProcess(tmp_path / "data", args, port=port).start()
    try:
        restarted = time.time()
        remote_write(server.url, [({"__name__": "burn", "job": "x"}, [int(time.time() * 1000)], [1.0])])
        fs = http_json(server.url + "/api/v1/query?query=" + urllib.request.quote("ALERTS_FOR_STATE[5m]"))[1]
        down_at = max(int(t) for t, _ in fs["data"]["result"][0]["values"])  # last sample before the restart
        assert down_at <= down
        pending = down_at - int(active0)  # how long it had been pending when the server went down

        def restored():
            a = _alerts(server.url)
            return a if a and _ts(a[0]["activeAt"]) < restarted - 1 else None

        after = _wait(restored, 15, "the restored activeAt")
        active1 = _ts(after[0]["activeAt"])
        assert after[0]["state"] == "pending"
        # restored activeAt = old activeAt + (restore time - down time): the pending time is kept.
        assert restarted <= active1 + pending <= time.time() + 1, (active0, active1, down_at, restarted)
        assert pending >= 3
    finally:
        server.stop()


@pytest.mark.parametrize("section,want", [
    ("alerting:\n  alertmanagers:\n    - static_config: []\n",
     'alerting.alertmanagers[0]: unknown field "static_config" (did you mean "static_configs"?)'),
    ("alerting:\n  alertmanager: []\n", 'alerting: unknown field "alertmanager"'),
    ("alerting:\n  alertmanagers:\n    - api_version: v1\n",
     'alerting.alertmanagers[0].api_version: "v1" is not supported'),
    ("alerting:\n  alertmanagers:\n    - timeout: soon\n", "alerting.alertmanagers[0].timeout: must be a duration"),
    ("alerting:\n  alertmanagers:\n    - scheme: ftp\n", "alerting.alertmanagers[0].scheme: must be 'http' or 'https'"),
    ("alerting:\n  alertmanagers:\n    - basic_auth: {username: a, password: b}\n      bearer_token: c\n",
     "at most one of basic_auth, authorization, bearer_token"),
    ("alerting:\n  alert_relabel_configs: [{action: explode}]\n", "alerting.alert_relabel_configs: unknown relabel action"),
    ("global:\n  external_labels: {a: [1]}\n", "global.external_labels.a: must be a string"),
])
def test_alerting_config_is_strict(tmp_path, section, want):
    # The same check `turboprom serve` and /-/reload run (the CLI path is covered by test_config_strict).
    cfg = tmp_path / "turboprom.yml"
    cfg.write_text(section)
    with pytest.raises(ConfigError) as e:
        load_config_file(str(cfg))
    assert str(e.value).startswith(f"{cfg}:") and want in str(e.value), str(e.value)
