"""Failure drills during acknowledged ingest (slow: ``pytest -m slow tests/test_cluster_faults.py``).

A writer sends remote-write bodies to the distributor(s) for the whole drill, retrying a body on
429/5xx or a refused connection until it is acknowledged, as Prometheus's sender does. Meanwhile,
``CYCLES`` times each: SIGKILL of one ingester (restarted), of one JetStream node (restarted), of
one distributor (restarted; the writer moves to the other). At the end, every body has been
acknowledged; after the ingesters caught up, the querier must count exactly the samples sent:
acknowledged samples lost = 0, samples counted twice = 0. Queries made right after each kill must
answer (the figures of failed queries and catch-up times are printed).
"""
from __future__ import annotations

import itertools
import threading
import time
import urllib.parse

import pytest

from tests.helpers import http_json, load_bench, require_binary
from tests.test_cluster import post
from turboprom.cluster.local_cluster import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.peer]
CYCLES = 2
SERIES = 2000
T0 = (int(time.time()) - 3600) // 60 * 60 * 1000  # recent: storage refuses samples too far behind its head


class Writer(threading.Thread):
    def __init__(self, urls: list[str], bodies: list[bytes]):
        super().__init__(daemon=True)
        self.urls, self.bodies = urls, bodies
        self.acked = 0
        self.refused = 0
        self.sent_all = threading.Event()

    def run(self) -> None:
        turn = itertools.cycle(range(len(self.urls)))
        for b in self.bodies:
            while True:
                url = self.urls[next(turn)]
                try:
                    code, _ = post(url + "/api/v1/write", b)
                except OSError:
                    code = 0
                if code == 204:
                    self.acked += 1
                    break
                assert code in (0, 429, 503), code
                self.refused += 1
                time.sleep(0.1)
            time.sleep(0.02)
        self.sent_all.set()


def total_samples(querier: str, end_s: float) -> float:
    q = f'sum(count_over_time({{__name__=~"node_.*|vllm.*"}}[{int(end_s - T0 / 1000) + 60}s]))'
    code, body, _ = http_json(f"{querier}/api/v1/query?" + urllib.parse.urlencode({"query": q, "time": end_s}))
    assert code == 200, body
    return float(body["data"]["result"][0]["value"][1])


def test_no_acknowledged_sample_lost_or_doubled_under_kills(tmp_path):
    require_binary("nats-server")
    require_binary("etcd")
    rw = load_bench("ingest_remote_write")
    rounds = 40
    bodies, counts = rw.build_payloads(SERIES, 500, 1, rounds, T0)
    c = LocalCluster(tmp_path / "c", ingesters=3, distributors=2, partitions=32, publish_timeout="2s").start()
    try:
        w = Writer([c.url("distributor-0"), c.url("distributor-1")], bodies)
        w.start()
        querier = c.url("querier-0")
        failed_queries = 0
        catch_up: list[float] = []

        def probe() -> None:
            nonlocal failed_queries
            code, _, _ = http_json(f"{querier}/api/v1/query?query=count(up)+or+vector(0)")
            failed_queries += code != 200

        for cycle in range(CYCLES):
            victim = f"ingester-{cycle % 3}"
            c.roles[victim].kill()
            probe()
            time.sleep(1.0)
            t = time.monotonic()
            c.add_role("ingester", victim)
            c.wait_ready(victim)
            c.wait_caught_up([victim], timeout=120)
            catch_up.append(time.monotonic() - t)
            c.nats[cycle % 3].kill()
            probe()
            time.sleep(1.5)
            c.restart_nats(cycle % 3)
            d = f"distributor-{cycle % 2}"
            c.roles[d].kill()
            probe()
            time.sleep(0.5)
            c.add_role("distributor", d)
            c.wait_ready(d)
        w.join(600)
        assert w.sent_all.is_set()
        c.wait_caught_up(["ingester-0", "ingester-1", "ingester-2"], timeout=180)
        end_s = (T0 + (rounds - 1) * 15_000) / 1000
        deadline = time.monotonic() + 60
        while total_samples(querier, end_s) != sum(counts) and time.monotonic() < deadline:
            time.sleep(0.5)
        got = total_samples(querier, end_s)
        per_ingester = {n: sum(c.ingester_status(n).get("applied", {}).values()) for n in ("ingester-0", "ingester-1", "ingester-2")}
        print("applied sequences summed per ingester:", per_ingester)
        print(f"acked bodies {w.acked}, refused attempts {w.refused}, failed queries {failed_queries}, "
              f"catch-up {['%.1fs' % x for x in catch_up]}, samples {got:.0f} of {sum(counts)}")
        assert got == sum(counts), f"lost {sum(counts) - got:.0f}" if got < sum(counts) else f"doubled {got - sum(counts):.0f}"
        assert failed_queries == 0
    finally:
        c.stop()
