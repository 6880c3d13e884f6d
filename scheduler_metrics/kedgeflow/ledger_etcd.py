"""Allowance ledger on etcd, through etcd's v3 JSON gateway (storage/etcd_gateway.py: endpoint
rotation, etcd users and TLS).

Consumption is the paper's transaction: read the allowance key (value + mod_revision R), then
``Txn If(mod_revision(key) == R) Then(put "consumed:<consumer>") Else(range key)``. Exactly one
racing claimer's transaction succeeds. A claimer that loses its connection mid-call retries on
another member; the retry recognizes its own consumer id, so an applied-but-unacknowledged claim is
not lost, and a claim whose outcome cannot be learned raises LedgerUnavailable (uncertain), never
"available".
"""
from __future__ import annotations

import base64
from typing import Any, Sequence

from scheduler_metrics.kedgeflow.ledger import AVAILABLE, CONSUMED, REVOKED, ClaimResult, LedgerUnavailable
from storage.etcd_gateway import EtcdAuthFailed, EtcdCredentials, EtcdGateway, EtcdUnavailable

PREFIX = "/kedgeflow/allowances/"


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def _unb64(s: str) -> str:
    return base64.b64decode(s).decode()


class EtcdLedger:
    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = 5.0, prefix: str = PREFIX, attempts: int = 6,
                 client: EtcdCredentials | None = None):
        """``client``: etcd user and TLS (``kedgeflow.ledger.etcd`` username, password_file, tls_config)."""
        if not endpoints:
            raise ValueError("EtcdLedger needs at least one endpoint URL (e.g. http://127.0.0.1:2379)")
        self.prefix = prefix
        self.gateway = EtcdGateway(endpoints, timeout_s=timeout_s, client=client, attempts=attempts)

    def _key(self, allowance_id: str) -> str:
        return _b64(self.prefix + allowance_id)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.gateway.call(path, body)
        except EtcdAuthFailed as e:
            raise LedgerUnavailable(f"{e} (kedgeflow.ledger.etcd username / password)") from None
        except EtcdUnavailable as e:
            raise LedgerUnavailable(str(e)) from None

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
        await self.gateway.close()
