"""rate()/increase()/delta() kernel (promql/functions/rate.py) against a per-window port of
Prometheus's extrapolatedRate, bit for bit, on shapes the small property tests do not reach:
many series split into many row chunks, counter resets found through the sparse (binary search)
path and through the dense (prefix count) path, unordered window ends, empty windows at both
ends of the sample arrays, and NaN/Inf/negative values."""
from __future__ import annotations

import math

import numpy as np
import pytest

from promql.functions import FunctionContext, load_all
from promql.functions import rate as rate_mod
from promql.types import Annotations, RangeWindows
from tests.test_promql_functions_property import build

F = load_all()


def prometheus_extrapolated_rate(ts: np.ndarray, v: np.ndarray, end: int, rng: int, counter: bool, per_second: bool):
    """Prometheus 3's extrapolatedRate for one window of float samples (None: no output)."""
    if len(v) < 2:
        return None
    res = float(v[-1]) - float(v[0])
    if counter:
        prev = float(v[0])
        for cur in v[1:]:
            if cur < prev:
                res += prev
            prev = float(cur)
    sampled = float(int(ts[-1]) - int(ts[0])) / 1000
    avg = sampled / float(len(v) - 1)
    threshold = avg * 1.1
    d_start = float(int(ts[0]) - (end - rng)) / 1000
    d_end = float(end - int(ts[-1])) / 1000
    if d_start >= threshold:
        d_start = avg / 2
    if counter:
        d_zero = d_start
        if res > 0 and v[0] >= 0:
            d_zero = sampled * (float(v[0]) / res)
        if d_zero < d_start:
            d_start = d_zero
    if d_end >= threshold:
        d_end = avg / 2
    factor = (sampled + d_start + d_end) / sampled
    if per_second:
        factor /= rng / 1000
    return res * factor


def random_series(rs: np.random.Generator, S: int, reset_p: float) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for s in range(S):
        n = int(rs.integers(0, 80))
        ts = np.cumsum(rs.integers(1, 40, n)) * 1000 + int(rs.integers(0, 5000))
        kind = s % 4
        if kind == 0:  # counter with resets, sometimes starting negative
            inc = rs.exponential(5.0, n)
            v = np.cumsum(inc) + (rs.uniform(-20, 20) if s % 8 == 0 else 0.0)
            cut = rs.random(n) < reset_p
            for i in np.flatnonzero(cut):
                v[i:] -= v[i] - rs.uniform(0, 3)
        elif kind == 1:  # gauge: a reset at every drop
            v = np.round(rs.normal(0, 10, n).cumsum(), 2)
        elif kind == 2:  # integers (exact cancellations, equal values)
            v = rs.integers(-3, 4, n).astype(float).cumsum()
        else:  # special values
            v = rs.uniform(0, 1e6, n).cumsum()
            if n:
                v[rs.integers(0, n, max(1, n // 10))] = rs.choice([np.nan, np.inf, -np.inf, 0.0, 1e300])
        out.append((ts, v))
    return out


def compare(rw: RangeWindows, name: str, counter: bool, per_second: bool) -> int:
    ctx = FunctionContext(rw.window_end, Annotations(), None)
    res = F[name](ctx, [rw])
    got = {}
    for i, lb in enumerate(res.labels):
        for t in np.flatnonzero(res.present[i]):
            got[(lb, int(t))] = float(res.values[i, t])
    want = {}
    for s, lb in enumerate(rw.labels):
        for t in range(rw.num_steps):
            a, b = int(rw.lo[s, t]), int(rw.hi[s, t])
            r = prometheus_extrapolated_rate(rw.ts[a:b], rw.vals[a:b], int(rw.window_end[t]), rw.range_ms, counter, per_second)
            if r is not None:
                want[(lb, t)] = r
    assert got.keys() == want.keys(), name
    for k, w in want.items():
        g = got[k]
        assert (math.isnan(g) and math.isnan(w)) or g == w, (name, k, g, w)
    return len(want)


@pytest.mark.parametrize("chunk", [3, 64, 1 << 15])
@pytest.mark.parametrize("seed,reset_p,ordered", [(1, 0.01, True), (2, 0.2, True), (3, 0.01, False), (4, 0.0, True)])
def test_extrapolated_rate_bit_exact(monkeypatch, chunk, seed, reset_p, ordered):
    monkeypatch.setattr(rate_mod, "_CHUNK_WINDOWS", chunk)
    rs = np.random.default_rng(seed)
    series = random_series(rs, 37, reset_p)
    steps = np.sort(rs.integers(0, 1_800, 23)) * 1000
    if not ordered:
        rs.shuffle(steps)  # unordered window ends (e.g. per-step @ times): dense reset path
    rw = build(series, steps, int(rs.integers(30, 300)) * 1000)
    checked = 0
    for name, counter, per_second in (("rate", True, True), ("increase", True, False), ("delta", False, False)):
        checked += compare(rw, name, counter, per_second)
    assert checked > 300


def test_reset_windows_sparse_and_dense_paths_agree():
    """The binary-search path (few resets) and the prefix-count path (many) pick the same windows."""
    rs = np.random.default_rng(5)
    series = [(np.arange(1, 301, dtype=np.int64) * 15_000,
               np.cumsum(rs.exponential(3, 300)) * np.where(np.arange(300) % 97 == 50, 0.1, 1.0))
              for _ in range(20)]
    for ts, v in series:  # a few resets per series
        for cut in rs.integers(1, 300, 3):
            v[cut:] -= v[cut] - 1.0
    steps = np.arange(0, 4_600_000, 60_000, dtype=np.int64)
    rw = build(series, steps, 600_000)
    lo, hi = rw.lo, rw.hi
    sparse_w, sparse_r = rate_mod._reset_corrected(rw, lo, hi, hi - lo, rw.vals)
    assert sparse_w.size
    dense_w, dense_r = rate_mod._reset_corrected(rw, lo, hi, hi - lo, rw.vals, allow_sparse=False)
    assert np.array_equal(sparse_w, dense_w)
    assert np.array_equal(sparse_r, dense_r)
    compare(rw, "increase", True, False)


def test_rows_out_of_csr_order_use_the_dense_reset_path():
    """A RangeWindows whose rows are permuted against its CSR (as the planner's canary builds
    them) must not be searched as if row-major order were sample order."""
    rs = np.random.default_rng(12)
    series = []
    for _ in range(16):  # counters with a few resets: few enough for the binary-search path
        ts = np.arange(1, 121, dtype=np.int64) * 15_000
        v = np.cumsum(rs.exponential(5.0, 120))
        for cut in rs.integers(1, 120, 2):
            v[cut:] -= v[cut] - 1.0
        series.append((ts, v))
    steps = np.arange(60, 1_800, 30, dtype=np.int64) * 1000
    rw = build(series, steps, 240_000)
    w, _ = rate_mod._reset_corrected(rw, rw.lo, rw.hi, rw.hi - rw.lo, rw.vals)
    assert 0 < w.size < rw.lo.size // 4
    perm = rs.permutation(len(series))
    shuffled = RangeWindows([rw.labels[i] for i in perm], rw.offsets, rw.ts, rw.vals, rw.lo[perm], rw.hi[perm],
                            rw.window_end, rw.range_ms)
    compare(shuffled, "increase", True, False)
    compare(shuffled, "rate", True, True)
