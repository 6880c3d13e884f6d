"""KV-cache events of a simulated engine, published as vLLM publishes them (``--kv-events-config``).

The demo's simulated instances keep a GPU prefix cache per session (``InstanceState.gpu``: session ->
cached tokens, LRU). ``SessionKVPublisher.sync`` turns changes of that map into vLLM's events:
``BlockStored`` for the blocks a session gained (chained to its previous last block), ``BlockRemoved``
for the blocks it lost or of a session evicted. The wire format is vLLM's ``ZmqEventPublisher``: a PUB
socket sending ``[topic, 8-byte big-endian seq, msgpack [ts, events]]``, and a ROUTER replay socket
answering ``[id, b"", start_seq]`` with every buffered batch from ``start_seq`` on, then the
end marker ``-1``. The trace carries no token ids, so a session's prompt tokens are a deterministic
function of the session id (``session_tokens``), which a scheduler asking TurboProm's prefix view
computes the same way.

Hand-written on purpose: vLLM's own publisher needs vLLM installed; pyzmq and msgpack do the work.
"""
from __future__ import annotations

import time
import weakref
from collections import deque
from typing import Mapping

import msgpack
import numpy as np
import zmq

BLOCK_TOKENS = 64  # tokens per KV block of the simulated engines (a vLLM --block-size choice)
_VOCAB = 151_936  # Qwen2.5's vocabulary size: token ids stay in range
_END_SEQ = (-1).to_bytes(8, "big", signed=True)


def session_tokens(session: int, n: int) -> list[int]:
    """The first ``n`` prompt token ids of ``session`` in the demo (every turn extends the last)."""
    return ((np.arange(n, dtype=np.int64) * 7_919 + session * 1_000_003) % _VOCAB).tolist()


def block_hash(session: int, block: int) -> int:
    """The simulated engine's hash of a session's ``block``-th block (unique per session and block)."""
    return (session << 24) | block


class SessionKVPublisher:
    """One engine's publisher. ``endpoint`` and ``replay_endpoint`` may name port ``*``: the sockets are
    bound here (on a port the kernel picks), and ``self.endpoint``/``self.replay_endpoint`` say where.
    Binding at construction means no other socket can take the port between choosing and binding it."""

    def __init__(self, endpoint: str = "tcp://127.0.0.1:*", replay_endpoint: str = "tcp://127.0.0.1:*", *,
                 topic: str = "kv-events", buffer_steps: int = 1_000) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.replay = self.ctx.socket(zmq.ROUTER)
        # closes the sockets before terminating the context, whoever drops the last reference: a zmq
        # context left to its own __del__ with a socket open waits in term() for ever
        self._finalize = weakref.finalize(self, _close_zmq, self.ctx, self.pub, self.replay)
        try:
            for sock, at in ((self.pub, endpoint), (self.replay, replay_endpoint)):
                sock.setsockopt(zmq.LINGER, 0)
                sock.bind(at)
        except zmq.ZMQError:
            self.close()
            raise
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = self.replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self.topic = topic.encode()
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.blocks: dict[int, int] = {}  # session -> full blocks announced

    def sync(self, gpu: Mapping[int, float]) -> int:
        """Publish what changed in ``gpu`` (session -> cached tokens) since the last call, as one batch;
        answer waiting replay requests. Returns the number of events sent."""
        events: list[list] = []
        for session in [s for s in self.blocks if s not in gpu]:
            n = self.blocks.pop(session)
            events.append(["BlockRemoved", [block_hash(session, b) for b in range(n)], "GPU"])
        for session, tokens in gpu.items():
            n_new = int(tokens) // BLOCK_TOKENS
            n_old = self.blocks.get(session, 0)
            if n_new > n_old:
                toks = session_tokens(session, n_new * BLOCK_TOKENS)[n_old * BLOCK_TOKENS:]
                parent = block_hash(session, n_old - 1) if n_old else None
                events.append(["BlockStored", [block_hash(session, b) for b in range(n_old, n_new)], parent, toks,
                               BLOCK_TOKENS, None, "GPU"])
            elif n_new < n_old:
                events.append(["BlockRemoved", [block_hash(session, b) for b in range(n_new, n_old)], "GPU"])
            if n_new:
                self.blocks[session] = n_new
            else:
                self.blocks.pop(session, None)
        if events:
            payload = msgpack.packb([time.time(), events])
            self.pub.send_multipart([self.topic, self.seq.to_bytes(8, "big"), payload])
            self.buffer.append((self.seq, payload))
            self.seq += 1
        self._serve_replay()
        return len(events)

    def _serve_replay(self) -> None:
        while self.replay.poll(0):
            frames = self.replay.recv_multipart()
            if len(frames) != 3:
                continue
            ident, _, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, payload in self.buffer:
                if seq >= start_seq:
                    self.replay.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
            self.replay.send_multipart([ident, b"", _END_SEQ, b""])

    def close(self) -> None:
        """Close both sockets and the context (idempotent)."""
        self._finalize()


def _close_zmq(ctx: zmq.Context, *socks: zmq.Socket) -> None:
    for sock in socks:
        sock.close(0)
    ctx.term()
