"""Strict configuration, rule-file checks and config reload, through the real CLI and a real server.

Like Prometheus 2.42 (`prometheus --config.file` and `promtool check config|rules`), an unknown field or
a mistyped value anywhere in the server YAML, or a broken rule file, refuses to start with one line
naming the file, line, field path and what was wrong. `POST /-/reload` (with --web.enable-lifecycle)
and SIGHUP apply a valid new config to scrape jobs and rule files; an invalid one is refused and the
running config keeps working.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import REPO, ServerProcess, free_port, http_json


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "turboprom", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def serve_refused(tmp: Path, config_text: str, name: str = "turboprom.yml") -> tuple[int, str]:
    cfg = tmp / name
    cfg.write_text(config_text)
    r = run_cli("serve", "--data-dir", str(tmp / "data"), "--listen", f"127.0.0.1:{free_port()}", "--config", str(cfg))
    return r.returncode, r.stderr


# (server YAML, text the one-line message must contain)
TYPOS = [
    ("scrape_config:\n  - job_name: a\n", ['turboprom.yml:1: top level: unknown field "scrape_config"', 'did you mean "scrape_configs"']),
    ("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: a\n    scrape_intervall: 1s\n",
     ['turboprom.yml:5: scrape_configs[0]: unknown field "scrape_intervall"', "known: authorization, basic_auth, bearer_token, bearer_token_file, body_size_limit"]),
    ("planner:\n  min_count: 2\n  min_cout: 3\n", ["turboprom.yml:3: planner: unknown field(s) min_cout"]),
    ("ingest:\n  max_queu: 3\n", ['turboprom.yml:2: ingest: unknown field "max_queu"', 'did you mean "max_queue"']),
    ('planner:\n  enabled: "false"\n', ["turboprom.yml:2: planner.enabled must be true or false, got 'false'"]),
    ("planner:\n  enabled: maybe\n", ["planner.enabled must be true or false, got 'maybe'"]),
    ('planner:\n  min_count: "3"\n', ["turboprom.yml:2: planner.min_count must be an integer, got '3'"]),
    ("planner:\n  canary_fraction: x\n", ["planner.canary_fraction must be a number, got 'x'"]),
    ("scrape_configs:\n  - job_name: a\n    static_configs:\n      - targets: ['127.0.0.1:9']\n        lables: {a: b}\n",
     ['turboprom.yml:5: scrape_configs[0].static_configs[0]: unknown field "lables"']),
    ("scrape_configs:\n  - job_name: a\n    relabel_configs:\n      - sourcelabels: [a]\n",
     ['scrape_configs[0].relabel_configs[0]: unknown field "sourcelabels"', 'did you mean "source_labels"']),
    ("scrape_configs:\n  - job_name: a\n    honor_labels: 'yes'\n",
     ["turboprom.yml:3: scrape_configs[0].honor_labels: must be true or false, got 'yes'"]),
    ("global:\n  scrape_interval: fast\n", ["turboprom.yml:2: global.scrape_interval: must be a duration such as 15s or 1m, got 'fast'"]),
    ("scrape_configs:\n  - job_name: a\n    body_size_limit: lots\n", ["scrape_configs[0].body_size_limit: must be a size such as 512MB"]),
    ("scrape_configs:\n  - job_name: a\n    scheme: ftp\n", ["scrape_configs[0].scheme: must be 'http' or 'https', got 'ftp'"]),
    ("scrape_configs:\n  - job_name: a\n    scrape_interval: 1s\n    scrape_timeout: 5s\n",
     ["scrape_configs[0]", "scrape timeout greater than scrape interval"]),
    ("congestion:\n  stale_aftr: 1s\n", ["turboprom.yml:2: congestion: unknown setting 'stale_aftr'"]),
    ("kedgeflow:\n  ledger: sqlite\n", ["turboprom.yml:2: kedgeflow.ledger: must be 'embedded' or a mapping, got 'sqlite'"]),
    ("kedgeflow:\n  rate_limit: {requests_per_second: 1, burts: 5}\n", ['kedgeflow.rate_limit: unknown field "burts"']),
    ("kedgeflow:\n  ledger:\n    etcd:\n      endpoints: ['http://127.0.0.1:2379']\n      username: u\n      password: x\n"
     "      password_file: /dev/null\n",
     ["turboprom.yml:6: kedgeflow.ledger.etcd: at most one of password and password_file must be configured"]),
    ("kedgeflow:\n  ledger:\n    etcd:\n      endpoints: ['http://127.0.0.1:2379']\n      password: x\n",
     ["turboprom.yml:5: kedgeflow.ledger.etcd: password needs username"]),
    ('web:\n  enable_admin_api: "true"\n', ["turboprom.yml:2: web.enable_admin_api: must be true or false, got 'true'"]),
    ("web:\n  read_header_timeout: soon\n", ["web.read_header_timeout: must be a duration"]),
    ("limits:\n  max_label_values: 3\n", ["turboprom.yml:2: limits: unknown setting(s) ['max_label_values']"]),
    ('limits:\n  max_active_series: "lots"\n', ["turboprom.yml:2: limits.max_active_series: expected an integer, got 'lots'"]),
    ("limits:\n  tenants:\n    a: {max_active_series: yes}\n", ["limits.tenants.a.max_active_series: expected an integer, got True"]),
    ("congestion:\n  ca2: high\n", ["turboprom.yml:2: congestion.ca2: expected a number, got 'high'"]),
    ("auth:\n  workers: two\n", ["turboprom.yml:2: auth.workers: expected an integer, got 'two'"]),
    ("storage:\n  tsdb: {out_of_order_time_window: 1h}\n", ['turboprom.yml:2: storage: unknown field "tsdb" (known: exemplars)']),
    ("self_scrape: sometimes\n", ["self_scrape: must be true or false or a mapping, got 'sometimes'"]),
    ("rule_files: rules.yml\n", ["rule_files: must be a list, got 'rules.yml'"]),
    ("global:\n  scrape_interval: 1s\n foo: [\n", ["turboprom.yml:3:2: invalid YAML"]),
    ("- just\n- a list\n", ["the top level must be a mapping"]),
]


@pytest.mark.parametrize("text,expected", TYPOS, ids=[f"typo{i}" for i in range(len(TYPOS))])
def test_config_typo_refuses_to_start(tmp_path: Path, text: str, expected: list[str]) -> None:
    code, err = serve_refused(tmp_path, text)
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: "), err
    for e in expected:
        assert e in lines[0], (e, lines[0])
    assert "Traceback" not in err
    assert not (tmp_path / "data").exists()  # refused before anything is created


def test_missing_config_file(tmp_path: Path) -> None:
    r = run_cli("serve", "--data-dir", str(tmp_path / "data"), "--config", str(tmp_path / "nope.yml"))
    assert r.returncode == 1 and r.stderr.strip() == f"config error: config file {tmp_path / 'nope.yml'} not found", r.stderr


RULES_OK = "groups:\n- name: g\n  interval: 1s\n  rules:\n  - record: job:up:sum\n    expr: sum by (job) (up)\n"
BROKEN_RULES = [
    ("groups:\n- name: g\n  rules:\n  - record: x\n    expr: sum(up\n", ["rules.yml:5:", 'group "g", rule 1, "x": could not parse expression']),
    ("groups:\n- name: g\n  rules:\n  - record: x\n    expr: up\n    lables: {a: b}\n",
     ['rules.yml:6: group "g", rule 1, "x": unknown field "lables"']),
    ("groups:\n- name: g\n  rules:\n  - expr: up\n", ["rules.yml:4: group \"g\", rule 1: one of 'record' or 'alert' must be set"]),
    ("groups:\n- name: g\n  rules:\n  - record: x\n", ["rules.yml:4: group \"g\", rule 1, \"x\": field 'expr' must be set in rule"]),
    ("groups:\n- name: g\n  rules: []\n- name: g\n  rules: []\n", ['rules.yml:4: groupname: "g" is repeated in the same file']),
    ("groups:\n- name: g\n  rules:\n  - record: x\n    expr: up\n  - record: x\n    expr: up * 2\n",
     ['rules.yml:6: group "g", rule 2, "x": the same rule (name and labels) is already rule 1']),
    ("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up == 0\n    for: 5x\n", ['rules.yml:6: group "g", rule 1, "A": for:']),
    ("groups:\n- name: g\n  rules:\n  - record: x\n    expr: up\n    for: 5m\n", ["invalid field 'for' in recording rule"]),
    ("groups:\n- name: g\n   rules: []\n", ["rules.yml:3:", "invalid YAML"]),
    ("group:\n- name: g\n", ['rules.yml:1: unknown field "group"']),
    ("groups:\n- name: g\n  limit: lots\n  rules: []\n", ['rules.yml:3: group "g": limit must be a non-negative integer']),
]


@pytest.mark.parametrize("text,expected", BROKEN_RULES, ids=[f"rules{i}" for i in range(len(BROKEN_RULES))])
def test_broken_rule_file(tmp_path: Path, text: str, expected: list[str]) -> None:
    (tmp_path / "rules.yml").write_text(text)
    r = run_cli("check", "rules", str(tmp_path / "rules.yml"))
    assert r.returncode == 1, r.stdout
    assert r.stdout.startswith(f"Checking {tmp_path / 'rules.yml'}\n  FAILED:"), r.stdout
    for e in expected:
        assert e in r.stdout, (e, r.stdout)
    code, err = serve_refused(tmp_path, "rule_files: [rules.yml]\n")
    assert code == 1 and err.startswith("config error: ") and len(err.strip().splitlines()) == 1, err
    for e in expected:
        assert e in err, (e, err)


def test_check_config_and_rules_succeed(tmp_path: Path) -> None:
    (tmp_path / "rules.yml").write_text(RULES_OK)
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\nrule_files: [rules.yml]\n"
                   "scrape_configs:\n  - job_name: a\n    static_configs: [{targets: ['127.0.0.1:9'], labels: {zone: z1}}]\n"
                   "    relabel_configs: [{source_labels: [zone], target_label: region, replacement: r-$1}]\n"
                   "planner: {enabled: false}\ncongestion: {stale_after: 30s}\nweb: {enable_lifecycle: true}\n")
    r = run_cli("check", "config", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 1 rule files found" in r.stdout and f"SUCCESS: {cfg} is valid" in r.stdout
    r = run_cli("check", "rules", str(tmp_path / "rules.yml"))
    assert r.returncode == 0 and "SUCCESS: 1 rules found" in r.stdout, r.stdout
    # several files: one bad one fails the whole check, the good one is still reported
    bad = tmp_path / "bad.yml"
    bad.write_text("scrape_configs:\n  - job_name: a\n    scrape_intervall: 1s\n")
    r = run_cli("check", "config", str(cfg), str(bad))
    assert r.returncode == 1 and f"SUCCESS: {cfg} is valid" in r.stdout
    assert f'{bad}:3: scrape_configs[0]: unknown field "scrape_intervall"' in r.stdout
    r = run_cli("check", "rules", str(tmp_path / "missing.yml"))
    assert r.returncode == 1 and "not found" in r.stdout


def test_shipped_configs_are_valid(tmp_path: Path) -> None:
    """The demo's config and the example sections of the README pass the strict check."""
    import yaml

    from turboprom.config import validate
    from turboprom.demo import demo_config

    validate(demo_config("127.0.0.1:9090", ["127.0.0.1:9100"], "127.0.0.1:9200"))
    validate(yaml.safe_load("""
global: {scrape_interval: 15s, scrape_timeout: 10s, evaluation_interval: 15s, metric_name_validation_scheme: legacy}
scrape_configs:
  - job_name: w
    scrape_interval: 1s
    scrape_timeout: 500ms
    metrics_path: /metrics
    scheme: http
    params: {format: [prometheus]}
    honor_labels: true
    honor_timestamps: false
    static_configs: [{targets: ['127.0.0.1:9100'], labels: {cluster: c1}}]
    file_sd_configs: [{files: [targets/*.json], refresh_interval: 30s}]
    relabel_configs: [{action: hashmod, source_labels: [__address__], target_label: shard, modulus: 4}]
    metric_relabel_configs: [{action: drop, source_labels: [__name__], regex: go_.*}]
    body_size_limit: 10MB
    sample_limit: 10000
self_scrape: {scrape_interval: 5s}
planner: {approximate: true, tenants: {team-a: {approximate: false}}, pinned: [{metric: foo_total, algorithm: exact}]}
congestion: {stale_after: 15s, drop_after: 5m, rate_window: 5s, resolution: 5s}
kedgeflow:
  ledger: {etcd: {endpoints: ['http://127.0.0.1:2379']}}
  policy: [{verbs: ['scheduler.*'], roles: [admin], max_congestion_price: 5.0, grant_ttl_ms: 30000}]
  targets: {scheduler.kv_migrate: 'http://127.0.0.1:8000/migrate'}
  rate_limit: {requests_per_second: 2, burst: 20}
limits: {max_labels_per_series: 40, tenants: {team-a: {max_active_series: 1000}}}
ingest: {max_queue: 64, overload_status: 503, max_body_bytes: 1000000}
web: {enable_admin_api: true, enable_lifecycle: true, read_header_timeout: 15s, idle_timeout: 2m}
storage: {exemplars: {max_exemplars: 0}}
auth: {cache_ttl_s: 60}
"""))


