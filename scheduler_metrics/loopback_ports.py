"""Free loopback ports for processes started on this machine (the demo fleet's exporters, the tests'
servers and peers)."""
from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free now. Each is held until all are chosen: ports picked one at
    a time can repeat, since the kernel may hand out a port just released (two exporters of one
    fleet then failed to bind)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
