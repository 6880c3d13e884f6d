"""Snappy block format (remote write) with a decompressed-size limit checked before decoding."""
from __future__ import annotations

import cramjam

from ingest.errors import IngestError


def uncompressed_length(data: bytes | memoryview) -> int:
    """The varint length header every snappy block starts with (at most 5 bytes for 32 bits)."""
    result = 0
    for i in range(min(len(data), 5)):
        b = data[i]
        result |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return result
    raise IngestError("bad_snappy", "snappy: corrupt input (bad length header)")


def decompress(data: bytes, max_bytes: int) -> memoryview:
    if not data:
        return memoryview(b"")
    n = uncompressed_length(data)
    if n > max_bytes:
        raise IngestError("too_large", f"snappy: decoded length {n} bytes exceeds the limit of {max_bytes} bytes", status=413)
    out = bytearray(n)
    try:
        written = cramjam.snappy.decompress_raw_into(data, out)
    except Exception as e:  # cramjam.DecompressionError and friends
        raise IngestError("bad_snappy", f"snappy: corrupt input: {e}") from None
    if written != n:
        raise IngestError("bad_snappy", f"snappy: corrupt input (decoded {written} bytes, header says {n})")
    return memoryview(out)


def compress(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(data))
