"""A real 3-member etcd cluster on loopback, started and stopped by the test that uses it."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.helpers import free_port, require_binary


class EtcdCluster:
    def __init__(self, base: Path, members: int = 3):
        self.etcd = require_binary("etcd")
        self.base = Path(base)
        self.names = [f"m{i}" for i in range(members)]
        self.client_ports = [free_port() for _ in self.names]
        self.peer_ports = [free_port() for _ in self.names]
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def endpoints(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.client_ports]

    def start(self) -> "EtcdCluster":
        initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(self.names, self.peer_ports))
        for n, cp, pp in zip(self.names, self.client_ports, self.peer_ports):
            d = self.base / n
            d.mkdir(parents=True, exist_ok=True)
            log = open(self.base / f"{n}.log", "wb")
            self.procs[n] = subprocess.Popen([
                self.etcd, "--name", n, "--data-dir", str(d / "data"),
                "--listen-client-urls", f"http://127.0.0.1:{cp}", "--advertise-client-urls", f"http://127.0.0.1:{cp}",
                "--listen-peer-urls", f"http://127.0.0.1:{pp}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{pp}",
                "--initial-cluster", initial, "--initial-cluster-state", "new", "--initial-cluster-token", f"tp-{self.client_ports[0]}",
                "--heartbeat-interval", "50", "--election-timeout", "500",
            ], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            if all(self._healthy(ep) for ep in self.endpoints):
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("etcd cluster did not become healthy: " + (self.base / "m0.log").read_text()[-2000:])

    @staticmethod
    def _healthy(ep: str) -> bool:
        try:
            with urllib.request.urlopen(ep + "/health", timeout=1) as r:
                return json.loads(r.read()).get("health") == "true"
        except Exception:  # noqa: BLE001
            return False

    def kill_member(self, index: int) -> None:
        p = self.procs[self.names[index]]
        if p.poll() is None:
            p.kill()
            p.wait(10)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
