"""Membership drills during acknowledged ingest (slow: ``pytest -m slow tests/test_cluster_rebalance.py``).

Rebalancing:
A writer sends remote-write bodies to the distributor for the whole drill (retrying a body on
429/5xx as Prometheus's sender does) while a querier is asked every few hundred milliseconds. A new
ingester joins (etcd gives it partitions; it replays them from the log), then one of the first two
leaves as docs/cluster.md says: stopped (SIGTERM revokes its lease) and removed from the ring (its
``members/<node>`` key deleted), so its partitions move to the others, which replay them and bring
every partition back to RF=2. At the end the querier must count
exactly the samples acknowledged: none lost, none counted twice; every query during the drill must
answer, and the ingester that joined must own partitions and have caught up on them.
"""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from storage.etcd_gateway import EtcdGateway
from tests.helpers import http_json, load_bench, require_binary
from tests.test_cluster_faults import T0, Writer, total_samples
from turboprom.cluster.local_cluster import LocalCluster
from turboprom.cluster.settings import ClusterSettings

pytestmark = [pytest.mark.slow, pytest.mark.peer]
SERIES = 2000


class Prober(threading.Thread):
    """Asks the querier a count over every series until stopped; counts the answers that failed."""

    def __init__(self, querier: str):
        super().__init__(daemon=True)
        self.querier = querier
        self.asked = 0
        self.failed: list[str] = []
        self.stop_now = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop_now.is_set():
            code, body, _ = http_json(f"{self.querier}/api/v1/query?query=count(%7B__name__%3D~%22vllm.%2A%22%7D)+or+vector(0)")
            self.asked += 1
            if code != 200:
                self.failed.append(f"at {time.monotonic() - self.t0:.1f}s: {code}: {str(body)[:200]}")
            time.sleep(0.3)


def settled_total(c: LocalCluster, prober: Prober, ingesters: list[str], rounds: int, want: float) -> float:
    """Once the ingesters caught up (and the prober stopped): the querier's sample count, given up to
    a minute to reach ``want``."""
    c.wait_caught_up(ingesters, timeout=180)
    prober.stop_now.set()
    prober.join(10)
    end_s = (T0 + (rounds - 1) * 15_000) / 1000
    deadline = time.monotonic() + 60
    while total_samples(c.url("querier-0"), end_s) != want and time.monotonic() < deadline:
        time.sleep(0.5)
    return total_samples(c.url("querier-0"), end_s)


def owned(c: LocalCluster, name: str) -> set[int]:
    return set(c.ingester_status(name).get("owned", []))


def leave_ring(c: LocalCluster, node: str) -> None:
    """What an operator does with ``etcdctl del <prefix>members/<node>``."""
    async def run() -> None:
        etcd = EtcdGateway([c.etcd_url])
        try:
            await etcd.delete(ClusterSettings().etcd_prefix + f"members/{node}")
        finally:
            await etcd.close()
    asyncio.run(run())


def alive_ingesters(etcd_url: str) -> set[str]:
    """The ingesters whose liveness key (under their lease) etcd holds."""
    async def run() -> set[str]:
        etcd = EtcdGateway([etcd_url])
        try:
            prefix = ClusterSettings().etcd_prefix + "alive/"
            return {k[len(prefix):] for k in await etcd.range_prefix(prefix)}
        finally:
            await etcd.close()
    return asyncio.run(run())


