"""Prometheus XOR float chunks (``tsdb/chunkenc/xor.go``), encoded column-wise with numpy.

Remote read's STREAMED_XOR_CHUNKS response carries series as these chunks. Storage keeps Parquet
columns, not chunks, so the chunks are built at read time. The encoder is written here because no
Python package produces Prometheus's chunk bytes, and because it can be vectorised: a chunk is a
sequence of bit fields whose widths follow from the samples, so all fields of all chunks are
computed as arrays and packed in one ``np.packbits`` call. The one sequential part of the format,
the leading/trailing-zero window that XOR values reuse until one does not fit, is resolved in rounds
over the window changes of all chunks at once (a handful per chunk for real data), never per sample.

Layout of a chunk (as Go writes it, bit for bit):
  2 bytes big-endian sample count;
  sample 0: varint (zigzag) timestamp, 64-bit value;
  sample 1: uvarint timestamp delta, XOR value;
  sample n: delta-of-delta timestamp in buckets ``0`` / ``10``+14 bits / ``110``+17 / ``1110``+20 /
  ``1111``+64, then XOR value: ``0`` (same bits), ``10`` + meaningful bits in the previous window,
  or ``11`` + 5 bits leading zeros (at most 31) + 6 bits length (64 written as 0) + the bits.
Go's bit writer leaves one zero byte at the end when its last write was a whole byte written at a
byte boundary; that byte is part of the chunk's bytes and reproduced here.

Samples keep their exact bits (stale markers and every NaN payload survive). At most
``MAX_SAMPLES`` (120, Prometheus's samples per head chunk) go into one chunk.
"""
from __future__ import annotations

import numpy as np

MAX_SAMPLES = 120
_U64 = np.uint64


def _bit_length(x: np.ndarray) -> np.ndarray:
    """Bits needed for each uint64 (0 for 0)."""
    x = x.copy()
    for s in (1, 2, 4, 8, 16, 32):
        x |= x >> _U64(s)
    return np.bitwise_count(x).astype(np.int64)


def _trailing_zeros(x: np.ndarray) -> np.ndarray:
    """Trailing zero bits of each non-zero uint64 (64 for 0)."""
    low = x & (~x + _U64(1))  # lowest set bit
    return np.where(x == 0, 64, np.bitwise_count(low - _U64(1)).astype(np.int64))


