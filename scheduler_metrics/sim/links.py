"""Per-link reservation timelines for the cluster simulator.

A link (a node's NIC, a GPU's NVLink port) holds the busy intervals already reserved on it, in time
order. A transfer needs a gap of its duration on every link it crosses, at or after the moment its
data is available; it takes the earliest such gap, so a write-back that can only start when a decode
ends does not block a fetch issued now (reserving at issue time would). Hand-written because it is a
few lines of interval bookkeeping specific to the simulator; no library models this.
"""
from __future__ import annotations

from bisect import bisect_right


class LinkTimeline:
    """Non-overlapping busy intervals ``[start, end)`` of one link, sorted by start."""

    __slots__ = ("starts", "ends", "busy_s")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.busy_s = 0.0  # total reserved time (for utilization counters)

    def conflict_end(self, t: float, dur: float) -> float | None:
        """End of a busy interval overlapping ``[t, t + dur)``, or None when that window is free."""
        k = bisect_right(self.starts, t) - 1
        if k >= 0 and self.ends[k] > t:
            return self.ends[k]
        k += 1
        if k < len(self.starts) and self.starts[k] < t + dur:
            return self.ends[k]
        return None

    def add(self, t: float, dur: float) -> None:
        k = bisect_right(self.starts, t)
        self.starts.insert(k, t)
        self.ends.insert(k, t + dur)
        self.busy_s += dur

    def prune(self, now: float) -> None:
        """Forget intervals that ended before ``now`` (nothing can be reserved in the past)."""
        k = bisect_right(self.ends, now)
        if k > 32:
            del self.starts[:k]
            del self.ends[:k]

    def free_at(self, now: float) -> float:
        """When the busy period covering ``now`` ends (``now`` if the link is idle)."""
        t = now
        k = bisect_right(self.starts, t) - 1
        k = max(k, 0)
        while k < len(self.starts) and self.starts[k] <= t:
            t = max(t, self.ends[k])
            k += 1
        return t

    def reserved_between(self, a: float, b: float) -> float:
        """Seconds reserved inside ``[a, b)``."""
        total = 0.0
        k = max(bisect_right(self.starts, a) - 1, 0)
        while k < len(self.starts) and self.starts[k] < b:
            total += max(0.0, min(b, self.ends[k]) - max(a, self.starts[k]))
            k += 1
        return total


def reserve(links: list[LinkTimeline], not_before: float, dur: float) -> float:
    """Reserve the earliest common gap of ``dur`` seconds on all ``links`` at or after
    ``not_before``; returns its start."""
    t = not_before
    while True:
        moved = False
        for link in links:
            end = link.conflict_end(t, dur)
            if end is not None:
                t, moved = end, True
        if not moved:
            break
    for link in links:
        link.add(t, dur)
    return t

