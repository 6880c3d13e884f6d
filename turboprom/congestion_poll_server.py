"""The congestion poll endpoint served by its own process (``congestion.poll_listen``).

Why: in the server process a poll waits for the GIL and the event loop behind ingest decoding,
storage appends and query evaluation, so its tail latency follows whatever else runs. Here the
tracker (in the server process) hands every new snapshot's pre-encoded body to a child process
over a ZMQ PUSH socket with ``ZMQ_CONFLATE`` (only the newest snapshot is ever queued; the send is a
copy with the GIL released); the child decodes it once and answers ``GET /api/v1/congestion`` (same
filters and JSON as the main server's) from its own event loop and its own GIL.

Scope: this port serves that one read-only view of the default tenant, nothing else: no auth of
the main server applies, so it binds to loopback unless told otherwise and is off by default. A
caller naming another tenant (X-Scope-OrgID) gets the empty view, as on the main server.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time
from typing import Any

import zmq

log = logging.getLogger("turboprom.congestion")


def _serve(host: str, port: int, feed: str, ready: Any) -> None:
    """Child process: PULL snapshots, serve them over HTTP until killed."""
    import asyncio

    import orjson
    from aiohttp import web

    from scheduler_metrics.congestion.tracker import CongestionSnapshot
    from turboprom.routes.congestion_api import BadParam, _error, _filters, _tenant_snapshot
    from turboprom.tenancy import DEFAULT_TENANT

    current: list[CongestionSnapshot] = [CongestionSnapshot(0, 0.0, [], [], {})]

    def receive() -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.CONFLATE, 1)
        sock.connect(feed)
        while True:
            body = sock.recv()
            data = orjson.loads(body)["data"]
            snap = CongestionSnapshot(data["version"], data["generated_at"], data["instances"], data["clusters"],
                                      data["model"])
            snap.body = body
            current[0] = snap

    threading.Thread(target=receive, name="congestion-feed", daemon=True).start()
    parent_pid = os.getppid()

    def watch_parent() -> None:  # the server was killed (no stop()): do not outlive it
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()

    async def congestion(request: web.Request) -> web.StreamResponse:
        try:
            f = _filters(request)
        except BadParam as e:
            return _error(400, "bad_data", str(e))
        snap = current[0] if f["tenant"] == DEFAULT_TENANT else _tenant_snapshot(current[0])
        return web.Response(body=snap.body_for(f["cluster"], f["model_name"], f["instance"], f["include_stale"]),
                            content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/api/v1/congestion", congestion)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        ready.send(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


class CongestionPollServer:
    """Started and stopped with the server's components; ``port`` is the bound port once started."""

    def __init__(self, tracker: Any, listen: str) -> None:
        host, _, port = listen.rpartition(":")
        self.host, self.port = host or "127.0.0.1", int(port)
        self.tracker = tracker
        self._proc: Any = None
        self._ctx: zmq.Context | None = None
        self._push: zmq.Socket | None = None
        self._unsubscribe: Any = None
        self._send_lock = threading.Lock()

    def start(self) -> None:
        if self._proc is not None:
            return
        self._ctx = zmq.Context()
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.CONFLATE, 1)
        self._push.setsockopt(zmq.LINGER, 0)
        feed_port = self._push.bind_to_random_port("tcp://127.0.0.1")
        mpc = mp.get_context("spawn")
        parent, child = mpc.Pipe()
        self._proc = mpc.Process(target=_serve, args=(self.host, self.port, f"tcp://127.0.0.1:{feed_port}", child),
                                 name="congestion-poll-server", daemon=True)
        self._proc.start()
        if not parent.poll(60):
            raise RuntimeError(f"congestion poll server did not start on {self.host}:{self.port}")
        self.port = parent.recv()
        self._unsubscribe = self.tracker.subscribe(self._publish)
        self._publish(self.tracker.snapshot())
        log.info("congestion poll server on %s:%d (pid %d)", self.host, self.port, self._proc.pid)

    def _publish(self, snap: Any) -> None:
        push = self._push
        if push is None:
            return
        with self._send_lock:  # zmq sockets are not thread-safe (refresher thread vs start)
            try:
                push.send(snap.body, zmq.NOBLOCK, copy=True)
            except zmq.Again:  # the child is not connected yet: the next rebuild sends again
                pass

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            proc.join(10)
        with self._send_lock:
            if self._push is not None:
                self._push.close(0)
                self._push = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
