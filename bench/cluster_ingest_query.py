"""Cluster vs single node on this machine: remote-write ingest throughput and dashboard query latency.

Same run, same payloads: a single-node ``turboprom serve`` and a local cluster (3 NATS JetStream
nodes with an R=3 stream, one etcd, 1 distributor, 2 ingesters with RF=2, 1 querier; 64 partitions)
started by turboprom/cluster/local_cluster.py. Bodies are bench/ingest_remote_write.py's
scrape-shaped fleet payloads (2000 series x 1 sample per request, 4 concurrent senders), built ahead
of time; each trial sends a fresh block of rounds to both targets (order alternating per trial).

Ingest figures per trial: acknowledged samples/s (wall, until the last 2xx) and acknowledged samples
per CPU-second of *every* process of the target (single node: 1 process; cluster: distributor,
ingesters, querier, NATS x3 and etcd), CPU measured from the first request until the cluster's
ingesters have applied everything on the log (so the cluster's consumption is charged). Also the
time from the last acknowledgement until both ingesters had applied every message (apply lag), and
what the distributor published (its turboprom_cluster_log_*_total counters): groups (group commits),
messages (one per tenant and partition of a group), samples and bytes per message.

Query figures: each dashboard query as a range query over the written window (step 15 s), rotating
single node / querier (aggregations pushed down to the ingesters, the default) / a second querier
with ``--cluster.pushdown false`` (raw samples pulled and evaluated on the querier), ``--query-repeats``
times, every target with ``exact=true`` (the raw path), and the single node and the querier once
more with their defaults (both reuse the step answers of a range query repeated over unchanged data;
a querier's are kept exact by its ingesters' write logs, turboprom/cluster/cluster_frontier.py); medians, and ratios to the single node in the same run. Before timing,
every query's answer through each querier is checked against the single node's (same series,
values within 1e-9 relative).

    .venv/bin/python bench/cluster_ingest_query.py [--series 20000] [--rounds 4] [--trials 3]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
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
sys.path.insert(0, str(REPO / "bench"))

import ingest_remote_write as rw  # noqa: E402
from tests.helpers import ServerProcess  # noqa: E402
from turboprom.cluster.local_cluster import LocalCluster  # noqa: E402

QUERIES = [
    'sum by (model_name) (rate(vllm:prompt_tokens_total[5m]))',
    'histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket[5m])))',
    'avg by (node) (rate(node_cpu_seconds_total{mode!="idle"}[5m]))',
    'topk(5, vllm:num_requests_waiting)',
    'sum(vllm:kv_cache_usage_perc) by (cluster)',
]


def cluster_procs(c: LocalCluster) -> dict[str, int]:
    """Every process of the cluster by name (roles, NATS nodes, etcd), but the second querier that
    only the query comparison uses."""
    return {**{n: p.pid for n, p in c.roles.items() if n != "querier-raw"}, **{p.name: p.pid for p in c.nats},
            **{p.name: p.pid for p in c.etcds}}


LOG_COUNTERS = ("groups", "messages", "message_bytes", "samples")


def log_counters(url: str) -> dict[str, float]:
    """The distributor's turboprom_cluster_log_*_total counters (what it published to JetStream)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out = dict.fromkeys(LOG_COUNTERS, 0.0)
    for line in text.splitlines():
        for k in LOG_COUNTERS:
            if line.startswith(f"turboprom_cluster_log_{k}_total "):
                out[k] = float(line.split()[-1])
    return out


def run_query(url: str, q: str, start_s: float, end_s: float, exact: bool = True) -> float:
    p = {"query": q, "start": start_s, "end": end_s, "step": 15}
    if exact:
        p["exact"] = "true"
    params = urllib.parse.urlencode(p)
    t = time.perf_counter()
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{params}", timeout=120) as r:
        r.read()
        assert r.status == 200
    return time.perf_counter() - t


