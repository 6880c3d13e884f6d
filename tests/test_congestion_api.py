"""End to end over real HTTP: a simulated worker fleet (prometheus-client, our instrumentation)
pushes through POST /api/v1/import/prometheus and is scraped by the server's scraper; the
congestion API, its SSE stream and the written-back series must follow the fleet's load."""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import aiohttp
import pytest

from scheduler_metrics.instrumentation import WorkerMetrics
from tests.helpers import ServerProcess, free_port

PUSH_EVERY_S = 0.2


class SimWorker:
    """A worker whose load the test sets; a fleet thread pushes its exposition every 0.2 s."""

    def __init__(self, instance: str, cluster: str, model: str, capacity: float = 1000.0) -> None:
        self.metrics = WorkerMetrics(model_name=model, cluster=cluster, instance=instance)
        self.metrics.set_prefill_capacity(capacity)
        self.load: dict[str, float] = dict(tps=200.0, req_per_s=2.0, backlog=0.0, waiting=0.0)
        self._req_carry = 0.0
        self.pushing = True

    def advance(self, dt: float) -> None:
        ld = self.load
        self.metrics.set_queue(waiting=int(ld["waiting"]), running=4)
        self.metrics.set_kv_usage(min(1.0, 0.1 + ld["tps"] / 2000))
        self.metrics.set_prefill_backlog(ld["backlog"])
        tokens = int(ld["tps"] * dt)
        self.metrics.add_prompt_tokens(tokens + tokens // 4, cached=tokens // 4)
        self._req_carry += ld["req_per_s"] * dt
        while self._req_carry >= 1.0:
            self._req_carry -= 1.0
            self.metrics.request_finished("stop", prompt_tokens=500, ttft_s=0.3)


class Fleet:
    def __init__(self, url: str, workers: dict[str, SimWorker]) -> None:
        self.url, self.workers = url, workers
        self._stop = threading.Event()
        self.errors: list[Exception] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = time.time()
        while not self._stop.wait(PUSH_EVERY_S):
            now = time.time()
            for w in list(self.workers.values()):
                if not w.pushing:
                    continue
                w.advance(now - last)
                try:
                    w.metrics.push(self.url)
                except Exception as e:  # noqa: BLE001 - surfaced by the tests
                    self.errors.append(e)
            last = now

    def start(self) -> "Fleet":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def get_json(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def congestion(base: str, **params: Any) -> dict[str, Any]:
    q = urllib.parse.urlencode(params, doseq=True)
    status, body = get_json(f"{base}/api/v1/congestion" + (f"?{q}" if q else ""))
    assert status == 200, body
    assert body["status"] == "success"
    return body["data"]


def by_instance(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["instance"]: d for d in data["instances"]}


def wait_for(fn: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.time() + timeout
    last: Any = None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp: Path = tmp_path_factory.mktemp("congestion")
    scraped = WorkerMetrics(model_name="qwen", cluster="west")  # no instance label: the scrape adds it
    scraped.set_queue(waiting=5, running=2)
    scraped.set_prefill_backlog(1234)
    scrape_port = scraped.serve(0)
    cfg = tmp / "turboprom.yml"
    cfg.write_text(
        "congestion:\n  stale_after: 1.5s\n  drop_after: 3s\n  rate_window: 1s\n  resolution: 0.5s\n"
        "scrape_configs:\n  - job_name: worker\n    scrape_interval: 500ms\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{scrape_port}']\n")
    server = ServerProcess(tmp / "data", ["--config", str(cfg)]).start()
    workers = {f"w{i}": SimWorker(f"w{i}", "east" if i < 2 else "west", "llama" if i < 2 else "qwen") for i in range(3)}
    fleet = Fleet(server.url, workers).start()
    try:
        wait_for(lambda: set(workers) <= set(by_instance(congestion(server.url))), what="fleet visible")
        yield {"server": server, "url": server.url, "fleet": fleet, "workers": workers,
               "scrape_instance": f"127.0.0.1:{scrape_port}", "scraped": scraped}
    finally:
        fleet.stop()
        server.stop()
        scraped.close()
    assert not fleet.errors, fleet.errors[:3]


def test_fleet_load_change_moves_backlog_and_price(env: dict[str, Any]) -> None:
    url, workers = env["url"], env["workers"]
    for w in workers.values():
        w.load.update(tps=200.0, req_per_s=2.0, backlog=0.0, waiting=0.0)
    time.sleep(3.0)
    light = by_instance(congestion(url))
    for name in workers:
        d = light[name]
        assert d["stale"] is False and d["service_rate_source"] == "capacity"
        assert d["service_rate_tokens_per_second"] == 1000
        assert d["utilization"] == pytest.approx(0.2, abs=0.08)
        assert d["tokens_per_request"] == pytest.approx(100, rel=0.6)
        assert d["congestion_price_seconds_per_token"] == pytest.approx(0.2 / (1000 * 0.8), rel=0.5)
    base_price = light["w1"]["congestion_price_seconds_per_token"]

    workers["w0"].load.update(tps=900.0, req_per_s=9.0, backlog=9000.0, waiting=12.0)
    # The backlog step is a burst of arrivals: lambda overshoots, then settles (EWMA, rate_window 1 s).
    burst = wait_for(lambda: (u := by_instance(congestion(url))["w0"]["utilization"]) and u > 1.05 and u, timeout=3,
                     what="arrival burst seen")
    assert burst > 1.05
    time.sleep(5.0)
    heavy = congestion(url)
    inst = by_instance(heavy)
    assert inst["w0"]["backlog_tokens"] == 9000 and inst["w0"]["backlog_seconds"] == pytest.approx(9.0)
    assert inst["w0"]["queue_length"] == 12
    assert inst["w0"]["utilization"] == pytest.approx(0.9, abs=0.12)
    assert inst["w0"]["congestion_price_seconds_per_token"] > 50 * base_price
    assert inst["w1"]["congestion_price_seconds_per_token"] == pytest.approx(base_price, rel=0.5)
    east = next(c for c in heavy["clusters"] if c["cluster"] == "east")
    assert east["instances"] == 2 and east["queue_length"] == 12 and east["backlog_tokens"] == 9000
    assert east["utilization"] == pytest.approx((0.9 + 0.2) / 2, abs=0.1)

    workers["w0"].load.update(tps=200.0, req_per_s=2.0, backlog=0.0, waiting=0.0)
    time.sleep(3.0)
    again = by_instance(congestion(url))
    assert again["w0"]["backlog_tokens"] == 0
    assert again["w0"]["congestion_price_seconds_per_token"] < 3 * base_price


def test_scraped_worker_is_tracked(env: dict[str, Any]) -> None:
    inst = env["scrape_instance"]
    d = wait_for(lambda: by_instance(congestion(env["url"], instance=inst)).get(inst), what="scraped worker")
    assert (d["cluster"], d["model_name"], d["queue_length"], d["running"], d["backlog_tokens"]) == ("west", "qwen", 5, 2, 1234)
    env["scraped"].set_queue(waiting=9, running=2)
    wait_for(lambda: by_instance(congestion(env["url"], instance=inst))[inst]["queue_length"] == 9, what="scrape update")


def test_filters(env: dict[str, Any]) -> None:
    url = env["url"]
    east = congestion(url, cluster="east")
    assert sorted(by_instance(east)) == ["w0", "w1"] and [c["cluster"] for c in east["clusters"]] == ["east"]
    qwen = congestion(url, model_name="qwen")
    assert {d["model_name"] for d in qwen["instances"]} == {"qwen"} and "w2" in by_instance(qwen)
    assert congestion(url, model="qwen")["instances"] == qwen["instances"]  # the filter's former name
    two = congestion(url, instance=["w0", "w2"])
    assert sorted(by_instance(two)) == ["w0", "w2"]
    assert congestion(url, cluster="east", model_name="qwen")["instances"] == []
    assert congestion(url, cluster="nowhere") ["clusters"] == []
    fresh = congestion(url, include_stale="false")
    assert all(not d["stale"] for d in fresh["instances"])


@pytest.mark.parametrize("query,needle", [
    ("include_stale=maybe", "include_stale"),
    ("cluster=", "cluster"),
])
def test_bad_params_are_400(env: dict[str, Any], query: str, needle: str) -> None:
    status, body = get_json(f"{env['url']}/api/v1/congestion?{query}")
    assert status == 400 and body["status"] == "error" and body["errorType"] == "bad_data"
    assert needle in body["error"]


@pytest.mark.parametrize("query,needle", [("limit=0", "limit"), ("limit=abc", "limit"), ("limit=1.5", "limit"),
                                          ("interval=-1", "interval"), ("interval=nan", "interval")])
def test_stream_bad_params_are_400(env: dict[str, Any], query: str, needle: str) -> None:
    status, body = get_json(f"{env['url']}/api/v1/congestion/stream?{query}")
    assert status == 400 and body["errorType"] == "bad_data" and needle in body["error"]


def test_stale_then_dropped(env: dict[str, Any]) -> None:
    url, workers = env["url"], env["workers"]
    ghost = SimWorker("ghost", "east", "llama")
    workers["ghost"] = ghost
    try:
        wait_for(lambda: by_instance(congestion(url)).get("ghost"), what="ghost visible")
        ghost.pushing = False
        t0 = time.time()
        d = wait_for(lambda: (g := by_instance(congestion(url)).get("ghost")) and g["stale"] and g, what="ghost stale")
        assert 1.0 <= time.time() - t0 + 0.3 and d["age_seconds"] >= 1.5
        east = next(c for c in congestion(url, cluster="east")["clusters"])
        assert east["stale_instances"] >= 1 and east["instances"] == 2
        assert "ghost" not in by_instance(congestion(url, include_stale="false"))
        wait_for(lambda: "ghost" not in by_instance(congestion(url)), what="ghost dropped")
        assert time.time() - t0 >= 2.5
        assert by_instance(congestion(url))["w0"]["stale"] is False  # the rest keeps reporting
    finally:
        workers.pop("ghost", None)


async def test_sse_stream_delivers_updates(env: dict[str, Any]) -> None:
    url, w1 = env["url"], env["workers"]["w1"]
    seen_77 = False
    events = 0
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{url}/api/v1/congestion/stream", params={"instance": "w1", "limit": "200"},
                         timeout=aiohttp.ClientTimeout(total=20)) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            t_change = None
            event, data = None, None
            async for raw in r.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    data = json.loads(line[6:])
                elif line == "" and event == "congestion" and data is not None:
                    events += 1
                    assert [d["instance"] for d in data["instances"]] == ["w1"]
                    if t_change is None:
                        w1.load["waiting"] = 77.0
                        t_change = time.time()
                    elif data["instances"][0]["queue_length"] == 77:
                        seen_77 = True
                        break
                    event, data = None, None
    w1.load["waiting"] = 0.0
    assert seen_77, f"no event showed the change after {events} events"
    assert time.time() - t_change < 5


async def test_sse_limit_closes_stream(env: dict[str, Any]) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{env['url']}/api/v1/congestion/stream", params={"limit": "2", "cluster": "west"},
                         timeout=aiohttp.ClientTimeout(total=20)) as r:
            body = (await r.read()).decode()
    blocks = [b for b in body.split("\n\n") if b.startswith("event: congestion")]
    assert len(blocks) == 2
    ids = [int(b.split("\n")[1].removeprefix("id: ")) for b in blocks]
    assert ids[0] < ids[1]
    for b in blocks:
        data = json.loads(b.split("\n")[2].removeprefix("data: "))
        assert {c["cluster"] for c in data["clusters"]} == {"west"}


def test_signals_written_back_as_series(env: dict[str, Any]) -> None:
    url = env["url"]
    q = urllib.parse.urlencode({"match[]": '{__name__=~"turboprom_congestion_.*",instance="w0"}'})
    status, body = wait_for(lambda: (r := get_json(f"{url}/api/v1/series?{q}")) and len(r[1].get("data", [])) >= 10 and r,
                            what="written-back series")
    names = {s["__name__"] for s in body["data"]}
    assert {"turboprom_congestion_price_seconds_per_token", "turboprom_congestion_backlog_seconds",
            "turboprom_congestion_utilization_ratio", "turboprom_congestion_stale"} <= names
    assert all(s["cluster"] == "east" and s["model_name"] == "llama" for s in body["data"])
    q = urllib.parse.urlencode({"match[]": 'turboprom_congestion_cluster_utilization_ratio'})
    _, body = get_json(f"{url}/api/v1/series?{q}")
    assert {(s["cluster"], s["model_name"]) for s in body["data"]} >= {("east", "llama"), ("west", "qwen")}


def test_written_back_values_via_promql(env: dict[str, Any]) -> None:
    url, workers = env["url"], env["workers"]
    workers["w2"].load.update(waiting=33.0)
    try:
        def value() -> float | None:
            q = urllib.parse.urlencode({"query": 'turboprom_congestion_queue_length{instance="w2"}'})
            status, body = get_json(f"{url}/api/v1/query?{q}")
            assert status == 200, body
            res = body["data"]["result"]
            return float(res[0]["value"][1]) if res and float(res[0]["value"][1]) == 33 else None

        assert wait_for(value, timeout=10, what="queue length 33 via PromQL") == 33
    finally:
        workers["w2"].load.update(waiting=0.0)


def test_unused_port_is_free() -> None:
    # helper sanity for the bench and fixtures: free_port gives a bindable loopback port
    import socket

    p = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", p))


def test_idle_server_rebuilds_rarely_and_the_first_poll_is_fresh(tmp_path: Path) -> None:
    """With nobody polling (``idle_after``), writes do not each rebuild the snapshot; the first poll
    after the idle spell still answers with the newest value (it waits for the rebuild it starts)."""
    from tests.test_ingest_support import metric_value

    cfg = tmp_path / "turboprom.yml"
    cfg.write_text("congestion:\n  idle_after: 1s\n  idle_rebuild_period: 1m\n  resolution: 0\n")
    server = ServerProcess(tmp_path / "data", ["--config", str(cfg)]).start()
    builds = "turboprom_congestion_snapshot_build_seconds_count"

    def push(v: int) -> None:
        body = f'vllm:num_requests_waiting{{cluster="c",model_name="m",instance="i1"}} {v}\n'.encode()
        req = urllib.request.Request(server.url + "/api/v1/import/prometheus", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 204

    try:
        time.sleep(1.5)  # idle: no read since start
        b0 = metric_value(server.url, builds)
        for v in range(1, 11):
            push(v)
            time.sleep(0.05)
        time.sleep(0.3)
        assert metric_value(server.url, builds) == b0  # ten writes, no rebuild
        assert by_instance(congestion(server.url))["i1"]["queue_length"] == 10  # one poll: fresh
        push(11)  # now polled: published promptly again
        wait_for(lambda: by_instance(congestion(server.url))["i1"]["queue_length"] == 11, timeout=5, what="11")
    finally:
        server.stop()
