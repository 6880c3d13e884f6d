"""Authentication and authorization (Prometheus web-config style), and the listen-address guard.

Web config file (``turboprom serve --web.config.file FILE``), a superset of Prometheus's:

    tls_server_config:            # TLS from cert files
      cert_file: server.crt
      key_file: server.key
    basic_auth_users:             # user -> bcrypt hash (as Prometheus's web config)
      alice: $2b$12$...
    bearer_tokens:                # bcrypt hashes of bearer tokens, each naming its user
      - user: grafana
        hash: $2b$12$...
    roles:                        # user -> roles: read, write, admin, scheduler (default: read)
      alice: [read, write, admin]
    tenants:                      # user -> X-Scope-OrgID values the user may act as (default: any)
      grafana: [team-a]

bcrypt is deliberately slow (~0.1-0.3 s per check), so a verified credential is remembered by its
SHA-256 digest: later requests with the same credential cost one hash and one dict lookup.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import logging
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import bcrypt
import orjson
import yaml
from aiohttp import web

from scheduler_metrics.kedgeflow.policy import Principal

log = logging.getLogger("turboprom.auth")

ROLES = ("read", "write", "admin", "scheduler")
OPEN_PATHS = ("/-/healthy", "/-/ready")


def required_role(method: str, path: str) -> str | None:
    """Which role a request needs (None: open)."""
    if path in OPEN_PATHS:
        return None
    if path in ("/api/v1/write",) or path.startswith("/api/v1/import/") or path.startswith("/api/v1/otlp/"):
        return "write"
    if path in ("/api/v1/kedgeflow/propose", "/api/v1/kedgeflow/execute"):
        return "read"  # any authenticated caller may ask; the KedgeFlow policy decides by role
    if path.startswith("/api/v1/admin/") or path.startswith("/api/v1/kedgeflow/") or path.startswith("/api/v1/audit") \
            or path.startswith("/-/reload") or path.startswith("/-/quit"):
        return "admin"
    return "read"


@dataclass
class WebConfig:
    cert_file: str | None = None
    key_file: str | None = None
    basic_users: dict[str, bytes] = field(default_factory=dict)
    bearer: list[tuple[str, bytes]] = field(default_factory=list)  # (user, bcrypt hash)
    roles: dict[str, set[str]] = field(default_factory=dict)
    tenants: dict[str, set[str]] = field(default_factory=dict)

    @property
    def auth_enabled(self) -> bool:
        return bool(self.basic_users or self.bearer)

    @property
    def tls_enabled(self) -> bool:
        return bool(self.cert_file and self.key_file)

    @classmethod
    def load(cls, path: str | Path) -> "WebConfig":
        p = Path(path)
        raw = yaml.safe_load(p.read_text()) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"web config {p}: top level must be a mapping")
        known = {"tls_server_config", "basic_auth_users", "bearer_tokens", "roles", "tenants", "http_server_config"}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"web config {p}: unknown key(s) {sorted(unknown)}")
        cfg = cls()
        tls = raw.get("tls_server_config") or {}
        base = p.parent

        def rel(f: str | None) -> str | None:
            return None if not f else str(f if Path(f).is_absolute() else base / f)

        cfg.cert_file, cfg.key_file = rel(tls.get("cert_file")), rel(tls.get("key_file"))
        if bool(cfg.cert_file) != bool(cfg.key_file):
            raise ValueError(f"web config {p}: tls_server_config needs both cert_file and key_file")
        for user, h in (raw.get("basic_auth_users") or {}).items():
            cfg.basic_users[str(user)] = _check_hash(str(h), f"basic_auth_users.{user}")
        for i, t in enumerate(raw.get("bearer_tokens") or []):
            if not isinstance(t, dict) or "user" not in t or "hash" not in t:
                raise ValueError(f"web config {p}: bearer_tokens[{i}] needs 'user' and 'hash'")
            cfg.bearer.append((str(t["user"]), _check_hash(str(t["hash"]), f"bearer_tokens[{i}]")))
        for user, rs in (raw.get("roles") or {}).items():
            bad = set(rs) - set(ROLES)
            if bad:
                raise ValueError(f"web config {p}: roles.{user}: unknown role(s) {sorted(bad)} (known: {', '.join(ROLES)})")
            cfg.roles[str(user)] = set(rs)
        for user, ts in (raw.get("tenants") or {}).items():
            cfg.tenants[str(user)] = {str(t) for t in ts}
        return cfg

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls_enabled:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_file, self.key_file)  # type: ignore[arg-type]
        return ctx


def _check_hash(h: str, where: str) -> bytes:
    if not h.startswith(("$2a$", "$2b$", "$2y$")):
        raise ValueError(f"web config: {where} must be a bcrypt hash (e.g. from `htpasswd -nBC 10 user`)")
    return h.replace("$2y$", "$2b$", 1).encode()


FAILED_TTL_S = 10.0  # a wrong credential is remembered briefly, so retries do not cost bcrypt each time
MAX_BCRYPT_AT_ONCE = 4  # bcrypt checks run in threads, at most this many at a time


class Authenticator:
    def __init__(self, cfg: WebConfig):
        self.cfg = cfg
        self._cache: dict[bytes, str] = {}  # sha256(credential) -> user
        self._failed: dict[bytes, float] = {}  # sha256(credential) -> when it failed
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_BCRYPT_AT_ONCE)

    @staticmethod
    def _credential(request: web.Request) -> tuple[str, bytes] | None:
        h = request.headers.get("Authorization", "")
        scheme, _, value = h.partition(" ")
        if scheme.lower() == "basic" and value:
            try:
                return "basic", base64.b64decode(value.strip(), validate=True)
            except ValueError:
                return None
        if scheme.lower() == "bearer" and value:
            return "bearer", value.strip().encode()
        return None

    @staticmethod
    def _key(kind: str, credential: bytes) -> bytes:
        return hashlib.sha256(kind.encode() + b"\0" + credential).digest()

    def cached(self, request: web.Request) -> tuple[bool, str | None]:
        """(known, user) from the caches alone: cheap enough for the event loop."""
        cred = self._credential(request)
        if cred is None:
            return True, None
        key = self._key(*cred)
        with self._lock:
            user = self._cache.get(key)
            if user is not None:
                return True, user
            t = self._failed.get(key)
            if t is not None and time.monotonic() - t < FAILED_TTL_S:
                return True, None
        return False, None

    def _verify(self, kind: str, credential: bytes) -> str | None:
        key = self._key(kind, credential)
        user = None
        with self._slots:
            try:
                if kind == "basic":
                    name, _, pw = credential.partition(b":")
                    h = self.cfg.basic_users.get(name.decode(errors="replace"))
                    if h is not None and bcrypt.checkpw(pw, h):
                        user = name.decode()
                else:
                    for u, h in self.cfg.bearer:
                        if bcrypt.checkpw(credential, h):
                            user = u
                            break
            except ValueError:  # e.g. bcrypt refuses secrets over 72 bytes: simply not a match
                user = None
        with self._lock:
            if user is not None:
                if len(self._cache) > 10_000:
                    self._cache.clear()
                self._cache[key] = user
            else:
                if len(self._failed) > 10_000:
                    self._failed.clear()
                self._failed[key] = time.monotonic()
        return user

    def identify(self, request: web.Request) -> str | None:
        """Blocking (may run bcrypt): call from a worker thread, or use ``identify_async``."""
        known, user = self.cached(request)
        if known:
            return user
        cred = self._credential(request)
        return self._verify(*cred) if cred is not None else None

    async def identify_async(self, request: web.Request) -> str | None:
        known, user = self.cached(request)
        if known:
            return user
        return await asyncio.get_running_loop().run_in_executor(None, self.identify, request)

    def principal_for(self, user: str) -> Principal:
        return Principal(user, frozenset(self.cfg.roles.get(user, {"read"})))

    def principal(self, request: web.Request) -> Principal:
        p = request.get("principal")
        if p is None:
            user = self.identify(request)
            p = self.principal_for(user) if user else Principal("anonymous", frozenset())
        return p

    def tenant_allowed(self, user: str, tenant: str) -> bool:
        allowed = self.cfg.tenants.get(user)
        return allowed is None or tenant in allowed


def _error(status: int, etype: str, msg: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps({"status": "error", "errorType": etype, "error": msg}),
                        content_type="application/json", headers=headers)


def auth_middleware(auth: Authenticator) -> Callable:
    @web.middleware
    async def mw(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        role = required_role(request.method, request.path)
        if role is None:
            return await handler(request)
        user = await auth.identify_async(request)
        if user is None:
            return _error(401, "unauthorized", "authentication required: send HTTP basic auth or a bearer token",
                          {"WWW-Authenticate": 'Basic realm="turboprom"'})
        principal = auth.principal_for(user)
        if role not in principal.roles and "admin" not in principal.roles:
            return _error(403, "forbidden", f"user {user!r} lacks the {role!r} role needed for {request.path}")
        # No header means the default tenant, which a tenant-restricted user may not read either.
        tenant = request.headers.get("X-Scope-OrgID") or "default"
        if not auth.tenant_allowed(user, tenant):
            return _error(403, "forbidden", f"user {user!r} may not act as tenant {tenant!r}"
                          + (" (send X-Scope-OrgID)" if "X-Scope-OrgID" not in request.headers else ""))
        request["principal"] = principal
        return await handler(request)

    return mw


def is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen_guard(host: str, cfg: WebConfig | None, insecure: bool) -> None:
    """Listening beyond loopback requires auth, unless --insecure (logged loudly)."""
    if is_loopback(host) or (cfg is not None and cfg.auth_enabled):
        return
    if insecure:
        log.warning("!!! listening on %s WITHOUT authentication (--insecure): anyone who can reach this port can "
                    "read, write and delete data !!!", host)
        return
    raise SystemExit(f"refusing to listen on {host} without authentication: configure --web.config.file with "
                     f"basic_auth_users or bearer_tokens, or pass --insecure to accept the risk")


def describe(cfg: WebConfig) -> dict[str, Any]:
    return {"tls": cfg.tls_enabled, "basic_users": sorted(cfg.basic_users), "bearer_tokens": len(cfg.bearer)}
