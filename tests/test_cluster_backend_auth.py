"""A cluster whose NATS and etcd require credentials and TLS (``--cluster.backends-config``): real
nats-server nodes with mutual TLS and users (a password user and an NKey user), a real etcd serving
https with client certificates and its authentication on. Writes go through, queries answer, an etcd
restart and a reset of every auth token (the roles authenticate again) are survived, and wrong or
missing credentials stop a role at start with one line naming the cause. The KedgeFlow ledger works on the same etcd with the server
YAML's ``kedgeflow.ledger.etcd`` user and TLS."""
from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import nkeys
import pytest
import yaml

from scheduler_metrics.kedgeflow.ledger import LedgerUnavailable
from scheduler_metrics.kedgeflow.ledger_etcd import EtcdLedger
from tests.helpers import (
    http_json,
    load_bench,
    require_binary,
    tls_ca_files,
    wait_until,
)
from turboprom.cluster.local_cluster import LocalCluster
from turboprom.cluster.backend_clients import ledger_etcd_client

pytestmark = pytest.mark.peer

T0 = (int(time.time()) - 1800) // 60 * 60 * 1000
N_SERIES = 400


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def _count(url: str) -> float | None:
    qs = urllib.parse.urlencode({"query": 'count({__name__=~"node_.*|vllm.*"})', "time": T0 / 1000 + 60})
    code, body, _ = http_json(f"{url}/api/v1/query?{qs}")
    if code != 200 or not body["data"]["result"]:
        return None
    return float(body["data"]["result"][0]["value"][1])


def _enable_etcd_auth(cluster: LocalCluster, password: str) -> None:
    """etcd's users and roles as an operator sets them up: root, and a user that may read and write the
    cluster's keys only; then authentication on."""
    call = cluster.etcd_call
    call("/v3/auth/user/add", {"name": "root", "password": "root-pw"})
    call("/v3/auth/user/grant", {"user": "root", "role": "root"})
    call("/v3/auth/role/add", {"name": "turboprom"})
    call("/v3/auth/role/grant", {"name": "turboprom", "perm": {"permType": "READWRITE", "key": _b64("/turboprom/"),
                                                               "range_end": _b64("/turboprom0")}})
    call("/v3/auth/user/add", {"name": "turboprom", "password": password})
    call("/v3/auth/user/grant", {"user": "turboprom", "role": "turboprom"})
    call("/v3/auth/role/add", {"name": "kedgeflow"})  # the KedgeFlow ledger's keys, for the same user
    call("/v3/auth/role/grant", {"name": "kedgeflow", "perm": {"permType": "READWRITE", "key": _b64("/kedgeflow/"),
                                                               "range_end": _b64("/kedgeflow0")}})
    call("/v3/auth/user/grant", {"user": "turboprom", "role": "kedgeflow"})
    call("/v3/auth/enable", {})


