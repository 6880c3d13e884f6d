"""A whole cluster on one machine's loopback: 3 NATS JetStream nodes, etcd, and TurboProm role
processes, each its own process with its role on its command line (``--role ingester``...), so an
operator or a test can find and kill one by its pid. Used by the cluster tests, bench/cluster_*.py
and for trying the cluster out; production runs the same commands on several machines
(docs/cluster.md).
"""
from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from scheduler_metrics.loopback_ports import free_port, free_ports

REPO = Path(__file__).resolve().parents[2]


def binary(name: str) -> str:
    path = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if Path(p).exists()), None)
    if path is None:
        raise FileNotFoundError(f"{name} is not installed (the Makefile's peers target installs it with apt-get)")
    return path


def _get(url: str, timeout: float = 1.0, context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except Exception:  # noqa: BLE001 - not up yet
        return 0, b""


def wait_until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} within {timeout:g}s")


@dataclass
class Proc:
    name: str
    cmd: list[str]
    log: Path
    port: int = 0
    popen: subprocess.Popen | None = None

    def start(self) -> "Proc":
        fh = open(self.log, "ab")
        self.popen = subprocess.Popen(self.cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT)
        fh.close()
        return self

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen else 0

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.popen.kill()
            self.popen.wait(10)

    def stop(self, timeout: float = 20.0) -> None:
        if self.alive():
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


