"""Approval policy: who may ask for which verb, under which live conditions.

A rule names verbs (shell-style patterns), the roles allowed to request them, and optionally a bound
on the congestion price read from the live congestion signals at decision time (e.g. a KV migration
is approved only while the cluster's price is below the bound). The decision records the signal
snapshot it used, so the audit log shows why.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Callable

from scheduler_metrics.kedgeflow.action import Action

# signals(action) -> snapshot dict; must contain "price" (float) when a rule bounds congestion.
SignalsFn = Callable[[Action], dict[str, Any]]


@dataclass(frozen=True)
class Principal:
    name: str
    roles: frozenset[str] = frozenset()


@dataclass
class Rule:
    verbs: list[str]
    roles: set[str]
    max_congestion_price: float | None = None
    grant_ttl_ms: int = 60_000


@dataclass
class Decision:
    approved: bool
    reason: str
    rule: int | None = None
    signals: dict[str, Any] = field(default_factory=dict)
    grant_ttl_ms: int = 60_000

    def to_dict(self) -> dict[str, Any]:
        return {"approved": self.approved, "reason": self.reason, "rule": self.rule, "signals": self.signals}


DEFAULT_RULES = [
    Rule(verbs=["tsdb.delete_series", "tsdb.retention", "planner.adopt"], roles={"admin"}),
    Rule(verbs=["scheduler.kv_migrate", "scheduler.drain_instance"], roles={"admin", "scheduler"}, max_congestion_price=0.05, grant_ttl_ms=30_000),
]


class Policy:
    def __init__(self, rules: list[Rule] | None = None, signals: SignalsFn | None = None):
        self.rules = list(DEFAULT_RULES if rules is None else rules)
        self.signals = signals

    @classmethod
    def from_config(cls, raw: list[dict[str, Any]] | None, signals: SignalsFn | None = None) -> "Policy":
        if not raw:
            return cls(None, signals)
        rules = [Rule(verbs=list(r["verbs"]), roles=set(r.get("roles", ["admin"])),
                      max_congestion_price=r.get("max_congestion_price"), grant_ttl_ms=int(r.get("grant_ttl_ms", 60_000))) for r in raw]
        return cls(rules, signals)

    def decide(self, action: Action, who: Principal) -> Decision:
        for i, rule in enumerate(self.rules):
            if not any(fnmatch.fnmatchcase(action.verb, v) for v in rule.verbs):
                continue
            if not (rule.roles & set(who.roles)):
                return Decision(False, f"{who.name!r} lacks a role allowed to request {action.verb!r} (needs one of {sorted(rule.roles)})", i)
            snap: dict[str, Any] = {}
            if rule.max_congestion_price is not None:
                if self.signals is None:
                    return Decision(False, f"{action.verb!r} needs live congestion signals and none are available", i)
                snap = self.signals(action)
                price = snap.get("price")
                if price is None:
                    return Decision(False, "no congestion price available for the action's scope", i, snap)
                if price >= rule.max_congestion_price:
                    return Decision(False, f"congestion price {price:.4g} is not below the bound {rule.max_congestion_price:g}", i, snap)
            return Decision(True, "approved", i, snap, rule.grant_ttl_ms)
        return Decision(False, f"no policy rule covers verb {action.verb!r}")
