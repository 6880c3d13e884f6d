"""A querier's write frontier: reused step answers on a querier, kept exact by the ingesters' logs.

On a single node, step answers (planner/step_answers.py) rely on a ``WriteFrontier`` fed by every
accepted write: steps at or before the sealed frontier are kept, and a later write reaching at or
below it is logged and drops the kept steps from its timestamp on. A querier sees no writes; its
ingesters do, each with its own ``WriteFrontier``. ``ClusterFrontier`` relays them: before every
read that may keep steps (``arm``), it asks every live ingester (``POST /internal/cluster/v1/frontier``,
in parallel) for its sequence, its sealed frontier and the oldest write it logged since the sequence
the querier saw last, and appends those writes to its own log. So:

* a write an ingester applied before answering is in storage when the read that follows reads it;
  one applied after is logged there under a later sequence and reaches the querier's log at its next
  ``arm``, before that refresh validates what it kept (a write in between is reported twice: harmless);
* the querier's sealed frontier is the smallest of its ingesters' (every one has logged any write at
  or below it, as every replica of a partition applies the same writes);
* anything the querier cannot account for drops every kept step: an ingester that did not answer,
  a new ingester process (its log starts again), a change of the partition assignment or of the
  live ingesters, or a ``since`` older than an ingester's log still holds.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from planner.step_answers import EVERYTHING, NEVER, WriteFrontier

if TYPE_CHECKING:
    from turboprom.cluster.fanout_storage import FanoutStorage


class ClusterFrontier(WriteFrontier):
    def __init__(self, fanout: FanoutStorage, seal_delay_ms: int):
        super().__init__(seal_delay_ms)
        self.fanout = fanout
        self._remote: dict[str, tuple[str, int]] = {}  # ingester -> (its log's epoch, last sequence relayed)
        self._members: tuple | None = None  # (assignment revision, live ingesters) at the last pull
        # one pull at a time; callers that arrive while one runs share the next one (a dashboard's
        # panels refreshed together cost one round of requests, not one each, in turn)
        self._cond = threading.Condition()
        self._pulling = False
        self._started = 0  # pulls started so far (numbered 1, 2, ...)
        self._done = 0  # the number of the last pull finished
        self._result: tuple[int, int] = (0, EVERYTHING)  # its (sequence, sealed frontier)

    def arm(self) -> tuple[int, int]:
        """(sequence, sealed frontier) before a read, after relaying what the ingesters logged: from a
        pull that started after this call (one already running may have missed a write that came
        before the call)."""
        with self._cond:
            want = self._started + 1
            while self._done < want:
                if not self._pulling:
                    self._pulling = True
                    self._started += 1
                    mine = self._started
                    break
                self._cond.wait()
            else:
                return self._result
        result = (0, EVERYTHING)
        try:
            sealed = self._pull()
            with self.lock:
                result = (self.seq, sealed)
        finally:
            with self._cond:
                self._pulling = False
                self._done = mine
                self._result = result
                self._cond.notify_all()
        return result

    def sealed_ms(self) -> int:
        return self.arm()[1]

    def _pull(self) -> int:
        state = self.fanout.view.state
        members = (state.assignment_revision, tuple(sorted(state.alive)))
        try:
            answers = self.fanout.frontiers({n: r[1] for n, r in self._remote.items()})
        except Exception:  # noqa: BLE001 - no ingester reachable: keep nothing, trust nothing kept
            self.invalidate_all()
            return EVERYTHING
        lost = members != self._members or not answers
        sealed = NEVER
        for node, a in answers.items():
            if isinstance(a, BaseException):  # its writes are unknown: drop everything, ask it again next time
                lost, sealed = True, EVERYTHING
                continue
            known = self._remote.get(node)
            if known is None or known[0] != a["epoch"]:
                lost = True  # a new ingester process (or one this querier never asked): its log starts here
            elif int(a["oldest"]) != NEVER:
                self.log_write(int(a["oldest"]))
            self._remote[node] = (str(a["epoch"]), int(a["seq"]))
            sealed = min(sealed, int(a["sealed"]))
        for node in set(self._remote) - set(answers):
            del self._remote[node]
        self._members = members
        if lost:
            self.invalidate_all()
        return EVERYTHING if sealed == NEVER else sealed
