"""End to end over real HTTP: a delete_series request goes through approval, gateway, target and
audit; a replayed or substituted execution is refused; `turboprom audit verify` checks the log."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.helpers import REPO, ServerProcess, http_json


def _post(url: str, body: dict | bytes, ctype: str = "application/json") -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    st, out, _ = http_json(url, data, {"Content-Type": ctype}, timeout=30)
    return st, out


def _get(url: str) -> dict:
    return http_json(url, timeout=30)[1]


def test_delete_series_through_grant_gateway_and_audit(tmp_path: Path) -> None:
    # Without the admin API enabled, tsdb.* actions are refused at proposal.
    with ServerProcess(tmp_path / "off") as srv:
        st, prop = _post(srv.url + "/api/v1/kedgeflow/propose",
                         {"verb": "tsdb.delete_series", "target": "tsdb", "params": {"match[]": ["x"]}})
        assert st == 400 and "admin APIs disabled" in prop["error"]
    with ServerProcess(tmp_path / "data", ["--web.enable-admin-api"]) as srv:
        # A malformed selector is refused before any allowance exists.
        st, prop = _post(srv.url + "/api/v1/kedgeflow/propose",
                         {"verb": "tsdb.delete_series", "target": "tsdb", "params": {"match[]": ["{"]}})
        assert st == 400
        st, _ = _post(srv.url + "/api/v1/import/prometheus", b'gpu_util{gpu="0"} 1\ngpu_util{gpu="1"} 2\n', "text/plain")
        assert st in (200, 204)
        assert len(_get(srv.url + "/api/v1/series?match[]=gpu_util")["data"]) == 2

        st, prop = _post(srv.url + "/api/v1/kedgeflow/propose",
                         {"verb": "tsdb.delete_series", "target": "tsdb", "params": {"match[]": ['gpu_util{gpu="0"}']}})
        assert st == 200 and prop["data"]["decision"]["approved"], prop
        action, grant = prop["data"]["action"], prop["data"]["grant"]

        # Parameter substitution: same grant, broader selector -> refused, nothing deleted.
        forged = dict(action, params={"match[]": ["gpu_util"]})
        st, out = _post(srv.url + "/api/v1/kedgeflow/execute", {"action": forged, "grant": grant})
        assert out["data"]["status"] == "refused"
        assert len(_get(srv.url + "/api/v1/series?match[]=gpu_util")["data"]) == 2

        st, out = _post(srv.url + "/api/v1/kedgeflow/execute", {"action": action, "grant": grant})
        assert out["data"]["status"] == "committed", out
        remaining = _get(srv.url + "/api/v1/series?match[]=gpu_util")["data"]
        assert [s["gpu"] for s in remaining] == ["1"]

        # Replay of the same grant: single use.
        st, out = _post(srv.url + "/api/v1/kedgeflow/execute", {"action": action, "grant": grant})
        assert out["data"]["status"] == "refused" and "consumed" in out["data"]["reason"]

        kinds = [e["kind"] for e in _get(srv.url + "/api/v1/audit")["data"]]
        for k in ("proposal", "decision", "grant", "consume_attempt", "consume_result", "dispatch", "outcome", "refused"):
            assert k in kinds, (k, kinds)
        v = _get(srv.url + "/api/v1/audit/verify")["data"]
        assert v["ok"] and v["entries"] == len(kinds)
    # After shutdown (heads signed on close) the CLI verifies, then detects an edit.
    cli = [sys.executable, "-m", "turboprom", "audit", "verify", "--data-dir", str(tmp_path / "data")]
    r = subprocess.run(cli, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    log = tmp_path / "data" / "kedgeflow" / "audit" / "audit.jsonl"
    lines = log.read_text().splitlines()
    e = json.loads(lines[2])
    e["data"]["principal"] = "mallory"
    lines[2] = json.dumps(e)
    log.write_text("\n".join(lines) + "\n")
    r = subprocess.run(cli, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 1 and "modified" in r.stdout


def test_vesta_migration_through_kedgeflow(tmp_path: Path) -> None:
    """A KV prefix migration: approved only under a low congestion price, dispatched once to the
    scheduler's control endpoint, conditional on the holder version, all audited."""
    import time

    from scheduler_metrics.kedgeflow.grant import GrantVerifier, load_or_create_key
    from scheduler_metrics.schedulers.control import ControlServer, SchedulerControl
    from scheduler_metrics.schedulers.vesta import VestaScheduler
    from tests.helpers import free_port

    # The control endpoint trusts the server's grant key only (exported as `turboprom audit export-key` does).
    key = load_or_create_key(tmp_path / "data" / "kedgeflow" / "signing-key.pem")
    pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    vesta = VestaScheduler(4)
    control = SchedulerControl(vesta, GrantVerifier.from_pem(pem))
    vesta.holder[7] = 1
    port = free_port()
    endpoint = ControlServer(control, port)
    endpoint.start()
    cfg = tmp_path / "cfg.yml"
    cfg.write_text(f"kedgeflow:\n  targets:\n    scheduler.kv_migrate: http://127.0.0.1:{port}/api/v1/scheduler/migrate\n"
                   "congestion:\n  rate_window: 1s\n")
    try:
        with ServerProcess(tmp_path / "data", ["--config", str(cfg)]) as srv:
            action_spec = {"verb": "scheduler.kv_migrate", "target": "session/7",
                           "params": {"cluster": "c1", "session": 7, "to": 3, "expected_holder_version": 0}}
            # No telemetry yet: no congestion price, so the policy refuses.
            st, prop = _post(srv.url + "/api/v1/kedgeflow/propose", action_spec)
            assert not prop["data"]["decision"]["approved"] and "congestion" in prop["data"]["decision"]["reason"]
            # A lightly loaded worker reports in (vLLM + Vesta families): the price is low.
            deadline = time.time() + 60
            k = 0
            while time.time() < deadline:  # report until the tracker has a price for c1 (slow CI boxes too)
                body = (f'vllm:num_requests_waiting{{cluster="c1",model_name="m",instance="w0"}} 0\n'
                        f'vllm:num_requests_running{{cluster="c1",model_name="m",instance="w0"}} 1\n'
                        f'turboprom_worker_prefill_backlog_tokens{{cluster="c1",model_name="m",instance="w0"}} 10\n'
                        f'turboprom_worker_prefill_capacity_tokens_per_second{{cluster="c1",model_name="m",instance="w0"}} 10000\n'
                        f'turboprom_worker_prefill_computed_tokens_total{{cluster="c1",model_name="m",instance="w0"}} {1000 * k}\n'
                        f'vllm:request_success_total{{cluster="c1",model_name="m",instance="w0",finished_reason="stop"}} {k}\n').encode()
                _post(srv.url + "/api/v1/import/prometheus", body, "text/plain")
                k += 1
                time.sleep(0.4)
                clusters = _get(srv.url + "/api/v1/congestion?cluster=c1")["data"]["clusters"]
                if k >= 4 and clusters and clusters[0].get("congestion_price_seconds_per_token") is not None:
                    break
            st, prop = _post(srv.url + "/api/v1/kedgeflow/propose", action_spec)
            d = prop["data"]["decision"]
            assert d["approved"], d
            assert d["signals"]["price"] is not None and d["signals"]["price"] < 0.05
            action, grant = prop["data"]["action"], prop["data"]["grant"]
            st, out = _post(srv.url + "/api/v1/kedgeflow/execute", {"action": action, "grant": grant})
            assert out["data"]["status"] == "committed", out
            assert vesta.holder[7] == 3 and control.commits == 1
            _control_refuses_unauthorized(f"http://127.0.0.1:{port}/api/v1/scheduler/migrate", action, grant, control)
            assert vesta.holder[7] == 3 and control.commits == 1
            # A second approval for the same (now stale) holder version is refused by the target.
            st, prop2 = _post(srv.url + "/api/v1/kedgeflow/propose", action_spec)
            st, out2 = _post(srv.url + "/api/v1/kedgeflow/execute", {"action": prop2["data"]["action"], "grant": prop2["data"]["grant"]})
            assert out2["data"]["status"] == "rejected_by_target" and "holder version" in out2["data"]["reason"]
            assert control.commits == 1
            outcomes = [e["data"]["status"] for e in _get(srv.url + "/api/v1/audit?kind=outcome")["data"]]
            assert outcomes == ["committed", "rejected_by_target"]
    finally:
        endpoint.close()


