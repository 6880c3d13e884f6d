"""Summaries on a cluster's ingesters: dashboard loads through a querier, from the ingesters' exact
summaries vs ``exact=true``, beside a single node doing the same.

Same run, same remote-write bodies: a single-node ``turboprom serve`` (defaults) and a local cluster
(turboprom/cluster/local_cluster.py: 3 NATS JetStream nodes with an R=3 stream, one etcd, one
distributor, ``--ingesters`` ingesters with RF=2, one querier; ``--partitions``). Both get
``--history-hours`` of a simulated vLLM fleet (bench/vllm_fleet.py: TTFT / e2e histograms with
vLLM's buckets, token and request counters with engine restarts) at ``--interval-s``, written
before anything is queried.

A *load* is one range query of a panel at a random place in the history, as a user panning the
dashboard's time picker makes them: its end is a random time between the oldest that leaves the
panel's range within the history and the wall clock, floored to the step as Grafana does, and the
step is Grafana's for a ~1000 px panel. Earlier loads' steps are reused where they overlap (by the
querier's and the single node's step answers alike); the rest is evaluated. Several panels share a
pushed-down sub-tree (the p50 / p90 / p99 of one histogram), as vLLM's dashboards do.
``--cold``: each load's end is also moved off the step grid by a random number of milliseconds, so
no load reuses another's steps: what summaries (not reused step answers) give to first loads.
``--pin``: the single node and every ingester start with exact plans pinned for the panels' metrics
(``planner.pinned``), instead of adopting plans when their cost models say they pay.

1. Warm-up: ``--warm-loads`` loads of every panel on the querier and on the single node, with their
   defaults: the ingesters' planners learn the sub-trees pushed to them, the single node's planner
   learns its own queries; both adopt exact summaries by their cost models and backfill them. Then
   ``--settle-s`` seconds, and every server's plans are printed.
2. Timed: ``--loads`` loads of every panel, each on four paths in rotating order: querier with
   defaults ("served"), querier ``exact=true`` (raw samples on the ingesters), single node with
   defaults, single node ``exact=true``. Each served querier answer is checked against the single
   node's ``exact=true`` answer of the same load (same series and timestamps, values within 1e-9
   relative); a difference stops the run.

Reported per panel: medians (ms, successful answers only), served/exact on each target, querier
served / single served, and the share of answers that name a summary in their ``infos``.

    .venv/bin/python bench/cluster_summaries.py [--series 2000] [--history-hours 6] [--loads 7]
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from cluster_ingest_query import answer_difference  # noqa: E402
from live_dashboard import grafana_step  # noqa: E402
from vllm_fleet import Encoder, Fleet, history_bodies  # noqa: E402
from tests.helpers import ServerProcess  # noqa: E402
from turboprom.cluster.local_cluster import LocalCluster  # noqa: E402

TTFT = "sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket[{r}]))"
E2E = "sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket[{r}]))"
PANELS = [  # (name, range s, PromQL): an hour of 5-minute rates, six hours of one-hour rates, and gauges
    *[(f"TTFT p{round(q * 100)} [5m]", 3600, f"histogram_quantile({q}, {TTFT.format(r='5m')})") for q in (0.5, 0.9, 0.99)],
    ("e2e p99 [5m]", 3600, f"histogram_quantile(0.99, {E2E.format(r='5m')})"),
    ("generation tokens rate [5m]", 3600, "sum by (model_name) (rate(vllm:generation_tokens_total[5m]))"),
    ("waiting max [10m]", 3600, "max by (model_name) (max_over_time(vllm:num_requests_waiting[10m]))"),
    ("waiting top 5", 3600, "topk(5, vllm:num_requests_waiting)"),  # a queue gauge: ties at the 5th place
    *[(f"TTFT p{round(q * 100)} [1h]", 21600, f"histogram_quantile({q}, {TTFT.format(r='1h')})") for q in (0.5, 0.99)],
    ("KV usage avg [1h]", 21600, "avg by (model_name) (avg_over_time(vllm:kv_cache_usage_perc[1h]))"),
    ("success increase [1h]", 21600, "sum by (model_name) (increase(vllm:request_success_total[1h]))"),
]
PINNED = ["vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
          "vllm:generation_tokens_total", "vllm:request_success_total", "vllm:num_requests_waiting",
          "vllm:kv_cache_usage_perc"]
PATHS = ("querier", "querier exact", "single", "single exact")


def fetch(url: str, q: str, start_s: float, end_s: float, step_s: int, exact: bool) -> tuple[float, dict]:
    p = {"query": q, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "step": step_s}
    if exact:
        p["exact"] = "true"
    t = time.perf_counter()
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{urllib.parse.urlencode(p)}", timeout=300) as r:
        body = r.read()
    dt = time.perf_counter() - t
    doc = json.loads(body)
    assert doc["status"] == "success", doc
    return dt, doc


def series_of(doc: dict) -> dict:
    return {json.dumps(x["metric"], sort_keys=True): [(t, float(v)) for t, v in x["values"]] for x in doc["data"]["result"]}


def served(doc: dict) -> bool:
    return any("served from summary" in i for i in doc.get("infos", []))


def post(url: str, body: bytes) -> None:
    req = urllib.request.Request(url, data=body, headers={
        "Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Prometheus-Remote-Write-Version": "0.1.0"})
    for attempt in range(20):
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                if r.status // 100 == 2:
                    return
        except urllib.error.HTTPError as e:
            if e.code not in (429, 503) or attempt == 19:
                raise
        time.sleep(0.5 * (attempt + 1))


def preload(fleet: Fleet, enc: Encoder, urls: list[str], hours: float, interval_s: int, per_request: int) -> int:
    sent = 0
    t0 = time.time()
    now = int(time.time() * 1000) // 1000 * 1000
    for i, (body, n) in enumerate(history_bodies(fleet, enc, hours, interval_s, per_request, now)):
        for u in urls:
            post(u, body)
        sent += n
        if i % 20 == 0:
            print(f"[bench] preload request {i + 1}, {time.time() - t0:.0f}s", flush=True)
    return sent


def plans(url: str) -> list[str]:
    with urllib.request.urlopen(url + "/api/v1/planner/plans", timeout=30) as r:
        doc = json.loads(r.read())
    out = [f"{p['id']} ({p.get('series', '?')} series, {p.get('bytes', 0) / 1e6:.1f} MB)" for p in doc["data"]["plans"]]
    out += [f"retired {r.get('id', '?')}: {r.get('reason', '')}" for r in doc["data"].get("retired", [])]
    with urllib.request.urlopen(url + "/api/v1/planner/candidates", timeout=30) as r:
        cands = json.loads(r.read())["data"]
    out += [f"candidate {c['metric']} ({c['algorithm']}, {c['recent_queries']} queries): {c['last_decision']}"
            for c in cands if c["metric"] not in " ".join(out)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--series", type=int, default=2000, help="approximate series (79 per vLLM engine)")
    ap.add_argument("--history-hours", type=float, default=8.0)
    ap.add_argument("--interval-s", type=int, default=15)
    ap.add_argument("--ingesters", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--warm-loads", type=int, default=4)
    ap.add_argument("--settle-s", type=float, default=20.0)
    ap.add_argument("--loads", type=int, default=7)
    ap.add_argument("--samples-per-request", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cold", action="store_true", help="loads off the step grid: no step answers reused")
    ap.add_argument("--pin", action="store_true", help="exact plans pinned for the panels' metrics on every server")
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    tmp = Path(tempfile.mkdtemp(prefix="cluster-summaries-"))
    args: list[str] = []
    if a.pin:
        cfg = tmp / "pinned.yml"
        cfg.write_text(json.dumps({"planner": {"pinned": [{"metric": m, "algorithm": "exact"} for m in PINNED]}}))
        args = ["--config", str(cfg)]
    single = ServerProcess(tmp / "single", args)
    cluster = LocalCluster(tmp / "c", ingesters=a.ingesters, partitions=a.partitions, ingester_args=args)
    ingesters = [f"ingester-{i}" for i in range(a.ingesters)]
    try:
        single.start()
        cluster.start()
        fleet = Fleet.for_series(a.series, a.seed)
        enc = Encoder(fleet.labels)
        n = preload(fleet, enc, [single.url + "/api/v1/write", cluster.url("distributor-0") + "/api/v1/write"],
                    a.history_hours, a.interval_s, a.samples_per_request)
        cluster.wait_applied(ingesters, timeout=600)
        print(f"[bench] {fleet.num_series} series, {n:,} samples written to each target", flush=True)
        targets = {"querier": cluster.url("querier-0"), "single": single.url}

        def load(name: str, range_s: int, q: str, paths: tuple[str, ...]) -> dict[str, tuple[float, dict]]:
            step = grafana_step(range_s)
            now = time.time()
            end = rnd.uniform(now - a.history_hours * 3600 + range_s + 600, now) // step * step
            if a.cold:
                end -= rnd.randint(1, step * 1000 - 1) / 1000
            out = {}
            for p in (paths if rnd.random() < 0.5 else tuple(reversed(paths))):
                out[p] = fetch(targets[p.split()[0]], q, end - range_s, end, step, p.endswith("exact"))
            return out

        t = time.time()
        for _ in range(a.warm_loads):
            for name, range_s, q in PANELS:
                load(name, range_s, q, ("querier", "single"))
        print(f"[bench] warm-up: {a.warm_loads} loads of {len(PANELS)} panels in {time.time() - t:.0f}s; "
              f"settling {a.settle_s:.0f}s", flush=True)
        time.sleep(a.settle_s)
        for who, url in [("single", single.url), *[(i, cluster.url(i)) for i in ingesters]]:
            print(f"[bench] plans on {who}: " + ("; ".join(plans(url)) or "none"), flush=True)
        lat: dict[str, dict[str, list[float]]] = {p: {name: [] for name, _, _ in PANELS} for p in PATHS}
        hits: dict[str, dict[str, list[bool]]] = {p: {name: [] for name, _, _ in PANELS} for p in ("querier", "single")}
        for k in range(a.loads):
            for name, range_s, q in PANELS:
                got = load(name, range_s, q, PATHS)
                diff = answer_difference(series_of(got["single exact"][1]), series_of(got["querier"][1]))
                if diff:
                    raise SystemExit(f"{name}: the querier's served answer differs from the single node's raw one: {diff}")
                for p, (dt, doc) in got.items():
                    lat[p][name].append(dt)
                for p in hits:
                    hits[p][name].append(served(got[p][1]))
            print(f"[bench] load {k + 1}/{a.loads} done", flush=True)
        print()
        print(f"{fleet.num_series} series, {a.history_hours:g} h at {a.interval_s} s; cluster: {a.ingesters} ingesters "
              f"(RF=2), {a.partitions} partitions; {'cold ' if a.cold else ''}loads{', plans pinned' if a.pin else ''}; "
              f"medians of {a.loads} loads (ms); every served querier answer equal to the single node's exact=true one")
        print("| panel | range/step | querier exact=true | querier served | ratio | single exact=true | single served | "
              "ratio | querier/single served | summary-served (querier / single) |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
        for name, range_s, _ in PANELS:
            m = {p: statistics.median(lat[p][name]) * 1000 for p in PATHS}
            f = {p: sum(hits[p][name]) / len(hits[p][name]) for p in hits}
            print(f"| {name} | {range_s // 3600}h/{grafana_step(range_s)}s | {m['querier exact']:.1f} | {m['querier']:.1f} | "
                  f"{m['querier'] / m['querier exact']:.2f} | {m['single exact']:.1f} | {m['single']:.1f} | "
                  f"{m['single'] / m['single exact']:.2f} | {m['querier'] / m['single']:.2f} | "
                  f"{f['querier']:.0%} / {f['single']:.0%} |")
    finally:
        cluster.stop()
        single.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
