"""A scheduler's control loop that asks before it acts: when TurboProm's live congestion API shows
an instance congested, it proposes moving the heaviest session KV that instance holds to the least
congested instance, and carries the move out only through KedgeFlow.

One round (``step``):

1. ``GET /api/v1/congestion?cluster=...``: per-instance congestion price and saturation.
2. ``choose``: the most congested fresh instance (saturated, or its price at least
   ``congested_price`` s/token) is the source; the fresh instance with the lowest price (below
   ``congested_price``, not the source) the destination; the session is the largest KV the source
   holds that was not moved within ``cooldown_s``. Nothing is proposed when no instance qualifies.
3. ``POST /api/v1/kedgeflow/propose`` with ``scheduler.kv_migrate`` and the session's current holder
   version (the target commits only if it is unchanged). The server's policy decides and, when it
   approves, signs a single-use grant for exactly this action.
4. ``POST /api/v1/kedgeflow/execute``: the gateway consumes the allowance, rechecks, and dispatches
   to the scheduler's control endpoint (``control.py``), which verifies the grant again and moves the KV.

With ``replay_probe`` the first committed grant is presented a second time, once, so the audit log
shows the refusal of a replay next to the commit.
"""
from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("turboprom.scheduler")

MIGRATE = "scheduler.kv_migrate"
# instance index -> [(session, KV tokens held there)], largest first
HeldSessions = Callable[[int], "list[tuple[int, int]]"]


@dataclass
class RoundResult:
    """What one round did: the action proposed (if any), the decision and the execution outcome."""

    action: dict[str, Any] | None = None
    decision: dict[str, Any] | None = None
    grant: str | None = None
    outcome: dict[str, Any] | None = None
    replay: dict[str, Any] | None = None
    error: str = ""


@dataclass
class RebalanceStats:
    rounds: int = 0
    proposed: int = 0
    approved: int = 0
    denied: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    errors: int = 0


