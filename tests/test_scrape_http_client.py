"""Scrape configs with Prometheus's HTTP client settings against real targets: basic auth from a
password file, a bearer token from a file that is rotated while the server runs, HTTPS checked against
a CA file with ``tls_config.server_name``, and the failures a wrong credential or certificate gives
(``up`` 0, the target's error as Prometheus words it)."""
from __future__ import annotations

import asyncio
import datetime
import ssl
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.helpers import ServerProcess, basic_auth, free_port, http_json, wait_until


def _cert(tmp: Path, dns: str) -> tuple[Path, Path]:
    """A self-signed certificate valid for ``dns`` only (not for 127.0.0.1)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns)]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    c, k = tmp / "target.crt", tmp / "target.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return c, k


class Targets:
    """Exporters in a thread of this process: each port checks its own Authorization value."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.runners: list[web.AppRunner] = []
        self.seen: dict[int, list[str]] = {}
        self.expected: dict[int, str | None] = {}
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def add(self, port: int, expected_auth: str | None, ssl_ctx: ssl.SSLContext | None = None) -> None:
        self.expected[port] = expected_auth
        self.seen[port] = []

        async def handle(request: web.Request) -> web.Response:
            got = request.headers.get("Authorization", "")
            self.seen[port].append(got)
            if self.expected[port] is not None and got != self.expected[port]:
                return web.Response(status=401, text="unauthorized\n")
            return web.Response(text=f"# TYPE guarded_metric gauge\nguarded_metric{{port=\"{port}\"}} 1\n")

        async def start() -> None:
            app = web.Application()
            app.router.add_get("/metrics", handle)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_ctx).start()
            self.runners.append(runner)

        asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)

    def close(self) -> None:
        async def stop() -> None:
            for r in self.runners:
                await r.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def _up(url: str) -> dict[str, float]:
    st, b, _ = http_json(url + "/api/v1/query?" + urllib.parse.urlencode({"query": "up"}))
    assert st == 200, b
    return {r["metric"]["job"]: float(r["value"][1]) for r in b["data"]["result"]}


def _errors(url: str) -> dict[str, str]:
    st, b, _ = http_json(url + "/api/v1/targets")
    assert st == 200, b
    return {t["labels"]["job"]: t["lastError"] for t in b["data"]["activeTargets"]}


