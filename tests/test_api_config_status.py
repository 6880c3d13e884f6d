"""Status endpoints fed by a YAML config: /api/v1/targets (a real Prometheus scraped by both),
/api/v1/rules and /api/v1/alerts (the same rule file loaded by both), the admin API when enabled,
/api/v1/status/config and /flags. Shapes are compared with the real Prometheus 2.42."""
from __future__ import annotations

import time

import orjson
import pytest

from tests.helpers import ServerProcess
from tests.test_api_helpers import PrometheusPeer, http, import_text

pytestmark = pytest.mark.peer

RULES = """groups:
- name: example
  interval: 1s
  rules:
  - record: job:up:sum
    expr: sum by (job) (up)
  - alert: AlwaysFiring
    expr: vector(1) > 0
    labels:
      severity: page
    annotations:
      summary: always firing
"""


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("config-status")
    (tmp / "rules.yml").write_text(RULES)
    prom = PrometheusPeer(tmp / "prom", extra_args=["--web.enable-admin-api"])
    scrape = (f"scrape_configs:\n- job_name: prom\n  scrape_interval: 1s\n  static_configs:\n"
              f"  - targets: ['127.0.0.1:{prom.port}']\n")
    prom.config_yaml = f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: ['{tmp / 'rules.yml'}']\n" + scrape
    cfg = tmp / "turboprom.yml"
    cfg.write_text(f"global:\n  scrape_interval: 1s\nrule_files: ['{tmp / 'rules.yml'}']\n{scrape}web:\n  enable_admin_api: true\n")
    with prom, ServerProcess(tmp / "tp" / "data", extra_args=["--config", str(cfg)]) as tp:
        deadline = time.time() + 60
        while time.time() < deadline:  # until both have scraped and evaluated
            ok = True
            for url in (prom.url, tp.url):
                _, _, body = http("GET", url + "/api/v1/query", {"query": "job:up:sum"})
                ok &= bool(orjson.loads(body)["data"]["result"])
            if ok:
                break
            time.sleep(0.5)
        yield prom, tp


def data(url: str, path: str, params=None, method: str = "GET"):
    status, _, body = http(method, url + path, params)
    assert status == 200, (path, body)
    doc = orjson.loads(body)
    assert doc["status"] == "success"
    return doc["data"]


def test_targets(servers):
    prom, tp = servers
    ref = data(prom.url, "/api/v1/targets")["activeTargets"]
    ours = data(tp.url, "/api/v1/targets")["activeTargets"]
    assert len(ours) == len(ref) == 1
    a, b = ref[0], ours[0]
    assert set(a) <= set(b)
    for k in ("labels", "scrapePool", "scrapeUrl", "scrapeInterval", "scrapeTimeout"):
        assert b[k] == a[k], k
    assert b["health"] == "up" and b["lastError"] == ""
    assert isinstance(b["lastScrapeDuration"], float) and b["lastScrape"].endswith("Z")
    assert data(tp.url, "/api/v1/targets", {"state": "dropped"})["activeTargets"] == []
    assert data(tp.url, "/api/v1/targets", {"scrapePool": "other"})["activeTargets"] == []
    assert data(tp.url, "/api/v1/scrape_pools") == data(prom.url, "/api/v1/scrape_pools") == {"scrapePools": ["prom"]}


def test_rules_and_alerts(servers):
    prom, tp = servers
    ref = data(prom.url, "/api/v1/rules")["groups"]
    ours = data(tp.url, "/api/v1/rules")["groups"]
    assert [g["name"] for g in ours] == [g["name"] for g in ref] == ["example"]
    ga, gb = ref[0], ours[0]
    assert set(ga) <= set(gb)
    assert gb["interval"] == ga["interval"] == 1
    assert [(r["name"], r["type"]) for r in gb["rules"]] == [(r["name"], r["type"]) for r in ga["rules"]]
    for ra, rb in zip(ga["rules"], gb["rules"]):
        assert set(ra) - {"lastError"} <= set(rb), (ra, rb)
        assert rb["health"] == "ok"
    assert [r["name"] for r in data(tp.url, "/api/v1/rules", {"type": "record"})["groups"][0]["rules"]] == ["job:up:sum"]
    assert [r["name"] for r in data(tp.url, "/api/v1/rules", {"type": "alert"})["groups"][0]["rules"]] == ["AlwaysFiring"]
    status, _, body = http("GET", tp.url + "/api/v1/rules", {"type": "bogus"})
    assert status == 400 and orjson.loads(body)["errorType"] == "bad_data"
    alerts = data(tp.url, "/api/v1/alerts")["alerts"]
    assert [a["labels"]["alertname"] for a in alerts] == ["AlwaysFiring"]
    assert alerts[0]["state"] in ("pending", "firing") and alerts[0]["labels"]["severity"] == "page"
    ref_alerts = data(prom.url, "/api/v1/alerts")["alerts"]
    assert set(ref_alerts[0]) <= set(alerts[0])


