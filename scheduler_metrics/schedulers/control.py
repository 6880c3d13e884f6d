"""A scheduler's control endpoint: the target KedgeFlow dispatches approved scheduler actions to.

``POST /api/v1/scheduler/migrate`` moves a session's KV holdership (Vesta's bucket-change prefix
move, or an operator-initiated migration) and ``POST /api/v1/scheduler/drain`` stops placing new
work on an instance. Both commit conditionally: the ``Idempotency-Key`` (the grant's allowance id)
must not have been applied before (409 otherwise), and a migration's ``expected_holder_version`` must
equal the session's current holder version (412 otherwise), so a stale or replayed action changes nothing.

Authorization is checked here too, not only at the KedgeFlow gateway: the request must carry the
gateway's signed grant (``X-KedgeFlow-Grant``), which must verify against the trusted public key(s),
be unexpired, be for exactly the posted action (byte-for-byte digest), name this endpoint's verb, and
carry the ``Idempotency-Key`` as its allowance id (401 without a grant, 403 for one that does not
authorize the request). A caller that can reach the endpoint but holds no grant changes nothing.
``allow_unsigned=True`` turns the check off; it exists for in-process simulations only.
"""
from __future__ import annotations

import threading
from typing import Any

from aiohttp import web

from scheduler_metrics.kedgeflow.action import Action
from scheduler_metrics.kedgeflow.grant import Grant, GrantError, GrantVerifier
from scheduler_metrics.kedgeflow.targets import GRANT_HEADER
from scheduler_metrics.schedulers.vesta import VestaScheduler

VERB_OF_PATH = {"migrate": "scheduler.kv_migrate", "drain": "scheduler.drain_instance"}


class SchedulerControl:
    def __init__(self, vesta: VestaScheduler, verifier: GrantVerifier | None = None, *, allow_unsigned: bool = False):
        if verifier is None and not allow_unsigned:
            raise ValueError("SchedulerControl needs a GrantVerifier (the KedgeFlow public key), or allow_unsigned=True")
        self.vesta = vesta
        self.verifier = verifier
        self.refused = 0
        self.versions: dict[int, int] = {}
        self.drained: set[int] = set()
        self.applied: dict[str, dict[str, Any]] = {}
        self.commits = 0
        self._lock = threading.Lock()

    def holder(self, session: int) -> tuple[int, int]:
        with self._lock:
            return self.vesta.holder.get(session, -1), self.versions.get(session, 0)

    def migrate(self, key: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            session, to = int(params["session"]), int(params["to"])
            expected = int(params["expected_holder_version"])
        except (KeyError, TypeError, ValueError) as e:
            return 400, {"error": f"migrate needs integer params session, to, expected_holder_version: {e}"}
        if not 0 <= to < self.vesta.n_instances:
            return 400, {"error": f"instance {to} out of range 0..{self.vesta.n_instances - 1}"}
        with self._lock:
            if key in self.applied:
                return 409, {"error": f"idempotency key {key} already applied", "result": self.applied[key]}
            version = self.versions.get(session, 0)
            if version != expected:
                return 412, {"error": f"holder version of session {session} is {version}, not {expected}"}
            self.vesta.pin_holder(session, to)  # honoured by later placements, not just recorded
            self.versions[session] = version + 1
            res = {"session": session, "holder": to, "holder_version": version + 1}
            self.applied[key] = res
            self.commits += 1
            return 200, res

    def drain(self, key: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            inst = int(params["instance"])
        except (KeyError, TypeError, ValueError) as e:
            return 400, {"error": f"drain needs integer param instance: {e}"}
        with self._lock:
            if key in self.applied:
                return 409, {"error": f"idempotency key {key} already applied"}
            self.drained.add(inst)
            self.vesta.drained.add(inst)  # Vesta stops placing work and sessions there
            res = {"drained": sorted(self.drained)}
            self.applied[key] = res
            self.commits += 1
            return 200, res

    def authorize(self, verb: str, key: str, body: Any, token: str | None) -> tuple[int, str] | None:
        """None when the request is authorized, else (status, reason)."""
        if self.verifier is None:
            return None
        if not token:
            return 401, f"{GRANT_HEADER} header required: actions must come through KedgeFlow with a signed grant"
        try:
            grant = Grant.from_token(token)
            if not isinstance(body, dict):
                raise GrantError("request body must be the granted action as a JSON object")
            try:
                action = Action.from_dict(body)
            except ValueError as e:
                raise GrantError(f"request body is not an action: {e}") from e
            self.verifier.verify(grant, action)
        except GrantError as e:
            return 403, str(e)
        if action.verb != verb:
            return 403, f"grant is for verb {action.verb!r}, this endpoint applies {verb!r}"
        if grant.allowance_id != key:
            return 403, "Idempotency-Key does not match the grant's allowance id"
        return None

    def app(self) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            key = request.headers.get("Idempotency-Key", "")
            if not key:
                return web.json_response({"error": "Idempotency-Key header required"}, status=400)
            try:
                body = await request.json()
            except ValueError:
                return web.json_response({"error": "request body must be JSON"}, status=400)
            kind = request.path.rsplit("/", 1)[-1]
            denied = self.authorize(VERB_OF_PATH[kind], key, body, request.headers.get(GRANT_HEADER))
            if denied is not None:
                with self._lock:
                    self.refused += 1
                return web.json_response({"error": denied[1]}, status=denied[0])
            params = body.get("params", {}) if isinstance(body, dict) else {}
            fn = self.migrate if kind == "migrate" else self.drain
            status, res = fn(key, params)
            return web.json_response(res, status=status)

        async def get_holder(request: web.Request) -> web.Response:
            h, v = self.holder(int(request.match_info["session"]))
            return web.json_response({"holder": h, "holder_version": v})

        app = web.Application()
        app.router.add_post("/api/v1/scheduler/migrate", handle)
        app.router.add_post("/api/v1/scheduler/drain", handle)
        app.router.add_get("/api/v1/scheduler/holders/{session}", get_holder)
        return app
