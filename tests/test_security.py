"""Auth (basic + bearer, bcrypt, roles), the non-loopback guard, and TLS, against the real server."""
from __future__ import annotations

import base64
import datetime
import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.helpers import REPO, ServerProcess, bcrypt_hash, free_port, wait_http

TOKEN = "s3cret-grafana-token"


def _web_config(tmp: Path, extra: str = "") -> Path:
    p = tmp / "web.yml"
    p.write_text(f"""
basic_auth_users:
  alice: {bcrypt_hash('alice-pw')}
  wally: {bcrypt_hash('wally-pw')}
  rita: {bcrypt_hash('rita-pw')}
bearer_tokens:
  - user: grafana
    hash: {bcrypt_hash(TOKEN)}
roles:
  alice: [admin]
  wally: [write]
  rita: [read]
  grafana: [read]
tenants:
  rita: [team-a]
{extra}""")
    return p


def _call(url: str, *, method: str = "GET", data: bytes | None = None, user: str | None = None, pw: str | None = None,
          token: str | None = None, headers: dict | None = None, context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    h = dict(headers or {})
    if user:
        h["Authorization"] = "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()
    if token:
        h["Authorization"] = "Bearer " + token
    req = urllib.request.Request(url, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_roles_matrix(tmp_path: Path) -> None:
    cfg = _web_config(tmp_path)
    with ServerProcess(tmp_path / "data", ["--web.config.file", str(cfg)]) as srv:
        u = srv.url
        body = b'auth_test{x="1"} 1\n'
        # Health stays open for probes; everything else needs credentials.
        assert _call(u + "/-/healthy")[0] == 200
        st, b = _call(u + "/api/v1/query?query=1")
        assert st == 401 and json.loads(b)["errorType"] == "unauthorized"
        assert _call(u + "/api/v1/query?query=1", user="alice", pw="wrong")[0] == 401
        assert _call(u + "/api/v1/query?query=1", token="not-the-token")[0] == 401
        # endpoint x role
        matrix = [
            ("/api/v1/import/prometheus", "POST", body, {"wally": 204, "rita": 403, "grafana": 403, "alice": 204}),
            ("/api/v1/query?query=auth_test", "GET", None, {"wally": 403, "rita": 200, "grafana": 200, "alice": 200}),
            ("/api/v1/labels", "GET", None, {"wally": 403, "rita": 200, "grafana": 200, "alice": 200}),
            ("/api/v1/congestion", "GET", None, {"wally": 403, "rita": 200, "grafana": 200, "alice": 200}),
            ("/api/v1/audit", "GET", None, {"wally": 403, "rita": 403, "grafana": 403, "alice": 200}),
        ]
        creds = {"wally": dict(user="wally", pw="wally-pw"), "rita": dict(user="rita", pw="rita-pw", headers={"X-Scope-OrgID": "team-a"}),
                 "grafana": dict(token=TOKEN), "alice": dict(user="alice", pw="alice-pw")}
        for path, method, data, want in matrix:
            for who, code in want.items():
                st, b = _call(u + path, method=method, data=data, **creds[who])
                ok = st == code or (code == 204 and st in (200, 204))
                assert ok, (path, who, st, b[:200])
        # Tenant restriction: rita may only act as team-a.
        st, b = _call(u + "/api/v1/labels", user="rita", pw="rita-pw", headers={"X-Scope-OrgID": "team-b"})
        assert st == 403 and b"team-b" in b


def test_non_loopback_listen_needs_auth_or_insecure(tmp_path: Path) -> None:
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "turboprom", "serve", "--data-dir", str(tmp_path / "d1"), "--listen", f"0.0.0.0:{port}"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "refusing to listen on 0.0.0.0 without authentication" in (r.stderr + r.stdout)
    # With --insecure it starts (and says so loudly); the test connects over loopback only.
    cmd_port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "turboprom", "serve", "--data-dir", str(tmp_path / "d3"), "--listen", f"0.0.0.0:{cmd_port}", "--insecure"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_http(f"http://127.0.0.1:{cmd_port}/-/ready", proc=p)
    finally:
        p.terminate()
        out = p.communicate(timeout=30)[0]
    assert "WITHOUT authentication" in out


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    c, k = tmp / "tls.crt", tmp / "tls.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return c, k


def test_tls_with_auth(tmp_path: Path) -> None:
    crt, key = _self_signed(tmp_path)
    cfg = _web_config(tmp_path, f"tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n")
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "turboprom", "serve", "--data-dir", str(tmp_path / "data"), "--listen", f"127.0.0.1:{port}",
                          "--web.config.file", str(cfg)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ctx = ssl.create_default_context(cafile=str(crt))
    try:
        import time
        deadline = time.time() + 60
        while True:
            try:
                st, _ = _call(f"https://127.0.0.1:{port}/-/ready", context=ctx)
                if st == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.time() < deadline and p.poll() is None, "TLS server did not come up"
            time.sleep(0.2)
        st, b = _call(f"https://127.0.0.1:{port}/api/v1/query?query=1%2B1", token=TOKEN, context=ctx)
        assert st == 200 and json.loads(b)["data"]["result"][1] == "2"
        # Plain HTTP to a TLS port fails.
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5)
            raise AssertionError("plain HTTP accepted on the TLS port")
        except (urllib.error.URLError, ConnectionError, http_client_errors()):
            pass
    finally:
        p.terminate()
        p.communicate(timeout=30)


def http_client_errors():
    import http.client
    return http.client.HTTPException
