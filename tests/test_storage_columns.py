"""Columnar merge helpers checked against a plain sort-based reference (hypothesis)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from storage import columns
from storage.columns import find_keys, merge_sorted_parts, ranges_index, sort_by_series_time, take_ranges

STALE_NAN = np.array([0x7FF0000000000002], np.uint64).view(np.float64)[0]


def reference(parts):
    rows = {}
    for s, t, v in parts:
        for a, b, c in zip(s.tolist(), t.tolist(), v.tolist()):
            rows.setdefault((a, b), c)
    keys = sorted(rows)
    return [k[0] for k in keys], [k[1] for k in keys]


@st.composite
def parts_strategy(draw):
    k = draw(st.integers(1, 4))
    disjoint = draw(st.booleans())
    parts = []
    for i in range(k):
        n = draw(st.integers(0, 30))
        sid = np.array(draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)), dtype=np.int64)
        lo = i * 1000 if disjoint else 0
        ts = np.array(draw(st.lists(st.integers(lo, lo + 50), min_size=n, max_size=n)), dtype=np.int64)
        s, t, _ = sort_by_series_time(sid, ts, np.zeros(n))
        keep = np.ones(len(s), dtype=bool)
        if len(s) > 1:
            keep[1:] = (s[1:] != s[:-1]) | (t[1:] != t[:-1])
        s, t = s[keep], t[keep]
        parts.append((s, t, (s * 100000 + t).astype(float)))
    return parts


@pytest.mark.parametrize("native", [True, False], ids=["compiled", "numpy"])
@settings(max_examples=150, deadline=None)
@given(parts=parts_strategy())
def test_merge_sorted_parts_matches_reference(parts, native):
    if native and columns._merge2_native is None:
        pytest.fail("storage._merge_native is not built: run `make native`")
    saved = columns.USE_NATIVE_MERGE
    columns.USE_NATIVE_MERGE = native
    try:
        s, t, v = merge_sorted_parts([tuple(x.copy() for x in p) for p in parts])
    finally:
        columns.USE_NATIVE_MERGE = saved
    ws, wt = reference(parts)
    assert s.tolist() == ws and t.tolist() == wt
    assert v.tolist() == (s * 100000 + t).astype(float).tolist()


@pytest.mark.parametrize("seed", range(40))
def test_compiled_merge_is_bit_identical_to_numpy(seed):
    """Two to five parts of random shapes (disjoint in time, interleaving, sharing keys with
    different values, stale markers): the compiled and the numpy merge give the same rows, values
    bit for bit (on a key in several parts, the part starting earliest keeps its value)."""
    if columns._merge2_native is None:
        pytest.fail("storage._merge_native is not built: run `make native`")
    rng = np.random.default_rng(seed)
    parts = []
    for i in range(2 + seed % 4):
        n = int(rng.integers(0, 3000))
        sid = rng.integers(0, int(rng.integers(1, 200)), n).astype(np.int64)
        lo = [0, 1000 * i, 500 * i][seed % 3]
        ts = rng.integers(lo, lo + 1000, n).astype(np.int64)
        s, t, _ = sort_by_series_time(sid, ts, np.zeros(n))
        keep = np.ones(len(s), bool)
        keep[1:] = (s[1:] != s[:-1]) | (t[1:] != t[:-1])
        s, t = s[keep], t[keep]
        v = rng.standard_normal(len(s))
        v[rng.random(len(s)) < 0.05] = STALE_NAN
        parts.append((s, t, v))
    saved = columns.USE_NATIVE_MERGE
    try:
        columns.USE_NATIVE_MERGE = True
        a = merge_sorted_parts([tuple(x.copy() for x in p) for p in parts])
        columns.USE_NATIVE_MERGE = False
        b = merge_sorted_parts([tuple(x.copy() for x in p) for p in parts])
    finally:
        columns.USE_NATIVE_MERGE = saved
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert np.array_equal(a[2].view(np.uint64), b[2].view(np.uint64))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 5)), max_size=10))
def test_ranges_index_and_take_ranges(rs):
    starts = np.array([a for a, _ in rs], dtype=np.int64)
    ends = starts + np.array([b for _, b in rs], dtype=np.int64)
    want = [i for a, b in zip(starts.tolist(), ends.tolist()) for i in range(a, b)]
    assert ranges_index(starts, ends).tolist() == want
    order = np.argsort(starts, kind="stable")
    s2, e2 = starts[order], ends[order]
    if all(e <= s for e, s in zip(e2[:-1].tolist(), s2[1:].tolist())):  # ascending, non-overlapping
        idx = take_ranges(s2, e2)
        arr = np.arange(100)
        assert arr[idx].tolist() == [i for a, b in zip(s2.tolist(), e2.tolist()) for i in range(a, b)]


def test_find_keys():
    a_s, a_t = np.array([1, 1, 2, 5]), np.array([10, 20, 10, 0])
    b_s, b_t = np.array([1, 2, 2, 5]), np.array([20, 5, 10, 1])
    assert find_keys(a_s, a_t, b_s, b_t).tolist() == [-1, 0, 2, -1]
