"""Tamper-evident audit log: an append-only hash chain with periodically signed heads.

Each entry carries its sequence number and the previous entry's hash; its own hash is
``SHA-256(0x00 || canonical JSON of the entry)`` (the leaf-hash domain prefix of Certificate
Transparency). Every ``head_every`` entries (and on close) the chain head ``(seq, hash)`` is signed
with the server's Ed25519 key and appended to a separate heads file. Verification recomputes the
chain and checks every signed head against it, which detects modification, deletion, insertion and
reordering of entries, and truncation of the tail behind a signed head.

What an entry records is bounded (``max_entry_bytes``, default 16 KiB of canonical JSON for its
``data``): an oversized value is replaced, largest first, by ``{"truncated": true, "sha256": ...,
"bytes": n, "preview": ...}`` (the digest of its canonical JSON and its first bytes), so the chain
stays verifiable and the log's growth per request stays bounded whatever a caller sends.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from scheduler_metrics.kedgeflow.action import canonical_json

GENESIS = "0" * 64
HEAD_DOMAIN = b"kedgeflow.audit.head.v1\n"
DEFAULT_HEAD_EVERY = 64
DEFAULT_MAX_ENTRY_BYTES = 16 * 1024
PREVIEW_CHARS = 256
_MIN_CHILD_BYTES = 512
KINDS = ("proposal", "decision", "grant", "consume_attempt", "consume_result", "dispatch", "outcome", "refused", "revoke")


def entry_hash(entry: dict[str, Any]) -> str:
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(b"\x00" + canonical_json(body)).hexdigest()


def digest_of(value: Any, raw: bytes | None = None) -> dict[str, Any]:
    """What the log records instead of an oversized value."""
    raw = canonical_json(value) if raw is None else raw
    return {"truncated": True, "sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw),
            "preview": raw[:PREVIEW_CHARS].decode("utf-8", errors="ignore")}


def bound_value(value: Any, limit: int) -> Any:
    """``value`` if its canonical JSON fits in ``limit`` bytes; else a mapping keeps its keys and
    has its largest members bounded in turn, anything else becomes ``digest_of(value)``."""
    raw = canonical_json(value)
    if len(raw) <= limit:
        return value
    if isinstance(value, dict) and value:
        out = dict(value)
        sizes = {k: len(canonical_json(v)) for k, v in out.items()}
        total = len(raw)
        for k in sorted(out, key=lambda k: -sizes[k]):
            if total <= limit:
                break
            child = max(_MIN_CHILD_BYTES, sizes[k] - (total - limit))
            out[k] = bound_value(out[k], child)
            new = len(canonical_json(out[k]))
            total += new - sizes[k]
        if total <= limit:
            return out
    return digest_of(value, raw)


def head_bytes(seq: int, h: str, ts_ms: int, prev_head: str = GENESIS, head_every: int = 0) -> bytes:
    return HEAD_DOMAIN + canonical_json({"seq": seq, "hash": h, "ts_ms": ts_ms, "prev_head": prev_head, "head_every": head_every})


def head_record_hash(head: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(head)).hexdigest()


@dataclass
class VerifyReport:
    entries: int = 0
    heads: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class AuditLog:
    def __init__(self, directory: str | Path, signing_key: Ed25519PrivateKey, *, head_every: int = DEFAULT_HEAD_EVERY, fsync: bool = True,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "audit.jsonl"
        self.heads_path = self.dir / "audit-heads.jsonl"
        self._key = signing_key
        self.public_key = signing_key.public_key()
        self.head_every = head_every
        self.fsync = fsync
        self.max_entry_bytes = max(1024, int(max_entry_bytes))
        self._lock = threading.Lock()
        self._seq, self._last = self._recover()
        self._prev_head = self._last_head()
        self._unsigned = 0

    def _recover(self) -> tuple[int, str]:
        """Continue after the last complete entry; a torn final line (crash mid-append) is cut off
        so the next entry starts on a fresh line."""
        if not self.path.exists():
            return 0, GENESIS
        seq, last, good_end = 0, GENESIS, 0
        with open(self.path, "rb") as f:
            data = f.read()
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                break  # unterminated last line
            try:
                e = json.loads(data[pos:nl])
                seq, last = e["seq"] + 1, e["hash"]
            except (json.JSONDecodeError, KeyError, TypeError):
                break
            pos = good_end = nl + 1
        if good_end < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(good_end)
                f.flush()
                os.fsync(f.fileno())
        return seq, last

    def _last_head(self) -> str:
        if not self.heads_path.exists():
            return GENESIS
        last = GENESIS
        for raw in self.heads_path.read_bytes().splitlines():
            try:
                last = head_record_hash(json.loads(raw))
            except json.JSONDecodeError:
                break
        return last

    def append(self, kind: str, data: dict[str, Any], *, tenant: str = "default", ts_ms: int | None = None) -> dict[str, Any]:
        if kind not in KINDS:
            raise ValueError(f"unknown audit entry kind {kind!r}")
        data = bound_value(data, self.max_entry_bytes)
        if not isinstance(data, dict):
            data = {"data": data}
        tenant = tenant if len(tenant) <= 256 else digest_of(tenant)["sha256"]
        with self._lock:
            entry = {"seq": self._seq, "ts_ms": int(time.time() * 1000) if ts_ms is None else ts_ms, "kind": kind,
                     "tenant": tenant, "data": data, "prev": self._last}
            entry["hash"] = entry_hash(entry)
            with open(self.path, "ab") as f:
                f.write(canonical_json(entry) + b"\n")
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())
            self._seq += 1
            self._last = entry["hash"]
            self._unsigned += 1
            if self._unsigned >= self.head_every:
                self._sign_head_locked()
            return entry

    def sign_head(self) -> dict[str, Any] | None:
        with self._lock:
            return self._sign_head_locked()

    def _sign_head_locked(self) -> dict[str, Any] | None:
        if self._seq == 0:
            return None
        ts = int(time.time() * 1000)
        seq = self._seq - 1
        sig = self._key.sign(head_bytes(seq, self._last, ts, self._prev_head, self.head_every))
        head = {"seq": seq, "hash": self._last, "ts_ms": ts, "prev_head": self._prev_head, "head_every": self.head_every,
                "sig": base64.b64encode(sig).decode()}
        self._prev_head = head_record_hash(head)
        with open(self.heads_path, "ab") as f:
            f.write(canonical_json(head) + b"\n")
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        self._unsigned = 0
        return head

    def read(self, *, kind: str | None = None, tenant: str | None = None, since_ms: int | None = None,
             until_ms: int | None = None, grant: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for e in iter_entries(self.path):
            if kind and e.get("kind") != kind:
                continue
            if tenant and e.get("tenant") != tenant:
                continue
            if since_ms is not None and e.get("ts_ms", 0) < since_ms:
                continue
            if until_ms is not None and e.get("ts_ms", 0) > until_ms:
                continue
            if grant and e.get("data", {}).get("allowance_id") != grant:
                continue
            out.append(e)
        return out[-limit:] if limit else out

    def close(self) -> None:
        with self._lock:
            if self._unsigned:
                self._sign_head_locked()


def iter_entries(path: Path) -> Iterable[dict[str, Any]]:
    """Readable entries (a damaged line is skipped here; ``verify`` reports it)."""
    if not path.exists():
        return
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    yield json.loads(raw)
                except json.JSONDecodeError:
                    continue


def verify(directory: str | Path, public_key: Ed25519PublicKey, head_every: int | None = None) -> VerifyReport:
    """Recompute the chain and check every signed head. Problems name the sequence numbers."""
    d = Path(directory)
    rep = VerifyReport()
    hashes: list[str] = []
    prev = GENESIS
    path = d / "audit.jsonl"
    lines = path.read_bytes().splitlines() if path.exists() else []
    for i, raw in enumerate(lines):
        if not raw.strip():
            rep.problems.append(f"line {i + 1}: empty line inside the log")
            continue
        try:
            e = json.loads(raw)
        except json.JSONDecodeError:
            rep.problems.append(f"line {i + 1}: not valid JSON (torn or edited)")
            hashes.append("")
            continue
        seq = e.get("seq")
        if seq != len(hashes):
            rep.problems.append(f"line {i + 1}: sequence number {seq} where {len(hashes)} was expected (entry deleted, inserted or reordered)")
        if e.get("prev") != prev:
            rep.problems.append(f"entry seq {seq}: prev hash does not match the previous entry (chain broken: deletion, insertion or reordering)")
        if entry_hash(e) != e.get("hash"):
            rep.problems.append(f"entry seq {seq}: content does not match its hash (entry modified)")
        prev = e.get("hash", "")
        hashes.append(prev)
    rep.entries = len(hashes)
    hpath = d / "audit-heads.jsonl"
    prev_head, last_seq, signed_every = GENESIS, -1, 0
    for raw in (hpath.read_bytes().splitlines() if hpath.exists() else []):
        if not raw.strip():
            continue
        rep.heads += 1
        try:
            h = json.loads(raw)
            public_key.verify(base64.b64decode(h["sig"]), head_bytes(h["seq"], h["hash"], h["ts_ms"], h.get("prev_head", GENESIS),
                                                                     h.get("head_every", 0)))
        except (InvalidSignature, KeyError, ValueError, json.JSONDecodeError):
            rep.problems.append(f"signed head {raw[:80]!r}: signature invalid")
            continue
        if h.get("prev_head", GENESIS) != prev_head:
            rep.problems.append(f"signed head at seq {h['seq']}: does not chain to the previous head (heads deleted or reordered)")
        if h["seq"] < last_seq:
            rep.problems.append(f"signed head at seq {h['seq']} comes after a head at seq {last_seq}")
        prev_head, last_seq, signed_every = head_record_hash(h), h["seq"], int(h.get("head_every", 0) or 0)
        if h["seq"] >= len(hashes):
            rep.problems.append(f"signed head at seq {h['seq']} but the log ends at seq {len(hashes) - 1} (entries deleted from the tail)")
        elif hashes[h["seq"]] != h["hash"]:
            rep.problems.append(f"signed head at seq {h['seq']} does not match the log's hash there (history rewritten)")
    # Heads are signed every ``head_every`` entries and at shutdown: a run of entries longer than
    # that with no head covering it means heads were removed (or the log was forged wholesale).
    every = head_every or signed_every or DEFAULT_HEAD_EVERY  # the verifier's own setting wins
    uncovered = len(hashes) - (last_seq + 1)
    if uncovered >= every:
        rep.problems.append(f"{uncovered} entries (from seq {last_seq + 1}) are not covered by any signed head: "
                            f"heads file deleted or truncated, or entries forged")
    return rep


def entry_summary(entry: dict[str, Any]) -> str:
    """One readable line for an entry: its kind and the fields that say what happened."""
    d = entry.get("data") if isinstance(entry.get("data"), dict) else {}
    action = d.get("action") if isinstance(d.get("action"), dict) else {}
    parts = [f"{action.get('verb', '')} {action.get('target', '')}".strip()] if action else []
    for k in ("approved", "allowance_id", "won", "state", "stage", "status", "verb", "target", "reason", "by"):
        if k in d and d[k] not in (None, ""):
            parts.append(f"{k}={d[k]}")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(entry.get("ts_ms", 0) / 1000))
    return f"{entry.get('seq', '?'):>6}  {when}  {entry.get('kind', '?'):<16} {entry.get('tenant', '')}  {'  '.join(parts)}"[:400]
