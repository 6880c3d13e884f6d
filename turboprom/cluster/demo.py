"""``make cluster-demo``: the local cluster (local_cluster.py: 3 NATS JetStream nodes, 3 etcd members,
a distributor, two ingesters, a querier) with the demo fleet writing into it, until ^C.

The fleet is the single-node demo's (scheduler_metrics/sim/demo_fleet.py: vLLM-like workers replaying
the Mooncake trace, placed by Vesta). In a cluster nothing scrapes on the write path (docs/cluster.md:
scrapers sit in front of the distributors), so a Prometheus in agent mode scrapes the fleet with the
single-node demo's scrape jobs and remote-writes to the distributor, as an operator's would. An hour
of fleet history is remote-written first, and the demo's dashboard workload refreshes its panels
through the querier (reused step answers, aggregation pushdown). Prints every process with its pid
and URL: remote write at the distributor, the Prometheus API at the querier.
"""
from __future__ import annotations

import argparse
import signal
import threading
import time
from pathlib import Path

import yaml

from turboprom.cluster.local_cluster import REPO, Proc, add_cluster_args, binary, cluster_from_args, free_port

SHARED_TRACE = REPO.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def agent_config(distributor_url: str, worker_targets: list[str], scheduler_target: str | None) -> dict:
    from turboprom.demo import fleet_scrape_jobs

    return {"global": {"scrape_interval": "5s"}, "scrape_configs": fleet_scrape_jobs(worker_targets, scheduler_target),
            "remote_write": [{"url": f"{distributor_url}/api/v1/write"}]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="a local TurboProm cluster on loopback with the demo fleet writing into it, until ^C")
    add_cluster_args(ap)
    ap.add_argument("--trace", default=str(SHARED_TRACE))
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--load", type=float, default=0.7)
    ap.add_argument("--history-hours", type=float, default=1.0, help="fleet history remote-written before the live fleet starts")
    a = ap.parse_args(argv)
    from scheduler_metrics.sim.demo_fleet import DemoFleet
    from turboprom.demo_history import write_history
    from turboprom.demo_workload import DashboardWorkload

    base = Path(a.dir)
    c = cluster_from_args(a)
    fleet: DemoFleet | None = None
    agent: Proc | None = None
    workload: DashboardWorkload | None = None
    try:
        c.start()
        dist, querier = c.url("distributor-0"), c.url("querier-0")
        fleet = DemoFleet(querier, a.trace, instances=a.instances, load=a.load)
        if a.history_hours > 0:
            t0 = time.time()
            n = write_history(dist, fleet.workers, scheduler=fleet.sched_metrics, hours=a.history_hours)
            print(f"wrote {a.history_hours:g} h of fleet history ({n:,} samples) through the distributor in "
                  f"{time.time() - t0:.1f} s", flush=True)
        fleet.start()
        cfg = base / "agent.yml"
        cfg.write_text(yaml.safe_dump(agent_config(dist, fleet.targets, f"127.0.0.1:{fleet.sched_port}"), sort_keys=False))
        port = free_port()
        agent = Proc("prometheus-agent", [binary("prometheus"), "--enable-feature=agent", f"--config.file={cfg}",
                                          f"--storage.agent.path={base / 'agent'}", f"--web.listen-address=127.0.0.1:{port}"],
                     base / "prometheus-agent.log", port).start()
        workload = DashboardWorkload(querier)
        workload.start()
        for name, p in [*c.roles.items(), ("prometheus-agent", agent)]:
            print(f"{name:16s} pid {p.pid:7d}  http://127.0.0.1:{p.port}", flush=True)
        print(f"remote write: {dist}/api/v1/write   Prometheus API (Grafana, promtool): {querier}\n"
              f"the demo fleet ({a.instances} vLLM-like workers) is scraped by the Prometheus agent every second "
              f"and written through the distributor; try: curl -s '{querier}/api/v1/query?query=sum(vllm:num_requests_running)'",
              flush=True)
        stop = threading.Event()  # Python runs signal handlers in the main thread, whichever thread got the signal
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.wait(1.0):
            pass
    finally:
        for comp in (workload, fleet):
            if comp is not None:
                comp.stop()
        if agent is not None:  # before the distributor: it flushes what it holds on the way out
            agent.stop()
        c.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
