"""The poll process's shared-memory board: a reader sees each posted body whole, in order, and a
body over the slot size is reported, not served truncated."""
from __future__ import annotations

import os
import threading

import pytest

from turboprom.snapshot_board import BoardBodyTooLarge, BoardReader, BoardWriter


def test_reader_sees_the_newest_body_and_copies_only_on_change() -> None:
    w = BoardWriter(epoch=7, capacity=1024)
    try:
        r = BoardReader(w.path)
        assert r.epoch == 7 and r.read() == (0, b"")
        w.post(1, b"one")
        w.post(2, b"two!")
        assert r.read() == (2, b"two!")
        first = r.read()[1]
        assert r.read()[1] is first  # unchanged generation: the body already held, no copy
        w.post(3, b"x" * 2000)  # over the slot: refused by the reader with the size, not cut short
        with pytest.raises(BoardBodyTooLarge, match="2000 bytes"):
            r.read()
        w.post(4, b"small again")
        assert r.read() == (4, b"small again")
        r.close()
    finally:
        w.close()
    assert not os.path.exists(w.path)


def test_concurrent_posts_never_give_a_torn_body() -> None:
    """Bodies whose every byte is the version: a torn copy would mix two versions' bytes."""
    w = BoardWriter(epoch=1, capacity=64 * 1024)
    r = BoardReader(w.path)
    stop = threading.Event()

    def write() -> None:
        v = 0
        while not stop.is_set():
            v += 1
            w.post(v, bytes([v % 251]) * (1000 + (v * 7919) % 60_000))

    t = threading.Thread(target=write)
    t.start()
    try:
        seen = set()
        last = 0
        for _ in range(20_000):
            version, body = r.read()
            assert version >= last
            last = version
            if version:
                assert body and body.count(body[:1]) == len(body) and body[0] == version % 251
                seen.add(version)
        assert len(seen) > 10
    finally:
        stop.set()
        t.join()
        r.close()
        w.close()


def test_a_read_stamps_the_board_for_the_writer() -> None:
    """The poll process's reads reach the server through the board's last-read word (same monotonic
    clock), which keeps the tracker publishing promptly while the poll port has readers."""
    import time

    w = BoardWriter(epoch=3, capacity=1024)
    try:
        assert w.last_read() == -float("inf")
        r = BoardReader(w.path)
        before = time.monotonic()
        r.read()
        assert before - 1e-6 <= w.last_read() <= time.monotonic()  # the stamp is whole microseconds
        r.close()
    finally:
        w.close()
    assert w.last_read() == -float("inf")  # closed: no readers
