"""Remote read codec: ``prometheus.ReadRequest`` in; ``ReadResponse`` (SAMPLES) or streamed
``ChunkedReadResponse`` frames (STREAMED_XOR_CHUNKS) out. Formats as Prometheus's
``storage/remote/codec.go`` and ``chunked.go``.

Responses are written as protobuf wire bytes directly: the samples of a ``SeriesSet`` become
``Sample`` records column-wise with numpy (tag, length, 8 value bytes, varint timestamp), so a
response of millions of samples creates no Python object per sample; labels and chunk headers are
written per series and per chunk. Every field is written explicitly (also zeros), which any protobuf
decoder reads the same as the omitted defaults, and keeps ``-0.0`` and NaN payloads bit-exact.

A frame of the streamed response is ``uvarint(len(msg))``, the big-endian CRC-32 (Castagnoli) of
``msg``, then ``msg``: one ``ChunkedReadResponse`` holding one series (a series whose chunks pass
``MAX_BYTES_IN_FRAME`` is split over several frames, as Prometheus does).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator, Sequence

import google_crc32c
import numpy as np

from ingest.remote_write import encode_varint
from storage.labels import Labels
from storage.matchers import Matcher
from storage.series_set import SeriesSet
from storage.xor_chunk import chunk_bounds, encode_chunks, varint_bytes

_MASK64 = (1 << 64) - 1  # protobuf int64: negative values as their two's complement uvarint

SAMPLES, STREAMED_XOR_CHUNKS = 0, 1
RESPONSE_TYPE_NAMES = {SAMPLES: "SAMPLES", STREAMED_XOR_CHUNKS: "STREAMED_XOR_CHUNKS"}
SAMPLES_CONTENT_TYPE = "application/x-protobuf"
STREAMED_CONTENT_TYPE = "application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse"
MAX_BYTES_IN_FRAME = 1024 * 1024  # Prometheus's --storage.remote.read-max-bytes-in-frame default
MATCHER_OPS = {0: "=", 1: "!=", 2: "=~", 3: "!~"}
CHUNK_XOR = 1


class ReadRequestError(ValueError):
    """The caller's request cannot be served (answered 400 bad_data)."""


def visible_matchers(ms: list[Matcher]) -> list[Matcher] | None:
    """A tenant's series have no visible ``__tenant__`` label (tenancy.TenantView strips it), so a
    matcher on it reads the label as absent (""): one that accepts "" is dropped, one that does not
    selects nothing (None)."""
    from storage.labels import TENANT_LABEL

    out = []
    for m in ms:
        if m.name == TENANT_LABEL:
            if not m.matches_empty:
                return None
            continue
        out.append(m)
    return out


@dataclass
class ReadQuery:
    start_ms: int
    end_ms: int
    matchers: list[Matcher]


def negotiate(accepted: Sequence[int]) -> int:
    """The first supported response type in the caller's order; none listed: SAMPLES."""
    if not accepted:
        return SAMPLES
    for t in accepted:
        if t in RESPONSE_TYPE_NAMES:
            return int(t)
    raise ReadRequestError(f"server does not support any of the requested response types: {list(accepted)}; "
                           f"supported: {sorted(RESPONSE_TYPE_NAMES.values())}")


def parse_request(raw: bytes | memoryview) -> tuple[list[ReadQuery], int]:
    """Decoded (snappy already undone) ReadRequest -> queries with compiled matchers, response type.
    Regexes compile through storage.matchers (RE2, Go syntax, fully anchored)."""
    from google.protobuf.message import DecodeError

    from ingest.proto.messages import ReadRequest

    try:
        req = ReadRequest.FromString(bytes(raw))
    except DecodeError as e:
        raise ReadRequestError(f"unable to decode the read request: {e}") from None
    rtype = negotiate(list(req.accepted_response_types))
    queries: list[ReadQuery] = []
    for qi, q in enumerate(req.queries):
        ms: list[Matcher] = []
        for m in q.matchers:
            op = MATCHER_OPS.get(int(m.type))
            if op is None:
                raise ReadRequestError(f"query {qi}: invalid matcher type {int(m.type)} for label {m.name!r}")
            try:
                ms.append(Matcher(m.name, op, m.value))
            except ValueError as e:
                raise ReadRequestError(f"query {qi}: {e}") from None
        queries.append(ReadQuery(int(q.start_timestamp_ms), int(q.end_timestamp_ms), ms))
    return queries, rtype


# ------------------------------------------------------------------------------ wire helpers
def _field_bytes(tag: int, payload: bytes) -> bytes:
    return bytes((tag,)) + encode_varint(len(payload)) + payload


