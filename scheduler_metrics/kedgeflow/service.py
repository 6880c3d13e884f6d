"""Assembles the KedgeFlow parts for a server: key, ledger (embedded or etcd), policy, audit, targets."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from scheduler_metrics.kedgeflow.action import Action
from scheduler_metrics.kedgeflow.audit import AuditLog, VerifyReport, verify
from scheduler_metrics.kedgeflow.gateway import ControlPlane, Gateway, Outcome
from scheduler_metrics.kedgeflow.grant import Grant, GrantSigner, GrantVerifier, load_or_create_key
from scheduler_metrics.kedgeflow.ledger import Ledger, SQLiteLedger
from scheduler_metrics.kedgeflow.ledger_etcd import EtcdLedger
from scheduler_metrics.kedgeflow.policy import Decision, Policy, Principal, SignalsFn
from scheduler_metrics.kedgeflow.targets import Target
from storage.etcd_gateway import EtcdCredentials


# Known fields of ``kedgeflow:`` in the server YAML (checked by turboprom/config.py). The request limits
# (max_body_bytes, max_params_bytes, max_name_chars, rate_limit) are read by turboprom/routes/kedgeflow_api.py,
# targets by turboprom/kedgeflow_wiring.py.
LEDGER_ETCD_FIELDS: dict[str, Any] = {"endpoints": ["str"], "timeout_s": "number"}
CONFIG_FIELDS: dict[str, Any] = {
    # the etcd client's user and TLS fields are added by turboprom/config.py (the cluster's etcd settings)
    "ledger": ("=embedded", {"etcd": LEDGER_ETCD_FIELDS}),
    "policy": [{"verbs": ["str"], "roles": ["str"], "max_congestion_price": "number", "grant_ttl_ms": "int"}],
    "dispatch_timeout_s": "number", "audit_head_every": "int", "audit_max_entry_bytes": "int",
    "max_body_bytes": "int", "max_params_bytes": "int", "max_name_chars": "int",
    "rate_limit": {"requests_per_second": "number", "burst": "number"},
    "targets": {"*": "str"},
}


@dataclass
class KedgeFlowService:
    control: ControlPlane
    gateway: Gateway
    audit: AuditLog
    ledger: Ledger
    signer: GrantSigner
    # verb -> check(action) raising ValueError: malformed or disallowed actions are refused at proposal
    validators: dict[str, Callable[[Action], None]] = field(default_factory=dict)

    @classmethod
    def open(cls, data_dir: str | Path, config: dict[str, Any] | None = None, *, signals: SignalsFn | None = None,
             targets: dict[str, Target] | None = None, etcd_client: EtcdCredentials | None = None) -> "KedgeFlowService":
        """``config`` is the ``kedgeflow:`` section of the server config:
        ``ledger: embedded`` (default) or ``ledger: {etcd: {endpoints: [http://127.0.0.1:2379, ...]}}``
        (``etcd_client``: the etcd user and TLS of that section, read by the caller),
        ``policy: [{verbs: [...], roles: [...], max_congestion_price: 5.0, grant_ttl_ms: 30000}, ...]``,
        ``dispatch_timeout_s: 10``, ``audit_max_entry_bytes: 16384`` (what one audit entry records at
        most; larger values are kept as digest + preview). The HTTP layer's request limits
        (``max_body_bytes``, ``max_params_bytes``, ``rate_limit``) are read by turboprom/routes/kedgeflow_api.py."""
        cfg = config or {}
        base = Path(data_dir) / "kedgeflow"
        key = load_or_create_key(base / "signing-key.pem")
        signer = GrantSigner(key)
        led_cfg = cfg.get("ledger", "embedded")
        ledger: Ledger
        if isinstance(led_cfg, dict) and "etcd" in led_cfg:
            ledger = EtcdLedger(list(led_cfg["etcd"]["endpoints"]), timeout_s=float(led_cfg["etcd"].get("timeout_s", 5.0)),
                                client=etcd_client)
        else:
            ledger = SQLiteLedger(base / "ledger.sqlite")
        audit = AuditLog(base / "audit", key, head_every=int(cfg.get("audit_head_every", 64)),
                         max_entry_bytes=int(cfg.get("audit_max_entry_bytes", 16 * 1024)))
        policy = Policy.from_config(cfg.get("policy"), signals)
        control = ControlPlane(policy, signer, ledger, audit)
        gateway = Gateway(GrantVerifier.for_signer(signer), ledger, policy, audit, dict(targets or {}),
                          dispatch_timeout_s=float(cfg.get("dispatch_timeout_s", 10.0)))
        return cls(control, gateway, audit, ledger, signer)

    def add_target(self, verb: str, target: Target) -> None:
        self.gateway.targets[verb] = target

    def validate(self, action: Action) -> None:
        if action.verb not in self.gateway.targets:
            raise ValueError(f"no target handles verb {action.verb!r} (known: {', '.join(sorted(self.gateway.targets))})")
        check = self.validators.get(action.verb)
        if check is not None:
            check(action)

    async def propose(self, action: Action, who: Principal) -> tuple[Decision, Grant | None]:
        return await self.control.propose(action, who)

    async def execute(self, action: Action, grant: Grant, who: Principal) -> Outcome:
        return await self.gateway.execute(action, grant, who)

    def verify_audit(self) -> VerifyReport:
        return verify(self.audit.dir, self.signer.public_key, self.audit.head_every)

    async def stop(self) -> None:
        self.audit.close()
        await self.ledger.close()
