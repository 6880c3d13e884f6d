"""Column-wise walk of remote-write 1.0 TimeSeries messages: the pure-Python fallback of the
compiled walk (ingest/csrc/rw_native.c), used when that extension is not built.

Why hand-written: with the protobuf runtime every label and sample becomes a Python object, and
per-series Python dominated scrape-shaped payloads (2,000 series x 1 sample). Here upb only splits
the request into one bytes object per TimeSeries; the fields of *all* series are then walked
together with numpy, one field position per step (labels first, then samples, as every encoder
writes them). A series' key is the raw bytes of its label fields, looked up in the decoder's
cache; samples are decoded straight from the buffer. Anything unexpected (unknown field, labels
after samples, bad lengths) returns None and the caller uses the protobuf-runtime path.

``PyRefTable`` has the compiled ``RefTable``'s interface (``walk_v1``, ``insert``, ``len``) and
gives the same columns (``V1Columns``), so everything after the walk is one code path.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ingest.errors import IngestError
from ingest.sample_columns import decode_sample_region

TAG_LABEL, TAG_SAMPLE, TAG_EXEMPLAR, TAG_HISTOGRAM = 0x0A, 0x12, 0x1A, 0x22
_PAD = 16


class Walk:
    __slots__ = ("starts", "label_end", "sample_off", "sample_len", "sample_sid", "n_exemplars", "n_histograms", "buf", "raw",
                 "exemplar_off", "exemplar_len", "exemplar_sid")


def walk(tss: list[bytes]) -> Walk | None:
    n = len(tss)
    raw = b"".join(tss)
    buf = np.frombuffer(raw + b"\x00" * _PAD, dtype=np.uint8)
    lens = np.fromiter(map(len, tss), dtype=np.int64, count=n)
    starts = np.zeros(n, np.int64)
    if n:
        np.cumsum(lens[:-1], out=starts[1:])
    ends = starts + lens
    label_end = starts.copy()
    in_labels = np.ones(n, bool)
    s_off: list[np.ndarray] = []
    s_len: list[np.ndarray] = []
    s_sid: list[np.ndarray] = []
    e_off: list[np.ndarray] = []
    e_len: list[np.ndarray] = []
    e_sid: list[np.ndarray] = []
    n_ex = n_h = 0
    sid = np.arange(n, dtype=np.int64)
    pos = starts.copy()
    end = ends.copy()
    act = pos < end
    sid, pos, end = sid[act], pos[act], end[act]
    while len(pos):
        tag = buf[pos]
        b1 = buf[pos + 1]
        if (b1 < 0x80).all():  # one-byte lengths (fields under 128 bytes): the common case
            length = b1.astype(np.int64)
            nxt = pos + 2 + length
            payload = pos + 2
        else:
            length = np.zeros(len(pos), np.int64)
            nb = np.zeros(len(pos), np.int64)
            done = np.zeros(len(pos), bool)
            for j in range(5):  # varint length (<= 5 bytes for 32-bit lengths)
                b = buf[pos + 1 + j]
                m = ~done
                length[m] |= (b[m].astype(np.int64) & 0x7F) << (7 * j)
                nb[m] += 1
                done |= b < 0x80
                if done.all():
                    break
            if not done.all():
                return None
            payload = pos + 1 + nb
            nxt = payload + length
        if (nxt > end).any():
            return None
        is_label = tag == TAG_LABEL
        if is_label.all():
            if not in_labels[sid].all():  # labels must come first
                return None
            label_end[sid] = nxt
        else:
            is_sample = tag == TAG_SAMPLE
            is_ex = tag == TAG_EXEMPLAR
            is_h = tag == TAG_HISTOGRAM
            if not (is_label | is_sample | is_ex | is_h).all():
                return None
            if is_label.any():
                if (is_label & ~in_labels[sid]).any():
                    return None
                label_end[sid[is_label]] = nxt[is_label]
            in_labels[sid[~is_label]] = False
            if is_sample.all():
                s_off.append(payload)
                s_len.append(length)
                s_sid.append(sid)
            elif is_sample.any():
                s_off.append(payload[is_sample])
                s_len.append(length[is_sample])
                s_sid.append(sid[is_sample])
            if is_ex.any():
                e_off.append(payload[is_ex])
                e_len.append(length[is_ex])
                e_sid.append(sid[is_ex])
                n_ex += int(is_ex.sum())
            n_h += int(is_h.sum())
        pos = nxt
        act = pos < end
        if not act.all():
            sid, pos, end = sid[act], pos[act], end[act]
    w = Walk()
    w.buf, w.raw = buf, raw
    w.label_end = label_end
    w.starts = starts
    if s_off:
        off, ln, ss = np.concatenate(s_off), np.concatenate(s_len), np.concatenate(s_sid)
        order = np.argsort(ss, kind="stable")  # per series, in field order
        w.sample_off, w.sample_len, w.sample_sid = off[order], ln[order], ss[order]
    else:
        w.sample_off = w.sample_len = w.sample_sid = np.zeros(0, np.int64)
    w.n_exemplars, w.n_histograms = n_ex, n_h
    if e_off:
        w.exemplar_off, w.exemplar_len, w.exemplar_sid = np.concatenate(e_off), np.concatenate(e_len), np.concatenate(e_sid)
    else:
        w.exemplar_off = w.exemplar_len = w.exemplar_sid = np.zeros(0, np.int64)
    return w


def label_keys(w: Walk) -> list[bytes]:
    """Raw label-field bytes of every series (the series cache key)."""
    raw = w.raw
    return [raw[a:b] for a, b in zip(w.starts.tolist(), w.label_end.tolist())]


class V1Columns(NamedTuple):
    """One remote-write 1.0 request as columns. Per TimeSeries (request order): ``refs`` (the
    series' reference, -1 when unknown), ``key_off``/``key_len`` (its raw label-field bytes in
    ``buf``). Per Sample: ``sample_ts`` (TimeSeries position), ``timestamps``, ``values``. Per
    Exemplar: ``ex_ts``, ``ex_off``, ``ex_len`` (its bytes in ``buf``). ``metadata``: the
    request's MetricMetadata messages; ``n_histograms``: native histogram samples (refused)."""

    refs: np.ndarray
    key_off: np.ndarray
    key_len: np.ndarray
    sample_ts: np.ndarray
    timestamps: np.ndarray
    values: np.ndarray
    ex_ts: np.ndarray
    ex_off: np.ndarray
    ex_len: np.ndarray
    metadata: list
    n_histograms: int
    buf: bytes | memoryview