def _serve_fails(args: list[str], tmp, timeout: float = 120) -> str:
    r = subprocess.run([sys.executable, "-m", "turboprom", "serve", "--data-dir", str(tmp), "--listen", "127.0.0.1:0",
                        *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode != 0, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in r.stderr, r.stderr
    return lines[-1]


def test_cluster_on_authenticated_tls_backends(tmp_path):
    require_binary("nats-server")
    require_binary("etcd")
    tls = tls_ca_files(tmp_path)
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    nkey_user = nkeys.from_seed(bytearray(seed)).public_key.decode()
    (tmp_path / "distributor.nk").write_bytes(seed + b"\n")
    nats_conf = tmp_path / "nats.conf"
    nats_conf.write_text(f"""
tls {{
  cert_file: "{tls['server_crt']}"
  key_file: "{tls['server_key']}"
  ca_file: "{tls['ca']}"
  verify: true
}}
authorization {{
  users = [
    {{user: "turboprom", password: "nats-pw"}}
    {{nkey: "{nkey_user}"}}
  ]
}}
""")
    (tmp_path / "nats.pass").write_text("nats-pw\n")
    (tmp_path / "etcd.pass").write_text("etcd-pw\n")
    client_tls = "{ca_file: ca.crt, cert_file: client.crt, key_file: client.key}"  # relative to the YAML
    etcd_section = f"etcd:\n  username: turboprom\n  password_file: etcd.pass\n  tls_config: {client_tls}\n"
    backends = tmp_path / "backends.yml"
    backends.write_text(f"nats:\n  user: turboprom\n  password_file: nats.pass\n  tls_config: {client_tls}\n{etcd_section}")
    with_nkey = tmp_path / "backends-nkey.yml"
    with_nkey.write_text(f"nats:\n  nkey_seed_file: distributor.nk\n  tls_config: {client_tls}\n{etcd_section}")

    cluster = LocalCluster(tmp_path / "c", ingesters=2, distributors=0, queriers=0, partitions=4, publish_timeout="3s",
                           nats_args=["-c", str(nats_conf)], etcd_tls=tls)
    try:
        cluster.start_backends()
        _enable_etcd_auth(cluster, "etcd-pw")
        with pytest.raises(urllib.error.HTTPError):  # auth is on: no token, nothing
            cluster.etcd_call("/v3/kv/range", {"key": _b64("/turboprom/")})

        for i in range(2):
            cluster.add_role("ingester", f"ingester-{i}", ["--cluster.backends-config", str(backends)])
        cluster.add_role("distributor", "distributor-0", ["--cluster.backends-config", str(with_nkey)])
        cluster.add_role("querier", "querier-0", ["--cluster.backends-config", str(backends)])
        for name in list(cluster.roles):
            cluster.wait_ready(name)

        bodies, _ = load_bench("ingest_remote_write").build_payloads(N_SERIES, 200, 2, 1, T0)
        for b in bodies:
            req = urllib.request.Request(cluster.url("distributor-0") + "/api/v1/write", data=b, method="POST",
                                         headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"})
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 204
        wait_until(lambda: _count(cluster.url("querier-0")) == N_SERIES, 60, f"{N_SERIES} series through the querier")

        def live_ingesters() -> list[str]:
            root = cluster.etcd_call("/v3/auth/authenticate", {"name": "root", "password": "root-pw"})["token"]
            keys = cluster.etcd_call("/v3/kv/range", {"key": _b64("/turboprom/turboprom/alive/"),
                                                      "range_end": _b64("/turboprom/turboprom/alive0")}, token=root)
            return sorted(base64.b64decode(kv["key"]).decode().rsplit("/", 1)[1] for kv in keys.get("kvs", []))

        # an etcd restart: the roles reconnect and keep their liveness leases (3 s)
        cluster.etcds[0].kill()
        cluster.restart_etcd(0)
        wait_until(cluster.etcd_healthy, 30, "etcd healthy again")
        time.sleep(5)  # past the lease TTL: a role that could not reach etcd again has lost its lease
        assert live_ingesters() == ["ingester-0", "ingester-1"]
        assert _count(cluster.url("querier-0")) == N_SERIES
        # every auth token forgotten (authentication switched off and on again: etcd answers "invalid auth
        # token" to the old ones): the roles authenticate again and keep their leases
        logs = {name: p.log for name, p in cluster.roles.items()}
        seen = {name: log.stat().st_size for name, log in logs.items()}
        root = cluster.etcd_call("/v3/auth/authenticate", {"name": "root", "password": "root-pw"})["token"]
        cluster.etcd_call("/v3/auth/disable", {}, token=root)
        cluster.etcd_call("/v3/auth/enable", {})
        with pytest.raises(urllib.error.HTTPError, match="401"):  # the old token is refused now
            cluster.etcd_call("/v3/kv/range", {"key": _b64("/turboprom/")}, token=root)
        time.sleep(5)  # several cluster-state polls (reads of the cluster's keys) by every role
        for name, log in logs.items():
            with open(log, "rb") as f:
                f.seek(seen[name])
                since = f.read().decode(errors="replace")
            assert "invalid auth token" not in since, f"{name} after the token reset:\n{since[-2000:]}"
        assert live_ingesters() == ["ingester-0", "ingester-1"]
        assert _count(cluster.url("querier-0")) == N_SERIES

        # wrong or missing credentials: one line at start naming the cause, no traceback
        bad_etcd = tmp_path / "bad-etcd.yml"
        bad_etcd.write_text(f"etcd:\n  username: turboprom\n  password: wrong\n  tls_config: {client_tls}\n")
        line = _serve_fails(["--role", "querier", "--cluster.etcd-endpoints", cluster.etcd_urls,
                             "--cluster.backends-config", str(bad_etcd)], tmp_path / "q-bad")
        assert "refused user 'turboprom'" in line and "--cluster.backends-config" in line, line
        no_nats_user = tmp_path / "no-nats-user.yml"
        no_nats_user.write_text(f"nats:\n  tls_config: {client_tls}\n{etcd_section}")
        line = _serve_fails(["--role", "distributor", "--cluster.nats-urls", cluster.nats_urls,
                             "--cluster.backends-config", str(no_nats_user)], tmp_path / "d-bad")
        assert "Authorization Violation" in line and "--cluster.backends-config" in line, line

        # the KedgeFlow ledger on the same etcd, with the server YAML's kedgeflow.ledger.etcd settings
        server_yml = tmp_path / "server.yml"
        server_yml.write_text(f"kedgeflow:\n  ledger:\n    etcd:\n      endpoints: [{cluster.etcd_url}]\n"
                              f"      username: turboprom\n      password_file: etcd.pass\n      tls_config: {client_tls}\n")
        r = subprocess.run([sys.executable, "-m", "turboprom", "check", "config", str(server_yml)], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        kedgeflow = yaml.safe_load(server_yml.read_text())["kedgeflow"]

        async def ledger_flow(client) -> list:
            led = EtcdLedger(kedgeflow["ledger"]["etcd"]["endpoints"], timeout_s=3.0, client=client)
            try:
                await led.create("grant-1")
                return [await led.consume("grant-1", "c1"), await led.consume("grant-1", "c2"), await led.state("grant-1")]
            finally:
                await led.close()

        first, second, state = asyncio.run(ledger_flow(ledger_etcd_client(kedgeflow, str(tmp_path))))
        assert first.won and not second.won and second.consumer == "c1" and state == "consumed", (first, second, state)
        wrong = {"ledger": {"etcd": {**kedgeflow["ledger"]["etcd"], "password_file": "nats.pass"}}}
        with pytest.raises(LedgerUnavailable, match="refused user 'turboprom'"):
            asyncio.run(ledger_flow(ledger_etcd_client(wrong, str(tmp_path))))
    finally:
        cluster.stop()


@pytest.mark.parametrize("text, expected", [
    ("nats:\n  user: a\n  pasword: x\n", 'backends.yml:3: nats: unknown field "pasword" (did you mean "password"?)'),
    ("nats:\n  user: a\n  password: x\n  token: y\n", "at most one of user/password, token and nkey_seed_file"),
    ("etcd:\n  username: a\n", "etcd: username needs password or password_file"),
    ("etcd:\n  username: a\n  password: x\n  password_file: y\n", "at most one of password and password_file"),
    ("etcd:\n  tls_config: {cert_file: c.crt}\n", "etcd.tls_config: cert_file needs key_file"),
    ("zookeeper: {}\n", 'unknown field "zookeeper"'),
])
def test_bad_backends_config_refuses_to_start(tmp_path, text, expected):
    bad = tmp_path / "backends.yml"
    bad.write_text(text)
    line = _serve_fails(["--role", "querier", "--cluster.backends-config", str(bad)], tmp_path / "d", timeout=60)
    assert line.startswith("turboprom: --cluster.backends-config") or "--cluster.backends-config" in line, line
    assert expected in line, line
