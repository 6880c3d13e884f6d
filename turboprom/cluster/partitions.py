"""Virtual partitions: which partition a series belongs to, and a batch split by partition.

A series' partition is a hash of its canonical label set modulo the fixed partition count. A
non-default tenant's series carry the ``__tenant__`` label (turboprom/tenancy.py) inside that set,
so the hash covers tenant + labels, and equal label sets of two tenants land independently. The
hash is CRC-32 of the label set's canonical JSON (``columns_codec.label_keys``): stable across
processes and versions, unlike Python's ``hash``. The distributor computes it once per series
(series_dictionary.SeriesKeys).
"""
from __future__ import annotations

import zlib
from typing import Sequence

import numpy as np

from storage.batch import SampleBatch


def partitions_of(keys: Sequence[bytes], partitions: int) -> np.ndarray:
    """Partition of each label set (by its canonical JSON key), int64 array."""
    h = np.fromiter(map(zlib.crc32, keys), dtype=np.int64, count=len(keys))
    return h % partitions


def split(batch: SampleBatch, series_part: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """``(partition, positions of its samples)`` per partition present in the batch
    (``series_part``: each series' partition), samples in batch order within each partition."""
    if len(batch) == 0:
        return []
    sample_part = np.asarray(series_part, np.int64)[batch.series_index]
    order = np.argsort(sample_part, kind="stable")
    sp = sample_part[order]
    bounds = np.flatnonzero(np.diff(sp)) + 1
    return [(int(sp[lo]), order[lo:hi]) for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(sp)])]
