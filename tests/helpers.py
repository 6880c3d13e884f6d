"""Shared test helpers: free loopback ports, a real TurboProm server subprocess, real peers."""
from __future__ import annotations

import base64
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler_metrics.loopback_ports import free_port, free_ports  # the tests' port picker too

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@contextlib.contextmanager
def held_port() -> Iterator[int]:
    """A free port kept bound until the block ends, so ports the kernel picks meanwhile (a demo
    fleet's exporters) cannot be it; the process to serve on it binds after the block."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout
    last: Exception | None = None
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except Exception as e:  # noqa: BLE001 - retry until deadline
            last = e
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s: {last}")


def require_binary(name: str) -> str:
    """Path of a real peer binary. Missing: fail loudly in CI (make test installs it), skip elsewhere."""
    path = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
    if path:
        return path
    msg = f"real peer {name!r} is not installed (make test installs it with apt-get)"
    if IN_CI:
        pytest.fail(msg)
    pytest.skip(msg)
    raise AssertionError  # unreachable


class ServerProcess:
    """A real `turboprom serve` on a loopback port, in its own process."""

    def __init__(self, data_dir: Path, extra_args: list[str] | None = None, port: int | None = None):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"server-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "ServerProcess":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "turboprom", "serve", "--data-dir", str(self.data_dir),
               "--listen", f"127.0.0.1:{self.port}", *self.extra_args]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_http(self.url + "/-/ready", timeout=timeout, proc=self.proc)
        except Exception:
            self.stop()
            raise RuntimeError(f"server failed to start; log:\n{self.log_path.read_text()[-4000:]}")
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if getattr(self, "_log", None):
            self._log.close()
        return self.proc.returncode if self.proc else None

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_BENCH_LOCK = threading.RLock()  # re-entrant: a bench script may load another at import


def load_bench(name: str):
    """Import a bench/ script as a module (bench/ is scripts, not a package), once. Thread-safe: a
    second caller waits for the first one's import instead of getting the half-run module."""
    import importlib.util

    key = f"bench_{name}"
    with _BENCH_LOCK:
        if key in sys.modules:
            return sys.modules[key]
        spec = importlib.util.spec_from_file_location(key, REPO / "bench" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod  # dataclasses look their module up here
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[key]
            raise
        return mod


def http_json(url: str, data: bytes | None = None, headers: dict | None = None, timeout: float = 60) -> tuple[int, dict, dict]:
    """(status, decoded JSON body or {}, response headers) for a GET, or a POST when data is given;
    HTTP errors are returned, not raised."""
    import json
    import urllib.error

    req = urllib.request.Request(url, data=data, headers=headers or {}, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw else {}), dict(r.headers)
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, (json.loads(raw) if raw else {}), dict(e.headers)


def bcrypt_hash(password: str) -> str:
    """A web config's bcrypt hash of ``password`` (cheap rounds: tests only)."""
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


def basic_auth(user: str, password: str) -> dict[str, str]:
    """The ``Authorization`` header of HTTP basic auth."""
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def wait_until(pred, timeout: float, what: str, interval: float = 0.2) -> None:
    """Poll ``pred`` until it is true; AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def tls_ca_files(folder: Path) -> dict[str, Path]:
    """A test CA and two certificates it signs: ``server`` (127.0.0.1 and localhost; server and client
    use, as etcd's gateway presents it to its own gRPC side) and ``client`` (no CommonName: etcd's
    gateway refuses client certificates with one once its authentication is on). Keys: ca, server_crt,
    server_key, client_crt, client_key."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "turboprom test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), True).sign(ca_key, hashes.SHA256()))
    out = {"ca": folder / "ca.crt"}
    out["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    for name, cn, sans, eku in (("server", "backend-server", [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                              x509.DNSName("localhost")], usages),
                                ("client", "", [x509.DNSName("turboprom-client")], usages[1:])):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn else [])
        cert = (x509.CertificateBuilder().subject_name(subject)
                .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(sans), False)
                .add_extension(x509.ExtendedKeyUsage(eku), False).sign(ca_key, hashes.SHA256()))
        out[f"{name}_crt"], out[f"{name}_key"] = folder / f"{name}.crt", folder / f"{name}.key"
        out[f"{name}_crt"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out[f"{name}_key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return out
