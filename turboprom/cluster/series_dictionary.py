"""Series by reference on the ingest log: label sets cross it once per series, not once per write.

A series' *log reference* is the 128-bit BLAKE2b digest of its canonical label set (the JSON key of
``columns_codec.label_keys``), carried as two uint64 columns. It depends on the labels alone, so
every distributor, every restart and every consumer agree on it without coordinating. A log message
lists the references of its series; it carries a series' label key only where its distributor has
not yet had a definition of that series acknowledged in that partition within the current
redefinition period (``REDEFINE_S``, spread over the period by reference so they do not come all at
once). Every series is therefore defined again in its partition at least once a period, which bounds
how far back a consumer missing a definition would have had to read.

- ``SeriesKeys`` (distributor): per ingest-path reference space (``SeriesRefColumn.space``, e.g. a
  tenant's remote-write reference table), numpy columns by that space's dense reference: partition,
  log reference, label key, and when its definition was last acknowledged. A known series costs a
  few array gathers per write: no JSON, no hash.
- ``SeriesDictionary`` (ingester): log reference -> a dense local reference -> labels, and the
  storage reference space of those local references (so storage resolves known series by a numpy
  gather, storage/index.py ``_ids_by_ref``). A consumer that resumes mid-log after a restart finds
  the series it already stores by rebuilding the dictionary from its storage's label sets once.

Hand-written because it is the log's wire contract between roles; no library holds it.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
import weakref
import zlib
from operator import itemgetter
from typing import Callable, Iterable, Sequence

import numpy as np
import orjson

from storage.batch import SampleBatch
from storage.labels import Labels

log = logging.getLogger("turboprom.cluster")
REDEFINE_S = 300  # each series' label key is sent again in its partition at least this often
DICTIONARY_MAX = 4_000_000  # series an ingester's dictionary holds before it starts afresh


def log_refs(keys: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """The two uint64 halves of each key's 128-bit log reference."""
    raw = b"".join(hashlib.blake2b(k, digest_size=16).digest() for k in keys)
    both = np.frombuffer(raw, "<u8").reshape(-1, 2) if keys else np.zeros((0, 2), np.uint64)
    return both[:, 0].copy(), both[:, 1].copy()


def _grow(a: np.ndarray, n: int, fill) -> np.ndarray:
    out = np.full(max(n, 2 * len(a), 1024), fill, a.dtype)
    out[:len(a)] = a
    return out


class _Space:
    """Columns of one reference space, by dense reference."""

    def __init__(self) -> None:
        self.part = np.full(0, -1, np.int32)
        self.h1 = np.zeros(0, np.uint64)
        self.h2 = np.zeros(0, np.uint64)
        self.keys: list[bytes | None] = []
        self.defined = np.full(0, -1, np.int64)  # period (see ``period_of``) of the last acknowledged definition


class _LabelsSpace:
    """A reference space for batches that come without one (import API, runtime decoder): label set ->
    dense reference, bounded."""

    MAX = 1_000_000

    def __init__(self) -> None:
        self.refs: dict[Labels, int] = {}

    def of(self, series: Sequence[Labels]) -> np.ndarray:
        get = self.refs.get
        out = np.fromiter((get(lbl, -1) for lbl in series), np.int64, len(series))
        for i in np.flatnonzero(out < 0).tolist():
            out[i] = self.refs.setdefault(series[i], len(self.refs))
        return out


