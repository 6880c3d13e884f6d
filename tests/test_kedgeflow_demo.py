"""KedgeFlow as the demo runs it: the real server (demo config) scraping the simulated fleet, whose
scheduler reads the live congestion API and proposes KV migrations off congested instances; the
server's policy approves, the gateway consumes each grant once and dispatches to the fleet's control
endpoint, which moves the session's KV in the simulation. A replayed grant is refused, an uncertain
dispatch leaves the allowance consumed, the audit page shows the entries, and the real
`turboprom audit verify` passes on the data dir, then fails once an entry is edited."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from scheduler_metrics.sim.demo_fleet import DemoFleet
from tests.helpers import REPO, SHARED, ServerProcess, held_port, http_json
from tests.test_ui import Browser
from turboprom.demo import demo_config, demo_grant_key_pem

TRACE = SHARED / "traces" / "mooncake_conversation_trace.jsonl"


def _post(url: str, body: dict) -> dict:
    st, out, _ = http_json(url, json.dumps(body).encode(), {"Content-Type": "application/json"}, timeout=30)
    assert st == 200, (url, st, out)
    return out["data"]


def _get(url: str) -> dict:
    st, out, _ = http_json(url, timeout=30)
    assert st == 200, (url, st, out)
    return out


def _samples(exposition: bytes, name: str, by: str) -> dict[str, float]:
    """Sample values of ``name`` in a text exposition, summed by one label."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(exposition.decode()):
        for s in fam.samples:
            if s.name == name:
                out[s.labels[by]] = out.get(s.labels[by], 0.0) + s.value
    return out


def _audit_page_text(url: str, profile: Path) -> str:
    async def run() -> str:
        b = Browser(profile)
        await b.start()
        try:
            await b.goto(url + "/audit")
            await b.wait("document.body.innerText.includes('VERIFIED') && document.body.innerText.includes('scheduler.kv_migrate')")
            assert not b.errors, b.errors
            return await b.js("document.body.innerText")
        finally:
            await b.close()

    return asyncio.run(run())


