"""Allowance ledger on etcd, through etcd's v3 JSON gateway (grpc-gateway) over aiohttp.

The maintained Python etcd clients either fail with current protobuf (``etcd3``) or pull in gRPC
stacks we do not otherwise need; the JSON gateway is part of every etcd >= 3.3 and speaks the same
linearizable KV API, so this module talks to it directly.

Consumption is the paper's transaction: read the allowance key (value + mod_revision R), then
``Txn If(mod_revision(key) == R) Then(put "consumed:<consumer>") Else(range key)``. Exactly one
racing claimer's transaction succeeds. A claimer that loses its connection mid-call retries on
another member; the retry recognizes its own consumer id, so an applied-but-unacknowledged claim is
not lost, and a claim whose outcome cannot be learned raises LedgerUnavailable (uncertain), never
"available".
"""
from __future__ import annotations

import asyncio
import base64
from typing import Any, Sequence

import aiohttp

from scheduler_metrics.kedgeflow.ledger import AVAILABLE, CONSUMED, REVOKED, ClaimResult, LedgerUnavailable

PREFIX = "/kedgeflow/allowances/"


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def _unb64(s: str) -> str:
    return base64.b64decode(s).decode()


class EtcdLedger:
    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = 5.0, prefix: str = PREFIX, attempts: int = 6):
        if not endpoints:
            raise ValueError("EtcdLedger needs at least one endpoint URL (e.g. http://127.0.0.1:2379)")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.prefix = prefix
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.attempts = attempts
        self._session: aiohttp.ClientSession | None = None
        self._next = 0

    def _key(self, allowance_id: str) -> str:
        return _b64(self.prefix + allowance_id)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        last: Exception | None = None
        for i in range(self.attempts):
            ep = self.endpoints[(self._next + i) % len(self.endpoints)]
            try:
                async with self._session.post(ep + path, json=body) as r:
                    data = await r.json(content_type=None)
                    if r.status != 200:
                        raise LedgerUnavailable(f"etcd {ep}{path} answered {r.status}: {data}")
                    self._next = (self._next + i) % len(self.endpoints)
                    return data
            except (aiohttp.ClientError, asyncio.TimeoutError, LedgerUnavailable, ValueError) as e:  # ValueError: not JSON
                last = e
                await asyncio.sleep(0.05 * (i + 1))
        raise LedgerUnavailable(f"etcd unreachable on all endpoints: {last}")

    async def _range(self, allowance_id: str) -> tuple[str | None, int]:
        data = await self._post("/v3/kv/range", {"key": self._key(allowance_id)})
        kvs = data.get("kvs") or []
        if not kvs:
            return None, 0
        return _unb64(kvs[0].get("value", "")), int(kvs[0].get("mod_revision", 0))

    async def create(self, allowance_id: str, meta: str = "") -> None:
        key = self._key(allowance_id)
        data = await self._post("/v3/kv/txn", {
            "compare": [{"target": "CREATE", "key": key, "create_revision": "0", "result": "EQUAL"}],
            "success": [{"request_put": {"key": key, "value": _b64(AVAILABLE)}}],
        })
        if not data.get("succeeded"):
            raise ValueError(f"allowance {allowance_id!r} already exists")

    async def consume(self, allowance_id: str, consumer: str) -> ClaimResult:
        value, rev = await self._range(allowance_id)
        mine = f"{CONSUMED}:{consumer}"
        if value is None:
            return ClaimResult(False, "missing")
        if value != AVAILABLE:
            return self._result_for(value, consumer)
        key = self._key(allowance_id)
        data = await self._post("/v3/kv/txn", {
            "compare": [{"target": "MOD", "key": key, "mod_revision": str(rev), "result": "EQUAL"}],
            "success": [{"request_put": {"key": key, "value": _b64(mine)}}],
            "failure": [{"request_range": {"key": key}}],
        })
        if data.get("succeeded"):
            return ClaimResult(True, CONSUMED, consumer)
        kvs = (((data.get("responses") or [{}])[0]).get("response_range") or {}).get("kvs") or []
        now = _unb64(kvs[0].get("value", "")) if kvs else ""
        return self._result_for(now, consumer)

    @staticmethod
    def _result_for(value: str, consumer: str) -> ClaimResult:
        if value.startswith(CONSUMED + ":"):
            holder = value.split(":", 1)[1]
            return ClaimResult(holder == consumer, CONSUMED, holder)
        return ClaimResult(False, value or "missing")

    async def revoke(self, allowance_id: str) -> bool:
        await self._post("/v3/kv/put", {"key": _b64(self.prefix + "revoked/" + allowance_id), "value": _b64("1")})
        value, rev = await self._range(allowance_id)
        if value != AVAILABLE:
            return False
        key = self._key(allowance_id)
        data = await self._post("/v3/kv/txn", {
            "compare": [{"target": "MOD", "key": key, "mod_revision": str(rev), "result": "EQUAL"}],
            "success": [{"request_put": {"key": key, "value": _b64(REVOKED)}}],
        })
        return bool(data.get("succeeded"))

    async def is_revoked(self, allowance_id: str) -> bool:
        data = await self._post("/v3/kv/range", {"key": _b64(self.prefix + "revoked/" + allowance_id)})
        return bool(data.get("kvs"))

    async def state(self, allowance_id: str) -> str | None:
        value, _ = await self._range(allowance_id)
        if value is None:
            return None
        return CONSUMED if value.startswith(CONSUMED) else value

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
