"""Series identity and the inverted index.

Canonical label set -> dense int64 series id, and label name -> value -> postings (ids). Matchers
are resolved per distinct label *value* (a regex test per value, as Prometheus does), never per
series or per sample.

Tenant partitions: the postings are kept per value of the reserved tenant label ``__tenant__``
(``""`` for the default tenant's series, which carry none): each partition has its own series ids
and postings, and a store-wide read is the union of the partitions' answers. A matcher list holding a ``__tenant__="<t>"`` equality
matcher (every read of ``turboprom.tenancy.TenantView`` does) is resolved inside partition ``<t>``
alone: the tenant restriction is applied *before* any value matcher is evaluated, so the regex
tests, postings look-ups and label enumeration a query costs depend only on that tenant's own
series. Another tenant's label values are never even handed to a matcher, so response times
cannot reveal them (no timing oracle on another tenant's values).
"""
from __future__ import annotations

import threading
import weakref
from bisect import bisect_left
from typing import Sequence

import numpy as np

from storage.batch import SeriesRefColumn
from storage.columns import grow
from storage.labels import TENANT_LABEL, Labels
from storage.matchers import Matcher

_TENANT_KEY = (TENANT_LABEL,)
_EMPTY_IDS = np.empty(0, dtype=np.int64)
# (matcher list, series count) -> ids remembered, up to this many entries and ids in all (32 MiB);
# then it starts over
_MATCH_MEMO_ENTRIES, _MATCH_MEMO_IDS = 4096, 1 << 22


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


def _below(arr: np.ndarray, n: int) -> np.ndarray:
    return arr[: np.searchsorted(arr, n)]  # ids are appended in ascending order


def _intersect_sorted(lists: list[np.ndarray]) -> np.ndarray:
    """Intersection of sorted id arrays: the shortest probed in the longer ones, O(k log N)."""
    lists = sorted(lists, key=len)
    ids = lists[0]
    for arr in lists[1:]:
        if not len(ids):
            break
        pos = np.minimum(np.searchsorted(arr, ids), len(arr) - 1)
        ids = ids[arr[pos] == ids] if len(arr) else ids[:0]
    return ids.astype(np.int64, copy=False)


class _Partition:
    """One tenant's series: their ids (ascending) and postings over those ids only."""

    __slots__ = ("ids", "postings", "name_postings")

    def __init__(self) -> None:
        self.ids = _Postings()
        self.postings: dict[str, dict[str, _Postings]] = {}
        self.name_postings: dict[str, _Postings] = {}

    def add(self, sid: int, labels: Labels) -> None:
        self.ids.add(sid)
        for name, value in labels:
            by_value = self.postings.get(name)
            if by_value is None:
                by_value = self.postings[name] = {}
            p = by_value.get(value)
            if p is None:
                p = by_value[value] = _Postings()
            p.add(sid)
            np_ = self.name_postings.get(name)
            if np_ is None:
                np_ = self.name_postings[name] = _Postings()
            np_.add(sid)

    def match_ids(self, matchers: Sequence[Matcher], n: int) -> np.ndarray:
        """Sorted ids (< n) of this partition's series satisfying all matchers. Equality matchers
        intersect this partition's postings first; each other matcher is then tested once per
        distinct value *this partition* holds, and not at all once nothing is left."""
        eq = [m for m in matchers if m.op == "=" and m.value != ""]
        rest = [m for m in matchers if not (m.op == "=" and m.value != "")]
        if eq:
            lists = []
            for m in eq:
                p = self.postings.get(m.name, {}).get(m.value)
                if p is None:
                    return _EMPTY_IDS
                lists.append(_below(p.array(), n))
            ids = _intersect_sorted(lists)
        else:
            ids = _below(self.ids.array(), n)
        for m in rest:
            if not len(ids):
                break
            by_value = self.postings.get(m.name, {})
            empty_hit = m.matches("")  # series lacking the label read as ""
            keep = np.full(n, empty_hit, dtype=bool)
            items = list(by_value.items())
            # every distinct value at once (RE2's bulk kernel, off the GIL); postings only where the
            # answer differs from that of a missing label
            hits = m.matches_values([v for v, _ in items])
            for k in np.flatnonzero(hits != empty_hit).tolist():
                keep[_below(items[k][1].array(), n)] = not empty_hit
            ids = ids[keep[ids]]
        return ids.astype(np.int64, copy=False)

    def names_in(self, sel: np.ndarray) -> list[str]:
        n = len(sel)
        return sorted(name for name, p in list(self.name_postings.items()) if sel[_below(p.array(), n)].any())

    def values_in(self, name: str, sel: np.ndarray) -> list[str]:
        n = len(sel)
        return sorted(v for v, p in list(self.postings.get(name, {}).items()) if sel[_below(p.array(), n)].any())