# ------------------------------------------------------------------------------------------- reload
def _targets(url: str) -> dict[str, set[str]]:
    _, body, _ = http_json(url + "/api/v1/targets")
    out: dict[str, set[str]] = {}
    for t in body["data"]["activeTargets"]:
        out.setdefault(t["scrapePool"], set()).add(t["labels"]["instance"])
    return out


def _rule_names(url: str) -> set[str]:
    _, body, _ = http_json(url + "/api/v1/rules")
    return {r["name"] for g in body["data"]["groups"] for r in g["rules"]}


def _post(url: str, method: str = "POST") -> tuple[int, str]:
    req = urllib.request.Request(url, data=b"", method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _gauge(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def _wait(cond, what: str, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_reload_applies_scrape_and_rules_and_refuses_broken(tmp_path: Path) -> None:
    port = free_port()
    me = f"127.0.0.1:{port}"
    other = f"localhost:{port}"  # the same server under another instance name
    cfg = tmp_path / "turboprom.yml"
    cfg.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                   f"scrape_configs:\n  - job_name: self\n    static_configs: [{{targets: ['{me}']}}]\n")
    with ServerProcess(tmp_path / "data", ["--config", str(cfg), "--web.enable-lifecycle"], port=port) as srv:
        url = srv.url
        assert _targets(url) == {"self": {me}}
        assert _gauge(url, "prometheus_config_last_reload_successful") == 1.0
        t_start = _gauge(url, "prometheus_config_last_reload_success_timestamp_seconds")
        assert abs(t_start - time.time()) < 120

        # a target added to the job, a second job, and a rule file
        (tmp_path / "rules.yml").write_text(RULES_OK)
        cfg.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [rules.yml]\n"
                       f"scrape_configs:\n  - job_name: self\n    static_configs: [{{targets: ['{me}', '{other}']}}]\n"
                       f"  - job_name: second\n    static_configs: [{{targets: ['{me}']}}]\n")
        assert _post(url + "/-/reload") == (200, "")
        assert _targets(url) == {"self": {me, other}, "second": {me}}
        assert _rule_names(url) == {"job:up:sum"}
        _wait(lambda: http_json(url + "/api/v1/query?query=job:up:sum")[1]["data"]["result"], "the recording rule to run")

        # a broken config is refused with Prometheus's 500 text; everything keeps running as before
        good = cfg.read_text()
        cfg.write_text(good.replace("  - job_name: second\n", "  - job_name: second\n    scrape_intervall: 1s\n"))
        code, text = _post(url + "/-/reload", "PUT")
        assert code == 500 and text.startswith("failed to reload config: ") and f'{cfg}:9: scrape_configs[1]: unknown field "scrape_intervall"' in text, text
        assert _gauge(url, "prometheus_config_last_reload_successful") == 0.0
        assert http_json(url + "/api/v1/status/runtimeinfo")[1]["data"]["reloadConfigSuccess"] is False
        assert http_json(url + "/api/v1/status/flags")[1]["data"]["web.enable-lifecycle"] == "true"
        assert _targets(url) == {"self": {me, other}, "second": {me}}
        (tmp_path / "rules.yml").write_text("groups:\n- name: g\n  rules:\n  - record: x\n    expr: sum(\n")
        cfg.write_text(good)
        code, text = _post(url + "/-/reload")
        assert code == 500 and "rules.yml:5:" in text and "could not parse expression" in text, text
        assert _rule_names(url) == {"job:up:sum"}
        _, body, _ = http_json(url + "/api/v1/query?query=up")
        assert body["data"]["result"], "scraping stopped after a refused reload"

        # SIGHUP: a job removed, a rule replaced
        (tmp_path / "rules.yml").write_text("groups:\n- name: g\n  interval: 1s\n  rules:\n  - record: up:count\n    expr: count(up)\n")
        cfg.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [rules.yml]\n"
                       f"scrape_configs:\n  - job_name: self\n    static_configs: [{{targets: ['{me}']}}]\n"
                       "planner:\n  pinned: [{metric: up, algorithm: exact}]\n")
        os.kill(srv.proc.pid, signal.SIGHUP)
        _wait(lambda: _targets(url) == {"self": {me}}, "SIGHUP reload to drop the job")
        _wait(lambda: _rule_names(url) == {"up:count"}, "SIGHUP reload to replace the rules")
        assert _gauge(url, "prometheus_config_last_reload_successful") == 1.0
        assert _gauge(url, "prometheus_config_last_reload_success_timestamp_seconds") >= t_start
        assert http_json(url + "/api/v1/status/runtimeinfo")[1]["data"]["reloadConfigSuccess"] is True
        plans = http_json(url + "/api/v1/planner/plans")[1]["data"]["plans"]
        assert [(p["metric"], p["algorithm"], p["pinned"]) for p in plans] == [("up", "exact", True)], plans
        _, body, _ = http_json(url + "/api/v1/status/config")
        assert "second" not in body["data"]["yaml"] and "rules.yml" in body["data"]["yaml"]
        assert "error reloading configuration" in srv.log_path.read_text()


