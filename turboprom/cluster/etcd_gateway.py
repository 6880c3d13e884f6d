"""The few etcd v3 calls cluster membership needs (lease grant/keep-alive, put, prefix range,
compare-and-swap), through etcd's JSON gateway over aiohttp.

As the KedgeFlow ledger (scheduler_metrics/kedgeflow/ledger_etcd.py) explains, the maintained
Python etcd clients either fail with current protobuf or pull in a gRPC stack; the gateway speaks
the same linearizable KV API. Calls rotate over the endpoints, so one dead member is skipped.
"""
from __future__ import annotations

import asyncio
import base64
from typing import Any, Sequence

import aiohttp


class EtcdUnavailable(Exception):
    pass


def _b64(b: bytes | str) -> str:
    return base64.b64encode(b.encode() if isinstance(b, str) else b).decode()


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


class EtcdGateway:
    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = 2.0):
        if not endpoints:
            raise ValueError("etcd needs at least one endpoint URL (e.g. http://127.0.0.1:2379)")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._next = 0

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        last: Exception | None = None
        for i in range(len(self.endpoints) * 2):
            ep = self.endpoints[(self._next + i) % len(self.endpoints)]
            try:
                async with self._session.post(ep + path, json=body) as r:
                    data = await r.json(content_type=None)
                    if r.status != 200:
                        raise EtcdUnavailable(f"etcd {ep}{path} answered {r.status}: {data}")
                    self._next = (self._next + i) % len(self.endpoints)
                    return data
            except (aiohttp.ClientError, asyncio.TimeoutError, EtcdUnavailable, ValueError) as e:
                last = e
                await asyncio.sleep(0.05)
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
