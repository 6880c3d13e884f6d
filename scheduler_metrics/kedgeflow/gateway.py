"""Control plane (propose -> decide -> grant) and gateway (verify -> consume -> recheck -> dispatch).

Every step appends to the audit log. The allowance moves only forward: a refused recheck, a failed
dispatch and an uncertain outcome all leave it consumed.
"""
from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from scheduler_metrics.kedgeflow.action import Action, canonical_json
from scheduler_metrics.kedgeflow.audit import AuditLog, digest_of
from scheduler_metrics.kedgeflow.grant import Grant, GrantError, GrantSigner, GrantVerifier
from scheduler_metrics.kedgeflow.ledger import Ledger, LedgerUnavailable
from scheduler_metrics.kedgeflow.policy import Decision, Policy, Principal
from scheduler_metrics.kedgeflow.targets import Target, TargetRejected

DENIED_PARAMS_BYTES = 1024  # a refused proposal records bigger parameters as digest + preview

COMMITTED, REFUSED, REJECTED, FAILED, UNCERTAIN = "committed", "refused", "rejected_by_target", "failed", "uncertain"


@dataclass
class Outcome:
    status: str  # committed | refused | rejected_by_target | failed | uncertain
    reason: str = ""
    allowance_id: str = ""
    result: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "allowance_id": self.allowance_id, "result": self.result}


class ControlPlane:
    def __init__(self, policy: Policy, signer: GrantSigner, ledger: Ledger, audit: AuditLog):
        self.policy, self.signer, self.ledger, self.audit = policy, signer, ledger, audit

    async def propose(self, action: Action, who: Principal) -> tuple[Decision, Grant | None]:
        decision = await asyncio.to_thread(self.policy.decide, action, who)  # its signals may wait for a rebuild
        ref = {"action_sha256": action.digest(), "principal": who.name}
        recorded = action.to_dict()
        if not decision.approved and len(canonical_json(action.params)) > DENIED_PARAMS_BYTES:
            # A refused proposal keeps the digest and a preview of bulky parameters, not all of them.
            recorded["params"] = digest_of(action.params)
        await asyncio.to_thread(self.audit.append, "proposal", {"action": recorded, **ref}, tenant=action.tenant)
        # The decision names the action by digest (the proposal entry just before it holds the action).
        await asyncio.to_thread(self.audit.append, "decision", {**ref, **decision.to_dict()}, tenant=action.tenant)
        if not decision.approved:
            return decision, None
        allowance_id = secrets.token_hex(16)
        await self.ledger.create(allowance_id, meta=action.digest())
        grant = self.signer.sign(action, allowance_id, decision.grant_ttl_ms)
        await asyncio.to_thread(self.audit.append, "grant", {"action_sha256": action.digest(), "allowance_id": allowance_id,
                                                             "expires_at_ms": grant.expires_at_ms, "kid": grant.key_id}, tenant=action.tenant)
        return decision, grant

    async def revoke(self, allowance_id: str, who: Principal, tenant: str = "default") -> bool:
        was_available = await self.ledger.revoke(allowance_id)
        await asyncio.to_thread(self.audit.append, "revoke", {"allowance_id": allowance_id, "by": who.name, "was_available": was_available},
                                tenant=tenant)
        return was_available


class Gateway:
    def __init__(self, verifier: GrantVerifier, ledger: Ledger, policy: Policy, audit: AuditLog,
                 targets: dict[str, Target], *, dispatch_timeout_s: float = 10.0):
        self.verifier, self.ledger, self.policy, self.audit = verifier, ledger, policy, audit
        self.targets = targets
        self.dispatch_timeout_s = dispatch_timeout_s

    async def _log(self, kind: str, data: dict[str, Any], tenant: str) -> None:
        await asyncio.to_thread(self.audit.append, kind, data, tenant=tenant)

    async def execute(self, action: Action, grant: Grant, who: Principal, *, call_id: str | None = None) -> Outcome:
        call_id = call_id or secrets.token_hex(8)
        aid, tenant = grant.allowance_id, action.tenant
        ref = {"allowance_id": aid, "action_sha256": action.digest(), "call": call_id, "principal": who.name}
        await self._log("consume_attempt", ref, tenant)
        try:
            self.verifier.verify(grant, action)
        except GrantError as e:
            await self._log("refused", {**ref, "stage": "verify", "reason": str(e)}, tenant)
            return Outcome(REFUSED, str(e), aid)
        target = self.targets.get(action.verb)
        if target is None:
            msg = f"no target handles verb {action.verb!r}"
            await self._log("refused", {**ref, "stage": "verify", "reason": msg}, tenant)
            return Outcome(REFUSED, msg, aid)
        try:
            claim = await self.ledger.consume(aid, call_id)
        except LedgerUnavailable as e:
            await self._log("consume_result", {**ref, "won": None, "uncertain": True, "reason": str(e)}, tenant)
            return Outcome(UNCERTAIN, f"ledger outcome unknown: {e}", aid)
        await self._log("consume_result", {**ref, "won": claim.won, "state": claim.state}, tenant)
        if not claim.won:
            msg = f"allowance is {claim.state}" + (" by another call" if claim.state == "consumed" else "")
            await self._log("refused", {**ref, "stage": "consume", "reason": msg}, tenant)
            return Outcome(REFUSED, msg, aid)
        # Recheck current authority with fresh state; a failure here leaves the allowance consumed.
        reason = None
        try:
            if await self.ledger.is_revoked(aid):
                reason = "grant was revoked"
            elif int(time.time() * 1000) >= grant.expires_at_ms:
                reason = "grant expired before dispatch"
            else:
                fresh = await asyncio.to_thread(self.policy.decide, action, who)
                if not fresh.approved:
                    reason = f"policy recheck failed: {fresh.reason}"
        except Exception as e:  # noqa: BLE001 - authority cannot be confirmed: refuse; the allowance stays consumed
            reason = f"could not recheck authority: {e!r}"
        if reason:
            await self._log("refused", {**ref, "stage": "recheck", "reason": reason}, tenant)
            return Outcome(REFUSED, reason, aid)
        await self._log("dispatch", {**ref, "verb": action.verb, "target": action.target}, tenant)
        try:
            result = await asyncio.wait_for(target.apply(action, aid, grant.to_token()), timeout=self.dispatch_timeout_s)
        except TargetRejected as e:
            await self._log("outcome", {**ref, "status": REJECTED, "reason": str(e)}, tenant)
            return Outcome(REJECTED, str(e), aid)
        except asyncio.TimeoutError:
            msg = f"dispatch timed out after {self.dispatch_timeout_s}s: outcome unknown, allowance stays consumed"
            await self._log("outcome", {**ref, "status": UNCERTAIN, "reason": msg}, tenant)
            return Outcome(UNCERTAIN, msg, aid)
        except Exception as e:  # noqa: BLE001 - unknown failure = uncertain, never restore
            msg = f"dispatch failed with unknown outcome: {e!r}"
            await self._log("outcome", {**ref, "status": UNCERTAIN, "reason": msg}, tenant)
            return Outcome(UNCERTAIN, msg, aid)
        await self._log("outcome", {**ref, "status": COMMITTED, "result": result}, tenant)
        return Outcome(COMMITTED, "", aid, result)
