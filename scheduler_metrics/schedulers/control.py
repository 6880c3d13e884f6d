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

A simulation that owns the scheduler passes ``mover``: the migration is then carried out in the
simulation's own thread (the session's KV moves over the simulated links and the holder is pinned),
and the endpoint answers only after it happened, or 503 when it did not (nothing changed).
``GET /api/v1/scheduler/actions`` lists what this endpoint applied, by idempotency key.
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable

from aiohttp import web

from scheduler_metrics.kedgeflow.action import Action
from scheduler_metrics.kedgeflow.grant import Grant, GrantError, GrantVerifier
from scheduler_metrics.kedgeflow.targets import GRANT_HEADER
from scheduler_metrics.schedulers.vesta import VestaScheduler

VERB_OF_PATH = {"migrate": "scheduler.kv_migrate", "drain": "scheduler.drain_instance"}

# (session, new holder) -> what moved, or None when the migration was not carried out
Mover = Callable[[int, int], "dict[str, Any] | None"]


class SchedulerControl:
    def __init__(self, vesta: VestaScheduler, verifier: GrantVerifier | None = None, *, allow_unsigned: bool = False,
                 mover: Mover | None = None):
        if verifier is None and not allow_unsigned:
            raise ValueError("SchedulerControl needs a GrantVerifier (the KedgeFlow public key), or allow_unsigned=True")
        self.vesta = vesta
        self.verifier = verifier
        self.mover = mover
        self.refused = 0
        self.versions: dict[int, int] = {}
        self.drained: set[int] = set()
        self.applied: dict[str, dict[str, Any]] = {}
        self.applied_at: dict[str, float] = {}
        self.commits = 0
        self._lock = threading.Lock()

    def attach(self, vesta: VestaScheduler) -> None:
        """Control a new scheduler instance (a simulation restarting its replay); drained instances stay drained."""
        with self._lock:
            vesta.drained |= self.drained
            self.vesta = vesta

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
            moved: dict[str, Any] = {}
            if self.mover is not None:
                done = self.mover(session, to)
                if done is None:
                    return 503, {"error": f"the migration of session {session} was not carried out (the simulation did not take it up); nothing changed"}
                moved = done
            else:
                self.vesta.pin_holder(session, to)  # honoured by later placements, not just recorded
            self.versions[session] = version + 1
            res = {"session": session, "holder": to, "holder_version": version + 1, **moved}
            self.applied[key] = res
            self.applied_at[key] = time.time()
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
            self.applied_at[key] = time.time()
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
            try:
                session = int(request.match_info["session"])
            except ValueError:
                return web.json_response({"error": "session must be an integer"}, status=400)
            h, v = self.holder(session)
            return web.json_response({"holder": h, "holder_version": v})

        async def get_actions(request: web.Request) -> web.Response:
            with self._lock:
                rows = [{"idempotency_key": k, "applied_at": self.applied_at.get(k), "result": r} for k, r in self.applied.items()]
                return web.json_response({"commits": self.commits, "refused": self.refused, "drained": sorted(self.drained),
                                          "applied": rows})

        app = web.Application()
        app.router.add_post("/api/v1/scheduler/migrate", handle)
        app.router.add_post("/api/v1/scheduler/drain", handle)
        app.router.add_get("/api/v1/scheduler/holders/{session}", get_holder)
        app.router.add_get("/api/v1/scheduler/actions", get_actions)
        return app


class ControlServer:
    """Serves a ``SchedulerControl`` on a loopback port from its own thread and event loop, so the
    endpoint answers while the thread that owns the scheduler (a simulation) is busy."""

    def __init__(self, control: SchedulerControl, port: int, host: str = "127.0.0.1"):
        self.control, self.host, self.port = control, host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> None:
        started = threading.Event()
        failed: list[BaseException] = []
        loop = self._loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            runner = web.AppRunner(self.control.app(), access_log=None)
            try:
                loop.run_until_complete(runner.setup())
                loop.run_until_complete(web.TCPSite(runner, self.host, self.port).start())
            except BaseException as e:  # noqa: BLE001 - reported to start()
                failed.append(e)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="scheduler-control", daemon=True)
        self._thread.start()
        if not started.wait(timeout_s):
            raise RuntimeError(f"scheduler control endpoint did not start on {self.url} within {timeout_s:g} s")
        if failed:
            raise RuntimeError(f"scheduler control endpoint could not listen on {self.url}: {failed[0]}")

    def close(self, timeout_s: float = 10.0) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