class SeriesKeys:
    """The distributor's side: partition, log reference and label key of each series it has seen."""

    def __init__(self, partitions: int):
        self.partitions = partitions
        self._spaces: weakref.WeakKeyDictionary[object, _Space] = weakref.WeakKeyDictionary()
        self._fallback = _LabelsSpace()
        self._fallback_space = _Space()
        self._lock = threading.Lock()

    def _space_and_refs(self, batch: SampleBatch) -> tuple[_Space, np.ndarray]:
        col = batch.series_refs
        if col is not None and len(col.refs) == len(batch.series):
            sp = self._spaces.get(col.space)
            if sp is None:
                with self._lock:
                    sp = self._spaces.setdefault(col.space, _Space())
            return sp, np.asarray(col.refs, np.int64)
        with self._lock:
            if len(self._fallback.refs) >= _LabelsSpace.MAX:
                self._fallback, self._fallback_space = _LabelsSpace(), _Space()
            return self._fallback_space, self._fallback.of(batch.series)

    def lookup(self, batch: SampleBatch) -> "BatchKeys":
        """Per series of ``batch``: partition, log reference, and where its key must travel."""
        sp, refs = self._space_and_refs(batch)
        top = int(refs.max()) + 1 if len(refs) else 0
        if len(sp.part) < top or (sp.part[refs] < 0).any():
            with self._lock:  # new series only: their key, partition and log reference, once
                if len(sp.part) < top:
                    sp.part, sp.h1, sp.h2 = _grow(sp.part, top, -1), _grow(sp.h1, top, 0), _grow(sp.h2, top, 0)
                    sp.defined = _grow(sp.defined, top, -1)
                    sp.keys.extend([None] * (len(sp.part) - len(sp.keys)))
                new = np.flatnonzero(sp.part[refs] < 0)
                if len(new):
                    new_refs, first = np.unique(refs[new], return_index=True)
                    keys = [orjson.dumps(batch.series[i]) for i in new[first].tolist()]
                    h1, h2 = log_refs(keys)
                    sp.h1[new_refs], sp.h2[new_refs] = h1, h2
                    for r, k in zip(new_refs.tolist(), keys):
                        sp.keys[r] = k
                    sp.part[new_refs] = np.fromiter(map(zlib.crc32, keys), np.int64, len(keys)) % self.partitions
        part, h1, h2 = sp.part[refs], sp.h1[refs], sp.h2[refs]
        due = sp.defined[refs] != period_of(h1)
        return BatchKeys(sp, refs, part, h1, h2, due)

    def acknowledged(self, keys: "BatchKeys", sent: np.ndarray) -> None:
        """The definitions of ``keys``'s series at positions ``sent`` are on the log."""
        if len(sent):
            keys.space.defined[keys.refs[sent]] = period_of(keys.h1[sent])


def period_of(h1: np.ndarray, now: float | None = None) -> np.ndarray:
    """The redefinition period each reference is in now (periods staggered by reference)."""
    now_s = int(time.time() if now is None else now)
    return (now_s + (h1 % np.uint64(REDEFINE_S)).astype(np.int64)) // REDEFINE_S


class BatchKeys:
    """``SeriesKeys.lookup``'s answer for one batch (arrays parallel to ``batch.series``)."""

    __slots__ = ("space", "refs", "part", "h1", "h2", "due")

    def __init__(self, space: _Space, refs: np.ndarray, part: np.ndarray, h1: np.ndarray, h2: np.ndarray, due: np.ndarray):
        self.space, self.refs, self.part, self.h1, self.h2, self.due = space, refs, part, h1, h2, due

    def key(self, i: int) -> bytes:
        k = self.space.keys[int(self.refs[i])]
        assert k is not None
        return k


class _StorageSpace:
    """Identity of one dictionary generation's local references in storage (weakly referenced there)."""


