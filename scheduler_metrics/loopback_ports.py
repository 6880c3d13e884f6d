"""Free loopback ports for processes started on this machine (the demo fleet's exporters, the tests'
servers and peers).

By default the kernel picks them (``bind`` to port 0). With ``TURBOPROM_PORT_RANGE=LO-HI`` in the
environment they come from that range instead, scanned from a random point: processes that run side by
side with disjoint ranges (the test suite's pytest-xdist workers) cannot be handed the same port, as
they can from the kernel between one releasing a port and a server binding it."""
from __future__ import annotations

import os
import random
import socket
import threading

_next: dict[tuple[int, int], int] = {}  # per range: where this process's next scan starts
_next_lock = threading.Lock()  # two threads of a process scanning one range must not pick the same port


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free now. Each is held until all are chosen: ports picked one at
    a time can repeat, since the kernel may hand out a port just released (two exporters of one
    fleet then failed to bind)."""
    socks: list[socket.socket] = []
    try:
        span = os.environ.get("TURBOPROM_PORT_RANGE", "")
        if not span:
            for _ in range(n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", 0))
            return [int(s.getsockname()[1]) for s in socks]
        lo, hi = (int(x) for x in span.split("-"))
        with _next_lock:
            return _scan(lo, hi, n, socks)
    finally:
        for s in socks:
            s.close()


def _scan(lo: int, hi: int, n: int, socks: list[socket.socket]) -> list[int]:
    """``n`` ports of [lo, hi) that bind now (their sockets left in ``socks``, held until the caller
    closes them), scanning on from where this process's last scan of the range ended."""
    port = _next.get((lo, hi)) or random.randrange(lo, hi)
    ports: list[int] = []
    for _ in range(hi - lo):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
        else:
            socks.append(s)
            ports.append(port)
        port = lo + (port + 1 - lo) % (hi - lo)
        if len(ports) == n:
            break
    _next[(lo, hi)] = port
    if len(ports) < n:
        raise RuntimeError(f"no {n} free loopback ports in TURBOPROM_PORT_RANGE={lo}-{hi}")
    return ports


def free_port() -> int:
    """One free loopback port (``free_ports(1)``)."""
    return free_ports(1)[0]
