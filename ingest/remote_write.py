"""Remote write 1.0 (prometheus.WriteRequest) and 2.0 (io.prometheus.write.v2.Request) decoding.

Input: the snappy-decoded protobuf bytes. Output: a validated columnar SampleBatch plus counts of
what was not taken (native histograms are out of scope and refused). Exemplars are decoded per
exemplar (they are sparse) into ``DecodedWrite.exemplar_list`` for ingest/exemplars.py.

Speed: remote write 1.0 is walked by the compiled walk (ingest/csrc/rw_native.c, without the GIL;
ingest/rw_fast.py when it is not built), which finds every known series by its raw label bytes in
the ingest-side series reference table (ingest/series_refs.py) and decodes samples into columns;
the batch carries those references to storage. A series new to the decoder is validated and
admitted (``Admission.series``: tenant label, input limits) once, and remembered only after the
request's admission (``Admission.batch``: rate and active-series limits) accepted it. Remote
write 2.0 has a compiled walk too (a series keyed by its referenced symbols, metadata deduplicated
with numpy); requests with exemplars, unusual encodings of either version, and everything when the
extension is not built go through the protobuf runtime with a cache by label strings (v2) or label
field bytes (v1), under the same admission rules and with the same results.
"""
from __future__ import annotations

import threading
from operator import itemgetter
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ingest.errors import IngestError
from ingest.exemplars import Exemplar
from ingest.proto.messages import V1_TYPE_NAMES, V2_TYPE_NAMES, Label, RawWriteRequest, V1Exemplar, V2Exemplar, V2RawRequest
from ingest.sample_columns import decode_samples
from ingest.series_refs import SeriesRefs
from ingest.validation import check_future, validate_pairs
from storage.batch import MetricMetadata, SampleBatch, SeriesRefColumn
from storage.labels import Labels

V1 = "prometheus.WriteRequest"
V2 = "io.prometheus.write.v2.Request"


class Admission(Protocol):
    """What the server checks before a request's series are written (turboprom/limits.py builds it).
    ``series`` runs once per series new to the decoder (tenant label, input limits) and may return
    changed labels; ``batch`` once per request with the series that were new (rate and
    active-series limits). Either raises IngestError to refuse the whole request."""

    def series(self, labels: Labels) -> Labels: ...

    def batch(self, batch: SampleBatch, new_series: list[Labels]) -> None: ...


@dataclass
class DecodedWrite:
    batch: SampleBatch
    histograms: int = 0  # native histogram samples refused
    exemplars: int = 0  # exemplars in the request
    metadata: list[MetricMetadata] = field(default_factory=list)
    exemplar_list: list[Exemplar] = field(default_factory=list)


class _SeriesCache:
    """Bounded map from a raw series key to its validated canonical Labels (thread-safe enough:
    dict get/set are atomic under the GIL; a full cache is simply cleared)."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self.d: dict[tuple, Labels] = {}

    def put(self, key: tuple, labels: Labels) -> None:
        if len(self.d) >= self.max_entries:
            self.d.clear()
        self.d[key] = labels


class _TenantState:
    """A tenant's known series under one admission policy (a new policy starts afresh)."""

    def __init__(self, admission: Admission | None, max_entries: int, native: bool | None):
        self.admission = admission
        self.refs = SeriesRefs(native)  # remote write 1.0, by raw label bytes
        self.refs_v2 = SeriesRefs(native)  # remote write 2.0, by referenced symbols
        self.v1 = _SeriesCache(max_entries)  # 1.0 through the protobuf runtime, by label field bytes
        self.v2 = _SeriesCache(max_entries)  # 2.0, by label strings