def split_request(data: bytes | memoryview):
    from ingest.proto.messages import SplitWriteRequest

    try:
        return SplitWriteRequest.FromString(data)
    except Exception as e:  # noqa: BLE001 - google.protobuf.message.DecodeError
        raise IngestError("bad_protobuf", f"protobuf: cannot decode prometheus.WriteRequest: {e}") from None


def walk_columns(data: bytes | memoryview, lookup) -> V1Columns | None:
    """The fallback walk: upb splits the request, ``walk`` finds the fields, ``lookup(key) -> ref or -1``."""
    split = split_request(data)
    w = walk(list(split.timeseries))
    if w is None:
        return None
    refs = np.fromiter(map(lookup, label_keys(w)), np.int64, count=len(w.starts))
    values, timestamps = decode_sample_region(w.buf, w.sample_off, w.sample_len)
    return V1Columns(refs, w.starts, w.label_end - w.starts, w.sample_sid, timestamps, values, w.exemplar_sid,
                     w.exemplar_off, w.exemplar_len, list(split.metadata), w.n_histograms, w.raw)


class PyRefTable:
    """Known series by raw label bytes -> dense references (the compiled RefTable's fallback)."""

    def __init__(self) -> None:
        self._d: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._d)

    def insert(self, key: bytes) -> int:
        return self._d.setdefault(key, len(self._d))

    def walk_v1(self, data: bytes | memoryview) -> V1Columns | None:
        get = self._d.get
        return walk_columns(data, lambda k: get(k, -1))