def test_demo_scheduler_migrates_kv_through_kedgeflow(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with held_port() as port:  # the fleet's exporters get other ports
        base = f"http://127.0.0.1:{port}"
        fleet = DemoFleet(base, str(TRACE), instances=4, load=0.6, speed=4.0, limit=1500,
                          control_key_pem=demo_grant_key_pem(data), rebalance_period_s=1.0, rebalance_cooldown_s=5.0)
    raw = demo_config(f"127.0.0.1:{port}", fleet.targets, f"127.0.0.1:{fleet.sched_port}", fleet.control_url)
    cfg = tmp_path / "demo.yml"
    cfg.write_text(yaml.safe_dump(raw))
    reb, control = fleet.rebalancer, fleet.control
    assert reb is not None and control is not None and fleet.control_url is not None
    with ServerProcess(data, ["--config", str(cfg)], port=port) as srv:
        fleet.start()
        try:
            deadline = time.time() + 20
            while time.time() < deadline and not any(r.outcome and r.outcome["status"] == "committed" for r in reb.rounds()):
                time.sleep(0.5)
            reb.stop()  # nothing else proposes from here on: the counts below are final
            done = [r for r in reb.rounds() if r.outcome and r.outcome["status"] == "committed"]
            assert done, f"no migration committed: {reb.stats}, rounds {reb.rounds()}"
            first = done[0]
            params = first.action["params"]
            ev = params["evidence"]
            # proposed because the source instance was congested, to a less congested one
            assert ev["saturated"] or ev["price_seconds_per_token"] >= reb.congested_price, ev
            assert ev["destination_price_seconds_per_token"] < reb.congested_price
            # approved by the server's policy on the live cluster price, below its bound
            assert first.decision["approved"] and first.decision["signals"]["price"] < 0.05, first.decision
            # the target pinned the new holder and moved the session's KV in the simulation (the KV the
            # source held when the loop chose it, unless the simulation evicted or moved it in between)
            results = [(r.action["params"], r.outcome["result"]) for r in done]
            assert all(res["holder"] == p["to"] for p, res in results), results
            assert any(res["from"] == p["from"] and res["moved_kv_tokens"] > 0 for p, res in results), results
            assert control.holder(params["session"])[1] == params["expected_holder_version"] + 1 or len(done) > 1

            # each committed grant was applied exactly once at the target
            actions = _get(fleet.control_url + "/api/v1/scheduler/actions")
            keys = [a["idempotency_key"] for a in actions["applied"]]
            committed = [r.outcome["allowance_id"] for r in done]
            assert sorted(keys) == sorted(committed) and actions["commits"] == len(committed), (keys, committed)

            # the replay of the first grant (by the loop's probe, and again here) is refused, nothing applied
            assert first.replay is not None and first.replay["status"] == "refused" and "consumed" in first.replay["reason"]
            again = _post(srv.url + "/api/v1/kedgeflow/execute", {"action": first.action, "grant": first.grant})
            assert again["status"] == "refused" and "consumed" in again["reason"], again
            assert control.commits == len(committed)

            # the fleet's exporters say the same: actions by outcome, and the migrated KV bytes at the receivers
            actions_by = _samples(fleet.sched_metrics.exposition(), "turboprom_scheduler_control_actions_total", "outcome")
            assert actions_by.get("committed") == len(committed), actions_by
            assert sum(actions_by.values()) == len(reb.rounds()), (actions_by, reb.stats)
            migrated = sum(_samples(w.exposition(), "turboprom_worker_kv_transfer_bytes_total", "reason").get("approved_migration", 0)
                           for w in fleet.workers)
            assert migrated == sum(res["moved_kv_bytes"] for _, res in results) > 0

            # an uncertain dispatch (the control endpoint gone) never restores the allowance
            fleet.control_server.close()  # type: ignore[union-attr]
            session = params["session"]
            version = control.holder(session)[1]
            spec = {"verb": "scheduler.kv_migrate", "target": f"session/{session}",
                    "params": {"cluster": "demo", "model": fleet.model, "session": session, "from": params["to"], "to": params["from"],
                               "expected_holder_version": version}}
            deadline = time.time() + 30
            while True:
                while not (prop := _post(srv.url + "/api/v1/kedgeflow/propose", spec))["decision"]["approved"] and time.time() < deadline:
                    time.sleep(0.5)  # the policy refuses while the cluster price is above its bound: ask again
                assert prop["decision"]["approved"], prop["decision"]
                out = _post(srv.url + "/api/v1/kedgeflow/execute", {"action": prop["action"], "grant": prop["grant"]})
                # the live price can cross the bound between propose and execute: the recheck refuses that
                # grant (nothing dispatched), so ask for a new one
                if out["status"] == "refused" and "policy recheck failed" in out["reason"] and time.time() < deadline:
                    time.sleep(0.5)
                    continue
                break
            assert out["status"] == "uncertain", out
            out = _post(srv.url + "/api/v1/kedgeflow/execute", {"action": prop["action"], "grant": prop["grant"]})
            assert out["status"] == "refused" and "consumed" in out["reason"], out
            assert control.commits == len(committed) and control.holder(session)[1] == version

            # every step is in the audit log, per allowance
            entries = _get(srv.url + "/api/v1/audit?limit=0")["data"]
            by_aid = [e["kind"] for e in entries if e["data"].get("allowance_id") == first.outcome["allowance_id"]]
            assert by_aid[:6] == ["grant", "consume_attempt", "consume_result", "dispatch", "outcome", "consume_attempt"], by_aid
            assert by_aid.count("refused") == 2 and by_aid.count("outcome") == 1
            outcomes = [e["data"]["status"] for e in entries if e["kind"] == "outcome"]
            assert outcomes.count("committed") == len(committed) and outcomes.count("uncertain") == 1
            v = _get(srv.url + "/api/v1/audit/verify")["data"]
            assert v["ok"] and v["entries"] == len(entries), v

            # the UI's audit page shows the verified log and the migration entries
            text = _audit_page_text(srv.url, tmp_path / "chrome")
            assert f"{len(entries)} entries" in text and "outcome" in text and first.outcome["allowance_id"] in text, text[:2000]
        finally:
            fleet.stop()

    cli = [sys.executable, "-m", "turboprom", "audit", "verify", "--data-dir", str(data), "--limit", "0"]
    r = subprocess.run(cli, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "OK: no tampering detected" in r.stdout, r.stdout + r.stderr
    listed = [ln for ln in r.stdout.splitlines() if ln.strip()[:1].isdigit()]
    assert len(listed) == len(entries)
    assert any("outcome" in ln and "status=committed" in ln for ln in listed), r.stdout
    assert any("proposal" in ln and "scheduler.kv_migrate session/" in ln for ln in listed), r.stdout

    log = data / "kedgeflow" / "audit" / "audit.jsonl"
    lines = log.read_text().splitlines()
    k = next(i for i, ln in enumerate(lines) if json.loads(ln)["kind"] == "outcome")
    e = json.loads(lines[k])
    e["data"]["status"] = "refused"
    lines[k] = json.dumps(e)
    log.write_text("\n".join(lines) + "\n")
    r = subprocess.run(cli, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"entry seq {e['seq']}: content does not match its hash" in r.stdout, r.stdout


def _row(name: str, price: float, *, saturated: bool = False, stale: bool = False) -> dict:
    return {"cluster": "demo", "instance": name, "congestion_price_seconds_per_token": price, "saturated": saturated, "stale": stale}


def test_rebalancer_chooses_the_most_congested_source_and_the_coolest_destination() -> None:
    from scheduler_metrics.schedulers.rebalance import KVRebalancer

    held = {0: [(7, 9000), (8, 100)], 1: [(11, 5000)], 2: [], 3: [(31, 4000)]}
    reb = KVRebalancer("http://127.0.0.1:1", ["w0", "w1", "w2", "w3"], lambda i: held[i], lambda s: 2, cluster="demo",
                       model="m", cooldown_s=30.0)
    snap = {"version": 5, "instances": [_row("w0", 0.2, saturated=True), _row("w1", 0.9, stale=True), _row("w2", 0.001),
                                        _row("w3", 0.01), {**_row("w9", 5.0)}]}
    spec = reb.choose(snap, now=1000.0)
    assert spec is not None and spec["verb"] == "scheduler.kv_migrate" and spec["target"] == "session/7"
    p = spec["params"]
    # w1 is stale and w9 unknown: the source is w0 (saturated), the destination the lowest price (w2)
    assert (p["from"], p["to"], p["session"], p["expected_holder_version"]) == (0, 2, 7, 2)
    assert p["evidence"]["instance"] == "w0" and p["evidence"]["snapshot_version"] == 5
    # nothing congested, or no destination below the bound: nothing to propose
    assert reb.choose({"instances": [_row("w0", 0.01), _row("w2", 0.001)]}, now=1000.0) is None
    assert reb.choose({"instances": [_row("w0", 0.2, saturated=True), _row("w2", 0.06)]}, now=1000.0) is None
    # within the cooldown the same source is left alone; an instance holding nothing cannot give
    reb._source_at[0] = 990.0
    assert reb.choose(snap, now=1000.0) is None
    assert reb.choose({"instances": [_row("w2", 0.5, saturated=True), _row("w3", 0.001)]}, now=1000.0) is None


def test_control_endpoint_refuses_a_migration_the_simulation_did_not_carry_out() -> None:
    from scheduler_metrics.schedulers.control import SchedulerControl
    from scheduler_metrics.schedulers.vesta import VestaScheduler
    from scheduler_metrics.sim.demo_fleet import Migrations

    moves = Migrations()
    control = SchedulerControl(VestaScheduler(4), allow_unsigned=True, mover=lambda s, to: moves.submit(s, to, timeout_s=0.2))
    status, body = control.migrate("k1", {"session": 3, "to": 1, "expected_holder_version": 0})
    assert status == 503 and "nothing changed" in body["error"]
    assert control.commits == 0 and control.holder(3) == (-1, 0) and "k1" not in control.applied
    # the withdrawn move is not applied later either
    from scheduler_metrics.sim.cluster import ClusterSim
    from scheduler_metrics.sim.signals import OracleSignals
    from scheduler_metrics.sim.traces import load_trace

    sim = ClusterSim(load_trace(str(TRACE)).head(10), control.vesta, OracleSignals(), instances=4)
    moves.apply(sim, control.vesta)
    assert 3 not in control.vesta.holder