def labels_bytes(labels: Labels, tag: int = 0x0A) -> bytes:
    """Repeated ``Label`` field (field 1 of TimeSeries and of ChunkedSeries)."""
    parts = []
    for n, v in labels:
        nb, vb = n.encode(), v.encode()
        parts.append(_field_bytes(tag, _field_bytes(0x0A, nb) + _field_bytes(0x12, vb)))
    return b"".join(parts)


def sample_records(timestamps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every sample as a ``samples`` field of TimeSeries (field 2: ``Sample{value=1 double,
    timestamp=2 int64}``), concatenated; returns (uint8 bytes, record byte offsets (N + 1))."""
    n = len(timestamps)
    if n == 0:
        return np.empty(0, np.uint8), np.zeros(1, np.int64)
    vi, vlen = varint_bytes(np.ascontiguousarray(timestamps, dtype=np.int64).view(np.uint64))
    m = np.zeros((n, 22), dtype=np.uint8)
    m[:, 0] = 0x12
    m[:, 1] = (10 + vlen).astype(np.uint8)
    m[:, 2] = 0x09
    m[:, 3:11] = np.ascontiguousarray(values, dtype="<f8").view(np.uint8).reshape(n, 8)
    m[:, 11] = 0x10
    m[:, 12:22] = vi
    reclen = 12 + vlen
    keep = np.arange(22)[None, :] < reclen[:, None]
    offs = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(reclen, out=offs[1:])
    return m[keep], offs


def query_result_bytes(ss: SeriesSet) -> bytes:
    """One ``QueryResult`` message body (its TimeSeries, in the set's label order)."""
    recs, roffs = sample_records(ss.timestamps, ss.values)
    buf = recs.tobytes()
    parts = []
    offsets = ss.offsets.tolist()
    for s, lbl in enumerate(ss.labels):  # per series: labels and the slice of its sample records
        body = labels_bytes(lbl) + buf[int(roffs[offsets[s]]):int(roffs[offsets[s + 1]])]
        parts.append(_field_bytes(0x0A, body))
    return b"".join(parts)


def read_response_bytes(results: Sequence[bytes]) -> bytes:
    """``ReadResponse`` from QueryResult bodies, in query order."""
    return b"".join(_field_bytes(0x0A, r) for r in results)


# ------------------------------------------------------------------------------ streamed chunks
def frame(msg: bytes) -> bytes:
    return encode_varint(len(msg)) + struct.pack(">I", google_crc32c.value(msg)) + msg


def _chunk_bytes(mint: int, maxt: int, data: bytes) -> bytes:
    body = b"\x08" + encode_varint(mint & _MASK64) + b"\x10" + encode_varint(maxt & _MASK64) + b"\x18\x01" + _field_bytes(0x22, data)
    return _field_bytes(0x12, body)  # ChunkedSeries.chunks (field 2)


def chunked_frames(ss: SeriesSet, query_index: int, max_bytes: int = MAX_BYTES_IN_FRAME) -> Iterator[bytes]:
    """Framed ``ChunkedReadResponse`` messages of one query's series: XOR chunks of at most 120
    samples, all encoded in one vectorised pass, then one series per frame."""
    bounds = chunk_bounds(ss.offsets)
    data, doffs = encode_chunks(ss.timestamps, ss.values, bounds)
    chunk_start = np.searchsorted(bounds[:-1], ss.offsets[:-1], side="left")  # first chunk of each series
    chunk_end = np.searchsorted(bounds[:-1], ss.offsets[1:], side="left")
    mins = ss.timestamps[bounds[:-1]].tolist() if len(bounds) > 1 else []
    maxs = ss.timestamps[bounds[1:] - 1].tolist() if len(bounds) > 1 else []
    d = doffs.tolist()
    qi = (b"\x10" + encode_varint(query_index)) if query_index else b""
    for s, lbl in enumerate(ss.labels):
        a, b = int(chunk_start[s]), int(chunk_end[s])
        if a == b:
            continue  # no samples in range: Prometheus sends no frame for a series without chunks
        lb = labels_bytes(lbl)
        budget = max_bytes - len(lb)
        pending: list[bytes] = []
        left = budget
        for c in range(a, b):  # per chunk (<= 120 samples each)
            cb = _chunk_bytes(mins[c], maxs[c], data[d[c]:d[c + 1]])
            pending.append(cb)
            left -= len(cb)
            if left > 0 and c + 1 < b:
                continue
            series = _field_bytes(0x0A, lb + b"".join(pending))
            yield frame(series + qi)
            pending, left = [], budget