class SeriesDictionary:
    """The ingester's side: log reference -> local reference -> labels.

    ``resolve`` is called from the one appender thread; it is not locked."""

    def __init__(self, all_labels: Callable[[], Iterable[Labels]], max_series: int = DICTIONARY_MAX):
        self._all_labels = all_labels  # every label set in this node's storage (the restart rebuild)
        self.max_series = max_series
        self._reset()
        self.rebuilt = False
        self.undefined_samples = 0  # samples dropped: their series' label key was nowhere to be found
        self.collisions = 0

    def _reset(self) -> None:
        self.space = _StorageSpace()
        self._by_h1: dict[int, int] = {}
        self._exact: dict[tuple[int, int], int] = {}  # series whose first half collides with another's
        self._h2 = np.zeros(0, np.uint64)
        self.labels: list[Labels] = []
        self.rebuilt = False
        # ``_by_h1`` as sorted columns, for a vectorized lookup; refreshed when it has grown by a quarter
        self._sorted_h1 = np.zeros(0, np.uint64)
        self._sorted_ref = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def _refresh_sorted(self) -> None:
        h = np.fromiter(self._by_h1.keys(), np.uint64, len(self._by_h1))
        r = np.fromiter(self._by_h1.values(), np.int64, len(self._by_h1))
        order = np.argsort(h)
        self._sorted_h1, self._sorted_ref = h[order], r[order]

    def _find(self, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        out = np.full(len(h1), -1, np.int64)
        if len(self._sorted_h1):
            i = np.minimum(np.searchsorted(self._sorted_h1, h1), len(self._sorted_h1) - 1)
            hit = self._sorted_h1[i] == h1
            out[hit] = self._sorted_ref[i[hit]]
        if len(self._by_h1) > len(self._sorted_h1):  # added since the sorted columns were made
            miss = np.flatnonzero(out < 0)
            if len(miss):
                get = self._by_h1.get
                out[miss] = np.fromiter((get(x, -1) for x in h1[miss].tolist()), np.int64, len(miss))
        hit = out >= 0
        # the first half found, the second not equal: another series with that first half (or none)
        for i in np.flatnonzero(hit)[self._h2[out[hit]] != h2[hit]].tolist():
            out[i] = self._exact.get((int(h1[i]), int(h2[i])), -1)
        return out

    def _add(self, h1: int, h2: int, lbl: Labels) -> int:
        ref = len(self.labels)
        self.labels.append(lbl)
        if len(self._h2) <= ref:
            self._h2 = _grow(self._h2, ref + 1, 0)
        self._h2[ref] = h2
        prev = self._by_h1.setdefault(h1, ref)
        if prev != ref:
            self._exact[(h1, h2)] = ref
            self.collisions += 1
        return ref

    def define(self, h1: np.ndarray, h2: np.ndarray, keys: Sequence[bytes | None]) -> np.ndarray:
        """Local references of the given log references; keys (None where absent) define the ones
        not known yet. -1 where a reference is unknown and comes without its key."""
        if len(self.labels) >= self.max_series:
            self._reset()
        refs = self._find(h1, h2)
        unknown = np.flatnonzero(refs < 0)
        if not len(unknown):
            return refs
        for i in unknown.tolist():
            k = keys[i]
            if k is None:
                continue
            a, b = int(h1[i]), int(h2[i])
            ref = self._by_h1.get(a, -1)  # perhaps defined earlier in this same call
            if ref >= 0 and int(self._h2[ref]) != b:
                ref = self._exact.get((a, b), -1)
            refs[i] = ref if ref >= 0 else self._add(a, b, tuple(tuple(p) for p in orjson.loads(k)))
        miss = unknown[refs[unknown] < 0]
        if len(miss):  # references without a key whose definition came earlier in this same call
            refs[miss] = self._find(h1[miss], h2[miss])
        if len(self._by_h1) > 1.25 * len(self._sorted_h1) + 64:
            self._refresh_sorted()
        if (refs < 0).any() and not self.rebuilt:
            log.info("series dictionary: %d log references without a label key; learning the series storage holds",
                     int((refs < 0).sum()))
            self._rebuild()
            miss = np.flatnonzero(refs < 0)
            refs[miss] = self._find(h1[miss], h2[miss])
        return refs

    def _rebuild(self) -> None:
        """Learn every series this node already stores (a restart resumes the log after their
        definitions)."""
        self.rebuilt = True
        stored = list(self._all_labels())
        keys = [orjson.dumps(lbl) for lbl in stored]
        h1, h2 = log_refs(keys)
        known = self._find(h1, h2)
        for i in np.flatnonzero(known < 0).tolist():
            self._add(int(h1[i]), int(h2[i]), stored[i])
        self._refresh_sorted()

    def labels_of(self, refs: np.ndarray) -> list[Labels]:
        if len(refs) == 1:
            return [self.labels[int(refs[0])]]
        return list(itemgetter(*refs.tolist())(self.labels)) if len(refs) else []