class KVRebalancer:
    def __init__(self, base_url: str, instance_names: list[str], held: HeldSessions, holder_version: Callable[[int], int], *,
                 cluster: str, model: str, period_s: float = 5.0, cooldown_s: float = 30.0, congested_price: float = 0.05,
                 replay_probe: bool = True, headers: dict[str, str] | None = None, timeout_s: float = 15.0,
                 on_outcome: Callable[[str, str], None] | None = None):
        if period_s <= 0 or cooldown_s < 0 or congested_price <= 0:
            raise ValueError("period_s and congested_price must be positive, cooldown_s not negative")
        self.base = base_url.rstrip("/")
        self.names = list(instance_names)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.held, self.holder_version = held, holder_version
        self.cluster, self.model = cluster, model
        self.period_s, self.cooldown_s, self.congested_price = period_s, cooldown_s, congested_price
        self.replay_probe = replay_probe
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s
        self.on_outcome = on_outcome  # (verb, outcome) per proposal: denied | an execution status | error
        self.stats = RebalanceStats()
        self.history: list[RoundResult] = []  # rounds that proposed something, oldest first (bounded)
        self._moved_at: dict[int, float] = {}  # session -> when a migration of it was last proposed
        self._source_at: dict[int, float] = {}  # instance -> when a migration off it was last proposed
        self._probed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ decision (pure)
    def choose(self, congestion: dict[str, Any], now: float | None = None) -> dict[str, Any] | None:
        """The migration to propose for a congestion API answer's ``data``, or None."""
        now = time.time() if now is None else now
        rows = [r for r in congestion.get("instances", [])
                if r.get("cluster") == self.cluster and r.get("instance") in self.index and not r.get("stale")
                and r.get("congestion_price_seconds_per_token") is not None]
        if len(rows) < 2:
            return None

        def price(r: dict[str, Any]) -> float:
            return float(r["congestion_price_seconds_per_token"])

        hot = [r for r in rows if (r.get("saturated") or price(r) >= self.congested_price)
               and now - self._source_at.get(self.index[r["instance"]], -1e18) >= self.cooldown_s]
        if not hot:
            return None
        src_row = max(hot, key=price)
        cool = [r for r in rows if r is not src_row and not r.get("saturated") and price(r) < self.congested_price]
        if not cool:
            return None
        dst_row = min(cool, key=price)
        src, dst = self.index[src_row["instance"]], self.index[dst_row["instance"]]
        session = next((s for s, tokens in self.held(src)
                        if tokens > 0 and now - self._moved_at.get(s, -1e18) >= self.cooldown_s), None)
        if session is None:
            return None
        evidence = {"instance": src_row["instance"], "price_seconds_per_token": price(src_row), "saturated": bool(src_row.get("saturated")),
                    "destination": dst_row["instance"], "destination_price_seconds_per_token": price(dst_row),
                    "snapshot_version": congestion.get("version")}
        return {"verb": MIGRATE, "target": f"session/{session}",
                "params": {"cluster": self.cluster, "model": self.model, "session": session, "from": src, "to": dst,
                           "expected_holder_version": self.holder_version(session), "evidence": evidence}}

    # ------------------------------------------------------------------ one round over HTTP
    def _request(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method="POST" if body is not None else "GET",
                                     headers={"Content-Type": "application/json", **self.headers})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                out = json.loads(r.read())
        except urllib.error.HTTPError as e:
            detail = e.read()[:500].decode("utf-8", "replace")
            raise RuntimeError(f"{path} answered {e.code}: {detail}") from e
        if out.get("status") != "success":
            raise RuntimeError(f"{path}: {out.get('error', out)}")
        return out["data"]

    def step(self) -> RoundResult | None:
        """One round; the result when an action was proposed (None when nothing needed doing)."""
        self.stats.rounds += 1
        q = urllib.parse.urlencode({"cluster": self.cluster})
        try:
            spec = self.choose(self._request(f"/api/v1/congestion?{q}"))
        except (OSError, RuntimeError, ValueError) as e:
            self.stats.errors += 1
            log.debug("congestion poll failed: %s", e)
            return None
        if spec is None:
            return None
        now = time.time()
        self._moved_at[spec["params"]["session"]] = now
        self._source_at[spec["params"]["from"]] = now
        res = RoundResult(action=spec)
        try:
            prop = self._request("/api/v1/kedgeflow/propose", spec)
            self.stats.proposed += 1
            res.action, res.decision, res.grant = prop["action"], prop["decision"], prop["grant"]
            if not res.decision["approved"] or not res.grant:
                self.stats.denied += 1
                log.info("KV migration of %s denied: %s", spec["target"], res.decision["reason"])
            else:
                self.stats.approved += 1
                res.outcome = self._request("/api/v1/kedgeflow/execute", {"action": res.action, "grant": res.grant})
                status = res.outcome["status"]
                self.stats.outcomes[status] = self.stats.outcomes.get(status, 0) + 1
                log.info("KV migration of %s %s -> %s: %s %s", spec["target"], self.names[spec["params"]["from"]],
                         self.names[spec["params"]["to"]], status, res.outcome.get("reason", ""))
                if status == "committed" and self.replay_probe and not self._probed:
                    self._probed = True
                    res.replay = self._request("/api/v1/kedgeflow/execute", {"action": res.action, "grant": res.grant})
                    log.info("replayed grant for %s: %s (%s)", spec["target"], res.replay["status"], res.replay.get("reason", ""))
        except (OSError, RuntimeError, ValueError, KeyError) as e:
            self.stats.errors += 1
            res.error = f"{type(e).__name__}: {e}"
            log.warning("KV migration round failed: %s", res.error)
        if self.on_outcome is not None:
            self.on_outcome(MIGRATE, "error" if res.error else res.outcome["status"] if res.outcome else "denied")
        with self._lock:
            self.history.append(res)
            del self.history[:-100]
        return res

    def rounds(self) -> list[RoundResult]:
        with self._lock:
            return list(self.history)

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.step()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kv-rebalancer", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 20.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
