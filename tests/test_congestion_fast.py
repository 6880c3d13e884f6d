"""Fast congestion signal paths on the real server: vLLM KV events over ZMQ (a real PUB socket here,
vLLM's wire format), the fast scrape of real HTTP exporters (prometheus-client, as vLLM serves its
/metrics), pushed load, SSE deltas, and data age."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import msgpack
import pytest
import zmq
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from tests.helpers import ServerProcess, free_port, free_ports, http_json

BLOCK = 4  # tokens per KV block in these tests


def wait_for(fn: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    end = time.time() + timeout
    last = None
    while time.time() < end:
        try:
            last = fn()
        except (KeyError, IndexError, StopIteration, TypeError):
            last = None
        if last:
            return last
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def post(url: str, body: bytes, ctype: str = "text/plain") -> tuple[int, dict]:
    status, out, _ = http_json(url, body, {"Content-Type": ctype})
    return status, out


def congestion(base: str, **params: Any) -> dict[str, Any]:
    q = urllib.parse.urlencode(params, doseq=True)
    with urllib.request.urlopen(f"{base}/api/v1/congestion" + (f"?{q}" if q else ""), timeout=10) as r:
        return json.loads(r.read())["data"]


def prefix(base: str, tokens: list[int], **params: Any) -> dict[str, dict[str, Any]]:
    q = urllib.parse.urlencode(params, doseq=True)
    status, body = post(f"{base}/api/v1/congestion/prefix" + (f"?{q}" if q else ""),
                        json.dumps({"token_ids": tokens}).encode(), "application/json")
    assert status == 200, body
    return {d["instance"]: d for d in body["data"]["instances"]}


class VLLMPublisher:
    """vLLM's ZmqEventPublisher framing: PUB, [topic, 8-byte big-endian seq, msgpack KVEventBatch]."""

    def __init__(self, port: int, topic: bytes = b"kv-events") -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(f"tcp://127.0.0.1:{port}")
        self.topic = topic
        self.seq = 0

    def send(self, *events: list, skip: int = 0, dp_rank: int | None = None) -> None:
        self.seq += skip
        batch: list = [time.time(), list(events)]
        if dp_rank is not None:
            batch.append(dp_rank)
        self.sock.send_multipart([self.topic, self.seq.to_bytes(8, "big"), msgpack.packb(batch)])
        self.seq += 1

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def replayed(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        lines = [ln for ln in r.read().decode().splitlines()
                 if ln.startswith("turboprom_kv_events_replayed_batches_total{")]
    return sum(float(ln.split()[-1]) for ln in lines)


class ReplayingPublisher(VLLMPublisher):
    """vLLM's publisher with ``replay_endpoint``: every batch kept in a bounded buffer, and a ROUTER
    that answers ``[id, b"", start_seq]`` with ``[id, b"", seq, payload]`` for each buffered batch
    from ``start_seq`` on, then ``[id, b"", -1, b""]``. ``send(..., lost=True)`` buffers a batch
    without publishing it (what a dropped message looks like to the subscriber)."""

    def __init__(self, port: int, replay_port: int, buffer_steps: int = 100) -> None:
        super().__init__(port)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(f"tcp://127.0.0.1:{replay_port}")
        self.buffer: list[tuple[int, bytes]] = []
        self.buffer_steps = buffer_steps
        self.requests: list[int] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def send(self, *events: list, skip: int = 0, dp_rank: int | None = None, lost: bool = False) -> None:
        payload = msgpack.packb([time.time(), list(events)])
        with self._lock:
            self.buffer = (self.buffer + [(self.seq, payload)])[-self.buffer_steps:]
            if not lost:
                self.sock.send_multipart([self.topic, self.seq.to_bytes(8, "big"), payload])
            self.seq += 1

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            ident, _, start = self.router.recv_multipart()
            start_seq = int.from_bytes(start, "big")
            self.requests.append(start_seq)
            with self._lock:
                for seq, payload in self.buffer:
                    if seq >= start_seq:
                        self.router.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
                self.router.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.router.close(0)
        super().close()


def test_missed_kv_events_are_replayed(tmp_path: Path) -> None:
    """Batches published before the subscriber joined, and batches lost on the way, come back from the
    publisher's replay socket; only what its buffer no longer holds counts as missed."""
    kv, replay, poll = free_ports(3)
    cfg = tmp_path / "turboprom.yml"
    cfg.write_text(f"congestion:\n  resolution: 0\n  poll_listen: '127.0.0.1:{poll}'\n  kv_events:\n    - {{endpoint: 'tcp://127.0.0.1:{kv}', "
                   f"replay_endpoint: 'tcp://127.0.0.1:{replay}', instance: r0, cluster: kv, model_name: m, "
                   f"topic: kv-events}}\n")
    pub = ReplayingPublisher(kv, replay, buffer_steps=6)
    prompt = list(range(500, 524))  # 6 blocks
    try:
        # before the server exists: nobody receives these, the buffer keeps them
        pub.send(stored([1], None, prompt[0:4]))
        pub.send(stored([2], 1, prompt[4:8]))
        with ServerProcess(tmp_path / "data", ["--config", str(cfg)]) as server:
            url = server.url

            def joined() -> bool:  # the first live batch reaches a late subscriber: it asks for the rest
                pub.send(stored([3], 2, prompt[8:12]))
                return prefix(url, prompt).get("r0", {}).get("matched_blocks", 0) >= 3

            wait_for(joined, what="late join replayed")
            assert pub.requests[0] == 0
            m = prefix(url, prompt)["r0"]
            assert m["missed_event_batches"] == 0, m
            assert replayed(url) >= 2  # at least the two sent before the server started
            # two batches lost on the way: the next live one reveals the gap, the replay fills it
            before = replayed(url)
            pub.send(stored([4], 3, prompt[12:16]), lost=True)
            pub.send(stored([5], 4, prompt[16:20]), lost=True)
            pub.send(stored([6], 5, prompt[20:24]))
            m = wait_for(lambda: (r := prefix(url, prompt)["r0"])["matched_blocks"] == 6 and r, what="gap replayed")
            assert m["missed_event_batches"] == 0 and m["matched_tokens"] == 24
            assert replayed(url) - before == 2
            # a gap beyond the buffer's horizon (6 batches): what it no longer holds is missed
            before = replayed(url)
            for k in range(8):
                pub.send(["BlockRemoved", [900 + k], "GPU"], lost=True)
            pub.send(["BlockRemoved", [6], "GPU"])
            m = wait_for(lambda: (r := prefix(url, prompt)["r0"])["matched_blocks"] == 5 and r, what="horizon gap")
            assert m["missed_event_batches"] == 3, m  # 8 lost, the last 5 still buffered beside the live one
            assert replayed(url) - before == 5
            # the poll process subscribes to the same publisher (and replays alike): same prefix view
            side = wait_for(lambda: (r := prefix(f"http://127.0.0.1:{poll}", prompt).get("r0"))
                            and r["missed_event_batches"] == 3 and r, what="the poll process's view")
            assert {k: side[k] for k in ("matched_blocks", "matched_tokens", "cached_blocks", "missed_event_batches")} \
                == {k: m[k] for k in ("matched_blocks", "matched_tokens", "cached_blocks", "missed_event_batches")}
            status, out = post(f"http://127.0.0.1:{poll}/api/v1/congestion/prefix", b'{"token_ids": [1, -2]}')
            assert status == 400 and "token_ids" in out["error"]
    finally:
        pub.close()


def stored(hashes: list[int], parent: int | None, tokens: list[int], lora: int | None = None, medium: str | None = "GPU") -> list:
    return ["BlockStored", hashes, parent, tokens, BLOCK, lora, medium]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp: Path = tmp_path_factory.mktemp("congestion-fast")
    kv_a, kv_b, *exporter_ports = free_ports(4)
    regs = []
    exporters = []
    for i in range(2):
        reg = CollectorRegistry()
        g = Gauge("vllm:num_requests_waiting", "waiting", ["model_name", "cluster"], registry=reg)
        g.labels("llama", "fast").set(0)
        Gauge("vllm:num_requests_running", "running", ["model_name", "cluster"], registry=reg).labels("llama", "fast").set(1)
        Gauge("unrelated_big_family", "noise", ["k"], registry=reg).labels("x").set(1)
        port = exporter_ports[i]
        server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
        exporters.append((server, thread))
        regs.append((port, g))
    cfg = tmp / "turboprom.yml"
    cfg.write_text(f"""
scrape_configs:
  - job_name: vllm
    scrape_interval: 3s
    static_configs:
      - targets: ["127.0.0.1:{regs[0][0]}", "127.0.0.1:{regs[1][0]}"]
congestion:
  stale_after: 30s
  resolution: 0
  fast_scrape_interval: 100ms
  fast_scrape_jobs: [vllm]
  kv_events:
    - {{endpoint: "tcp://127.0.0.1:{kv_a}", instance: e0, cluster: kv, model_name: llama, topic: kv-events}}
    - {{endpoint: "tcp://127.0.0.1:{kv_b}", instance: e1, cluster: kv, model_name: llama}}
""")
    pubs = [VLLMPublisher(kv_a), VLLMPublisher(kv_b, topic=b"")]
    try:
        with ServerProcess(tmp / "data", ["--config", str(cfg)]) as server:
            yield {"url": server.url, "pubs": pubs, "exporters": regs}
    finally:
        for p in pubs:
            p.close()
        for server, thread in exporters:
            server.shutdown()
            server.server_close()


def test_kv_events_prefix_view(env: dict[str, Any]) -> None:
    url, (a, b) = env["url"], env["pubs"]
    prompt = list(range(100, 112))  # 3 full blocks of 4 tokens
    # load of the two engines, pushed by themselves (not stored: the tracker only)
    body = (b'vllm:num_requests_waiting{cluster="kv",model_name="llama",instance="e0"} 7\n'
            b'vllm:num_requests_waiting{cluster="kv",model_name="llama",instance="e1"} 1\n')
    status, out = post(url + "/api/v1/congestion/push", body)
    assert status == 200 and out["data"]["samples"] == 2
    wait_for(lambda: len(congestion(url, cluster="kv")["instances"]) == 2, what="pushed load in the snapshot")

    # a PUB socket drops what it sends before the subscriber joins: publish until the view shows it
    def both_hold_first_block() -> bool:
        a.send(stored([11], None, prompt[:4]))
        b.send(stored([91], None, prompt[:4]), dp_rank=0)
        m = prefix(url, prompt)
        return m.get("e0", {}).get("matched_blocks") == 1 and m.get("e1", {}).get("matched_blocks") == 1

    wait_for(both_hold_first_block, what="first KV events seen")
    # e0 stores the next two blocks of the prompt (engine hashes differ: the index chains tokens)
    a.send(stored([12, 13], 11, prompt[4:12]))
    m = wait_for(lambda: (r := prefix(url, prompt))["e0"]["matched_blocks"] == 3 and r, what="e0 holds 3 blocks")
    assert m["e0"]["matched_tokens"] == 12 and m["e1"]["matched_blocks"] == 1
    assert m["e0"]["queue_length"] == 7 and m["e1"]["queue_length"] == 1 and m["e0"]["load_known"]
    assert list(m) == ["e0", "e1"]  # longest prefix first
    assert m["e0"]["kv_events_age_seconds"] is not None and m["e0"]["kv_events_age_seconds"] < 5
    # a different prompt sharing only the first block, and a LoRA adapter that never matches the base
    other = prompt[:4] + [1, 2, 3, 4]
    assert prefix(url, other)["e0"]["matched_blocks"] == 1
    status, out = post(url + "/api/v1/congestion/prefix", json.dumps({"token_ids": prompt, "lora_id": 3}).encode())
    assert status == 200 and all(d["matched_blocks"] == 0 for d in out["data"]["instances"])
    # an unknown parent (missed events) never matches from the start of a prompt
    b.send(stored([95], 777, prompt[4:8]))
    # eviction of the middle block cuts e0's match to 1
    a.send(["BlockRemoved", [12], "GPU"])
    wait_for(lambda: prefix(url, prompt)["e0"]["matched_blocks"] == 1, what="eviction applied")
    assert prefix(url, prompt)["e1"]["matched_blocks"] == 1
    # a sequence gap is reported; AllBlocksCleared empties the instance
    a.send(["AllBlocksCleared"], skip=2)
    m = wait_for(lambda: (r := prefix(url, prompt))["e0"]["matched_blocks"] == 0 and r, what="cleared")
    assert m["e0"]["missed_event_batches"] == 2 and m["e0"]["cached_blocks"] == 0
    assert m["e1"]["cached_blocks"] == 2
    # filters, and bad requests named
    assert set(prefix(url, prompt, instance="e1")) == {"e1"}
    status, out = post(url + "/api/v1/congestion/prefix", b'{"token_ids": [1, -2]}')
    assert status == 400 and out["errorType"] == "bad_data" and "token_ids" in out["error"]
    for bad in (b'{"token_ids": [1, "2"]}', b'{"token_ids": [1, 2.5]}', b'{"token_ids": [[1], [2]]}',
                b'{"token_ids": [true, false]}', b'{"token_ids": [1, 18446744073709551615]}', b'{"token_ids": 7}'):
        status, out = post(url + "/api/v1/congestion/prefix", bad)
        assert status == 400 and "token_ids" in out["error"], (bad, status, out)
    status, out = post(url + "/api/v1/congestion/prefix", b'{"tokens": [1]}')
    assert status == 400 and "unknown field" in out["error"]


def test_fast_scrape_is_fresh_and_not_stored(env: dict[str, Any]) -> None:
    url = env["url"]
    port, gauge = env["exporters"][0]
    inst = f"127.0.0.1:{port}"
    wait_for(lambda: congestion(url, instance=inst)["instances"], what="scraped instance")
    for v in (5, 9, 3):
        gauge.labels("llama", "fast").set(v)
        t0 = time.time()
        d = wait_for(lambda: (x := congestion(url, instance=inst)["instances"]) and x[0]["queue_length"] == v and x[0],
                     timeout=3, what=f"queue_length {v} via the fast scrape")
        # sooner than the 3 s scrape interval could (the bound leaves room for a loaded CI machine; the
        # latency itself is measured by bench/congestion_bench.py); the entry's data age says how old
        # its newest sample is
        assert time.time() - t0 < 2.5
        assert 0 <= d["age_seconds"] < 2.5
    # the second engine exposes the same series text; one round is parsed as one body, yet it stays its own series
    other = f"127.0.0.1:{env['exporters'][1][0]}"
    assert congestion(url, instance=other)["instances"][0]["queue_length"] == 0
    # the fast samples were not stored: the stored series has one sample per 3 s scrape, not one per 100 ms
    q = urllib.parse.urlencode({"query": f'count_over_time(vllm:num_requests_waiting{{instance="{inst}"}}[30s])'})

    def stored() -> float:
        with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as r:
            res = json.loads(r.read())["data"]["result"]
        return float(res[0]["value"][1]) if res else 0.0

    assert 1 <= wait_for(stored, timeout=8, what="a stored sample from the normal scrape") <= 11

    def fast_rounds() -> float:  # rounds counted as they run (several per normal scrape)
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            text = r.read().decode()
        ok = [ln for ln in text.splitlines() if ln.startswith('turboprom_fast_scrapes_total{job="vllm",outcome="ok"}')]
        return float(ok[0].split()[-1]) if ok else 0.0

    wait_for(lambda: fast_rounds() >= 10, timeout=10, what="ten fast-scrape rounds in /metrics")


def test_stream_deltas_at_interval(env: dict[str, Any]) -> None:
    url = env["url"]
    events: list[tuple[str, dict]] = []
    arrived: list[float] = []
    done = threading.Event()

    def listen() -> None:
        q = urllib.parse.urlencode({"delta": "true", "interval": "0.2", "cluster": "push", "limit": 4})
        with urllib.request.urlopen(f"{url}/api/v1/congestion/stream?{q}", timeout=20) as r:
            kind = ""
            for raw in r:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    events.append((kind, json.loads(line[6:])))
                    arrived.append(time.monotonic())
        done.set()

    def push(inst: str, v: int) -> None:
        status, _ = post(url + "/api/v1/congestion/push",
                         f'vllm:num_requests_waiting{{cluster="push",model_name="m",instance="{inst}"}} {v}\n'.encode())
        assert status == 200

    push("p0", 1)
    push("p1", 1)
    wait_for(lambda: len(congestion(url, cluster="push")["instances"]) == 2, what="pushed instances")
    th = threading.Thread(target=listen, daemon=True)
    th.start()
    wait_for(lambda: events, what="first event")
    for k in range(2, 8):
        push("p1", k)
        time.sleep(0.1)
    assert done.wait(20)
    kinds = [k for k, _ in events]
    assert kinds[0] == "congestion" and set(kinds[1:]) == {"delta"}
    full = events[0][1]
    assert {d["instance"] for d in full["instances"]} == {"p0", "p1"}
    for _, d in events[1:]:
        # only what changed: p1 (and its cluster row), never the unchanged p0
        assert {x["instance"] for x in d["instances"]} <= {"p1"} and d["removed_instances"] == []
    assert any(d["instances"] for _, d in events[1:])
    versions = [d["version"] for _, d in events]
    assert versions == sorted(versions)
    gaps = [b - a for a, b in zip(arrived, arrived[1:])]
    assert min(gaps) >= 0.15, gaps  # paced by interval=0.2 (the server sleeps that long after each event)


def test_push_refuses_bad_input(env: dict[str, Any]) -> None:
    url = env["url"]
    status, out = post(url + "/api/v1/congestion/push", b"vllm:num_requests_waiting{oops 1\n")
    assert status == 400 and out["errorType"] == "bad_data"
    status, out, _ = http_json(url + "/api/v1/congestion/push", b"x 1\n", {"X-Scope-OrgID": "other"})
    assert status == 400 and "default tenant" in out["error"]


def test_model_server_protocol_endpoint(env: dict[str, Any]) -> None:
    """What an endpoint picker (llm-d's EPP) scrapes from a model server, served per instance from the
    tracker's view; the exposition passes Prometheus's own linter (promtool check metrics)."""
    import subprocess

    from prometheus_client.parser import text_string_to_metric_families

    from tests.helpers import require_binary

    url = env["url"]
    body = (b'vllm:num_requests_waiting{cluster="kv",model_name="llama",instance="e2"} 4\n'
            b'vllm:num_requests_running{cluster="kv",model_name="llama",instance="e2"} 2\n'
            b'vllm:kv_cache_usage_perc{cluster="kv",model_name="llama",instance="e2"} 0.25\n')
    assert post(url + "/api/v1/congestion/push", body)[0] == 200
    target = f"{url}/api/v1/congestion/model_server/e2/metrics?cluster=kv"

    def scrape() -> str:
        try:
            with urllib.request.urlopen(target, timeout=10) as r:
                assert r.headers["Content-Type"].startswith("text/plain")
                return r.read().decode()
        except urllib.error.HTTPError as e:  # 404 until the snapshot after the push is built
            assert e.code == 404
            return ""

    text = wait_for(lambda: (t := scrape()) and "vllm:num_requests_waiting" in t and t, what="model-server view")
    got = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert got["vllm:num_requests_waiting"] == 4 and got["vllm:num_requests_running"] == 2
    assert got["vllm:kv_cache_usage_perc"] == 0.25 and 0 <= got["turboprom_congestion_age_seconds"] < 5
    lint = subprocess.run([require_binary("promtool"), "check", "metrics"], input=text.encode(), capture_output=True,
                          timeout=30)
    # exit 3 = lint findings only (1 would be a parse error); the only finding allowed is the one
    # vLLM's own /metrics gets too: its names contain ':'
    problems = [ln for ln in (lint.stdout + lint.stderr).decode().splitlines() if ln.strip()]
    assert lint.returncode in (0, 3) and all(ln.endswith("metric names should not contain ':'") for ln in problems), problems
    # e0's KV events carry its block size (the protocol's optional BlockSize)
    with urllib.request.urlopen(f"{url}/api/v1/congestion/model_server/e0/metrics", timeout=10) as r:
        assert 'vllm:cache_config_info{block_size="4"} 1.0' in r.read().decode()
    status, out, _ = http_json(f"{url}/api/v1/congestion/model_server/nowhere/metrics")
    assert status == 404 and out["errorType"] == "not_found"


def test_poll_endpoint_in_its_own_process(tmp_path: Path) -> None:
    """congestion.poll_listen: the same poll answered by a child process fed every new snapshot."""
    port = free_port()
    cfg = tmp_path / "turboprom.yml"
    cfg.write_text(f"congestion:\n  resolution: 0\n  poll_listen: '127.0.0.1:{port}'\n")
    with ServerProcess(tmp_path / "data", ["--config", str(cfg)]) as server:
        side = f"http://127.0.0.1:{port}"
        for v in (3, 8):
            assert post(server.url + "/api/v1/congestion/push",
                        f'vllm:num_requests_waiting{{cluster="pp",model_name="m",instance="w{v}"}} {v}\n'.encode())[0] == 200
            got = wait_for(lambda: (d := congestion(side, cluster="pp")["instances"]) and any(
                x["queue_length"] == v for x in d) and d, what=f"queue {v} in the poll process")
        main = congestion(server.url, cluster="pp")
        side_view = wait_for(lambda: (d := congestion(side, cluster="pp")) and d["version"] >= main["version"] and d,
                             what="same snapshot version")
        assert {x["instance"] for x in side_view["instances"]} == {x["instance"] for x in main["instances"]} == {"w3", "w8"}
        assert [x["instance"] for x in got] == ["w3", "w8"]
        status, out, _ = http_json(side + "/api/v1/congestion?include_stale=maybe")
        assert status == 400 and "include_stale" in out["error"]
        status, out, _ = http_json(side + "/api/v1/congestion", headers={"X-Scope-OrgID": "other"})
        assert status == 200 and out["data"]["instances"] == [] and out["data"]["version"] == 0
        # Same ETag on both ports for the same snapshot; If-None-Match with it answers 304 without a body
        # until the next snapshot.
        # (snapshots are rebuilt every rebuild_period, 0.5 s, so a revalidation can race the next one)
        for base in (server.url, side):
            assert wait_for(lambda: revalidate(base, etag_of(base)[0]) == (304, b""), what=f"304 from {base}")
        main_tag, main_version = etag_of(server.url)
        side_tag, side_version = etag_of(side)
        assert main_tag.split("-")[0] == side_tag.split("-")[0]  # one epoch: one tracker behind both ports
        if main_version == side_version:
            assert main_tag == side_tag
        assert revalidate(side, '"0-0"')[0] == 200
        assert post(server.url + "/api/v1/congestion/push",
                    b'vllm:num_requests_waiting{cluster="pp",model_name="m",instance="w3"} 30\n')[0] == 200
        tag, _ = etag_of(side)
        assert wait_for(lambda: revalidate(side, tag)[0] == 200, what="a new snapshot (200 with a body)")


def etag_of(base: str) -> tuple[str, int]:
    with urllib.request.urlopen(base + "/api/v1/congestion?cluster=pp", timeout=10) as r:
        return r.headers["ETag"], json.loads(r.read())["data"]["version"]


def revalidate(base: str, tag: str) -> tuple[int, bytes]:
    req = urllib.request.Request(base + "/api/v1/congestion?cluster=pp", headers={"If-None-Match": tag})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_poll_process_applies_the_servers_auth(tmp_path: Path) -> None:
    """The poll port answers only callers the main server would (same web config: users, roles,
    tenants), and is refused beyond loopback without auth, as the main port is."""
    import base64

    import bcrypt

    pw = {"reader": "reader-pw", "teamb": "teamb-pw", "nobody": "x"}
    web = tmp_path / "web.yml"
    hashes = "".join(f"  {u}: {bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=4)).decode()}\n" for u, p in pw.items()
                     if u != "nobody")
    web.write_text(f"basic_auth_users:\n{hashes}tenants:\n  teamb: [team-b]\n")
    port = free_port()
    cfg = tmp_path / "turboprom.yml"
    cfg.write_text(f"congestion:\n  resolution: 0\n  poll_listen: '127.0.0.1:{port}'\n")

    def basic(user: str) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{pw[user]}".encode()).decode()}

    with ServerProcess(tmp_path / "data", ["--config", str(cfg), "--web.config.file", str(web)]) as server:
        side = f"http://127.0.0.1:{port}/api/v1/congestion"
        status, out, hdrs = http_json(side)
        assert status == 401 and out["errorType"] == "unauthorized" and "WWW-Authenticate" in hdrs
        assert http_json(side, headers=basic("nobody"))[0] == 401
        status, out, _ = http_json(side, headers=basic("reader"))
        assert status == 200 and out["status"] == "success"
        # a tenant-restricted user may not read the default tenant's view here either
        status, out, _ = http_json(side, headers=basic("teamb"))
        assert status == 403 and "tenant" in out["error"]
        status, out, _ = http_json(side, headers={**basic("teamb"), "X-Scope-OrgID": "team-b"})
        assert status == 200 and out["data"]["instances"] == []
        assert http_json(server.url + "/api/v1/congestion", headers=basic("reader"))[0] == 200
    # no auth configured: a non-loopback poll address is refused at startup, naming the way out
    cfg.write_text("congestion:\n  poll_listen: '0.0.0.0:0'\n")
    proc = subprocess.run([sys.executable, "-m", "turboprom", "serve", "--config", str(cfg), "--data-dir",
                           str(tmp_path / "d2"), "--listen", f"127.0.0.1:{free_port()}"],
                          capture_output=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode != 0 and b"without authentication" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("raw, message", [
    ({"fast_scrape_interval": "10ms", "fast_scrape_jobs": ["vllm"]}, "between 50ms and 250ms"),
    ({"fast_scrape_jobs": ["vllm"]}, "needs fast_scrape_interval"),
    ({"fast_scrape_interval": "100ms", "fast_scrape_jobs": "vllm"}, "list of job names"),
    ({"kv_events": [{"instance": "a"}]}, "endpoint is required"),
    ({"kv_events": [{"endpoint": "127.0.0.1:5557", "instance": "a"}]}, "ZMQ address"),
    ({"kv_events": [{"endpoint": "tcp://h:1", "instance": "a", "port": 1}]}, "unknown key(s) port"),
    ({"kv_events": [{"endpoint": "tcp://h:1", "instance": "a", "replay_endpoint": "h:2"}]},
     "replay_endpoint must be a ZMQ address"),
    ({"poll_listen": "9091"}, "host:port"),
    ({"stream_interval": -1}, "stream_interval must be >= 0"),
])
def test_fast_path_settings_refused_with_a_reason(raw: dict, message: str) -> None:
    from scheduler_metrics.congestion import CongestionConfig

    with pytest.raises(ValueError) as e:
        CongestionConfig.from_mapping(raw)
    assert message in str(e.value)


def test_prefix_index_counts_each_medium() -> None:
    """A block offloaded to CPU and kept on GPU stays held until both copies are evicted."""
    from scheduler_metrics.congestion.prefix_index import PrefixIndex

    idx = PrefixIndex()
    key = ("c", "m", "w")
    toks = [5, 6, 7, 8]
    idx.stored(key, [1], None, toks, 4, medium="GPU")
    idx.stored(key, [1], None, toks, 4, medium="CPU")
    assert idx.match(toks)[key]["matched_blocks"] == 1
    idx.removed(key, [1], "GPU")
    assert idx.match(toks)[key]["matched_blocks"] == 1
    idx.removed(key, [1], "CPU")
    assert idx.match(toks)[key]["matched_blocks"] == 0 and idx.status()[key]["distinct_blocks"] == 0
    with pytest.raises(ValueError, match="need 8 token ids"):
        idx.stored(key, [2, 3], 1, toks, 4)


def test_lora_adapters_from_vllm_exposition(tmp_path: Path) -> None:
    """vLLM's ``vllm:lora_requests_info`` (labels running/waiting adapters and max_lora, no
    model_name, the value the update time) scraped from a real exporter: each instance entry carries
    the adapters of its newest series, and the model-server view serves them back as vLLM names them."""
    from prometheus_client.parser import text_string_to_metric_families

    reg = CollectorRegistry()
    Gauge("vllm:num_requests_waiting", "waiting", ["model_name", "cluster"], registry=reg).labels("llama", "lo").set(3)
    # vLLM's label names; ``cluster`` stands for what the scrape config's target labels add to every series
    lora = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                 ["max_lora", "waiting_lora_adapters", "running_lora_adapters", "cluster"], registry=reg)
    lora.labels("4", "", "sql-lora", "lo").set(1000.0)  # an older adapter set stays exported
    lora.labels("4", "tts-lora", "sql-lora,chat-lora", "lo").set(2000.0)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    cfg = tmp_path / "turboprom.yml"
    cfg.write_text(f"""
scrape_configs:
  - job_name: vllm
    scrape_interval: 10s
    static_configs:
      - targets: ["127.0.0.1:{port}"]
congestion:
  resolution: 0
  fast_scrape_interval: 100ms
  fast_scrape_jobs: [vllm]
""")
    inst = f"127.0.0.1:{port}"
    try:
        with ServerProcess(tmp_path / "data", ["--config", str(cfg)]) as srv:
            def entry() -> dict[str, Any] | None:
                rows = congestion(srv.url, cluster="lo")["instances"]
                return rows[0] if rows and rows[0]["lora"] else None

            d = wait_for(entry, what="lora info in the congestion entry")
            # one entry: the LoRA series (no model_name) joins the engine's entry instead of making its own
            assert [r["instance"] for r in congestion(srv.url, cluster="lo")["instances"]] == [inst]
            assert d["model_name"] == "llama" and d["queue_length"] == 3
            assert d["lora"] == {"running": ["sql-lora", "chat-lora"], "waiting": ["tts-lora"], "max_lora": 4,
                                 "updated_at": 2000.0}
            with urllib.request.urlopen(f"{srv.url}/api/v1/congestion/model_server/{inst}/metrics", timeout=10) as r:
                text = r.read().decode()
            (smp,) = [s for f in text_string_to_metric_families(text) if f.name == "vllm:lora_requests_info"
                      for s in f.samples]
            assert smp.value == 2000.0 and smp.labels == {
                "max_lora": "4", "model_name": "llama", "running_lora_adapters": "sql-lora,chat-lora",
                "waiting_lora_adapters": "tts-lora"}
            # the engine moves on: a newer adapter set takes over at the next fast scrape
            lora.labels("4", "", "", "lo").set(3000.0)
            d = wait_for(lambda: (e := entry()) and e["lora"]["updated_at"] == 3000.0 and e, what="newer lora set")
            assert d["lora"] == {"running": [], "waiting": [], "max_lora": 4, "updated_at": 3000.0}
    finally:
        server.shutdown()
        server.server_close()
