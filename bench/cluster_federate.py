"""/federate through a querier vs a single node on the same data (bench for the querier's metric
metadata, which lives on the ingesters: docs/cluster.md).

Same run: a single-node ``turboprom serve`` and a local cluster (3 NATS JetStream nodes with an R=3
stream, one etcd, 1 distributor, 3 ingesters with RF=2, 16 partitions, 1 querier) get one
remote-write body of ``--families`` gauge families x 3 series, one recent sample each, with each
family's TYPE/HELP. Then ``/federate?match[]={__name__=~"fed_.+"}`` on each, alternating,
``--repeats`` times; medians and the querier/single ratio. Bounded: it stops by itself.

    .venv/bin/python bench/cluster_federate.py [--families 500] [--repeats 5]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ingest.proto.messages import WriteRequest  # noqa: E402
from ingest.snappy_block import compress  # noqa: E402
from tests.helpers import ServerProcess  # noqa: E402
from turboprom.cluster.local_cluster import LocalCluster  # noqa: E402

INGESTERS = ["ingester-0", "ingester-1", "ingester-2"]


def body(families: int, now_ms: int) -> bytes:
    w = WriteRequest()
    for m in range(families):
        name = f"fed_m{m:05d}"
        w.metadata.add(type=2, metric_family_name=name, help=f"metric {m}.")
        for i in range(3):
            ts = w.timeseries.add()
            for n, v in sorted({"__name__": name, "instance": f"w{i}:9100", "job": "fleet"}.items()):
                ts.labels.add(name=n, value=v)
            ts.samples.add(value=float(m + i), timestamp=now_ms - 30_000)
    return compress(w.SerializeToString())


def post(url: str, data: bytes) -> None:
    req = urllib.request.Request(url + "/api/v1/write", data=data, method="POST", headers={
        "Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Prometheus-Remote-Write-Version": "0.1.0"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 204, r.status


def federate_s(url: str) -> tuple[float, bytes]:
    q = urllib.parse.urlencode({"match[]": '{__name__=~"fed_.+"}'})
    t = time.perf_counter()
    with urllib.request.urlopen(f"{url}/federate?{q}", timeout=60) as r:
        out = r.read()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="cluster-federate-"))
    single = ServerProcess(base / "single" / "data")
    cluster = LocalCluster(base / "c", ingesters=len(INGESTERS), partitions=16)
    try:
        single.start()
        cluster.start()
        b = body(a.families, int(time.time() * 1000))
        post(single.url, b)
        post(cluster.url("distributor-0"), b)
        cluster.wait_applied(INGESTERS)
        times: dict[str, list[float]] = {"single": [], "querier": []}
        answers = {}
        for _ in range(a.repeats):
            for who, url in (("single", single.url), ("querier", cluster.url("querier-0"))):
                s, out = federate_s(url)
                times[who].append(s)
                answers[who] = out
        assert answers["single"] == answers["querier"], "the federate answers differ"
        med = {k: statistics.median(v) * 1000 for k, v in times.items()}
        print(f"{a.families} families x 3 series, {answers['single'].count(b'# TYPE')} TYPE lines, {a.repeats} runs each")
        for k, v in times.items():
            print(f"{k:8s} median {med[k]:.1f} ms  runs {[round(x * 1000, 1) for x in v]}")
        print(f"querier / single: {med['querier'] / med['single']:.2f}x")
    finally:
        cluster.stop()
        single.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
