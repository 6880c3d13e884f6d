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
                missing = [f"{d.uid}: {p.title}: {p.expr}" for d in DASHBOARDS for p in d.panels if not _query_range(srv.url, p.expr, now)]
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
        assert [p["targets"][0]["expr"] for p in on_disk["panels"]] == [p.expr for p in d.panels]


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
