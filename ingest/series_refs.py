"""The ingest-side series reference: known remote-write series by their raw label bytes.

A ``SeriesRefs`` maps the raw label-field bytes of a TimeSeries to a dense reference and each
reference to its validated, admitted canonical ``Labels``. The table and the walk that looks
every series of a request up are compiled (``ingest._rw_native``, built from
ingest/csrc/rw_native.c; the walk runs without the GIL) or, when the extension is not built, the
pure-Python ``ingest.rw_fast.PyRefTable`` with the same interface and the same columns.

Storage is handed the references with each batch (``storage.batch.SeriesRefColumn``, the
``SeriesRefs`` object being the reference space) and keeps reference -> series id per space, so a
known series costs neither label objects nor a label-set hash anywhere on the write path.

``TURBOPROM_RW_NATIVE=0`` in the environment selects the Python walk even when the extension is
built (tests run both and compare).
"""
from __future__ import annotations

import os
import threading
from typing import NamedTuple

import numpy as np

from ingest.rw_fast import PyRefTable, V1Columns, split_request, walk_columns
from storage.labels import Labels, metric_name

try:
    from ingest._rw_native import RefTable as NativeRefTable
except ImportError:  # not built: the Python walk (same results, slower)
    NativeRefTable = None


def native_available() -> bool:
    return NativeRefTable is not None


def native_default() -> bool:
    return NativeRefTable is not None and os.environ.get("TURBOPROM_RW_NATIVE", "1") != "0"


class V2Columns(NamedTuple):
    """One remote-write 2.0 request as columns (ingest/csrc/rw_native.c walk_v2). Per TimeSeries:
    ``refs`` (-1 unknown), ``key_off``/``key_len`` (the unknown series' keys in ``new_keys``),
    ``meta_type`` (-1: no metadata field), ``meta_help``, ``meta_unit``. Per Sample: ``sample_ts``,
    ``timestamps``, ``values``. Per Exemplar: ``ex_ts``, ``ex_off``, ``ex_len``. The symbols table:
    ``sym_off``, ``sym_len`` (in the request bytes)."""

    refs: np.ndarray
    key_off: np.ndarray
    key_len: np.ndarray
    sample_ts: np.ndarray
    timestamps: np.ndarray
    values: np.ndarray
    ex_ts: np.ndarray
    ex_off: np.ndarray
    ex_len: np.ndarray
    sym_off: np.ndarray
    sym_len: np.ndarray
    meta_type: np.ndarray
    meta_help: np.ndarray
    meta_unit: np.ndarray
    new_keys: bytes
    n_histograms: int


def _col(b: bytearray, dtype: str) -> np.ndarray:
    return np.frombuffer(b, dtype=dtype)


def _unknown(_key: bytes) -> int:
    return -1


class SeriesRefs:
    """Raw label bytes -> reference -> Labels, for one tenant (and one admission policy)."""

    def __init__(self, native: bool | None = None):
        self.native = native_default() if native is None else native
        if self.native and NativeRefTable is None:
            raise RuntimeError("the compiled remote-write walk (ingest._rw_native) is not built: run `make install`")
        self.table = NativeRefTable() if self.native else PyRefTable()
        self.labels: list[Labels] = []  # by reference
        self.name_ids = np.zeros(0, np.int64)  # by reference: the series' metric name, interned in ``names``
        self.names: list[str] = []
        self._name_ids: dict[str, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.labels)

    def walk_v1(self, data: bytes | memoryview) -> V1Columns | None:
        """The request's columns with known series' references filled in; None when the encoding is
        unusual (the caller decodes with the protobuf runtime); IngestError when it is not protobuf."""
        if not self.native:
            return self.table.walk_v1(data)
        got = self.table.walk_v1(data)
        if got is None:
            # Not the shape every encoder writes: the Python walk decides, exactly as without the
            # extension (same errors, same fallback), every series looked up as new.
            return walk_columns(data, _unknown)
        refs, koff, klen, sts, ts, vals, ets, eoff, elen, moff, _mlen, n_hist = got
        metadata = list(split_request(data).metadata) if moff else []
        return V1Columns(_col(refs, "<i8"), _col(koff, "<i8"), _col(klen, "<i8"), _col(sts, "<i8"), _col(ts, "<i8"),
                         _col(vals, "<f8"), _col(ets, "<i8"), _col(eoff, "<i8"), _col(elen, "<i8"), metadata, n_hist, data)

    def name_id(self, name: str) -> int:
        i = self._name_ids.get(name)
        if i is None:
            with self._lock:
                i = self._name_ids.get(name)
                if i is None:
                    self.names.append(name)
                    i = self._name_ids[name] = len(self.names) - 1
        return i

    def walk_v2(self, data: bytes | memoryview) -> V2Columns | None:
        """Remote write 2.0 columns (compiled walk only); None: the caller uses the protobuf runtime."""
        if not self.native:
            return None
        got = self.table.walk_v2(data)
        if got is None:
            return None
        *arrays, new_keys, n_hist = got
        return V2Columns(*(_col(a, "<f8" if j == 5 else "<i8") for j, a in enumerate(arrays)), new_keys, n_hist)

    def remember(self, keys: list[bytes], labels: list[Labels]) -> np.ndarray:
        """Insert admitted new series; their references (an existing one if another request got there first)."""
        names = [self.name_id(metric_name(lbl)) for lbl in labels]  # per new series only
        out = np.empty(len(keys), np.int64)
        with self._lock:  # references are dense: labels[ref] is written before the key is findable
            table, lst = self.table, self.labels
            top = len(lst) + len(keys)
            if len(self.name_ids) < top:
                grown = np.zeros(max(top, 2 * len(self.name_ids), 1024), np.int64)
                grown[:len(self.name_ids)] = self.name_ids
                self.name_ids = grown
            name_ids = self.name_ids
            for j, (key, lbl) in enumerate(zip(keys, labels)):
                lst.append(lbl)
                name_ids[len(lst) - 1] = names[j]
                ref = table.insert(key)
                if ref != len(lst) - 1:
                    lst.pop()
                out[j] = ref
        return out
