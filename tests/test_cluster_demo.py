"""``make cluster-demo`` (turboprom/cluster/demo.py): the local cluster with the demo fleet writing into
it through a Prometheus agent and the distributor; the fleet's live series, its history and its
congestion signals answer through the querier, and ^C stops every process it started."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.parse

import pytest

from tests.helpers import REPO, SHARED, free_port, http_json, require_binary, wait_until

pytestmark = pytest.mark.peer


def _value(url: str, q: str, at: float | None = None) -> float | None:
    params = {"query": q, **({"time": at} if at is not None else {})}
    code, body, _ = http_json(f"{url}/api/v1/query?{urllib.parse.urlencode(params)}")
    if code != 200 or not body["data"]["result"]:
        return None
    return float(body["data"]["result"][0]["value"][1])


def test_cluster_demo_fleet_writes_through_the_cluster(tmp_path):
    for b in ("nats-server", "etcd", "prometheus"):
        require_binary(b)
    assert (SHARED / "traces" / "mooncake_conversation_trace.jsonl").exists()
    qport, dport = free_port(), free_port()
    log = tmp_path / "demo.log"
    proc = subprocess.Popen([sys.executable, "-m", "turboprom.cluster.demo", "--dir", str(tmp_path / "c"),
                             "--querier-port", str(qport), "--distributor-port", str(dport), "--instances", "2",
                             "--partitions", "8", "--etcd-members", "1", "--history-hours", "0.1"],
                            cwd=REPO, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    querier = f"http://127.0.0.1:{qport}"
    pids: list[int] = []
    try:
        wait_until(lambda: proc.poll() is None and "remote write:" in log.read_text(), 120, "the demo's banner")
        pids = [int(p) for p in re.findall(r" pid +(\d+) ", log.read_text())]
        assert len(pids) == 5, log.read_text()  # 2 ingesters, distributor, querier, Prometheus agent
        wait_until(lambda: _value(querier, 'count(up{job="vllm-workers"} == 1)') == 2, 60,
                   "both fleet workers scraped by the agent and answered through the querier")
        assert _value(querier, "sum(vllm:num_requests_running)") is not None
        # the remote-written history: samples three minutes back
        assert _value(querier, "count(vllm:num_requests_running)", at=time.time() - 180) == 2

        # the congestion API through the querier: its tracker fed from the ingesters
        def fresh_instances() -> list[dict]:
            code, body, _ = http_json(f"{querier}/api/v1/congestion")
            assert code == 200 and body["status"] == "success", body
            return [d for d in body["data"]["instances"] if not d.get("stale")]

        wait_until(lambda: len(fresh_instances()) == 2, 60, "both fleet workers in the querier's congestion signals")
        assert all(d["model_name"] == "qwen2.5-7b" and d["queue_length"] is not None for d in fresh_instances())
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(90)
    assert proc.returncode == 0, log.read_text()[-3000:]
    alive = [p for p in pids if _running(p)]
    assert not alive, f"processes left running after ^C: {alive}"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" not in f.read().lower()
    except FileNotFoundError:
        return False
