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
SHA-256 digest: later requests with the same credential cost one hash and one dict lookup. Checks of
credentials not yet verified run on dedicated threads, scheduled so that a flood of wrong ones does
not delay a valid one (``Authenticator``; limits under ``auth:`` in the server YAML, ``AuthLimits``).
"""
from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import heapq
import ipaddress
import logging
import os
import ssl
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import bcrypt
import yaml
from aiohttp import web

from scheduler_metrics.kedgeflow.policy import Principal
from storage.labels import DEFAULT_TENANT
from turboprom.api_errors import error_response

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


FAILING_SCORE = 3.0  # decayed failures at which a source's checks stop going ahead of others


class AuthOverloaded(Exception):
    """Too many unverified credentials are waiting for bcrypt: answered 429 + Retry-After."""


@dataclass
class AuthLimits:
    """``auth:`` in the server YAML (all optional)."""

    workers: int = 0  # threads running bcrypt for not-yet-verified credentials; 0 = half the CPUs (1 to 4)
    max_pending: int = 256  # unverified credentials waiting; beyond it the lowest-priority one gets 429
    max_pending_per_source: int = 64  # per (client address, claimed user): new checks beyond it get 429
    max_wait_s: float = 5.0  # a check not started within this long gets 429 (it would only get later)
    cache_ttl_s: float = 600.0  # a verified credential is trusted this long without bcrypt
    cache_size: int = 10_000
    failed_ttl_s: float = 10.0  # a wrong credential is answered 401 from memory this long
    failure_half_life_s: float = 30.0  # how fast a source's failure score decays

    @classmethod
    def from_config(cls, raw: dict[str, Any] | None) -> "AuthLimits":
        raw = raw if isinstance(raw, dict) else {}
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"auth: unknown key(s) {sorted(unknown)} (known: {', '.join(cls.__dataclass_fields__)})")
        for k, v in raw.items():
            want = type(getattr(cls, k))
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (want is int and not float(v).is_integer()):
                raise ValueError(f"auth.{k}: expected {'an integer' if want is int else 'a number'}, got {v!r}")
        out = cls(**{k: type(getattr(cls, k))(v) for k, v in raw.items()})
        if out.workers <= 0:
            out.workers = max(1, min(4, (os.cpu_count() or 2) // 2))  # leave CPU for everything else
        return out


class _TTLCache:
    """Bounded LRU of digest -> (value, expiry). Not thread-safe: callers hold the authenticator's lock."""

    def __init__(self, size: int, ttl_s: float):
        self.size, self.ttl_s = size, ttl_s
        self._d: OrderedDict[bytes, tuple[Any, float]] = OrderedDict()

    def get(self, key: bytes, now: float) -> Any:
        hit = self._d.get(key)
        if hit is None:
            return None
        if hit[1] <= now:
            del self._d[key]
            return None
        self._d.move_to_end(key)
        return hit[0]

    def put(self, key: bytes, value: Any, now: float) -> None:
        self._d[key] = (value, now + self.ttl_s)
        self._d.move_to_end(key)
        while len(self._d) > self.size:
            self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)


class _Check:
    """One credential waiting for (or in) bcrypt: each candidate hash is one step, so a long check
    (a wrong bearer token is compared with every configured hash) yields to fresher ones between steps."""

    __slots__ = ("key", "kind", "credential", "source", "seq", "candidates", "step", "running", "future", "done", "t0")

    def __init__(self, key: bytes, kind: str, credential: bytes, source: tuple[str, str], seq: int,
                 candidates: list[tuple[str, bytes, bytes]]):
        self.key, self.kind, self.credential, self.source, self.seq = key, kind, credential, source, seq
        self.candidates = candidates  # (user, secret to check, bcrypt hash)
        self.step = 0  # next candidate to compare
        self.running = 0  # comparisons in progress (several workers may share one check's candidates)
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.done = False
        self.t0 = time.monotonic()


