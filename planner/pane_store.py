"""``PaneStore``: what the SDS runtime, the summarizer, the scans' callers and persistence use of every
algorithm's pane store, and ``PaneStoreParts``, the parts a store without them answers trivially.

Per-series shift constants (exact and REQ payloads hold ``v - c``), group metadata (group panes number
their groups), series -> group / item assignment (fixed-scope stores) and the chain state a restart
rebuilds (exact panes: each series' last folded sample) are each a method here, so persistence and
the SDS runtime call them on any store instead of asking which store they hold.
"""
from __future__ import annotations

import threading
from typing import Any, Protocol, Sequence

import numpy as np

from storage.labels import Labels


class PaneStore(Protocol):
    pane_ms: int
    lock: threading.RLock

    def ensure_series(self, n: int) -> None: ...

    def ingest_sorted(self, sid: np.ndarray, ts: np.ndarray, vals: np.ndarray, *, live: bool = True) -> None: ...

    def nbytes(self) -> int: ...

    def export_rows(self, k_lo: int, k_hi: int) -> dict[str, Any]: ...

    def import_rows(self, rows: dict[str, Any]) -> None: ...  # columns as ``export_rows`` gave them (lists or arrays)

    def pane_totals(self) -> tuple[int, np.ndarray]: ...  # (first pane, samples per pane): the read cost model

    def drop_before(self, k: int) -> None: ...  # forget panes older than pane k (the plan's history moved on)

    def assign(self, ids: np.ndarray, labels: Sequence[Labels]) -> None: ...  # newly registered series

    def series_shift(self) -> np.ndarray: ...  # per registered series: its shift constant (NaN = none)

    def set_series_shift(self, shift: np.ndarray) -> None: ...  # restore those of series 0..len-1

    def export_meta(self) -> dict[str, list] | None: ...  # store-level state beside the panes (persisted)

    def import_meta(self, meta: dict[str, list]) -> None: ...

    def restore_chain(self) -> None: ...  # after a restore: continue each series from its persisted panes

    def take_written_lo(self) -> int | None: ...  # lowest pane written since the last call (None: none)

    def clear_from(self, k: int) -> None: ...  # forget panes k and later (a restart rebuilds them from raw)


class PaneStoreParts:
    """Defaults for stores that keep no per-series shift, no metadata, no series assignment and no
    chain to restore; and the record of the lowest pane written, which every store keeps (its
    ``ingest_sorted`` calls ``note_written`` under its lock): persistence re-writes panes it had
    already written when late or lagging samples changed them since (``SDSPersistence.flush``)."""

    written_lo: int | None = None

    def note_written(self, k: int) -> None:
        if self.written_lo is None or k < self.written_lo:
            self.written_lo = int(k)

    def take_written_lo(self) -> int | None:
        with self.lock:  # type: ignore[attr-defined]
            k, self.written_lo = self.written_lo, None
            return k

    def assign(self, ids: np.ndarray, labels: Sequence[Labels]) -> None:
        return None

    def series_shift(self) -> np.ndarray:
        return np.zeros(0)

    def set_series_shift(self, shift: np.ndarray) -> None:
        return None

    def export_meta(self) -> dict[str, list] | None:
        return None

    def import_meta(self, meta: dict[str, list]) -> None:
        return None

    def restore_chain(self) -> None:
        return None


# a first sample this large (beyond the integers a float holds exactly) is no shift: values of the
# size the series usually has would keep none of their digits in ``v - c`` (one 1e300 or an unsigned
# overflow's 1.8e19 as a series' first sample made every later sum of it 0); such series get c = 0
MAX_SHIFT = float(2 ** 53)


def choose_shifts(shift: np.ndarray, ids: np.ndarray, vals: np.ndarray) -> None:
    """Set ``shift[i]`` of every id in ``ids`` that has none yet (NaN) from its first finite sample in
    ``vals`` (0 when that sample is beyond ``MAX_SHIFT``): per series for exact panes and REQ
    sketches, per group for group panes."""
    fin = np.isfinite(vals)
    if not fin.any():
        return
    u, first = np.unique(ids[fin], return_index=True)
    unset = np.isnan(shift[u])
    c = vals[fin][first[unset]]
    shift[u[unset]] = np.where(np.abs(c) < MAX_SHIFT, c, 0.0)


class SeriesShift:
    """For stores with a per-series ``shift`` array (exact panes, REQ sketches): each series' values
    are kept as ``v - c``, with ``c`` the series' first finite sample (``choose_shift``), so the sums
    and squares of a series that sits far from zero keep their digits."""

    shift: np.ndarray
    lock: Any

    def choose_shift(self, sid: np.ndarray, vals: np.ndarray) -> None:
        choose_shifts(self.shift, sid, vals)

    def series_shift(self) -> np.ndarray:
        return self.shift

    def set_series_shift(self, shift: np.ndarray) -> None:
        with self.lock:
            self.shift[: len(shift)] = np.asarray(shift, np.float64)
