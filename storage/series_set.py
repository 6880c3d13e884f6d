"""Columnar result of a storage read: S series in CSR form."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from storage.labels import Labels


@dataclass
class SeriesSet:
    """``labels[s]``'s samples are ``timestamps[offsets[s]:offsets[s+1]]`` (sorted ascending,
    no duplicates) and the matching ``values``. Series are sorted by labels."""

    labels: list[Labels]
    offsets: np.ndarray  # int64, shape (S+1,)
    timestamps: np.ndarray  # int64, shape (N,)
    values: np.ndarray  # float64, shape (N,)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_samples(self) -> int:
        return int(self.offsets[-1]) if len(self.offsets) else 0

    def series(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = int(self.offsets[s]), int(self.offsets[s + 1])
        return self.timestamps[a:b], self.values[a:b]

    @classmethod
    def empty(cls) -> "SeriesSet":
        return cls([], np.zeros(1, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))
