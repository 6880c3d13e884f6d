"""How the cluster's roles reach NATS and etcd when those run with authentication and TLS
(``--cluster.backends-config FILE``, docs/cluster.md); the etcd part also for the KedgeFlow
ledger on etcd (``kedgeflow.ledger.etcd`` in the server YAML).

One YAML file, checked as strictly as the server config (unknown fields and wrong types refuse to
start, naming file:line)::

    nats:
      user: turboprom                 # with password or password_file
      password_file: nats.pass
      token_file: nats.token          # or a token (instead of user/password)
      nkey_seed_file: turboprom.nk    # or an NKey user seed (needs the nkeys package)
      tls_config: {ca_file, cert_file, key_file, server_name, insecure_skip_verify, min_version}
    etcd:
      username: turboprom             # etcd's own users (``etcdctl auth enable``)
      password_file: etcd.pass
      tls_config: {...}               # https:// endpoints; cert_file/key_file for --client-cert-auth

Files are relative to the YAML's folder. Secrets in files are read when they are used: NATS reads
them at every (re)connect and etcd at every authentication (a new token once etcd no longer knows
the old one), so rotated passwords apply without a restart. The TLS settings are Prometheus's
``tls_config``, read by the same code as scrape targets' (ingest/http_client_config.py).
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any

from ingest.http_client_config import TLS_FIELDS, HTTPClientConfig, SecretFile, config_path

NATS_FIELDS: dict[str, Any] = {"user": "str", "password": "str", "password_file": "str", "token": "str",
                               "token_file": "str", "nkey_seed_file": "str", "tls_config": TLS_FIELDS}
ETCD_FIELDS: dict[str, Any] = {"username": "str", "password": "str", "password_file": "str", "tls_config": TLS_FIELDS}
BACKENDS_FIELDS: dict[str, Any] = {"nats": NATS_FIELDS, "etcd": ETCD_FIELDS}


def _secret(d: dict[str, Any], name: str, where: str, base_dir: str | None) -> str | SecretFile | None:
    """``name`` or ``name_file`` (at most one): the value, a file read when used, or None."""
    if d.get(name) and d.get(f"{name}_file"):
        raise ValueError(f"{where}: at most one of {name} and {name}_file must be configured")
    if d.get(f"{name}_file"):
        return SecretFile(config_path(d[f"{name}_file"], base_dir))
    return str(d[name]) if d.get(name) else None


def _value(s: str | SecretFile | None) -> str:
    return s.read() if isinstance(s, SecretFile) else (s or "")


def _tls(d: dict[str, Any], where: str, base_dir: str | None) -> HTTPClientConfig | None:
    if not d.get("tls_config"):
        return None
    return HTTPClientConfig.parse({"tls_config": d["tls_config"]}, where, base_dir)


@dataclass
class NatsClientConfig:
    user: str = ""
    password: str | SecretFile | None = None
    token: str | SecretFile | None = None
    nkey_seed_file: str = ""
    tls: HTTPClientConfig | None = None

    @classmethod
    def parse(cls, d: dict[str, Any], base_dir: str | None) -> NatsClientConfig:
        password = _secret(d, "password", "nats", base_dir)
        token = _secret(d, "token", "nats", base_dir)
        ways = [w for w, on in (("user/password", d.get("user") or password), ("token", token),
                                ("nkey_seed_file", d.get("nkey_seed_file"))) if on]
        if len(ways) > 1:
            raise ValueError(f"nats: at most one of user/password, token and nkey_seed_file must be configured (found {', '.join(ways)})")
        if password is not None and not d.get("user"):
            raise ValueError("nats: password needs user")
        seed = config_path(d.get("nkey_seed_file"), base_dir)
        if seed:
            try:
                import nkeys  # noqa: F401 - nats-py signs the server's nonce with it
            except ImportError:
                raise ValueError("nats.nkey_seed_file: the nkeys package is not installed (pip install nkeys)") from None
        return cls(str(d.get("user") or ""), password, token, seed, _tls(d, "nats", base_dir))

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments of ``nats.connect``: secrets as callbacks, so every reconnect reads them again."""
        o: dict[str, Any] = {}
        if self.user:
            o["user"] = self.user
            password = self.password
            o["password"] = lambda: _value(password)
        if self.token is not None:
            token = self.token
            o["token"] = lambda: _value(token)
        if self.nkey_seed_file:
            o["nkeys_seed"] = self.nkey_seed_file
        if self.tls is not None:
            o["tls"] = self.tls.ssl_context()
            if self.tls.server_hostname():
                o["tls_hostname"] = self.tls.server_hostname()
        return o


@dataclass
class EtcdClientConfig:
    username: str = ""
    password: str | SecretFile | None = None
    tls: HTTPClientConfig | None = None

    @classmethod
    def parse(cls, d: dict[str, Any], base_dir: str | None, where: str = "etcd") -> EtcdClientConfig:
        """From ``username``, ``password``/``password_file`` and ``tls_config`` of ``d`` (other keys,
        e.g. the KedgeFlow ledger's ``endpoints``, are left to their owner)."""
        password = _secret(d, "password", where, base_dir)
        if password is not None and not d.get("username"):
            raise ValueError(f"{where}: password needs username")
        if d.get("username") and password is None:
            raise ValueError(f"{where}: username needs password or password_file")
        return cls(str(d.get("username") or ""), password, _tls(d, where, base_dir))

    def password_text(self) -> str:
        return _value(self.password)

    def ssl_context(self) -> ssl.SSLContext | None:
        return self.tls.ssl_context() if self.tls is not None else None

    def server_hostname(self) -> str | None:
        return self.tls.server_hostname() if self.tls is not None else None


@dataclass
class BackendClients:
    nats: NatsClientConfig = field(default_factory=NatsClientConfig)
    etcd: EtcdClientConfig = field(default_factory=EtcdClientConfig)

    @classmethod
    def parse(cls, d: dict[str, Any], base_dir: str | None) -> BackendClients:
        """From a mapping already shape-checked against ``BACKENDS_FIELDS``; ValueError naming the field."""
        return cls(NatsClientConfig.parse(d.get("nats") or {}, base_dir),
                   EtcdClientConfig.parse(d.get("etcd") or {}, base_dir))


def ledger_etcd_client(kedgeflow: dict[str, Any] | None, config_dir: str | None) -> EtcdClientConfig | None:
    """The etcd user and TLS of ``kedgeflow.ledger.etcd`` (the cluster's etcd client settings:
    username, password / password_file, tls_config), or None for a ledger not on etcd."""
    led = (kedgeflow or {}).get("ledger")
    if not isinstance(led, dict) or not isinstance(led.get("etcd"), dict):
        return None
    return EtcdClientConfig.parse(led["etcd"], config_dir, "kedgeflow.ledger.etcd")
