"""Prometheus's HTTP client settings (its ``HTTPClientConfig``), read in one place for every
outgoing request that takes them: scrape configs (ingest/scrape), Alertmanager sets
(turboprom/alert_notifier.py).

Fields, as in Prometheus's configuration (strict: ``HTTP_CLIENT_FIELDS`` for turboprom/config.py):

    basic_auth: {username, username_file, password, password_file}
    authorization: {type (default Bearer), credentials, credentials_file}
    bearer_token / bearer_token_file         # the older spelling of authorization
    tls_config: {ca_file, cert_file, key_file, server_name, insecure_skip_verify, min_version}
    proxy_url                                # an http:// proxy
    follow_redirects (default true), enable_http2 (accepted; requests use HTTP/1.1)

At most one of basic_auth, authorization, bearer_token, bearer_token_file. Credential files are
relative to the config file's folder and are read at request time, again whenever they change
(rotated tokens and passwords apply without a reload); a missing one fails the request, not the
config load, as in Prometheus. TLS files are read at load.
"""
from __future__ import annotations

import base64
import os
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TLS_FIELDS: dict[str, Any] = {"ca_file": "str", "cert_file": "str", "key_file": "str", "server_name": "str",
                              "insecure_skip_verify": "bool", "min_version": ("=TLS10", "=TLS11", "=TLS12", "=TLS13")}
HTTP_CLIENT_FIELDS: dict[str, Any] = {
    "basic_auth": {"username": "str", "username_file": "str", "password": "str", "password_file": "str"},
    "authorization": {"type": "str", "credentials": "str", "credentials_file": "str"},
    "bearer_token": "str", "bearer_token_file": "str",
    "tls_config": TLS_FIELDS,
    "proxy_url": "str",
    "follow_redirects": "bool", "enable_http2": "bool",
}
# Fields holding a secret value (Prometheus's config.Secret): shown as "<secret>" wherever the
# configuration is shown back (GET /api/v1/status/config).
SECRET_FIELDS = frozenset({"password", "credentials", "bearer_token", "client_secret"})
_TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
                 "TLS13": ssl.TLSVersion.TLSv1_3}


def redact_secrets(tree: Any) -> Any:
    """A copy of a config tree with every secret value replaced by ``<secret>``, as Prometheus shows it."""
    if isinstance(tree, dict):
        return {k: ("<secret>" if k in SECRET_FIELDS and v not in (None, "") else redact_secrets(v)) for k, v in tree.items()}
    if isinstance(tree, list):
        return [redact_secrets(v) for v in tree]
    return tree


def config_path(p: Any, base_dir: str | None) -> str:
    """A file named in a config file: relative paths are relative to that file's folder ``base_dir``."""
    text = str(p or "")
    return str(Path(base_dir) / text) if text and base_dir and not Path(text).is_absolute() else text


