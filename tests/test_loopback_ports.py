"""The loopback port picker: from the kernel, or from ``TURBOPROM_PORT_RANGE`` (what `make test` gives each
pytest-xdist worker so two workers' servers are never handed the same port)."""
from __future__ import annotations

import socket
import threading

from scheduler_metrics.loopback_ports import free_port, free_ports


def test_ports_from_the_kernel_are_distinct_and_bindable(monkeypatch) -> None:
    monkeypatch.delenv("TURBOPROM_PORT_RANGE", raising=False)
    ports = free_ports(8)
    assert len(set(ports)) == 8
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_range_is_scanned_on_from_the_last_pick_and_skips_taken_ports(monkeypatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        lo = taken.getsockname()[1]
        monkeypatch.setenv("TURBOPROM_PORT_RANGE", f"{lo}-{lo + 40}")
        got = free_ports(5) + free_ports(5) + [free_port()]
        assert len(set(got)) == 11 and lo not in got
        assert all(lo < p < lo + 40 for p in got)


def test_threads_scanning_one_range_get_distinct_ports(monkeypatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        lo = s.getsockname()[1] + 1
    monkeypatch.setenv("TURBOPROM_PORT_RANGE", f"{lo}-{lo + 200}")
    out: list[int] = []
    lock = threading.Lock()

    def pick() -> None:
        got = free_ports(4)
        with lock:
            out.extend(got)

    threads = [threading.Thread(target=pick) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 32 and len(set(out)) == 32
