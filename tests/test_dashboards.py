"""Every panel of the bundled Grafana dashboards returns data against a demo-populated server:
the real server scraping a live simulated fleet (real exporters, Vesta polling the congestion API)."""
from __future__ import annotations

import json
import urllib.error
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from scheduler_metrics.sim.demo_fleet import DemoFleet
from tests.helpers import SHARED, ServerProcess, free_port
from turboprom.dashboards import DASHBOARDS, grafana_json
from turboprom.demo import demo_config
from turboprom.demo_workload import DashboardWorkload


def _query_range(url: str, expr: str, now: float) -> list:
    q = urllib.parse.urlencode({"query": expr, "start": now - 600, "end": now, "step": 5})
    with urllib.request.urlopen(url + "/api/v1/query_range?" + q, timeout=60) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def test_every_dashboard_panel_returns_data(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    fleet = DemoFleet(base, str(SHARED / "traces" / "mooncake_conversation_trace.jsonl"), instances=4, load=0.8, speed=4.0, limit=1500)
    cfg = tmp_path / "demo.yml"
    raw = demo_config(f"127.0.0.1:{port}", fleet.targets, f"127.0.0.1:{fleet.sched_port}")
    raw["scrape_configs"][0]["scrape_interval"] = "2s"
    cfg.write_text(yaml.safe_dump(raw))
    with ServerProcess(tmp_path / "data", ["--config", str(cfg)], port=port) as srv:
        fleet.start()
        try:
            # One out-of-order sample, as any real deployment sees: the rejections panel has something to show.
            now_ms = int(time.time() * 1000)
            for body in (f"late_metric 1 {now_ms}\n", f"late_metric 2 {now_ms - 3_600_000}\n"):
                try:
                    urllib.request.urlopen(urllib.request.Request(srv.url + "/api/v1/import/prometheus", data=body.encode(), method="POST"), timeout=10)
                except urllib.error.HTTPError:
                    pass
            wl = DashboardWorkload(srv.url, range_s=600, step_s=5)
            deadline = time.time() + 150
            missing: list[str] = []
            while time.time() < deadline:
                wl.run_once()
                now = time.time()
                missing = [f"{d.uid}: {p.title}: {q}" for d in DASHBOARDS for p in d.panels for q in p.queries()
                           if not _query_range(srv.url, q, now)]
                if not missing and fleet.completed > 50:
                    break
                time.sleep(5)
            assert not missing, "panels without data:\n" + "\n".join(missing)
            assert wl.errors == 0
        finally:
            fleet.stop()


def test_dashboard_json_matches_the_definitions() -> None:
    for d in DASHBOARDS:
        on_disk = json.loads((Path(__file__).resolve().parent.parent / "docs" / "grafana" / f"{d.uid}.json").read_text())
        assert on_disk == json.loads(json.dumps(grafana_json(d))), f"regenerate docs/grafana with python -m turboprom.dashboards ({d.uid})"


# Grafana's built-in variables a panel query may use (public/app/features/variables: __interval,
# __rate_interval, __range and friends are interpolated by Grafana itself, never defined by a dashboard).
GRAFANA_BUILTINS = {"__interval", "__interval_ms", "__rate_interval", "__range", "__range_s", "__range_ms"}


def test_dashboards_follow_grafanas_import_rules() -> None:
    """What Grafana's dashboard import and file provisioning check or need (schemaVersion 39 dashboards):
    a unique ``uid`` of at most 40 characters, unique panel ids, ``gridPos`` inside the 24-column grid
    without overlaps, every ``$variable`` and ``${datasource}`` defined in ``templating.list`` (file
    provisioning does not resolve ``__inputs``, so there must be none and no ``${DS_...}`` left), a
    ``datasource``-type variable for the Prometheus plugin, unique refIds per panel, and every target
    query a valid PromQL expression once Grafana has interpolated it (checked by the server's parser)."""
    from turboprom.dashboards import FLEET_VARIABLES, expand, variables_in
    from promql.engine import parse

    uids = [d.uid for d in DASHBOARDS]
    assert len(set(uids)) == len(uids)
    for d in DASHBOARDS:
        j = grafana_json(d)
        text = json.dumps(j)
        assert "__inputs" not in j and "${DS_" not in text, d.uid
        assert len(j["uid"]) <= 40 and isinstance(j["schemaVersion"], int)
        names = [v["name"] for v in j["templating"]["list"]]
        assert len(set(names)) == len(names)
        assert {"name": "datasource", "type": "datasource", "query": "prometheus"}.items() <= j["templating"]["list"][0].items()
        defined = set(names) | GRAFANA_BUILTINS
        ids = [p["id"] for p in j["panels"]]
        assert len(set(ids)) == len(ids)
        cells: set[tuple[int, int]] = set()
        for p in j["panels"]:
            g = p["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0 and g["y"] >= 0, (d.uid, p["title"])
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not mine & cells, f"{d.uid}: panel {p['title']!r} overlaps another"
            cells |= mine
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            refs = [t["refId"] for t in p["targets"]]
            assert len(set(refs)) == len(refs) and refs
            for t in p["targets"]:
                assert variables_in(t["expr"]) <= defined, (d.uid, t["expr"])
                assert "[1m]" not in t["expr"] and "[5m]" not in t["expr"], f"fixed rate window in {t['expr']}"
                parse(expand(t["expr"]))
        for v in j["templating"]["list"][1:]:
            assert v["name"] in FLEET_VARIABLES and v["allValue"] == ".*"
            assert variables_in(v["query"]["query"]) <= defined


def _instant(url: str, expr: str) -> list:
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url + "/api/v1/query?" + q, timeout=60) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def test_demo_history_is_continued_by_the_live_scrape(tmp_path: Path) -> None:
    """The demo writes fleet history before its exporters serve: the live scrape then continues the very
    same series (no second copy of any series, nothing refused as out of order), and hour-long panels
    have an hour of data from the start."""
    from turboprom.demo_history import write_history

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    fleet = DemoFleet(base, str(SHARED / "traces" / "mooncake_conversation_trace.jsonl"), instances=2, load=0.8, speed=4.0, limit=300)
    cfg = tmp_path / "demo.yml"
    raw = demo_config(f"127.0.0.1:{port}", fleet.targets, f"127.0.0.1:{fleet.sched_port}")
    cfg.write_text(yaml.safe_dump(raw))
    with ServerProcess(tmp_path / "data", ["--config", str(cfg)], port=port) as srv:
        time.sleep(2.5)  # scrapes of the fleet fail until it serves: nothing of it is stored yet
        assert not _instant(srv.url, "vllm:num_requests_waiting")
        n = write_history(srv.url, fleet.workers, scheduler=fleet.sched_metrics, hours=1.0)
        assert n > 10_000
        hist = {json.dumps(s["metric"], sort_keys=True) for s in _instant(srv.url, "vllm:num_requests_waiting")}
        assert len(hist) == 2
        fleet.start()
        try:
            deadline = time.time() + 60
            while time.time() < deadline:
                live = _instant(srv.url, "count_over_time(vllm:num_requests_waiting[3s])")
                if len(live) == 2:
                    break
                time.sleep(1)
            series = {json.dumps(s["metric"], sort_keys=True) for s in _instant(srv.url, "vllm:num_requests_waiting")}
            assert series == hist, (series, hist)  # the live scrape continues the history's series
            n_hour = _instant(srv.url, "count_over_time(vllm:num_requests_waiting[1h])")
            assert len(n_hour) == 2 and all(float(s["value"][1]) >= 230 for s in n_hour), n_hour
            rejected = _instant(srv.url, 'sum(turboprom_storage_rejected_samples_total{reason=~"out_of_order|too_old"})')
            assert not rejected or float(rejected[0]["value"][1]) == 0, rejected
            ttft = _instant(srv.url, "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[30m] offset 10m)))")
            assert ttft and 0 < float(ttft[0]["value"][1]) < 30, ttft
        finally:
            fleet.stop()