def test_reload_under_load(tmp_path: Path) -> None:
    """Reloads while queries and text imports run: every reload succeeds, no request fails."""
    import threading

    port = free_port()
    cfg = tmp_path / "turboprom.yml"
    body = "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: j{n}\n    static_configs: [{{targets: ['127.0.0.1:%d']}}]\n" % port
    cfg.write_text(body.format(n=0))
    with ServerProcess(tmp_path / "data", ["--config", str(cfg), "--web.enable-lifecycle"], port=port) as srv:
        failures: list[str] = []
        stop = threading.Event()

        def load(k: int) -> None:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    # one series per thread: two threads writing one series in the same millisecond
                    # (samples stamped on arrival) is a duplicate timestamp, refused as Prometheus does
                    code, _, _ = http_json(srv.url + "/api/v1/import/prometheus", f'load_metric{{thread="{k}"}} {i}\n'.encode())
                    if code >= 300:
                        failures.append(f"import {code}")
                    code, b, _ = http_json(srv.url + "/api/v1/query?query=sum(up)")
                    if code != 200:
                        failures.append(f"query {code} {b}")
                except Exception as e:  # noqa: BLE001
                    failures.append(repr(e))

        threads = [threading.Thread(target=load, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        try:
            for n in range(1, 6):
                cfg.write_text(body.format(n=n))
                assert _post(srv.url + "/-/reload") == (200, "")
                assert set(_targets(srv.url)) == {f"j{n}"}
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        assert not failures, failures[:5]


def test_reload_needs_lifecycle_flag(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data") as srv:
        assert _post(srv.url + "/-/reload") == (403, "Lifecycle API is not enabled.")
        assert _post(srv.url + "/-/reload", "PUT") == (403, "Lifecycle API is not enabled.")
        try:
            urllib.request.urlopen(srv.url + "/-/reload", timeout=30)
            raise AssertionError("GET /-/reload answered")
        except urllib.error.HTTPError as e:
            assert e.code == 405 and e.read().decode().strip() == "Only POST or PUT requests allowed"
