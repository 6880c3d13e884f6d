"""Prometheus's stale marker: a NaN with an exact bit pattern that must survive storage."""
from __future__ import annotations

import numpy as np

STALE_NAN_BITS = 0x7FF0000000000002
STALE_NAN: float = np.array([STALE_NAN_BITS], dtype=np.uint64).view(np.float64)[0].item()


def is_stale(values: np.ndarray) -> np.ndarray:
    """Boolean mask of stale markers in a float64 array (bit-exact comparison)."""
    return np.ascontiguousarray(values, dtype=np.float64).view(np.uint64) == np.uint64(STALE_NAN_BITS)


def is_stale_value(v: float) -> bool:
    return np.array([v], dtype=np.float64).view(np.uint64)[0] == STALE_NAN_BITS
