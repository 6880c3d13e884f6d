"""Which head cuts a cluster ingester's storage may make (turboprom/cluster/ingester.py ``cut_hold``):
none reaching past the newest applied sample time of a partition that is still busy."""
from __future__ import annotations

from turboprom.cluster.ingester import IDLE_S, MAX_HOLD_MS, cut_hold

NOW = 1000.0


def test_the_slowest_busy_partition_holds_the_cuts():
    applied = {0: 5_000, 1: 9_000, 2: 7_000}
    fetched = {0: NOW - 1, 1: NOW - 1, 2: NOW - 1}
    assert cut_hold([0, 1, 2], {0, 1, 2}, {}, fetched, applied, NOW) == 5_000
    # partition 0 has gone quiet (nothing fetched for IDLE_S, nothing queued): the next one holds
    fetched[0] = NOW - IDLE_S - 1
    assert cut_hold([0, 1, 2], {0, 1, 2}, {}, fetched, applied, NOW) == 7_000
    # ... unless batches of it are still queued, or it is not caught up yet
    assert cut_hold([0, 1, 2], {0, 1, 2}, {0: 1}, fetched, applied, NOW) == 5_000
    assert cut_hold([0, 1, 2], {1, 2}, {}, fetched, applied, NOW) == 5_000


def test_nothing_is_cut_while_a_busy_partition_has_applied_nothing():
    assert cut_hold([0, 1], {1}, {}, {1: NOW}, {}, NOW) == -(1 << 63)
    # ... within a day of the newest sample the node applied: a stalled partition does not hold the
    # head back without end
    assert cut_hold([0, 1], {1}, {}, {1: NOW}, {1: 9_000}, NOW) == 9_000 - MAX_HOLD_MS
    assert cut_hold([0, 1], {1}, {}, {1: NOW}, {0: 5_000, 1: 9_000}, NOW) == 5_000
    assert cut_hold([0, 1], {1}, {}, {1: NOW}, {0: 5_000, 1: 5_000 + MAX_HOLD_MS + 1}, NOW) == 5_001


def test_idle_partitions_hold_nothing():
    assert cut_hold([0, 1], {0, 1}, {}, {}, {0: 5_000}, NOW) is None
    assert cut_hold([], set(), {}, {}, {}, NOW) is None
