"""vLLM KV-cache events over ZMQ (``--kv-events-config``): decoder and subscriber.

Wire format (vLLM's ``ZmqEventPublisher``): a PUB socket sends three-frame messages
``[topic, seq, payload]``; ``seq`` is an 8-byte big-endian counter per publisher, ``payload`` a
msgpack ``KVEventBatch`` encoded by msgspec with ``array_like=True``: ``[ts, events]`` or
``[ts, events, data_parallel_rank]``. Each event is a tagged array whose first element names it:

    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, ...]
    ["BlockRemoved", block_hashes, medium]
    ["AllBlocksCleared"]

Block hashes are ints (older vLLM) or bytes (sha256-based hashing); both become uint64 here (an
int masked to 64 bits, bytes by their first 8 bytes). Trailing fields newer vLLM versions add are
ignored; ``omit_defaults`` may drop trailing defaults, so missing trailing fields read as None.

The subscriber runs one thread with one SUB socket per configured endpoint; each endpoint is bound
to the identity labels (cluster, model_name, instance) of the engine behind it, since the events
themselves do not say who sent them. Decoded events go to ``handle(endpoint, events, seq_gap)``
(the prefix index); ingest does not know what consumes them.

Replay (vLLM's ``replay_endpoint``, a ROUTER socket in front of the publisher's buffer of its last
``buffer_steps`` batches): on a sequence gap the subscriber sends the first missing sequence number
(8 bytes, big-endian) from a DEALER socket and applies the batches that come back,
``[seq, payload]`` each, up to the end marker ``[-1, b""]``, before the live batch that revealed the
gap. A subscriber that joins a running engine (first batch with ``seq > 0``) asks for everything
still buffered the same way. What the buffer no longer holds, or what does not come back within
``replay_timeout_s``, is counted as missed and passed on, so the consumer can treat that instance's
view as incomplete.

Hand-written on purpose: pyzmq and msgpack do the transport and decoding; what is left is the
positional layout above, which no library on PyPI decodes without depending on vLLM itself.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import msgpack
import zmq
from prometheus_client import Counter

log = logging.getLogger("turboprom.kv_events")

EVENTS = Counter("turboprom_kv_events_total", "vLLM KV-cache events received, by kind.", ["kind"])
GAPS = Counter("turboprom_kv_events_missed_batches_total", "Event batches missed (sequence gaps) per endpoint.",
               ["endpoint"])
BAD = Counter("turboprom_kv_events_undecodable_total", "Messages that were not vLLM KV event batches.")
REPLAYED = Counter("turboprom_kv_events_replayed_batches_total",
                   "Event batches recovered from a publisher's replay socket after a sequence gap, per endpoint.",
                   ["endpoint"])
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # vLLM's end-of-replay marker

_MASK64 = (1 << 64) - 1


def block_hash64(h: Any) -> int:
    """An engine block hash (int, or bytes for sha256-based hashing) as an unsigned 64-bit int."""
    if isinstance(h, (bytes, bytearray, memoryview)):
        return int.from_bytes(bytes(h[:8]).ljust(8, b"\0"), "big")
    return int(h) & _MASK64


@dataclass(frozen=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass
class EventBatch:
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


class KVEventFormatError(ValueError):
    pass


def _field(a: list, i: int) -> Any:
    return a[i] if len(a) > i else None


def decode_event(raw: Any) -> KVEvent | None:
    """One tagged event array; None for a tag this decoder does not know (newer event kinds)."""
    if not isinstance(raw, (list, tuple)) or not raw or not isinstance(raw[0], (str, bytes)):
        raise KVEventFormatError(f"event is not a tagged array: {raw!r:.80}")
    tag = raw[0].decode() if isinstance(raw[0], bytes) else raw[0]
    if tag == "BlockStored":
        hashes = tuple(block_hash64(h) for h in (_field(raw, 1) or ()))
        parent = _field(raw, 2)
        tokens = tuple(int(t) for t in (_field(raw, 3) or ()))
        size = int(_field(raw, 4) or 0)
        if size <= 0 or len(tokens) != size * len(hashes):
            raise KVEventFormatError(f"BlockStored with {len(hashes)} blocks of size {size} carries {len(tokens)} tokens")
        lora = _field(raw, 5)
        medium = _field(raw, 6)
        return BlockStored(hashes, None if parent is None else block_hash64(parent), tokens, size,
                           None if lora is None else int(lora), None if medium is None else str(medium))
    if tag == "BlockRemoved":
        medium = _field(raw, 2)
        return BlockRemoved(tuple(block_hash64(h) for h in (_field(raw, 1) or ())), None if medium is None else str(medium))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def decode_batch(payload: bytes) -> EventBatch:
    """A msgpack ``KVEventBatch`` payload."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:  # noqa: BLE001 - msgpack raises several types for bad input
        raise KVEventFormatError(f"payload is not msgpack: {e}") from None
    if not isinstance(raw, (list, tuple)) or len(raw) < 2 or not isinstance(raw[1], (list, tuple)):
        raise KVEventFormatError(f"payload is not an event batch [ts, events, ...]: {raw!r:.80}")
    events = [e for e in (decode_event(x) for x in raw[1]) if e is not None]
    dp = _field(list(raw), 2)
    return EventBatch(float(raw[0]), events, None if dp is None else int(dp))


