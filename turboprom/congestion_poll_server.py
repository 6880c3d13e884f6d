"""The congestion poll endpoint served by its own process (``congestion.poll_listen``).

Why: in the server process a poll waits for the GIL and the event loop behind ingest decoding,
storage appends and query evaluation, so its tail latency follows whatever else runs. Here the
tracker (in the server process) posts every new snapshot's pre-encoded body to a shared-memory board
(``turboprom/snapshot_board.py``: a memcpy into a double buffer, no pipe, no wake-up of the child);
the child answers ``GET /api/v1/congestion`` (same filters, JSON and ``ETag``/``If-None-Match`` as the
main server's) from its own event loop and its own GIL. With ``kv_events`` configured it also
subscribes to the engines' KV events itself and answers ``POST /api/v1/congestion/prefix`` (its own
prefix index, the board's load), so an event is visible without a hop through the server process. An unfiltered poll of an unchanged snapshot
reads one 8-byte word from the board and sends the body it already holds; a new snapshot costs one
copy; only a filtered poll decodes the body (once per snapshot, filtered bodies cached).

Scope: this port serves those read-only views of the default tenant, nothing else. It applies the
main server's web config (``--web.config.file``): the same users, roles (``read``), tenant limits and
TLS, and the same listen guard (a non-loopback address needs auth or ``--insecure``). A caller
naming another tenant (X-Scope-OrgID) gets the empty view, as on the main server.
"""
from __future__ import annotations

import gc
import logging
import multiprocessing as mp
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from turboprom.snapshot_board import BoardBodyTooLarge, BoardReader, BoardWriter

log = logging.getLogger("turboprom.congestion")


@dataclass(frozen=True)
class PollSettings:
    """What the child needs of the server's configuration (picklable: the child is spawned)."""

    host: str
    port: int
    board: str
    web_config_file: str | None = None
    auth_limits: dict[str, Any] | None = None
    web_timeouts: dict[str, Any] | None = None  # the server YAML's ``web:`` section (read/idle timeouts)
    kv_events: tuple[dict[str, str], ...] = ()  # congestion.kv_events: this process subscribes too
    kv_max_blocks_per_instance: int = 1_000_000