class RemoteWriteDecoder:
    """``native``: the compiled walk (None: when built and not disabled by TURBOPROM_RW_NATIVE=0)."""

    def __init__(self, *, future_tolerance_ms: int = 10 * 60_000, max_cached_series: int = 2_000_000,
                 native: bool | None = None):
        self.future_tolerance_ms = future_tolerance_ms
        self.max_cached_series = max_cached_series
        self.native = native
        self._tenants: dict[str, _TenantState] = {}
        self._lock = threading.Lock()

    def _state(self, tenant: str, admission: Admission | None) -> _TenantState:
        st = self._tenants.get(tenant)
        if st is None or st.admission is not admission or len(st.refs) >= self.max_cached_series:
            with self._lock:
                st = self._tenants.get(tenant)
                if st is None or st.admission is not admission or len(st.refs) >= self.max_cached_series:
                    st = self._tenants[tenant] = _TenantState(admission, self.max_cached_series, self.native)
        return st

    @staticmethod
    def _admit(st: _TenantState, lbl: Labels) -> Labels:
        if st.admission is None:
            return lbl
        return st.admission.series(lbl)

    # ---- series by reference (both versions) ----
    def _series_by_ref(self, st: _TenantState, refs: np.ndarray, key_at, labels_of, n_samples: int | None):
        """The request's distinct series (first-occurrence order), each TimeSeries' index among them,
        and the new series' keys and admitted labels. ``key_at(i)``: raw key of unknown TimeSeries i;
        ``labels_of(key, i)``: its validated labels. In-request repeats of a new key share one
        temporary id (< 0) until ``_remember`` gives it its reference."""
        new_at = np.flatnonzero(refs < 0)
        new_keys: list[bytes] = []
        new_labels: list[Labels] = []
        ids = refs
        if len(new_at):
            ids = refs.copy()
            first: dict[bytes, int] = {}
            try:
                for i in new_at.tolist():
                    key = key_at(i)
                    k = first.get(key)
                    if k is None:
                        k = first[key] = len(new_keys)
                        new_keys.append(key)
                        new_labels.append(self._admit(st, labels_of(key, i)))
                    ids[i] = -1 - k
            except IngestError as e:
                if n_samples is not None:
                    e.samples = e.samples or n_samples
                raise
        uniq, ts_local = _first_occurrence(ids)
        return uniq, ts_local, new_keys, new_labels

    @staticmethod
    def _labels_by_ref(space: SeriesRefs, uniq: np.ndarray, new_labels: list[Labels]) -> list[Labels]:
        known = space.labels
        if not new_labels and len(uniq) > 1:
            return list(itemgetter(*uniq.tolist())(known))  # one C loop
        return [known[r] if r >= 0 else new_labels[-1 - r] for r in uniq.tolist()]

    @staticmethod
    def _remember(space: SeriesRefs, admission: Admission | None, batch: SampleBatch, uniq: np.ndarray,
                  new_keys: list[bytes], new_labels: list[Labels]) -> None:
        """The request's admission, then its new series get references (a refused request's do not)."""
        if admission is not None:
            admission.batch(batch, new_labels)
        if new_keys:
            new_refs = space.remember(new_keys, new_labels)
            uniq = np.where(uniq >= 0, uniq, new_refs[np.maximum(-1 - uniq, 0)])
        batch.series_refs = SeriesRefColumn(space, uniq)

    # ---- 1.0 ----
    def decode_v1(self, data: bytes | memoryview, tenant: str = "default", admission: Admission | None = None) -> DecodedWrite:
        st = self._state(tenant, admission)
        space = st.refs
        cols = space.walk_v1(data)
        if cols is None:  # unusual encoding: let the protobuf runtime decide
            return self.decode_v1_runtime(data, tenant, admission)
        buf, koff, klen = cols.buf, cols.key_off, cols.key_len
        uniq, ts_local, new_keys, new_labels = self._series_by_ref(
            st, cols.refs, lambda i: bytes(buf[int(koff[i]):int(koff[i]) + int(klen[i])]), self._v1_labels, len(cols.timestamps))
        series = self._labels_by_ref(space, uniq, new_labels)
        values, timestamps = cols.values, cols.timestamps
        sidx = ts_local[cols.sample_ts]
        check_future(timestamps, sidx, series, self.future_tolerance_ms)
        meta = self._meta_v1(cols.metadata)
        batch = SampleBatch(series, sidx, timestamps, values, metadata=meta, tenant=tenant)
        self._remember(space, admission, batch, uniq, new_keys, new_labels)
        exs = []
        if len(cols.ex_ts):  # sparse; their series as the client sent it (before admission)
            sent: dict[int, Labels] = {}
            for off, ln, i in zip(cols.ex_off.tolist(), cols.ex_len.tolist(), cols.ex_ts.tolist()):
                lbl = sent.get(i)
                if lbl is None:
                    a = int(koff[i])
                    lbl = sent[i] = self._v1_labels(bytes(buf[a:a + int(klen[i])]), i) if admission is not None \
                        else series[int(ts_local[i])]
                exs.append(_v1_exemplar(bytes(buf[off:off + ln]), lbl, i))
        return DecodedWrite(batch, cols.n_histograms, len(cols.ex_ts), meta, exs)

    def _v1_labels(self, key: bytes, i: int) -> Labels:
        """Validate a series first seen as raw label-field bytes."""
        try:
            ts = RawWriteRequest.FromString(b"\x0a" + encode_varint(len(key)) + key).timeseries[0]
        except Exception as e:  # noqa: BLE001
            raise IngestError("bad_protobuf", f"protobuf: malformed labels in timeseries {i}: {e}") from None
        return self._validate_v1(tuple(ts.labels), i)

    @staticmethod
    def _meta_v1(items) -> list[MetricMetadata]:
        return [MetricMetadata(m.metric_family_name, V1_TYPE_NAMES[m.type] if 0 <= m.type < len(V1_TYPE_NAMES) else "unknown",
                               m.help, m.unit) for m in items if m.metric_family_name]

    def decode_v1_runtime(self, data: bytes | memoryview, tenant: str = "default", admission: Admission | None = None) -> DecodedWrite:
        try:
            req = RawWriteRequest.FromString(data)
        except Exception as e:  # noqa: BLE001 - google.protobuf.message.DecodeError
            raise IngestError("bad_protobuf", f"protobuf: cannot decode prometheus.WriteRequest: {e}") from None
        st = self._state(tenant, admission)
        cache = st.v1.d
        pending: list[tuple[tuple, Labels]] = []
        local: dict[tuple, int] = {}
        series: list[Labels] = []
        ts_local: list[int] = []
        counts: list[int] = []
        samples: list[bytes] = []
        hist = ex = 0
        exs: list[Exemplar] = []
        for i, ts in enumerate(req.timeseries):
            key = tuple(ts.labels)
            li = local.get(key)
            if li is None:
                lbl = cache.get(key)
                if lbl is None:
                    lbl = self._admit(st, self._validate_v1(key, i))
                    pending.append((key, lbl))
                li = len(series)
                local[key] = li
                series.append(lbl)
            s = ts.samples
            samples.extend(s)
            counts.append(len(s))
            ts_local.append(li)
            if ts.histograms:
                hist += len(ts.histograms)
            if ts.exemplars:
                ex += len(ts.exemplars)
                sent = self._validate_v1(key, i) if admission is not None else series[li]
                exs.extend(_v1_exemplar(b, sent, i) for b in ts.exemplars)
        batch = self._batch(series, ts_local, counts, samples, tenant)
        meta = self._meta_v1(req.metadata)
        batch.metadata = meta
        self._admitted(st.v1, admission, batch, pending)
        return DecodedWrite(batch, hist, ex, meta, exs)

    def _validate_v1(self, key: tuple, i: int) -> Labels:
        pairs = []
        for raw in key:
            try:
                lb = Label.FromString(raw)
            except Exception as e:  # noqa: BLE001
                raise IngestError("bad_protobuf", f"protobuf: malformed Label in timeseries {i}: {e}") from None
            pairs.append((lb.name, lb.value))
        try:
            lbl = validate_pairs(pairs)
        except IngestError as e:
            raise IngestError(e.reason, f"timeseries {i}: {e.message}") from None
        return lbl

    # ---- 2.0 ----
    def decode_v2(self, data: bytes | memoryview, tenant: str = "default", admission: Admission | None = None) -> DecodedWrite:
        st = self._state(tenant, admission)
        cols = st.refs_v2.walk_v2(data)
        if cols is None or len(cols.ex_ts) or (len(cols.meta_type) and (
                ((cols.meta_type >= 0) & ((cols.meta_help >= len(cols.sym_off)) | (cols.meta_unit >= len(cols.sym_off)))).any())):
            # unusual encodings, exemplars (sparse) and anything the runtime words as an error
            return self.decode_v2_runtime(data, tenant, admission)
        space = st.refs_v2
        keys, koff, klen = cols.new_keys, cols.key_off, cols.key_len
        uniq, ts_local, new_keys, new_labels = self._series_by_ref(
            st, cols.refs, lambda i: keys[int(koff[i]):int(koff[i]) + int(klen[i])],
            lambda key, i: self._validate_v2(_v2_key_strings(key), i), None)
        series = self._labels_by_ref(space, uniq, new_labels)
        values, timestamps = cols.values, cols.timestamps
        sidx = ts_local[cols.sample_ts]
        check_future(timestamps, sidx, series, self.future_tolerance_ms)
        meta = self._meta_v2(cols, space, uniq, new_labels, ts_local, data)
        batch = SampleBatch(series, sidx, timestamps, values, metadata=meta, tenant=tenant)
        self._remember(space, admission, batch, uniq, new_keys, new_labels)
        return DecodedWrite(batch, cols.n_histograms, 0, batch.metadata, [])

    @staticmethod
    def _meta_v2(cols, space: SeriesRefs, uniq: np.ndarray, new_labels: list[Labels], ts_local: np.ndarray,
                 data: bytes | memoryview) -> list[MetricMetadata]:
        """Each family's metadata from the first occurrence of its series that carries any (as the
        runtime path), without Python per series: candidates are keyed by (family name id, type,
        help, unit) and deduplicated with numpy; Python sees only the distinct ones."""
        mt, mh, mu = cols.meta_type, cols.meta_help, cols.meta_unit
        if not len(mt):
            return []
        firsts = np.unique(ts_local, return_index=True)[1]  # each series' first TimeSeries
        cand = np.sort(firsts[(mt[firsts] >= 0) & ((mt[firsts] != 0) | (mh[firsts] != 0) | (mu[firsts] != 0))])
        if not len(cand):
            return []
        u = uniq[ts_local[cand]]
        name_ids = np.empty(len(cand), np.int64)
        known = u >= 0
        name_ids[known] = space.name_ids[u[known]]
        for j in np.flatnonzero(~known).tolist():
            name_ids[j] = space.name_id(dict(new_labels[-1 - int(u[j])]).get("__name__", ""))
        rows = np.stack([name_ids, mt[cand], mh[cand], mu[cand]], axis=1)
        _, idx = np.unique(rows, axis=0, return_index=True)
        soff, slen = cols.sym_off, cols.sym_len

        def sym(r: int) -> str:
            a = int(soff[r])
            return bytes(data[a:a + int(slen[r])]).decode()

        out: dict[str, MetricMetadata] = {}
        for nid, t, h, un in rows[np.sort(idx)].tolist():
            name = space.names[nid]
            if name not in out:
                out[name] = MetricMetadata(name, V2_TYPE_NAMES[t] if 0 <= t < 8 else "unknown", sym(h), sym(un))
        return list(out.values())

    def decode_v2_runtime(self, data: bytes | memoryview, tenant: str = "default", admission: Admission | None = None) -> DecodedWrite:
        try:
            req = V2RawRequest.FromString(data)
        except Exception as e:  # noqa: BLE001
            raise IngestError("bad_protobuf", f"protobuf: cannot decode io.prometheus.write.v2.Request: {e}") from None
        symbols = list(req.symbols)
        if symbols and symbols[0] != "":
            raise IngestError("bad_protobuf", "remote write 2.0: symbols table must start with the empty string")
        get = symbols.__getitem__
        st = self._state(tenant, admission)
        cache = st.v2.d
        pending: list[tuple[tuple, Labels]] = []
        local: dict[tuple, int] = {}
        series: list[Labels] = []
        ts_local: list[int] = []
        counts: list[int] = []
        samples: list[bytes] = []
        hist = ex = 0
        exs: list[Exemplar] = []
        meta: dict[str, MetricMetadata] = {}
        for i, ts in enumerate(req.timeseries):
            refs = ts.labels_refs
            try:
                key = tuple(map(get, refs))
            except IndexError:
                raise IngestError("bad_protobuf", f"timeseries {i}: label reference out of range of the symbols table "
                                                  f"({len(symbols)} symbols)") from None
            li = local.get(key)
            if li is None:
                lbl = cache.get(key)
                if lbl is None:
                    lbl = self._admit(st, self._validate_v2(key, i))
                    pending.append((key, lbl))
                li = len(series)
                local[key] = li
                series.append(lbl)
                if ts.HasField("metadata"):
                    m = ts.metadata
                    if m.type or m.help_ref or m.unit_ref:
                        name = dict(lbl).get("__name__", "")
                        try:
                            meta.setdefault(name, MetricMetadata(name, V2_TYPE_NAMES[m.type] if 0 <= m.type < 8 else "unknown",
                                                                 get(m.help_ref), get(m.unit_ref)))
                        except IndexError:
                            raise IngestError("bad_protobuf", f"timeseries {i}: metadata reference out of range") from None
            s = ts.samples
            samples.extend(s)
            counts.append(len(s))
            ts_local.append(li)
            if ts.histograms:
                hist += len(ts.histograms)
            if ts.exemplars:
                ex += len(ts.exemplars)
                sent = self._validate_v2(key, i) if admission is not None else series[li]
                exs.extend(_v2_exemplar(b, sent, i, symbols) for b in ts.exemplars)
        batch = self._batch(series, ts_local, counts, samples, tenant)
        batch.metadata = list(meta.values())
        self._admitted(st.v2, admission, batch, pending)
        return DecodedWrite(batch, hist, ex, batch.metadata, exs)

    def _validate_v2(self, key: tuple, i: int) -> Labels:
        if len(key) % 2:
            raise IngestError("bad_protobuf", f"timeseries {i}: odd number of label references ({len(key)})")
        pairs = list(zip(key[0::2], key[1::2]))
        try:
            lbl = validate_pairs(pairs)
        except IngestError as e:
            raise IngestError(e.reason, f"timeseries {i}: {e.message}") from None
        return lbl

    # ---- shared ----
    @staticmethod
    def _admitted(cache: _SeriesCache, admission: Admission | None, batch: SampleBatch, pending: list[tuple[tuple, Labels]]) -> None:
        """The request's admission, then its new series are remembered (a refused request's are not)."""
        if admission is not None:
            admission.batch(batch, [lbl for _, lbl in pending])
        for key, lbl in pending:
            cache.put(key, lbl)

    def _batch(self, series: list[Labels], ts_local: list[int], counts: list[int], samples: list[bytes], tenant: str) -> SampleBatch:
        values, timestamps = decode_samples(samples)
        sidx = np.repeat(np.asarray(ts_local, np.int64), np.asarray(counts, np.int64))
        check_future(timestamps, sidx, series, self.future_tolerance_ms)
        return SampleBatch(series, sidx, timestamps, values, tenant=tenant)