def _control_refuses_unauthorized(url: str, action: dict, token: str, control: object) -> None:
    """Reaching the scheduler's control endpoint directly, without a valid grant, changes nothing."""
    from scheduler_metrics.kedgeflow.action import Action
    from scheduler_metrics.kedgeflow.grant import Grant, GrantSigner
    from scheduler_metrics.kedgeflow.targets import GRANT_HEADER

    aid = Grant.from_token(token).allowance_id
    fresh = {**action, "params": {**action["params"], "expected_holder_version": 1, "to": 0}}

    def post(body: dict, headers: dict) -> tuple[int, dict]:
        st, out, _ = http_json(url, json.dumps(body).encode(), {"Content-Type": "application/json", **headers}, timeout=30)
        return st, out

    st, out = post(fresh, {"Idempotency-Key": "k-unsigned"})
    assert st == 401 and GRANT_HEADER in out["error"]
    # The granted action with substituted parameters (valid for the current holder version).
    st, out = post(fresh, {"Idempotency-Key": aid, GRANT_HEADER: token})
    assert st == 403 and "byte for byte" in out["error"]
    # The granted action under another idempotency key (a second application of one grant).
    st, out = post(action, {"Idempotency-Key": "another", GRANT_HEADER: token})
    assert st == 403 and "allowance id" in out["error"]
    # A grant signed by a key the target does not trust.
    rogue = GrantSigner(Ed25519PrivateKey.generate()).sign(Action.from_dict(fresh), "rogue-aid", 60_000)
    st, out = post(fresh, {"Idempotency-Key": "rogue-aid", GRANT_HEADER: rogue.to_token()})
    assert st == 403 and "unknown key" in out["error"]
    st, out = post(fresh, {"Idempotency-Key": "x", GRANT_HEADER: "not-a-token"})
    assert st == 403 and "malformed" in out["error"]
    # The original, valid request replayed: already applied.
    st, out = post(action, {"Idempotency-Key": aid, GRANT_HEADER: token})
    assert st == 409
    assert control.refused == 5  # type: ignore[attr-defined]


