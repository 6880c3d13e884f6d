"""Series identity and the inverted index.

Canonical label set -> dense int64 series id, and label name -> value -> postings (ids). Matchers
are resolved to a boolean mask over all ids: per distinct label *value* Python work (a regex test per
value, as Prometheus does), never per series or per sample.
"""
from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

from storage.labels import Labels
from storage.matchers import Matcher


class _Postings:
    """Ids of one (name, value) pair: appended as Python ints, read as a cached numpy array."""

    __slots__ = ("ids", "_arr")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self._arr: np.ndarray | None = None

    def add(self, sid: int) -> None:
        self.ids.append(sid)
        self._arr = None

    def array(self) -> np.ndarray:
        arr = self._arr
        if arr is None or len(arr) != len(self.ids):
            arr = np.array(self.ids, dtype=np.int64)
            self._arr = arr
        return arr


class SeriesIndex:
    """Thread-safe: writers take the lock; readers see a consistent prefix of ids."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._ids: dict[Labels, int] = {}
        self.labels: list[Labels] = []
        self._postings: dict[str, dict[str, _Postings]] = {}
        self._name_postings: dict[str, _Postings] = {}

    def __len__(self) -> int:
        return len(self.labels)

    def get(self, labels: Labels) -> int | None:
        return self._ids.get(labels)

    def get_or_create(self, labels: Labels) -> tuple[int, bool]:
        sid = self._ids.get(labels)
        if sid is not None:
            return sid, False
        with self._lock:
            sid = self._ids.get(labels)
            if sid is not None:
                return sid, False
            sid = len(self.labels)
            for name, value in labels:
                by_value = self._postings.get(name)
                if by_value is None:
                    by_value = self._postings[name] = {}
                p = by_value.get(value)
                if p is None:
                    p = by_value[value] = _Postings()
                p.add(sid)
                np_ = self._name_postings.get(name)
                if np_ is None:
                    np_ = self._name_postings[name] = _Postings()
                np_.add(sid)
            self.labels.append(labels)
            self._ids[labels] = sid
            return sid, True

    def ids_for(self, series: Sequence[Labels]) -> tuple[np.ndarray, list[int]]:
        """Ids for a batch's label sets (created as needed); also which positions were new."""
        try:
            # Fast path, all series known: one C-level pass (tuple hashing dominates).
            return np.fromiter(map(self._ids.__getitem__, series), dtype=np.int64, count=len(series)), []
        except KeyError:
            pass
        out = np.empty(len(series), dtype=np.int64)
        created: list[int] = []
        get = self._ids.get
        for i, lbl in enumerate(series):
            sid = get(lbl)
            if sid is None:
                sid, new = self.get_or_create(lbl)
                if new:
                    created.append(i)
            out[i] = sid
        return out, created

    # --- matcher resolution -------------------------------------------------------------------

    def match_mask(self, matchers: Sequence[Matcher], n: int | None = None) -> np.ndarray:
        """Boolean mask over ids [0, n) of series satisfying all matchers."""
        n = len(self.labels) if n is None else n
        mask = np.ones(n, dtype=bool)
        for m in matchers:
            mask &= self._matcher_mask(m, n)
            if not mask.any():
                break
        return mask

    def match_ids(self, matchers: Sequence[Matcher], n: int | None = None) -> np.ndarray:
        """Sorted ids of series satisfying all matchers."""
        n = len(self.labels) if n is None else n
        if matchers and all(m.op == "=" and m.value != "" for m in matchers):
            # Equality matchers only (the planner's and dashboards' common case): intersect the
            # sorted postings, O(postings) instead of a mask over every id.
            lists = []
            for m in matchers:
                p = self._postings.get(m.name, {}).get(m.value)
                if p is None:
                    return np.empty(0, dtype=np.int64)
                arr = p.array()
                lists.append(arr[: np.searchsorted(arr, n)])  # ids are appended in ascending order
            lists.sort(key=len)
            ids = lists[0]
            for arr in lists[1:]:  # the shortest list probed in the longer ones: O(k log N)
                if not len(ids):
                    break
                pos = np.minimum(np.searchsorted(arr, ids), len(arr) - 1)
                ids = ids[arr[pos] == ids] if len(arr) else ids[:0]
            return ids.astype(np.int64, copy=False)
        return np.flatnonzero(self.match_mask(matchers, n)).astype(np.int64)

    def match_any_mask(self, matcher_sets: Sequence[Sequence[Matcher]], n: int | None = None) -> np.ndarray:
        n = len(self.labels) if n is None else n
        if not matcher_sets:
            return np.ones(n, dtype=bool)
        mask = np.zeros(n, dtype=bool)
        for ms in matcher_sets:
            mask |= self.match_mask(ms, n)
        return mask

    def _matcher_mask(self, m: Matcher, n: int) -> np.ndarray:
        by_value = self._postings.get(m.name, {})
        if m.op == "=" and m.value != "":
            mask = np.zeros(n, dtype=bool)
            p = by_value.get(m.value)
            if p is not None:
                ids = p.array()
                mask[ids[ids < n]] = True
            return mask
        # Series lacking the label read as "": they match iff the matcher matches "".
        empty_hit = m.matches("")
        mask = np.full(n, empty_hit, dtype=bool)
        for value, p in list(by_value.items()):
            hit = m.matches(value)
            if hit != empty_hit:
                ids = p.array()
                mask[ids[ids < n]] = hit
        return mask

    # --- label enumeration --------------------------------------------------------------------

    def names_in(self, sel: np.ndarray) -> list[str]:
        """Label names carried by at least one series in the boolean mask ``sel``."""
        n = len(sel)
        out = []
        for name, p in list(self._name_postings.items()):
            arr = p.array()
            if sel[arr[arr < n]].any():
                out.append(name)
        return sorted(out)

    def values_in(self, name: str, sel: np.ndarray) -> list[str]:
        """Values of label ``name`` over series in the boolean mask ``sel``: per distinct value work."""
        by_value = self._postings.get(name, {})
        n = len(sel)
        out = []
        for value, p in list(by_value.items()):
            arr = p.array()
            if sel[arr[arr < n]].any():
                out.append(value)
        return sorted(out)

    def label_names_all(self) -> list[str]:
        return sorted(self._postings)

    def postings_sizes(self) -> dict[str, dict[str, int]]:
        return {name: {v: len(p.ids) for v, p in list(vals.items())} for name, vals in list(self._postings.items())}