@dataclass
class LocalCluster:
    base: Path
    ingesters: int = 2
    distributors: int = 1
    queriers: int = 1
    partitions: int = 16
    nats_nodes: int = 3
    etcd_members: int = 1
    publish_timeout: str = "5s"
    extra_args: list[str] = field(default_factory=list)
    ingester_args: list[str] = field(default_factory=list)  # for every ingester (e.g. ``--config`` with planner settings)
    nats_args: list[str] = field(default_factory=list)  # for every nats-server (e.g. ``-c`` a config with TLS and users)
    # etcd serves https and wants client certificates signed by the CA: files ``ca``, ``server_crt``,
    # ``server_key`` (etcd's), ``client_crt``, ``client_key`` (this object's health checks, ``etcd_call``)
    etcd_tls: dict[str, Path] | None = None
    ports: dict[str, int] = field(default_factory=dict)  # fixed ports by process name (default: free ones)
    nats: list[Proc] = field(default_factory=list)
    etcds: list[Proc] = field(default_factory=list)  # the etcd cluster's members
    roles: dict[str, Proc] = field(default_factory=dict)

    @property
    def nats_urls(self) -> str:
        return ",".join(f"nats://127.0.0.1:{p.port}" for p in self.nats)

    @property
    def etcd(self) -> Proc:
        return self.etcds[0]

    @property
    def etcd_scheme(self) -> str:
        return "https" if self.etcd_tls else "http"

    @property
    def etcd_url(self) -> str:
        """The first member's client URL."""
        return f"{self.etcd_scheme}://127.0.0.1:{self.etcd.port}"

    @property
    def etcd_urls(self) -> str:
        """Every member's client URL, as ``--cluster.etcd-endpoints`` takes them."""
        return ",".join(f"{self.etcd_scheme}://127.0.0.1:{p.port}" for p in self.etcds)

    def etcd_ssl(self) -> ssl.SSLContext | None:
        if self.etcd_tls is None:
            return None
        t = self.etcd_tls
        c = ssl.create_default_context(cafile=str(t["ca"]))
        c.load_cert_chain(str(t["client_crt"]), str(t["client_key"]))
        return c

    def etcd_call(self, path: str, body: dict, token: str | None = None) -> dict:
        """One call to etcd's JSON gateway on the first member (e.g. to set up users and auth)."""
        req = urllib.request.Request(self.etcd_url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **({"Authorization": token} if token else {})})
        with urllib.request.urlopen(req, timeout=10, context=self.etcd_ssl()) as r:
            return json.loads(r.read())

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.roles[name].port}"

    def start_backends(self) -> "LocalCluster":
        """NATS and etcd only (a caller may set them up, e.g. etcd users, before adding roles)."""
        self.base.mkdir(parents=True, exist_ok=True)
        self._start_nats()
        self._start_etcd()
        return self

    def etcd_healthy(self, i: int = 0) -> bool:
        return _get(f"{self.etcd_scheme}://127.0.0.1:{self.etcds[i].port}/health", context=self.etcd_ssl())[0] == 200

    def start(self, timeout: float = 90.0) -> "LocalCluster":
        self.start_backends()
        for i in range(self.ingesters):
            self.add_role("ingester", f"ingester-{i}", self.ingester_args)
        for i in range(self.distributors):
            self.add_role("distributor", f"distributor-{i}")
        for i in range(self.queriers):
            self.add_role("querier", f"querier-{i}")
        for name in self.roles:
            self.wait_ready(name, timeout)
        return self

    def _start_nats(self) -> None:
        exe = binary("nats-server")
        ports = free_ports(2 * self.nats_nodes)  # all at once: ports picked one at a time can repeat
        client, route = ports[: self.nats_nodes], ports[self.nats_nodes:]
        routes = ",".join(f"nats://127.0.0.1:{p}" for p in route)
        for i in range(self.nats_nodes):
            d = self.base / f"nats-{i}"
            d.mkdir(exist_ok=True)
            cmd = [exe, "-a", "127.0.0.1", "-p", str(client[i]), "-js", "-sd", str(d), "--server_name", f"n{i}",
                   "--cluster_name", "turboprom", "--cluster", f"nats://127.0.0.1:{route[i]}", "--routes", routes,
                   *self.nats_args]
            self.nats.append(Proc(f"nats-{i}", cmd, self.base / f"nats-{i}.log", client[i]).start())

    def restart_nats(self, i: int) -> None:
        p = self.nats[i]
        p.start()

    def _start_etcd(self) -> None:
        n = self.etcd_members
        ports = free_ports(2 * n)
        client, peer = ports[:n], ports[n:]
        initial = ",".join(f"e{i}=http://127.0.0.1:{peer[i]}" for i in range(n))
        sc = self.etcd_scheme
        tls = []
        if self.etcd_tls is not None:
            t = self.etcd_tls
            tls = ["--cert-file", str(t["server_crt"]), "--key-file", str(t["server_key"]), "--client-cert-auth",
                   "--trusted-ca-file", str(t["ca"])]
        for i in range(n):
            cmd = [binary("etcd"), "--name", f"e{i}", "--data-dir", str(self.base / ("etcd" if i == 0 else f"etcd-{i}")),
                   "--listen-client-urls", f"{sc}://127.0.0.1:{client[i]}", "--advertise-client-urls",
                   f"{sc}://127.0.0.1:{client[i]}", "--listen-peer-urls", f"http://127.0.0.1:{peer[i]}",
                   "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer[i]}", "--initial-cluster", initial,
                   "--initial-cluster-token", "turboprom-local", *tls]
            name = "etcd" if n == 1 else f"etcd-{i}"
            self.etcds.append(Proc(name, cmd, self.base / f"{name}.log", client[i]).start())
        for i, p in enumerate(self.etcds):  # healthy once the members have elected a leader
            wait_until(lambda i=i: self.etcd_healthy(i), 30, f"{p.name} did not become healthy")

    def restart_etcd(self, i: int) -> None:
        """Start member ``i`` again (same name, ports and data dir) after a kill."""
        self.etcds[i].start()

    def role_cmd(self, role: str, name: str, port: int, args: Sequence[str] = ()) -> list[str]:
        return [sys.executable, "-m", "turboprom", "serve", "--role", role, "--listen", f"127.0.0.1:{port}",
                "--data-dir", str(self.base / name), "--cluster.nats-urls", self.nats_urls,
                "--cluster.etcd-endpoints", self.etcd_urls, "--cluster.partitions", str(self.partitions),
                "--cluster.node-id", name, "--cluster.publish-timeout", self.publish_timeout, *self.extra_args, *args]

    def add_role(self, role: str, name: str, args: Sequence[str] = ()) -> Proc:
        """Start (or restart, on its port) a process of ``role``; ``args``: flags of its own
        (e.g. a second querier with ``--cluster.pushdown false``)."""
        port = self.roles[name].port if name in self.roles else self.ports.get(name) or free_port()
        p = Proc(name, self.role_cmd(role, name, port, args), self.base / f"{name}.log", port).start()
        self.roles[name] = p
        return p

    def wait_ready(self, name: str, timeout: float = 90.0) -> None:
        p = self.roles[name]

        def ready() -> bool:
            if not p.alive():
                raise RuntimeError(f"{name} exited: {p.log.read_text()[-3000:]}")
            return _get(self.url(name) + "/-/ready")[0] == 200
        wait_until(ready, timeout, f"{name} did not become ready")

    def ingester_status(self, name: str, lag: bool = False) -> dict:
        code, body = _get(self.url(name) + "/internal/cluster/v1/status" + ("?lag=1" if lag else ""), timeout=10)
        return json.loads(body) if code == 200 else {}

    def wait_applied(self, names: list[str], timeout: float = 60.0) -> None:
        """Until each ingester has applied everything on the log of every partition it owns (what was
        acknowledged before the call is then queryable)."""
        def done() -> bool:
            sts = [self.ingester_status(n, lag=True) for n in names]
            return all(st and st.get("owned") and "lag" in st and not any(st["lag"].values()) for st in sts)
        wait_until(done, timeout, f"{', '.join(names)} did not apply the whole log")

    def wait_caught_up(self, names: list[str], timeout: float = 60.0) -> None:
        def done() -> bool:
            sts = [self.ingester_status(n) for n in names]
            return all(st and st.get("owned") and set(st["owned"]) <= set(st.get("caught_up", [])) for st in sts)
        wait_until(done, timeout, f"{', '.join(names)} did not catch up")

    def stop(self) -> None:
        for p in reversed(list(self.roles.values())):
            p.stop()
        for p in self.nats:
            p.stop()
        for p in self.etcds:
            p.stop()


def add_cluster_args(ap: Any) -> None:
    """The command-line shape of a local cluster (this module's ``main`` and the cluster demo's)."""
    ap.add_argument("--dir", default="./cluster-data")
    ap.add_argument("--ingesters", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--etcd-members", type=int, default=3)
    ap.add_argument("--distributor-port", type=int, default=9091)
    ap.add_argument("--querier-port", type=int, default=9090)


def cluster_from_args(a: Any) -> LocalCluster:
    return LocalCluster(Path(a.dir), ingesters=a.ingesters, partitions=a.partitions, etcd_members=a.etcd_members,
                        ports={"distributor-0": a.distributor_port, "querier-0": a.querier_port})


def main() -> None:
    import argparse
    import signal

    ap = argparse.ArgumentParser(description="run a local TurboProm cluster on loopback until ^C")
    add_cluster_args(ap)
    c = cluster_from_args(ap.parse_args()).start()
    try:
        for name, p in c.roles.items():
            print(f"{name:14s} pid {p.pid:7d}  {c.url(name)}", flush=True)
        print(f"remote write: {c.url('distributor-0')}/api/v1/write   Prometheus API: {c.url('querier-0')}", flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # after the children started
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        c.stop()


if __name__ == "__main__":
    main()
