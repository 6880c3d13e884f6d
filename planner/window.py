"""Window geometry: split each step's window into raw left edge + whole panes + raw right edge.

A window is (end - range, end] in ms (Prometheus 3: left-open), i.e. samples with
``start < t <= end``. Pane k holds samples with ``k*P <= t < (k+1)*P``. Whole panes inside a window
and inside the SDS's coverage [cov_lo, cov_hi) are served from the summary; the remaining two edge
runs come from raw samples, so exact algorithms are exact for any range and step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class WindowPlan:
    start: np.ndarray  # (T,) exclusive left bound (end - range)
    end: np.ndarray  # (T,) inclusive right bound
    klo: np.ndarray  # (T,) first whole pane served from the summary
    khi: np.ndarray  # (T,) one past the last (klo == khi: no summary part)
    left: tuple[np.ndarray, np.ndarray]  # inclusive [x, y] raw ranges (x > y: empty)
    right: tuple[np.ndarray, np.ndarray]
    _span: int | None = field(default=None, repr=False, compare=False)

    def raw_span(self) -> int:
        """Milliseconds of raw data the summary path reads (the union of the edges), computed once."""
        if self._span is None:
            self._span = union_length(self.raw_intervals())
        return self._span

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


def union_length(iv: np.ndarray) -> int:
    """Points covered by the union of inclusive intervals ``iv`` (M, 2), vectorized (the rewrite's
    cost check asks this of every query a plan could serve)."""
    if len(iv) == 0:
        return 0
    order = np.argsort(iv[:, 0], kind="stable")
    x = iv[order, 0]
    y = np.maximum.accumulate(iv[order, 1])
    prev = np.empty_like(y)
    prev[0] = x[0] - 1
    prev[1:] = y[:-1]
    # each interval adds what reaches past everything before it
    return int(np.maximum(y - np.maximum(x, prev + 1) + 1, 0).sum())


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


# One more storage read costs about as much as scanning this many samples (index match, a searchsorted
# per head run / block, the result's concatenation); measured with bench/planner_profile.py.
READ_COST_SAMPLES = 20_000
MAX_EDGE_READS = 48


def coalesce_reads(iv: np.ndarray, pane_ms: int, density: tuple[int, np.ndarray] | None,
                   read_cost_samples: float = READ_COST_SAMPLES, max_reads: int = MAX_EDGE_READS) -> list[tuple[int, int]]:
    """Raw edge intervals -> the storage reads that fetch them at the least estimated cost.

    The union of the intervals is taken first; two neighbouring runs are then read as one only when
    the samples in the gap between them (estimated from ``density`` = (first pane, samples per pane
    over all series of the SDS)) cost less than one more read. So edges in sparse history coalesce
    into one read while edges in dense recent data are read one by one, instead of reading the whole
    dense stretch between them. Without a density the old rule applies (at most 2 reads).
    """
    if density is None:
        return merge_intervals(iv, max_reads=2)
    runs = merge_intervals(iv, max_reads=max(len(iv), 1))
    if len(runs) <= 1:
        return runs
    k0, tot = density
    a = np.array([r[0] for r in runs], np.int64)
    b = np.array([r[1] for r in runs], np.int64)
    gap_lo, gap_hi = b[:-1] + 1, a[1:]  # gap i = [b_i + 1, a_{i+1})
    est = samples_between(gap_lo, gap_hi, int(pane_ms), k0, tot)
    split = est >= read_cost_samples
    if int(split.sum()) > max_reads - 1:
        idx = np.argsort(est, kind="stable")[::-1][: max_reads - 1]
        split = np.zeros(len(est), bool)
        split[idx] = True
    cut = np.nonzero(split)[0]
    starts = np.concatenate([a[:1], a[cut + 1]])
    ends = np.concatenate([b[cut], b[-1:]])
    return [(int(x), int(y)) for x, y in zip(starts, ends)]


def samples_between(lo: np.ndarray, hi: np.ndarray, pane_ms: int, k0: int, tot: np.ndarray) -> np.ndarray:
    """Estimated samples in [lo, hi) from per-pane totals (panes k0.. ; partial panes prorated; time
    outside the known panes at their mean density)."""
    n = len(tot)
    if n == 0:
        return (hi - lo).astype(np.float64)  # nothing known: one sample per ms (never merges far)
    mean = float(tot.mean())
    cum = np.zeros(n + 1)
    np.cumsum(tot, out=cum[1:])

    def F(t: np.ndarray) -> np.ndarray:  # samples before time t (relative to pane k0's start)
        x = (t - k0 * pane_ms) / pane_ms  # in panes
        below = np.minimum(x, 0.0) * mean
        xi = np.clip(x, 0.0, float(n))
        k = np.minimum(np.floor(xi).astype(np.int64), n - 1)
        inside = cum[k] + (xi - k) * tot[k]
        above = np.maximum(x - n, 0.0) * mean
        return below + inside + above

    return np.maximum(F(hi.astype(np.float64)) - F(lo.astype(np.float64)), 0.0)