def test_recording_rule_output_is_queryable(servers):
    prom, tp = servers
    ours = data(tp.url, "/api/v1/query", {"query": "job:up:sum"})["result"]
    ref = data(prom.url, "/api/v1/query", {"query": "job:up:sum"})["result"]
    assert [r["metric"] for r in ours] == [r["metric"] for r in ref] == [{"__name__": "job:up:sum", "job": "prom"}]
    assert ours[0]["value"][1] == "1"


def test_config_and_flags(servers):
    _, tp = servers
    yaml_text = data(tp.url, "/api/v1/status/config")["yaml"]
    assert "scrape_configs" in yaml_text and "rule_files" in yaml_text
    flags = data(tp.url, "/api/v1/status/flags")
    assert flags["web.enable-admin-api"] == "true" and flags["config.file"].endswith("turboprom.yml")


def test_admin_delete_series_when_enabled(servers):
    prom, tp = servers
    now_ms = int(time.time() * 1000)
    import_text(tp.url, f'deleteme{{a="1"}} 1 {now_ms - 60_000}\ndeleteme{{a="2"}} 2 {now_ms - 60_000}\nkeepme 3 {now_ms - 60_000}\n')
    assert len(data(tp.url, "/api/v1/series", {"match[]": "deleteme"})) == 2
    for url in (prom.url, tp.url):  # both accept the call with 204 No Content
        status, _, body = http("POST", url + "/api/v1/admin/tsdb/delete_series", {"match[]": 'deleteme{a="1"}'})
        assert status == 204, body
    assert data(tp.url, "/api/v1/series", {"match[]": "deleteme"}) == [{"__name__": "deleteme", "a": "2"}]
    status, _, body = http("PUT", tp.url + "/api/v1/admin/tsdb/delete_series", {"match[]": "deleteme"})
    assert status == 204, body
    assert data(tp.url, "/api/v1/series", {"match[]": "deleteme"}) == []
    assert data(tp.url, "/api/v1/series", {"match[]": "keepme"}) == [{"__name__": "keepme"}]
    status, _, body = http("POST", tp.url + "/api/v1/admin/tsdb/delete_series", {})
    assert status == 400 and orjson.loads(body)["error"] == "no match[] parameter provided"


def test_admin_api_cli_flag(tmp_path):
    # Like Prometheus's --web.enable-admin-api: off by default, on with the flag.
    now_ms = int(time.time() * 1000)
    with ServerProcess(tmp_path / "off") as off:
        status, _, body = http("POST", off.url + "/api/v1/admin/tsdb/delete_series", {"match[]": "x"})
        assert status == 500 and orjson.loads(body) == {"status": "error", "errorType": "unavailable", "error": "admin APIs disabled"}
        assert data(off.url, "/api/v1/status/flags")["web.enable-admin-api"] == "false"
    with ServerProcess(tmp_path / "on", extra_args=["--web.enable-admin-api"]) as on:
        import_text(on.url, f"x 1 {now_ms - 1000}\n")
        status, _, body = http("POST", on.url + "/api/v1/admin/tsdb/delete_series", {"match[]": "x"})
        assert status == 204, body
        assert data(on.url, "/api/v1/series", {"match[]": "x"}) == []
        assert data(on.url, "/api/v1/status/flags")["web.enable-admin-api"] == "true"
