"""deriv()/predict_linear() fast paths (promql/functions/rate.py) against the bit-exact replica
of Prometheus's compensated-sum linear regression, on adversarial shapes: large value offsets
(cancellation in Prometheus's one-pass covariance), timestamps far from the intercept time,
mixed window widths on both sides of the dense/prefix threshold, constant and non-finite
windows. Every window the fast paths report ok must agree with the replica within 1e-9
relative; the others must have gone to the replica (so they agree bit for bit)."""
from __future__ import annotations

import numpy as np
import pytest

import promql.functions.rate as rmod
from promql.types import RangeWindows
from tests.test_promql_functions_property import build


def adversarial_series(rs: np.random.Generator, S: int):
    out = []
    t_base = 1_700_000_000_000  # realistic epoch milliseconds: large x before centring
    for s in range(S):
        n = 400
        ts = t_base + np.cumsum(rs.integers(5_000, 25_000, n))
        kind = s % 6
        if kind == 0:
            v = 1e9 + np.round(rs.normal(0, 1e-3, n).cumsum(), 6)  # big offset, tiny slope
        elif kind == 1:
            v = np.cumsum(rs.exponential(3, n))  # counter
        elif kind == 2:
            v = np.where(rs.random(n) < 0.7, 5.0, 6.0)  # long constant stretches
        elif kind == 3:
            v = rs.normal(0, 1, n) * 10.0 ** rs.integers(-3, 12, n)  # mixed magnitudes
        elif kind == 4:
            v = rs.normal(0, 1, n).cumsum()
            v[rs.integers(0, n, 6)] = rs.choice([np.nan, np.inf, -np.inf], 6)
        else:
            v = -1e15 + rs.integers(-3, 4, n).astype(float).cumsum()  # exact cancellations
        out.append((ts, v))
    return out


@pytest.mark.parametrize("range_s", [45, 150, 400, 900])
def test_fast_paths_agree_with_replica(range_s):
    rs = np.random.default_rng(range_s)
    series = adversarial_series(rs, 12)
    t_base = int(series[0][0][0])
    steps = t_base + np.arange(0, 4_000_000, 37_000, dtype=np.int64)
    rw = build(series, steps, range_s * 1000, name="g")
    n = (rw.hi - rw.lo).reshape(-1)
    sel = np.flatnonzero(n >= 2)
    assert n[sel].min() <= rmod._DENSE_MAX_N or n[sel].max() > rmod._DENSE_MAX_N
    lo_sel = rw.lo.reshape(-1)[sel]
    fallbacks = 0
    for intercept in (None, steps + 3_600_000, steps - 86_400_000):
        need = intercept is not None
        t0 = rw.ts[lo_sel] if intercept is None else intercept[sel % len(steps)]
        ref_s, ref_i = rmod._regression_kernel(rw, lo_sel, n[sel], t0)
        for fast in (rmod._regression_dense, rmod._regression_prefix):
            slope, icpt, ok = fast(rw, intercept, sel, need)
            fallbacks += int((~ok).sum())
            np.testing.assert_allclose(slope[ok], ref_s[ok], rtol=1e-9, atol=0)
            if need:
                np.testing.assert_allclose(icpt[ok], ref_i[ok], rtol=1e-9, atol=0)
        # the combination used by deriv/predict_linear: exact where the fast paths decline
        slope, icpt, present = rmod._linear_regression(rw, intercept)
        got_s = slope.reshape(-1)[sel]
        np.testing.assert_allclose(got_s, ref_s, rtol=1e-9, atol=0, equal_nan=True)
        if need:
            np.testing.assert_allclose(icpt.reshape(-1)[sel], ref_i, rtol=1e-9, atol=0, equal_nan=True)
    assert fallbacks > 0  # the adversarial kinds do reach the replica


def test_dense_threshold_splits_mixed_widths(monkeypatch):
    """Windows on both sides of the dense width limit in one call, and with several width
    groups and chunks, land in the right output positions."""
    rs = np.random.default_rng(3)
    series = [(np.cumsum(rs.integers(1_000, 9_000, 300)), rs.normal(0, 1, 300).cumsum()) for _ in range(7)]
    steps = np.arange(60_000, 1_500_000, 11_000, dtype=np.int64)
    rw = build(series, steps, 120_000, name="g")
    monkeypatch.setattr(rmod, "_DENSE_CHUNK", 50)
    monkeypatch.setattr(rmod, "_DENSE_MAX_N", 20)
    n = (rw.hi - rw.lo).reshape(-1)
    sel = np.flatnonzero(n >= 2)
    assert (n[sel] <= 20).any() and (n[sel] > 20).any() and len(np.unique(n[sel])) > 5
    slope, icpt, present = rmod._linear_regression(rw, steps)
    ref_s, ref_i = rmod._regression_kernel(rw, rw.lo.reshape(-1)[sel], n[sel], steps[sel % len(steps)])
    np.testing.assert_allclose(slope.reshape(-1)[sel], ref_s, rtol=1e-9)
    np.testing.assert_allclose(icpt.reshape(-1)[sel], ref_i, rtol=1e-9)
    assert np.array_equal(present.reshape(-1), n >= 2)


def test_repeated_windows_regressed_once_still_match_replica():
    """Steps finer than the sample interval select the same samples several times in a row:
    those windows share one regression, but predict_linear's intercept (and its error check)
    still follows each step's own time."""
    rs = np.random.default_rng(8)
    series = [(np.arange(1, 241, dtype=np.int64) * 60_000 + 7_000, 1e3 * s + rs.normal(0, 1, 240).cumsum())
              for s in range(4)]
    steps = np.arange(20 * 60_000, 200 * 60_000, 10_000, dtype=np.int64)  # 6 steps per sample
    rw = build(series, steps, 10 * 60_000, name="g")
    n = (rw.hi - rw.lo).reshape(-1)
    sel = np.flatnonzero(n >= 2)
    lo_sel = rw.lo.reshape(-1)[sel]
    assert np.unique(lo_sel).size * 3 < sel.size  # mostly repeats
    for intercept in (None, steps + 600_000):
        slope, icpt, ok = rmod._regression_dense(rw, intercept, sel, intercept is not None)
        assert ok.mean() > 0.95
        t0 = rw.ts[lo_sel] if intercept is None else intercept[sel % len(steps)]
        ref_s, ref_i = rmod._regression_kernel(rw, lo_sel, n[sel], t0)
        np.testing.assert_allclose(slope[ok], ref_s[ok], rtol=1e-9, atol=0)
        np.testing.assert_allclose(icpt[ok], ref_i[ok], rtol=1e-9, atol=0)
