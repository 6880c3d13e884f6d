"""Backfill: historical samples written straight into blocks (``TSDB.import_history``).

The live write path keeps recent samples in the head and refuses what is older than the
out-of-order window; history (days, weeks) instead goes here, as ``promtool tsdb
create-blocks-from`` writes blocks for Prometheus: rows sorted once by (series, time), checked as a
whole (nothing is written when anything is refused), cut into aligned time ranges as large as the
largest compaction level (so a month is a handful of blocks, not one block per sample or per 2 h),
each written with ``storage.block.write_block``.

Refused, with the batch position of the first offending sample:
  beyond_retention     older than the retention window (measured back from the newest sample in
                       the store, the import included): retention would delete it at once
  in_head_range        at or after the head's oldest sample: that range is still being written by
                       the live path (as in Prometheus, backfill is for data older than the head)
  too_far_in_future    more than the future tolerance ahead of the wall clock
  duplicate_timestamp  two different values for one series and timestamp (in the file, or against
                       a sample already in a block); exact repeats are dropped and counted
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from storage.columns import group_bounds, order_by_series_time
from storage.interface import AppendResult


class BackfillError(ValueError):
    """An import refused as a whole. ``position``: the batch index of the first offending sample;
    ``bounds``: the time limits that applied (ms), as in ``AppendResult.bounds``."""

    def __init__(self, reason: str, message: str, position: int, count: int = 1, bounds: dict[str, int] | None = None):
        super().__init__(message)
        self.reason, self.message, self.position, self.count = reason, message, position, count
        self.bounds = bounds or {}


@dataclass
class BackfillResult:
    samples: int = 0  # written
    series: int = 0
    duplicates: int = 0  # exact repeats (in the file, or of samples already stored), not written again
    blocks: list[dict] = field(default_factory=list)  # id, minTime, maxTime, numSamples, numSeries per new block
    block_range_ms: int = 0
    written: np.ndarray | None = None  # bool per batch sample: True = written by this import

    def stored_as_append(self, n: int) -> AppendResult:
        """The outcome in ``AppendResult`` form (what ingest sinks are handed samples by)."""
        mask = self.written if self.written is not None else np.zeros(n, dtype=bool)
        return AppendResult(accepted=self.samples, duplicates=self.duplicates, accepted_mask=mask)


def sorted_rows(sid: np.ndarray, ts: np.ndarray, val: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows sorted by (sid, ts) and the batch position of each."""
    pos = np.arange(len(sid), dtype=np.int64)
    o = order_by_series_time(sid, ts)
    if o is None:
        return sid, ts, val, pos
    return sid[o], ts[o], val[o], pos[o]


def drop_repeats(sid: np.ndarray, ts: np.ndarray, val: np.ndarray, pos: np.ndarray):
    """Rows sorted by (sid, ts): exact repeats dropped (counted); a key with two values raises."""
    if len(sid) < 2:
        return sid, ts, val, pos, 0
    same = (sid[1:] == sid[:-1]) & (ts[1:] == ts[:-1])
    if not same.any():
        return sid, ts, val, pos, 0
    bits = val.view(np.uint64)
    conflict = same & (bits[1:] != bits[:-1])
    if conflict.any():
        i = int(np.argmax(conflict))
        a, b = sorted((int(pos[i]), int(pos[i + 1])))
        raise BackfillError("duplicate_timestamp", f"two different values for one series and timestamp (also at sample {a})",
                            b, int(conflict.sum()))
    keep = np.concatenate(([True], ~same))
    return sid[keep], ts[keep], val[keep], pos[keep], int(same.sum())


def first_where(mask: np.ndarray, pos: np.ndarray) -> int:
    """The smallest batch position among the rows where ``mask`` holds (the first in the file)."""
    return int(pos[mask].min())


def in_intervals(ts: np.ndarray, intervals: list[tuple[int, int]]) -> np.ndarray:
    """Bool per timestamp: inside any of the closed intervals (e.g. the blocks' time ranges)."""
    if not intervals or len(ts) == 0:
        return np.zeros(len(ts), dtype=bool)
    iv = sorted(intervals)
    starts, ends = [iv[0][0]], [iv[0][1]]
    for a, b in iv[1:]:  # merge overlapping ranges (per block, not per sample)
        if a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    st, en = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    i = np.searchsorted(st, ts, "right") - 1
    ok = i >= 0
    return ok & (ts <= en[np.maximum(i, 0)])


def split_ranges(sid: np.ndarray, ts: np.ndarray, val: np.ndarray, range_ms: int):
    """Rows sorted by (sid, ts) -> per aligned range [k*range_ms, (k+1)*range_ms), the rows in it
    (still sorted by sid, ts)."""
    w = ts // np.int64(range_ms)
    o = np.argsort(w, kind="stable")
    ws = w[o]
    keys, starts, ends = group_bounds(ws)
    for k, a, b in zip(keys.tolist(), starts.tolist(), ends.tolist()):
        idx = o[a:b]
        yield k * range_ms, sid[idx], ts[idx], val[idx]
