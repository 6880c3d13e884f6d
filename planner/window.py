"""Window geometry: split each step's window into raw left edge + whole panes + raw right edge.

A window is (end - range, end] in ms (Prometheus 3: left-open), i.e. samples with
``start < t <= end``. Pane k holds samples with ``k*P <= t < (k+1)*P``. Whole panes inside a window
and inside the SDS's coverage [cov_lo, cov_hi) are served from the summary; the remaining two edge
runs come from raw samples, so exact algorithms are exact for any range and step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class WindowPlan:
    start: np.ndarray  # (T,) exclusive left bound (end - range)
    end: np.ndarray  # (T,) inclusive right bound
    klo: np.ndarray  # (T,) first whole pane served from the summary
    khi: np.ndarray  # (T,) one past the last (klo == khi: no summary part)
    left: tuple[np.ndarray, np.ndarray]  # inclusive [x, y] raw ranges (x > y: empty)
    right: tuple[np.ndarray, np.ndarray]

    @property
    def summary_panes(self) -> int:
        return int((self.khi - self.klo).sum())

    def raw_intervals(self) -> np.ndarray:
        """Non-empty inclusive [x, y] raw ranges, shape (M, 2)."""
        x = np.concatenate([self.left[0], self.right[0]])
        y = np.concatenate([self.left[1], self.right[1]])
        keep = x <= y
        return np.stack([x[keep], y[keep]], axis=1)


def plan_windows(ends: np.ndarray, range_ms: int, pane_ms: int, cov_lo: int, cov_hi: int) -> WindowPlan:
    end = np.asarray(ends, dtype=np.int64)
    start = end - int(range_ms)
    P = int(pane_ms)
    klo = -((-(start + 1)) // P)  # ceil((start+1)/P)
    khi = (end + 1) // P
    klo = np.maximum(klo, cov_lo)
    khi = np.minimum(khi, cov_hi)
    none = khi <= klo
    klo = np.where(none, 0, klo)
    khi = np.where(none, 0, khi)
    lx = start + 1
    ly = np.where(none, end, klo * P - 1)
    rx = np.where(none, end + 1, khi * P)
    ry = end
    return WindowPlan(start, end, klo, khi, (lx, ly), (rx, ry))


def merge_intervals(iv: np.ndarray, max_reads: int = 8) -> list[tuple[int, int]]:
    """Union of inclusive intervals, then coalesced across the smallest gaps so that at most
    ``max_reads`` storage reads remain (each read costs a storage round trip; gaps cost samples)."""
    if len(iv) == 0:
        return []
    order = np.argsort(iv[:, 0], kind="stable")
    x = iv[order, 0]
    y = np.maximum.accumulate(iv[order, 1])
    # a new run starts where x exceeds every earlier y + 1
    brk = np.ones(len(x), bool)
    brk[1:] = x[1:] > y[:-1] + 1
    starts = x[brk]
    run_id = np.cumsum(brk) - 1
    ends = np.full(len(starts), np.iinfo(np.int64).min, np.int64)
    np.maximum.at(ends, run_id, y)
    if len(starts) > max_reads:
        gaps = starts[1:] - ends[:-1]
        keep_split = np.zeros(len(gaps), bool)
        keep_split[np.argsort(gaps)[::-1][: max_reads - 1]] = True
        idx = np.nonzero(keep_split)[0]
        starts = np.concatenate([starts[:1], starts[idx + 1]])
        ends = np.concatenate([ends[idx], ends[-1:]])
    return [(int(a), int(b)) for a, b in zip(starts, ends)]
