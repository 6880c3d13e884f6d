"""End to end over real HTTP: a delete_series request goes through approval, gateway, target and
audit; a replayed or substituted execution is refused; `turboprom audit verify` checks the log."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.helpers import REPO, ServerProcess


def _post(url: str, body: dict | bytes, ctype: str = "application/json") -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def test_delete_series_through_grant_gateway_and_audit(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data") as srv:
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
