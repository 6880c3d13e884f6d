"""Top-k by sample count (algorithm ``fi``): one ``frequent_strings_sketch`` per pane, item = the tuple of
the grouping labels L of a sample's series, weight = its number of samples in the pane, for

    topk(k, sum by (L) (count_over_time(x{scope}[w])))

The per-item weights are additive across series and panes (a sample counts once wherever it lands), so
the merged sketch of a window's whole panes plus the raw edges' counts holds exactly the quantity the
query ranks: samples per L tuple in the window. The sketch bounds every item's count:
``lower <= count <= upper`` with ``upper - lower`` = the sketch's current offset (0 while it tracks every
item; after evictions at most ~epsilon x total weight, ``epsilon_for(lg_max)``), and an untracked item
has ``count <= offset``. A window is answered only when the top-k *set* is provable: the k-th largest
lower bound exceeds every other item's upper bound and the offset; the values returned are the
estimates (exact while offset = 0, within +-offset otherwise, stated in the info). Any step that is not
provable sends the whole query back to raw evaluation.

Not served: ``topk(k, sum by (L) (increase/rate(x[w])))`` (per-series extrapolation is not a sum of
per-pane weights, so a frequent-items bound would be about a different quantity) and anything whose
weights could be negative.
"""
from __future__ import annotations

import threading
from typing import Sequence

import numpy as np
from datasketches import frequent_strings_sketch

from planner.dyadic_panes import DyadicPanes, SeriesItems
from planner.pane_store import PaneStoreParts
from storage.labels import Labels

DEFAULT_LG_MAX = 10
_UNTRACKED = "\x00untracked\x00"


def epsilon_for(lg_max: int) -> float:
    return float(frequent_strings_sketch.get_epsilon_for_lg_size(int(lg_max)))


def offset_of(sk: frequent_strings_sketch) -> float:
    """The sketch's current maximum error (upper bound of an item it does not track)."""
    return float(sk.get_upper_bound(_UNTRACKED))


class TopKPaneStore(DyadicPanes[frequent_strings_sketch], SeriesItems, PaneStoreParts):
    def __init__(self, pane_ms: int, grouping: Sequence[str], lg_max: int = DEFAULT_LG_MAX, cache_entries: int = 20_000):
        DyadicPanes.__init__(self, cache_entries)
        SeriesItems.__init__(self, grouping)  # items: grouping values joined by \xff
        self.pane_ms = int(pane_ms)
        self.lg_max = int(lg_max)
        self.lock = threading.RLock()
        self.panes: dict[int, frequent_strings_sketch] = {}
        self.version = 0

    def item_labels(self, text: str) -> Labels:
        return tuple(sorted((g, v) for g, v in zip(self.grouping, text.split("\xff")) if v != ""))

    def nbytes(self) -> int:
        with self.lock:
            return int(sum(s.get_serialized_size_bytes() for s in self.panes.values()))

    def pane_totals(self) -> None:
        return None

    def ingest_sorted(self, sid: np.ndarray, ts: np.ndarray, vals: np.ndarray, *, live: bool = True) -> None:
        """Fold samples (any order, each once): per (pane, item) one weighted update."""
        if len(ts) == 0:
            return
        with self.lock:
            it = self.item_of[sid]
            ok = it >= 0
            if not ok.any():
                return
            k, it = ts[ok] // self.pane_ms, it[ok]
            self.version += 1
            n_items = len(self.items)
            kmin = int(k.min())
            self.note_written(kmin)
            u, cnt = np.unique((k - kmin) * n_items + it, return_counts=True)
            u_pane, u_item = u // n_items + kmin, u % n_items
            touched = set()
            for pane, item, c in zip(u_pane.tolist(), u_item.tolist(), cnt.tolist()):
                sk = self.panes.get(pane)
                if sk is None:
                    sk = self.panes[pane] = frequent_strings_sketch(self.lg_max)
                sk.update(self.items[item], c)
                touched.add(pane)
            self.drop_nodes(touched)
            np.maximum.at(self.last_t, sid[ok], ts[ok])

    def merge(self, a: frequent_strings_sketch, b: frequent_strings_sketch) -> frequent_strings_sketch:
        res = frequent_strings_sketch(self.lg_max)
        res.merge(a)
        res.merge(b)
        return res

    def deserialize(self, blob: bytes) -> frequent_strings_sketch:
        return frequent_strings_sketch.deserialize(blob)


def provable_topk(sk: frequent_strings_sketch, k: int) -> list[tuple[str, float]] | None:
    """The top-k items by count with their estimates when the set is certain from the sketch's bounds
    (k-th largest lower bound > every other upper bound and > the offset of untracked items); None
    when it is not (a tie or overlapping bounds at the boundary)."""
    from datasketches import frequent_items_error_type

    rows = sk.get_frequent_items(frequent_items_error_type.NO_FALSE_NEGATIVES, 0)
    rows = sorted(rows, key=lambda r: (-r[2], r[0]))  # (item, estimate, lower, upper) by lower bound
    off = offset_of(sk)
    if len(rows) <= k:
        # every tracked item is in; untracked ones (count <= off) could be too unless off == 0
        return [(r[0], float(r[1])) for r in rows] if off == 0 else None
    kth_lower = rows[k - 1][2]
    others = max(max(r[3] for r in rows[k:]), off)
    if kth_lower <= others:
        return None
    return [(r[0], float(r[1])) for r in rows[:k]]