class SecretFile:
    """A secret file's text, stripped, read again when its modification time or size changes."""

    def __init__(self, path: str):
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._text = ""
        self._lock = threading.Lock()

    def read(self) -> str:
        """OSError naming the file when it cannot be read (the request fails, as in Prometheus)."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
            with self._lock:
                if stamp != self._stamp:
                    self._text = Path(self.path).read_text().strip()
                    self._stamp = stamp
                return self._text
        except OSError as e:
            raise OSError(f"unable to read file {self.path}: {e.strerror or e}") from None


@dataclass
class HTTPClientConfig:
    """How to reach one set of targets: the Authorization header, TLS, proxy, redirects."""

    basic_auth: tuple[str, str, str, str] | None = None  # username, username_file, password, password_file
    authorization: tuple[str, str, str] | None = None  # type, credentials, credentials_file
    tls: dict[str, Any] = field(default_factory=dict)
    proxy_url: str | None = None
    follow_redirects: bool = True
    _files: dict[str, SecretFile] = field(default_factory=dict, repr=False, compare=False)
    _ssl: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    @classmethod
    def parse(cls, d: dict[str, Any] | None, where: str, base_dir: str | None = None) -> HTTPClientConfig:
        """From a config mapping already shape-checked against ``HTTP_CLIENT_FIELDS`` (other keys are
        ignored here); ValueError naming the field for what the shape cannot express."""
        d = d or {}

        def path(p: Any) -> str:
            return config_path(p, base_dir)

        auths = [k for k in ("basic_auth", "authorization", "bearer_token", "bearer_token_file") if d.get(k)]
        if len(auths) > 1:
            raise ValueError(f"{where}: at most one of basic_auth, authorization, bearer_token and "
                             f"bearer_token_file must be configured (found {', '.join(auths)})")
        basic = None
        if d.get("basic_auth"):
            b = d["basic_auth"]
            if b.get("username") and b.get("username_file"):
                raise ValueError(f"{where}.basic_auth: at most one of username and username_file must be configured")
            if b.get("password") and b.get("password_file"):
                raise ValueError(f"{where}.basic_auth: at most one of password and password_file must be configured")
            basic = (str(b.get("username", "") or ""), path(b.get("username_file")), str(b.get("password", "") or ""),
                     path(b.get("password_file")))
        authz = None
        if d.get("authorization"):
            a = d["authorization"]
            if a.get("credentials") and a.get("credentials_file"):
                raise ValueError(f"{where}.authorization: at most one of credentials and credentials_file must be configured")
            typ = str(a.get("type", "Bearer") or "Bearer")
            if typ.lower() == "basic":
                raise ValueError(f'{where}.authorization.type: "Basic" is not allowed, use basic_auth instead')
            authz = (typ, str(a.get("credentials", "") or ""), path(a.get("credentials_file")))
        elif d.get("bearer_token"):
            authz = ("Bearer", str(d["bearer_token"]), "")
        elif d.get("bearer_token_file"):
            authz = ("Bearer", "", path(d["bearer_token_file"]))
        tls = {k: (path(v) if k.endswith("_file") else v) for k, v in (d.get("tls_config") or {}).items()}
        if tls.get("key_file") and not tls.get("cert_file"):
            raise ValueError(f"{where}.tls_config: key_file needs cert_file")
        if tls.get("cert_file") and not tls.get("key_file"):
            raise ValueError(f"{where}.tls_config: cert_file needs key_file")
        proxy = str(d["proxy_url"]) if d.get("proxy_url") else None
        if proxy is not None and not proxy.startswith("http://"):
            raise ValueError(f"{where}.proxy_url: {proxy!r}: only http:// proxies are supported")
        cfg = cls(basic, authz, tls, proxy, bool(d.get("follow_redirects", True)))
        try:
            cfg.ssl_context()  # unreadable certificates refuse the config now, not at the first request
        except ValueError as e:
            raise ValueError(f"{where}.{e}") from None
        return cfg

    def _file(self, p: str) -> str:
        f = self._files.get(p)
        if f is None:
            f = self._files[p] = SecretFile(p)
        return f.read()

    def reads_files(self) -> bool:
        """Whether the Authorization header comes from files (so it may change between requests)."""
        if self.authorization is not None:
            return bool(self.authorization[2])
        return self.basic_auth is not None and bool(self.basic_auth[1] or self.basic_auth[3])

    def authorization_header(self) -> str | None:
        """The ``Authorization`` value (files read again when they changed), or None."""
        if self.authorization is not None:
            typ, cred, cred_file = self.authorization
            return f"{typ} {self._file(cred_file) if cred_file else cred}"
        if self.basic_auth is not None:
            user, user_file, password, pw_file = self.basic_auth
            user = self._file(user_file) if user_file else user
            password = self._file(pw_file) if pw_file else password
            return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        return None

    def ssl_context(self) -> ssl.SSLContext | None:
        """None: the client's default verification (system CAs); built once."""
        if not self.tls:
            return None
        if self._ssl is None:
            try:
                c = ssl.create_default_context(cafile=self.tls.get("ca_file") or None)
                if self.tls.get("cert_file"):
                    c.load_cert_chain(self.tls["cert_file"], self.tls.get("key_file") or None)
            except (OSError, ssl.SSLError) as e:
                raise ValueError(f"tls_config: {e}") from None
            if self.tls.get("insecure_skip_verify"):
                c.check_hostname = False
                c.verify_mode = ssl.CERT_NONE
            if self.tls.get("min_version"):
                c.minimum_version = _TLS_VERSIONS[self.tls["min_version"]]
            self._ssl = c
        return self._ssl

    def server_hostname(self) -> str | None:
        """``tls_config.server_name``: the name the certificate is checked against (SNI), if set."""
        return self.tls.get("server_name") or None