def test_revoke_is_tenant_scoped_and_blocks_execution(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", ["--web.enable-admin-api"]) as srv:
        spec = {"verb": "tsdb.delete_series", "target": "tsdb", "params": {"match[]": ["nothing_here"]}}
        req = urllib.request.Request(srv.url + "/api/v1/kedgeflow/propose", data=json.dumps(spec).encode(), method="POST",
                                     headers={"X-Scope-OrgID": "team-a"})
        prop = json.loads(urllib.request.urlopen(req, timeout=30).read())["data"]
        aid = prop["allowance_id"]
        # Another tenant (here: the default one) cannot revoke team-a's grant.
        st, out = _post(srv.url + "/api/v1/kedgeflow/revoke", {"allowance_id": aid})
        assert st == 404
        req = urllib.request.Request(srv.url + "/api/v1/kedgeflow/revoke", data=json.dumps({"allowance_id": aid}).encode(),
                                     method="POST", headers={"X-Scope-OrgID": "team-a"})
        assert json.loads(urllib.request.urlopen(req, timeout=30).read())["data"]["was_available"] is True
        req = urllib.request.Request(srv.url + "/api/v1/kedgeflow/execute", data=json.dumps({"action": prop["action"], "grant": prop["grant"]}).encode(),
                                     method="POST", headers={"X-Scope-OrgID": "team-a"})
        out = json.loads(urllib.request.urlopen(req, timeout=30).read())["data"]
        assert out["status"] == "refused" and "revoked" in out["reason"]
