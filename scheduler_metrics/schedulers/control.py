"""A scheduler's control endpoint: the target KedgeFlow dispatches approved scheduler actions to.

``POST /api/v1/scheduler/migrate`` moves a session's KV holdership (Vesta's bucket-change prefix
move, or an operator-initiated migration) and ``POST /api/v1/scheduler/drain`` stops placing new
work on an instance. Both commit conditionally: the ``Idempotency-Key`` (the grant's allowance id)
must not have been applied before (409 otherwise), and a migration's ``expected_holder_version`` must
equal the session's current holder version (412 otherwise), so a stale or replayed action changes nothing.
"""
from __future__ import annotations

import threading
from typing import Any

from aiohttp import web

from scheduler_metrics.schedulers.vesta import VestaScheduler


class SchedulerControl:
    def __init__(self, vesta: VestaScheduler):
        self.vesta = vesta
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

    def app(self) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            key = request.headers.get("Idempotency-Key", "")
            if not key:
                return web.json_response({"error": "Idempotency-Key header required"}, status=400)
            body = await request.json()
            params = body.get("params", {}) if isinstance(body, dict) else {}
            fn = self.migrate if request.path.endswith("/migrate") else self.drain
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
