"""Ed25519 grants: a signature over (action digest, allowance id, expiry, key id)."""
from __future__ import annotations

import base64
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from scheduler_metrics.kedgeflow.action import Action, canonical_json

GRANT_DOMAIN = b"kedgeflow.grant.v1\n"


class GrantError(Exception):
    """A grant does not authorize the action presented (reason in the message)."""


@dataclass(frozen=True)
class Grant:
    action_digest: str
    allowance_id: str
    expires_at_ms: int
    key_id: str
    signature: bytes

    def signed_bytes(self) -> bytes:
        return GRANT_DOMAIN + canonical_json({"action_sha256": self.action_digest, "allowance_id": self.allowance_id,
                                              "expires_at_ms": self.expires_at_ms, "kid": self.key_id})

    def to_token(self) -> str:
        body = {"action_sha256": self.action_digest, "allowance_id": self.allowance_id, "expires_at_ms": self.expires_at_ms,
                "kid": self.key_id, "sig": base64.urlsafe_b64encode(self.signature).decode()}
        return base64.urlsafe_b64encode(canonical_json(body)).decode()

    @classmethod
    def from_token(cls, token: str) -> "Grant":
        try:
            d = json.loads(base64.urlsafe_b64decode(token.encode()))
            return cls(d["action_sha256"], d["allowance_id"], int(d["expires_at_ms"]), d["kid"], base64.urlsafe_b64decode(d["sig"]))
        except Exception as e:  # noqa: BLE001 - any malformed token is the caller's fault
            raise GrantError(f"malformed grant token: {e}") from e


def load_or_create_key(path: Path) -> Ed25519PrivateKey:
    """The server's signing key, created on first use (0600) in the data dir."""
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path} does not hold an Ed25519 private key")
        return key
    key = Ed25519PrivateKey.generate()
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # never readable by others, not even briefly
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return key


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    import hashlib

    return hashlib.sha256(raw).hexdigest()[:16]


class GrantSigner:
    def __init__(self, private_key: Ed25519PrivateKey):
        self._key = private_key
        self.public_key = private_key.public_key()
        self.key_id = key_id(self.public_key)

    def sign(self, action: Action, allowance_id: str, ttl_ms: int, now_ms: int | None = None) -> Grant:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        unsigned = Grant(action.digest(), allowance_id, now + ttl_ms, self.key_id, b"")
        return Grant(unsigned.action_digest, allowance_id, unsigned.expires_at_ms, self.key_id, self._key.sign(unsigned.signed_bytes()))


class GrantVerifier:
    def __init__(self, public_keys: dict[str, Ed25519PublicKey]):
        self._keys = dict(public_keys)

    @classmethod
    def for_signer(cls, signer: GrantSigner) -> "GrantVerifier":
        return cls({signer.key_id: signer.public_key})

    @classmethod
    def from_pem(cls, *pems: bytes) -> "GrantVerifier":
        """Verifier for the public key(s) a target trusts, as printed by ``turboprom audit export-key``."""
        keys: dict[str, Ed25519PublicKey] = {}
        for pem in pems:
            pub = serialization.load_pem_public_key(pem)
            if not isinstance(pub, Ed25519PublicKey):
                raise ValueError("a KedgeFlow grant key must be an Ed25519 public key")
            keys[key_id(pub)] = pub
        return cls(keys)

    def verify(self, grant: Grant, action: Action, now_ms: int | None = None) -> None:
        """Raise GrantError unless the grant is validly signed, unexpired, and for exactly this action."""
        key = self._keys.get(grant.key_id)
        if key is None:
            raise GrantError(f"grant signed by unknown key {grant.key_id!r}")
        try:
            key.verify(grant.signature, grant.signed_bytes())
        except InvalidSignature as e:
            raise GrantError("grant signature is invalid") from e
        if action.digest() != grant.action_digest:
            raise GrantError("action does not match the granted action byte for byte (parameter substitution refused)")
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if now >= grant.expires_at_ms:
            raise GrantError(f"grant expired at {grant.expires_at_ms} ms")