def _v1_exemplar(data: bytes, series: Labels, i: int) -> Exemplar:
    try:
        e = V1Exemplar.FromString(data)
    except Exception as err:  # noqa: BLE001
        raise IngestError("bad_protobuf", f"protobuf: malformed Exemplar in timeseries {i}: {err}") from None
    return Exemplar(series, tuple(sorted((lb.name, lb.value) for lb in e.labels)), e.value, e.timestamp)


def _v2_exemplar(data: bytes, series: Labels, i: int, symbols: list[str]) -> Exemplar:
    try:
        e = V2Exemplar.FromString(data)
        refs = [symbols[r] for r in e.labels_refs]
    except IndexError:
        raise IngestError("bad_protobuf", f"timeseries {i}: exemplar label reference out of range of the symbols table") from None
    except Exception as err:  # noqa: BLE001
        raise IngestError("bad_protobuf", f"protobuf: malformed Exemplar in timeseries {i}: {err}") from None
    if len(refs) % 2:
        raise IngestError("bad_protobuf", f"timeseries {i}: odd number of exemplar label references ({len(refs)})")
    return Exemplar(series, tuple(sorted(zip(refs[0::2], refs[1::2]))), e.value, e.timestamp)


def _v2_key_strings(key: bytes) -> tuple[str, ...]:
    """The label strings of a remote write 2.0 series key (each symbol as varint length, UTF-8 bytes)."""
    out = []
    i, n = 0, len(key)
    while i < n:
        ln = shift = 0
        while True:
            b = key[i]
            i += 1
            ln |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        out.append(key[i:i + ln].decode())
        i += ln
    return tuple(out)


def _first_occurrence(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values of ``ids`` in first-occurrence order, and each position's index among them."""
    n = len(ids)
    if n < 2 or bool((np.diff(np.sort(ids)) != 0).all()):  # every series once per request: the usual case
        return ids, np.arange(n, dtype=np.int64)
    u, first, inv = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(u), np.int64)
    rank[order] = np.arange(len(u), dtype=np.int64)
    return u[order], rank[inv.ravel()]


def encode_varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int (also used by encoders in bench/)."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)
