"""The demo fleet publishes its simulated GPU prefix caches as vLLM KV events (ZMQ, vLLM's framing and
replay socket): the server's prefix view, pointed at them by the demo config, answers which instance
holds a session's prompt, and the poll process's view agrees."""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from scheduler_metrics.sim.demo_fleet import DemoFleet
from scheduler_metrics.sim.kv_publisher import BLOCK_TOKENS, session_tokens
from scheduler_metrics.sim.signals import instance_name
from tests.helpers import SHARED, ServerProcess, free_port
from turboprom.demo import demo_config


def prefix(base: str, tokens: list[int]) -> dict[str, dict[str, Any]]:
    req = urllib.request.Request(base + "/api/v1/congestion/prefix", data=json.dumps({"token_ids": tokens}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return {d["instance"]: d for d in json.loads(r.read())["data"]["instances"]}


def held(fleet: DemoFleet) -> list[tuple[int, int, int]]:
    """(instance, session, blocks) the fleet's publishers have announced (read while the sim runs)."""
    for _ in range(10):
        try:
            return [(i, s, n) for i, pub in enumerate(fleet.kv_publishers) for s, n in list(pub.blocks.items())]
        except RuntimeError:  # the simulation thread changed a map while it was copied
            continue
    return []


def test_demo_fleet_publishes_kv_events(tmp_path: Path) -> None:
    port, poll = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    fleet = DemoFleet(base, str(SHARED / "traces" / "mooncake_conversation_trace.jsonl"), instances=4, load=0.8,
                      speed=4.0, limit=300)
    raw = demo_config(f"127.0.0.1:{port}", fleet.targets, f"127.0.0.1:{fleet.sched_port}",
                      kv_events=fleet.kv_event_endpoints)
    raw["congestion"]["poll_listen"] = f"127.0.0.1:{poll}"
    cfg = tmp_path / "demo.yml"
    cfg.write_text(yaml.safe_dump(raw))
    with ServerProcess(tmp_path / "data", ["--config", str(cfg)], port=port) as srv:
        fleet.start()
        try:
            deadline = time.time() + 90
            checked: dict[str, int] = {}
            while time.time() < deadline and len(checked) < 3:
                for inst, session, blocks in sorted(held(fleet), key=lambda x: -x[2])[:5]:
                    tokens = session_tokens(session, blocks * BLOCK_TOKENS)
                    got = prefix(srv.url, tokens).get(instance_name(inst))
                    side = prefix(f"http://127.0.0.1:{poll}", tokens).get(instance_name(inst))
                    # the session may grow or be evicted meanwhile: count it once both views saw it whole,
                    # and the instance's load (scraped every 1 s) is known beside it
                    if got and side and got["matched_blocks"] == side["matched_blocks"] == blocks and got["load_known"]:
                        assert got["matched_tokens"] == blocks * BLOCK_TOKENS
                        assert got["cluster"] == "demo" and got["model_name"] == fleet.model
                        checked[f"{inst}/{session}"] = blocks
                time.sleep(0.5)
            assert len(checked) >= 3, (checked, held(fleet)[:5])
            # a prompt no session has is held nowhere
            assert all(d["matched_blocks"] == 0 for d in prefix(srv.url, list(range(5, 5 + 4 * BLOCK_TOKENS))).values())
        finally:
            fleet.stop()