def test_scrape_auth_tls_and_rotated_token(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "pw.txt").write_text("s3cret\n")
    (conf / "token.txt").write_text("token-one\n")
    crt, key = _cert(conf, "target.test")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(crt, key)
    ports = {name: free_port() for name in ("basic", "bearer", "tls", "wrong", "tls_no_name", "no_file")}
    targets = Targets()
    try:
        targets.add(ports["basic"], basic_auth("prom", "s3cret")["Authorization"])
        targets.add(ports["bearer"], "Bearer token-one")
        targets.add(ports["tls"], basic_auth("prom", "s3cret")["Authorization"], server_ctx)
        targets.add(ports["wrong"], basic_auth("prom", "s3cret")["Authorization"])
        targets.add(ports["tls_no_name"], None, server_ctx)
        targets.add(ports["no_file"], None)
        cfg = conf / "turboprom.yml"  # credential and CA file names relative to the config's folder
        cfg.write_text(f"""
scrape_configs:
  - job_name: basic
    scrape_interval: 1s
    basic_auth: {{username: prom, password_file: pw.txt}}
    static_configs: [{{targets: ["127.0.0.1:{ports['basic']}"]}}]
  - job_name: bearer
    scrape_interval: 1s
    authorization: {{credentials_file: token.txt}}
    static_configs: [{{targets: ["127.0.0.1:{ports['bearer']}"]}}]
  - job_name: tls
    scrape_interval: 1s
    scheme: https
    basic_auth: {{username: prom, password: s3cret}}
    tls_config: {{ca_file: target.crt, server_name: target.test, min_version: TLS12}}
    static_configs: [{{targets: ["127.0.0.1:{ports['tls']}"]}}]
  - job_name: wrong
    scrape_interval: 1s
    basic_auth: {{username: prom, password: nope}}
    static_configs: [{{targets: ["127.0.0.1:{ports['wrong']}"]}}]
  - job_name: tls_no_name
    scrape_interval: 1s
    scheme: https
    tls_config: {{ca_file: target.crt}}
    static_configs: [{{targets: ["127.0.0.1:{ports['tls_no_name']}"]}}]
  - job_name: no_file
    scrape_interval: 1s
    bearer_token_file: not-yet.txt
    static_configs: [{{targets: ["127.0.0.1:{ports['no_file']}"]}}]
""")
        with ServerProcess(tmp_path / "data", ["--config", str(cfg)]) as srv:
            want = {"basic": 1.0, "bearer": 1.0, "tls": 1.0, "wrong": 0.0, "tls_no_name": 0.0, "no_file": 0.0}
            wait_until(lambda: _up(srv.url) == want, 30, f"up == {want}")
            errors = _errors(srv.url)
            assert errors["wrong"] == "server returned HTTP status 401 Unauthorized", errors
            assert "certificate" in errors["tls_no_name"].lower() or "hostname" in errors["tls_no_name"].lower(), errors
            assert all(errors[j] == "" for j in ("basic", "bearer", "tls")), errors
            # a credential file that is missing fails the scrape (named), not the config; once it exists, it is used
            assert "unable to read file" in errors["no_file"] and "not-yet.txt" in errors["no_file"], errors
            (conf / "not-yet.txt").write_text("late-token\n")
            wait_until(lambda: _up(srv.url)["no_file"] == 1.0, 15, "the late token file used")
            assert targets.seen[ports["no_file"]][-1] == "Bearer late-token"
            # the configuration shown back hides passwords and tokens, as Prometheus's does
            st, b, _ = http_json(srv.url + "/api/v1/status/config")
            assert st == 200 and "s3cret" not in b["data"]["yaml"] and "nope" not in b["data"]["yaml"], b
            assert b["data"]["yaml"].count("<secret>") == 2 and "password_file: pw.txt" in b["data"]["yaml"], b
            # the exporter now wants a new token; the file changes on disk and the next scrapes send it
            targets.expected[ports["bearer"]] = "Bearer token-two"
            wait_until(lambda: _up(srv.url)["bearer"] == 0.0, 15, "the old token refused")
            (conf / "token.txt").write_text("token-two\n")
            wait_until(lambda: _up(srv.url)["bearer"] == 1.0, 15, "the rotated token accepted")
            assert targets.seen[ports["bearer"]][-1] == "Bearer token-two"
            st, b, _ = http_json(srv.url + "/api/v1/query?" + urllib.parse.urlencode({"query": "count(guarded_metric)"}))
            assert st == 200 and b["data"]["result"][0]["value"][1] == "4", b
    finally:
        targets.close()


@pytest.mark.parametrize("section,message", [
    ("basic_auth: {username: a, password: b}\n    bearer_token: c",
     "at most one of basic_auth, authorization, bearer_token and bearer_token_file"),
    ("basic_auth: {username: a, password: b, password_file: pw.txt}", "at most one of password and password_file"),
    ("authorization: {type: Basic, credentials: x}", '"Basic" is not allowed, use basic_auth instead'),
    ("tls_config: {ca_file: missing.crt}", "tls_config"),
    ("tls_config: {insecure_skip_verify: maybe}", "insecure_skip_verify"),
    ("proxy_url: socks5://127.0.0.1:1080", "only http:// proxies"),
    ("oauth2: {client_id: x}", 'unknown field "oauth2"'),
])
def test_bad_http_client_settings_refuse_to_start(tmp_path: Path, section: str, message: str) -> None:
    (tmp_path / "pw.txt").write_text("x\n")
    cfg = tmp_path / "turboprom.yml"
    cfg.write_text(f"scrape_configs:\n  - job_name: j\n    {section}\n    static_configs: [{{targets: ['127.0.0.1:1']}}]\n")
    r = subprocess.run([sys.executable, "-m", "turboprom", "serve", "--data-dir", str(tmp_path / "data"), "--listen",
                        f"127.0.0.1:{free_port()}", "--config", str(cfg)], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode != 0, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("config error: ") and message in lines[-1], r.stderr
    assert "scrape_configs[0]" in lines[-1], r.stderr
