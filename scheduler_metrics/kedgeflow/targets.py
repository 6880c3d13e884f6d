"""Targets commit conditionally: each apply carries an idempotency key (the allowance id) and a
target commits only if it has not seen that key (and under its own preconditions)."""
from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import aiohttp

from scheduler_metrics.kedgeflow.action import Action


class TargetRejected(Exception):
    """The target refused to commit (a precondition failed); nothing was applied."""


GRANT_HEADER = "X-KedgeFlow-Grant"


class Target(Protocol):
    async def apply(self, action: Action, idempotency_key: str, grant_token: str | None = None) -> dict[str, Any]: ...


class IdempotencyStore:
    """Keys a target has committed, durably (SQLite). ``claim`` is atomic across threads/processes."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._conn().execute("CREATE TABLE IF NOT EXISTS applied (key TEXT PRIMARY KEY, applied_ms INTEGER, result TEXT)")

    def _conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            c.execute("PRAGMA journal_mode=WAL")
            self._local.conn = c
        return c

    def claim(self, key: str) -> bool:
        cur = self._conn().execute("INSERT OR IGNORE INTO applied (key, applied_ms) VALUES (?, ?)", (key, int(time.time() * 1000)))
        return cur.rowcount == 1

    def seen(self, key: str) -> bool:
        return self._conn().execute("SELECT 1 FROM applied WHERE key=?", (key,)).fetchone() is not None


class FunctionTarget:
    """An in-process target: runs ``fn(action)`` in a worker thread once per idempotency key. The gateway
    in the same process has verified the grant, so the token is not checked again here."""

    def __init__(self, store: IdempotencyStore, fn: Callable[[Action], dict[str, Any]]):
        self.store = store
        self.fn = fn

    async def apply(self, action: Action, idempotency_key: str, grant_token: str | None = None) -> dict[str, Any]:
        if not await asyncio.to_thread(self.store.claim, idempotency_key):
            raise TargetRejected(f"idempotency key {idempotency_key} already applied at this target")
        return await asyncio.to_thread(self.fn, action)


class HTTPTarget:
    """A remote target: POSTs the action with an Idempotency-Key header and the signed grant token
    (``X-KedgeFlow-Grant``) so the target can verify the authorization itself; 401/403/409/412 mean
    'refused' (nothing was applied)."""

    def __init__(self, url: str, timeout_s: float = 5.0):
        self.url = url
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def apply(self, action: Action, idempotency_key: str, grant_token: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key}
        if grant_token:
            headers[GRANT_HEADER] = grant_token
        async with aiohttp.ClientSession(timeout=self.timeout) as s:
            async with s.post(self.url, json=action.to_dict(), headers=headers) as r:
                body = await r.json(content_type=None)
                if r.status in (401, 403, 409, 412):
                    raise TargetRejected(str(body))
                if r.status >= 300:
                    raise RuntimeError(f"target answered {r.status}: {body}")
                return body