def _serve(settings: PollSettings, ready: Any) -> None:
    """Child process: serve the board over HTTP until killed (or the server is gone)."""
    import asyncio
    import sys

    import orjson
    from aiohttp import web

    from scheduler_metrics.congestion.tracker import CongestionSnapshot
    from turboprom.api_errors import ParamError, error_response
    from turboprom.http_guard import GuardedAppRunner, Timeouts
    from turboprom.routes.congestion_api import _filters, _tenant_snapshot, not_modified, prefix_response, snapshot_etag
    from turboprom.tenancy import DEFAULT_TENANT

    reader = BoardReader(settings.board)
    decoded: list[CongestionSnapshot | None] = [None]  # the newest snapshot, decoded on first filtered poll

    def snapshot_of(version: int, body: bytes) -> CongestionSnapshot:
        snap = decoded[0]
        if snap is None or snap.version != version:
            data = orjson.loads(body)["data"]
            snap = CongestionSnapshot(data["version"], data["generated_at"], data["instances"], data["clusters"],
                                      data["model"])
            snap.body = body
            decoded[0] = snap
        return snap

    def current() -> CongestionSnapshot:
        try:
            return snapshot_of(*reader.read())
        except BoardBodyTooLarge:
            return CongestionSnapshot(0, time.time(), [], [], {})

    # The prefix view from this process's own subscription to the engines' KV events: an event is
    # visible here without waiting for the server process's GIL (a PUB socket serves both subscribers).
    index = None
    if settings.kv_events:
        from ingest.kv_events import KVEventEndpoint, KVEventSubscriber
        from scheduler_metrics.congestion.prefix_index import PrefixIndex
        from turboprom.kv_events_adapter import apply_batch

        sys.setswitchinterval(0.001)  # the subscriber thread must not hold the GIL 5 ms at a time
        index = PrefixIndex(settings.kv_max_blocks_per_instance)
        endpoints = [KVEventEndpoint(**e) for e in settings.kv_events]
        KVEventSubscriber(endpoints, lambda ep, b, missed: apply_batch(index, ep, b, missed)).start()

    parent_pid = os.getppid()

    def watch_parent() -> None:  # the server was killed (no stop()): do not outlive it
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()

    async def congestion(request: web.Request) -> web.StreamResponse:
        try:
            f = _filters(request)
        except ParamError as e:
            return error_response("bad_data", str(e))
        try:
            version, body = reader.read()
        except BoardBodyTooLarge as e:
            return error_response("unavailable", str(e))
        if f["tenant"] != DEFAULT_TENANT:
            snap = _tenant_snapshot(snapshot_of(version, body))
            return web.Response(body=snap.body_for(f["cluster"], f["model_name"], f["instance"], f["include_stale"]),
                                content_type="application/json")
        etag = snapshot_etag(reader.epoch, version)
        headers = {"ETag": etag, "Cache-Control": "no-cache"}
        if not_modified(request, etag):
            return web.Response(status=304, headers=headers)
        if f["cluster"] or f["model_name"] or f["instance"] or not f["include_stale"]:
            body = snapshot_of(version, body).body_for(f["cluster"], f["model_name"], f["instance"],
                                                       f["include_stale"])
        return web.Response(body=body, content_type="application/json", headers=headers)

    async def main() -> None:
        middlewares = []
        ssl_ctx = None
        if settings.web_config_file:
            from turboprom.auth import Authenticator, WebConfig, auth_middleware

            cfg = WebConfig.load(settings.web_config_file)
            if cfg.auth_enabled:
                middlewares.append(auth_middleware(Authenticator(cfg, settings.auth_limits)))
            ssl_ctx = cfg.ssl_context()
        app = web.Application(middlewares=middlewares)
        app.router.add_get("/api/v1/congestion", congestion)
        if index is not None:
            async def prefix(request: web.Request) -> web.StreamResponse:
                return await prefix_response(request, index, current, None)

            app.router.add_post("/api/v1/congestion/prefix", prefix)
        runner = GuardedAppRunner(app, Timeouts.from_config({"web": settings.web_timeouts or {}}), access_log=None,
                                  handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, settings.host, settings.port, ssl_context=ssl_ctx)
        await site.start()
        # Everything allocated so far lives as long as the process: keep the collector from walking it.
        gc.collect()
        gc.freeze()
        ready.send(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


class CongestionPollServer:
    """Started and stopped with the server's components; ``port`` is the bound port once started."""

    def __init__(self, tracker: Any, listen: str, *, web_config_file: str | None = None,
                 auth_limits: dict[str, Any] | None = None, web_timeouts: dict[str, Any] | None = None) -> None:
        host, _, port = listen.rpartition(":")
        self.host, self.port = host or "127.0.0.1", int(port)
        self.tracker = tracker
        self.web_config_file = web_config_file
        self.auth_limits = auth_limits
        self.web_timeouts = web_timeouts
        self._proc: Any = None
        self._board: BoardWriter | None = None
        self._unsubscribe: Any = None
        self._warned_large = False

    def start(self) -> None:
        if self._proc is not None:
            return
        self._board = BoardWriter(epoch=self.tracker.epoch)
        self._publish(self.tracker.snapshot())
        # A relay, not a reader: the poll port's own readers stamp the board, and keep the tracker prompt.
        unsubscribe = self.tracker.subscribe(self._publish, reader=False)
        remove_clock = self.tracker.add_reader_clock(self._board.last_read)

        def detach() -> None:
            unsubscribe()
            remove_clock()

        self._unsubscribe = detach
        cfg = self.tracker.config
        settings = PollSettings(self.host, self.port, self._board.path, self.web_config_file, self.auth_limits,
                                self.web_timeouts, tuple(cfg.kv_events), cfg.kv_max_blocks_per_instance)
        mpc = mp.get_context("spawn")
        parent, child = mpc.Pipe()
        self._proc = mpc.Process(target=_serve, args=(settings, child), name="congestion-poll-server", daemon=True)
        self._proc.start()
        if not parent.poll(60):
            self.stop()
            raise RuntimeError(f"congestion poll server did not start on {self.host}:{self.port}")
        self.port = parent.recv()
        log.info("congestion poll server on %s:%d (pid %d)", self.host, self.port, self._proc.pid)

    def _publish(self, snap: Any) -> None:
        board = self._board
        if board is None:
            return
        if len(snap.body) > board.capacity and not self._warned_large:
            self._warned_large = True
            log.warning("congestion snapshot of %d bytes does not fit the poll process's board (%d bytes): "
                        "the poll port answers 503 until it shrinks", len(snap.body), board.capacity)
        board.post(snap.version, snap.body)

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            proc.join(10)
        board, self._board = self._board, None
        if board is not None:
            board.close()
