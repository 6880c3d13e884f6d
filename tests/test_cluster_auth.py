"""A cluster whose every role runs with ``--web.config.file`` (basic auth): the querier calls the
ingesters with the credentials of ``--cluster.internal-client-config`` (a password file), and a
querier without them gets nothing from the ingesters (real NATS JetStream and etcd)."""
from __future__ import annotations

import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from tests.helpers import basic_auth, bcrypt_hash, http_json, load_bench, require_binary
from turboprom.cluster.local_cluster import LocalCluster

pytestmark = pytest.mark.peer

T0 = (int(time.time()) - 1800) // 60 * 60 * 1000


def _count(url: str, headers: dict[str, str]) -> tuple[int, float | None]:
    qs = urllib.parse.urlencode({"query": 'count({__name__=~"node_.*|vllm.*"})', "time": T0 / 1000 + 60})
    code, body, _ = http_json(f"{url}/api/v1/query?{qs}", headers=headers)
    if code != 200 or not body["data"]["result"]:
        return code, None
    return code, float(body["data"]["result"][0]["value"][1])


def test_querier_authenticates_to_ingesters(tmp_path):
    require_binary("nats-server")
    require_binary("etcd")
    web = tmp_path / "web.yml"
    web.write_text(f"""
basic_auth_users:
  writer: {bcrypt_hash('writer-pw')}
  reader: {bcrypt_hash('reader-pw')}
  querier: {bcrypt_hash('querier-pw')}
roles:
  writer: [write]
  reader: [read]
  querier: [read]
""")
    (tmp_path / "querier-pw.txt").write_text("querier-pw\n")
    client = tmp_path / "internal-client.yml"
    client.write_text("basic_auth:\n  username: querier\n  password_file: querier-pw.txt\n")  # relative to the file
    cluster = LocalCluster(tmp_path / "c", ingesters=2, partitions=4, publish_timeout="2s",
                           extra_args=["--web.config.file", str(web)], queriers=0)
    try:
        cluster.start()
        cluster.add_role("querier", "querier-ok", ["--cluster.internal-client-config", str(client)])
        cluster.add_role("querier", "querier-no-creds")
        for name in ("querier-ok", "querier-no-creds"):
            cluster.wait_ready(name)
        bodies, _ = load_bench("ingest_remote_write").build_payloads(600, 300, 4, 1, T0)
        dist = cluster.url("distributor-0")
        for b in bodies:
            req = urllib.request.Request(dist + "/api/v1/write", data=b, method="POST", headers={
                "Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", **basic_auth("writer", "writer-pw")})
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 204
        reader = basic_auth("reader", "reader-pw")
        deadline = time.time() + 60
        got: tuple[int, float | None] = (0, None)
        while time.time() < deadline:
            got = _count(cluster.url("querier-ok"), reader)
            if got == (200, 600.0):
                break
            time.sleep(0.5)
        assert got == (200, 600.0), got
        # the ingesters refuse the querier that sends no credentials: no partition can be read
        code, body, _ = http_json(cluster.url("querier-no-creds") + "/api/v1/query?query=up", headers=reader)
        assert code == 503 and body["errorType"] == "unavailable", (code, body)
        # the querier itself still wants its own caller's credentials
        assert _count(cluster.url("querier-ok"), {})[0] == 401
    finally:
        cluster.stop()


def test_bad_internal_client_config_refuses_to_start(tmp_path):
    bad = tmp_path / "client.yml"
    bad.write_text("basic_auth:\n  username: q\n  pasword: x\n")
    r = subprocess.run([sys.executable, "-m", "turboprom", "serve", "--role", "querier", "--data-dir", str(tmp_path / "d"),
                        "--cluster.internal-client-config", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    last = [ln for ln in r.stderr.splitlines() if ln.strip()][-1]
    assert "--cluster.internal-client-config" in last and 'unknown field "pasword"' in last and "client.yml:3" in last, r.stderr
