"""`make demo`: the server with its embedded store plus a live demo workload.

* a simulated fleet of GPU serving workers (real prometheus-client exporters on loopback ports)
  replaying the Mooncake conversation trace, placed by the Vesta scheduler, which polls TurboProm's
  congestion API; TurboProm scrapes the workers and itself;
* a recurring dashboard workload (the bundled Grafana dashboards' panels, refreshed every 10 s), so
  the planner adopts summaries within minutes and the cost report shows what they save;
* KedgeFlow in the loop: the fleet's scheduler serves a control endpoint that trusts the server's
  grant key only, and its rebalancing loop proposes KV migrations off congested instances; the
  server's policy approves them under the live congestion price, the gateway dispatches each grant
  once, and the audit log (``/audit``, ``turboprom audit verify``) records every step.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from turboprom.config import ConfigError, ServerConfig, split_listen

SHARED_TRACE = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def demo_grant_key_pem(data_dir: str | Path) -> bytes:
    """The public half of the server's KedgeFlow signing key (created now if the data dir has none),
    as ``turboprom audit export-key`` prints it: the only key the fleet's control endpoint trusts."""
    from cryptography.hazmat.primitives import serialization

    from scheduler_metrics.kedgeflow.grant import load_or_create_key

    key = load_or_create_key(Path(data_dir) / "kedgeflow" / "signing-key.pem")
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def fleet_scrape_jobs(worker_targets: list[str], scheduler_target: str | None) -> list[dict]:
    """The demo fleet's scrape jobs (its vLLM-like workers every second, its scheduler): the single
    node scrapes them itself; the cluster demo's Prometheus agent scrapes them for the distributors."""
    jobs: list[dict] = []
    if worker_targets:
        jobs.append({"job_name": "vllm-workers", "scrape_interval": "1s", "scrape_timeout": "1s", "honor_labels": True,
                     "static_configs": [{"targets": worker_targets, "labels": {"cluster": "demo"}}]})
    if scheduler_target:
        jobs.append({"job_name": "scheduler", "scrape_interval": "5s", "static_configs": [{"targets": [scheduler_target]}]})
    return jobs


def demo_config(listen: str, worker_targets: list[str], scheduler_target: str | None, control_url: str | None = None,
                kv_events: list[dict[str, str]] | None = None) -> dict:
    jobs = [{"job_name": "turboprom", "scrape_interval": "5s", "static_configs": [{"targets": [listen]}]},
            *fleet_scrape_jobs(worker_targets, scheduler_target)]
    # the demo opts in to sketches (a plain server answers exactly by default); approx=false or
    # exact=true on a request turns them off again
    planner = {"min_count": 3, "period": "5m", "pane": "1m", "approximate": True}
    cfg = {"global": {"scrape_interval": "5s", "evaluation_interval": "15s"}, "scrape_configs": jobs,
           "congestion": {"resolution": "5s", **({"kv_events": kv_events} if kv_events else {})}, "planner": planner}
    if control_url:
        # the fleet scheduler's control endpoint is where approved scheduler actions are dispatched
        cfg["kedgeflow"] = {"targets": {"scheduler.kv_migrate": f"{control_url}/api/v1/scheduler/migrate",
                                        "scheduler.drain_instance": f"{control_url}/api/v1/scheduler/drain"}}
    return cfg


def banner(listen: str, data_dir: str, fleet: bool) -> str:
    base = f"http://{listen}"
    lines = [
        "",
        f"TurboProm demo (data dir {data_dir})" + (": a simulated 8-GPU fleet replays the Mooncake trace, placed by Vesta." if fleet else "."),
        "",
        f"  Web page:      {base}/graph            (query panels; /targets, /rules, /planner, /query-log, /congestion, /audit)",
        f"  Health:        curl -s {base}/-/ready",
        f"  Query:         curl -s '{base}/api/v1/query?query=sum(vllm:num_requests_waiting)'",
        f"  Congestion:    curl -s {base}/api/v1/congestion     (live: {base}/api/v1/congestion/stream)",
        f"  promtool:      promtool query instant {base} 'turboprom_congestion_price_seconds_per_token'",
        f"  Plans:         .venv/bin/turboprom plan list --url {base}",
        f"  Cost report:   .venv/bin/turboprom cost-report --url {base} --since 1h",
        "  Replay:        .venv/bin/turboprom replay --trace ../shared/traces/mooncake_conversation_trace.jsonl --instances 32 --scheduler vesta,smetric --load 0.5,0.9 --limit 3000",
        f"  Grafana:       add a Prometheus datasource with URL {base}; import docs/grafana/*.json",
    ]
    if fleet:
        lines += [
            f"  KedgeFlow:     {base}/audit   (the scheduler proposes KV migrations off congested instances;",
            "                 each is approved by policy, granted once, dispatched to the fleet's control endpoint)",
            f"  Audit verify:  .venv/bin/turboprom audit verify --data-dir {data_dir}",
        ]
    lines += [
        "",
        "Dashboard refreshes reuse the answers of steps no new sample touched, and summaries are adopted once",
        "queries recur (a few minutes); every minute a viewer also pans the dashboards back to an earlier hour.",
        "This demo turns approximation on (planner.approximate: true): sketch answers say so in their infos",
        "with a value bound; add approx=false or exact=true to a query for exact answers (the default of a",
        "plain server). Stop with Ctrl-C.",
        "",
    ]
    return "\n".join(lines)


