"""The action being approved, and its canonical bytes (what a grant signs)."""
from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

ACTION_DOMAIN = b"kedgeflow.action.v1\n"


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON: sorted keys, no whitespace, UTF-8, no NaN (rejected)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


@dataclass(frozen=True)
class Action:
    verb: str  # e.g. "tsdb.delete_series", "scheduler.kv_migrate", "scheduler.drain_instance"
    target: str  # what it acts on, e.g. "tsdb", "instance/worker-3"
    params: dict[str, Any] = field(default_factory=dict)
    tenant: str = "default"
    requester: str = "anonymous"
    nonce: str = field(default_factory=lambda: secrets.token_hex(16))

    def __post_init__(self) -> None:
        if not self.verb or not isinstance(self.verb, str):
            raise ValueError("action verb must be a non-empty string")
        if not isinstance(self.params, dict):
            raise ValueError("action params must be a JSON object")
        canonical_json(self.params)  # raises on values JSON cannot carry exactly

    def to_dict(self) -> dict[str, Any]:
        return {"verb": self.verb, "target": self.target, "params": self.params, "tenant": self.tenant,
                "requester": self.requester, "nonce": self.nonce}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Action":
        missing = [k for k in ("verb", "target", "nonce") if k not in d]
        if missing:
            raise ValueError(f"action is missing field(s): {', '.join(missing)}")
        return cls(verb=d["verb"], target=d["target"], params=dict(d.get("params") or {}),
                   tenant=d.get("tenant", "default"), requester=d.get("requester", "anonymous"), nonce=d["nonce"])

    def canonical_bytes(self) -> bytes:
        return ACTION_DOMAIN + canonical_json(self.to_dict())

    def digest(self) -> str:
        return hashlib.sha256(self.canonical_bytes()).hexdigest()
