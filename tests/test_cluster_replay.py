"""Partitions that advance unevenly lose nothing: an ingester that was down while hours of history
were written replays its partitions from the ingest log, each partition at its own pace (some hours
ahead of others), and ends up with every sample, as does the ingester that stayed up.

Before the storage held its head cuts back to the oldest time a busy partition may still append
(``TSDB.hold_cuts``, ``PartitionIngester.cut_hold``), the partitions that got ahead made the head
cut its oldest ranges, and what the lagging partitions applied after that was refused as too old:
with this workload (about 70 s, so marked slow; ``tests/test_cluster_cut_hold.py`` and the storage
test of ``hold_cuts`` run by default) both ingesters lost 6-24% of the samples.
"""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

import pytest

from tests.helpers import http_json, load_bench, require_binary
from turboprom.cluster.local_cluster import LocalCluster

pytestmark = [pytest.mark.peer, pytest.mark.slow]

SERIES, HOURS, INTERVAL_S, PER_REQUEST = 2000, 8, 15, 50_000
RW_HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
              "X-Prometheus-Remote-Write-Version": "0.1.0"}


def instant(url: str, q: str) -> list:
    p = urllib.parse.urlencode({"query": q, "time": time.time()})
    with urllib.request.urlopen(f"{url}/api/v1/query?{p}", timeout=120) as r:
        return json.loads(r.read())["data"]["result"]


def refused(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("turboprom_cluster_refused_samples_total "):
                return float(line.split()[-1])
    return 0.0


def test_an_ingester_replaying_hours_of_history_keeps_every_sample(tmp_path):
    require_binary("nats-server")
    require_binary("etcd")
    fleet_mod = load_bench("vllm_fleet")
    cluster = LocalCluster(tmp_path / "c", ingesters=2, partitions=16)
    try:
        cluster.start()
        cluster.roles["ingester-1"].kill()  # SIGKILL by pid: it replays everything when it comes back
        fleet = fleet_mod.Fleet.for_series(SERIES, 7)
        enc = fleet_mod.Encoder(fleet.labels)
        now = int(time.time() * 1000) // 1000 * 1000
        written = 0
        for body, n in fleet_mod.history_bodies(fleet, enc, HOURS, INTERVAL_S, PER_REQUEST, now):
            code, resp, _ = http_json(cluster.url("distributor-0") + "/api/v1/write", data=body, headers=RW_HEADERS)
            assert code == 204, (code, resp)
            written += n
        cluster.add_role("ingester", "ingester-1")
        cluster.wait_ready("ingester-1")
        cluster.wait_applied(["ingester-0", "ingester-1"], timeout=180)
        q = f'sum(count_over_time({{__name__=~"vllm:.*"}}[{HOURS + 1}h]))'
        for name in ("ingester-0", "ingester-1"):
            got = instant(cluster.url(name), q)
            assert got and int(float(got[0]["value"][1])) == written, (name, got, written)
            assert refused(cluster.url(name)) == 0, name
        got = instant(cluster.url("querier-0"), q)
        assert int(float(got[0]["value"][1])) == written
    finally:
        cluster.stop()
