"""The exact store's kept running sums (planner/pane_prefix.py) give what ``range_stats`` gives over
copies of the same panes, for any windows, after live writes, late writes into summed panes, restored
rows, cleared and dropped panes; and float windows stay exact where a difference of two sums would not."""
from __future__ import annotations

import numpy as np
import pytest

from planner.algorithms.exact import FIELDS
from planner.exact_store import ExactPaneStore
from planner.pane_ranges import range_stats

P = 15_000


def _feed(store: ExactPaneStore, rng: np.random.Generator, series: int, t_from: int, t_to: int,
          values: str = "counter", gaps: float = 0.1) -> None:
    """Samples every 5 s (jittered) per series over [t_from, t_to), some series silent for a while."""
    store.ensure_series(series)
    ts = np.arange(t_from, t_to, 5_000, dtype=np.int64)
    for t in ts:
        sid = np.flatnonzero(rng.random(series) > gaps).astype(np.int64)
        tt = t + rng.integers(0, 3_000, len(sid))
        if values == "counter":
            v = np.floor(np.abs(rng.normal(100, 50, len(sid))) + t / 1000)
            v[rng.random(len(sid)) < 0.05] = rng.integers(0, 5)  # resets
        elif values == "wild":
            v = rng.choice([1.0, -3.5, 1e300, -1e300, 0.0, np.nan, np.inf, 7e15, 1e-300], len(sid))
        else:
            v = rng.lognormal(0, 2, len(sid))
        keep = tt > store.last_t[sid]
        store.ingest_sorted(sid[keep], tt[keep], v[keep])


def _check(store: ExactPaneStore, sids: np.ndarray, klo: np.ndarray, khi: np.ndarray,
           fields: frozenset[str] | None) -> None:
    has = khi > klo
    ka, kb = int(klo[has].min()), int(khi[has].max())
    want = range_stats(store.pane_arrays(sids, ka, kb, fields), np.where(has, klo - ka, 0),
                       np.where(has, khi - ka, 0), fields)
    got = store.window_stats(sids, np.where(has, klo, 0), np.where(has, khi, 0), fields)
    for f in FIELDS:
        a, b = getattr(got, f), getattr(want, f)
        assert a.shape == b.shape, f
        if f in ("s1", "s2", "corr") and f in store.cols:
            # a window adding 7e15 to 1e300 and taking 1e300 away again has no defined float sum (it
            # depends on the order of the additions; the served functions' precision checks send such
            # windows to the raw path): compared where its panes stay below 1e12, far from 2^53
            panes = store.pane_arrays(sids, ka, kb, frozenset({f}))
            mag = np.abs(np.nan_to_num(panes[f], nan=0.0, posinf=1e308, neginf=1e308))
            if f == "corr":  # the counter term adds each pane's entry pair
                mag = np.maximum(mag, np.abs(np.nan_to_num(panes["entry_corr"], nan=0.0, posinf=1e308, neginf=1e308)))
            wmag = np.array([[mag[r, lo - ka:hi - ka].max(initial=0.0) for lo, hi in zip(klo, khi)]
                             for r in range(len(sids))]).reshape(a.shape)
            wild = wmag > 1e12
            a, b = np.where(wild, 0.0, a), np.where(wild, 0.0, b)
            # a sum is as precise as its terms' magnitude: a window whose terms cancel may be an exact
            # 0 on one side and a rounding residue of 1e-17 on the other
            with np.errstate(invalid="ignore"):
                close = (np.abs(a - b) <= 1e-12 * np.maximum(np.abs(b), wmag)) | (np.isnan(a) & np.isnan(b)) | (a == b)
            assert close.all(), (f, np.argwhere(~close)[:5], a[~close][:5], b[~close][:5])
            continue
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=0, equal_nan=True, err_msg=f)
        else:
            np.testing.assert_array_equal(a, b, err_msg=f)


