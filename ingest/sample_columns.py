"""Column-wise decoding of encoded remote-write ``Sample`` messages (double value=1; int64 timestamp=2).

Hand-written because no library decodes a repeated sub-message into numpy columns: upb would
give one Python object per sample. Samples arrive as raw bytes (see RawTimeSeries in remote.proto),
are concatenated, grouped by encoded length, and each group is decoded as a 2-D uint8 matrix.
Encodings other than the canonical field order (rare) fall back to the protobuf runtime.
"""
from __future__ import annotations

import numpy as np

from ingest.errors import IngestError


def _varint_cols(mat: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode a varint occupying columns ``start:`` of every row; returns (values, ok mask)."""
    body = mat[:, start:]
    k = body.shape[1]
    if k == 0 or k > 10:
        return np.zeros(len(mat), np.int64), np.zeros(len(mat), bool)
    cont = body >= 0x80
    ok = (~cont[:, -1]) & cont[:, :-1].all(axis=1) if k > 1 else ~cont[:, 0]
    acc = np.zeros(len(mat), np.uint64)
    for j in range(k):  # loop over byte positions (<= 10), not samples
        acc |= (body[:, j] & 0x7F).astype(np.uint64) << np.uint64(7 * j)
    return acc.view(np.int64), ok


def decode_samples(samples: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(values float64, timestamps int64) of encoded Sample messages, in order."""
    n = len(samples)
    if n == 0:
        return np.zeros(0, np.float64), np.zeros(0, np.int64)
    lens = np.fromiter(map(len, samples), dtype=np.int64, count=n)
    buf = np.frombuffer(b"".join(samples), dtype=np.uint8)
    offs = np.zeros(n, np.int64)
    np.cumsum(lens[:-1], out=offs[1:])
    return decode_sample_region(buf, offs, lens)


def decode_sample_region(buf: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode the Sample messages stored at ``buf[offs[i]:offs[i]+lens[i]]`` (uint8 buffer)."""
    n = len(offs)
    values = np.zeros(n, np.float64)
    ts = np.zeros(n, np.int64)
    if n == 0:
        return values, ts
    done = lens == 0  # empty message: value 0, timestamp 0
    first = np.zeros(n, np.uint8)
    nz = ~done
    first[nz] = buf[offs[nz]]
    for length in np.unique(lens[nz]).tolist():
        rows = np.nonzero((lens == length) & nz)[0]
        mat = buf[offs[rows, None] + np.arange(length)]
        f = first[rows]
        # value then timestamp: 0x09 <8 bytes> 0x10 <varint>
        if length >= 11:
            r_ok = (f == 0x09) & (mat[:, 9] == 0x10)
            tv, vok = _varint_cols(mat, 10)
            r_ok &= vok
            sel = rows[r_ok]
            values[sel] = np.ascontiguousarray(mat[r_ok, 1:9]).view("<f8").ravel()
            ts[sel] = tv[r_ok]
            done[sel] = True
        if length == 9:  # value only (timestamp 0)
            r_ok = f == 0x09
            sel = rows[r_ok]
            values[sel] = np.ascontiguousarray(mat[r_ok, 1:9]).view("<f8").ravel()
            done[sel] = True
        if 2 <= length <= 11:  # timestamp only (value 0.0 omitted by proto3 encoders)
            r_ok = (f == 0x10) & ~done[rows]
            if r_ok.any():
                tv, vok = _varint_cols(mat, 1)
                r_ok &= vok
                sel = rows[r_ok]
                ts[sel] = tv[r_ok]
                done[sel] = True
    rest = np.nonzero(~done)[0]
    if len(rest):
        from ingest.proto.messages import Sample

        raw = buf.tobytes() if len(rest) else b""
        for i in rest.tolist():  # non-canonical encodings only (rare): protobuf runtime decides
            a = int(offs[i])
            try:
                s = Sample.FromString(raw[a:a + int(lens[i])])
            except Exception as e:  # noqa: BLE001 - DecodeError
                raise IngestError("bad_protobuf", f"protobuf: malformed Sample message: {e}") from None
            values[i] = s.value
            ts[i] = s.timestamp
    return values, ts