def test_join_and_clean_leave_lose_and_double_nothing(tmp_path):
    require_binary("nats-server")
    require_binary("etcd")
    rw = load_bench("ingest_remote_write")
    rounds = 40
    bodies, counts = rw.build_payloads(SERIES, 500, 1, rounds, T0)
    c = LocalCluster(tmp_path / "c", ingesters=2, distributors=1, partitions=16).start()
    try:
        before = {n: owned(c, n) for n in ("ingester-0", "ingester-1")}
        assert before["ingester-0"] | before["ingester-1"] == set(range(16))
        w = Writer([c.url("distributor-0")], bodies)
        prober = Prober(c.url("querier-0"))
        w.start()
        prober.start()
        time.sleep(2.0)

        print(f"join at {time.monotonic() - prober.t0:.1f}s")
        c.add_role("ingester", "ingester-2")  # joins while writes continue
        c.wait_ready("ingester-2")
        deadline = time.monotonic() + 60
        while not owned(c, "ingester-2") and time.monotonic() < deadline:
            time.sleep(0.5)
        joined = owned(c, "ingester-2")
        assert joined, "the new ingester was given no partition"
        c.wait_caught_up(["ingester-2"], timeout=120)
        time.sleep(2.0)

        print(f"leave at {time.monotonic() - prober.t0:.1f}s")
        c.roles["ingester-0"].stop()  # leaves cleanly while writes continue
        leave_ring(c, "ingester-0")
        deadline = time.monotonic() + 60
        while not (owned(c, "ingester-1") | owned(c, "ingester-2")) >= set(range(16)) and time.monotonic() < deadline:
            time.sleep(0.5)
        after = {n: owned(c, n) for n in ("ingester-1", "ingester-2")}
        assert after["ingester-1"] | after["ingester-2"] == set(range(16)), after

        w.join(600)
        assert w.sent_all.is_set()
        # RF=2 again: with two ingesters left, each owns every partition once the new owners caught up
        deadline = time.monotonic() + 120
        while not all(owned(c, n) == set(range(16)) for n in ("ingester-1", "ingester-2")) and time.monotonic() < deadline:
            time.sleep(0.5)
        final = {n: sorted(owned(c, n)) for n in ("ingester-1", "ingester-2")}
        assert all(v == list(range(16)) for v in final.values()), f"replication not restored: {final}"
        got = settled_total(c, prober, ["ingester-1", "ingester-2"], rounds, sum(counts))
        print(f"partitions before {before}, joined {sorted(joined)}, after {after}; acked bodies {w.acked}, "
              f"refused attempts {w.refused}, queries {prober.asked} ({len(prober.failed)} failed), "
              f"samples {got:.0f} of {sum(counts)}")
        assert got == sum(counts), f"lost {sum(counts) - got:.0f}" if got < sum(counts) else f"doubled {got - sum(counts):.0f}"
        assert not prober.failed, prober.failed[:3]
    finally:
        c.stop()


def test_etcd_member_killed_during_ingest_and_queries(tmp_path):
    """Three etcd members; during acknowledged writes and queries the member every process asks first
    is SIGKILLed (clients move to the others), held down longer than the ingesters' lease TTL, and
    restarted; then another member. Leases are kept through the remaining quorum, so no ingester
    drops out of the live set, no query fails, no sample is lost or doubled."""
    require_binary("nats-server")
    require_binary("etcd")
    rw = load_bench("ingest_remote_write")
    rounds = 40
    bodies, counts = rw.build_payloads(SERIES, 500, 1, rounds, T0)
    c = LocalCluster(tmp_path / "c", ingesters=2, distributors=1, partitions=16, etcd_members=3).start()
    try:
        w = Writer([c.url("distributor-0")], bodies)
        prober = Prober(c.url("querier-0"))
        w.start()
        prober.start()
        dropped: list[str] = []
        for i in (0, 1):
            c.etcds[i].kill()
            t_end = time.monotonic() + 5.0  # > the 3 s lease TTL: a lease kept only through the others
            while time.monotonic() < t_end:
                live = alive_ingesters(f"http://127.0.0.1:{c.etcds[2].port}")  # a member that stays up
                if live != {"ingester-0", "ingester-1"}:
                    dropped.append(f"etcd-{i} down: live set {sorted(live)}")
                time.sleep(0.5)
            c.restart_etcd(i)
            time.sleep(2.0)
        w.join(600)
        assert w.sent_all.is_set()
        got = settled_total(c, prober, ["ingester-0", "ingester-1"], rounds, sum(counts))
        code, body, _ = http_json(c.url("querier-0") + "/api/v1/status/tsdb")
        print(f"acked bodies {w.acked}, refused attempts {w.refused}, queries {prober.asked} ({len(prober.failed)} failed), "
              f"samples {got:.0f} of {sum(counts)}")
        assert got == sum(counts), f"lost {sum(counts) - got:.0f}" if got < sum(counts) else f"doubled {got - sum(counts):.0f}"
        assert not prober.failed, prober.failed[:3]
        assert not dropped, dropped
        assert code == 200, body
    finally:
        c.stop()
