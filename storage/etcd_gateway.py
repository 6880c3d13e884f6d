"""etcd's v3 KV API through its JSON gateway (grpc-gateway) over aiohttp: the store the cluster's
membership (turboprom/cluster/membership.py) and the KedgeFlow ledger on etcd
(scheduler_metrics/kedgeflow/ledger_etcd.py) keep their state in.

The maintained Python etcd clients either fail with current protobuf (``etcd3``) or pull in a gRPC
stack; the JSON gateway is part of every etcd >= 3.3 and speaks the same linearizable KV API. Calls
rotate over the endpoints, so one dead member is skipped.

With etcd's authentication on, the configured user authenticates once (``/v3/auth/authenticate``)
and sends the token with every call; a token etcd no longer knows (``invalid auth token``: expired,
or authentication switched off and on) is replaced by authenticating again. ``https://`` endpoints
use the configured TLS context. The credentials are any object with ``username``,
``password_text()``, ``ssl_context()`` and ``server_hostname()``
(turboprom/cluster/backend_clients.py ``EtcdClientConfig`` reads them from the operator's YAML).
"""
from __future__ import annotations

import asyncio
import base64
import json
import ssl
from typing import Any, Protocol, Sequence

import aiohttp


class EtcdCredentials(Protocol):
    username: str

    def password_text(self) -> str: ...

    def ssl_context(self) -> ssl.SSLContext | None: ...

    def server_hostname(self) -> str | None: ...


class EtcdUnavailable(Exception):
    pass


class EtcdAuthFailed(EtcdUnavailable):
    """etcd refused the configured user name or password (retrying does not help)."""


def _b64(b: bytes | str) -> str:
    return base64.b64encode(b.encode() if isinstance(b, str) else b).decode()


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _token_invalid(status: int, data: Any) -> bool:
    """An answer saying the auth token is missing, expired or unknown (simple tokens live in one
    member's memory and expire): authenticate again."""
    text = str(data.get("error") or data.get("message") or "") if isinstance(data, dict) else ""
    return status == 401 or "invalid auth token" in text or "user name is empty" in text


class EtcdGateway:
    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = 2.0, client: EtcdCredentials | None = None,
                 attempts: int | None = None):
        """``attempts``: calls tried before giving up, rotating over the endpoints (default two rounds)."""
        if not endpoints:
            raise ValueError("etcd needs at least one endpoint URL (e.g. http://127.0.0.1:2379)")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.client = client
        self.attempts = attempts if attempts is not None else 2 * len(self.endpoints)
        self._session: aiohttp.ClientSession | None = None
        self._next = 0
        self._token: str | None = None
        self._auth_lock = asyncio.Lock()

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            ctx = self.client.ssl_context() if self.client is not None else None
            connector = aiohttp.TCPConnector(ssl=ctx) if ctx is not None else None
            self._session = aiohttp.ClientSession(timeout=self.timeout, connector=connector)
        return self._session

    async def _post(self, ep: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
        hostname = self.client.server_hostname() if self.client is not None else None
        kw: dict[str, Any] = {"server_hostname": hostname} if hostname else {}
        async with self._open().post(ep + path, json=body, headers=headers, **kw) as r:
            text = await r.text()
            try:
                return r.status, json.loads(text)
            except ValueError:  # the gateway's own refusals are plain text
                return r.status, {"error": text.strip()}

    async def _authenticate(self, ep: str, stale: str | None) -> str:
        """A token for the configured user (one authentication at a time; ``stale``: the token that was
        refused, so a caller that raced another's refresh reuses the new one)."""
        async with self._auth_lock:
            if self._token is not None and self._token != stale:
                return self._token
            assert self.client is not None
            try:
                password = self.client.password_text()
            except OSError as e:
                raise EtcdAuthFailed(f"etcd password: {e}") from None
            status, data = await self._post(ep, "/v3/auth/authenticate",
                                            {"name": self.client.username, "password": password}, {})
            if status != 200 or not isinstance(data, dict) or not data.get("token"):
                msg = data.get("error") or data.get("message") if isinstance(data, dict) else data
                if status in (400, 401) or "authentication failed" in str(msg):
                    raise EtcdAuthFailed(f"etcd at {ep} refused user {self.client.username!r}: {msg}")
                raise EtcdUnavailable(f"etcd {ep}/v3/auth/authenticate answered {status}: {msg}")
            self._token = str(data["token"])
            return self._token

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        last: Exception | None = None
        auth = self.client is not None and bool(self.client.username)
        for i in range(self.attempts):
            ep = self.endpoints[(self._next + i) % len(self.endpoints)]
            try:
                headers: dict[str, str] = {}
                if auth:
                    headers["Authorization"] = self._token or await self._authenticate(ep, None)
                status, data = await self._post(ep, path, body, headers)
                if auth and _token_invalid(status, data):
                    headers["Authorization"] = await self._authenticate(ep, headers["Authorization"])
                    status, data = await self._post(ep, path, body, headers)
                if status != 200:
                    raise EtcdUnavailable(f"etcd {ep}{path} answered {status}: {data}")
                self._next = (self._next + i) % len(self.endpoints)
                return data
            except EtcdAuthFailed:
                raise
            except (aiohttp.ClientError, asyncio.TimeoutError, EtcdUnavailable, ValueError) as e:
                last = e
                await asyncio.sleep(0.05 * min(i + 1, 4))
        raise EtcdUnavailable(f"etcd unreachable on {', '.join(self.endpoints)}: {last}")

    async def grant(self, ttl_s: int) -> str:
        return str((await self.call("/v3/lease/grant", {"TTL": str(ttl_s)}))["ID"])

    async def keepalive(self, lease: str) -> bool:
        """Refresh a lease; False when it has expired (its keys are gone)."""
        data = await self.call("/v3/lease/keepalive", {"ID": lease})
        return int((data.get("result") or {}).get("TTL", 0)) > 0

    async def revoke(self, lease: str) -> None:
        await self.call("/v3/lease/revoke", {"ID": lease})

    async def put(self, key: str, value: bytes, lease: str | None = None) -> None:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = lease
        await self.call("/v3/kv/put", body)

    async def delete(self, key: str) -> None:
        await self.call("/v3/kv/deleterange", {"key": _b64(key)})

    async def range_prefix(self, prefix: str) -> dict[str, tuple[bytes, int]]:
        """key -> (value, mod_revision) of every key under ``prefix``."""
        p = prefix.encode()
        data = await self.call("/v3/kv/range", {"key": _b64(p), "range_end": _b64(_prefix_end(p))})
        return {base64.b64decode(kv["key"]).decode(): (base64.b64decode(kv.get("value", "")), int(kv.get("mod_revision", 0)))
                for kv in data.get("kvs") or []}

    async def put_if_revision(self, key: str, value: bytes, mod_revision: int) -> bool:
        """Put ``key`` only if its mod_revision is still ``mod_revision`` (0: only if absent)."""
        k = _b64(key)
        cmp = ({"target": "CREATE", "key": k, "create_revision": "0", "result": "EQUAL"} if mod_revision == 0 else
               {"target": "MOD", "key": k, "mod_revision": str(mod_revision), "result": "EQUAL"})
        data = await self.call("/v3/kv/txn", {"compare": [cmp], "success": [{"request_put": {"key": k, "value": _b64(value)}}]})
        return bool(data.get("succeeded"))

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
