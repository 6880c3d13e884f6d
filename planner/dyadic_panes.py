"""Per-pane sketches with a cache of merged dyadic nodes, and the series -> item mapping, shared by the
CPC and frequent-items stores.

A window covering panes [klo, khi) is answered from O(log n) cached nodes (node (level, j) = the merge
of panes [j * 2^level, (j + 1) * 2^level)) instead of merging every pane on every query. Writes into
panes drop the cached nodes that cover them. Subclasses hold ``panes``, ``lock``, ``version`` and say
how two sketches merge and how a payload is read back.
"""
from __future__ import annotations

from typing import Any, Generic, Hashable, Sequence, TypeVar

import numpy as np

from storage.labels import Labels

S = TypeVar("S")


class SeriesItems:
    """Series (registry ids) -> items (what a sketch counts: the grouping label values). Per new
    series Python only; ``item_of`` maps ids to local item ids in bulk (-1 = not yet assigned)."""

    lock: Any

    def __init__(self, grouping: Sequence[str]):
        self.grouping = tuple(grouping)
        self.items: list[Any] = []  # local item id -> item (as the sketch takes it)
        self.item_index: dict[Hashable, int] = {}
        self.item_of = np.zeros(0, np.int64)
        self.last_t = np.zeros(0, np.int64)
        self.ns = 0

    def item_text(self, lbl: Labels) -> str:
        d = dict(lbl)
        return "\xff".join(d.get(g, "") for g in self.grouping)

    def item_key(self, lbl: Labels) -> Hashable:
        """The item a series counts as (default: its grouping values joined)."""
        return self.item_text(lbl)

    def ensure_series(self, n: int) -> None:
        if n > len(self.item_of):
            grow = max(n, 2 * len(self.item_of), 16) - len(self.item_of)
            self.item_of = np.concatenate([self.item_of, np.full(grow, -1, np.int64)])
            self.last_t = np.concatenate([self.last_t, np.full(grow, np.iinfo(np.int64).min)])
        self.ns = max(self.ns, n)

    def assign(self, ids: np.ndarray, labels: Sequence[Labels]) -> None:
        with self.lock:
            self.ensure_series(int(ids.max()) + 1 if len(ids) else 0)
            for i in np.nonzero(self.item_of[ids] < 0)[0].tolist():  # new series only
                key = self.item_key(labels[i])
                loc = self.item_index.get(key)
                if loc is None:
                    loc = self.item_index[key] = len(self.items)
                    self.items.append(key)
                self.item_of[ids[i]] = loc


class DyadicPanes(Generic[S]):
    panes: dict[int, S]
    lock: Any
    version: int

    def __init__(self, cache_entries: int):
        self._nodes: dict[tuple[int, int], S | None] = {}
        self._cache_entries = cache_entries

    # --- what a subclass provides ----------------------------------------------------------------
    def merge(self, a: S, b: S) -> S:
        raise NotImplementedError

    def deserialize(self, blob: bytes) -> S:
        raise NotImplementedError

    def on_import(self) -> None:
        """Hook after payloads were restored (e.g. bump an answer-cache epoch)."""

    # --- shared ------------------------------------------------------------------------------
    def drop_nodes(self, touched: set[int]) -> None:
        """Forget cached nodes covering any of the ``touched`` panes (caller holds the lock)."""
        if touched and self._nodes:
            lo, hi = min(touched), max(touched)
            self._nodes = {key: v for key, v in self._nodes.items()
                           if not (key[1] << key[0] <= hi and (key[1] + 1) << key[0] > lo)}

    def _node(self, level: int, j: int) -> S | None:
        key = (level, j)
        if key in self._nodes:
            return self._nodes[key]
        if level == 0:
            res = self.panes.get(j)
        else:
            a, b = self._node(level - 1, 2 * j), self._node(level - 1, 2 * j + 1)
            res = (a if b is None else b) if a is None or b is None else self.merge(a, b)
        if len(self._nodes) > self._cache_entries:
            self._nodes.clear()
        self._nodes[key] = res
        return res

    def range_parts(self, klo: int, khi: int) -> list[S]:
        """Cached dyadic sketches covering panes [klo, khi)."""
        parts = []
        lo, hi, level = klo, khi, 0
        with self.lock:
            while lo < hi:
                if lo & 1:
                    parts.append(self._node(level, lo))
                    lo += 1
                if hi & 1:
                    hi -= 1
                    parts.append(self._node(level, hi))
                lo >>= 1
                hi >>= 1
                level += 1
        return [p for p in parts if p is not None]

    def drop_before(self, k: int) -> None:
        """Forget panes older than ``k`` and the cached nodes that start there."""
        k = int(k)
        with self.lock:
            old = [j for j in self.panes if j < k]
            if not old:
                return
            for j in old:
                del self.panes[j]
            self._nodes = {key: v for key, v in self._nodes.items() if key[1] << key[0] >= k}
            self.version += 1

    def clear_from(self, k: int) -> None:
        """Forget panes ``k`` and later and every cached node (a restart folds them again from raw)."""
        k = int(k)
        with self.lock:
            for j in [j for j in self.panes if j >= k]:
                del self.panes[j]
            self._nodes.clear()
            self.version += 1
            self.on_import()

    # --- persistence ---------------------------------------------------------------------------
    def export_rows(self, k_lo: int, k_hi: int) -> dict[str, list]:
        with self.lock:
            items = [(k, sk.serialize()) for k, sk in self.panes.items() if k_lo <= k < k_hi]  # type: ignore[attr-defined]
        return {"pane": [i[0] for i in items], "sketch": [i[1] for i in items]}

    def import_rows(self, rows: dict[str, list]) -> None:
        with self.lock:
            self.version += 1
            for k, blob in zip(rows["pane"], rows["sketch"]):
                self.panes[int(k)] = self.deserialize(bytes(blob))
            self._nodes.clear()
            self.on_import()