@dataclass(frozen=True)
class KVEventEndpoint:
    """One engine's publisher: where to connect, which topic, and who it is."""

    endpoint: str  # e.g. tcp://10.0.0.7:5557
    instance: str
    cluster: str = ""
    model_name: str = ""
    topic: str = ""  # ZMQ subscription prefix ("" = everything)
    replay_endpoint: str = ""  # the publisher's ROUTER for missed batches ("" = none)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.cluster, self.model_name, self.instance)


@dataclass
class _EndpointState:
    spec: KVEventEndpoint
    last_seq: int = -1
    batches: int = 0
    missed: int = 0
    replayed: int = 0
    last_event_at: float = 0.0
    errors: list[str] = field(default_factory=list)


Handler = Callable[[KVEventEndpoint, EventBatch, int], None]  # (endpoint, batch, batches missed before it)


class KVEventSubscriber:
    """Connects a SUB socket to every endpoint and hands decoded batches to ``handle`` (own thread)."""

    def __init__(self, endpoints: list[KVEventEndpoint], handle: Handler, *, poll_ms: int = 100,
                 replay_timeout_s: float = 1.0) -> None:
        self.endpoints = endpoints
        self.handle = handle
        self.poll_ms = poll_ms
        self.replay_timeout_s = replay_timeout_s
        self._replay_socks: dict[str, zmq.Socket] = {}
        self.state = {e.endpoint: _EndpointState(e) for e in endpoints}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context | None = None

    def start(self) -> None:
        if self._thread is not None or not self.endpoints:
            return
        self._stop.clear()
        self._ctx = zmq.Context()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="kv-events", daemon=True)
        self._thread.start()
        ready.wait(5)

    def stop(self) -> None:
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout=5)
        # term() waits for every socket to close: only once the thread that owns them has ended
        if self._ctx is not None and (t is None or not t.is_alive()):
            self._ctx.term()
            self._ctx = None

    def _run(self, ready: threading.Event) -> None:
        assert self._ctx is not None
        poller = zmq.Poller()
        socks: dict[zmq.Socket, _EndpointState] = {}
        for st in self.state.values():
            s = self._ctx.socket(zmq.SUB)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVHWM, 100_000)
            s.setsockopt_string(zmq.SUBSCRIBE, st.spec.topic)
            s.connect(st.spec.endpoint)
            poller.register(s, zmq.POLLIN)
            socks[s] = st
        ready.set()
        try:
            while not self._stop.is_set():
                for s, _ in poller.poll(self.poll_ms):
                    st = socks[s]
                    while not self._stop.is_set():  # a busy publisher must not keep the thread from stopping
                        try:
                            frames = s.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._one(st, frames)
        finally:
            for s in socks:
                s.close(0)
            for s in self._replay_socks.values():
                s.close(0)
            self._replay_socks.clear()

    def _decode(self, st: _EndpointState, payload: bytes) -> EventBatch | None:
        try:
            return decode_batch(payload)
        except KVEventFormatError as e:
            BAD.inc()
            if len(st.errors) < 5:
                st.errors.append(str(e))
            log.warning("kv events from %s: %s", st.spec.endpoint, e)
            return None

    def _one(self, st: _EndpointState, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            BAD.inc()
            return
        seq = int.from_bytes(frames[1], "big")
        batch = self._decode(st, frames[2])
        if batch is None:
            return
        gap = seq > st.last_seq + 1 if st.last_seq >= 0 else seq > 0
        if gap and st.spec.replay_endpoint:
            self._replay(st, seq)
        # without replay a late join is not a gap (nothing was expected yet); with it, what the
        # publisher no longer buffered is
        missed = seq - st.last_seq - 1 if seq > st.last_seq + 1 and (st.last_seq >= 0 or st.spec.replay_endpoint) else 0
        if st.last_seq >= seq:
            return  # replay already delivered it (it arrived live while the replay ran)
        self._deliver(st, seq, batch, missed)

    def _deliver(self, st: _EndpointState, seq: int, batch: EventBatch, missed: int) -> None:
        if missed:
            st.missed += missed
            GAPS.labels(st.spec.endpoint).inc(missed)
        st.last_seq = seq
        st.batches += 1
        st.last_event_at = time.time()
        for ev in batch.events:
            EVENTS.labels(type(ev).__name__).inc()
        try:
            self.handle(st.spec, batch, missed)
        except Exception:  # noqa: BLE001 - a consumer error must not stop the subscriber
            log.exception("kv event handler failed for %s", st.spec.endpoint)

    def _replay(self, st: _EndpointState, until: int) -> None:
        """Batches ``last_seq + 1 .. until - 1`` from the publisher's replay socket, applied in order;
        a gap inside what comes back (the buffer's horizon) is passed on as missed."""
        assert self._ctx is not None
        sock = self._replay_socks.get(st.spec.endpoint)
        if sock is None:
            sock = self._replay_socks[st.spec.endpoint] = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(st.spec.replay_endpoint)
        start = st.last_seq + 1
        try:
            sock.send_multipart([b"", start.to_bytes(8, "big")], zmq.NOBLOCK)
        except zmq.Again:
            return
        deadline = time.monotonic() + self.replay_timeout_s
        got = 0
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000) + 1):
                # no answer in time: drop the socket so a late answer cannot end the next replay early
                log.warning("kv events replay from %s timed out after %d batches", st.spec.replay_endpoint, got)
                sock.close(0)
                del self._replay_socks[st.spec.endpoint]
                break
            frames = sock.recv_multipart()
            if frames and frames[0] == b"":
                frames = frames[1:]
            if len(frames) != 2 or len(frames[0]) != 8:
                BAD.inc()
                continue
            if frames[0] == END_SEQ:
                break
            seq = int.from_bytes(frames[0], "big")
            if seq <= st.last_seq or seq >= until:
                continue  # already applied, or the live stream brings it
            batch = self._decode(st, frames[1])
            if batch is None:
                continue
            self._deliver(st, seq, batch, seq - st.last_seq - 1)  # last_seq starts at -1: a replay starts at 0
            got += 1
        if got:
            st.replayed += got
            REPLAYED.labels(st.spec.endpoint).inc(got)

    def status(self) -> list[dict[str, Any]]:
        return [{"endpoint": st.spec.endpoint, "instance": st.spec.instance, "cluster": st.spec.cluster,
                 "model_name": st.spec.model_name, "topic": st.spec.topic, "batches": st.batches,
                 "missed_batches": st.missed, "replayed_batches": st.replayed, "last_seq": st.last_seq,
                 "last_event_at": st.last_event_at or None, "errors": list(st.errors)} for st in self.state.values()]
