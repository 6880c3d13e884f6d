"""One select's rows, from the head's runs and the blocks' row groups, straight into CSR form.

A *segment* is ``(tmin, ts, val, lo, hi)``: rows ``lo[i]:hi[i]`` of the arrays ``ts`` / ``val`` are
series ``sids[i]``'s samples in that source (a head run, a decoded block row group, ...), in time
order; ``lo`` / ``hi`` are aligned with the select's sorted ids (``lo == hi`` where the source has
none) and ``tmin`` is the source's oldest timestamp. ``build_csr`` lays every series' rows out
series after series in the output order (labels order), segment after segment in time order, with
a fixed number of numpy calls plus a few per segment: no per-series or per-sample Python work, no
(sid, ts) sort, no repeated series-id column. It answers None when, for some series, a segment's
rows do not all follow the earlier segments' rows in time (out-of-order data, rows seen in both the
head and a block being cut): the caller then merges generically (sort + dedupe).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from storage.columns import EMPTY_F64, EMPTY_I64, INT64_MAX, INT64_MIN

# Up to this many output rows the time-order check runs on the output (a few passes over small
# arrays); above it on each segment's first and last rows per series (O(segments x series)).
_CHECK_OUTPUT_ROWS = 1 << 18
# Up to this many output rows, one expansion of every segment's row ranges (fewest numpy calls);
# above it one per segment (bounded temporaries).
_ONE_EXPANSION_ROWS = 1 << 20


class Segment(NamedTuple):
    tmin: int
    ts: np.ndarray
    val: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


class Csr(NamedTuple):
    present: np.ndarray | None  # bool per series in output order: has rows (None: all have)
    offsets: np.ndarray  # int64 (S+1,) over the present series
    ts: np.ndarray
    val: np.ndarray


def expand(starts: np.ndarray, lens: np.ndarray, total: int) -> np.ndarray:
    """Concatenation of arange(starts[i], starts[i] + lens[i]) (lens >= 0, summing to ``total``)."""
    if total == 0:
        return EMPTY_I64
    shift = starts - lens.cumsum()
    shift += lens  # starts[i] minus the output position where range i begins
    out = shift.repeat(lens)
    out += np.arange(total, dtype=np.int64)
    return out


def segment_of_rows(tmin: int, sids: np.ndarray, s: np.ndarray, t: np.ndarray, v: np.ndarray) -> Segment:
    """A segment from rows sorted by (sid, ts) with their sid column."""
    return Segment(tmin, t, v, np.searchsorted(s, sids, "left"), np.searchsorted(s, sids, "right"))


def _in_time_order(segs: list[Segment], lo: np.ndarray, lens: np.ndarray) -> bool:
    """Per series, is every segment's first row later than the earlier segments' last rows?"""
    has = lens > 0
    first = np.full(lens.shape, INT64_MAX, dtype=np.int64)
    last = np.full(lens.shape, INT64_MIN, dtype=np.int64)
    for j, sg in enumerate(segs):
        h = has[j]
        if h.any():
            a = lo[j][h]
            first[j, h] = sg.ts[a]
            last[j, h] = sg.ts[a + lens[j][h] - 1]
    return bool((first[1:] > np.maximum.accumulate(last, axis=0)[:-1]).all())


def _copy_segment(out_t: np.ndarray, out_v: np.ndarray, sg: Segment, lo: np.ndarray, lens: np.ndarray,
                  dst: np.ndarray, count: int) -> None:
    """Rows ``lo[i]:lo[i] + lens[i]`` of a segment to ``dst[i]:dst[i] + lens[i]`` of the output
    (``count`` rows in all). Where every series but the first and last has the same number of rows
    at evenly spaced places in the segment and in the output (scrapes at one interval: a block's
    row group, a head run; every series of a metric, or every eighth), one strided 2-D copy plus
    two slices, no index arrays; otherwise an index gather and scatter."""
    nz = np.flatnonzero(lens)
    a, b = int(nz[0]), int(nz[-1]) + 1
    q = b - a
    if q == len(nz):
        ln, s, d = lens[a:b], lo[a:b], dst[a:b]
        ok = True
        if q > 2:
            width = int(ln[1])
            ok = bool((ln[1:-1] == width).all())
            s_stride = int(s[2] - s[1]) if q > 3 else width
            d_stride = int(d[2] - d[1]) if q > 3 else width
            if ok and q > 3:
                ok = bool((np.diff(s[1:-1]) == s_stride).all()) and bool((np.diff(d[1:-1]) == d_stride).all())
        if ok:
            for i in ((0, q - 1) if q > 1 else (0,)):
                s0, d0, n0 = int(s[i]), int(d[i]), int(ln[i])
                out_t[d0:d0 + n0] = sg.ts[s0:s0 + n0]
                out_v[d0:d0 + n0] = sg.val[s0:s0 + n0]
            if q > 2:
                rows, s1, d1 = q - 2, int(s[1]), int(d[1])
                for out, src in ((out_t, sg.ts), (out_v, sg.val)):
                    size = out.itemsize
                    view = as_strided(out[d1:], shape=(rows, width), strides=(d_stride * size, size))
                    view[...] = as_strided(src[s1:], shape=(rows, width), strides=(s_stride * size, size))
            return
    src = expand(lo, lens, count)
    dst_rows = expand(dst, lens, count)
    out_t[dst_rows] = sg.ts[src]
    out_v[dst_rows] = sg.val[src]


def build_csr(segs: list[Segment], k: int, order: np.ndarray | None) -> Csr | None:
    """The rows of ``k`` series from segments in time order (``tmin`` ascending), series in
    ``order`` (positions 0..k-1; None = as given). None when they interleave in time."""
    m = len(segs)
    if m == 0 or k == 0:
        return Csr(np.zeros(k, dtype=bool), np.zeros(1, np.int64), EMPTY_I64, EMPTY_F64)
    if m == 1:
        lo2 = segs[0].lo.reshape(1, k)
        lens2 = segs[0].hi - segs[0].lo
        lens2 = lens2.reshape(1, k)
    else:  # (segments, series), by numpy calls that do not depend on the number of segments
        lo2 = np.concatenate([sg.lo for sg in segs]).reshape(m, k)
        lens2 = np.concatenate([sg.hi for sg in segs]).reshape(m, k)
        lens2 -= lo2
    if order is not None:
        lo2, lens2 = lo2[:, order], lens2[:, order]
    total = lens2[0] if m == 1 else lens2.sum(axis=0)
    if total.all():
        present_out = None
    else:
        present_out = total > 0
        keep = np.flatnonzero(present_out)
        lo2, lens2, total = lo2[:, keep], lens2[:, keep], total[keep]
    kk = len(total)
    offsets = np.empty(kk + 1, dtype=np.int64)
    offsets[0] = 0
    total.cumsum(out=offsets[1:])
    n = int(offsets[-1])
    if n == 0:
        return Csr(present_out, offsets, EMPTY_I64, EMPTY_F64)
    if m == 1:
        sg = segs[0]
        lo, lens = lo2[0], lens2[0]
        if n and int(lo[-1]) + int(lens[-1]) - int(lo[0]) == n and (kk == 1 or bool((lo[1:] == lo[:-1] + lens[:-1]).all())):
            src = slice(int(lo[0]), int(lo[0]) + n)  # back to back: a view, no gather
            t, v = sg.ts[src], sg.val[src]
            if not (t.flags.writeable and v.flags.writeable):  # a cached decoded row group: copy
                t, v = t.copy(), v.copy()
            return Csr(present_out, offsets, t, v)
        src = expand(lo, lens, n)
        return Csr(present_out, offsets, sg.ts[src], sg.val[src])
    if n > _CHECK_OUTPUT_ROWS and not _in_time_order(segs, lo2, lens2):
        return None
    # where segment j's rows of each series go: the series' offset plus the earlier segments' rows
    before = lens2.cumsum(axis=0)
    before -= lens2
    before += offsets[:-1]
    flat_lens = lens2.ravel()
    begin = flat_lens.cumsum()  # run-major: where each (segment, series) range ends ...
    ends = begin[kk - 1::kk].tolist()  # (rows of each segment: differences of these)
    per_seg = [e - b for b, e in zip([0] + ends[:-1], ends)]
    begin -= flat_lens  # ... and begins
    out_t = np.empty(n, dtype=np.int64)
    out_v = np.empty(n, dtype=np.float64)
    if n <= _ONE_EXPANSION_ROWS:
        # source and destination rows of every (segment, series) range at once: both are the
        # range's start plus the position within it, so they share one arange
        ar = np.arange(n, dtype=np.int64)
        src_all = (lo2.ravel() - begin).repeat(flat_lens)
        src_all += ar
        dst_all = (before.ravel() - begin).repeat(flat_lens)
        dst_all += ar
        a = 0
        for sg, c in zip(segs, per_seg):
            if c:
                src, dst = src_all[a:a + c], dst_all[a:a + c]
                out_t[dst] = sg.ts[src]
                out_v[dst] = sg.val[src]
                a += c
    else:
        for j, (sg, c) in enumerate(zip(segs, per_seg)):
            if c:
                _copy_segment(out_t, out_v, sg, lo2[j], lens2[j], before[j], c)
    if n <= _CHECK_OUTPUT_ROWS and n > 1:
        bad = out_t[1:] <= out_t[:-1]
        bad[offsets[1:-1] - 1] = False  # one series ending, the next beginning
        if bad.any():
            return None
    return Csr(present_out, offsets, out_t, out_v)