def _windows(rng: np.random.Generator, k_lo: int, k_hi: int, n: int, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    lo = rng.integers(k_lo, k_hi, n)
    hi = np.minimum(lo + rng.integers(0, max_len, n), k_hi)
    return lo.astype(np.int64), hi.astype(np.int64)


@pytest.mark.parametrize("values", ["counter", "gauge", "wild"])
@pytest.mark.parametrize("fields", [None, frozenset({"count", "corr", "first_t", "first_v", "last_t", "last_v"}),
                                    frozenset({"count", "s1"}), frozenset({"count", "s1", "s2", "vmin", "vmax"})])
def test_window_stats_equal_range_stats(values: str, fields: frozenset[str] | None) -> None:
    rng = np.random.default_rng(7)
    store = ExactPaneStore(P, None if fields is None else fields | {"count"})
    t0 = 1_000 * P
    _feed(store, rng, 40, t0, t0 + 600_000, values)
    k0, k1 = t0 // P, (t0 + 600_000) // P
    sids = np.sort(rng.choice(40, 25, replace=False)).astype(np.int64)
    for n, max_len in ((1, 20), (3, 5), (60, 40), (200, 4)):
        _check(store, sids, *_windows(rng, k0, k1, n, max_len), fields)
    # live ingest moves on: the sums extend; a late sample lands in a summed pane: cut back and recomputed
    _feed(store, rng, 40, t0 + 600_000, t0 + 900_000, values)
    _check(store, sids, *_windows(rng, k0, k1 + 20, 50, 30), fields)
    late_sid = np.array([int(sids[0])], np.int64)
    store.last_t[late_sid] = t0 + 100_000  # let an old timestamp through, as a late rebuild re-folds
    store.ingest_sorted(late_sid, np.array([t0 + 100_001], np.int64), np.array([5.0]), live=False)
    _check(store, sids, *_windows(rng, k0, k1 + 20, 50, 30), fields)
    # panes cleared (a restart folds them again) and rows restored into them
    rows = store.export_rows(k1, k1 + 20)
    store.clear_from(k1)
    _check(store, sids, *_windows(rng, k0, k1 + 20, 30, 30), fields)
    store.import_rows(rows)
    _check(store, sids, *_windows(rng, k0, k1 + 20, 30, 30), fields)
    # history trimmed: the sums restart at the first pane read
    store.drop_before(k0 + 10)
    _check(store, sids, *_windows(rng, k0 + 10, k1 + 20, 30, 30), fields)
    # new series: the sums are rebuilt for every row
    _feed(store, rng, 60, t0 + 900_000, t0 + 960_000, values)
    _check(store, np.arange(60, dtype=np.int64), *_windows(rng, k0 + 10, k1 + 24, 30, 30), fields)


def test_counter_correction_exact_far_after_huge_resets() -> None:
    """A counter that reset from 1.8e19 once: later windows without a reset keep a correction of
    exactly zero, and a window with a small reset after it keeps that reset's value exactly."""
    store = ExactPaneStore(P, frozenset({"count", "corr", "first_t", "first_v", "last_t", "last_v"}))
    t0 = 1_000 * P
    ts = np.arange(t0, t0 + 3_600_000, 5_000, dtype=np.int64)
    v = np.arange(len(ts), dtype=np.float64)
    v[:10] += 1.8e19  # reset from 1.8e19 at the 10th sample
    v[500:] -= 400  # then a reset from 499 to 100 at the 500th
    store.ensure_series(1)
    store.ingest_sorted(np.zeros(len(ts), np.int64), ts, v)
    k_reset = int(ts[500] // P)
    klo = np.array([t0 // P + 20, k_reset - 2, k_reset + 2], np.int64)
    khi = klo + 3
    got = store.window_stats(np.array([0], np.int64), klo, khi, frozenset({"count", "corr", "first_v"}))
    assert got.corr[0, 0] == 0.0
    assert got.corr[0, 1] == 499.0
    assert got.corr[0, 2] == 0.0
    _check(store, np.array([0], np.int64), klo, khi, frozenset({"count", "corr", "first_v"}))


def test_sums_follow_the_tip_without_rebuilding() -> None:
    """Refreshes that move by a pane extend the kept sums by that pane (no rebuild, no growth)."""
    rng = np.random.default_rng(3)
    store = ExactPaneStore(P, frozenset({"count", "s1"}))
    t0 = 1_000 * P
    _feed(store, rng, 30, t0, t0 + 1_800_000, "gauge", gaps=0.0)
    sids = np.arange(30, dtype=np.int64)
    k = (t0 + 1_800_000) // P - 1
    store.window_stats(sids, np.array([k - 20]), np.array([k]), frozenset({"count", "s1"}))
    arrays = {f: id(a) for f, a in store.prefix.sums.items()}
    for step in range(1, 6):
        _feed(store, rng, 30, t0 + 1_800_000 + (step - 1) * P, t0 + 1_800_000 + step * P, "gauge", gaps=0.0)
        _check(store, sids, np.array([k - 20 + step]), np.array([k + step]), frozenset({"count", "s1"}))
    assert {f: id(a) for f, a in store.prefix.sums.items()} == arrays
    assert store.prefix.n == k + 5 - store.prefix.k_lo


def test_sparse_corrections_and_dense_windows() -> None:
    """Counters where two series reset (the extended-precision work covers only their block of
    series and windows), every series sampled in every window (no masking), and a pane whose
    correction cancels its entry pair (negative values: the window's sum of terms is zero but its
    correction is not)."""
    fields = frozenset({"count", "corr", "first_t", "first_v", "last_t", "last_v"})
    store = ExactPaneStore(P, fields)
    t0 = 1_000 * P
    ts = np.arange(t0, t0 + 3_600_000, 5_000, dtype=np.int64)
    n = 40
    store.ensure_series(n)
    vals = np.cumsum(np.ones((n, len(ts))), axis=1) * 3.0
    vals[7, 300:] -= 500.0  # one reset in series 7
    vals[21, 100:] -= 200.0  # one in series 21
    # series 30, pane k_c: the entry pair 3 -> 2 adds 3, inside it 2 -> -5 adds 2 and -5 -> -6 adds -5,
    # so the pane's terms sum to zero while the correction of a window starting there is -3
    k_c = int(ts[400] // P) + 1
    i = int(np.searchsorted(ts, k_c * P))
    vals[30, i - 1], vals[30, i:i + 3] = 3.0, [2.0, -5.0, -6.0]
    vals[30, i + 3:] = -5.0 + np.arange(len(ts) - i - 3)
    for j, t in enumerate(ts):
        store.ingest_sorted(np.arange(n, dtype=np.int64), np.full(n, t, np.int64), vals[:, j])
    sids = np.arange(n, dtype=np.int64)
    k0 = t0 // P
    for width in (1, 2, 20, 240):
        klo = np.arange(k0, k0 + 240 - width + 1, dtype=np.int64)
        _check(store, sids, klo, klo + width, fields)
    one = store.window_stats(sids, np.array([k_c]), np.array([k_c + 1]), fields)
    assert one.corr[30, 0] == -3.0  # 2 - 5 inside the pane; the entry pair's 3 belongs to the window before
    assert (one.corr[np.arange(n) != 30, 0] == 0).all()