class Authenticator:
    """Credentials -> user, with bcrypt off the event loop and valid credentials kept from waiting
    behind failing ones:

    - a verified credential is cached by SHA-256 (bounded LRU, ``cache_ttl_s``); a wrong one is
      remembered for ``failed_ttl_s``: repeats of either cost one hash and a dict lookup;
    - concurrent requests with the same unverified credential share one bcrypt check;
    - unverified credentials run on ``workers`` dedicated threads, one bcrypt comparison at a time,
      picked by priority: sources (client address + claimed user, or "bearer") without recent
      failures first, then newest first (so a flood of wrong guesses does not form a queue
      in front of a new, valid credential); a basic-auth user that does not exist costs no bcrypt;
    - waiting checks are bounded (``max_pending``, ``max_pending_per_source``, ``max_wait_s``): a new
      check from a source with too many waiting, the worst-ranked one when too many wait in all, and
      one that waited too long without starting are answered 429 + Retry-After.
    """

    def __init__(self, cfg: WebConfig, limits: dict[str, Any] | AuthLimits | None = None):
        self.cfg = cfg
        self.limits = limits if isinstance(limits, AuthLimits) else AuthLimits.from_config(limits)
        lim = self.limits
        self._ok = _TTLCache(lim.cache_size, lim.cache_ttl_s)  # sha256(credential) -> user
        self._failed = _TTLCache(lim.cache_size, lim.failed_ttl_s)  # sha256(credential) -> True
        self._scores: OrderedDict[tuple[str, str], tuple[float, float]] = OrderedDict()  # source -> (score, when)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pending: dict[bytes, _Check] = {}  # key -> check not finished yet (single flight)
        self._heap: list[tuple[int, int, int, _Check]] = []
        self._arrivals: deque[_Check] = deque()  # waiting checks in arrival order (for the wait limit)
        self._per_source: dict[tuple[str, str], int] = {}  # source -> checks pending
        self._seq = 0
        self._stopped = False
        self.stats = {"bcrypt_checks": 0, "shed": 0, "coalesced": 0}
        self._threads = [threading.Thread(target=self._worker, name=f"auth-bcrypt-{i}", daemon=True)
                         for i in range(lim.workers)]
        for t in self._threads:
            t.start()

    # -- credentials ------------------------------------------------------------------------------

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

    @staticmethod
    def _source(request: web.Request, kind: str, credential: bytes) -> tuple[str, str]:
        claim = "bearer" if kind == "bearer" else "basic:" + credential.partition(b":")[0].decode(errors="replace")[:128]
        return (request.remote or "?", claim)

    def cached(self, request: web.Request) -> tuple[bool, str | None]:
        """(known, user) from the caches alone: cheap enough for the event loop."""
        cred = self._credential(request)
        if cred is None:
            return True, None
        key = self._key(*cred)
        now = time.monotonic()
        with self._lock:
            user = self._ok.get(key, now)
            if user is not None:
                return True, user
            if self._failed.get(key, now):
                return True, None
        return False, None

    # -- scheduling -------------------------------------------------------------------------------

    def _score(self, source: tuple[str, str], now: float) -> float:
        hit = self._scores.get(source)
        if hit is None:
            return 0.0
        score, when = hit
        return score * 0.5 ** ((now - when) / self.limits.failure_half_life_s)

    def _note_failure(self, source: tuple[str, str], now: float) -> None:
        self._scores[source] = (self._score(source, now) + 1.0, now)
        self._scores.move_to_end(source)
        while len(self._scores) > self.limits.cache_size:
            self._scores.popitem(last=False)

    @staticmethod
    def _band(score: float) -> int:
        """0 for a source with (almost) no recent failures, 1 for a failing one. Only two bands: a
        valid credential that shares a failing source must not also wait behind other failing
        sources; among failing sources the newest check goes first."""
        return 0 if score < FAILING_SCORE else 1

    def _push(self, check: _Check, now: float) -> None:
        heapq.heappush(self._heap, (self._band(self._score(check.source, now)), -check.seq, check.step, check))
        self._cond.notify()

    def _finish(self, check: _Check, user: str | None, exc: BaseException | None = None) -> None:
        """Under the lock."""
        if check.done:
            return
        check.done = True
        if self._pending.get(check.key) is check:
            del self._pending[check.key]
            n = self._per_source.get(check.source, 1) - 1
            if n > 0:
                self._per_source[check.source] = n
            else:
                self._per_source.pop(check.source, None)
        now = time.monotonic()
        if exc is None:
            if user is not None:
                self._ok.put(check.key, user, now)
            else:
                self._failed.put(check.key, True, now)
                self._note_failure(check.source, now)
        if not check.future.done():
            if exc is not None:
                check.future.set_exception(exc)
            else:
                check.future.set_result(user)
        if len(self._heap) > 4 * len(self._pending) + 64:  # drop the entries of finished checks
            self._heap = [(self._band(self._score(c.source, now)), -c.seq, c.step, c) for c in self._pending.values()
                          if c.step < len(c.candidates)]
            heapq.heapify(self._heap)

    def _expire(self, now: float) -> None:
        """Under the lock: checks that waited ``max_wait_s`` without starting get 429 now rather than
        hold their requests open (under a flood, newer checks keep going first)."""
        q = self._arrivals
        while q and (q[0].done or q[0].step > 0 or now - q[0].t0 > self.limits.max_wait_s):
            c = q.popleft()
            if not c.done and c.step == 0:
                self.stats["shed"] += 1
                self._finish(c, None, AuthOverloaded(f"credential check waited over {self.limits.max_wait_s:g}s"))

    def _refused(self, source: tuple[str, str], now: float, why: str) -> concurrent.futures.Future:
        """Under the lock: a check not admitted. A source being refused is flooding: that counts
        against it like a failure (its later checks stop going ahead of clean sources')."""
        self.stats["shed"] += 1
        self._note_failure(source, now)
        f: concurrent.futures.Future = concurrent.futures.Future()
        f.set_exception(AuthOverloaded(why))
        return f

    def _submit(self, request: web.Request, kind: str, credential: bytes) -> concurrent.futures.Future:
        key = self._key(kind, credential)
        source = self._source(request, kind, credential)
        if kind == "basic":
            name, _, pw = credential.partition(b":")
            h = self.cfg.basic_users.get(name.decode(errors="replace"))
            candidates = [] if h is None else [(name.decode(errors="replace"), pw, h)]
        else:
            candidates = [(u, credential, h) for u, h in self.cfg.bearer]
        now = time.monotonic()
        lim = self.limits
        with self._lock:
            running = self._pending.get(key)
            if running is not None:
                self.stats["coalesced"] += 1
                return running.future
            self._seq += 1
            check = _Check(key, kind, credential, source, self._seq, candidates)
            if not candidates:  # e.g. a basic-auth user that does not exist: no bcrypt to run
                self._finish(check, None)
                return check.future
            self._expire(now)
            # Bounds: a source with too many checks waiting gets 429 for new ones (which keeps a
            # flood from churning the queue); when all waiting checks are too many, the worst-ranked
            # of them (failing source, then oldest) or the new one gets 429.
            if self._per_source.get(source, 0) >= lim.max_pending_per_source:
                return self._refused(source, now, f"too many credential checks waiting for {source[1]} from {source[0]}")
            if len(self._pending) >= lim.max_pending:
                def rank(c: _Check) -> tuple[int, int]:
                    return self._band(self._score(c.source, now)), -c.seq
                worst = max(self._pending.values(), key=rank)
                if rank(worst) < rank(check):
                    return self._refused(source, now, "too many credential checks waiting")
                self.stats["shed"] += 1
                self._finish(worst, None, AuthOverloaded("too many credential checks waiting"))
            self._pending[key] = check
            self._per_source[source] = self._per_source.get(source, 0) + 1
            self._arrivals.append(check)
            self._push(check, now)
            return check.future

    def _worker(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                band, _, _, check = heapq.heappop(self._heap)
                if check.done:
                    continue
                now = time.monotonic()
                if self._band(self._score(check.source, now)) > band:
                    self._push(check, now)  # its source has been failing since it was queued: re-rank
                    continue
                user, secret, h = check.candidates[check.step]
                check.step += 1
                check.running += 1
                if check.step < len(check.candidates):
                    self._push(check, time.monotonic())  # another worker may take the next candidate now
            try:
                ok = bcrypt.checkpw(secret, h)
            except ValueError:  # e.g. bcrypt refuses secrets over 72 bytes: simply not a match
                ok = False
            with self._cond:
                self.stats["bcrypt_checks"] += 1
                check.running -= 1
                self._expire(time.monotonic())
                if check.done:
                    continue
                if ok:
                    self._finish(check, user)
                elif check.step >= len(check.candidates) and check.running == 0:
                    self._finish(check, None)

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    # -- identification ---------------------------------------------------------------------------

    def identify(self, request: web.Request, timeout: float | None = 60.0) -> str | None:
        """Blocking (waits for bcrypt): call from a worker thread, or use ``identify_async``."""
        known, user = self.cached(request)
        if known:
            return user
        cred = self._credential(request)
        return self._submit(request, *cred).result(timeout) if cred is not None else None

    async def identify_async(self, request: web.Request) -> str | None:
        """Raises ``AuthOverloaded`` when the check was shed. bcrypt runs on the authenticator's own
        threads, never on the event loop."""
        known, user = self.cached(request)
        if known:
            return user
        cred = self._credential(request)
        if cred is None:
            return None
        return await asyncio.wrap_future(self._submit(request, *cred))

    def principal_for(self, user: str) -> Principal:
        return Principal(user, frozenset(self.cfg.roles.get(user, {"read"})))

    def principal(self, request: web.Request) -> Principal:
        """The middleware's principal; elsewhere (open paths) only a cached credential counts, so this
        never runs bcrypt on the event loop."""
        p = request.get("principal")
        if p is None:
            _, user = self.cached(request)
            p = self.principal_for(user) if user else Principal("anonymous", frozenset())
        return p

    def tenant_allowed(self, user: str, tenant: str) -> bool:
        allowed = self.cfg.tenants.get(user)
        return allowed is None or tenant in allowed


def auth_middleware(auth: Authenticator) -> Callable:
    @web.middleware
    async def mw(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        role = required_role(request.method, request.path)
        if role is None:
            return await handler(request)
        try:
            user = await auth.identify_async(request)
        except AuthOverloaded as e:
            return error_response("unavailable", f"{e}; retry later", 429, {"Retry-After": "1"})
        if user is None:
            return error_response("unauthorized", "authentication required: send HTTP basic auth or a bearer token",
                                  401, {"WWW-Authenticate": 'Basic realm="turboprom"'})
        principal = auth.principal_for(user)
        if role not in principal.roles and "admin" not in principal.roles:
            return error_response("forbidden", f"user {user!r} lacks the {role!r} role needed for {request.path}", 403)
        # No header means the default tenant, which a tenant-restricted user may not read either.
        tenant = request.headers.get("X-Scope-OrgID") or DEFAULT_TENANT
        if not auth.tenant_allowed(user, tenant):
            return error_response("forbidden", f"user {user!r} may not act as tenant {tenant!r}"
                                  + (" (send X-Scope-OrgID)" if "X-Scope-OrgID" not in request.headers else ""), 403)
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
