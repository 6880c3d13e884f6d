"""Which step grids the planner's step caches keep answers for.

A range query's steps sit on a grid: its step and its phase (``start % step``). Grafana floors start
and end to the step, so every refresh of a panel lands on the same grid (phase 0) and the next
refresh reuses what this one keeps. A client that sends ``end=now`` (a script, the Prometheus UI,
``promtool query range``) lands on a new grid at every refresh: nothing it keeps is ever met again,
and each such answer costs a copy and pushes useful entries out of the cache.

So the two step caches (``planner/step_answers.py`` per query text, the exact summaries' per
sub-tree cache in ``planner/summary_scan.py``) keep a grid on multiples of its step at once, and any
other grid only when its key has come before: the second query on the same unaligned grid is kept,
the first is only remembered.
"""
from __future__ import annotations

import threading
from collections import OrderedDict


class GridAdmission:
    """Remembers the recent keys of unaligned grids (``size`` of them, least recent forgotten first)."""

    def __init__(self, size: int = 1024):
        self.size = int(size)
        self._seen: OrderedDict[tuple, None] = OrderedDict()
        self._lock = threading.Lock()
        self.refused = 0  # answers not kept: their unaligned grid had not come before

    def admit(self, key: tuple, aligned: bool) -> bool:
        """Whether a new cache entry under ``key`` is worth keeping (see the module doc)."""
        if aligned:
            return True
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return True
            self._seen[key] = None
            while len(self._seen) > self.size:
                self._seen.popitem(last=False)
            self.refused += 1
            return False
