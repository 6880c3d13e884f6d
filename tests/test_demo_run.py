"""`make demo` end to end (``python -m turboprom.demo``): the server starts, the fleet's history is
written, the fleet starts, and only then are its exporters scraped (its scrape jobs join the config
by a SIGHUP reload), so a new user's first screen has no failed scrapes; every worker and the
scheduler are up, and Ctrl-C (SIGINT) stops it cleanly."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from tests.helpers import REPO, free_port, wait_until


def _up_by_job(base: str) -> dict[str, float]:
    q = urllib.parse.urlencode({"query": "sum by (job) (up)"})
    try:
        with urllib.request.urlopen(f"{base}/api/v1/query?{q}", timeout=5) as r:
            res = json.load(r)["data"]["result"]
    except OSError:
        return {}
    return {x["metric"].get("job", ""): float(x["value"][1]) for x in res}


def test_demo_scrapes_its_fleet_only_once_it_serves(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    data = tmp_path / "data"
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "turboprom.demo", "--data-dir", str(data), "--listen",
                                 f"127.0.0.1:{port}", "--history-hours", "0.05", "--instances", "4"],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _up_by_job(base).get("vllm-workers") == 4 and _up_by_job(base).get("scheduler") == 1,
                   120, "the demo fleet's 4 workers and its scheduler scraped and up")
        text = log.read_text()
        assert "demo: wrote 0.05 h of fleet history" in text, text
        assert "scrape of" not in text, text  # no failed scrape of a fleet exporter that was not serving yet
        assert "completed loading of configuration file" in text, text
        jobs = {j["job_name"] for j in yaml.safe_load((data / "demo-config.yml").read_text())["scrape_configs"]}
        assert jobs == {"turboprom", "vllm-workers", "scheduler"}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()