def varint_bytes(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Protobuf/Go uvarint of each uint64, in bulk: ((N, 10) uint8 bytes, the first ``nbytes`` of each
    row used; nbytes (N,) in 1..10). The one vectorised varint encoder (remote read's sample records
    and the XOR chunks use it); ``ingest.remote_write.encode_varint`` is its scalar twin."""
    u = np.asarray(u, dtype=np.uint64)
    nbytes = np.maximum(1, (_bit_length(u) + 6) // 7)
    k = np.arange(10, dtype=np.uint64)
    groups = ((u[:, None] >> (k * _U64(7))[None, :]) & _U64(0x7F)).astype(np.uint8)
    cont = np.arange(10)[None, :] < (nbytes[:, None] - 1)
    return groups | (cont.astype(np.uint8) << 7), nbytes


def _varint_fields(u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Protobuf/Go uvarint bytes of each uint64 as two bit fields (first up to 8 bytes, rest up to 2)."""
    b8, nbytes = varint_bytes(u)
    byts = b8.astype(np.uint64)
    n1 = np.minimum(nbytes, 8)
    n2 = nbytes - n1
    a = np.zeros(len(u), dtype=np.uint64)
    b = np.zeros(len(u), dtype=np.uint64)
    for j in range(10):  # fixed 10 columns, not per sample
        in1 = j < n1
        a = np.where(in1, (a << _U64(8)) | byts[:, j], a)
        in2 = (j >= n1) & (j < nbytes)
        b = np.where(in2, (b << _U64(8)) | byts[:, j], b)
    return a, n1 * 8, b, n2 * 8


def chunk_bounds(offsets: np.ndarray, max_samples: int = MAX_SAMPLES) -> np.ndarray:
    """Start index of every chunk when each series (CSR ``offsets``) is cut into runs of at most
    ``max_samples`` samples; returns chunk starts plus the final end (length chunks + 1)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    lens = np.diff(offsets)
    per = (lens + max_samples - 1) // max_samples
    total = int(per.sum())
    if total == 0:
        return np.array([offsets[-1] if len(offsets) else 0], dtype=np.int64)
    series_of = np.repeat(np.arange(len(lens)), per)
    first_chunk = np.cumsum(per) - per
    k = np.arange(total) - first_chunk[series_of]
    starts = offsets[:-1][series_of] + k * max_samples
    return np.append(starts, offsets[-1]).astype(np.int64)


BATCH_SAMPLES = 1 << 16  # samples encoded together: bounds the temporaries (~200 bytes per sample)


def encode_chunks(timestamps: np.ndarray, values: np.ndarray, bounds: np.ndarray) -> tuple[bytes, np.ndarray]:
    """XOR chunks of the samples ``[bounds[c], bounds[c+1])`` for every chunk c (contiguous, each at
    most 65535 samples, sorted by time). Returns (all chunk bytes concatenated, byte offsets, one
    more than chunks)."""
    bounds = np.asarray(bounds, dtype=np.int64)
    nchunks = len(bounds) - 1
    if nchunks <= 0:
        return b"", np.zeros(1, dtype=np.int64)
    parts: list[bytes] = []
    offs = [np.zeros(1, dtype=np.int64)]
    total = 0
    c = 0
    while c < nchunks:
        # as many whole chunks as fit in a batch (at least one)
        e = int(np.searchsorted(bounds, bounds[c] + BATCH_SAMPLES, side="right")) - 1
        e = min(max(e, c + 1), nchunks)
        data, o = _encode_batch(timestamps, values, bounds[c:e + 1])
        parts.append(data)
        offs.append(o[1:] + total)
        total += len(data)
        c = e
    return b"".join(parts), np.concatenate(offs)


def _encode_batch(timestamps: np.ndarray, values: np.ndarray, bounds: np.ndarray) -> tuple[bytes, np.ndarray]:
    t = np.ascontiguousarray(timestamps, dtype=np.int64)
    vb = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    bounds = np.asarray(bounds, dtype=np.int64)
    nchunks = len(bounds) - 1
    if nchunks <= 0:
        return b"", np.zeros(1, dtype=np.int64)
    n = int(bounds[-1] - bounds[0])
    base = int(bounds[0])
    t = t[base:base + n]
    vb = vb[base:base + n]
    starts = bounds[:-1] - base
    counts = np.diff(bounds)
    chunk_of = np.repeat(np.arange(nchunks), counts)
    pos = np.arange(n) - starts[chunk_of]  # index within the chunk
    first = pos == 0

    # --- timestamps
    prev_t = np.empty_like(t)
    prev_t[1:] = t[:-1]
    prev_t[0] = t[0]
    delta = (t - prev_t).astype(np.uint64)  # meaningful from pos 1 on
    prev_d = np.empty_like(delta)
    prev_d[1:] = delta[:-1]
    prev_d[0] = 0
    dod = (delta - prev_d).view(np.int64)  # meaningful from pos 2 on

    zig = (t.view(np.uint64) << _U64(1)) ^ (t >> 63).view(np.uint64)  # zigzag varint of t at pos 0
    head = np.flatnonzero(pos < 2)  # varints only at the first two samples of each chunk
    a1 = np.zeros(n, dtype=np.uint64)
    a2 = np.zeros(n, dtype=np.uint64)
    a1n = np.zeros(n, dtype=np.int64)
    a2n = np.zeros(n, dtype=np.int64)
    a1[head], a1n[head], a2[head], a2n[head] = _varint_fields(np.where(first[head], zig[head], delta[head]))

    # delta-of-delta buckets (Go's bitRange: -(2^(n-1)-1) <= x <= 2^(n-1))
    def in_range(x: np.ndarray, nb: int) -> np.ndarray:
        return (x >= -((1 << (nb - 1)) - 1)) & (x <= (1 << (nb - 1)))

    r14, r17, r20 = in_range(dod, 14), in_range(dod, 17), in_range(dod, 20)
    d_ctrl = np.select([dod == 0, r14, r17, r20], [0b0, 0b10, 0b110, 0b1110], 0b1111).astype(np.uint64)
    d_ctrl_n = np.select([dod == 0, r14, r17, r20], [1, 2, 3, 4], 4)
    d_pay_n = np.select([dod == 0, r14, r17, r20], [0, 14, 17, 20], 64)
    mask = np.where(d_pay_n >= 64, ~_U64(0), (_U64(1) << d_pay_n.astype(np.uint64)) - _U64(1))
    d_pay = dod.view(np.uint64) & mask

    rest = pos >= 2
    t1 = np.where(rest, d_ctrl, a1)
    t1n = np.where(rest, d_ctrl_n, a1n)
    t2 = np.where(rest, d_pay, a2)
    t2n = np.where(rest, d_pay_n, a2n)

    # --- values
    prev_v = np.empty_like(vb)
    prev_v[1:] = vb[:-1]
    prev_v[0] = vb[0]
    x = vb ^ prev_v
    nz = (x != 0) & ~first
    lead = np.minimum(64 - _bit_length(x), 31)
    trail = _trailing_zeros(x)
    reset = _window_resets(nz, lead, trail, starts, counts)
    # window (leading, trailing) in force at each sample: that of the latest reset at or before it
    last_reset = np.maximum.accumulate(np.where(reset, np.arange(n), -1))
    win = np.maximum(last_reset, 0)
    wl, wt = lead[win], trail[win]
    sig_new = 64 - lead - trail
    reuse = nz & ~reset
    # control field: 0 | 10 | 11 + 5 bits leading + 6 bits length (64 -> 0)
    ctrl_reset = (_U64(0b11) << _U64(11)) | (lead.astype(np.uint64) << _U64(6)) | (sig_new.astype(np.uint64) & _U64(63))
    v1 = np.select([first, ~nz, reuse], [vb, _U64(0), _U64(0b10)], ctrl_reset).astype(np.uint64)
    v1n = np.select([first, ~nz, reuse], [64, 1, 2], 13)
    shift = np.where(reuse, wt, trail)
    v2 = np.where(nz, x >> np.minimum(shift, 63).astype(np.uint64), _U64(0))
    v2n = np.select([~nz, reuse], [0, 64 - wl - wt], sig_new)

    # --- header per chunk (16 bits) and padding to a byte boundary (+ Go's trailing empty byte)
    hdr = np.where(first, counts[chunk_of].astype(np.uint64), _U64(0))
    hdrn = np.where(first, 16, 0)
    widths = np.stack([hdrn, t1n, t2n, v1n, v2n], axis=1)
    chunk_bits = np.bincount(chunk_of, weights=widths.sum(axis=1), minlength=nchunks).astype(np.int64)
    last = starts + counts - 1
    pad = (-chunk_bits) % 8
    # Go appends an empty byte after a whole byte written at a byte boundary as its last write: the
    # 64-bit value of a one-sample chunk, or a last XOR payload of 8k bits ending on a boundary.
    last_payload = np.where(counts == 1, 64, v2n[last])
    pad += np.where((pad == 0) & (last_payload > 0) & (last_payload % 8 == 0), 8, 0)
    padn = np.zeros(n, dtype=np.int64)
    padn[last] = pad

    fields = np.stack([hdr, t1, t2, v1, v2, np.zeros(n, dtype=np.uint64)], axis=1).ravel()
    nbits = np.concatenate([widths, padn[:, None]], axis=1).ravel()
    used = nbits > 0
    fields, nbits = fields[used], nbits[used]
    bits = np.unpackbits(fields.astype(">u8").view(np.uint8).reshape(-1, 8), axis=1)  # (F, 64)
    keep = np.arange(64)[None, :] >= (64 - np.minimum(nbits, 64))[:, None]
    # padding beyond 64 bits never happens (pad <= 15 bits): a pad field is all zeros
    stream = np.packbits(bits[keep])
    byte_len = (chunk_bits + pad) // 8
    offs = np.zeros(nchunks + 1, dtype=np.int64)
    np.cumsum(byte_len, out=offs[1:])
    return stream.tobytes(), offs


def _window_resets(nz: np.ndarray, lead: np.ndarray, trail: np.ndarray, starts: np.ndarray,
                   counts: np.ndarray) -> np.ndarray:
    """Where a chunk's XOR value opens a new (leading, trailing) window: its first non-zero XOR,
    then every non-zero XOR whose leading or trailing zeros are fewer than the window's. Rounds over
    all chunks at once; each round moves every unfinished chunk to its next reset."""
    n = len(nz)
    reset = np.zeros(n, dtype=bool)
    width = int(counts.max()) if len(counts) else 0
    if n == 0 or width == 0:
        return reset
    col = np.arange(width)
    idx = starts[:, None] + col[None, :]
    valid = col[None, :] < counts[:, None]
    idx = np.where(valid, idx, 0)
    NZ = nz[idx] & valid
    L = lead[idx]
    T = trail[idx]
    # first reset: the first non-zero XOR of the chunk
    has = NZ.any(axis=1)
    cur = np.where(has, NZ.argmax(axis=1), -1)
    active = np.flatnonzero(has)
    while len(active):
        c = cur[active]
        reset[starts[active] + c] = True
        lc = L[active, c][:, None]
        tc = T[active, c][:, None]
        later = (col[None, :] > c[:, None]) & NZ[active] & ((L[active] < lc) | (T[active] < tc))
        more = later.any(axis=1)
        cur[active] = np.where(more, later.argmax(axis=1), -1)
        active = active[more]
    return reset
