"""Remote write 1.0 (prometheus.WriteRequest) and 2.0 (io.prometheus.write.v2.Request) decoding.

Input: the snappy-decoded protobuf bytes. Output: a validated columnar SampleBatch plus counts of
what was not taken (native histograms are out of scope and refused). Exemplars are decoded per
exemplar (they are sparse) into ``DecodedWrite.exemplar_list`` for ingest/exemplars.py.

Speed: a known series is found by its raw label bytes (v1) or its label strings (v2) in a
bounded cache, so no Label objects are built for it; samples are decoded column-wise
(ingest/sample_columns.py). The remaining per-series Python is one dict lookup and list appends.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from ingest.errors import IngestError
from ingest.exemplars import Exemplar
from ingest.proto.messages import (V1_TYPE_NAMES, V2_TYPE_NAMES, Label, RawWriteRequest, SplitWriteRequest, V1Exemplar,
                                   V2Exemplar, V2RawRequest)
from ingest.rw_fast import label_keys, walk
from ingest.sample_columns import decode_sample_region, decode_samples
from ingest.validation import check_future, validate_pairs
from storage.batch import MetricMetadata, SampleBatch
from storage.labels import Labels

V1 = "prometheus.WriteRequest"
V2 = "io.prometheus.write.v2.Request"


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


class RemoteWriteDecoder:
    def __init__(self, *, future_tolerance_ms: int = 10 * 60_000, max_cached_series: int = 2_000_000):
        self.future_tolerance_ms = future_tolerance_ms
        self._v1 = _SeriesCache(max_cached_series)
        self._v2 = _SeriesCache(max_cached_series)
        self._lock = threading.Lock()

    # ---- 1.0 ----
    def decode_v1(self, data: bytes | memoryview, tenant: str = "default") -> DecodedWrite:
        try:
            split = SplitWriteRequest.FromString(data)
        except Exception as e:  # noqa: BLE001 - google.protobuf.message.DecodeError
            raise IngestError("bad_protobuf", f"protobuf: cannot decode prometheus.WriteRequest: {e}") from None
        tss = list(split.timeseries)
        w = walk(tss)
        if w is None:  # unusual encoding: let the protobuf runtime decide
            return self.decode_v1_runtime(data, tenant)
        keys = label_keys(w)
        cache = self._v1.d
        uniq: dict[bytes, int] = dict.fromkeys(keys)  # type: ignore[assignment]
        if len(uniq) == len(keys):  # the usual case: every series once per request
            ts_local = np.arange(len(keys), dtype=np.int64)
        else:
            uniq = {}
            setd = uniq.setdefault
            ts_local = np.fromiter((setd(k, len(uniq)) for k in keys), np.int64, count=len(keys))
        series = list(map(cache.get, uniq))
        if None in series:
            for j, k in enumerate(uniq):
                if series[j] is None:
                    series[j] = self._new_v1_raw(k, j)
        values, timestamps = decode_sample_region(w.buf, w.sample_off, w.sample_len)
        sidx = ts_local[w.sample_sid]
        check_future(timestamps, sidx, series, self.future_tolerance_ms)
        meta = self._meta_v1(split.metadata)
        batch = SampleBatch(series, sidx, timestamps, values, metadata=meta, tenant=tenant)
        raw = w.raw  # exemplar offsets index the concatenated timeseries bytes
        exs = [_v1_exemplar(raw[off:off + ln], series[int(ts_local[sid])], sid)
               for off, ln, sid in zip(w.exemplar_off.tolist(), w.exemplar_len.tolist(), w.exemplar_sid.tolist())]
        return DecodedWrite(batch, w.n_histograms, w.n_exemplars, meta, exs)

    def _new_v1_raw(self, key: bytes, i: int) -> Labels:
        """Validate a series first seen as raw label-field bytes (cached by those bytes)."""
        try:
            ts = RawWriteRequest.FromString(b"\x0a" + encode_varint(len(key)) + key).timeseries[0]
        except Exception as e:  # noqa: BLE001
            raise IngestError("bad_protobuf", f"protobuf: malformed labels in timeseries {i}: {e}") from None
        lbl = self._new_v1(tuple(ts.labels), i)
        self._v1.put(key, lbl)
        return lbl

    @staticmethod
    def _meta_v1(items) -> list[MetricMetadata]:
        return [MetricMetadata(m.metric_family_name, V1_TYPE_NAMES[m.type] if 0 <= m.type < len(V1_TYPE_NAMES) else "unknown",
                               m.help, m.unit) for m in items if m.metric_family_name]

    def decode_v1_runtime(self, data: bytes | memoryview, tenant: str = "default") -> DecodedWrite:
        try:
            req = RawWriteRequest.FromString(data)
        except Exception as e:  # noqa: BLE001 - google.protobuf.message.DecodeError
            raise IngestError("bad_protobuf", f"protobuf: cannot decode prometheus.WriteRequest: {e}") from None
        cache = self._v1.d
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
                    lbl = self._new_v1(key, i)
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
                exs.extend(_v1_exemplar(b, series[li], i) for b in ts.exemplars)
        batch = self._batch(series, ts_local, counts, samples, tenant)
        meta = self._meta_v1(req.metadata)
        batch.metadata = meta
        return DecodedWrite(batch, hist, ex, meta, exs)

    def _new_v1(self, key: tuple, i: int) -> Labels:
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
        self._v1.put(key, lbl)
        return lbl

    # ---- 2.0 ----
    def decode_v2(self, data: bytes | memoryview, tenant: str = "default") -> DecodedWrite:
        try:
            req = V2RawRequest.FromString(data)
        except Exception as e:  # noqa: BLE001
            raise IngestError("bad_protobuf", f"protobuf: cannot decode io.prometheus.write.v2.Request: {e}") from None
        symbols = list(req.symbols)
        if symbols and symbols[0] != "":
            raise IngestError("bad_protobuf", "remote write 2.0: symbols table must start with the empty string")
        get = symbols.__getitem__
        cache = self._v2.d
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
                    lbl = self._new_v2(key, i)
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
                exs.extend(_v2_exemplar(b, series[li], i, symbols) for b in ts.exemplars)
        batch = self._batch(series, ts_local, counts, samples, tenant)
        batch.metadata = list(meta.values())
        return DecodedWrite(batch, hist, ex, batch.metadata, exs)

    def _new_v2(self, key: tuple, i: int) -> Labels:
        if len(key) % 2:
            raise IngestError("bad_protobuf", f"timeseries {i}: odd number of label references ({len(key)})")
        pairs = list(zip(key[0::2], key[1::2]))
        try:
            lbl = validate_pairs(pairs)
        except IngestError as e:
            raise IngestError(e.reason, f"timeseries {i}: {e.message}") from None
        self._v2.put(key, lbl)
        return lbl

    # ---- shared ----
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
