"""Single-use allowances with atomic consumption: the interface and the embedded SQLite ledger.

Consumption is the only state change that matters: ``available -> consumed``, done atomically so
that exactly one of any number of racing claimers (threads or processes) wins. Nothing ever moves an
allowance back to ``available``: a consumer whose outcome is unknown records ``uncertain``.
"""
from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

AVAILABLE, CONSUMED, REVOKED = "available", "consumed", "revoked"


class LedgerUnavailable(Exception):
    """The ledger could not be reached or answered ambiguously: the claim's outcome is unknown."""


@dataclass
class ClaimResult:
    won: bool
    state: str  # state after the attempt
    consumer: str | None = None  # who holds the consumption


class Ledger(Protocol):
    async def create(self, allowance_id: str, meta: str = "") -> None: ...

    async def consume(self, allowance_id: str, consumer: str) -> ClaimResult:
        """Atomically consume; idempotent for the same consumer (a retry after a lost reply wins again)."""
        ...

    async def revoke(self, allowance_id: str) -> bool:
        """Mark revoked: an available allowance can no longer be consumed, and a consumed one fails
        the gateway's authority recheck. True if the allowance was still available."""
        ...

    async def is_revoked(self, allowance_id: str) -> bool: ...

    async def state(self, allowance_id: str) -> str | None: ...

    async def close(self) -> None: ...


class SQLiteLedger:
    """Embedded default: a SQLite file in the data dir, safe across threads and processes.

    SQLite (not DuckDB) because several processes must claim from the same file concurrently and
    SQLite serializes writers with file locks while DuckDB allows a single writing process.
    """

    def __init__(self, path: str | Path, busy_timeout_ms: int = 30_000):
        self.path = str(path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._busy_ms = busy_timeout_ms
        self._local = threading.local()
        with self._conn() as c:
            c.execute("PRAGMA journal_mode=WAL")
            c.execute(
                "CREATE TABLE IF NOT EXISTS allowances (id TEXT PRIMARY KEY, state TEXT NOT NULL, consumer TEXT,"
                " meta TEXT, created_ms INTEGER, consumed_ms INTEGER)"
            )
            c.execute("CREATE TABLE IF NOT EXISTS revocations (id TEXT PRIMARY KEY, revoked_ms INTEGER)")

    def _conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = sqlite3.connect(self.path, timeout=self._busy_ms / 1000, isolation_level=None, check_same_thread=True)
            c.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            c.execute("PRAGMA synchronous=FULL")
            self._local.conn = c
        return c

    # Synchronous core (used from worker threads / other processes directly).
    def create_sync(self, allowance_id: str, meta: str = "") -> None:
        c = self._conn()
        c.execute("INSERT INTO allowances (id, state, meta, created_ms) VALUES (?, ?, ?, ?)",
                  (allowance_id, AVAILABLE, meta, int(time.time() * 1000)))

    def consume_sync(self, allowance_id: str, consumer: str) -> ClaimResult:
        c = self._conn()
        try:
            c.execute("BEGIN IMMEDIATE")
            cur = c.execute("UPDATE allowances SET state=?, consumer=?, consumed_ms=? WHERE id=? AND state=?",
                            (CONSUMED, consumer, int(time.time() * 1000), allowance_id, AVAILABLE))
            won = cur.rowcount == 1
            row = c.execute("SELECT state, consumer FROM allowances WHERE id=?", (allowance_id,)).fetchone()
            c.execute("COMMIT")
        except sqlite3.Error as e:
            try:
                c.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise LedgerUnavailable(f"sqlite ledger error: {e}") from e
        if row is None:
            return ClaimResult(False, "missing")
        state, holder = row
        if not won and state == CONSUMED and holder == consumer:
            won = True  # idempotent retry by the same consumer
        return ClaimResult(won, state, holder)

    def revoke_sync(self, allowance_id: str) -> bool:
        c = self._conn()
        c.execute("BEGIN IMMEDIATE")
        c.execute("INSERT OR IGNORE INTO revocations (id, revoked_ms) VALUES (?, ?)", (allowance_id, int(time.time() * 1000)))
        cur = c.execute("UPDATE allowances SET state=? WHERE id=? AND state=?", (REVOKED, allowance_id, AVAILABLE))
        c.execute("COMMIT")
        return cur.rowcount == 1

    def is_revoked_sync(self, allowance_id: str) -> bool:
        return self._conn().execute("SELECT 1 FROM revocations WHERE id=?", (allowance_id,)).fetchone() is not None

    def state_sync(self, allowance_id: str) -> str | None:
        row = self._conn().execute("SELECT state FROM allowances WHERE id=?", (allowance_id,)).fetchone()
        return row[0] if row else None

    # Async interface.
    async def create(self, allowance_id: str, meta: str = "") -> None:
        await asyncio.to_thread(self.create_sync, allowance_id, meta)

    async def consume(self, allowance_id: str, consumer: str) -> ClaimResult:
        return await asyncio.to_thread(self.consume_sync, allowance_id, consumer)

    async def revoke(self, allowance_id: str) -> bool:
        return await asyncio.to_thread(self.revoke_sync, allowance_id)

    async def is_revoked(self, allowance_id: str) -> bool:
        return await asyncio.to_thread(self.is_revoked_sync, allowance_id)

    async def state(self, allowance_id: str) -> str | None:
        return await asyncio.to_thread(self.state_sync, allowance_id)

    async def close(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
            self._local.conn = None
