"""Scraper state through the real server: self_scrape, /api/v1/targets (the route reading
ScrapeManager.targets_snapshot), a failing target, and bad scrape config refused at startup."""
from __future__ import annotations

import json
import time
import urllib.request

import numpy as np
import pytest

from storage.matchers import Matcher
from tests.helpers import ServerProcess, free_port
from tests.test_ingest_support import read_stored


def test_self_scrape_and_targets_api(tmp_path):
    cfg = tmp_path / "config.yml"
    cfg.write_text("self_scrape: {scrape_interval: 1s}\n")
    with ServerProcess(tmp_path / "data", extra_args=["--config", str(cfg)]) as s:
        deadline = time.time() + 20
        active = []
        while time.time() < deadline:
            doc = json.loads(urllib.request.urlopen(s.url + "/api/v1/targets", timeout=10).read())
            active = doc["data"]["activeTargets"]
            if active and active[0]["health"] == "up":
                break
            time.sleep(0.3)
        time.sleep(1.5)
    assert len(active) == 1
    t = active[0]
    assert t["labels"] == {"job": "turboprom", "instance": f"127.0.0.1:{s.port}"}
    assert t["scrapePool"] == "turboprom" and t["scrapeUrl"] == f"http://127.0.0.1:{s.port}/metrics"
    assert t["health"] == "up" and t["lastError"] == "" and t["scrapeInterval"] == "1s"
    assert t["discoveredLabels"]["__address__"] == f"127.0.0.1:{s.port}"
    got = read_stored(s.data_dir, [Matcher("job", "=", "turboprom"), Matcher("__name__", "=", "turboprom_ingest_in_flight_batches")])
    assert got, "the server's own /metrics were not ingested"
    (_, up), = read_stored(s.data_dir, [Matcher("job", "=", "turboprom"), Matcher("__name__", "=", "up")]).values()
    assert np.all(up == 1.0)


def test_failing_target_reported_down(tmp_path):
    dead = free_port()
    cfg = tmp_path / "config.yml"
    cfg.write_text(f"scrape_configs:\n  - job_name: gone\n    scrape_interval: 1s\n    scrape_timeout: 500ms\n"
                   f"    static_configs: [{{targets: ['127.0.0.1:{dead}']}}]\n"
                   f"    relabel_configs: [{{action: drop, source_labels: [__address__], regex: 'nomatch'}}]\n")
    with ServerProcess(tmp_path / "data", extra_args=["--config", str(cfg)]) as s:
        deadline = time.time() + 20
        t = {}
        while time.time() < deadline:
            doc = json.loads(urllib.request.urlopen(s.url + "/api/v1/targets", timeout=10).read())
            t = doc["data"]["activeTargets"][0]
            if t["health"] != "unknown":
                break
            time.sleep(0.3)
    assert t["health"] == "down"
    assert f"127.0.0.1:{dead}" in t["lastError"]


def test_bad_scrape_config_fails_startup(tmp_path):
    cfg = tmp_path / "config.yml"
    cfg.write_text("scrape_configs:\n  - job_name: x\n    scrape_interval: 5s\n    scrape_timeout: 10s\n")
    with pytest.raises(RuntimeError) as e:
        ServerProcess(tmp_path / "data", extra_args=["--config", str(cfg)]).start(timeout=30)
    assert "scrape timeout greater than scrape interval" in str(e.value)
