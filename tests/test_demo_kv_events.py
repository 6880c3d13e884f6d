"""The demo fleet publishes its simulated GPU prefix caches as vLLM KV events (ZMQ, vLLM's framing and
replay socket): the server's prefix view, pointed at them by the demo config, answers which instance
holds a session's prompt, and the poll process's view agrees."""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml
import zmq

from scheduler_metrics.sim.demo_fleet import DemoFleet
from scheduler_metrics.sim.kv_publisher import BLOCK_TOKENS, SessionKVPublisher, session_tokens
from scheduler_metrics.sim.signals import instance_name
from tests.helpers import SHARED, ServerProcess, held_port
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
    with held_port() as port, held_port() as poll:  # the fleet's exporters get other ports
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


def test_publisher_binds_at_construction_and_releases_a_failed_bind() -> None:
    """The publisher's sockets are bound when it is made (ports the kernel picks, so nothing can take
    them before the server connects); a bind that fails closes what was opened, and the endpoint is
    free again for the next publisher."""
    a = SessionKVPublisher()
    try:
        assert a.endpoint.startswith("tcp://127.0.0.1:") and a.endpoint != a.replay_endpoint
        with pytest.raises(zmq.ZMQError):
            SessionKVPublisher("tcp://127.0.0.1:*", a.replay_endpoint)  # replay port taken
        # events reach a subscriber connected to the reported endpoint, in vLLM's framing
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(a.endpoint)
        try:
            deadline, got = time.time() + 10, None
            while got is None and time.time() < deadline:  # a PUB drops what it sends before the join
                a.blocks.clear()
                a.sync({7: 2 * BLOCK_TOKENS})
                if sub.poll(200):
                    got = sub.recv_multipart()
            assert got is not None
            topic, seq, payload = got
            assert topic == b"kv-events" and len(seq) == 8
            kind, hashes, *_ = msgpack.unpackb(payload)[1][0]
            assert kind == "BlockStored" and len(hashes) == 2
        finally:
            sub.close(0)
            ctx.term()
    finally:
        a.close()
    a.close()  # idempotent
    b = SessionKVPublisher(a.endpoint, a.replay_endpoint)  # both ports free again
    b.close()
