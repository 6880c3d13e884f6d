"""What a request scheduler sees and decides."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np


@dataclass
class RequestView:
    idx: int
    session: int
    input_tokens: int
    output_tokens: int
    reuse_tokens: int  # prefix tokens shared with the session's earlier turns (0 for a new session)


@dataclass
class ClusterView:
    """Signals as the scheduler sees them (possibly a few hundred ms old) plus cache placement.

    ``backlog_s``: unfinished prefill work per instance in seconds; ``queue_len``/``running``:
    requests; ``kv_usage``: 0..1; ``price``: the cluster congestion price in seconds of delay imposed
    on later requests per added token of work (TurboProm's congestion API); ``service_tps``: measured
    prefill service rate per instance (tokens/s).
    """

    n: int
    backlog_s: np.ndarray
    queue_len: np.ndarray
    running: np.ndarray
    kv_usage: np.ndarray
    price: float
    service_tps: np.ndarray
    candidates: np.ndarray  # instance indices that may execute (prefill-capable)
    cached_tokens: Callable[[int, int], int]  # (instance, session) -> KV tokens of that session held there (any tier)
    prefill_time: Callable[[np.ndarray, np.ndarray], np.ndarray]  # (tokens, running) -> seconds, vectorized
    transfer_time: Callable[[float], float]  # tokens -> seconds over a cross-node link (no waiting)
    nic_wait_s: np.ndarray  # per instance: seconds until its NIC is free
    signal_time: float = 0.0  # when the signals in this view were produced
    # Tiers and links, for schedulers that price KV movement (Vesta). Defaults keep simple views valid.
    gpu_cached: Callable[[int, int], int] | None = None  # (instance, session) -> tokens in its GPU prefix cache
    host_cached: Callable[[int, int], int] | None = None  # (instance, session) -> tokens in its host KV store
    h2d_time: Callable[[np.ndarray], np.ndarray] | None = None  # tokens -> seconds host DRAM -> GPU, vectorized
    # (src, dsts, tokens per dst) -> seconds for the KV to arrive at each dst, including waiting for
    # every link crossed (0 where dst == src or tokens == 0)
    fetch_time: Callable[[int, np.ndarray, np.ndarray], np.ndarray] | None = None
    # (src, dsts) -> seconds of delay imposed on later transfers per second of link time added on that path
    link_price: Callable[[int, np.ndarray], np.ndarray] | None = None


@dataclass
class Decision:
    executor: int
    kv_source: int = -1  # instance whose KV for this session is reused (-1: none)
    holder: int = -1  # where the session's KV lives after this turn (-1: the executor)
    migrate_from: int = -1  # holder change: move the reusable prefix from here to ``holder`` first
    fetch: bool = True  # reuse ``kv_source``'s prefix over the network (False: recompute what is not local)
    penalty_s: float = 0.0  # congestion penalty applied to the chosen executor (for metrics)


class Scheduler(Protocol):
    name: str

    def choose(self, req: RequestView, cluster: ClusterView) -> Decision: ...


def stable_hash(session: int, salt: str = "") -> int:
    """Process-independent hash of a session id (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(f"{salt}{session}".encode(), digest_size=8).digest(), "little")


class PendingWork:
    """Work this scheduler assigned since the signals it sees were produced.

    Congestion signals refresh every few hundred ms; without this, every request in between would
    pile onto the same momentarily idle instance (a thundering herd). Reset when fresh signals arrive.
    """

    def __init__(self) -> None:
        self._t = float("nan")
        self._added: np.ndarray | None = None
        self._count: np.ndarray | None = None

    def _sync(self, cl: ClusterView) -> None:
        if self._added is None or cl.signal_time != self._t or len(self._added) != cl.n:
            self._t = cl.signal_time
            self._added = np.zeros(cl.n)
            self._count = np.zeros(cl.n)

    def backlog(self, cl: ClusterView) -> np.ndarray:
        self._sync(cl)
        return cl.backlog_s + self._added

    def queue(self, cl: ClusterView) -> np.ndarray:
        """Queue length as seen in the signals plus requests assigned since."""
        self._sync(cl)
        return cl.queue_len + self._count

    def add(self, instance: int, seconds: float) -> None:
        if self._added is not None:
            self._added[instance] += seconds
            self._count[instance] += 1