def _tenant_key(matchers: Sequence[Matcher]) -> tuple[str | None, bool, list[Matcher]]:
    """(partition key or None, contradictory, the other matchers) of a matcher list: the key is the
    value of a ``__tenant__="<t>"`` equality matcher ("" = the default tenant's series)."""
    key: str | None = None
    rest: list[Matcher] = []
    for m in matchers:
        if m.name == TENANT_LABEL and m.op == "=":
            if key is not None and key != m.value:
                return key, True, rest
            key = m.value
        else:
            rest.append(m)
    return key, False, rest


class SeriesIndex:
    """Thread-safe: writers take the lock; readers see a consistent prefix of ids.

    Postings live in the tenant partitions only (each series in exactly one), so the index costs
    what one store-wide set of postings would; a read that names no tenant is the union of the
    partitions' answers."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._ids: dict[Labels, int] = {}
        self.labels: list[Labels] = []
        self._parts: dict[str, _Partition] = {}  # tenant label value ("" = none) -> that tenant's postings
        # ingest reference space -> (reference -> id, -1 unknown); a space that ingest drops is forgotten
        self._ref_ids: weakref.WeakKeyDictionary[object, np.ndarray] = weakref.WeakKeyDictionary()
        self._match_memo: dict[tuple[tuple[Matcher, ...], int], np.ndarray] = {}  # see match_ids
        self._match_memo_ids = 0

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
            i = bisect_left(labels, _TENANT_KEY)  # labels are sorted by name
            tenant = labels[i][1] if i < len(labels) and labels[i][0] == TENANT_LABEL else ""
            part = self._parts.get(tenant)
            if part is None:
                part = self._parts[tenant] = _Partition()
            part.add(sid, labels)
            # Published last: a reader holding this id finds it in the postings above.
            self.labels.append(labels)
            self._ids[labels] = sid
            return sid, True

    def ids_for(self, series: Sequence[Labels], refs: SeriesRefColumn | None = None) -> tuple[np.ndarray, list[int]]:
        """Ids for a batch's label sets (created as needed); also which positions were new.

        With ``refs`` (the ingest path's references of these series), ids come from this index's
        reference -> id table of that reference space; only references it has not seen are looked
        up by their labels (and then remembered)."""
        if refs is not None and len(refs.refs) == len(series):
            return self._ids_by_ref(series, refs)
        return self._ids_by_labels(series)

    def _ids_by_ref(self, series: Sequence[Labels], refs: SeriesRefColumn) -> tuple[np.ndarray, list[int]]:
        r = refs.refs
        table = self._ref_ids.get(refs.space)
        top = int(r.max()) + 1 if len(r) else 0
        if table is None or len(table) < top:
            with self._lock:
                table = self._ref_ids.get(refs.space)
                if table is None or len(table) < top:
                    table = grow(table if table is not None else np.empty(0, np.int64), max(top, 1024), -1)
                    self._ref_ids[refs.space] = table
        ids = table[r]
        miss = ids < 0
        if not miss.any():
            return ids, []
        pos = np.flatnonzero(miss)
        got, created = self._ids_by_labels([series[i] for i in pos.tolist()])
        ids[pos] = got
        table[r[pos]] = got  # ids never change: racing writers store the same value
        return ids, [int(pos[i]) for i in created]

    def _ids_by_labels(self, series: Sequence[Labels]) -> tuple[np.ndarray, list[int]]:
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

    def _partitions(self) -> list[_Partition]:
        return list(self._parts.values())

    # --- matcher resolution -------------------------------------------------------------------

    def partition_of(self, matcher_sets: Sequence[Sequence[Matcher]]) -> str | None:
        """The tenant partition every matcher set is restricted to, or None (mixed or unrestricted)."""
        keys = set()
        for ms in matcher_sets:
            key, contradictory, _ = _tenant_key(ms)
            if key is None:
                return None
            if not contradictory:
                keys.add(key)
        return keys.pop() if len(keys) == 1 else None

    def match_ids(self, matchers: Sequence[Matcher], n: int | None = None) -> np.ndarray:
        """Sorted ids of series satisfying all matchers. A ``__tenant__="<t>"`` matcher is resolved
        first: the other matchers are then evaluated in tenant <t>'s partition alone.

        Remembered per (matchers, n): ids are never reused and postings only grow by ids >= n, so
        the answer over ids < n never changes; a new series (n grows) starts a new entry."""
        n = len(self.labels) if n is None else n
        ck = (tuple(matchers), n)
        hit = self._match_memo.get(ck)
        if hit is not None:
            return hit
        ids = self._match_ids(matchers, n)
        if len(self._match_memo) >= _MATCH_MEMO_ENTRIES or self._match_memo_ids + len(ids) > _MATCH_MEMO_IDS:
            self._match_memo.clear()
            self._match_memo_ids = 0
        if len(ids) <= _MATCH_MEMO_IDS:
            self._match_memo[ck] = ids
            self._match_memo_ids += len(ids)
        return ids

    def _match_ids(self, matchers: Sequence[Matcher], n: int) -> np.ndarray:
        key, contradictory, rest = _tenant_key(matchers)
        if key is not None:
            part = self._parts.get(key)
            if contradictory or part is None:
                return _EMPTY_IDS
            return part.match_ids(rest, n)
        found = [ids for ids in (p.match_ids(matchers, n) for p in self._partitions()) if len(ids)]
        if not found:
            return _EMPTY_IDS
        return found[0] if len(found) == 1 else np.sort(np.concatenate(found))

    def match_mask(self, matchers: Sequence[Matcher], n: int | None = None) -> np.ndarray:
        """Boolean mask over ids [0, n) of series satisfying all matchers."""
        n = len(self.labels) if n is None else n
        mask = np.zeros(n, dtype=bool)
        mask[self.match_ids(matchers, n)] = True
        return mask

    def match_any_mask(self, matcher_sets: Sequence[Sequence[Matcher]], n: int | None = None) -> np.ndarray:
        n = len(self.labels) if n is None else n
        if not matcher_sets:
            return np.ones(n, dtype=bool)
        mask = np.zeros(n, dtype=bool)
        for ms in matcher_sets:
            mask[self.match_ids(ms, n)] = True
        return mask

    # --- label enumeration --------------------------------------------------------------------

    def names_in(self, sel: np.ndarray, partition: str | None = None) -> list[str]:
        """Label names carried by at least one series in the boolean mask ``sel`` (only the names of
        tenant ``partition``'s series are looked at when given)."""
        if partition is not None:
            part = self._parts.get(partition)
            return part.names_in(sel) if part is not None else []
        return sorted({name for p in self._partitions() for name in p.names_in(sel)})

    def values_in(self, name: str, sel: np.ndarray, partition: str | None = None) -> list[str]:
        """Values of label ``name`` over series in the boolean mask ``sel``: per distinct value work
        (over tenant ``partition``'s values only when given)."""
        if partition is not None:
            part = self._parts.get(partition)
            return part.values_in(name, sel) if part is not None else []
        return sorted({v for p in self._partitions() for v in p.values_in(name, sel)})

    def label_names_all(self) -> list[str]:
        return sorted({name for p in self._partitions() for name in list(p.postings)})

    def postings_sizes(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for p in self._partitions():
            for name, vals in list(p.postings.items()):
                d = out.setdefault(name, {})
                for v, ps in list(vals.items()):
                    d[v] = d.get(v, 0) + len(ps.ids)
        return out
