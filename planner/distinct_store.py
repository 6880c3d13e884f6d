"""Distinct counts over windows (algorithm ``cpc``): one ``cpc_sketch`` per pane of the *items* of the
series that have a sample in the pane, for

    count(count by (L) (f(x{scope}[w])))  -- distinct values of the label tuple L among active series
    count(f(x{scope}[w]))                  -- series active in the window (item = the whole label set)

with ``f`` in count_over_time / present_over_time / last_over_time (present exactly when the series has
a sample in the window). A window's answer is the estimate of the union of its whole panes' sketches
(dyadic union cache, O(log K) unions per window) and the items of the series in its raw edges: the same
set Prometheus counts, so the only error is CPC's own (``error_bound``: the library's 2- and 3-sd
bounds; relative standard error ~0.6/sqrt(2^lg_k), e.g. lg_k=12: ~0.9%, 95% within ~1.8%). Set sketches
are idempotent, so late and repeated samples need nothing special.

Folding is per (pane, new item), not per sample: a batch's (item, pane) pairs are made unique with
numpy and each pane keeps a bitmap of items already added while it is recent.
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Sequence

import numpy as np
from datasketches import cpc_sketch, cpc_union

from planner.dyadic_panes import DyadicPanes, SeriesItems
from planner.pane_store import PaneStoreParts
from storage.labels import Labels

DEFAULT_LG_K = 12
SERIES_ITEM = "__series__"  # grouping marker: the item is the series' whole label set
_I64 = (1 << 63)


def item_hash(text: str) -> int:
    """Stable 64-bit item id (Python's hash() of str is salted per process; sketches are persisted)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") - _I64


def rse(lg_k: int) -> float:
    """Approximate relative standard error of CPC's estimator (DataSketches' figure 0.6/sqrt(k))."""
    return 0.6 / np.sqrt(float(1 << int(lg_k)))


class CPCPaneStore(DyadicPanes[cpc_sketch], SeriesItems, PaneStoreParts):
    def __init__(self, pane_ms: int, grouping: Sequence[str], lg_k: int = DEFAULT_LG_K, cache_entries: int = 20_000):
        DyadicPanes.__init__(self, cache_entries)
        SeriesItems.__init__(self, grouping)  # items: stable 64-bit hashes of the item text
        self.pane_ms = int(pane_ms)
        self.lg_k = int(lg_k)
        self.lock = threading.RLock()
        self.panes: dict[int, cpc_sketch] = {}
        self.version = 0
        self._seen: OrderedDict[int, np.ndarray] = OrderedDict()  # recent panes: items already added
        self.epoch = 0  # bumped by writes into panes behind the newest one (answer-cache validity)
        self._newest = np.iinfo(np.int64).min
        self.answers: OrderedDict = OrderedDict()  # (query key, step end) -> (stamp, count)

    # --- series and items ---------------------------------------------------------------------
    def item_text(self, lbl: Labels) -> str:
        if self.grouping == (SERIES_ITEM,):
            return "\xff".join(f"{n}\xfe{v}" for n, v in lbl)
        return super().item_text(lbl)

    def item_key(self, lbl: Labels) -> int:
        return item_hash(self.item_text(lbl))

    def nbytes(self) -> int:
        with self.lock:
            return int(sum(len(s.serialize()) for s in list(self.panes.values())[-64:]) / max(min(len(self.panes), 64), 1)
                       * len(self.panes)) if self.panes else 0

    def pane_totals(self) -> tuple[int, np.ndarray] | None:
        return None  # no per-pane sample counts: the raw-read cost model falls back to its default

    # --- ingest ------------------------------------------------------------------------------
    def ingest_sorted(self, sid: np.ndarray, ts: np.ndarray, vals: np.ndarray, *, live: bool = True) -> None:
        n = len(ts)
        if n == 0:
            return
        with self.lock:
            it = self.item_of[sid]
            ok = it >= 0
            k = ts[ok] // self.pane_ms
            it = it[ok]
            if not len(it):
                return
            self.version += 1
            kmin = int(k.min())
            self.note_written(kmin)
            if not live or kmin < self._newest:
                self.epoch += 1
            self._newest = max(self._newest, int(k.max()))
            n_items = len(self.items)
            u = np.unique((k - kmin) * n_items + it)  # distinct (pane, item) pairs, one int64 key each
            u_pane, u_item = u // n_items + kmin, u % n_items
            cuts = np.flatnonzero(np.diff(u_pane)) + 1
            touched = set()
            for a, b in zip(np.concatenate([[0], cuts]).tolist(), np.concatenate([cuts, [len(u)]]).tolist()):
                pane = int(u_pane[a])  # per pane, then per item not yet in its sketch
                seen = self._seen.get(pane)
                if seen is None or len(seen) < n_items:
                    grown = np.zeros(max(n_items, 16), bool)
                    if seen is not None:
                        grown[: len(seen)] = seen
                    seen = grown
                self._seen[pane] = seen
                self._seen.move_to_end(pane)
                new_items = u_item[a:b]
                new_items = new_items[~seen[new_items]]
                if not len(new_items):
                    continue
                seen[new_items] = True
                sk = self.panes.get(pane)
                if sk is None:
                    sk = self.panes[pane] = cpc_sketch(self.lg_k)
                for loc in new_items.tolist():
                    sk.update(self.items[loc])
                touched.add(pane)
            while len(self._seen) > 8:  # bitmaps for the few most recent panes only
                self._seen.popitem(last=False)
            self.drop_nodes(touched)
            np.maximum.at(self.last_t, sid[ok], ts[ok])

    # --- reads -------------------------------------------------------------------------------
    def merge(self, a: cpc_sketch, b: cpc_sketch) -> cpc_sketch:
        u = cpc_union(self.lg_k)
        u.update(a)
        u.update(b)
        return u.get_result()

    def deserialize(self, blob: bytes) -> cpc_sketch:
        return cpc_sketch.deserialize(blob)

    def on_import(self) -> None:
        self.epoch += 1