def _when_ready(url: str, then: list, fleet: Any = None, history_hours: float = 0.0, timeout: float = 120.0,
                fleet_config: tuple[Path, dict] | None = None) -> None:
    deadline = time.time() + timeout
    ready = False
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    ready = True
                    break
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.3)
    if fleet is not None and history_hours > 0:
        # before the fleet serves its exporters: the live scrape then continues these series in order
        from turboprom.demo_history import write_history

        t0 = time.time()
        try:
            n = write_history(url, fleet.workers, scheduler=fleet.sched_metrics, hours=history_hours)
            print(f"demo: wrote {history_hours:g} h of fleet history ({n:,} samples) in {time.time() - t0:.1f} s", flush=True)
        except Exception as e:  # noqa: BLE001 - the live demo runs without it
            print(f"demo: fleet history not written ({type(e).__name__}: {e}); the live fleet starts anyway", flush=True)
    for comp in then:
        comp.start()
    if fleet_config is not None:
        # the fleet's scrape jobs join the config only now that its exporters serve (scraped from the
        # start, each worker would log a failed scrape while the history is written): the server
        # reloads its config on SIGHUP, as an operator's edit would be picked up
        path, raw = fleet_config
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        if ready:  # (its handler is installed once it serves; before that SIGHUP would end the process)
            os.kill(os.getpid(), signal.SIGHUP)
        else:
            print("demo: the server was not ready in time; its fleet's scrape jobs take effect at its "
                  f"next start or reload (kill -HUP {os.getpid()})", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="turboprom-demo")
    ap.add_argument("--data-dir", default="./data")
    ap.add_argument("--listen", default="127.0.0.1:9090")
    ap.add_argument("--trace", default=str(SHARED_TRACE))
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--load", type=float, default=0.7)
    ap.add_argument("--no-fleet", action="store_true", help="serve and scrape itself only")
    ap.add_argument("--history-hours", type=float, default=3.0,
                    help="hours of fleet history written before the live fleet starts (0: none)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from turboprom.cli import CliError, serve_preflight
    from turboprom.server import StartupError

    try:  # the server's own checks, before the fleet and the banner: one line, exit 1
        serve_preflight(a.data_dir, *split_listen(a.listen), a.listen)
    except (CliError, ConfigError) as e:
        print(f"turboprom-demo: {e}", file=sys.stderr)
        return 1
    base = f"http://{a.listen}"
    comps: list = []
    fleet = None
    if not a.no_fleet and Path(a.trace).exists():
        from scheduler_metrics.sim.demo_fleet import DemoFleet

        fleet = DemoFleet(base, a.trace, instances=a.instances, load=a.load, control_key_pem=demo_grant_key_pem(a.data_dir))
        comps.append(fleet)
    from turboprom.demo_workload import DashboardWorkload

    comps.append(DashboardWorkload(base, history_s=a.history_hours * 3600 if fleet is not None else 0.0))
    cfg_path = Path(a.data_dir) / "demo-config.yml"
    control, kv_events = (fleet.control_url, fleet.kv_event_endpoints) if fleet else (None, None)
    # the server starts scraping itself only; the fleet's jobs are added by a reload once it serves
    cfg_path.write_text(yaml.safe_dump(demo_config(a.listen, [], None, control, kv_events), sort_keys=False))
    fleet_config = None if fleet is None else (
        cfg_path, demo_config(a.listen, fleet.targets, f"127.0.0.1:{fleet.sched_port}", control, kv_events))
    cfg = ServerConfig(data_dir=a.data_dir, listen=a.listen, config_file=str(cfg_path))
    cfg.load_file()
    print(banner(a.listen, a.data_dir, fleet is not None), flush=True)
    threading.Thread(target=_when_ready, args=(base, comps, fleet, a.history_hours),
                     kwargs={"fleet_config": fleet_config}, daemon=True).start()
    from turboprom.server import serve

    try:
        asyncio.run(serve(cfg))
    except StartupError as e:
        print(f"turboprom-demo: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        for c in comps:
            c.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