def answer(url: str, q: str, start_s: float, end_s: float) -> dict:
    params = urllib.parse.urlencode({"query": q, "start": start_s, "end": end_s, "step": 15, "exact": "true"})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{params}", timeout=120) as r:
        body = json.loads(r.read())
    return {json.dumps(x["metric"], sort_keys=True): [(t, float(v)) for t, v in x["values"]] for x in body["data"]["result"]}


def answer_difference(a: dict, b: dict) -> str:
    """'' when two answers agree (same series and timestamps, values within 1e-9 relative)."""
    if sorted(a) != sorted(b):
        return f"{len(a)} vs {len(b)} series, e.g. {sorted(set(a) ^ set(b))[:2]}"
    for k, pa in a.items():
        pb = b[k]
        if [t for t, _ in pa] != [t for t, _ in pb]:
            return f"{k}: timestamps differ, {sorted(set(t for t, _ in pa) ^ set(t for t, _ in pb))[:4]}"
        for (t, x), (_, y) in zip(pa, pb):
            if not ((math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)):
                return f"{k} at {t}: {x!r} vs {y!r}"
    return ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--series", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=4, help="rounds per trial (each writes every series once)")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--query-repeats", type=int, default=7)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--profile", type=Path, help="py-spy raw stacks of the cluster's TurboProm processes per trial, "
                    "into this dir (bench/profile_summary.py reads them)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tp-cluster-bench-"))
    single = ServerProcess(tmp / "single")
    cluster = LocalCluster(tmp / "cluster", ingesters=2, partitions=a.partitions)
    try:
        single.start()
        cluster.start()
        cluster.add_role("querier", "querier-raw", ["--cluster.pushdown", "false"])
        cluster.wait_ready("querier-raw")
        # recent timestamps, the last round a minute ago: the congestion trackers (single node and ingesters)
        # see live instances, as under real scrape traffic, instead of dropping and logging silent ones
        T0 = (int(time.time()) - a.rounds * a.trials * 15 - 60) * 1000
        bodies, counts = rw.build_payloads(a.series, 2000, 1, a.rounds * a.trials, T0)
        per_trial = len(bodies) // a.trials
        rows: dict[str, list[dict]] = {"single": [], "cluster": []}
        for trial in range(a.trials):
            chunk = slice(trial * per_trial, (trial + 1) * per_trial)
            order = ["single", "cluster"] if trial % 2 == 0 else ["cluster", "single"]
            for name in order:
                url = (single.url if name == "single" else cluster.url("distributor-0")) + "/api/v1/write"
                procs = {"single": single.proc.pid} if name == "single" else cluster_procs(cluster)
                spies = []
                if a.profile and name == "cluster":
                    a.profile.mkdir(parents=True, exist_ok=True)
                    spies = [rw.start_profile(cluster.roles[n].pid, a.profile / f"trial{trial + 1}-{n}.txt")
                             for n in cluster.roles if not n.startswith("querier")]
                cpu_each0 = {n: rw.proc_cpu_s(p) for n, p in procs.items()}
                log0 = log_counters(cluster.url("distributor-0")) if name == "cluster" else None
                res = asyncio.run(rw.send_all(url, bodies[chunk], counts[chunk], a.senders))
                lag = 0.0
                if name == "cluster":
                    t = time.perf_counter()
                    cluster.wait_applied(["ingester-0", "ingester-1"], timeout=300)
                    lag = time.perf_counter() - t
                cpu_each = {n: rw.proc_cpu_s(p) - cpu_each0[n] for n, p in procs.items()}
                cpu = sum(cpu_each.values())
                for spy in spies:
                    rw.stop_profile(spy)
                acked = res["acked_samples"]
                row = {"samples_s": acked / res["wall_s"], "samples_cpu_s": acked / max(cpu, 1e-9), "cpu_s": cpu,
                       "failed": res["failed"], "retries": res["retries"], "lag_s": lag}
                if res.get("first_failure"):
                    print(f"  {name}: first refused request: {res['first_failure']}", flush=True)
                rows[name].append(row)
                print(f"trial {trial + 1} {name:8s} {row['samples_s']:>10,.0f} samples/s  {row['samples_cpu_s']:>10,.0f} /cpu-s  "
                      f"cpu {cpu:6.1f}s  retries {res['retries']}  failed {res['failed']}  apply lag {lag:.2f}s", flush=True)
                if name == "cluster":
                    print("    cpu-s by process: " + ", ".join(f"{n} {c:.1f}" for n, c in cpu_each.items()), flush=True)
                    pub = {k: v - log0[k] for k, v in log_counters(cluster.url("distributor-0")).items()}
                    n_msg = max(pub["messages"], 1.0)
                    print(f"    published: {pub['groups']:,.0f} groups, {pub['messages']:,.0f} messages "
                          f"({pub['samples'] / n_msg:,.0f} samples and {pub['message_bytes'] / n_msg:,.0f} B each), "
                          f"{pub['samples'] / max(pub['groups'], 1.0):,.0f} samples per group", flush=True)
        end_s = (T0 + (a.rounds * a.trials - 1) * 15_000) / 1000
        start_s = T0 / 1000
        time.sleep(2)
        targets = {"single": single.url, "querier": cluster.url("querier-0"), "querier-raw": cluster.url("querier-raw")}
        for q in QUERIES:
            want = answer(single.url, q, start_s, end_s)
            assert want, f"{q}: the single node answers nothing"
            for name in ("querier", "querier-raw"):
                diff = answer_difference(want, answer(targets[name], q, start_s, end_s))
                assert not diff, f"{q}: {name} answers differently from the single node: {diff}"
        # every target on the raw path (exact=true), and the single node with its defaults too, where
        # its planner reuses the step answers of a recurring range query over unchanged data
        targets["single-default"] = single.url
        targets["querier-default"] = cluster.url("querier-0")  # reuses step answers too (cluster_frontier.py)
        lat: dict[str, dict[str, list[float]]] = {n: {} for n in targets}
        for q in QUERIES:
            for _ in range(a.query_repeats):
                for name, url in targets.items():
                    lat[name].setdefault(q, []).append(run_query(url, q, start_s, end_s, exact=not name.endswith("-default")))
        print()
        med = {n: {k: statistics.median([r[k] for r in rs]) for k in ("samples_s", "samples_cpu_s", "lag_s")} for n, rs in rows.items()}
        print(f"ingest medians over {a.trials} trials ({a.series} series x {a.rounds} rounds each, 2000 series/request, {a.senders} senders):")
        for n in ("single", "cluster"):
            print(f"  {n:8s} {med[n]['samples_s']:>10,.0f} samples/s  {med[n]['samples_cpu_s']:>10,.0f} samples/cpu-s  apply lag {med[n]['lag_s']:.2f}s")
        print(f"  cluster/single: wall {med['cluster']['samples_s'] / med['single']['samples_s']:.2f}x, "
              f"per CPU-s {med['cluster']['samples_cpu_s'] / med['single']['samples_cpu_s']:.2f}x")
        steps = int(round((end_s - start_s) / 15)) + 1
        print(f"query latency medians over {a.query_repeats} runs (ms), range queries of {steps} steps: single (exact=true), "
              "querier (pushdown), ratio, querier without pushdown, ratio; both with their defaults (reused step "
              "answers): single, querier, ratio")
        for q in QUERIES:
            s_, c_, r_, d_, qd = (statistics.median(lat[n][q]) * 1000
                                  for n in ("single", "querier", "querier-raw", "single-default", "querier-default"))
            print(f"  {s_:8.1f} {c_:8.1f} {c_ / s_:5.2f}x {r_:8.1f} {r_ / s_:5.2f}x {d_:8.1f} {qd:8.1f} {qd / d_:5.2f}x  {q}")
    finally:
        cluster.stop()
        single.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
